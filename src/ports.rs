//! The ports through which the core reaches the host: randomness, the clock and the
//! process-wide shared store. The host adapter implements them over proxy-wasm; tests use
//! `testing::FakeHost`.

/// What the core needs from the host: randomness, the clock and the process-wide store.
pub(crate) trait Host {
    /// A uniformly random u64 (WASI `random_get`, never the clock).
    fn random(&mut self) -> u64;
    /// Unix time in milliseconds.
    fn now_ms(&self) -> u64;
    fn store(&self) -> &dyn SharedStore;
}

/// The store shared by every worker: proxy-wasm shared data in the host, a map in tests.
pub(crate) trait SharedStore {
    /// The value of `key` and its CAS token; None when the key was never set.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Stores `value` if the key's CAS token still equals `cas`; false on a CAS mismatch.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool;
}

/// A store's values and their CAS tokens, by key: the native host's shared store and the tests'.
#[cfg(any(test, fuzzing, feature = "native"))]
pub(crate) type Entries = std::collections::HashMap<String, (Vec<u8>, u32)>;

/// Proxy-wasm's rule for `set`: stores `value` when `cas` is 0 or the key's token, and gives
/// the key a new non-zero token; false on a mismatch.
#[cfg(any(test, fuzzing, feature = "native"))]
pub(crate) fn compare_and_set(entries: &mut Entries, key: &str, value: &[u8], cas: u32) -> bool {
    let current = entries.get(key).map_or(0, |(_, c)| *c);
    if cas != 0 && cas != current {
        return false;
    }
    entries.insert(key.to_string(), (value.to_vec(), current.wrapping_add(1).max(1)));
    true
}

/// A host for tests: scripted randomness and clock, and an in-memory store with CAS.
#[cfg(any(test, fuzzing))]
pub(crate) mod testing {
    use super::{compare_and_set, Entries, Host, SharedStore};
    use std::cell::{Cell, RefCell};

    pub(crate) struct FakeHost {
        pub(crate) random: u64,
        pub(crate) now_ms: Cell<u64>,
        pub(crate) data: RefCell<Entries>,
    }

    impl FakeHost {
        pub(crate) fn new(random: u64) -> Self {
            FakeHost { random, now_ms: Cell::new(1_000_000), data: RefCell::new(Entries::new()) }
        }
    }

    impl Host for FakeHost {
        fn random(&mut self) -> u64 {
            self.random
        }

        fn now_ms(&self) -> u64 {
            self.now_ms.get()
        }

        fn store(&self) -> &dyn SharedStore {
            self
        }
    }

    impl SharedStore for FakeHost {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.data.borrow().get(key).cloned()
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
            compare_and_set(&mut self.data.borrow_mut(), key, value, cas)
        }
    }

    /// A fake host's body buffer: its first `size` bytes, as Envoy hands them to the filter.
    pub(crate) fn prefix(buffer: &[u8], size: usize) -> Vec<u8> {
        buffer.get(..size).unwrap_or(buffer).to_vec()
    }

    /// A fake host's body buffer: its first `size` bytes replaced by `bytes`.
    pub(crate) fn replace_prefix(buffer: &mut Vec<u8>, size: usize, bytes: &[u8]) {
        let size = size.min(buffer.len());
        buffer.splice(..size, bytes.iter().copied());
    }
}
