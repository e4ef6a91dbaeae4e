//! A Messages request as an OpenAI chat request, for a provider that does not speak Messages.
//!
//! What chat can express goes across: `system`, the turns with their text, images, tool calls
//! and tool results, `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `stream` (with
//! usage asked for, so the answer can report it), `tools`, `tool_choice`, `metadata.user_id`.
//! Thinking blocks of earlier assistant turns travel as the gateway's `content_blocks` (the
//! providers that take reasoning back read them there). Everything else (`top_k`, `thinking`,
//! `cache_control`, documents, server tools, fields chat has no word for) is dropped and
//! named in [`Translated::dropped`], for the log line the caller writes: never an upstream 400
//! for a field the client was allowed to send. Errors name the field at fault, as Anthropic's
//! own checks would.

use crate::client_api::{chat_call_id, chat_tool_call, Translated};
use crate::errors::GatewayError;
use serde_json::{json, Map, Value};

/// Top-level fields carried by a rule of their own below.
const CARRIED: [&str; 12] = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "stream",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
];

pub(crate) fn to_chat(body: &Map<String, Value>) -> Result<Translated, GatewayError> {
    let mut out = Translated { body: Map::new(), dropped: Vec::new() };
    let model = body.get("model").and_then(Value::as_str).filter(|m| !m.is_empty());
    let model = model.ok_or_else(|| GatewayError::invalid_param("model", "model: a non-empty string is required"))?;
    out.body.insert("model".into(), model.into());
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64).filter(|n| *n >= 1);
    let max_tokens = max_tokens
        .ok_or_else(|| GatewayError::invalid_param("max_tokens", "max_tokens: an integer of at least 1 is required"))?;
    out.body.insert("max_tokens".into(), max_tokens.into());

    let mut messages = Vec::new();
    if let Some(system) = body.get("system") {
        messages.push(json!({"role": "system", "content": system_text(system, &mut out.dropped)?}));
    }
    let turns = match body.get("messages") {
        Some(Value::Array(turns)) => turns,
        _ => return Err(GatewayError::invalid_param("messages", "messages: an array is required")),
    };
    for (i, turn) in turns.iter().enumerate() {
        turn_messages(i, turn, &mut messages, &mut out.dropped)?;
    }
    out.body.insert("messages".into(), Value::Array(messages));

    for name in ["temperature", "top_p"] {
        if let Some(value) = body.get(name) {
            out.body.insert(name.into(), value.clone());
        }
    }
    if let Some(stop) = body.get("stop_sequences") {
        out.body.insert("stop".into(), stop.clone());
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        out.body.insert("stream".into(), true.into());
        out.body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    match body.get("metadata").and_then(Value::as_object) {
        Some(metadata) => {
            for (key, value) in metadata {
                match (key.as_str(), value) {
                    ("user_id", Value::String(user)) => {
                        out.body.insert("user".into(), user.as_str().into());
                    }
                    _ => out.dropped.push(format!("metadata.{key}")),
                }
            }
        }
        None if body.contains_key("metadata") => out.dropped.push("metadata".into()),
        None => {}
    }
    if let Some(tools) = body.get("tools") {
        let tools = function_tools(tools, &mut out.dropped)?;
        if !tools.is_empty() {
            out.body.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = body.get("tool_choice") {
        tool_choice(choice, &mut out)?;
    }
    if body.contains_key("thinking") {
        out.dropped.push("thinking".into());
    }
    out.dropped.extend(body.keys().filter(|k| !CARRIED.contains(&k.as_str())).cloned());
    Ok(out)
}

/// `system` as a string or text blocks; a chat system message's content.
fn system_text(system: &Value, dropped: &mut Vec<String>) -> Result<Value, GatewayError> {
    match system {
        Value::String(text) => Ok(text.as_str().into()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("system[{j}]");
                match block_type(block, &at)? {
                    "text" => parts.push(json!({"type": "text", "text": text_of(block, &at)?})),
                    _ => dropped.push(at.clone()),
                }
                if block.get("cache_control").is_some() {
                    dropped.push(format!("{at}.cache_control"));
                }
            }
            Ok(Value::Array(parts))
        }
        _ => Err(GatewayError::invalid_param("system", "system must be a string or an array of text blocks")),
    }
}

/// The chat messages of Messages turn `i`: a user turn's tool results become `tool` messages
/// (first, as Anthropic requires them first in the turn), then the rest of its content; an
/// assistant turn becomes one assistant message with its text, tool calls and thinking.
fn turn_messages(
    i: usize,
    turn: &Value,
    messages: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), GatewayError> {
    let at = format!("messages[{i}]");
    let role = turn.get("role").and_then(Value::as_str);
    if role == Some("system") {
        // A system turn within the conversation (Claude Code's per-turn control): chat takes
        // system messages anywhere; its per-turn settings have no chat counterpart.
        let content = turn.get("content").unwrap_or(&Value::Null);
        messages.push(json!({"role": "system", "content": system_text(content, dropped)?}));
        let settings = turn.as_object().into_iter().flatten().filter(|(key, _)| *key != "role" && *key != "content");
        dropped.extend(settings.map(|(key, _)| format!("{at}.{key}")));
        return Ok(());
    }
    let blocks = match turn.get("content") {
        Some(Value::String(text)) => {
            let role = role_of(role, &at)?;
            messages.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(GatewayError::invalid_param(
                format!("{at}.content"),
                "content must be a string or an array of blocks",
            ))
        }
    };
    match role_of(role, &at)? {
        "user" => user_turn(&at, blocks, messages, dropped),
        _ => assistant_turn(&at, blocks, messages, dropped),
    }
}

fn role_of<'a>(role: Option<&'a str>, at: &str) -> Result<&'a str, GatewayError> {
    match role {
        Some(role @ ("user" | "assistant")) => Ok(role),
        _ => {
            Err(GatewayError::invalid_param(format!("{at}.role"), "role must be \"user\", \"assistant\" or \"system\""))
        }
    }
}

