//! A request to an MCP endpoint as routing sees it (docs/mcp.md): the caller's key, then the
//! server it names (the plugin configuration's, else the workspace's in the control plane) or,
//! for the aggregate endpoint, every server the caller may use.

use super::{caller, RawHeaders, Refusals, Started, ToolChecks};
use crate::catalog::{Catalog, KeyOwner, Kind, Ref};
use crate::errors::GatewayError;
use crate::guardrails::cached_jwks;
use crate::mcp;
use crate::mcp::oauth::{self, Verified};
use crate::ports::Host;
use crate::request::headers;
use crate::settings::Settings;
use crate::upstream::Upstream;
use serde_json::Value;

/// The header naming what else of the caller's an MCP server gets (docs/mcp.md).
const MCP_FORWARD_HEADER: &str = "x-gateway-forward-headers";
/// The header naming the config whose hooks and guardrails check tool calls.
const CONFIG_HEADER: &str = "x-gateway-config";

/// A request to an MCP endpoint: the caller's key first (as `Authorization: Bearer` too), then
/// where it goes (docs/mcp.md).
pub(super) fn start_mcp(
    settings: &Settings,
    raw: &RawHeaders,
    method: &str,
    path: &str,
    query: Option<&str>,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Started, GatewayError> {
    let refusals = Refusals { missing: mcp::missing_key, invalid: mcp::invalid_key };
    let presented = mcp::presented_key(headers::api_key(raw), headers::find(raw, "authorization"));
    // An access token of the OAuth issuer, else a gateway key; `subject` names the token's caller.
    let (owner, subject) = match (&settings.mcp_oauth, presented) {
        (Some(oauth), Some(token)) if oauth::looks_like_jwt(token) => {
            let token = std::str::from_utf8(token).map_err(|_| mcp::invalid_token("it is not text"))?;
            let cached = cached_jwks(host.store(), &oauth.jwks_uri);
            match oauth.verify(token, cached.as_ref(), host.now_ms() / 1000) {
                Verified::Caller { workspace, subject } => {
                    (KeyOwner { workspace, key_id: None, mcp_tools: None }, Some(subject))
                }
                Verified::NeedsJwks => return Ok(Started::Jwks(oauth.jwks_uri.clone())),
                Verified::Refused(why) => return Err(mcp::invalid_token(&why)),
            }
        }
        _ => (caller(settings, presented, &refusals, host, catalog)?, None),
    };
    catalog.workspace = owner.workspace;
    let forwarded = match headers::find(raw, MCP_FORWARD_HEADER) {
        Some(list) => {
            let list = std::str::from_utf8(list)
                .map_err(|_| GatewayError::invalid_header(MCP_FORWARD_HEADER, "must be a list of header names"))?;
            headers::parse_header_list(MCP_FORWARD_HEADER, list)?
        }
        None => Vec::new(),
    };
    let request = mcp::Request {
        method,
        path,
        query,
        origin: headers::find(raw, "origin"),
        authority: headers::find(raw, ":authority"),
        allowed_origins: &settings.mcp_allowed_origins,
        forwarded: &forwarded,
        headers: raw,
    };
    // Refused before anything is read for it: a foreign Origin, a method or a path no MCP
    // endpoint has.
    let id = mcp::server_id(&request)?;
    let policy = match catalog.enabled() {
        true => catalog.policy(host)?,
        false => None,
    };
    let checks = match headers::find(raw, CONFIG_HEADER) {
        Some(value) => {
            let value = headers::decode_value(CONFIG_HEADER, value)?;
            Some(Box::new(ToolChecks::of(&value, catalog, host)?))
        }
        None => None,
    };
    let cluster = |upstream: &Upstream| settings.routed_cluster(upstream);
    let routing = mcp::Routing { route_header: settings.route_header(), cluster: &cluster };
    let key_tools = owner.mcp_tools.as_ref();
    let Some(id) = id else {
        // Every server of the plugin configuration, then the workspace's.
        let mut servers: Vec<(String, mcp::Server)> =
            settings.mcp_servers.iter().map(|(id, server)| (id.to_string(), server.clone())).collect();
        if catalog.enabled() {
            let list = catalog.mcp_servers(host)?;
            servers.extend(stored_servers(settings, list.as_deref(), &servers));
        }
        let members = servers.into_iter().map(|(id, server)| {
            let tools = mcp::ToolPolicy::new(&id, &server.tools, key_tools);
            let routed = mcp::edits(&id, &server, &routing, &request, tools);
            mcp::Member { id, server, routed }
        });
        let caller = match (&owner.key_id, subject, presented) {
            (Some(key_id), _, _) => key_id.clone(),
            (None, Some(subject), _) => subject,
            (None, None, key) => Ref::key(key.unwrap_or_default()).id,
        };
        let client_session = mcp::client_session(headers::find(raw, "mcp-session-id")).map(str::to_string);
        let sealed = match client_session.as_deref() {
            Some(id) => {
                let key = mcp::sealed::SessionKey::or_own(settings.mcp_session_key.as_ref(), host);
                mcp::sealed::unseal(&key, id, &caller).unwrap_or_default()
            }
            None => Vec::new(),
        };
        let version = headers::find(raw, "mcp-protocol-version");
        let stateless = version == Some(mcp::aggregate::STATELESS_VERSION.as_bytes());
        let workspace = catalog.workspace.clone();
        let members = members.collect();
        let aggregate = mcp::Aggregate { caller, workspace, client_session, sealed, stateless, members };
        let target = mcp::Target::Aggregate(Box::new(aggregate));
        return Ok(Started::Mcp { target, key_id: owner.key_id, policy, checks });
    };
    // The plugin configuration's servers, then the workspace's in the control plane.
    let stored;
    let server = match settings.mcp_servers.get(id) {
        Some(server) => server,
        None if catalog.enabled() => {
            let entry = catalog.item(Kind::McpServer, id, host)?.ok_or_else(|| mcp::unknown_server(id))?;
            stored = mcp::stored_server(id, &entry)?;
            settings.require_allowed("MCP server host", &stored.upstream.host)?;
            &stored
        }
        None => return Err(mcp::unknown_server(id)),
    };
    let tools = mcp::ToolPolicy::new(id, &server.tools, key_tools);
    let routed = mcp::edits(id, server, &routing, &request, tools);
    Ok(Started::Mcp { target: mcp::Target::Server(routed), key_id: owner.key_id, policy, checks })
}

/// The servers of the workspace's list (the control plane's `data`) that the aggregate may
/// use: not one of `configured` (the plugin configuration's id wins), parsed, and on an allowed
/// host; any other is left out with a log line, never failing the caller's request.
fn stored_servers(
    settings: &Settings,
    list: Option<&Value>,
    configured: &[(String, mcp::Server)],
) -> Vec<(String, mcp::Server)> {
    let entries = list.and_then(|list| list.get("data")).and_then(Value::as_array);
    let mut servers = Vec::new();
    for entry in entries.into_iter().flatten() {
        let Some(id) = entry.get("id").and_then(Value::as_str).filter(|id| mcp::is_server_id(id)) else {
            continue;
        };
        if configured.iter().any(|(known, _)| known == id) {
            continue;
        }
        let value = entry.get("value").unwrap_or(&Value::Null);
        let server = mcp::stored_server(id, value)
            .and_then(|server| settings.require_allowed("MCP server host", &server.upstream.host).map(|_| server));
        match server {
            Ok(server) => servers.push((id.to_string(), server)),
            Err(error) => log::warn!("MCP server '{id}' left out of the aggregate endpoint: {}", error.message),
        }
    }
    servers
}
