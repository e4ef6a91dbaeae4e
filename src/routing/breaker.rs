//! Circuit breaker (spec 2.5): stops sending to a target that keeps failing, and after the
//! cooldown lets one trial attempt through to see whether it has recovered.
//!
//! Pure logic over a [`SharedStore`], so it is tested natively; the host adapter implements the
//! store with proxy-wasm shared data. That data is process-wide (every worker thread's VM sees
//! the same), has get and compare-and-swap set, and has neither delete nor eviction.
//!
//! # States
//!
//! Closed counts consecutive failures; when they reach `failure_threshold` the circuit is Open.
//! After `cooldown_interval` the first [`admit`] wins a trial by CAS (HalfOpen); everyone else is
//! refused until the trial's outcome arrives: success closes the circuit, failure opens it for a
//! new cooldown. A trial whose outcome never arrives (the client went away) expires after a
//! cooldown and the next caller starts another.
//!
//! A circuit is a target (provider, location, credential), shared by every config that routes
//! there; each caller applies its own config's threshold and cooldown. Outcomes arriving while
//! the circuit is open come from attempts admitted before it opened: they are ignored, the
//! circuit waits for its trial. An outcome arriving while a trial is in flight is taken as the
//! trial's (the record cannot tell which attempt was the trial, and any outcome is fresh news
//! about the target).
//!
//! # Storage
//!
//! Memory is bounded: [`SLOT_COUNT`] keys `gateway.cb.0000` to `gateway.cb.2047`, each holding
//! at most one circuit's record, 30 bytes, integers little endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | version, 1 |
//! | 1 | 8 | circuit id |
//! | 9 | 1 | state: 0 closed, 1 open, 2 half-open |
//! | 10 | 4 | consecutive failures |
//! | 14 | 8 | ms: closed, the latest failure; open, when it opened; half-open, when the trial started |
//! | 22 | 8 | the cooldown (ms) of the config that wrote the record |
//!
//! A value that does not decode (the startup placeholder, garbage, another version) is an
//! empty slot. A circuit may live in two slots, picked by two independent bit ranges of its id.
//! It uses the one that holds it; otherwise, once it has something to record, it claims one
//! that is empty or idle. Idle means forgetting the record loses nothing worth keeping: closed
//! without failures, or the record's own cooldown has passed since its last change (failures
//! that old restart the count anyway; an open circuit that old is due a trial; a trial that
//! old is presumed lost). The price of the last case: an open circuit whose slot is taken after
//! its cooldown starts closed again, so its next attempts all go through instead of one trial.
//!
//! Trade-off: when both slots are busy with other circuits, the circuit is not tracked this
//! time ([`admit`] lets it through, [`record`] does nothing). That takes two other circuits with
//! recent failures on exactly its two slots, and busy records turn idle within a cooldown; in
//! exchange a gateway that sees millions of targets (custom hosts, per-user keys) keeps a fixed
//! 2048 small keys. In a rare race (two first failures of a circuit while one of its slots turns
//! idle) it can land in both slots; it then uses the first, and the other ages out.
//!
//! Keys are created only at startup ([`slot_keys`]): with no delete and no eviction every later
//! write is a CAS on an existing key. A first insert cannot be conditional (the host ignores
//! the CAS of a missing key), so two workers inserting at once would lose one write; a missing
//! key therefore reads as an empty slot that is never claimed.
//!
//! The credential only goes into the 64-bit hash that is the circuit id: the secret itself is
//! never stored.

use crate::config::CircuitBreakerConfig;
use crate::hash::Hasher;
use crate::ports::SharedStore;

/// The number of slots, so of shared-data keys, the breaker ever uses.
pub(crate) const SLOT_COUNT: usize = 2048;

/// The value the startup stores in each slot key. One byte rather than none: the SDK returns
/// no data for an empty value, which an adapter could mistake for a missing key.
pub(crate) const EMPTY_SLOT: &[u8] = &[0];

const KEY_PREFIX: &str = "gateway.cb.";

/// Bounds every CAS loop; contention on one circuit never lasts this long in practice.
const MAX_CAS_ATTEMPTS: usize = 64;

