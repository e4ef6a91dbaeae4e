//! The exchange: a request's whole way through the gateway as a state machine that knows
//! nothing of proxy-wasm. The host adapter feeds it events (request headers and body,
//! response headers and chunks, call answers by token, ticks) and runs what it asks for
//! through the [`Io`] port; answers and resumes, which may re-enter the filter, come back as
//! [`After`] effects that the adapter runs once the exchange has let go.
//!
//! The first attempt of a request goes through Envoy's router, so a healthy provider streams
//! straight to the client. When it fails in a way the plan retries or falls back on, the
//! response is held and later attempts run as dispatched calls; the final result is sent as a
//! local answer. Every asynchronous step (recovery attempts, the embeddings call) is a task
//! in one registry keyed by call token, whichever context the answer arrives on.

mod bodies;
mod caching;
mod guard;
mod lookups;
pub(crate) mod metrics;
pub(crate) mod record;
mod reply;
mod shipping;
#[cfg(test)]
mod tests;
mod tokens;
mod usage;

use crate::cache::store;
use crate::cache::{semantic, STATUS_HEADER};
use crate::catalog::{Catalog, Entry, Ref, MAX_LOOKUPS};
use crate::errors::GatewayError;
use crate::guardrails::{self, verdict};
use crate::pipeline::{
    self, Call, Forward, Pending, ResponsePlan, Started, CLUSTER_HEADER, PROVIDER_HEADER, RETRIES_HEADER,
    TARGET_HEADER, TRACE_HEADER,
};
use crate::ports::{Host, SharedStore};
use crate::request::headers;
use crate::routing::attempts::Next;
use crate::routing::breaker;
use crate::routing::plan::Failure;
use crate::settings::Settings;
use crate::stream;
use crate::upstream::Upstream;
use bodies::Bodies;
use caching::{CacheState, Hit};
use guard::{Answer, Guard, Progress};
use hashbrown::HashMap;
use metrics::ModelLabels;
pub(crate) use record::Record;
pub(crate) use reply::parse_status;
use reply::{finish, response_mode, Finished, ResponseMode};
use std::rc::Rc;
use usage::UsageScan;

type RawHeaders = Vec<(String, Vec<u8>)>;

/// The host for one worker: reads and writes of a request's streams (named by context id),
/// dispatched calls, the tick timer and metrics. None of these may re-enter the filter.
pub(crate) trait Io {
    fn host(&mut self) -> &mut dyn Host;
    fn request_headers(&mut self, id: u32) -> RawHeaders;
    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8>;
    /// Replaces every request header at once (one host call instead of one per header).
    fn set_request_headers(&mut self, id: u32, headers: &[(&str, &[u8])]);
    fn set_request_header(&mut self, id: u32, name: &str, value: &str);
    /// Replaces the first `size` bytes of the buffered request body.
    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]);
    fn response_header(&mut self, id: u32, name: &str) -> Option<Vec<u8>>;
    fn response_headers(&mut self, id: u32) -> RawHeaders;
    /// Envoy's `response.code_details`: why the router answered as it did.
    fn response_details(&mut self, id: u32) -> String;
    fn response_body(&mut self, id: u32, size: usize) -> Vec<u8>;
    /// Sets (or with `None` removes) one response header.
    fn set_response_header(&mut self, id: u32, name: &str, value: Option<&str>);
    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]);
    /// Starts a call on behalf of request `id`; its token, or None when it cannot start.
    fn dispatch(&mut self, id: u32, call: &Dispatch) -> Option<u32>;
    /// The root context's tick period; 0 stops the ticks.
    fn tick_every(&mut self, period_ms: u64);
    /// Adds `value` to a counter, or records it in a histogram (the stat is named with its
    /// labels, see [`metrics`]).
    fn metric(&mut self, kind: metrics::Kind, name: &str, value: u64);
    /// Adds `delta` (negative: subtracts) to a gauge.
    fn add_to_gauge(&mut self, name: &str, delta: i64);
    /// Publishes request `id`'s access-log line (the record's JSON object) as it ends.
    fn access_log(&mut self, line: &[u8]);
    /// Publishes one of request `id`'s gateway headers where Envoy's own reply can add it
    /// (filter state `wasm.<name>`, for the local reply mapper of the Envoy config).
    fn publish_header(&mut self, id: u32, name: &str, value: &str);
}

/// A call for the host to dispatch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Dispatch {
    pub(crate) cluster: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) timeout_ms: u64,
}

impl Dispatch {
    /// A POST to `upstream` through the recovery listener, whose router reaches any host by
    /// the cluster header (resolving new hosts on the way).
    fn post(
        settings: &Settings,
        upstream: &Upstream,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        extra: Vec<(String, String)>,
        timeout_ms: u64,
    ) -> Dispatch {
        let mut headers = vec![("content-type".to_string(), content_type.to_string())];
        headers.extend(extra);
        Dispatch::request(settings, upstream, "POST", path, body, headers, timeout_ms)
    }

    /// A `method` request to `upstream` through the recovery listener (`extra`: its headers,
    /// the content type among them when there is a body).
    fn request(
        settings: &Settings,
        upstream: &Upstream,
        method: &str,
        path: &str,
        body: Vec<u8>,
        extra: Vec<(String, String)>,
        timeout_ms: u64,
    ) -> Dispatch {
        let cluster = if upstream.tls { &settings.tls_cluster } else { &settings.plain_cluster };
        let mut headers = vec![
            (":method".to_string(), method.to_string()),
            (":path".to_string(), path.to_string()),
            (":authority".to_string(), upstream.authority.clone()),
        ];
        if method != "GET" || !body.is_empty() {
            headers.push(("content-length".to_string(), body.len().to_string()));
        }
        headers.extend(extra);
        headers.push((CLUSTER_HEADER.to_string(), cluster.clone()));
        Dispatch { cluster: settings.recovery_cluster.clone(), headers, body, timeout_ms }
    }
}

/// A dispatched call's answer; status 0 when it failed without one.
pub(crate) struct CallAnswer {
    pub(crate) status: u16,
    pub(crate) headers: RawHeaders,
    pub(crate) body: Vec<u8>,
}

/// What the host callback returns to Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Continue,
    Pause,
}

/// Effects that may re-enter the filter, run by the adapter after the exchange returns.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum After {
    /// Answer request `id` locally.
    Reply { id: u32, status: u16, headers: Vec<(String, String)>, body: Vec<u8> },
    /// Let request `id` go on (it was held for the embeddings call).
    ResumeRequest(u32),
}

/// The result of one event.
#[derive(Debug, PartialEq)]
pub(crate) struct Output {
    pub(crate) action: Action,
    pub(crate) after: Vec<After>,
}

impl Output {
    fn proceed() -> Output {
        Output { action: Action::Continue, after: Vec::new() }
    }
}

/// A dispatched call's wait before it starts.
struct Timer {
    due_ms: u64,
    owner: u32,
    attempt: usize,
}

/// What a dispatched call was for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Task {
    /// A recovery attempt (the plan knows which).
    Attempt,
    Embedding,
    /// An access token for the credential with this cache key.
    Token(String),
    /// A guardrail check's call (a webhook).
    Check,
    /// A JWKS fetch: its answer goes to every check waiting for this URI.
    Jwks(String),
    /// A control-plane read: its answer goes to every request waiting for this ref.
    Lookup(Ref),
    /// The control plane's health, for the gateway's own `/health`.
    Health,
    /// A batch of request records to the control plane (the root context's call).
    Records,
}

/// Dispatched calls in flight (token → request and purpose) and waiting calls.
#[derive(Default)]
struct Tasks {
    calls: HashMap<u32, (u32, Task)>,
    timers: Vec<Timer>,
    /// Requests waiting for an access token, by credential: one fetch serves them all.
    token_waiters: HashMap<String, Vec<u32>>,
    /// Checks waiting for a JWKS, by URI: (request, the token its check waits under).
    jwks_waiters: HashMap<String, Vec<(u32, u32)>>,
    /// Requests waiting for a control-plane entry: one read serves them all.
    lookup_waiters: HashMap<Ref, Vec<u32>>,
    /// Control-plane entries this worker read lately.
    recent: lookups::Recent,
    /// Tokens for checks that wait for another request's call, counted down from `u32::MAX`.
    aliases: u32,
    /// Request records on their way to the control plane.
    records: shipping::Shipper,
}

/// What an exchange's event handler can reach besides the exchange.
struct Env<'a> {
    id: u32,
    settings: &'a Settings,
    io: &'a mut dyn Io,
    tasks: &'a mut Tasks,
    after: Vec<After>,
}

