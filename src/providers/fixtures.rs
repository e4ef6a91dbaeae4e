//! Golden translation fixtures: one JSON file per case under `fixtures/<provider>/`, each
//! holding the client's request, the upstream request the gateway makes of it, and where
//! relevant the provider's answer and what the client gets back. `fixtures/README.md`
//! describes the fields.
//!
//! The files are listed here one by one with `include_str!` (the same tests run inside wasm
//! under wasm-bindgen-test, where there is no filesystem): the list is the set of cases, and
//! a listed file that is missing fails to compile. Every fixture runs end to end through
//! `prepare` (translation, then the provider's auth) and the `Translator` methods; all
//! mismatches of all fixtures are reported together, each naming its fixture and field.

use crate::unit_tests::test;

use super::bedrock::eventstream::encode_frame;
use super::{bind_and_prepare, find, Outbound, Prepared, TargetFields, Usage};
use crate::request::chat;
use crate::request::endpoint::{classify, Endpoint, Route};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

macro_rules! fixtures {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("fixtures/", $name)))),*]
    };
}

/// Every fixture: its name (path below `fixtures/`) and its text.
const FIXTURES: &[(&str, &str)] = fixtures![
    "anthropic/basic_chat.json",
    "anthropic/system_and_developer.json",
    "anthropic/system_parts_with_cache_control.json",
    "anthropic/tools_tool_choice_required.json",
    "anthropic/tool_calls_and_results.json",
    "anthropic/thinking_resent_with_tool_use.json",
    "anthropic/image_parts.json",
    "anthropic/stop_user_max_tokens_default.json",
    "anthropic/answer_tool_use_thinking_strict.json",
    "anthropic/answer_tool_use_thinking_not_strict.json",
    "anthropic/stream_text_tool_call_usage.json",
    "anthropic/error_rate_limit.json",
    "anthropic/unsupported_endpoint.json",
    "google/system_tools_tool_turn.json",
    "google/answer_function_call.json",
    "vertex_ai/gemini_stream_text_function_call_usage.json",
    "vertex_ai/gemini_error_invalid_argument.json",
    "vertex_ai/anthropic_raw_predict.json",
    "openai/passthrough_chat.json",
    "openai/override_changed_body.json",
    "openai/vendor_headers_resource.json",
    "openai_compatible/detail_error.json",
    "bedrock/system_tools_tool_result.json",
    "bedrock/answer_tool_use.json",
    "bedrock/stream_text_tool_call_usage.json",
    "bedrock/stream_exception.json",
    "bedrock/error_validation.json",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fixture {
    #[allow(dead_code)] // For the reader.
    description: String,
    /// A provider name of `PROVIDERS`.
    provider: String,
    /// The host clock (Unix milliseconds); `created` is its seconds.
    now_ms: u64,
    client_request: ClientRequest,
    /// What is sent upstream; absent when the translation refuses the request.
    upstream_request: Option<UpstreamExpect>,
    /// The gateway's answer when the translation refuses the request.
    request_error: Option<ClientResponse>,
    provider_response: Option<ProviderResponse>,
    client_response: Option<ClientResponse>,
    /// What the translator reports of the answer; absent or null: nothing.
    usage: Option<UsageExpect>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientRequest {
    #[serde(default = "post")]
    method: String,
    /// The client's path, e.g. `/v1/chat/completions`.
    path: String,
    api_key: Option<String>,
    strict_vendor_compliance: bool,
    /// The body after `override_params`; null when the gateway does not read it.
    body: Option<Value>,
    /// Whether `override_params` changed the body.
    #[serde(default)]
    overridden: bool,
    vendor_organization: Option<String>,
    vendor_project: Option<String>,
    vendor_beta: Option<String>,
    /// The target's config (its cloud fields), checked as the gateway checks configs.
    config: Option<Value>,
}

fn post() -> String {
    "POST".to_string()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamExpect {
    path: String,
    /// The provider's own query, without `?`.
    query: Option<String>,
    /// In order: the provider's headers, then the credential.
    headers: Vec<(String, String)>,
    /// Null: the client's bytes go as they came.
    body: Option<Value>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientResponse {
    status: u16,
    body: Option<Value>,
    /// The `data:` payloads of the client's stream, JSON (`"[DONE]"` as a string).
    sse_data: Option<Vec<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageExpect {
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// The mismatches of one fixture.
struct Check<'a> {
    name: &'a str,
    failures: Vec<String>,
}

impl Check<'_> {
    fn fail(&mut self, field: &str, message: impl std::fmt::Display) {
        self.failures.push(format!("{}: {field}: {message}", self.name));
    }

    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, field: &str, expected: &T, actual: &T) {
        if expected != actual {
            self.fail(field, format!("expected {expected:?}\n     got {actual:?}"));
        }
    }

    /// Each differing leaf on its own line, named by its path below `field`.
    fn json_eq(&mut self, field: &str, expected: &Value, actual: &Value) {
        let mut differences = Vec::new();
        json_diff(field, expected, actual, &mut differences);
        for (at, message) in differences {
            self.fail(&at, message);
        }
    }

    /// A body the gateway produced, compared as JSON.
    fn body_eq(&mut self, field: &str, expected: &Value, actual: &[u8]) {
        match serde_json::from_slice::<Value>(actual) {
            Ok(actual) => self.json_eq(field, expected, &actual),
            Err(e) => self.fail(field, format!("not JSON ({e}): {}", String::from_utf8_lossy(actual))),
        }
    }
}

fn json_diff(at: &str, expected: &Value, actual: &Value, out: &mut Vec<(String, String)>) {
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, value) in expected {
                match actual.get(key) {
                    Some(got) => json_diff(&format!("{at}.{key}"), value, got, out),
                    None => out.push((format!("{at}.{key}"), format!("missing; expected {value}"))),
                }
            }
            for (key, value) in actual.iter().filter(|(key, _)| !expected.contains_key(*key)) {
                out.push((format!("{at}.{key}"), format!("not expected; got {value}")));
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            for (i, (value, got)) in expected.iter().zip(actual).enumerate() {
                json_diff(&format!("{at}[{i}]"), value, got, out);
            }
            for (i, value) in expected.iter().enumerate().skip(actual.len()) {
                out.push((format!("{at}[{i}]"), format!("missing; expected {value}")));
            }
            for (i, value) in actual.iter().enumerate().skip(expected.len()) {
                out.push((format!("{at}[{i}]"), format!("not expected; got {value}")));
            }
        }
        _ if expected != actual => out.push((at.to_string(), format!("expected {expected}, got {actual}"))),
        _ => {}
    }
}

/// The fixture's request made ready for its provider, as the pipeline does.
fn prepare_fixture(fixture: &Fixture, check: &mut Check) -> Option<Result<Prepared, crate::errors::GatewayError>> {
    let Some(spec) = find(&fixture.provider) else {
        check.fail("provider", format!("unknown provider '{}'", fixture.provider));
        return None;
    };
    let client = &fixture.client_request;
    let (endpoint, path) = match classify(&client.method, &client.path) {
        Ok(Route::Api { endpoint, path, .. }) => (endpoint, path),
        other => {
            check.fail("client_request.path", format!("not an API route: {other:?}"));
            return None;
        }
    };
    // The pipeline validates chat bodies before translating them: a fixture's request is one
    // the gateway accepts.
    if let (Endpoint::ChatCompletions, Some(body)) = (endpoint, &client.body) {
        if let Err(e) = chat::validate_chat_request(body) {
            check.fail("client_request.body", format!("the gateway would refuse it: {e:?}"));
        }
    }
    let now_ms = fixture.now_ms;
    let clock = move || now_ms;
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
    };
    let cloud = match &client.config {
        Some(config) => match crate::config::parse_config(config) {
            Ok(config) => config.cloud,
            Err(e) => {
                check.fail("client_request.config", e.to_string());
                return None;
            }
        },
        None => crate::cloud::CloudFields::default(),
    };
    // A config names the target's place (a region); without one, a target without a key or a
    // public endpoint is a local server.
    let local = client.config.is_none() && (client.api_key.is_none() || spec.base_url.is_none());
    let fields = TargetFields { api_key: client.api_key.as_deref(), custom_host: local, built_in: None, cloud: &cloud };
    let custom_host = local.then_some("http://127.0.0.1:8000/v1");
    Some(bind_and_prepare(spec.name, fields, custom_host, &client.method, outbound))
}

