//! Where cached answers live: proxy-wasm shared data, which every worker sees, with get and
//! compare-and-swap set, but neither delete nor eviction. The cache bounds its own memory.
//!
//! # Layout
//!
//! - **Data slots** `gateway.cache.d.<class>.<slot>`: one entry each. Entries fall into size
//!   classes (4 KiB, 16 KiB, 64 KiB, ... up to `max_entry_bytes`); an entry goes to the
//!   smallest class it fits, and each class has a fixed number of slots, so the data never
//!   holds more than the sum of `slots × size` however many distinct requests pass.
//! - **Rings** `gateway.cache.ring.<class>`: a counter per class. A writer claims the next
//!   slot of its class by CAS on the counter: the replacement rule is "the oldest write of
//!   the class goes first", and two writers never claim the same slot (until the ring wraps
//!   around during one write, which the readers' checks make harmless).
//! - **Index buckets** `gateway.cache.idx.<n>`: which slot holds which key. A bucket (picked by
//!   the key's digest) lists up to [`INDEX_RECORDS`] records of (digest, expiry, slot);
//!   a full bucket drops its earliest-expiring record.
//! - **Vector buckets** `gateway.cache.vec.<n>` (semantic mode): per bucket (picked by the
//!   scope: tenant, namespace, endpoint, provider, model and parameters) up to
//!   [`VECTORS_PER_BUCKET`] embeddings, 8-bit quantised, each pointing to a slot.
//!
//! The budget is split: an eighth for vector buckets (when semantic mode is configured), the
//! rest evenly over the size classes, each data slot also paying its share of the index.
//!
//! # Races
//!
//! Buckets and rings are created at startup ([`Layout::startup_keys`]) so every update is a
//! CAS. A data slot is written without one: its writer owns it by the ring. A reader trusts
//! nothing it did not check: an index record may point to a slot that was written again since,
//! so a hit requires the entry's own digest, tenant, whole key and expiry to match. The worst
//! a lost race does is lose a write (a later request misses and stores again).

use super::Key;
use crate::ports::SharedStore;

/// An entry's smallest size class; each next class is four times larger.
const SMALLEST_CLASS: usize = 4096;
pub(crate) const INDEX_RECORDS: usize = 8;
const INDEX_RECORD_LEN: usize = 21;
/// A bucket holds up to `INDEX_RECORDS` records for about half as many slots: room for
/// stale records before live ones are dropped.
const SLOTS_PER_INDEX_BUCKET: usize = INDEX_RECORDS / 2;
pub(crate) const VECTORS_PER_BUCKET: usize = 16;
/// Longest embedding kept (OpenAI's text-embedding-3-large has 3072 dimensions).
pub(crate) const MAX_DIMENSIONS: usize = 3072;
const VECTOR_HEAD_LEN: usize = 31;
const VECTOR_BUCKET_BYTES: usize = 1 + VECTORS_PER_BUCKET * (VECTOR_HEAD_LEN + MAX_DIMENSIONS);
const MAX_CAS_ATTEMPTS: usize = 16;
const VERSION: u8 = 1;

/// What startup writes into each bucket and ring key (one byte: the SDK reads an empty value
/// as no data).
pub(crate) const EMPTY: &[u8] = &[0];

/// How the byte budget is cut into keys; the same for every worker with the same settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Layout {
    /// (entry size limit, number of slots) per class, smallest first.
    classes: Vec<(usize, u32)>,
    index_buckets: u32,
    vector_buckets: u32,
}

/// A data slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    class: u8,
    slot: u32,
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) expires_ms: u64,
    /// The provider that gave the answer.
    pub(crate) provider: String,
    pub(crate) content_type: String,
    pub(crate) body: Vec<u8>,
}