fn user_turn(
    at: &str,
    blocks: &[Value],
    messages: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), GatewayError> {
    let mut parts = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        note_cache_control(block, &at, dropped);
        match block_type(block, &at)? {
            "text" => parts.push(json!({"type": "text", "text": text_of(block, &at)?})),
            "image" => match image_url(block.get("source")) {
                Some(url) => parts.push(json!({"type": "image_url", "image_url": {"url": url}})),
                None => dropped.push(at),
            },
            "tool_result" => messages.push(tool_message(block, &at, dropped)?),
            _ => dropped.push(at),
        }
    }
    if !parts.is_empty() {
        messages.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

/// A `tool_result` block as a chat `tool` message; its text blocks joined (chat tool results
/// are text), anything else in it dropped.
fn tool_message(block: &Value, at: &str, dropped: &mut Vec<String>) -> Result<Value, GatewayError> {
    let id = block.get("tool_use_id").and_then(Value::as_str);
    let id =
        id.ok_or_else(|| GatewayError::invalid_param(format!("{at}.tool_use_id"), "tool_use_id must be a string"))?;
    let content = match block.get("content") {
        None => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            for (k, part) in parts.iter().enumerate() {
                let at = format!("{at}.content[{k}]");
                match block_type(part, &at)? {
                    "text" => text.push(text_of(part, &at)?),
                    _ => dropped.push(at),
                }
            }
            text.join("\n")
        }
        Some(_) => {
            return Err(GatewayError::invalid_param(
                format!("{at}.content"),
                "content must be a string or an array of blocks",
            ))
        }
    };
    if block.get("is_error").is_some() {
        dropped.push(format!("{at}.is_error"));
    }
    Ok(json!({"role": "tool", "tool_call_id": chat_call_id(id), "content": content}))
}

