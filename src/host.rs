//! The thin host adapter: the only code that calls proxy-wasm. It feeds headers and bodies
//! to the pure pipeline and applies the decisions it returns.

use crate::errors::GatewayError;
use crate::pipeline::{self, Forward, Pending, ResponsePlan, Started, PROVIDER_HEADER, TRACE_HEADER};
use crate::providers::{ResponseContext, StreamTranslator};
use crate::request::headers::decode_value;
use crate::settings::Settings;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::rc::Rc;
use std::time::UNIX_EPOCH;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { settings: None }) });
}}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn random_get(buf: *mut u8, len: usize) -> u16;
}

/// Random bytes from the host (WASI `random_get`), never from the clock.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // SAFETY: the host writes exactly `N` bytes into a buffer of `N` bytes.
    unsafe { random_get(buf.as_mut_ptr(), N) };
    buf
}

struct Root {
    settings: Option<Rc<Settings>>,
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
                self.settings = Some(Rc::new(settings));
                true
            }
            Err(message) => {
                log::error!("{message}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let settings = self.settings.clone()?;
        Some(Box::new(Request {
            settings,
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
    /// The request headers are held (with their values) until the body is complete.
    AwaitingBody(Pending, Vec<(String, String)>),
    Forwarded(ResponsePlan),
    /// The gateway answered itself; its response passes the response callbacks untouched.
    Answered,
}

enum ResponseMode {
    Passthrough,
    /// Buffer the whole body, then reshape a provider error.
    Error(u16),
    /// Buffer the whole body, then translate a chat completion.
    Chat(ResponseContext),
    /// Translate a chat stream chunk by chunk.
    Stream(Box<dyn StreamTranslator>),
}

#[derive(Default)]
struct LogLine {
    method: String,
    path: String,
    span_id: String,
    parent_span_id: String,
    span_name: String,
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

impl Request {
    fn request_headers(&self) -> Result<Vec<(String, String)>, GatewayError> {
        self.get_http_request_headers_bytes()
            .into_iter()
            .map(|(name, value)| decode_value(&name, &value).map(|value| (name, value)))
            .collect()
    }

    fn respond_error(&mut self, error: &GatewayError) -> Action {
        self.respond(error.status, &error.to_json())
    }

    fn respond(&mut self, status: u16, body: &[u8]) -> Action {
        self.phase = Phase::Answered;
        self.log.status = status;
        self.send_http_response(
            u32::from(status),
            vec![("content-type", "application/json"), (TRACE_HEADER, &self.trace_id)],
            Some(body),
        );
        Action::Pause
    }

    fn forward(&mut self, forward: Forward, headers: &[(String, String)]) -> Action {
        let edited = forward.headers.apply(headers);
        self.set_http_request_headers(edited.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect());
        self.log.provider = forward.response.provider.name;
        self.phase = Phase::Forwarded(forward.response);
        Action::Continue
    }

    fn now(&self) -> u64 {
        self.get_current_time().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _count: usize, end_of_stream: bool) -> Action {
        let decoded = self.request_headers();
        let headers = match &decoded {
            Ok(headers) => headers.as_slice(),
            Err(_) => &[],
        };
        // The client's trace id, else Envoy's request id, else a random one.
        let trace = ["x-gateway-trace-id", "trace_id", "traceid", "x-request-id"]
            .iter()
            .find_map(|n| header(headers, n).map(str::trim).filter(|id| !id.is_empty()));
        self.trace_id = match trace {
            Some(id) => id.to_string(),
            None => random_bytes::<16>().iter().map(|b| format!("{b:02x}")).collect(),
        };
        let field = |name: &str| header(headers, name).unwrap_or_default().to_string();
        self.log = LogLine {
            method: field(":method"),
            path: field(":path"),
            span_id: field("x-gateway-span-id"),
            parent_span_id: field("x-gateway-parent-span-id"),
            span_name: field("x-gateway-span-name"),
            ..LogLine::default()
        };
        let headers = match decoded {
            Ok(headers) => headers,
            Err(error) => return self.respond_error(&error),
        };
        let mut random = || u64::from_le_bytes(random_bytes::<8>());
        match pipeline::start(&self.settings, &headers, &mut random) {
            Err(error) => self.respond_error(&error),
            Ok(Started::Health) => self.respond(200, br#"{"status":"ok"}"#),
            Ok(Started::Ready(forward)) => self.forward(forward, &headers),
            Ok(Started::NeedsBody(pending)) if end_of_stream => {
                // A JSON endpoint called without a body.
                match pipeline::finish(pending, b"", &|| self.now()) {
                    Ok(forward) => self.forward(forward, &headers),
                    Err(error) => self.respond_error(&error),
                }
            }
            Ok(Started::NeedsBody(pending)) => {
                self.phase = Phase::AwaitingBody(pending, headers);
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
        let Phase::AwaitingBody(pending, headers) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        match pipeline::finish(pending, &body, &|| self.now()) {
            Err(error) => self.respond_error(&error),
            Ok(forward) => {
                if let Some(new_body) = &forward.body {
                    self.set_http_request_body(0, body_size, new_body);
                }
                self.forward(forward, &headers)
            }
        }
    }

    fn on_http_response_headers(&mut self, _count: usize, _end_of_stream: bool) -> Action {
        let plan = match &self.phase {
            Phase::Forwarded(plan) => plan,
            // The gateway's own answers already carry the trace id.
            Phase::Answered => return Action::Continue,
            // Envoy answered before the request went upstream (e.g. 413 for a huge body).
            Phase::Headers | Phase::AwaitingBody(..) => {
                self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
                return Action::Continue;
            }
        };
        let status = self
            .get_http_response_header_bytes(":status")
            .and_then(|s| String::from_utf8_lossy(&s).parse::<u16>().ok())
            .unwrap_or(0);
        self.log.status = status;
        self.response = if status >= 400 {
            ResponseMode::Error(status)
        } else {
            match &plan.chat {
                None => ResponseMode::Passthrough,
                Some(ctx) => {
                    let content_type = self.get_http_response_header_bytes("content-type").unwrap_or_default();
                    if String::from_utf8_lossy(&content_type).starts_with("text/event-stream") {
                        ResponseMode::Stream(plan.provider.translator.chat_stream(ctx.clone()))
                    } else {
                        ResponseMode::Chat(ctx.clone())
                    }
                }
            }
        };
        if !matches!(self.response, ResponseMode::Passthrough) {
            // The body changes size; Envoy frames the new one.
            self.set_http_response_header("content-length", None);
        }
        if matches!(self.response, ResponseMode::Error(_) | ResponseMode::Chat(_)) {
            self.set_http_response_header("content-type", Some("application/json"));
        }
        self.set_http_response_header(TRACE_HEADER, Some(&self.trace_id));
        self.set_http_response_header(PROVIDER_HEADER, Some(plan.provider.name));
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Phase::Forwarded(plan) = &self.phase else {
            return Action::Continue;
        };
        let translator = plan.provider.translator;
        let buffered = matches!(self.response, ResponseMode::Error(_) | ResponseMode::Chat(_));
        if matches!(self.response, ResponseMode::Passthrough) || (buffered && !end_of_stream) {
            // Buffered modes wait for the whole body.
            return if buffered { Action::Pause } else { Action::Continue };
        }
        let body = self.get_http_response_body(0, body_size).unwrap_or_default();
        let rewritten = match &mut self.response {
            ResponseMode::Passthrough => return Action::Continue,
            ResponseMode::Stream(stream) => {
                let mut out = Vec::with_capacity(body.len() + 256);
                stream.push(&body, &mut out);
                if end_of_stream {
                    stream.finish(&mut out);
                }
                out
            }
            ResponseMode::Error(status) => translator.error_body(*status, &body),
            ResponseMode::Chat(ctx) => translator.chat_response(&body, ctx).unwrap_or_else(|error| error.to_json()),
        };
        self.set_http_response_body(0, body_size, &rewritten);
        Action::Continue
    }

    fn on_log(&mut self) {
        let log = &self.log;
        log::info!(
            "trace_id={} span_id={} parent_span_id={} span_name={:?} method={} path={:?} provider={} status={}",
            self.trace_id,
            log.span_id,
            log.parent_span_id,
            log.span_name,
            log.method,
            log.path,
            if log.provider.is_empty() { "-" } else { log.provider },
            log.status,
        );
    }
}

