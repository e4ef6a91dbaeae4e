//! OpenAI and every OpenAI-compatible provider: requests and responses pass through;
//! only the credential header and non-OpenAI error bodies are reshaped.

use super::{
    bind_keyed, error_kind_for_status, Binding, KeyHeader, Outbound, Provider, TargetFields, Translator,
    UpstreamRequest, Usage,
};
use crate::errors::{error_json, GatewayError};
use crate::request::endpoint::ClientApi;
use crate::stream::sse::{write_data, SseParser};
use crate::stream::Event;
use serde_json::Value;

pub(crate) struct OpenAi;

impl Provider for OpenAi {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        // Only OpenAI's own API is sure to speak Responses; other servers get chat.
        let translator: fn() -> Box<dyn Translator> = match name {
            "openai" => || Box::new(Passthrough::OPENAI),
            _ => || Box::new(Passthrough::COMPATIBLE),
        };
        bind_keyed(name, fields, KeyHeader::Bearer, translator)
    }

    fn answers_as_openai(&self) -> bool {
        true
    }

    fn serves_resources(&self) -> bool {
        true
    }
}

/// A stream whose usage the gateway asked for on the client's behalf
/// (`stream_options.include_usage`): the usage chunk is read and dropped, and the `usage`
/// field every other chunk then carries (`null`) is removed, so the client gets the stream it
/// asked for. Everything else is the inner translator's.
pub(crate) struct UsageStripped {
    inner: Box<dyn Translator>,
    parser: SseParser,
    usage: Option<Usage>,
}

impl UsageStripped {
    pub(crate) fn new(inner: Box<dyn Translator>) -> UsageStripped {
        UsageStripped { inner, parser: SseParser::new(), usage: None }
    }

    fn on_event(&mut self, event: &Event, out: &mut Vec<u8>) {
        if let Some(name) = &event.event {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        // Most chunks never name usage: they pass as they came.
        if !event.data.contains("\"usage\"") {
            return write_data(out, event.data.as_bytes());
        }
        let Ok(Value::Object(mut chunk)) = serde_json::from_str::<Value>(&event.data) else {
            return write_data(out, event.data.as_bytes());
        };
        if let Some(usage) = chunk.remove("usage") {
            if let Some(usage) = Usage::of_openai(&usage) {
                self.usage = Some(usage);
            }
        }
        // The usage chunk itself has no choices.
        if chunk.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty) {
            return;
        }
        write_data(out, Value::Object(chunk).to_string().as_bytes());
    }
}

