//! A `chat.completion` (the translated provider's answer) as a Messages `message`.

use crate::client_api::client_call_id;
use serde_json::{json, Map, Value};

/// Chat's `finish_reason` as Messages' `stop_reason`.
pub(crate) fn stop_reason(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// Chat usage as Messages usage: Anthropic counts cache reads apart from `input_tokens`,
/// OpenAI's `prompt_tokens` include them (`prompt_tokens_details.cached_tokens`).
pub(crate) fn usage(usage: Option<&Value>) -> Value {
    let count = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64).unwrap_or(0);
    let cached =
        usage.and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens")).and_then(Value::as_u64).unwrap_or(0);
    json!({
        "input_tokens": count("prompt_tokens").saturating_sub(cached),
        "output_tokens": count("completion_tokens"),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

/// A tool call's `arguments` (a JSON text) as a `tool_use` block's `input` object; arguments
/// that are no object (a model's broken JSON) are kept as text under `arguments`, not lost.
pub(crate) fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(input)) => Value::Object(input),
        _ => json!({"arguments": arguments}),
    }
}

/// The message of the answer's first choice, in Messages' shape; `model` is the client's when
/// the answer names none.
pub(crate) fn from_chat(chat: &Value, model: &str) -> Value {
    let choice = chat.pointer("/choices/0");
    let message = choice.and_then(|c| c.get("message"));
    let mut content = Vec::new();
    // Reasoning comes first, as Anthropic sends it.
    for block in message.and_then(|m| m.get("content_blocks")).and_then(Value::as_array).into_iter().flatten() {
        if matches!(block.get("type").and_then(Value::as_str), Some("thinking" | "redacted_thinking")) {
            content.push(block.clone());
        }
    }
    let text = message.and_then(|m| m.get("content")).and_then(Value::as_str).unwrap_or_default();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let refusal = message.and_then(|m| m.get("refusal")).and_then(Value::as_str);
    if let Some(refusal) = refusal {
        content.push(json!({"type": "text", "text": refusal}));
    }
    for call in message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).into_iter().flatten() {
        let function = call.get("function");
        let field = |name: &str| function.and_then(|f| f.get(name)).and_then(Value::as_str).unwrap_or_default();
        content.push(json!({
            "type": "tool_use",
            "id": client_call_id(call),
            "name": field("name"),
            "input": tool_input(field("arguments")),
        }));
    }
    let finish = choice.and_then(|c| c.get("finish_reason")).and_then(Value::as_str);
    let mut out = Map::new();
    out.insert("id".into(), chat.get("id").cloned().unwrap_or_else(|| "".into()));
    out.insert("type".into(), "message".into());
    out.insert("role".into(), "assistant".into());
    out.insert("model".into(), chat.get("model").and_then(Value::as_str).unwrap_or(model).into());
    out.insert("content".into(), Value::Array(content));
    let reason = if refusal.is_some() { "refusal" } else { stop_reason(finish) };
    out.insert("stop_reason".into(), reason.into());
    out.insert("stop_sequence".into(), Value::Null);
    out.insert("usage".into(), usage(chat.get("usage")));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn a_chat_answer_with_tool_calls_becomes_a_message() {
        let chat = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.",
                "content_blocks": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Let me look."}],
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}},
                               {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": ""}}]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150, "prompt_tokens_details": {"cached_tokens": 100}}
        });
        assert_eq!(
            from_chat(&chat, "asked"),
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-4o",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "call_2", "name": "noop", "input": {}}
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 20, "output_tokens": 30, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0}
            })
        );
    }

    #[test]
    fn stop_reasons_refusals_and_broken_arguments() {
        assert_eq!(
            [None, Some("stop"), Some("length"), Some("function_call"), Some("content_filter")].map(stop_reason),
            ["end_turn", "end_turn", "max_tokens", "tool_use", "refusal"]
        );
        let refused =
            json!({"choices": [{"finish_reason": "stop", "message": {"content": null, "refusal": "I can't."}}]});
        let message = from_chat(&refused, "m");
        assert_eq!(
            (&message["content"], &message["stop_reason"], &message["model"]),
            (&json!([{"type": "text", "text": "I can't."}]), &json!("refusal"), &json!("m"))
        );
        assert_eq!(tool_input("{\"a\": "), json!({"arguments": "{\"a\": "}));
        assert_eq!(tool_input("[1]"), json!({"arguments": "[1]"}));
    }
}