/// Every request of one worker (one Envoy worker thread, one VM).
pub(crate) struct Worker {
    settings: Rc<Settings>,
    exchanges: HashMap<u32, Exchange>,
    tasks: Tasks,
    models: ModelLabels,
    /// Whether this worker queued a record yet (the drop counter is then defined, at 0).
    shipping: bool,
    /// The root context: record batches are dispatched on it (a request's context may be gone
    /// before its call answers).
    root: u32,
}

/// Names no cluster: a held request that Envoy resumed without the gateway's edits goes
/// nowhere, even when the client named a cluster itself (without the header Envoy's route
/// finds no cluster either).
const UNROUTED: &str = "gateway-unrouted";

/// A dispatched call needs a timeout of its own; the request timeout is Envoy's per-try
/// timeout of the internal listener's router (until the response headers), as for routed
/// requests. This one bounds a whole generation, like Envoy's default stream idle timeout
/// bounds a silent client connection.
const CALL_TIMEOUT_MS: u64 = 300_000;

impl Worker {
    pub(crate) fn new(settings: Rc<Settings>) -> Worker {
        Worker {
            settings,
            exchanges: HashMap::new(),
            tasks: Tasks { aliases: u32::MAX, ..Tasks::default() },
            models: ModelLabels::default(),
            shipping: false,
            root: 0,
        }
    }

    /// The worker of root context `root`.
    pub(crate) fn rooted(mut self, root: u32) -> Worker {
        self.root = root;
        self
    }

    /// New requests use `settings` (requests in flight keep theirs).
    pub(crate) fn configure(&mut self, settings: Settings) {
        self.settings = Rc::new(settings);
    }

    /// Runs `event` on exchange `id` with what it may reach.
    fn on(&mut self, id: u32, io: &mut dyn Io, event: impl FnOnce(&mut Exchange, &mut Env) -> Action) -> Output {
        let Some(exchange) = self.exchanges.get_mut(&id) else {
            return Output::proceed();
        };
        let settings = Rc::clone(&exchange.settings);
        let mut env = Env { id, settings: &settings, io, tasks: &mut self.tasks, after: Vec::new() };
        let action = event(exchange, &mut env);
        Output { action, after: env.after }
    }

    pub(crate) fn request_headers(&mut self, id: u32, end_of_stream: bool, io: &mut dyn Io) -> Output {
        let raw = io.request_headers(id);
        let exchange = Exchange::new(Rc::clone(&self.settings), &raw, io.host());
        self.exchanges.insert(id, exchange);
        let output = self.on(id, io, |exchange, env| exchange.request_headers(env, raw, end_of_stream));
        self.forget_passed_gate(id);
        output
    }

    /// A lookup gate's request is the main instance's once it waits for no entry: the gate
    /// forgets it (every later event passes untouched, and no record is made twice).
    fn forget_passed_gate(&mut self, id: u32) {
        let passed = |e: &Exchange| e.settings.lookup_gate && !matches!(e.phase, Phase::AwaitingLookup(_));
        if self.exchanges.get(&id).is_some_and(passed) {
            self.exchanges.remove(&id);
        }
    }

    pub(crate) fn request_body(&mut self, id: u32, size: usize, end_of_stream: bool, io: &mut dyn Io) -> Output {
        self.on(id, io, |exchange, env| exchange.request_body(env, size, end_of_stream))
    }

    pub(crate) fn request_trailers(&mut self, id: u32, io: &mut dyn Io) -> Output {
        self.on(id, io, |exchange, env| exchange.request_trailers(env))
    }

    pub(crate) fn response_headers(&mut self, id: u32, end_of_stream: bool, io: &mut dyn Io) -> Output {
        self.on(id, io, |exchange, env| exchange.response_headers(env, end_of_stream))
    }

    pub(crate) fn response_body(&mut self, id: u32, size: usize, end_of_stream: bool, io: &mut dyn Io) -> Output {
        self.on(id, io, |exchange, env| exchange.response_body(env, size, end_of_stream))
    }

    /// Whether a call answer is awaited (an unknown token's answer need not even be read).
    pub(crate) fn awaits(&self, token: u32) -> bool {
        self.tasks.calls.contains_key(&token)
    }

    /// A dispatched call answered, on whichever context it arrived.
    pub(crate) fn call_answered(&mut self, token: u32, answer: CallAnswer, io: &mut dyn Io) -> Output {
        let Some((owner, task)) = self.tasks.calls.remove(&token) else {
            return Output::proceed();
        };
        let key = match task {
            Task::Token(key) => key,
            Task::Records if !self.tasks.records.carries(token) => return Output::proceed(),
            Task::Records => {
                let now_ms = io.host().now_ms();
                let dropped = self.tasks.records.answered(answer.status, now_ms, self.settings.records.max_queued);
                count_dropped(io, dropped);
                rearm(&self.tasks, io);
                return Output::proceed();
            }
            Task::Lookup(r) => {
                let settled = lookups::settle(&self.settings, &r, &answer, io);
                let mut after = Vec::new();
                for waiter in self.tasks.lookup_waiters.remove(&r).unwrap_or_default() {
                    let output = self.on(waiter, io, |exchange, env| {
                        exchange.lookup_arrived(env, &r, &settled);
                        Action::Continue
                    });
                    self.forget_passed_gate(waiter);
                    after.extend(output.after);
                }
                return Output { action: Action::Continue, after };
            }
            Task::Jwks(uri) => {
                let mut after = Vec::new();
                for (waiter, alias) in self.tasks.jwks_waiters.remove(&uri).unwrap_or_default() {
                    let copy = CallAnswer { status: answer.status, headers: Vec::new(), body: answer.body.clone() };
                    let output = self.on(waiter, io, |exchange, env| {
                        exchange.check_answered(env, alias, copy);
                        Action::Continue
                    });
                    after.extend(output.after);
                }
                return Output { action: Action::Continue, after };
            }
            task => {
                return self.on(owner, io, |exchange, env| {
                    match task {
                        Task::Embedding => exchange.embedding_arrived(env, answer),
                        Task::Health => {
                            exchange.health_answered(env, answer.status);
                        }
                        Task::Check => exchange.check_answered(env, token, answer),
                        _ => exchange.attempt_answered(env, answer),
                    }
                    Action::Continue
                })
            }
        };
        let fetched = tokens::from_answer(&answer);
        match &fetched {
            Ok((token, expires_in)) => {
                let now_ms = io.host().now_ms();
                tokens::remember(io.host().store(), &key, token, *expires_in, now_ms);
            }
            Err(error) => log::warn!("{}", error.message),
        }
        let fetched = fetched.map(|(token, _)| token);
        let mut after = Vec::new();
        for waiter in self.tasks.token_waiters.remove(&key).unwrap_or_default() {
            let output = self.on(waiter, io, |exchange, env| {
                exchange.token_arrived(env, &fetched);
                Action::Continue
            });
            after.extend(output.after);
        }
        Output { action: Action::Continue, after }
    }

    /// The root's timer: starts the calls whose delay is over.
    pub(crate) fn tick(&mut self, io: &mut dyn Io) -> Output {
        let now = io.host().now_ms();
        let (due, waiting): (Vec<Timer>, Vec<Timer>) =
            std::mem::take(&mut self.tasks.timers).into_iter().partition(|t| t.due_ms <= now);
        self.tasks.timers = waiting;
        let mut after = Vec::new();
        for timer in due {
            let output = self.on(timer.owner, io, |exchange, env| {
                exchange.step(env, Next::Call { index: timer.attempt, delay_ms: 0 });
                Action::Continue
            });
            after.extend(output.after);
        }
        self.ship(now, io);
        rearm(&self.tasks, io);
        Output { action: Action::Continue, after }
    }

    /// Sends the next batch of records when one is due (from the root's timer).
    fn ship(&mut self, now_ms: u64, io: &mut dyn Io) {
        let Some(cp) = &self.settings.control_plane else {
            let dropped = self.tasks.records.clear();
            return count_dropped(io, dropped);
        };
        let Some(body) = self.tasks.records.take(now_ms) else {
            return;
        };
        match io.dispatch(self.root, &shipping::call(cp, body)) {
            Some(token) => {
                self.tasks.records.sent(token);
                self.tasks.calls.insert(token, (self.root, Task::Records));
            }
            None => {
                let dropped = self.tasks.records.answered(0, now_ms, self.settings.records.max_queued);
                count_dropped(io, dropped);
            }
        }
    }