fn assistant_turn(
    at: &str,
    blocks: &[Value],
    messages: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), GatewayError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut reasoning = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        note_cache_control(block, &at, dropped);
        match block_type(block, &at)? {
            "text" => text.push_str(text_of(block, &at)?),
            "tool_use" => {
                let field = |name: &str| {
                    block.get(name).and_then(Value::as_str).ok_or_else(|| {
                        GatewayError::invalid_param(format!("{at}.{name}"), format!("{name} must be a string"))
                    })
                };
                let arguments = block.get("input").cloned().unwrap_or_else(|| json!({})).to_string();
                calls.push(chat_tool_call(field("id")?, field("name")?, arguments));
            }
            "thinking" => reasoning.push(json!({
                "type": "thinking",
                "thinking": block.get("thinking").cloned().unwrap_or_else(|| "".into()),
                "signature": block.get("signature").cloned().unwrap_or_else(|| "".into()),
            })),
            "redacted_thinking" => reasoning.push(
                json!({"type": "redacted_thinking", "data": block.get("data").cloned().unwrap_or_else(|| "".into())}),
            ),
            _ => dropped.push(at),
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert("content".into(), if text.is_empty() && !calls.is_empty() { Value::Null } else { text.into() });
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    if !reasoning.is_empty() {
        message.insert("content_blocks".into(), Value::Array(reasoning));
    }
    messages.push(Value::Object(message));
    Ok(())
}

/// Client tools (`name`, `description`, `input_schema`) as chat function tools; server tools
/// (a `type` other than `custom`: web search, bash, ...) cannot run at another provider.
fn function_tools(tools: &Value, dropped: &mut Vec<String>) -> Result<Vec<Value>, GatewayError> {
    let tools = tools.as_array().ok_or_else(|| GatewayError::invalid_param("tools", "tools must be an array"))?;
    let mut out = Vec::new();
    for (j, tool) in tools.iter().enumerate() {
        let at = format!("tools[{j}]");
        if !matches!(tool.get("type").and_then(Value::as_str), None | Some("custom")) {
            dropped.push(at);
            continue;
        }
        let name = tool.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| GatewayError::invalid_param(format!("{at}.name"), "name must be a string"))?;
        let mut function = Map::new();
        function.insert("name".into(), name.into());
        if let Some(description) = tool.get("description") {
            function.insert("description".into(), description.clone());
        }
        function.insert(
            "parameters".into(),
            tool.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
        );
        note_cache_control(tool, &at, dropped);
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

fn tool_choice(choice: &Value, out: &mut Translated) -> Result<(), GatewayError> {
    let bad = || GatewayError::invalid_param("tool_choice", "tool_choice.type must be auto, any, tool or none");
    let chat = match choice.get("type").and_then(Value::as_str).ok_or_else(bad)? {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = choice.get("name").and_then(Value::as_str);
            let name = name.ok_or_else(|| GatewayError::invalid_param("tool_choice.name", "name must be a string"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad()),
    };
    // Only a choice that lets the model call tools can restrict it to one call.
    if choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) && chat != json!("none") {
        out.body.insert("parallel_tool_calls".into(), false.into());
    }
    out.body.insert("tool_choice".into(), chat);
    Ok(())
}

/// An image source as a URL chat takes: a `data:` URL for base64 data, or the URL itself.
fn image_url(source: Option<&Value>) -> Option<String> {
    let source = source?;
    match source.get("type").and_then(Value::as_str)? {
        "base64" => {
            let media_type = source.get("media_type").and_then(Value::as_str)?;
            let data = source.get("data").and_then(Value::as_str)?;
            Some(format!("data:{media_type};base64,{data}"))
        }
        "url" => source.get("url").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn block_type<'a>(block: &'a Value, at: &str) -> Result<&'a str, GatewayError> {
    block
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| GatewayError::invalid_param(format!("{at}.type"), "a content block needs a string type"))
}

