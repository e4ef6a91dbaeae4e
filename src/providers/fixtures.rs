//! Golden translation fixtures that fan out: each client request in `fixtures/requests/` goes
//! to every provider of `fixtures/targets.json`, and each provider's result is a snapshot,
//! `fixtures/snapshots/<case>/<provider>.json`: the upstream request with its auth, then the
//! client's answer when the case gives that provider's answer. `fixtures/README.md` describes
//! the files.
//!
//! Both directories are read by `build.rs` (the same tests run inside wasm under
//! wasm-bindgen-test, where there is no filesystem): a new request file is a new case. Every
//! case runs through the gateway's own steps: `pipeline::in_target_api` (a client API's request
//! as it came to a target that speaks it, else as chat with `client_api::Reply` bringing the
//! answers back), `prepare` (translation, then the provider's auth), then the exchange's
//! `response_mode` and `finish` for a whole answer, or the `Translator` stream methods fed
//! piece by piece. A snapshot that differs, is missing or is no longer made fails, all of
//! them reported together; `./build.sh fixtures` (`UPDATE_SNAPSHOTS=1` natively) writes them
//! again after an intended change, for the diff to be reviewed.

use crate::unit_tests::test;

use super::bedrock::eventstream::encode_frame;
use super::{bind_target, find, prepare, Destination, Outbound, TargetFields, Translator, Usage};
use crate::client_api::{self, Reply};
use crate::errors::GatewayError;
use crate::exchange::reply::{finish, gateway_error, response_mode, Finished, ResponseMode};
use crate::exchange::usage::UsageScan;
use crate::pipeline::{in_target_api, ResponsePlan, TargetRequest, KEPT_RESPONSE_PREFIX};
use crate::request::chat;
use crate::request::endpoint::{classify, Endpoint, Route};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

// REQUESTS and SNAPSHOTS: (name, text), listed by build.rs.
include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

const TARGETS: &str = include_str!("fixtures/targets.json");

/// The host clock of every case (Unix milliseconds): translated answers have `created` =
/// its seconds, and AWS signatures its time.
const NOW_MS: u64 = 1_700_000_000_123;

/// The id the gateway gives a Responses answer of a translating target (it draws two random
/// numbers): here 1 and 2.
fn response_id() -> String {
    format!("{KEPT_RESPONSE_PREFIX}{:016x}{:016x}", 1, 2)
}

