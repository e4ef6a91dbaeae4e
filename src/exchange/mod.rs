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
//!
//! Where to read what:
//!
//! | file | what |
//! |---|---|
//! | `worker.rs` | the worker: requests by context id, tasks by call token, waiters, timers, records |
//! | `waiters.rs` | one fetch (token, JWKS, control-plane entry) for every request waiting for it |
//! | `request.rs` | the request phases: start, control-plane reads, checks, token, cache, forward |
//! | `head.rs` | a provider's response head (status, headers), read from the host once |
//! | `response.rs` | the routed response: its mode, its body as it flows |
//! | `finish.rs` | finishing a whole answer: translate, usage, cache, output checks, delivery |
//! | `recovery.rs` | later attempts as dispatched calls, and the recovered answer |
//! | `gate.rs` | the lookup gate: reads entries ahead of the main instance, nothing else |
//! | `guard.rs`, `caching.rs`, `lookups.rs`, `tokens.rs`, `usage.rs` | each concern's own state |
//! | `reply.rs` | response modes, finishing a body, the gateway's error answers |
//! | `record.rs`, `shipping.rs`, `metrics.rs`, `bodies.rs` | the request record and where it goes |

mod bodies;
mod caching;
mod finish;
mod gate;
mod guard;
mod head;
mod limits;
mod lookups;
mod mcp;
mod mcp_aggregate;
pub(crate) mod metrics;
pub(crate) mod record;
mod recovery;
pub(crate) mod reply;
mod request;
mod response;
mod shipping;
#[cfg(test)]
mod tests;
mod tokens;
pub(crate) mod usage;
mod waiters;
mod worker;

use crate::cache::store;
use crate::cache::STATUS_HEADER;
use crate::client_api;
use crate::errors::GatewayError;
use crate::pipeline::{Call, ResponsePlan, PROVIDER_HEADER, RETRIES_HEADER, TARGET_HEADER, TRACE_HEADER};
use crate::ports::{Host, SharedStore};
use crate::request::endpoint::{classify, ClientApi, Route};
use crate::request::headers::{self, TraceFields};
use crate::routing::breaker;
use crate::settings::Settings;
use crate::upstream::Upstream;
use bodies::Bodies;
use caching::CacheState;
use guard::Guard;
use head::Head;
use lookups::{Reads, Stalled};
pub(crate) use record::Record;
use recovery::Recovery;
pub(crate) use reply::parse_status;
use reply::ResponseMode;
#[cfg(all(test, feature = "native"))]
pub(crate) use shipping::Handover;
#[cfg(any(test, feature = "native"))]
pub(crate) use shipping::IdleCopies;
use std::fmt::Write;
use std::rc::Rc;
use usage::UsageScan;
#[cfg(feature = "native")]
pub(crate) use worker::IdleCalls;
use worker::Tasks;
pub(crate) use worker::Worker;

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
    /// Every response header at once (the response head is read once, see [`response`]).
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
    /// A POST to `upstream`, through the cluster `Settings::dispatch_cluster` names.
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

    /// A `method` request to `upstream` (`extra`: its headers, the content type among them
    /// when there is a body): through the recovery listener, whose router reaches any host by
    /// the cluster header (resolving new hosts on the way), or straight to the host's cluster.
    fn request(
        settings: &Settings,
        upstream: &Upstream,
        method: &str,
        path: &str,
        body: Vec<u8>,
        extra: Vec<(String, String)>,
        timeout_ms: u64,
    ) -> Dispatch {
        let (cluster, route) = settings.dispatch_cluster(upstream);
        let mut headers = vec![
            (":method".to_string(), method.to_string()),
            (":path".to_string(), path.to_string()),
            (":authority".to_string(), upstream.authority.clone()),
        ];
        if method != "GET" || !body.is_empty() {
            headers.push(("content-length".to_string(), body.len().to_string()));
        }
        headers.extend(extra);
        headers.extend(route.map(|(name, value)| (name.to_string(), value)));
        Dispatch { cluster, headers, body, timeout_ms }
    }
}

/// A dispatched call's answer; status 0 when it failed without one.
pub(crate) struct CallAnswer {
    pub(crate) status: u16,
    pub(crate) headers: RawHeaders,
    pub(crate) body: Vec<u8>,
}