fn check_fixture(name: &str, text: &str) -> Vec<String> {
    let mut check = Check { name, failures: Vec::new() };
    let fixture: Fixture = match serde_json::from_str(text) {
        Ok(fixture) => fixture,
        Err(e) => {
            check.fail("(file)", format!("not a fixture: {e}"));
            return check.failures;
        }
    };
    let Some(result) = prepare_fixture(&fixture, &mut check) else {
        return check.failures;
    };
    let mut prepared = match (result, &fixture.upstream_request, &fixture.request_error) {
        (Ok(prepared), Some(expected), None) => {
            check_upstream(&mut check, expected, &prepared);
            prepared
        }
        (Err(e), None, Some(expected)) => {
            check.eq("request_error.status", &expected.status, &e.status);
            if let Some(body) = &expected.body {
                check.body_eq("request_error.body", body, &e.to_json());
            }
            return check.failures;
        }
        (Ok(prepared), None, Some(_)) => {
            check.fail("request_error", format!("the request was translated: {:?}", prepared.request));
            return check.failures;
        }
        (Err(e), Some(_), None) => {
            check.fail("upstream_request", format!("the translation refused the request: {e:?}"));
            return check.failures;
        }
        _ => {
            check.fail("(file)", "needs exactly one of upstream_request and request_error");
            return check.failures;
        }
    };

    match (&fixture.provider_response, &fixture.client_response) {
        (Some(provider), Some(client)) => {
            check_response(&mut check, &fixture, provider, client, &mut prepared);
        }
        (None, None) => {}
        _ => check.fail("client_response", "provider_response and client_response go together"),
    }
    let expected_usage = fixture
        .usage
        .as_ref()
        .map(|u| Usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens });
    check.eq("usage", &expected_usage, &prepared.translator.usage());
    check.failures
}

