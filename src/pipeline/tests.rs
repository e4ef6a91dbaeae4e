use super::*;
use crate::ports::testing::FakeHost;
use crate::settings::CLUSTER_HEADER;
use crate::unit_tests::test;

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
    let settings = settings();
    let mut nothing = catalog::Nothing;
    start(&settings, h, &mut FakeHost::new(0), &mut Catalog::new(&settings, &mut nothing))
}

/// The call `h` and `body` make.
fn routed(settings: &Settings, h: &RawHeaders, body: &[u8]) -> Result<Call, GatewayError> {
    let mut host = FakeHost::new(0);
    let mut nothing = catalog::Nothing;
    let mut catalog = Catalog::new(settings, &mut nothing);
    let started = match start(settings, h, &mut host, &mut catalog)? {
        Started::NeedsBody(pending) => finish(settings, pending, body, &mut host, &mut catalog)?,
        started => started,
    };
    match started {
        Started::Ready(call) => Ok(call),
        _ => panic!("not routed"),
    }
}

/// The first attempt's upstream request for headers `h` and `body`.
fn forwarded(h: &RawHeaders, body: &[u8]) -> Result<Forward, GatewayError> {
    forwarded_with(&settings(), h, body)
}

fn forwarded_with(settings: &Settings, h: &RawHeaders, body: &[u8]) -> Result<Forward, GatewayError> {
    let mut call = routed(settings, h, body)?;
    call.forward(settings, h, call.attempts.current, None, &|| 1)
}

#[test]
fn an_openai_stream_asks_for_usage_the_client_did_not() {
    let settings = Settings::parse(br#"{"api_keys": ["gw-key"]}"#).unwrap();
    let off = Settings::parse(br#"{"api_keys": ["gw-key"], "metrics": {"stream_usage": false}}"#).unwrap();
    let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
    let stream = br#"{"model":"m","stream":true,"stream_options":{"x":1},"messages":[{"role":"user","content":"hi"}]}"#;
    let sent: Value = serde_json::from_slice(&forwarded_with(&settings, &h, stream).unwrap().body.unwrap()).unwrap();
    assert_eq!(sent["stream_options"], json!({"x": 1, "include_usage": true}));
    let stream = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let forward = forwarded_with(&settings, &h, stream).unwrap();
    let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert!(forward.response.translator.translates_responses(), "the client's stream is rewritten");
    // The client asked itself, or no stream, or the setting off: the body goes as it came.
    let asked = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(forwarded_with(&settings, &h, asked).unwrap().body, None);
    assert_eq!(forwarded_with(&settings, &h, CHAT).unwrap().body, None);
    assert_eq!(forwarded_with(&off, &h, stream).unwrap().body, None);
    // A bad stream_options is the validation's to refuse, never replaced.
    let bad = br#"{"model":"m","stream":true,"stream_options":"x","messages":[{"role":"user","content":"hi"}]}"#;
    assert!(forwarded_with(&settings, &h, bad).is_err());
}

const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

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
    h.push((
        "x-gateway-forward-headers".into(),
        b"x-gateway-api-key, apikey, x-gateway-config, x-gateway-provider".to_vec(),
    ));
    h.push(("apikey".into(), b"gw-key".to_vec()));
    let edits = forwarded(&h, CHAT).ok().unwrap().headers;
    for gone in ["x-gateway-api-key", "apikey"] {
        assert!(edits.remove.iter().any(|n| n == gone), "{gone}");
    }
    // A non-secret gateway header may be forwarded on request.
    assert!(!edits.remove.iter().any(|n| n == "x-gateway-provider"));
}

#[test]
fn other_header_bytes_pass_untouched() {
    let mut h = request("GET", "/v1/batches", OPENAI_LOCAL);
    h.push(("x-latin1".into(), b"caf\xe9".to_vec()));
    assert!(matches!(started(&h), Ok(Started::Ready(_))));
    let forward = forwarded(&h, b"").ok().unwrap();
    let upstream = forward.headers.apply(&h);
    assert!(upstream.contains(&("x-latin1", &b"caf\xe9"[..])));
    let mut bad = request("GET", "/v1/batches", OPENAI_LOCAL);
    bad.push(("x-gateway-metadata".into(), b"{\"a\":\"\xff\"}".to_vec()));
    assert_eq!(started(&bad).err().unwrap().param.as_deref(), Some("x-gateway-metadata"));
}

#[test]
fn plans_upstream_headers() {
    let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
    assert!(matches!(started(&h), Ok(Started::NeedsBody(_))), "chat needs the body");
    let forward = forwarded(&h, CHAT).ok().unwrap();
    let edits = &forward.headers;
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
    let names: Vec<&str> = after.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, vec![":method", ":path", "x-keep", ":authority", "x-new"]);
    assert_eq!(after[3].1, b"up:80".as_slice());
}

