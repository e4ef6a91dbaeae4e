//! Golden translation fixtures that fan out: each client request in `fixtures/requests/` goes
//! to every provider of `fixtures/targets.json`, and each provider's result is a snapshot,
//! `fixtures/snapshots/<case>/<provider>.json`: the upstream request with its auth, then the
//! client's answer when the case gives that provider's answer. `fixtures/README.md` describes
//! the files.
//!
//! Both directories are read by `build.rs` (the same tests run inside wasm under
//! wasm-bindgen-test, where there is no filesystem): a new request file is a new case. Every
//! case runs end to end through `prepare` (translation, then the provider's auth) and the
//! `Translator` methods. A snapshot that differs, is missing or is no longer made fails, all of
//! them reported together; `./build.sh fixtures` (`UPDATE_SNAPSHOTS=1` natively) writes them
//! again after an intended change, for the diff to be reviewed.

use crate::unit_tests::test;

use super::bedrock::eventstream::encode_frame;
use super::{bind_and_prepare, find, Outbound, Prepared, TargetFields, Usage};
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
    /// The client's path, e.g. `/v1/chat/completions`.
    path: String,
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
    /// cut anywhere), and whole.
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
    /// The gateway's answer when the translation refuses the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_error: Option<Answer>,
    /// With the provider's answer of the case (`answers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_response: Option<Answer>,
    /// The token counts the translator reports of that answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageCounts>,
}

#[derive(Serialize)]
struct UpstreamRequest {
    /// Below the provider's base URL, without the query.
    path: String,
    /// The provider's own query.
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
    /// The `data:` payloads of the client's stream, JSON (`"[DONE]"` as a string).
    #[serde(skip_serializing_if = "Option::is_none")]
    sse_data: Option<Vec<Value>>,
}

#[derive(Serialize)]
struct UsageCounts {
    prompt_tokens: u64,
    completion_tokens: u64,
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

/// The case's request made ready for `provider`, as the pipeline does.
fn prepare_case(
    case: &Case,
    provider: &str,
    target: &Target,
    check: &mut Check,
) -> Option<Result<Prepared, crate::errors::GatewayError>> {
    let Some(spec) = find(provider) else {
        check.fail("targets", format!("unknown provider '{provider}'"));
        return None;
    };
    let client = &case.client_request;
    let (endpoint, path) = match classify(&client.method, &client.path) {
        Ok(Route::Api { endpoint, path, .. }) => (endpoint, path),
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
    let clock = || NOW_MS;
    let outbound = Outbound {
        endpoint,
        path: &path,
        body: client.body.as_ref().map(Cow::Borrowed),
        overridden: client.overridden,
        strict_vendor_compliance: client.strict_vendor_compliance,
        now_ms: &clock,
        organization: client.vendor_organization.as_deref(),
        project: client.vendor_project.as_deref(),
        beta: client.vendor_beta.as_deref(),
        headers: &[],
    };
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
    Some(bind_and_prepare(spec.name, fields, custom_host, &client.method, outbound))
}

/// The snapshot of `case` sent to `provider`.
fn snapshot(case: &Case, provider: &str, target: &Target, check: &mut Check) -> Option<Snapshot> {
    let mut prepared = match prepare_case(case, provider, target, check)? {
        Ok(prepared) => prepared,
        Err(e) => {
            let request_error = Answer { status: e.status, body: Some(body_value(&e.to_json())), sse_data: None };
            return Some(Snapshot { request_error: Some(request_error), ..Snapshot::default() });
        }
    };
    let request = &prepared.request;
    let upstream_request = UpstreamRequest {
        path: request.path.clone(),
        query: request.query.clone(),
        headers: request.headers.iter().map(|(name, value)| format!("{name}: {value}")).collect(),
        body: request.body.as_deref().map(body_value),
    };
    let mut snapshot = Snapshot { upstream_request: Some(upstream_request), ..Snapshot::default() };
    if let Some(answer) = case.answers.get(provider) {
        snapshot.client_response = client_answer(case, provider, target, answer, &mut prepared, check);
        snapshot.usage = prepared
            .translator
            .usage()
            .map(|Usage { prompt_tokens, completion_tokens }| UsageCounts { prompt_tokens, completion_tokens });
    }
    Some(snapshot)
}

/// What the client gets of the provider's `answer`.
fn client_answer(
    case: &Case,
    provider: &str,
    target: &Target,
    answer: &ProviderResponse,
    prepared: &mut Prepared,
    check: &mut Check,
) -> Option<Answer> {
    let translator = &mut prepared.translator;
    // The caller keeps the provider's status.
    let status = answer.status;
    let chunks: Option<Vec<Vec<u8>>> = match (&answer.sse_chunks, &answer.event_stream) {
        (Some(chunks), None) => Some(chunks.iter().map(|chunk| chunk.as_bytes().to_vec()).collect()),
        (None, Some(frames)) => {
            let bytes: Vec<u8> = frames
                .iter()
                .flat_map(|frame| {
                    let headers: Vec<(&str, &str)> =
                        frame.headers.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
                    encode_frame(&headers, frame.payload.to_string().as_bytes())
                })
                .collect();
            Some(bytes.chunks(7).map(<[u8]>::to_vec).collect())
        }
        (None, None) => None,
        (Some(_), Some(_)) => {
            check.fail("answers", "sse_chunks and event_stream are exclusive");
            return None;
        }
    };
    match (&answer.body, chunks) {
        (Some(body), None) => {
            let sent = body.to_string().into_bytes();
            let out = if (200..300).contains(&status) {
                let out = match translator.response(&sent) {
                    Ok(out) => out,
                    // Refused: the client gets the gateway's error.
                    Err(e) => {
                        return Some(Answer { status: e.status, body: Some(body_value(&e.to_json())), sse_data: None })
                    }
                };
                if !translator.translates_responses() && out != sent {
                    check.fail("client_response.body", "an untranslated answer must pass byte for byte");
                }
                out
            } else {
                let headers: Vec<(String, Vec<u8>)> =
                    answer.headers.iter().map(|(n, v)| (n.clone(), v.as_bytes().to_vec())).collect();
                translator.error(status, &headers, &sent)
            };
            Some(Answer { status, body: Some(body_value(&out)), sse_data: None })
        }
        (None, Some(chunks)) => {
            let mut out = Vec::new();
            for chunk in &chunks {
                translator.stream(chunk, &mut out);
            }
            translator.stream_end(&mut out);
            // However the stream is split, the client gets the same bytes.
            if let Some(Ok(mut whole)) = prepare_case(case, provider, target, check) {
                let mut again = Vec::new();
                whole.translator.stream(&chunks.concat(), &mut again);
                whole.translator.stream_end(&mut again);
                if again != out {
                    check.fail("answers", "the output depends on where the stream is split");
                }
            }
            Some(Answer { status, body: None, sse_data: Some(sse_data(check, &out)) })
        }
        _ => {
            check.fail("answers", "needs exactly one of body, sse_chunks and event_stream");
            None
        }
    }
}

/// The `data:` payloads of the client's stream, which must be well formed.
fn sse_data(check: &mut Check, out: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(out);
    if !text.ends_with("\n\n") {
        check.fail("client_response.sse_data", format!("the stream does not end with a blank line: {text:?}"));
    }
    let mut data = Vec::new();
    for event in text.split_terminator("\n\n") {
        match event.strip_prefix("data: ") {
            Some("[DONE]") => data.push(Value::from("[DONE]")),
            Some(payload) => data.push(body_value(payload.as_bytes())),
            None => check.fail("client_response.sse_data", format!("not a single data line: {event:?}")),
        }
    }
    data
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
