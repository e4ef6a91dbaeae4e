//! AWS Bedrock (cloud C) through the Converse API: OpenAI chat requests become
//! `/model/{id}/converse` (or `/converse-stream`) requests; answers, event streams and errors
//! come back in OpenAI's shapes. [`Bedrock`] binds a target's access keys and region;
//! [`sigv4::sign`] makes the auth headers of the final request, [`Converse`] translates. A
//! Messages client asking for Claude is served by Anthropic's own API on Bedrock instead
//! ([`invoke::Invoke`]), with nothing lost.

pub(crate) mod eventstream;
mod invoke;
mod request;
mod response;
pub(crate) mod sigv4;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use request::convert_request;
pub(crate) use response::convert_response;
pub(crate) use stream::EventStream;

use super::openai::normalize_error_of_kind;
use super::{
    chat_only, context_or_default, host_label, u64_field, Backend, Binding, Outbound, Provider, ResponseContext,
    Signable, TargetFields, Translator, UpstreamRequest, Usage,
};
use crate::cloud::CloudFields;
use crate::errors::GatewayError;
use crate::hash::Hasher;
use crate::percent;
use crate::request::endpoint::ClientApi;
use invoke::Invoke;
use serde_json::Value;
use sigv4::AwsCredentials;
use std::rc::Rc;

/// The region SigV4 signs for when a custom host is given without one.
const DEFAULT_REGION: &str = "us-east-1";

pub(crate) struct Bedrock;

impl Provider for Bedrock {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        let cloud = fields.cloud;
        let (base_url, region) = match &cloud.aws_region {
            Some(region) => {
                let region = host_label("cloud_c_region", region)?;
                let base_url = format!("https://bedrock-runtime.{region}.amazonaws.com");
                ((!fields.custom_host).then_some(base_url), region.to_string())
            }
            // A custom host (a proxy, a local mock) names the place; the signature still needs a region.
            None if fields.custom_host => (None, DEFAULT_REGION.to_string()),
            None => {
                return Err(GatewayError::invalid_param(
                    "cloud_c_region",
                    "`cloud_c_region` (e.g. us-east-1) is required for bedrock, unless custom_host is given",
                )
                .with_code("invalid_config"))
            }
        };
        let credentials = credentials(name, cloud)?;
        let account = Some(credentials.access_key_id.clone());
        Ok(Binding { base_url, account, backend: Rc::new(SigV4 { credentials, region }) })
    }
}

/// The access key pair (and session token) of the target; a missing one is a 401 that says
/// what to send, never echoing what was sent.
fn credentials(name: &str, cloud: &CloudFields) -> Result<AwsCredentials, GatewayError> {
    let non_empty = |field: &Option<String>| field.clone().filter(|value| !value.is_empty());
    match (non_empty(&cloud.aws_access_key_id), non_empty(&cloud.aws_secret_access_key)) {
        (Some(access_key_id), Some(secret_access_key)) => {
            Ok(AwsCredentials { access_key_id, secret_access_key, session_token: cloud.aws_session_token.clone() })
        }
        _ => Err(GatewayError::new(
            401,
            "authentication_error",
            format!(
                "no credential for provider '{name}': send cloud_c_access_key_id and cloud_c_secret_access_key \
                 (and cloud_c_session_token for temporary keys) in the config, or the headers \
                 x-gateway-cloud-c-access-key-id and x-gateway-cloud-c-secret-access-key"
            ),
        )
        .with_code("missing_provider_key")),
    }
}

/// A Bedrock target: every request signed with its keys for its region.
struct SigV4 {
    credentials: AwsCredentials,
    region: String,
}

impl Backend for SigV4 {
    fn translator(&self) -> Box<dyn Translator> {
        Box::new(BedrockApi::Converse(Converse::new()))
    }

    fn authorize(
        &self,
        request: &Signable,
        now_ms: &dyn Fn() -> u64,
    ) -> Result<Vec<(&'static str, String)>, GatewayError> {
        sigv4::sign(&self.credentials, &self.region, "bedrock", request, now_ms())
    }
}

/// One chat completion through the Converse API.
#[derive(Default)]
pub(crate) struct Converse {
    /// What the answer needs of the request; set by `request`.
    ctx: Option<ResponseContext>,
    /// The answer's id (Converse answers have none); set by `request`.
    id: String,
    stream: Option<EventStream>,
    usage: Option<Usage>,
}

impl Converse {
    pub(crate) fn new() -> Self {
        Converse::default()
    }

    /// The stream converter, made at the first chunk.
    fn events(&mut self) -> &mut EventStream {
        let (ctx, id) = (&self.ctx, &self.id);
        self.stream.get_or_insert_with(|| EventStream::new(context_or_default(ctx), id.clone()))
    }
}

