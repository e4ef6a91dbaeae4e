//! The native host adapter: the same core as the wasm filter (`host/`), loaded by Envoy 1.40 as
//! a dynamic module (`envoy.filters.http.dynamic_modules`). Its hooks feed events to the
//! exchange's [`Worker`] and run what comes back; every call into Envoy goes through `calls`.
//!
//! Each Envoy worker thread has its own `Worker` per filter config, as each has its own wasm VM.
//! Metrics are Envoy's labelled stats, defined per config from `metrics::FAMILIES` (no
//! `stats_tags` needed). The root's calls to the control plane (its entries, record batches,
//! leases, kept responses) go out from the main thread (see `relay`); its other calls (a fetch
//! several requests share: a JWKS, an access token) ride on the stream whose hook starts them
//! (see `Call`). Not yet here (issue 29): an async hook's call, which outlives its request.

mod calls;
mod relay;

use crate::exchange::metrics::{self, Kind};
use crate::exchange::{self, Action, After, Dispatch, Io, Output, Worker};
use crate::ports::{compare_and_set, Entries, Host, SharedStore};
use crate::settings::Settings;
use calls::ffi::{self, EnvoyFilter};
use hashbrown::HashMap;
use relay::{Mailbox, Relay};
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The worker's root id: stream ids start at 1.
const ROOT: u32 = 0;

/// What a filter config holds: its settings' bytes (each worker thread parses its own copy, as
/// each wasm VM does), its number, and the ids of its stats.
struct Config {
    id: u64,
    bytes: Vec<u8>,
    /// The lookup gate's config (see `Filter::gate`).
    gate: bool,
    metrics: MetricIds,
    relay: Arc<Relay>,
}

/// The id Envoy gave each family of `metrics::FAMILIES`, in its order (None: Envoy refused it).
type MetricIds = Arc<[Option<usize>]>;

/// The configs Envoy holds now, by number (a config's address may be reused by the next one).
static LIVE_CONFIGS: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static NEXT_CONFIG: AtomicU64 = AtomicU64::new(1);
/// Numbers each worker thread's state (the relay finds its mailbox by it).
static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

/// One stream, as the module holds it between hooks.
struct Filter {
    /// Its config's number: which of the thread's workers the stream belongs to.
    config: u64,
    id: u32,
    /// Its config is the lookup gate's (`lookup_gate`): a request it holds at its headers is
    /// held with flow control, so that an upload above Envoy's buffer limit waits for the
    /// control plane's read instead of being refused (the wasm filter's gate gets the same from
    /// Envoy for lack of `allow_on_headers_stop_iteration`).
    gate: bool,
}

/// One stream, as its thread's state knows it.
struct Stream {
    envoy: EnvoyFilter,
    /// The filter held a request (response) body chunk: Envoy buffers it, and later chunks are
    /// moved to that buffer so the core sees the whole body so far, as proxy-wasm shows it.
    request_buffered: bool,
    response_buffered: bool,
}

/// A worker thread's timer: the wasm root's tick, which the ABI lacks (no timer or scheduler
/// of a worker thread's own). A thread sleeps for the period, then commits the scheduler of one
/// live stream of the worker thread (the ticking stream), whose `scheduled` hook runs the
/// worker's tick on the worker thread. When that stream ends, another live stream takes over.
/// A worker with no stream left sends at once what its timer would send later (`Worker::idle`).
struct Ticker {
    shared: Arc<TickerShared>,
}

struct TickerShared {
    beat: Mutex<Beat>,
    /// Signalled when the period changes or the ticker stops.
    changed: Condvar,
    /// The ticking stream and its scheduler.
    ticking: Mutex<Option<(u32, calls::Scheduler)>>,
}

/// When the ticker's thread commits next, as proxy-wasm's tick period has it: the first tick a
/// period after it is set (a shorter period set during a long wait takes effect at once), then
/// every period.
#[derive(Default)]
struct Beat {
    /// 0: no ticks.
    period_ms: u64,
    next: Option<Instant>,
    /// When the worker's idle calls go (see `went_idle`), unless a request comes first.
    idle_due: Option<Instant>,
    stopped: bool,
}

