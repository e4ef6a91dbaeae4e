//! A Responses request as an OpenAI chat request, for a provider that does not speak Responses.
//!
//! What chat can express goes across: `instructions`, the input items (messages with their
//! text and images, `function_call`, `function_call_output`, and `reasoning` items, which
//! travel as the gateway's `content_blocks` thinking on the next assistant message, their
//! `encrypted_content` as its signature), function `tools`, `tool_choice`,
//! `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, `stream` (with usage
//! asked for), `text.format`, `user`. The gateway itself answers for `store`,
//! `previous_response_id` and `metadata`. Everything else (hosted tools such as `web_search`,
//! custom and namespace tools, `include`, `reasoning`, `truncation`, fields chat has no word
//! for) is dropped and named in [`Translated::dropped`] for the caller's log line.

use crate::client_api::{chat_call_id, chat_tool_call, Translated};
use crate::errors::GatewayError;
use serde_json::{json, Map, Value};

/// Fields the gateway answers for itself rather than the provider.
const GATEWAY_FIELDS: [&str; 3] = ["store", "previous_response_id", "metadata"];

/// Fields carried by a rule of their own below.
const CARRIED: [&str; 11] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "stream",
    "text",
];

/// The request's `input` as items: a string is one user message.
pub(crate) fn input_items(request: &Map<String, Value>) -> Vec<Value> {
    match request.get("input") {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::String(text)) => vec![json!({"type": "message", "role": "user", "content": text})],
        _ => Vec::new(),
    }
}

/// A request that continues a kept response: the conversation so far (`earlier`: the kept
/// input items then the kept response's output items) put before the request's own input, and
/// `previous_response_id` removed (no provider knows the gateway's ids).
pub(crate) fn continued(request: &mut Map<String, Value>, earlier: &Value) {
    let mut items: Vec<Value> = earlier.get("input").and_then(Value::as_array).cloned().unwrap_or_default();
    let output = earlier.pointer("/response/output").and_then(Value::as_array);
    items.extend(output.into_iter().flatten().cloned());
    items.extend(input_items(request));
    request.insert("input".into(), Value::Array(items));
    request.remove("previous_response_id");
}

pub(crate) fn to_chat(body: &Map<String, Value>) -> Result<Translated, GatewayError> {
    let mut out = Translated { body: Map::new(), dropped: Vec::new() };
    let model = body.get("model").and_then(Value::as_str).filter(|m| !m.is_empty());
    let model = model.ok_or_else(|| GatewayError::invalid_param("model", "model: a non-empty string is required"))?;
    out.body.insert("model".into(), model.into());

    let mut messages = Vec::new();
    match body.get("instructions") {
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        None | Some(Value::Null) => {}
        Some(_) => return Err(GatewayError::invalid_param("instructions", "instructions must be a string")),
    }
    match body.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            let mut turns = Turns { messages, reasoning: Vec::new() };
            for (i, item) in items.iter().enumerate() {
                turns.item(i, item, &mut out.dropped)?;
            }
            messages = turns.messages;
        }
        _ => return Err(GatewayError::invalid_param("input", "input: a string or an array of items is required")),
    }
    out.body.insert("messages".into(), Value::Array(messages));

    for name in ["temperature", "top_p", "parallel_tool_calls", "user"] {
        if let Some(value) = body.get(name).filter(|v| !v.is_null()) {
            out.body.insert(name.into(), value.clone());
        }
    }
    if let Some(max) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        out.body.insert("max_tokens".into(), max.clone());
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        out.body.insert("stream".into(), true.into());
        out.body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let tools = function_tools(tools, &mut out.dropped)?;
        if !tools.is_empty() {
            out.body.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        match tool_choice(choice) {
            Some(choice) => {
                out.body.insert("tool_choice".into(), choice);
            }
            None => out.dropped.push("tool_choice".into()),
        }
    }
    if let Some(text) = body.get("text").filter(|v| !v.is_null()) {
        text_format(text, &mut out)?;
    }
    let known = |k: &str| CARRIED.contains(&k) || GATEWAY_FIELDS.contains(&k) || k == "user";
    out.dropped.extend(body.keys().filter(|k| !known(k)).cloned());
    Ok(out)
}

