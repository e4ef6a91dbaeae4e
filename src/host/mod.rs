//! The thin host adapter: the only code that calls proxy-wasm, and the module's exports (the
//! callbacks Envoy makes). Its callbacks feed events to the exchange's [`Worker`] and run what
//! comes back; every host call goes through `abi`, which returns a `Result` instead of
//! panicking (a panic would kill the worker's VM).
//!
//! It has no SDK underneath: the proxy-wasm SDK's dispatcher hands a call's answer to the
//! context that was running when the call was made, not to the one the host answers it on. A
//! control-plane read dispatched on the root context from a request's callback was then dropped
//! when that request ended first (its client gone), and every request that joined the read
//! waited for the 70 s bound on lost fetches. Here an answer goes where Envoy sends it.

mod abi;
mod wire;

use crate::entropy::Entropy;
use crate::exchange::metrics::Kind;
use crate::exchange::{self, Action, After, CallAnswer, Dispatch, Io, Output, Worker};
use crate::ports::{Host, SharedStore};
use crate::request::headers;
use crate::settings::Settings;
use abi::{Buffer, HostError, Map, MetricType};
use hashbrown::HashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The module's start (a WASI reactor's `_initialize`): before any context exists.
#[no_mangle]
pub extern "C" fn _initialize() {
    abi::call_constructors();
    // The `log` crate writes through `abi::log`.
    if log::set_logger(&HostLogger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    // A panic aborts the VM (panic = "abort"); its message reaches Envoy's log first.
    std::panic::set_hook(Box::new(|panic| {
        let _ = abi::log(CRITICAL, &panic.to_string());
    }));
}

/// The proxy-wasm ABI version this module speaks (Envoy reads it from the export's name).
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

thread_local! {
    /// This VM's contexts: each root context's worker, and the worker of each request's root.
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts::default());
    /// This VM's randomness, read from the host 4 KiB at a time.
    static ENTROPY: RefCell<Entropy> = RefCell::new(Entropy::new());
}

#[derive(Default)]
struct Contexts {
    roots: HashMap<u32, Rc<Shared>>,
    requests: HashMap<u32, Rc<Shared>>,
}

/// The worker context `id` belongs to (a root's own, or its request's root's). The registry is
/// not borrowed while the worker runs: a host call may re-enter the module (a local reply runs
/// the response callbacks at once).
fn shared(id: u32) -> Option<Rc<Shared>> {
    CONTEXTS.with(|contexts| {
        let contexts = contexts.try_borrow().ok()?;
        contexts.requests.get(&id).or_else(|| contexts.roots.get(&id)).cloned()
    })
}

/// proxy-wasm's `Action`: 0 continues, 1 pauses.
const CONTINUE: u32 = 0;
const PAUSE: u32 = 1;

/// A request callback of context `id`; a request of no known root fails closed.
fn on_request(id: u32, event: impl FnOnce(&mut Worker, &mut HostIo) -> Output) -> u32 {
    match shared(id) {
        Some(shared) => shared.run(id, event),
        None => refuse(),
    }
}

