//! The MCP endpoints as an OAuth resource server (docs/mcp.md, "OAuth"): with `mcp_oauth` set, a
//! caller may present an access token of the configured issuer instead of a gateway key. The
//! token is verified against the issuer's JWKS (fetched, and cached in shared data as
//! `default.jwt`'s is); its `aud` must name the gateway's MCP resource, and a claim of it names
//! the workspace. The gateway serves the resource's metadata (RFC 9728) and names it in the
//! `WWW-Authenticate` of every 401. Tokens never go upstream: servers get their own headers.

use crate::guardrails::jwt::{self, Failure};
use crate::guardrails::params::Rules;
use crate::guardrails::CachedJwks;
use crate::upstream::Upstream;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

/// Where RFC 9728 puts a resource's metadata: this, then the resource's path.
pub(crate) const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";
/// A cached JWKS is fetched again after this long (seconds), so a key the issuer withdrew stops
/// verifying.
const JWKS_MAX_AGE_S: u64 = 3600;
/// The signature algorithms an access token may use.
const ALGORITHMS: [&str; 6] = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"];
/// Clocks differ this much (seconds) between the issuer and the gateway.
const CLOCK_TOLERANCE_S: u64 = 60;

/// `mcp_oauth`, parsed once.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OAuth {
    issuer: String,
    pub(crate) jwks_uri: String,
    /// Where the JWKS is fetched from.
    pub(crate) jwks: Upstream,
    /// The gateway's MCP URL: the `aud` a token must carry.
    resource: String,
    workspace_claim: String,
    /// The `WWW-Authenticate` of a 401: `Bearer resource_metadata="..."`.
    pub(crate) challenge: String,
    /// The metadata document.
    pub(crate) metadata: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    issuer: String,
    jwks_uri: String,
    resource: String,
    #[serde(default = "default_workspace_claim")]
    workspace_claim: String,
}

fn default_workspace_claim() -> String {
    "workspace".to_string()
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<OAuth>, D::Error> {
    let raw = Option::<Raw>::deserialize(deserializer)?;
    raw.map(OAuth::parse).transpose().map_err(serde::de::Error::custom)
}

impl OAuth {
    fn parse(raw: Raw) -> Result<OAuth, String> {
        if raw.issuer.trim().is_empty() {
            return Err("mcp_oauth.issuer must not be empty".to_string());
        }
        let jwks = Upstream::parse(&raw.jwks_uri).map_err(|why| format!("mcp_oauth.jwks_uri {why}"))?;
        let resource = Upstream::parse(&raw.resource).map_err(|why| format!("mcp_oauth.resource {why}"))?;
        if raw.workspace_claim.is_empty() {
            return Err("mcp_oauth.workspace_claim must not be empty".to_string());
        }
        // RFC 9728: the well-known path goes between the resource's authority and its path.
        let Some(origin) = raw.resource.strip_suffix(resource.base_path.as_str()) else {
            return Err("mcp_oauth.resource must not end with a slash".to_string());
        };
        let origin = origin.trim_end_matches('/');
        let metadata_url = format!("{origin}{METADATA_PREFIX}{}", resource.base_path);
        let metadata = json!({
            "resource": raw.resource,
            "authorization_servers": [raw.issuer],
            "bearer_methods_supported": ["header"],
        });
        Ok(OAuth {
            issuer: raw.issuer,
            jwks_uri: raw.jwks_uri,
            jwks,
            resource: raw.resource,
            workspace_claim: raw.workspace_claim,
            challenge: format!("Bearer resource_metadata=\"{metadata_url}\""),
            metadata: metadata.to_string().into_bytes(),
        })
    }

    /// What `token` (a bearer token that looks like a JWT) is, given the JWKS cached for the
    /// issuer (if any) at `now_s`.
    pub(crate) fn verify(&self, token: &str, cached: Option<&CachedJwks>, now_s: u64) -> Verified {
        let parsed = match jwt::parse(token) {
            Ok(parsed) => parsed,
            Err(why) => return Verified::Refused(why),
        };
        let Some(cached) = cached.filter(|cached| now_s < cached.fetched_at_s.saturating_add(JWKS_MAX_AGE_S)) else {
            return Verified::NeedsJwks;
        };
        let rules = Rules {
            algorithms: ALGORITHMS.iter().map(|alg| alg.to_string()).collect(),
            clock_tolerance_s: CLOCK_TOLERANCE_S,
            max_token_age_s: None,
        };
        match jwt::verify(&parsed, &cached.json, &rules, now_s) {
            Ok(()) => {}
            // Whole seconds both: only a later second than the limit's is surely over it.
            Err(Failure::UnknownKid(_)) if now_s > cached.fetched_at_s.saturating_add(jwt::REFETCH_AFTER_S) => {
                return Verified::NeedsJwks
            }
            Err(Failure::UnknownKid(why) | Failure::Invalid(why)) => return Verified::Refused(why),
        }
        let claims = parsed.claims();
        let text = |name: &str| claims.get(name).and_then(Value::as_str);
        if claims.get("exp").is_none() {
            return Verified::Refused("the token has no `exp`".to_string());
        }
        if text("iss") != Some(self.issuer.as_str()) {
            return Verified::Refused("the token is not of the configured issuer (`iss`)".to_string());
        }
        let audience = match claims.get("aud") {
            Some(Value::String(aud)) => aud == &self.resource,
            Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(self.resource.as_str())),
            _ => false,
        };
        if !audience {
            return Verified::Refused(format!("the token's `aud` does not name {}", self.resource));
        }
        let Some(workspace) = text(&self.workspace_claim) else {
            return Verified::Refused(format!("the token has no `{}` naming its workspace", self.workspace_claim));
        };
        // The caller's identity seals its MCP sessions: one `sub` in two workspaces is two
        // callers, and a token naming no one (RFC 9068 requires `sub`) is nobody's.
        let Some(subject) = text("sub").filter(|sub| !sub.is_empty()) else {
            return Verified::Refused("the token has no `sub` naming its caller".to_string());
        };
        let subject = json!([self.issuer, subject, workspace]).to_string();
        Verified::Caller { workspace: workspace.to_string(), subject }
    }
}

/// What a bearer token is to the gateway.
#[derive(Debug, PartialEq)]
pub(crate) enum Verified {
    /// A caller of `workspace`; `subject` names it (the issuer, its `sub` and the workspace).
    Caller { workspace: String, subject: String },
    /// The issuer's JWKS must be fetched first (none cached, stale, or without the token's key).
    NeedsJwks,
    /// Why the token is refused.
    Refused(String),
}

/// The answer to a method other than GET at the metadata's path: it is only read.
pub(crate) fn metadata_is_read() -> crate::errors::GatewayError {
    let message = "the protected resource metadata is read with GET";
    crate::errors::GatewayError::method_not_allowed(message, &["GET", "HEAD"])
}

/// Whether a bearer token is a JWT (three base64url parts, a JSON header) rather than a
/// gateway key.
pub(crate) fn looks_like_jwt(token: &[u8]) -> bool {
    token.starts_with(b"eyJ") && token.iter().filter(|b| **b == b'.').count() == 2
}

#[cfg(test)]
mod tests;