/// The chat messages made so far, and reasoning waiting for the assistant message it precedes.
struct Turns {
    messages: Vec<Value>,
    reasoning: Vec<Value>,
}

impl Turns {
    fn item(&mut self, i: usize, item: &Value, dropped: &mut Vec<String>) -> Result<(), GatewayError> {
        let at = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        // A message may leave out its type.
        match kind.or_else(|| item.get("role").map(|_| "message")) {
            Some("message") => self.message(&at, item, dropped),
            Some("function_call") => {
                let field = |name: &str| string_field(item, &at, name);
                let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let call = chat_tool_call(field("call_id")?, field("name")?, arguments.to_string());
                self.with_assistant(|message| match message.entry("tool_calls").or_insert_with(|| json!([])) {
                    Value::Array(calls) => calls.push(call),
                    other => *other = json!([call]),
                });
                Ok(())
            }
            Some("function_call_output") => {
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(Value::Array(parts)) => parts_text(parts, &format!("{at}.output"), dropped),
                    _ => {
                        return Err(GatewayError::invalid_param(
                            format!("{at}.output"),
                            "output must be a string or an array of parts",
                        ))
                    }
                };
                self.messages.push(
                    json!({"role": "tool", "tool_call_id": chat_call_id(string_field(item, &at, "call_id")?), "content": output}),
                );
                Ok(())
            }
            Some("reasoning") => {
                // Only the gateway's sealed thinking goes back (signed, as the provider gave it);
                // another provider's encrypted reasoning is of no use to this one.
                let sealed = item.get("encrypted_content").and_then(Value::as_str).and_then(super::unseal);
                match sealed {
                    Some((thinking, signature)) => {
                        self.reasoning.push(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
                    }
                    None => dropped.push(at),
                }
                Ok(())
            }
            Some(_) => {
                dropped.push(at);
                Ok(())
            }
            None => Err(GatewayError::invalid_param(format!("{at}.type"), "an input item needs a type")),
        }
    }

    fn message(&mut self, at: &str, item: &Value, dropped: &mut Vec<String>) -> Result<(), GatewayError> {
        let role = match item.get("role").and_then(Value::as_str) {
            Some(role @ ("user" | "assistant" | "system")) => role,
            Some("developer") => "system",
            _ => {
                return Err(GatewayError::invalid_param(
                    format!("{at}.role"),
                    "role must be user, assistant, system or developer",
                ))
            }
        };
        let content = match item.get("content") {
            Some(Value::String(text)) => Value::String(text.clone()),
            Some(Value::Array(parts)) if role == "assistant" => {
                parts_text(parts, &format!("{at}.content"), dropped).into()
            }
            Some(Value::Array(parts)) => Value::Array(input_parts(parts, &format!("{at}.content"), dropped)),
            _ => {
                return Err(GatewayError::invalid_param(
                    format!("{at}.content"),
                    "content must be a string or an array of parts",
                ))
            }
        };
        if role == "assistant" {
            let added = content.as_str().unwrap_or_default();
            self.with_assistant(|message| {
                let text = message.get("content").and_then(Value::as_str).unwrap_or_default();
                let text = format!("{text}{added}");
                message.insert("content".into(), text.into());
            });
        } else {
            self.messages.push(json!({"role": role, "content": content}));
        }
        Ok(())
    }

    /// Runs `change` on the assistant message the next assistant part joins: the last message
    /// when it is an assistant's and no reasoning waits, else a new one carrying that reasoning.
    fn with_assistant(&mut self, change: impl FnOnce(&mut Map<String, Value>)) {
        let joinable = self.reasoning.is_empty()
            && self.messages.last().is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
        if !joinable {
            let mut message = Map::new();
            message.insert("role".into(), "assistant".into());
            message.insert("content".into(), Value::Null);
            if !self.reasoning.is_empty() {
                message.insert("content_blocks".into(), Value::Array(std::mem::take(&mut self.reasoning)));
            }
            self.messages.push(Value::Object(message));
        }
        if let Some(Value::Object(message)) = self.messages.last_mut() {
            change(message);
        }
    }
}

