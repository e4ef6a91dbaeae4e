//! MCP (Model Context Protocol) servers behind the gateway: a second kind of exchange in the
//! same core (docs/mcp.md). What is MCP's own lives here as pure decisions: the endpoint a
//! request names, the caller's key, the `Origin` check, the header edits that route a request
//! to its server, and the gateway's errors as JSON-RPC. The exchange applies them.

pub(crate) mod aggregate;
mod message;
pub(crate) mod oauth;
pub(crate) mod params;
pub(crate) mod sealed;
mod servers;
mod tools;

pub(crate) use aggregate::{client_session, forget_session, keep_session, Backend, List, Plan};
pub(crate) use message::{
    answer_in, denied_answer, for_era, prefixed, read as read_message, AnswerWatch, Message, Outcome,
};
pub(crate) use servers::{deserialize as deserialize_servers, is_server_id, Server, Servers};
pub(crate) use tools::{unknown_tool, AnswerRewrite, Bridge, Edit, ToolPolicy};

use crate::errors::GatewayError;
use crate::upstream::Upstream;
use serde_json::{json, Value};

/// Where the MCP endpoints live: the aggregate `/mcp` and one server's `/mcp/{server}`.
const PREFIX: &str = "/mcp";

/// The methods MCP's streamable HTTP transport uses (GET: the server's stream; DELETE: the end
/// of a session).
pub(crate) const ALLOWED_METHODS: &str = "GET, POST, DELETE";
/// The aggregate endpoint has no stream of its own: no GET.
pub(crate) const AGGREGATE_METHODS: &str = "POST, DELETE";

/// Whether `path` (without its query) is an MCP endpoint. Only asked of paths outside `/v1`,
/// so model requests never pay for it.
pub(crate) fn is_mcp_path(path: &str) -> bool {
    path.strip_prefix(PREFIX).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The caller's gateway key: the `x-gateway-api-key` header's, else the bearer token of its
/// `authorization` header (what MCP clients let a user configure).
pub(crate) fn presented_key<'a>(gateway_key: Option<&'a [u8]>, authorization: Option<&'a [u8]>) -> Option<&'a [u8]> {
    gateway_key.or_else(|| {
        let value = authorization?;
        let scheme = value.get(..7)?;
        scheme.eq_ignore_ascii_case(b"bearer ").then(|| value.get(7..)).flatten().filter(|key| !key.is_empty())
    })
}

pub(crate) fn missing_key() -> GatewayError {
    GatewayError::new(
        401,
        "authentication_error",
        "missing gateway key: send Authorization: Bearer <gateway key> (or x-gateway-api-key)",
    )
    .with_code("missing_api_key")
}

pub(crate) fn invalid_key() -> GatewayError {
    GatewayError::new(401, "authentication_error", "invalid gateway key").with_code("invalid_api_key")
}

/// An access token that is not accepted (`mcp_oauth`), and why.
pub(crate) fn invalid_token(why: &str) -> GatewayError {
    GatewayError::new(401, "authentication_error", format!("invalid access token: {why}")).with_code("invalid_token")
}

/// The OAuth metadata asked for while the gateway is no resource server (no `mcp_oauth`).
pub(crate) fn no_oauth_metadata() -> GatewayError {
    let message = "this gateway takes no OAuth access tokens (mcp_oauth is not set): use a gateway key";
    GatewayError::new(404, "invalid_request_error", message).with_code("unknown_endpoint")
}

/// The issuer's JWKS could not be fetched (`status` 0: no answer), so no token can be checked.
pub(crate) fn jwks_unavailable(status: u16) -> GatewayError {
    let message = format!("the OAuth issuer's keys (jwks_uri) could not be fetched (status {status}): try again");
    GatewayError::new(503, "api_error", message).with_code("jwks_unavailable")
}

/// What an MCP request was, for its record and metric: the server, and (for a POST) the
/// JSON-RPC method and tool its message named, and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Facts {
    pub(crate) server: String,
    /// The message's JSON-RPC id: the gateway's own answers carry it (not recorded).
    pub(crate) id: Option<Value>,
    pub(crate) method: Option<String>,
    pub(crate) tool: Option<String>,
    pub(crate) outcome: Outcome,
}

/// Where an MCP request goes: one server, or every server the caller may use.
#[derive(Debug)]
pub(crate) enum Target {
    Server(Routed),
    Aggregate(Box<Aggregate>),
}

