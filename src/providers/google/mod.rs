//! Google's Gemini models, through the Gemini API (`google`, an API key) or Vertex AI
//! (`vertex-ai`, cloud B, a project and a region), and Anthropic's models on Vertex AI.
//! OpenAI chat requests become `generateContent` requests (`request`); answers, streams
//! (`alt=sse`) and errors come back in OpenAI's shapes (`response`, `stream`). Anthropic's
//! models on Vertex take the Anthropic translator with its Vertex transport. `auth` holds the
//! service account's pieces: the signed assertion, the exchange's request and its answer.
//!
//! Everything here takes explicit inputs (the location, the key file, the clock); the provider
//! registration decides where they come from.

pub(crate) mod auth;
mod provider;
mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use provider::{Gemini, VertexAi};
pub(crate) use request::convert_request;
pub(crate) use response::convert_response;
pub(crate) use stream::GeminiEvents;

use super::anthropic::{HostedMessages, Messages, Transport};
use super::openai::normalize_error;
use super::{
    chat_only, context_or_default, error_kind_for_status, path_segment, Outbound, ResponseContext, Translator,
    UpstreamRequest, Usage,
};
use crate::errors::{error_json, GatewayError};
use crate::request::endpoint::{ClientApi, Endpoint};
use crate::stream::sse::SseStream;
use serde_json::Value;

/// A Vertex AI project and region, the `{project}` and `{region}` of every Vertex path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VertexLocation {
    pub(crate) project: String,
    pub(crate) region: String,
}

impl VertexLocation {
    /// `/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}:{method}`.
    pub(crate) fn model_path(&self, publisher: &str, model: &str, method: &str) -> Result<String, GatewayError> {
        let project = path_segment("cloud_b_project_id", &self.project)?;
        let region = path_segment("cloud_b_region", &self.region)?;
        let model = path_segment("model", model)?;
        Ok(format!("/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}:{method}"))
    }
}

/// Where a Gemini model is served.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GeminiTransport {
    /// The Gemini API: `/v1beta/models/{model}:generateContent`.
    GeminiApi,
    /// Vertex AI: `/v1/projects/{project}/locations/{region}/publishers/google/models/{model}:...`.
    Vertex(VertexLocation),
}

impl GeminiTransport {
    fn provider(&self) -> &'static str {
        match self {
            GeminiTransport::GeminiApi => "google",
            GeminiTransport::Vertex(_) => "vertex-ai",
        }
    }

    fn path(&self, model: &str, method: &str) -> Result<String, GatewayError> {
        match self {
            // The Gemini API names models `models/{id}` too; either form is accepted.
            GeminiTransport::GeminiApi => {
                let model = path_segment("model", model.strip_prefix("models/").unwrap_or(model))?;
                Ok(format!("/v1beta/models/{model}:{method}"))
            }
            GeminiTransport::Vertex(location) => location.model_path("google", model, method),
        }
    }
}

/// One chat completion through `generateContent` (or `streamGenerateContent?alt=sse`).
pub(crate) struct GeminiTranslator {
    transport: GeminiTransport,
    /// What the answer needs of the request; set by `request`.
    ctx: Option<ResponseContext>,
    stream: Option<SseStream<GeminiEvents>>,
    usage: Option<Usage>,
    /// The request counts tokens (`countTokens`) instead of generating.
    counting: bool,
}

impl GeminiTranslator {
    pub(crate) fn new(transport: GeminiTransport) -> Self {
        GeminiTranslator { transport, ctx: None, stream: None, usage: None, counting: false }
    }

    fn ctx(&self) -> ResponseContext {
        context_or_default(&self.ctx)
    }

    /// The stream converter, made at the first chunk (not copied per chunk).
    fn sse(&mut self) -> &mut SseStream<GeminiEvents> {
        let (ctx, provider) = (&self.ctx, self.transport.provider());
        self.stream.get_or_insert_with(|| SseStream::new(GeminiEvents::new(context_or_default(ctx), provider)))
    }
}

/// Vertex AI's translator: Gemini or Anthropic, picked by the model of the request it gets
/// (the Gemini API's is `GeminiTranslator::new(GeminiTransport::GeminiApi)`).
pub(crate) fn vertex_translator(location: VertexLocation) -> Box<dyn Translator> {
    Box::new(Vertex::Pending(location))
}

/// Vertex AI serves Gemini through `generateContent` and Anthropic's `claude-*` models
/// through `rawPredict`; which one is known once the request's model is.
enum Vertex {
    Pending(VertexLocation),
    Gemini(GeminiTranslator),
    Anthropic(Messages),
}

impl Vertex {
    fn chosen(&self) -> Option<&dyn Translator> {
        match self {
            Vertex::Pending(_) => None,
            Vertex::Gemini(t) => Some(t),
            Vertex::Anthropic(t) => Some(t),
        }
    }

    fn chosen_mut(&mut self) -> Option<&mut dyn Translator> {
        match self {
            Vertex::Pending(_) => None,
            Vertex::Gemini(t) => Some(t),
            Vertex::Anthropic(t) => Some(t),
        }
    }
}

