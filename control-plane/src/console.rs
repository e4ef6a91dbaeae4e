//! The console's endpoints (issue 47): signing in with a gateway key, and what its pages read.
//!
//! Signing in makes a session: a random id in an `HttpOnly`, `SameSite=Strict` cookie scoped to
//! `/console` (the browser keeps nothing else; the key is kept nowhere), its SHA-256 in the
//! database, ending after `SESSION_MS`. A write carries the session's CSRF token in
//! `x-console-csrf`, and a browser's `Origin` must be the console's own. Every answer forbids
//! other origins' scripts, styles, frames and connections (`Content-Security-Policy`).

use crate::auth::{self, Caller};
use crate::batches::batch_object;
use crate::crypto::{constant_time_eq, key_hash, new_token};
use crate::db::batches::Cursor;
use crate::db::console::{ConsoleSession, Dimension, Slot, Span, Sums, DURATION_BOUNDS_MS};
use crate::db::now_ms;
use crate::errors::{ApiError, ApiResult};
use crate::limits::acting_workspace;
use crate::validate::{json_object, only_known_fields, query_pairs, WholeBody};
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use serde_json::{json, Map, Value};

/// The session cookie's name.
pub const COOKIE: &str = "gateway_console";
/// How long a session lasts from sign-in.
const SESSION_MS: i64 = 12 * 3600 * 1000;
/// The header a write carries the session's CSRF token in.
const CSRF_HEADER: &str = "x-console-csrf";

const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(page))
        .route("/console/", get(page))
        .route("/console/assets/{name}", get(asset))
        .route("/console/session", get(session).post(sign_in).delete(sign_out))
        .route("/console/api/overview", get(overview))
        .route("/console/api/logs", get(logs))
        .route("/console/api/batches", get(batches))
        .route("/console/api/secret-fields", get(secret_fields))
        .layer(middleware::map_response(secured))
}

/// The console's files, built into the binary: its own (`console/src`) and the chart library
/// (uPlot, from `console/package-lock.json`, installed by `./build.sh`).
const ASSETS: [(&str, &str, &[u8]); 4] = [
    ("console.js", "text/javascript; charset=utf-8", include_bytes!("../../console/src/console.js")),
    ("console.css", "text/css; charset=utf-8", include_bytes!("../../console/src/console.css")),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/node_modules/uplot/dist/uPlot.iife.min.js"),
    ),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../../console/node_modules/uplot/dist/uPlot.min.css")),
];