const VERSION: u8 = 1;
const RECORD_LEN: usize = 30;

/// The stable identity of a target: a hash of its provider, location and credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CircuitId(u64);

/// The circuit of a target. `location` is where it lives (e.g. authority and base path).
pub(crate) fn circuit_id(provider: &str, location: &str, credential: Option<&str>) -> CircuitId {
    let mut hasher = Hasher::new();
    hasher.part(Some(provider.as_bytes())).part(Some(location.as_bytes())).part(credential.map(str::as_bytes));
    CircuitId(hasher.finish())
}

/// What an attempt's result says about the target's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The provider answered with a status not counted as a failure (a 4xx is the request's
    /// fault, not the target's: it proves the target is up, and settles a trial).
    Success,
    Failure,
}

/// Classifies an attempt: `status` is None for a transport failure or a timeout, which count as
/// failures. The config's `failure_status_codes` (by default every status from 500) are
/// failures; any other response shows the target is up and is a success.
pub(crate) fn classify(config: &CircuitBreakerConfig, status: Option<u16>) -> Outcome {
    let Some(status) = status else {
        return Outcome::Failure;
    };
    let failing = match &config.failure_status_codes {
        Some(codes) => codes.contains(&status),
        None => status >= 500,
    };
    if failing {
        Outcome::Failure
    } else {
        Outcome::Success
    }
}

/// Whether an attempt may go to a target now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The circuit is closed (or not tracked): go.
    Closed,
    /// This attempt is the one trial after the cooldown: go, and record its outcome.
    Trial,
    /// Skip the target: inside the cooldown, or another attempt is the trial.
    Open,
}

/// Read-only: would [`admit`] refuse an attempt now? For choosing among loadbalance targets.
pub(crate) fn is_open(store: &dyn SharedStore, id: CircuitId, config: &CircuitBreakerConfig, now_ms: u64) -> bool {
    match locate(store, id, now_ms) {
        Place::Held { record, .. } => refuses(&record, config, now_ms),
        Place::Free { .. } | Place::Busy => false,
    }
}

/// Called right before an attempt. After the cooldown (or once a trial has gone unanswered for
/// a cooldown) the first caller to swap in a new trial gets [`Admission::Trial`].
pub(crate) fn admit(store: &dyn SharedStore, id: CircuitId, config: &CircuitBreakerConfig, now_ms: u64) -> Admission {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Place::Held { key, cas, record } = locate(store, id, now_ms) else {
            return Admission::Closed;
        };
        if record.state == State::Closed {
            return Admission::Closed;
        }
        if refuses(&record, config, now_ms) {
            return Admission::Open;
        }
        let trial = Record { state: State::HalfOpen, at_ms: now_ms, cooldown_ms: config.cooldown_interval, ..record };
        if store.set(&key, &trial.encode(), cas) {
            return Admission::Trial;
        }
        // Another worker changed the circuit first, perhaps starting the trial: look again.
    }
    // Every CAS lost: others are busy with this circuit right now, skipping it is the safe side.
    Admission::Open
}

/// What [`record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// This call opened the circuit (from closed, or by a failed trial): true for exactly one
    /// caller per opening, so the host can count openings.
    pub(crate) opened: bool,
    /// How this call changed the number of circuits not closed (open, or on trial): +1 when it
    /// opened a closed one, -1 when it closed one or took the slot of one left open.
    pub(crate) open_change: i32,
    /// The circuit's consecutive failures after this call; 0 when it is not tracked (or every
    /// CAS lost).
    pub(crate) failures: u32,
}