/// A request to the aggregate endpoint: who asks (for the servers' sessions), in which of the
/// gateway's sessions, and the servers it may use.
#[derive(Debug)]
pub(crate) struct Aggregate {
    /// The caller's identity: its key's id, or its key's hash (never the key).
    pub(crate) caller: String,
    /// The caller's workspace (the servers' lists are kept per workspace).
    pub(crate) workspace: String,
    /// The client's session with the gateway (its `Mcp-Session-Id`).
    pub(crate) client_session: Option<String>,
    /// The servers' sessions sealed in the client's session id (docs/mcp.md).
    pub(crate) sealed: sealed::Sessions,
    /// Whether the client speaks the stateless era (2026-07-28).
    pub(crate) stateless: bool,
    pub(crate) members: Vec<Member>,
}

/// A server of the aggregate: the server, and the edits that send the caller's request there.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: String,
    pub(crate) server: Server,
    pub(crate) routed: Routed,
}

impl Aggregate {
    /// The members' ids with what the caller may use of their tools.
    pub(crate) fn policies(&self) -> Vec<(&str, Option<&ToolPolicy>)> {
        self.members.iter().map(|m| (m.id.as_str(), m.routed.tools.as_deref())).collect()
    }

    /// Whose member `server`'s session is.
    pub(crate) fn session_identity(&self, server: &str) -> String {
        aggregate::session_identity(&self.caller, self.client_session.as_deref(), server)
    }

    /// The session kept for member `server`: the one this Envoy opened since (shared data),
    /// else the one sealed in the client's session id.
    pub(crate) fn kept_session(
        &self,
        store: &dyn crate::ports::SharedStore,
        server: &str,
    ) -> Option<aggregate::Session> {
        let sealed = || self.sealed.iter().find(|(id, _)| id == server).map(|(_, session)| session.clone());
        aggregate::kept_session(store, &self.session_identity(server)).or_else(sealed)
    }

    /// Whose `member`'s kept `list` is.
    pub(crate) fn list_identity(&self, member: &Member, list: List) -> String {
        aggregate::list_identity(&self.workspace, &member.id, &member.server, list)
    }
}

/// A request to an MCP server: the server and the edits that send it there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Routed {
    pub(crate) server: String,
    /// Request headers to remove, then to set.
    pub(crate) remove: Vec<String>,
    pub(crate) set: Vec<(String, String)>,
    /// What the caller may use of the server's tools, when something is withheld.
    pub(crate) tools: Option<Box<ToolPolicy>>,
}

/// How a routed request reaches a server: the header Envoy's route reads, and the cluster
/// that reaches an upstream (a custom host's way).
pub(crate) struct Routing<'a> {
    pub(crate) route_header: &'a str,
    pub(crate) cluster: &'a dyn Fn(&Upstream) -> String,
}

/// What routing reads of a request to an MCP endpoint.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// Under `/mcp`, without the query.
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
    pub(crate) origin: Option<&'a [u8]>,
    pub(crate) authority: Option<&'a [u8]>,
    /// Browser origins allowed besides the gateway's own pages on loopback names.
    pub(crate) allowed_origins: &'a [String],
    /// The headers the caller's `x-gateway-forward-headers` names (lowercase).
    pub(crate) forwarded: &'a [String],
    /// Every request header (their names say which ones the server must not get).
    pub(crate) headers: &'a [(String, Vec<u8>)],
}

/// The server an authenticated request names (None: the aggregate endpoint), or why it goes
/// nowhere: a foreign `Origin` (403), a method MCP does not use (405), or no server id (404).
pub(crate) fn server_id<'a>(request: &Request<'a>) -> Result<Option<&'a str>, GatewayError> {
    let Request { method, path, .. } = *request;
    if !origin_allowed(request.origin, request.authority, request.allowed_origins) {
        return Err(GatewayError::new(
            403,
            "permission_error",
            "the request's Origin is not this gateway: MCP requests from other sites' pages are refused",
        )
        .with_code("origin_not_allowed"));
    }
    if !matches!(method, "GET" | "POST" | "DELETE") {
        let message = format!("{method} is not allowed on an MCP endpoint; use {ALLOWED_METHODS}");
        return Err(GatewayError::new(405, "invalid_request_error", message).with_code("method_not_allowed"));
    }
    let rest = path.get(PREFIX.len()..).unwrap_or_default();
    if rest.is_empty() {
        return Ok(None);
    }
    let id = rest.strip_prefix('/').unwrap_or(rest);
    if !servers::is_server_id(id) {
        return Err(unknown_server(id));
    }
    Ok(Some(id))
}