fn text_of<'a>(block: &'a Value, at: &str) -> Result<&'a str, GatewayError> {
    block
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| GatewayError::invalid_param(format!("{at}.text"), "text must be a string"))
}

fn note_cache_control(block: &Value, at: &str, dropped: &mut Vec<String>) {
    if block.get("cache_control").is_some() {
        dropped.push(format!("{at}.cache_control"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn translate(body: Value) -> Result<Translated, GatewayError> {
        to_chat(body.as_object().unwrap())
    }

    #[test]
    fn a_tool_using_conversation_becomes_chat() {
        let body = json!({
            "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true, "temperature": 0.2, "top_k": 5,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "metadata": {"user_id": "u-1"}, "stop_sequences": ["END"],
            "tools": [{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [
                {"role": "user", "content": "Read a.txt"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "sig-1"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "hello"}]},
                    {"type": "text", "text": "Now summarise."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}
            ]
        });
        let out = translate(body).unwrap();
        assert_eq!(
            Value::Object(out.body),
            json!({
                "model": "claude-sonnet-4-5", "max_tokens": 1024, "temperature": 0.2, "stop": ["END"],
                "stream": true, "stream_options": {"include_usage": true}, "user": "u-1",
                "tools": [{"type": "function", "function": {"name": "read_file", "description": "Reads a file",
                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
                "tool_choice": "required", "parallel_tool_calls": false,
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                    {"role": "user", "content": "Read a.txt"},
                    {"role": "assistant", "content": "Reading.",
                     "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}],
                     "content_blocks": [{"type": "thinking", "thinking": "I should read it.", "signature": "sig-1"}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "hello"},
                    {"role": "user", "content": [{"type": "text", "text": "Now summarise."},
                                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]}
                ]
            })
        );
        assert_eq!(out.dropped, ["system[0].cache_control", "tools[1]", "thinking", "top_k"]);
    }

    #[test]
    fn tool_choices_map_to_chat() {
        let choice = |c: Value| {
            let out = translate(json!({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": c})).unwrap();
            (out.body.get("tool_choice").cloned(), out.body.get("parallel_tool_calls").cloned())
        };
        assert_eq!(choice(json!({"type": "auto"})), (Some(json!("auto")), None));
        assert_eq!(choice(json!({"type": "none", "disable_parallel_tool_use": true})), (Some(json!("none")), None));
        assert_eq!(
            choice(json!({"type": "tool", "name": "f"})),
            (Some(json!({"type": "function", "function": {"name": "f"}})), None)
        );
    }

    #[test]
    fn a_system_turn_within_the_conversation_stays_in_place() {
        let out = translate(json!({"model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "Be brief now."}], "output_config": {"effort": "low"}},
            {"role": "assistant", "content": "ok"}]}))
        .unwrap();
        let roles: Vec<&str> =
            out.body["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "system", "assistant"]);
        assert_eq!(out.body["messages"][1]["content"], json!([{"type": "text", "text": "Be brief now."}]));
        assert_eq!(out.dropped, ["messages[1].output_config"]);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let param = |body: Value| translate(body).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"max_tokens": 1, "messages": []})), "model");
        assert_eq!(param(json!({"model": "m", "messages": []})), "max_tokens");
        assert_eq!(param(json!({"model": "m", "max_tokens": 0, "messages": []})), "max_tokens");
        assert_eq!(param(json!({"model": "m", "max_tokens": 1})), "messages");
        assert_eq!(
            param(json!({"model": "m", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]})),
            "messages[0].role"
        );
        assert_eq!(
            param(json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": 5}]})),
            "messages[0].content"
        );
        assert_eq!(
            param(json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"text": "x"}]}]})),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param(
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})
            ),
            "messages[0].content[0].tool_use_id"
        );
        assert_eq!(
            param(json!({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": {"type": "some"}})),
            "tool_choice"
        );
        assert_eq!(param(json!({"model": "m", "max_tokens": 1, "messages": [], "system": 3})), "system");
    }
}
