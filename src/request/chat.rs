//! Chat completion request validation (spec 2.9, 8).
//!
//! We check what the OpenAI API itself enforces, so a client gets one clear 400 from the gateway
//! whose `param` names the exact field (`messages[2].content`, `tools[3].function.name`), instead
//! of a provider-specific error after the request was translated. Unknown fields, top-level and in
//! messages, are allowed: providers add their own (`top_k`) and the API grows.
//!
//! Nothing here panics on input and every check is a single pass over the body.

use std::fmt::Display;

use serde_json::{Map, Value};

use crate::errors::GatewayError;
use crate::json_check::{self, each_item, join};

type Obj = Map<String, Value>;
type Checked<T = ()> = Result<T, GatewayError>;

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "function"];
const TEXT_PARTS: &[&str] = &["text"];
const USER_PARTS: &[&str] = &["text", "image_url", "input_audio", "file"];
const ASSISTANT_PARTS: &[&str] = &["text", "refusal"];
const MAX_TOOLS: usize = 128;

/// Validates an OpenAI chat completion request body (already parsed JSON). Errors are 400
/// `invalid_request_error` whose `param` names the exact parameter, e.g. `messages[2].content`,
/// `temperature`, `tools[3].function.name`, and whose message says what is wrong and what is allowed.
pub(crate) fn validate_chat_request(body: &Value) -> Result<(), GatewayError> {
    let body = body
        .as_object()
        .ok_or_else(|| GatewayError::invalid_param("body", "The request body must be a JSON object."))?;

    let model = req_field(body, "", "model", Value::as_str, "a string")?;
    if model.is_empty() {
        return Err(invalid("", "model", "must not be empty."));
    }

    let messages = req_field(body, "", "messages", Value::as_array, "an array of messages")?;
    len_in(messages.len(), "", "messages", 1, None)?;
    each_item(messages, "messages", validate_message)?;

    opt_number_in(body, "", "frequency_penalty", -2.0, 2.0)?;
    opt_number_in(body, "", "presence_penalty", -2.0, 2.0)?;
    opt_number_in(body, "", "temperature", 0.0, 2.0)?;
    opt_number_in(body, "", "top_p", 0.0, 1.0)?;
    opt_int_in(body, "", "max_tokens", 1, None)?;
    opt_int_in(body, "", "max_completion_tokens", 1, None)?;
    opt_int_in(body, "", "n", 1, Some(128))?;
    opt_int_in(body, "", "seed", i64::MIN.into(), Some(i64::MAX.into()))?;
    opt_field(body, "", "parallel_tool_calls", Value::as_bool, "a boolean")?;
    opt_field(body, "", "user", Value::as_str, "a string")?;

    validate_logit_bias(body)?;
    validate_logprobs(body)?;
    validate_response_format(body)?;
    validate_stop(body)?;
    validate_stream(body)?;
    validate_thinking(body)?;
    validate_tools(body)?;
    validate_functions(body)
}

/// `include_usage: true` in a request's `stream_options`.
pub(crate) fn include_usage(stream_options: Option<&Value>) -> bool {
    stream_options.and_then(|o| o.get("include_usage")).and_then(Value::as_bool) == Some(true)
}

// ---------------------------------------------------------------------------------------------
// Messages

fn validate_message(v: &Value, at: &str) -> Checked {
    let m = typed(v, "", at, Value::as_object, "an object")?;
    let role = req_field(m, at, "role", Value::as_str, "a string")?;
    one_of(role, at, "role", ROLES)?;

    match role {
        "system" | "developer" => validate_content(req(m, at, "content")?, at, TEXT_PARTS)?,
        "user" => validate_content(req(m, at, "content")?, at, USER_PARTS)?,
        "tool" => {
            validate_content(req(m, at, "content")?, at, TEXT_PARTS)?;
            req_field(m, at, "tool_call_id", Value::as_str, "a string")?;
        }
        "assistant" => validate_assistant(m, at)?,
        // "function": the last allowed role. Its content is required but may be null, so `get`
        // (which reads null as absent) does not fit here.
        _ => match m.get("content") {
            None => return Err(invalid(at, "content", "is required (a string or null).")),
            Some(Value::String(_) | Value::Null) => {}
            Some(_) => return Err(invalid(at, "content", "must be a string or null.")),
        },
    }

    // Function results are matched to their call by name; for other roles it is optional.
    if role == "function" {
        req_field(m, at, "name", Value::as_str, "a string")?;
    } else {
        opt_field(m, at, "name", Value::as_str, "a string")?;
    }
    Ok(())
}

fn validate_assistant(m: &Obj, at: &str) -> Checked {
    let content = get(m, "content");
    if let Some(content) = content {
        validate_content(content, at, ASSISTANT_PARTS)?;
    }

    let tool_calls = opt_field(m, at, "tool_calls", Value::as_array, "an array")?;
    if let Some(calls) = tool_calls {
        len_in(calls.len(), at, "tool_calls", 1, None)?;
        each_item(calls, &join(at, "tool_calls"), validate_tool_call)?;
    }

    let function_call = opt_field(m, at, "function_call", Value::as_object, "an object")?;
    if let Some(call) = function_call {
        validate_call_function(call, &join(at, "function_call"))?;
    }

    // An assistant turn must say something or call something.
    if content.is_none() && tool_calls.is_none() && function_call.is_none() {
        return Err(invalid(at, "content", "is required unless 'tool_calls' or 'function_call' is given."));
    }
    Ok(())
}

fn validate_tool_call(v: &Value, at: &str) -> Checked {
    let call = typed(v, "", at, Value::as_object, "an object")?;
    req_field(call, at, "id", Value::as_str, "a string")?;
    require_function_type(call, at)?;
    let function = req_field(call, at, "function", Value::as_object, "an object")?;
    validate_call_function(function, &join(at, "function"))
}

