//! Fuzz entry points, built with `--cfg fuzzing` for the targets in `fuzz/` (`./build.sh fuzz`)
//! and with the unit tests (below). Each takes the fuzzer's bytes and runs one parser or decision, or a whole exchange
//! driven by a sequence of host events, and asserts what must hold for any input: no panic, the
//! same parse however the input is cut into chunks, at most one answer per request.

use crate::exchange::{self, After, CallAnswer, Dispatch, Io, Worker};
use crate::ports::testing::{prefix, replace_prefix, FakeHost};
use crate::ports::Host;
use crate::request::headers::set as set_header;
use crate::settings::Settings;
use std::collections::HashMap;
use std::rc::Rc;

/// The fuzzer's bytes, read front to back; past the end every read is empty or zero.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    /// The next `n` bytes (fewer at the end).
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    /// A piece whose length the next two bytes give (little-endian).
    fn piece(&mut self) -> &'a [u8] {
        let n = usize::from(u16::from_le_bytes([self.byte(), self.byte()]));
        self.take(n)
    }

    fn choose<T: Copy + Default>(&mut self, options: &[T]) -> T {
        let index = usize::from(self.byte()) % options.len().max(1);
        options.get(index).copied().unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `text` cut into pieces whose sizes `seed` spreads from 1 to 17 bytes.
fn cut(text: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut i = 0usize;
    while !rest.is_empty() {
        let size = 1 + (usize::from(seed) ^ i.wrapping_mul(31)) % 17;
        let (piece, after) = rest.split_at(size.min(rest.len()));
        pieces.push(piece);
        rest = after;
        i += 1;
    }
    pieces
}

/// The plugin configuration Envoy hands the filter.
pub fn plugin_settings(data: &[u8]) {
    let _ = Settings::parse(data);
}

/// Server-sent events: the events of a stream do not depend on where its chunks end.
pub fn sse(data: &[u8]) {
    let mut input = Input(data);
    let seed = input.byte();
    let text = input.0;
    let events = |pieces: &[&[u8]]| {
        let mut parser = crate::stream::sse::SseParser::new();
        let mut events: Vec<String> = pieces.iter().flat_map(|p| parser.push(p)).map(|e| format!("{e:?}")).collect();
        events.extend(parser.finish().into_iter().map(|e| format!("{e:?}")));
        (events, parser.overflowed())
    };
    assert_eq!(events(&[text]), events(&cut(text, seed)));
}

/// MCP: a client's JSON-RPC message read (never a panic; names cut for the record) and planned
/// by the aggregate endpoint; a server's answer read by the aggregate's backend, watched for its
/// outcome, a `tools/list` answer rewritten and a member's answer bridged between eras, each
/// the same however the answer is cut into chunks; `Mcp-Param-*` headers written for any schema
/// and arguments.
pub fn mcp(data: &[u8]) {
    use crate::mcp::{
        aggregate, read_message, AnswerRewrite, AnswerWatch, Backend, Bridge, Edit, List, Plan, ToolPolicy,
    };
    use gateway_schema::mcp_servers::Tools;
    let mut input = Input(data);
    let seed = input.byte();
    let content_type = input.choose(&["application/json", "text/event-stream", "text/plain"]);
    let id: serde_json::Value = serde_json::from_slice(input.piece()).unwrap_or(serde_json::Value::Null);
    let body = input.0;
    let schema: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    for (name, value) in crate::mcp::params::headers(&schema, &id) {
        assert!(name.bytes().all(|b| b.is_ascii_graphic()) && value.bytes().all(|b| (0x20..0x7f).contains(&b)));
    }
    if let Ok(message) = read_message(body) {
        assert!(message.method.iter().chain(&message.tool).all(|name| name.chars().count() <= 128));
        // The aggregate's plan of it: a route names a member and a name without its prefix.
        let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let members: [(&str, Option<&ToolPolicy>); 2] = [("files", None), ("web-2", None)];
        if let Plan::Route { member, name, .. } = aggregate::plan(&value, message.id.as_ref(), &members) {
            assert!(member < members.len() && name.is_none_or(|name| !name.is_empty()));
        }
    }
    // A server's answer to each of the aggregate's calls to it: never a panic, always an end.
    let mut backend = Backend::new("files", seed % 2 == 1, None, Some(List::Tools));
    for _ in 0..4 {
        backend.answered(200, Some("s"), content_type.as_bytes(), body);
    }
    assert!(backend.is_done() || backend.next_call().is_some());
    // A client's session id is the client's to make up: reading it never panics, and what the
    // gateway seals reads back.
    let key = crate::mcp::sealed::SessionKey::of([seed; 32]);
    let text = String::from_utf8_lossy(body);
    let _ = crate::mcp::sealed::unseal(&key, &text, "caller");
    let sessions = vec![(text.replace(['\0', '\n'], ""), aggregate::Session { id: None, version: "v".into() })];
    let sealed = crate::mcp::sealed::seal(&key, [seed; 12], "caller", &sessions);
    assert_eq!(crate::mcp::sealed::unseal(&key, &sealed, "caller"), Some(sessions));
    let watched = |pieces: &[&[u8]]| {
        let mut watch = AnswerWatch::new(id.clone(), content_type.as_bytes())?;
        pieces.iter().for_each(|piece| watch.push(piece));
        watch.finish()
    };
    assert_eq!(watched(&[body]), watched(&cut(body, seed)));
    let Some(policy) = ToolPolicy::new("files", &Tools::Deny(vec!["w*".into()]), None) else {
        return;
    };
    let rewritten = |edit: &Edit, pieces: &[&[u8]]| {
        let mut list = AnswerRewrite::new(id.clone(), edit.clone(), content_type.as_bytes())?;
        let mut out = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            out.extend(list.push(piece, i + 1 == pieces.len()));
        }
        if pieces.is_empty() {
            out.extend(list.push(&[], true));
        }
        Some((out, list.outcome()))
    };
    let member = |bridge| Edit::Member { server: "files".into(), bridge };
    for edit in [Edit::Tools(policy), member(Bridge::Same), member(Bridge::ToStateless), member(Bridge::ToSession)] {
        assert_eq!(rewritten(&edit, &[body]), rewritten(&edit, &cut(body, seed)));
    }
}

