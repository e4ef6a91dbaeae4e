//! The thin host adapter: the only code that calls proxy-wasm. It feeds headers and bodies
//! to the pure pipeline and applies the decisions it returns.
//!
//! The first attempt of a request goes through Envoy's router, so a healthy provider streams
//! straight to the client. When it fails in a way the plan retries or falls back on, the
//! response is held and later attempts run as dispatched calls; the final result is sent as a
//! local response. Timers exist only on the root context, so the recovery state of a request
//! lives in the worker's registry (`Worker`), reachable from both the request's context and
//! the root's (retry delays fire in the root's `on_tick`, and calls dispatched there answer
//! to the root).

use crate::cache::store::{self, Entry};
use crate::cache::{semantic, Capture, Lookup, Status, STATUS_HEADER};
use crate::config::CacheMode;
use crate::errors::GatewayError;
use crate::pipeline::{
    self, CachePlan, Call, Forward, Pending, ResponsePlan, Started, CLUSTER_HEADER, PROVIDER_HEADER, RETRIES_HEADER,
    TARGET_HEADER, TRACE_HEADER,
};
use crate::ports::Host;
use crate::ports::SharedStore;
use crate::providers::{ResponseContext, StreamTranslator};
use crate::request::headers::{self, TraceFields};
use crate::routing::attempts::Next;
use crate::routing::breaker;
use crate::routing::plan::Failure;
use crate::settings::Settings;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { settings: Rc::new(Settings::default()), worker: Rc::new(Worker::default()) })
    });
}}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn random_get(buf: *mut u8, len: usize) -> u16;
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_send_local_response(
        status_code: u32,
        status_details_data: *const u8,
        status_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

/// Random bytes from the host (WASI `random_get`), never from the clock.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // SAFETY: the host writes at most `N` bytes into a buffer of `N` bytes.
    let errno = unsafe { random_get(buf.as_mut_ptr(), N) };
    if errno != 0 {
        log::warn!("random_get failed (errno {errno}); random choices fall back to the first option");
    }
    buf
}

/// Randomness, clock and shared data for the pure routing code.
struct ProxyHost;

impl Host for ProxyHost {
    fn random(&mut self) -> u64 {
        u64::from_le_bytes(random_bytes::<8>())
    }

    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn store(&self) -> &dyn SharedStore {
        self
    }
}

impl SharedStore for ProxyHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        // A key that exists has a CAS token (its value may read as None when empty).
        match hostcalls::get_shared_data(key) {
            Ok((value, Some(cas))) => Some((value.unwrap_or_default(), cas)),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        hostcalls::set_shared_data(key, Some(value), (cas != 0).then_some(cas)).is_ok()
    }
}

/// Envoy's own text answers of a dispatched call that never reached a provider.
fn call_failure(status: u16, body: &[u8]) -> Option<Failure> {
    match status {
        504 if body == b"upstream request timeout" => Some(Failure::Timeout),
        503 if body.starts_with(b"upstream connect error") || body.starts_with(b"no healthy upstream") => {
            Some(Failure::Unreachable)
        }
        _ => None,
    }
}

/// How the latest attempt ended, kept for the final answer.
enum Outcome {
    Response { status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8> },
    Timeout,
    Unreachable,
}

impl Outcome {
    /// A failed attempt's outcome; the response is kept when the provider sent one.
    fn of(failure: Failure, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Outcome {
        match failure {
            Failure::Status(status) => Outcome::Response { status, headers, body },
            Failure::Timeout => Outcome::Timeout,
            Failure::Unreachable | Failure::CircuitOpen => Outcome::Unreachable,
        }
    }
}

/// A `:status` value; 0 when absent or garbled.
fn parse_status(value: Option<&[u8]>) -> u16 {
    value.and_then(|s| std::str::from_utf8(s).ok()?.parse::<u16>().ok()).unwrap_or(0)
}

/// A request whose first attempt failed and whose plan goes on.
struct Recovery {
    settings: Rc<Settings>,
    call: Call,
    /// The client's request headers and body, to build every later attempt.
    raw: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    trace_id: String,
    /// The response plan of the latest attempt.
    response: ResponsePlan,
    latest: Outcome,
    /// Status and provider of the answer, once sent.
    answered: Option<(u16, &'static str)>,
    cache: CacheState,
}

/// A dispatched call's wait before it starts.
struct Timer {
    due_ms: u64,
    context_id: u32,
    attempt: usize,
}

/// Per-VM (per worker thread) state shared by the root context and the request contexts.
#[derive(Default)]
struct Worker {
    recoveries: RefCell<HashMap<u32, Recovery>>,
    /// Dispatched call token → request context.
    calls: RefCell<HashMap<u32, u32>>,
    timers: RefCell<Vec<Timer>>,
    /// Metric counting circuits opened (an Envoy stat shared by every worker).
    circuits_opened: Cell<Option<u32>>,
}

/// A dispatched call needs a timeout of its own; the request timeout is Envoy's per-try
/// timeout of the internal listener's router (until the response headers), as for routed
/// requests. This one bounds a whole generation, like Envoy's default stream idle timeout
/// bounds a silent client connection.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

impl Worker {
    /// Carries out `next` for the request in recovery `context_id`, until a call is on its way,
    /// a timer is set, or the answer is sent. No registry borrow is held across a host call
    /// that could re-enter the filter.
    fn step(&self, context_id: u32, mut next: Next) {
        loop {
            next = match next {
                Next::GiveUp => return self.answer(context_id),
                Next::Call { index, delay_ms } if delay_ms > 0 => {
                    let due_ms = ProxyHost.now_ms() + delay_ms;
                    self.timers.borrow_mut().push(Timer { due_ms, context_id, attempt: index });
                    return self.rearm();
                }
                Next::Call { index, .. } => match self.dispatch(context_id, index) {
                    Some(failed) => failed,
                    None => return,
                },
            };
        }
    }