/// The `{name, arguments}` of a call the model made (tool call or legacy function call).
fn validate_call_function(f: &Obj, at: &str) -> Checked {
    req_field(f, at, "name", Value::as_str, "a string")?;
    req_field(f, at, "arguments", Value::as_str, "a string (JSON-encoded arguments)")?;
    Ok(())
}

/// Message content: a string or an array of parts whose `type` is one of `parts`.
fn validate_content(v: &Value, at: &str, parts: &[&'static str]) -> Checked {
    match v {
        Value::String(_) => Ok(()),
        Value::Array(items) => {
            each_item(items, &join(at, "content"), |part, part_at| validate_part(part, part_at, parts)).map(drop)
        }
        _ => Err(invalid(
            at,
            "content",
            format!("must be a string or an array of content parts of type {}.", parts.join(", ")),
        )),
    }
}

fn validate_part(v: &Value, at: &str, allowed: &[&'static str]) -> Checked {
    let part = typed(v, "", at, Value::as_object, "an object")?;
    let kind = req_field(part, at, "type", Value::as_str, "a string")?;
    one_of(kind, at, "type", allowed)?;
    match kind {
        // A text part carries its text under "text", a refusal part under "refusal".
        "text" | "refusal" => {
            req_field(part, at, kind, Value::as_str, "a string")?;
        }
        "image_url" => {
            let image = req_field(part, at, "image_url", Value::as_object, "an object")?;
            req_field(image, &join(at, "image_url"), "url", Value::as_str, "a string (an https or data URL)")?;
        }
        "input_audio" => {
            let audio = req_field(part, at, "input_audio", Value::as_object, "an object")?;
            let audio_at = join(at, "input_audio");
            req_field(audio, &audio_at, "data", Value::as_str, "a string (base64 audio)")?;
            req_field(audio, &audio_at, "format", Value::as_str, "a string")?;
        }
        // "file", the last part type any role allows.
        _ => {
            req_field(part, at, "file", Value::as_object, "an object")?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Top-level fields with structure

fn validate_logit_bias(body: &Obj) -> Checked {
    let Some(bias) = opt_field(body, "", "logit_bias", Value::as_object, "an object")? else {
        return Ok(());
    };
    for (token, value) in bias {
        // Token ids fit in u32; the key is echoed into `param` only once it is one, so a
        // huge or arbitrary key never comes back in an error.
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) || token.parse::<u32>().is_err() {
            return Err(invalid("", "logit_bias", "keys must be token ids (strings of digits)."));
        }
        number_in(value, "logit_bias", token, -100.0, 100.0)?;
    }
    Ok(())
}

fn validate_logprobs(body: &Obj) -> Checked {
    let logprobs = opt_field(body, "", "logprobs", Value::as_bool, "a boolean")?;
    if opt_int_in(body, "", "top_logprobs", 0, Some(20))?.is_some() && logprobs != Some(true) {
        return Err(invalid("", "top_logprobs", "requires 'logprobs' to be true."));
    }
    Ok(())
}

fn validate_response_format(body: &Obj) -> Checked {
    let Some(format) = opt_field(body, "", "response_format", Value::as_object, "an object")? else {
        return Ok(());
    };
    let kind = req_field(format, "response_format", "type", Value::as_str, "a string")?;
    one_of(kind, "response_format", "type", &["text", "json_object", "json_schema"])?;
    if kind == "json_schema" {
        let schema = req_field(format, "response_format", "json_schema", Value::as_object, "an object")?;
        let at = "response_format.json_schema";
        validate_name(schema, at)?;
        opt_field(schema, at, "description", Value::as_str, "a string")?;
        opt_field(schema, at, "schema", Value::as_object, "an object (a JSON Schema)")?;
        opt_field(schema, at, "strict", Value::as_bool, "a boolean")?;
    }
    Ok(())
}

fn validate_stop(body: &Obj) -> Checked {
    match get(body, "stop") {
        None | Some(Value::String(_)) => Ok(()),
        Some(Value::Array(stops)) => {
            len_in(stops.len(), "", "stop", 1, Some(4))?;
            each_item(stops, "stop", |v, at| typed(v, "", at, Value::as_str, "a string").map(drop)).map(drop)
        }
        Some(_) => Err(invalid("", "stop", "must be a string or an array of up to 4 strings.")),
    }
}

fn validate_stream(body: &Obj) -> Checked {
    let stream = opt_field(body, "", "stream", Value::as_bool, "a boolean")?;
    let Some(options) = opt_field(body, "", "stream_options", Value::as_object, "an object")? else {
        return Ok(());
    };
    if stream != Some(true) {
        return Err(invalid("", "stream_options", "is only allowed when 'stream' is true."));
    }
    opt_field(options, "stream_options", "include_usage", Value::as_bool, "a boolean")?;
    Ok(())
}

fn validate_thinking(body: &Obj) -> Checked {
    let Some(thinking) = opt_field(body, "", "thinking", Value::as_object, "an object")? else {
        return Ok(());
    };
    req_field(thinking, "thinking", "type", Value::as_str, "a string (e.g. enabled, disabled)")?;
    opt_int_in(thinking, "thinking", "budget_tokens", 1, None)?;
    Ok(())
}

fn validate_tools(body: &Obj) -> Checked {
    let tools = opt_field(body, "", "tools", Value::as_array, "an array")?;
    if let Some(tools) = tools {
        len_in(tools.len(), "", "tools", 0, Some(MAX_TOOLS))?;
        each_item(tools, "tools", |v, at| {
            let tool = typed(v, "", at, Value::as_object, "an object")?;
            require_function_type(tool, at)?;
            let function = req_field(tool, at, "function", Value::as_object, "an object")?;
            validate_function_definition(function, &join(at, "function"))
        })?;
    }

    let Some(choice) = get(body, "tool_choice") else {
        return Ok(());
    };
    let name = match choice {
        Value::String(mode) => {
            one_of(mode, "", "tool_choice", &["none", "auto", "required"])?;
            None
        }
        Value::Object(choice) => {
            require_function_type(choice, "tool_choice")?;
            let function = req_field(choice, "tool_choice", "function", Value::as_object, "an object")?;
            Some(req_field(function, "tool_choice.function", "name", Value::as_str, "a string")?)
        }
        _ => {
            return Err(invalid(
                "",
                "tool_choice",
                "must be one of none, auto, required, or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
            ))
        }
    };
    let declared = tools.map(Vec::as_slice).unwrap_or_default();
    check_choice(
        choice,
        name,
        declared,
        |t| t.pointer("/function/name")?.as_str(),
        "tool_choice",
        "tools",
        "tool_choice.function.name",
    )
}

fn validate_functions(body: &Obj) -> Checked {
    let functions = opt_field(body, "", "functions", Value::as_array, "an array")?;
    if let Some(functions) = functions {
        len_in(functions.len(), "", "functions", 1, Some(MAX_TOOLS))?;
        each_item(functions, "functions", |v, at| {
            validate_function_definition(typed(v, "", at, Value::as_object, "an object")?, at)
        })?;
    }

    let Some(choice) = get(body, "function_call") else {
        return Ok(());
    };
    let name = match choice {
        Value::String(mode) => {
            one_of(mode, "", "function_call", &["none", "auto"])?;
            None
        }
        Value::Object(choice) => Some(req_field(choice, "function_call", "name", Value::as_str, "a string")?),
        _ => return Err(invalid("", "function_call", "must be one of none, auto, or {\"name\": ...}.")),
    };
    let declared = functions.map(Vec::as_slice).unwrap_or_default();
    check_choice(
        choice,
        name,
        declared,
        |f| f.get("name")?.as_str(),
        "function_call",
        "functions",
        "function_call.name",
    )
}

/// Shared by `tool_choice` and the legacy `function_call`: anything but "none" needs declared
/// functions, and a function named by the choice must be one of them.
fn check_choice(
    choice: &Value,
    name: Option<&str>,
    declared: &[Value],
    name_of: fn(&Value) -> Option<&str>,
    key: &str,
    list_key: &str,
    name_param: &str,
) -> Checked {
    if choice.as_str() == Some("none") {
        return Ok(());
    }
    if declared.is_empty() {
        return Err(invalid("", key, format!("is only allowed when '{list_key}' is given, unless it is \"none\".")));
    }
    match name {
        Some(name) if !declared.iter().any(|d| name_of(d) == Some(name)) => {
            Err(invalid("", name_param, format!("must be the name of one of the functions in '{list_key}'.")))
        }
        _ => Ok(()),
    }
}

/// A function the model may call: in `tools[].function` and legacy `functions[]`.
fn validate_function_definition(f: &Obj, at: &str) -> Checked {
    validate_name(f, at)?;
    opt_field(f, at, "description", Value::as_str, "a string")?;
    opt_field(f, at, "parameters", Value::as_object, "an object (a JSON Schema)")?;
    opt_field(f, at, "strict", Value::as_bool, "a boolean")?;
    Ok(())
}

/// `name` matching `^[a-zA-Z0-9_-]{1,64}$`, as OpenAI requires for functions and schemas.
fn validate_name(obj: &Obj, at: &str) -> Checked {
    let name = req_field(obj, at, "name", Value::as_str, "a string")?;
    let valid =
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(invalid(at, "name", "must be 1 to 64 characters of a-z, A-Z, 0-9, underscores and dashes."));
    }
    Ok(())
}

fn require_function_type(obj: &Obj, at: &str) -> Checked {
    let kind = req_field(obj, at, "type", Value::as_str, "a string")?;
    one_of(kind, at, "type", &["function"])
}

// ---------------------------------------------------------------------------------------------
// Generic helpers in the OpenAI wording; paths, item loops and the allowed-values lookup are
// shared with config validation (`json_check`). A field is addressed by its parent's param path
// ("" at top level) and its key; the full param string is only built when there is an error to report.

fn invalid(parent: &str, key: &str, what: impl Display) -> GatewayError {
    let param = join(parent, key);
    let message = format!("Invalid '{param}': {what}");
    GatewayError::invalid_param(param, message)
}

/// A field's value; null counts as absent because clients commonly send null for "not set".
fn get<'a>(obj: &'a Obj, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn req<'a>(obj: &'a Obj, parent: &str, key: &str) -> Checked<&'a Value> {
    get(obj, key).ok_or_else(|| invalid(parent, key, "is required."))
}

/// `v` viewed as the expected JSON type (`Value::as_str`, `Value::as_bool`, ...), or an error.
fn typed<'a, T>(v: &'a Value, parent: &str, key: &str, view: fn(&'a Value) -> Option<T>, expected: &str) -> Checked<T> {
    view(v).ok_or_else(|| invalid(parent, key, format!("must be {expected}.")))
}

fn req_field<'a, T>(
    obj: &'a Obj,
    parent: &str,
    key: &str,
    view: fn(&'a Value) -> Option<T>,
    expected: &str,
) -> Checked<T> {
    typed(req(obj, parent, key)?, parent, key, view, expected)
}

fn opt_field<'a, T>(
    obj: &'a Obj,
    parent: &str,
    key: &str,
    view: fn(&'a Value) -> Option<T>,
    expected: &str,
) -> Checked<Option<T>> {
    get(obj, key).map(|v| typed(v, parent, key, view, expected)).transpose()
}

fn one_of(value: &str, parent: &str, key: &str, allowed: &[&'static str]) -> Checked {
    json_check::one_of(value, allowed, |s| s, "")
        .map(drop)
        .map_err(|names| invalid(parent, key, format!("must be one of {names}.")))
}

/// "between min and max" or, without a maximum, "at least min".
fn range_text(min: impl Display, max: Option<impl Display>) -> String {
    match max {
        Some(max) => format!("between {min} and {max}"),
        None => format!("at least {min}"),
    }
}

fn number_in(v: &Value, parent: &str, key: &str, min: f64, max: f64) -> Checked {
    let x = typed(v, parent, key, Value::as_f64, "a number")?;
    if !(min..=max).contains(&x) {
        return Err(invalid(parent, key, format!("must be {}.", range_text(min, Some(max)))));
    }
    Ok(())
}

fn opt_number_in(obj: &Obj, parent: &str, key: &str, min: f64, max: f64) -> Checked {
    get(obj, key).map_or(Ok(()), |v| number_in(v, parent, key, min, max))
}

/// An integer JSON number (not `2.0`), widened so any i64 or u64 compares exactly.
fn as_integer(v: &Value) -> Option<i128> {
    v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from))
}

