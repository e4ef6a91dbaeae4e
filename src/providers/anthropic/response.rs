//! An Anthropic message as an OpenAI `chat.completion`.

use super::{finish_reason, str_field};
use crate::errors::GatewayError;
use crate::providers::{Reply, ResponseContext, Usage};
use serde_json::{json, Value};

fn invalid_response() -> GatewayError {
    GatewayError::new(502, "api_error", "invalid response from provider anthropic")
}

/// The answer and its token counts.
pub(crate) fn convert_response(body: &[u8], ctx: &ResponseContext) -> Result<(Vec<u8>, Usage), GatewayError> {
    let message: Value = serde_json::from_slice(body).map_err(|_| invalid_response())?;
    let blocks = message.get("content").and_then(Value::as_array).ok_or_else(invalid_response)?;

    let mut reply = Reply::default();
    for block in blocks {
        match str_field(Some(block), "type") {
            Some("text") => reply.text(str_field(Some(block), "text").unwrap_or_default()),
            Some("thinking") => reply.content_blocks.push(json!({
                "type": "thinking",
                "thinking": str_field(Some(block), "thinking").unwrap_or_default(),
                "signature": str_field(Some(block), "signature").unwrap_or_default(),
            })),
            Some("tool_use") => reply.tool_call(
                str_field(Some(block), "id").unwrap_or_default(),
                str_field(Some(block), "name").unwrap_or_default(),
                block.get("input"),
            ),
            // redacted_thinking and blocks unknown to OpenAI are kept as they are.
            _ => reply.content_blocks.push(block.clone()),
        }
    }

    // Cache reads and writes are prompt tokens, as OpenAI counts them.
    let tokens = message.get("usage").and_then(Usage::of_openai).unwrap_or_default();
    let id = str_field(Some(&message), "id").unwrap_or_default();
    let model = str_field(Some(&message), "model").unwrap_or(&ctx.model);
    let reason = finish_reason(str_field(Some(&message), "stop_reason"));
    Ok((reply.completion(id, model, ctx, reason, tokens), tokens))
}