/// User content parts as chat parts: text, and images given by URL.
fn input_parts(parts: &[Value], at: &str, dropped: &mut Vec<String>) -> Vec<Value> {
    let mut out = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    out.push(json!({"type": "text", "text": text}));
                }
            }
            Some("input_image") => match part.get("image_url").and_then(Value::as_str) {
                Some(url) => {
                    let mut image = Map::new();
                    image.insert("url".into(), url.into());
                    if let Some(detail) = part.get("detail").filter(|d| d.is_string()) {
                        image.insert("detail".into(), detail.clone());
                    }
                    out.push(json!({"type": "image_url", "image_url": image}));
                }
                None => dropped.push(format!("{at}[{j}]")),
            },
            _ => dropped.push(format!("{at}[{j}]")),
        }
    }
    out
}

/// The text of parts (`input_text`, `output_text`, `refusal`), joined; other parts dropped.
fn parts_text(parts: &[Value], at: &str, dropped: &mut Vec<String>) -> String {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let field = match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            _ => {
                dropped.push(format!("{at}[{j}]"));
                continue;
            }
        };
        text.push_str(part.get(field).and_then(Value::as_str).unwrap_or_default());
    }
    text
}

fn string_field<'a>(item: &'a Value, at: &str, name: &str) -> Result<&'a str, GatewayError> {
    item.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| GatewayError::invalid_param(format!("{at}.{name}"), format!("{name} must be a string")))
}

