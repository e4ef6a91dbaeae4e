//! The plugin configuration's `mcp_servers`: server id to `{"url", "headers", "timeout_ms"}`,
//! parsed once into typed values. Errors name the path of the value at fault and never quote
//! a header's value (a server's own credential).

use crate::upstream::Upstream;
use crate::wire_names::is_header_name;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::fmt;

/// The longest server id (ids are `[a-z0-9-]{1,32}`).
const MAX_ID_LEN: usize = 32;

/// One MCP server behind the gateway.
#[derive(Clone, PartialEq)]
pub(crate) struct Server {
    pub(crate) upstream: Upstream,
    /// Headers sent to this server and nowhere else (lowercase names).
    pub(crate) headers: Vec<(String, String)>,
    /// Bounds a call (Envoy's per-try timeout); none: the stream idle timeout alone.
    pub(crate) timeout_ms: Option<u64>,
}

/// Header values are the server's credentials: never printed.
impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Server")
            .field("upstream", &self.upstream)
            .field("headers", &names)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// The configured servers, by id.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Servers(Vec<(String, Server)>);

impl Servers {
    pub(crate) fn get(&self, id: &str) -> Option<&Server> {
        self.0.iter().find(|(known, _)| known == id).map(|(_, server)| server)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Server)> {
        self.0.iter().map(|(id, server)| (id.as_str(), server))
    }

    /// Parses the `mcp_servers` object (its errors complete "mcp_servers...").
    pub(crate) fn parse(value: &Map<String, Value>) -> Result<Servers, String> {
        let mut servers = Vec::with_capacity(value.len());
        for (id, entry) in value {
            if !is_server_id(id) {
                let shown: String = id.chars().take(40).collect();
                return Err(format!("mcp_servers: '{shown}' is not a server id (1 to {MAX_ID_LEN} of a-z, 0-9 and -)"));
            }
            servers.push((id.clone(), server(id, entry)?));
        }
        Ok(Servers(servers))
    }
}

/// Whether `id` is a server id: `[a-z0-9-]{1,32}`.
pub(crate) fn is_server_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn server(id: &str, entry: &Value) -> Result<Server, String> {
    let at = |field: &str| format!("mcp_servers.{id}{field}");
    let Value::Object(fields) = entry else {
        return Err(format!("{} must be an object with a url", at("")));
    };
    if let Some(unknown) = fields.keys().find(|k| !matches!(k.as_str(), "url" | "headers" | "timeout_ms")) {
        return Err(format!("{}: unknown field (known: url, headers, timeout_ms)", at(&format!(".{unknown}"))));
    }
    let url = match fields.get("url") {
        Some(Value::String(url)) => url,
        Some(_) => return Err(format!("{} must be a string", at(".url"))),
        None => return Err(format!("{} is required", at(".url"))),
    };
    let upstream = Upstream::parse(url).map_err(|e| format!("{}: the URL {e}", at(".url")))?;
    let headers = match fields.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(headers)) => {
            let mut parsed = Vec::with_capacity(headers.len());
            for (name, value) in headers {
                let path = at(&format!(".headers.{name}"));
                let name = name.to_ascii_lowercase();
                if !is_header_name(&name) || RESERVED_HEADERS.contains(&name.as_str()) || name.starts_with("x-gateway-")
                {
                    return Err(format!("{path}: not a header name the gateway may send"));
                }
                let Value::String(value) = value else {
                    return Err(format!("{path} must be a string"));
                };
                if value.contains(['\r', '\n', '\0']) {
                    return Err(format!("{path} must be a single line"));
                }
                parsed.push((name, value.clone()));
            }
            parsed
        }
        Some(_) => return Err(format!("{} must be an object of header names to values", at(".headers"))),
    };
    let timeout_ms = match fields.get("timeout_ms") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(ms) if (1..=3_600_000).contains(&ms) => Some(ms),
            _ => return Err(format!("{} must be a whole number of milliseconds, 1 to 3600000", at(".timeout_ms"))),
        },
    };
    Ok(Server { upstream, headers, timeout_ms })
}

/// Headers the routing itself sets or HTTP owns.
const RESERVED_HEADERS: &[&str] = &["host", "content-length", "transfer-encoding", "connection", "upgrade", "te"];

/// Deserializes `mcp_servers` for `Settings` (serde's message carries ours).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Servers, D::Error> {
    let value = Map::<String, Value>::deserialize(deserializer)?;
    Servers::parse(&value).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn parse(value: Value) -> Result<Servers, String> {
        Servers::parse(value.as_object().unwrap())
    }

    #[test]
    fn parses_servers_with_their_headers_and_timeouts() {
        let servers = parse(json!({
            "files": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer s"}, "timeout_ms": 5000},
            "search-2": {"url": "https://mcp.example.com"},
        }))
        .unwrap();
        let files = servers.get("files").unwrap();
        assert_eq!(files.upstream.authority, "127.0.0.1:9000");
        assert_eq!(files.upstream.base_path, "/mcp");
        assert!(!files.upstream.tls);
        assert_eq!(files.headers, vec![("authorization".to_string(), "Bearer s".to_string())]);
        assert_eq!(files.timeout_ms, Some(5000));
        let search = servers.get("search-2").unwrap();
        assert!(search.upstream.tls);
        assert_eq!((search.headers.len(), search.timeout_ms), (0, None));
        assert!(servers.get("nope").is_none());
        // The credential never shows in a debug print.
        assert!(!format!("{files:?}").contains("Bearer s"));
    }

    #[test]
    fn errors_name_the_path_at_fault() {
        let error = |value: Value| parse(value).unwrap_err();
        assert!(error(json!({"Files": {"url": "http://a"}})).contains("'Files' is not a server id"));
        assert!(error(json!({"a".repeat(33): {"url": "http://a"}})).contains("not a server id"));
        assert_eq!(error(json!({"f": {}})), "mcp_servers.f.url is required");
        assert_eq!(error(json!({"f": "http://a"})), "mcp_servers.f must be an object with a url");
        assert!(error(json!({"f": {"url": "ftp://a"}})).starts_with("mcp_servers.f.url: the URL must be an absolute"));
        assert!(error(json!({"f": {"url": "http://a", "tools": {}}})).starts_with("mcp_servers.f.tools: unknown field"));
        assert_eq!(
            error(json!({"f": {"url": "http://a", "headers": {"host": "x"}}})),
            "mcp_servers.f.headers.host: not a header name the gateway may send"
        );
        assert!(error(json!({"f": {"url": "http://a", "headers": {"x-gateway-api-key": "x"}}})).contains("may send"));
        let split = error(json!({"f": {"url": "http://a", "headers": {"a": "secret\r\nx: y"}}}));
        assert_eq!(split, "mcp_servers.f.headers.a must be a single line");
        assert!(error(json!({"f": {"url": "http://a", "timeout_ms": 0}})).starts_with("mcp_servers.f.timeout_ms"));
        assert!(error(json!({"f": {"url": "http://a", "timeout_ms": "5"}})).starts_with("mcp_servers.f.timeout_ms"));
    }

    #[test]
    fn server_ids() {
        assert!(is_server_id("a") && is_server_id("files-2") && is_server_id(&"x".repeat(32)));
        assert!(!is_server_id("") && !is_server_id(&"x".repeat(33)) && !is_server_id("A") && !is_server_id("a_b"));
        assert!(!is_server_id("a/b") && !is_server_id("a.b"));
    }
}
