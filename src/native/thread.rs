//! A worker thread's state per filter config (streams, calls in flight, orphans, the idle
//! calls) and running one event on its worker.

use super::calls::{self, ffi::EnvoyFilter};
use super::io::NativeIo;
use super::relay::{Mailbox, Relay};
use super::ticker::{after, unix_ms, Ticker, ANSWER_ORPHANED};
use super::MetricIds;
use crate::exchange::{Action, After, Output, Worker};
use hashbrown::HashMap;
use std::cell::{Cell, RefCell};
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

/// One stream, as its thread's state knows it.
pub(super) struct Stream {
    pub(super) envoy: EnvoyFilter,
    /// The filter held a request (response) body chunk: Envoy buffers it, and later chunks are
    /// moved to that buffer so the core sees the whole body so far, as proxy-wasm shows it.
    pub(super) request_buffered: bool,
    pub(super) response_buffered: bool,
}

/// A call in flight: the worker's token, and whether it is the root's, carried by the stream
/// that started it (the ABI starts a worker thread's calls only on a stream's behalf, and
/// cancels them when the stream ends; the root's call is then lost, see `Orphans`).
#[derive(Clone, Copy)]
pub(super) struct Call {
    pub(super) token: u32,
    pub(super) carried: bool,
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
    pub(super) random: u64,
    pub(super) metrics: MetricIds,
    /// This state's number, its config's relay and its mailbox there.
    pub(super) number: u64,
    pub(super) relay: Arc<Relay>,
    pub(super) mailbox: Arc<Mailbox>,
    /// The control plane's cluster: the root's calls to it are relayed.
    pub(super) relayed: Option<String>,
    /// The last stream ended and the worker's idle calls wait in the relay (see `went_idle`).
    pub(super) idle: bool,
}

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
        ticker.keep_awake(current.map(|envoy| (filter.id, envoy)), mailbox);
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

/// The last stream of `filter`'s worker thread ended: the calls its timer would make later (see
/// `Worker::idle_calls`) wait in the relay, which sends them when the ticker's thread says the
/// grace is over; a stream that starts first drops them (see `filter_new`).
pub(super) fn went_idle(filter: &Filter) {
    THREADS.with(|threads| {
        let Ok(mut threads) = threads.try_borrow_mut() else {
            return;
        };
        let Some(state) = threads.get_mut(&filter.config) else {
            return;
        };
        let now_ms = unix_ms();
        let calls = state.worker.idle_calls(now_ms);
        if !calls.is_empty() {
            state.relay.defer(state.number, now_ms, calls);
            state.idle = true;
            state.ticker.shared.idle_until(after(IDLE_GRACE_MS));
        }
    });
}