pub(crate) fn unknown_server(id: &str) -> GatewayError {
    let shown: String = id.chars().take(64).collect();
    GatewayError::new(404, "invalid_request_error", format!("unknown MCP server '{shown}'"))
        .with_code("unknown_mcp_server")
}

/// A server the control plane keeps (its stored object), parsed as the plugin
/// configuration's are; one that does not parse is the gateway's fault, named, never quoted.
pub(crate) fn stored_server(id: &str, value: &Value) -> Result<Server, GatewayError> {
    let parsed = value.as_object().ok_or_else(|| "it is not an object".to_string()).and_then(|fields| {
        gateway_schema::mcp_servers::parse_server(fields).map_err(|(path, _)| format!("its {path} is not valid"))
    });
    parsed.map_err(|why| {
        GatewayError::new(502, "api_error", format!("the stored MCP server '{id}' cannot be used: {why}"))
            .with_code("invalid_mcp_server")
    })
}

/// The edits that send a request to `server`: its authority, path and stored headers, the
/// client's query kept; nothing of the caller's that is the gateway's (its key, its
/// `Authorization`, `x-gateway-*`), its browser's (`Origin`, cookies) or Envoy's reaches it,
/// nor its `Accept-Encoding` (the gateway reads the answer). `tools`: what the caller may use.
///
/// `x-gateway-forward-headers` may name others of the caller's to pass (its `Origin`, a
/// cookie, a gateway header), never its credentials (`Authorization` carries the gateway key
/// for MCP clients), Envoy's controls or `Accept-Encoding`.
pub(crate) fn edits(
    id: &str,
    server: &Server,
    routing: &Routing,
    request: &Request,
    tools: Option<ToolPolicy>,
) -> Routed {
    let (query, raw, forwarded) = (request.query, request.headers, request.forwarded);
    let never = |name: &str| {
        matches!(name, "authorization" | "proxy-authorization" | "accept-encoding" | "x-gateway-api-key")
            || name.starts_with("x-envoy-")
    };
    let withheld = |name: &str| {
        let private = matches!(name, "origin" | "cookie") || name.starts_with("x-gateway-");
        never(name) || (private && !forwarded.iter().any(|f| f == name))
    };
    let remove = raw.iter().map(|(name, _)| name).filter(|name| withheld(name)).cloned().collect();
    let upstream = &server.upstream;
    let base = upstream.path_or_root();
    let path = match query {
        Some(query) => format!("{base}?{query}"),
        None => base.to_string(),
    };
    let mut set = vec![
        (":authority".to_string(), upstream.authority.clone()),
        (":path".to_string(), path),
        (routing.route_header.to_string(), (routing.cluster)(upstream)),
    ];
    if let Some(ms) = server.timeout_ms {
        set.push(("x-envoy-upstream-rq-per-try-timeout-ms".to_string(), ms.to_string()));
    }
    set.extend(server.headers.iter().cloned());
    Routed { server: id.to_string(), remove, set, tools: tools.map(Box::new) }
}

/// Whether a request may come from `origin`: none (not a browser); a page the gateway served
/// on a loopback name (`localhost`, `127.0.0.1`, `[::1]`: the origin is the request's own
/// authority); or an origin of `allowed` (`mcp_allowed_origins`). A page of another name is
/// refused even when the request's `Host` is that name too: a DNS-rebinding page controls both
/// (the MCP spec asks servers to refuse it).
fn origin_allowed(origin: Option<&[u8]>, authority: Option<&[u8]>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let Some(origin) = std::str::from_utf8(origin).ok().and_then(normalized_origin) else {
        return false;
    };
    if allowed.contains(&origin) {
        return true;
    }
    let (scheme, host) = origin.split_once("://").unwrap_or_default();
    let own = authority
        .and_then(|authority| std::str::from_utf8(authority).ok())
        .and_then(|authority| normalized_origin(&format!("{scheme}://{authority}")));
    own.as_deref() == Some(origin.as_str()) && is_loopback(host)
}

/// An origin as compared: `scheme://host[:port]`, lowercase, without its scheme's default
/// port; None for what is not an http(s) origin.
pub(crate) fn normalized_origin(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let (scheme, rest) = lower.split_once("://")?;
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    let host = rest.strip_suffix(default_port).unwrap_or(rest);
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_');
    (!host.is_empty() && host.bytes().all(valid)).then(|| format!("{scheme}://{host}"))
}

