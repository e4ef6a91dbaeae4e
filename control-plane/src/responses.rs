//! Responses the gateway keeps (issue 25). A Responses API answer the filter translated from
//! another provider's is kept here with its input (the whole conversation so far), per
//! workspace, so that `previous_response_id`, `GET /v1/responses/{id}` and its `input_items`
//! work whichever provider answered; another workspace's id is not found.
//!
//! The filter writes and reads them on `/internal/v1/workspaces/{workspace}/responses/{id}`,
//! and relays the client's operations on a kept response to `/internal/v1/responses/{id}...`
//! (with the caller's workspace in `x-gateway-workspace`, as for managed batches), answered in
//! OpenAI's shapes.

use crate::auth;
use crate::db::responses::KeptResponse;
use crate::errors::{ApiError, ApiResult};
use crate::gateway::workspace;
use crate::lists::list_json;
use crate::validate::{is_name, json_object, only_known_fields, query_pairs, Path, MAX_WORKSPACE};
use crate::AppState;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::time::Duration;
use tokio::time::Instant;

/// Response ids: 1..=128 characters from [A-Za-z0-9_-] (the filter makes `resp_gw_` + 32 hex).
pub const MAX_ID: usize = 128;
/// The largest body of a PUT (a response and the whole conversation before it): a request of
/// up to Envoy's 20 MiB limit, its answer, and what earlier turns added.
pub const MAX_KEPT_BYTES: usize = 32 * 1024 * 1024;
/// How long a client's operation waits for the response it names to be written.
const RELAYED_WAIT: Duration = Duration::from_millis(1000);
/// The longest a read may wait for a response being written (`wait_ms`).
pub const MAX_WAIT_MS: u64 = 2000;
/// A waiting read looks again this often even unwoken: another control plane sharing the
/// database may be the one that writes.
const RECHECK: Duration = Duration::from_millis(100);
/// `input_items` pages: OpenAI's default and largest.
const DEFAULT_ITEMS: usize = 20;
const MAX_ITEMS: usize = 100;

fn is_response_id(text: &str) -> bool {
    (1..=MAX_ID).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
}

/// A response id from a path, else a 400 naming `param`.
pub(crate) fn response_id<'a>(text: &'a str, param: &str) -> ApiResult<&'a str> {
    if is_response_id(text) {
        return Ok(text);
    }
    let message =
        format!("Invalid '{param}': expected an ID of 1 to {MAX_ID} letters, numbers, underscores or dashes.");
    Err(ApiError::invalid(param, &message))
}

/// A workspace named in an internal path, else a 400 naming it.
fn path_workspace(text: &str) -> ApiResult<&str> {
    if is_name(text, MAX_WORKSPACE) {
        return Ok(text);
    }
    let message = format!("workspace must be 1 to {MAX_WORKSPACE} characters from [A-Za-z0-9._-]");
    Err(ApiError::invalid("workspace", &message))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(404, "invalid_request_error", &format!("No response found with id '{id}'."), None, None)
}

// ---- the filter's reads and writes ----

/// `PUT /internal/v1/workspaces/{workspace}/responses/{id}` with `{"response": {...}, "input":
/// [...]}`: kept (replacing the same id of the same workspace); answers `{"id": id}`.
pub async fn put(
    State(s): State<AppState>,
    h: HeaderMap,
    Path((workspace, id)): Path<(String, String)>,
    body: Body,
) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let workspace = path_workspace(&workspace)?;
    let id = response_id(&id, "id")?;
    let body = axum::body::to_bytes(body, MAX_KEPT_BYTES).await.map_err(unreadable)?;
    let kept = kept_response(&json_object(&body)?, id)?;
    s.db.keep_response(workspace, id, &kept).await?;
    s.response_kept.notify_waiters();
    Ok(Json(json!({"id": id})))
}

/// A body over `MAX_KEPT_BYTES` is a 413; one that broke off a 400.
fn unreadable(e: axum::Error) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(error) = cause {
        if error.is::<http_body_util::LengthLimitError>() {
            let message = format!("the body is larger than the gateway's limit of {MAX_KEPT_BYTES} bytes");
            return ApiError::new(413, "invalid_request_error", &message, Some("body"), Some("body_too_large"));
        }
        cause = error.source();
    }
    ApiError::invalid("body", &format!("the body cannot be read: {e}"))
}

