//! OpenAI chat completion requests as Bedrock Converse requests.

use super::model_path;
use crate::errors::GatewayError;
use crate::providers::chat_input::{
    content_error, function_tools, part_param, read_tool_call, reasoning, reject_unsupported, role_error,
    stop_sequences, tool_call_id, tool_calls, tool_choice, Reasoning, ToolChoice,
};
use crate::providers::str_field;
use serde_json::{json, Map, Value};

const PROVIDER: &str = "bedrock";
/// Converse fields a user may force through `override_params`; Converse rejects unknown
/// fields, so every other field left after the conversion is dropped.
const CONVERSE_FIELDS: &[&str] = &[
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "guardrailConfig",
    "performanceConfig",
    "promptVariables",
    "requestMetadata",
];

/// The Converse body and the upstream path (`/model/{id}/converse` or `/converse-stream`).
pub(crate) fn convert_request(body: Value) -> Result<(Value, String), GatewayError> {
    let Value::Object(mut req) = body else {
        return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
    };
    // OpenAI reads null as "use the default"; Converse rejects nulls.
    req.retain(|_, v| !v.is_null());
    reject_unsupported(&req, PROVIDER)?;
    let action = if req.get("stream") == Some(&Value::Bool(true)) { "converse-stream" } else { "converse" };
    let path = model_path(req.get("model"), action)?;

    let mut out = Map::new();
    let (system, messages) = convert_messages(req.get("messages"))?;
    out.insert("messages".into(), messages);
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }

    let mut inference = Map::new();
    if let Some(tokens) = req.get("max_completion_tokens").or_else(|| req.get("max_tokens")) {
        inference.insert("maxTokens".into(), tokens.clone());
    }
    for (from, to) in [("temperature", "temperature"), ("top_p", "topP")] {
        if let Some(value) = req.get(from) {
            inference.insert(to.into(), value.clone());
        }
    }
    if let Some(stop) = req.remove("stop") {
        inference.insert("stopSequences".into(), stop_sequences(stop)?);
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }

    if let Some(tool_config) = tool_config(req.get("tools"), req.get("tool_choice"))? {
        out.insert("toolConfig".into(), tool_config);
    }
    for field in CONVERSE_FIELDS {
        if let Some(value) = req.remove(*field) {
            out.insert((*field).into(), value);
        }
    }
    Ok((Value::Object(out), path))
}

/// OpenAI `messages` into Converse's `system` blocks and its `messages`, where user and
/// assistant alternate and tool results are user content.
fn convert_messages(messages: Option<&Value>) -> Result<(Vec<Value>, Value), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(GatewayError::invalid_param("messages", "'messages' must be an array"));
    };
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let content = message.get("content").filter(|c| !c.is_null());
        match str_field(Some(message), "role").unwrap_or_default() {
            "system" | "developer" => system.extend(text_blocks(content, i)?),
            "user" => push_turn(&mut turns, "user", content_blocks(content, i)?),
            "assistant" => push_turn(&mut turns, "assistant", assistant_blocks(message, content, i)?),
            "tool" => push_turn(&mut turns, "user", vec![tool_result(message, content, i)?]),
            role => return Err(role_error(i, role, PROVIDER)),
        }
    }
    let messages = turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    Ok((system, Value::Array(messages)))
}

/// Appends a turn, merged into the previous one of the same role (Converse wants user and
/// assistant to alternate; consecutive tool results become one user turn).
fn push_turn(turns: &mut Vec<(&'static str, Vec<Value>)>, role: &'static str, blocks: Vec<Value>) {
    match turns.last_mut() {
        Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
        _ => turns.push((role, blocks)),
    }
}

/// `{text}` blocks of a string or of text parts (system messages and tool results); an
/// empty string is no block (Converse rejects blank text).
fn text_blocks(content: Option<&Value>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(text_block(text).into_iter().collect()),
        Some(Value::Array(parts)) => {
            let mut blocks = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                match str_field(Some(part), "type") {
                    Some("text") => blocks.extend(text_block(part_text(part, i, j)?)),
                    _ => {
                        return Err(GatewayError::invalid_param(
                            part_param(i, j, "type"),
                            "system, developer and tool messages accept only text parts with provider 'bedrock'",
                        ))
                    }
                }
            }
            Ok(blocks)
        }
        _ => Err(content_error(i)),
    }
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"text": text}))
}