/// Answers the current request with a 500 (the gateway cannot check it) and pauses it.
fn refuse() -> u32 {
    let body = br#"{"error":{"message":"the gateway could not handle this request","type":"api_error","param":null,"code":null}}"#;
    logged(abi::send_local_response(500, &[("content-type", b"application/json")], body));
    PAUSE
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(id: u32, root: u32) {
    CONTEXTS.with(|contexts| {
        let Ok(mut contexts) = contexts.try_borrow_mut() else {
            return;
        };
        if root == 0 {
            // Until a configuration loads, no key is accepted: requests fail closed with 401.
            let worker = Worker::new(Rc::new(Settings::default())).rooted(id);
            let shared = Shared { worker: RefCell::new(worker), metrics: Rc::new(RefCell::new(HashMap::new())) };
            contexts.roots.insert(id, Rc::new(shared));
        } else if let Some(shared) = contexts.roots.get(&root).cloned() {
            contexts.requests.insert(id, shared);
        }
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root: u32, size: usize) -> u32 {
    u32::from(shared(root).is_some_and(|shared| shared.configure(root, size)))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root: u32) {
    if let Some(shared) = shared(root) {
        shared.run(root, |worker, io| worker.tick(io));
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _count: usize, end_of_stream: u32) -> u32 {
    on_request(id, |worker, io| worker.request_headers(id, end_of_stream != 0, io))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(id: u32, size: usize, end_of_stream: u32) -> u32 {
    on_request(id, |worker, io| worker.request_body(id, size, end_of_stream != 0, io))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(id: u32, _count: usize) -> u32 {
    on_request(id, |worker, io| worker.request_trailers(id, io))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _count: usize, end_of_stream: u32) -> u32 {
    on_request(id, |worker, io| worker.response_headers(id, end_of_stream != 0, io))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(id: u32, size: usize, end_of_stream: u32) -> u32 {
    on_request(id, |worker, io| worker.response_body(id, size, end_of_stream != 0, io))
}

#[no_mangle]
pub extern "C" fn proxy_on_log(id: u32) {
    if let Some(shared) = shared(id) {
        shared.finished(id);
    }
}

/// A call's answer, on the context Envoy made it on (a request's, or the root's).
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(id: u32, token: u32, headers: usize, body_size: usize, _trailers: usize) {
    if let Some(shared) = shared(id) {
        shared.call_answered(id, token, headers, body_size);
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_id: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(id: u32) {
    CONTEXTS.with(|contexts| {
        if let Ok(mut contexts) = contexts.try_borrow_mut() {
            if contexts.requests.remove(&id).is_none() {
                contexts.roots.remove(&id);
            }
        }
    });
}

/// What the root context and the request contexts of one worker share.
struct Shared {
    worker: RefCell<Worker>,
    /// The ids of the metrics this VM defined, by stat name (each is defined once per VM).
    metrics: Rc<RefCell<HashMap<String, u32>>>,
}

impl Shared {
    /// Runs one event on the worker from the callback of context `current`, then the effects
    /// that may re-enter the filter, once the worker is free again.
    fn run(&self, current: u32, event: impl FnOnce(&mut Worker, &mut HostIo) -> Output) -> u32 {
        let mut io = self.io(current);
        let output = match self.worker.try_borrow_mut() {
            Ok(mut worker) => event(&mut worker, &mut io),
            // Cannot happen while no host call inside an event re-enters the filter; should it,
            // the request fails closed rather than passing unchecked.
            Err(_) => {
                log::error!("the filter was re-entered while busy; the request is refused");
                return refuse();
            }
        };
        io.flush();
        for after in output.after {
            io.run_after(after);
        }
        match output.action {
            Action::Continue => CONTINUE,
            Action::Pause => PAUSE,
        }
    }

    fn io(&self, current: u32) -> HostIo {
        HostIo {
            effective: current,
            metrics: Rc::clone(&self.metrics),
            now_ms: Cell::new(None),
            response_head: None,
            response_edits: Vec::new(),
        }
    }

    /// Request `id` ended: the worker publishes its metrics and access-log record; its log line
    /// here, at `debug` only (the access log has the record; Envoy logs nothing per request at
    /// `info`).
    fn finished(&self, id: u32) {
        let mut io = self.io(id);
        let record = self.worker.try_borrow_mut().ok().and_then(|mut worker| worker.finished(id, &mut io));
        io.flush();
        if let Some(record) = record {
            log::debug!("{record}");
        }
    }

    fn call_answered(&self, current: u32, token: u32, num_headers: usize, body_size: usize) {
        if !self.worker.try_borrow().is_ok_and(|worker| worker.awaits(token)) {
            return;
        }
        // A call that failed has no headers (status 0).
        let headers = if num_headers == 0 { Vec::new() } else { logged(abi::get_map(Map::CallResponseHeaders)) };
        let body = logged(abi::get_buffer(Buffer::CallResponseBody, 0, body_size));
        let status = exchange::parse_status(headers::find(&headers, ":status"));
        self.run(current, |worker, io| worker.call_answered(token, CallAnswer { status, headers, body }, io));
    }
}

/// A failed host call's default value; the failure is logged.
fn logged<T: Default>(result: Result<T, HostError>) -> T {
    result.unwrap_or_else(|error| {
        log::warn!("host call failed: {error}");
        T::default()
    })
}

/// The filter state the shipped access log writes (Envoy: `wasm.gateway_record`).
const ACCESS_LOG_PROPERTY: &str = "gateway_record";

/// A header map as the host hands it over.
type Pairs = Vec<(String, Vec<u8>)>;

/// The host as the exchange sees it, from one callback.
struct HostIo {
    /// The context later host calls act on.
    effective: u32,
    metrics: Rc<RefCell<HashMap<String, u32>>>,
    /// The time, read once per callback (a host call each; the exchange asks many times).
    now_ms: Cell<Option<u64>>,
    /// The response headers read in this callback (the request's id, and the pairs with this
    /// callback's edits made to them).
    response_head: Option<(u32, Pairs)>,
    /// This callback's response header edits, by request, in order: made when its event is
    /// done, in one host call where the headers were read (`flush`).
    response_edits: Vec<(u32, String, Option<String>)>,
}

impl HostIo {
    /// Makes host calls act on request `id` (a call answer or tick arrives on another
    /// context); when the host refuses, the calls for `id` are not made at all.
    fn on(&mut self, id: u32) -> Result<(), HostError> {
        if self.effective != id {
            abi::set_effective_context(id)?;
            self.effective = id;
        }
        Ok(())
    }

    /// Makes this callback's response header edits: the headers read in it are written back
    /// whole with theirs (one host call instead of one per header); a request whose headers
    /// were not read gets its few edits one by one.
    fn flush(&mut self) {
        let edits = std::mem::take(&mut self.response_edits);
        let mut head = self.response_head.take();
        let mut done: Vec<u32> = Vec::new();
        for &(id, _, _) in &edits {
            if done.contains(&id) {
                continue;
            }
            done.push(id);
            let written = match head.take() {
                Some((read, pairs)) if read == id => self.on(id).and_then(|()| {
                    let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
                    abi::set_map(Map::ResponseHeaders, &pairs)
                }),
                other => {
                    head = other;
                    let mut result = self.on(id);
                    for (_, name, value) in edits.iter().filter(|(edited, _, _)| *edited == id) {
                        result = result.and_then(|()| match value {
                            Some(value) => abi::replace_map_value(Map::ResponseHeaders, name, value.as_bytes()),
                            None => abi::remove_map_value(Map::ResponseHeaders, name),
                        });
                    }
                    result
                }
            };
            logged(written);
        }
    }

    fn run_after(&mut self, after: After) {
        match after {
            After::Reply { id, status, headers, body } => {
                let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
                logged(self.on(id).and_then(|()| abi::send_local_response(status, &headers, &body)));
            }
            After::ResumeRequest(id) => logged(self.on(id).and_then(|()| abi::resume_request())),
        }
    }
}

impl Io for HostIo {
    fn host(&mut self) -> &mut dyn Host {
        self
    }

    fn request_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        logged(self.on(id).and_then(|()| abi::get_map(Map::RequestHeaders)))
    }

    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        logged(self.on(id).and_then(|()| abi::get_buffer(Buffer::RequestBody, 0, size)))
    }

    fn set_request_headers(&mut self, id: u32, headers: &[(&str, &[u8])]) {
        logged(self.on(id).and_then(|()| abi::set_map(Map::RequestHeaders, headers)));
    }

    fn set_request_header(&mut self, id: u32, name: &str, value: &str) {
        logged(self.on(id).and_then(|()| abi::replace_map_value(Map::RequestHeaders, name, value.as_bytes())));
    }

    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]) {
        logged(self.on(id).and_then(|()| abi::set_buffer(Buffer::RequestBody, 0, size, body)));
    }

    fn response_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        if let Some((read, pairs)) = &self.response_head {
            if *read == id {
                return pairs.clone();
            }
        }
        let mut pairs = logged(self.on(id).and_then(|()| abi::get_map(Map::ResponseHeaders)));
        for (_, name, value) in self.response_edits.iter().filter(|(edited, _, _)| *edited == id) {
            headers::set(&mut pairs, name, value.as_deref().map(str::as_bytes));
        }
        if self.response_head.is_none() {
            self.response_head = Some((id, pairs.clone()));
        }
        pairs
    }

    fn response_details(&mut self, id: u32) -> String {
        let details = logged(self.on(id).and_then(|()| abi::get_property(&["response", "code_details"])));
        let details = details.unwrap_or_default();
        String::from_utf8_lossy(&details).into_owned()
    }

    fn response_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        logged(self.on(id).and_then(|()| abi::get_buffer(Buffer::ResponseBody, 0, size)))
    }

    fn set_response_header(&mut self, id: u32, name: &str, value: Option<&str>) {
        if let Some((read, pairs)) = &mut self.response_head {
            if *read == id {
                headers::set(pairs, name, value.map(str::as_bytes));
            }
        }
        self.response_edits.push((id, name.to_string(), value.map(String::from)));
    }

    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]) {
        logged(self.on(id).and_then(|()| abi::set_buffer(Buffer::ResponseBody, 0, size, body)));
    }

    fn dispatch(&mut self, id: u32, call: &Dispatch) -> Option<u32> {
        let headers: Vec<(&str, &[u8])> = call.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
        let timeout_ms = u32::try_from(call.timeout_ms).unwrap_or(u32::MAX);
        let dispatched =
            self.on(id).and_then(|()| abi::dispatch_http_call(&call.cluster, &headers, &call.body, timeout_ms));
        match dispatched {
            Ok(token) => Some(token),
            Err(error) => {
                log::warn!("dispatching a call to cluster {} failed: {error}", call.cluster);
                None
            }
        }
    }

    fn tick_every(&mut self, period_ms: u64) {
        logged(abi::set_tick_period_ms(u32::try_from(period_ms).unwrap_or(u32::MAX)));
    }

    fn access_log(&mut self, line: &[u8]) {
        logged(abi::set_property(&[ACCESS_LOG_PROPERTY], line));
    }

    fn publish_header(&mut self, id: u32, name: &str, value: &str) {
        logged(self.on(id).and_then(|()| abi::set_property(&[name], value.as_bytes())));
    }

    fn metric(&mut self, kind: Kind, name: &str, value: u64) {
        let metric_type = match kind {
            Kind::Counter => MetricType::Counter,
            Kind::Histogram => MetricType::Histogram,
        };
        let Some(id) = self.metric_id(metric_type, name) else {
            return;
        };
        // Defining a counter shows it at 0; Envoy refuses an increment by 0 (BadArgument).
        if kind == Kind::Counter && value == 0 {
            return;
        }
        logged(match kind {
            Kind::Counter => abi::increment_metric(id, i64::try_from(value).unwrap_or(i64::MAX)),
            Kind::Histogram => abi::record_metric(id, value),
        });
    }

    fn add_to_gauge(&mut self, name: &str, delta: i64) {
        if let Some(id) = self.metric_id(MetricType::Gauge, name) {
            logged(abi::increment_metric(id, delta));
        }
    }
}

impl HostIo {
    /// The id of stat `name`, defined on first use.
    fn metric_id(&self, metric_type: MetricType, name: &str) -> Option<u32> {
        let mut ids = self.metrics.try_borrow_mut().ok()?;
        if let Some(id) = ids.get(name) {
            return Some(*id);
        }
        match abi::define_metric(metric_type, name) {
            Ok(id) => Some(*ids.entry(name.to_string()).or_insert(id)),
            Err(error) => {
                log::warn!("metric {name} could not be defined: {error}");
                None
            }
        }
    }
}

impl Host for HostIo {
    fn random(&mut self) -> u64 {
        let refill = |bytes: &mut [u8]| match abi::random_bytes(bytes) {
            Ok(()) => true,
            Err(error) => {
                log::warn!("random_get failed ({error}); random choices fall back to the first option");
                false
            }
        };
        ENTROPY.with(|entropy| entropy.try_borrow_mut().map(|mut entropy| entropy.next_u64(refill)).unwrap_or_default())
    }

    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = logged(abi::now_ms());
        self.now_ms.set(Some(now));
        now
    }

    fn store(&self) -> &dyn SharedStore {
        self
    }
}

