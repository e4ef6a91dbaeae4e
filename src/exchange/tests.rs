//! The exchange as a client and a provider see it: a `FakeIo` plays Envoy (the streams of
//! each request, dispatched calls, the root's timer) over a `FakeHost` (clock, randomness,
//! shared store), and each test tells one request's story event by event.

use super::*;
use crate::ports::testing::{prefix, replace_prefix, FakeHost};
use crate::request::headers::set as set_header;
use crate::settings::CLUSTER_HEADER;
use crate::unit_tests::test;
use serde_json::{json, Value};
use std::collections::HashMap as StdHashMap;

mod allocations;
mod batches;
mod control_plane;
mod guardrails;
mod limits;
mod records;

// ---------------------------------------------------------------------------------------------
// The fake host

/// One request's streams as Envoy holds them.
#[derive(Default)]
struct Streams {
    request_headers: RawHeaders,
    request_body: Vec<u8>,
    response_headers: RawHeaders,
    /// The response body Envoy holds for the filter (chunks accumulate while it pauses).
    response_body: Vec<u8>,
    details: String,
    /// What went on to the client of the routed response's body.
    client_body: Vec<u8>,
}

/// A write to a request's streams, in the order the exchange made it.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    RequestHeaders(u32, RawHeaders),
    RequestHeader(u32, String, String),
    RequestBody(u32, usize, Vec<u8>),
    ResponseHeader(u32, String, Option<String>),
    ResponseBody(u32, usize, Vec<u8>),
}

/// A call the exchange dispatched: for which request, its token, what it was.
#[derive(Debug, Clone)]
struct Sent {
    id: u32,
    token: u32,
    call: Dispatch,
}

impl Sent {
    fn header(&self, name: &str) -> Option<&str> {
        self.call.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

struct FakeIo {
    host: FakeHost,
    streams: StdHashMap<u32, Streams>,
    writes: Vec<Write>,
    sent: Vec<Sent>,
    next_token: u32,
    /// Every dispatch fails (e.g. the recovery cluster is missing).
    dispatch_fails: bool,
    ticks: Vec<u64>,
    /// Every metric update, in order.
    metrics: Vec<(metrics::Kind, String, u64)>,
    /// Each gauge's value: the sum of its changes.
    gauges: StdHashMap<String, i64>,
    /// Every access-log line published, in order.
    access_lines: Vec<Vec<u8>>,
    /// The gateway headers published for Envoy's own replies, by request.
    published: StdHashMap<u32, StdHashMap<String, String>>,
    /// How often the exchange asked for a request's response headers.
    head_reads: StdHashMap<u32, u32>,
}

impl FakeIo {
    fn new() -> FakeIo {
        FakeIo {
            host: FakeHost::new(7),
            streams: StdHashMap::new(),
            writes: Vec::new(),
            sent: Vec::new(),
            next_token: 1,
            dispatch_fails: false,
            ticks: Vec::new(),
            metrics: Vec::new(),
            gauges: StdHashMap::new(),
            access_lines: Vec::new(),
            published: StdHashMap::new(),
            head_reads: StdHashMap::new(),
        }
    }

    fn streams(&mut self, id: u32) -> &mut Streams {
        self.streams.entry(id).or_default()
    }

    fn writes_of(&self, id: u32) -> Vec<&Write> {
        self.writes
            .iter()
            .filter(|w| match w {
                Write::RequestHeaders(i, _)
                | Write::RequestHeader(i, ..)
                | Write::RequestBody(i, ..)
                | Write::ResponseHeader(i, ..)
                | Write::ResponseBody(i, ..) => *i == id,
            })
            .collect()
    }
}

impl Io for FakeIo {
    fn host(&mut self) -> &mut dyn Host {
        &mut self.host
    }

    fn request_headers(&mut self, id: u32) -> RawHeaders {
        self.streams(id).request_headers.clone()
    }

    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        prefix(&self.streams(id).request_body, size)
    }

    fn set_request_headers(&mut self, id: u32, headers: &[(&str, &[u8])]) {
        let headers: Vec<(String, Vec<u8>)> = headers.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
        self.streams(id).request_headers = headers.clone();
        self.writes.push(Write::RequestHeaders(id, headers));
    }

    fn set_request_header(&mut self, id: u32, name: &str, value: &str) {
        set_header(&mut self.streams(id).request_headers, name, Some(value.as_bytes()));
        self.writes.push(Write::RequestHeader(id, name.into(), value.into()));
    }

    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]) {
        replace_prefix(&mut self.streams(id).request_body, size, body);
        self.writes.push(Write::RequestBody(id, size, body.to_vec()));
    }

    fn response_headers(&mut self, id: u32) -> RawHeaders {
        *self.head_reads.entry(id).or_default() += 1;
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
        self.writes.push(Write::ResponseHeader(id, name.into(), value.map(Into::into)));
    }

    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]) {
        replace_prefix(&mut self.streams(id).response_body, size, body);
        self.writes.push(Write::ResponseBody(id, size, body.to_vec()));
    }

    fn dispatch(&mut self, id: u32, call: &Dispatch) -> Option<u32> {
        if self.dispatch_fails {
            return None;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.sent.push(Sent { id, token, call: call.clone() });
        Some(token)
    }

    fn tick_every(&mut self, period_ms: u64) {
        self.ticks.push(period_ms);
    }

    fn metric(&mut self, kind: metrics::Kind, name: &str, value: u64) {
        self.metrics.push((kind, name.to_string(), value));
    }

    fn add_to_gauge(&mut self, name: &str, delta: i64) {
        *self.gauges.entry(name.to_string()).or_default() += delta;
    }

    fn access_log(&mut self, line: &[u8]) {
        self.access_lines.push(line.to_vec());
    }

    fn publish_header(&mut self, id: u32, name: &str, value: &str) {
        self.published.entry(id).or_default().insert(name.to_string(), value.to_string());
    }
}

// ---------------------------------------------------------------------------------------------
// The gateway, driven as Envoy drives it

const SETTINGS: &str =
    r#"{"api_keys": ["gw-key", "gw-other"], "cache": {"byte_budget": 1048576, "max_entry_bytes": 65536}}"#;

const SEMANTIC_SETTINGS: &str = r#"{"api_keys": ["gw-key"], "cache": {"byte_budget": 1048576,
    "max_entry_bytes": 65536, "semantic": {"base_url": "http://127.0.0.1:9100/v1", "api_key": "sk-emb",
    "model": "embed-small", "threshold": 0.9}}}"#;

struct Gateway {
    worker: Worker,
    io: FakeIo,
    /// The records an idle worker handed over, as the native host's relay keeps them.
    idle_copies: super::IdleCopies,
    control_plane: Option<crate::settings::ControlPlaneSettings>,
}

impl Gateway {
    /// A worker whose Envoy passes request bodies on (it delivered one already, so no request
    /// is probed for a withheld body; see `worker::BODY_WAIT_MS`).
    fn new(settings: &str) -> Gateway {
        let mut gw = Gateway::withholding_bodies(settings);
        gw.worker.request_body(0, 0, true, &mut gw.io);
        gw.io.ticks.clear();
        gw
    }

    /// A worker that has not been given a request body yet.
    fn withholding_bodies(settings: &str) -> Gateway {
        let settings = Settings::parse(settings.as_bytes()).unwrap();
        let io = FakeIo::new();
        prepare_store(&io.host, &settings);
        // The stories' workspaces have no limits and no prices of their own, read long ago and
        // fresh for ever (the limits' own stories read theirs).
        let empty = Some(Rc::new(json!({"limits": [], "prices": {}})));
        for workspace in ["default", "team", "team-a", "team-b"] {
            let r = crate::catalog::Ref {
                kind: crate::catalog::Kind::Policy,
                workspace: workspace.into(),
                id: "policy".into(),
            };
            crate::catalog::remember(&io.host, &r, &empty, 0, u64::MAX / 2, u64::MAX / 2);
        }
        let control_plane = settings.control_plane.clone();
        Gateway { worker: Worker::new(Rc::new(settings)), io, idle_copies: Default::default(), control_plane }
    }

    /// The calls the native host makes for a worker whose last request ended at `now_ms` (see
    /// `Worker::idle_calls`), if no request comes first: its leases' report, then copies of
    /// every record it handed over and that may not be stored.
    fn idle_calls(&mut self, now_ms: u64) -> Vec<Dispatch> {
        let (Some(calls), Some(cp)) = (self.worker.idle_calls(now_ms), &self.control_plane) else {
            return Vec::new();
        };
        self.idle_copies.take_over(calls.records);
        calls.leases.into_iter().chain(self.idle_copies.calls(cp)).collect()
    }

    /// The calls `idle_calls` made went (`stored`: every one was answered).
    fn idle_sent(&mut self, now_ms: u64, stored: bool) {
        if stored {
            self.idle_copies.stored();
        }
        self.worker.idle_sent(now_ms, stored);
    }

    /// The client's request headers arrive (a body follows unless `body` is false).
    fn request_headers(&mut self, id: u32, headers: RawHeaders, body: bool) -> Output {
        self.io.streams(id).request_headers = headers;
        self.worker.request_headers(id, !body, &mut self.io)
    }

