//! OpenAI chat completion requests as Anthropic Messages requests.

use super::str_field;
use crate::errors::GatewayError;
use crate::providers::chat_input::{
    content_error, function_tools, part_param, read_tool_call, reasoning, reject_unsupported, role_error,
    stop_sequences, tool_call_id, tool_calls, tool_choice, FunctionTool, Reasoning, ToolChoice,
};
use serde_json::{json, Map, Value};

/// Anthropic requires `max_tokens`; OpenAI lets it default.
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// OpenAI-only request fields with no Anthropic counterpart. Anthropic rejects unknown fields,
/// so these are dropped (values that would change the answer were rejected before).
const DROPPED_FIELDS: &[&str] = &[
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "response_format",
    "stream_options",
    "functions",
    "function_call",
    "store",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "prompt_cache_key",
    "safety_identifier",
];

pub(crate) fn convert_request(body: Value) -> Result<Value, GatewayError> {
    let Value::Object(mut req) = body else {
        return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
    };
    // OpenAI reads null as "use the default"; Anthropic rejects nulls.
    req.retain(|_, v| !v.is_null());
    reject_unsupported(&req, "anthropic")?;
    for field in DROPPED_FIELDS {
        req.remove(*field);
    }

    let mut out = Map::new();
    let max_tokens = match (req.remove("max_completion_tokens"), req.remove("max_tokens")) {
        (Some(tokens), _) | (None, Some(tokens)) => tokens,
        (None, None) => json!(DEFAULT_MAX_TOKENS),
    };
    out.insert("max_tokens".into(), max_tokens);

    let (system, messages) = convert_messages(req.remove("messages").as_ref())?;
    if let Some(system) = system {
        out.insert("system".into(), system);
    }
    out.insert("messages".into(), messages);

    let tools = match req.remove("tools") {
        Some(tools) => convert_tools(&tools)?,
        None => Vec::new(),
    };
    let tool_choice = req.remove("tool_choice").map(|c| convert_tool_choice(&c)).transpose()?;
    let parallel_tool_calls = req.remove("parallel_tool_calls");
    // Anthropic accepts tool_choice only together with tools.
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        let tool_choice = match parallel_tool_calls {
            Some(Value::Bool(false)) => Some(disable_parallel_tool_use(tool_choice)),
            _ => tool_choice,
        };
        if let Some(tool_choice) = tool_choice {
            out.insert("tool_choice".into(), tool_choice);
        }
    }

    if let Some(stop) = req.remove("stop") {
        out.insert("stop_sequences".into(), stop_sequences(stop)?);
    }
    let user = req.remove("user");

    // What is left is named alike in both APIs (model, temperature, top_p, stream, thinking)
    // or provider-specific (top_k, metadata, ...) forced by the user; computed fields win.
    for (key, value) in req {
        out.entry(key).or_insert(value);
    }
    if let Some(Value::String(user)) = user {
        if let Value::Object(metadata) = out.entry("metadata").or_insert_with(|| json!({})) {
            metadata.entry("user_id").or_insert(Value::String(user));
        }
    }
    Ok(Value::Object(out))
}

/// OpenAI `messages` into Anthropic's top-level `system` and its `messages`, where roles
/// alternate and tool results are user content.
fn convert_messages(messages: Option<&Value>) -> Result<(Option<Value>, Value), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(GatewayError::invalid_param("messages", "'messages' must be an array"));
    };
    let mut system = Vec::new();
    let mut system_is_plain = true;
    let mut turns: Vec<(&'static str, Value)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let content = message.get("content").filter(|c| !c.is_null());
        match str_field(Some(message), "role").unwrap_or_default() {
            "system" | "developer" => {
                system_is_plain &= matches!(content, Some(Value::String(_)));
                system.extend(system_blocks(content, i)?);
            }
            "user" => push_turn(&mut turns, "user", convert_content(content, i)?),
            "assistant" => push_turn(&mut turns, "assistant", assistant_content(message, content, i)?),
            "tool" => push_turn(&mut turns, "user", tool_result(message, content, i)?),
            role => return Err(role_error(i, role, "anthropic")),
        }
    }

    let system = if system.is_empty() {
        None
    } else if system_is_plain {
        let texts: Vec<&str> = system.iter().filter_map(|block| str_field(Some(block), "text")).collect();
        Some(Value::String(texts.join("\n\n")))
    } else {
        Some(Value::Array(system))
    };
    let messages = turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    Ok((system, Value::Array(messages)))
}