/// Whether `host` (`name[:port]`) is a loopback name.
fn is_loopback(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]")
}

/// The JSON-RPC error code of a gateway error with HTTP `status` and `code`: -32700 for a body
/// that is not JSON, -32001 for a missing or wrong key, -32000 (a server error) for a server
/// that failed or did not answer, -32600 (invalid request) for the other refusals, -32603
/// (internal) for the gateway's own faults.
fn error_code(status: u16, code: Option<&str>) -> i64 {
    match (status, code) {
        (_, Some("parse_error")) => -32700,
        (401, _) => -32001,
        (408 | 502 | 503 | 504, _) => -32000,
        (s, _) if s >= 500 => -32603,
        _ => -32600,
    }
}

/// The gateway's error (its OpenAI-shaped `openai` body) as a JSON-RPC error answer to the
/// request with `id` (null when the gateway answers before reading the body, or the message
/// had none, as JSON-RPC allows): its message, and the status, type and code in `data`.
pub(crate) fn error_body(status: u16, openai: &[u8], id: Option<&Value>) -> Vec<u8> {
    let parsed: Value = serde_json::from_slice(openai).unwrap_or(Value::Null);
    let error = parsed.get("error").unwrap_or(&Value::Null);
    let field = |name: &str| error.get(name).cloned().unwrap_or(Value::Null);
    let message = error.get("message").and_then(Value::as_str).unwrap_or("the gateway refused the request");
    let code = error_code(status, error.get("code").and_then(Value::as_str));
    let data = json!({"status": status, "type": field("type"), "code": field("code")});
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}});
    body.to_string().into_bytes()
}

/// The header an error answer of `status` carries besides its body: the auth scheme with a 401,
/// the allowed methods with a 405 (of the aggregate endpoint, or of one server's).
pub(crate) fn error_header(status: u16, aggregate: bool, oauth: Option<&oauth::OAuth>) -> Option<(&'static str, &str)> {
    match status {
        // With OAuth, the challenge names where the resource's metadata is (RFC 9728).
        401 => Some(("www-authenticate", oauth.map_or("Bearer", |oauth| oauth.challenge.as_str()))),
        405 if aggregate => Some(("allow", AGGREGATE_METHODS)),
        405 => Some(("allow", ALLOWED_METHODS)),
        _ => None,
    }
}

/// The aggregate endpoint's answer to a GET: it has no stream of its own (servers speak on
/// the streams of the requests they answer).
pub(crate) fn no_aggregate_stream() -> GatewayError {
    let message = "the aggregate endpoint /mcp has no stream of its own: POST messages (DELETE ends a session)";
    GatewayError::new(405, "invalid_request_error", message).with_code("method_not_allowed")
}

/// Server `server` could not be reached (`detail`: Envoy's response details).
pub(crate) fn unreachable_error(server: &str, detail: &str) -> GatewayError {
    GatewayError::new(502, "api_error", format!("MCP server '{server}' is unreachable ({detail})"))
        .with_code("upstream_unreachable")
}

/// Server `server`'s answer to `method` cannot be read (compressed, or not JSON-RPC's types),
/// so the gateway cannot do what it must with it (a `tools/list` loses the tools the caller
/// may not use, a `tools/call`'s result passes the config's output checks): it is not passed.
pub(crate) fn unreadable_answer_error(server: &str, method: &str) -> GatewayError {
    let message = format!("MCP server '{server}' answered {method} in a form the gateway cannot read");
    GatewayError::new(502, "api_error", message).with_code("unreadable_answer")
}