    /// Request `id` ended: its metrics go to the host, its record is returned, and nothing
    /// of it is left behind.
    pub(crate) fn finished(&mut self, id: u32, io: &mut dyn Io) -> Option<Record> {
        self.tasks.timers.retain(|t| t.owner != id);
        // A token, JWKS or control-plane read goes on for the other requests waiting for it.
        self.tasks.calls.retain(|_, (owner, task)| {
            *owner != id || matches!(task, Task::Token(_) | Task::Jwks(_) | Task::Lookup(_))
        });
        for waiters in self.tasks.lookup_waiters.values_mut() {
            waiters.retain(|waiter| *waiter != id);
        }
        for waiters in self.tasks.token_waiters.values_mut() {
            waiters.retain(|waiter| *waiter != id);
        }
        for waiters in self.tasks.jwks_waiters.values_mut() {
            waiters.retain(|(waiter, _)| *waiter != id);
        }
        let exchange = self.exchanges.remove(&id)?;
        if exchange.settings.lookup_gate {
            return None;
        }
        let settings = Rc::clone(&exchange.settings);
        // Envoy answered a held answer itself when its provider broke off: the record says so.
        let broke_off = exchange.awaiting_end && reply::broke_off(&io.response_details(id));
        let mut record = exchange.into_record();
        if broke_off {
            record.status = 502;
            record.error_code = Some(reply::BROKE_OFF_CODE);
        }
        record.end(io.host().now_ms());
        for metric in metrics::of_request(&record, &settings.metrics, &mut self.models) {
            io.metric(metric.kind, &metric.name, metric.value);
        }
        let line = record.to_json();
        io.access_log(&line);
        if settings.control_plane.is_some() && !record.workspace.is_empty() {
            self.queue(&line, record.start_ms, record.bodies.as_deref(), &settings, io);
        }
        Some(record)
    }
}

impl Worker {
    /// Queues a finished request's record for the control plane; the timer is set again only
    /// when the first record waits or a batch is due at once.
    fn queue(&mut self, line: &[u8], start_ms: u64, bodies: Option<&Bodies>, settings: &Settings, io: &mut dyn Io) {
        if !self.shipping {
            // Scrapes show the counter at 0 once records are shipped, not only after a drop.
            self.shipping = true;
            io.metric(metrics::Kind::Counter, metrics::RECORDS_DROPPED, 0);
        }
        let host = io.host();
        let now_ms = host.now_ms();
        let record_id = record::record_id(now_ms, host.random());
        let extra = record::Shipped::new(start_ms, record_id.as_deref());
        let records = &mut self.tasks.records;
        let Some(shipped) = record::shipped_with_bodies(line, &extra, bodies, shipping::MAX_RECORD_BYTES) else {
            return count_dropped(io, 1);
        };
        if !records.push(shipped, now_ms, settings.records.max_queued) {
            return count_dropped(io, 1);
        }
        if records.len() == 1 || records.len() == shipping::EAGER {
            rearm(&self.tasks, io);
        }
    }
}

/// Counts records dropped on their way to the control plane.
fn count_dropped(io: &mut dyn Io, dropped: u64) {
    if dropped > 0 {
        io.metric(metrics::Kind::Counter, metrics::RECORDS_DROPPED, dropped);
    }
}

/// Creates every breaker slot and cache key before traffic, so each later update is a
/// compare-and-swap (shared data has no delete and no eviction; the keys are fixed).
pub(crate) fn prepare_store(store: &dyn SharedStore, settings: &Settings) {
    let startup = breaker::slot_keys()
        .map(|key| (key, breaker::EMPTY_SLOT))
        .chain(settings.cache.layout.startup_keys().map(|key| (key, store::EMPTY)));
    for (key, empty) in startup {
        if store.get(&key).is_none() {
            store.set(&key, empty, 0);
        }
    }
}

/// Ticks when the earliest timer (or the next batch of records) is due; no ticks while
/// nothing waits.
fn rearm(tasks: &Tasks, io: &mut dyn Io) {
    let now = io.host().now_ms();
    let earliest = tasks.timers.iter().map(|t| t.due_ms).chain(tasks.records.due_ms()).min();
    io.tick_every(earliest.map_or(0, |due| due.saturating_sub(now).max(1)));
}

enum Phase {
    Headers,
    /// Held until a control-plane entry arrives; then processed again from its headers.
    AwaitingLookup(Box<Stalled>),
    /// `/health` waits for the control plane's.
    AwaitingHealth,
    /// The request headers are held (with their raw values) until the body is complete.
    AwaitingBody(Box<(Pending, RawHeaders)>),
    /// Routed and held until its backend's access token arrives.
    AwaitingToken(Box<Held>),
    /// Routed and held until the input checks' calls answered.
    AwaitingChecks(Box<Held>),
    Forwarded(Box<Routed>),
    /// The first attempt failed; later ones run as dispatched calls.
    Recovering(Box<Recovery>),
    /// The gateway answered itself; its answer passes the response callbacks untouched.
    Answered,
}

/// A request waiting for a control-plane entry: its headers, and its body once complete
/// (when the gateway reads it).
struct Stalled {
    raw: RawHeaders,
    body: Option<(usize, Vec<u8>)>,
    /// The body is complete (or there is none).
    ended: bool,
}

impl Stalled {
    fn new(raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Box<Stalled> {
        let ended = body.is_some();
        Box::new(Stalled { raw, body, ended })
    }
}

/// A routed request not yet sent: its call, headers and body (as `forward` takes them).
struct Held {
    call: Call,
    raw: RawHeaders,
    body: Option<(usize, Vec<u8>)>,
}

/// Whether a request's backend needs an access token first.
enum Token {
    Unneeded,
    Ready(String),
    /// Being fetched; the request waits for it.
    Awaited,
}

/// A request routed through Envoy's router.
struct Routed {
    call: Call,
    plan: ResponsePlan,
    /// The client's headers and body, kept only when a failure could lead to another call.
    retained: Option<(RawHeaders, Vec<u8>)>,
}

/// A request whose first attempt failed and whose plan goes on.
struct Recovery {
    call: Call,
    /// The client's request headers and body, to build every later attempt.
    raw: RawHeaders,
    body: Vec<u8>,
    /// The response plan of the latest attempt.
    plan: ResponsePlan,
    latest: Outcome,
    /// The attempt waiting for its backend's access token.
    awaiting_token: Option<usize>,
    /// The answer was sent.
    answered: bool,
}

/// How the latest attempt ended, kept for the final answer.
enum Outcome {
    Response(CallAnswer),
    Timeout,
    Unreachable,
}

impl Outcome {
    /// A failed attempt's outcome; the response is kept when the provider sent one.
    fn of(failure: Failure, answer: CallAnswer) -> Outcome {
        match failure {
            Failure::Status(_) => Outcome::Response(answer),
            Failure::Timeout => Outcome::Timeout,
            Failure::Unreachable | Failure::CircuitOpen => Outcome::Unreachable,
        }
    }
}

struct Exchange {
    settings: Rc<Settings>,
    record: Record,
    phase: Phase,
    mode: ResponseMode,
    cache: CacheState,
    /// The top-level config's hooks and guardrails, when it has some.
    guard: Option<Box<Guard>>,
    /// The 2xx answer is held whole for the output checks (`hook_results`, 246, 446).
    hold: bool,
    /// The endpoint's answers carry token usage.
    reports_usage: bool,
    /// Reads the usage of an answer that passes untouched.
    usage: Option<UsageScan>,
    /// The control-plane entries this request read (its progress never depends on shared data).
    known: HashMap<Ref, Entry>,
    /// Control-plane reads this request waited for.
    lookups: u32,
    /// The provider's answer is held in Envoy until its body ends.
    awaiting_end: bool,
}

impl Exchange {
    fn new(settings: Rc<Settings>, raw: &RawHeaders, host: &mut dyn Host) -> Exchange {
        let text = |name: &str| headers::find(raw, name).map(|v| String::from_utf8_lossy(v).into_owned());
        let trace = headers::trace_fields(raw);
        // The client's trace id, else Envoy's request id, else a random one.
        let trace_id = match &trace.trace_id {
            Some(id) => id.clone(),
            None => format!("{:016x}{:016x}", host.random(), host.random()),
        };
        // Bodies only ever go to the control plane.
        let bodies = (settings.records.bodies && settings.control_plane.is_some())
            .then(|| Box::new(Bodies::new(settings.records.max_body_bytes)));
        let record = Record {
            trace_id,
            trace,
            bodies,
            method: text(":method").unwrap_or_default(),
            path: text(":path").unwrap_or_default(),
            start_ms: host.now_ms(),
            ..Record::default()
        };
        Exchange {
            settings,
            record,
            phase: Phase::Headers,
            mode: ResponseMode::Passthrough,
            cache: CacheState::Off,
            guard: None,
            hold: false,
            reports_usage: false,
            usage: None,
            known: HashMap::new(),
            lookups: 0,
            awaiting_end: false,
        }
    }