/// AWS event-stream frames (Bedrock's streams): the frames and the error do not depend on where
/// the chunks end.
pub fn event_stream(data: &[u8]) {
    use crate::providers::bedrock::eventstream::Decoder;
    let mut input = Input(data);
    let seed = input.byte();
    let bytes = input.0;
    let decode = |pieces: &[&[u8]]| {
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        let mut failed = None;
        for piece in pieces {
            if let Err(error) = decoder.push(piece, &mut frames) {
                failed = Some(error);
                break;
            }
        }
        let end = failed.map_or_else(|| decoder.finish(), Err);
        (frames, end)
    };
    assert_eq!(decode(&[bytes]), decode(&cut(bytes, seed)));
}

/// A conditional-routing query (JSON) checked and, when valid, run against a JSON input.
pub fn query(data: &[u8]) {
    let mut input = Input(data);
    let query = input.piece();
    let Ok(serde_json::Value::Object(query)) = serde_json::from_slice(query) else {
        return;
    };
    if gateway_schema::query::validate(&query).is_err() {
        return;
    }
    if let Ok(value) = serde_json::from_slice(input.0) {
        let _ = gateway_schema::query::matches(&query, &value);
    }
}

/// A prompt version (its Mustache template) rendered for a request's variables.
pub fn prompt(data: &[u8]) {
    let mut input = Input(data);
    let (Ok(version), Ok(serde_json::Value::Object(request))) =
        (serde_json::from_slice(input.piece()), serde_json::from_slice(input.0))
    else {
        return;
    };
    let _ = gateway_schema::prompts::render(&version, &request);
}

/// A JWT checked against a JWKS (the `default.jwt` guardrail), both from the fuzzer.
pub fn jwt(data: &[u8]) {
    use crate::guardrails::jwt;
    let mut input = Input(data);
    let jwks = input.piece();
    let Ok(token) = std::str::from_utf8(input.0) else {
        return;
    };
    if let Ok(token) = jwt::parse(token) {
        let rules = gateway_schema::guardrails::params::Rules {
            algorithms: ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"].map(String::from).to_vec(),
            clock_tolerance_s: 5,
            max_token_age_s: Some(86_400),
        };
        let _ = jwt::verify(&token, jwks, &rules, 1_700_000_000);
    }
}