    /// Dispatches attempt `index`; what to do instead when it cannot even start.
    fn dispatch(&self, context_id: u32, index: usize) -> Option<Next> {
        let prepared = {
            let mut recoveries = self.recoveries.borrow_mut();
            let recovery = recoveries.get_mut(&context_id)?;
            let now = || ProxyHost.now_ms() / 1000;
            match recovery.call.forward(&recovery.settings, &recovery.raw, index, &now) {
                Ok(forward) => {
                    recovery.response = forward.response.clone();
                    Ok((
                        recovery.settings.recovery_cluster.clone(),
                        call_request(forward, &recovery.raw, &recovery.body),
                    ))
                }
                Err(error) => {
                    log::warn!("attempt {index} skipped, its request cannot be built: {}", error.message);
                    Err(recovery.call.attempts.skip(&mut ProxyHost))
                }
            }
        };
        let (cluster, (headers, body)) = match prepared {
            Ok(prepared) => prepared,
            Err(next) => return Some(next),
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        if hostcalls::set_effective_context(context_id).is_err() {
            return None; // the request is gone
        }
        match hostcalls::dispatch_http_call(&cluster, headers, Some(&body), vec![], CALL_TIMEOUT) {
            Ok(token) => {
                self.calls.borrow_mut().insert(token, context_id);
                None
            }
            Err(status) => {
                // The gateway's own fault (e.g. no such cluster), not the provider's.
                log::warn!("dispatching to cluster {cluster} failed: {status:?}");
                let mut recoveries = self.recoveries.borrow_mut();
                Some(recoveries.get_mut(&context_id).map_or(Next::GiveUp, |r| r.call.attempts.skip(&mut ProxyHost)))
            }
        }
    }

    /// Records a failure of the latest attempt (with the response, when there was one) and
    /// asks the plan what comes next.
    fn failed(&self, context_id: u32, failure: Failure, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Next {
        let mut recoveries = self.recoveries.borrow_mut();
        let Some(recovery) = recoveries.get_mut(&context_id) else {
            return Next::GiveUp;
        };
        let next = recovery.call.attempts.failed(failure, &headers, &mut ProxyHost);
        self.count_circuits_opened(&mut recovery.call);
        recovery.latest = Outcome::of(failure, headers, body);
        next
    }

    fn on_call_response(&self, token: u32, num_headers: usize, body_size: usize) {
        let Some(context_id) = self.calls.borrow_mut().remove(&token) else {
            return;
        };
        if !self.recoveries.borrow().contains_key(&context_id) {
            return; // the client went away meanwhile
        }
        let (status, headers, body) = call_response(num_headers, body_size);
        let failure = match call_failure(status, &body) {
            Some(failure) => failure,
            None if status == 0 => Failure::Unreachable,
            None if (200..300).contains(&status) => {
                if let Some(recovery) = self.recoveries.borrow_mut().get_mut(&context_id) {
                    recovery.call.attempts.succeeded(status, &ProxyHost);
                    self.count_circuits_opened(&mut recovery.call);
                    recovery.latest = Outcome::Response { status, headers, body };
                }
                return self.answer(context_id);
            }
            None => Failure::Status(status),
        };
        let next = self.failed(context_id, failure, headers, body);
        self.step(context_id, next);
    }

    /// Sends the latest outcome to the client as a local response.
    fn answer(&self, context_id: u32) {
        let reply = {
            let mut recoveries = self.recoveries.borrow_mut();
            let Some(recovery) = recoveries.get_mut(&context_id) else {
                return;
            };
            let reply = final_reply(recovery);
            recovery.answered = Some((reply.0, recovery.response.provider.name));
            if let (CacheState::Active(caching), true) = (&mut recovery.cache, (200..300).contains(&reply.0)) {
                let content_type = reply.1.iter().find(|(n, _)| n == "content-type").map_or("", |(_, v)| v.as_str());
                caching.start_capture(&recovery.settings, content_type);
                caching.capture.push(&reply.2);
                caching.store(&recovery.settings, recovery.response.provider.name);
            }
            reply
        };
        let (status, headers, body) = reply;
        if hostcalls::set_effective_context(context_id).is_ok() {
            send_local_response(status, &headers, &body);
        }
    }

    /// Starts the calls whose delay is over.
    fn on_tick(&self) {
        let now = ProxyHost.now_ms();
        let due: Vec<Timer> = {
            let mut timers = self.timers.borrow_mut();
            let (due, waiting) = timers.drain(..).partition(|t| t.due_ms <= now);
            *timers = waiting;
            due
        };
        for timer in due {
            self.step(timer.context_id, Next::Call { index: timer.attempt, delay_ms: 0 });
        }
        self.rearm();
    }

    /// Ticks when the earliest timer is due; no ticks while nothing waits.
    fn rearm(&self) {
        let now = ProxyHost.now_ms();
        let earliest = self.timers.borrow().iter().map(|t| t.due_ms).min();
        let period = earliest.map_or(0, |due| due.saturating_sub(now).max(1));
        if let Err(status) = hostcalls::set_tick_period(Duration::from_millis(period)) {
            log::warn!("set_tick_period failed: {status:?}");
        }
    }

    /// The request ended: drop what belongs to it.
    fn forget(&self, context_id: u32) -> Option<Recovery> {
        self.timers.borrow_mut().retain(|t| t.context_id != context_id);
        self.calls.borrow_mut().retain(|_, owner| *owner != context_id);
        self.recoveries.borrow_mut().remove(&context_id)
    }

    /// Adds the circuits the request's latest outcome opened to Envoy's counter.
    fn count_circuits_opened(&self, call: &mut Call) {
        let count = std::mem::take(&mut call.attempts.circuits_opened);
        if let (Some(metric), true) = (self.circuits_opened.get(), count > 0) {
            let _ = hostcalls::increment_metric(metric, i64::from(count));
        }
    }
}

/// Status, headers and body of a dispatched call's answer, read without the SDK's panics: a
/// call that failed has no headers (status 0).
fn call_response(num_headers: usize, body_size: usize) -> (u16, Vec<(String, Vec<u8>)>, Vec<u8>) {
    let headers = if num_headers == 0 {
        Vec::new()
    } else {
        hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default()
    };
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
    (parse_status(headers::find(&headers, ":status")), headers, body)
}

/// Headers and body of the dispatched call for `forward`.
fn call_request(forward: Forward, raw: &[(String, Vec<u8>)], original_body: &[u8]) -> (Vec<(String, String)>, Vec<u8>) {
    let body = forward.body.clone().unwrap_or_else(|| original_body.to_vec());
    // The cluster and per-try timeout headers stay: the internal listener's router uses them.
    let skip = ["content-length", "transfer-encoding"];
    let mut headers: Vec<(String, String)> = forward
        .headers
        .apply(raw)
        .into_iter()
        .filter(|(name, _)| !skip.contains(&name.as_str()))
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    headers.push(("content-length".into(), body.len().to_string()));
    (headers, body)
}

/// Status, headers and body of the answer to a recovered request.
fn final_reply(recovery: &Recovery) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let plan = &recovery.response;
    let translator = plan.provider.translator;
    let (status, mut headers, body) = match &recovery.latest {
        Outcome::Response { status, headers, body } if (200..300).contains(status) => {
            let content_type = headers::find(headers, "content-type").map(String::from_utf8_lossy).unwrap_or_default();
            let stream = content_type.starts_with("text/event-stream");
            let body = match &plan.chat {
                None => Ok(body.clone()),
                Some(ctx) if stream => {
                    let mut out = Vec::with_capacity(body.len());
                    let mut translator = translator.chat_stream(ctx.clone());
                    translator.push(body, &mut out);
                    translator.finish(&mut out);
                    Ok(out)
                }
                Some(ctx) => translator.chat_response(body, ctx),
            };
            match body {
                Ok(body) => (*status, provider_headers(headers, plan.chat.is_some() && !stream), body),
                Err(error) => (error.status, json_headers(), error.to_json()),
            }
        }
        Outcome::Response { status, body, .. } => (*status, json_headers(), translator.error_body(*status, body)),
        Outcome::Timeout => {
            let error = timeout_error();
            (error.status, json_headers(), error.to_json())
        }
        Outcome::Unreachable => {
            let error = unreachable_error("the connection failed before a response");
            (error.status, json_headers(), error.to_json())
        }
    };
    headers.push((TRACE_HEADER.into(), recovery.trace_id.clone()));
    headers.push((PROVIDER_HEADER.into(), plan.provider.name.into()));
    if let Some(status) = recovery.cache.status_header() {
        headers.push((STATUS_HEADER.into(), status.into()));
    }
    headers.extend(attempt_headers(&recovery.call));
    (status, headers, body)
}

fn json_headers() -> Vec<(String, String)> {
    vec![("content-type".into(), "application/json".into())]
}

/// The provider's response headers a local response may carry (Envoy frames the body).
fn provider_headers(headers: &[(String, Vec<u8>)], translated_json: bool) -> Vec<(String, String)> {
    let framing = ["content-length", "transfer-encoding", "connection", "keep-alive"];
    let mut kept: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| !name.starts_with(':') && !framing.contains(&name.as_str()))
        .filter(|(name, _)| !(translated_json && name == "content-type"))
        .map(|(name, value)| (name.clone(), String::from_utf8_lossy(value).into_owned()))
        .collect();
    if translated_json {
        kept.push(("content-type".into(), "application/json".into()));
    }
    kept
}

/// Which target served and how many retries it took.
fn attempt_headers(call: &Call) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    if !call.target_path().is_empty() {
        headers.push((TARGET_HEADER.into(), call.target_path().to_string()));
    }
    if call.attempts.plan.can_recover() {
        headers.push((RETRIES_HEADER.into(), call.attempts.retries.to_string()));
    }
    headers
}

fn timeout_error() -> GatewayError {
    GatewayError::new(408, "timeout_error", "the provider did not answer within the request timeout")
        .with_code("request_timeout")
}

fn unreachable_error(detail: &str) -> GatewayError {
    GatewayError::new(502, "api_error", format!("provider unreachable: {detail}")).with_code("upstream_unreachable")
}

/// `proxy_send_local_response` without the SDK's panic when the stream can no longer be
/// answered (a panic would kill the worker's VM).
fn send_local_response(status: u16, headers: &[(String, String)], body: &[u8]) {
    let mut serialized = Vec::with_capacity(64 + body.len());
    serialized.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (name, value) in headers {
        serialized.extend_from_slice(&(name.len() as u32).to_le_bytes());
        serialized.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in headers {
        serialized.extend_from_slice(name.as_bytes());
        serialized.push(0);
        serialized.extend_from_slice(value.as_bytes());
        serialized.push(0);
    }
    // SAFETY: every pointer and length describes a live buffer owned by this function.
    let result = unsafe {
        proxy_send_local_response(
            u32::from(status),
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            serialized.as_ptr(),
            serialized.len(),
            -1,
        )
    };
    if result != 0 {
        log::warn!("a local answer could not be sent (status {result})");
    }
}

/// The cache's part in a request.
enum CacheState {
    /// Not an endpoint the cache serves: no status header.
    Off,
    Disabled,
    Active(Box<Caching>),
}

/// A request the cache looked up and may store the answer of.
struct Caching {
    lookup: Lookup,
    status: Status,
    /// The embeddings call in flight (semantic mode, after an exact miss).
    embedding_call: Option<u32>,
    /// The request's embedding, stored with its answer.
    vector: Option<Vec<f32>>,
    capture: Capture,
}

impl CacheState {
    fn status_header(&self) -> Option<&'static str> {
        match self {
            CacheState::Off => None,
            CacheState::Disabled => Some(Status::Disabled.as_str()),
            CacheState::Active(caching) => Some(caching.status.as_str()),
        }
    }
}

impl Caching {
    /// Starts collecting a 2xx answer whose body the client gets with `content_type`.
    fn start_capture(&mut self, settings: &Settings, content_type: &str) {
        let max_bytes = usize::try_from(settings.cache.max_entry_bytes).unwrap_or(usize::MAX);
        self.capture = Capture::start(self.lookup.endpoint, content_type, max_bytes);
    }

