//! Anthropic's Messages API (`POST /v1/messages`) for the providers that do not speak it: the
//! request becomes an OpenAI chat request ([`request`]), which the provider's translator takes
//! as it takes any chat request; its answer ([`answer`]) and stream ([`stream`]) come back in
//! Messages shapes, and errors in Anthropic's error shape (below), so the Anthropic SDKs and
//! Claude Code read them as they read Anthropic's own.

pub(crate) mod answer;
pub(crate) mod replay;
pub(crate) mod request;
pub(crate) mod stream;

#[cfg(test)]
mod tests {
    use crate::providers::anthropic::error_from_openai;
    use crate::unit_tests::test;
    use serde_json::{json, Value};

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