/// The events a stream's scheduler runs in its `scheduled` hook.
const TICK: u64 = 0;
const ANSWER_ORPHANED: u64 = 1;
/// Relayed answers wait in the thread's mailbox (see `relay`).
const ANSWERS: u64 = 2;

impl Ticker {
    /// `on_idle`: run on the ticker's thread when the idle time set (`idle_until`) comes.
    fn start(on_idle: impl Fn() + Send + 'static) -> Ticker {
        let shared = Arc::new(TickerShared {
            beat: Mutex::new(Beat::default()),
            changed: Condvar::new(),
            ticking: Mutex::new(None),
        });
        let ticker = Arc::clone(&shared);
        let started = std::thread::Builder::new().name("gateway-ticker".into()).spawn(move || ticker.run(on_idle));
        if let Err(error) = started {
            calls::log(ffi::LOG_ERROR, &format!("the gateway's timer thread did not start: {error}"));
        }
        Ticker { shared }
    }

    fn set_period(&self, period_ms: u64) {
        let mut beat = self.shared.beat();
        if beat.period_ms != period_ms {
            beat.period_ms = period_ms;
            beat.next = (period_ms > 0).then(|| after(period_ms)).flatten();
            self.shared.changed.notify_one();
        }
    }

    /// Makes live stream `stream` the ticking one when no stream ticks and ticks are asked for
    /// or the worker awaits a relayed answer (which wakes it the same way); then wakes the
    /// ticking stream for answers that came while none could be woken (they are taken in a
    /// `scheduled` hook of their own, never inside another event).
    fn keep_awake(&self, stream: Option<(u32, EnvoyFilter)>, mailbox: &Mailbox) {
        if let Some((id, envoy)) = stream {
            if self.shared.beat().period_ms > 0 || mailbox.awaits() {
                if let Ok(mut ticking) = self.shared.ticking.lock() {
                    if ticking.is_none() {
                        *ticking = calls::Scheduler::new(envoy).map(|scheduler| (id, scheduler));
                    }
                }
            }
        }
        if mailbox.has_answers() {
            self.shared.wake(ANSWERS);
        }
    }

    /// Stream `id` ended: if it was ticking, its scheduler goes (another live stream adopts).
    fn forget(&self, id: u32) {
        if let Ok(mut ticking) = self.shared.ticking.lock() {
            if ticking.as_ref().is_some_and(|(ticker, _)| *ticker == id) {
                *ticking = None;
            }
        }
    }
}

impl TickerShared {
    /// When `on_idle` runs (None: not at all).
    fn idle_until(&self, due: Option<Instant>) {
        let mut beat = self.beat();
        if beat.idle_due != due {
            beat.idle_due = due;
            self.changed.notify_one();
        }
    }

    /// The beat, also after a panic elsewhere (each use leaves it consistent).
    fn beat(&self) -> MutexGuard<'_, Beat> {
        self.beat.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the ticking stream's `scheduled` hook with `event` soon, if a stream ticks.
    fn wake(&self, event: u64) {
        if let Ok(ticking) = self.ticking.lock() {
            if let Some((_, scheduler)) = ticking.as_ref() {
                scheduler.commit(event);
            }
        }
    }

    /// The ticker's thread: waits for each tick's time, then commits the ticking stream's
    /// scheduler; and runs `on_idle` when the idle time comes.
    fn run(&self, on_idle: impl Fn()) {
        let mut beat = self.beat();
        while !beat.stopped {
            let now = Instant::now();
            match beat.next.into_iter().chain(beat.idle_due).min() {
                None => beat = self.changed.wait(beat).unwrap_or_else(PoisonError::into_inner),
                Some(at) if at > now => {
                    beat = self.changed.wait_timeout(beat, at - now).unwrap_or_else(PoisonError::into_inner).0;
                }
                Some(_) if beat.idle_due.is_some_and(|due| due <= now) => {
                    beat.idle_due = None;
                    // Not under the beat's lock: the relay takes its own.
                    drop(beat);
                    on_idle();
                    beat = self.beat();
                }
                Some(_) => {
                    beat.next = after(beat.period_ms);
                    self.wake(TICK);
                }
            }
        }
    }
}