/// The PUT body, checked: `response` an object (its `id`, when given, the path's), `input` an
/// array of objects.
pub(crate) fn kept_response(body: &Map<String, Value>, id: &str) -> ApiResult<KeptResponse> {
    only_known_fields(body, |k| k == "response" || k == "input")?;
    let response = match body.get("response") {
        Some(Value::Object(response)) => response,
        Some(_) => return Err(ApiError::invalid("response", "response must be an object (a response object)")),
        None => return Err(ApiError::invalid("response", "response is required")),
    };
    if response.get("id").is_some_and(|named| named.as_str() != Some(id)) {
        return Err(ApiError::invalid("response.id", "response.id must be the id the path names"));
    }
    let input = match body.get("input") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("input", "input must be an array of input items")),
        None => return Err(ApiError::invalid("input", "input is required")),
    };
    if let Some(at) = input.iter().position(|item| !item.is_object()) {
        return Err(ApiError::invalid(&format!("input[{at}]"), "every input item must be an object"));
    }
    Ok(KeptResponse { response: json_text(response)?, input: json_text(input)? })
}

fn json_text(value: &impl Serialize) -> ApiResult<String> {
    serde_json::to_string(value).map_err(ApiError::internal)
}

/// What the filter reads: the same `{"value": ...}` envelope as its other entries.
#[derive(Serialize)]
struct Envelope<'a> {
    value: Stored<'a>,
}

#[derive(Serialize)]
struct Stored<'a> {
    response: &'a RawValue,
    input: &'a RawValue,
}

/// `GET /internal/v1/workspaces/{workspace}/responses/{id}?wait_ms=N`: `{"value": {"response",
/// "input"}}`, else 404. A response not found is looked for again until `wait_ms` (0..=2000,
/// default 0) passed: the filter writes one just before its client gets the answer, so the
/// client's next request may read it while the write is in flight.
pub async fn get(
    State(s): State<AppState>,
    h: HeaderMap,
    Path((workspace, id)): Path<(String, String)>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    let workspace = path_workspace(&workspace)?;
    let id = response_id(&id, "id")?;
    let wait = wait_ms(&query_pairs(query)?)?;
    let kept = wait_for(&s, workspace, id, wait).await?.ok_or_else(|| not_found(id))?;
    let stored = Stored { response: raw(&kept.response)?, input: raw(&kept.input)? };
    Ok(Json(Envelope { value: stored }).into_response())
}

fn raw(text: &str) -> ApiResult<&RawValue> {
    serde_json::from_str(text).map_err(ApiError::internal)
}

/// `wait_ms` of the filter's read (the only parameter it takes).
pub(crate) fn wait_ms(pairs: &[(String, String)]) -> ApiResult<Duration> {
    let mut wait = None;
    for (name, value) in pairs {
        if name != "wait_ms" {
            return Err(ApiError::invalid(name, &format!("unknown parameter `{name}`")));
        }
        if wait.is_some() {
            return Err(ApiError::invalid(name, "wait_ms is given more than once"));
        }
        let ms =
            value.parse::<u64>().ok().filter(|ms| *ms <= MAX_WAIT_MS).ok_or_else(|| {
                ApiError::invalid(name, &format!("wait_ms must be an integer from 0 to {MAX_WAIT_MS}"))
            })?;
        wait = Some(Duration::from_millis(ms));
    }
    Ok(wait.unwrap_or_default())
}

/// The kept response, looked for until `wait` passed: woken by each write of this control plane,
/// and every `RECHECK` for the writes of others.
async fn wait_for(s: &AppState, workspace: &str, id: &str, wait: Duration) -> ApiResult<Option<KeptResponse>> {
    let deadline = Instant::now() + wait;
    loop {
        // Registered before the read: a write landing between the read and the wait still wakes it.
        let written = s.response_kept.notified();
        tokio::pin!(written);
        written.as_mut().enable();
        if let Some(kept) = s.db.kept_response(workspace, id).await? {
            return Ok(Some(kept));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        // Either way it looks again; the timeout is no failure.
        let _ = tokio::time::timeout((deadline - now).min(RECHECK), written).await;
    }
}

// ---- the client's operations, relayed by the filter ----

/// The caller's workspace and the response id of a relayed request.
fn relayed<'a>(s: &AppState, h: &HeaderMap, id: &'a str) -> ApiResult<(String, &'a str)> {
    auth::internal(s, h)?;
    Ok((workspace(h)?, response_id(id, "response_id")?))
}

