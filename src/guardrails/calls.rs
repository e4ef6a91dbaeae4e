//! The checks that call out: `default.webhook` (its answer decides), `default.log` (sent and
//! forgotten) and `default.jwt` (decided at once from a fresh cached JWKS, else after fetching
//! one). They describe their call as a `CallSpec`; the core dispatches it and brings the
//! `Reply` back to the `Continuation`.

use super::jwt::{self, Failure, Token};
use super::params::{configured_headers, count, jwt_params, required_string, target, JwtParams, Params, Rules};
use super::{CheckResult, Env, Evaluation, Input, Stage};
use crate::json_check::shorten;
use crate::upstream::Upstream;
use serde_json::{json, Value};

/// `default.webhook`'s default `timeout`, and the timeout of the log and JWKS calls.
const DEFAULT_TIMEOUT_MS: u64 = 3000;
/// Longest `timeout` a webhook may ask for: a request stage waits for it.
const MAX_TIMEOUT_MS: u64 = 60_000;
/// A call for the core to dispatch on a check's behalf.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallSpec {
    /// Where: scheme, authority (the path prefix is already in `path`).
    pub(crate) upstream: Upstream,
    /// `GET` or `POST`.
    pub(crate) method: &'static str,
    /// `:path`: the URL's path and query.
    pub(crate) path: String,
    /// Lowercase names; `content-type` included when there is a body.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) timeout_ms: u64,
}

/// A dispatched call's answer: `status` 0 when there was none (failure or timeout).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply<'a> {
    pub(crate) status: u16,
    pub(crate) body: &'a [u8],
}

/// What a check waiting for a call does with the answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Continuation {
    /// `default.webhook`: the answer `{"verdict": bool}` decides.
    Webhook { id: String, url: String },
    /// `default.jwt`: the fetched JWKS verifies the token (and should be cached).
    Jwks { id: String, uri: String, max_age_s: u64, token: Box<Token>, rules: Rules },
}

/// A continuation's result, and the JWKS the core should cache (shared data, `max_age_s`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finished {
    pub(crate) result: CheckResult,
    pub(crate) jwks: Option<JwksUpdate>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JwksUpdate {
    pub(crate) uri: String,
    pub(crate) json: Vec<u8>,
    pub(crate) max_age_s: u64,
}

impl Continuation {
    /// The check's result from the call's answer; `now_s` is Unix seconds.
    pub(crate) fn finish(self, reply: Reply, now_s: u64) -> Finished {
        match self {
            Continuation::Webhook { id, url } => Finished { result: webhook_answer(&id, &url, reply), jwks: None },
            Continuation::Jwks { id, uri, max_age_s, token, rules } => {
                let fetched = (200..300).contains(&reply.status)
                    && serde_json::from_slice::<Value>(reply.body)
                        .is_ok_and(|v| v.get("keys").is_some_and(Value::is_array));
                if !fetched {
                    let error =
                        format!("fetching the JWKS from {} failed ({})", shorten(&uri), status_text(reply.status));
                    return Finished { result: CheckResult::failed(&id, error, Value::Null), jwks: None };
                }
                let result = jwt_result(&id, jwt::verify(&token, reply.body, &rules, now_s));
                Finished { result, jwks: Some(JwksUpdate { uri, json: reply.body.to_vec(), max_age_s }) }
            }
        }
    }
}

fn status_text(status: u16) -> String {
    if status == 0 {
        "no answer: the call failed or timed out".to_string()
    } else {
        format!("status {status}")
    }
}

/// `{"verdict": bool}` from a 2xx answer decides; anything else fails with an error.
fn webhook_answer(id: &str, url: &str, reply: Reply) -> CheckResult {
    let data = |answer: Value| json!({"webhookUrl": url, "responseData": answer});
    if !(200..300).contains(&reply.status) {
        return CheckResult::failed(
            id,
            format!("the webhook answered {}", status_text(reply.status)),
            data(Value::Null),
        );
    }
    let answer: Value = serde_json::from_slice(reply.body).unwrap_or(Value::Null);
    match answer.get("verdict") {
        Some(Value::Bool(verdict)) => CheckResult::new(id, *verdict, data(answer.clone())),
        _ => CheckResult::failed(id, "the webhook's answer has no boolean `verdict`", data(answer)),
    }
}

/// `default.webhook`: POSTs the request (and the response, after it) to `webhookURL` with
/// `headers`, within `timeout` milliseconds.
pub(super) fn webhook(id: &str, p: &Params, input: &Input) -> Evaluation {
    let call = || -> Result<(CallSpec, String), String> {
        let url = required_string(p, "webhookURL")?;
        let timeout_ms = count(p, "timeout")?.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(format!("parameter `timeout` must be between 1 and {MAX_TIMEOUT_MS} milliseconds"));
        }
        Ok((post(url, "webhookURL", p, input, timeout_ms)?, shorten(url)))
    };
    match call() {
        Ok((spec, url)) => Evaluation::Needs(spec, Continuation::Webhook { id: id.to_string(), url }),
        Err(e) => Evaluation::Done(CheckResult::failed(id, e, Value::Null)),
    }
}

