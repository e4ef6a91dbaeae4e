//! Validation of what the control plane itself owns: path ids, workspace names, the API-key
//! body and the prompt body of spec 4.2 (with its `patch` semantics). Configs, providers,
//! guardrails and prompt rendering are checked by the filter's code (the shared crate, `gateway_schema`).

use crate::errors::{ApiError, ApiResult};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use gateway_schema::mcp_servers::parse_key_tools;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// An item named in a path: its UUID, or its slug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Id(String),
    Slug(String),
}

impl Target {
    pub fn text(&self) -> &str {
        match self {
            Target::Id(text) | Target::Slug(text) => text,
        }
    }
}

pub const MAX_SLUG: usize = 128;
pub const MAX_WORKSPACE: usize = 64;

/// `[A-Za-z0-9._-]`, 1..=max characters.
pub fn is_name(text: &str, max: usize) -> bool {
    (1..=max).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub fn is_uuid(text: &str) -> bool {
    text.len() == 36 && uuid::Uuid::try_parse(text).is_ok()
}

/// The path id of a PUT: a UUID or a valid slug, else a 400.
pub fn put_target(text: &str) -> ApiResult<Target> {
    path_target(text).ok_or_else(|| {
        ApiError::invalid("id", &format!("an id is a UUID or a slug of 1 to {MAX_SLUG} characters from [A-Za-z0-9._-]"))
    })
}

/// The path id of a GET: `None` (answered 404) when it cannot name anything.
pub fn path_target(text: &str) -> Option<Target> {
    if is_uuid(text) {
        Some(Target::Id(text.to_ascii_lowercase()))
    } else if is_name(text, MAX_SLUG) {
        Some(Target::Slug(text.to_string()))
    } else {
        None
    }
}

/// The path's parameters, as axum's `Path` reads them; a path it cannot read (a parameter not
/// UTF-8 once decoded: `/v1/prompts/%FF`) is a 400 in the OpenAI shape naming the path, where
/// axum's own answer is plain text.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(params)) => Ok(Path(params)),
            Err(e) => Err(ApiError::invalid("path", &e.body_text())),
        }
    }
}

/// The whole body, as axum's `Bytes` reads it (up to its `DefaultBodyLimit`); one over the limit
/// is a 413 and one that broke off a 400, in the OpenAI shape naming the body, where axum's own
/// answers are plain text.
pub struct WholeBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for WholeBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(request, state).await.map(WholeBody).map_err(|e| {
            let too_large = e.status() == StatusCode::PAYLOAD_TOO_LARGE;
            let code = too_large.then_some("body_too_large");
            ApiError::new(e.status().as_u16(), "invalid_request_error", &e.body_text(), Some("body"), code)
        })
    }
}

/// A JSON object body, else a 400 naming the body.
pub fn json_object(body: &[u8]) -> ApiResult<Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
        Err(e) => Err(match gateway_schema::nested_too_deep(body) {
            Some(deep) => ApiError(deep),
            None => ApiError::invalid("body", &format!("the body is not valid JSON: {e}")),
        }),
    }
}

/// The query string's pairs (decoded), or a 400 naming the query. A parameter without a name
/// (`?=1`) is refused here: a refusal naming it would name nothing.
pub fn query_pairs(query: Result<Query<Vec<(String, String)>>, QueryRejection>) -> ApiResult<Vec<(String, String)>> {
    let Query(pairs) =
        query.map_err(|e| ApiError::invalid("query", &format!("the query string cannot be read: {e}")))?;
    if pairs.iter().any(|(name, _)| name.is_empty()) {
        return Err(ApiError::invalid("query", "the query string has a parameter without a name (`=value`)"));
    }
    Ok(pairs)
}

/// A 400 naming the first field of `body` that `known` does not accept.
pub fn only_known_fields(body: &Map<String, Value>, known: impl Fn(&str) -> bool) -> ApiResult<()> {
    only_known_keys(body.keys().map(String::as_str), known)
}

/// A 400 naming the first of `keys` that `known` does not accept (an object read without a
/// `Map`, e.g. a record batch read in place).
pub fn only_known_keys<'a>(keys: impl IntoIterator<Item = &'a str>, known: impl Fn(&str) -> bool) -> ApiResult<()> {
    match keys.into_iter().find(|k| !known(k)) {
        Some(key) => Err(unknown_field("", key, "")),
        None => Ok(()),
    }
}

