//! The HTTP endpoints: small handlers over `auth`, `validate`, `items` and the filter's
//! shared checks.

use crate::auth::{self, Caller};
use crate::batches;
use crate::crypto::{key_hash, new_api_key};
use crate::db::{Kind, NewKey};
use crate::errors::{ApiError, ApiResult};
use crate::files;
use crate::items::{self, mask_secrets};
use crate::limits;
use crate::lists;
use crate::logs;
use crate::mcp_servers;
use crate::responses;
use crate::validate::{self, json_object, path_target, put_target, Path, WholeBody};
use crate::AppState;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::DefaultBodyLimit;
use axum::extract::Request;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post, put, MethodRouter};
use axum::{middleware, Json, Router};
use gateway_schema::{self as shared, SharedError};
use serde_json::{json, Map, Value};
use tower::ServiceExt;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/prompts", listing(Kind::Prompt))
        .route("/v1/guardrails", listing(Kind::Guardrail))
        .route("/v1/configs", listing(Kind::Config))
        .route("/v1/providers", listing(Kind::Provider))
        .route("/v1/prompts/{id}", put(put_prompt).get(get_prompt).merge(deleting(Kind::Prompt)))
        .route("/v1/prompts/{id}/render", post(render_prompt))
        .route("/v1/guardrails/{id}", put(put_guardrail).get(get_guardrail).merge(deleting(Kind::Guardrail)))
        .route("/v1/configs/{id}", put(put_config).get(get_config).merge(deleting(Kind::Config)))
        .route("/v1/providers/{id}", put(put_provider).get(get_provider).merge(deleting(Kind::Provider)))
        .route("/v1/mcp-servers", get(mcp_servers::list))
        .route("/v1/mcp-servers/{id}", put(mcp_servers::put).get(mcp_servers::get).delete(mcp_servers::delete))
        .route("/v1/api-keys", post(create_key).get(list_keys))
        .route("/v1/api-keys/{id}", delete(delete_key))
        .route("/v1/limits", get(limits::list_limits))
        .route("/v1/limits/{id}", put(limits::put_limit).get(limits::get_limit).delete(limits::delete_limit))
        // Model names may hold `/`: the rest of the path, percent-decoded.
        .route("/v1/prices/{*model}", put(limits::put_price).get(limits::get_price))
        .route("/v1/usage", get(limits::usage))
        .route("/v1/logs", get(list_logs))
        .route("/v1/feedback", post(post_feedback))
        .route("/internal/v1/records", post(ingest_records))
        .route("/internal/v1/keys/{hash}", get(internal_key))
        .route("/internal/v1/workspaces/{workspace}/policy", get(limits::policy))
        .route("/internal/v1/leases", post(limits::leases))
        .route("/internal/v1/batches", post(batches::create).get(lists::list::<batches::ManagedBatches>))
        .route("/internal/v1/batches/{id}", get(batches::get))
        .route("/internal/v1/batches/{id}/cancel", post(batches::cancel))
        // Uploads are streamed and bounded by `max_file_bytes` as they are read.
        .route(
            "/internal/v1/files",
            post(files::upload).layer(DefaultBodyLimit::disable()).get(lists::list::<files::GatewayFiles>),
        )
        .route("/internal/v1/files/{id}", get(files::file).delete(files::delete))
        .route("/internal/v1/files/{id}/content", get(files::content))
        .route("/internal/v1/workspaces/{workspace}/{kind}/{id}", get(internal_item))
        .route("/internal/v1/workspaces/{workspace}/mcp-servers", get(mcp_servers::internal_list))
        // The static segment wins over `{kind}` above.
        .route("/internal/v1/workspaces/{workspace}/responses/{id}", put(responses::put).get(responses::get))
        .route("/internal/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/internal/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/internal/v1/responses/{id}/cancel", post(responses::cancel))
        .merge(crate::console::routes())
        .route(
            "/console/api/v1/{*path}",
            any(console_calls_api).layer(middleware::map_response(crate::console::secured)),
        )
        .fallback(|| async { ApiError::new(404, "invalid_request_error", "no such endpoint", None, Some("not_found")) })
        .with_state(state)
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `?version=<id>` of a prompt's GET (other parameters are ignored); given twice, a 400.
pub(crate) fn version_query(pairs: &[(String, String)]) -> ApiResult<Option<&str>> {
    let mut versions = pairs.iter().filter(|(name, _)| name == "version").map(|(_, value)| value.as_str());
    let version = versions.next();
    if versions.next().is_some() {
        return Err(ApiError::invalid("version", "version is given more than once"));
    }
    Ok(version)
}