impl CallAnswer {
    /// A call that failed without an answer.
    pub(crate) const FAILED: CallAnswer = CallAnswer { status: 0, headers: Vec::new(), body: Vec::new() };
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

/// What an exchange's event handler can reach besides the exchange.
struct Env<'a> {
    id: u32,
    settings: &'a Settings,
    io: &'a mut dyn Io,
    tasks: &'a mut Tasks,
    after: Vec<After>,
}

/// Names no cluster: a held request that Envoy resumed without the gateway's edits goes
/// nowhere, even when the client named a cluster itself (without the header Envoy's route
/// finds no cluster either).
const UNROUTED: &str = "gateway-unrouted";

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

/// Starts the call that fetches `fetch` for every request of the worker that will wait for it,
/// `first` (made from the call's token) the first; None when the call could not be sent. The
/// call is the root context's: Envoy cancels a context's calls when it ends, and the request
/// that started a fetch may end before the others that joined it. The timer is set for when the
/// fetch would count as lost.
fn start_fetch(
    env: &mut Env,
    call: &Dispatch,
    fetch: waiters::Fetch,
    first: impl FnOnce(u32) -> waiters::Waiter,
) -> Option<u32> {
    let token = env.io.dispatch(env.tasks.root, call)?;
    let first = first(token);
    let now_ms = env.io.host().now_ms();
    env.tasks.calls.insert(token, (first.id, worker::Task::Fetch(fetch.clone())));
    env.tasks.waiters.started(fetch, first, now_ms, call);
    worker::rearm(env.tasks, env.io);
    Some(token)
}

/// A held request goes nowhere if Envoy resumes it without the gateway's edits.
fn unroute(env: &mut Env, raw: &RawHeaders) {
    let route_header = env.settings.route_header();
    if headers::find(raw, route_header).is_some() {
        env.io.set_request_header(env.id, route_header, UNROUTED);
    }
}

/// The request's trace id: the client's, else Envoy's request id, else a random one.
fn trace_id(trace: &TraceFields, host: &mut dyn Host) -> String {
    match &trace.trace_id {
        Some(id) => id.clone(),
        None => uuid_v7(host.now_ms(), host.random(), host.random()),
    }
}

/// A UUID version 7 (RFC 9562): the time in ms, then random bits. The gateway's trace ids
/// follow time, as its record ids do, so the control plane's trace-id index grows at its end
/// rather than at a random page per record (Envoy's `x-request-id`, random, cost SQLite a
/// third of its ingest time; bench/README.md).
fn uuid_v7(now_ms: u64, high: u64, low: u64) -> String {
    let time = now_ms & 0xffff_ffff_ffff;
    let version_and_random = 0x7000 | (high & 0x0fff);
    let variant_and_random = 0x8000 | ((high >> 12) & 0x3fff);
    let node = low & 0xffff_ffff_ffff;
    // Written into its exact size: `format!` grows its string several times on the way.
    let mut id = String::with_capacity(36);
    let _ = write!(
        id,
        "{:08x}-{:04x}-{version_and_random:04x}-{variant_and_random:04x}-{node:012x}",
        time >> 16,
        time & 0xffff
    );
    id
}

/// The body of a held request ends with trailers instead of end_of_stream: no client of this
/// API sends them, and the request must never go on unchecked.
fn trailers_refused() -> GatewayError {
    GatewayError::invalid_param("body", "request trailers are not supported on this endpoint")
}

/// The answer to a request whose body Envoy withholds from the filter (see
/// [`worker::BODY_WAIT_MS`]): the setting that fixes it.
fn body_withheld_error() -> GatewayError {
    let message = format!(
        "Envoy did not pass the request body to the gateway's filter within {} s: the filter's Wasm \
         configuration needs \"allow_on_headers_stop_iteration\": true (in Istio and Envoy Gateway, the \
         patch shipped in deploy/; docs/deployment.md)",
        worker::BODY_WAIT_MS / 1000
    );
    GatewayError::new(500, "api_error", message).with_code("request_body_withheld")
}

fn json_headers() -> Vec<(String, String)> {
    vec![("content-type".to_string(), "application/json".to_string())]
}

/// A 405's `Allow` header (RFC 9110: the methods the resource takes), when the error has one.
fn allow_header(error: &GatewayError) -> Vec<(String, String)> {
    error.allow.iter().map(|methods| ("allow".to_string(), methods.clone())).collect()
}