impl SharedStore for HostIo {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        logged(abi::get_shared_data(key))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        abi::set_shared_data(key, value, cas).is_ok()
    }
}

impl Shared {
    /// Root context `root`'s plugin configuration (`size` bytes) arrived: new requests use it.
    fn configure(&self, root: u32, size: usize) -> bool {
        // Follow Envoy's level for the wasm component, so disabled lines cost no formatting.
        if let Ok(level) = abi::log_level() {
            log::set_max_level(level_filter(level));
        }
        let bytes = logged(abi::get_buffer(Buffer::PluginConfiguration, 0, size));
        let settings = match Settings::parse(&bytes) {
            Ok(settings) => settings,
            Err(message) => {
                log::error!("{message}");
                return false;
            }
        };
        let io = self.io(root);
        exchange::prepare_store(&io, &settings);
        match self.worker.try_borrow_mut() {
            Ok(mut worker) => worker.configure(settings),
            Err(_) => return false,
        }
        true
    }
}

/// proxy-wasm's `LogLevel` numbers.
const CRITICAL: u32 = 5;

/// The `log` crate's filter for a proxy-wasm log level (critical lines are the gateway's
/// panics alone, written by the panic hook).
fn level_filter(level: u32) -> log::LevelFilter {
    match level {
        0 => log::LevelFilter::Trace,
        1 => log::LevelFilter::Debug,
        2 => log::LevelFilter::Info,
        3 => log::LevelFilter::Warn,
        4 => log::LevelFilter::Error,
        _ => log::LevelFilter::Off,
    }
}

/// The `log` crate's lines into Envoy's log.
struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => 0,
            log::Level::Debug => 1,
            log::Level::Info => 2,
            log::Level::Warn => 3,
            log::Level::Error => 4,
        };
        // Nothing to do when the host refuses a log line.
        let _ = abi::log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}