impl Layout {
    pub(crate) fn new(byte_budget: u64, max_entry_bytes: u64, semantic: bool) -> Layout {
        let budget = usize::try_from(byte_budget).unwrap_or(usize::MAX);
        let max_entry = usize::try_from(max_entry_bytes).unwrap_or(usize::MAX).max(SMALLEST_CLASS);
        let mut sizes = Vec::new();
        let mut size = SMALLEST_CLASS;
        while size < max_entry {
            sizes.push(size);
            size = size.saturating_mul(4);
        }
        sizes.push(max_entry);
        let vector_buckets = if semantic { (budget / 8 / VECTOR_BUCKET_BYTES).max(1) } else { 0 };
        let rings = sizes.len() * (1 + 8);
        let rest = budget.saturating_sub(vector_buckets * VECTOR_BUCKET_BYTES + rings);
        let share = rest / sizes.len();
        let index_per_slot = (1 + INDEX_RECORDS * INDEX_RECORD_LEN).div_ceil(SLOTS_PER_INDEX_BUCKET);
        let classes: Vec<(usize, u32)> =
            sizes.iter().map(|&size| (size, (share / (size + index_per_slot)) as u32)).collect();
        let slots: usize = classes.iter().map(|&(_, n)| n as usize).sum();
        Layout {
            classes,
            index_buckets: slots.div_ceil(SLOTS_PER_INDEX_BUCKET).max(1) as u32,
            vector_buckets: vector_buckets as u32,
        }
    }

    /// The keys that must exist before traffic: buckets and rings.
    pub(crate) fn startup_keys(&self) -> impl Iterator<Item = String> + '_ {
        let index = (0..self.index_buckets).map(index_key);
        let vectors = (0..self.vector_buckets).map(vector_key);
        let rings = (0..self.classes.len()).map(ring_key);
        index.chain(vectors).chain(rings)
    }

    /// The most bytes of values the layout can ever hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        let data: usize = self.classes.iter().map(|&(size, n)| size * n as usize).sum();
        let index = self.index_buckets as usize * (1 + INDEX_RECORDS * INDEX_RECORD_LEN);
        data + index + self.vector_buckets as usize * VECTOR_BUCKET_BYTES + self.classes.len() * 9
    }

    fn class_for(&self, len: usize) -> Option<u8> {
        self.classes.iter().position(|&(size, n)| len <= size && n > 0).map(|c| c as u8)
    }
}

fn index_key(bucket: u32) -> String {
    format!("gateway.cache.idx.{bucket}")
}

fn vector_key(bucket: u32) -> String {
    format!("gateway.cache.vec.{bucket}")
}

fn ring_key(class: usize) -> String {
    format!("gateway.cache.ring.{class}")
}

fn data_key(location: Location) -> String {
    format!("gateway.cache.d.{}.{}", location.class, location.slot)
}

/// The exact entry of `key`, unless missing or expired.
pub(crate) fn find(store: &dyn SharedStore, layout: &Layout, key: &Key, now_ms: u64) -> Option<Entry> {
    let (bucket, _) = store.get(&index_key(bucket_of(key.digest, layout.index_buckets)))?;
    let record = decode_index(&bucket).into_iter().find(|r| r.digest == key.digest && r.expires_ms > now_ms)?;
    let (value, _) = store.get(&data_key(record.location))?;
    let stored = StoredEntry::decode(&value)?;
    let matches =
        stored.digest == key.digest && stored.tenant == key.tenant && stored.identity == key.identity.as_slice();
    (matches && stored.expires_ms > now_ms).then(|| stored.entry())
}

/// The entry of the same scope whose embedding is the most similar to `vector`, when its
/// cosine similarity reaches `threshold`.
pub(crate) fn find_similar(
    store: &dyn SharedStore,
    layout: &Layout,
    key: &Key,
    vector: &[f32],
    threshold: f32,
    now_ms: u64,
) -> Option<Entry> {
    if layout.vector_buckets == 0 {
        return None;
    }
    let (bucket, _) = store.get(&vector_key(bucket_of(key.scope, layout.vector_buckets)))?;
    let mut candidates: Vec<(f32, VectorRecord)> = decode_vectors(&bucket)
        .into_iter()
        .filter(|r| r.scope == key.scope && r.expires_ms > now_ms)
        .filter_map(|r| Some((super::semantic::cosine(vector, &r.vector)?, r)))
        .filter(|(similarity, _)| *similarity >= threshold)
        .collect();
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
    // The best candidate whose slot still holds its entry.
    candidates.into_iter().find_map(|(_, record)| {
        let (value, _) = store.get(&data_key(record.location))?;
        let stored = StoredEntry::decode(&value)?;
        let matches = stored.digest == record.digest && stored.scope == key.scope && stored.tenant == key.tenant;
        (matches && stored.expires_ms > now_ms).then(|| stored.entry())
    })
}