#[test]
fn passthrough_endpoints_keep_the_query() {
    let forward = forwarded(&request("GET", "/v1/batches?limit=2", OPENAI_LOCAL), b"").ok().unwrap();
    assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/batches?limit=2".to_string())));
}

#[test]
fn resource_requests_are_checked_then_sent_as_they_came() {
    let bad = started(&request("GET", "/v1/batches?limit=101", OPENAI_LOCAL)).err().unwrap();
    assert_eq!((bad.status, bad.param.as_deref()), (400, Some("limit")));
    let bad = started(&request("GET", "/v1/batches/a%2Fb", OPENAI_LOCAL)).err().unwrap();
    assert_eq!(bad.param.as_deref(), Some("batch_id"));
    // The key still comes first.
    assert_eq!(started(&request("GET", "/v1/batches?limit=0", &[])).err().unwrap().status, 401);
    let h = request("POST", "/v1/batches?x=%20", OPENAI_LOCAL);
    assert!(matches!(started(&h), Ok(Started::NeedsBody(_))), "a batch body is read");
    let bad = forwarded(&h, br#"{"input_file_id":"f","endpoint":"/v1/chat/completions","completion_window":"1h"}"#);
    assert_eq!(bad.err().unwrap().param.as_deref(), Some("completion_window"));
    // override_params never reach a resource body: the client's bytes go.
    let config = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","override_params":{"model":"forced"}}"#;
    let h = request("POST", "/v1/batches?x=%20", &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
    let body = br#"{"input_file_id":"f", "endpoint":"/v1/embeddings","completion_window":"24h"}"#;
    let forward = forwarded(&h, body).ok().unwrap();
    assert_eq!(forward.body, None);
    assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/batches?x=%20".to_string())));
    assert!(!forward.headers.set.iter().any(|(n, _)| n == "content-length"));
    // Without a provider: the headers that select one are named.
    let h = request("GET", "/v1/batches", &[("x-gateway-api-key", "gw-key")]);
    let missing = started(&h).err().unwrap();
    assert_eq!(missing.code, Some("missing_provider"));
    assert!(missing.message.contains("x-gateway-provider") && missing.message.contains("x-gateway-virtual-key"));
}

#[test]
fn untouched_openai_chat_keeps_its_bytes() {
    let forward = forwarded(&request("POST", "/v1/chat/completions", OPENAI_LOCAL), CHAT).ok().unwrap();
    assert!(forward.body.is_none());
    assert!(!forward.response.translator.translates_responses());
}

#[test]
fn override_params_rewrite_the_body() {
    let config = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","override_params":{"model":"forced"}}"#;
    let h = request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
    let forward = forwarded(&h, CHAT).ok().unwrap();
    let body: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
    assert_eq!(body["model"], "forced");
    let length = forward.headers.set.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.clone());
    assert_eq!(length, Some(body.to_string().len().to_string()));
}

#[test]
fn bad_bodies_are_400s() {
    let too_many_values = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES));
    for body in
        [&b"not json"[..], b"[1]", b"{\"model\":\"m\",\"messages\":[]}", b"\xff\xfe", too_many_values.as_bytes()]
    {
        let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        assert_eq!(forwarded(&h, body).err().unwrap().status, 400);
    }
}

