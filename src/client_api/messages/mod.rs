//! Anthropic's Messages API (`POST /v1/messages`) for the providers that do not speak it: the
//! request becomes an OpenAI chat request ([`request`]), which the provider's translator takes
//! as it takes any chat request; its answer ([`answer`]) and stream ([`stream`]) come back in
//! Messages shapes, and errors in Anthropic's error shape (below), so the Anthropic SDKs and
//! Claude Code read them as they read Anthropic's own.

pub(crate) mod answer;
pub(crate) mod request;
pub(crate) mod stream;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn errors_take_anthropic_shape_with_the_same_status() {
        let openai = br#"{"error": {"message": "max_tokens must be an integer", "type": "invalid_request_error", "param": "max_tokens", "code": null}}"#;
        let body: Value = serde_json::from_slice(&error_from_openai(400, openai)).unwrap();
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens must be an integer"}})
        );
        let cases = [
            (401, "authentication_error"),
            (404, "not_found_error"),
            (429, "rate_limit_error"),
            (418, "invalid_request_error"),
            (502, "api_error"),
            (529, "overloaded_error"),
        ];
        for (status, kind) in cases {
            let body: Value = serde_json::from_slice(&error_from_openai(status, b"upstream said no")).unwrap();
            assert_eq!(
                (body["error"]["type"].as_str(), body["error"]["message"].as_str()),
                (Some(kind), Some("upstream said no"))
            );
        }
    }
}
