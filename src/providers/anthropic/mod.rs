//! Anthropic Messages API: OpenAI chat requests become `/v1/messages` requests; Anthropic
//! messages, streams and errors come back in OpenAI's shapes. The conversions live apart
//! (`request`, `response`, `stream`) so other transports of Anthropic's models can reuse them;
//! a service hosting Anthropic's models (Vertex AI's `rawPredict`, in `google`) takes the same
//! translator with its own [`Transport::Hosted`].

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;
mod wire;

pub(crate) use request::convert_request;
pub(crate) use response::convert_response;
pub(crate) use stream::{EventConverter, SseStream};
pub(crate) use wire::{error_body, error_from_openai, error_type, write_event};

use super::openai::normalize_error;
use super::{
    bind_keyed, chat_only, context_or_default, Binding, KeyHeader, Outbound, Provider, ResponseContext, TargetFields,
    Translator, UpstreamRequest, Usage,
};
use crate::errors::GatewayError;
use crate::request::endpoint::ClientApi;
use crate::request::endpoint::Endpoint;
use crate::request::headers;
use serde_json::Value;
use std::borrow::Cow;

pub(crate) struct Anthropic;

const API_VERSION: &str = "2023-06-01";

impl Provider for Anthropic {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        bind_keyed(name, fields, KeyHeader::Named("x-api-key"), || Box::new(Messages::new(Transport::Direct)))
    }
}

/// Where the Messages body goes.
pub(crate) enum Transport {
    /// Anthropic's own API: `/messages`, the version in a header.
    Direct,
    /// Another service serving Anthropic's models.
    Hosted(Box<dyn HostedMessages>),
}

/// A service serving Anthropic's Messages API its own way: its path, the changes it needs in
/// the body, its name and the shape of its errors.
pub(crate) trait HostedMessages {
    /// The provider's name in errors.
    fn provider(&self) -> &'static str;
    /// The request's path, after changing the body as the service wants it.
    fn path(&self, body: &mut Value) -> Result<String, GatewayError>;
    /// The path of a token count (`/v1/messages/count_tokens`), after changing the body as the
    /// service wants it; its answer is Anthropic's.
    fn count_path(&self, body: &mut Value) -> Result<String, GatewayError>;
    /// The service's own error as an OpenAI error.
    fn error(&self, status: u16, body: &[u8]) -> Vec<u8>;
}

/// One chat completion through the Messages API.
pub(crate) struct Messages {
    transport: Transport,
    /// What the answer needs of the request; set by `request`.
    ctx: Option<ResponseContext>,
    stream: Option<SseStream>,
    usage: Option<Usage>,
    /// The client spoke Messages itself: its request goes as it came, answers come back as
    /// they are.
    native: bool,
}

impl Messages {
    pub(crate) fn new(transport: Transport) -> Self {
        Messages { transport, ctx: None, stream: None, usage: None, native: false }
    }

    /// A Messages request as the client sent it: only `model` (by `override_params`) and what
    /// the transport needs change. The client's `anthropic-version` and `anthropic-beta` go
    /// with it (the version defaults as on the chat path).
    fn native_request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        self.native = true;
        let count = outbound.endpoint == Endpoint::MessagesCountTokens;
        match &self.transport {
            Transport::Direct => {
                let version = headers::find(outbound.headers, "anthropic-version")
                    .map_or_else(|| API_VERSION.to_string(), |v| String::from_utf8_lossy(v).into_owned());
                let body = match outbound.body {
                    Some(body) if outbound.overridden => Some(body.to_string().into_bytes()),
                    _ => None,
                };
                let path = if count { "/messages/count_tokens" } else { "/messages" };
                Ok(UpstreamRequest {
                    path: path.into(),
                    query: None,
                    headers: vec![("anthropic-version", version)],
                    body,
                })
            }
            Transport::Hosted(hosted) => {
                let Some(mut body) = outbound.body.map(Cow::into_owned) else {
                    return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
                };
                let path = if count { hosted.count_path(&mut body)? } else { hosted.path(&mut body)? };
                Ok(UpstreamRequest {
                    path,
                    query: None,
                    headers: Vec::new(),
                    body: Some(body.to_string().into_bytes()),
                })
            }
        }
    }

    fn provider(&self) -> &'static str {
        match &self.transport {
            Transport::Direct => "anthropic",
            Transport::Hosted(hosted) => hosted.provider(),
        }
    }

    fn ctx(&self) -> ResponseContext {
        context_or_default(&self.ctx)
    }

    /// The stream converter, made at the first chunk (not copied per chunk).
    fn sse(&mut self) -> &mut SseStream {
        let (ctx, provider) = (&self.ctx, self.provider());
        self.stream.get_or_insert_with(|| SseStream::new(EventConverter::new(context_or_default(ctx), provider)))
    }
}

impl Translator for Messages {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        if outbound.endpoint.client_api() == ClientApi::Messages {
            return self.native_request(outbound);
        }
        let (body, ctx) = chat_only(self.provider(), outbound)?;
        self.ctx = Some(ctx);
        // `thinking` under strict_vendor_compliance is rejected by the pipeline before this call.
        let mut body = convert_request(body.into_owned())?;
        let (path, headers) = match &self.transport {
            // The version header goes even without a key (a local server behind custom_host).
            Transport::Direct => ("/messages".to_string(), vec![("anthropic-version", API_VERSION.to_string())]),
            Transport::Hosted(hosted) => (hosted.path(&mut body)?, Vec::new()),
        };
        Ok(UpstreamRequest { path, query: None, headers, body: Some(body.to_string().into_bytes()) })
    }

    fn translates_responses(&self) -> bool {
        !self.native
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
        self.usage = Some(stream.converter().usage());
    }

    // Anthropic's `{"type":"error","error":{"type","message"}}` has the `error.type` and
    // `error.message` of OpenAI's shape, so the generic reshaping covers it; a hosting service
    // answers its own errors in its own shape.
    fn error(&self, status: u16, _headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        match &self.transport {
            // A Messages client reads Anthropic's errors as they are.
            Transport::Direct if self.native => body.to_vec(),
            Transport::Direct => normalize_error(status, body),
            Transport::Hosted(hosted) if self.native => error_from_openai(status, &hosted.error(status, body)),
            Transport::Hosted(hosted) => hosted.error(status, body),
        }
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn speaks(&self, api: ClientApi, _model: &str) -> bool {
        api == ClientApi::Messages
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the conversions

pub(super) use super::str_field;

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