/// `GET /console`: the page (one page; what it shows is the address's `#` part).
async fn page() -> Response {
    let html = include_str!("../../console/src/index.html");
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

/// `GET /console/assets/{name}`: one of the console's files.
async fn asset(axum::extract::Path(name): axum::extract::Path<String>) -> ApiResult<Response> {
    let (_, content_type, bytes) =
        ASSETS.iter().find(|(file, _, _)| *file == name).ok_or_else(|| ApiError::not_found("console file"))?;
    Ok(([(CONTENT_TYPE, *content_type)], *bytes).into_response())
}

/// `GET /console/api/logs`: a page of the request log, as `GET /v1/logs` answers it (the same
/// filters), of the session's workspace, or for an admin the one `workspace=` names.
async fn logs(
    State(s): State<AppState>,
    h: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let (_, session) = signed_in(&s, &h).await?;
    let mut pairs = query_pairs(query)?;
    let named = take_workspace(&mut pairs)?;
    let workspace = acting_workspace(&caller(&session), named.as_deref())?;
    Ok(Json(crate::logs::page(&s, &workspace, &pairs).await?))
}

/// The `workspace=` of a console query (the workspace an admin reads), taken out of `pairs`; a
/// 400 when it is given twice.
fn take_workspace(pairs: &mut Vec<(String, String)>) -> ApiResult<Option<String>> {
    let (named, rest): (Vec<_>, Vec<_>) = std::mem::take(pairs).into_iter().partition(|(name, _)| name == "workspace");
    *pairs = rest;
    let mut named = named.into_iter().map(|(_, workspace)| workspace);
    match (named.next(), named.next()) {
        (workspace, None) => Ok(workspace),
        _ => Err(ApiError::invalid("workspace", "workspace may be given once")),
    }
}

/// `GET /console/api/secret-fields`: the fields whose values the API shows only as their last
/// four characters; the stored-objects page leaves them out of what it edits, so a save never
/// writes the shown four characters over a secret.
async fn secret_fields(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Json<Value>> {
    signed_in(&s, &h).await?;
    Ok(Json(json!({"data": crate::items::masked_fields()})))
}

/// Managed batches a page of the console shows.
const BATCHES_PER_PAGE: usize = 50;

/// `GET /console/api/batches[?after=<id>]`: the managed batches of the session's workspace, or
/// for an admin the one `workspace=` names, newest first, as `GET /v1/batches` gives each.
async fn batches(
    State(s): State<AppState>,
    h: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let (_, session) = signed_in(&s, &h).await?;
    let mut pairs = query_pairs(query)?;
    let named = take_workspace(&mut pairs)?;
    let mut after = None;
    for (name, value) in pairs {
        match name.as_str() {
            "after" => after = Some(value),
            other => return Err(ApiError::invalid(other, &format!("unknown parameter {other}"))),
        }
    }
    let workspace = acting_workspace(&caller(&session), named.as_deref())?;
    let cursor = match after {
        None => Cursor::Start,
        Some(id) => {
            let batch = s.db.batch(&id, Some(&workspace)).await?;
            let batch = batch.ok_or_else(|| ApiError::invalid("after", "after must name a batch of the workspace"))?;
            Cursor::After(batch.created_at, batch.id)
        }
    };
    let limit = i64::try_from(BATCHES_PER_PAGE + 1).unwrap_or(i64::MAX);
    let rows = s.db.list_batches(&workspace, &cursor, limit).await?;
    let data: Vec<Value> = rows.iter().take(BATCHES_PER_PAGE).map(batch_object).collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": rows.len() > BATCHES_PER_PAGE})))
}

/// Every console answer: the security headers, and never cached (it is one caller's).
pub(crate) async fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `POST /console/session` with `{"key": "<gateway key>"}`: a new session for the key's
/// workspace (an admin key of `default` sees every workspace), in the cookie.
async fn sign_in(State(s): State<AppState>, h: HeaderMap, WholeBody(body): WholeBody) -> ApiResult<Response> {
    same_origin(&h)?;
    let body = json_object(&body)?;
    only_known_fields(&body, |field| field == "key")?;
    let key = body.get("key").and_then(Value::as_str).filter(|key| !key.is_empty());
    let key = key.ok_or_else(|| ApiError::invalid("key", "key must be a gateway API key"))?;
    let Caller { workspace, admin } = auth::caller_of_key(&s, key).await?;
    let id = new_token().map_err(ApiError::internal)?;
    let csrf_token = new_token().map_err(ApiError::internal)?;
    let expires_at_ms = now_ms() + SESSION_MS;
    let session = ConsoleSession { key_hash: key_hash(key), workspace, admin, csrf_token, expires_at_ms };
    s.db.insert_console_session(&key_hash(&id), &session).await?;
    let secure = if forwarded_https(&h) { "; Secure" } else { "" };
    let cookie =
        format!("{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}", SESSION_MS / 1000);
    let cookie = HeaderValue::from_str(&cookie).map_err(ApiError::internal)?;
    Ok(([(SET_COOKIE, cookie)], Json(described(&session))).into_response())
}

/// `GET /console/session`: who is signed in, and the token its writes carry.
async fn session(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Json<Value>> {
    let (_, session) = signed_in(&s, &h).await?;
    Ok(Json(described(&session)))
}

/// `DELETE /console/session` (a write): the session ends, and the cookie with it.
async fn sign_out(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Response> {
    let (id_hash, session) = signed_in(&s, &h).await?;
    writes(&session, &h)?;
    s.db.delete_console_session(&id_hash).await?;
    let cookie = HeaderValue::from_str(&format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0"))
        .map_err(ApiError::internal)?;
    Ok((StatusCode::NO_CONTENT, [(SET_COOKIE, cookie)]).into_response())
}

fn described(session: &ConsoleSession) -> Value {
    json!({
        "workspace": session.workspace,
        "admin": session.admin,
        "csrf_token": session.csrf_token,
        "expires_at": session.expires_at_ms / 1000,
    })
}

/// The session the request's cookie names (with its id's hash); 401 without one.
pub(crate) async fn signed_in(s: &AppState, h: &HeaderMap) -> ApiResult<(String, ConsoleSession)> {
    let cookies = h.get_all(axum::http::header::COOKIE).into_iter().filter_map(|value| value.to_str().ok());
    let id = cookies
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty());
    let id = id.ok_or_else(|| ApiError::unauthorized("sign in to the console first"))?;
    let id_hash = key_hash(id);
    let ended = || ApiError::unauthorized("the console session ended: sign in again");
    let session = s.db.console_session(&id_hash).await?.ok_or_else(ended)?;
    // The session lasts while its key works as it did: a deleted key's sessions end with it.
    let key = match session.key_hash.is_empty() {
        true => None,
        false => auth::caller_of_hash(s, &session.key_hash).await?,
    };
    if key.is_none_or(|key| key.workspace != session.workspace || key.admin != session.admin) {
        s.db.delete_console_session(&id_hash).await?;
        return Err(ended());
    }
    Ok((id_hash, session))
}

/// The caller a session acts as.
pub(crate) fn caller(session: &ConsoleSession) -> Caller {
    Caller { workspace: session.workspace.clone(), admin: session.admin }
}

/// A write's checks: the session's CSRF token, and a browser's `Origin` the console's own.
pub(crate) fn writes(session: &ConsoleSession, h: &HeaderMap) -> ApiResult<()> {
    same_origin(h)?;
    let presented = h.get(CSRF_HEADER).map(HeaderValue::as_bytes).unwrap_or_default();
    match constant_time_eq(presented, session.csrf_token.as_bytes()) {
        true => Ok(()),
        false => Err(ApiError::forbidden("a console write needs the session's x-console-csrf token")),
    }
}

/// A request with an `Origin` (a browser's) must come from the console's own origin: the
/// scheme Envoy saw and the request's `Host`.
fn same_origin(h: &HeaderMap) -> ApiResult<()> {
    let Some(origin) = h.get("origin") else {
        return Ok(());
    };
    let host = h.get("host").and_then(|host| host.to_str().ok()).unwrap_or_default();
    let scheme = if forwarded_https(h) { "https" } else { "http" };
    match origin.to_str().ok() == Some(format!("{scheme}://{host}").as_str()) && !host.is_empty() {
        true => Ok(()),
        false => Err(ApiError::forbidden("a console request from another origin is refused")),
    }
}

fn forwarded_https(h: &HeaderMap) -> bool {
    h.get("x-forwarded-proto").is_some_and(|proto| proto.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// An overview's period: how long it is and the slots it is cut in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Range {
    Hour,
    Day,
    Week,
    Month,
}

impl Range {
    fn parse(text: &str) -> Option<Range> {
        match text {
            "hour" => Some(Range::Hour),
            "day" => Some(Range::Day),
            "week" => Some(Range::Week),
            "month" => Some(Range::Month),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
            Range::Month => "month",
        }
    }

    /// Its slot's length and how many slots it has.
    fn slots(self) -> (i64, usize) {
        const MINUTE: i64 = 60_000;
        match self {
            Range::Hour => (MINUTE, 60),
            Range::Day => (60 * MINUTE, 24),
            Range::Week => (6 * 60 * MINUTE, 28),
            Range::Month => (24 * 60 * MINUTE, 30),
        }
    }
}

/// `GET /console/api/overview?range=hour|day|week|month[&workspace=]`: the period up to the
/// end of the current slot, its requests, errors, tokens, cost and latency (p50, p95) per slot
/// and in all, broken down by model, provider, key, workspace and client API; the top models by
/// cost and each provider's error rate. An admin without `workspace` sees every workspace.
async fn overview(
    State(s): State<AppState>,
    h: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let (_, session) = signed_in(&s, &h).await?;
    let caller = caller(&session);
    let mut pairs = query_pairs(query)?;
    let named = take_workspace(&mut pairs)?;
    let mut range = Range::Day;
    for (name, value) in &pairs {
        match name.as_str() {
            "range" => {
                range = Range::parse(value)
                    .ok_or_else(|| ApiError::invalid(name, "range must be one of hour, day, week, month"))?
            }
            other => return Err(ApiError::invalid(other, &format!("unknown parameter {other}"))),
        }
    }
    let workspace = match (named, caller.admin) {
        (Some(named), _) => Some(acting_workspace(&caller, Some(&named))?),
        (None, true) => None,
        (None, false) => Some(caller.workspace.clone()),
    };
    let (slot_ms, slots) = range.slots();
    let until_ms = (now_ms() / slot_ms + 1) * slot_ms;
    let span = Span { workspace: workspace.as_deref(), from_ms: until_ms - slot_ms * slots as i64, until_ms };
    let slotted = s.db.overview_slots(&span, slot_ms, slots).await?;
    let mut total = Slot::empty();
    let mut series = Vec::with_capacity(slotted.len());
    for (i, slot) in slotted.iter().enumerate() {
        total.add(slot);
        let mut point = slot_fields(slot);
        point.insert("t".into(), json!((span.from_ms + slot_ms * i as i64) / 1000));
        series.push(Value::Object(point));
    }
    let mut breakdown = Map::new();
    let mut by_model = Vec::new();
    let mut by_provider = Vec::new();
    for dimension in Dimension::ALL {
        let rows = s.db.overview_breakdown(&span, dimension).await?;
        let listed = rows.iter().map(|(value, sums)| with_value(value, sums)).collect();
        breakdown.insert(dimension.name().to_string(), Value::Array(listed));
        match dimension {
            Dimension::Model => by_model = rows,
            Dimension::Provider => by_provider = rows,
            _ => {}
        }
    }
    by_model.sort_by(|(a, x), (b, y)| y.cost_micro_usd.cmp(&x.cost_micro_usd).then_with(|| a.cmp(b)));
    let top_models: Vec<Value> = by_model
        .iter()
        .filter(|(_, sums)| sums.cost_micro_usd > 0)
        .take(10)
        .map(|(v, sums)| with_value(v, sums))
        .collect();
    let error_rates: Vec<Value> = by_provider
        .iter()
        .map(|(provider, sums)| {
            json!({"value": provider, "requests": sums.requests, "errors": sums.errors,
                "error_rate": sums.errors as f64 / sums.requests.max(1) as f64})
        })
        .collect();
    Ok(Json(json!({
        "range": range.name(),
        "workspace": workspace,
        "from": span.from_ms / 1000,
        "to": span.until_ms / 1000,
        "slot_seconds": slot_ms / 1000,
        "totals": slot_fields(&total),
        "series": series,
        "breakdown": breakdown,
        "top_models_by_cost": top_models,
        "error_rate_by_provider": error_rates,
    })))
}

fn sums_fields(sums: &Sums) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("requests".into(), json!(sums.requests));
    out.insert("errors".into(), json!(sums.errors));
    out.insert("input_tokens".into(), json!(sums.input_tokens));
    out.insert("output_tokens".into(), json!(sums.output_tokens));
    out.insert("cost_usd".into(), json!(sums.cost_micro_usd as f64 / 1e6));
    out
}

fn with_value(value: &Option<String>, sums: &Sums) -> Value {
    let mut out = sums_fields(sums);
    out.insert("value".into(), json!(value));
    Value::Object(out)
}

fn slot_fields(slot: &Slot) -> Map<String, Value> {
    let mut out = sums_fields(&slot.sums);
    out.insert("p50_ms".into(), json!(percentile(&slot.durations, 0.50)));
    out.insert("p95_ms".into(), json!(percentile(&slot.durations, 0.95)));
    out
}

/// The duration under which a share `q` of the records fall, from their counts per class
/// (interpolated within the class it falls in); None without any duration.
fn percentile(counts: &[i64], q: f64) -> Option<f64> {
    let total: i64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0i64;
    for (class, &count) in counts.iter().enumerate() {
        if count > 0 && (below + count) as f64 >= rank {
            let low = class.checked_sub(1).and_then(|i| DURATION_BOUNDS_MS.get(i)).copied().unwrap_or(0) as f64;
            // Past the last bound: that bound is all it can say.
            let Some(&high) = DURATION_BOUNDS_MS.get(class) else {
                return Some(low);
            };
            let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
            return Some((low + (high as f64 - low) * within).round());
        }
        below += count;
    }
    DURATION_BOUNDS_MS.last().map(|&bound| bound as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percentile_is_read_from_the_classes_interpolated_within_one() {
        let mut counts = vec![0; DURATION_BOUNDS_MS.len() + 1];
        assert_eq!(percentile(&counts, 0.5), None);
        // Ten durations in (100, 150]: the median is half way.
        counts[9] = 10;
        assert_eq!(percentile(&counts, 0.5), Some(125.0));
        assert_eq!(percentile(&counts, 0.95), Some(148.0));
        // One slow record past the last bound.
        counts[DURATION_BOUNDS_MS.len()] = 1;
        assert_eq!(percentile(&counts, 1.0), Some(120_000.0));
    }

    #[test]
    fn a_range_is_cut_in_slots_that_fit_it() {
        for (name, span_ms) in
            [("hour", 3_600_000), ("day", 86_400_000), ("week", 604_800_000), ("month", 2_592_000_000)]
        {
            let (slot_ms, slots) = Range::parse(name).unwrap().slots();
            assert_eq!(slot_ms * slots as i64, span_ms, "{name}");
        }
        assert_eq!(Range::parse("year"), None);
    }
}