    /// The client's whole request body arrives (in one last chunk).
    fn request_body(&mut self, id: u32, body: &[u8]) -> Output {
        self.io.streams(id).request_body.extend_from_slice(body);
        let size = self.io.streams(id).request_body.len();
        self.worker.request_body(id, size, true, &mut self.io)
    }

    /// Headers, body and end of a request with a JSON body.
    fn post(&mut self, id: u32, headers: RawHeaders, body: &[u8]) -> Output {
        assert_eq!(self.request_headers(id, headers, true).action, Action::Pause, "held until the body is in");
        self.request_body(id, body)
    }

    /// The provider's (or Envoy's own) response headers reach the filter; a body follows.
    fn response_headers(&mut self, id: u32, status: u16, headers: &[(&str, &str)], details: &str) -> Output {
        self.response_head(id, status, headers, details, false)
    }

    /// Response headers that end the answer (no body follows).
    fn response_headers_end(&mut self, id: u32, status: u16, headers: &[(&str, &str)], details: &str) -> Output {
        self.response_head(id, status, headers, details, true)
    }

    fn response_head(&mut self, id: u32, status: u16, headers: &[(&str, &str)], details: &str, end: bool) -> Output {
        let streams = self.io.streams(id);
        streams.response_headers = vec![(":status".to_string(), status.to_string().into_bytes())];
        streams.response_headers.extend(headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())));
        streams.details = details.to_string();
        self.worker.response_headers(id, end, &mut self.io)
    }

    /// A chunk of the response body; what the filter lets through goes on to the client.
    fn response_body(&mut self, id: u32, chunk: &[u8], end: bool) -> Output {
        self.io.streams(id).response_body.extend_from_slice(chunk);
        let size = self.io.streams(id).response_body.len();
        let output = self.worker.response_body(id, size, end, &mut self.io);
        if output.action == Action::Continue {
            let streams = self.io.streams(id);
            let passed = std::mem::take(&mut streams.response_body);
            streams.client_body.extend(passed);
        }
        output
    }

    /// The response header the client gets.
    fn client_header(&mut self, id: u32, name: &str) -> Option<String> {
        headers::find(&self.io.streams(id).response_headers, name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    fn client_body(&mut self, id: u32) -> Vec<u8> {
        self.io.streams(id).client_body.clone()
    }

    /// The upstream request header as Envoy's router gets it.
    fn upstream_header(&mut self, id: u32, name: &str) -> Option<String> {
        headers::find(&self.io.streams(id).request_headers, name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Dispatched call `token` answers.
    fn answer(&mut self, token: u32, status: u16, headers: &[(&str, &str)], body: &[u8]) -> Output {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
        self.worker.call_answered(token, CallAnswer { status, headers, body: body.to_vec() }, &mut self.io)
    }

    fn tick(&mut self) -> Output {
        self.worker.tick(&mut self.io)
    }

    fn advance_clock(&mut self, ms: u64) {
        self.io.host.now_ms.set(self.io.host.now_ms.get() + ms);
    }

    /// Request `id` ends (Envoy's `on_log`): its record; its metrics go to `io.metrics`.
    fn finished(&mut self, id: u32) -> Option<Record> {
        self.worker.finished(id, &mut self.io)
    }

    /// The metrics sent so far, as `name value` (counters and histogram values alike).
    fn metrics(&self) -> Vec<String> {
        self.io.metrics.iter().map(|(_, name, value)| format!("{name} {value}")).collect()
    }
}

fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> RawHeaders {
    let mut headers =
        vec![(":method".to_string(), method.as_bytes().to_vec()), (":path".to_string(), path.as_bytes().to_vec())];
    headers.push((":authority".to_string(), b"gateway.local".to_vec()));
    headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())));
    headers
}

/// A chat request to the gateway with `config` in `x-gateway-config`.
fn chat_with_config(key: &str, config: &Value) -> RawHeaders {
    let config = config.to_string();
    request(
        "POST",
        "/v1/chat/completions",
        &[("x-gateway-api-key", key), ("x-gateway-config", &config), ("content-type", "application/json")],
    )
}

const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

const COMPLETION: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}]}"#;

fn openai(key: &str, port: u16) -> Value {
    json!({"provider": "openai", "api_key": key, "custom_host": format!("http://127.0.0.1:{port}/v1")})
}

fn fallback(targets: Vec<Value>) -> Value {
    json!({"strategy": {"mode": "fallback"}, "targets": targets})
}

/// The one local answer of an output.
fn reply(output: &Output) -> (u32, u16, StdHashMap<String, String>, Value) {
    match output.after.as_slice() {
        [After::Reply { id, status, headers, body }] => {
            let headers = headers.iter().cloned().collect();
            let body =
                serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()));
            (*id, *status, headers, body)
        }
        other => panic!("expected one reply, got {other:?}"),
    }
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

// ---------------------------------------------------------------------------------------------
// 1. Health and authentication

#[test]
fn health_answers_without_a_key() {
    let mut gw = Gateway::new(SETTINGS);
    let out = gw.request_headers(1, request("GET", "/health", &[]), false);
    assert_eq!(out.action, Action::Pause);
    let (id, status, headers, body) = reply(&out);
    assert_eq!((id, status), (1, 200));
    assert_eq!(body, json!({"status": "ok"}));
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.contains_key(TRACE_HEADER));
    assert!(gw.io.writes.is_empty(), "nothing goes upstream");
    assert_eq!(gw.finished(1).unwrap().status, 200);
}

#[test]
fn a_request_without_a_trace_id_gets_a_uuid_v7_that_follows_time_not_envoys_request_id() {
    let mut gw = Gateway::new(SETTINGS);
    gw.io.host.now_ms.set(0x0192_3456_789a);
    gw.io.host.random = 0x0123_4567_89ab_cdef;
    let headers = request("POST", "/v1/chat/completions", &[("x-request-id", "envoy-random-id")]);
    let (_, status, headers, _) = reply(&gw.request_headers(1, headers, true));
    assert_eq!(status, 401);
    // The time's 48 bits, version 7, 12 random bits, variant 10, 62 random bits.
    assert_eq!(headers[TRACE_HEADER], "01923456-789a-7def-9abc-456789abcdef");
    assert_eq!(gw.finished(1).unwrap().trace_id, "01923456-789a-7def-9abc-456789abcdef");
    // A later request's id sorts after it.
    gw.io.host.now_ms.set(0x0192_3456_789b);
    let (_, _, later, _) = reply(&gw.request_headers(2, request("GET", "/health", &[]), true));
    assert!(later[TRACE_HEADER].as_str() > "01923456-789a-7def-9abc-456789abcdef", "{}", later[TRACE_HEADER]);
}

#[test]
fn a_request_without_a_gateway_key_is_refused_in_openai_shape() {
    let mut gw = Gateway::new(SETTINGS);
    let headers = request("POST", "/v1/chat/completions", &[("x-gateway-trace-id", "trace-401")]);
    let out = gw.request_headers(1, headers, true);
    assert_eq!(out.action, Action::Pause);
    let (_, status, headers, body) = reply(&out);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["type"], "authentication_error");
    assert_eq!(body["error"]["code"], "missing_api_key");
    assert!(body["error"]["message"].as_str().unwrap().contains("x-gateway-api-key"));
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(headers[TRACE_HEADER], "trace-401");
    assert!(gw.io.writes.is_empty());
    // The body that follows is not looked at; the response passes as the gateway made it.
    assert_eq!(gw.request_body(1, CHAT), Output::proceed());
    let record = gw.finished(1).unwrap();
    assert_eq!((record.status, record.trace_id.as_str()), (401, "trace-401"));
}

#[test]
fn a_held_request_ending_in_trailers_is_refused() {
    let mut gw = Gateway::new(SETTINGS);
    // A client that names a cluster itself gets it overwritten while the request is held.
    let headers = request(
        "POST",
        "/v1/chat/completions",
        &[("x-gateway-api-key", "gw-key"), ("x-gateway-provider", "openai"), (CLUSTER_HEADER, "gateway_recovery")],
    );
    assert_eq!(gw.request_headers(1, headers, true).action, Action::Pause);
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some(UNROUTED));
    gw.io.streams(1).request_body.extend_from_slice(CHAT);
    assert_eq!(gw.worker.request_body(1, CHAT.len(), false, &mut gw.io).action, Action::Pause);
    let out = gw.worker.request_trailers(1, &mut gw.io);
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("body")));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some(UNROUTED), "never routed");
}

// ---------------------------------------------------------------------------------------------
// 2. The happy path: an OpenAI-compatible provider on a custom host