/// Whether Vertex serves the model through Anthropic's API.
pub(crate) fn is_anthropic_model(model: &str) -> bool {
    model.starts_with("claude-")
}

/// Vertex's Anthropic API version, sent in the body.
const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// Anthropic's Messages API on Vertex AI (`rawPredict`/`streamRawPredict`): the model in the
/// path, the version in the body, errors in Google's shape.
struct VertexMessages(VertexLocation);

impl HostedMessages for VertexMessages {
    fn provider(&self) -> &'static str {
        "vertex-ai"
    }

    /// The body loses `model` and gains `anthropic_version`.
    fn path(&self, body: &mut Value) -> Result<String, GatewayError> {
        let model = match body.as_object_mut().and_then(|body| body.remove("model")) {
            Some(Value::String(model)) => model,
            _ => return Err(GatewayError::invalid_param("model", "'model' must be a string")),
        };
        let streams = body.get("stream") == Some(&Value::Bool(true));
        if let Value::Object(body) = body {
            body.insert("anthropic_version".into(), VERTEX_ANTHROPIC_VERSION.into());
        }
        let method = if streams { "streamRawPredict" } else { "rawPredict" };
        self.0.model_path("anthropic", &model, method)
    }

    /// Vertex counts with a model of its own, `count-tokens`; the body keeps its `model` and
    /// gains `anthropic_version`.
    fn count_path(&self, body: &mut Value) -> Result<String, GatewayError> {
        if let Value::Object(body) = body {
            body.entry("anthropic_version").or_insert_with(|| VERTEX_ANTHROPIC_VERSION.into());
        }
        self.0.model_path("anthropic", "count-tokens", "rawPredict")
    }

    fn error(&self, status: u16, body: &[u8]) -> Vec<u8> {
        error(status, body)
    }
}

impl Translator for Vertex {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let location = match self {
            Vertex::Pending(location) => location.clone(),
            Vertex::Gemini(t) => return t.request(outbound),
            Vertex::Anthropic(t) => return t.request(outbound),
        };
        let model = outbound.body.as_deref().and_then(|b| b.get("model")).and_then(Value::as_str).unwrap_or_default();
        *self = if is_anthropic_model(model) {
            Vertex::Anthropic(Messages::new(Transport::Hosted(Box::new(VertexMessages(location)))))
        } else {
            Vertex::Gemini(GeminiTranslator::new(GeminiTransport::Vertex(location)))
        };
        match self.chosen_mut() {
            Some(translator) => translator.request(outbound),
            None => Err(GatewayError::new(500, "api_error", "no Vertex translator was chosen")),
        }
    }

    fn translates_responses(&self) -> bool {
        self.chosen().is_none_or(Translator::translates_responses)
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        match self.chosen_mut() {
            Some(translator) => translator.response(body),
            None => Err(GatewayError::new(502, "api_error", "an answer came before the request")),
        }
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if let Some(translator) = self.chosen_mut() {
            translator.stream(chunk, out);
        }
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        if let Some(translator) = self.chosen_mut() {
            translator.stream_end(out);
        }
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        match self.chosen() {
            Some(translator) => translator.error(status, headers, body),
            None => error(status, body),
        }
    }

    fn usage(&self) -> Option<Usage> {
        self.chosen().and_then(Translator::usage)
    }

    /// Gemini's models count tokens (`countTokens`); Anthropic's count natively.
    fn counts_tokens(&self, model: &str) -> bool {
        !is_anthropic_model(model)
    }

    /// Anthropic's models on Vertex speak Messages (through `rawPredict`).
    fn speaks(&self, api: ClientApi, model: &str) -> bool {
        api == ClientApi::Messages && is_anthropic_model(model)
    }

    fn takes_api_query(&self) -> bool {
        false
    }
}

impl GeminiTranslator {
    /// `countTokens` for a chat request (a Messages `count_tokens`, converted): the request it
    /// would generate from, counted. The Gemini API takes it as `generateContentRequest`, Vertex
    /// as it is.
    fn count_request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let provider = self.transport.provider();
        let body = outbound.body.ok_or_else(|| GatewayError::invalid_param("body", "a JSON body is required"))?;
        let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
        let path = self.transport.path(model, "countTokens")?;
        let request = convert_request(&body, provider)?;
        let sent = match &self.transport {
            GeminiTransport::GeminiApi => {
                let mut request = request;
                if let Value::Object(fields) = &mut request {
                    let model = model.strip_prefix("models/").unwrap_or(model);
                    fields.insert("model".into(), format!("models/{model}").into());
                }
                serde_json::json!({"generateContentRequest": request})
            }
            GeminiTransport::Vertex(_) => request,
        };
        self.counting = true;
        Ok(UpstreamRequest { path, query: None, headers: Vec::new(), body: Some(sent.to_string().into_bytes()) })
    }
}

