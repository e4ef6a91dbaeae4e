//! Prompt templates (spec 4.1, 4.2, 2.8): a stored prompt version rendered into a chat
//! completion request, by the control plane (`POST /prompts/{id}/render`) and by the filter
//! (config `prompt_id`). Pure: no I/O.
//!
//! Templates are Mustache (`template`): variables (`{{name}}`, `{{{name}}}`, dotted names,
//! `{{.}}`), sections (`{{#name}}...{{/name}}`: once per list item, once with an object as
//! context, once for a truthy value) and inverted sections (`{{^name}}...{{/name}}`), with
//! handlebars' `{{#each}}`, `{{#if}}`, `{{#unless}}`, `{{#with}}` and `{{else}}` too. Values are
//! inserted as given (no HTML escaping); a variable the template uses and `variables` lacks is
//! a 400 naming it. One difference from Mustache: inside a section a name is looked up in the
//! section's context only (no fallback to enclosing contexts); `{{@root.name}}` reaches the
//! variables.

mod template;

use crate::errors::GatewayError;
use crate::errors::SharedError;
use crate::json_check::{kind_of, shorten};
use serde_json::{Map, Value};
use template::{Template, TemplateError, MAX_RENDER_WORK};

/// Version fields copied into the rendered request as they are.
const TOOL_FIELDS: [&str; 3] = ["tools", "functions", "tool_choice"];

/// `POST /prompts/{promptId}/render`: the version rendered with the request's `variables`
/// (required, an object; `hyperparameters` is refused: hyperparameters sit at the root), as
/// a chat completion request: the version's `model`, its `parameters` spread at the root, its
/// `tools`, `functions` and `tool_choice`, the rendered `messages`; then every root field of
/// the request but `variables` overrides.
pub fn render(version: &Value, request: &Map<String, Value>) -> Result<Map<String, Value>, SharedError> {
    render_request(version, request).map_err(|e| SharedError::from_gateway(&e))
}

/// Config `prompt_id` on a chat request: the body's `variables` fill the template, the body's
/// own `messages` follow the rendered ones, every other body field overrides the version's,
/// and `variables` is removed.
pub fn apply_to_chat(version: &Value, mut body: Map<String, Value>) -> Result<Map<String, Value>, SharedError> {
    let variables = match body.remove("variables") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(variables @ Value::Object(_)) => variables,
        Some(other) => return Err(SharedError::from_gateway(&must_be_object("variables", &other))),
    };
    let own = match body.remove("messages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(messages)) => messages,
        Some(other) => {
            let e =
                GatewayError::invalid_param("messages", format!("messages must be an array, got {}", kind_of(&other)));
            return Err(SharedError::from_gateway(&e));
        }
    };
    let mut messages = messages(version, &variables).map_err(|e| SharedError::from_gateway(&e))?;
    messages.extend(own);
    let mut out = version_fields(version);
    out.extend(body);
    out.insert("messages".to_string(), Value::Array(messages));
    Ok(out)
}

fn render_request(version: &Value, request: &Map<String, Value>) -> Result<Map<String, Value>, GatewayError> {
    if request.contains_key("hyperparameters") {
        return Err(GatewayError::invalid_param(
            "hyperparameters",
            "hyperparameters go at the root of the request, never under `hyperparameters`",
        ));
    }
    let variables = match request.get("variables") {
        Some(variables @ Value::Object(_)) => variables,
        Some(other) => return Err(must_be_object("variables", other)),
        None => return Err(GatewayError::invalid_param("variables", "variables is required")),
    };
    let mut out = version_fields(version);
    out.insert("messages".to_string(), Value::Array(messages(version, variables)?));
    out.extend(request.iter().filter(|(key, _)| *key != "variables").map(|(k, v)| (k.clone(), v.clone())));
    Ok(out)
}

fn must_be_object(param: &str, v: &Value) -> GatewayError {
    GatewayError::invalid_param(param, format!("{param} must be an object, got {}", kind_of(v)))
}