/// Function tools as chat tools; hosted, custom and namespace tools cannot run elsewhere.
fn function_tools(tools: &Value, dropped: &mut Vec<String>) -> Result<Vec<Value>, GatewayError> {
    let tools = tools.as_array().ok_or_else(|| GatewayError::invalid_param("tools", "tools must be an array"))?;
    let mut out = Vec::new();
    for (j, tool) in tools.iter().enumerate() {
        let at = format!("tools[{j}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            dropped.push(at);
            continue;
        }
        let mut function = Map::new();
        function.insert("name".into(), string_field(tool, &at, "name")?.into());
        for name in ["description", "parameters", "strict"] {
            if let Some(value) = tool.get(name).filter(|v| !v.is_null()) {
                function.insert(name.into(), value.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `tool_choice` in chat's form; `None` for a choice of a hosted tool.
fn tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(mode) if matches!(mode.as_str(), "auto" | "none" | "required") => Some(choice.clone()),
        Value::Object(object) if object.get("type").and_then(Value::as_str) == Some("function") => {
            let name = object.get("name").and_then(Value::as_str)?;
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        _ => None,
    }
}

/// `text.format` as chat's `response_format`; `text.verbosity` and the like are dropped.
fn text_format(text: &Value, out: &mut Translated) -> Result<(), GatewayError> {
    let Some(text) = text.as_object() else {
        return Err(GatewayError::invalid_param("text", "text must be an object"));
    };
    for key in text.keys().filter(|k| *k != "format") {
        out.dropped.push(format!("text.{key}"));
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    let format_type = format.get("type").and_then(Value::as_str);
    let response_format = match format_type {
        Some("text") => return Ok(()),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let mut schema = Map::new();
            for name in ["name", "description", "schema", "strict"] {
                if let Some(value) = format.get(name).filter(|v| !v.is_null()) {
                    schema.insert(name.into(), value.clone());
                }
            }
            json!({"type": "json_schema", "json_schema": schema})
        }
        _ => {
            return Err(GatewayError::invalid_param(
                "text.format.type",
                "text.format.type must be text, json_object or json_schema",
            ))
        }
    };
    out.body.insert("response_format".into(), response_format);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn translate(body: Value) -> Result<Translated, GatewayError> {
        to_chat(body.as_object().unwrap())
    }

    #[test]
    fn a_kept_conversation_goes_before_the_input() {
        let earlier = json!({"input": [{"type": "message", "role": "user", "content": "Capital of France?"}],
            "response": {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]}]}});
        let mut request = json!({"model": "m", "input": "And its population?", "previous_response_id": "resp_gw_1"});
        let request = request.as_object_mut().unwrap();
        continued(request, &earlier);
        assert_eq!(request.get("previous_response_id"), None);
        let roles: Vec<&str> =
            request["input"].as_array().unwrap().iter().map(|i| i["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(input_items(request).len(), 3);
        assert_eq!(input_items(&Map::new()), Vec::<Value>::new());
    }

    #[test]
    fn a_codex_turn_becomes_chat() {
        let body = json!({
            "model": "gpt-5-codex", "instructions": "You are a coding agent.", "stream": true, "store": false,
            "parallel_tool_calls": false, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium"},
            "max_output_tokens": 500, "prompt_cache_key": "k",
            "tools": [{"type": "function", "name": "shell", "description": "Runs a command", "strict": false,
                       "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
                      {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}],
            "tool_choice": "auto",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files"},
                                                               {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use ls."}], "encrypted_content": crate::client_api::responses::seal("Use ls.", "sig-1")},
                {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "One file."}]},
                {"role": "user", "content": "Thanks"},
                {"type": "web_search_call", "id": "ws_1"}
            ]
        });
        let out = translate(body).unwrap();
        assert_eq!(
            Value::Object(out.body),
            json!({
                "model": "gpt-5-codex", "parallel_tool_calls": false, "max_tokens": 500,
                "stream": true, "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {"name": "shell", "description": "Runs a command", "strict": false,
                           "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}}],
                "tool_choice": "auto",
                "messages": [
                    {"role": "system", "content": "You are a coding agent."},
                    {"role": "system", "content": [{"type": "text", "text": "Sandbox: none."}]},
                    {"role": "user", "content": [{"type": "text", "text": "List files"},
                                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}}]},
                    {"role": "assistant", "content": null,
                     "content_blocks": [{"type": "thinking", "thinking": "Use ls.", "signature": "sig-1"}],
                     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                    {"role": "assistant", "content": "One file."},
                    {"role": "user", "content": "Thanks"}
                ]
            })
        );
        assert_eq!(out.dropped, ["input[7]", "tools[1]", "tools[2]", "include", "prompt_cache_key", "reasoning"]);
    }

    #[test]
    fn formats_choices_and_errors() {
        let out = translate(json!({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
                                   "tool_choice": {"type": "function", "name": "f"}}))
        .unwrap();
        assert_eq!(
            out.body["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(out.body["tool_choice"], json!({"type": "function", "function": {"name": "f"}}));
        assert_eq!(out.dropped, ["text.verbosity"]);
        let hosted = translate(json!({"model": "m", "input": "hi", "tool_choice": {"type": "web_search"}})).unwrap();
        assert_eq!((hosted.body.get("tool_choice"), hosted.dropped), (None, vec!["tool_choice".to_string()]));

        let param = |body: Value| translate(body).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"input": "hi"})), "model");
        assert_eq!(param(json!({"model": "m"})), "input");
        assert_eq!(param(json!({"model": "m", "input": [{"content": "x"}]})), "input[0].type");
        assert_eq!(param(json!({"model": "m", "input": [{"role": "tool", "content": "x"}]})), "input[0].role");
        assert_eq!(param(json!({"model": "m", "input": [{"type": "function_call", "name": "f"}]})), "input[0].call_id");
        assert_eq!(
            param(json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]})),
            "input[0].output"
        );
        assert_eq!(param(json!({"model": "m", "input": "x", "text": {"format": {"type": "xml"}}})), "text.format.type");
        assert_eq!(param(json!({"model": "m", "input": "x", "instructions": 1})), "instructions");
    }
}
