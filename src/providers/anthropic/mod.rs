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
// The conversions' shared helpers, for `super::` in the submodules.
use super::{chat_only, Outbound, Provider, ResponseContext, Translator, UpstreamRequest, Usage};
use super::{str_field, u64_field};
use crate::errors::GatewayError;
use serde_json::Value;

pub(crate) struct Anthropic;

const API_VERSION: &str = "2023-06-01";

impl Provider for Anthropic {
    fn translator(&self) -> Box<dyn Translator> {
        Box::new(Messages::default())
    }

    fn authorize(
        &self,
        api_key: Option<&str>,
        _request: &UpstreamRequest,
        _now_ms: &dyn Fn() -> u64,
    ) -> Result<Vec<(&'static str, String)>, GatewayError> {
        Ok(api_key.map(|key| ("x-api-key", key.to_string())).into_iter().collect())
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
        self.ctx.clone().unwrap_or_default()
    }

    /// The stream converter, made at the first chunk (not copied per chunk).
    fn sse(&mut self) -> &mut SseStream {
        let ctx = &self.ctx;
        self.stream.get_or_insert_with(|| SseStream::new(ctx.clone().unwrap_or_default()))
    }
}

impl Translator for Messages {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let (body, ctx) = chat_only("anthropic", outbound)?;
        self.ctx = Some(ctx);
        // `thinking` under strict_vendor_compliance is rejected by the pipeline before this call.
        let body = convert_request(body)?;
        // The version header goes even without a key (a local server behind custom_host).
        let headers = vec![("anthropic-version", API_VERSION.to_string())];
        Ok(UpstreamRequest { path: "/messages".to_string(), headers, body: Some(body.to_string().into_bytes()) })
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
