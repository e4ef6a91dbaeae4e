//! Errors the gateway itself produces, in the OpenAI error shape so SDKs raise typed errors:
//! `{"error": {"message": "...", "type": "...", "param": "...|null", "code": "...|null"}}`.

use serde_json::{json, Value};
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayError {
    pub status: u16,
    /// OpenAI error `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// With a 405: the methods the resource takes, as its `Allow` header lists them.
    pub allow: Option<String>,
}

impl GatewayError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        GatewayError { status, kind, message: message.into(), param: None, code: None, allow: None }
    }

    /// 405: the request's method is not one of `allowed`, which the answer's `Allow` lists.
    pub fn method_not_allowed(message: impl Into<String>, allowed: &[&str]) -> Self {
        let mut e = Self::new(405, "invalid_request_error", message).with_code("method_not_allowed");
        e.allow = Some(allowed.join(", "));
        e
    }

    /// 400 for a bad request parameter; `param` names the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(400, "invalid_request_error", message);
        e.param = Some(param.into());
        e
    }

    /// 400 for a bad gateway header; the message names the header.
    pub fn invalid_header(header: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(400, "invalid_request_error", format!("invalid header '{header}': {}", message.into()));
        e.param = Some(header.to_string());
        e.code = Some("invalid_header");
        e
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn to_json(&self) -> Vec<u8> {
        error_json(&self.message, self.kind, self.param.as_deref(), self.code)
    }
}

/// The OpenAI error object; the gateway's own errors and reshaped provider errors (whose
/// `type` and `code` are the provider's strings) are both built here.
pub fn error_json(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Vec<u8> {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}}).to_string().into_bytes()
}

/// A refusal: the status and the OpenAI-shaped JSON body to answer with.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedError {
    pub status: u16,
    pub body: Vec<u8>,
}

impl SharedError {
    /// An error in the OpenAI shape; `kind` is its `type` (e.g. `invalid_request_error`).
    pub fn new(status: u16, kind: &str, message: &str, param: Option<&str>, code: Option<&str>) -> SharedError {
        SharedError { status, body: error_json(message, kind, param, code) }
    }

    pub fn from_gateway(e: &GatewayError) -> SharedError {
        SharedError { status: e.status, body: e.to_json() }
    }

    /// The error's `message`.
    pub fn message(&self) -> String {
        self.field("message").unwrap_or_default()
    }

    /// The error's `param`: the field at fault.
    pub fn param(&self) -> Option<String> {
        self.field("param")
    }

    fn field(&self, name: &str) -> Option<String> {
        let body: Value = serde_json::from_slice(&self.body).ok()?;
        body.get("error")?.get(name)?.as_str().map(str::to_string)
    }
}

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedError({}, {})", self.status, String::from_utf8_lossy(&self.body))
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message())
    }
}

impl std::error::Error for SharedError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::Value;

    #[test]
    fn renders_openai_error_shape() {
        let e = GatewayError::invalid_param("temperature", "temperature must be between 0 and 2");
        let v: Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], Value::Null);
        assert_eq!(e.status, 400);
    }
}
