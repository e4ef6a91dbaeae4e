//! An MCP server behind the gateway, as the plugin configuration's `mcp_servers` (server id to
//! this object) and the control plane's `PUT /v1/mcp-servers/{id}` give it: `{"url",
//! "headers", "tools": {"allow": [...]} | {"deny": [...]}, "timeout_ms", "failure"}`, only
//! `url` required. One parser for both, so a server is refused in the same words wherever it
//! is written. Errors never quote a header's value (a server's own credential).

use crate::json_check::{kind_of, shorten};
use crate::upstream::Upstream;
use crate::wire_names::{is_header_name, is_header_value};
use serde_json::{Map, Value};
use std::fmt;

/// The longest server id (ids are `[a-z0-9-]{1,32}`, so `{server}__{tool}` splits at the first `__`).
pub const MAX_SERVER_ID: usize = 32;
/// The longest URL.
pub const MAX_URL: usize = 2048;
/// At most this many headers, each value at most `MAX_HEADER_VALUE` bytes.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_VALUE: usize = 8192;
/// At most this many tool patterns, each at most `MAX_PATTERN` characters (MCP's longest tool name).
pub const MAX_PATTERNS: usize = 256;
pub const MAX_PATTERN: usize = 128;
/// A key's `mcp_tools` holds at most this many patterns (each `{server}__{tool pattern}`, so at
/// most `MAX_SERVER_ID + 2 + MAX_PATTERN` characters).
pub const MAX_KEY_TOOL_PATTERNS: usize = 256;
/// The longest `timeout_ms`: an hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

const FIELDS: &[&str] = &["url", "headers", "tools", "timeout_ms", "failure"];

/// Headers the routing itself sets or HTTP owns.
const RESERVED_HEADERS: &[&str] = &["host", "content-length", "transfer-encoding", "connection", "upgrade", "te"];
/// Prefixes of headers the gateway (`x-gateway-`), Envoy (`x-envoy-`: timeouts, retries) or the
/// protocol (`mcp-`: session, version, method) owns.
const RESERVED_PREFIXES: &[&str] = &["x-gateway-", "x-envoy-", "mcp-"];

/// One MCP server.
#[derive(Clone, PartialEq, Eq)]
pub struct McpServer {
    pub upstream: Upstream,
    /// Headers sent to this server and nowhere else (lowercase names).
    pub headers: Vec<(String, String)>,
    /// Which of the server's tools callers see and may call.
    pub tools: Tools,
    /// Bounds a call (Envoy's per-try timeout); none: the stream idle timeout alone.
    pub timeout_ms: Option<u64>,
    pub failure: Failure,
}

/// Header values are the server's credentials: never printed.
impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("McpServer")
            .field("upstream", &self.upstream)
            .field("headers", &names)
            .field("tools", &self.tools)
            .field("timeout_ms", &self.timeout_ms)
            .field("failure", &self.failure)
            .finish()
    }
}

/// `tools`: every tool, only those an `allow` pattern matches, or all but those a `deny`
/// pattern matches. A pattern is a tool name in which `*` stands for any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tools {
    All,
    Allow(Vec<String>),
    Deny(Vec<String>),
}

impl Tools {
    /// Whether the server's tool `name` (as the server names it) is kept.
    pub fn permits(&self, name: &str) -> bool {
        match self {
            Tools::All => true,
            Tools::Allow(patterns) => patterns.iter().any(|p| glob_matches(p, name)),
            Tools::Deny(patterns) => !patterns.iter().any(|p| glob_matches(p, name)),
        }
    }
}

/// `failure`: when the server fails or times out, a list across servers leaves it out
/// (`open`, the default) or fails as a whole (`closed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Open,
    Closed,
}