impl Translator for UsageStripped {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        self.inner.request(outbound)
    }

    /// Streams are rewritten (other answers pass as they are).
    fn translates_responses(&self) -> bool {
        true
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        self.inner.response(body)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        for event in self.parser.push(chunk) {
            self.on_event(&event, out);
        }
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        for event in self.parser.finish() {
            self.on_event(&event, out);
        }
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        self.inner.error(status, headers, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

/// OpenAI's own API: the request goes as it came (re-serialised only when `override_params`
/// changed it), answers and streams pass untouched.
pub(crate) struct Passthrough {
    /// Speaks OpenAI's Responses API too.
    responses: bool,
}

impl Passthrough {
    pub(crate) const OPENAI: Passthrough = Passthrough { responses: true };
    /// A server of OpenAI's chat API (and the other endpoints it serves).
    pub(crate) const COMPATIBLE: Passthrough = Passthrough { responses: false };
}

impl Translator for Passthrough {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let vendor = [("openai-organization", outbound.organization), ("openai-project", outbound.project)];
        let headers = vendor
            .into_iter()
            .chain([("openai-beta", outbound.beta)])
            .filter_map(|(name, value)| value.map(|v| (name, v.to_string())))
            .collect();
        let body = match outbound.body {
            Some(body) if outbound.overridden => Some(body.to_string().into_bytes()),
            _ => None,
        };
        Ok(UpstreamRequest { path: outbound.path.to_string(), query: None, headers, body })
    }

    fn translates_responses(&self) -> bool {
        false
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        Ok(body.to_vec())
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(chunk);
    }

    fn stream_end(&mut self, _out: &mut Vec<u8>) {}

    fn error(&self, status: u16, _headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        normalize_error(status, body)
    }

    /// Answers pass untouched, so the gateway does not read their usage.
    fn usage(&self) -> Option<Usage> {
        None
    }

    fn speaks(&self, api: ClientApi, _model: &str) -> bool {
        api == ClientApi::Responses && self.responses
    }
}

/// Any error body into the OpenAI error object: an `{"error": {...}}` body keeps its fields,
/// an `{"error": "text"}` or `{"message": ...}` body keeps its text, anything else becomes
/// the message (truncated; bodies can be large HTML pages).
pub(crate) fn normalize_error(status: u16, body: &[u8]) -> Vec<u8> {
    normalize_error_of_kind(status, body, None)
}

/// [`normalize_error`] for a provider that sends its error type apart from the body (in a
/// header): `kind` is the type unless the body has its own.
pub(crate) fn normalize_error_of_kind(status: u16, body: &[u8], kind: Option<&str>) -> Vec<u8> {
    let default_kind = kind.unwrap_or(error_kind_for_status(status));
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
                // `Message`: AWS services spell it so in some errors.
                let message = ["message", "Message", "detail"].iter().find_map(|field| text_of(root.get(*field)));
                if let Some(message) = message {
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
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn a_stream_whose_usage_the_gateway_asked_for_reaches_the_client_without_it() {
        let stream = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{}}]}\n\n",
            // One chunk's data on two lines: each goes back as a data line of its own.
            "data: {\"id\":\"c\",\n",
            "data: \"choices\":[]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        for size in [1, 7, stream.len()] {
            let mut translator = UsageStripped::new(Box::new(Passthrough::OPENAI));
            let mut out = Vec::new();
            for chunk in stream.as_bytes().chunks(size) {
                translator.stream(chunk, &mut out);
            }
            translator.stream_end(&mut out);
            let text = String::from_utf8(out).unwrap();
            let events: Vec<&str> = text.split_terminator("\n\n").collect();
            assert_eq!(events.len(), 4, "{text}");
            let first: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(first, serde_json::json!({"id": "c", "choices": [{"delta": {"content": "Hi"}}]}));
            assert_eq!(events[1], "data: {\"id\":\"c\",\"choices\":[{\"delta\":{}}]}", "passed as it came");
            assert_eq!(events[2], "data: {\"id\":\"c\",\ndata: \"choices\":[]}");
            assert_eq!(events[3], "data: [DONE]");
            assert_eq!(
                translator.usage(),
                Some(Usage { prompt_tokens: 5, completion_tokens: 2, ..Default::default() })
            );
        }
    }

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
        let cloud = crate::cloud::CloudFields::default();
        let request = crate::providers::Signable {
            method: "POST",
            authority: "h:443",
            path: "/v1/chat/completions",
            token: None,
            body: b"",
        };
        let public = Some("https://api.openai.com/v1");
        let keyed = TargetFields { api_key: Some("sk"), custom_host: false, built_in: public, cloud: &cloud };
        let keyed = OpenAi.bind("openai", keyed).unwrap();
        assert_eq!(keyed.backend.authorize(&request, &|| 0).unwrap(), vec![("authorization", "Bearer sk".to_string())]);
        let local = OpenAi
            .bind("vllm", TargetFields { api_key: None, custom_host: true, built_in: None, cloud: &cloud })
            .unwrap();
        assert!(local.backend.authorize(&request, &|| 0).unwrap().is_empty());
        let keyless =
            OpenAi.bind("openai", TargetFields { api_key: None, custom_host: false, built_in: public, cloud: &cloud });
        assert_eq!(keyless.err().map(|e| e.status), Some(401));
        let outbound = Outbound {
            endpoint: crate::request::endpoint::Endpoint::Resource,
            path: "/assistants",
            body: None,
            overridden: false,
            strict_vendor_compliance: true,
            now_ms: &|| 0,
            organization: Some("org"),
            project: None,
            beta: Some("assistants=v2"),
            headers: &[],
        };
        let mut openai = Passthrough::OPENAI;
        let request = openai.request(outbound).unwrap();
        assert_eq!(
            request.headers,
            vec![("openai-organization", "org".to_string()), ("openai-beta", "assistants=v2".to_string())]
        );
        assert_eq!((request.path.as_str(), request.body), ("/assistants", None));
    }
}