/// What the control plane checks in a request body before it stores it (its first byte picks
/// the kind: a saved config, a stored provider, a guardrail, a limit, a price), as it does.
pub fn stored_items(data: &[u8]) {
    use gateway_schema::{limits, prices, stored};
    let mut input = Input(data);
    let kind = input.byte() % 5;
    let body = input.0;
    if stored::nested_too_deep(body).is_some() || (kind == 0 && stored::config_nested_too_deep(body).is_some()) {
        return;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let _ = match kind {
        0 => stored::check_config(&value).is_ok(),
        1 => stored::check_provider(&value).is_ok(),
        2 => stored::check_guardrail(&value).is_ok(),
        3 => limits::parse_limit("fuzz", &value).is_ok(),
        _ => prices::parse_price(&value).is_ok(),
    };
}

/// Gateway header names (alternative names among them) and resource paths a request may have.
const HEADER_NAMES: &[&str] = &[
    "x-gateway-api-key",
    "provider",
    "x-gateway-config",
    "config",
    "custom_host",
    "x-gateway-trace-id",
    "metadata",
    "cache_force_refresh",
    "x-gateway-request-timeout",
    "forward_headers",
    "x-gateway-cloud-a-api-version",
    "x-cloud-b-llm-request-type",
    "cloud_c_access_key_id",
    "x-gateway-cloud-c-region",
];
const RESOURCE_PATHS: &[&str] =
    &["/v1/batches", "/v1/assistants", "/v1/assistants/a1", "/v1/threads/t1/messages", "/v1/fine_tuning/jobs"];

/// What a client's request carries before it is routed: gateway headers (under any of their
/// names), a chat body, or a resource's path, query and body; each checked as the gateway
/// checks it (the first byte picks which).
pub fn request(data: &[u8]) {
    use crate::request::{chat, headers::GatewayHeaders, resources};
    let mut input = Input(data);
    match input.byte() % 3 {
        0 => {
            let mut pairs = Vec::new();
            while !input.is_empty() {
                let name = input.choose(HEADER_NAMES);
                pairs.push((name, String::from_utf8_lossy(input.piece()).into_owned()));
            }
            let _ = GatewayHeaders::parse(pairs.iter().map(|(name, value)| (*name, value.as_str())));
        }
        1 => {
            if let Ok(body) = serde_json::from_slice(input.0) {
                let _ = chat::validate_chat_request(&body);
            }
        }
        _ => {
            let path = input.choose(RESOURCE_PATHS);
            let query = String::from_utf8_lossy(input.piece()).into_owned();
            let _ = resources::check_path(path);
            let _ = resources::check_query("POST", path, Some(&query));
            if let (Some(kind), Ok(serde_json::Value::Object(body))) =
                (resources::checked_body("POST", path), serde_json::from_slice(input.0))
            {
                let _ = resources::check_body(kind, &body);
            }
        }
    }
}

/// Client requests whose answers come back translated (or reshaped), by client API.
const ASKED: &[(&str, &str)] = &[
    ("/v1/chat/completions", r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#),
    ("/v1/chat/completions", r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#),
    ("/v1/messages", r#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#),
    ("/v1/messages", r#"{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#),
    ("/v1/responses", r#"{"model":"m","input":"hi"}"#),
    ("/v1/responses", r#"{"model":"m","input":"hi","stream":true}"#),
    ("/v1/embeddings", r#"{"model":"m","input":"hi"}"#),
];

/// The plan an answer to `body` on `path`, sent to the single target `config`, goes back
/// through: made by the pipeline's own steps. `None`: the gateway refuses the pairing.
fn response_plan(settings: &Settings, path: &str, config: &str, body: &[u8]) -> Option<crate::pipeline::ResponsePlan> {
    use crate::pipeline::{self, Started};
    let raw: Vec<(String, Vec<u8>)> = [
        (":method", "POST"),
        (":path", path),
        (":authority", "gateway.local"),
        ("x-gateway-api-key", "gw-key"),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("x-gateway-config", config),
    ]
    .iter()
    .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
    .collect();
    let mut host = FakeHost::new(7);
    let mut nothing = crate::catalog::Nothing;
    let mut catalog = crate::catalog::Catalog::new(settings, &mut nothing);
    let Ok(Started::NeedsBody(pending)) = pipeline::start(settings, &raw, &mut host, &mut catalog) else {
        return None;
    };
    let Ok(Started::Ready(mut call)) = pipeline::finish(settings, pending, body, &mut host, &mut catalog) else {
        return None;
    };
    call.forward(settings, &raw, 0, None, &|| 1_700_000_000_000).ok().map(|forward| forward.response)
}

/// A provider's answer (status and body from the fuzzer) to each client API's request, sent to
/// each provider: finished whole (translated or reshaped) without a panic, and, as a stream,
/// translated to the same events and usage however its chunks are cut.
pub fn translations(data: &[u8]) {
    use crate::exchange::reply::{finish, ResponseMode};
    let mut input = Input(data);
    let (path, body) = input.choose(ASKED);
    // The single-provider configs (the others are strategies over them).
    let config = input.choose(CONFIGS.get(..5).unwrap_or_default());
    let status = input.choose(STATUSES);
    let seed = input.byte();
    let answer = input.0;
    let Ok(settings) = Settings::parse(br#"{"api_keys": ["gw-key"]}"#) else {
        return;
    };
    let plan = || response_plan(&settings, path, config, body.as_bytes());
    let Some(mut whole) = plan() else {
        return;
    };
    let headers = [("content-type".to_string(), b"application/json".to_vec())];
    let mode = if status >= 400 { ResponseMode::Error(status) } else { ResponseMode::Translated };
    let _ = finish(&mut whole, mode, status, &headers, answer.to_vec());
    let streamed = |pieces: &[&[u8]]| {
        let mut plan = plan()?;
        let mut out = Vec::new();
        for piece in pieces {
            plan.translator.stream(piece, &mut out);
        }
        plan.translator.stream_end(&mut out);
        Some((out, plan.translator.usage()))
    };
    assert_eq!(streamed(&[answer]), streamed(&cut(answer, seed)));
}

/// Plugin configurations the exchange runs under.
const SETTINGS: &[&str] = &[
    r#"{"api_keys": ["gw-key"], "cache": {"byte_budget": 1048576, "max_entry_bytes": 65536}}"#,
    r#"{"api_keys": ["gw-key"], "upstream": {"cluster": "outbound|{port}||{host}"}}"#,
    // Keys, saved configs, stored providers, limits and prices read from the control plane:
    // the fuzzer answers those reads too.
    r#"{"control_plane": {"cluster": "cp", "authority": "cp:1", "token": "t"}, "records": {"bodies": true}}"#,
    r#"{"control_plane": {"cluster": "cp", "authority": "cp:1", "token": "t"}, "lookup_gate": true}"#,
];

/// Targets a request names in `x-gateway-config` (or, with the last, its own bytes).
const CONFIGS: &[&str] = &[
    r#"{"provider": "openai", "api_key": "sk", "custom_host": "http://127.0.0.1:9001/v1"}"#,
    r#"{"provider": "anthropic", "api_key": "sk-ant", "custom_host": "http://127.0.0.1:9002/v1"}"#,
    r#"{"provider": "bedrock", "cloud_c_region": "us-east-1", "cloud_c_access_key_id": "AKID", "cloud_c_secret_access_key": "s"}"#,
    r#"{"provider": "azure-openai", "api_key": "k", "custom_host": "http://127.0.0.1:9003", "deployments": [{"deployment_id": "d", "alias": "gpt-4o", "api_version": "2024-10-21", "is_default": true}]}"#,
    r#"{"provider": "google", "api_key": "g", "custom_host": "http://127.0.0.1:9004"}"#,
    r#"{"strategy": {"mode": "fallback"}, "retry": {"attempts": 2}, "cache": {"mode": "simple"}, "targets": [{"provider": "openai", "api_key": "a", "custom_host": "http://127.0.0.1:9001/v1"}, {"provider": "anthropic", "api_key": "b", "custom_host": "http://127.0.0.1:9002/v1"}]}"#,
    r#"{"strategy": {"mode": "loadbalance"}, "targets": [{"provider": "openai", "api_key": "a", "custom_host": "http://127.0.0.1:9001/v1", "weight": 1}, {"provider": "bedrock", "cloud_c_region": "eu-west-3", "cloud_c_access_key_id": "A", "cloud_c_secret_access_key": "s", "weight": 2}]}"#,
];

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/v1/files",
    "/v1/images/generations",
    "/v1/chat/completions?x=1",
    "/v2/nothing",
];

const STATUSES: &[u16] = &[200, 200, 200, 400, 401, 408, 429, 500, 502, 503, 999, 204];
const CONTENT_TYPES: &[&str] =
    &["application/json", "text/event-stream", "application/vnd.amazon.eventstream", "text/plain", ""];
const DETAILS: &[&str] = &[
    "via_upstream",
    "upstream_reset_before_response_started{connection_termination}",
    "upstream_per_try_timeout",
    "upstream_response_timeout",
    "route_not_found",
    "cluster_not_found",
];

#[derive(Default)]
struct Streams {
    request_headers: Vec<(String, Vec<u8>)>,
    request_body: Vec<u8>,
    response_headers: Vec<(String, Vec<u8>)>,
    response_body: Vec<u8>,
    details: String,
}

/// The host of one worker, as the adapter would be: streams by context id, calls by token.
struct FuzzIo {
    host: FakeHost,
    streams: HashMap<u32, Streams>,
    pending: Vec<u32>,
    next_token: u32,
}

impl FuzzIo {
    fn streams(&mut self, id: u32) -> &mut Streams {
        self.streams.entry(id).or_default()
    }
}

impl Io for FuzzIo {
    fn host(&mut self) -> &mut dyn Host {
        &mut self.host
    }
    fn request_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.streams(id).request_headers.clone()
    }
    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        prefix(&self.streams(id).request_body, size)
    }
    fn set_request_headers(&mut self, id: u32, headers: &[(&str, &[u8])]) {
        self.streams(id).request_headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
    }
    fn set_request_header(&mut self, id: u32, name: &str, value: &str) {
        set_header(&mut self.streams(id).request_headers, name, Some(value.as_bytes()));
    }
    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]) {
        replace_prefix(&mut self.streams(id).request_body, size, body);
    }
    fn response_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.streams(id).response_headers.clone()
    }
    fn response_details(&mut self, id: u32) -> String {
        self.streams(id).details.clone()
    }
    fn response_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        prefix(&self.streams(id).response_body, size)
    }
    fn set_response_header(&mut self, id: u32, name: &str, value: Option<&str>) {
        set_header(&mut self.streams(id).response_headers, name, value.map(str::as_bytes));
    }
    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]) {
        replace_prefix(&mut self.streams(id).response_body, size, body);
    }
    fn dispatch(&mut self, _id: u32, _call: &Dispatch) -> Option<u32> {
        self.next_token += 1;
        self.pending.push(self.next_token);
        Some(self.next_token)
    }
    fn tick_every(&mut self, _period_ms: u64) {}
    fn metric(&mut self, _kind: exchange::metrics::Kind, _name: &str, _value: u64) {}
    fn add_to_gauge(&mut self, _name: &str, _delta: i64) {}
    fn access_log(&mut self, _line: &[u8]) {}
    fn publish_header(&mut self, _id: u32, _name: &str, _value: &str) {}
}