#[test]
fn openai_compatible_chat_goes_upstream_and_back_untouched() {
    let mut gw = Gateway::new(SETTINGS);
    let mut headers = openai_chat();
    headers.push(("x-gateway-trace-id".to_string(), b"story-1".to_vec()));
    // Held until the body is in, and meanwhile routed nowhere: no cluster header, no write.
    assert_eq!(gw.request_headers(1, headers, true).action, Action::Pause);
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER), None);
    assert!(gw.io.writes.is_empty(), "{:?}", gw.io.writes);
    assert_eq!(gw.request_body(1, CHAT), Output::proceed());

    // One replacement of the whole header map, no body rewrite.
    let upstream_writes: Vec<_> =
        gw.io.writes.iter().filter(|w| matches!(w, Write::RequestHeaders(..) | Write::RequestBody(..))).collect();
    assert_eq!(upstream_writes.len(), 1, "{upstream_writes:?}");
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_upstream_plain"));
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/v1/chat/completions"));
    assert_eq!(gw.upstream_header(1, "authorization").as_deref(), Some("Bearer sk-local"));
    for private in ["x-gateway-api-key", "x-gateway-provider", "x-gateway-custom-host"] {
        assert_eq!(gw.upstream_header(1, private), None, "{private} stays in the gateway");
    }
    assert_eq!(gw.io.streams(1).request_body, CHAT);

    // The provider answers; the client sees the gateway's headers and the provider's bytes.
    let length = COMPLETION.len().to_string();
    let out = gw.response_headers(
        1,
        200,
        &[("content-type", "application/json"), ("content-length", &length)],
        "via_upstream",
    );
    assert_eq!(out, Output::proceed());
    assert_eq!(gw.client_header(1, TRACE_HEADER).as_deref(), Some("story-1"));
    assert_eq!(gw.client_header(1, PROVIDER_HEADER).as_deref(), Some("openai"));
    assert_eq!(gw.client_header(1, RETRIES_HEADER), None, "no config that could retry");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("DISABLED"), "a cached endpoint, no cache config");
    let (first, second) = COMPLETION.split_at(40);
    assert_eq!(gw.response_body(1, first, false), Output::proceed());
    assert_eq!(gw.response_body(1, second, true), Output::proceed());
    assert_eq!(gw.client_body(1), COMPLETION);
    assert!(!gw.io.writes.iter().any(|w| matches!(w, Write::ResponseBody(..))), "the body passes untouched");

    let record = gw.finished(1).unwrap();
    assert_eq!((record.provider, record.status, record.path.as_str()), ("openai", 200, "/v1/chat/completions"));
    assert!(gw.io.sent.is_empty() && gw.io.ticks.is_empty());
}

// ---------------------------------------------------------------------------------------------
// 3. Anthropic: translated both ways

/// A chat request to an OpenAI-compatible provider on a custom host, with a gateway key.
fn openai_chat() -> RawHeaders {
    request(
        "POST",
        "/v1/chat/completions",
        &[
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-local"),
            ("content-type", "application/json"),
        ],
    )
}

fn anthropic_chat() -> RawHeaders {
    request(
        "POST",
        "/v1/chat/completions",
        &[
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-provider", "anthropic"),
            ("authorization", "Bearer sk-ant"),
            ("content-type", "application/json"),
        ],
    )
}

const ANTHROPIC_MESSAGE: &[u8] = br#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hello from Claude"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":4}}"#;

#[test]
fn a_routed_answer_reads_its_head_from_the_host_once() {
    let mut gw = Gateway::new(SETTINGS);
    // Passing untouched (its usage read as it flows), translated whole, translated as a stream.
    gw.post(1, openai_chat(), CHAT);
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    gw.response_body(1, COMPLETION, true);
    let body = br#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(2, anthropic_chat(), body);
    gw.response_headers(2, 200, &[("content-type", "application/json")], "via_upstream");
    gw.response_body(2, ANTHROPIC_MESSAGE, true);
    let stream = br#"{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(3, anthropic_chat(), stream);
    gw.response_headers(3, 200, &[("content-type", "text/event-stream; charset=utf-8")], "via_upstream");
    gw.response_body(3, b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true);

    assert_eq!(gw.client_body(1), COMPLETION);
    assert_eq!(json_of(&gw.client_body(2))["object"], "chat.completion");
    assert_eq!(gw.client_header(3, "content-type").as_deref(), Some("text/event-stream; charset=utf-8"));
    for id in 1..=3 {
        assert_eq!(gw.io.head_reads.get(&id), Some(&1), "request {id}");
    }
}

#[test]
fn anthropic_requests_and_answers_are_translated() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}"#;
    assert_eq!(gw.post(1, anthropic_chat(), body), Output::proceed());

    // The body is rewritten into Anthropic's shape and the headers say so.
    let rewritten = gw.io.writes.iter().find_map(|w| match w {
        Write::RequestBody(1, size, bytes) => Some((*size, bytes.clone())),
        _ => None,
    });
    let (size, bytes) = rewritten.expect("the request body is rewritten");
    assert_eq!(size, body.len());
    let sent = json_of(&bytes);
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/v1/messages"));
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("api.anthropic.com:443"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_upstream_tls"));
    assert_eq!(gw.upstream_header(1, "x-api-key").as_deref(), Some("sk-ant"));
    assert_eq!(gw.upstream_header(1, "authorization"), None);
    assert_eq!(gw.upstream_header(1, "content-length"), Some(bytes.len().to_string()));

    // The 2xx answer is held whole, then replaced by an OpenAI chat completion.
    let headers = [("content-type", "application/json"), ("content-length", "999")];
    assert_eq!(gw.response_headers(1, 200, &headers, "via_upstream").action, Action::Pause);
    let (first, second) = ANTHROPIC_MESSAGE.split_at(50);
    assert_eq!(gw.response_body(1, first, false).action, Action::Pause);
    assert_eq!(gw.response_body(1, second, true), Output::proceed());
    let client_body = gw.client_body(1);
    let completion = json_of(&client_body);
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["choices"][0]["message"]["content"], "Hello from Claude");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert_eq!(gw.client_header(1, "content-length"), Some(client_body.len().to_string()));
    assert_eq!(gw.client_header(1, "content-type").as_deref(), Some("application/json"));
    assert_eq!(gw.client_header(1, PROVIDER_HEADER).as_deref(), Some("anthropic"));
    assert_eq!(gw.finished(1).unwrap().status, 200);
}

#[test]
fn an_anthropic_error_keeps_its_status_in_openai_shape() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(gw.post(1, anthropic_chat(), body), Output::proceed());
    let error = br#"{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"}}"#;
    let out = gw.response_headers(1, 429, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(out.action, Action::Pause);
    assert_eq!(gw.response_body(1, error, true), Output::proceed());
    assert_eq!(
        json_of(&gw.client_body(1)),
        json!({"error": {"message": "Slow down", "type": "rate_limit_error", "param": null, "code": null}})
    );
    assert_eq!(gw.client_header(1, ":status").as_deref(), Some("429"));
    assert_eq!(gw.client_header(1, "content-length"), Some(gw.client_body(1).len().to_string()));
    assert!(gw.io.sent.is_empty(), "no config that recovers: no further call");
    assert_eq!(gw.finished(1).unwrap().status, 429);
}

const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",",
    "\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi there\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

#[test]
fn an_anthropic_stream_is_translated_chunk_by_chunk() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(gw.post(1, anthropic_chat(), body), Output::proceed());
    let headers = [("content-type", "text/event-stream"), ("content-length", "4000")];
    assert_eq!(gw.response_headers(1, 200, &headers, "via_upstream"), Output::proceed());
    assert_eq!(gw.client_header(1, "content-length"), None, "Envoy frames the translated stream");
    // Chunks cut in the middle of events: each passes at once, translated as far as complete.
    let (first, second) = ANTHROPIC_STREAM.as_bytes().split_at(150);
    assert_eq!(gw.response_body(1, first, false), Output::proceed());
    assert_eq!(gw.response_body(1, second, true), Output::proceed());
    let sse = String::from_utf8(gw.client_body(1)).unwrap();
    let chunks: Vec<Value> = sse
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"), "{sse}");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "Hi there");
    assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    let usage = gw.finished(1).unwrap().usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 2));

    // Cut before its end (the client left): the record has the usage reported so far.
    gw.post(2, anthropic_chat(), body);
    gw.response_headers(2, 200, &headers, "via_upstream");
    let cut = ANTHROPIC_STREAM.find("event: message_delta").unwrap();
    gw.response_body(2, &ANTHROPIC_STREAM.as_bytes()[..cut], false);
    let usage = gw.finished(2).unwrap().usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 1));
}