/// The time in Unix milliseconds.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The instant `ms` from now; None past what the clock can say (a period that never ends).
fn after(ms: u64) -> Option<Instant> {
    Instant::now().checked_add(Duration::from_millis(ms))
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.beat().stopped = true;
        self.shared.changed.notify_one();
        if let Ok(mut ticking) = self.shared.ticking.lock() {
            *ticking = None;
        }
    }
}

/// A call in flight: the worker's token, and whether it is the root's, carried by the stream
/// that started it (the ABI starts a worker thread's calls only on a stream's behalf, and
/// cancels them when the stream ends; the root's call is then lost, see `Orphans`).
#[derive(Clone, Copy)]
struct Call {
    token: u32,
    carried: bool,
}

/// The root's calls whose carrying stream ended before their answer, reported lost in the
/// `scheduled` hook of another live stream (`waker`): a fetch that requests still wait for is
/// sent again from the worker's next tick, which that stream carries (not from the ended
/// stream's `destroy` hook, where it would have no stream to ride on).
#[derive(Default)]
struct Orphans {
    tokens: Vec<u32>,
    waker: Option<(u32, calls::Scheduler)>,
}

impl Orphans {
    /// Asks one live stream for a `scheduled` hook, if orphans wait and none was asked.
    fn wake(&mut self, streams: &HashMap<u32, Stream>) {
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
struct ThreadState {
    worker: Worker,
    ticker: Ticker,
    streams: HashMap<u32, Stream>,
    /// Calls in flight, by (carrying stream id, Envoy's callout id).
    calls: HashMap<(u32, u64), Call>,
    orphans: Orphans,
    next_id: u32,
    next_token: u32,
    random: u64,
    metrics: MetricIds,
    /// This state's number, its config's relay and its mailbox there.
    number: u64,
    relay: Arc<Relay>,
    mailbox: Arc<Mailbox>,
    /// The control plane's cluster: the root's calls to it are relayed.
    relayed: Option<String>,
    /// The last stream ended and the worker's idle calls wait in the relay (see `went_idle`).
    idle: bool,
}

thread_local! {
    /// By config number.
    static THREADS: RefCell<HashMap<u64, ThreadState>> = RefCell::new(HashMap::new());
}

/// The store every worker thread shares (proxy-wasm's shared data).
static STORE: OnceLock<Mutex<Entries>> = OnceLock::new();

struct ProcessStore;

impl SharedStore for ProcessStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let store = STORE.get_or_init(Default::default).lock().ok()?;
        store.get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        let Ok(mut store) = STORE.get_or_init(Default::default).lock() else {
            return false;
        };
        compare_and_set(&mut store, key, value, cas)
    }
}

/// Runs a hook, turning a panic into `fallback` (a panic must not cross into Envoy).
fn guarded<T>(fallback: T, hook: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(hook)).unwrap_or_else(|_| {
        calls::log(ffi::LOG_CRITICAL, "the gateway's native filter panicked; the stream is held");
        fallback
    })
}

/// Runs `event` on the worker of `filter`'s config, with the host as the hook sees it; then
/// `then` with the thread's streams and what the event returned.
fn with_worker<R, T>(
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
fn run(
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
fn unmarked(_: &mut Stream, _: Action) {}

/// The host as the exchange sees it, from one hook.
struct NativeIo<'a> {
    /// The stream of the hook.
    current: Option<EnvoyFilter>,
    current_id: u32,
    metrics: &'a [Option<usize>],
    /// How the root's calls to the control plane are asked of the main thread.
    relay: relay::Asker<'a>,
    ticker: &'a Ticker,
    streams: &'a HashMap<u32, Stream>,
    calls: &'a mut HashMap<(u32, u64), Call>,
    next_token: &'a mut u32,
    random: &'a mut u64,
    now_ms: Cell<Option<u64>>,
}

impl NativeIo<'_> {
    /// Records `value` in stat `name` (the core's flat name, read back into its family's labels),
    /// through the hook's stream: the ABI's per-stream metric calls.
    fn record_metric(&self, name: &str, record: calls::Record, value: u64) {
        let (Some(filter), Some((family, values))) = (self.current, metrics::family_of(name)) else {
            return;
        };
        if let Some(id) = self.metrics.get(family).copied().flatten() {
            calls::record_metric(filter, record, id, &values, value);
        }
    }

    /// The live stream `id` of this thread; None once it ended (nothing is done for it).
    fn stream(&self, id: u32) -> Option<&Stream> {
        self.streams.get(&id)
    }

    fn filter(&self, id: u32) -> Option<EnvoyFilter> {
        self.stream(id).map(|s| s.envoy)
    }

    /// Which request body holds what the core has seen so far.
    fn request_body_at(&self, id: u32) -> Option<(EnvoyFilter, u32)> {
        let stream = self.stream(id)?;
        let kind = if stream.request_buffered { ffi::BUFFERED_REQUEST_BODY } else { ffi::RECEIVED_REQUEST_BODY };
        Some((stream.envoy, kind))
    }

    fn response_body_at(&self, id: u32) -> Option<(EnvoyFilter, u32)> {
        let stream = self.stream(id)?;
        let kind = if stream.response_buffered { ffi::BUFFERED_RESPONSE_BODY } else { ffi::RECEIVED_RESPONSE_BODY };
        Some((stream.envoy, kind))
    }
}

