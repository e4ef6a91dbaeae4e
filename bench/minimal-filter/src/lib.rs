//! The benchmark's floor filters: what any proxy-wasm filter must do to route like the gateway
//! under the gateway's Envoy config, and nothing else. The plugin configuration is
//! `<mode> <authority>` (`authority` is the upstream's `host:port`), read once per VM:
//! - `pass` (the `floor_pass` variant): on the request headers it sets the route's
//!   `cluster_header` and the forward proxy's `:authority` (Envoy chooses the route again) and
//!   lets everything through. Two host calls per request.
//! - `hold` (`floor_hold`): the same, and it holds the request's headers until its body has
//!   been buffered whole, and the answer's headers until its body has, as the gateway does
//!   (it validates the body before the provider sees it and reads the answer for its usage).
//!   The bodies are never read: reading them is the gateway's own work.
//!
//! Without an authority only the cluster is set. Failures are ignored: the request goes on.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

/// The route's `cluster_header` and the gateway's cluster for plain-HTTP custom hosts.
const CLUSTER_HEADER: &str = "x-gateway-upstream-cluster";
const PLAIN_CLUSTER: &str = "gateway_upstream_plain";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { hold: false, authority: None }) });
}}

struct Root {
    hold: bool,
    authority: Option<Rc<str>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let text = self.get_plugin_configuration().and_then(|bytes| String::from_utf8(bytes).ok()).unwrap_or_default();
        let (mode, authority) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        self.hold = mode == "hold";
        self.authority = Some(authority.trim()).filter(|authority| !authority.is_empty()).map(Rc::from);
        mode == "hold" || mode == "pass"
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request { hold: self.hold, authority: self.authority.clone() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    hold: bool,
    authority: Option<Rc<str>>,
}

impl Request {
    /// Holds a side's headers or body until its end, in `hold` mode.
    fn until_end(&self, end_of_stream: bool) -> Action {
        if self.hold && !end_of_stream {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Straight to the host: the trait's setters unwrap the host's answer.
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, CLUSTER_HEADER, Some(PLAIN_CLUSTER));
        if let Some(authority) = &self.authority {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, ":authority", Some(authority));
        }
        self.until_end(end_of_stream)
    }

    fn on_http_request_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        self.until_end(end_of_stream)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.until_end(end_of_stream)
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        self.until_end(end_of_stream)
    }
}