/// A Bedrock stream is AWS's binary event stream: it is translated as it comes like an SSE
/// stream, and the client gets server-sent events with their content type.
#[test]
fn a_bedrock_event_stream_reaches_the_client_as_server_sent_events() {
    use crate::providers::bedrock::eventstream::event_frame;
    let mut gw = Gateway::new(SETTINGS);
    let config = json!({"provider": "bedrock", "cloud_c_region": "us-east-1",
        "cloud_c_access_key_id": "AKIDEXAMPLE", "cloud_c_secret_access_key": "secret"});
    let body = br#"{"model":"amazon.nova-lite-v1:0","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(gw.post(1, chat_with_config("gw-key", &config), body), Output::proceed());
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/model/amazon.nova-lite-v1%3A0/converse-stream"));
    assert!(gw.upstream_header(1, "authorization").is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 ")));
    let headers = [("content-type", "application/vnd.amazon.eventstream")];
    assert_eq!(gw.response_headers(1, 200, &headers, "via_upstream"), Output::proceed());
    assert_eq!(gw.client_header(1, "content-type").as_deref(), Some("text/event-stream"));
    let frames = [
        event_frame("messageStart", r#"{"role":"assistant"}"#),
        event_frame("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"Hi there"}}"#),
        event_frame("messageStop", r#"{"stopReason":"end_turn"}"#),
        event_frame("metadata", r#"{"usage":{"inputTokens":3,"outputTokens":2}}"#),
    ]
    .concat();
    let (first, second) = frames.split_at(40);
    assert_eq!(gw.response_body(1, first, false), Output::proceed());
    assert_eq!(gw.response_body(1, second, true), Output::proceed());
    let sse = String::from_utf8(gw.client_body(1)).unwrap();
    assert!(sse.contains(r#""content":"Hi there""#) && sse.ends_with("data: [DONE]\n\n"), "{sse}");

    // The same stream as the answer of a recovery call arrives whole: translated the same way.
    let bedrock = json!({"provider": "bedrock", "custom_host": "http://127.0.0.1:9002",
        "cloud_c_access_key_id": "AKIDEXAMPLE", "cloud_c_secret_access_key": "secret"});
    let config = fallback(vec![openai("sk-first", 9001), bedrock]);
    gw.post(2, chat_with_config("gw-key", &config), body);
    gw.response_headers(2, 500, &[("content-type", "application/json")], "via_upstream");
    let token = gw.io.sent.last().map(|call| call.token).unwrap();
    let out = gw.answer(token, 200, &[("content-type", "application/vnd.amazon.eventstream")], &frames);
    let (_, status, headers, body) = reply(&out);
    assert_eq!((status, headers["content-type"].as_str()), (200, "text/event-stream"));
    let sse = body.as_str().unwrap_or_default();
    assert!(sse.contains(r#""content":"Hi there""#) && sse.ends_with("data: [DONE]\n\n"), "{sse}");
}

// ---------------------------------------------------------------------------------------------
// 4. Recovery: fallback after a failed first attempt

#[test]
fn in_a_hosts_clusters_the_route_header_names_each_hosts_cluster_and_calls_go_straight_to_it() {
    let settings =
        r#"{"api_keys": ["gw-key"], "upstream": {"cluster": "outbound|{port}||{host}", "route_header": "x-route"}}"#;
    let mut gw = Gateway::new(settings);
    let mut first = openai("sk-first", 9001);
    first["request_timeout"] = json!(2500);
    let mut second = openai("sk-second", 9002);
    second["request_timeout"] = json!(4000);
    assert_eq!(gw.post(1, chat_with_config("gw-key", &fallback(vec![first, second])), CHAT), Output::proceed());
    assert_eq!(gw.upstream_header(1, "x-route").as_deref(), Some("outbound|9001||127.0.0.1"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER), None, "the forward proxy's header is not set");
    gw.response_headers(1, 500, &[("content-type", "application/json")], "via_upstream");
    let [call] = gw.io.sent.as_slice() else { panic!("one call: {:?}", gw.io.sent) };
    assert_eq!(call.call.cluster, "outbound|9002||127.0.0.1");
    assert_eq!(call.call.timeout_ms, 4000, "the attempt's timeout bounds the call");
    assert_eq!(call.header(":authority"), Some("127.0.0.1:9002"));
    assert_eq!((call.header("x-route"), call.header(CLUSTER_HEADER)), (None, None));
    assert!(call.call.headers.iter().all(|(name, _)| !name.starts_with("x-envoy-")), "{:?}", call.call.headers);
    // A host the host Envoy has no route or cluster for is a 502 that names both.
    let mut gw = Gateway::new(settings);
    gw.post(2, chat_with_config("gw-key", &openai("sk-first", 9001)), CHAT);
    let out = gw.response_headers(2, 404, &[], "route_not_found");
    let (_, status, _, body) = reply(&out);
    assert_eq!(status, 502);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("outbound|9001||127.0.0.1") && message.contains("host 127.0.0.1"), "{message}");
    // Reached as a later attempt (the host has no such cluster: the call cannot start), the same
    // 502 naming it, not the first target's 500.
    let mut gw = Gateway::new(settings);
    gw.io.dispatch_fails = true;
    gw.post(3, chat_with_config("gw-key", &fallback(vec![openai("sk-first", 9001), openai("sk-second", 9002)])), CHAT);
    let (_, status, _, body) = reply(&gw.response_headers(3, 500, &[], "via_upstream"));
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("upstream_unreachable")));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("outbound|9002||127.0.0.1") && message.contains("host 127.0.0.1"), "{message}");
}

#[test]
fn a_failed_first_target_falls_back_to_the_second_as_a_dispatched_call() {
    let mut gw = Gateway::new(SETTINGS);
    let mut first = openai("sk-first", 9001);
    first["cb_config"] = json!({"failure_threshold": 1, "cooldown_interval": 60000});
    let config = fallback(vec![first, openai("sk-second", 9002)]);
    assert_eq!(gw.post(1, chat_with_config("gw-key", &config), CHAT), Output::proceed());
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:9001"));

    // The first target fails: its response is held, the second is called.
    let out = gw.response_headers(1, 500, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(out, Output { action: Action::Pause, after: vec![] });
    assert_eq!(
        gw.metrics(),
        ["gen_ai_gateway_circuits_opened_total 1"],
        "one failure opens the first target's circuit"
    );
    assert_eq!(gw.io.gauges.get("gen_ai_gateway_circuits_open"), Some(&1), "and it is open now");
    let [call] = gw.io.sent.as_slice() else { panic!("one call: {:?}", gw.io.sent) };
    let call = call.clone();
    assert_eq!((call.id, call.call.cluster.as_str()), (1, "gateway_recovery"));
    assert_eq!(call.header(":authority"), Some("127.0.0.1:9002"));
    assert_eq!(call.header("authorization"), Some("Bearer sk-second"));
    assert_eq!(call.header(CLUSTER_HEADER), Some("gateway_upstream_plain"));
    assert_eq!(call.header(":path"), Some("/v1/chat/completions"));
    assert_eq!(call.header("content-length"), Some(CHAT.len().to_string().as_str()));
    assert_eq!(call.header("x-gateway-config"), None, "the config (with keys) never leaves");
    assert_eq!(call.call.body, CHAT);

    // The failed body never reaches the client (nor fills Envoy's buffer).
    let out = gw.response_body(1, br#"{"error":{"message":"boom"}}"#, false);
    assert_eq!(out.action, Action::Pause);
    assert!(gw.io.streams(1).response_body.is_empty());
    assert_eq!(gw.response_body(1, b"more", true).action, Action::Pause);
    assert!(gw.io.streams(1).response_body.is_empty());

    // The second target answers: that is the client's answer.
    let out = gw.answer(
        call.token,
        200,
        &[(":status", "200"), ("content-type", "application/json"), ("content-length", "5"), ("x-upstream", "b")],
        COMPLETION,
    );
    assert_eq!(out.action, Action::Continue);
    let (id, status, headers, body) = reply(&out);
    assert_eq!((id, status), (1, 200));
    assert_eq!(body, json_of(COMPLETION));
    assert_eq!(headers[PROVIDER_HEADER], "openai");
    assert_eq!(headers[RETRIES_HEADER], "0", "a fallback is no retry");
    assert_eq!(headers[TARGET_HEADER], "targets[1]");
    assert_eq!(headers["x-upstream"], "b");
    assert!(!headers.contains_key("content-length") && !headers.contains_key(":status"));
    assert!(headers.contains_key(TRACE_HEADER));

    let record = gw.finished(1).unwrap();
    assert_eq!((record.target.as_str(), record.status, record.provider), ("targets[1]", 200, "openai"));
}

#[test]
fn a_fallback_to_anthropic_is_translated_like_a_routed_answer() {
    let mut gw = Gateway::new(SETTINGS);
    let anthropic = json!({"provider": "anthropic", "api_key": "sk-ant", "override_params": {"max_tokens": 32}});
    let config = fallback(vec![openai("sk-first", 9001), anthropic]);
    assert_eq!(gw.post(1, chat_with_config("gw-key", &config), CHAT), Output::proceed());
    assert_eq!(gw.response_headers(1, 503, &[], "via_upstream").action, Action::Pause);
    let call = gw.io.sent[0].clone();
    assert_eq!(call.header(":path"), Some("/v1/messages"));
    assert_eq!(call.header("x-api-key"), Some("sk-ant"));
    assert_eq!(json_of(&call.call.body)["max_tokens"], 32);
    let out = gw.answer(call.token, 200, &[("content-type", "application/json")], ANTHROPIC_MESSAGE);
    let (_, status, headers, body) = reply(&out);
    assert_eq!(status, 200);
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello from Claude");
    assert_eq!(
        (headers[PROVIDER_HEADER].as_str(), headers["content-type"].as_str()),
        ("anthropic", "application/json")
    );
}

#[test]
fn when_every_target_fails_the_client_gets_the_last_failure() {
    let mut gw = Gateway::new(SETTINGS);
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 500, &[], "via_upstream");
    let token = gw.io.sent[0].token;
    let error = br#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}"#;
    let (_, status, headers, body) = reply(&gw.answer(token, 529, &[("content-type", "application/json")], error));
    assert_eq!(status, 529);
    assert_eq!(body["error"]["message"], "overloaded");
    assert_eq!(headers[TARGET_HEADER], "targets[1]");
    assert_eq!(gw.finished(1).unwrap().status, 529);
}

#[test]
fn a_recovery_call_that_cannot_start_answers_with_the_failed_attempts_status() {
    let mut gw = Gateway::new(SETTINGS);
    gw.io.dispatch_fails = true;
    // The next target is another provider's: the answer is still the first one's, shaped and
    // named as its own provider's.
    let anthropic = json!({"provider": "anthropic", "api_key": "sk-ant", "custom_host": "http://127.0.0.1:9002/v1"});
    let config = fallback(vec![openai("a", 9001), anthropic]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    // An upstream's copy of a gateway header never reaches the client.
    let failed = [
        ("content-type", "text/plain"),
        ("content-length", "4"),
        ("x-request-id", "up-1"),
        ("x-gateway-provider", "forged"),
    ];
    let out = gw.response_headers(1, 500, &failed, "via_upstream");
    assert_eq!(out.action, Action::Pause);
    // The second target cannot be called (e.g. no recovery cluster): the client learns the
    // provider's failure, in the gateway's error shape, never a status 0.
    let (_, status, headers, body) = reply(&out);
    assert_eq!(status, 500);
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(body["error"]["message"], "provider returned status 500");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-request-id"], "up-1");
    assert_eq!(headers["x-gateway-provider"], "openai");
    let (_, _, listed, _) = match out.after.as_slice() {
        [After::Reply { id, status, headers, body }] => (id, status, headers.clone(), body),
        other => panic!("{other:?}"),
    };
    assert_eq!(listed.iter().filter(|(name, _)| name == "x-gateway-provider").count(), 1);
    assert!(!headers.contains_key("content-length"));
    assert_eq!(gw.finished(1).unwrap().status, 500);
}

// ---------------------------------------------------------------------------------------------
// 5. Retries with a delay

#[test]
fn a_retry_waits_for_the_providers_retry_after_on_the_root_timer() {
    let mut gw = Gateway::new(SETTINGS);
    let mut target = openai("sk", 9001);
    target["retry"] = json!({"attempts": 2, "use_retry_after_headers": true});
    gw.post(1, chat_with_config("gw-key", &target), CHAT);
    let out = gw.response_headers(1, 429, &[("retry-after-ms", "1500")], "via_upstream");
    assert_eq!(out, Output { action: Action::Pause, after: vec![] });
    assert_eq!(gw.io.ticks, vec![1500]);
    assert!(gw.io.sent.is_empty(), "nothing is sent before the wait is over");

    // Too early: nothing starts, the timer is set for the rest of the wait.
    gw.advance_clock(1000);
    assert_eq!(gw.tick(), Output::proceed());
    assert!(gw.io.sent.is_empty());
    assert_eq!(gw.io.ticks.last(), Some(&500));

    gw.advance_clock(600);
    assert_eq!(gw.tick(), Output::proceed());
    assert_eq!(gw.io.sent.len(), 1);
    assert_eq!(gw.io.sent[0].header(":authority"), Some("127.0.0.1:9001"), "the same target again");
    assert_eq!(gw.io.ticks.last(), Some(&0), "nothing waits: no more ticks");

    let (_, status, headers, _) = reply(&gw.answer(gw.io.sent[0].token, 200, &[], COMPLETION));
    assert_eq!((status, headers[RETRIES_HEADER].as_str()), (200, "1"));
    let record = gw.finished(1).unwrap();
    assert_eq!((record.retries, record.status), (1, 200));
}

// ---------------------------------------------------------------------------------------------
// 6. Timeouts and unreachable providers

#[test]
fn envoys_per_try_timeout_is_a_408_of_the_gateway() {
    let mut gw = Gateway::new(SETTINGS);
    let mut target = openai("sk", 9001);
    target["request_timeout"] = json!(2000);
    gw.post(1, chat_with_config("gw-key", &target), CHAT);
    assert_eq!(gw.upstream_header(1, "x-envoy-upstream-rq-per-try-timeout-ms").as_deref(), Some("2000"));
    // Beyond what Envoy's signed milliseconds hold: at most u32::MAX, as a dispatched attempt's.
    let mut forever = openai("sk", 9001);
    forever["request_timeout"] = json!(u64::MAX);
    gw.post(2, chat_with_config("gw-key", &forever), CHAT);
    assert_eq!(gw.upstream_header(2, "x-envoy-upstream-rq-per-try-timeout-ms").as_deref(), Some("4294967295"));
    let out = gw.response_headers(1, 504, &[("content-type", "text/plain")], "upstream_per_try_timeout");
    assert_eq!(out.action, Action::Pause);
    let (_, status, headers, body) = reply(&out);
    assert_eq!(status, 408);
    assert_eq!(body["error"]["code"], "request_timeout");
    assert_eq!(body["error"]["type"], "timeout_error");
    assert_eq!(headers[PROVIDER_HEADER], "openai");
    assert_eq!(gw.finished(1).unwrap().status, 408);
}

#[test]
fn a_recovery_call_without_an_answer_is_a_502() {
    let mut gw = Gateway::new(SETTINGS);
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 503, &[], "upstream_reset_before_response_started{connection_failure}");
    let token = gw.io.sent[0].token;
    let (_, status, _, body) = reply(&gw.answer(token, 0, &[], b""));
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "upstream_unreachable");
    assert_eq!(gw.finished(1).unwrap().status, 502);
}

#[test]
fn envoys_own_unrelated_reply_passes_as_it_is() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &fallback(vec![openai("a", 9001), openai("b", 9002)])), CHAT);
    let out = gw.response_headers(1, 503, &[("content-type", "text/plain")], "overload_manager");
    assert_eq!(out, Output::proceed());
    assert!(gw.io.sent.is_empty());
    assert_eq!(gw.response_body(1, b"overloaded", true), Output::proceed());
    assert_eq!(gw.client_body(1), b"overloaded");
}

// ---------------------------------------------------------------------------------------------
// 7. The response cache

fn cached_openai() -> Value {
    let mut target = openai("sk", 9001);
    target["cache"] = json!({"mode": "simple"});
    target
}

#[test]
fn a_repeated_request_is_answered_from_the_cache_of_its_tenant_only() {
    let mut gw = Gateway::new(SETTINGS);
    // First: a miss, answered by the provider and stored.
    assert_eq!(gw.post(1, chat_with_config("gw-key", &cached_openai()), CHAT), Output::proceed());
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("MISS"));
    let (first, second) = COMPLETION.split_at(30);
    gw.response_body(1, first, false);
    gw.response_body(1, second, true);
    assert_eq!(gw.finished(1).unwrap().cache, "MISS");

    // Again: the cache answers, nothing goes upstream.
    gw.request_headers(2, chat_with_config("gw-key", &cached_openai()), true);
    let out = gw.request_body(2, CHAT);
    assert_eq!(out.action, Action::Pause);
    let (id, status, headers, body) = reply(&out);
    assert_eq!((id, status), (2, 200));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(headers[STATUS_HEADER], "HIT");
    assert_eq!(headers[PROVIDER_HEADER], "openai");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.contains_key(TRACE_HEADER));
    let upstream_edits: Vec<_> = gw
        .io
        .writes_of(2)
        .into_iter()
        .filter(|w| matches!(w, Write::RequestHeaders(..) | Write::RequestBody(..)))
        .collect();
    assert!(upstream_edits.is_empty(), "{upstream_edits:?}");
    // Envoy's response callbacks for the local answer change nothing.
    assert_eq!(gw.response_headers(2, 200, &[], "send_local_reply"), Output::proceed());
    assert!(!gw.io.writes_of(2).iter().any(|w| matches!(w, Write::ResponseHeader(..) | Write::ResponseBody(..))));
    let record = gw.finished(2).unwrap();
    assert_eq!((record.status, record.cache, record.provider), (200, "HIT", "openai"));

    // Another tenant asking the same never sees it.
    assert_eq!(gw.post(3, chat_with_config("gw-other", &cached_openai()), CHAT), Output::proceed());
    gw.response_headers(3, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(3, STATUS_HEADER).as_deref(), Some("MISS"));
}

