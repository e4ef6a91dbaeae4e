//! Anthropic's Messages API on the wire, for every path that speaks it to a client: its error
//! shape and its server-sent events.

use serde_json::{json, Value};

/// Anthropic's error `type` for an HTTP status (the statuses Anthropic documents; any other
/// 4xx is an invalid request, any other 5xx an API error).
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type": ..., "message": ...}}`.
pub(crate) fn error_body(status: u16, message: &str) -> Vec<u8> {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}}).to_string().into_bytes()
}

/// An error answer in OpenAI's shape (the gateway's own, or a provider's as its translator gave
/// it) in Anthropic's shape, same status. A body that is no OpenAI error keeps its text as the
/// message.
pub(crate) fn error_from_openai(status: u16, body: &[u8]) -> Vec<u8> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message").and_then(Value::as_str).or_else(|| e.as_str()))
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    error_body(status, &message)
}

/// One server-sent event as Anthropic writes them: `event: <type>`, then `data: <JSON>` (one
/// line: `data` holds no line break).
pub(crate) fn write_event(out: &mut Vec<u8>, event: &str, data: &[u8]) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}