// ---- prompts (spec 4.1, 4.2) ----

async fn put_prompt(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let target = put_target(&id)?;
    let body = json_object(&body)?;
    let existing = items::find(&s, &caller.workspace, Kind::Prompt, &target).await?;
    let latest = match &existing {
        Some(_) if body.get("patch") == Some(&Value::Bool(true)) => {
            Some(items::read(&s, &caller.workspace, Kind::Prompt, Some(target.clone()), None).await?.value)
        }
        _ => None,
    };
    let version = validate::prompt_version(&body, latest.as_ref().and_then(Value::as_object))?;
    let (item, version_id) =
        items::put(&s, &caller.workspace, Kind::Prompt, &target, existing, &Value::Object(version)).await?;
    Ok(Json(json!({"id": item.id, "slug": item.slug, "prompt_version_id": version_id})))
}

async fn get_prompt(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let pairs = validate::query_pairs(query)?;
    let read = items::read(&s, &caller.workspace, Kind::Prompt, path_target(&id), version_query(&pairs)?).await?;
    let mut out = Map::new();
    out.insert("id".into(), json!(read.item.id));
    out.insert("slug".into(), json!(read.item.slug));
    out.insert("prompt_version_id".into(), json!(read.version.id));
    out.insert("created_at".into(), json!(read.version.created_at));
    out.extend(read.value.as_object().cloned().unwrap_or_default());
    Ok(Json(Value::Object(out)))
}

async fn render_prompt(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let read = items::read(&s, &caller.workspace, Kind::Prompt, path_target(&id), None).await?;
    let request = json_object(&body)?;
    let data = shared::render(&read.value, &request)?;
    Ok(Json(json!({"success": true, "data": data})))
}

// ---- guardrails, configs, providers ----

/// `GET` of a kind's list ([`list_items`]).
fn listing(kind: Kind) -> MethodRouter<AppState> {
    get(move |s: State<AppState>, h: HeaderMap| list_items(s, h, kind))
}

/// `DELETE` of one item of a kind ([`delete_item`]).
fn deleting(kind: Kind) -> MethodRouter<AppState> {
    delete(move |s: State<AppState>, h: HeaderMap, p: Path<String>| delete_item(s, h, p, kind))
}

/// `GET /v1/{prompts|guardrails|configs|providers}`: the workspace's items of the kind, each its
/// id, slug, latest version and when that was made, by slug (their values: `GET` one).
async fn list_items(State(s): State<AppState>, h: HeaderMap, kind: Kind) -> ApiResult<Response> {
    let caller = auth::caller(&s, &h).await?;
    // Values are not read (nor opened, for sealed kinds): the list names the items only.
    let data = s
        .db
        .latest_items(&caller.workspace, kind)
        .await?
        .iter()
        .map(|(item, version)| {
            json!({"id": item.id, "slug": item.slug, "version_id": version.id, "created_at": version.created_at})
        })
        .collect();
    Ok(crate::lists::list_json(data, false))
}

/// `DELETE /v1/{prompts|guardrails|configs|providers}/{id}`: the item with every version.
async fn delete_item(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    kind: Kind,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let not_found = || ApiError::not_found(kind.as_str());
    let target = path_target(&id).ok_or_else(not_found)?;
    let item = items::find(&s, &caller.workspace, kind, &target).await?.ok_or_else(not_found)?;
    if !s.db.delete_item(&caller.workspace, kind, &item.slug).await? {
        return Err(not_found());
    }
    Ok(Json(json!({"id": item.id, "slug": item.slug, "deleted": true})))
}

/// PUT of a guardrail, config or provider: checked by the filter's code, then versioned.
async fn put_checked(
    s: &AppState,
    h: &HeaderMap,
    id: &str,
    body: &[u8],
    kind: Kind,
    check: fn(&Value) -> Result<(), SharedError>,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(s, h).await?;
    let target = put_target(id)?;
    let value = checked_item(body, kind, check)?;
    let existing = items::find(s, &caller.workspace, kind, &target).await?;
    let (item, version_id) = items::put(s, &caller.workspace, kind, &target, existing, &value).await?;
    Ok(Json(json!({"id": item.id, "slug": item.slug, "version_id": version_id})))
}

