//! A worker thread's state per filter config (streams, calls in flight, orphans, the idle
//! calls) and running one event on its worker.

use super::calls::{self, ffi::EnvoyFilter};
use super::io::{Call, NativeIo, Stream};
use super::relay::{Mailbox, Relay};
use super::ticker::{after, unix_ms, Ticker, ANSWER_ORPHANED};
use super::{MetricIds, ROOT};
use crate::entropy::Entropy;
use crate::exchange::{Action, After, Output, Worker};
use crate::settings::Settings;
use hashbrown::HashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One stream, as the module holds it between hooks.
pub(super) struct Filter {
    /// Its config's number: which of the thread's workers the stream belongs to.
    pub(super) config: u64,
    pub(super) id: u32,
    /// Its config is the lookup gate's (`lookup_gate`): a request it holds at its headers is
    /// held with flow control, so that an upload above Envoy's buffer limit waits for the
    /// control plane's read instead of being refused (the wasm filter's gate gets the same from
    /// Envoy for lack of `allow_on_headers_stop_iteration`).
    pub(super) gate: bool,
}

/// The root's calls whose carrying stream ended before their answer, reported lost in the
/// `scheduled` hook of another live stream (`waker`): a fetch that requests still wait for is
/// sent again from the worker's next tick, which that stream carries (not from the ended
/// stream's `destroy` hook, where it would have no stream to ride on).
#[derive(Default)]
pub(super) struct Orphans {
    pub(super) tokens: Vec<u32>,
    pub(super) waker: Option<(u32, calls::Scheduler)>,
}

impl Orphans {
    /// Asks one live stream for a `scheduled` hook, if orphans wait and none was asked.
    pub(super) fn wake(&mut self, streams: &HashMap<u32, Stream>) {
        if self.tokens.is_empty() || self.waker.is_some() {
            return;
        }
        if let Some((id, stream)) = streams.iter().next() {
            self.waker = calls::Scheduler::new(stream.envoy).map(|scheduler| {
                scheduler.commit(ANSWER_ORPHANED);
                (*id, scheduler)
            });
        }
    }
}

/// A worker thread's state for one filter config.
pub(super) struct ThreadState {
    pub(super) worker: Worker,
    pub(super) ticker: Ticker,
    pub(super) streams: HashMap<u32, Stream>,
    /// Calls in flight, by (carrying stream id, Envoy's callout id).
    pub(super) calls: HashMap<(u32, u64), Call>,
    pub(super) orphans: Orphans,
    pub(super) next_id: u32,
    pub(super) next_token: u32,
    pub(super) random: Entropy,
    pub(super) metrics: MetricIds,
    /// This state's number, its config's relay and its mailbox there.
    pub(super) number: u64,
    pub(super) relay: Arc<Relay>,
    pub(super) mailbox: Arc<Mailbox>,
    /// The control plane's cluster: the root's calls to it are relayed.
    pub(super) relayed: Option<String>,
    /// The last stream ended and the worker's idle calls wait in the relay (see `went_idle`).
    idle: bool,
}

impl ThreadState {
    /// A new worker thread's state for a config (`relay`: the config's); None when the config's
    /// settings do not parse (Envoy's `config_new` parsed them already).
    pub(super) fn new(settings: &[u8], relay: &Arc<Relay>, metrics: &MetricIds) -> Option<ThreadState> {
        let settings = Settings::parse(settings).ok()?;
        let relayed = settings.control_plane.as_ref().map(|cp| cp.cluster.clone());
        let worker = Worker::new(Rc::new(settings)).rooted(ROOT);
        let number = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
        let relay = Arc::clone(relay);
        let idle_relay = Arc::downgrade(&relay);
        let ticker = Ticker::start(move || {
            if let Some(relay) = idle_relay.upgrade() {
                relay.release(number);
            }
        });
        let mailbox = relay.mailbox(number, Arc::clone(&ticker.shared));
        Some(ThreadState {
            worker,
            ticker,
            streams: HashMap::new(),
            calls: HashMap::new(),
            orphans: Orphans::default(),
            next_id: 1,
            next_token: 1,
            random: Entropy::new(),
            metrics: Arc::clone(metrics),
            number,
            relay,
            mailbox,
            relayed,
            idle: false,
        })
    }

