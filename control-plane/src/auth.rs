//! Who calls: a gateway API key (`x-gateway-api-key`) decides the workspace and whether the
//! caller is an admin; the filter's internal calls carry `authorization: Bearer <token>`.

use crate::crypto::{constant_time_eq, key_hash};
use crate::errors::{ApiError, ApiResult};
use crate::AppState;
use axum::http::HeaderMap;

/// The workspace of the static admin keys (`GATEWAY_API_KEYS`).
pub const DEFAULT_WORKSPACE: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub workspace: String,
    pub admin: bool,
}

impl Caller {
    pub fn require_admin(&self) -> ApiResult<()> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::forbidden("this endpoint needs an admin API key"))
        }
    }
}

/// The header by which the console's call to the gateway API (`/console/api/v1/...`, made inside
/// the process) names its session's caller: `{console secret} {0|1: admin} {workspace}`.
pub const CONSOLE_CALLER: &str = "x-gateway-console-caller";

/// `CONSOLE_CALLER`'s value for `caller`.
pub fn console_caller(state: &AppState, caller: &Caller) -> String {
    format!("{} {} {}", state.console_secret, u8::from(caller.admin), caller.workspace)
}

/// The caller of a public endpoint: a static admin key, else a stored key (by its hash), or
/// the console session's a call of the console names.
pub async fn caller(state: &AppState, headers: &HeaderMap) -> ApiResult<Caller> {
    if let Some(value) = headers.get(CONSOLE_CALLER) {
        let text = value.to_str().unwrap_or_default();
        let mut parts = text.splitn(3, ' ');
        let (secret, admin, workspace) = (parts.next(), parts.next(), parts.next());
        return match (secret, admin, workspace) {
            (Some(secret), Some(admin @ ("0" | "1")), Some(workspace))
                if constant_time_eq(secret.as_bytes(), state.console_secret.as_bytes()) =>
            {
                Ok(Caller { workspace: workspace.to_string(), admin: admin == "1" })
            }
            _ => Err(ApiError::unauthorized("unknown console caller")),
        };
    }
    let key = headers
        .get("x-gateway-api-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::unauthorized("missing x-gateway-api-key header"))?;
    caller_of_key(state, key).await
}

/// Whose `key` is: a static admin key's, else a stored key's (by its hash).
pub async fn caller_of_key(state: &AppState, key: &str) -> ApiResult<Caller> {
    caller_of_hash(state, &key_hash(key)).await?.ok_or_else(|| ApiError::unauthorized("unknown API key"))
}

/// Whose key hashes to `hash`, while it works: a static admin key's, else a stored key's.
pub async fn caller_of_hash(state: &AppState, hash: &str) -> ApiResult<Option<Caller>> {
    if let Some(caller) = static_key(state, hash) {
        return Ok(Some(caller));
    }
    let stored = state.db.key_by_hash(hash).await?;
    Ok(stored.map(|stored| Caller { workspace: stored.workspace, admin: stored.admin }))
}

/// A static admin key by its hash (compared in constant time).
pub fn static_key(state: &AppState, hash: &str) -> Option<Caller> {
    let mut found = false;
    for known in &state.admin_key_hashes {
        found |= constant_time_eq(known.as_bytes(), hash.as_bytes());
    }
    found.then(|| Caller { workspace: DEFAULT_WORKSPACE.to_string(), admin: true })
}

/// The filter's bearer token on the internal endpoints.
pub fn internal(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !presented.is_empty() && constant_time_eq(presented.as_bytes(), state.internal_token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("the internal endpoints need the control plane token"))
    }
}