#[test]
fn a_recovered_answer_is_cached_too() {
    let mut gw = Gateway::new(SETTINGS);
    let mut config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    config["cache"] = json!({"mode": "simple"});
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 500, &[], "via_upstream");
    let token = gw.io.sent[0].token;
    let (_, _, headers, _) = reply(&gw.answer(token, 200, &[("content-type", "application/json")], COMPLETION));
    assert_eq!(headers[STATUS_HEADER], "MISS");
    gw.finished(1);

    gw.request_headers(2, chat_with_config("gw-key", &config), true);
    let (_, status, headers, body) = reply(&gw.request_body(2, CHAT));
    assert_eq!((status, headers[STATUS_HEADER].as_str()), (200, "HIT"));
    assert_eq!(body, json_of(COMPLETION));
}

#[test]
fn a_completed_stream_is_stored_and_replayed_as_a_stream_or_as_json() {
    let mut gw = Gateway::new(SETTINGS);
    let stream_chat = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(1, chat_with_config("gw-key", &cached_openai()), stream_chat);
    gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    let sse = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",",
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",",
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let (first, second) = sse.as_bytes().split_at(100);
    gw.response_body(1, first, false);
    gw.response_body(1, second, true);
    assert_eq!(gw.client_body(1), sse.as_bytes(), "an OpenAI stream passes as it came");
    gw.finished(1);

    // The same question without streaming: the assembled completion, as JSON.
    gw.request_headers(2, chat_with_config("gw-key", &cached_openai()), true);
    let (_, status, headers, body) = reply(&gw.request_body(2, CHAT));
    assert_eq!((status, headers[STATUS_HEADER].as_str()), (200, "HIT"));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello");
    // And streaming again: an SSE stream of the same answer.
    gw.request_headers(3, chat_with_config("gw-key", &cached_openai()), true);
    let (_, _, headers, body) = reply(&gw.request_body(3, stream_chat));
    assert_eq!(headers["content-type"], "text/event-stream");
    let replay = body.as_str().unwrap();
    assert!(replay.contains("Hello") || (replay.contains("Hel") && replay.contains("lo")), "{replay}");
    assert!(replay.ends_with("data: [DONE]\n\n"), "{replay}");
}