/// Stores `entry` under `key` (and its embedding, when given). False when it was not stored:
/// too large, or the store was too contended.
pub(crate) fn put(
    store: &dyn SharedStore,
    layout: &Layout,
    key: &Key,
    entry: &Entry,
    vector: Option<&[f32]>,
    now_ms: u64,
) -> bool {
    let stored = StoredEntry {
        expires_ms: entry.expires_ms,
        digest: key.digest,
        scope: key.scope,
        tenant: key.tenant,
        identity: &key.identity,
        provider: &entry.provider,
        content_type: &entry.content_type,
        body: &entry.body,
    };
    let value = stored.encode();
    let Some(class) = layout.class_for(value.len()) else {
        return false;
    };
    let Some(location) = claim_slot(store, layout, class) else {
        return false;
    };
    if !store.set(&data_key(location), &value, 0) {
        return false;
    }
    let indexed = update_bucket(store, &index_key(bucket_of(key.digest, layout.index_buckets)), |bytes| {
        let mut records = decode_index(bytes);
        records.retain(|r| r.digest != key.digest && r.location != location && r.expires_ms > now_ms);
        keep_latest(&mut records, INDEX_RECORDS - 1, |r| r.expires_ms);
        records.push(IndexRecord { digest: key.digest, expires_ms: entry.expires_ms, location });
        Some(encode_index(&records))
    });
    if indexed && layout.vector_buckets > 0 {
        update_vectors(store, layout, key, location, entry.expires_ms, vector, now_ms);
    }
    indexed
}

/// Points the key's vector record at `location`, adding `vector` when given: a refreshed
/// entry stays findable by meaning and the old slot is no longer referenced.
fn update_vectors(
    store: &dyn SharedStore,
    layout: &Layout,
    key: &Key,
    location: Location,
    expires_ms: u64,
    vector: Option<&[f32]>,
    now_ms: u64,
) {
    let quantised = vector.and_then(quantise);
    let bucket = vector_key(bucket_of(key.scope, layout.vector_buckets));
    update_bucket(store, &bucket, |bytes| {
        let mut records = decode_vectors(bytes);
        let previous = records.iter().position(|r| r.digest == key.digest && r.scope == key.scope);
        let vector = match (&quantised, previous) {
            (Some(vector), _) => vector.clone(),
            (None, Some(i)) => records.get(i)?.vector.clone(),
            (None, None) => return None,
        };
        records.retain(|r| r.digest != key.digest && r.location != location && r.expires_ms > now_ms);
        keep_latest(&mut records, VECTORS_PER_BUCKET - 1, |r| r.expires_ms);
        records.push(VectorRecord { scope: key.scope, digest: key.digest, expires_ms, location, vector });
        Some(encode_vectors(&records))
    });
}

/// Claims the next slot of `class` by CAS on its ring.
fn claim_slot(store: &dyn SharedStore, layout: &Layout, class: u8) -> Option<Location> {
    let slots = layout.classes.get(usize::from(class))?.1;
    let key = ring_key(usize::from(class));
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = store.get(&key)?;
        let next = value.get(1..9).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
        let mut updated = vec![VERSION];
        updated.extend_from_slice(&next.wrapping_add(1).to_le_bytes());
        if store.set(&key, &updated, cas) {
            return Some(Location { class, slot: (next % u64::from(slots)) as u32 });
        }
    }
    None
}

/// Read-modify-write of a bucket by CAS; `change` returns None to leave it as it is.
fn update_bucket(store: &dyn SharedStore, key: &str, change: impl Fn(&[u8]) -> Option<Vec<u8>>) -> bool {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some((value, cas)) = store.get(key) else {
            return false; // never created at startup: left alone (a first insert races)
        };
        let Some(updated) = change(&value) else {
            return true;
        };
        if store.set(key, &updated, cas) {
            return true;
        }
    }
    false
}