enum Phase {
    Headers,
    /// Held until a control-plane entry arrives; then processed again from its headers.
    AwaitingLookup(Box<Stalled>),
    /// `/health` waits for the control plane's.
    AwaitingHealth,
    /// The request headers are held (with their raw values) until the body is complete.
    AwaitingBody(Box<(crate::pipeline::Pending, RawHeaders)>),
    /// Routed and held until its backend's access token arrives.
    AwaitingToken(Box<request::Held>),
    /// Routed and held until the input checks' calls answered.
    AwaitingChecks(Box<request::Held>),
    /// Routed and held until a limit's allowance is granted.
    AwaitingAllowance(Box<request::Held>),
    Forwarded(Box<Routed>),
    /// An MCP POST held (with its routing and raw headers) until its JSON-RPC message is in.
    McpAwaitingBody(Box<(crate::mcp::Target, RawHeaders)>),
    /// An MCP tool call held until a limit's allowance is granted.
    McpAwaitingAllowance(Box<McpHeld>),
    /// An MCP tool call held until the config's input checks' calls answered.
    McpAwaitingChecks(Box<McpHeld>),
    /// An MCP request to the aggregate endpoint, held while the gateway speaks to its servers
    /// (see `mcp_aggregate`).
    McpBackends(Box<mcp_aggregate::Backends>),
    /// A client's notification (or the end of its session) to the aggregate, held until this
    /// many servers answered it; then answered with `status`.
    McpNotifying {
        waiting: usize,
        status: u16,
    },
    /// A request the aggregate sent again (in a new server session) as a dispatched call, its
    /// server's first answer drained; the call's answer is the client's.
    McpResent(Box<mcp_aggregate::Resent>),
    /// Sent to its MCP server (`record.mcp` says which); with the policy that filters the
    /// answer when it is a `tools/list` whose caller may not use every tool.
    Mcp(Option<Box<Sent>>),
    /// The MCP server's answer, read as it passes (see `mcp::McpAnswer`).
    McpAnswer(Option<Box<mcp::McpAnswer>>),
    /// The first attempt failed; later ones run as dispatched calls.
    Recovering(Box<Recovery>),
    /// The gateway answered itself; its answer passes the response callbacks untouched.
    Answered,
}

/// What the exchange keeps of an MCP request it sent: what to change in its answer (a
/// `tools/list` whose caller may not use every tool; the server's requests on a call's stream
/// through the aggregate), and (through the aggregate) whose server session it was sent in,
/// forgotten when the server no longer knows it.
#[derive(Debug, Default)]
struct Sent {
    edit: Option<crate::mcp::Edit>,
    /// Whose server session, and its id.
    session: Option<(String, Option<String>)>,
    /// What sends the request again in a new session, should the server no longer know the
    /// kept one it went in (through the aggregate).
    resend: Option<Box<mcp_aggregate::Resend>>,
}

/// An MCP request on its way once its limits admit it: to one server with its edits, raw
/// headers and what to change in its answer; or through the aggregate, to its servers.
enum McpHeld {
    Server(Box<(crate::mcp::Routed, RawHeaders, Option<Box<Sent>>)>),
    Aggregate(Box<mcp_aggregate::Backends>),
}

/// A request routed through Envoy's router.
struct Routed {
    call: Call,
    plan: ResponsePlan,
    /// The client's headers and body, kept only when a failure could lead to another call.
    retained: Option<(RawHeaders, Vec<u8>)>,
    /// The provider's response head, once it arrived.
    head: Head,
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
    /// Reads the usage of an answer that flows untouched.
    usage: Option<UsageScan>,
    /// The control-plane entries this request read.
    reads: Reads,
    /// The provider's answer is held in Envoy until its body ends.
    awaiting_end: bool,
    /// A JSON answer of unannounced length: its headers wait for its first byte, since an
    /// empty one is the gateway's error rather than an empty 200.
    awaiting_first_byte: bool,
    /// A translated stream reached its end (else it was cut: the client left, or the provider).
    stream_ended: bool,
    /// The workspace's limits and prices (with a control plane).
    policy: Option<Rc<crate::usage_limits::Policy>>,
    /// What the request reserved of the limits that apply to it.
    limits: Option<Box<limits::Limited>>,
    /// A request to an MCP endpoint: the gateway's errors are JSON-RPC errors.
    /// The OAuth issuer's JWKS was fetched for this request (it is fetched once: see
    /// `jwks_arrived`).
    jwks_fetched: bool,
    mcp: bool,
}