    /// A stream starts (Envoy's `envoy` filter): its id. An idle worker's calls that wait in
    /// the relay are dropped; those that went already say so to the worker.
    pub(super) fn stream_started(&mut self, envoy: EnvoyFilter) -> u32 {
        if std::mem::take(&mut self.idle) {
            self.ticker.shared.idle_until(None);
            if let Some((idle_ms, stored)) = self.relay.woke(self.number) {
                self.worker.idle_sent(idle_ms, stored);
            }
        }
        let id = self.next_id;
        self.next_id = id.wrapping_add(1).max(1);
        self.streams.insert(id, Stream { envoy, request_buffered: false, response_buffered: false });
        id
    }

    /// Stream `id` ended: its calls go with it (the root's it carried are orphans, reported to
    /// the worker from another live stream); true when it was the last one and the worker has
    /// idle calls to make (see `went_idle`).
    pub(super) fn stream_ended(&mut self, id: u32) -> bool {
        self.ticker.forget(id);
        self.streams.remove(&id);
        // Another live stream ticks from now on: a request paused for a timer (a retry's
        // delay, a relayed answer) gets no hook of its own that would adopt the ticker.
        let next = self.streams.iter().next().map(|(id, stream)| (*id, stream.envoy));
        self.ticker.keep_awake(next, self.mailbox.state());
        let orphans = &mut self.orphans;
        self.calls.retain(|(carrier, _), call| {
            let ended = *carrier == id;
            if ended && call.carried {
                orphans.tokens.push(call.token);
            }
            !ended
        });
        if orphans.waker.as_ref().is_some_and(|(waker, _)| *waker == id) {
            orphans.waker = None;
        }
        orphans.wake(&self.streams);
        self.streams.is_empty() && self.relayed.is_some()
    }

    /// The last stream ended at `now_ms`: the calls the worker's timer would make later (see
    /// `Worker::idle_calls`) wait in the relay, which sends them when the ticker's thread says the
    /// grace is over; a stream that starts first drops them (`stream_started`).
    pub(super) fn went_idle(&mut self, now_ms: u64) {
        let Some(calls) = self.worker.idle_calls(now_ms) else {
            return;
        };
        if self.relay.defer(self.number, now_ms, calls) {
            self.idle = true;
            self.ticker.shared.idle_until(after(IDLE_GRACE_MS));
        }
    }
}

/// Numbers each worker thread's state (the relay finds its mailbox by it).
static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// By config number.
    pub(super) static THREADS: RefCell<HashMap<u64, ThreadState>> = RefCell::new(HashMap::new());
}

/// Runs `event` on the worker of `filter`'s config, with the host as the hook sees it; then
/// `then` with the thread's streams and what the event returned.
pub(super) fn with_worker<R, T>(
    filter: &Filter,
    event: impl FnOnce(&mut Worker, &mut NativeIo) -> R,
    then: impl FnOnce(&mut HashMap<u32, Stream>, R) -> T,
) -> Option<T> {
    THREADS.with(|threads| {
        let mut threads = threads.try_borrow_mut().ok()?;
        let state = threads.get_mut(&filter.config)?;
        let ThreadState {
            worker,
            ticker,
            streams,
            calls,
            orphans,
            next_token,
            random,
            metrics,
            number,
            relay,
            mailbox,
            relayed,
            ..
        } = state;
        let current = streams.get(&filter.id).map(|s| s.envoy);
        // Orphans left while no other stream lived (a stream's scheduler is made in its hooks,
        // once Envoy has given it its callbacks).
        orphans.wake(streams);
        let mut io = NativeIo {
            current,
            current_id: filter.id,
            metrics,
            relay: Relay::asker(relay, mailbox, *number, relayed.as_deref()),
            ticker,
            streams,
            calls,
            next_token,
            random,
            now_ms: Cell::new(None),
        };
        let result = event(worker, &mut io);
        // After the event: what it asked for (ticks, relayed calls) counts.
        ticker.keep_awake(current.map(|envoy| (filter.id, envoy)), mailbox.state());
        Some(then(streams, result))
    })
}

