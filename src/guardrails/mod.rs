//! Guardrails and hooks (spec 2.6, 2.7, 4.3): the checks, their verdicts and the bodies they
//! produce, as plain Rust. The exchange runs them; nothing here knows of proxy-wasm.
//!
//! How the exchange drives a stage (before the request, or after the response):
//! 1. `verdict::items` turns a config's hooks and inline guardrails into `Item`s.
//! 2. `verdict::StageRun::start` evaluates every check of those items against an `Input`.
//!    Most checks decide at once. A check that needs the network yields a `PendingCall`: the
//!    exchange dispatches its `CallSpec` and, when the call answers (or fails, or times out:
//!    status 0), hands the `Reply` to `StageRun::answer`, which runs the pending call's
//!    `Continuation` (the webhook's verdict, the JWT verified against a fetched JWKS). Calls
//!    listed in `sends` (`default.log`) are fire-and-forget: dispatch them, ignore the answer.
//! 3. Once `StageRun::is_done`, `StageRun::finish` gives one `ItemResult` per item;
//!    `verdict::outcome` says Pass, Flag (answer 246) or Deny (answer 446), and
//!    `verdict::hook_results`, `verdict::with_hook_results` and `verdict::denied_body` build the
//!    JSON.
//!
//! Async items (`async: true`, after-request only) are run the same way after the answer went
//! out; their results go to the log and never change the answer (`outcome` ignores them).

pub(crate) mod calls;
mod checks;
pub(crate) mod inject;
pub(crate) mod jwt;
mod schema;
pub(crate) mod verdict;

// What a config or stored guardrail says, and the checks' parameters: the shared crate's.
pub(crate) use gateway_schema::guardrails::{params, spec};

#[cfg(test)]
pub(crate) mod tests;

use crate::json_check::shorten;
use crate::ports::SharedStore;
use calls::{CallSpec, Continuation};
use params::CheckParams;
pub(crate) use params::CHECK_IDS;
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};
use spec::Check;

/// Which side of the provider call a check runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// `before_request_hooks`, `input_guardrails`: sees the request.
    Before,
    /// `after_request_hooks`, `output_guardrails`: sees the request and the response.
    After,
}

/// What a check sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Input<'a> {
    pub(crate) stage: Stage,
    /// Before: the last message's text parts (`request_text`); after: the first choice's
    /// message content (`response_text`).
    pub(crate) text: &'a str,
    /// The client's request body.
    pub(crate) request: &'a Value,
    /// The provider's answer (after the response only).
    pub(crate) response: Option<&'a Value>,
    /// The `x-gateway-metadata` map.
    pub(crate) metadata: Option<&'a Map<String, Value>>,
    /// The client's request headers: lowercase names, raw values (for `default.jwt`).
    pub(crate) headers: &'a [(String, Vec<u8>)],
    /// The model the request asked for.
    pub(crate) model: &'a str,
}

/// What a check needs from the core besides its input.
pub(crate) struct Env<'a> {
    /// Unix time in seconds, for token lifetimes.
    pub(crate) now_s: u64,
    /// The cached JWKS of a URI, if the core holds one (shared data).
    pub(crate) jwks: &'a dyn Fn(&str) -> Option<CachedJwks>,
}

/// A JWKS as the core cached it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CachedJwks {
    pub(crate) json: Vec<u8>,
    /// When it was fetched (Unix seconds): decides freshness (`cacheMaxAge`) and the
    /// unknown-`kid` refetch (at most once per `jwt::REFETCH_AFTER_S`).
    pub(crate) fetched_at_s: u64,
}

fn jwks_key(uri: &str) -> String {
    format!("jwks:{uri}")
}

/// The JWKS of `uri` in shared data: the fetch time (Unix seconds, little-endian) then the JSON.
pub(crate) fn cached_jwks(store: &dyn SharedStore, uri: &str) -> Option<CachedJwks> {
    let (value, _) = store.get(&jwks_key(uri))?;
    let (fetched_at, json) = value.split_first_chunk::<8>()?;
    (!json.is_empty()).then(|| CachedJwks { json: json.to_vec(), fetched_at_s: u64::from_le_bytes(*fetched_at) })
}

/// Keeps the JWKS of `uri` (its `json`, fetched at `now_s`) in shared data for every worker.
pub(crate) fn remember_jwks(store: &dyn SharedStore, uri: &str, json: &[u8], now_s: u64) {
    let mut value = now_s.to_le_bytes().to_vec();
    value.extend_from_slice(json);
    if !store.set(&jwks_key(uri), &value, 0) {
        log::warn!("a JWKS could not be cached in shared data");
    }
}

/// The result of one check, in `hook_results` as `{id, verdict, data, error, execution_time}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CheckResult {
    pub(crate) id: String,
    pub(crate) verdict: bool,
    pub(crate) data: Value,
    /// Why the check could not run (bad parameters, a failed call); the verdict is then false.
    #[serde(serialize_with = "error_object")]
    pub(crate) error: Option<String>,
    /// Milliseconds; filled by the caller, which owns the clock.
    pub(crate) execution_time: u64,
}

impl CheckResult {
    pub(crate) fn new(id: &str, verdict: bool, data: Value) -> CheckResult {
        CheckResult { id: id.to_string(), verdict, data, error: None, execution_time: 0 }
    }

    /// A check that could not run fails, whatever it would have said.
    pub(crate) fn failed(id: &str, error: impl Into<String>, data: Value) -> CheckResult {
        CheckResult { id: id.to_string(), verdict: false, data, error: Some(error.into()), execution_time: 0 }
    }
}