/// The first `size` bytes of a body (none when the stream is gone).
fn body_prefix(body: Option<(EnvoyFilter, u32)>, size: usize) -> Vec<u8> {
    let Some((filter, kind)) = body else {
        return Vec::new();
    };
    let mut bytes = calls::body(filter, kind);
    bytes.truncate(size);
    bytes
}

/// Replaces the first `size` bytes of `body` with `bytes`.
fn replace_body(filter: EnvoyFilter, body: u32, size: usize, bytes: &[u8]) {
    let whole = calls::body(filter, body);
    let rest = whole.get(size..).unwrap_or_default().to_vec();
    calls::drain_body(filter, body, whole.len());
    calls::append_body(filter, body, bytes);
    if !rest.is_empty() {
        calls::append_body(filter, body, &rest);
    }
}

impl Io for NativeIo<'_> {
    fn host(&mut self) -> &mut dyn Host {
        self
    }

    fn request_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.filter(id).map(|f| calls::headers(f, ffi::REQUEST_HEADERS)).unwrap_or_default()
    }

    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        body_prefix(self.request_body_at(id), size)
    }

    fn set_request_headers(&mut self, id: u32, wanted: &[(&str, &[u8])]) {
        let Some(filter) = self.filter(id) else {
            return;
        };
        // Only what differs is written: each write is a header-map edit in Envoy, and most of
        // a request's headers pass unchanged.
        let current = calls::headers(filter, ffi::REQUEST_HEADERS);
        let mut removed: Vec<&str> = Vec::new();
        for (name, _) in &current {
            if !wanted.iter().any(|(n, _)| n == name) && !removed.contains(&name.as_str()) {
                calls::set_header(filter, ffi::REQUEST_HEADERS, name, b"");
                removed.push(name);
            }
        }
        let mut changed = !removed.is_empty();
        let mut seen: Vec<&str> = Vec::new();
        for (name, _) in wanted {
            if seen.contains(name) {
                continue;
            }
            seen.push(name);
            let want: Vec<&[u8]> = wanted.iter().filter(|(n, _)| n == name).map(|(_, v)| *v).collect();
            let have: Vec<&[u8]> = current.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_slice()).collect();
            if want == have {
                continue;
            }
            changed = true;
            // The ABI has no empty value: a wanted header whose value is empty is removed.
            let mut values = want.into_iter();
            if let Some(first) = values.next() {
                calls::set_header(filter, ffi::REQUEST_HEADERS, name, first);
            }
            for value in values {
                calls::add_header(filter, ffi::REQUEST_HEADERS, name, value);
            }
        }
        if changed {
            calls::clear_route_cache(filter);
        }
    }

    fn set_request_header(&mut self, id: u32, name: &str, value: &str) {
        if let Some(filter) = self.filter(id) {
            calls::set_header(filter, ffi::REQUEST_HEADERS, name, value.as_bytes());
            calls::clear_route_cache(filter);
        }
    }

    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]) {
        if let Some((filter, kind)) = self.request_body_at(id) {
            replace_body(filter, kind, size, body);
        }
    }

    fn response_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.filter(id).map(|f| calls::headers(f, ffi::RESPONSE_HEADERS)).unwrap_or_default()
    }

    fn response_details(&mut self, id: u32) -> String {
        let details = self.filter(id).and_then(|f| calls::attribute(f, ffi::ATTRIBUTE_RESPONSE_CODE_DETAILS));
        String::from_utf8_lossy(&details.unwrap_or_default()).into_owned()
    }

    fn response_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        body_prefix(self.response_body_at(id), size)
    }

    fn set_response_header(&mut self, id: u32, name: &str, value: Option<&str>) {
        if let Some(filter) = self.filter(id) {
            // The ABI has no empty value: `Some("")`, like `None`, removes the header.
            calls::set_header(filter, ffi::RESPONSE_HEADERS, name, value.unwrap_or_default().as_bytes());
        }
    }

    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]) {
        if let Some((filter, kind)) = self.response_body_at(id) {
            replace_body(filter, kind, size, body);
        }
    }

    fn dispatch(&mut self, id: u32, call: &Dispatch) -> Option<u32> {
        let token = *self.next_token;
        if id == ROOT && self.relay.relays(call) {
            // It outlives every stream: the main thread makes it (see `relay`).
            if !self.relay.ask(token, call) {
                return None;
            }
        } else {
            // The root's other calls ride on the stream of the running hook (see `Call`).
            let carrier = if id == ROOT { self.current_id } else { id };
            let Some(filter) = self.filter(carrier) else {
                calls::log(ffi::LOG_WARN, "a call of the gateway's has no live stream to start on");
                return None;
            };
            let callout = calls::callout(filter, call)?;
            self.calls.insert((carrier, callout), Call { token, carried: id == ROOT });
        }
        *self.next_token = token.wrapping_add(1).max(1);
        Some(token)
    }

    fn tick_every(&mut self, period_ms: u64) {
        // The hook's stream ticks from the end of the hook on (`with_worker`, `keep_awake`).
        self.ticker.set_period(period_ms);
    }

    fn access_log(&mut self, line: &[u8]) {
        if let Some(filter) = self.current {
            calls::set_filter_state(filter, ACCESS_LOG_STATE, line);
        }
    }

    fn publish_header(&mut self, id: u32, name: &str, value: &str) {
        if let Some(filter) = self.filter(id) {
            calls::set_filter_state(filter, &format!("wasm.{name}"), value.as_bytes());
        }
    }

    fn metric(&mut self, kind: Kind, name: &str, value: u64) {
        let record = match kind {
            // Adding 0 changes nothing (the wasm filter skips it too); a sample of 0 counts.
            Kind::Counter if value == 0 => return,
            Kind::Counter => calls::Record::AddToCounter,
            Kind::Histogram => calls::Record::Sample,
        };
        self.record_metric(name, record, value);
    }

    fn add_to_gauge(&mut self, name: &str, delta: i64) {
        let record = if delta < 0 { calls::Record::TakeFromGauge } else { calls::Record::AddToGauge };
        self.record_metric(name, record, delta.unsigned_abs());
    }
}

