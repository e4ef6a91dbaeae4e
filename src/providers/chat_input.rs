//! Reading an OpenAI chat request for a translator to another API: the checks and the parts
//! (tool calls, tools, tool choice, stop) every such translation needs alike. `provider`
//! names the provider in error messages.

use super::str_field;
use crate::errors::GatewayError;
use serde_json::{json, Map, Value};

/// OpenAI fields whose requested behaviour a provider without them cannot provide.
pub(crate) fn reject_unsupported(req: &Map<String, Value>, provider: &str) -> Result<(), GatewayError> {
    if req.get("n").and_then(Value::as_f64).is_some_and(|n| n > 1.0) {
        return Err(GatewayError::invalid_param(
            "n",
            format!("provider '{provider}' returns a single choice; 'n' must be 1"),
        ));
    }
    if req.get("logprobs") == Some(&Value::Bool(true)) {
        return Err(GatewayError::invalid_param(
            "logprobs",
            format!("'logprobs' is not supported by provider '{provider}'"),
        ));
    }
    for field in ["functions", "function_call"] {
        if req.get(field).is_some_and(|v| !is_empty(v)) {
            return Err(GatewayError::invalid_param(
                field,
                format!("'{field}' is not supported by provider '{provider}'; use 'tools' and 'tool_choice'"),
            ));
        }
    }
    // `text` is the only output; it is dropped with the other OpenAI-only fields.
    if matches!(str_field(req.get("response_format"), "type"), Some("json_object" | "json_schema")) {
        return Err(GatewayError::invalid_param(
            "response_format",
            format!(
                "provider '{provider}' has no JSON mode through this gateway yet; \
                 only response_format type 'text' is supported"
            ),
        ));
    }
    Ok(())
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The error of message `i`'s role when the translation takes no such role.
pub(crate) fn role_error(i: usize, role: &str, provider: &str) -> GatewayError {
    let message = if role == "function" {
        format!("role 'function' is not supported by provider '{provider}'; use 'tools' and 'tool' messages")
    } else {
        format!("unknown role '{role}'")
    };
    GatewayError::invalid_param(format!("messages[{i}].role"), message)
}

pub(crate) fn content_error(i: usize) -> GatewayError {
    GatewayError::invalid_param(
        format!("messages[{i}].content"),
        "content must be a string or an array of content parts",
    )
}

pub(crate) fn part_param(i: usize, j: usize, field: &str) -> String {
    format!("messages[{i}].content[{j}].{field}")
}

/// The `tool_calls` of assistant message `i` (none when absent or null).
pub(crate) fn tool_calls(message: &Value, i: usize) -> Result<&[Value], GatewayError> {
    match message.get("tool_calls") {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(calls)) => Ok(calls.as_slice()),
        Some(_) => Err(GatewayError::invalid_param(format!("messages[{i}].tool_calls"), "tool_calls must be an array")),
    }
}

/// One of OpenAI's tool calls: its id, the function's name and its arguments as a JSON object.
pub(crate) struct ToolCall<'a> {
    pub(crate) id: Option<&'a str>,
    pub(crate) name: &'a str,
    pub(crate) arguments: Value,
    /// `messages[i].tool_calls[j]`, for errors.
    at: (usize, usize),
}

impl<'a> ToolCall<'a> {
    /// The id, for APIs that pair each result with its call by id.
    pub(crate) fn required_id(&self) -> Result<&'a str, GatewayError> {
        let (i, j) = self.at;
        self.id.ok_or_else(|| {
            GatewayError::invalid_param(format!("messages[{i}].tool_calls[{j}].id"), "id must be a string")
        })
    }
}

/// `messages[i].tool_calls[j]`, which must call a function.
pub(crate) fn read_tool_call<'a>(
    call: &'a Value,
    i: usize,
    j: usize,
    provider: &str,
) -> Result<ToolCall<'a>, GatewayError> {
    let bad = |field: &str, message: &str| {
        GatewayError::invalid_param(format!("messages[{i}].tool_calls[{j}].{field}"), message)
    };
    if str_field(Some(call), "type").is_some_and(|t| t != "function") {
        return Err(bad("type", &format!("only function tool calls are supported by provider '{provider}'")));
    }
    let function = call.get("function");
    let name = str_field(function, "name").ok_or_else(|| bad("function.name", "name must be a string"))?;
    let arguments = match function.and_then(|f| f.get("arguments")) {
        None => Some(json!({})),
        Some(Value::String(arguments)) => parse_arguments(arguments),
        Some(_) => None,
    }
    .ok_or_else(|| bad("function.arguments", "arguments must be a JSON object encoded as a string"))?;
    Ok(ToolCall { id: str_field(Some(call), "id"), name, arguments, at: (i, j) })
}

/// Tool call arguments as a JSON object; models emit "" for tools without parameters.
fn parse_arguments(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object)
}

