//! A Gemini `GenerateContentResponse` as an OpenAI `chat.completion`.

use super::{finish_reason, tool_call, usage_of};
use crate::errors::GatewayError;
use crate::providers::{str_field, u64_field, usage_json, ResponseContext, Usage};
use serde_json::{json, Map, Value};

/// The answer and its token counts. `provider` names the provider in errors.
pub(crate) fn convert_response(
    body: &[u8],
    ctx: &ResponseContext,
    provider: &str,
) -> Result<(Vec<u8>, Usage), GatewayError> {
    let invalid = || GatewayError::new(502, "api_error", format!("invalid response from provider {provider}"));
    let answer: Value = serde_json::from_slice(body).map_err(|_| invalid())?;
    if !answer.is_object() {
        return Err(invalid());
    }
    let candidates = answer.get("candidates").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut choices: Vec<Value> = candidates.iter().enumerate().map(|(i, c)| choice(c, i)).collect();
    // A prompt Gemini blocked has no candidates; OpenAI's shape has a choice that says so.
    if choices.is_empty() {
        choices.push(json!({
            "index": 0,
            "message": {"role": "assistant", "content": null},
            "logprobs": null,
            "finish_reason": match str_field(answer.get("promptFeedback"), "blockReason") {
                Some(_) => "content_filter",
                None => "stop",
            },
        }));
    }
    let metadata = answer.get("usageMetadata");
    let tokens = usage_of(metadata);
    let mut usage = usage_json(tokens);
    let thoughts = u64_field(metadata, "thoughtsTokenCount");
    if let (true, Value::Object(usage)) = (thoughts > 0, &mut usage) {
        usage.insert("completion_tokens_details".into(), json!({"reasoning_tokens": thoughts}));
    }
    let response = json!({
        "id": str_field(Some(&answer), "responseId").unwrap_or_default(),
        "object": "chat.completion",
        "created": ctx.created,
        "model": str_field(Some(&answer), "modelVersion").unwrap_or(&ctx.model),
        "choices": choices,
        "usage": usage,
    });
    Ok((response.to_string().into_bytes(), tokens))
}

/// One candidate as one choice: its text parts joined (thoughts left out), its function
/// calls as tool calls.
fn choice(candidate: &Value, position: usize) -> Value {
    let parts = candidate.get("content").and_then(|c| c.get("parts")).and_then(Value::as_array);
    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    for part in parts.map(Vec::as_slice).unwrap_or_default() {
        if part.get("functionCall").is_some() {
            tool_calls.push(tool_call(part, tool_calls.len()));
        } else if let Some(part_text) = str_field(Some(part), "text") {
            if part.get("thought") != Some(&Value::Bool(true)) {
                text.get_or_insert_with(String::new).push_str(part_text);
            }
        }
    }
    let reason = finish_reason(str_field(Some(candidate), "finishReason"), !tool_calls.is_empty());
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert("content".into(), text.map_or(Value::Null, Value::String));
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    json!({
        "index": candidate.get("index").and_then(Value::as_u64).unwrap_or(position as u64),
        "message": message,
        "logprobs": null,
        "finish_reason": reason,
    })
}