/// Records an attempt's outcome: a failure counts (opening the circuit at the threshold, or
/// again when it is the trial's), a success closes the circuit and resets the count, and
/// outcomes while open are ignored. Each change is a CAS on the
/// circuit's slot, retried on a mismatch, so concurrent workers never lose a count.
pub(crate) fn record(
    store: &dyn SharedStore,
    id: CircuitId,
    config: &CircuitBreakerConfig,
    outcome: Outcome,
    now_ms: u64,
) -> Recorded {
    let untracked = Recorded { opened: false, open_change: 0, failures: 0 };
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (key, cas, current, evicts_open) = match locate(store, id, now_ms) {
            Place::Held { key, cas, record } => (key, cas, record, false),
            Place::Free { key, cas, evicts_open } => (key, cas, Record::closed(id, config), evicts_open),
            Place::Busy => return untracked,
        };
        let next = current.after(outcome, config, now_ms);
        // Most outcomes (successes of a healthy target) change nothing: no write at all.
        if next == current {
            return Recorded { opened: false, open_change: 0, failures: current.failures };
        }
        if store.set(&key, &next.encode(), cas) {
            let opened = next.state == State::Open && current.state != State::Open;
            let open_change = i32::from(next.is_open()) - i32::from(current.is_open()) - i32::from(evicts_open);
            return Recorded { opened, open_change, failures: next.failures };
        }
    }
    untracked
}

/// The keys the host creates at startup, each with [`EMPTY_SLOT`], so that every later write is
/// a CAS on an existing key. Create only the keys that are missing (get returns None): other
/// workers' VMs and the VMs of an earlier configuration share them. Two VMs creating the same
/// key at once both store the placeholder; at worst that wipes a record written in that very
/// instant.
pub(crate) fn slot_keys() -> impl Iterator<Item = String> {
    (0..SLOT_COUNT).map(slot_key)
}

fn slot_key(index: usize) -> String {
    format!("{KEY_PREFIX}{index:04}")
}

/// The two slots a circuit may live in (the same one twice when the bits agree).
fn candidate_slots(id: CircuitId) -> [usize; 2] {
    let slots = SLOT_COUNT as u64;
    [(id.0 % slots) as usize, ((id.0 >> 32) % slots) as usize]
}

/// Where a circuit's record is, as read just now.
enum Place {
    /// A slot holds the circuit.
    Held { key: String, cas: u32, record: Record },
    /// No slot holds it; this one is empty or idle and may be claimed (taking it from an
    /// idle circuit that was left open when `evicts_open`).
    Free { key: String, cas: u32, evicts_open: bool },
    /// No slot holds it and none may be claimed: the circuit is not tracked this time.
    Busy,
}

fn locate(store: &dyn SharedStore, id: CircuitId, now_ms: u64) -> Place {
    let [first, second] = candidate_slots(id);
    let first_place = read_slot(store, first, id, now_ms);
    if matches!(first_place, Place::Held { .. }) || first == second {
        return first_place;
    }
    match (first_place, read_slot(store, second, id, now_ms)) {
        (_, held @ Place::Held { .. }) => held,
        (free @ Place::Free { .. }, _) => free,
        (_, other) => other,
    }
}

fn read_slot(store: &dyn SharedStore, index: usize, id: CircuitId, now_ms: u64) -> Place {
    let key = slot_key(index);
    let Some((value, cas)) = store.get(&key) else {
        // Never claimed: only the startup creates keys (see the module doc).
        return Place::Busy;
    };
    match Record::decode(&value) {
        Some(record) if record.circuit == id.0 => Place::Held { key, cas, record },
        Some(record) if !record.is_idle(now_ms) => Place::Busy,
        Some(record) => Place::Free { key, cas, evicts_open: record.is_open() },
        None => Place::Free { key, cas, evicts_open: false },
    }
}

/// Whether an attempt is refused: open inside its cooldown, or a trial is in flight.
fn refuses(record: &Record, config: &CircuitBreakerConfig, now_ms: u64) -> bool {
    match record.state {
        State::Closed => false,
        State::Open | State::HalfOpen => !has_passed(record.at_ms, config.cooldown_interval, now_ms),
    }
}

/// Whether `span` ms have passed since `at_ms`. A time more than `span` ahead of `now_ms`
/// means the clock was set back: it counts as passed, or a circuit could stay open that long.
/// (A time slightly ahead is only another worker that read the clock a moment later.)
fn has_passed(at_ms: u64, span: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) >= span || at_ms.saturating_sub(now_ms) > span
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// One circuit's slot content (layout in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    circuit: u64,
    state: State,
    /// Consecutive failures; a success resets them.
    failures: u32,
    /// Closed: the latest failure (0 before any); open: when it opened; half-open: when the
    /// trial started.
    at_ms: u64,
    /// So that other circuits can tell when this slot turns idle.
    cooldown_ms: u64,
}