impl Translator for Converse {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let now_ms = (outbound.now_ms)();
        let (body, ctx) = chat_only("bedrock", outbound)?;
        let (body, path) = convert_request(body.into_owned())?;
        let body = body.to_string().into_bytes();
        self.id = chat_id(now_ms, &body);
        self.ctx = Some(ctx);
        Ok(UpstreamRequest { path, query: None, headers: Vec::new(), body: Some(body) })
    }

    fn translates_responses(&self) -> bool {
        true
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        let (answer, usage) = convert_response(body, &context_or_default(&self.ctx), &self.id)?;
        self.usage = Some(usage);
        Ok(answer)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.events().push(chunk, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        let events = self.events();
        events.finish(out);
        self.usage = Some(events.usage());
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        error(status, headers, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

/// Bedrock's translator of one request: Anthropic's Messages API through `InvokeModel` for a
/// Messages client asking for Claude, Converse for everything else.
enum BedrockApi {
    Converse(Converse),
    Invoke(Invoke),
}

impl BedrockApi {
    fn chosen(&self) -> &dyn Translator {
        match self {
            BedrockApi::Converse(t) => t,
            BedrockApi::Invoke(t) => t,
        }
    }

    fn chosen_mut(&mut self) -> &mut dyn Translator {
        match self {
            BedrockApi::Converse(t) => t,
            BedrockApi::Invoke(t) => t,
        }
    }
}

impl Translator for BedrockApi {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let model = outbound.body.as_deref().and_then(|b| b.get("model")).and_then(Value::as_str).unwrap_or_default();
        if self.speaks(outbound.endpoint.client_api(), model) {
            *self = BedrockApi::Invoke(Invoke::default());
        }
        self.chosen_mut().request(outbound)
    }

    fn translates_responses(&self) -> bool {
        self.chosen().translates_responses()
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        self.chosen_mut().response(body)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.chosen_mut().stream(chunk, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        self.chosen_mut().stream_end(out);
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        self.chosen().error(status, headers, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.chosen().usage()
    }

    /// Anthropic's models on Bedrock speak Messages (through `InvokeModel`).
    fn speaks(&self, api: ClientApi, model: &str) -> bool {
        api == ClientApi::Messages && is_anthropic_model(model)
    }

    fn takes_api_query(&self) -> bool {
        false
    }
}

/// Whether Bedrock serves `model` with Anthropic's Messages API: Anthropic's model ids
/// (`anthropic.claude-...`), alone, behind an inference profile's geography (`us.`,
/// `global.`, `us-gov.`, ...) or at the end of an ARN. An application inference profile's
/// ARN names no model: it goes through Converse.
fn is_anthropic_model(model: &str) -> bool {
    let id = model.rsplit('/').next().unwrap_or(model);
    let geography = |prefix: &str| prefix.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    id.starts_with("anthropic.")
        || id.split_once('.').is_some_and(|(prefix, rest)| geography(prefix) && rest.starts_with("anthropic."))
}

/// The path of `action` on the request's model: `/model/{id}/{action}`, the model id
/// percent-encoded (`:` as `%3A`, `/` as `%2F`).
fn model_path(model: Option<&Value>, action: &str) -> Result<String, GatewayError> {
    let model = model
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid_param("model", "'model' (the Bedrock model id) is required"))?;
    Ok(format!("/model/{}/{action}", percent::encode(model)))
}

/// Bedrock's error in OpenAI's shape: Bedrock answers `{"message": ...}` with its error type in
/// the `x-amzn-ErrorType` header (`ValidationException:http://internal.amazon.com/...`: the
/// name before `:`).
fn error(status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    let kind = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("x-amzn-errortype"))
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
        .and_then(|value| value.split(':').next())
        .map(str::trim)
        .filter(|kind| !kind.is_empty());
    normalize_error_of_kind(status, body, kind)
}

/// Why the provider's stream cannot be read, for the client.
fn invalid_stream(error: &eventstream::DecodeError) -> String {
    format!("provider 'bedrock' sent an invalid event stream: {error}")
}

/// What a stream's `exception` frame says (`{"message": ...}`; some AWS errors spell it
/// `Message`).
fn exception_message(frame: &eventstream::Frame) -> Option<String> {
    let payload: Value = serde_json::from_slice(&frame.payload).ok()?;
    ["message", "Message"].iter().find_map(|field| super::str_field(Some(&payload), field)).map(str::to_string)
}

/// An id for the answer: the request's time and body hashed (Converse sends none).
fn chat_id(now_ms: u64, body: &[u8]) -> String {
    let mut hasher = Hasher::new();
    hasher.part(Some(&now_ms.to_le_bytes())).part(Some(body));
    format!("chatcmpl-{:016x}", hasher.finish())
}

// ---------------------------------------------------------------------------------------------
// Shared by the conversions

/// Converse's `stopReason` as an OpenAI `finish_reason`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("content_filtered" | "guardrail_intervened") => "content_filter",
        // end_turn, stop_sequence, unknown or missing.
        _ => "stop",
    }
}

/// Converse `usage` (answers and the stream's `metadata`); OpenAI counts cached prompt tokens
/// as prompt tokens, Converse reports them apart.
fn tokens(usage: Option<&Value>) -> Usage {
    Usage {
        prompt_tokens: u64_field(usage, "inputTokens")
            .saturating_add(u64_field(usage, "cacheReadInputTokens"))
            .saturating_add(u64_field(usage, "cacheWriteInputTokens")),
        cached_prompt_tokens: u64_field(usage, "cacheReadInputTokens"),
        cache_write_prompt_tokens: u64_field(usage, "cacheWriteInputTokens"),
        completion_tokens: u64_field(usage, "outputTokens"),
    }
}