/// `default.log`: POSTs the request (and the response, after it) to `logURL` and passes at
/// once; the answer is never awaited.
pub(super) fn log(id: &str, p: &Params, input: &Input) -> Evaluation {
    let call = || -> Result<(CallSpec, String), String> {
        let url = required_string(p, "logURL")?;
        Ok((post(url, "logURL", p, input, DEFAULT_TIMEOUT_MS)?, shorten(url)))
    };
    match call() {
        Ok((spec, url)) => {
            Evaluation::DoneAndSend(CheckResult::new(id, true, json!({"message": format!("logged to {url}")})), spec)
        }
        Err(e) => Evaluation::Done(CheckResult::failed(id, e, Value::Null)),
    }
}

/// A JSON POST of `{"request": <body>, "response": <body>}` (`response` after the response
/// only) with the check's `headers`.
fn post(url: &str, key: &str, p: &Params, input: &Input, timeout_ms: u64) -> Result<CallSpec, String> {
    let (upstream, path) = target(url).map_err(|e| format!("parameter `{key}` {e}"))?;
    let mut body = json!({"request": input.request});
    if let (Stage::After, Some(response), Some(map)) = (input.stage, input.response, body.as_object_mut()) {
        map.insert("response".to_string(), response.clone());
    }
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    headers.extend(configured_headers(p)?);
    Ok(CallSpec { upstream, method: "POST", path, headers, body: body.to_string().into_bytes(), timeout_ms })
}

/// A prepared `default.jwt`: the token and what to verify it with.
struct JwtCheck {
    uri: String,
    max_age_s: u64,
    rules: Rules,
    token: Token,
}

/// The check's parameters (`Err`: a parameter error), then the token (`Ok(Err)`: missing,
/// malformed or of an algorithm not allowed: the check fails without fetching anything).
fn jwt_prepare(p: &Params, input: &Input) -> Result<Result<JwtCheck, String>, String> {
    let JwtParams { uri, header, max_age_s, rules } = jwt_params(p)?;
    let Some((_, raw)) = input.headers.iter().find(|(name, _)| *name == header) else {
        return Ok(Err(format!("the request has no {header} header")));
    };
    let Ok(raw) = std::str::from_utf8(raw) else {
        return Ok(Err(format!("the {header} header is not UTF-8")));
    };
    let raw = raw.trim();
    let text = match raw.get(..7) {
        Some(prefix) if prefix.eq_ignore_ascii_case("bearer ") => raw.get(7..).unwrap_or_default().trim(),
        _ => raw,
    };
    let token = match jwt::parse(text) {
        Ok(token) => token,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(e) = jwt::allowed(&token, &rules) {
        return Ok(Err(e));
    }
    Ok(Ok(JwtCheck { uri: uri.to_string(), max_age_s, rules, token }))
}

/// `default.jwt`: verified against the cached JWKS while it is fresh; fetched when there is
/// none, it is stale, or it lacks the token's `kid` and was fetched over `REFETCH_AFTER_S` ago.
pub(super) fn jwt(id: &str, p: &Params, input: &Input, env: &Env) -> Evaluation {
    let check = match jwt_prepare(p, input) {
        Ok(Ok(check)) => check,
        Ok(Err(why)) => return Evaluation::Done(rejected(id, &why)),
        Err(e) => return Evaluation::Done(CheckResult::failed(id, e, Value::Null)),
    };
    if let Some(cached) = (env.jwks)(&check.uri) {
        if env.now_s < cached.fetched_at_s.saturating_add(check.max_age_s) {
            match jwt::verify(&check.token, &cached.json, &check.rules, env.now_s) {
                // Whole seconds both: only a later second than the limit's is surely over it.
                Err(Failure::UnknownKid(_)) if env.now_s > cached.fetched_at_s.saturating_add(jwt::REFETCH_AFTER_S) => {
                }
                verified => return Evaluation::Done(jwt_result(id, verified)),
            }
        }
    }
    let fetch = match target(&check.uri) {
        Ok((upstream, path)) => CallSpec {
            upstream,
            method: "GET",
            path,
            headers: Vec::new(),
            body: Vec::new(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
        },
        Err(e) => return Evaluation::Done(CheckResult::failed(id, format!("parameter `jwksUri` {e}"), Value::Null)),
    };
    let JwtCheck { uri, max_age_s, rules, token } = check;
    Evaluation::Needs(fetch, Continuation::Jwks { id: id.to_string(), uri, max_age_s, token: Box::new(token), rules })
}

fn rejected(id: &str, why: &str) -> CheckResult {
    CheckResult::new(id, false, json!({"explanation": format!("JWT validation failed: {why}")}))
}

fn jwt_result(id: &str, verified: Result<(), Failure>) -> CheckResult {
    match verified {
        Ok(()) => CheckResult::new(id, true, json!({"explanation": "JWT token validation succeeded"})),
        Err(Failure::UnknownKid(why) | Failure::Invalid(why)) => rejected(id, &why),
    }
}
