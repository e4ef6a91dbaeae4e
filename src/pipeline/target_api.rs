//! A request as the target that answers it takes it: as it came when the target speaks the
//! client's API, else as a chat request (checked as the gateway checks chat) with the shape its
//! answers go back to the client in.

use super::KEPT_RESPONSE_PREFIX;
use crate::client_api;
use crate::errors::GatewayError;
use crate::providers::Translator;
use crate::request::chat;
use crate::request::endpoint::{ClientApi, Endpoint};
use serde_json::{json, Value};
use std::borrow::Cow;

/// A request as the client asked it of one target (the body after `override_params`), or as
/// that target gets it.
pub(crate) struct TargetRequest<'a> {
    pub(crate) endpoint: Endpoint,
    /// After `/v1`, e.g. `/messages`.
    pub(crate) path: &'a str,
    /// The client's query string.
    pub(crate) query: Option<&'a str>,
    pub(crate) body: Option<Cow<'a, Value>>,
    pub(crate) strict_vendor_compliance: bool,
}

/// `asked` as the target whose translator is `translator` gets it. A target that speaks the
/// client's API gets it as it came (the client's query only if its transport is that API's
/// own service: `Translator::takes_api_query`); any other gets it as a chat request (without
/// the client's query, which belongs to the client's API: Claude Code's `?beta=true`), with
/// the shape its answers go back to the client in (through `client_api::Reply`). A chat
/// request is checked as the gateway checks chat.
pub(crate) fn in_target_api<'a>(
    asked: TargetRequest<'a>,
    provider: &str,
    translator: &dyn Translator,
    response_id: Option<&str>,
    now_ms: &dyn Fn() -> u64,
) -> Result<(TargetRequest<'a>, Option<client_api::Shape>), GatewayError> {
    let api = asked.endpoint.client_api();
    let model = asked.body.as_deref().and_then(|r| r.get("model")).and_then(Value::as_str).unwrap_or_default();
    let (sent, shape) = if api == ClientApi::Chat {
        (asked, None)
    } else if translator.speaks(api, model) {
        let query = asked.query.filter(|_| translator.takes_api_query());
        (TargetRequest { query, ..asked }, None)
    } else {
        let counts = translator.counts_tokens(model);
        let (mut request, shape) = as_chat(&asked, provider, response_id, counts, now_ms)?;
        if !translator.translates_responses() {
            // The chat request goes upstream as written: an OpenAI-family server knows no
            // `content_blocks` (the gateway's own field for earlier turns' signed thinking, which
            // no such server can take back) and a strict one refuses the request for it.
            without_reasoning_blocks(&mut request, provider);
        }
        // A count stays a count: the provider's translator counts the chat request.
        let (endpoint, path) = match shape {
            client_api::Shape::Count => (Endpoint::MessagesCountTokens, "/messages/count_tokens"),
            _ => (Endpoint::ChatCompletions, "/chat/completions"),
        };
        // A translated client API carries thinking itself: the provider's translator gives it
        // back (in `content_blocks`) for the client's shape.
        let sent = TargetRequest {
            endpoint,
            path,
            query: None,
            body: Some(Cow::Owned(request)),
            strict_vendor_compliance: false,
        };
        (sent, Some(shape))
    };
    if let (Endpoint::ChatCompletions, Some(request)) = (sent.endpoint, &sent.body) {
        check_chat(request, sent.strict_vendor_compliance)?;
    }
    Ok((sent, shape))
}

/// A client API's request (`asked`, after `override_params`) as a chat request for a target
/// that does not speak the API, with what its answers need of it. Endpoints with no chat
/// counterpart are a 400 for such a target (never a made-up answer).
fn as_chat(
    asked: &TargetRequest,
    provider: &str,
    response_id: Option<&str>,
    counts_tokens: bool,
    now_ms: &dyn Fn() -> u64,
) -> Result<(Value, client_api::Shape), GatewayError> {
    let unsupported = |what: &str| {
        GatewayError::new(400, "invalid_request_error", format!("provider '{provider}' {what}"))
            .with_code("unsupported_endpoint")
    };
    let request = match (asked.endpoint, asked.body.as_deref()) {
        (Endpoint::Messages | Endpoint::Responses, Some(Value::Object(request))) => request,
        (Endpoint::MessagesCountTokens, Some(Value::Object(request))) if counts_tokens => {
            // A count has no `max_tokens`; chat's conversion wants one, which counting ignores.
            let mut request = request.clone();
            request.entry("max_tokens").or_insert(1.into());
            let translated = client_api::to_chat(ClientApi::Messages, &request)?;
            return Ok((Value::Object(translated.body), client_api::Shape::Count));
        }
        (Endpoint::MessagesCountTokens, _) => return Err(unsupported("cannot count tokens")),
        (Endpoint::StoredResponse, _) => {
            return Err(unsupported(&format!(
                "does not keep responses: the gateway serves only the ones it kept itself (ids \
                 {KEPT_RESPONSE_PREFIX}...)"
            )))
        }
        _ => return Err(unsupported(&format!("does not support /v1{}", asked.path))),
    };
    let api = asked.endpoint.client_api();
    if let Some(previous) = request.get("previous_response_id").and_then(Value::as_str) {
        // The conversation so far lives with whoever answered it; a translating target has none.
        let message = format!(
            "previous_response_id: provider '{provider}' does not keep responses, so response '{}' cannot be \
             continued there; send the conversation in `input` instead",
            previous.chars().take(64).collect::<String>()
        );
        return Err(GatewayError::invalid_param("previous_response_id", message).with_code("unsupported_parameter"));
    }
    let translated = client_api::to_chat(api, request)?;
    if !translated.dropped.is_empty() {
        log::info!(
            "provider '{provider}' does not take these {} request fields; dropped: {}",
            api.name(),
            translated.dropped.join(", ")
        );
    }
    let shape = match api {
        ClientApi::Responses => client_api::Shape::Responses {
            id: response_id.unwrap_or_default().to_string(),
            created_at: now_ms() / 1000,
            request: request.clone(),
        },
        _ => client_api::Shape::Messages {
            model: request.get("model").and_then(Value::as_str).unwrap_or_default().to_string(),
        },
    };
    Ok((Value::Object(translated.body), shape))
}

/// `request`'s messages without the gateway's `content_blocks`; logged when there were some.
fn without_reasoning_blocks(request: &mut Value, provider: &str) {
    let messages = request.get_mut("messages").and_then(Value::as_array_mut).into_iter().flatten();
    let dropped = messages.filter_map(|m| m.as_object_mut()?.remove("content_blocks")).count();
    if dropped > 0 {
        log::info!(
            "provider '{provider}' takes no thinking of earlier turns; dropped from {dropped} assistant messages"
        );
    }
}

/// The request with `stream_options.include_usage` set (other stream options kept).
pub(super) fn with_usage(request: Cow<Value>) -> Value {
    let mut value = request.into_owned();
    if let Value::Object(map) = &mut value {
        if let Value::Object(options) = map.entry("stream_options").or_insert_with(|| json!({})) {
            options.insert("include_usage".into(), Value::Bool(true));
        }
    }
    value
}

fn check_chat(request: &Value, strict: bool) -> Result<(), GatewayError> {
    chat::validate_chat_request(request)?;
    if strict && request.get("thinking").is_some_and(|t| !t.is_null()) {
        return Err(GatewayError::invalid_param(
            "thinking",
            "thinking requires strict_vendor_compliance false in the config",
        ));
    }
    Ok(())
}
