//! The MCP servers of a workspace (issue 46): `PUT`/`GET`/`DELETE /v1/mcp-servers/{id}`,
//! `GET /v1/mcp-servers`, and the filter's read of them all,
//! `GET /internal/v1/workspaces/{workspace}/mcp-servers` (one server is read like any item, at
//! `/internal/v1/workspaces/{workspace}/mcp-servers/{id}`). Versioned items like stored
//! providers, sealed likewise (their `headers` are the servers' credentials), checked by the
//! parser the filter reads its own `mcp_servers` with.

use crate::auth;
use crate::db::Kind;
use crate::errors::{ApiError, ApiResult};
use crate::items::{self, mask_headers, Read};
use crate::lists::list_json;
use crate::validate::{self, json_object, Path, Target, WholeBody};
use crate::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use gateway_schema::mcp_servers::{is_server_id, parse_server, MAX_SERVER_ID};
use serde_json::{json, Map, Value};

/// The item a server id names; `None` when it is not a server id (nothing by that id).
fn target(id: &str) -> Option<Target> {
    is_server_id(id).then(|| Target::Slug(id.to_string()))
}

/// The path id of a PUT: a server id, else a 400.
pub(crate) fn put_target(id: &str) -> ApiResult<Target> {
    target(id).ok_or_else(|| {
        ApiError::invalid("id", &format!("an MCP server id is 1 to {MAX_SERVER_ID} characters from [a-z0-9-]"))
    })
}

/// The server as the public endpoints show it: its id, version, when it was last written, and
/// its fields with each header value masked.
fn public(read: &Read) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), json!(read.item.slug));
    out.insert("version_id".into(), json!(read.version.id));
    out.insert("updated_at".into(), json!(read.version.created_at));
    if let Value::Object(fields) = mask_headers(&read.value) {
        out.extend(fields);
    }
    Value::Object(out)
}

/// The body of a `PUT /v1/mcp-servers/{id}` as it is stored: the object as given, once the
/// filter's parser accepts it.
pub(crate) fn server_body(body: &[u8]) -> ApiResult<Value> {
    let fields = json_object(body)?;
    // A field without a name is the body's fault: it names no field of its own.
    parse_server(&fields)
        .map_err(|(path, message)| ApiError::invalid(if path.is_empty() { "body" } else { &path }, &message))?;
    Ok(Value::Object(fields))
}

/// `PUT /v1/mcp-servers/{id}`: creates the server or replaces it (a new version).
pub async fn put(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let target = put_target(&id)?;
    let value = server_body(&body)?;
    let existing = items::find(&s, &caller.workspace, Kind::McpServer, &target).await?;
    items::put(&s, &caller.workspace, Kind::McpServer, &target, existing, &value).await?;
    let read = items::read(&s, &caller.workspace, Kind::McpServer, Some(target), None).await?;
    Ok(Json(public(&read)))
}

/// `GET /v1/mcp-servers/{id}`.
pub async fn get(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let read = items::read(&s, &caller.workspace, Kind::McpServer, target(&id), None).await?;
    Ok(Json(public(&read)))
}

/// `GET /v1/mcp-servers`: the workspace's servers, by id.
pub async fn list(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Response> {
    let caller = auth::caller(&s, &h).await?;
    let servers = items::list(&s, &caller.workspace, Kind::McpServer).await?;
    Ok(list_json(servers.iter().map(public).collect(), false))
}

/// `DELETE /v1/mcp-servers/{id}`.
pub async fn delete(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let not_found = || ApiError::not_found(Kind::McpServer.as_str());
    let target = target(&id).ok_or_else(not_found)?;
    if !s.db.delete_item(&caller.workspace, Kind::McpServer, target.text()).await? {
        return Err(not_found());
    }
    Ok(Json(json!({"id": id, "deleted": true})))
}

/// `GET /internal/v1/workspaces/{workspace}/mcp-servers` (the filter): every server of the
/// workspace, opened, as `{"id", "version_id", "value"}` by id.
pub async fn internal_list(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(workspace): Path<String>,
) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    if !validate::is_name(&workspace, validate::MAX_WORKSPACE) {
        return Ok(list_json(Vec::new(), false));
    }
    let servers = items::list(&s, &workspace, Kind::McpServer).await?;
    let data = servers
        .into_iter()
        .map(|read| json!({"id": read.item.slug, "version_id": read.version.id, "value": read.value}))
        .collect();
    Ok(list_json(data, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_stored_as_given_once_the_filters_parser_accepts_it() {
        let body =
            br#"{"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer t"}, "failure": "closed"}"#;
        assert_eq!(server_body(body).unwrap(), serde_json::from_slice::<Value>(body).unwrap());
        let param = |body: &[u8]| server_body(body).unwrap_err().0.param();
        assert_eq!(param(br#"{"url": "http://a", "tools": {"allow": ["ok", 5]}}"#).as_deref(), Some("tools.allow[1]"));
        assert_eq!(param(br#"{"headers": {}}"#).as_deref(), Some("url"));
        assert_eq!(param(b"[]").as_deref(), Some("body"));
        assert_eq!(
            (target("files-2"), target("Files"), target(&"a".repeat(33))),
            (Some(Target::Slug("files-2".into())), None, None)
        );
    }
}