/// Keeps at most `room` records, dropping those that expire first.
fn keep_latest<T>(records: &mut Vec<T>, room: usize, expires: impl Fn(&T) -> u64) {
    while records.len() > room {
        let earliest = records.iter().enumerate().min_by_key(|(_, r)| expires(r)).map_or(0, |(i, _)| i);
        records.swap_remove(earliest);
    }
}

fn bucket_of(hash: u64, buckets: u32) -> u32 {
    ((hash >> 32) % u64::from(buckets.max(1))) as u32
}

struct IndexRecord {
    digest: u64,
    expires_ms: u64,
    location: Location,
}

/// Index bucket: version, then records of digest (8), expiry ms (8), class (1), slot (4).
fn decode_index(bytes: &[u8]) -> Vec<IndexRecord> {
    let mut reader = Reader::new(bytes);
    let mut records = Vec::new();
    if reader.u8() != Some(VERSION) {
        return records; // the startup placeholder, or another version: empty
    }
    while let (Some(digest), Some(expires_ms), Some(class), Some(slot)) =
        (reader.u64(), reader.u64(), reader.u8(), reader.u32())
    {
        records.push(IndexRecord { digest, expires_ms, location: Location { class, slot } });
    }
    records
}

fn encode_index(records: &[IndexRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + records.len() * INDEX_RECORD_LEN);
    out.push(VERSION);
    for r in records {
        out.extend_from_slice(&r.digest.to_le_bytes());
        out.extend_from_slice(&r.expires_ms.to_le_bytes());
        out.push(r.location.class);
        out.extend_from_slice(&r.location.slot.to_le_bytes());
    }
    out
}

struct VectorRecord {
    scope: u64,
    digest: u64,
    expires_ms: u64,
    location: Location,
    vector: Vec<i8>,
}

/// Vector bucket: version, then records of scope (8), digest (8), expiry ms (8), class (1),
/// slot (4), dimensions (2) and one signed byte per dimension.
fn decode_vectors(bytes: &[u8]) -> Vec<VectorRecord> {
    let mut reader = Reader::new(bytes);
    let mut records = Vec::new();
    if reader.u8() != Some(VERSION) {
        return records;
    }
    loop {
        let head = (reader.u64(), reader.u64(), reader.u64(), reader.u8(), reader.u32(), reader.u16());
        let (Some(scope), Some(digest), Some(expires_ms), Some(class), Some(slot), Some(dims)) = head else {
            return records;
        };
        let Some(vector) = reader.take(usize::from(dims)) else {
            return records;
        };
        let vector = vector.iter().map(|&b| b as i8).collect();
        records.push(VectorRecord { scope, digest, expires_ms, location: Location { class, slot }, vector });
    }
}

fn encode_vectors(records: &[VectorRecord]) -> Vec<u8> {
    let mut out = vec![VERSION];
    for r in records {
        out.extend_from_slice(&r.scope.to_le_bytes());
        out.extend_from_slice(&r.digest.to_le_bytes());
        out.extend_from_slice(&r.expires_ms.to_le_bytes());
        out.push(r.location.class);
        out.extend_from_slice(&r.location.slot.to_le_bytes());
        out.extend_from_slice(&(r.vector.len() as u16).to_le_bytes());
        out.extend(r.vector.iter().map(|&v| v as u8));
    }
    out
}

/// An embedding scaled to unit length and rounded to signed bytes: a quarter of the memory of
/// floats, and cosine similarities stay within about 0.01 of the exact ones.
fn quantise(vector: &[f32]) -> Option<Vec<i8>> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    if vector.is_empty() || vector.len() > MAX_DIMENSIONS || !norm.is_finite() || norm == 0.0 {
        return None;
    }
    Some(vector.iter().map(|v| (v / norm * 127.0).round() as i8).collect())
}

/// A data slot's value: version (1), expiry ms (8), digest (8), scope (8), tenant (16), then
/// the lengths of the key (4), provider (1), content type (2) and body (4), then those bytes.
struct StoredEntry<'a> {
    expires_ms: u64,
    digest: u64,
    scope: u64,
    tenant: [u8; 16],
    identity: &'a [u8],
    provider: &'a str,
    content_type: &'a str,
    body: &'a [u8],
}

