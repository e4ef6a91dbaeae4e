//! A host's randomness read 4 KiB at a time, so that a draw is not a host call (wasm's
//! `random_get`) or a system call (the native module's `/dev/urandom`). Session ids and the key
//! that seals them (`crate::mcp::sealed`) are made of it, so it is the OS's, never a generator's.

const ENTROPY_BYTES: usize = 4096;

#[derive(Debug)]
pub(crate) struct Entropy {
    bytes: Box<[u8; ENTROPY_BYTES]>,
    next: usize,
}

impl Entropy {
    pub(crate) fn new() -> Entropy {
        Entropy { bytes: Box::new([0; ENTROPY_BYTES]), next: ENTROPY_BYTES }
    }

    /// The next 64 random bits; `refill` fills the buffer from the host when it is used up and
    /// says whether it could. When it could not (it logs why), draws are 0 until the next
    /// refill: callers take 0 for "no randomness" (a record id is then not made), where bytes
    /// drawn before would repeat.
    pub(crate) fn next_u64(&mut self, refill: impl FnOnce(&mut [u8]) -> bool) -> u64 {
        if self.next + 8 > ENTROPY_BYTES {
            if !refill(&mut self.bytes[..]) {
                self.bytes.fill(0);
            }
            self.next = 0;
        }
        let draw = self.bytes.get(self.next..self.next + 8).and_then(|bytes| bytes.try_into().ok());
        self.next += 8;
        u64::from_le_bytes(draw.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::Entropy;
    use crate::unit_tests::test;

    #[test]
    fn draws_are_the_hosts_bytes_refilled_when_used_up() {
        let mut refills = 0u8;
        let mut entropy = Entropy::new();
        let mut draw = |entropy: &mut Entropy| {
            entropy.next_u64(|bytes| {
                refills += 1;
                bytes.iter_mut().enumerate().for_each(|(i, byte)| *byte = (i as u8) ^ refills);
                true
            })
        };
        let first = draw(&mut entropy);
        assert_eq!(first, u64::from_le_bytes([1, 0, 3, 2, 5, 4, 7, 6]));
        let draws: Vec<u64> = (1..512).map(|_| draw(&mut entropy)).collect();
        assert_eq!(draws.last().copied(), Some(u64::from_le_bytes([249, 248, 251, 250, 253, 252, 255, 254])));
        assert_ne!(draw(&mut entropy), first, "the 513th draw is a new read's");
        assert_eq!(refills, 2);
    }

    #[test]
    fn a_failed_refill_draws_zeros_rather_than_repeating_bytes() {
        let mut entropy = Entropy::new();
        assert_ne!(
            entropy.next_u64(|bytes| {
                bytes.fill(7);
                true
            }),
            0
        );
        for _ in 1..512 {
            entropy.next_u64(|_| unreachable!("no refill before the buffer is used up"));
        }
        assert_eq!(entropy.next_u64(|_| false), 0);
        assert_eq!(entropy.next_u64(|_| unreachable!()), 0);
    }
}