/// Whether `id` is a server id: `[a-z0-9-]{1,32}`.
pub fn is_server_id(id: &str) -> bool {
    (1..=MAX_SERVER_ID).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `*`-pattern `pattern` matches all of `name`.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(mut rest) = name.strip_prefix(parts.next().unwrap_or_default()) else {
        return false;
    };
    let Some(last) = parts.next_back() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    // Each middle part at its first place after the one before: the earliest leaves the
    // most room for the parts after it.
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = rest.get(at + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// A tool name pattern: 1 to 128 of the characters MCP tool names are made of (`A-Z a-z 0-9
/// _ - .`) and `*`.
fn is_pattern(text: &str) -> bool {
    (1..=MAX_PATTERN).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'*'))
}

/// Whether `text` is a pattern of a key's `mcp_tools`: `{server}__{tool pattern}`, the server
/// a server id or `*` (any server), the tool pattern as in a server's `tools`.
pub fn is_key_tool_pattern(text: &str) -> bool {
    split_key_tool_pattern(text).is_some()
}

/// A key's pattern as its server (`*` for any) and its tool pattern; `None` when it is not one.
/// Server ids hold no `_`, so the first `__` ends the server.
fn split_key_tool_pattern(text: &str) -> Option<(&str, &str)> {
    let (server, tool) = text.split_once("__")?;
    ((server == "*" || is_server_id(server)) && is_pattern(tool)).then_some((server, tool))
}

/// Whether a key narrowed to `patterns` (its `mcp_tools`) may see and call the tool `tool` of
/// the server `server`: some pattern's server is `server` or `*` and its tool pattern matches
/// all of `tool`. (Matched part by part, so a `*` in the tool pattern never reaches into the
/// server id, nor a tool name's own `__` into the server part.)
pub fn key_permits(patterns: &[String], server: &str, tool: &str) -> bool {
    patterns.iter().filter_map(|p| split_key_tool_pattern(p)).any(|(server_pattern, tool_pattern)| {
        (server_pattern == "*" || server_pattern == server) && glob_matches(tool_pattern, tool)
    })
}

/// Parses a key's `mcp_tools`: a list of 1 to `MAX_KEY_TOOL_PATTERNS` key tool patterns. Err:
/// the path at fault (`mcp_tools`, `mcp_tools[2]`) and a message that starts with it.
pub fn parse_key_tools(value: &Value) -> Result<Vec<String>, (String, String)> {
    let fail = |path: String, message: &str| Err((path.clone(), format!("{path} {message}")));
    let list = match value {
        Value::Array(list) if list.is_empty() => {
            return fail("mcp_tools".into(), "must not be empty: omit mcp_tools to allow every tool")
        }
        Value::Array(list) if list.len() <= MAX_KEY_TOOL_PATTERNS => list,
        Value::Array(_) => return fail("mcp_tools".into(), &format!("holds at most {MAX_KEY_TOOL_PATTERNS} patterns")),
        other => {
            let message = format!(
                "must be a list of patterns such as \"files__*\", got {} (omit mcp_tools to allow every tool)",
                kind_of(other)
            );
            return fail("mcp_tools".into(), &message);
        }
    };
    let mut parsed = Vec::with_capacity(list.len());
    for (i, pattern) in list.iter().enumerate() {
        match pattern {
            Value::String(text) if is_key_tool_pattern(text) => parsed.push(text.clone()),
            _ => {
                let message = format!(
                    "must be {{server}}__{{tool}}: a server id (1 to {MAX_SERVER_ID} of a-z, 0-9 and -) or *, then __, \
                     then a tool name pattern (1 to {MAX_PATTERN} of A-Z, a-z, 0-9, _, -, . and *, any run of characters)"
                );
                return fail(format!("mcp_tools[{i}]"), &message);
            }
        }
    }
    Ok(parsed)
}