/// At most the first `max` bytes.
fn prefix(bytes: &[u8], max: usize) -> &[u8] {
    bytes.get(..max).unwrap_or(bytes)
}

impl<'a> StoredEntry<'a> {
    fn encode(&self) -> Vec<u8> {
        let provider = prefix(self.provider.as_bytes(), 255);
        let content_type = prefix(self.content_type.as_bytes(), 1024);
        let mut out =
            Vec::with_capacity(52 + self.identity.len() + provider.len() + content_type.len() + self.body.len());
        out.push(VERSION);
        out.extend_from_slice(&self.expires_ms.to_le_bytes());
        out.extend_from_slice(&self.digest.to_le_bytes());
        out.extend_from_slice(&self.scope.to_le_bytes());
        out.extend_from_slice(&self.tenant);
        out.extend_from_slice(&(self.identity.len() as u32).to_le_bytes());
        out.push(provider.len() as u8);
        out.extend_from_slice(&(content_type.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        for part in [self.identity, provider, content_type, self.body] {
            out.extend_from_slice(part);
        }
        out
    }

    fn decode(bytes: &'a [u8]) -> Option<StoredEntry<'a>> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let (expires_ms, digest, scope) = (r.u64()?, r.u64()?, r.u64()?);
        let tenant = r.take(16)?.try_into().ok()?;
        let (identity_len, provider_len, type_len, body_len) = (r.u32()?, r.u8()?, r.u16()?, r.u32()?);
        Some(StoredEntry {
            expires_ms,
            digest,
            scope,
            tenant,
            identity: r.take(identity_len as usize)?,
            provider: std::str::from_utf8(r.take(usize::from(provider_len))?).ok()?,
            content_type: std::str::from_utf8(r.take(usize::from(type_len))?).ok()?,
            body: r.take(body_len as usize)?,
        })
    }

    fn entry(&self) -> Entry {
        Entry {
            expires_ms: self.expires_ms,
            provider: self.provider.to_string(),
            content_type: self.content_type.to_string(),
            body: self.body.to_vec(),
        }
    }
}

/// Little-endian fields off a byte slice; None past the end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|b| b.first().copied())
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2)?.try_into().ok().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::testing::FakeHost;
    use crate::unit_tests::test;

    const NOW: u64 = 1_000_000;

    fn store_for(layout: &Layout) -> FakeHost {
        let host = FakeHost::new(0);
        for key in layout.startup_keys() {
            host.set(&key, EMPTY, 0);
        }
        host
    }

    fn key(n: u64, tenant: u8) -> Key {
        let identity = format!("request {n}").into_bytes();
        Key {
            tenant: [tenant; 16],
            digest: crate::hash::Hasher::new().part(Some(&identity)).part(Some(&[tenant])).finish(),
            scope: 7,
            identity,
        }
    }

    fn entry(body: &str, expires_ms: u64) -> Entry {
        Entry { expires_ms, provider: "openai".into(), content_type: "application/json".into(), body: body.into() }
    }

    /// Bytes of values held under cache keys.
    fn held(host: &FakeHost) -> usize {
        host.data.borrow().iter().filter(|(k, _)| k.starts_with("gateway.cache.")).map(|(_, (v, _))| v.len()).sum()
    }

    #[test]
    fn layout_stays_within_the_budget() {
        for (budget, max_entry, semantic) in [
            (1u64 << 20, 65536u64, true),
            (32 << 20, 512 << 10, true),
            (32 << 20, 4096, false),
            (1 << 30, 1 << 20, true),
        ] {
            let layout = Layout::new(budget, max_entry, semantic);
            assert!(layout.capacity() as u64 <= budget, "{budget} {max_entry}: {}", layout.capacity());
            assert!(layout.capacity() as u64 > budget / 10 * 9, "most of the budget is used: {layout:?}");
            assert_eq!(layout.classes.last().map(|c| c.0 as u64), Some(max_entry));
            assert!(layout.classes.iter().all(|&(_, n)| n > 0), "{layout:?}");
        }
        let layout = Layout::new(32 << 20, 512 << 10, false);
        let sizes: Vec<usize> = layout.classes.iter().map(|c| c.0).collect();
        assert_eq!(sizes, vec![4096, 16384, 65536, 262144, 524288]);
        assert_eq!(layout.vector_buckets, 0);
    }