/// How many local answers `after` holds.
fn answers(after: &[After]) -> usize {
    after.iter().filter(|a| matches!(a, After::Reply { .. })).count()
}

/// One request through the gateway, driven by the fuzzer's bytes as Envoy would drive it:
/// its headers (an endpoint, a target config), its body in chunks, the provider's answer head
/// and body in chunks, answers to the calls the filter dispatched, ticks, and its end, in the
/// order the bytes say. Asserts no panic and at most one local answer.
pub fn exchange(data: &[u8]) {
    let mut input = Input(data);
    let Ok(settings) = Settings::parse(input.choose(SETTINGS).as_bytes()) else {
        return;
    };
    let mut io = FuzzIo { host: FakeHost::new(7), streams: HashMap::new(), pending: Vec::new(), next_token: 0 };
    exchange::prepare_store(&io.host, &settings);
    let mut worker = Worker::new(Rc::new(settings));
    let id = 1;
    let method = input.choose(&["POST", "POST", "GET", "DELETE"]);
    let path = input.choose(PATHS);
    let config_choice = usize::from(input.byte()) % (CONFIGS.len() + 1);
    let config = CONFIGS.get(config_choice).map_or_else(|| input.piece().to_vec(), |c| c.as_bytes().to_vec());
    let mut headers = vec![
        (":method".to_string(), method.as_bytes().to_vec()),
        (":path".to_string(), path.as_bytes().to_vec()),
        (":authority".to_string(), b"gateway.local".to_vec()),
        ("x-gateway-api-key".to_string(), b"gw-key".to_vec()),
        ("content-type".to_string(), b"application/json".to_vec()),
        ("x-gateway-config".to_string(), config),
    ];
    let extra = input.choose(&[
        "x-gateway-cache-force-refresh",
        "x-gateway-trace-id",
        "x-gateway-metadata",
        "anthropic-version",
        "content-encoding",
    ]);
    headers.push((extra.to_string(), input.piece().to_vec()));
    io.streams(id).request_headers = headers;
    let has_body = method == "POST";
    let mut replies = 0;
    replies += answers(&worker.request_headers(id, !has_body, &mut io).after);
    let mut body_ended = !has_body;
    let mut response_ended = false;
    while !input.is_empty() {
        match input.byte() % 6 {
            0 if !body_ended => {
                let chunk = input.piece().to_vec();
                body_ended = input.byte() % 2 == 0;
                let streams = io.streams(id);
                streams.request_body.extend_from_slice(&chunk);
                let size = streams.request_body.len();
                replies += answers(&worker.request_body(id, size, body_ended, &mut io).after);
            }
            1 => {
                let status = input.choose(STATUSES);
                let content_type = input.choose(CONTENT_TYPES);
                let streams = io.streams(id);
                streams.response_headers = vec![
                    (":status".to_string(), status.to_string().into_bytes()),
                    ("content-type".to_string(), content_type.as_bytes().to_vec()),
                ];
                streams.details = input.choose(DETAILS).to_string();
                response_ended = input.byte() % 4 == 0;
                replies += answers(&worker.response_headers(id, response_ended, &mut io).after);
            }
            2 if !response_ended => {
                let chunk = input.piece().to_vec();
                response_ended = input.byte() % 3 == 0;
                let streams = io.streams(id);
                streams.response_body.extend_from_slice(&chunk);
                let size = streams.response_body.len();
                replies += answers(&worker.response_body(id, size, response_ended, &mut io).after);
            }
            3 if !io.pending.is_empty() => {
                let token = io.pending.remove(usize::from(input.byte()) % io.pending.len());
                let status = input.choose(STATUSES);
                let content_type = input.choose(CONTENT_TYPES);
                let body = input.piece().to_vec();
                let headers = vec![("content-type".to_string(), content_type.as_bytes().to_vec())];
                if worker.awaits(token) {
                    replies +=
                        answers(&worker.call_answered(token, CallAnswer { status, headers, body }, &mut io).after);
                }
            }
            4 => {
                let advance = u64::from(input.byte()) * 250;
                io.host.now_ms.set(io.host.now_ms.get() + advance);
                replies += answers(&worker.tick(&mut io).after);
            }
            _ => {}
        }
        assert!(replies <= 1, "a request answered twice");
    }
    let _ = worker.finished(id, &mut io);
}