/// Runs `event` on the worker of `filter`'s config, `mark` on the stream's state with its
/// result, then the effects that may re-enter the filter once the worker is free again.
pub(super) fn run(
    filter: &Filter,
    event: impl FnOnce(&mut Worker, &mut NativeIo) -> Output,
    mark: impl FnOnce(&mut Stream, Action),
) -> Option<Action> {
    let output = with_worker(filter, event, |streams, output| {
        if let Some(stream) = streams.get_mut(&filter.id) {
            mark(stream, output.action);
        }
        let afters: Vec<(EnvoyFilter, After)> = output
            .after
            .into_iter()
            .filter_map(|after| {
                let id = match &after {
                    After::Reply { id, .. } | After::ResumeRequest(id) => *id,
                };
                streams.get(&id).map(|s| (s.envoy, after))
            })
            .collect();
        (output.action, afters)
    });
    let (action, afters) = output?;
    for (envoy, after) in afters {
        match after {
            After::Reply { status, headers, body, .. } => {
                let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
                calls::send_response(envoy, status, &headers, &body, "gateway_reply");
            }
            After::ResumeRequest(_) => calls::continue_decoding(envoy),
        }
    }
    Some(action)
}

/// `run` for an event that leaves the stream's state as it was.
pub(super) fn unmarked(_: &mut Stream, _: Action) {}

/// The relayed answers in the thread's mailbox, each to the worker (see `relay`) at the time it
/// arrived: one taken by a worker's next stream may have waited there, and a lease granted then
/// ends a TTL after then, as the control plane counts it.
pub(super) fn answer_mail(worker: &mut Worker, io: &mut NativeIo) -> Output {
    let mut after = Vec::new();
    for (token, answer, arrived_ms) in io.relay.mail() {
        io.now_ms.set(Some(arrived_ms));
        after.extend(worker.call_answered(token, answer, io).after);
    }
    io.now_ms.set(None);
    Output { action: Action::Continue, after }
}

/// How long a worker without streams waits for its next request before its idle calls go: under
/// load a worker is without streams for moments only, and each idle call costs the control plane
/// a write (a lease given back is asked again by the next request).
const IDLE_GRACE_MS: u64 = 1000;

/// Whether a tick of `filter`'s worker came that it has not run yet, which the caller then runs
/// (see `TickerShared::take_tick`).
pub(super) fn tick_pending(filter: &Filter) -> bool {
    THREADS.with(|threads| {
        let threads = threads.try_borrow().ok()?;
        Some(threads.get(&filter.config)?.ticker.shared.take_tick())
    }) == Some(true)
}