    #[test]
    fn stores_and_finds_an_entry() {
        let layout = Layout::new(1 << 20, 65536, false);
        let host = store_for(&layout);
        assert_eq!(find(&host, &layout, &key(1, 1), NOW), None);
        assert!(put(&host, &layout, &key(1, 1), &entry("answer", NOW + 1000), None, NOW));
        assert_eq!(find(&host, &layout, &key(1, 1), NOW).map(|e| e.body), Some(b"answer".to_vec()));
        assert_eq!(find(&host, &layout, &key(2, 1), NOW), None);
        // Expired.
        assert_eq!(find(&host, &layout, &key(1, 1), NOW + 1000), None);
        // Replaced by a newer answer.
        assert!(put(&host, &layout, &key(1, 1), &entry("newer", NOW + 5000), None, NOW));
        assert_eq!(find(&host, &layout, &key(1, 1), NOW).map(|e| e.body), Some(b"newer".to_vec()));
    }

    #[test]
    fn a_key_matches_only_in_full() {
        let layout = Layout::new(1 << 20, 65536, false);
        let host = store_for(&layout);
        let stored = key(1, 1);
        assert!(put(&host, &layout, &stored, &entry("tenant one", NOW + 1000), None, NOW));
        // Same digest (a collision) but another tenant or another request: no hit.
        let other_tenant = Key { tenant: [2; 16], ..stored.clone() };
        assert_eq!(find(&host, &layout, &other_tenant, NOW), None);
        let other_request = Key { identity: b"something else".to_vec(), ..stored.clone() };
        assert_eq!(find(&host, &layout, &other_request, NOW), None);
    }

    #[test]
    fn memory_stays_bounded_and_the_newest_entries_stay() {
        let layout = Layout::new(1 << 20, 65536, false);
        let host = store_for(&layout);
        let body = "x".repeat(3000);
        for n in 0..5000 {
            put(&host, &layout, &key(n, 1), &entry(&body, NOW + 1000), None, NOW);
        }
        assert!(held(&host) <= layout.capacity(), "{} > {}", held(&host), layout.capacity());
        assert!(held(&host) <= 1 << 20);
        assert!(find(&host, &layout, &key(4999, 1), NOW).is_some());
        assert!(find(&host, &layout, &key(0, 1), NOW).is_none(), "the oldest write went first");
        let kept = (0..5000).filter(|&n| find(&host, &layout, &key(n, 1), NOW).is_some()).count();
        let small_slots = layout.classes[0].1 as usize;
        assert!(kept > small_slots / 2 && kept <= small_slots, "{kept} of {small_slots} slots");
    }

    #[test]
    fn entries_over_the_cap_are_not_stored() {
        let layout = Layout::new(1 << 20, 65536, false);
        let host = store_for(&layout);
        assert!(!put(&host, &layout, &key(1, 1), &entry(&"x".repeat(70_000), NOW + 1000), None, NOW));
        assert!(put(&host, &layout, &key(2, 1), &entry(&"x".repeat(60_000), NOW + 1000), None, NOW));
        assert!(find(&host, &layout, &key(2, 1), NOW).is_some());
    }

    #[test]
    fn a_slot_written_again_is_no_hit_for_the_old_key() {
        let layout = Layout { classes: vec![(4096, 1)], index_buckets: 1, vector_buckets: 0 };
        let host = store_for(&layout);
        assert!(put(&host, &layout, &key(1, 1), &entry("one", NOW + 1000), None, NOW));
        assert!(put(&host, &layout, &key(2, 1), &entry("two", NOW + 1000), None, NOW));
        assert_eq!(find(&host, &layout, &key(1, 1), NOW), None);
        assert_eq!(find(&host, &layout, &key(2, 1), NOW).map(|e| e.body), Some(b"two".to_vec()));
    }