impl Translator for GeminiTranslator {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        if outbound.endpoint == Endpoint::MessagesCountTokens {
            return self.count_request(outbound);
        }
        let provider = self.transport.provider();
        let (body, ctx) = chat_only(provider, outbound)?;
        let streams = body.get("stream") == Some(&Value::Bool(true));
        let method = if streams { "streamGenerateContent" } else { "generateContent" };
        let path = self.transport.path(&ctx.model, method)?;
        self.ctx = Some(ctx);
        let sent = convert_request(&body, provider)?;
        Ok(UpstreamRequest {
            path,
            query: streams.then(|| "alt=sse".to_string()),
            headers: Vec::new(),
            body: Some(sent.to_string().into_bytes()),
        })
    }

    fn translates_responses(&self) -> bool {
        true
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        if self.counting {
            // `{"totalTokens": n}` as Anthropic's count answer.
            let counted: Value = serde_json::from_slice(body).unwrap_or_default();
            let tokens = counted.get("totalTokens").and_then(Value::as_u64).ok_or_else(|| {
                GatewayError::new(502, "api_error", "the provider's token count has no totalTokens")
                    .with_code("invalid_provider_response")
            })?;
            return Ok(serde_json::json!({"input_tokens": tokens}).to_string().into_bytes());
        }
        let (answer, usage) = convert_response(body, &self.ctx(), self.transport.provider())?;
        self.usage = Some(usage);
        Ok(answer)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.sse().push(chunk, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        let stream = self.sse();
        stream.finish(out);
        self.usage = Some(stream.converter().usage());
    }

    fn error(&self, status: u16, _headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        error(status, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn counts_tokens(&self, _model: &str) -> bool {
        true
    }
}

/// A Google error into the OpenAI error shape: `{"error": {"code", "message", "status"}}`
/// (or a list of such objects, as the streaming methods answer) keeps Google's message, its
/// `status` (e.g. `INVALID_ARGUMENT`) becomes the `code`, and the `type` follows the HTTP
/// status. Anything else goes through the generic reshaping.
pub(crate) fn error(status: u16, body: &[u8]) -> Vec<u8> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let first = match &parsed {
        Some(Value::Array(list)) => list.first(),
        other => other.as_ref(),
    };
    let error = first.and_then(|e| e.get("error"));
    match (super::str_field(error, "message"), super::str_field(error, "status")) {
        (Some(message), Some(google_status)) => {
            error_json(message, error_kind_for_status(status), None, Some(google_status))
        }
        _ => match first {
            Some(first) if parsed.as_ref().is_some_and(Value::is_array) => {
                normalize_error(status, first.to_string().as_bytes())
            }
            _ => normalize_error(status, body),
        },
    }
}

/// Gemini's `finishReason` as an OpenAI `finish_reason`; a candidate that called functions
/// finished with `tool_calls`.
pub(crate) fn finish_reason(reason: Option<&str>, called_functions: bool) -> &'static str {
    match reason {
        Some("MAX_TOKENS") => "length",
        Some("SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" | "LANGUAGE") => {
            "content_filter"
        }
        _ if called_functions => "tool_calls",
        // STOP, OTHER, MALFORMED_FUNCTION_CALL, unknown or missing.
        _ => "stop",
    }
}

/// Gemini's `usageMetadata` as token counts; thinking counts as completion, as OpenAI counts
/// reasoning tokens. `promptTokenCount` includes the cached content's tokens.
pub(crate) fn usage_of(metadata: Option<&Value>) -> Usage {
    let count = |field| super::u64_field(metadata, field);
    Usage {
        prompt_tokens: count("promptTokenCount"),
        cached_prompt_tokens: count("cachedContentTokenCount"),
        cache_write_prompt_tokens: 0,
        completion_tokens: count("candidatesTokenCount").saturating_add(count("thoughtsTokenCount")),
    }
}

/// A function call part as an OpenAI tool call: Gemini's `id` when it gives one, else one
/// made from the call's place in the answer (stable across retries of the same answer). The
/// part's thought signature goes along where Gemini's own OpenAI-compatible API puts it,
/// `extra_content.google.thought_signature`: thinking models need it back with the call.
pub(crate) fn tool_call(part: &Value, index: usize) -> Value {
    let call = part.get("functionCall");
    let id = super::str_field(call, "id").map_or_else(|| format!("call_{index}"), str::to_string);
    let arguments = call.and_then(|c| c.get("args")).map_or_else(|| "{}".to_string(), Value::to_string);
    let mut tool_call = serde_json::json!({
        "id": id,
        "type": "function",
        "function": {"name": super::str_field(call, "name").unwrap_or_default(), "arguments": arguments},
    });
    if let Some(signature) = super::str_field(Some(part), "thoughtSignature") {
        sign_tool_call(&mut tool_call, signature);
    }
    tool_call
}

/// Gives an OpenAI tool call its thought signature (see [`tool_call`]).
pub(crate) fn sign_tool_call(tool_call: &mut Value, signature: &str) {
    if let Value::Object(fields) = tool_call {
        fields.insert("extra_content".into(), serde_json::json!({"google": {"thought_signature": signature}}));
    }
}

/// The thought signature an OpenAI tool call carries back (see [`tool_call`]).
pub(crate) fn thought_signature(tool_call: &Value) -> Option<&str> {
    tool_call.pointer("/extra_content/google/thought_signature").and_then(Value::as_str)
}
