//! A request's way through the gateway as plain decisions: the host adapter feeds it
//! headers and body and applies what it returns.

use crate::errors::GatewayError;
use crate::providers::{Endpoint, ProviderSpec, ResponseContext};
use crate::request::chat;
use crate::request::limits::{check_json_size, MAX_JSON_VALUES};
use crate::request::endpoint::{classify, BodyMode, Route};
use crate::request::headers::{self, decode_value, is_gateway_header, is_secret_header, GatewayHeaders};
use crate::routing::{select_target, Target};
use crate::settings::Settings;
use serde_json::{Map, Value};

/// Envoy routes on this header to the cluster that reaches the provider.
pub const CLUSTER_HEADER: &str = "x-gateway-upstream-cluster";
/// Names the provider that served the request, on every provider response.
pub const PROVIDER_HEADER: &str = "x-gateway-provider";
pub const TRACE_HEADER: &str = "x-gateway-trace-id";

/// Request headers as the host gives them: lowercase names, raw values (values the gateway
/// does not touch go upstream byte for byte).
pub type RawHeaders = [(String, Vec<u8>)];

/// Header edits for the upstream request: removals first, then sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeaderEdits {
    pub remove: Vec<String>,
    pub set: Vec<(String, String)>,
}

impl HeaderEdits {
    /// The request headers after the edits, for one host call that replaces them all
    /// (each single-header call costs a host round trip and a route-cache clear).
    pub fn apply(&self, headers: &RawHeaders) -> Vec<(String, Vec<u8>)> {
        let replaced = |name: &str| self.remove.iter().any(|r| r == name) || self.set.iter().any(|(s, _)| s == name);
        let mut result: Vec<(String, Vec<u8>)> = headers.iter().filter(|(name, _)| !replaced(name)).cloned().collect();
        result.extend(self.set.iter().map(|(name, value)| (name.clone(), value.clone().into_bytes())));
        result
    }
}

/// How the response of a forwarded request is handled.
#[derive(Clone)]
pub struct ResponsePlan {
    pub provider: &'static ProviderSpec,
    /// Set when chat responses must be translated to the OpenAI shape.
    pub chat: Option<ResponseContext>,
}

/// A request ready to go upstream.
pub struct Forward {
    pub headers: HeaderEdits,
    /// The new body, when the gateway rewrote it.
    pub body: Option<Vec<u8>>,
    pub response: ResponsePlan,
}

/// A request that needs its body before it can go upstream.
pub struct Pending {
    endpoint: Endpoint,
    target: Target,
    headers: HeaderEdits,
}

pub enum Started {
    Health,
    Ready(Forward),
    NeedsBody(Pending),
}

/// Request headers arrived: authenticate, parse, pick the target, plan the upstream request.
/// `random` gives random u64s from the host, asked for only when a choice is random.
pub fn start(settings: &Settings, raw: &RawHeaders, random: &mut dyn FnMut() -> u64) -> Result<Started, GatewayError> {
    let pseudo = |name: &str| headers::find(raw, name).map(String::from_utf8_lossy).unwrap_or_default();
    let method = pseudo(":method");
    let route = classify(&method, &pseudo(":path"))?;
    let Route::Api { endpoint, body, path, query } = route else {
        return Ok(Started::Health);
    };
    // The key comes first: a caller without one learns nothing else about the request.
    match headers::api_key(raw) {
        Some(key) if settings.authenticate(key) => {}
        Some(_) => {
            return Err(GatewayError::new(401, "authentication_error", "invalid x-gateway-api-key")
                .with_code("invalid_api_key"))
        }
        None => {
            return Err(GatewayError::new(
                401,
                "authentication_error",
                "missing x-gateway-api-key header: every request needs a gateway API key",
            )
            .with_code("missing_api_key"))
        }
    }
    let decoded = raw
        .iter()
        .map(|(name, value)| decode_value(name, value).map(|text| (name.as_str(), text)))
        .collect::<Result<Vec<_>, _>>()?;
    let gateway = GatewayHeaders::parse(decoded.iter().map(|(name, value)| (*name, value.as_str())))?;
    let target = select_target(settings, &gateway, random)?;
    let upstream_path = target.provider.translator.upstream_path(endpoint, &path)?;
    let location = UpstreamPath { path: &upstream_path, query: query.as_deref() };
    let edits = upstream_headers(settings, raw, &target, &gateway, location);
    if body == BodyMode::Json && method == "POST" {
        Ok(Started::NeedsBody(Pending { endpoint, target, headers: edits }))
    } else {
        let response = ResponsePlan { provider: target.provider, chat: None };
        Ok(Started::Ready(Forward { headers: edits, body: None, response }))
    }
}