/// The version's `model`, `parameters` (spread) and tool fields.
fn version_fields(version: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(model) = version.get("model").filter(|m| !m.is_null()) {
        out.insert("model".to_string(), model.clone());
    }
    if let Some(parameters) = version.get("parameters").and_then(Value::as_object) {
        out.extend(parameters.clone());
    }
    for field in TOOL_FIELDS {
        if let Some(value) = version.get(field).filter(|v| !v.is_null()) {
            out.insert(field.to_string(), value.clone());
        }
    }
    out
}

/// The version's `string` as chat messages: a JSON array of messages keeps each message and
/// role, rendering each text content; any other text is one user message.
fn messages(version: &Value, variables: &Value) -> Result<Vec<Value>, GatewayError> {
    let template = version.get("string").and_then(Value::as_str).unwrap_or_default();
    let raw = version.get("is_raw_template").and_then(Value::as_u64) == Some(1);
    let render = |text: &str| Template::parse(text).and_then(|t| t.render(variables)).map_err(render_error);
    let Some(mut messages) = chat_messages(template) else {
        let content = if raw { template.to_string() } else { render(template)? };
        return Ok(vec![serde_json::json!({"role": "user", "content": content})]);
    };
    if raw {
        return Ok(messages);
    }
    for message in &mut messages {
        match message.get_mut("content") {
            Some(Value::String(text)) => *text = render(text)?,
            Some(Value::Array(parts)) => {
                for part in parts.iter_mut().filter(|p| p.get("type").and_then(Value::as_str) == Some("text")) {
                    if let Some(Value::String(text)) = part.get_mut("text") {
                        *text = render(text)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(messages)
}

fn render_error(e: TemplateError) -> GatewayError {
    match e {
        TemplateError::Missing(name) => {
            let name = shorten(&name);
            GatewayError::invalid_param(
                format!("variables.{name}"),
                format!("the prompt template uses variable `{name}`, which `variables` lacks"),
            )
            .with_code("missing_variable")
        }
        TemplateError::Invalid(why) => {
            GatewayError::invalid_param("string", format!("the prompt template is not valid Mustache: {why}"))
                .with_code("invalid_template")
        }
        TemplateError::TooMuchWork => GatewayError::invalid_param(
            "variables",
            format!(
                "the prompt could not be rendered: its sections over these variables take more than \
                 {MAX_RENDER_WORK} steps (one per tag, list item and byte written)"
            ),
        )
        .with_code("render_failed"),
    }
}

/// `text` as a JSON array of chat messages (objects with a string `role`), if it is one.
fn chat_messages(text: &str) -> Option<Vec<Value>> {
    if !text.trim_start().starts_with('[') {
        return None;
    }
    let messages: Vec<Value> = serde_json::from_str(text).ok()?;
    let is_message = |m: &Value| m.get("role").is_some_and(Value::is_string);
    (!messages.is_empty() && messages.iter().all(is_message)).then_some(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn error(e: SharedError) -> (u16, Value) {
        let body: Value = serde_json::from_slice(&e.body).unwrap();
        (e.status, body["error"].clone())
    }

    #[test]
    fn plain_string_is_one_user_message_without_html_escaping() {
        let version = json!({"string": "Hi {{name}} & <{{thing}}>", "model": "gpt-4o",
            "parameters": {"temperature": 0.2, "max_tokens": 50}, "tools": [{"type": "function"}]});
        let out = render(&version, &map(json!({"variables": {"name": "Ann \"A\"", "thing": "<b>"}}))).unwrap();
        assert_eq!(
            Value::Object(out),
            json!({"model": "gpt-4o", "temperature": 0.2, "max_tokens": 50, "tools": [{"type": "function"}],
                "messages": [{"role": "user", "content": "Hi Ann \"A\" & <<b>>"}]})
        );
    }

    #[test]
    fn chat_array_renders_each_text_and_keeps_roles() {
        let template = json!([
            {"role": "system", "content": "You are {{who}}."},
            {"role": "user", "content": [{"type": "text", "text": "Say {{what}}"}, {"type": "image_url", "image_url": {"url": "{{x}}"}}]}
        ])
        .to_string();
        let out =
            render(&json!({"string": template}), &map(json!({"variables": {"who": "terse", "what": "hi"}}))).unwrap();
        assert_eq!(
            out["messages"],
            json!([
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Say hi"}, {"type": "image_url", "image_url": {"url": "{{x}}"}}]}
            ])
        );
    }

    #[test]
    fn request_fields_override_the_version() {
        let version = json!({"string": "x", "model": "a", "parameters": {"temperature": 0.2, "top_p": 1}});
        let out =
            render(&version, &map(json!({"variables": {}, "temperature": 0.9, "model": "b", "stream": true}))).unwrap();
        assert_eq!(out["temperature"], 0.9);
        assert_eq!(out["top_p"], 1);
        assert_eq!(out["model"], "b");
        assert_eq!(out["stream"], true);
        assert!(!out.contains_key("variables"));
    }

    #[test]
    fn missing_variable_hyperparameters_and_no_variables_are_400s() {
        let version = json!({"string": "Hi {{name}}, {{greeting}}"});
        let (status, e) = error(render(&version, &map(json!({"variables": {"name": "A"}}))).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("variables.greeting")));
        let (status, e) = error(render(&version, &map(json!({"name": "A"}))).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("variables")));
        let (_, e) = error(render(&version, &map(json!({"variables": [], "x": 1}))).unwrap_err());
        assert_eq!(e["param"], "variables");
        let request = map(json!({"variables": {"name": "A", "greeting": "g"}, "hyperparameters": {"temperature": 1}}));
        let (status, e) = error(render(&version, &request).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("hyperparameters")));
    }

    #[test]
    fn raw_template_is_not_rendered() {
        let version = json!({"string": "Hi {{name}}", "is_raw_template": 1});
        let out = render(&version, &map(json!({"variables": {}}))).unwrap();
        assert_eq!(out["messages"], json!([{"role": "user", "content": "Hi {{name}}"}]));
    }

    #[test]
    fn sections_and_non_string_values_render() {
        let version = json!({"string": "{{#each items}}- {{.}}\n{{/each}}n={{n}} {{user.name}}"});
        let request = map(json!({"variables": {"items": ["a", "b"], "n": 3, "user": {"name": "Ann"}}}));
        let out = render(&version, &request).unwrap();
        assert_eq!(out["messages"][0]["content"], "- a\n- b\nn=3 Ann");
    }

    #[test]
    fn mustache_sections_render_lists_objects_flags_and_inverses() {
        let render_one = |template: &str, variables: Value| {
            let out = render(&json!({"string": template}), &map(json!({"variables": variables})))?;
            Ok::<Value, SharedError>(out["messages"][0]["content"].clone())
        };
        let vars = json!({"items": [{"n": "a"}, {"n": "b"}], "names": ["x", "y"], "user": {"name": "Ann"},
            "on": true, "off": false, "none": [], "outer": "o"});
        assert_eq!(render_one("{{#items}}[{{n}}]{{/items}}", vars.clone()).unwrap(), "[a][b]");
        assert_eq!(render_one("{{#names}}{{.}},{{/names}}", vars.clone()).unwrap(), "x,y,");
        assert_eq!(render_one("{{#user}}{{name}} {{@root.outer}}{{/user}}", vars.clone()).unwrap(), "Ann o");
        // No Mustache context-stack fallback: an outer name inside a section needs `@root.`.
        assert_eq!(error(render_one("{{#user}}{{outer}}{{/user}}", vars.clone()).unwrap_err()).0, 400);
        assert_eq!(render_one("{{#on}}yes{{/on}}{{#off}}no{{/off}}{{#none}}no{{/none}}", vars.clone()).unwrap(), "yes");
        assert_eq!(
            render_one("{{^none}}empty{{/none}}{{^on}}no{{/on}}{{^off}}off{{/off}}", vars.clone()).unwrap(),
            "emptyoff"
        );
        let nested = json!({"groups": [{"g": "1", "members": ["a", "b"]}, {"g": "2", "members": []}]});
        let template = "{{#groups}}{{g}}:{{#members}}{{.}}{{/members}}{{^members}}-{{/members}};{{/groups}}";
        assert_eq!(render_one(template, nested).unwrap(), "1:ab;2:-;");
        assert_eq!(render_one("{{#each names}}{{this}}{{/each}}{{#if on}}!{{/if}}", vars.clone()).unwrap(), "xy!");
        let (status, e) = error(render_one("{{#missing}}x{{/missing}}", vars.clone()).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("variables.missing")));
        let (_, e) = error(render_one("{{#items}}{{nope}}{{/items}}", vars).unwrap_err());
        assert_eq!(e["code"], "missing_variable");
    }

    #[test]
    fn bad_template_names_the_string() {
        let (status, e) = error(render(&json!({"string": "{{#if}}"}), &map(json!({"variables": {}}))).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("string")));
    }

    #[test]
    fn template_errors_are_400s_saying_what_is_wrong() {
        let fails = |template: &str, variables: Value| {
            let request = map(json!({"variables": variables}));
            let (status, e) = error(render(&json!({"string": template}), &request).unwrap_err());
            (status, e["param"].as_str().map(str::to_string), e["code"].clone(), e["message"].clone())
        };
        let (status, param, code, message) = fails("Hi {{#items}}{{.}}", json!({"items": []}));
        assert_eq!((status, param.as_deref(), code), (400, Some("string"), json!("invalid_template")));
        assert_eq!(message, "the prompt template is not valid Mustache: `{{#items}}`: is never closed");
        let (_, _, _, message) = fails("{{#a}}{{/b}}", json!({"a": 1}));
        assert_eq!(message, "the prompt template is not valid Mustache: `{{/b}}`: closes `{{#a}}`");
        let (status, param, code, message) = fails("{{user.name}}", json!({"user": {}}));
        assert_eq!((status, param.as_deref(), code), (400, Some("variables.user.name"), json!("missing_variable")));
        assert_eq!(message, "the prompt template uses variable `user.name`, which `variables` lacks");
        let copies = "{{#@root.a}}".repeat(3) + "{{@root.kb}}" + &"{{/@root.a}}".repeat(3);
        let (status, param, code, _) = fails(&copies, json!({"a": vec![0; 100], "kb": "k".repeat(1024)}));
        assert_eq!((status, param.as_deref(), code), (400, Some("variables"), json!("render_failed")));
    }

    #[test]
    fn apply_to_chat_puts_own_messages_after_rendered_ones() {
        let version = json!({"string": "About {{topic}}", "model": "gpt-4o", "parameters": {"temperature": 0.2}});
        let body = map(json!({"variables": {"topic": "rust"}, "temperature": 1.0,
            "messages": [{"role": "user", "content": "more"}]}));
        let out = apply_to_chat(&version, body).unwrap();
        assert_eq!(
            Value::Object(out),
            json!({"model": "gpt-4o", "temperature": 1.0, "messages": [
                {"role": "user", "content": "About rust"}, {"role": "user", "content": "more"}]})
        );
        let (status, e) = error(apply_to_chat(&version, map(json!({"model": "x"}))).unwrap_err());
        assert_eq!((status, e["param"].as_str()), (400, Some("variables.topic")));
        let (_, e) =
            error(apply_to_chat(&version, map(json!({"variables": {"topic": 1}, "messages": {}}))).unwrap_err());
        assert_eq!(e["param"], "messages");
    }
}