/// A 400 for the field `key` that the object at `at` (empty: the body) does not have: `param`
/// is the field's path (`grants[1].x`), or the object's when the field's name is empty (a
/// `param` of `""` would name nothing); `hint` follows the message.
pub fn unknown_field(at: &str, key: &str, hint: &str) -> ApiError {
    let param = match (at, key) {
        ("", "") => "body".to_string(),
        ("", key) => key.to_string(),
        (at, "") => at.to_string(),
        (at, key) => format!("{at}.{key}"),
    };
    let name = if key.is_empty() { "with an empty name".to_string() } else { format!("`{key}`") };
    ApiError::invalid(&param, &format!("unknown field {name}{hint}"))
}

/// What a `POST /api-keys` body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRequest {
    pub workspace: String,
    pub admin: bool,
    /// The MCP tools the key may see and call (`{server}__{tool pattern}`); `None`: every tool.
    pub mcp_tools: Option<Vec<String>>,
    /// What the people who hand it out call it.
    pub name: Option<String>,
}

/// A key's name, at most (characters).
pub const MAX_KEY_NAME: usize = 100;

/// `POST /api-keys`: `{"workspace": "<name>", "admin": false, "mcp_tools": ["files__*"],
/// "name": "ci pipeline"}`.
pub fn key_request(body: &Map<String, Value>) -> ApiResult<KeyRequest> {
    only_known_fields(body, |k| ["workspace", "admin", "mcp_tools", "name"].contains(&k))?;
    let workspace = match body.get("workspace") {
        Some(Value::String(name)) if is_name(name, MAX_WORKSPACE) => name.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "workspace",
                &format!("workspace must be 1 to {MAX_WORKSPACE} characters from [A-Za-z0-9._-]"),
            ))
        }
        None => return Err(ApiError::invalid("workspace", "workspace is required")),
    };
    let admin = match body.get("admin") {
        None => false,
        Some(Value::Bool(admin)) => *admin,
        Some(_) => return Err(ApiError::invalid("admin", "admin must be a boolean")),
    };
    let mcp_tools = body
        .get("mcp_tools")
        .map(parse_key_tools)
        .transpose()
        .map_err(|(path, message)| ApiError::invalid(&path, &message))?;
    let name = match body.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name))
            if !name.trim().is_empty()
                && name.chars().count() <= MAX_KEY_NAME
                && !name.chars().any(char::is_control) =>
        {
            Some(name.clone())
        }
        Some(_) => {
            let message =
                format!("name must be 1 to {MAX_KEY_NAME} characters, not only spaces, no control characters");
            return Err(ApiError::invalid("name", &message));
        }
    };
    Ok(KeyRequest { workspace, admin, mcp_tools, name })
}

/// The JSON type a prompt field must have (spec 4.2).
#[derive(Clone, Copy)]
enum Type {
    String,
    Object,
    ObjectArray,
    RawFlag,
    ToolChoice,
}

/// The version fields of a prompt (spec 4.2), all inherited by `patch: true`.
const PROMPT_FIELDS: &[(&str, Type)] = &[
    ("name", Type::String),
    ("collection_id", Type::String),
    ("string", Type::String),
    ("parameters", Type::Object),
    ("model", Type::String),
    ("virtual_key", Type::String),
    ("version_description", Type::String),
    ("functions", Type::ObjectArray),
    ("tools", Type::ObjectArray),
    ("tool_choice", Type::ToolChoice),
    ("is_raw_template", Type::RawFlag),
    ("prompt_metadata", Type::Object),
];

fn check_type(field: &str, kind: Type, v: &Value) -> ApiResult<()> {
    let ok = match kind {
        Type::String => v.is_string(),
        Type::Object => v.is_object(),
        Type::ObjectArray => v.as_array().is_some_and(|items| items.iter().all(Value::is_object)),
        Type::RawFlag => v.as_u64().is_some_and(|n| n <= 1),
        // Spec 4.2 says an object; OpenAI's string forms are accepted too.
        Type::ToolChoice => v.is_object() || matches!(v.as_str(), Some("none" | "auto" | "required")),
    };
    if ok {
        return Ok(());
    }
    let want = match kind {
        Type::String => "a string",
        Type::Object => "an object",
        Type::ObjectArray => "an array of objects",
        Type::RawFlag => "0 (processed) or 1 (raw)",
        Type::ToolChoice => "an object (or \"none\", \"auto\", \"required\")",
    };
    Err(ApiError::invalid(field, &format!("{field} must be {want}")))
}