/// A piece of an earlier answer's reasoning that an assistant message carries back in its
/// `content_blocks` (as a non-strict answer gave them): providers that sign their reasoning
/// need it resent while tools are in use.
pub(crate) enum Reasoning<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Redacted {
        data: &'a str,
    },
    /// A provider's own block kept as it came (e.g. Converse's `reasoningContent`).
    Native(&'a Value),
}

/// The reasoning blocks of assistant message `i`'s `content_blocks`, in order; its text blocks
/// repeat `content` and are not read.
pub(crate) fn reasoning(message: &Value, i: usize) -> Result<Vec<Reasoning<'_>>, GatewayError> {
    let blocks = match message.get("content_blocks") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(GatewayError::invalid_param(
                format!("messages[{i}].content_blocks"),
                "content_blocks must be an array",
            ))
        }
    };
    let mut out = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        match str_field(Some(block), "type") {
            Some("thinking") => out.push(Reasoning::Thinking {
                thinking: block_text(block, i, j, "thinking")?,
                signature: block_text(block, i, j, "signature")?,
            }),
            Some("redacted_thinking") => out.push(Reasoning::Redacted { data: block_text(block, i, j, "data")? }),
            None if block.get("reasoningContent").is_some() => out.push(Reasoning::Native(block)),
            _ => {}
        }
    }
    Ok(out)
}

/// Field `name` of block `j` of message `i`'s `content_blocks`, which must be a string.
fn block_text<'a>(block: &'a Value, i: usize, j: usize, name: &str) -> Result<&'a str, GatewayError> {
    str_field(Some(block), name).ok_or_else(|| {
        GatewayError::invalid_param(
            format!("messages[{i}].content_blocks[{j}].{name}"),
            format!("{name} must be a string"),
        )
    })
}

/// The `tool_call_id` of tool message `i`.
pub(crate) fn tool_call_id(message: &Value, i: usize) -> Result<&str, GatewayError> {
    str_field(Some(message), "tool_call_id").ok_or_else(|| {
        GatewayError::invalid_param(format!("messages[{i}].tool_call_id"), "tool_call_id must be a string")
    })
}

/// One function tool of OpenAI's `tools`.
pub(crate) struct FunctionTool<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: Option<&'a str>,
    /// The parameters' JSON schema, when it is an object.
    pub(crate) parameters: Option<&'a Value>,
}

impl FunctionTool<'_> {
    /// `name` and, when given, `description`: how every API's tool declaration starts.
    pub(crate) fn declaration(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("name".into(), self.name.into());
        if let Some(description) = self.description {
            out.insert("description".into(), description.into());
        }
        out
    }

    /// The parameters' schema, or the schema of no parameters for APIs that require one.
    pub(crate) fn schema(&self) -> Value {
        self.parameters.cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}))
    }
}

/// OpenAI's `tools`, all of which must be function tools.
pub(crate) fn function_tools<'a>(tools: &'a Value, provider: &str) -> Result<Vec<FunctionTool<'a>>, GatewayError> {
    let Value::Array(tools) = tools else {
        return Err(GatewayError::invalid_param("tools", "tools must be an array"));
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            if str_field(Some(tool), "type") != Some("function") {
                return Err(GatewayError::invalid_param(
                    format!("tools[{i}].type"),
                    format!("only function tools are supported by provider '{provider}'"),
                ));
            }
            let function = tool.get("function");
            let name = str_field(function, "name").ok_or_else(|| {
                GatewayError::invalid_param(format!("tools[{i}].function.name"), "name must be a string")
            })?;
            let description = str_field(function, "description");
            let parameters = function.and_then(|f| f.get("parameters")).filter(|p| p.is_object());
            Ok(FunctionTool { name, description, parameters })
        })
        .collect()
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolChoice<'a> {
    Auto,
    Required,
    None,
    Function(&'a str),
}

pub(crate) fn tool_choice(choice: &Value) -> Result<ToolChoice<'_>, GatewayError> {
    let named = (str_field(Some(choice), "type"), str_field(choice.get("function"), "name"));
    match (choice.as_str(), named) {
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("required"), _) => Ok(ToolChoice::Required),
        (Some("none"), _) => Ok(ToolChoice::None),
        (None, (Some("function"), Some(name))) => Ok(ToolChoice::Function(name)),
        _ => Err(GatewayError::invalid_param(
            "tool_choice",
            "tool_choice must be 'auto', 'required', 'none' or {\"type\":\"function\",\"function\":{\"name\":...}}",
        )),
    }
}

/// `stop` as a list of strings.
pub(crate) fn stop_sequences(stop: Value) -> Result<Value, GatewayError> {
    match stop {
        Value::String(stop) => Ok(json!([stop])),
        Value::Array(stops) if stops.iter().all(Value::is_string) => Ok(Value::Array(stops)),
        _ => Err(GatewayError::invalid_param("stop", "stop must be a string or an array of strings")),
    }
}