struct UpstreamPath<'a> {
    path: &'a str,
    query: Option<&'a str>,
}

fn upstream_headers(
    settings: &Settings,
    raw: &RawHeaders,
    target: &Target,
    gateway: &GatewayHeaders,
    location: UpstreamPath,
) -> HeaderEdits {
    let forwarded = |name: &str| target.options.forward_headers.iter().any(|f| f == name);
    let mut edits = HeaderEdits::default();
    for (name, _) in raw {
        // Gateway headers and the client's credential stay here unless the user forwards them;
        // gateway secrets never leave; accept-encoding goes so responses arrive uncompressed
        // and can be translated.
        let private = is_gateway_header(name) || name == "authorization";
        if is_secret_header(name) || (private && !forwarded(name)) || name == "accept-encoding" {
            edits.remove.push(name.clone());
        }
    }
    let cluster = if target.upstream.tls { &settings.tls_cluster } else { &settings.plain_cluster };
    let base = &target.upstream.base_path;
    let path = match location.query {
        Some(q) => format!("{base}{}?{q}", location.path),
        None => format!("{base}{}", location.path),
    };
    edits.set.push((":authority".into(), target.upstream.authority.clone()));
    edits.set.push((":path".into(), path));
    edits.set.push((CLUSTER_HEADER.into(), cluster.clone()));
    let translator = target.provider.translator;
    let vendor = translator.vendor_headers(
        target.vendor_organization.as_deref(),
        target.vendor_project.as_deref(),
        gateway.vendor_beta.as_deref(),
    );
    let provider_headers = translator.auth_headers(target.api_key.as_deref()).into_iter().chain(vendor);
    edits.set.extend(provider_headers.map(|(name, value)| (name.to_string(), value)));
    if let Some(ms) = target.options.request_timeout {
        // Envoy's per-try timer stops at the response headers (the route timer would also
        // cut a stream that has started).
        edits.set.push(("x-envoy-upstream-rq-per-try-timeout-ms".into(), ms.to_string()));
    }
    edits
}

/// The whole request body arrived: validate it, apply `override_params`, translate it.
/// `now` reads Unix seconds from the host clock, only when a response will need them.
pub fn finish(pending: Pending, body: &[u8], now: &dyn Fn() -> u64) -> Result<Forward, GatewayError> {
    let Pending { endpoint, target, headers } = pending;
    let response = |chat| ResponsePlan { provider: target.provider, chat };
    let overrides = &target.options.override_params;
    let translator = target.provider.translator;
    let is_chat = endpoint == Endpoint::ChatCompletions;
    if !is_chat && overrides.is_empty() {
        return Ok(Forward { headers, body: None, response: response(None) });
    }
    let mut request = parse_object(body)?;
    apply_overrides(&mut request, overrides);
    let mut chat_context = None;
    if is_chat {
        let value = Value::Object(request);
        chat::validate_chat_request(&value)?;
        let strict = target.options.strict_vendor_compliance;
        if strict && value.get("thinking").is_some_and(|t| !t.is_null()) {
            return Err(GatewayError::invalid_param(
                "thinking",
                "thinking requires strict_vendor_compliance false in the config",
            ));
        }
        if !translator.translates_responses() && overrides.is_empty() {
            // OpenAI-compatible and untouched: the original bytes go upstream as they came.
            return Ok(Forward { headers, body: None, response: response(None) });
        }
        if translator.translates_responses() {
            chat_context = Some(ResponseContext {
                model: value.get("model").and_then(Value::as_str).unwrap_or_default().to_string(),
                created: now(),
                include_usage: chat::include_usage(&value),
                strict_vendor_compliance: strict,
            });
        }
        let translated = translator.chat_request(value, strict)?;
        return Ok(with_json_body(headers, translated, response(chat_context)));
    }
    Ok(with_json_body(headers, Value::Object(request), response(None)))
}