/// Parses one server's object. Err: the path of the value at fault (`url`, `headers.x`,
/// `tools.allow[2]`) and a message that starts with that path.
pub fn parse_server(fields: &Map<String, Value>) -> Result<McpServer, (String, String)> {
    let fail = |path: &str, message: String| Err((path.to_string(), message));
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let shown = if unknown.is_empty() { "\"\"".to_string() } else { shorten(unknown) };
        return fail(unknown, format!("{shown}: unknown field (known: {})", FIELDS.join(", ")));
    }
    let url = match fields.get("url") {
        Some(Value::String(url)) if url.len() <= MAX_URL => url,
        Some(Value::String(_)) => return fail("url", format!("url must be at most {MAX_URL} characters")),
        Some(other) => return fail("url", format!("url must be a string, got {}", kind_of(other))),
        None => return fail("url", "url is required".to_string()),
    };
    let upstream = Upstream::parse(url).map_err(|e| ("url".to_string(), format!("url: the URL {e}")))?;
    Ok(McpServer {
        upstream,
        headers: headers(fields.get("headers"))?,
        tools: tools(fields.get("tools"))?,
        timeout_ms: match fields.get("timeout_ms") {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_u64() {
                Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Some(ms),
                _ => {
                    let message = format!("timeout_ms must be a whole number of milliseconds, 1 to {MAX_TIMEOUT_MS}");
                    return fail("timeout_ms", message);
                }
            },
        },
        failure: match fields.get("failure") {
            None | Some(Value::Null) => Failure::Open,
            Some(Value::String(text)) if text == "open" => Failure::Open,
            Some(Value::String(text)) if text == "closed" => Failure::Closed,
            Some(_) => return fail("failure", "failure must be \"open\" or \"closed\"".to_string()),
        },
    })
}

fn headers(value: Option<&Value>) -> Result<Vec<(String, String)>, (String, String)> {
    let headers = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(headers)) => headers,
        Some(_) => {
            return Err(("headers".to_string(), "headers must be an object of header names to values".to_string()))
        }
    };
    if headers.len() > MAX_HEADERS {
        return Err(("headers".to_string(), format!("headers holds at most {MAX_HEADERS} headers")));
    }
    let mut parsed: Vec<(String, String)> = Vec::with_capacity(headers.len());
    for (given, value) in headers {
        let path = format!("headers.{}", shorten(given));
        let fail = |message: &str| Err((path.clone(), format!("{path} {message}")));
        let name = given.to_ascii_lowercase();
        let reserved =
            RESERVED_HEADERS.contains(&name.as_str()) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p));
        if !is_header_name(&name) || reserved {
            return Err((path.clone(), format!("{path}: not a header name the gateway may send")));
        }
        if parsed.iter().any(|(known, _)| *known == name) {
            return fail("is given twice (header names are case-insensitive)");
        }
        let Value::String(value) = value else {
            return fail("must be a string");
        };
        if !is_header_value(value) {
            return fail("must be a single line without control characters");
        }
        if value.len() > MAX_HEADER_VALUE {
            return fail(&format!("must be at most {MAX_HEADER_VALUE} bytes"));
        }
        parsed.push((name, value.clone()));
    }
    Ok(parsed)
}

