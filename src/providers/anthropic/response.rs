//! An Anthropic message as an OpenAI `chat.completion`.

use super::{finish_reason, prompt_tokens, str_field, u64_field, usage_json};
use crate::errors::GatewayError;
use crate::providers::{ResponseContext, Usage};
use serde_json::{json, Map, Value};

fn invalid_response() -> GatewayError {
    GatewayError::new(502, "api_error", "invalid response from provider anthropic")
}

/// The answer and its token counts.
pub(crate) fn convert_response(body: &[u8], ctx: &ResponseContext) -> Result<(Vec<u8>, Usage), GatewayError> {
    let message: Value = serde_json::from_slice(body).map_err(|_| invalid_response())?;
    let blocks = message.get("content").and_then(Value::as_array).ok_or_else(invalid_response)?;

    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    let mut content_blocks = Vec::new();
    for block in blocks {
        match str_field(Some(block), "type") {
            Some("text") => {
                let part = str_field(Some(block), "text").unwrap_or_default();
                text.get_or_insert_with(String::new).push_str(part);
                content_blocks.push(json!({"type": "text", "text": part}));
            }
            Some("thinking") => content_blocks.push(json!({
                "type": "thinking",
                "thinking": str_field(Some(block), "thinking").unwrap_or_default(),
                "signature": str_field(Some(block), "signature").unwrap_or_default(),
            })),
            Some("tool_use") => tool_calls.push(json!({
                "id": str_field(Some(block), "id").unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": str_field(Some(block), "name").unwrap_or_default(),
                    "arguments": block.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                },
            })),
            // redacted_thinking and blocks unknown to OpenAI are kept as they are.
            _ => content_blocks.push(block.clone()),
        }
    }

    let mut reply = Map::new();
    reply.insert("role".into(), "assistant".into());
    reply.insert("content".into(), text.map_or(Value::Null, Value::String));
    if !tool_calls.is_empty() {
        reply.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    if !ctx.strict_vendor_compliance {
        reply.insert("content_blocks".into(), Value::Array(content_blocks));
    }

    let usage = message.get("usage");
    let tokens = Usage { prompt_tokens: prompt_tokens(usage), completion_tokens: u64_field(usage, "output_tokens") };
    let response = json!({
        "id": str_field(Some(&message), "id").unwrap_or_default(),
        "object": "chat.completion",
        "created": ctx.created,
        "model": str_field(Some(&message), "model").unwrap_or(&ctx.model),
        "choices": [{
            "index": 0,
            "message": reply,
            "logprobs": null,
            "finish_reason": finish_reason(str_field(Some(&message), "stop_reason")),
        }],
        "usage": usage_json(tokens.prompt_tokens, tokens.completion_tokens),
    });
    Ok((response.to_string().into_bytes(), tokens))
}