fn part_text(part: &Value, i: usize, j: usize) -> Result<&str, GatewayError> {
    str_field(Some(part), "text")
        .ok_or_else(|| GatewayError::invalid_param(part_param(i, j, "text"), "text must be a string"))
}

/// User or assistant content: text and images.
fn content_blocks(content: Option<&Value>, i: usize) -> Result<Vec<Value>, GatewayError> {
    let Some(Value::Array(parts)) = content else {
        return text_blocks(content, i);
    };
    let mut blocks = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        match str_field(Some(part), "type") {
            Some("text") => blocks.extend(text_block(part_text(part, i, j)?)),
            Some("image_url") => blocks.push(image_block(part, i, j)?),
            other => {
                return Err(GatewayError::invalid_param(
                    part_param(i, j, "type"),
                    format!("content part type '{}' is not supported by provider 'bedrock'", other.unwrap_or_default()),
                ))
            }
        }
    }
    Ok(blocks)
}

/// A base64 data URL as an image block; Converse does not fetch URLs.
fn image_block(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let bad_url = |message: &str| GatewayError::invalid_param(part_param(i, j, "image_url.url"), message);
    let url = str_field(part.get("image_url"), "url").ok_or_else(|| bad_url("image_url.url must be a string"))?;
    let (media_type, data) = url
        .strip_prefix("data:")
        .and_then(|data_url| data_url.split_once(";base64,"))
        .ok_or_else(|| bad_url("provider 'bedrock' takes images as data:image/<format>;base64,<data> URLs"))?;
    let format = match media_type {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return Err(bad_url("provider 'bedrock' accepts png, jpeg, gif and webp images")),
    };
    Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
}

/// Assistant content: the reasoning it carries back first, then its content, then its tool
/// calls as `toolUse` blocks.
fn assistant_blocks(message: &Value, content: Option<&Value>, i: usize) -> Result<Vec<Value>, GatewayError> {
    let calls = tool_calls(message, i)?;
    let mut blocks: Vec<Value> = reasoning(message, i)?.iter().map(reasoning_block).collect();
    match content {
        None if !calls.is_empty() || !blocks.is_empty() => {}
        _ => blocks.extend(content_blocks(content, i)?),
    }
    for (j, call) in calls.iter().enumerate() {
        let call = read_tool_call(call, i, j, PROVIDER)?;
        blocks.push(json!({"toolUse": {"toolUseId": call.required_id()?, "name": call.name, "input": call.arguments}}));
    }
    Ok(blocks)
}

/// Reasoning as Converse's `reasoningContent` (an answer's own block as it came).
fn reasoning_block(reasoning: &Reasoning) -> Value {
    match reasoning {
        Reasoning::Thinking { thinking, signature } => {
            json!({"reasoningContent": {"reasoningText": {"text": thinking, "signature": signature}}})
        }
        Reasoning::Redacted { data } => json!({"reasoningContent": {"redactedContent": data}}),
        Reasoning::Native(block) => (*block).clone(),
    }
}

fn tool_result(message: &Value, content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    let id = tool_call_id(message, i)?;
    let content = match content {
        Some(_) => text_blocks(content, i)?,
        None => Vec::new(),
    };
    Ok(json!({"toolResult": {"toolUseId": id, "content": content}}))
}

/// `toolConfig` of the tools and tool choice. `none` has no Converse counterpart: the tools
/// are then not offered at all.
fn tool_config(tools: Option<&Value>, choice: Option<&Value>) -> Result<Option<Value>, GatewayError> {
    let choice = choice.map(tool_choice).transpose()?;
    let Some(tools) = tools else {
        return Ok(None);
    };
    let tools = function_tools(tools, PROVIDER)?;
    if tools.is_empty() || choice == Some(ToolChoice::None) {
        return Ok(None);
    }
    let specs: Vec<Value> = tools
        .into_iter()
        .map(|tool| {
            let mut spec = tool.declaration();
            spec.insert("inputSchema".into(), json!({"json": tool.schema()}));
            json!({"toolSpec": spec})
        })
        .collect();
    let mut config = Map::new();
    config.insert("tools".into(), Value::Array(specs));
    let choice = match choice {
        Some(ToolChoice::Auto) => Some(json!({"auto": {}})),
        Some(ToolChoice::Required) => Some(json!({"any": {}})),
        Some(ToolChoice::Function(name)) => Some(json!({"tool": {"name": name}})),
        Some(ToolChoice::None) | None => None,
    };
    if let Some(choice) = choice {
        config.insert("toolChoice".into(), choice);
    }
    Ok(Some(Value::Object(config)))
}