impl Exchange {
    fn new(settings: Rc<Settings>, raw: &RawHeaders, host: &mut dyn Host) -> Exchange {
        let text = |name: &str| headers::find(raw, name).map(|v| String::from_utf8_lossy(v).into_owned());
        let trace = headers::trace_fields(raw);
        let trace_id = trace_id(&trace, host);
        // Bodies only ever go to the control plane.
        let bodies = (settings.records.bodies && settings.control_plane.is_some())
            .then(|| Box::new(Bodies::new(settings.records.max_body_bytes)));
        let method = text(":method").unwrap_or_default();
        let path = text(":path").unwrap_or_default();
        let (client_api, mcp) = match classify(&method, &path) {
            Ok(Route::Api { endpoint, .. }) => (endpoint.client_api(), false),
            Ok(Route::Mcp { .. }) => (ClientApi::Chat, true),
            _ => (ClientApi::Chat, false),
        };
        let record =
            Record { trace_id, trace, bodies, method, path, client_api, start_ms: host.now_ms(), ..Record::default() };
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
            reads: Reads::default(),
            awaiting_end: false,
            awaiting_first_byte: false,
            stream_ended: false,
            policy: None,
            limits: None,
            mcp,
            jwks_fetched: false,
        }
    }

    fn into_record(mut self) -> Record {
        let mut record = self.record;
        // A translated stream cut before its end (the client left, the provider broke off): the
        // usage its provider reported so far. Its closing events go nowhere; the limits settled
        // it by their bound already (`settle`).
        let cut = self.mode == ResponseMode::Stream && !self.stream_ended;
        if let (true, None, Phase::Forwarded(routed)) = (cut, record.usage, &mut self.phase) {
            routed.plan.translator.stream_end(&mut Vec::new());
            record.usage = routed.plan.translator.usage();
        }
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

    /// The gateway's response headers, for every answer: its own headers, and under limits the
    /// `x-ratelimit-*` headers.
    fn each_gateway_header(&self, add: &mut dyn FnMut(&str, &str)) {
        self.each_own_header(add);
        for (name, value) in self.limit_headers() {
            add(name, value);
        }
    }

    /// The gateway's own response headers: the trace id, and as far as known the provider, the
    /// target and retries (configs that can recover), and the cache status.
    fn each_own_header(&self, add: &mut dyn FnMut(&str, &str)) {
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
        self.answer_with(env, error.status, error.to_json(), allow_header(error))
    }

    /// Answers with a JSON body of the gateway's (an error in the shape of the client's API).
    fn answer(&mut self, env: &mut Env, status: u16, body: Vec<u8>) -> Action {
        self.answer_with(env, status, body, Vec::new())
    }

    /// Answers as [`Exchange::answer`] does, with `extra` headers.
    fn answer_with(&mut self, env: &mut Env, status: u16, body: Vec<u8>, extra: Vec<(String, String)>) -> Action {
        let body = match status >= 400 {
            true if self.mcp => {
                let facts = self.record.mcp.as_deref_mut();
                let id = facts.and_then(|facts| {
                    facts.outcome = crate::mcp::Outcome::Error;
                    facts.id.as_ref()
                });
                crate::mcp::error_body(status, &body, id)
            }
            true => client_api::error_body(self.record.client_api, status, body),
            false => body,
        };
        self.record.status = status;
        let mut headers = json_headers();
        let aggregate = self.record.mcp.as_deref().is_some_and(|facts| facts.server.is_empty());
        let oauth = env.settings.mcp_oauth.as_ref();
        if let Some((name, value)) = crate::mcp::error_header(status, aggregate, oauth).filter(|_| self.mcp) {
            headers.push((name.to_string(), value.to_string()));
        }
        headers.extend(extra);
        headers.extend(self.gateway_headers());
        self.phase = Phase::Answered;
        self.record.client_received(&body);
        env.after.push(After::Reply { id: env.id, status, headers, body });
        Action::Pause
    }
}