impl Record {
    /// A circuit with nothing recorded yet.
    fn closed(id: CircuitId, config: &CircuitBreakerConfig) -> Record {
        Record { circuit: id.0, state: State::Closed, failures: 0, at_ms: 0, cooldown_ms: config.cooldown_interval }
    }

    /// The record after `outcome`; itself when nothing changes.
    fn after(self, outcome: Outcome, config: &CircuitBreakerConfig, now_ms: u64) -> Record {
        let changed = |state, failures, at_ms| Record {
            circuit: self.circuit,
            state,
            failures,
            at_ms,
            cooldown_ms: config.cooldown_interval,
        };
        match (outcome, self.state) {
            // From attempts admitted before it opened; the trial decides.
            (_, State::Open) => self,
            (Outcome::Success, State::Closed) if self.failures == 0 => self,
            (Outcome::Success, State::Closed | State::HalfOpen) => changed(State::Closed, 0, 0),
            (Outcome::Failure, State::HalfOpen) => changed(State::Open, self.failures.saturating_add(1), now_ms),
            (Outcome::Failure, State::Closed) => {
                // Failures a cooldown apart are unrelated: start a fresh count.
                let earlier = if has_passed(self.at_ms, config.cooldown_interval, now_ms) { 0 } else { self.failures };
                let failures = earlier.saturating_add(1);
                let state = if failures >= config.failure_threshold { State::Open } else { State::Closed };
                changed(state, failures, now_ms)
            }
        }
    }

    /// Open or on trial: not closed.
    fn is_open(&self) -> bool {
        self.state != State::Closed
    }