/// Appends a turn, merging it into the previous one of the same role (Anthropic wants
/// user and assistant to alternate; consecutive tool results become one user turn).
fn push_turn(turns: &mut Vec<(&'static str, Value)>, role: &'static str, content: Value) {
    if let Some((last_role, last_content)) = turns.last_mut() {
        if *last_role == role {
            let mut blocks = into_blocks(std::mem::take(last_content));
            blocks.extend(into_blocks(content));
            *last_content = Value::Array(blocks);
            return;
        }
    }
    turns.push((role, content));
}

/// Anthropic content as a list of blocks; an empty string is no block (Anthropic rejects
/// empty text blocks).
fn into_blocks(content: Value) -> Vec<Value> {
    match content {
        Value::Array(blocks) => blocks,
        Value::String(text) if text.is_empty() => Vec::new(),
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

fn system_blocks(content: Option<&Value>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(vec![json!({"type": "text", "text": text})]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| match str_field(Some(part), "type") {
                Some("text") => text_block(part, i, j),
                _ => Err(GatewayError::invalid_param(
                    part_param(i, j, "type"),
                    "system and developer messages accept only text parts with provider 'anthropic'",
                )),
            })
            .collect(),
        _ => Err(content_error(i)),
    }
}

/// User, assistant or tool content: a string stays a string, parts become blocks.
fn convert_content(content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(Value::String(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| convert_part(part, i, j))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        _ => Err(content_error(i)),
    }
}

fn convert_part(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    match str_field(Some(part), "type") {
        Some("text") => text_block(part, i, j),
        Some("image_url") => image_block(part, i, j),
        other => Err(GatewayError::invalid_param(
            part_param(i, j, "type"),
            format!("content part type '{}' is not supported by provider 'anthropic'", other.unwrap_or_default()),
        )),
    }
}

fn text_block(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let text = str_field(Some(part), "text")
        .ok_or_else(|| GatewayError::invalid_param(part_param(i, j, "text"), "text must be a string"))?;
    let mut block = Map::new();
    block.insert("type".into(), "text".into());
    block.insert("text".into(), text.into());
    // Prompt caching hints written for Anthropic are honoured.
    if let Some(cache_control) = part.get("cache_control") {
        block.insert("cache_control".into(), cache_control.clone());
    }
    Ok(Value::Object(block))
}

fn image_block(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let bad_url = |message: &str| GatewayError::invalid_param(part_param(i, j, "image_url.url"), message);
    let url = str_field(part.get("image_url"), "url").ok_or_else(|| bad_url("image_url.url must be a string"))?;
    let source = if let Some(data_url) = url.strip_prefix("data:") {
        let (media_type, data) = data_url
            .split_once(";base64,")
            .ok_or_else(|| bad_url("data URLs must have the form data:<media type>;base64,<data>"))?;
        json!({"type": "base64", "media_type": media_type, "data": data})
    } else if url.starts_with("https://") || url.starts_with("http://") {
        json!({"type": "url", "url": url})
    } else {
        return Err(bad_url("image URLs must be http(s) URLs or base64 data URLs"));
    };
    Ok(json!({"type": "image", "source": source}))
}

/// Assistant content: the reasoning it carries back first (Anthropic wants thinking blocks
/// to lead the turn), then its content, then its tool calls as `tool_use` blocks.
fn assistant_content(message: &Value, content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    let calls = tool_calls(message, i)?;
    let reasoning = reasoning(message, i)?;
    if calls.is_empty() && reasoning.is_empty() {
        return convert_content(content, i);
    }
    let mut blocks: Vec<Value> = reasoning.iter().filter_map(thinking_block).collect();
    if content.is_some() {
        blocks.extend(into_blocks(convert_content(content, i)?));
    }
    for (j, call) in calls.iter().enumerate() {
        let call = read_tool_call(call, i, j, "anthropic")?;
        blocks.push(json!({"type": "tool_use", "id": call.required_id()?, "name": call.name, "input": call.arguments}));
    }
    Ok(Value::Array(blocks))
}

fn thinking_block(reasoning: &Reasoning) -> Option<Value> {
    match reasoning {
        Reasoning::Thinking { thinking, signature } => {
            Some(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
        }
        Reasoning::Redacted { data } => Some(json!({"type": "redacted_thinking", "data": data})),
        Reasoning::Native(_) => None,
    }
}

fn tool_result(message: &Value, content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    let id = tool_call_id(message, i)?;
    let mut block = Map::new();
    block.insert("type".into(), "tool_result".into());
    block.insert("tool_use_id".into(), id.into());
    if content.is_some() {
        block.insert("content".into(), convert_content(content, i)?);
    }
    Ok(Value::Array(vec![Value::Object(block)]))
}

fn convert_tools(tools: &Value) -> Result<Vec<Value>, GatewayError> {
    let tools = function_tools(tools, "anthropic")?;
    let convert = |tool: FunctionTool| {
        let mut out = tool.declaration();
        out.insert("input_schema".into(), tool.schema());
        Value::Object(out)
    };
    Ok(tools.into_iter().map(convert).collect())
}

fn convert_tool_choice(choice: &Value) -> Result<Value, GatewayError> {
    Ok(match tool_choice(choice)? {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Function(name) => json!({"type": "tool", "name": name}),
    })
}

fn disable_parallel_tool_use(tool_choice: Option<Value>) -> Value {
    let mut tool_choice = tool_choice.unwrap_or_else(|| json!({"type": "auto"}));
    // `none` allows no tool call at all, and Anthropic accepts no flag on it.
    if let Value::Object(choice) = &mut tool_choice {
        if choice.get("type").and_then(Value::as_str) != Some("none") {
            choice.insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
    }
    tool_choice
}