    /// Stores the collected answer, when it is complete.
    fn store(&mut self, settings: &Settings, provider: &str) {
        let Some((content_type, body)) = std::mem::replace(&mut self.capture, Capture::Off).finish() else {
            return;
        };
        let now = ProxyHost.now_ms();
        let entry = Entry {
            expires_ms: now.saturating_add(self.lookup.max_age_ms),
            provider: provider.into(),
            content_type,
            body,
        };
        let layout = &settings.cache.layout;
        if !store::put(&ProxyHost, layout, &self.lookup.key, &entry, self.vector.as_deref(), now) {
            log::debug!("answer not cached: larger than max_entry_bytes, or the store was contended");
        }
    }
}

struct Root {
    /// Until a configuration loads, no key is accepted: requests fail closed with 401.
    settings: Rc<Settings>,
    worker: Rc<Worker>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.worker.on_call_response(token, num_headers, body_size);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        // Follow Envoy's level for the wasm component, so disabled lines cost no formatting.
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        // Every breaker slot exists before traffic, so each update is a compare-and-swap.
        for key in breaker::slot_keys() {
            if ProxyHost.get(&key).is_none() {
                ProxyHost.set(&key, breaker::EMPTY_SLOT, 0);
            }
        }
        self.worker.circuits_opened.set(hostcalls::define_metric(MetricType::Counter, "gateway.circuits_opened").ok());
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match Settings::parse(&bytes) {
            Ok(settings) => {
                // Likewise every cache bucket and ring.
                for key in settings.cache.layout.startup_keys() {
                    if ProxyHost.get(&key).is_none() {
                        ProxyHost.set(&key, store::EMPTY, 0);
                    }
                }
                self.settings = Rc::new(settings);
                true
            }
            Err(message) => {
                log::error!("{message}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        self.worker.on_tick();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            context_id,
            settings: Rc::clone(&self.settings),
            worker: Rc::clone(&self.worker),
            trace_id: String::new(),
            phase: Phase::Headers,
            response: ResponseMode::Passthrough,
            cache: CacheState::Off,
            log: LogLine::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// A request routed through Envoy's router.
struct Routed {
    call: Call,
    response: ResponsePlan,
    /// The client's headers and body, kept only when a failure could lead to another call.
    retained: Option<(Vec<(String, Vec<u8>)>, Vec<u8>)>,
}

enum Phase {
    Headers,
    /// The request headers are held (with their raw values) until the body is complete.
    AwaitingBody(Pending, Vec<(String, Vec<u8>)>),
    Forwarded(Box<Routed>),
    /// The first attempt failed; the worker's registry runs the next ones.
    Recovering,
    /// The gateway answered itself; its response passes the response callbacks untouched.
    Answered,
}

enum ResponseMode {
    Passthrough,
    /// Hold the headers and buffer the body, then reshape a provider error.
    Error(u16),
    /// Hold the headers and buffer the body, then translate a chat completion.
    Chat(ResponseContext),
    /// Translate a chat stream chunk by chunk.
    Stream(Box<dyn StreamTranslator>),
}

#[derive(Default)]
struct LogLine {
    method: String,
    path: String,
    trace: TraceFields,
    provider: &'static str,
    target: String,
    retries: u32,
    status: u16,
    cache: &'static str,
}

struct Request {
    context_id: u32,
    settings: Rc<Settings>,
    worker: Rc<Worker>,
    trace_id: String,
    phase: Phase,
    response: ResponseMode,
    cache: CacheState,
    log: LogLine,
}

/// Names no cluster: a held request that Envoy resumed without the gateway's edits goes nowhere.
const UNROUTED: &str = "gateway-unrouted";

impl Request {
    fn respond_error(&mut self, error: &GatewayError) -> Action {
        self.respond(error.status, &error.to_json())
    }

    fn respond(&mut self, status: u16, body: &[u8]) -> Action {
        self.phase = Phase::Answered;
        self.log.status = status;
        let provider = self.log.provider;
        let mut headers = vec![("content-type", "application/json"), (TRACE_HEADER, self.trace_id.as_str())];
        if !provider.is_empty() {
            headers.push((PROVIDER_HEADER, provider));
        }
        if let Some(cache_status) = self.cache.status_header() {
            headers.push((STATUS_HEADER, cache_status));
        }
        self.send_http_response(u32::from(status), headers, Some(body));
        Action::Pause
    }

    /// Answers from the cache (also from the embeddings call's callback, hence the wrapper
    /// that cannot panic).
    fn respond_cached(&mut self, status: Status, provider: &str, (content_type, body): (String, Vec<u8>)) -> Action {
        self.phase = Phase::Answered;
        self.log.status = 200;
        self.log.cache = status.as_str();
        self.log.provider = crate::providers::find(provider).map_or("", |spec| spec.name);
        let headers = [
            ("content-type".to_string(), content_type),
            (TRACE_HEADER.to_string(), self.trace_id.clone()),
            (PROVIDER_HEADER.to_string(), provider.to_string()),
            (STATUS_HEADER.to_string(), status.as_str().to_string()),
        ];
        send_local_response(200, &headers, &body);
        Action::Pause
    }

    /// Looks the request up; a hit answers it. Otherwise notes how the answer will be cached.
    /// A hit needs no validation: its key holds everything validation reads (the body after
    /// overrides, the provider, strictness), and the same request passed when it was stored.
    fn look_up(&mut self, plan: CachePlan) -> Option<Action> {
        let lookup = match plan {
            CachePlan::Uncached => return None,
            CachePlan::Disabled => {
                self.cache = CacheState::Disabled;
                return None;
            }
            CachePlan::Lookup(lookup) => lookup,
        };
        if !lookup.refresh {
            let layout = &self.settings.cache.layout;
            if let Some(entry) = store::find(&ProxyHost, layout, &lookup.key, ProxyHost.now_ms()) {
                if let Some(answer) = lookup.answer(&entry) {
                    return Some(self.respond_cached(Status::Hit, &entry.provider, answer));
                }
            }
        }
        let status = if lookup.refresh { Status::Refresh } else { Status::Miss };
        let lookup = *lookup;
        self.cache = CacheState::Active(Box::new(Caching {
            lookup,
            status,
            embedding_call: None,
            vector: None,
            capture: Capture::Off,
        }));
        None
    }

    /// Semantic mode after an exact miss, once the request is known to be valid: asks for the
    /// request's embedding. True when the request must wait for it.
    fn look_up_by_meaning(&mut self) -> bool {
        let text = match &self.cache {
            CacheState::Active(caching) if caching.lookup.mode == CacheMode::Semantic && !caching.lookup.refresh => {
                match &caching.lookup.conversation {
                    Some(text) => text.clone(),
                    None => return false,
                }
            }
            _ => return false,
        };
        let call = self.request_embedding(&text);
        if let CacheState::Active(caching) = &mut self.cache {
            caching.embedding_call = call;
            if call.is_none() {
                caching.status = Status::MissSemanticUnavailable;
            }
        }
        call.is_some()
    }

    /// Dispatches the embeddings call of semantic mode; None when there is no embeddings
    /// provider or the call cannot start.
    fn request_embedding(&self, text: &str) -> Option<u32> {
        let semantic = self.settings.cache.semantic.as_ref()?;
        let upstream = semantic.upstream.as_ref()?;
        let cluster = if upstream.tls { &self.settings.tls_cluster } else { &self.settings.plain_cluster };
        let path = format!("{}/embeddings", upstream.base_path);
        let body = semantic::embeddings_request(&semantic.model, text);
        let length = body.len().to_string();
        let authorization = semantic.api_key.as_ref().map(|key| format!("Bearer {key}"));
        let mut headers = vec![
            (":method", "POST"),
            (":path", path.as_str()),
            (":authority", upstream.authority.as_str()),
            ("content-type", "application/json"),
            ("content-length", length.as_str()),
            (CLUSTER_HEADER, cluster.as_str()),
        ];
        if let Some(value) = &authorization {
            headers.push(("authorization", value));
        }
        let timeout = Duration::from_millis(semantic.timeout_ms);
        match self.dispatch_http_call(&self.settings.recovery_cluster, headers, Some(&body), vec![], timeout) {
            Ok(token) => Some(token),
            Err(status) => {
                log::warn!("the embeddings call could not start: {status:?}");
                None
            }
        }
    }

    /// The embedding arrived (or its call failed): a similar stored answer answers the
    /// request, otherwise it goes on to the provider.
    fn embedding_arrived(&mut self, num_headers: usize, body_size: usize) {
        let (status, _, body) = call_response(num_headers, body_size);
        let vector = if (200..300).contains(&status) { semantic::embedding_of(&body) } else { None };
        let CacheState::Active(caching) = &mut self.cache else {
            return;
        };
        caching.embedding_call = None;
        match (vector, &self.settings.cache.semantic) {
            (Some(vector), Some(semantic)) => {
                let layout = &self.settings.cache.layout;
                let found = store::find_similar(
                    &ProxyHost,
                    &layout,
                    &caching.lookup.key,
                    &vector,
                    semantic.threshold,
                    ProxyHost.now_ms(),
                );
                if let Some(entry) = found {
                    if let Some(answer) = caching.lookup.answer(&entry) {
                        self.respond_cached(Status::SemanticHit, &entry.provider, answer);
                        return;
                    }
                }
                caching.vector = Some(vector);
            }
            _ => {
                log::warn!("semantic cache lookup skipped: the embeddings call answered {status}");
                caching.status = Status::MissSemanticUnavailable;
            }
        }
        if let Err(status) = hostcalls::resume_http_request() {
            log::warn!("resuming the request after the embeddings call failed: {status:?}");
        }
    }

    /// Collects what the client receives of a 2xx answer; stores it at the end.
    fn capture(&mut self, bytes: &[u8], end_of_stream: bool) {
        let CacheState::Active(caching) = &mut self.cache else {
            return;
        };
        caching.capture.push(bytes);
        // Stored at `[DONE]`: the client may already ask again before the upstream's end.
        if end_of_stream || caching.capture.is_complete() {
            caching.store(&self.settings, self.log.provider);
        }
    }

    fn capturing(&self) -> bool {
        matches!(&self.cache, CacheState::Active(caching) if !matches!(caching.capture, Capture::Off))
    }

    /// Sends the current attempt of `call` through Envoy's router. `body` is the whole request
    /// body and its size in Envoy's buffer, when the gateway has it (or knows there is none);
    /// only then can a later attempt send the request again.
    fn forward(&mut self, mut call: Call, raw: Vec<(String, Vec<u8>)>, body: Option<(usize, Vec<u8>)>) -> Action {
        // Before `forward`, which may move the body.
        if let Some(hit) = self.look_up(call.cache_plan()) {
            return hit;
        }
        let now = || self.now();
        let forward = match call.forward(&self.settings, &raw, call.attempts.current, &now) {
            Ok(forward) => forward,
            Err(error) => return self.respond_error(&error),
        };
        let awaits_embedding = self.look_up_by_meaning();
        let resendable = body.is_some();
        let (body_size, original) = body.unwrap_or_default();
        if let Some(new_body) = &forward.body {
            self.set_http_request_body(0, body_size, new_body);
        }
        let edited = forward.headers.apply(&raw);
        self.set_http_request_headers_bytes(edited.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect());
        self.log.provider = forward.response.provider.name;
        self.log.target = call.target_path().to_string();
        let retained = (resendable && call.attempts.plan.can_recover()).then_some((raw, original));
        self.phase = Phase::Forwarded(Box::new(Routed { call, response: forward.response, retained }));
        // A semantic lookup holds the request until its embedding arrives.
        if awaits_embedding {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn now(&self) -> u64 {
        self.get_current_time().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }

    fn response_status(&self) -> u16 {
        parse_status(self.get_http_response_header_bytes(":status").as_deref())
    }

    /// Why the routed attempt did not succeed: the provider's status, or Envoy's reply for a
    /// timeout or an unreachable provider. `None`: Envoy answered for a reason that says
    /// nothing about the provider (e.g. overload); that reply passes as it is.
    fn routed_failure(&self, status: u16) -> Option<Failure> {
        let details = self.get_property(vec!["response", "code_details"]).unwrap_or_default();
        let details = String::from_utf8_lossy(&details);
        match details.as_ref() {
            "via_upstream" => Some(Failure::Status(status)),
            "upstream_per_try_timeout" | "upstream_response_timeout" => Some(Failure::Timeout),
            d if d.starts_with("upstream_reset_before_response_started")
                || d.starts_with("no_healthy_upstream")
                || d.starts_with("dns_resolution_failure") =>
            {
                Some(Failure::Unreachable)
            }
            _ => None,
        }
    }

    /// The routed attempt failed and the plan goes on: hold this response and hand the
    /// request to the worker's registry.
    fn recover(&mut self, routed: Routed, failure: Failure, next: Next) -> Action {
        let Some((raw, body)) = routed.retained else {
            return Action::Continue;
        };
        let recovery = Recovery {
            settings: Rc::clone(&self.settings),
            call: routed.call,
            raw,
            body,
            trace_id: self.trace_id.clone(),
            response: routed.response,
            // Replaced by the next attempt's outcome before any answer.
            latest: Outcome::of(failure, Vec::new(), Vec::new()),
            answered: None,
            cache: std::mem::replace(&mut self.cache, CacheState::Off),
        };
        self.worker.recoveries.borrow_mut().insert(self.context_id, recovery);
        self.phase = Phase::Recovering;
        self.worker.step(self.context_id, next);
        Action::Pause
    }

    /// The status and body a buffered response ends with.
    fn finish_buffered(&self, body: &[u8]) -> (u16, Vec<u8>) {
        let Phase::Forwarded(routed) = &self.phase else {
            return (self.log.status, body.to_vec());
        };
        let translator = routed.response.provider.translator;
        match &self.response {
            ResponseMode::Error(status) => (*status, translator.error_body(*status, body)),
            ResponseMode::Chat(ctx) => match translator.chat_response(body, ctx) {
                Ok(translated) => (self.log.status, translated),
                // A success the gateway cannot read is no success for the client.
                Err(error) => (error.status, error.to_json()),
            },
            ResponseMode::Passthrough | ResponseMode::Stream(_) => (self.log.status, body.to_vec()),
        }
    }

    fn recovery_answered(&self) -> bool {
        self.worker.recoveries.borrow().get(&self.context_id).is_some_and(|r| r.answered.is_some())
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        match &self.cache {
            CacheState::Active(caching) if caching.embedding_call == Some(token) => {
                self.embedding_arrived(num_headers, body_size)
            }
            _ => self.worker.on_call_response(token, num_headers, body_size),
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _count: usize, end_of_stream: bool) -> Action {
        let raw = self.get_http_request_headers_bytes();
        let text = |name: &str| headers::find(&raw, name).map(|v| String::from_utf8_lossy(v).into_owned());
        let trace = headers::trace_fields(&raw);
        // The client's trace id, else Envoy's request id, else a random one.
        self.trace_id = match &trace.trace_id {
            Some(id) => id.clone(),
            None => random_bytes::<16>().iter().map(|b| format!("{b:02x}")).collect(),
        };
        self.log = LogLine {
            method: text(":method").unwrap_or_default(),
            path: text(":path").unwrap_or_default(),
            trace,
            ..LogLine::default()
        };
        match pipeline::start(&self.settings, &raw, &mut ProxyHost) {
            Err(error) => self.respond_error(&error),
            Ok(Started::Health) => self.respond(200, br#"{"status":"ok"}"#),
            // Without a body to read, the request can be sent again only when it has none.
            Ok(Started::Ready(call)) => self.forward(call, raw, end_of_stream.then(|| (0, Vec::new()))),
            Ok(Started::NeedsBody(pending)) if end_of_stream => {
                // A JSON endpoint called without a body.
                match pipeline::finish(&self.settings, pending, b"", &mut ProxyHost) {
                    Ok(call) => self.forward(call, raw, Some((0, Vec::new()))),
                    Err(error) => self.respond_error(&error),
                }
            }
            Ok(Started::NeedsBody(pending)) => {
                self.set_http_request_header(CLUSTER_HEADER, Some(UNROUTED));
                self.phase = Phase::AwaitingBody(pending, raw);
                // Held until the body is complete (allow_on_headers_stop_iteration).
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !matches!(self.phase, Phase::AwaitingBody(..)) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let Phase::AwaitingBody(pending, raw) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        match pipeline::finish(&self.settings, pending, &body, &mut ProxyHost) {
            Err(error) => self.respond_error(&error),
            Ok(call) => self.forward(call, raw, Some((body_size, body))),
        }
    }

    fn on_http_request_trailers(&mut self, _count: usize) -> Action {
        // The body of a held request ends with trailers instead of end_of_stream: no client of
        // this API sends them, and the request must never go on unchecked.
        if matches!(self.phase, Phase::AwaitingBody(..)) {
            let error = GatewayError::invalid_param("body", "request trailers are not supported on this endpoint");
            return self.respond_error(&error);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _count: usize, end_of_stream: bool) -> Action {
        // The gateway's own answers already carry the trace id (and their status is logged).
        if matches!(self.phase, Phase::Answered) {
            return Action::Continue;
        }
        self.log.status = self.response_status();
        let status = self.log.status;
        match std::mem::replace(&mut self.phase, Phase::Answered) {
            // Only errors are failures; a redirect or not-modified passes as it is.
            Phase::Forwarded(mut routed) if status < 400 => {
                routed.call.attempts.succeeded(status, &ProxyHost);
                self.worker.count_circuits_opened(&mut routed.call);
                // No later attempt: the request copies can go.
                routed.retained = None;
                routed.call.release_body();
                self.phase = Phase::Forwarded(routed);
            }
            Phase::Forwarded(routed) => {
                let Some(failure) = self.routed_failure(status) else {
                    self.phase = Phase::Forwarded(routed);
                    self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
                    return Action::Continue;
                };
                let mut routed = routed;
                if routed.retained.is_some() {
                    let headers = self.get_http_response_headers_bytes();
                    let next = routed.call.attempts.failed(failure, &headers, &mut ProxyHost);
                    self.worker.count_circuits_opened(&mut routed.call);
                    if matches!(next, Next::Call { .. }) {
                        return self.recover(*routed, failure, next);
                    }
                } else {
                    routed.call.attempts.failed_finally(failure, &ProxyHost);
                    self.worker.count_circuits_opened(&mut routed.call);
                }
                self.phase = Phase::Forwarded(routed);
                // Envoy's own reply (timeout, no connection) gets the gateway's error shape.
                match failure {
                    Failure::Timeout => return self.respond_error(&timeout_error()),
                    Failure::Unreachable | Failure::CircuitOpen => {
                        let details = self.get_property(vec!["response", "code_details"]).unwrap_or_default();
                        return self.respond_error(&unreachable_error(&String::from_utf8_lossy(&details)));
                    }
                    Failure::Status(_) => {}
                }
            }
            Phase::Recovering => {
                self.phase = Phase::Recovering;
                return if self.recovery_answered() { Action::Continue } else { Action::Pause };
            }
            Phase::Answered => return Action::Continue,
            // Envoy answered before the request went upstream (e.g. 413 for a huge body).
            phase @ (Phase::Headers | Phase::AwaitingBody(..)) => {
                self.phase = phase;
                self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
                return Action::Continue;
            }
        }
        let Phase::Forwarded(routed) = &self.phase else {
            return Action::Continue;
        };
        let plan = routed.response.clone();
        let extra = attempt_headers(&routed.call);
        let has_body = self.log.method != "HEAD" && status >= 200 && status != 204 && status != 304;
        self.response = match &plan.chat {
            _ if !has_body => ResponseMode::Passthrough,
            _ if status >= 400 => ResponseMode::Error(status),
            None => ResponseMode::Passthrough,
            Some(ctx) => {
                let content_type = self.get_http_response_header_bytes("content-type").unwrap_or_default();
                if String::from_utf8_lossy(&content_type).starts_with("text/event-stream") {
                    ResponseMode::Stream(plan.provider.translator.chat_stream(ctx.clone()))
                } else {
                    ResponseMode::Chat(ctx.clone())
                }
            }
        };
        self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
        self.set_http_response_header(PROVIDER_HEADER, Some(plan.provider.name));
        for (name, value) in &extra {
            self.set_http_response_header(name, Some(value));
        }
        if let Some(cache_status) = self.cache.status_header() {
            self.set_http_response_header(STATUS_HEADER, Some(cache_status));
        }
        if matches!(self.cache, CacheState::Active(_)) && has_body && (200..300).contains(&status) {
            // The content type of what the client gets.
            let content_type = match &self.response {
                ResponseMode::Stream(_) => b"text/event-stream".to_vec(),
                ResponseMode::Chat(_) => b"application/json".to_vec(),
                _ => self.get_http_response_header_bytes("content-type").unwrap_or_default(),
            };
            if let CacheState::Active(caching) = &mut self.cache {
                caching.start_capture(&self.settings, &String::from_utf8_lossy(&content_type));
            }
        }
        match self.response {
            ResponseMode::Passthrough => Action::Continue,
            ResponseMode::Stream(_) => {
                // Translated chunks change the length; Envoy frames the stream.
                self.set_http_response_header("content-length", None);
                Action::Continue
            }
            ResponseMode::Error(_) | ResponseMode::Chat(_) if end_of_stream => {
                // No body will follow: answer with the finished one now.
                let (status, body) = self.finish_buffered(b"");
                self.respond(status, &body)
            }
            // Held until the whole body is in, so status and length can still change.
            ResponseMode::Error(_) | ResponseMode::Chat(_) => Action::Pause,
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if matches!(self.phase, Phase::Recovering) {
            // The failed attempt's body: emptied chunk by chunk, so it never fills the buffer.
            if self.recovery_answered() {
                return Action::Continue;
            }
            self.set_http_response_body(0, body_size, &[]);
            return Action::Pause;
        }
        let buffered = match self.response {
            ResponseMode::Passthrough if self.capturing() => {
                let body = self.get_http_response_body(0, body_size).unwrap_or_default();
                self.capture(&body, end_of_stream);
                return Action::Continue;
            }
            ResponseMode::Passthrough => return Action::Continue,
            ResponseMode::Stream(_) => false,
            ResponseMode::Error(_) | ResponseMode::Chat(_) => true,
        };
        if buffered && !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_response_body(0, body_size).unwrap_or_default();
        if let ResponseMode::Stream(stream) = &mut self.response {
            let mut out = Vec::with_capacity(body.len() + 256);
            stream.push(&body, &mut out);
            if end_of_stream {
                stream.finish(&mut out);
            }
            self.set_http_response_body(0, body_size, &out);
            self.capture(&out, end_of_stream);
            return Action::Continue;
        }
        let (status, finished) = self.finish_buffered(&body);
        if status != self.log.status {
            self.log.status = status;
            self.set_http_response_header(":status", Some(&status.to_string()));
        }
        self.set_http_response_header("content-type", Some("application/json"));
        self.set_http_response_header("content-length", Some(&finished.len().to_string()));
        self.set_http_response_body(0, body_size, &finished);
        if (200..300).contains(&status) {
            self.capture(&finished, true);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(recovery) = self.worker.forget(self.context_id) {
            self.log.target = recovery.call.target_path().to_string();
            self.log.retries = recovery.call.attempts.retries;
            if let Some((status, provider)) = recovery.answered {
                self.log.status = status;
                self.log.provider = provider;
            }
            self.cache = recovery.cache;
        }
        if self.log.cache.is_empty() {
            self.log.cache = self.cache.status_header().unwrap_or("-");
        }
        let log = &self.log;
        // Client-given values are quoted ({:?}) so they cannot forge fields of the line.
        log::info!(
            "trace_id={:?} span_id={:?} parent_span_id={:?} span_name={:?} method={:?} path={:?} provider={} target={:?} retries={} status={} cache={:?}",
            self.trace_id,
            log.trace.span_id,
            log.trace.parent_span_id,
            log.trace.span_name,
            log.method,
            log.path,
            if log.provider.is_empty() { "-" } else { log.provider },
            log.target,
            log.retries,
            log.status,
            log.cache,
        );
    }
}