/// A check's error as `{"message": ...}`.
fn error_object<S: Serializer>(error: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    error.as_ref().map(|message| json!({"message": message})).serialize(serializer)
}

/// How a check is decided.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Evaluation {
    /// Decided at once.
    Done(CheckResult),
    /// Decided at once; the core also sends `CallSpec` and ignores its answer (`default.log`).
    DoneAndSend(CheckResult, CallSpec),
    /// Decided by a call: dispatch the `CallSpec`, then give its `Reply` to the continuation.
    Needs(CallSpec, Continuation),
}

/// Evaluates a check, its parameters read when its config or stored guardrail was, against
/// what it sees.
pub(crate) fn evaluate(check: &Check, input: &Input, env: &Env) -> Evaluation {
    let id = check.id.as_str();
    let done = |r: Result<CheckResult, String>| {
        Evaluation::Done(r.unwrap_or_else(|error| CheckResult::failed(id, error, Value::Null)))
    };
    match &check.params {
        CheckParams::RegexMatch { pattern, not } => Evaluation::Done(checks::regex_match(id, pattern, *not, input)),
        CheckParams::Contains { words, operator } => Evaluation::Done(checks::contains(id, words, *operator, input)),
        CheckParams::Count { counted, min, max, not } => {
            Evaluation::Done(checks::count_within(id, *counted, (*min, *max, *not), input))
        }
        CheckParams::JsonSchema { schema, not } => done(checks::json_schema(id, schema, *not, input)),
        CheckParams::JsonKeys { keys, operator } => Evaluation::Done(checks::json_keys(id, keys, *operator, input)),
        CheckParams::ContainsCode { format } => Evaluation::Done(checks::contains_code(id, format, input)),
        CheckParams::ModelWhitelist { models, not } => {
            Evaluation::Done(checks::model_whitelist(id, models, *not, input))
        }
        CheckParams::RequiredMetadataKeys { keys, operator } => {
            Evaluation::Done(checks::required_metadata_keys(id, keys, *operator, input))
        }
        CheckParams::AsGiven => match id {
            "default.validUrls" => Evaluation::Done(checks::valid_urls(id, input)),
            "default.webhook" => calls::webhook(id, &check.parameters, input),
            "default.log" => calls::log(id, &check.parameters, input),
            "default.jwt" => calls::jwt(id, &check.parameters, input, env),
            _ => Evaluation::Done(unknown(id)),
        },
        CheckParams::Unknown => Evaluation::Done(unknown(id)),
    }
}

fn unknown(id: &str) -> CheckResult {
    CheckResult::failed(id, format!("unknown check `{}`", shorten(id)), Value::Null)
}

/// The text before-request checks see: the last message's text parts (a string content, or
/// the `text` of its parts, joined by newlines; Messages requests alike); for a Responses
/// request the last input message's; for the completions and embeddings bodies, `prompt` or
/// `input`.
pub(crate) fn request_text(body: &Value) -> String {
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        return messages.last().and_then(|m| m.get("content")).map(content_text).unwrap_or_default();
    }
    let input = body.get("prompt").or_else(|| body.get("input"));
    if let Some(items) = input.and_then(Value::as_array).filter(|items| items.iter().any(|i| i.get("role").is_some())) {
        let last_message = items.iter().rev().find(|item| item.get("role").is_some());
        return last_message.and_then(|m| m.get("content")).map(content_text).unwrap_or_default();
    }
    input.map(content_text).unwrap_or_default()
}

/// The text after-request checks see: the first choice's message content (or `text`, for
/// completions); a Messages answer's text blocks; a Responses answer's output messages.
pub(crate) fn response_text(body: &Value) -> String {
    if let Some(choice) = body.get("choices").and_then(|c| c.get(0)) {
        let content = choice.get("message").and_then(|m| m.get("content")).or_else(|| choice.get("text"));
        return content.map(content_text).unwrap_or_default();
    }
    if let Some(output) = body.get("output").and_then(Value::as_array) {
        let messages = output.iter().filter(|item| item.get("type").and_then(Value::as_str) == Some("message"));
        let texts: Vec<String> = messages.filter_map(|m| m.get("content")).map(content_text).collect();
        return texts.join("\n");
    }
    body.get("content").map(content_text).unwrap_or_default()
}

/// The text input checks see of a tool call (its JSON-RPC `params`): every value in its
/// `arguments` (strings as they are, numbers and booleans as JSON), a line each; the names of
/// the arguments are the tool's, not the caller's words.
pub(crate) fn arguments_text(params: &Value) -> String {
    fn line(out: &mut String, text: &str) {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(text);
    }
    fn values(value: &Value, out: &mut String) {
        match value {
            Value::String(text) => line(out, text),
            Value::Number(number) => line(out, &number.to_string()),
            Value::Bool(flag) => line(out, if *flag { "true" } else { "false" }),
            Value::Array(items) => items.iter().for_each(|item| values(item, out)),
            Value::Object(fields) => fields.values().for_each(|field| values(field, out)),
            Value::Null => {}
        }
    }
    let mut text = String::new();
    if let Some(arguments) = params.get("arguments") {
        values(arguments, &mut text);
    }
    text
}

/// A string, or the text of an array of parts (`{"type": "text", "text": ...}` or strings).
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let texts = parts.iter().filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Value::as_str)));
            texts.collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

/// At most 100 characters of `text`, for a check's `data`.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((end, _)) => format!("{}...", text.get(..end).unwrap_or_default()),
        None => text.to_string(),
    }
}