/// Each entry point over a few fixed inputs, so a harness that panics on its own is caught by the
/// unit tests too; an input a campaign crashed on is kept here once fixed (fuzz/README.md).
/// What Envoy hands the native module through its ABI, decoded as the module's hooks decode it
/// (`native::calls`): a call's answer (its result, its header array and its body's chunks, the
/// arrays or any entry's buffer null) and a filter config's bytes. The answer is the reference
/// decoding below: a failed call's is empty with status 0; a call's headers in order, names as
/// text (invalid UTF-8 replaced), null buffers empty; the chunks one after the other; the status
/// the first `:status` header's decimal value, 0 when there is none or it is not a `u16`.
#[cfg(feature = "native")]
pub fn native_abi(data: &[u8]) {
    use crate::native::calls::ffi::{EnvoyBuffer, EnvoyHeader, CALLOUT_SUCCEEDED};
    use crate::native::calls::{callout_answer, hook_bytes};

    /// A buffer of the fuzzer's bytes, or null (with the same length) when `null`.
    fn pointer(bytes: &[u8], null: bool) -> *const u8 {
        if null {
            std::ptr::null()
        } else {
            bytes.as_ptr()
        }
    }
    fn reference_status(headers: &[(String, Vec<u8>)]) -> u16 {
        let Some((_, value)) = headers.iter().find(|(name, _)| name == ":status") else {
            return 0;
        };
        let digits = value.strip_prefix(b"+").unwrap_or(value);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return 0;
        }
        digits.iter().try_fold(0u16, |n, d| n.checked_mul(10)?.checked_add(u16::from(d - b'0'))).unwrap_or(0)
    }

    let mut input = Input(data);
    let result = match input.byte() {
        0..=223 => CALLOUT_SUCCEEDED,
        other => u32::from(other),
    };
    let nulls = input.byte();
    let (headers_null, chunks_null, config_null) = (nulls & 1 != 0, nulls & 2 != 0, nulls & 4 != 0);
    let mut headers = Vec::new();
    let mut expected_headers = Vec::new();
    for _ in 0..input.byte() % 16 {
        let nulls = input.byte();
        let size = usize::from(input.byte());
        let name = input.take(size);
        let size = usize::from(input.byte());
        let value = input.take(size);
        let (name_null, value_null) = (nulls & 1 != 0, nulls & 2 != 0);
        headers.push(EnvoyHeader {
            key_ptr: pointer(name, name_null),
            key_length: name.len(),
            value_ptr: pointer(value, value_null),
            value_length: value.len(),
        });
        let name = if name_null { "".into() } else { String::from_utf8_lossy(name) };
        expected_headers.push((name.into_owned(), if value_null { Vec::new() } else { value.to_vec() }));
    }
    let mut chunks = Vec::new();
    let mut expected_body = Vec::new();
    for _ in 0..input.byte() % 8 {
        let null = input.byte() % 4 == 0;
        let chunk = input.piece();
        chunks.push(EnvoyBuffer { ptr: pointer(chunk, null), length: chunk.len() });
        if !null {
            expected_body.extend_from_slice(chunk);
        }
    }
    let answer = callout_answer(
        result,
        if headers_null { std::ptr::null() } else { headers.as_ptr() },
        headers.len(),
        if chunks_null { std::ptr::null() } else { chunks.as_ptr() },
        chunks.len(),
    );
    if result != CALLOUT_SUCCEEDED || headers_null {
        expected_headers.clear();
    }
    if result != CALLOUT_SUCCEEDED || chunks_null {
        expected_body.clear();
    }
    let expected_status = reference_status(&expected_headers);
    assert_eq!((answer.status, answer.headers, answer.body), (expected_status, expected_headers, expected_body));

    let config = input.0;
    let bytes = hook_bytes(EnvoyBuffer { ptr: pointer(config, config_null), length: config.len() });
    assert_eq!(bytes, if config_null { &[][..] } else { config });
    let _ = Settings::parse(&bytes);
}

