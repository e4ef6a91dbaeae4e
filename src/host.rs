//! The thin host adapter: the only code that calls proxy-wasm. It feeds headers and bodies
//! to the pure pipeline and applies the decisions it returns.

use crate::errors::GatewayError;
use crate::pipeline::{self, Forward, Pending, ResponsePlan, Started, CLUSTER_HEADER, PROVIDER_HEADER, TRACE_HEADER};
use crate::providers::{ResponseContext, StreamTranslator};
use crate::request::headers::{self, TraceFields};
use crate::settings::Settings;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::rc::Rc;
use std::time::UNIX_EPOCH;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { settings: Rc::new(Settings::default()) }) });
}}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn random_get(buf: *mut u8, len: usize) -> u16;
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

struct Root {
    /// Until a configuration loads, no key is accepted: requests fail closed with 401.
    settings: Rc<Settings>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        // Follow Envoy's level for the wasm component, so disabled lines cost no formatting.
        if let Ok(level) = proxy_wasm::hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match Settings::parse(&bytes) {
            Ok(settings) => {
                self.settings = Rc::new(settings);
                true
            }
            Err(message) => {
                log::error!("{message}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            settings: Rc::clone(&self.settings),
            trace_id: String::new(),
            phase: Phase::Headers,
            response: ResponseMode::Passthrough,
            log: LogLine::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

enum Phase {
    Headers,
    /// The request headers are held (with their raw values) until the body is complete.
    AwaitingBody(Pending, Vec<(String, Vec<u8>)>),
    Forwarded(ResponsePlan),
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
    status: u16,
}

struct Request {
    settings: Rc<Settings>,
    trace_id: String,
    phase: Phase,
    response: ResponseMode,
    log: LogLine,
}

impl Context for Request {}

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
        self.send_http_response(u32::from(status), headers, Some(body));
        Action::Pause
    }

    fn forward(&mut self, forward: Forward, raw: &[(String, Vec<u8>)]) -> Action {
        let edited = forward.headers.apply(raw);
        self.set_http_request_headers_bytes(edited.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect());
        self.log.provider = forward.response.provider.name;
        self.phase = Phase::Forwarded(forward.response);
        Action::Continue
    }

    fn now(&self) -> u64 {
        self.get_current_time().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }

    fn response_status(&self) -> u16 {
        self.get_http_response_header_bytes(":status")
            .and_then(|s| String::from_utf8_lossy(&s).parse::<u16>().ok())
            .unwrap_or(0)
    }

    /// The finished body of a buffered response, and the status to answer with.
    fn finish_buffered(&self, body: &[u8]) -> (u16, Vec<u8>) {
        let Phase::Forwarded(plan) = &self.phase else {
            return (self.log.status, body.to_vec());
        };
        let translator = plan.provider.translator;
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
        let mut random = || u64::from_le_bytes(random_bytes::<8>());
        match pipeline::start(&self.settings, &raw, &mut random) {
            Err(error) => self.respond_error(&error),
            Ok(Started::Health) => self.respond(200, br#"{"status":"ok"}"#),
            Ok(Started::Ready(forward)) => self.forward(forward, &raw),
            Ok(Started::NeedsBody(pending)) if end_of_stream => {
                // A JSON endpoint called without a body.
                match pipeline::finish(pending, b"", &|| self.now()) {
                    Ok(forward) => self.forward(forward, &raw),
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
        match pipeline::finish(pending, &body, &|| self.now()) {
            Err(error) => self.respond_error(&error),
            Ok(forward) => {
                if let Some(new_body) = &forward.body {
                    self.set_http_request_body(0, body_size, new_body);
                }
                self.forward(forward, &raw)
            }
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
        self.log.status = self.response_status();
        let plan = match &self.phase {
            Phase::Forwarded(plan) => plan.clone(),
            // The gateway's own answers already carry the trace id.
            Phase::Answered => return Action::Continue,
            // Envoy answered before the request went upstream (e.g. 413 for a huge body).
            Phase::Headers | Phase::AwaitingBody(..) => {
                self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
                return Action::Continue;
            }
        };
        let status = self.log.status;
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
        let buffered = match self.response {
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
        Action::Continue
    }

    fn on_log(&mut self) {
        let log = &self.log;
        // Client-given values are quoted ({:?}) so they cannot forge fields of the line.
        log::info!(
            "trace_id={:?} span_id={:?} parent_span_id={:?} span_name={:?} method={:?} path={:?} provider={} status={}",
            self.trace_id,
            log.trace.span_id,
            log.trace.parent_span_id,
            log.trace.span_name,
            log.method,
            log.path,
            if log.provider.is_empty() { "-" } else { log.provider },
            log.status,
        );
    }
}
