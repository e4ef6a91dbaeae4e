//! A fast 64-bit hash over length-prefixed parts: FNV-1a, finished with MurmurHash3's mixer.
//!
//! Not collision-resistant against someone who chooses the input: users never let a hash alone
//! decide something a collision could abuse (the cache compares the whole key of an entry;
//! the breaker's ids only pick slots and share a record between colliding targets).

pub(crate) struct Hasher(u64);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Hasher {
    pub(crate) fn new() -> Self {
        Hasher(FNV_OFFSET)
    }

    /// A hasher whose outputs are independent of `new()`'s (two of them make a 128-bit hash).
    pub(crate) fn seeded(seed: u64) -> Self {
        let mut hasher = Hasher::new();
        hasher.bytes(&seed.to_le_bytes());
        hasher
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }

    /// Adds one part. A presence tag and a length prefix per part: ("ab", "c") and ("a", "bc")
    /// differ, and so do a missing part and an empty one.
    pub(crate) fn part(&mut self, part: Option<&[u8]>) -> &mut Self {
        match part {
            Some(bytes) => {
                self.bytes(&[1]);
                self.bytes(&(bytes.len() as u64).to_le_bytes());
                self.bytes(bytes);
            }
            None => self.bytes(&[0]),
        }
        self
    }

    /// The hash, its bits well mixed: callers take slots from the low bits and from bits 32
    /// and up, which FNV-1a alone mixes poorly.
    pub(crate) fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher::new()
    }
}