/// The last stream of `filter`'s worker thread ended (see `ThreadState::went_idle`).
pub(super) fn went_idle(filter: &Filter) {
    THREADS.with(|threads| {
        if let Some(state) = threads.try_borrow_mut().ok().as_mut().and_then(|threads| threads.get_mut(&filter.config))
        {
            state.went_idle(unix_ms());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::metrics::Kind;
    use crate::exchange::{Dispatch, Io};
    use crate::ports::testing::FakeHost;
    use crate::ports::Host;
    use crate::unit_tests::test;
    use std::time::{Duration, Instant};

    const CP: &str = r#"{"api_keys": ["gw-key"],
        "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret",
                          "fresh_ms": 5000, "grace_ms": 600000, "timeout_ms": 3000}}"#;
    const NO_CP: &str = r#"{"api_keys": ["gw-key"]}"#;

    fn state(settings: &str) -> ThreadState {
        let control_plane = Settings::parse(settings.as_bytes()).unwrap().control_plane;
        let relay = Arc::new(Relay::new(std::ptr::null_mut(), control_plane));
        ThreadState::new(settings.as_bytes(), &relay, &MetricIds::from(Vec::new())).unwrap()
    }

    /// Envoy's filter of a stream; no Envoy runs in these tests, so no callback reads it.
    fn envoy() -> EnvoyFilter {
        std::ptr::null_mut()
    }

    /// Runs `test` with `state` as this thread's state of config 1 (each test has its thread).
    fn on_thread<T>(state: ThreadState, test: impl FnOnce() -> T) -> T {
        THREADS.with(|threads| threads.borrow_mut().insert(1, state));
        let result = test();
        THREADS.with(|threads| threads.borrow_mut().clear());
        result
    }

    fn with_state<T>(then: impl FnOnce(&mut ThreadState) -> T) -> T {
        THREADS.with(|threads| then(threads.borrow_mut().get_mut(&1).unwrap()))
    }

    /// A request with a key, answered at its headers (no call to the control plane can start
    /// here: a 503), as the worker's host shows it; nothing else is asked of the host.
    struct Answered(FakeHost);

    impl Io for Answered {
        fn host(&mut self) -> &mut dyn Host {
            &mut self.0
        }
        fn request_headers(&mut self, _id: u32) -> Vec<(String, Vec<u8>)> {
            vec![
                (":method".into(), b"POST".to_vec()),
                (":path".into(), b"/v1/chat/completions".to_vec()),
                ("x-gateway-api-key".into(), b"gw-key".to_vec()),
            ]
        }
        fn request_body(&mut self, _id: u32, _size: usize) -> Vec<u8> {
            Vec::new()
        }
        fn set_request_headers(&mut self, _id: u32, _headers: &[(&str, &[u8])]) {}
        fn set_request_header(&mut self, _id: u32, _name: &str, _value: &str) {}
        fn set_request_body(&mut self, _id: u32, _size: usize, _body: &[u8]) {}
        fn response_headers(&mut self, _id: u32) -> Vec<(String, Vec<u8>)> {
            Vec::new()
        }
        fn response_details(&mut self, _id: u32) -> String {
            String::new()
        }
        fn response_body(&mut self, _id: u32, _size: usize) -> Vec<u8> {
            Vec::new()
        }
        fn set_response_header(&mut self, _id: u32, _name: &str, _value: Option<&str>) {}
        fn set_response_body(&mut self, _id: u32, _size: usize, _body: &[u8]) {}
        fn dispatch(&mut self, _id: u32, _call: &Dispatch) -> Option<u32> {
            None
        }
        fn tick_every(&mut self, _period_ms: u64) {}
        fn metric(&mut self, _kind: Kind, _name: &str, _value: u64) {}
        fn add_to_gauge(&mut self, _name: &str, _delta: i64) {}
        fn access_log(&mut self, _line: &[u8]) {}
        fn publish_header(&mut self, _id: u32, _name: &str, _value: &str) {}
    }

    /// A stream of the thread's whose request the gateway answered ended: its record is queued
    /// for the control plane. Its id.
    fn answered_request() -> u32 {
        with_state(|state| {
            let id = state.stream_started(envoy());
            let mut io = Answered(FakeHost::new(7));
            io.0.now_ms.set(unix_ms());
            let output = state.worker.request_headers(id, true, &mut io);
            assert_eq!(output.action, Action::Pause, "answered at its headers");
            assert_eq!(state.worker.finished(id, &mut io).map(|record| record.status), Some(503));
            id
        })
    }

    #[test]
    fn stream_ids_start_at_one_and_never_take_the_roots() {
        let mut state = state(NO_CP);
        assert_eq!(state.stream_started(envoy()), 1);
        state.next_id = u32::MAX;
        assert_eq!(state.stream_started(envoy()), u32::MAX);
        assert_eq!(state.stream_started(envoy()), 1, "past the last id, 0 is the root's");
    }

    #[test]
    fn a_stream_that_ends_takes_its_calls_with_it_and_the_roots_it_carried_become_orphans() {
        let mut state = state(CP);
        let (one, two) = (state.stream_started(envoy()), state.stream_started(envoy()));
        state.calls.insert((one, 10), Call { token: 5, carried: true });
        state.calls.insert((one, 11), Call { token: 6, carried: false });
        state.calls.insert((two, 12), Call { token: 7, carried: true });
        assert!(!state.stream_ended(one), "another stream lives");
        assert_eq!(state.orphans.tokens, [5], "the root's call is reported lost, the stream's own goes");
        assert_eq!(state.calls.keys().copied().collect::<Vec<_>>(), [(two, 12)]);
        assert!(state.stream_ended(two), "the last stream, with a control plane to call");
        assert_eq!(state.orphans.tokens, [5, 7]);
    }

    #[test]
    fn without_a_control_plane_a_worker_has_no_idle_calls_to_make() {
        let mut state = state(NO_CP);
        let id = state.stream_started(envoy());
        assert!(!state.stream_ended(id));
    }

    /// The records in the calls the relay started (each call answered `Some(1)`).
    fn records_started(relay: &Relay) -> Vec<Vec<serde_json::Value>> {
        let mut started = Vec::new();
        relay.start_asked(|call| {
            let body: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
            assert_eq!(call.cluster, "gateway_control_plane");
            started.push(body["records"].as_array().unwrap().clone());
            Some(1)
        });
        started
    }

    #[test]
    fn a_worker_whose_last_stream_ends_sends_its_records_copy_when_the_ticker_says_a_second_passed() {
        on_thread(state(CP), || {
            let id = answered_request();
            let relay = with_state(|state| {
                assert!(state.stream_ended(id));
                Arc::clone(&state.relay)
            });
            let idle_ms = unix_ms();
            let idled = Instant::now();
            with_state(|state| state.went_idle(idle_ms));
            assert_eq!(relay.commits(0, Duration::ZERO), 0, "nothing goes before the grace is over");
            assert_eq!(relay.commits(1, Duration::from_secs(10)), 1, "the ticker's thread released them");
            assert!(idled.elapsed() >= Duration::from_millis(IDLE_GRACE_MS));
            let [records]: [Vec<serde_json::Value>; 1] = records_started(&relay).try_into().unwrap();
            assert_eq!(records.len(), 1, "the record's copy went");
            assert_eq!(records[0]["status"], 503);
            relay.answered(1, crate::exchange::CallAnswer { status: 200, headers: Vec::new(), body: b"{}".to_vec() });

            // The next stream tells the worker: the records copied are the control plane's.
            with_state(|state| {
                let id = state.stream_started(envoy());
                assert!(state.stream_ended(id));
                state.went_idle(unix_ms());
                assert!(!state.idle, "nothing is left to copy");
            });
        });
    }

    #[test]
    fn a_stream_that_starts_within_the_grace_drops_the_idle_calls_and_the_relay_keeps_the_records() {
        on_thread(state(CP), || {
            let id = answered_request();
            let (relay, next) = with_state(|state| {
                assert!(state.stream_ended(id));
                state.went_idle(unix_ms());
                assert!(state.ticker.shared.idle_due().is_some());
                let next = state.stream_started(envoy());
                assert_eq!(state.ticker.shared.idle_due(), None, "the ticker's thread has nothing to release");
                (Arc::clone(&state.relay), next)
            });
            // Had the ticker's thread released them late, nothing would go.
            let number = with_state(|state| state.number);
            relay.release(number);
            assert_eq!(relay.commits(0, Duration::ZERO), 0);

            // A second request: the worker hands over only that one, and both records go.
            let second = answered_request();
            with_state(|state| {
                assert!(!state.stream_ended(next));
                assert!(state.stream_ended(second));
                state.went_idle(unix_ms());
            });
            relay.release(number);
            let [records]: [Vec<serde_json::Value>; 1] = records_started(&relay).try_into().unwrap();
            assert_eq!(records.len(), 2);
        });
    }
}