fn semantic_openai() -> Value {
    let mut target = openai("sk", 9001);
    target["cache"] = json!({"mode": "semantic"});
    target
}

fn chat_saying(text: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string().into_bytes()
}

fn embedding(vector: &[f32]) -> Vec<u8> {
    json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": vector}]})
        .to_string()
        .into_bytes()
}

#[test]
fn semantic_mode_asks_for_an_embedding_and_answers_a_similar_request() {
    let mut gw = Gateway::new(SEMANTIC_SETTINGS);
    // A miss: the request waits for the embedding of its conversation.
    let out = gw.post(1, chat_with_config("gw-key", &semantic_openai()), &chat_saying("What is a prime?"));
    assert_eq!(out, Output { action: Action::Pause, after: vec![] });
    let call = gw.io.sent[0].clone();
    assert_eq!((call.id, call.call.cluster.as_str()), (1, "gateway_recovery"));
    assert_eq!(call.header(":path"), Some("/v1/embeddings"));
    assert_eq!(call.header(":authority"), Some("127.0.0.1:9100"));
    assert_eq!(call.header("authorization"), Some("Bearer sk-emb"));
    assert_eq!(call.header(CLUSTER_HEADER), Some("gateway_upstream_plain"));
    let asked = json_of(&call.call.body);
    assert_eq!(
        (asked["model"].as_str(), asked["input"].as_str()),
        (Some("embed-small"), Some("user: What is a prime?"))
    );
    // The upstream request is ready, waiting only for the go.
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:9001"));

    // Nothing similar is stored: the request goes on and its answer is stored with the vector.
    let out = gw.answer(call.token, 200, &[], &embedding(&[1.0, 0.0, 0.2]));
    assert_eq!(out, Output { action: Action::Continue, after: vec![After::ResumeRequest(1)] });
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("MISS"));
    gw.response_body(1, COMPLETION, true);
    gw.finished(1);

    // A rewording with a close embedding is answered from the cache.
    let out = gw.post(2, chat_with_config("gw-key", &semantic_openai()), &chat_saying("Define a prime number?"));
    assert_eq!(out.action, Action::Pause);
    let token = gw.io.sent[1].token;
    let (id, status, headers, body) = reply(&gw.answer(token, 200, &[], &embedding(&[0.99, 0.01, 0.21])));
    assert_eq!((id, status), (2, 200));
    assert_eq!(headers[STATUS_HEADER], "SEMANTIC_HIT");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(gw.finished(2).unwrap().cache, "SEMANTIC_HIT");
}

#[test]
fn a_failed_embeddings_call_lets_the_request_go_on_as_an_exact_miss() {
    let mut gw = Gateway::new(SEMANTIC_SETTINGS);
    assert_eq!(gw.post(1, chat_with_config("gw-key", &semantic_openai()), CHAT).action, Action::Pause);
    let token = gw.io.sent[0].token;
    let out = gw.answer(token, 503, &[], b"no healthy upstream");
    assert_eq!(out, Output { action: Action::Continue, after: vec![After::ResumeRequest(1)] });
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("MISS; semantic=unavailable"));
    assert_eq!(gw.finished(1).unwrap().cache, "MISS; semantic=unavailable");
}

#[test]
fn an_embeddings_call_that_cannot_start_does_not_hold_the_request() {
    let mut gw = Gateway::new(SEMANTIC_SETTINGS);
    gw.io.dispatch_fails = true;
    assert_eq!(gw.post(1, chat_with_config("gw-key", &semantic_openai()), CHAT), Output::proceed());
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("MISS; semantic=unavailable"));
}

// ---------------------------------------------------------------------------------------------
// 8. A finished request leaves nothing behind

#[test]
fn a_call_answer_for_a_finished_request_is_ignored() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &fallback(vec![openai("a", 9001), openai("b", 9002)])), CHAT);
    gw.response_headers(1, 500, &[], "via_upstream");
    let token = gw.io.sent[0].token;
    assert!(gw.worker.awaits(token));
    // The client went away.
    let record = gw.finished(1).unwrap();
    assert_eq!((record.status, record.target.as_str()), (500, "targets[1]"));
    assert!(!gw.worker.awaits(token));
    let writes = gw.io.writes.len();
    assert_eq!(gw.answer(token, 200, &[], COMPLETION), Output::proceed());
    assert_eq!(gw.io.writes.len(), writes);
    assert!(gw.finished(1).is_none(), "finished once");
}

#[test]
fn a_body_envoy_withholds_is_answered_with_the_setting_to_fix_it() {
    // Envoy without allow_on_headers_stop_iteration stops the stream at the held headers and
    // never passes the body on.
    let mut gw = Gateway::withholding_bodies(SETTINGS);
    let headers = chat_with_config("gw-key", &openai("sk", 9001));
    assert_eq!(gw.request_headers(1, headers.clone(), true).action, Action::Pause);
    assert_eq!(gw.io.ticks, vec![2000], "the probe waits two seconds");
    gw.advance_clock(1999);
    assert!(gw.tick().after.is_empty(), "not before its time");
    gw.advance_clock(1);
    let (id, status, _, body) = reply(&gw.tick());
    assert_eq!((id, status), (1, 500));
    assert_eq!(body["error"]["code"], "request_body_withheld");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"allow_on_headers_stop_iteration\": true"), "{message}");
    assert!(gw.io.sent.is_empty());
    // A request without a body is not held for one: nothing to probe.
    let get = request("GET", "/v1/models", &[("x-gateway-api-key", "gw-key")]);
    gw.io.ticks.clear();
    gw.request_headers(2, get, false);
    assert!(gw.io.ticks.is_empty());
}

#[test]
fn the_first_body_envoy_delivers_ends_every_probe() {
    let mut gw = Gateway::withholding_bodies(SETTINGS);
    let headers = chat_with_config("gw-key", &openai("sk", 9001));
    gw.request_headers(1, headers.clone(), true);
    gw.request_headers(2, headers.clone(), true);
    assert_eq!(gw.io.ticks, vec![2000, 2000]);
    // Request 1's body arrives: Envoy passes bodies on, request 2's is only slow.
    gw.request_body(1, CHAT);
    assert_eq!(gw.io.ticks.last(), Some(&0), "no timer left");
    gw.advance_clock(5000);
    assert!(gw.tick().after.is_empty(), "request 2 is not answered");
    gw.io.ticks.clear();
    gw.request_headers(3, headers, true);
    assert!(gw.io.ticks.is_empty(), "later requests are not probed");
    assert_eq!(gw.request_body(2, CHAT).action, Action::Continue, "request 2 goes on once its body is in");
}

#[test]
fn timers_of_a_finished_request_never_fire() {
    let mut gw = Gateway::new(SETTINGS);
    let mut target = openai("sk", 9001);
    target["retry"] = json!({"attempts": 1, "use_retry_after_headers": true});
    gw.post(1, chat_with_config("gw-key", &target), CHAT);
    gw.response_headers(1, 503, &[("retry-after-ms", "200")], "via_upstream");
    assert_eq!(gw.io.ticks, vec![200]);
    gw.finished(1);
    gw.advance_clock(1000);
    assert_eq!(gw.tick(), Output::proceed());
    assert!(gw.io.sent.is_empty());
    assert_eq!(gw.io.ticks.last(), Some(&0), "the timer stops");
}