fn with_json_body(mut headers: HeaderEdits, body: Value, response: ResponsePlan) -> Forward {
    let bytes = body.to_string().into_bytes();
    headers.set.push(("content-length".into(), bytes.len().to_string()));
    headers.set.push(("content-type".into(), "application/json".into()));
    Forward { headers, body: Some(bytes), response }
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    check_json_size(body, MAX_JSON_VALUES)?;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(GatewayError::invalid_param("body", "the request body must be a JSON object")),
        Err(e) => Err(GatewayError::invalid_param("body", format!("the request body is not valid JSON: {e}"))),
    }
}

fn apply_overrides(request: &mut Map<String, Value>, overrides: &Map<String, Value>) {
    for (key, value) in overrides {
        request.insert(key.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    // The same tests run inside wasm (32-bit) under wasm-bindgen-test.
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use super::*;

    fn settings() -> Settings {
        Settings::parse(br#"{"api_keys": ["gw-key"]}"#).unwrap()
    }

    fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        let mut h = vec![(":method".to_string(), method.into()), (":path".to_string(), path.into())];
        h.extend(extra.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())));
        h
    }

    const OPENAI_LOCAL: &[(&str, &str)] = &[
        ("x-gateway-api-key", "gw-key"),
        ("x-gateway-provider", "openai"),
        ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
        ("authorization", "Bearer sk-local"),
        ("x-custom-thing", "kept"),
        ("accept-encoding", "gzip"),
    ];

    fn started(h: &RawHeaders) -> Result<Started, GatewayError> {
        start(&settings(), h, &mut || 0)
    }

    #[test]
    fn health_needs_no_key() {
        assert!(matches!(started(&request("GET", "/health", &[])), Ok(Started::Health)));
    }

    #[test]
    fn gateway_key_is_required() {
        let err = started(&request("POST", "/v1/chat/completions", &[])).err().unwrap();
        assert_eq!((err.status, err.code), (401, Some("missing_api_key")));
        assert!(err.message.contains("x-gateway-api-key"));
        let err = started(&request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "nope")])).err().unwrap();
        assert_eq!((err.status, err.code), (401, Some("invalid_api_key")));
        // Other header errors come only after the key: no key, no details.
        let err = started(&request("POST", "/v1/chat/completions", &[("x-gateway-metadata", "[1]")])).err().unwrap();
        assert_eq!(err.status, 401);
    }

    #[test]
    fn gateway_secrets_are_never_forwarded() {
        let mut h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        h.push(("x-gateway-forward-headers".into(), b"x-gateway-api-key, apikey, x-gateway-config, x-gateway-provider".to_vec()));
        h.push(("apikey".into(), b"gw-key".to_vec()));
        let Ok(Started::NeedsBody(pending)) = started(&h) else { panic!() };
        for gone in ["x-gateway-api-key", "apikey"] {
            assert!(pending.headers.remove.iter().any(|n| n == gone), "{gone}");
        }
        // A non-secret gateway header may be forwarded on request.
        assert!(!pending.headers.remove.iter().any(|n| n == "x-gateway-provider"));
    }

    #[test]
    fn other_header_bytes_pass_untouched() {
        let mut h = request("GET", "/v1/batches", OPENAI_LOCAL);
        h.push(("x-latin1".into(), b"caf\xe9".to_vec()));
        let Ok(Started::Ready(forward)) = started(&h) else { panic!() };
        let upstream = forward.headers.apply(&h);
        assert!(upstream.contains(&("x-latin1".to_string(), b"caf\xe9".to_vec())));
        let mut bad = request("GET", "/v1/batches", OPENAI_LOCAL);
        bad.push(("x-gateway-metadata".into(), b"{\"a\":\"\xff\"}".to_vec()));
        assert_eq!(started(&bad).err().unwrap().param.as_deref(), Some("x-gateway-metadata"));
    }

    #[test]
    fn plans_upstream_headers() {
        let Ok(Started::NeedsBody(pending)) = started(&request("POST", "/v1/chat/completions", OPENAI_LOCAL)) else {
            panic!("chat needs the body")
        };
        let edits = &pending.headers;
        for gone in ["x-gateway-api-key", "x-gateway-provider", "x-gateway-custom-host", "accept-encoding"] {
            assert!(edits.remove.iter().any(|n| n == gone), "{gone}");
        }
        assert!(!edits.remove.iter().any(|n| n == "x-custom-thing"));
        let set = |name: &str| edits.set.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(set(":authority"), Some("127.0.0.1:9000"));
        assert_eq!(set(":path"), Some("/v1/chat/completions"));
        assert_eq!(set(CLUSTER_HEADER), Some("gateway_upstream_plain"));
        assert_eq!(set("authorization"), Some("Bearer sk-local"));
    }

    #[test]
    fn header_edits_apply_to_the_whole_map() {
        let edits = HeaderEdits {
            remove: vec!["x-gateway-api-key".into()],
            set: vec![(":authority".into(), "up:80".into()), ("x-new".into(), "1".into())],
        };
        let before = request("POST", "/p", &[(":authority", "gw"), ("x-gateway-api-key", "k"), ("x-keep", "v")]);
        let after = edits.apply(&before);
        let names: Vec<&str> = after.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec![":method", ":path", "x-keep", ":authority", "x-new"]);
        assert_eq!(after[3].1, b"up:80");
    }

    #[test]
    fn passthrough_endpoints_keep_the_query() {
        let Ok(Started::Ready(forward)) = started(&request("GET", "/v1/batches?limit=2", OPENAI_LOCAL)) else {
            panic!("resources go straight through")
        };
        assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/batches?limit=2".to_string())));
    }

    #[test]
    fn untouched_openai_chat_keeps_its_bytes() {
        let Ok(Started::NeedsBody(pending)) = started(&request("POST", "/v1/chat/completions", OPENAI_LOCAL)) else {
            panic!()
        };
        let forward = finish(pending, br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, &|| 1).ok().unwrap();
        assert!(forward.body.is_none());
        assert!(forward.response.chat.is_none());
    }

    #[test]
    fn override_params_rewrite_the_body() {
        let config = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","override_params":{"model":"forced"}}"#;
        let h = request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
        let Ok(Started::NeedsBody(pending)) = started(&h) else { panic!() };
        let forward = finish(pending, br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, &|| 1).ok().unwrap();
        let body: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
        assert_eq!(body["model"], "forced");
        let length = forward.headers.set.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.clone());
        assert_eq!(length, Some(body.to_string().len().to_string()));
    }

    #[test]
    fn bad_bodies_are_400s() {
        let too_many_values = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES));
        for body in [&b"not json"[..], b"[1]", b"{\"model\":\"m\",\"messages\":[]}", b"\xff\xfe", too_many_values.as_bytes()] {
            let Ok(Started::NeedsBody(pending)) = started(&request("POST", "/v1/chat/completions", OPENAI_LOCAL)) else {
                panic!()
            };
            assert_eq!(finish(pending, body, &|| 1).err().unwrap().status, 400);
        }
    }

    #[test]
    fn thinking_needs_non_strict_mode() {
        let Ok(Started::NeedsBody(pending)) = started(&request("POST", "/v1/chat/completions", OPENAI_LOCAL)) else {
            panic!()
        };
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}"#;
        assert_eq!(finish(pending, body, &|| 1).err().unwrap().param.as_deref(), Some("thinking"));
    }
}
