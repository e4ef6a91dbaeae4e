//! A Converse answer as an OpenAI `chat.completion`.

use super::{finish_reason, tokens};
use crate::errors::GatewayError;
use crate::providers::{str_field, Reply, ResponseContext, Usage};
use serde_json::{json, Value};

fn invalid_response() -> GatewayError {
    GatewayError::new(502, "api_error", "invalid response from provider bedrock")
}

/// The answer and its token counts. Converse answers carry no id: `id` is the gateway's.
pub(crate) fn convert_response(body: &[u8], ctx: &ResponseContext, id: &str) -> Result<(Vec<u8>, Usage), GatewayError> {
    let answer: Value = serde_json::from_slice(body).map_err(|_| invalid_response())?;
    let blocks = answer
        .get("output")
        .and_then(|o| o.get("message"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .ok_or_else(invalid_response)?;

    let mut reply = Reply::default();
    for block in blocks {
        if let Some(part) = str_field(Some(block), "text") {
            reply.text(part);
        } else if let Some(tool_use) = block.get("toolUse") {
            reply.tool_call(
                str_field(Some(tool_use), "toolUseId").unwrap_or_default(),
                str_field(Some(tool_use), "name").unwrap_or_default(),
                tool_use.get("input"),
            );
        } else if let Some(reasoning) = block.get("reasoningContent").and_then(|r| r.get("reasoningText")) {
            reply.content_blocks.push(json!({
                "type": "thinking",
                "thinking": str_field(Some(reasoning), "text").unwrap_or_default(),
                "signature": str_field(Some(reasoning), "signature").unwrap_or_default(),
            }));
        } else {
            // Blocks unknown to OpenAI (redacted reasoning, ...) are kept as they are.
            reply.content_blocks.push(block.clone());
        }
    }
    let usage = tokens(answer.get("usage"));
    let reason = finish_reason(str_field(Some(&answer), "stopReason"));
    Ok((reply.completion(id, &ctx.model, ctx, reason, usage), usage))
}