/// The version a `PUT /prompts/{id}` body makes: every field type-checked; with `patch: true`
/// the omitted fields come from `latest`; a version needs a `string` either way.
pub fn prompt_version(body: &Map<String, Value>, latest: Option<&Map<String, Value>>) -> ApiResult<Map<String, Value>> {
    let patch = match body.get("patch") {
        None => false,
        Some(Value::Bool(patch)) => *patch,
        Some(_) => return Err(ApiError::invalid("patch", "patch must be a boolean")),
    };
    only_known_fields(body, |k| k == "patch" || PROMPT_FIELDS.iter().any(|(f, _)| *f == k))?;
    let mut version = Map::new();
    for (field, kind) in PROMPT_FIELDS {
        let value = match (body.get(*field), latest) {
            (Some(value), _) => {
                check_type(field, *kind, value)?;
                value
            }
            (None, Some(latest)) if patch => match latest.get(*field) {
                Some(value) => value,
                None => continue,
            },
            (None, _) => continue,
        };
        version.insert(field.to_string(), value.clone());
    }
    if !version.contains_key("string") {
        return Err(ApiError::invalid("string", "string (the template) is required"));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn param(r: ApiResult<Map<String, Value>>) -> String {
        let e = r.unwrap_err().0;
        assert_eq!(e.status, 400);
        e.param().unwrap()
    }

    #[test]
    fn strict_prompt_bodies_check_every_field() {
        let ok = map(json!({"string": "Hi {{n}}", "model": "gpt-4o", "parameters": {"temperature": 0.1},
            "tools": [{"type": "function"}], "is_raw_template": 0, "tool_choice": {"type": "none"}, "name": "p"}));
        assert_eq!(prompt_version(&ok, None).unwrap().len(), 7);
        assert_eq!(param(prompt_version(&map(json!({"model": "x"})), None)), "string");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "model": 5})), None)), "model");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "parameters": []})), None)), "parameters");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "tools": [1]})), None)), "tools");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "is_raw_template": 2})), None)), "is_raw_template");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "extra": 1})), None)), "extra");
        assert_eq!(param(prompt_version(&map(json!({"string": "x", "patch": "yes"})), None)), "patch");
        assert_eq!(param(prompt_version(&map(json!({"string": null})), None)), "string");
    }

    #[test]
    fn patch_fills_omitted_fields_from_the_latest_version() {
        let latest = map(json!({"string": "old", "model": "gpt-4o", "parameters": {"temperature": 0.1}, "name": "p"}));
        let version = prompt_version(&map(json!({"patch": true, "model": "gpt-4.1"})), Some(&latest)).unwrap();
        assert_eq!(
            Value::Object(version),
            json!({"string": "old", "model": "gpt-4.1", "parameters": {"temperature": 0.1}, "name": "p"})
        );
        // Without patch nothing is inherited: the missing template is an error.
        assert_eq!(param(prompt_version(&map(json!({"model": "gpt-4.1"})), Some(&latest))), "string");
        // Patch still checks what is sent.
        assert_eq!(param(prompt_version(&map(json!({"patch": true, "model": 1})), Some(&latest))), "model");
        // Patch of a new prompt has nothing to inherit.
        assert_eq!(param(prompt_version(&map(json!({"patch": true, "model": "m"})), None)), "string");
    }

    #[test]
    fn a_body_nested_deeper_than_the_parser_reads_is_named_as_such() {
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(200), "]".repeat(200));
        let e = json_object(deep.as_bytes()).unwrap_err().0;
        assert_eq!((e.status, e.param().as_deref()), (400, Some("body")));
        assert!(e.message().contains("more than 127 levels deep"), "{}", e.message());
        assert!(json_object(b"{\"a\": oops}").unwrap_err().0.message().contains("not valid JSON"));
    }

    /// A path parameter that is not UTF-8 once decoded is refused in the OpenAI shape, naming
    /// the path (axum's own `Path` answers plain text).
    #[tokio::test]
    async fn a_path_that_cannot_be_read_is_refused_in_the_openai_shape() {
        use axum::body::{to_bytes, Body};
        use tower::ServiceExt;
        let app = axum::Router::new().route("/items/{id}", axum::routing::get(|Path(id): Path<String>| async { id }));
        let get = |uri: &str| axum::http::Request::get(uri).body(Body::empty()).unwrap();
        let answer = app.clone().oneshot(get("/items/%FF")).await.unwrap();
        assert_eq!(answer.status(), 400);
        let body: Value = serde_json::from_slice(&to_bytes(answer.into_body(), 1 << 16).await.unwrap()).unwrap();
        assert_eq!(body["error"]["param"], "path");
        assert!(body["error"]["message"].as_str().unwrap().contains("Invalid UTF-8"), "{body}");
        let answer = app.oneshot(get("/items/caf%C3%A9")).await.unwrap();
        assert_eq!(to_bytes(answer.into_body(), 1 << 16).await.unwrap(), "café");
    }

    /// A body over the limit is a 413 in the OpenAI shape naming the body (axum's own answer
    /// is plain text).
    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_in_the_openai_shape() {
        use axum::body::{to_bytes, Body};
        use tower::ServiceExt;
        let echo = axum::routing::post(|WholeBody(body): WholeBody| async { body });
        let app = axum::Router::new().route("/items", echo).layer(axum::extract::DefaultBodyLimit::max(8));
        let post = |body: &'static str| axum::http::Request::post("/items").body(Body::from(body)).unwrap();
        let answer = app.clone().oneshot(post("123456789")).await.unwrap();
        assert_eq!(answer.status(), 413);
        let body: Value = serde_json::from_slice(&to_bytes(answer.into_body(), 1 << 16).await.unwrap()).unwrap();
        assert_eq!((&body["error"]["param"], &body["error"]["code"]), (&json!("body"), &json!("body_too_large")));
        let answer = app.oneshot(post("12345678")).await.unwrap();
        assert_eq!(to_bytes(answer.into_body(), 1 << 16).await.unwrap(), "12345678");
    }

    #[test]
    fn a_field_without_a_name_is_named_by_its_object() {
        let e = key_request(&map(json!({"workspace": "w", "": false}))).unwrap_err().0;
        assert_eq!((e.param().as_deref(), e.message().as_str()), (Some("body"), "unknown field with an empty name"));
        assert_eq!(unknown_field("grants[1]", "", "").0.param().as_deref(), Some("grants[1]"));
        assert_eq!(unknown_field("grants[1]", "x", "").0.param().as_deref(), Some("grants[1].x"));
    }

    #[test]
    fn a_query_parameter_without_a_name_is_refused_naming_the_query() {
        let pairs = |query: &str| query_pairs(Query::try_from_uri(&format!("/p?{query}").parse().unwrap()));
        let e = pairs("limit=1&=2").unwrap_err().0;
        assert_eq!((e.status, e.param().as_deref()), (400, Some("query")));
        assert_eq!(pairs("limit=1&&x").unwrap(), [("limit".to_string(), "1".to_string()), ("x".into(), "".into())]);
    }

    #[test]
    fn names_and_ids() {
        assert!(is_name("my-prompt_v1.2", MAX_SLUG));
        assert!(!is_name("", MAX_SLUG));
        assert!(!is_name("a/b", MAX_SLUG));
        assert!(!is_name(&"a".repeat(65), MAX_WORKSPACE));
        assert_eq!(
            put_target("9f1c2b3a-0000-4000-8000-000000000000").unwrap(),
            Target::Id("9f1c2b3a-0000-4000-8000-000000000000".into())
        );
        assert_eq!(put_target("greeting").unwrap(), Target::Slug("greeting".into()));
        assert_eq!(put_target("bad slug").unwrap_err().0.status, 400);
        assert_eq!(path_target("bad slug"), None);
        let request = |workspace: &str, admin: bool, mcp_tools: Option<&[&str]>| KeyRequest {
            workspace: workspace.into(),
            admin,
            mcp_tools: mcp_tools.map(|tools| tools.iter().map(|t| t.to_string()).collect()),
            name: None,
        };
        assert_eq!(key_request(&map(json!({"workspace": "team-a"}))).unwrap(), request("team-a", false, None));
        assert_eq!(key_request(&map(json!({"workspace": "t", "admin": true}))).unwrap(), request("t", true, None));
        assert_eq!(
            key_request(&map(json!({"workspace": "t", "mcp_tools": ["files__*"]}))).unwrap(),
            request("t", false, Some(&["files__*"]))
        );
        let bad_tool = key_request(&map(json!({"workspace": "t", "mcp_tools": ["files__*", "files"]})));
        assert_eq!(bad_tool.unwrap_err().0.param().unwrap(), "mcp_tools[1]");
        assert_eq!(key_request(&map(json!({"workspace": "a b"}))).unwrap_err().0.param().unwrap(), "workspace");
        assert_eq!(key_request(&map(json!({}))).unwrap_err().0.param().unwrap(), "workspace");
        let named = key_request(&map(json!({"workspace": "t", "name": "CI — nightly"}))).unwrap();
        assert_eq!(named.name.as_deref(), Some("CI — nightly"));
        assert_eq!(key_request(&map(json!({"workspace": "t", "name": ""}))).unwrap_err().0.param().unwrap(), "name");
    }
}