fn tools(value: Option<&Value>) -> Result<Tools, (String, String)> {
    let wrong = || {
        let message = "tools must be {\"allow\": [patterns]} or {\"deny\": [patterns]}".to_string();
        Err(("tools".to_string(), message))
    };
    let fields = match value {
        None | Some(Value::Null) => return Ok(Tools::All),
        Some(Value::Object(fields)) => fields,
        Some(_) => return wrong(),
    };
    if let Some(unknown) = fields.keys().find(|k| !matches!(k.as_str(), "allow" | "deny")) {
        let path = format!("tools.{}", shorten(unknown));
        return Err((path.clone(), format!("{path}: unknown field (known: allow, deny)")));
    }
    let (field, patterns) = match (fields.get("allow"), fields.get("deny")) {
        (Some(patterns), None) => ("allow", patterns),
        (None, Some(patterns)) => ("deny", patterns),
        (Some(_), Some(_)) => {
            return Err(("tools".to_string(), "tools takes one of allow and deny, not both".to_string()))
        }
        (None, None) => return wrong(),
    };
    let path = format!("tools.{field}");
    let list = match patterns {
        Value::Array(list) if !list.is_empty() && list.len() <= MAX_PATTERNS => list,
        _ => return Err((path.clone(), format!("{path} must be a list of 1 to {MAX_PATTERNS} tool name patterns"))),
    };
    let mut parsed = Vec::with_capacity(list.len());
    for (i, pattern) in list.iter().enumerate() {
        match pattern {
            Value::String(text) if is_pattern(text) => parsed.push(text.clone()),
            _ => {
                let path = format!("{path}[{i}]");
                let message = format!(
                    "{path} must be a tool name pattern: 1 to {MAX_PATTERN} of A-Z, a-z, 0-9, _, -, . and * (any run of characters)"
                );
                return Err((path, message));
            }
        }
    }
    Ok(if field == "allow" { Tools::Allow(parsed) } else { Tools::Deny(parsed) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn parse(value: Value) -> Result<McpServer, (String, String)> {
        parse_server(value.as_object().unwrap())
    }

    fn error(value: Value) -> (String, String) {
        parse(value).unwrap_err()
    }

    #[test]
    fn parses_every_field() {
        let server = parse(json!({"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer s"},
            "tools": {"deny": ["delete_*"]}, "timeout_ms": 5000, "failure": "closed"}))
        .unwrap();
        assert_eq!(
            (server.upstream.authority.as_str(), server.upstream.base_path.as_str()),
            ("127.0.0.1:9000", "/mcp")
        );
        assert_eq!(server.headers, vec![("authorization".to_string(), "Bearer s".to_string())]);
        assert_eq!(server.tools, Tools::Deny(vec!["delete_*".to_string()]));
        assert_eq!((server.timeout_ms, server.failure), (Some(5000), Failure::Closed));
        // The credential never shows in a debug print.
        assert!(!format!("{server:?}").contains("Bearer s"));
        let plain = parse(json!({"url": "https://mcp.example.com"})).unwrap();
        assert!(plain.upstream.tls && plain.headers.is_empty());
        assert_eq!((plain.tools, plain.timeout_ms, plain.failure), (Tools::All, None, Failure::Open));
    }

    #[test]
    fn errors_name_the_path_at_fault_and_start_with_it() {
        let cases = [
            (json!({}), "url", "url is required"),
            (json!({"url": 5}), "url", "url must be a string, got a number"),
            (json!({"url": "ftp://a"}), "url", "url: the URL must be an absolute http:// or https:// URL"),
            (
                json!({"url": "http://a", "tool": {}}),
                "tool",
                "tool: unknown field (known: url, headers, tools, timeout_ms, failure)",
            ),
            (
                json!({"url": "http://a", "headers": []}),
                "headers",
                "headers must be an object of header names to values",
            ),
            (
                json!({"url": "http://a", "headers": {"Host": "x"}}),
                "headers.Host",
                "headers.Host: not a header name the gateway may send",
            ),
            (
                json!({"url": "http://a", "headers": {"a b": "x"}}),
                "headers.a b",
                "headers.a b: not a header name the gateway may send",
            ),
            (
                json!({"url": "http://a", "headers": {"A": "x", "a": "y"}}),
                "headers.a",
                "headers.a is given twice (header names are case-insensitive)",
            ),
            (json!({"url": "http://a", "headers": {"a": 1}}), "headers.a", "headers.a must be a string"),
            (
                json!({"url": "http://a", "headers": {"a": "s\r\nx: y"}}),
                "headers.a",
                "headers.a must be a single line without control characters",
            ),
            (
                json!({"url": "http://a", "tools": ["x"]}),
                "tools",
                "tools must be {\"allow\": [patterns]} or {\"deny\": [patterns]}",
            ),
            (
                json!({"url": "http://a", "tools": {}}),
                "tools",
                "tools must be {\"allow\": [patterns]} or {\"deny\": [patterns]}",
            ),
            (
                json!({"url": "http://a", "tools": {"allow": ["a"], "deny": ["b"]}}),
                "tools",
                "tools takes one of allow and deny, not both",
            ),
            (
                json!({"url": "http://a", "tools": {"only": []}}),
                "tools.only",
                "tools.only: unknown field (known: allow, deny)",
            ),
            (
                json!({"url": "http://a", "tools": {"allow": []}}),
                "tools.allow",
                "tools.allow must be a list of 1 to 256 tool name patterns",
            ),
            (
                json!({"url": "http://a", "tools": {"deny": ["ok", "no space"]}}),
                "tools.deny[1]",
                "tools.deny[1] must be a tool name pattern: 1 to 128 of A-Z, a-z, 0-9, _, -, . and * (any run of characters)",
            ),
            (
                json!({"url": "http://a", "timeout_ms": 0}),
                "timeout_ms",
                "timeout_ms must be a whole number of milliseconds, 1 to 3600000",
            ),
            (
                json!({"url": "http://a", "timeout_ms": "5"}),
                "timeout_ms",
                "timeout_ms must be a whole number of milliseconds, 1 to 3600000",
            ),
            (json!({"url": "http://a", "failure": "shut"}), "failure", "failure must be \"open\" or \"closed\""),
        ];
        for (value, path, message) in cases {
            assert_eq!(error(value.clone()), (path.to_string(), message.to_string()), "{value}");
        }
        for name in ["x-gateway-api-key", "X-Envoy-Upstream-Rq-Timeout-Ms", "mcp-session-id", "content-length"] {
            assert_eq!(error(json!({"url": "http://a", "headers": {name: "x"}})).0, format!("headers.{name}"));
        }
        let many: Map<String, Value> = (0..=MAX_HEADERS).map(|i| (format!("h{i}"), json!("v"))).collect();
        assert_eq!(error(json!({"url": "http://a", "headers": many})).0, "headers");
        assert_eq!(error(json!({"url": "http://a", "headers": {"a": "v".repeat(8193)}})).0, "headers.a");
        assert_eq!(error(json!({"url": format!("http://a/{}", "p".repeat(MAX_URL))})).0, "url");
        let patterns: Vec<String> = (0..=MAX_PATTERNS).map(|i| format!("t{i}")).collect();
        assert_eq!(error(json!({"url": "http://a", "tools": {"allow": patterns}})).0, "tools.allow");
        assert_eq!(error(json!({"url": "http://a", "tools": {"allow": ["a".repeat(129)]}})).0, "tools.allow[0]");
        // A header's value is never quoted.
        assert!(!error(json!({"url": "http://a", "headers": {"a": "secret\n"}})).1.contains("secret"));
    }

    #[test]
    fn tool_patterns() {
        for (pattern, name, matches) in [
            ("search", "search", true),
            ("search", "search2", false),
            ("search*", "search", true),
            ("search*", "search_web", true),
            ("search*", "research", false),
            ("*_web", "search_web", true),
            ("*_web", "search_webs", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("**", "x", true),
        ] {
            assert_eq!(glob_matches(pattern, name), matches, "{pattern} {name}");
        }
        let allow = Tools::Allow(vec!["read_*".into(), "list".into()]);
        assert!(allow.permits("read_file") && allow.permits("list") && !allow.permits("write_file"));
        let deny = Tools::Deny(vec!["delete*".into()]);
        assert!(deny.permits("read") && !deny.permits("delete_all"));
        assert!(Tools::All.permits("anything"));
    }

    #[test]
    fn key_tool_patterns() {
        let longest = format!("{}__{}", "s".repeat(MAX_SERVER_ID), "t".repeat(MAX_PATTERN));
        for good in ["files__*", "search__web_search", "*__read_*", "*__*", "a-1__x.y-z", "s__a__b", longest.as_str()] {
            assert!(is_key_tool_pattern(good), "{good}");
        }
        let too_long_server = format!("{}__t", "s".repeat(MAX_SERVER_ID + 1));
        let too_long_tool = format!("s__{}", "t".repeat(MAX_PATTERN + 1));
        for bad in [
            "",
            "files",
            "files__",
            "__x",
            "Files__x",
            "fi_les__x",
            "f*__x",
            "**__x",
            "files__a b",
            "files__a/b",
            "files_x",
            too_long_server.as_str(),
            too_long_tool.as_str(),
        ] {
            assert!(!is_key_tool_pattern(bad), "{bad}");
        }
    }

    #[test]
    fn a_key_permits_the_tools_its_patterns_match() {
        let patterns: Vec<String> = ["files__*", "search__web_search", "*__read_*"].map(String::from).into();
        for (server, tool, permitted) in [
            ("files", "anything", true),
            ("files", "", true),
            ("search", "web_search", true),
            ("search", "web_search2", false),
            ("search", "image_search", false),
            ("mail", "read_inbox", true),
            ("mail", "send", false),
            // The server is matched whole: `files__*` is not `files-2`.
            ("files-2", "x", false),
            // A tool name's own `__` does not make it another server's tool.
            ("mail", "x__read_y", false),
            ("search", "web_search__x", false),
        ] {
            assert_eq!(key_permits(&patterns, server, tool), permitted, "{server} {tool}");
        }
        assert!(key_permits(&["*__*".to_string()], "any", "tool"));
        assert!(!key_permits(&[], "files", "x"));
        // A string that is not a pattern permits nothing.
        assert!(!key_permits(&["files".to_string(), "files__".to_string()], "files", ""));
    }

    #[test]
    fn key_tools_are_a_list_of_patterns_and_errors_name_the_index() {
        assert_eq!(
            parse_key_tools(&json!(["files__*", "*__read_*"])).unwrap(),
            vec!["files__*".to_string(), "*__read_*".to_string()]
        );
        let error = |value: Value| parse_key_tools(&value).unwrap_err();
        assert_eq!(
            error(json!([])),
            ("mcp_tools".to_string(), "mcp_tools must not be empty: omit mcp_tools to allow every tool".to_string())
        );
        let (path, message) = error(json!("files__*"));
        assert_eq!(path, "mcp_tools");
        assert!(message.starts_with("mcp_tools must be a list") && message.contains("got a string"), "{message}");
        assert_eq!(error(Value::Null).0, "mcp_tools");
        let many: Vec<String> = (0..=MAX_KEY_TOOL_PATTERNS).map(|i| format!("s__t{i}")).collect();
        assert_eq!(error(json!(many)), ("mcp_tools".to_string(), "mcp_tools holds at most 256 patterns".to_string()));
        assert_eq!(parse_key_tools(&json!(many[..MAX_KEY_TOOL_PATTERNS])).unwrap().len(), MAX_KEY_TOOL_PATTERNS);
        for (value, path) in [
            (json!(["files__*", "files"]), "mcp_tools[1]"),
            (json!(["files__*", "ok__x", 5]), "mcp_tools[2]"),
            (json!(["Files__x"]), "mcp_tools[0]"),
            (json!(["files__a b"]), "mcp_tools[0]"),
        ] {
            let (at, message) = error(value.clone());
            assert_eq!(at, path, "{value}");
            assert!(message.starts_with(&format!("{path} must be {{server}}__{{tool}}: ")), "{message}");
        }
    }

    #[test]
    fn server_ids() {
        assert!(is_server_id("a") && is_server_id("files-2") && is_server_id(&"x".repeat(32)));
        assert!(!is_server_id("") && !is_server_id(&"x".repeat(33)) && !is_server_id("A") && !is_server_id("a_b"));
        assert!(!is_server_id("a/b") && !is_server_id("a.b"));
    }
}