#[cfg(test)]
mod tests {
    use crate::unit_tests::test;

    /// A chat to OpenAI (settings 0, POST, the first path and config) whose body arrives whole,
    /// then a 200 JSON answer: the exchange's input format.
    fn openai_chat() -> Vec<u8> {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let answer = br#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[]}"#;
        let mut input = vec![0, 0, 0, 0, 0, 0, 0];
        input.push(0);
        input.extend((body.len() as u16).to_le_bytes());
        input.extend(body);
        input.extend([0, 1, 0, 0, 0, 1, 2]);
        input.extend((answer.len() as u16).to_le_bytes());
        input.extend(answer);
        input.push(0);
        input
    }

    /// The translations target reaches every provider's translator: a chat request makes a
    /// plan for each of them (a target whose every pairing were refused would test nothing).
    #[test]
    fn a_chat_makes_a_response_plan_for_every_provider() {
        let settings = crate::settings::Settings::parse(br#"{"api_keys": ["gw-key"]}"#).unwrap();
        let (path, body) = super::ASKED[1];
        for config in &super::CONFIGS[..5] {
            let plan = super::response_plan(&settings, path, config, body.as_bytes());
            assert!(plan.is_some_and(|p| p.translator.translates_responses() || config.contains("openai")), "{config}");
        }
    }

    /// What campaigns found (fuzz/regressions/<target>/, fuzz/README.md), fixed.
    #[test]
    fn campaign_findings_stay_fixed() {
        // A Bedrock stream whose exception event is followed, in the same chunk, by a broken
        // frame: a second error event when the chunk came whole, none when cut.
        super::translations(include_bytes!("../fuzz/regressions/translations/bedrock-frame-broken-after-an-exception"));
    }

    #[test]
    fn every_entry_point_takes_these_inputs() {
        let inputs = [Vec::new(), vec![0; 64], vec![0xff; 64], openai_chat()];
        for input in &inputs {
            super::plugin_settings(input);
            super::sse(input);
            super::mcp(input);
            super::event_stream(input);
            super::query(input);
            super::prompt(input);
            super::jwt(input);
            super::stored_items(input);
            super::translations(input);
            super::request(input);
            super::exchange(input);
            #[cfg(feature = "native")]
            super::native_abi(input);
        }
    }
}