/// One provider's target: its key and its config node (cloud fields).
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Target {
    api_key: Option<String>,
    /// Checked as the gateway checks configs.
    config: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[allow(dead_code)] // For the reader.
    description: String,
    client_request: ClientRequest,
    /// Targets of this case that differ from `targets.json`, by provider.
    #[serde(default)]
    targets: BTreeMap<String, Target>,
    /// The providers' answers, by provider: those snapshots also hold the client's answer.
    #[serde(default)]
    answers: BTreeMap<String, ProviderResponse>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientRequest {
    #[serde(default = "post")]
    method: String,
    /// The client's path with its query, e.g. `/v1/chat/completions` or `/v1/messages?beta=true`.
    path: String,
    /// The client's request headers a translator reads, e.g. `anthropic-version`.
    #[serde(default)]
    headers: Vec<(String, String)>,
    strict_vendor_compliance: bool,
    /// The body after `override_params`; null when the gateway does not read it.
    body: Option<Value>,
    /// Whether `override_params` changed the body.
    #[serde(default)]
    overridden: bool,
    vendor_organization: Option<String>,
    vendor_project: Option<String>,
    vendor_beta: Option<String>,
}

fn post() -> String {
    "POST".to_string()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderResponse {
    status: u16,
    #[serde(default)]
    headers: Vec<(String, String)>,
    /// A JSON body (sent compact).
    body: Option<Value>,
    /// A server-sent event stream, as the chunks it arrives in.
    sse_chunks: Option<Vec<String>>,
    /// An AWS event stream (binary), as its frames; it is fed in chunks of 7 bytes (frames
    /// cut anywhere).
    event_stream: Option<Vec<EventFrame>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventFrame {
    /// String headers, e.g. `[":event-type", "messageStart"]`.
    headers: Vec<(String, String)>,
    /// Sent compact.
    payload: Value,
}

/// What one provider makes of one case, as written to its snapshot file.
#[derive(Serialize, Default)]
struct Snapshot {
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_request: Option<UpstreamRequest>,
    /// The gateway's answer when it refuses the request for this target.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_error: Option<Answer>,
    /// With the provider's answer of the case (`answers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_response: Option<Answer>,
    /// The token counts the gateway records of that answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageCounts>,
    /// The id under which the gateway keeps a translated Responses answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept_as: Option<String>,
}

#[derive(Serialize)]
struct UpstreamRequest {
    /// Below the provider's base URL, without the query.
    path: String,
    /// The query sent: the provider's own, then the client's.
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<String>,
    /// `name: value`, in order: the provider's headers, then the credential.
    headers: Vec<String>,
    /// Null: the client's bytes go unchanged.
    body: Option<Value>,
}

#[derive(Serialize)]
struct Answer {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
    /// The `event:` names of the client's stream, when it names its events.
    #[serde(skip_serializing_if = "Option::is_none")]
    sse_events: Option<Vec<String>>,
    /// The `data:` payloads of the client's stream, JSON (`"[DONE]"` as a string).
    #[serde(skip_serializing_if = "Option::is_none")]
    sse_data: Option<Vec<Value>>,
}

impl Answer {
    fn of(finished: Finished) -> Answer {
        Answer { status: finished.status, body: Some(body_value(&finished.body)), sse_events: None, sse_data: None }
    }
}

#[derive(Serialize)]
struct UsageCounts {
    prompt_tokens: u64,
    /// Absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    cached_prompt_tokens: u64,
    /// Absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    cache_write_prompt_tokens: u64,
    completion_tokens: u64,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// What a case breaks beyond its snapshots (a request the gateway would refuse, a stream whose
/// output depends on where it is cut, ...).
struct Check<'a> {
    name: &'a str,
    failures: Vec<String>,
}

impl Check<'_> {
    fn fail(&mut self, field: &str, message: impl std::fmt::Display) {
        self.failures.push(format!("{}: {field}: {message}", self.name));
    }
}

/// A body the gateway produced: JSON, else its text.
fn body_value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// A case's request made ready for one provider: the upstream request, its `:path`, and the
/// plan the answer goes back through.
struct Sent {
    request: super::UpstreamRequest,
    path: String,
    plan: ResponsePlan,
}

/// The case's request made ready for `provider` as the pipeline makes it. An error is the
/// gateway's answer, in the client's API.
fn prepare_case(case: &Case, provider: &str, target: &Target, check: &mut Check) -> Option<Result<Sent, Finished>> {
    let Some(spec) = find(provider) else {
        check.fail("targets", format!("unknown provider '{provider}'"));
        return None;
    };
    let client = &case.client_request;
    let (endpoint, path, query) = match classify(&client.method, &client.path) {
        Ok(Route::Api { endpoint, path, query, .. }) => (endpoint, path, query),
        other => {
            check.fail("client_request.path", format!("not an API route: {other:?}"));
            return None;
        }
    };
    // The pipeline validates chat bodies before translating them: a case's request is one the
    // gateway accepts.
    if let (Endpoint::ChatCompletions, Some(body)) = (endpoint, &client.body) {
        if let Err(e) = chat::validate_chat_request(body) {
            check.fail("client_request.body", format!("the gateway would refuse it: {e:?}"));
        }
    }
    let cloud = match &target.config {
        Some(config) => match crate::config::parse_config(config) {
            Ok(config) => config.cloud,
            Err(e) => {
                check.fail(&format!("targets.{provider}.config"), e.to_string());
                return None;
            }
        },
        None => crate::cloud::CloudFields::default(),
    };
    // A config names the target's place (a region); without one, a target without a key or a
    // public endpoint is a local server.
    let local = target.config.is_none() && (target.api_key.is_none() || spec.base_url.is_none());
    let fields = TargetFields { api_key: target.api_key.as_deref(), custom_host: local, built_in: None, cloud: &cloud };
    let custom_host = local.then_some("http://127.0.0.1:8000/v1");
    let api = endpoint.client_api();
    let refused = |e: GatewayError| Some(Err(gateway_error(&e, api)));
    let (backend, upstream) = match bind_target(spec.name, fields, custom_host) {
        Ok(bound) => bound,
        Err(e) => return refused(e),
    };
    let clock = || NOW_MS;
    let headers: Vec<(String, Vec<u8>)> =
        client.headers.iter().map(|(name, value)| (name.clone(), value.as_bytes().to_vec())).collect();
    let translator = backend.translator();
    let asked = TargetRequest {
        endpoint,
        path: &path,
        query: query.as_deref(),
        body: client.body.as_ref().map(Cow::Borrowed),
        strict_vendor_compliance: client.strict_vendor_compliance,
    };
    let response_id = response_id();
    let (sent, shape) = match in_target_api(asked, spec.name, translator.as_ref(), Some(&response_id), &clock) {
        Ok(sent) => sent,
        Err(e) => return refused(e),
    };
    let outbound = Outbound {
        endpoint: sent.endpoint,
        path: sent.path,
        body: sent.body,
        // A translated request is not the client's body (as in the pipeline).
        overridden: client.overridden || shape.is_some(),
        strict_vendor_compliance: sent.strict_vendor_compliance,
        now_ms: &clock,
        organization: client.vendor_organization.as_deref(),
        project: client.vendor_project.as_deref(),
        beta: client.vendor_beta.as_deref(),
        headers: &headers,
    };
    let to = Destination {
        backend: backend.as_ref(),
        upstream: &upstream,
        method: &client.method,
        query: sent.query,
        token: None,
    };
    let prepared = match prepare(to, translator, outbound) {
        Ok(prepared) => prepared,
        Err(e) => return refused(e),
    };
    let translator: Box<dyn Translator> = match shape {
        Some(shape) => Box::new(Reply::new(prepared.translator, shape)),
        None => prepared.translator,
    };
    let plan = ResponsePlan { provider: spec, translator, api };
    Some(Ok(Sent { request: prepared.request, path: prepared.path, plan }))
}

/// The snapshot of `case` sent to `provider`.
fn snapshot(case: &Case, provider: &str, target: &Target, check: &mut Check) -> Option<Snapshot> {
    let Sent { request, path: sent_path, plan } = match prepare_case(case, provider, target, check)? {
        Ok(prepared) => prepared,
        Err(refused) => {
            if case.answers.contains_key(provider) {
                check.fail("answers", format!("an answer from '{provider}', which the request never reaches"));
            }
            return Some(Snapshot { request_error: Some(Answer::of(refused)), ..Snapshot::default() });
        }
    };
    let upstream_request = UpstreamRequest {
        path: request.path.clone(),
        query: sent_path.split_once('?').map(|(_, query)| query.to_string()),
        headers: request.headers.iter().map(|(name, value)| format!("{name}: {value}")).collect(),
        body: request.body.as_deref().map(body_value),
    };
    let mut snapshot = Snapshot { upstream_request: Some(upstream_request), ..Snapshot::default() };
    if let Some(answer) = case.answers.get(provider) {
        if let Some(received) = client_answer(case, provider, target, answer, plan, check) {
            snapshot.client_response = Some(received.answer);
            snapshot.usage = received.usage.map(|usage| UsageCounts {
                prompt_tokens: usage.prompt_tokens,
                cached_prompt_tokens: usage.cached_prompt_tokens,
                cache_write_prompt_tokens: usage.cache_write_prompt_tokens,
                completion_tokens: usage.completion_tokens,
            });
            snapshot.kept_as = received.kept_as;
        }
    }
    Some(snapshot)
}

/// What the client gets of one answer, and what the gateway records and keeps of it.
struct Received {
    answer: Answer,
    usage: Option<Usage>,
    kept_as: Option<String>,
}

/// The provider's answer as it arrives: a whole JSON body, or a stream in the pieces it arrives
/// in.
enum Arrival {
    Whole(Vec<u8>),
    Stream(Vec<Vec<u8>>),
}

/// What the client gets of the provider's `answer`. A stream is fed as the case cuts it, whole,
/// and in pieces of 1, 2 and 3 bytes in turn (each through a plan of its own): the client must
/// get the same bytes, usage and kept answer each time.
fn client_answer(
    case: &Case,
    provider: &str,
    target: &Target,
    answer: &ProviderResponse,
    mut plan: ResponsePlan,
    check: &mut Check,
) -> Option<Received> {
    let arrival = match (&answer.body, &answer.sse_chunks, &answer.event_stream) {
        (Some(body), None, None) => Arrival::Whole(body.to_string().into_bytes()),
        (None, Some(chunks), None) => Arrival::Stream(chunks.iter().map(|chunk| chunk.as_bytes().to_vec()).collect()),
        (None, None, Some(frames)) => {
            let bytes: Vec<u8> = frames
                .iter()
                .flat_map(|frame| {
                    let headers: Vec<(&str, &str)> =
                        frame.headers.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
                    encode_frame(&headers, frame.payload.to_string().as_bytes())
                })
                .collect();
            Arrival::Stream(bytes.chunks(7).map(<[u8]>::to_vec).collect())
        }
        _ => {
            check.fail("answers", "needs exactly one of body, sse_chunks and event_stream");
            return None;
        }
    };
    let headers: Vec<(String, Vec<u8>)> =
        answer.headers.iter().map(|(name, value)| (name.clone(), value.as_bytes().to_vec())).collect();
    // The client asked for JSON unless it asked for a stream (every fixture endpoint reports
    // usage).
    let body = case.client_request.body.as_ref();
    let expects_json = body.and_then(|b| b.get("stream")).and_then(Value::as_bool) != Some(true);
    let is_stream = matches!(arrival, Arrival::Stream(_));
    let mode = response_mode(&plan, false, answer.status, expects_json, is_stream);
    let pieces = match arrival {
        Arrival::Whole(body) => return Some(received_whole(&mut plan, mode, answer.status, &headers, body, check)),
        Arrival::Stream(pieces) if matches!(mode, ResponseMode::Stream | ResponseMode::Passthrough) => pieces,
        Arrival::Stream(pieces) => {
            return Some(received_whole(&mut plan, mode, answer.status, &headers, pieces.concat(), check))
        }
    };
    let first = streamed(&mut plan, mode, &pieces);
    // However the stream is cut, the client gets the same.
    let whole = pieces.concat();
    for (how, pieces) in [("whole", vec![whole.clone()]), ("in pieces of 1 to 3 bytes", small_pieces(&whole))] {
        if let Some(Ok(mut again)) = prepare_case(case, provider, target, check) {
            if streamed(&mut again.plan, mode, &pieces) != first {
                check.fail("answers", format!("the client gets another stream when it arrives {how}"));
            }
        }
    }
    let (out, usage, kept) = first;
    if let Some((_, kept)) = &kept {
        if client_api::stream_answer(plan.api, &out).as_ref() != kept.get("response") {
            check.fail("answers", "the gateway keeps another response than the one the stream completed");
        }
    }
    let (sse_events, sse_data) = sse_events(check, &out);
    let answer = Answer { status: answer.status, body: None, sse_events, sse_data: Some(sse_data) };
    Some(Received { answer, usage, kept_as: kept.map(|(id, _)| id) })
}

/// `bytes` in pieces of 1, 2, 3, 1, 2, 3, ... bytes.
fn small_pieces(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut rest = bytes;
    for size in [1, 2, 3].into_iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (piece, after) = rest.split_at(size.min(rest.len()));
        pieces.push(piece.to_vec());
        rest = after;
    }
    pieces
}

/// A whole answer as the exchange finishes it: the client's answer, the usage it records (an
/// answer that passes untouched tells its own) and what it keeps.
fn received_whole(
    plan: &mut ResponsePlan,
    mode: ResponseMode,
    status: u16,
    headers: &[(String, Vec<u8>)],
    body: Vec<u8>,
    check: &mut Check,
) -> Received {
    let finished = finish(plan, mode, status, headers, body);
    let passed = mode == ResponseMode::Passthrough && (200..300).contains(&status);
    let usage = if passed { UsageScan::of(&finished.body) } else { plan.translator.usage() };
    let kept = plan.translator.kept();
    if let Some((_, kept)) = &kept {
        if Some(&body_value(&finished.body)) != kept.get("response") {
            check.fail("answers", "the gateway keeps another response than the one the client got");
        }
    }
    Received { answer: Answer::of(finished), usage, kept_as: kept.map(|(id, _)| id) }
}

/// A stream as the exchange passes it on, piece by piece as it arrives: the client's bytes,
/// the usage it records and what it keeps.
fn streamed(
    plan: &mut ResponsePlan,
    mode: ResponseMode,
    pieces: &[Vec<u8>],
) -> (Vec<u8>, Option<Usage>, Option<(String, Value)>) {
    let mut out = Vec::new();
    if mode == ResponseMode::Passthrough {
        let mut scan = UsageScan::default();
        for piece in pieces {
            scan.push(piece);
            out.extend_from_slice(piece);
        }
        return (out, scan.usage(), None);
    }
    let translator = &mut plan.translator;
    for piece in pieces {
        translator.stream(piece, &mut out);
    }
    translator.stream_end(&mut out);
    (out, translator.usage(), translator.kept())
}

/// The `event:` names (when the stream names its events) and `data:` payloads of the client's
/// stream, which must be well formed: each event one data line, after its name if it has one,
/// the name its data's `type`.
fn sse_events(check: &mut Check, out: &[u8]) -> (Option<Vec<String>>, Vec<Value>) {
    let text = String::from_utf8_lossy(out);
    if !text.ends_with("\n\n") {
        check.fail("client_response.sse_data", format!("the stream does not end with a blank line: {text:?}"));
    }
    let (mut names, mut data) = (Vec::new(), Vec::new());
    for event in text.split_terminator("\n\n") {
        let mut lines = event.split('\n');
        let first = lines.next().unwrap_or_default();
        let (name, line) = match first.strip_prefix("event: ") {
            Some(name) => (Some(name), lines.next()),
            None => (None, Some(first)),
        };
        let Some(payload) = line.and_then(|line| line.strip_prefix("data: ")).filter(|_| lines.next().is_none()) else {
            check.fail("client_response.sse_data", format!("not one data line after an event line: {event:?}"));
            continue;
        };
        let value = if payload == "[DONE]" { Value::from(payload) } else { body_value(payload.as_bytes()) };
        if let (Some(name), Some(kind)) = (name, value.get("type").and_then(Value::as_str)) {
            if name != kind {
                check.fail("client_response.sse_events", format!("event '{name}' carries data of type '{kind}'"));
            }
        }
        names.extend(name.map(str::to_string));
        data.push(value);
    }
    match names.len() {
        0 => (None, data),
        n if n == data.len() => (Some(names), data),
        _ => {
            check.fail("client_response.sse_events", "some events are named, some not");
            (Some(names), data)
        }
    }
}

/// Every snapshot the cases make now, by "case/provider", as the text written to its file.
fn make_snapshots(failures: &mut Vec<String>) -> BTreeMap<String, String> {
    let targets: BTreeMap<String, Target> = match serde_json::from_str(TARGETS) {
        Ok(targets) => targets,
        Err(e) => {
            failures.push(format!("targets.json: {e}"));
            return BTreeMap::new();
        }
    };
    let mut made = BTreeMap::new();
    for (name, text) in REQUESTS {
        let mut check = Check { name, failures: Vec::new() };
        match serde_json::from_str::<Case>(text) {
            Ok(case) => {
                for provider in case.answers.keys().chain(case.targets.keys()) {
                    if !targets.contains_key(provider) {
                        check.fail("answers/targets", format!("'{provider}' is not a provider of targets.json"));
                    }
                }
                for (provider, default) in &targets {
                    let target = case.targets.get(provider).unwrap_or(default);
                    if let Some(snapshot) = snapshot(&case, provider, target, &mut check) {
                        let text = serde_json::to_string_pretty(&snapshot).unwrap_or_default() + "\n";
                        made.insert(format!("{name}/{provider}"), text);
                    }
                }
            }
            Err(e) => check.fail("(file)", format!("not a case: {e}")),
        }
        failures.append(&mut check.failures);
    }
    made
}

/// `./build.sh fixtures`: natively, with `UPDATE_SNAPSHOTS=1`, the snapshots are written again
/// (and those no case makes any more removed) instead of compared.
#[cfg(not(target_arch = "wasm32"))]
fn update_requested() -> bool {
    std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v != "0")
}