    #[test]
    fn garbage_in_shared_data_reads_as_empty() {
        let layout = Layout::new(1 << 20, 65536, false);
        let host = store_for(&layout);
        assert!(put(&host, &layout, &key(1, 1), &entry("answer", NOW + 1000), None, NOW));
        for (k, (v, _)) in host.data.borrow_mut().iter_mut() {
            if k.starts_with("gateway.cache.d.") {
                v.truncate(v.len() / 2);
            }
        }
        assert_eq!(find(&host, &layout, &key(1, 1), NOW), None);
        for bytes in [&[][..], &[1], &[1, 2, 3], &[9; 40]] {
            assert!(decode_index(bytes).len() <= 1);
            assert!(decode_vectors(bytes).is_empty());
            assert!(StoredEntry::decode(bytes).is_none());
        }
    }

    #[test]
    fn similar_vectors_find_the_entry_of_the_same_scope() {
        let layout = Layout::new(1 << 20, 65536, true);
        let host = store_for(&layout);
        let stored = key(1, 1);
        assert!(put(&host, &layout, &stored, &entry("paris", NOW + 1000), Some(&[1.0, 0.0, 0.1]), NOW));
        let asking = key(2, 1);
        let found = find_similar(&host, &layout, &asking, &[0.99, 0.05, 0.1], 0.95, NOW);
        assert_eq!(found.map(|e| e.body), Some(b"paris".to_vec()));
        assert_eq!(find_similar(&host, &layout, &asking, &[0.0, 1.0, 0.0], 0.95, NOW), None);
        // Another scope or tenant, or expired: no hit.
        assert_eq!(find_similar(&host, &layout, &Key { scope: 8, ..asking.clone() }, &[1.0, 0.0, 0.1], 0.5, NOW), None);
        assert_eq!(
            find_similar(&host, &layout, &Key { tenant: [2; 16], ..asking.clone() }, &[1.0, 0.0, 0.1], 0.5, NOW),
            None
        );
        assert_eq!(find_similar(&host, &layout, &asking, &[1.0, 0.0, 0.1], 0.5, NOW + 1000), None);
    }

    #[test]
    fn a_refreshed_entry_keeps_its_vector() {
        let layout = Layout::new(1 << 20, 65536, true);
        let host = store_for(&layout);
        let stored = key(1, 1);
        assert!(put(&host, &layout, &stored, &entry("old", NOW + 1000), Some(&[1.0, 0.0]), NOW));
        assert!(put(&host, &layout, &stored, &entry("new", NOW + 2000), None, NOW));
        let found = find_similar(&host, &layout, &key(2, 1), &[1.0, 0.0], 0.95, NOW);
        assert_eq!(found.map(|e| e.body), Some(b"new".to_vec()));
    }

    #[test]
    fn vector_buckets_stay_bounded() {
        let layout = Layout::new(1 << 20, 65536, true);
        let host = store_for(&layout);
        let vector: Vec<f32> = (0..MAX_DIMENSIONS).map(|i| (i % 7) as f32).collect();
        for n in 0..200 {
            put(&host, &layout, &key(n, 1), &entry("a", NOW + 1000 + n), Some(&vector), NOW);
        }
        let bucket = host.get(&vector_key(bucket_of(7, layout.vector_buckets))).unwrap().0;
        assert_eq!(decode_vectors(&bucket).len(), VECTORS_PER_BUCKET);
        assert!(bucket.len() <= VECTOR_BUCKET_BYTES);
        assert!(held(&host) <= layout.capacity());
        // Too long a vector is not kept, the entry still is.
        assert!(put(&host, &layout, &key(999, 1), &entry("b", NOW + 1000), Some(&vec![1.0; MAX_DIMENSIONS + 1]), NOW));
    }

    #[test]
    fn quantised_vectors_keep_their_direction() {
        let a = [0.3f32, -0.2, 0.9, 0.0];
        assert!(super::super::semantic::cosine(&a, &quantise(&a).unwrap()).unwrap() > 0.999);
        assert_eq!(quantise(&[0.0, 0.0]), None);
        assert_eq!(quantise(&[f32::NAN]), None);
        assert_eq!(quantise(&[]), None);
    }
}