    fn into_record(self) -> Record {
        let mut record = self.record;
        if let Phase::Recovering(recovery) = self.phase {
            record.target = recovery.call.target_path().to_string();
            record.retries = recovery.call.attempts.retries;
            record.moves = recovery.call.attempts.moves;
        }
        record.cache = self.cache.status_header().unwrap_or_default();
        if let Some(guard) = self.guard {
            record.guardrails = guard.into_results();
        }
        record
    }

    /// The routed request's facts for the record, from attempt `index` of `call`.
    fn note(&mut self, call: &Call, index: usize) {
        let facts = call.facts(index);
        self.record.provider = facts.provider;
        self.record.model = facts.model;
        self.record.stream = facts.stream;
        self.reports_usage = facts.reports_usage;
        if self.record.metadata.is_none() {
            self.record.metadata = call.metadata().cloned();
        }
    }

    /// The client asked for a JSON answer, not a stream (the endpoints that report usage
    /// answer JSON unless asked to stream).
    fn expects_json(&self) -> bool {
        self.reports_usage && !self.record.stream
    }

    /// The first byte of a streamed answer goes to the client now.
    fn first_byte(&mut self, env: &mut Env) {
        if self.record.stream && self.record.first_byte_ms.is_none() {
            self.record.first_byte_ms = Some(env.io.host().now_ms());
        }
    }

    fn request_headers(&mut self, env: &mut Env, raw: RawHeaders, end_of_stream: bool) -> Action {
        // Without a body to read, the request can be sent again only when it has none.
        self.process(env, raw, end_of_stream.then(|| (0, Vec::new())))
    }

    /// Processes the request from its headers (and its body, once complete): the first time,
    /// and again each time a control-plane entry it waited for arrived.
    fn process(&mut self, env: &mut Env, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        let mut known = lookups::Known::new(&self.known, &mut env.tasks.recent);
        let mut catalog = Catalog::new(env.settings, &mut known);
        let started = match pipeline::start(env.settings, &raw, env.io.host(), &mut catalog) {
            Ok(Started::NeedsBody(pending)) => match &body {
                // A JSON endpoint whose body is in (or that was called without one).
                Some((_, bytes)) => pipeline::finish(env.settings, pending, bytes, env.io.host(), &mut catalog),
                None => Ok(Started::NeedsBody(pending)),
            },
            started => started,
        };
        // The caller's workspace, once its key is known (with a control plane).
        if catalog.enabled() && !catalog.workspace.is_empty() {
            self.record.workspace.clone_from(&catalog.workspace);
        }
        if env.settings.lookup_gate {
            // The main instance does the rest once every entry is read.
            return match started {
                Ok(Started::Lookup(r)) => self.look_up(env, r, Stalled::new(raw, body)),
                _ => Action::Continue,
            };
        }
        match started {
            Err(error) => self.answer_error(env, &error),
            Ok(Started::Health) => self.health(env),
            Ok(Started::Ready(call)) => self.admit(env, call, raw, body),
            Ok(Started::Lookup(r)) => self.look_up(env, r, Stalled::new(raw, body)),
            Ok(Started::Relay(relay)) => self.relay(env, &relay, &raw),
            Ok(Started::NeedsBody(pending)) => {
                self.unroute(env, &raw);
                self.phase = Phase::AwaitingBody(Box::new((pending, raw)));
                // Held until the body is complete (allow_on_headers_stop_iteration).
                Action::Pause
            }
        }
    }

    /// A held request goes nowhere if Envoy resumes it without the gateway's edits.
    fn unroute(&mut self, env: &mut Env, raw: &RawHeaders) {
        if headers::find(raw, CLUSTER_HEADER).is_some() {
            env.io.set_request_header(env.id, CLUSTER_HEADER, UNROUTED);
        }
    }

    fn request_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        if let Phase::AwaitingLookup(stalled) = &mut self.phase {
            // Buffered meanwhile; the request is processed with it once the entry arrived (a
            // body the gateway does not read stays in Envoy's buffer).
            if end_of_stream && !stalled.ended {
                stalled.ended = true;
                if pipeline::reads_body(&stalled.raw) {
                    let body = env.io.request_body(env.id, size);
                    self.record.client_sent(&body);
                    stalled.body = Some((size, body));
                }
            }
            return Action::Pause;
        }
        if !matches!(self.phase, Phase::AwaitingBody(..)) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let Phase::AwaitingBody(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let (pending, raw) = *held;
        let body = env.io.request_body(env.id, size);
        self.record.client_sent(&body);
        let mut known = lookups::Known::new(&self.known, &mut env.tasks.recent);
        let mut catalog = Catalog::new(env.settings, &mut known);
        match pipeline::finish(env.settings, pending, &body, env.io.host(), &mut catalog) {
            Err(error) => self.answer_error(env, &error),
            Ok(Started::Ready(call)) => self.admit(env, call, raw, Some((size, body))),
            Ok(Started::Lookup(r)) => self.look_up(env, r, Stalled::new(raw, Some((size, body)))),
            Ok(Started::Relay(relay)) => self.relay(env, &relay, &raw),
            Ok(_) => self.answer_error(env, &GatewayError::new(500, "api_error", "the request was not routed")),
        }
    }

    /// A managed-batch request goes to the control plane through Envoy's router, as it came
    /// (its answer passes back untouched).
    fn relay(&mut self, env: &mut Env, relay: &pipeline::Relay, raw: &RawHeaders) -> Action {
        let Some(edits) = relay.edits(env.settings, raw) else {
            let error = GatewayError::new(500, "api_error", "managed batches need the control plane");
            return self.answer_error(env, &error);
        };
        env.io.set_request_headers(env.id, &edits.apply(raw));
        Action::Continue
    }

    /// Holds the request until control-plane entry `r` arrives: one read per entry serves
    /// every request of this worker waiting for it.
    fn look_up(&mut self, env: &mut Env, r: Ref, stalled: Box<Stalled>) -> Action {
        let Some(cp) = &env.settings.control_plane else {
            return self.answer_error(env, &crate::catalog::unavailable(&r, "not configured"));
        };
        self.lookups += 1;
        if self.lookups > MAX_LOOKUPS {
            let error = GatewayError::new(500, "api_error", "the request needs too many control-plane reads");
            return self.answer_error(env, &error);
        }
        self.unroute(env, &stalled.raw);
        if let Some(waiters) = env.tasks.lookup_waiters.get_mut(&r) {
            waiters.push(env.id);
            self.phase = Phase::AwaitingLookup(stalled);
            return Action::Pause;
        }
        let Some(token) = env.io.dispatch(env.id, &lookups::call(cp, &r)) else {
            // Not even sent (e.g. no such cluster): as when it does not answer.
            lookups::count(env.io, "failed");
            let settled = lookups::failed(cp, &r, "it could not be called", env.io.host());
            return match settled {
                Ok(entry) => {
                    self.known.insert(r, entry);
                    self.process(env, stalled.raw, stalled.body)
                }
                Err(error) => self.answer_error(env, &error),
            };
        };
        env.tasks.calls.insert(token, (env.id, Task::Lookup(r.clone())));
        env.tasks.lookup_waiters.insert(r, vec![env.id]);
        self.phase = Phase::AwaitingLookup(stalled);
        Action::Pause
    }

    /// The entry a held request waited for (or why there is none): it is processed again.
    fn lookup_arrived(&mut self, env: &mut Env, r: &Ref, settled: &Result<Entry, GatewayError>) {
        if !matches!(self.phase, Phase::AwaitingLookup(_)) {
            return;
        }
        let Phase::AwaitingLookup(stalled) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return;
        };
        let action = match settled {
            Ok(entry) => {
                self.known.insert(r.clone(), entry.clone());
                let Stalled { raw, body, .. } = *stalled;
                self.process(env, raw, body)
            }
            // The main instance reads it again and answers.
            Err(_) if env.settings.lookup_gate => Action::Continue,
            Err(error) => self.answer_error(env, error),
        };
        if action == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
    }