fn check_upstream(check: &mut Check, expected: &UpstreamExpect, prepared: &Prepared) {
    let request = &prepared.request;
    check.eq("upstream_request.path", &expected.path, &request.path);
    check.eq("upstream_request.query", &expected.query, &request.query);
    let headers: Vec<(String, String)> =
        request.headers.iter().map(|(name, value)| (name.to_string(), value.clone())).collect();
    check.eq("upstream_request.headers", &expected.headers, &headers);
    match (&expected.body, &request.body) {
        (Some(body), Some(sent)) => check.body_eq("upstream_request.body", body, sent),
        (None, None) => {}
        (Some(_), None) => check.fail("upstream_request.body", "expected a body; the client's bytes are sent"),
        (None, Some(sent)) => check.fail(
            "upstream_request.body",
            format!("expected the client's bytes; got {}", String::from_utf8_lossy(sent)),
        ),
    }
}

fn check_response(
    check: &mut Check,
    fixture: &Fixture,
    provider: &ProviderResponse,
    client: &ClientResponse,
    prepared: &mut Prepared,
) {
    // The caller keeps the provider's status; the fixture states it for the reader.
    check.eq("client_response.status", &provider.status, &client.status);
    let translator = &mut prepared.translator;
    let chunks: Option<Vec<Vec<u8>>> = match (&provider.sse_chunks, &provider.event_stream) {
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
            check.fail("provider_response", "sse_chunks and event_stream are exclusive");
            return;
        }
    };
    match (&provider.body, chunks) {
        (Some(body), None) => {
            let sent = body.to_string().into_bytes();
            let answer = if (200..300).contains(&provider.status) {
                let answer = match translator.response(&sent) {
                    Ok(answer) => answer,
                    Err(e) => {
                        check.fail("client_response.body", format!("the answer was refused: {e:?}"));
                        return;
                    }
                };
                if !translator.translates_responses() && answer != sent {
                    check.fail("client_response.body", "an untranslated answer must pass byte for byte");
                }
                answer
            } else {
                let headers: Vec<(String, Vec<u8>)> =
                    provider.headers.iter().map(|(n, v)| (n.clone(), v.as_bytes().to_vec())).collect();
                translator.error(provider.status, &headers, &sent)
            };
            match &client.body {
                Some(expected) => check.body_eq("client_response.body", expected, &answer),
                None => check.fail("client_response.body", "missing"),
            }
        }
        (None, Some(chunks)) => {
            let mut out = Vec::new();
            for chunk in &chunks {
                translator.stream(chunk, &mut out);
            }
            translator.stream_end(&mut out);
            check_stream(check, client, &out);
            // However the stream is split, the client gets the same bytes.
            if let Some(Ok(mut whole)) = prepare_fixture(fixture, check) {
                let mut again = Vec::new();
                whole.translator.stream(&chunks.concat(), &mut again);
                whole.translator.stream_end(&mut again);
                if again != out {
                    check.fail("provider_response", "the output depends on where the stream is split");
                }
            }
        }
        _ => check.fail("provider_response", "needs exactly one of body, sse_chunks and event_stream"),
    }
}

fn check_stream(check: &mut Check, client: &ClientResponse, out: &[u8]) {
    let Some(expected) = &client.sse_data else {
        check.fail("client_response.sse_data", "missing");
        return;
    };
    let Ok(text) = std::str::from_utf8(out) else {
        check.fail("client_response.sse_data", "the stream is not UTF-8");
        return;
    };
    if !text.ends_with("\n\n") {
        check.fail("client_response.sse_data", format!("the stream does not end with a blank line: {text:?}"));
    }
    let mut actual = Vec::new();
    for event in text.split_terminator("\n\n") {
        let Some(data) = event.strip_prefix("data: ") else {
            check.fail("client_response.sse_data", format!("not a single data line: {event:?}"));
            return;
        };
        let value = if data == "[DONE]" { Some(Value::from("[DONE]")) } else { serde_json::from_str(data).ok() };
        match value {
            Some(value) => actual.push(value),
            None => {
                check.fail("client_response.sse_data", format!("not JSON: {data}"));
                return;
            }
        }
    }
    check.json_eq("client_response.sse_data", &Value::Array(expected.clone()), &Value::Array(actual));
}

#[test]
fn translation_fixtures() {
    let failures: Vec<String> = FIXTURES.iter().flat_map(|(name, text)| check_fixture(name, text)).collect();
    assert!(failures.is_empty(), "{} fixture mismatches:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// Natively, a fixture file that is not in `FIXTURES` fails too (it would never run).
// The one unit test that runs natively only: it lists the source tree, and the wasm test build
// (wasm32-unknown-unknown under Node) has no filesystem; the cases it guards run in both.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn every_fixture_file_is_listed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/providers/fixtures");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "json") {
                files.push(file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let listed: Vec<&str> = FIXTURES.iter().map(|(name, _)| *name).collect();
    let unlisted: Vec<&String> = files.iter().filter(|f| !listed.contains(&f.as_str())).collect();
    assert!(unlisted.is_empty(), "fixture files not listed in FIXTURES: {unlisted:?}");
}