/// The body of a guardrail's, config's or provider's PUT as it is stored: a JSON object that
/// `check` (the filter's own reading of it) accepts.
pub(crate) fn checked_item(body: &[u8], kind: Kind, check: fn(&Value) -> Result<(), SharedError>) -> ApiResult<Value> {
    // A config (a stored provider is one) nested too deep is named as `check` names it.
    let configs = matches!(kind, Kind::Config | Kind::Provider);
    let object = json_object(body).map_err(|e| {
        if configs {
            shared::config_nested_too_deep(body).map_or(e, ApiError)
        } else {
            e
        }
    })?;
    let value = Value::Object(object);
    check(&value)?;
    Ok(value)
}

/// GET of a guardrail, config or provider: the latest version; `nest` puts the value under
/// that key (a config), else its fields sit beside `id`, `slug` and `version_id`.
async fn get_item(s: &AppState, h: &HeaderMap, id: &str, kind: Kind, nest: Option<&str>) -> ApiResult<Json<Value>> {
    let caller = auth::caller(s, h).await?;
    let read = items::read(s, &caller.workspace, kind, path_target(id), None).await?;
    let value = if kind == Kind::Provider { mask_secrets(&read.value) } else { read.value };
    let mut out = Map::new();
    out.insert("id".into(), json!(read.item.id));
    out.insert("slug".into(), json!(read.item.slug));
    out.insert("version_id".into(), json!(read.version.id));
    out.insert("created_at".into(), json!(read.version.created_at));
    match nest {
        Some(key) => {
            out.insert(key.into(), value);
        }
        None => out.extend(value.as_object().cloned().unwrap_or_default()),
    }
    Ok(Json(Value::Object(out)))
}

async fn put_guardrail(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    put_checked(&s, &h, &id, &body, Kind::Guardrail, shared::check_guardrail).await
}

async fn get_guardrail(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    get_item(&s, &h, &id, Kind::Guardrail, None).await
}

async fn put_config(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    put_checked(&s, &h, &id, &body, Kind::Config, shared::check_config).await
}

async fn get_config(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    get_item(&s, &h, &id, Kind::Config, Some("config")).await
}

async fn put_provider(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    put_checked(&s, &h, &id, &body, Kind::Provider, shared::check_provider).await
}

async fn get_provider(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    get_item(&s, &h, &id, Kind::Provider, None).await
}

// ---- API keys (admin only) ----

async fn admin(s: &AppState, h: &HeaderMap) -> ApiResult<Caller> {
    let caller = auth::caller(s, h).await?;
    caller.require_admin()?;
    Ok(caller)
}

