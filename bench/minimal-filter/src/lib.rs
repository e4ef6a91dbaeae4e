//! The benchmark's baseline filter: on the request headers it sets what any filter must set to
//! route like the gateway under the gateway's Envoy config (the route's `cluster_header` and the
//! forward proxy's `:authority`), and nothing else. Two host calls per request.
//!
//! The plugin configuration is the upstream authority (`host:port`), read once per VM. Without
//! one only the cluster is set. Failures are ignored: the request goes on as it is.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

/// The route's `cluster_header` and the gateway's cluster for plain-HTTP custom hosts.
const CLUSTER_HEADER: &str = "x-gateway-upstream-cluster";
const PLAIN_CLUSTER: &str = "gateway_upstream_plain";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { authority: None }) });
}}

struct Root {
    authority: Option<Rc<str>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        self.authority = self
            .get_plugin_configuration()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(|text| text.trim().to_string())
            .filter(|text| !text.is_empty())
            .map(Rc::from);
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request { authority: self.authority.clone() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    authority: Option<Rc<str>>,
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // Straight to the host: the trait's setters unwrap the host's answer.
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, CLUSTER_HEADER, Some(PLAIN_CLUSTER));
        if let Some(authority) = &self.authority {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, ":authority", Some(authority));
        }
        Action::Continue
    }
}