/// Server `server` did not answer within its `timeout_ms`.
pub(crate) fn timeout_error(server: &str) -> GatewayError {
    GatewayError::new(504, "timeout_error", format!("MCP server '{server}' did not answer within its timeout_ms"))
        .with_code("request_timeout")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn raw(headers: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect()
    }

    fn servers() -> Servers {
        let value = json!({
            "files": {"url": "http://127.0.0.1:9000/mcp", "headers": {"authorization": "Bearer server-own"}, "timeout_ms": 5000},
            "root": {"url": "https://mcp.example.com"},
        });
        Servers::parse(value.as_object().unwrap()).unwrap()
    }

    fn route_of(
        method: &str,
        path: &str,
        query: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Routed, GatewayError> {
        let cluster = |u: &Upstream| if u.tls { "tls".to_string() } else { "plain".to_string() };
        let routing = Routing { route_header: "x-gateway-upstream-cluster", cluster: &cluster };
        let raw = raw(headers);
        let find = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes());
        let forwarded: Vec<String> = find("x-gateway-forward-headers")
            .map(|list| String::from_utf8_lossy(list).split(',').map(|name| name.trim().to_string()).collect())
            .unwrap_or_default();
        let request = Request {
            method,
            path,
            query,
            origin: find("origin"),
            authority: find(":authority"),
            allowed_origins: &[],
            forwarded: &forwarded,
            headers: &raw,
        };
        let id = server_id(&request)?.unwrap_or("(aggregate)");
        let servers = servers();
        let server = servers.get(id).ok_or_else(|| unknown_server(id))?;
        Ok(edits(id, server, &routing, &request, None))
    }

    #[test]
    fn mcp_paths() {
        assert!(is_mcp_path("/mcp") && is_mcp_path("/mcp/") && is_mcp_path("/mcp/files"));
        assert!(!is_mcp_path("/mcpx") && !is_mcp_path("/v1/mcp") && !is_mcp_path("/"));
    }

    #[test]
    fn keys_from_either_header() {
        let key = |gateway: Option<&'static str>, authorization: Option<&'static str>| {
            presented_key(gateway.map(str::as_bytes), authorization.map(str::as_bytes))
        };
        assert_eq!(key(Some("k1"), None), Some(&b"k1"[..]));
        assert_eq!(key(None, Some("Bearer k2")), Some(&b"k2"[..]));
        assert_eq!(key(None, Some("bearer k2")), Some(&b"k2"[..]));
        // The gateway header wins over the Authorization one.
        assert_eq!(key(Some("k1"), Some("Bearer k2")), Some(&b"k1"[..]));
        assert_eq!(key(None, Some("Basic a2V5")), None);
        assert_eq!(key(None, Some("Bearer ")), None);
        assert_eq!(key(None, Some("Bear")), None);
        assert_eq!(key(None, None), None);
    }

    #[test]
    fn routes_to_the_server_with_its_own_authority_path_and_headers() {
        let client = [
            (":authority", "gateway:8787"),
            ("authorization", "Bearer gw-key"),
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-trace-id", "t"),
            ("x-envoy-upstream-rq-timeout-ms", "1"),
            ("cookie", "c=1"),
            ("mcp-session-id", "s1"),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        let routed = route_of("POST", "/mcp/files", Some("a=1"), &client).unwrap();
        assert_eq!(routed.server, "files");
        let mut removed = routed.remove.clone();
        removed.sort();
        assert_eq!(
            removed,
            ["authorization", "cookie", "x-envoy-upstream-rq-timeout-ms", "x-gateway-api-key", "x-gateway-trace-id"]
        );
        let set: Vec<(&str, &str)> = routed.set.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(
            set,
            [
                (":authority", "127.0.0.1:9000"),
                (":path", "/mcp?a=1"),
                ("x-gateway-upstream-cluster", "plain"),
                ("x-envoy-upstream-rq-per-try-timeout-ms", "5000"),
                ("authorization", "Bearer server-own"),
            ]
        );
        // Named in x-gateway-forward-headers, a cookie or a gateway header passes; the caller's
        // credentials never do.
        let forwarding = [
            ("authorization", "Bearer gw-key"),
            ("cookie", "c=1"),
            ("x-gateway-metadata", "{}"),
            ("x-gateway-forward-headers", "cookie, x-gateway-metadata, authorization, x-gateway-api-key"),
        ];
        let routed = route_of("POST", "/mcp/files", None, &forwarding).unwrap();
        assert_eq!(routed.remove, ["authorization", "x-gateway-forward-headers"]);
        // A URL without a path: the server's root; TLS by its scheme.
        let root = route_of("GET", "/mcp/root", None, &[]).unwrap();
        assert!(root.set.contains(&(":path".to_string(), "/".to_string())));
        assert!(root.set.contains(&(":authority".to_string(), "mcp.example.com:443".to_string())));
        assert!(root.set.contains(&("x-gateway-upstream-cluster".to_string(), "tls".to_string())));
        assert!(route_of("DELETE", "/mcp/root", None, &[]).is_ok());
    }

    #[test]
    fn refusals() {
        let status = |method, path, headers: &[(&str, &str)]| route_of(method, path, None, headers).unwrap_err().status;
        assert_eq!(status("PUT", "/mcp/files", &[]), 405);
        assert_eq!(status("PATCH", "/mcp/nope", &[]), 405);
        let unknown = route_of("POST", "/mcp/nope", None, &[]).unwrap_err();
        assert_eq!((unknown.status, unknown.message.as_str()), (404, "unknown MCP server 'nope'"));
        assert_eq!(status("POST", "/mcp/", &[]), 404);
        assert_eq!(status("POST", "/mcp/files/extra", &[]), 404);
        assert_eq!(status("POST", "/mcp/Files", &[]), 404);
        let foreign = [(":authority", "gateway:8787"), ("origin", "http://evil.example")];
        assert_eq!(status("POST", "/mcp/files", &foreign), 403);
    }

    #[test]
    fn origins() {
        let console = ["https://console.example.com".to_string()];
        let allowed = |origin: Option<&str>, authority: &str| {
            origin_allowed(origin.map(str::as_bytes), Some(authority.as_bytes()), &console)
        };
        assert!(allowed(None, "gw:8787"), "not a browser");
        // The gateway's own pages on loopback names.
        assert!(allowed(Some("http://127.0.0.1:8787"), "127.0.0.1:8787"));
        assert!(allowed(Some("http://LOCALHOST:8787"), "localhost:8787"));
        assert!(allowed(Some("http://[::1]:8787"), "[::1]:8787"));
        assert!(allowed(Some("http://localhost"), "localhost:80"));
        assert!(!allowed(Some("http://localhost:3000"), "localhost:8787"), "another local page");
        // DNS rebinding: the page's name is the request's Host too.
        assert!(!allowed(Some("http://evil.example.com"), "evil.example.com"));
        assert!(!allowed(Some("http://gw:8787"), "gw:8787"), "a name of its own, unless configured");
        // Configured origins, from any authority.
        assert!(allowed(Some("https://console.example.com"), "gw:8787"));
        assert!(allowed(Some("https://Console.example.com:443"), "gw:8787"));
        assert!(!allowed(Some("http://console.example.com"), "gw:8787"), "another scheme");
        assert!(!allowed(Some("null"), "gw:8787"));
        assert!(!origin_allowed(Some(b"http://localhost"), None, &[]));
        assert_eq!(normalized_origin("HTTPS://A.example:443").as_deref(), Some("https://a.example"));
        assert_eq!(normalized_origin("https://a.example/path"), None);
        assert_eq!(normalized_origin("ftp://a.example"), None);
    }

    #[test]
    fn errors_are_json_rpc() {
        let body: Value = serde_json::from_slice(&error_body(401, &missing_key().to_json(), None)).unwrap();
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["id"], Value::Null);
        assert_eq!(body["error"]["code"], -32001);
        assert!(body["error"]["message"].as_str().unwrap().starts_with("missing gateway key"));
        assert_eq!(
            body["error"]["data"],
            json!({"status": 401, "type": "authentication_error", "code": "missing_api_key"})
        );
        let unreachable: Value =
            serde_json::from_slice(&error_body(502, &unreachable_error("files", "connection_failure").to_json(), None))
                .unwrap();
        assert_eq!(unreachable["error"]["code"], -32000);
        assert!(unreachable["error"]["message"].as_str().unwrap().contains("'files'"));
        assert_eq!(error_code(404, None), -32600);
        assert_eq!(error_code(500, None), -32603);
        // Once the message is read, the answer carries its id; a body that is no JSON is -32700.
        let not_json = read_message(b"{").unwrap_err();
        let parse: Value = serde_json::from_slice(&error_body(400, &not_json.to_json(), None)).unwrap();
        assert_eq!(parse["error"]["code"], -32700);
        let id = json!("call-9");
        let denied: Value = serde_json::from_slice(&error_body(404, &missing_key().to_json(), Some(&id))).unwrap();
        assert_eq!(denied["id"], "call-9");
        // Not the gateway's JSON: still a JSON-RPC error.
        let garbled: Value = serde_json::from_slice(&error_body(500, b"oops", None)).unwrap();
        assert_eq!(garbled["error"]["code"], -32603);
        assert_eq!(error_header(401, false, None), Some(("www-authenticate", "Bearer")));
        assert_eq!(error_header(405, false, None), Some(("allow", ALLOWED_METHODS)));
        assert_eq!(error_header(405, true, None), Some(("allow", AGGREGATE_METHODS)));
        assert_eq!(error_header(404, false, None), None);
    }
}