async fn create_key(State(s): State<AppState>, h: HeaderMap, WholeBody(body): WholeBody) -> ApiResult<Response> {
    admin(&s, &h).await?;
    let request = validate::key_request(&json_object(&body)?)?;
    let key = new_api_key().map_err(ApiError::internal)?;
    let id = uuid::Uuid::new_v4().to_string();
    let last_four: String = key.chars().skip(key.len().saturating_sub(4)).collect();
    let new_key = NewKey {
        id: &id,
        workspace: &request.workspace,
        hash: &key_hash(&key),
        admin: request.admin,
        last_four: &last_four,
        mcp_tools: request.mcp_tools.as_deref(),
        name: request.name.as_deref(),
    };
    s.db.insert_key(&new_key).await?;
    let mut body =
        json!({"id": id, "key": key, "name": request.name, "workspace": request.workspace, "admin": request.admin});
    with_mcp_tools(&mut body, request.mcp_tools.as_deref());
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn list_keys(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Json<Value>> {
    admin(&s, &h).await?;
    let data: Vec<Value> =
        s.db.list_keys()
            .await?
            .into_iter()
            .map(|k| {
                let mut key = json!({"id": k.id, "name": k.name, "workspace": k.workspace, "admin": k.admin,
                "last_four": k.last_four, "created_at": k.created_at});
                with_mcp_tools(&mut key, k.mcp_tools.as_deref());
                key
            })
            .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// A key as shown carries `mcp_tools` only when it is narrowed to some tools.
fn with_mcp_tools(key: &mut Value, mcp_tools: Option<&[String]>) {
    if let (Value::Object(fields), Some(tools)) = (key, mcp_tools) {
        fields.insert("mcp_tools".into(), json!(tools));
    }
}

async fn delete_key(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    admin(&s, &h).await?;
    if !s.db.delete_key(&id).await? {
        return Err(ApiError::not_found("api key"));
    }
    Ok(Json(json!({"id": id, "deleted": true})))
}

/// `/console/api/v1/{path}`: the gateway API's `/v1/{path}` called as the console session's
/// caller, so the console's pages use the API's own endpoints, checks and errors (`param`); a
/// write also needs the session's CSRF token. Only the body and its content type pass.
async fn console_calls_api(
    State(s): State<AppState>,
    Path(path): Path<String>,
    request: Request,
) -> ApiResult<Response> {
    let (parts, body) = request.into_parts();
    let session = crate::console::signed_in(&s, &parts.headers).await?.1;
    if !matches!(parts.method, Method::GET | Method::HEAD) {
        crate::console::writes(&session, &parts.headers)?;
    }
    // The path stays under /v1 (the router matches it as it is, with no `.` or `..` step).
    if path.split('/').any(|step| step == "." || step == "..") {
        return Err(ApiError::not_found("console path"));
    }
    let query = parts.uri.query().map(|query| format!("?{query}")).unwrap_or_default();
    let caller = crate::console::caller(&session);
    let mut inner = Request::builder()
        .method(parts.method)
        .uri(format!("/v1/{path}{query}"))
        .header(auth::CONSOLE_CALLER, auth::console_caller(&s, &caller));
    if let Some(content_type) = parts.headers.get(CONTENT_TYPE) {
        inner = inner.header(CONTENT_TYPE, content_type);
    }
    let inner = inner.body(body).map_err(|_| ApiError::not_found("console path"))?;
    Ok(router(s).oneshot(inner).await.unwrap_or_else(|never| match never {}))
}

// ---- internal endpoints (the filter) ----

async fn internal_key(State(s): State<AppState>, h: HeaderMap, Path(hash): Path<String>) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let hash = hash.to_ascii_lowercase();
    if let Some(caller) = auth::static_key(&s, &hash) {
        return Ok(Json(json!({"workspace": caller.workspace, "admin": caller.admin})));
    }
    let stored = s.db.key_by_hash(&hash).await?.ok_or_else(|| ApiError::not_found("api key"))?;
    let mut key = json!({"id": stored.id, "workspace": stored.workspace, "admin": stored.admin});
    with_mcp_tools(&mut key, stored.mcp_tools.as_deref());
    Ok(Json(key))
}

async fn internal_item(
    State(s): State<AppState>,
    h: HeaderMap,
    Path((workspace, kind, id)): Path<(String, String, String)>,
) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let kind = Kind::from_plural(&kind).ok_or_else(|| ApiError::not_found("kind"))?;
    if !validate::is_name(&workspace, validate::MAX_WORKSPACE) {
        return Err(ApiError::not_found(kind.as_str()));
    }
    let read = items::read(&s, &workspace, kind, path_target(&id), None).await?;
    Ok(Json(json!({"id": read.item.id, "slug": read.item.slug, "version_id": read.version.id, "value": read.value})))
}

// ---- request logs and feedback (issue 15) ----

/// `POST /internal/v1/records`: a batch of the filter's records, stored in one transaction
/// whether or not their workspaces exist yet (the filter authenticated each request).
async fn ingest_records(State(s): State<AppState>, h: HeaderMap, body: Body) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    let body = axum::body::to_bytes(body, logs::MAX_BATCH_BYTES).await.map_err(|e| {
        ApiError::invalid(
            "records",
            &format!("the batch cannot be read (at most {} bytes): {e}", logs::MAX_BATCH_BYTES),
        )
    })?;
    let records = logs::batch(&body)?;
    s.db.insert_records(&records).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": records.len()}))).into_response())
}

/// `GET /v1/logs`: the caller's workspace's records, filtered and paged, newest first.
async fn list_logs(
    State(s): State<AppState>,
    h: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    Ok(Json(logs::page(&s, &caller.workspace, &validate::query_pairs(query)?).await?))
}

/// `POST /v1/feedback`: feedback on a trace of the caller's workspace, logged yet or not.
async fn post_feedback(State(s): State<AppState>, h: HeaderMap, WholeBody(body): WholeBody) -> ApiResult<Response> {
    let caller = auth::caller(&s, &h).await?;
    let feedback = logs::feedback(&json_object(&body)?)?;
    s.db.insert_feedback(&caller.workspace, &logs::index_key(&feedback.trace_id), &feedback).await?;
    let body = json!({"status": "accepted", "trace_id": feedback.trace_id});
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompts_version_is_given_once() {
        let pairs = |query: &[(&str, &str)]| -> Vec<(String, String)> {
            query.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
        };
        assert_eq!(version_query(&pairs(&[("version", "v1"), ("other", "x")])).unwrap(), Some("v1"));
        assert_eq!(version_query(&pairs(&[])).unwrap(), None);
        let twice = version_query(&pairs(&[("version", "v1"), ("version", "v2")])).unwrap_err().0;
        assert_eq!((twice.status, twice.param().as_deref()), (400, Some("version")));
    }
}