fn cache_plan(config: &str, path: &str, body: &[u8]) -> CachePlan {
    let h = request("POST", path, &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
    routed(&settings(), &h, body).ok().unwrap().cache_plan()
}

fn cache_key(config: &str, body: &[u8]) -> cache::Key {
    match cache_plan(config, "/v1/chat/completions", body) {
        CachePlan::Lookup(lookup) => lookup.key,
        _ => panic!("not cached"),
    }
}

#[test]
fn the_cache_key_is_taken_after_override_params() {
    let plain =
        r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple"}}"#;
    let forced = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple"},"override_params":{"model":"forced"}}"#;
    let same = r#"{"provider":"openai","api_key":"k2","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple","max_age":5},"override_params":{"model":"m"}}"#;
    assert_ne!(cache_key(plain, CHAT), cache_key(forced, CHAT));
    // The provider credential and max_age are not part of it; the same resulting body is.
    assert_eq!(cache_key(plain, CHAT), cache_key(same, CHAT));
    let other = br#"{"model":"forced","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(cache_key(forced, CHAT), cache_key(plain, other));
}

#[test]
fn cache_plans_by_endpoint_and_config() {
    let cached =
        r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"semantic"}}"#;
    let uncached = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1"}"#;
    assert!(matches!(cache_plan(uncached, "/v1/chat/completions", CHAT), CachePlan::Disabled));
    assert!(matches!(cache_plan(cached, "/v1/moderations", br#"{"input":"x"}"#), CachePlan::Uncached));
    let CachePlan::Lookup(lookup) = cache_plan(cached, "/v1/embeddings", br#"{"model":"e","input":"x"}"#) else {
        panic!("embeddings are cached");
    };
    assert_eq!((lookup.conversation, lookup.max_age_ms), (None, cache::DEFAULT_MAX_AGE_SECONDS * 1000));
    let stream = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let CachePlan::Lookup(lookup) = cache_plan(cached, "/v1/chat/completions", stream) else {
        panic!("chat is cached");
    };
    assert!(lookup.stream && lookup.include_usage && !lookup.refresh);
    assert_eq!(lookup.conversation.as_deref(), Some("user: hi"));
    assert_eq!(lookup.key, cache_key(cached, CHAT));
}

#[test]
fn a_translated_request_leaves_the_clients_query_behind() {
    let messages = br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let h = request("POST", "/v1/messages?beta=true", OPENAI_LOCAL);
    let forward = forwarded(&h, messages).ok().unwrap();
    assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/chat/completions".to_string())));
    let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
    assert_eq!(sent["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn a_count_goes_to_a_provider_that_counts_and_only_there() {
    let count = br#"{"model":"gemini-2.5-flash","system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#;
    let google = [
        ("x-gateway-api-key", "gw-key"),
        ("x-gateway-provider", "google"),
        ("x-gateway-custom-host", "http://127.0.0.1:9000"),
        ("x-api-key", "gm-key"),
    ];
    let forward = forwarded(&request("POST", "/v1/messages/count_tokens", &google), count).ok().unwrap();
    let path = forward.headers.set.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.as_str());
    assert_eq!(path, Some("/v1beta/models/gemini-2.5-flash:countTokens"));
    let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
    assert_eq!(sent["generateContentRequest"]["model"], "models/gemini-2.5-flash");
    assert!(sent["generateContentRequest"]["contents"].is_array());
    let mut translator = forward.response.translator;
    let answer = translator.response(br#"{"totalTokens": 12}"#).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&answer).unwrap(), json!({"input_tokens": 12}));
    // A provider that cannot count is told so, before any call.
    let error = forwarded(&request("POST", "/v1/messages/count_tokens", OPENAI_LOCAL), count).err().unwrap();
    assert_eq!(error.status, 400);
    assert!(error.message.contains("cannot count tokens"), "{}", error.message);
}

#[test]
fn kept_responses_need_the_control_plane() {
    let h = request("POST", "/v1/responses", OPENAI_LOCAL);
    let body = br#"{"model":"m","input":"more","previous_response_id":"resp_gw_0123"}"#;
    let error = forwarded(&h, body).err().unwrap();
    assert_eq!((error.status, error.param.as_deref()), (400, Some("previous_response_id")));
    assert!(error.message.contains("control plane"), "{}", error.message);
    // A provider's own id goes to the provider that speaks Responses (it keeps its own).
    let body = br#"{"model":"m","input":"more","previous_response_id":"resp_abc"}"#;
    assert!(forwarded(&h, body).is_ok());
    let missing = started(&request("GET", "/v1/responses/resp_gw_0123", OPENAI_LOCAL)).err().unwrap();
    assert_eq!(missing.status, 404);
    assert!(matches!(started(&request("GET", "/v1/responses/resp_abc", OPENAI_LOCAL)), Ok(Started::Ready(_))));
    assert_eq!(
        kept_response_path("/responses/resp_gw_1/input_items", Some("limit=2")).as_deref(),
        Some("/internal/v1/responses/resp_gw_1/input_items?limit=2")
    );
    assert_eq!(kept_response_path("/responses/resp_1", None), None);
}

#[test]
fn thinking_needs_non_strict_mode() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}"#;
    let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
    assert_eq!(forwarded(&h, body).err().unwrap().param.as_deref(), Some("thinking"));
}