#[cfg(target_arch = "wasm32")]
fn update_requested() -> bool {
    false
}

#[cfg(not(target_arch = "wasm32"))]
fn write_snapshots(made: &BTreeMap<String, String>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/providers/fixtures/snapshots");
    let _ = std::fs::remove_dir_all(&root);
    for (key, text) in made {
        let path = root.join(format!("{key}.json"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, text).unwrap();
    }
}

#[cfg(target_arch = "wasm32")]
fn write_snapshots(_: &BTreeMap<String, String>) {}

/// The first line where `expected` and `actual` differ, for the failure message.
fn first_difference(expected: &str, actual: &str) -> String {
    let mut lines = expected.lines().zip(actual.lines()).enumerate();
    match lines.find(|(_, (e, a))| e != a) {
        Some((i, (e, a))) => format!("line {}:\n  snapshot: {e}\n  now:      {a}", i + 1),
        None => "one is longer than the other".to_string(),
    }
}

#[test]
fn translation_fixtures() {
    let mut failures = Vec::new();
    let made = make_snapshots(&mut failures);
    if update_requested() {
        write_snapshots(&made);
    } else {
        let stored: BTreeMap<&str, &str> = SNAPSHOTS.iter().copied().collect();
        for (key, text) in &made {
            match stored.get(key.as_str()) {
                Some(stored) if stored == text => {}
                Some(stored) => {
                    failures.push(format!("{key}: differs from its snapshot, {}", first_difference(stored, text)))
                }
                None => failures.push(format!("{key}: no snapshot yet")),
            }
        }
        for key in stored.keys().filter(|key| !made.contains_key(**key)) {
            failures.push(format!("{key}: a snapshot no case makes"));
        }
        if !failures.is_empty() {
            failures.push("After an intended change, `./build.sh fixtures` writes the snapshots again.".to_string());
        }
    }
    assert!(!REQUESTS.is_empty(), "no request files found");
    assert!(failures.is_empty(), "{} fixture failures:\n\n{}", failures.len(), failures.join("\n\n"));
}
