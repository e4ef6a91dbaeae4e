//! The thin host adapter: the only code that calls proxy-wasm. Its callbacks feed events to
//! the exchange's [`Worker`] and run what comes back; every host call goes through `abi`,
//! which returns a `Result` instead of panicking (a panic would kill the worker's VM).

mod abi;
mod wire;

use crate::exchange::metrics::Kind;
use crate::exchange::{self, Action, After, CallAnswer, Dispatch, Io, Output, Worker};
use crate::ports::{Host, SharedStore};
use crate::request::headers;
use crate::settings::Settings;
use abi::{Buffer, HostError, Map, MetricType};
use hashbrown::HashMap;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{self, ContextType};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

proxy_wasm::main! {{
    // The `log` crate writes through `abi::log`: the SDK's logger unwraps the host's answer.
    if log::set_logger(&HostLogger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    // A panic aborts the VM (panic = "abort"); its message reaches Envoy's log first.
    std::panic::set_hook(Box::new(|panic| {
        let _ = abi::log(CRITICAL, &panic.to_string());
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(Root {
            id,
            shared: Rc::new(Shared {
                // Until a configuration loads, no key is accepted: requests fail closed with 401.
                worker: RefCell::new(Worker::new(Rc::new(Settings::default())).rooted(id)),
                metrics: Rc::new(RefCell::new(HashMap::new())),
            }),
        })
    });
}}

/// What the root context and the request contexts of one worker share.
struct Shared {
    worker: RefCell<Worker>,
    /// The ids of the metrics this VM defined, by stat name (each is defined once per VM).
    metrics: Rc<RefCell<HashMap<String, u32>>>,
}

impl Shared {
    /// Runs one event on the worker from the callback of context `current`, then the effects
    /// that may re-enter the filter, once the worker is free again.
    fn run(&self, current: u32, event: impl FnOnce(&mut Worker, &mut HostIo) -> Output) -> types::Action {
        let mut io = self.io(current);
        let output = match self.worker.try_borrow_mut() {
            Ok(mut worker) => event(&mut worker, &mut io),
            // Cannot happen while no host call inside an event re-enters the filter; should it,
            // the request fails closed rather than passing unchecked.
            Err(_) => {
                log::error!("the filter was re-entered while busy; the request is refused");
                let body = br#"{"error":{"message":"the gateway could not handle this request","type":"api_error","param":null,"code":null}}"#;
                logged(abi::send_local_response(500, &[("content-type", b"application/json")], body));
                return types::Action::Pause;
            }
        };
        io.flush();
        for after in output.after {
            io.run_after(after);
        }
        match output.action {
            Action::Continue => types::Action::Continue,
            Action::Pause => types::Action::Pause,
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

    /// Request `id` ended: the worker publishes its metrics and access-log line; the log line here.
    fn finished(&self, id: u32) {
        let mut io = self.io(id);
        let record = self.worker.try_borrow_mut().ok().and_then(|mut worker| worker.finished(id, &mut io));
        io.flush();
        if let Some(record) = record {
            log::info!("{record}");
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
        let mut bytes = [0u8; 8];
        if let Err(error) = abi::random_bytes(&mut bytes) {
            log::warn!("random_get failed ({error}); random choices fall back to the first option");
        }
        u64::from_le_bytes(bytes)
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

struct Root {
    id: u32,
    shared: Rc<Shared>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.shared.call_answered(self.id, token, num_headers, body_size);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
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
        let io = self.shared.io(self.id);
        exchange::prepare_store(&io, &settings);
        match self.shared.worker.try_borrow_mut() {
            Ok(mut worker) => worker.configure(settings),
            Err(_) => return false,
        }
        true
    }

    fn on_tick(&mut self) {
        self.shared.run(self.id, |worker, io| worker.tick(io));
    }

    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request { id, shared: Rc::clone(&self.shared) }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
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

struct Request {
    id: u32,
    shared: Rc<Shared>,
}

impl Context for Request {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.shared.call_answered(self.id, token, num_headers, body_size);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _count: usize, end_of_stream: bool) -> types::Action {
        self.shared.run(self.id, |worker, io| worker.request_headers(self.id, end_of_stream, io))
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> types::Action {
        self.shared.run(self.id, |worker, io| worker.request_body(self.id, size, end_of_stream, io))
    }

    fn on_http_request_trailers(&mut self, _count: usize) -> types::Action {
        self.shared.run(self.id, |worker, io| worker.request_trailers(self.id, io))
    }

    fn on_http_response_headers(&mut self, _count: usize, end_of_stream: bool) -> types::Action {
        self.shared.run(self.id, |worker, io| worker.response_headers(self.id, end_of_stream, io))
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> types::Action {
        self.shared.run(self.id, |worker, io| worker.response_body(self.id, size, end_of_stream, io))
    }

    fn on_log(&mut self) {
        self.shared.finished(self.id);
    }
}
