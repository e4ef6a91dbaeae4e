//! Anthropic Messages API: OpenAI chat requests become `/v1/messages` requests; Anthropic
//! messages, streams and errors come back in OpenAI's shapes. The conversions live apart
//! (`request`, `response`, `stream`) so other transports of Anthropic's models can reuse them.

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use request::convert_request;
pub(crate) use response::convert_response;
pub(crate) use stream::SseStream;

use super::openai::normalize_error;
use super::{
    bind_keyed, Binding, KeyHeader, Outbound, Provider, ResponseContext, TargetFields, Translator, UpstreamRequest,
    Usage,
};
use crate::errors::GatewayError;
use crate::request::chat;
use crate::request::endpoint::Endpoint;
use serde_json::{json, Value};

pub(crate) struct Anthropic;

const API_VERSION: &str = "2023-06-01";

impl Provider for Anthropic {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        bind_keyed(name, fields, KeyHeader::Named("x-api-key"), || Box::<Messages>::default())
    }
}

/// One chat completion through the Messages API.
#[derive(Default)]
struct Messages {
    /// What the answer needs of the request; set by `request`.
    ctx: Option<ResponseContext>,
    stream: Option<SseStream>,
    usage: Option<Usage>,
}

impl Messages {
    fn ctx(&self) -> ResponseContext {
        context_or_default(&self.ctx)
    }

    /// The stream converter, made at the first chunk (not copied per chunk).
    fn sse(&mut self) -> &mut SseStream {
        let ctx = &self.ctx;
        self.stream.get_or_insert_with(|| SseStream::new(context_or_default(ctx)))
    }
}

fn context_or_default(ctx: &Option<ResponseContext>) -> ResponseContext {
    ctx.clone().unwrap_or_else(|| ResponseContext {
        model: String::new(),
        created: 0,
        include_usage: false,
        strict_vendor_compliance: true,
    })
}

impl Translator for Messages {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let body = match (outbound.endpoint, outbound.body) {
            (Endpoint::ChatCompletions, Some(body)) => body.into_owned(),
            _ => {
                return Err(GatewayError::new(
                    400,
                    "invalid_request_error",
                    format!("provider 'anthropic' does not support /v1{}", outbound.path),
                )
                .with_code("unsupported_endpoint"))
            }
        };
        self.ctx = Some(ResponseContext {
            model: body.get("model").and_then(Value::as_str).unwrap_or_default().to_string(),
            created: (outbound.now_ms)() / 1000,
            include_usage: chat::include_usage(body.get("stream_options")),
            strict_vendor_compliance: outbound.strict_vendor_compliance,
        });
        // `thinking` under strict_vendor_compliance is rejected by the pipeline before this call.
        let body = convert_request(body)?;
        // The version header goes even without a key (a local server behind custom_host).
        let headers = vec![("anthropic-version", API_VERSION.to_string())];
        Ok(UpstreamRequest {
            path: "/messages".to_string(),
            query: None,
            headers,
            body: Some(body.to_string().into_bytes()),
        })
    }

    fn translates_responses(&self) -> bool {
        true
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        let (answer, usage) = convert_response(body, &self.ctx())?;
        self.usage = Some(usage);
        Ok(answer)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.sse().push(chunk, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        let stream = self.sse();
        stream.finish(out);
        self.usage = Some(stream.usage());
    }

    // Anthropic's `{"type":"error","error":{"type","message"}}` has the `error.type` and
    // `error.message` of OpenAI's shape, so the generic reshaping covers it.
    fn error(&self, status: u16, _headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        normalize_error(status, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the conversions

pub(super) fn str_field<'a>(value: Option<&'a Value>, field: &str) -> Option<&'a str> {
    value.and_then(|v| v.get(field)).and_then(Value::as_str)
}

pub(super) fn u64_field(value: Option<&Value>, field: &str) -> u64 {
    value.and_then(|v| v.get(field)).and_then(Value::as_u64).unwrap_or(0)
}

/// Anthropic's `stop_reason` as an OpenAI `finish_reason`.
pub(super) fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        // end_turn, stop_sequence, pause_turn, unknown or missing.
        _ => "stop",
    }
}

/// OpenAI counts cached prompt tokens as prompt tokens; Anthropic reports them apart.
pub(super) fn prompt_tokens(usage: Option<&Value>) -> u64 {
    u64_field(usage, "input_tokens")
        .saturating_add(u64_field(usage, "cache_read_input_tokens"))
        .saturating_add(u64_field(usage, "cache_creation_input_tokens"))
}

pub(super) fn usage_json(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens.saturating_add(completion_tokens),
    })
}