#[test]
fn requests_of_one_worker_do_not_mix() {
    let mut gw = Gateway::new(SETTINGS);
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.post(2, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 500, &[], "via_upstream");
    gw.response_headers(2, 500, &[], "via_upstream");
    let (t1, t2) = (gw.io.sent[0].token, gw.io.sent[1].token);
    assert_ne!(t1, t2);
    // The answers come back in the other order, each to its own request.
    let (id, status, ..) = reply(&gw.answer(t2, 429, &[], br#"{"error":{"message":"slow"}}"#));
    assert_eq!((id, status), (2, 429));
    let (id, status, ..) = reply(&gw.answer(t1, 200, &[], COMPLETION));
    assert_eq!((id, status), (1, 200));
}

// ---------------------------------------------------------------------------------------------
// Access tokens (a Vertex AI service account)

fn vertex_with_service_account() -> Value {
    let key_file = json!({
        "type": "service_account",
        "project_id": "proj-1",
        "private_key_id": "kid-1",
        "private_key": include_str!("../providers/google/testdata/test_key.pem"),
        "client_email": "gw@proj-1.iam.gserviceaccount.com",
        "token_uri": "http://127.0.0.1:9200/token",
    });
    json!({"provider": "vertex-ai", "cloud_b_region": "us-central1", "cloud_b_service_account_json": key_file,
           "custom_host": "http://127.0.0.1:9300"})
}

const TOKEN_ANSWER: &[u8] = br#"{"access_token":"ya29.first","expires_in":3600,"token_type":"Bearer"}"#;

#[test]
fn one_token_exchange_serves_every_request_until_shortly_before_it_expires() {
    let mut gw = Gateway::new(SETTINGS);
    // Two requests arrive before any token: both wait for one exchange.
    assert_eq!(gw.post(1, chat_with_config("gw-key", &vertex_with_service_account()), CHAT).action, Action::Pause);
    assert_eq!(gw.post(2, chat_with_config("gw-key", &vertex_with_service_account()), CHAT).action, Action::Pause);
    assert_eq!(gw.io.sent.len(), 1, "one exchange per credential");
    let exchange = gw.io.sent[0].clone();
    assert_eq!((exchange.header(":path"), exchange.header(":authority")), (Some("/token"), Some("127.0.0.1:9200")));
    assert_eq!(exchange.header("content-type"), Some("application/x-www-form-urlencoded"));
    let form = String::from_utf8(exchange.call.body.clone()).unwrap();
    assert!(
        form.starts_with("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=ey"),
        "{form}"
    );
    assert_eq!(gw.upstream_header(1, "authorization"), None, "nothing is sent before the token");

    let out = gw.answer(exchange.token, 200, &[], TOKEN_ANSWER);
    assert_eq!(out.after, vec![After::ResumeRequest(1), After::ResumeRequest(2)]);
    for id in [1, 2] {
        assert_eq!(gw.upstream_header(id, "authorization").as_deref(), Some("Bearer ya29.first"));
        assert_eq!(
            gw.upstream_header(id, ":path").as_deref(),
            Some("/v1/projects/proj-1/locations/us-central1/publishers/google/models/m:generateContent")
        );
        gw.finished(id);
    }
    // Later requests use the cached token without waiting.
    gw.advance_clock(3_000_000);
    assert_eq!(gw.post(3, chat_with_config("gw-key", &vertex_with_service_account()), CHAT).action, Action::Continue);
    assert_eq!(gw.upstream_header(3, "authorization").as_deref(), Some("Bearer ya29.first"));
    assert_eq!(gw.io.sent.len(), 1);
    // In the token's last minute a new one is fetched.
    gw.advance_clock(540_000);
    assert_eq!(gw.post(4, chat_with_config("gw-key", &vertex_with_service_account()), CHAT).action, Action::Pause);
    assert_eq!(gw.io.sent.len(), 2);
}

#[test]
fn a_refused_exchange_answers_401_and_a_waiter_that_left_does_not_stop_the_others() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &vertex_with_service_account()), CHAT);
    gw.post(2, chat_with_config("gw-key", &vertex_with_service_account()), CHAT);
    // The client of the request that started the exchange goes away.
    gw.finished(1);
    let token = gw.io.sent[0].token;
    let refused = br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#;
    let (id, status, _, body) = reply(&gw.answer(token, 400, &[], refused));
    assert_eq!((id, status), (2, 401));
    assert_eq!(body["error"]["code"], "token_exchange_failed");
    assert!(body["error"]["message"].as_str().unwrap().contains("Invalid JWT Signature."));
}

#[test]
fn the_clients_own_access_token_goes_as_it_is() {
    let mut gw = Gateway::new(SETTINGS);
    let config = json!({"provider": "vertex-ai", "cloud_b_region": "global", "cloud_b_project_id": "p",
                        "custom_host": "http://127.0.0.1:9300"});
    let mut headers = chat_with_config("gw-key", &config);
    headers.push(("authorization".to_string(), b"Bearer ya29.client".to_vec()));
    headers.push(("x-cloud-b-llm-request-type".to_string(), b"dedicated".to_vec()));
    assert_eq!(gw.post(1, headers, CHAT).action, Action::Continue);
    assert!(gw.io.sent.is_empty(), "no exchange");
    assert_eq!(gw.upstream_header(1, "authorization").as_deref(), Some("Bearer ya29.client"));
    assert_eq!(gw.upstream_header(1, "x-vertex-ai-llm-request-type").as_deref(), Some("dedicated"));
    assert_eq!(gw.upstream_header(1, "x-cloud-b-llm-request-type"), None);
}

// ---------------------------------------------------------------------------------------------
// 10. Metrics and the access log's record

const COMPLETION_WITH_USAGE: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;

#[test]
fn a_passthrough_answer_counts_its_request_duration_and_tokens_read_as_they_pass() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &cached_openai()), CHAT);
    gw.advance_clock(25);
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    // The usage object is split across chunks; the body still passes untouched.
    let (first, second) = COMPLETION_WITH_USAGE.split_at(COMPLETION_WITH_USAGE.len() - 30);
    assert_eq!(gw.response_body(1, first, false), Output::proceed());
    assert_eq!(gw.response_body(1, second, true), Output::proceed());
    assert_eq!(gw.client_body(1), COMPLETION_WITH_USAGE);
    gw.advance_clock(5);
    let record = gw.finished(1).unwrap();
    assert_eq!((record.model.as_str(), record.duration_ms, record.time_to_first_token_ms), ("m", 30, None));
    let stored = COMPLETION_WITH_USAGE.len();
    assert_eq!(
        gw.metrics(),
        [
            "gen_ai_gateway_cache_stores_total 1".to_string(),
            format!("gen_ai_gateway_cache_stored_bytes_total {stored}"),
            "gen_ai_gateway_requests_total.provider.openai.status_class.2xx.cache_status.miss.model.m 1".to_string(),
            "gen_ai_server_request_duration.provider.openai.model.m 30".to_string(),
            "gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.input.model.m 9".to_string(),
            "gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.output.model.m 4".to_string(),
        ]
    );

    // The cache answers the same request: counted as a hit, with no tokens spent.
    gw.io.metrics.clear();
    gw.post(2, chat_with_config("gw-key", &cached_openai()), CHAT);
    gw.finished(2).unwrap();
    assert_eq!(
        gw.metrics(),
        [
            "gen_ai_gateway_requests_total.provider.openai.status_class.2xx.cache_status.hit.model.m 1",
            "gen_ai_server_request_duration.provider.openai.model.m 0",
        ]
    );
}

#[test]
fn a_stream_counts_its_time_to_first_token_and_the_usage_it_carries() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"gpt-4.1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), body);
    gw.advance_clock(10);
    gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    gw.advance_clock(7);
    gw.response_body(1, b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n", false);
    gw.advance_clock(100);
    gw.response_body(1, b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n", false);
    gw.response_body(1, b"data: [DONE]\n\n", true);
    let record = gw.finished(1).unwrap();
    assert_eq!((record.stream, record.time_to_first_token_ms, record.duration_ms), (true, Some(17), 117));
    assert_eq!(record.cost_micro_usd, Some(18));
    assert_eq!(
        gw.metrics(),
        [
            "gen_ai_gateway_requests_total.provider.openai.status_class.2xx.cache_status.disabled.model.gpt-4.1 1",
            "gen_ai_server_request_duration.provider.openai.model.gpt-4.1 117",
            "gen_ai_server_time_to_first_token.provider.openai.model.gpt-4.1 17",
            // gpt-4.1's list prices: $2 and $8 per million tokens, so 5 × 2 + 1 × 8 micro-USD.
            "gen_ai_gateway_cost_micro_usd_total.provider.openai.model.gpt-4.1 18",
            "gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.input.model.gpt-4.1 5",
            "gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.output.model.gpt-4.1 1",
        ]
    );
}

#[test]
fn retries_and_fallbacks_count_by_the_provider_that_failed() {
    let mut gw = Gateway::new(SETTINGS);
    let mut first = openai("sk-first", 9001);
    first["retry"] = json!({"attempts": 1, "on_status_codes": [503]});
    let anthropic = json!({"provider": "anthropic", "api_key": "sk-ant", "override_params": {"model": "claude-x"}});
    let config = fallback(vec![first, anthropic]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 503, &[], "via_upstream");
    gw.advance_clock(60_000);
    gw.tick();
    let retry = gw.io.sent[0].token;
    gw.answer(retry, 503, &[], b"{}");
    let call = gw.io.sent[1].clone();
    let (_, status, _, _) =
        reply(&gw.answer(call.token, 200, &[("content-type", "application/json")], ANTHROPIC_MESSAGE));
    assert_eq!(status, 200);
    let record = gw.finished(1).unwrap();
    assert_eq!((record.provider, record.model.as_str(), record.retries), ("anthropic", "claude-x", 1));
    let metrics = gw.metrics();
    assert_eq!(
        metrics[..3],
        [
            "gen_ai_gateway_retries_total.provider.openai 1",
            "gen_ai_gateway_fallbacks_total.provider.openai 1",
            "gen_ai_gateway_requests_total.provider.anthropic.status_class.2xx.cache_status.disabled.model.claude-x 1",
        ]
    );
    assert!(metrics.iter().any(|m| m.starts_with("gen_ai_client_token_usage_total.provider.anthropic")), "{metrics:?}");
    // The line published for the access log is the record's.
    assert_eq!(gw.io.access_lines, vec![record.to_json()]);
    let line = json_of(&record.to_json());
    assert_eq!(
        (line["attempts"].clone(), line["retries"].clone(), line["fallbacks"].clone()),
        (json!(3), json!(1), json!(1))
    );
}

#[test]
fn a_request_refused_before_provider_selection_has_no_request_metrics() {
    let mut gw = Gateway::new(SETTINGS);
    gw.request_headers(1, request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "wrong")]), true);
    let record = gw.finished(1).unwrap();
    assert_eq!(record.status, 401);
    assert!(gw.metrics().is_empty(), "{:?}", gw.metrics());
}

