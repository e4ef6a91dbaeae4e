//! Versioned items of a workspace: how values are written (providers and MCP servers sealed
//! with the master key) and read back, and how their secrets are masked for public reads.

use crate::db::{Item, Kind, Version};
use crate::errors::{ApiError, ApiResult};
use crate::validate::Target;
use crate::AppState;
use serde_json::{Map, Value};

/// Provider fields that hold secrets, at any depth (`deployments[]` included).
const SECRET_FIELDS: &[&str] = &[
    "api_key",
    "cloud_c_access_key_id",
    "cloud_c_secret_access_key",
    "cloud_c_session_token",
    "cloud_b_service_account_json",
];

/// An MCP server's field of secrets: every value of it.
const MCP_HEADERS: &str = "headers";

/// The fields whose values a read shows as their last four characters only: a provider's (at
/// any depth) and an MCP server's headers.
pub fn masked_fields() -> Vec<&'static str> {
    SECRET_FIELDS.iter().copied().chain([MCP_HEADERS]).collect()
}

/// A version as read: its item, the version and its value (providers opened).
pub struct Read {
    pub item: Item,
    pub version: Version,
    pub value: Value,
}

/// The item a path names in the workspace, if any.
pub async fn find(state: &AppState, workspace: &str, kind: Kind, target: &Target) -> ApiResult<Option<Item>> {
    Ok(state.db.find_item(workspace, kind, target.text()).await?)
}

/// Adds a version to the item `target` names, creating it when `target` is a new slug (a
/// UUID nobody has is a 404).
pub async fn put(
    state: &AppState,
    workspace: &str,
    kind: Kind,
    target: &Target,
    existing: Option<Item>,
    value: &Value,
) -> ApiResult<(Item, String)> {
    if existing.is_none() && matches!(target, Target::Id(_)) {
        return Err(ApiError::not_found(kind.as_str()));
    }
    let stored = if sealed(kind) {
        state.key.seal(value.to_string().as_bytes()).map_err(ApiError::internal)?
    } else {
        value.to_string()
    };
    // Two writers of one item can race for its next version number (or its creation): the
    // loser's unique violation is retried against what the winner wrote. A version of an
    // item deleted meanwhile (a foreign key violation) makes the item again.
    let mut existing = existing;
    for _ in 0..5 {
        match state.db.add_version(workspace, kind, existing.clone(), target.text(), &stored).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() || e.is_foreign_key_violation() => {
                existing = find(state, workspace, kind, target).await?;
            }
            done => return Ok(done?),
        }
    }
    Err(ApiError::new(409, "invalid_request_error", "concurrent writes to this item; retry", None, Some("conflict")))
}

/// The latest version (or `version_id`) of the item `target` names; 404 when there is none.
pub async fn read(
    state: &AppState,
    workspace: &str,
    kind: Kind,
    target: Option<Target>,
    version_id: Option<&str>,
) -> ApiResult<Read> {
    let not_found = || ApiError::not_found(kind.as_str());
    let target = target.ok_or_else(not_found)?;
    let item = find(state, workspace, kind, &target).await?.ok_or_else(not_found)?;
    let version = match version_id {
        Some(id) => state.db.version(&item.id, &id.to_ascii_lowercase()).await?,
        None => state.db.latest(&item.id).await?,
    };
    let version = version.ok_or_else(|| ApiError::not_found(&format!("{} version", kind.as_str())))?;
    let value = decode(state, kind, &version.value)?;
    Ok(Read { item, version, value })
}

/// The latest version of every item of `kind` in the workspace, by slug.
pub async fn list(state: &AppState, workspace: &str, kind: Kind) -> ApiResult<Vec<Read>> {
    let items = state.db.latest_items(workspace, kind).await?;
    items
        .into_iter()
        .map(|(item, version)| Ok(Read { value: decode(state, kind, &version.value)?, item, version }))
        .collect()
}

/// Whether values of `kind` hold secrets, so are sealed at rest.
fn sealed(kind: Kind) -> bool {
    matches!(kind, Kind::Provider | Kind::McpServer)
}

fn decode(state: &AppState, kind: Kind, stored: &str) -> ApiResult<Value> {
    let text =
        if sealed(kind) { state.key.open(stored).map_err(ApiError::internal)? } else { stored.as_bytes().to_vec() };
    serde_json::from_slice(&text).map_err(|e| ApiError::internal(format!("a stored value is not JSON: {e}")))
}

/// Every secret field replaced by its last four characters (nothing for secrets under 8).
pub fn mask_secrets(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if SECRET_FIELDS.contains(&k.as_str()) { last_four(v) } else { mask_secrets(v) };
                    (k.clone(), v)
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_secrets).collect()),
        other => other.clone(),
    }
}

/// An MCP server with each of its `headers` (the server's credentials) replaced by its last
/// four characters, as `mask_secrets` shows a provider's.
pub fn mask_headers(value: &Value) -> Value {
    let mut masked = value.clone();
    if let Some(Value::Object(headers)) = masked.get_mut(MCP_HEADERS) {
        for secret in headers.values_mut() {
            *secret = last_four(secret);
        }
    }
    masked
}

fn last_four(secret: &Value) -> Value {
    let text = match secret {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let chars: Vec<char> = text.chars().collect();
    let shown = if chars.len() < 8 { String::new() } else { chars.iter().skip(chars.len() - 4).collect() };
    Value::String(shown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_show_their_last_four_only() {
        let stored = json!({"provider": "openai", "api_key": "sk-abcdef123456", "custom_host": "http://h",
            "deployments": [{"api_key": "zzzzzzzz9876", "deployment_id": "d"}], "cloud_c_secret_access_key": "short"});
        assert_eq!(
            mask_secrets(&stored),
            json!({"provider": "openai", "api_key": "3456", "custom_host": "http://h",
                "deployments": [{"api_key": "9876", "deployment_id": "d"}], "cloud_c_secret_access_key": ""})
        );
    }

    #[test]
    fn an_mcp_servers_headers_show_their_last_four_only() {
        let stored = json!({"url": "http://h/mcp", "headers": {"Authorization": "Bearer tok-123456", "X-Short": "abc"},
            "tools": {"allow": ["api_key"]}});
        assert_eq!(
            mask_headers(&stored),
            json!({"url": "http://h/mcp", "headers": {"Authorization": "3456", "X-Short": ""},
                "tools": {"allow": ["api_key"]}})
        );
        assert_eq!(mask_headers(&json!({"url": "http://h"})), json!({"url": "http://h"}));
    }
}