/// A whole number neither i64 nor u64 holds (serde reads it as a float): an integer out of
/// range, not "not an integer".
fn beyond_64_bits(v: &Value) -> bool {
    v.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9_223_372_036_854_775_808.0) && as_integer(v).is_none()
}

fn opt_int_in(obj: &Obj, parent: &str, key: &str, min: i128, max: Option<i128>) -> Checked<Option<i128>> {
    if get(obj, key).is_some_and(beyond_64_bits) {
        let max = max.unwrap_or(u64::MAX.into());
        return Err(invalid(parent, key, format!("must be an integer {}.", range_text(min, Some(max)))));
    }
    let Some(x) = opt_field(obj, parent, key, as_integer, "an integer")? else {
        return Ok(None);
    };
    if x < min || max.is_some_and(|max| x > max) {
        return Err(invalid(parent, key, format!("must be an integer {}.", range_text(min, max))));
    }
    Ok(Some(x))
}

fn len_in(len: usize, parent: &str, key: &str, min: usize, max: Option<usize>) -> Checked {
    if len < min || max.is_some_and(|max| len > max) {
        return Err(invalid(parent, key, format!("array length must be {}.", range_text(min, max))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn base() -> Value {
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello"}]})
    }

    /// The base request with one top-level field set.
    fn with(field: &str, value: Value) -> Value {
        let mut body = base();
        body[field] = value;
        body
    }

    /// The base request with these top-level fields set.
    fn with_all(fields: Value) -> Value {
        let mut body = base();
        for (k, v) in fields.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }

    /// A request whose only message is `message`.
    fn message(message: Value) -> Value {
        with("messages", json!([message]))
    }

    fn ok(body: Value) {
        assert_eq!(validate_chat_request(&body), Ok(()), "{body}");
    }

    fn rejects(body: Value, param: &str) {
        let e = validate_chat_request(&body).expect_err(&body.to_string());
        assert_eq!(e.status, 400);
        assert_eq!(e.kind, "invalid_request_error");
        assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        assert!(e.message.contains(param), "message names the param: {e:?}");
    }

    #[test]
    fn body_must_be_an_object() {
        ok(base());
        for body in [json!(null), json!([]), json!("x"), json!(1)] {
            rejects(body, "body");
        }
    }

    #[test]
    fn model_is_a_required_non_empty_string() {
        ok(with("model", json!("any-provider/model")));
        let mut missing = base();
        missing.as_object_mut().unwrap().remove("model");
        rejects(missing, "model");
        rejects(with("model", json!(null)), "model");
        rejects(with("model", json!("")), "model");
        rejects(with("model", json!(4)), "model");
    }

    #[test]
    fn messages_is_a_required_non_empty_array_of_objects() {
        let mut missing = base();
        missing.as_object_mut().unwrap().remove("messages");
        rejects(missing, "messages");
        rejects(with("messages", json!([])), "messages");
        rejects(with("messages", json!({"role": "user"})), "messages");
        rejects(with("messages", json!([{"role": "user", "content": "a"}, "b"])), "messages[1]");
    }

    #[test]
    fn message_role_must_be_known() {
        for role in ["system", "developer", "user"] {
            ok(message(json!({"role": role, "content": "x"})));
        }
        rejects(message(json!({"content": "x"})), "messages[0].role");
        rejects(message(json!({"role": 1, "content": "x"})), "messages[0].role");
        let e = validate_chat_request(&message(json!({"role": "bot", "content": "x"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(e.message.contains("system, developer, user, assistant, tool, function"), "{e:?}");
    }

    #[test]
    fn system_and_developer_content_is_text() {
        for role in ["system", "developer"] {
            ok(message(json!({"role": role, "content": [{"type": "text", "text": "Be brief."}]})));
            rejects(message(json!({"role": role})), "messages[0].content");
            rejects(message(json!({"role": role, "content": null})), "messages[0].content");
            rejects(message(json!({"role": role, "content": 3})), "messages[0].content");
            rejects(
                message(json!({"role": role, "content": [{"type": "image_url", "image_url": {"url": "x"}}]})),
                "messages[0].content[0].type",
            );
            rejects(message(json!({"role": role, "content": [{"type": "text"}]})), "messages[0].content[0].text");
            rejects(message(json!({"role": role, "content": ["text"]})), "messages[0].content[0]");
        }
    }

    #[test]
    fn user_content_parts() {
        ok(message(json!({"role": "user", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-abc"}}
        ]})));
        rejects(message(json!({"role": "user"})), "messages[0].content");
        let part = |p: Value| message(json!({"role": "user", "content": [{"type": "text", "text": "hi"}, p]}));
        rejects(part(json!({"text": "no type"})), "messages[0].content[1].type");
        rejects(part(json!({"type": "video"})), "messages[0].content[1].type");
        rejects(part(json!({"type": "refusal", "refusal": "no"})), "messages[0].content[1].type");
        rejects(part(json!({"type": "text", "text": 5})), "messages[0].content[1].text");
        rejects(part(json!({"type": "image_url", "image_url": "https://x"})), "messages[0].content[1].image_url");
        rejects(part(json!({"type": "image_url", "image_url": {}})), "messages[0].content[1].image_url.url");
        rejects(part(json!({"type": "input_audio"})), "messages[0].content[1].input_audio");
        rejects(
            part(json!({"type": "input_audio", "input_audio": {"format": "mp3"}})),
            "messages[0].content[1].input_audio.data",
        );
        rejects(
            part(json!({"type": "input_audio", "input_audio": {"data": "x"}})),
            "messages[0].content[1].input_audio.format",
        );
        rejects(part(json!({"type": "file", "file": "file-abc"})), "messages[0].content[1].file");
    }

    #[test]
    fn assistant_needs_content_or_a_call() {
        ok(message(json!({"role": "assistant", "content": "Sure."})));
        ok(message(
            json!({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]}),
        ));
        ok(message(json!({"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{}"}})));
        rejects(message(json!({"role": "assistant"})), "messages[0].content");
        rejects(message(json!({"role": "assistant", "content": null})), "messages[0].content");
        rejects(message(json!({"role": "assistant", "content": null, "tool_calls": null})), "messages[0].content");
        rejects(
            message(json!({"role": "assistant", "content": [{"type": "refusal"}]})),
            "messages[0].content[0].refusal",
        );
        rejects(
            message(json!({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "u"}}]})),
            "messages[0].content[0].type",
        );
        rejects(
            message(json!({"role": "assistant", "function_call": {"name": "f"}})),
            "messages[0].function_call.arguments",
        );
        rejects(message(json!({"role": "assistant", "function_call": "f"})), "messages[0].function_call");
    }

    #[test]
    fn assistant_tool_calls() {
        let call = json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
        ok(message(json!({"role": "assistant", "tool_calls": [call]})));
        let calls = |c: Value| message(json!({"role": "assistant", "content": null, "tool_calls": [call, c]}));
        rejects(calls(json!("call_2")), "messages[0].tool_calls[1]");
        rejects(
            calls(json!({"type": "function", "function": {"name": "f", "arguments": ""}})),
            "messages[0].tool_calls[1].id",
        );
        rejects(
            calls(json!({"id": "c", "type": "code", "function": {"name": "f", "arguments": ""}})),
            "messages[0].tool_calls[1].type",
        );
        rejects(
            calls(json!({"id": "c", "function": {"name": "f", "arguments": ""}})),
            "messages[0].tool_calls[1].type",
        );
        rejects(calls(json!({"id": "c", "type": "function"})), "messages[0].tool_calls[1].function");
        rejects(
            calls(json!({"id": "c", "type": "function", "function": {"arguments": ""}})),
            "messages[0].tool_calls[1].function.name",
        );
        rejects(
            calls(json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}})),
            "messages[0].tool_calls[1].function.arguments",
        );
        rejects(message(json!({"role": "assistant", "tool_calls": []})), "messages[0].tool_calls");
        rejects(message(json!({"role": "assistant", "tool_calls": call})), "messages[0].tool_calls");
    }

    #[test]
    fn tool_message_needs_content_and_call_id() {
        ok(message(json!({"role": "tool", "tool_call_id": "call_1", "content": "22C"})));
        ok(message(json!({"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "22C"}]})));
        rejects(message(json!({"role": "tool", "content": "22C"})), "messages[0].tool_call_id");
        rejects(message(json!({"role": "tool", "tool_call_id": 1, "content": "22C"})), "messages[0].tool_call_id");
        rejects(message(json!({"role": "tool", "tool_call_id": "c"})), "messages[0].content");
        rejects(
            message(
                json!({"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}),
            ),
            "messages[0].content[0].type",
        );
    }

    #[test]
    fn function_message_needs_name_and_content() {
        ok(message(json!({"role": "function", "name": "get_weather", "content": "22C"})));
        ok(message(json!({"role": "function", "name": "get_weather", "content": null})));
        rejects(message(json!({"role": "function", "name": "get_weather"})), "messages[0].content");
        rejects(message(json!({"role": "function", "name": "f", "content": ["22C"]})), "messages[0].content");
        rejects(message(json!({"role": "function", "content": "22C"})), "messages[0].name");
        rejects(message(json!({"role": "function", "name": null, "content": "22C"})), "messages[0].name");
    }

    #[test]
    fn message_name_is_a_string_and_unknown_fields_pass() {
        ok(message(json!({"role": "user", "content": "hi", "name": "alice", "cache_control": {"type": "ephemeral"}})));
        rejects(message(json!({"role": "user", "content": "hi", "name": 7})), "messages[0].name");
    }

    #[test]
    fn penalties() {
        for field in ["frequency_penalty", "presence_penalty"] {
            for v in [json!(-2), json!(0), json!(1.5), json!(2.0), json!(null)] {
                ok(with(field, v));
            }
            for v in [json!(-2.01), json!(3), json!("1"), json!(1e308), json!(-1e308)] {
                rejects(with(field, v), field);
            }
        }
    }

    #[test]
    fn logit_bias() {
        ok(with("logit_bias", json!({"50256": -100, "15": 100, "7": 0.5})));
        ok(with("logit_bias", json!(null)));
        ok(with("logit_bias", json!({})));
        rejects(with("logit_bias", json!([1, 2])), "logit_bias");
        rejects(with("logit_bias", json!({"abc": 1})), "logit_bias");
        rejects(with("logit_bias", json!({"": 1})), "logit_bias");
        rejects(with("logit_bias", json!({"-1": 1})), "logit_bias");
        rejects(with("logit_bias", json!({"9".repeat(1000): 200})), "logit_bias");
        rejects(with("logit_bias", json!({"50256": 101})), "logit_bias.50256");
        rejects(with("logit_bias", json!({"50256": "1"})), "logit_bias.50256");
        rejects(with("logit_bias", json!({"50256": null})), "logit_bias.50256");
    }

    #[test]
    fn logprobs_and_top_logprobs() {
        ok(with("logprobs", json!(true)));
        ok(with("logprobs", json!(null)));
        ok(with_all(json!({"logprobs": true, "top_logprobs": 0})));
        ok(with_all(json!({"logprobs": true, "top_logprobs": 20})));
        ok(with_all(json!({"logprobs": false, "top_logprobs": null})));
        rejects(with("logprobs", json!("true")), "logprobs");
        rejects(with("logprobs", json!(1)), "logprobs");
        rejects(with_all(json!({"logprobs": true, "top_logprobs": 21})), "top_logprobs");
        rejects(with_all(json!({"logprobs": true, "top_logprobs": -1})), "top_logprobs");
        rejects(with_all(json!({"logprobs": true, "top_logprobs": 2.5})), "top_logprobs");
        rejects(with("top_logprobs", json!(5)), "top_logprobs");
        rejects(with_all(json!({"logprobs": false, "top_logprobs": 5})), "top_logprobs");
    }

    #[test]
    fn max_tokens() {
        for field in ["max_tokens", "max_completion_tokens"] {
            ok(with(field, json!(1)));
            ok(with(field, json!(u64::MAX)));
            ok(with(field, json!(null)));
            for v in [json!(0), json!(-5), json!(10.5), json!("100"), json!(1e308)] {
                rejects(with(field, v), field);
            }
        }
    }

    #[test]
    fn n() {
        ok(with("n", json!(1)));
        ok(with("n", json!(128)));
        ok(with("n", json!(null)));
        for v in [json!(0), json!(129), json!(2.0), json!("2"), json!(true)] {
            rejects(with("n", v), "n");
        }
    }

    #[test]
    fn response_format() {
        ok(with("response_format", json!({"type": "text"})));
        ok(with("response_format", json!({"type": "json_object"})));
        ok(with(
            "response_format",
            json!({"type": "json_schema", "json_schema": {
                "name": "weather_report", "strict": true, "schema": {"type": "object", "properties": {}}
            }}),
        ));
        rejects(with("response_format", json!("json_object")), "response_format");
        rejects(with("response_format", json!({})), "response_format.type");
        rejects(with("response_format", json!({"type": "xml"})), "response_format.type");
        rejects(with("response_format", json!({"type": "json_schema"})), "response_format.json_schema");
        rejects(
            with("response_format", json!({"type": "json_schema", "json_schema": {}})),
            "response_format.json_schema.name",
        );
        rejects(
            with("response_format", json!({"type": "json_schema", "json_schema": {"name": "a b"}})),
            "response_format.json_schema.name",
        );
        rejects(
            with("response_format", json!({"type": "json_schema", "json_schema": {"name": "r", "schema": "{}"}})),
            "response_format.json_schema.schema",
        );
        rejects(
            with("response_format", json!({"type": "json_schema", "json_schema": {"name": "r", "strict": "yes"}})),
            "response_format.json_schema.strict",
        );
    }

    #[test]
    fn seed() {
        for v in [json!(0), json!(-1), json!(i64::MIN), json!(i64::MAX), json!(null)] {
            ok(with("seed", v));
        }
        for v in [json!(i64::MAX as u64 + 1), json!(u64::MAX), json!(1.5), json!(1e19), json!("42")] {
            rejects(with("seed", v), "seed");
        }
        // Whole numbers beyond 64 bits (serde reads them as floats) are out of range, not
        // "not an integer".
        for text in ["-9223372036854775809", "100000000000000000000"] {
            let body = with("seed", serde_json::from_str(text).unwrap());
            let e = validate_chat_request(&body).expect_err(text);
            assert!(e.message.contains("between"), "{e:?}");
        }
        let e = validate_chat_request(&with("seed", json!(1.5))).expect_err("1.5");
        assert!(!e.message.contains("between"), "{e:?}");
    }

    #[test]
    fn stop() {
        for v in [json!(null), json!("\n"), json!(["a"]), json!(["a", "b", "c", "d"])] {
            ok(with("stop", v));
        }
        rejects(with("stop", json!([])), "stop");
        rejects(with("stop", json!(["a", "b", "c", "d", "e"])), "stop");
        rejects(with("stop", json!(5)), "stop");
        rejects(with("stop", json!({"a": 1})), "stop");
        rejects(with("stop", json!(["a", 1])), "stop[1]");
    }

    #[test]
    fn stream_and_stream_options() {
        ok(with("stream", json!(true)));
        ok(with("stream", json!(false)));
        ok(with("stream", json!(null)));
        ok(with_all(json!({"stream": true, "stream_options": {"include_usage": true}})));
        ok(with_all(json!({"stream": true, "stream_options": {}})));
        ok(with_all(json!({"stream": false, "stream_options": null})));
        rejects(with("stream", json!("true")), "stream");
        rejects(with("stream", json!(1)), "stream");
        rejects(with("stream_options", json!({"include_usage": true})), "stream_options");
        rejects(with_all(json!({"stream": false, "stream_options": {}})), "stream_options");
        rejects(with_all(json!({"stream": true, "stream_options": true})), "stream_options");
        rejects(
            with_all(json!({"stream": true, "stream_options": {"include_usage": "yes"}})),
            "stream_options.include_usage",
        );
    }

    #[test]
    fn include_usage_flag() {
        assert!(include_usage(
            with_all(json!({"stream": true, "stream_options": {"include_usage": true}})).get("stream_options")
        ));
        assert!(!include_usage(
            with_all(json!({"stream": true, "stream_options": {"include_usage": false}})).get("stream_options")
        ));
        assert!(!include_usage(with("stream_options", json!("include_usage")).get("stream_options")));
        assert!(!include_usage(base().get("stream_options")));
    }

    #[test]
    fn thinking() {
        ok(with("thinking", json!({"type": "enabled", "budget_tokens": 2048})));
        ok(with("thinking", json!({"type": "disabled"})));
        rejects(with("thinking", json!(true)), "thinking");
        rejects(with("thinking", json!({"budget_tokens": 1024})), "thinking.type");
        rejects(with("thinking", json!({"type": 1})), "thinking.type");
        rejects(with("thinking", json!({"type": "enabled", "budget_tokens": 0})), "thinking.budget_tokens");
        rejects(with("thinking", json!({"type": "enabled", "budget_tokens": "1024"})), "thinking.budget_tokens");
    }

    #[test]
    fn temperature_and_top_p() {
        for v in [json!(0), json!(2), json!(0.7), json!(null)] {
            ok(with("temperature", v));
        }
        for v in [json!(-0.1), json!(2.01), json!("0.7"), json!(1e308)] {
            rejects(with("temperature", v), "temperature");
        }
        for v in [json!(0), json!(1), json!(0.9), json!(null)] {
            ok(with("top_p", v));
        }
        for v in [json!(-0.1), json!(1.01), json!(false)] {
            rejects(with("top_p", v), "top_p");
        }
    }

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "description": "d", "parameters": {"type": "object"}, "strict": true}})
    }

    #[test]
    fn tools() {
        ok(with("tools", json!([tool("get_weather"), tool("a-B_9"), tool(&"x".repeat(64))])));
        ok(with("tools", json!([{"type": "function", "function": {"name": "f"}}])));
        ok(with("tools", json!(vec![tool("f"); 128])));
        ok(with("tools", json!([])));
        rejects(with("tools", json!(vec![tool("f"); 129])), "tools");
        rejects(with("tools", json!(tool("f"))), "tools");
        let tools = |t: Value| with("tools", json!([tool("ok"), tool("ok2"), tool("ok3"), t]));
        rejects(tools(json!("f")), "tools[3]");
        rejects(tools(json!({"function": {"name": "f"}})), "tools[3].type");
        rejects(tools(json!({"type": "code_interpreter"})), "tools[3].type");
        rejects(tools(json!({"type": "function"})), "tools[3].function");
        rejects(tools(json!({"type": "function", "function": {}})), "tools[3].function.name");
        for bad in ["", "get weather", "get.weather", "wetter_für", &"x".repeat(65)] {
            rejects(tools(tool(bad)), "tools[3].function.name");
        }
        rejects(
            tools(json!({"type": "function", "function": {"name": "f", "description": 1}})),
            "tools[3].function.description",
        );
        rejects(
            tools(json!({"type": "function", "function": {"name": "f", "parameters": "{}"}})),
            "tools[3].function.parameters",
        );
        rejects(
            tools(json!({"type": "function", "function": {"name": "f", "strict": "true"}})),
            "tools[3].function.strict",
        );
    }

    #[test]
    fn tool_choice() {
        let tools = json!([tool("get_weather"), tool("get_time")]);
        for choice in [json!("none"), json!("auto"), json!("required"), json!(null)] {
            ok(with_all(json!({"tools": tools, "tool_choice": choice})));
        }
        ok(with_all(json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})));
        ok(with("tool_choice", json!("none")));
        rejects(with_all(json!({"tools": tools, "tool_choice": "always"})), "tool_choice");
        rejects(with_all(json!({"tools": tools, "tool_choice": true})), "tool_choice");
        rejects(
            with_all(json!({"tools": tools, "tool_choice": {"function": {"name": "get_time"}}})),
            "tool_choice.type",
        );
        rejects(with_all(json!({"tools": tools, "tool_choice": {"type": "function"}})), "tool_choice.function");
        rejects(
            with_all(json!({"tools": tools, "tool_choice": {"type": "function", "function": {}}})),
            "tool_choice.function.name",
        );
        rejects(
            with_all(json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_news"}}})),
            "tool_choice.function.name",
        );
        rejects(with("tool_choice", json!("auto")), "tool_choice");
        rejects(with("tool_choice", json!("required")), "tool_choice");
        rejects(with_all(json!({"tools": [], "tool_choice": "required"})), "tool_choice");
        rejects(with("tool_choice", json!({"type": "function", "function": {"name": "get_time"}})), "tool_choice");
    }

    #[test]
    fn parallel_tool_calls_and_user() {
        ok(with_all(json!({"parallel_tool_calls": false, "user": "user-123"})));
        rejects(with("parallel_tool_calls", json!("false")), "parallel_tool_calls");
        rejects(with("parallel_tool_calls", json!(0)), "parallel_tool_calls");
        rejects(with("user", json!(123)), "user");
        rejects(with("user", json!({"id": "u"})), "user");
    }

    fn function(name: &str) -> Value {
        json!({"name": name, "description": "d", "parameters": {"type": "object"}})
    }

    #[test]
    fn functions_and_function_call() {
        let functions = json!([function("get_weather"), function("get_time")]);
        ok(with("functions", functions.clone()));
        ok(with("functions", json!(vec![function("f"); 128])));
        for choice in [json!("none"), json!("auto"), json!({"name": "get_time"})] {
            ok(with_all(json!({"functions": functions, "function_call": choice})));
        }
        rejects(with("functions", json!([])), "functions");
        rejects(with("functions", json!(vec![function("f"); 129])), "functions");
        rejects(with("functions", json!([function("f"), "g"])), "functions[1]");
        rejects(with("functions", json!([function("f"), {"description": "no name"}])), "functions[1].name");
        rejects(with("functions", json!([function("f"), function("bad name")])), "functions[1].name");
        rejects(with("functions", json!([{"name": "f", "parameters": []}])), "functions[0].parameters");
        rejects(with_all(json!({"functions": functions, "function_call": "required"})), "function_call");
        rejects(with_all(json!({"functions": functions, "function_call": 1})), "function_call");
        rejects(with_all(json!({"functions": functions, "function_call": {"name": 1}})), "function_call.name");
        rejects(with_all(json!({"functions": functions, "function_call": {"name": "get_news"}})), "function_call.name");
        rejects(with("function_call", json!("auto")), "function_call");
        ok(with("function_call", json!("none")));
    }

    #[test]
    fn unknown_top_level_fields_pass() {
        ok(with_all(json!({"top_k": 40, "safe_prompt": true, "metadata": {"a": "b"}, "store": false})));
    }

    #[test]
    fn realistic_multi_turn_request_validates() {
        ok(json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "developer", "content": "You are a travel assistant."},
                {"role": "system", "content": [{"type": "text", "text": "Answer in English."}]},
                {"role": "user", "name": "alice", "content": [
                    {"type": "text", "text": "Where was this taken, and what is the weather there?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"Europe/Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 22}"},
                {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "14:05"}]},
                {"role": "assistant", "content": "It is the Eiffel Tower; 22C at 14:05.", "refusal": null},
                {"role": "user", "content": "Thanks! Anything similar nearby?"}
            ],
            "tools": [tool("get_weather"), tool("get_time")],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "temperature": 0.2,
            "top_p": 0.9,
            "max_completion_tokens": 1024,
            "n": 1,
            "seed": 42,
            "stop": ["\n\n\n"],
            "stream": true,
            "stream_options": {"include_usage": true},
            "logprobs": true,
            "top_logprobs": 3,
            "logit_bias": {"50256": -100},
            "frequency_penalty": 0.1,
            "presence_penalty": -0.1,
            "response_format": {"type": "text"},
            "user": "user-42"
        }));
    }

    /// Wrong types everywhere: every field set to every JSON type must give an error or pass,
    /// never panic, and errors always carry a param.
    #[test]
    fn hostile_types_never_panic() {
        let values = [
            json!(null),
            json!(true),
            json!(-1),
            json!(1e308),
            json!(u64::MAX),
            json!("x"),
            json!([]),
            json!([null, 1, "x", {}]),
            json!({}),
            json!({"type": 1, "function": [], "name": {}, "url": 1}),
        ];
        let fields = [
            "model",
            "messages",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "response_format",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "thinking",
            "temperature",
            "top_p",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "user",
            "function_call",
            "functions",
        ];
        let message_fields = ["role", "content", "name", "tool_calls", "tool_call_id", "function_call"];
        for v in &values {
            for field in fields {
                if let Err(e) = validate_chat_request(&with(field, v.clone())) {
                    assert!(e.param.is_some());
                }
            }
            for role in ROLES {
                for field in message_fields {
                    let mut m = json!({"role": role, "content": "x", "tool_call_id": "c", "name": "n"});
                    m[field] = v.clone();
                    let _ = validate_chat_request(&message(m.clone()));
                    let _ = validate_chat_request(&message(json!({"role": role, "content": [v, m]})));
                    let _ = validate_chat_request(&message(json!({"role": role, "tool_calls": [v, m]})));
                }
            }
            let _ = validate_chat_request(v);
        }
    }

    #[test]
    fn hostile_sizes_never_panic() {
        let many = vec![json!({"role": "user", "content": "hi"}); 10_000];
        ok(with("messages", json!(many)));
        let mut bad_last = many;
        bad_last.push(json!({"role": "user"}));
        rejects(with("messages", json!(bad_last)), "messages[10000].content");

        let huge = "x".repeat(1 << 20);
        ok(message(json!({"role": "user", "content": huge})));
        rejects(with("model", json!({"id": huge})), "model");
        rejects(message(json!({"role": huge, "content": "hi"})), "messages[0].role");
        rejects(with("logit_bias", json!({huge.clone(): 1})), "logit_bias");
        rejects(with("tools", json!([tool(&huge)])), "tools[0].function.name");
        let e = validate_chat_request(&message(json!({"role": huge, "content": "hi"}))).unwrap_err();
        assert!(e.message.len() < 200, "client text is not echoed back");

        // As deep as serde_json will parse (its recursion limit is 128).
        let depth = 120;
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let deep: Value = serde_json::from_str(&deep).unwrap();
        rejects(message(json!({"role": "user", "content": deep.clone()})), "messages[0].content[0]");
        rejects(
            message(json!({"role": "user", "content": [{"type": "text", "text": deep.clone()}]})),
            "messages[0].content[0].text",
        );
        rejects(with("stop", deep), "stop[0]");
    }
}