    /// `/health`: ok, or with a control plane, ok only when the control plane answers ok too.
    fn health(&mut self, env: &mut Env) -> Action {
        let Some(cp) = &env.settings.control_plane else {
            return self.answer(env, 200, br#"{"status":"ok"}"#.to_vec());
        };
        match env.io.dispatch(env.id, &lookups::health_call(cp)) {
            Some(token) => {
                env.tasks.calls.insert(token, (env.id, Task::Health));
                self.phase = Phase::AwaitingHealth;
                Action::Pause
            }
            None => self.health_answered(env, 0),
        }
    }

    /// The control plane's health answered (status 0: it did not).
    fn health_answered(&mut self, env: &mut Env, status: u16) -> Action {
        if !matches!(self.phase, Phase::AwaitingHealth | Phase::Headers) {
            return Action::Continue;
        }
        if status == 200 {
            return self.answer(env, 200, br#"{"status":"ok"}"#.to_vec());
        }
        let why = if status == 0 { "no answer".to_string() } else { format!("it answered {status}") };
        let error = GatewayError::new(503, "api_error", format!("the control plane is not healthy ({why})"))
            .with_code("control_plane_unavailable");
        self.answer_error(env, &error)
    }

    fn request_trailers(&mut self, env: &mut Env) -> Action {
        // The body of a held request ends with trailers instead of end_of_stream: no client of
        // this API sends them, and the request must never go on unchecked.
        let incomplete = matches!(&self.phase, Phase::AwaitingLookup(stalled) if !stalled.ended);
        if matches!(self.phase, Phase::AwaitingBody(..)) || incomplete {
            let error = GatewayError::invalid_param("body", "request trailers are not supported on this endpoint");
            return self.answer_error(env, &error);
        }
        Action::Continue
    }

    /// Runs the input checks of the top-level config (before the cache: a denied prompt is
    /// not answered from it either), then forwards; a request whose checks call out is held.
    fn admit(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        // Routed: from here on every answer, a denial or a cache hit too, counts for the
        // provider and model the request is meant for.
        self.note(&call, call.attempts.current);
        let mut guard = match Guard::new(&call, &raw) {
            Ok(Some(guard)) => guard,
            Ok(None) => return self.forward(env, call, raw, body),
            Err(error) => return self.answer_error(env, &error),
        };
        let progress = guard.start_before(env, guard::Seen::of(&call, &raw));
        self.guard = Some(Box::new(guard));
        match progress {
            Progress::Waiting => {
                self.phase = Phase::AwaitingChecks(Box::new(Held { call, raw, body }));
                Action::Pause
            }
            Progress::Done => self.checked(env, call, raw, body),
        }
    }

    /// The input checks decided: a denied request is answered 446, the others go on.
    fn checked(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        match &self.guard {
            Some(guard) if guard.outcome() == verdict::Outcome::Deny => {
                let body = guard.denied_body();
                self.answer(env, verdict::DENY_STATUS, body)
            }
            _ => self.forward(env, call, raw, body),
        }
    }

    /// A check's call answered: the held request goes on (or is denied), or the held answer
    /// is sent.
    fn check_answered(&mut self, env: &mut Env, token: u32, answer: CallAnswer) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        if guard.answer(env, token, answer.status, &answer.body) != Some(Progress::Done) {
            return;
        }
        if matches!(self.phase, Phase::AwaitingChecks(_)) {
            let Phase::AwaitingChecks(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
                return;
            };
            let Held { call, raw, body } = *held;
            if self.checked(env, call, raw, body) == Action::Continue {
                env.after.push(After::ResumeRequest(env.id));
            }
            return;
        }
        if let Some(held) = guard.held.take() {
            let answer = guard.compose(env, held);
            self.reply(env, answer);
        }
    }

    /// A 2xx answer passes the output checks: the answer to send now, or None while their
    /// calls are awaited (the answer is then sent as a local reply).
    fn checked_answer(&mut self, env: &mut Env, answer: Answer) -> Option<Answer> {
        let guard = self.guard.as_mut()?;
        match guard.start_after(env, answer) {
            Progress::Waiting => None,
            Progress::Done => {
                let held = guard.held.take();
                held.map(|answer| guard.compose(env, answer))
            }
        }
    }

    /// Sends `answer` as a local reply.
    fn reply(&mut self, env: &mut Env, answer: Answer) {
        self.record.status = answer.status;
        let mut headers = vec![("content-type".to_string(), answer.content_type)];
        headers.extend(self.gateway_headers());
        self.phase = Phase::Answered;
        self.record.client_received(&answer.body);
        env.after.push(After::Reply { id: env.id, status: answer.status, headers, body: answer.body });
    }

    /// Sends the current attempt of `call` through Envoy's router. `body` is the whole request
    /// body and its size in Envoy's buffer, when the gateway has it (or knows there is none);
    /// only then can a later attempt send the request again.
    fn forward(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        self.cache = match CacheState::look_up(call.cache_plan(), env.settings, env.io.host()) {
            Ok(cache) => cache,
            Err(hit) => return self.answer_hit(env, hit),
        };
        let token = match token_for(env, &call, call.attempts.current) {
            Ok(Token::Unneeded) => None,
            Ok(Token::Ready(token)) => Some(token),
            Ok(Token::Awaited) => {
                self.phase = Phase::AwaitingToken(Box::new(Held { call, raw, body }));
                return Action::Pause;
            }
            Err(error) => return self.answer_error(env, &error),
        };
        self.send(env, call, raw, body, token.as_deref())
    }

    /// Sends the current attempt of `call` (with its backend's access token, when it needs one).
    fn send(
        &mut self,
        env: &mut Env,
        mut call: Call,
        raw: RawHeaders,
        body: Option<(usize, Vec<u8>)>,
        token: Option<&str>,
    ) -> Action {
        let host = env.io.host();
        let forward = match call.forward(env.settings, &raw, call.attempts.current, token, &|| host.now_ms()) {
            Ok(forward) => forward,
            Err(error) => return self.answer_error(env, &error),
        };
        let awaits_embedding = self.ask_embedding(env);
        let resendable = body.is_some();
        let (size, original) = body.unwrap_or_default();
        if let Some(new_body) = &forward.body {
            env.io.set_request_body(env.id, size, new_body);
        }
        env.io.set_request_headers(env.id, &forward.headers.apply(&raw));
        self.record.provider = forward.response.provider.name;
        self.record.target = call.target_path().to_string();
        let retained = (resendable && call.attempts.plan.can_recover()).then_some((raw, original));
        self.phase = Phase::Forwarded(Box::new(Routed { call, plan: forward.response, retained }));
        // A semantic lookup holds the request until its embedding arrives.
        if awaits_embedding {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    /// The access token a held request or a recovery attempt waited for (or why there is none).
    fn token_arrived(&mut self, env: &mut Env, fetched: &Result<String, GatewayError>) {
        if matches!(self.phase, Phase::AwaitingToken(_)) {
            let Phase::AwaitingToken(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
                return;
            };
            let Held { call, raw, body } = *held;
            let action = match fetched {
                Ok(token) => self.send(env, call, raw, body, Some(token)),
                Err(error) => self.answer_error(env, error),
            };
            if action == Action::Continue {
                env.after.push(After::ResumeRequest(env.id));
            }
            return;
        }
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        let Some(index) = recovery.awaiting_token.take() else {
            return;
        };
        let next = match fetched {
            Ok(token) => match self.dispatch_attempt(env, index, Some(token)) {
                Some(next) => next,
                None => return,
            },
            Err(error) => {
                log::warn!("attempt {index} skipped: {}", error.message);
                recovery.call.attempts.skip(env.io.host())
            }
        };
        self.step(env, next);
    }

    /// Semantic mode: starts the embeddings call; true when the request waits for it.
    fn ask_embedding(&mut self, env: &mut Env) -> bool {
        let Some(call) = self.cache.embeddings_call(env.settings) else {
            return false;
        };
        match env.io.dispatch(env.id, &call) {
            Some(token) => {
                env.tasks.calls.insert(token, (env.id, Task::Embedding));
                true
            }
            None => {
                log::warn!("the embeddings call could not start");
                self.cache.semantic_unavailable();
                false
            }
        }
    }

    fn embedding_arrived(&mut self, env: &mut Env, answer: CallAnswer) {
        let vector = if (200..300).contains(&answer.status) { semantic::embedding_of(&answer.body) } else { None };
        if vector.is_none() {
            log::warn!("semantic cache lookup skipped: the embeddings call answered {}", answer.status);
        }
        match self.cache.embedding_arrived(vector, env.settings, env.io.host()) {
            Some(hit) => {
                self.answer_hit(env, hit);
            }
            None => env.after.push(After::ResumeRequest(env.id)),
        }
    }

    fn response_headers(&mut self, env: &mut Env, end_of_stream: bool) -> Action {
        let routed = match std::mem::replace(&mut self.phase, Phase::Answered) {
            // The gateway's own answers already carry its headers (and their status is recorded).
            Phase::Answered => return Action::Continue,
            Phase::Recovering(recovery) => {
                let answered = recovery.answered;
                self.phase = Phase::Recovering(recovery);
                return if answered { Action::Continue } else { Action::Pause };
            }
            // Envoy answered before the request went upstream (e.g. 413 for a huge body).
            phase @ (Phase::Headers
            | Phase::AwaitingBody(..)
            | Phase::AwaitingToken(..)
            | Phase::AwaitingChecks(..)
            | Phase::AwaitingLookup(..)
            | Phase::AwaitingHealth) => {
                // A request still waiting for a token, a check or a control-plane read is over:
                // what arrives later finds nothing to send.
                let waiting = matches!(
                    phase,
                    Phase::AwaitingToken(..)
                        | Phase::AwaitingChecks(..)
                        | Phase::AwaitingLookup(..)
                        | Phase::AwaitingHealth
                );
                if !waiting {
                    self.phase = phase;
                }
                self.record.status = reply::parse_status(env.io.response_header(env.id, ":status").as_deref());
                self.set_gateway_headers(env);
                return Action::Continue;
            }
            Phase::Forwarded(routed) => routed,
        };
        let status = reply::parse_status(env.io.response_header(env.id, ":status").as_deref());
        self.record.status = status;
        // A status outside HTTP's range is a broken provider, as a 502 would say.
        let judged = if reply::valid_status(status) { status } else { 502 };
        let mut routed = routed;
        // Only errors are failures; a redirect or not-modified passes as it is.
        if judged < 400 {
            routed.call.attempts.succeeded(status, env.io.host());
            count_circuits(env, &mut routed.call);
            // No later attempt: the request copies can go.
            routed.retained = None;
            routed.call.release_body();
            self.phase = Phase::Forwarded(routed);
        } else {
            let details = env.io.response_details(env.id);
            let Some(failure) = reply::routed_failure(judged, &details) else {
                self.phase = Phase::Forwarded(routed);
                self.set_gateway_headers(env);
                return Action::Continue;
            };
            if routed.retained.is_some() {
                let headers = env.io.response_headers(env.id);
                let next = routed.call.attempts.failed(failure, &headers, env.io.host());
                count_circuits(env, &mut routed.call);
                if matches!(next, Next::Call { .. }) {
                    return self.recover(env, *routed, failure, next, headers);
                }
            } else {
                routed.call.attempts.failed_finally(failure, env.io.host());
                count_circuits(env, &mut routed.call);
            }
            self.phase = Phase::Forwarded(routed);
            // Envoy's own reply (timeout, no connection) gets the gateway's error shape.
            match failure {
                Failure::Timeout => return self.answer_error(env, &reply::timeout_error()),
                Failure::Unreachable | Failure::CircuitOpen => {
                    return self.answer_error(env, &reply::unreachable_error(&details))
                }
                Failure::Status(_) => {}
            }
        }
        let Phase::Forwarded(routed) = &self.phase else {
            return Action::Continue;
        };
        let head = self.record.method == "HEAD";
        let (id, io) = (env.id, &mut *env.io);
        let mut event_stream = || io.response_header(id, "content-type").is_some_and(|v| stream::is_stream(&v));
        self.mode = response_mode(&routed.plan, head, status, self.expects_json(), &mut event_stream);
        if let ResponseMode::Unreadable(why) = self.mode {
            return self.answer_error(env, &reply::unreadable_error(routed.plan.provider.name, why));
        }
        if let Some(guard) = &mut self.guard {
            if reply::has_body(head, status) && (200..300).contains(&status) {
                // A passthrough answer's headers in one host call (each call costs); the other
                // modes' content is known.
                let passthrough = self.mode == ResponseMode::Passthrough;
                let answer_headers = if passthrough { io.response_headers(id) } else { Vec::new() };
                let header = |name: &str| headers::find(&answer_headers, name);
                let content_type = header("content-type");
                let stream = self.mode == ResponseMode::Stream || content_type.is_some_and(stream::is_stream);
                // Only JSON answers are held whole (not audio or images).
                let json = self.mode == ResponseMode::Translated
                    || content_type.is_some_and(|v| v.windows(4).any(|w| w == b"json"));
                self.hold = if stream { guard.holds_streams() } else { json && guard.shapes_answer() };
                // Verdicts known before the answer: an answer that passes untouched flows, with
                // `hook_results` spliced in on its way (it grows by a known length).
                let untouched = passthrough && header("content-encoding").is_none_or(|v| v == b"identity");
                // (A body must follow: its chunks carry what the new length announces.)
                if self.hold && !stream && !end_of_stream && untouched && guard.decided_before_answer() {
                    self.hold = false;
                    if guard.outcome() == verdict::Outcome::Flag {
                        self.record.status = verdict::FLAG_STATUS;
                        io.set_response_header(id, ":status", Some(&verdict::FLAG_STATUS.to_string()));
                    }
                    let added = guard.splice_answer();
                    let length = header("content-length");
                    let length = length.and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
                    let length = length.map(|length| length.saturating_add(added).to_string());
                    io.set_response_header(id, "content-length", length.as_deref());
                }
                if stream && !self.hold {
                    // The stream flows: a flagged request shows in its status only.
                    if guard.outcome() == verdict::Outcome::Flag {
                        self.record.status = verdict::FLAG_STATUS;
                        env.io.set_response_header(env.id, ":status", Some(&verdict::FLAG_STATUS.to_string()));
                    }
                    guard.watch_stream();
                }
            }
        }
        self.set_gateway_headers(env);
        if self.cache.is_active() && reply::has_body(head, status) && (200..300).contains(&status) {
            // The content type of what the client gets.
            let content_type = match &self.mode {
                ResponseMode::Stream => "text/event-stream".to_string(),
                ResponseMode::Translated => "application/json".to_string(),
                _ => env
                    .io
                    .response_header(env.id, "content-type")
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_default(),
            };
            self.cache.start_capture(env.settings, &content_type);
        }
        if self.mode == ResponseMode::Passthrough
            && self.reports_usage
            && reply::has_body(head, status)
            && (200..300).contains(&status)
        {
            self.usage = Some(UsageScan::default());
        }
        match self.mode {
            // Held whole for the output checks.
            _ if self.hold => self.hold_answer(env),
            ResponseMode::Passthrough => Action::Continue,
            ResponseMode::Stream => {
                // Translated chunks change the length; Envoy frames the stream.
                env.io.set_response_header(env.id, "content-length", None);
                let provider_type = env.io.response_header(env.id, "content-type");
                if let Some(content_type) = stream::client_content_type(provider_type.as_deref()) {
                    env.io.set_response_header(env.id, "content-type", Some(content_type));
                }
                Action::Continue
            }
            // No body will follow: answer with the finished one now.
            ResponseMode::Error(_) | ResponseMode::Translated if end_of_stream => {
                let finished = self.finish_routed(env, Vec::new());
                self.answer(env, finished.status, finished.body)
            }
            // Held until the whole body is in, so status and length can still change (an
            // unreadable answer was answered above).
            ResponseMode::Error(_) | ResponseMode::Translated | ResponseMode::Unreadable(_) => self.hold_answer(env),
        }
    }

    /// Holds the provider's answer in Envoy until its body is in. Should the provider break
    /// off meanwhile, Envoy answers itself, past the filter: its reply (in the gateway's error
    /// shape, by the config's local reply mapper) gets the gateway's headers from here.
    fn hold_answer(&mut self, env: &mut Env) -> Action {
        self.awaiting_end = true;
        self.each_gateway_header(&mut |name, value| env.io.publish_header(env.id, name, value));
        Action::Pause
    }

    fn response_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        self.awaiting_end &= !end_of_stream;
        let routed = match &mut self.phase {
            Phase::Recovering(recovery) if recovery.answered => return Action::Continue,
            // The failed attempt's body: emptied chunk by chunk, so it never fills the buffer.
            Phase::Recovering(_) => {
                env.io.set_response_body(env.id, size, &[]);
                return Action::Pause;
            }
            Phase::Forwarded(routed) => routed,
            _ => return Action::Continue,
        };
        if size > 0 && self.record.stream && self.record.first_byte_ms.is_none() {
            self.record.first_byte_ms = Some(env.io.host().now_ms());
        }
        if self.hold {
            return self.held_body(env, size, end_of_stream);
        }
        let watching = self.guard.as_ref().is_some_and(|g| g.follows_answer());
        match self.mode {
            ResponseMode::Passthrough if self.cache.capturing() || watching || self.usage.is_some() => {
                let body = env.io.response_body(env.id, size);
                if let Some(scan) = &mut self.usage {
                    scan.push(&body);
                    if end_of_stream {
                        self.record.usage = scan.usage();
                    }
                }
                self.record.client_received(&body);
                self.capture(env, &body, end_of_stream);
                if let Some(edit) = self.watched(env, &body, end_of_stream) {
                    env.io.set_response_body(env.id, edit.replaced, &edit.with);
                }
                Action::Continue
            }
            ResponseMode::Passthrough => {
                // Only what the record keeps is read.
                if let Some(bodies) = &mut self.record.bodies {
                    let room = bodies.response.room().min(size);
                    let kept = if room > 0 { env.io.response_body(env.id, room) } else { Vec::new() };
                    bodies.response.push_prefix(&kept, size);
                }
                Action::Continue
            }
            ResponseMode::Stream => {
                let body = env.io.response_body(env.id, size);
                let mut out = Vec::with_capacity(body.len() + 256);
                routed.plan.translator.stream(&body, &mut out);
                if end_of_stream {
                    routed.plan.translator.stream_end(&mut out);
                    self.record.usage = routed.plan.translator.usage();
                }
                self.capture(env, &out, end_of_stream);
                if let Some(edit) = self.watched(env, &out, end_of_stream) {
                    out.splice(..edit.replaced.min(out.len()), edit.with);
                }
                env.io.set_response_body(env.id, size, &out);
                self.record.client_received(&out);
                Action::Continue
            }
            ResponseMode::Error(_) | ResponseMode::Translated | ResponseMode::Unreadable(_) if !end_of_stream => {
                Action::Pause
            }
            ResponseMode::Error(_) | ResponseMode::Translated | ResponseMode::Unreadable(_) => {
                let body = env.io.response_body(env.id, size);
                let finished = self.finish_routed(env, body);
                if finished.status != self.record.status {
                    self.record.status = finished.status;
                    env.io.set_response_header(env.id, ":status", Some(&finished.status.to_string()));
                }
                env.io.set_response_header(env.id, "content-type", Some("application/json"));
                env.io.set_response_header(env.id, "content-length", Some(&finished.body.len().to_string()));
                env.io.set_response_body(env.id, size, &finished.body);
                self.record.client_received(&finished.body);
                if (200..300).contains(&finished.status) {
                    self.capture(env, &finished.body, true);
                }
                Action::Continue
            }
        }
    }

    /// The whole body of a buffered routed response, finished for the client (an error is
    /// reshaped with the provider's headers in view).
    fn finish_routed(&mut self, env: &mut Env, body: Vec<u8>) -> Finished {
        let Phase::Forwarded(routed) = &mut self.phase else {
            return Finished { status: self.record.status, json: false, body, error_code: None };
        };
        let headers = match self.mode {
            ResponseMode::Error(_) => env.io.response_headers(env.id),
            _ => Vec::new(),
        };
        let finished = finish(&mut routed.plan, self.mode, self.record.status, &headers, body);
        self.record.usage = routed.plan.translator.usage();
        self.record.error_code = finished.error_code;
        finished
    }

    /// The bytes of an answer that flows, for the guard: what to change in them, if anything.
    fn watched(&mut self, env: &mut Env, bytes: &[u8], end: bool) -> Option<guardrails::inject::Edit> {
        self.guard.as_mut()?.watched(env, bytes, end)
    }

    /// The body of a 2xx answer held for the output checks: once whole, finished as its mode
    /// says, checked, and sent in place (or as a local reply once the checks' calls answered).
    fn held_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = env.io.response_body(env.id, size);
        let finished = self.finish_routed(env, body);
        // A held answer that passes untouched still tells its usage.
        if let Some(scan) = &mut self.usage {
            scan.push(&finished.body);
            self.record.usage = scan.usage();
        }
        let content_type = match self.mode {
            ResponseMode::Stream => {
                stream::client_content_type(env.io.response_header(env.id, "content-type").as_deref())
                    .unwrap_or("text/event-stream")
                    .to_string()
            }
            ResponseMode::Translated | ResponseMode::Error(_) | ResponseMode::Unreadable(_) => {
                "application/json".to_string()
            }
            ResponseMode::Passthrough => env
                .io
                .response_header(env.id, "content-type")
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default(),
        };
        if (200..300).contains(&finished.status) {
            self.capture(env, &finished.body, true);
        }
        let answer = Answer { status: finished.status, content_type, body: finished.body };
        let Some(answer) = self.checked_answer(env, answer) else {
            return Action::Pause;
        };
        self.record.status = answer.status;
        env.io.set_response_header(env.id, ":status", Some(&answer.status.to_string()));
        env.io.set_response_header(env.id, "content-type", Some(&answer.content_type));
        env.io.set_response_header(env.id, "content-length", Some(&answer.body.len().to_string()));
        env.io.set_response_body(env.id, size, &answer.body);
        self.record.client_received(&answer.body);
        Action::Continue
    }

    fn capture(&mut self, env: &mut Env, bytes: &[u8], end: bool) {
        if let Some(stored) = self.cache.capture(bytes, end, env.settings, self.record.provider, env.io.host()) {
            self.record.cache_stored = Some(stored);
        }
    }

    /// The routed attempt failed and the plan goes on: hold this response and run the next
    /// attempts as dispatched calls (`headers`: the failed response's).
    fn recover(&mut self, env: &mut Env, routed: Routed, failure: Failure, next: Next, headers: RawHeaders) -> Action {
        let Some((raw, body)) = routed.retained else {
            return Action::Continue;
        };
        // The failed response's status and headers (its body is dropped chunk by chunk): the
        // answer when no later attempt can even be dispatched.
        let status = match failure {
            Failure::Status(status) => status,
            Failure::Timeout | Failure::Unreachable | Failure::CircuitOpen => 0,
        };
        self.phase = Phase::Recovering(Box::new(Recovery {
            call: routed.call,
            raw,
            body,
            plan: routed.plan,
            latest: Outcome::of(failure, CallAnswer { status, headers, body: Vec::new() }),
            awaiting_token: None,
            answered: false,
        }));
        self.step(env, next);
        self.hold_answer(env)
    }

    /// Carries out `next` until a call is on its way, a timer is set, or the answer is sent.
    fn step(&mut self, env: &mut Env, mut next: Next) {
        loop {
            next = match next {
                Next::GiveUp => return self.answer_recovered(env),
                Next::Call { index, delay_ms } if delay_ms > 0 => {
                    let due_ms = env.io.host().now_ms().saturating_add(delay_ms);
                    env.tasks.timers.push(Timer { due_ms, owner: env.id, attempt: index });
                    return rearm(env.tasks, env.io);
                }
                Next::Call { index, .. } => match self.dispatch_attempt(env, index, None) {
                    Some(failed) => failed,
                    None => return,
                },
            };
        }
    }

    /// Dispatches attempt `index` (`token`: its backend's access token, just fetched); what to
    /// do instead when it cannot even start.
    fn dispatch_attempt(&mut self, env: &mut Env, index: usize, token: Option<&str>) -> Option<Next> {
        let Phase::Recovering(recovery) = &mut self.phase else {
            return None;
        };
        let cached = match token {
            Some(_) => None,
            None => match token_for(env, &recovery.call, index) {
                Ok(Token::Unneeded) => None,
                Ok(Token::Ready(token)) => Some(token),
                Ok(Token::Awaited) => {
                    recovery.awaiting_token = Some(index);
                    return None;
                }
                Err(error) => {
                    log::warn!("attempt {index} skipped: {}", error.message);
                    return Some(recovery.call.attempts.skip(env.io.host()));
                }
            },
        };
        let token = token.or(cached.as_deref());
        let facts = recovery.call.facts(index);
        self.record.model = facts.model;
        let host = env.io.host();
        let forward = match recovery.call.forward(env.settings, &recovery.raw, index, token, &|| host.now_ms()) {
            Ok(forward) => forward,
            Err(error) => {
                log::warn!("attempt {index} skipped, its request cannot be built: {}", error.message);
                return Some(recovery.call.attempts.skip(env.io.host()));
            }
        };
        let Forward { headers, body, response } = forward;
        let call = attempt_call(env.settings, &headers.apply(&recovery.raw), body, &recovery.body);
        match env.io.dispatch(env.id, &call) {
            Some(token) => {
                // The answer will be this attempt's (until then the latest outcome is the
                // previous attempt's, answered by its own provider's translator).
                recovery.plan = response;
                env.tasks.calls.insert(token, (env.id, Task::Attempt));
                None
            }
            // The gateway's own fault (e.g. no such cluster), not the provider's.
            None => {
                log::warn!("dispatching to cluster {} failed", call.cluster);
                Some(recovery.call.attempts.skip(env.io.host()))
            }
        }
    }

    fn attempt_answered(&mut self, env: &mut Env, answer: CallAnswer) {
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        let next = match reply::call_failure(answer.status, &answer.body) {
            None => {
                recovery.call.attempts.succeeded(answer.status, env.io.host());
                count_circuits(env, &mut recovery.call);
                recovery.latest = Outcome::Response(answer);
                Next::GiveUp
            }
            Some(failure) => {
                let next = recovery.call.attempts.failed(failure, &answer.headers, env.io.host());
                count_circuits(env, &mut recovery.call);
                recovery.latest = Outcome::of(failure, answer);
                next
            }
        };
        self.step(env, next);
    }

    /// Sends the latest outcome of a recovered request as a local answer.
    fn answer_recovered(&mut self, env: &mut Env) {
        let expects_json = self.expects_json();
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        let head = self.record.method == "HEAD";
        let (finished, mut headers) = match &mut recovery.latest {
            Outcome::Response(answer) => {
                let status = answer.status;
                let provider_type = headers::find(&answer.headers, "content-type");
                let event_stream = provider_type.is_some_and(stream::is_stream);
                let mode = response_mode(&recovery.plan, head, status, expects_json, &mut || event_stream);
                let body = std::mem::take(&mut answer.body);
                let finished = finish(&mut recovery.plan, mode, status, &answer.headers, body);
                self.record.usage = recovery.plan.translator.usage();
                if mode == ResponseMode::Passthrough && self.reports_usage && (200..300).contains(&status) {
                    self.record.usage = UsageScan::of(&finished.body);
                }
                let mut headers = reply::provider_headers(&answer.headers, finished.json);
                if let (ResponseMode::Stream, Some(sse)) = (mode, stream::client_content_type(provider_type)) {
                    headers.retain(|(name, _)| name != "content-type");
                    headers.push(("content-type".into(), sse.into()));
                }
                (finished, headers)
            }
            Outcome::Timeout => (reply::gateway_error(&reply::timeout_error()), json_headers()),
            Outcome::Unreachable => {
                let error = reply::unreachable_error("the connection failed before a response");
                (reply::gateway_error(&error), json_headers())
            }
        };
        recovery.answered = true;
        self.record.stream &= (200..300).contains(&finished.status);
        if self.record.stream && self.record.first_byte_ms.is_none() {
            self.record.first_byte_ms = Some(env.io.host().now_ms());
        }
        self.record.status = finished.status;
        self.record.error_code = finished.error_code;
        self.record.provider = recovery.plan.provider.name;
        let mut finished = finished;
        if (200..300).contains(&finished.status) {
            let content_type = headers.iter().find(|(n, _)| n == "content-type").map_or("", |(_, v)| v.as_str());
            self.cache.start_capture(env.settings, content_type);
            self.capture(env, &finished.body, true);
            if self.guard.is_some() {
                let content_type = content_type.to_string();
                let answer = Answer { status: finished.status, content_type, body: finished.body };
                // Sent as a local reply once the output checks' calls answered.
                let Some(answer) = self.checked_answer(env, answer) else {
                    return;
                };
                headers.retain(|(name, _)| name != "content-type");
                headers.push(("content-type".into(), answer.content_type));
                (finished.status, finished.body) = (answer.status, answer.body);
                self.record.status = finished.status;
            }
        }
        headers.extend(self.gateway_headers());
        self.record.client_received(&finished.body);
        env.after.push(After::Reply { id: env.id, status: finished.status, headers, body: finished.body });
    }

    /// The gateway's response headers, for every answer: the trace id, and as far as known the
    /// provider, the target and retries (configs that can recover), and the cache status.
    fn each_gateway_header(&self, add: &mut dyn FnMut(&str, &str)) {
        add(TRACE_HEADER, &self.record.trace_id);
        if !self.record.provider.is_empty() {
            add(PROVIDER_HEADER, self.record.provider);
        }
        let call = match &self.phase {
            Phase::Forwarded(routed) => Some(&routed.call),
            Phase::Recovering(recovery) => Some(&recovery.call),
            _ => None,
        };
        if let Some(call) = call {
            if !call.target_path().is_empty() {
                add(TARGET_HEADER, call.target_path());
            }
            if call.attempts.plan.can_recover() {
                add(RETRIES_HEADER, &call.attempts.retries.to_string());
            }
        }
        if let Some(status) = self.cache.status_header() {
            add(STATUS_HEADER, status);
        }
    }

    /// The same headers for a local answer.
    fn gateway_headers(&self) -> Vec<(String, String)> {
        let mut headers = Vec::new();
        self.each_gateway_header(&mut |name, value| headers.push((name.to_string(), value.to_string())));
        headers
    }

    fn set_gateway_headers(&self, env: &mut Env) {
        self.each_gateway_header(&mut |name, value| env.io.set_response_header(env.id, name, Some(value)));
    }

    fn answer_error(&mut self, env: &mut Env, error: &GatewayError) -> Action {
        self.record.error_code = error.code;
        self.answer(env, error.status, error.to_json())
    }

    /// Answers with a JSON body of the gateway's.
    fn answer(&mut self, env: &mut Env, status: u16, body: Vec<u8>) -> Action {
        self.record.status = status;
        let mut headers = json_headers();
        headers.extend(self.gateway_headers());
        self.phase = Phase::Answered;
        self.record.client_received(&body);
        env.after.push(After::Reply { id: env.id, status, headers, body });
        Action::Pause
    }

    /// Answers from the cache.
    fn answer_hit(&mut self, env: &mut Env, hit: Hit) -> Action {
        self.record.status = 200;
        self.record.provider = crate::providers::find(&hit.provider).map_or("", |spec| spec.name);
        self.cache = CacheState::Served(hit.status);
        self.first_byte(env);
        // No attempt answered: the gateway headers name no target and no retries.
        self.phase = Phase::Answered;
        let answer = Answer { status: 200, content_type: hit.content_type, body: hit.body };
        // A cached answer passes the output checks too.
        let answer = match self.guard.is_some() {
            true => self.checked_answer(env, answer),
            false => Some(answer),
        };
        if let Some(answer) = answer {
            self.reply(env, answer);
        }
        Action::Pause
    }
}

/// Whether attempt `index` of `call` needs an access token: cached, or fetched now (one
/// fetch per credential serves every request waiting for it).
fn token_for(env: &mut Env, call: &Call, index: usize) -> Result<Token, GatewayError> {
    let Some(backend) = call.token_source(index) else {
        return Ok(Token::Unneeded);
    };
    let Some(source) = backend.token_source() else {
        return Ok(Token::Unneeded);
    };
    let key = source.cache_key();
    let host = env.io.host();
    if let Some(token) = tokens::cached(host.store(), key, host.now_ms()) {
        return Ok(Token::Ready(token));
    }
    if let Some(waiters) = env.tasks.token_waiters.get_mut(key) {
        waiters.push(env.id);
        return Ok(Token::Awaited);
    }
    let request = source.request(host.now_ms())?;
    let dispatch = tokens::call(env.settings, &request)?;
    let Some(call_token) = env.io.dispatch(env.id, &dispatch) else {
        return Err(GatewayError::new(502, "api_error", "the token endpoint could not be called")
            .with_code("token_exchange_failed"));
    };
    env.tasks.calls.insert(call_token, (env.id, Task::Token(key.to_string())));
    env.tasks.token_waiters.insert(key.to_string(), vec![env.id]);
    Ok(Token::Awaited)
}

fn json_headers() -> Vec<(String, String)> {
    vec![("content-type".to_string(), "application/json".to_string())]
}

/// Adds the circuits the request's latest outcome opened to the host's counter, and how it
/// changed the circuits open now to the gauge.
fn count_circuits(env: &mut Env, call: &mut Call) {
    let opened = std::mem::take(&mut call.attempts.circuits_opened);
    if opened > 0 {
        env.io.metric(metrics::Kind::Counter, metrics::CIRCUITS_OPENED, u64::from(opened));
    }
    let change = std::mem::take(&mut call.attempts.circuits_open_change);
    if change != 0 {
        env.io.add_to_gauge(metrics::CIRCUITS_OPEN, i64::from(change));
    }
}

/// The dispatched call of a later attempt, through the recovery listener: the attempt's
/// request headers and body (the client's, when the translator kept them).
fn attempt_call(
    settings: &Settings,
    headers: &[(&str, &[u8])],
    body: Option<Vec<u8>>,
    original_body: &[u8],
) -> Dispatch {
    let body = body.unwrap_or_else(|| original_body.to_vec());
    // The cluster and per-try timeout headers stay: the internal listener's router uses them.
    let framing = ["content-length", "transfer-encoding"];
    let mut headers: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| !framing.contains(name))
        .map(|(name, value)| (name.to_string(), String::from_utf8_lossy(value).into_owned()))
        .collect();
    headers.push(("content-length".into(), body.len().to_string()));
    Dispatch { cluster: settings.recovery_cluster.clone(), headers, body, timeout_ms: CALL_TIMEOUT_MS }
}
