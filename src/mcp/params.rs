//! The `Mcp-Param-*` headers of the 2026-07-28 era: a tool's input schema may mark a property
//! (`x-mcp-header`) whose argument a `tools/call` mirrors in a header, and the server refuses a
//! call whose headers and arguments disagree. A client of that era writes them; for a client of
//! the session era the aggregate writes them from the schema the server listed.

use base64::Engine as _;
use serde_json::Value;

/// The annotation that names a property's header.
const HEADER_KEY: &str = "x-mcp-header";

/// The headers (`mcp-param-{token}`, lowercase) that mirror `arguments` by `input_schema`'s
/// annotations, as a client of the 2026-07-28 era writes them: a scalar argument that is present
/// (a boolean as `true`/`false`), its value kept when it is visible ASCII without edge spaces,
/// else in the `=?base64?…?=` form. None for a schema whose annotations are not valid (a
/// client drops such a tool, and the server checks none).
pub(crate) fn headers(input_schema: &Value, arguments: &Value) -> Vec<(String, String)> {
    let Some(annotated) = annotated(input_schema) else {
        return Vec::new();
    };
    let mut headers = Vec::new();
    for (path, token) in annotated {
        let value = path.iter().try_fold(arguments, |node, key| node.get(key));
        let rendered = match value {
            Some(Value::Bool(flag)) => flag.to_string(),
            Some(Value::String(text)) => text.clone(),
            Some(Value::Number(number)) => number.to_string(),
            _ => continue,
        };
        headers.push((format!("mcp-param-{}", token.to_ascii_lowercase()), encoded(&rendered)));
    }
    headers
}

/// Each annotated property reachable from the root by `properties` alone, as its path and its
/// header's token; None when an annotation is not a token, sits on a property that is not a
/// string, integer or boolean, or repeats another's (in any case).
fn annotated(schema: &Value) -> Option<Vec<(Vec<&str>, &str)>> {
    let mut found: Vec<(Vec<&str>, &str)> = Vec::new();
    let mut stack: Vec<(Vec<&str>, &Value)> = vec![(Vec::new(), schema)];
    while let Some((path, node)) = stack.pop() {
        if let (false, Some(token)) = (path.is_empty(), node.get(HEADER_KEY)) {
            let token = token.as_str().filter(|token| is_token(token))?;
            let typed = node.get("type").and_then(Value::as_str);
            if !matches!(typed, Some("string" | "integer" | "boolean")) {
                return None;
            }
            if found.iter().any(|(_, seen)| seen.eq_ignore_ascii_case(token)) {
                return None;
            }
            found.push((path.clone(), token));
        }
        if let Some(Value::Object(properties)) = node.get("properties") {
            for (name, property) in properties {
                let mut nested = path.clone();
                nested.push(name.as_str());
                stack.push((nested, property));
            }
        }
    }
    Some(found)
}

/// An RFC 9110 token: what a header's name may hold.
fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A value as a header carries it: as it is when that survives (visible ASCII, no space at
/// either end, not itself in the encoded form), else `=?base64?{its UTF-8 in base64}?=`.
fn encoded(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b)) && value.trim() == value;
    let looks_encoded = value.starts_with("=?base64?") && value.ends_with("?=");
    match plain && !looks_encoded {
        true => value.to_string(),
        false => format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "dry_run": {"type": "boolean", "x-mcp-header": "DryRun"},
            "target": {"type": "object", "properties": {"id": {"type": "integer", "x-mcp-header": "Target-Id"}}},
            "note": {"type": "string"},
        }})
    }

    #[test]
    fn each_annotated_argument_present_is_mirrored_in_its_header() {
        let arguments = json!({"region": "eu-west-1", "dry_run": false, "target": {"id": 42}, "note": "n"});
        let mut headers = headers(&schema(), &arguments);
        headers.sort();
        let expected =
            [("mcp-param-dryrun", "false"), ("mcp-param-region", "eu-west-1"), ("mcp-param-target-id", "42")];
        assert_eq!(headers, expected.map(|(name, value)| (name.to_string(), value.to_string())));
        assert_eq!(super::headers(&schema(), &json!({"note": "n", "target": null})), [], "absent or null: none");
    }

    #[test]
    fn a_value_a_header_cannot_carry_goes_in_base64() {
        let encoded = |region: &str| headers(&schema(), &json!({"region": region}))[0].1.clone();
        assert_eq!(encoded("Zürich"), "=?base64?WsO8cmljaA==?=");
        assert_eq!(encoded(" padded"), "=?base64?IHBhZGRlZA==?=");
        assert_eq!(encoded("=?base64?abc?="), "=?base64?PT9iYXNlNjQ/YWJjPz0=?=");
        assert_eq!(encoded("plain text"), "plain text");
    }

    #[test]
    fn a_schema_with_an_invalid_annotation_gets_no_headers() {
        let arguments = json!({"region": "eu", "tags": "a"});
        for bad in [
            json!({"type": "array", "x-mcp-header": "Tags"}),
            json!({"type": "string", "x-mcp-header": "not a token"}),
            json!({"type": "string", "x-mcp-header": "region"}),
        ] {
            let mut schema = schema();
            schema["properties"]["tags"] = bad.clone();
            assert_eq!(headers(&schema, &arguments), [], "{bad}");
        }
    }
}