/// The filter state the shipped access log writes: the wasm build's key, so that one Envoy
/// config serves both builds.
const ACCESS_LOG_STATE: &str = "wasm.gateway_record";

impl Host for NativeIo<'_> {
    fn random(&mut self) -> u64 {
        // xorshift64*, seeded per thread from the OS (see `seed`).
        let mut x = *self.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *self.random = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = unix_ms();
        self.now_ms.set(Some(now));
        now
    }

    fn store(&self) -> &dyn SharedStore {
        &ProcessStore
    }
}

/// A non-zero seed from the OS's randomness.
fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if let Ok(mut file) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut file, &mut bytes);
    }
    u64::from_le_bytes(bytes) | 1
}

// ---- the hooks Envoy calls -------------------------------------------------------------

/// The `log` crate's lines (the core's) into Envoy's log, under its `dynamic_modules` component.
struct EnvoyLogger;

impl log::Log for EnvoyLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        calls::log_enabled(envoy_level(metadata.level()))
    }

    fn log(&self, record: &log::Record) {
        let level = envoy_level(record.level());
        if calls::log_enabled(level) {
            calls::log(level, &record.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn envoy_level(level: log::Level) -> u32 {
    match level {
        log::Level::Trace => ffi::LOG_TRACE,
        log::Level::Debug => ffi::LOG_DEBUG,
        log::Level::Info => ffi::LOG_INFO,
        log::Level::Warn => ffi::LOG_WARN,
        log::Level::Error => ffi::LOG_ERROR,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    guarded(std::ptr::null(), || {
        if let Err(missing) = calls::resolve() {
            // Envoy's own log may be what is missing: stderr is where Envoy's log goes too.
            eprintln!(
                "model gateway: this Envoy lacks the callback {missing}: the module is built for Envoy 1.40's dynamic-module ABI {}, and does not load",
                String::from_utf8_lossy(ffi::ABI_VERSION.strip_suffix(b"\0").unwrap_or_default())
            );
            return std::ptr::null();
        }
        // Envoy's level decides (checked per line): the `log` crate lets every line through.
        if log::set_logger(&EnvoyLogger).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
        ffi::ABI_VERSION.as_ptr()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ffi::EnvoyConfig,
    _name: ffi::EnvoyBuffer,
    config: ffi::EnvoyBuffer,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        let bytes = calls::hook_bytes(config);
        let settings = match Settings::parse(&bytes) {
            Ok(settings) => settings,
            Err(message) => {
                calls::log(ffi::LOG_ERROR, &message);
                return std::ptr::null();
            }
        };
        exchange::prepare_store(&ProcessStore, &settings);
        let id = NEXT_CONFIG.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut live) = LIVE_CONFIGS.lock() {
            live.push(id);
        }
        let metrics = metrics::FAMILIES
            .iter()
            .map(|(name, keeping, labels)| calls::define_metric(envoy, *keeping, name, labels))
            .collect();
        let gate = settings.lookup_gate;
        calls::into_module(Config { id, bytes, gate, metrics, relay: Arc::new(Relay::new(envoy)) })
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            config.relay.close();
            if let Ok(mut live) = LIVE_CONFIGS.lock() {
                live.retain(|id| *id != config.id);
            }
        }
        calls::drop_module::<Config>(config);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void, envoy: EnvoyFilter) -> *const c_void {
    guarded(std::ptr::null(), || {
        let Some(config_ref) = calls::module_ref::<Config>(config) else {
            return std::ptr::null();
        };
        let key = config_ref.id;
        let id = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            if !threads.contains_key(&key) {
                // A config Envoy replaced: its workers here go (their streams ended before it).
                if let Ok(live) = LIVE_CONFIGS.lock() {
                    threads.retain(|id, state| {
                        let keep = live.contains(id);
                        if !keep {
                            state.relay.forget(state.number);
                        }
                        keep
                    });
                }
                let settings = Settings::parse(&config_ref.bytes).ok()?;
                let relayed = settings.control_plane.as_ref().map(|cp| cp.cluster.clone());
                let worker = Worker::new(Rc::new(settings)).rooted(ROOT);
                let number = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
                let relay = Arc::clone(&config_ref.relay);
                let idle_relay = Arc::downgrade(&relay);
                let ticker = Ticker::start(move || {
                    if let Some(relay) = idle_relay.upgrade() {
                        relay.release(number);
                    }
                });
                let mailbox = relay.mailbox(number, Arc::clone(&ticker.shared));
                let state = ThreadState {
                    worker,
                    ticker,
                    streams: HashMap::new(),
                    calls: HashMap::new(),
                    orphans: Orphans::default(),
                    next_id: 1,
                    next_token: 1,
                    random: seed(),
                    metrics: Arc::clone(&config_ref.metrics),
                    number,
                    relay,
                    mailbox,
                    relayed,
                    idle: false,
                };
                threads.insert(key, state);
            }
            let state = threads.get_mut(&key)?;
            if std::mem::take(&mut state.idle) {
                state.ticker.shared.idle_until(None);
                if let Some((idle_ms, stored)) = state.relay.woke(state.number) {
                    state.worker.idle_sent(idle_ms, stored);
                }
            }
            let id = state.next_id;
            state.next_id = id.wrapping_add(1).max(1);
            state.streams.insert(id, Stream { envoy, request_buffered: false, response_buffered: false });
            Some(id)
        });
        match id {
            Some(id) => calls::into_module(Filter { config: key, id, gate: config_ref.gate }),
            None => std::ptr::null(),
        }
    })
}

/// The module's filter behind a hook's pointer (made in filter_new, freed in destroy).
fn filter<'a>(module: *const c_void) -> Option<&'a Filter> {
    calls::module_ref::<Filter>(module)
}

/// A headers hook: the core holds the headers (`held`: how) or lets them go.
fn headers_hook(
    module: *const c_void,
    end_of_stream: bool,
    event: fn(&mut Worker, u32, bool, &mut dyn Io) -> Output,
    held: fn(&Filter) -> u32,
) -> u32 {
    guarded(ffi::HEADERS_STOP_ITERATION, || {
        let Some(filter) = filter(module) else {
            return ffi::HEADERS_CONTINUE;
        };
        match run(filter, |worker, io| event(worker, filter.id, end_of_stream, io), unmarked) {
            Some(Action::Continue) => ffi::HEADERS_CONTINUE,
            _ => held(filter),
        }
    })
}

/// How a request's held headers stop: the body still comes to the filter, unless the lookup
/// gate holds them.
fn request_held(filter: &Filter) -> u32 {
    if filter.gate {
        ffi::HEADERS_STOP_ALL_AND_WATERMARK
    } else {
        ffi::HEADERS_STOP_ITERATION
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    headers_hook(module, end_of_stream, Worker::request_headers, request_held)
}

/// Which way a body goes.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

impl Side {
    /// The chunk of the current body hook.
    fn received(self) -> u32 {
        match self {
            Side::Request => ffi::RECEIVED_REQUEST_BODY,
            Side::Response => ffi::RECEIVED_RESPONSE_BODY,
        }
    }

    /// Whether the filter held a chunk of this body (Envoy buffers it).
    fn buffered(self, stream: &mut Stream) -> &mut bool {
        match self {
            Side::Request => &mut stream.request_buffered,
            Side::Response => &mut stream.response_buffered,
        }
    }
}

/// A body hook: the body so far goes to the core (see `gather`), which holds it or lets it go.
fn body_hook(envoy: EnvoyFilter, module: *const c_void, end_of_stream: bool, side: Side) -> u32 {
    guarded(ffi::BODY_STOP_AND_BUFFER, || {
        let Some(filter) = filter(module) else {
            return ffi::BODY_CONTINUE;
        };
        let action = run(
            filter,
            |worker, io| {
                let at = match side {
                    Side::Request => io.request_body_at(filter.id),
                    Side::Response => io.response_body_at(filter.id),
                };
                let kind = at.map_or(side.received(), |(_, kind)| kind);
                let size = calls::body_size(envoy, gather(envoy, kind, side.received()));
                match side {
                    Side::Request => worker.request_body(filter.id, size, end_of_stream, io),
                    Side::Response => worker.response_body(filter.id, size, end_of_stream, io),
                }
            },
            |stream, action| *side.buffered(stream) |= action == Action::Pause,
        );
        match action {
            Some(Action::Continue) => ffi::BODY_CONTINUE,
            _ => ffi::BODY_STOP_AND_BUFFER,
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body_hook(envoy, module, end_of_stream, Side::Request)
}

/// Where the body so far is (`kind`): when it is the buffer of chunks held before, this hook's
/// chunk joins them there first, so the core sees the whole body so far as proxy-wasm shows it.
fn gather(envoy: EnvoyFilter, kind: u32, received: u32) -> u32 {
    if kind != received {
        let chunk = calls::body(envoy, received);
        if !chunk.is_empty() {
            calls::append_body(envoy, kind, &chunk);
            calls::drain_body(envoy, received, chunk.len());
        }
    }
    kind
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: EnvoyFilter,
    module: *const c_void,
) -> u32 {
    guarded(ffi::TRAILERS_STOP_ITERATION, || {
        let Some(filter) = filter(module) else {
            return ffi::TRAILERS_CONTINUE;
        };
        match run(filter, |worker, io| worker.request_trailers(filter.id, io), unmarked) {
            Some(Action::Continue) => ffi::TRAILERS_CONTINUE,
            _ => ffi::TRAILERS_STOP_ITERATION,
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    headers_hook(module, end_of_stream, Worker::response_headers, |_| ffi::HEADERS_STOP_ITERATION)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body_hook(envoy, module, end_of_stream, Side::Response)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: EnvoyFilter,
    _module: *const c_void,
) -> u32 {
    ffi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_envoy: EnvoyFilter, module: *const c_void) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let record = with_worker(filter, |worker, io| worker.finished(filter.id, io), |_, record| record).flatten();
        if let Some(record) = record {
            if calls::log_enabled(ffi::LOG_INFO) {
                calls::log(ffi::LOG_INFO, &record.to_string());
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let idle = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            let state = threads.get_mut(&filter.config)?;
            state.ticker.forget(filter.id);
            state.streams.remove(&filter.id);
            // Another live stream ticks from now on: a request paused for a timer (a retry's
            // delay, a relayed answer) gets no hook of its own that would adopt the ticker.
            let next = state.streams.iter().next().map(|(id, stream)| (*id, stream.envoy));
            state.ticker.keep_awake(next, &state.mailbox);
            let orphans = &mut state.orphans;
            state.calls.retain(|(id, _), call| {
                let ended = *id == filter.id;
                if ended && call.carried {
                    orphans.tokens.push(call.token);
                }
                !ended
            });
            if orphans.waker.as_ref().is_some_and(|(id, _)| *id == filter.id) {
                orphans.waker = None;
            }
            orphans.wake(&state.streams);
            Some(state.streams.is_empty() && state.relayed.is_some())
        });
        // The last stream went: nothing ticks before the next one. The answers that came are
        // taken, and what the timer would send (records, leases' reports) goes if no request
        // comes soon.
        if idle == Some(true) {
            run(filter, answer_mail, unmarked);
            went_idle(filter);
        }
        calls::drop_module::<Filter>(module);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: EnvoyFilter,
    module: *const c_void,
    callout: u64,
    result: u32,
    headers: *const ffi::EnvoyHeader,
    headers_length: usize,
    chunks: *const ffi::EnvoyBuffer,
    chunks_length: usize,
) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let answer = calls::callout_answer(result, headers, headers_length, chunks, chunks_length);
        run(
            filter,
            |worker, io| match io.calls.remove(&(filter.id, callout)) {
                Some(call) => worker.call_answered(call.token, answer, io),
                None => Output { action: Action::Continue, after: Vec::new() },
            },
            unmarked,
        );
    })
}

// Hooks Envoy requires of every HTTP filter module, for features this filter does not use
// (streamed callouts, per-stream schedulers, a terminal filter's flow control).

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset() {}
/// The relayed answers in the thread's mailbox, each to the worker (see `relay`) at the time it
/// arrived: one taken by a worker's next stream may have waited there, and a lease granted then
/// ends a TTL after then, as the control plane counts it.
fn answer_mail(worker: &mut Worker, io: &mut NativeIo) -> Output {
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
fn went_idle(filter: &Filter) {
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

/// The ticker committed this stream's scheduler: the worker's tick runs (see `Ticker`); or the
/// stream was asked to report the orphaned root calls (see `Orphans`), or to take the relayed
/// answers (see `relay`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: EnvoyFilter,
    module: *const c_void,
    event: u64,
) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        match event {
            TICK => {
                run(filter, |worker, io| worker.tick(io), unmarked);
                return;
            }
            ANSWERS => {
                run(filter, answer_mail, unmarked);
                return;
            }
            _ => {}
        }
        let orphaned = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            let orphans = &mut threads.get_mut(&filter.config)?.orphans;
            orphans.waker = None;
            Some(std::mem::take(&mut orphans.tokens))
        });
        for token in orphaned.unwrap_or_default() {
            run(filter, |worker, io| worker.call_lost(token, io), unmarked);
        }
    })
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark() {}

/// A worker thread asked for a call to the control plane (`relay`): the main thread starts it.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    envoy: ffi::EnvoyConfig,
    config: *const c_void,
    _event: u64,
) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            config.relay.start_asked(envoy);
        }
    })
}

/// A call the main thread started for a worker thread answered: to that thread's mailbox.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _envoy: ffi::EnvoyConfig,
    config: *const c_void,
    callout: u64,
    result: u32,
    headers: *const ffi::EnvoyHeader,
    headers_length: usize,
    chunks: *const ffi::EnvoyBuffer,
    chunks_length: usize,
) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            let answer = calls::callout_answer(result, headers, headers_length, chunks, chunks_length);
            config.relay.answered(callout, answer);
        }
    })
}
