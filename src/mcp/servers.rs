//! The plugin configuration's `mcp_servers`: server id to the object the control plane's
//! `PUT /v1/mcp-servers/{id}` takes (`gateway_schema::mcp_servers`, one parser for both),
//! parsed once into typed values. Errors name the path of the value at fault and never quote
//! a header's value (a server's own credential).

pub(crate) use gateway_schema::mcp_servers::{is_server_id, McpServer as Server};
use gateway_schema::mcp_servers::{parse_server, MAX_SERVER_ID};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

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
                return Err(format!(
                    "mcp_servers: '{shown}' is not a server id (1 to {MAX_SERVER_ID} of a-z, 0-9 and -)"
                ));
            }
            let Value::Object(fields) = entry else {
                return Err(format!("mcp_servers.{id} must be an object with a url"));
            };
            let server = parse_server(fields).map_err(|(_, message)| format!("mcp_servers.{id}.{message}"))?;
            servers.push((id.clone(), server));
        }
        Ok(Servers(servers))
    }
}

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
        assert!(error(json!({"f": {"url": "http://a", "tool": {}}})).starts_with("mcp_servers.f.tool: unknown field"));
        let tools = error(json!({"f": {"url": "http://a", "tools": {"allow": []}}}));
        assert!(tools.starts_with("mcp_servers.f.tools.allow must be a list"), "{tools}");
        assert_eq!(
            error(json!({"f": {"url": "http://a", "headers": {"host": "x"}}})),
            "mcp_servers.f.headers.host: not a header name the gateway may send"
        );
        assert!(error(json!({"f": {"url": "http://a", "headers": {"x-gateway-api-key": "x"}}})).contains("may send"));
        let split = error(json!({"f": {"url": "http://a", "headers": {"a": "secret\r\nx: y"}}}));
        assert_eq!(split, "mcp_servers.f.headers.a must be a single line without control characters");
        assert!(error(json!({"f": {"url": "http://a", "timeout_ms": 0}})).starts_with("mcp_servers.f.timeout_ms"));
        assert!(error(json!({"f": {"url": "http://a", "timeout_ms": "5"}})).starts_with("mcp_servers.f.timeout_ms"));
    }
}
