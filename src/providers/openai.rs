//! OpenAI and every OpenAI-compatible provider: requests and responses pass through;
//! only the credential header and non-OpenAI error bodies are reshaped.

use super::{error_kind_for_status, Endpoint, ResponseContext, StreamTranslator, Translator};
use crate::errors::{error_json, GatewayError};
use serde_json::Value;

pub(crate) struct OpenAi;

impl Translator for OpenAi {
    fn upstream_path(&self, _endpoint: Endpoint, openai_path: &str) -> Result<String, GatewayError> {
        Ok(openai_path.to_string())
    }

    fn auth_headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)> {
        api_key.map(|key| ("authorization", format!("Bearer {key}"))).into_iter().collect()
    }

    fn vendor_headers(
        &self,
        organization: Option<&str>,
        project: Option<&str>,
        beta: Option<&str>,
    ) -> Vec<(&'static str, String)> {
        [("openai-organization", organization), ("openai-project", project), ("openai-beta", beta)]
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| (name, v.to_string())))
            .collect()
    }

    fn chat_request(&self, body: Value, _strict_vendor_compliance: bool) -> Result<Value, GatewayError> {
        Ok(body)
    }

    fn translates_responses(&self) -> bool {
        false
    }

    fn chat_response(&self, body: &[u8], _ctx: &ResponseContext) -> Result<Vec<u8>, GatewayError> {
        Ok(body.to_vec())
    }

    fn chat_stream(&self, _ctx: ResponseContext) -> Box<dyn StreamTranslator> {
        Box::new(Unchanged)
    }

    fn error_body(&self, status: u16, body: &[u8]) -> Vec<u8> {
        normalize_error(status, body)
    }
}

struct Unchanged;

impl StreamTranslator for Unchanged {
    fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(chunk);
    }
    fn finish(&mut self, _out: &mut Vec<u8>) {}
}

/// Any error body into the OpenAI error object: an `{"error": {...}}` body keeps its fields,
/// an `{"error": "text"}` or `{"message": ...}` body keeps its text, anything else becomes
/// the message (truncated; bodies can be large HTML pages).
pub(crate) fn normalize_error(status: u16, body: &[u8]) -> Vec<u8> {
    let default_kind = error_kind_for_status(status);
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(Value::Object(root)) = &parsed {
        let text_of = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        match root.get("error") {
            Some(Value::Object(err)) => {
                let message = text_of(err.get("message")).unwrap_or_else(|| Value::Object(err.clone()).to_string());
                let kind = text_of(err.get("type")).unwrap_or_else(|| default_kind.to_string());
                let param = text_of(err.get("param"));
                let code = err.get("code").and_then(|c| match c {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                });
                return error_json(&message, &kind, param.as_deref(), code.as_deref());
            }
            Some(Value::String(message)) => return error_json(message, default_kind, None, None),
            _ => {
                if let Some(message) = text_of(root.get("message")).or_else(|| text_of(root.get("detail"))) {
                    return error_json(&message, default_kind, None, None);
                }
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message =
        if text.is_empty() { format!("provider returned status {status}") } else { text.chars().take(1000).collect() };
    error_json(&message, default_kind, None, None)
}

#[cfg(test)]
mod tests {
    // The same tests run inside wasm (32-bit) under wasm-bindgen-test.
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn error_of(status: u16, body: &str) -> Value {
        serde_json::from_slice(&normalize_error(status, body.as_bytes())).unwrap()
    }

    #[test]
    fn keeps_openai_errors() {
        let v = error_of(
            400,
            r#"{"error":{"message":"bad","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#,
        );
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
    }

    #[test]
    fn reshapes_other_errors() {
        let v = error_of(429, r#"{"error":"slow down"}"#);
        assert_eq!(v["error"]["message"], "slow down");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        let v = error_of(500, r#"{"detail":"boom"}"#);
        assert_eq!(v["error"]["message"], "boom");
        let v = error_of(502, "<html>bad gateway</html>");
        assert_eq!(v["error"]["message"], "<html>bad gateway</html>");
        assert_eq!(v["error"]["type"], "api_error");
        let v = error_of(503, "");
        assert_eq!(v["error"]["message"], "provider returned status 503");
        assert_eq!(v["error"]["code"], Value::Null);
    }

    #[test]
    fn credential_and_vendor_headers() {
        assert_eq!(OpenAi.auth_headers(Some("sk")), vec![("authorization", "Bearer sk".to_string())]);
        assert!(OpenAi.auth_headers(None).is_empty());
        assert_eq!(
            OpenAi.vendor_headers(Some("org"), None, Some("assistants=v2")),
            vec![("openai-organization", "org".to_string()), ("openai-beta", "assistants=v2".to_string())]
        );
    }
}