    /// Another circuit may take the slot (the rule is in the module doc).
    fn is_idle(&self, now_ms: u64) -> bool {
        (self.state == State::Closed && self.failures == 0) || has_passed(self.at_ms, self.cooldown_ms, now_ms)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_LEN);
        out.push(VERSION);
        out.extend_from_slice(&self.circuit.to_le_bytes());
        out.push(self.state as u8);
        out.extend_from_slice(&self.failures.to_le_bytes());
        out.extend_from_slice(&self.at_ms.to_le_bytes());
        out.extend_from_slice(&self.cooldown_ms.to_le_bytes());
        out
    }

    /// None for anything but a well-formed record of this version.
    fn decode(bytes: &[u8]) -> Option<Record> {
        if bytes.len() != RECORD_LEN || bytes.first() != Some(&VERSION) {
            return None;
        }
        let u64_at = |i: usize| bytes.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
        let u32_at = |i: usize| bytes.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes);
        let state = match bytes.get(9).copied()? {
            0 => State::Closed,
            1 => State::Open,
            2 => State::HalfOpen,
            _ => return None,
        };
        Some(Record { circuit: u64_at(1)?, state, failures: u32_at(10)?, at_ms: u64_at(14)?, cooldown_ms: u64_at(22)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    const COOLDOWN: u64 = 30_000;
    /// A plausible wall clock, far from 0.
    const T: u64 = 1_700_000_000_000;

    /// Shared data as Envoy keeps it: one CAS counter for all keys, CAS 0 unconditional, and a
    /// missing key inserted whatever the CAS.
    #[derive(Default)]
    struct FakeStore {
        data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        last_cas: Cell<u32>,
        sets: Cell<usize>,
        mismatches: Cell<usize>,
    }

    impl FakeStore {
        /// A store after the host's startup.
        fn started() -> FakeStore {
            let store = FakeStore::default();
            for key in slot_keys() {
                assert!(store.set(&key, EMPTY_SLOT, 0));
            }
            store.sets.set(0);
            store
        }

        fn stored(&self, id: CircuitId) -> Option<Record> {
            match locate(self, id, T) {
                Place::Held { record, .. } => Some(record),
                Place::Free { .. } | Place::Busy => None,
            }
        }
    }

    impl SharedStore for FakeStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.data.borrow().get(key).cloned()
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
            let mut data = self.data.borrow_mut();
            if let Some((_, current)) = data.get(key) {
                if cas != 0 && cas != *current {
                    self.mismatches.set(self.mismatches.get() + 1);
                    return false;
                }
            }
            self.last_cas.set(self.last_cas.get() + 1);
            data.insert(key.to_string(), (value.to_vec(), self.last_cas.get()));
            self.sets.set(self.sets.get() + 1);
            true
        }
    }

    fn config(failure_threshold: u32) -> CircuitBreakerConfig {
        CircuitBreakerConfig { failure_threshold, cooldown_interval: COOLDOWN, failure_status_codes: None }
    }

    fn fail(store: &dyn SharedStore, id: CircuitId, config: &CircuitBreakerConfig, now_ms: u64) -> Recorded {
        record(store, id, config, Outcome::Failure, now_ms)
    }

    /// An id whose two slots are `first` and `second`; `n` tells apart ids sharing them.
    fn id_in(first: u64, second: u64, n: u64) -> CircuitId {
        CircuitId(first | (n << 11) | (second << 32))
    }

    /// A store with circuit `id` opened at `T` (threshold 1).
    fn opened(id: CircuitId) -> FakeStore {
        let store = FakeStore::started();
        assert!(fail(&store, id, &config(1), T).opened);
        store
    }

    #[test]
    fn opens_at_the_threshold_exactly() {
        let store = FakeStore::started();
        let (id, cb) = (circuit_id("openai", "api.openai.com:443/v1", Some("sk-1")), config(3));
        assert_eq!(fail(&store, id, &cb, T), Recorded { opened: false, open_change: 0, failures: 1 });
        assert_eq!(fail(&store, id, &cb, T + 1), Recorded { opened: false, open_change: 0, failures: 2 });
        assert_eq!(admit(&store, id, &cb, T + 1), Admission::Closed);
        assert!(!is_open(&store, id, &cb, T + 1));
        assert_eq!(fail(&store, id, &cb, T + 2), Recorded { opened: true, open_change: 1, failures: 3 });
        assert!(is_open(&store, id, &cb, T + 2));
        assert_eq!(admit(&store, id, &cb, T + 2), Admission::Open);
        // Late outcomes of attempts admitted before it opened change nothing.
        let sets = store.sets.get();
        assert_eq!(fail(&store, id, &cb, T + 3), Recorded { opened: false, open_change: 0, failures: 3 });
        let late = record(&store, id, &cb, Outcome::Success, T + 3);
        assert_eq!(late, Recorded { opened: false, open_change: 0, failures: 3 });
        assert_eq!(store.sets.get(), sets);
        assert_eq!(admit(&store, id, &cb, T + 3), Admission::Open);
    }

    #[test]
    fn one_trial_after_the_cooldown() {
        let id = CircuitId(42);
        let (store, cb) = (opened(id), config(1));
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN - 1), Admission::Open);
        assert!(!is_open(&store, id, &cb, T + COOLDOWN));
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN), Admission::Trial);
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN), Admission::Open);
        assert!(is_open(&store, id, &cb, T + COOLDOWN + 1));
        // A trial that never reports back expires after a cooldown; then exactly one more.
        assert_eq!(admit(&store, id, &cb, T + 2 * COOLDOWN - 1), Admission::Open);
        assert_eq!(admit(&store, id, &cb, T + 2 * COOLDOWN), Admission::Trial);
        assert_eq!(admit(&store, id, &cb, T + 2 * COOLDOWN), Admission::Open);
    }

    #[test]
    fn trial_success_closes() {
        let id = CircuitId(42);
        let (store, cb) = (opened(id), config(1));
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN), Admission::Trial);
        let done = record(&store, id, &cb, Outcome::Success, T + COOLDOWN + 5);
        assert_eq!(done, Recorded { opened: false, open_change: -1, failures: 0 });
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN + 6), Admission::Closed);
        assert!(!is_open(&store, id, &cb, T + COOLDOWN + 6));
    }

    #[test]
    fn trial_failure_reopens_for_a_new_cooldown() {
        let id = CircuitId(42);
        let (store, cb) = (opened(id), config(1));
        let reopened = T + COOLDOWN + 5;
        assert_eq!(admit(&store, id, &cb, T + COOLDOWN), Admission::Trial);
        // Opened again, but it was never closed in between.
        assert_eq!(fail(&store, id, &cb, reopened), Recorded { opened: true, open_change: 0, failures: 2 });
        assert_eq!(admit(&store, id, &cb, reopened + COOLDOWN - 1), Admission::Open);
        assert_eq!(admit(&store, id, &cb, reopened + COOLDOWN), Admission::Trial);
    }

    #[test]
    fn stale_failures_start_a_fresh_count() {
        let (store, cb) = (FakeStore::started(), config(3));
        let (stale, recent) = (CircuitId(1), CircuitId(2));
        for id in [stale, recent] {
            fail(&store, id, &cb, T);
            fail(&store, id, &cb, T + 10);
        }
        let fresh = fail(&store, stale, &cb, T + 10 + COOLDOWN);
        assert_eq!(fresh, Recorded { opened: false, open_change: 0, failures: 1 });
        let opened = fail(&store, recent, &cb, T + 10 + COOLDOWN - 1);
        assert_eq!(opened, Recorded { opened: true, open_change: 1, failures: 3 });
    }

    #[test]
    fn success_resets_the_count() {
        let (store, cb, id) = (FakeStore::started(), config(3), CircuitId(7));
        fail(&store, id, &cb, T);
        fail(&store, id, &cb, T);
        assert_eq!(
            record(&store, id, &cb, Outcome::Success, T),
            Recorded { opened: false, open_change: 0, failures: 0 }
        );
        assert_eq!(fail(&store, id, &cb, T), Recorded { opened: false, open_change: 0, failures: 1 });
        assert_eq!(fail(&store, id, &cb, T), Recorded { opened: false, open_change: 0, failures: 2 });
        // Successes of a healthy target, tracked or not, write nothing.
        record(&store, id, &cb, Outcome::Success, T);
        let sets = store.sets.get();
        record(&store, id, &cb, Outcome::Success, T);
        record(&store, CircuitId(8), &cb, Outcome::Success, T);
        assert_eq!(store.sets.get(), sets);
        assert!(store.stored(CircuitId(8)).is_none());
    }

    #[test]
    fn classifies_statuses() {
        let default = config(1);
        for (status, outcome) in [
            (None, Outcome::Failure),
            (Some(500), Outcome::Failure),
            (Some(503), Outcome::Failure),
            (Some(599), Outcome::Failure),
            (Some(200), Outcome::Success),
            (Some(204), Outcome::Success),
            (Some(304), Outcome::Success),
            (Some(404), Outcome::Success),
            (Some(429), Outcome::Success),
        ] {
            assert_eq!(classify(&default, status), outcome, "{status:?}");
        }
        let listed = CircuitBreakerConfig { failure_status_codes: Some(vec![429, 502]), ..config(1) };
        for (status, outcome) in [
            (None, Outcome::Failure),
            (Some(429), Outcome::Failure),
            (Some(502), Outcome::Failure),
            (Some(500), Outcome::Success),
            (Some(200), Outcome::Success),
        ] {
            assert_eq!(classify(&listed, status), outcome, "{status:?}");
        }
    }

    #[test]
    fn colliding_circuits_share_two_slots() {
        let (store, cb) = (FakeStore::started(), config(1));
        let [a, b, c] = [id_in(5, 7, 1), id_in(5, 7, 2), id_in(5, 7, 3)];
        assert!(fail(&store, a, &cb, T).opened);
        assert_eq!(fail(&store, b, &config(2), T).failures, 1);
        // Both slots hold circuits with recent failures: `c` is not tracked.
        assert_eq!(fail(&store, c, &cb, T), Recorded { opened: false, open_change: 0, failures: 0 });
        assert_eq!(admit(&store, c, &cb, T), Admission::Closed);
        assert!(!is_open(&store, c, &cb, T));
        // Once `b` is closed without failures, its slot is free for `c`.
        record(&store, b, &cb, Outcome::Success, T + 1);
        assert!(fail(&store, c, &cb, T + 1).opened);
        assert_eq!(admit(&store, c, &cb, T + 1), Admission::Open);
        assert_eq!(admit(&store, a, &cb, T + 1), Admission::Open);
        // `a` opened a cooldown ago: idle, so `b` may take its slot, and `a` starts over closed
        // (the circuits open stay as many: `b` is, `a` no longer).
        assert_eq!(fail(&store, b, &cb, T + COOLDOWN), Recorded { opened: true, open_change: 0, failures: 1 });
        assert_eq!(admit(&store, a, &cb, T + COOLDOWN), Admission::Closed);
        assert_eq!(admit(&store, b, &cb, T + COOLDOWN), Admission::Open);
        assert_eq!(admit(&store, c, &cb, T + COOLDOWN), Admission::Open);
        // A circuit whose two slots are one and the same works too.
        let single = id_in(9, 9, 0);
        assert!(fail(&store, single, &cb, T).opened);
        assert_eq!(admit(&store, single, &cb, T), Admission::Open);
    }

    #[test]
    fn memory_stays_bounded() {
        let (store, cb) = (FakeStore::started(), config(1_000));
        let ids: Vec<CircuitId> = (0..100_000).map(|i| circuit_id("openai", &format!("host-{i}:443"), None)).collect();
        let tracked = ids.iter().filter(|&&id| fail(&store, id, &cb, T).failures == 1).count();
        assert!(tracked > SLOT_COUNT * 9 / 10 && tracked <= SLOT_COUNT, "{tracked}");
        let keys: Vec<String> = slot_keys().collect();
        assert_eq!(keys.len(), SLOT_COUNT);
        let data = store.data.borrow();
        assert_eq!(data.len(), keys.len());
        assert!(keys.iter().all(|key| data.contains_key(key)));
        drop(data);
        // A cooldown later the stale failures are idle: new circuits get slots again.
        let later = (0..100).filter(|i| fail(&store, CircuitId(*i), &cb, T + COOLDOWN).failures == 1).count();
        assert_eq!(later, 100);
    }

    #[test]
    fn missing_keys_are_never_created() {
        let (store, cb, id) = (FakeStore::default(), config(1), CircuitId(3));
        assert_eq!(fail(&store, id, &cb, T), Recorded { opened: false, open_change: 0, failures: 0 });
        assert_eq!(admit(&store, id, &cb, T), Admission::Closed);
        assert!(store.data.borrow().is_empty());
    }

    /// Another worker that records a failure of the same circuit between this caller's get and
    /// set, `rivals` times.
    struct Contended<'a> {
        store: &'a FakeStore,
        id: CircuitId,
        config: &'a CircuitBreakerConfig,
        rivals: Cell<u32>,
        rival_results: RefCell<Vec<Recorded>>,
    }

    impl SharedStore for Contended<'_> {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.store.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
            if self.rivals.get() > 0 {
                self.rivals.set(self.rivals.get() - 1);
                self.rival_results.borrow_mut().push(fail(self.store, self.id, self.config, T));
            }
            self.store.set(key, value, cas)
        }
    }

    #[test]
    fn contention_loses_no_count_and_opens_once() {
        let (store, cb, id) = (FakeStore::started(), config(10), CircuitId(0xfeed));
        let mut results = Vec::new();
        for round in 1..=4 {
            let contended =
                Contended { store: &store, id, config: &cb, rivals: Cell::new(2), rival_results: RefCell::default() };
            results.push(fail(&contended, id, &cb, T));
            results.extend(contended.rival_results.into_inner());
            if round == 3 {
                // Nine failures, each of ours retried past two rivals.
                assert_eq!(store.stored(id).map(|r| (r.state, r.failures)), Some((State::Closed, 9)));
                assert_eq!(store.mismatches.get(), 6);
            }
        }
        assert_eq!(results.iter().filter(|r| r.opened).count(), 1, "{results:?}");
        assert_eq!(results.iter().map(|r| r.open_change).sum::<i32>(), 1, "{results:?}");
        assert_eq!(store.stored(id).map(|r| (r.state, r.failures)), Some((State::Open, 10)));
    }

    /// A store where every CAS write loses.
    struct AlwaysLoses {
        store: FakeStore,
        attempts: Cell<usize>,
    }

    impl SharedStore for AlwaysLoses {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.store.get(key)
        }

        fn set(&self, _key: &str, _value: &[u8], _cas: u32) -> bool {
            self.attempts.set(self.attempts.get() + 1);
            false
        }
    }

    #[test]
    fn endless_contention_gives_up() {
        let id = CircuitId(42);
        let losing = AlwaysLoses { store: opened(id), attempts: Cell::new(0) };
        assert_eq!(admit(&losing, id, &config(1), T + COOLDOWN), Admission::Open);
        assert_eq!(losing.attempts.get(), MAX_CAS_ATTEMPTS);
        let fresh = CircuitId(43);
        assert_eq!(fail(&losing, fresh, &config(1), T), Recorded { opened: false, open_change: 0, failures: 0 });
        assert_eq!(losing.attempts.get(), 2 * MAX_CAS_ATTEMPTS);
    }

    #[test]
    fn garbage_in_a_slot_is_an_empty_slot() {
        let cb = config(2);
        let mut wrong_version = Record::closed(CircuitId(0), &cb).encode();
        wrong_version[0] = 9;
        let mut wrong_state = Record::closed(CircuitId(0), &cb).encode();
        wrong_state[9] = 7;
        let mut too_long = Record::closed(CircuitId(0), &cb).encode();
        too_long.push(0);
        for garbage in [vec![], EMPTY_SLOT.to_vec(), vec![0xff; RECORD_LEN], wrong_version, wrong_state, too_long] {
            let store = FakeStore::started();
            let id = id_in(11, 12, 0);
            for key in [slot_key(11), slot_key(12)] {
                store.set(&key, &garbage, 0);
            }
            assert_eq!(admit(&store, id, &cb, T), Admission::Closed);
            assert!(!is_open(&store, id, &cb, T));
            assert_eq!(
                fail(&store, id, &cb, T),
                Recorded { opened: false, open_change: 0, failures: 1 },
                "{garbage:?}"
            );
            assert!(fail(&store, id, &cb, T).opened);
        }
    }

    #[test]
    fn records_round_trip() {
        let record =
            Record { circuit: u64::MAX - 1, state: State::HalfOpen, failures: 7, at_ms: T, cooldown_ms: COOLDOWN };
        let bytes = record.encode();
        assert_eq!(bytes.len(), RECORD_LEN);
        assert_eq!(Record::decode(&bytes), Some(record));
        assert_eq!(slot_keys().next().as_deref(), Some("gateway.cb.0000"));
        assert_eq!(slot_keys().last().as_deref(), Some("gateway.cb.2047"));
    }

    #[test]
    fn circuit_ids_tell_targets_apart_and_keep_no_secret() {
        let id = circuit_id("openai", "api.openai.com:443/v1", Some("sk-secret"));
        assert_eq!(id, circuit_id("openai", "api.openai.com:443/v1", Some("sk-secret")));
        for other in [
            circuit_id("openai", "api.openai.com:443/v1", Some("sk-other")),
            circuit_id("openai", "api.openai.com:443/v1", Some("")),
            circuit_id("openai", "api.openai.com:443/v1", None),
            circuit_id("openai", "api.openai.com:443/v", Some("1sk-secret")),
            circuit_id("anthropic", "api.openai.com:443/v1", Some("sk-secret")),
        ] {
            assert_ne!(id, other);
        }
        let store = FakeStore::started();
        fail(&store, id, &config(1), T);
        let data = store.data.borrow();
        assert!(data.values().all(|(value, _)| !value.windows(9).any(|w| w == b"sk-secret")));
    }

    #[test]
    fn a_clock_set_back_cannot_keep_a_circuit_open() {
        let id = CircuitId(42);
        let (store, cb) = (opened(id), config(1));
        // Another worker's clock a moment behind: still open.
        assert_eq!(admit(&store, id, &cb, T - 5), Admission::Open);
        // Set back by more than a cooldown: the opening time is meaningless, a trial may go.
        assert_eq!(admit(&store, id, &cb, T - COOLDOWN - 1), Admission::Trial);
    }
}