#[test]
fn a_stream_is_counted_and_the_client_gets_it_as_it_asked() {
    let mut gw = Gateway::new(r#"{"api_keys": ["gw-key"]}"#);
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), body);
    let sent = json_of(&gw.io.streams(1).request_body);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}), "asked upstream");
    gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    gw.response_body(1, b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n", false);
    gw.response_body(1, b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"co", false);
    gw.response_body(1, b"mpletion_tokens\":1}}\n\ndata: [DONE]\n\n", true);
    let client = String::from_utf8(gw.client_body(1)).unwrap();
    assert!(!client.contains("usage") && client.ends_with("data: [DONE]\n\n"), "{client}");
    assert!(client.contains(r#""content":"Hi""#), "{client}");
    assert_eq!(
        gw.finished(1).unwrap().usage,
        Some(crate::providers::Usage { prompt_tokens: 5, completion_tokens: 1, ..Default::default() })
    );
    let metrics = gw.metrics();
    assert!(metrics
        .contains(&"gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.input.model.m 5".to_string()));
}

#[test]
fn a_stream_that_fails_has_no_time_to_first_token() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), body);
    gw.response_headers(1, 429, &[("content-type", "application/json")], "via_upstream");
    gw.response_body(1, br#"{"error":{"message":"slow down"}}"#, true);
    let record = gw.finished(1).unwrap();
    assert_eq!((record.status, record.time_to_first_token_ms), (429, None));
    assert!(!gw.metrics().iter().any(|m| m.starts_with(metrics::TIME_TO_FIRST_TOKEN)), "{:?}", gw.metrics());
}

// ---------------------------------------------------------------------------------------------
// Answers the gateway cannot pass on

#[test]
fn a_status_outside_http_is_a_502_that_names_it() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    let out = gw.response_headers(1, 999, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(out.action, Action::Pause);
    let (_, status, headers, body) = reply(&out);
    assert_eq!(status, 502);
    assert_eq!(
        body["error"],
        json!({"message": "provider 'openai' answered with an invalid HTTP status 999", "type": "api_error",
            "param": null, "code": "invalid_provider_response"})
    );
    assert!(headers.contains_key(TRACE_HEADER) && headers[PROVIDER_HEADER] == "openai");
    let record = gw.finished(1).unwrap();
    assert_eq!((record.status, record.error_code), (502, Some("invalid_provider_response")));

    // A fallback goes on as after a 502, and a dispatched call's odd status is named too.
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(2, chat_with_config("gw-key", &config), CHAT);
    assert_eq!(gw.response_headers(2, 600, &[], "via_upstream").action, Action::Pause);
    let token = gw.io.sent.last().unwrap().token;
    let (_, status, _, body) = reply(&gw.answer(token, 1000, &[("content-type", "application/json")], COMPLETION));
    assert_eq!(status, 502);
    assert_eq!(body["error"]["message"], "provider 'openai' answered with an invalid HTTP status 1000");
}

#[test]
fn an_event_stream_for_a_request_that_asked_for_json_is_a_502() {
    let unasked = "provider '{}' answered with an event stream to a request that did not ask for one: \
                   the answer could not be read";
    let event_stream = [("content-type", "text/event-stream")];
    // OpenAI-compatible, whose answers otherwise pass untouched, and a translated provider.
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    let (_, status, headers, body) = reply(&gw.response_headers(1, 200, &event_stream, "via_upstream"));
    assert_eq!((status, body["error"]["message"].as_str()), (502, Some(unasked.replace("{}", "openai").as_str())));
    assert_eq!(headers["content-type"], "application/json");
    let body = br#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(2, anthropic_chat(), body);
    let (_, status, _, body) = reply(&gw.response_headers(2, 200, &event_stream, "via_upstream"));
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("invalid_provider_response")));

    // Asked for, a stream is a stream; a JSON answer to a JSON request passes as before.
    let streamed = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(3, chat_with_config("gw-key", &openai("sk", 9001)), streamed);
    assert_eq!(gw.response_headers(3, 200, &event_stream, "via_upstream"), Output::proceed());
    gw.post(4, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    let length = [("content-type", "application/json"), ("content-length", "99")];
    assert_eq!(gw.response_headers(4, 200, &length, "via_upstream"), Output::proceed());

    // A recovered answer is judged the same way.
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(5, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(5, 500, &[], "via_upstream");
    let token = gw.io.sent.last().unwrap().token;
    let (_, status, _, body) = reply(&gw.answer(token, 200, &event_stream, b"data: {}\n\n"));
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("invalid_provider_response")));
}

#[test]
fn an_empty_success_for_a_request_that_asked_for_json_is_a_502() {
    let empty = "provider 'openai' answered 200 with an empty body: the answer could not be read";
    let json = [("content-type", "application/json")];
    let mut gw = Gateway::new(SETTINGS);
    // Headers that end the answer (`content-length: 0`): answered at once.
    gw.post(1, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    let (_, status, _, body) = reply(&gw.response_headers_end(1, 200, &json, "via_upstream"));
    assert_eq!((status, body["error"]["message"].as_str()), (502, Some(empty)));
    assert_eq!(body["error"]["code"], "invalid_provider_response");

    // An unannounced length: the headers wait for the first byte (the gateway's published for
    // Envoy's own reply should the provider break off meanwhile); none came, so the answer is
    // the gateway's 502 in place of the empty body.
    gw.post(2, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    assert_eq!(gw.response_headers(2, 200, &json, "via_upstream").action, Action::Pause);
    assert_eq!(gw.io.published[&2][PROVIDER_HEADER], "openai");
    assert_eq!(gw.response_body(2, b"", false).action, Action::Pause, "an empty chunk is no first byte");
    assert_eq!(gw.response_body(2, b"", true), Output::proceed());
    assert_eq!(gw.client_header(2, ":status").as_deref(), Some("502"));
    assert_eq!(serde_json::from_slice::<Value>(&gw.client_body(2)).unwrap()["error"]["message"], empty);
    assert_eq!(gw.finished(2).unwrap().error_code, Some("invalid_provider_response"));

    // A first byte lets the headers and the rest flow untouched.
    gw.post(3, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    assert_eq!(gw.response_headers(3, 200, &json, "via_upstream").action, Action::Pause);
    let (first, second) = COMPLETION.split_at(1);
    assert_eq!(gw.response_body(3, first, false), Output::proceed());
    assert_eq!(gw.response_body(3, second, true), Output::proceed());
    assert_eq!(gw.client_body(3), COMPLETION);
    assert_eq!(gw.finished(3).unwrap().status, 200);
}

#[test]
fn a_held_answer_publishes_the_gateway_headers_for_envoys_own_reply() {
    let mut gw = Gateway::new(SETTINGS);
    let body = br#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    gw.post(1, anthropic_chat(), body);
    assert_eq!(
        gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream").action,
        Action::Pause
    );
    let published = gw.io.published[&1].clone();
    assert_eq!(Some(&published[TRACE_HEADER]), gw.client_header(1, TRACE_HEADER).as_ref());
    assert_eq!(published[PROVIDER_HEADER], "anthropic");
    // The provider breaks off before the body ends: Envoy answers (502), and the record says so.
    gw.io.streams(1).details = "upstream_reset_after_response_started{remote_reset}".to_string();
    let record = gw.finished(1).unwrap();
    assert_eq!((record.status, record.error_code), (502, Some("upstream_incomplete")));
    // Or it goes silent for the stream idle timeout: Envoy's 504.
    gw.post(4, anthropic_chat(), body);
    gw.response_headers(4, 200, &[("content-type", "application/json")], "via_upstream");
    gw.io.streams(4).details = "stream_idle_timeout".to_string();
    let record = gw.finished(4).unwrap();
    assert_eq!((record.status, record.error_code), (504, Some("upstream_stalled")));

    // A held failure that recovers publishes its headers too; an answer that flows, none.
    let config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    gw.post(2, chat_with_config("gw-key", &config), CHAT);
    assert_eq!(gw.response_headers(2, 500, &[], "via_upstream").action, Action::Pause);
    assert_eq!(gw.io.published[&2][RETRIES_HEADER], "0");
    gw.post(3, chat_with_config("gw-key", &openai("sk", 9001)), CHAT);
    let length = [("content-type", "application/json"), ("content-length", "99")];
    assert_eq!(gw.response_headers(3, 200, &length, "via_upstream"), Output::proceed());
    assert!(!gw.io.published.contains_key(&3));
}