/// The kept response a client names, waited for a while: the filter writes it as its answer
/// reaches the client, who may ask for it again before the write has landed.
async fn find(s: &AppState, workspace: &str, id: &str) -> ApiResult<KeptResponse> {
    wait_for(s, workspace, id, RELAYED_WAIT).await?.ok_or_else(|| not_found(id))
}

/// `GET /internal/v1/responses/{id}`: the response object, as kept.
pub async fn retrieve(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Response> {
    let (workspace, id) = relayed(&s, &h, &id)?;
    let kept = find(&s, &workspace, id).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], kept.response).into_response())
}

/// `DELETE /internal/v1/responses/{id}`: OpenAI's answer to a deleted response.
pub async fn delete(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let (workspace, id) = relayed(&s, &h, &id)?;
    if !s.db.delete_kept_response(&workspace, id).await? {
        return Err(not_found(id));
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}

/// `POST /internal/v1/responses/{id}/cancel`: a kept response was answered whole, never in
/// background mode, so OpenAI's 400 for cancelling such a response.
pub async fn cancel(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Response> {
    let (workspace, id) = relayed(&s, &h, &id)?;
    find(&s, &workspace, id).await?;
    Err(ApiError::new(400, "invalid_request_error", "Cannot cancel a synchronous response.", None, None))
}

/// The `input_items` query: OpenAI's `limit`, `order`, `after` (`include` is accepted: items
/// are kept whole).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ItemsQuery {
    limit: usize,
    newest_first: bool,
    after: Option<String>,
}

pub(crate) fn items_query(pairs: &[(String, String)]) -> ApiResult<ItemsQuery> {
    let mut q = ItemsQuery { limit: DEFAULT_ITEMS, newest_first: true, after: None };
    let mut seen: Vec<&str> = Vec::new();
    for (name, value) in pairs {
        if name == "include" || name == "include[]" {
            continue;
        }
        if seen.contains(&name.as_str()) {
            return Err(ApiError::invalid(name, &format!("{name} is given more than once")));
        }
        seen.push(name);
        match name.as_str() {
            "limit" => {
                q.limit = value.parse::<usize>().ok().filter(|n| (1..=MAX_ITEMS).contains(n)).ok_or_else(|| {
                    ApiError::invalid(name, &format!("limit must be an integer from 1 to {MAX_ITEMS}"))
                })?
            }
            "order" => {
                q.newest_first = match value.as_str() {
                    "desc" => true,
                    "asc" => false,
                    _ => return Err(ApiError::invalid(name, "order must be `asc` or `desc`")),
                }
            }
            "after" if value.is_empty() => return Err(ApiError::invalid(name, "after must be an item id")),
            "after" => q.after = Some(value.clone()),
            other => return Err(ApiError::invalid(other, &format!("unknown parameter `{other}`"))),
        }
    }
    Ok(q)
}

/// `GET /internal/v1/responses/{id}/input_items?limit=&order=&after=`: OpenAI's list of the
/// response's input items, newest first unless `order=asc`.
pub async fn input_items(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let (workspace, id) = relayed(&s, &h, &id)?;
    let q = items_query(&query_pairs(query)?)?;
    let kept = find(&s, &workspace, id).await?;
    let input: Vec<Map<String, Value>> = serde_json::from_str(&kept.input).map_err(ApiError::internal)?;
    let (data, has_more) = page(listed_items(id, input), &q)?;
    Ok(list_json(data, has_more))
}

/// The input items as OpenAI lists them: each with an `id` (its own, else one made from the
/// response id and its place, the same on every read), a message with `type` and its text as
/// a content part.
fn listed_items(response_id: &str, input: Vec<Map<String, Value>>) -> Vec<Value> {
    let stem = response_id.strip_prefix("resp_").unwrap_or(response_id);
    let listed = |(at, mut item): (usize, Map<String, Value>)| {
        if item.get("id").and_then(Value::as_str).is_none_or(str::is_empty) {
            item.insert("id".into(), json!(format!("msg_{stem}_{at}")));
        }
        if item.contains_key("role") {
            item.entry("type").or_insert_with(|| json!("message"));
        }
        if item.get("type").and_then(Value::as_str) == Some("message") {
            let part = if item.get("role").and_then(Value::as_str) == Some("assistant") {
                "output_text"
            } else {
                "input_text"
            };
            if let Some(content) = item.get_mut("content") {
                if let Value::String(text) = content {
                    *content = json!([{"type": part, "text": std::mem::take(text)}]);
                }
            }
        }
        Value::Object(item)
    };
    input.into_iter().enumerate().map(listed).collect()
}

/// One page of `items` (in input order): its items and whether more follow.
fn page(mut items: Vec<Value>, q: &ItemsQuery) -> ApiResult<(Vec<Value>, bool)> {
    if q.newest_first {
        items.reverse();
    }
    let start = match &q.after {
        Some(after) => {
            let at = items.iter().position(|item| item.get("id").and_then(Value::as_str) == Some(after.as_str()));
            at.map(|at| at + 1)
                .ok_or_else(|| ApiError::invalid("after", "after names no input item of this response"))?
        }
        None => 0,
    };
    let mut rest: Vec<Value> = items.into_iter().skip(start).collect();
    let has_more = rest.len() > q.limit;
    rest.truncate(q.limit);
    Ok((rest, has_more))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn param(e: ApiError) -> String {
        e.0.param().unwrap_or_default().to_string()
    }

    #[test]
    fn response_ids_are_letters_digits_underscores_and_dashes() {
        assert!(is_response_id("resp_gw_0123456789abcdef0123456789abcdef"));
        assert!(is_response_id(&"a-_".repeat(42)));
        for bad in ["", "resp.1", "resp/1", "résp", &"a".repeat(129)] {
            assert_eq!(param(response_id(bad, "response_id").unwrap_err()), "response_id", "{bad:?}");
        }
    }

    #[test]
    fn wait_ms_is_0_to_2000() {
        assert_eq!(wait_ms(&[]).unwrap(), Duration::ZERO);
        assert_eq!(wait_ms(&pairs(&[("wait_ms", "2000")])).unwrap(), Duration::from_millis(2000));
        for bad in ["2001", "-1", "x", ""] {
            assert_eq!(param(wait_ms(&pairs(&[("wait_ms", bad)])).unwrap_err()), "wait_ms", "{bad:?}");
        }
        assert_eq!(param(wait_ms(&pairs(&[("wait_ms", "1"), ("wait_ms", "2")])).unwrap_err()), "wait_ms");
        assert_eq!(param(wait_ms(&pairs(&[("wait", "1")])).unwrap_err()), "wait");
    }

    #[test]
    fn the_items_query_takes_openais_parameters() {
        let q = items_query(&pairs(&[("include[]", "message.input_image.image_url"), ("include", "x")])).unwrap();
        assert_eq!(q, ItemsQuery { limit: 20, newest_first: true, after: None });
        let q = items_query(&pairs(&[("limit", "100"), ("order", "asc"), ("after", "msg_1")])).unwrap();
        assert_eq!(q, ItemsQuery { limit: 100, newest_first: false, after: Some("msg_1".into()) });
        for (name, bad) in [("limit", "0"), ("limit", "101"), ("limit", "x"), ("order", "up"), ("after", "")] {
            assert_eq!(param(items_query(&pairs(&[(name, bad)])).unwrap_err()), name, "{name}={bad}");
        }
        assert_eq!(param(items_query(&pairs(&[("order", "asc"), ("order", "asc")])).unwrap_err()), "order");
        assert_eq!(param(items_query(&pairs(&[("before", "msg_1")])).unwrap_err()), "before");
    }

    #[test]
    fn listed_items_have_ids_and_openais_message_shape() {
        let input = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"type": "message", "role": "assistant", "content": "hello", "id": "msg_kept"}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "42", "id": ""}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]}),
        ];
        let input = input.into_iter().map(|v| v.as_object().cloned().unwrap()).collect();
        assert_eq!(
            listed_items("resp_gw_abc", input),
            vec![
                json!({"id": "msg_gw_abc_0", "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}]}),
                json!({"id": "msg_kept", "type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "hello"}]}),
                json!({"id": "msg_gw_abc_2", "type": "function_call_output", "call_id": "call_1", "output": "42"}),
                json!({"id": "msg_gw_abc_3", "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "more"}]}),
            ]
        );
    }
}
