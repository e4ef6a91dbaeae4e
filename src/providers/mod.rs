//! Providers: one file (or folder) per provider behind two small traits. A [`Provider`] makes a
//! [`Translator`] per request, which owns the upstream path, the provider's headers and
//! body, and how answers, streams and errors come back in OpenAI's shapes; then the
//! provider's backend auth runs on the final request (so a signature can cover the
//! translated body). Adding a provider means its own files and one line in `PROVIDERS`.

pub(crate) mod anthropic;
#[cfg(test)]
mod fixtures;
#[allow(dead_code)] // wired by the provider registration (cloud issue)
pub(crate) mod google;
pub(crate) mod openai;

use crate::errors::GatewayError;
use crate::request::endpoint::Endpoint;
use serde_json::Value;
use std::borrow::Cow;

/// What a translator needs to shape a response to OpenAI's form.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResponseContext {
    /// The model the client asked for (after `override_params`).
    pub(crate) model: String,
    /// Unix seconds from the host clock, for `created`.
    pub(crate) created: u64,
    /// `stream_options.include_usage` of the request.
    pub(crate) include_usage: bool,
    /// When false, non-standard parts (thinking) are returned as `content_blocks`.
    pub(crate) strict_vendor_compliance: bool,
}

/// The request's context, or a neutral one for an answer that came without a request.
pub(crate) fn context_or_default(ctx: &Option<ResponseContext>) -> ResponseContext {
    ctx.clone().unwrap_or_else(|| ResponseContext {
        model: String::new(),
        created: 0,
        include_usage: false,
        strict_vendor_compliance: true,
    })
}

/// One request as the client made it, for a translator.
pub(crate) struct Outbound<'a> {
    pub(crate) endpoint: Endpoint,
    /// What the client called after `/v1`, e.g. `/chat/completions` or `/batches/b1/cancel`.
    pub(crate) path: &'a str,
    /// The body after `override_params` (a chat body validated), when the gateway read it;
    /// `None`: the client's bytes go as they came.
    pub(crate) body: Option<Cow<'a, Value>>,
    /// Whether `override_params` changed the body (then it is sent re-serialised).
    pub(crate) overridden: bool,
    pub(crate) strict_vendor_compliance: bool,
    /// The host clock (Unix milliseconds), read only by translators that need it.
    pub(crate) now_ms: &'a dyn Fn() -> u64,
    /// `vendor_organization`, `vendor_project` and the client's `Vendor-Beta`.
    pub(crate) organization: Option<&'a str>,
    pub(crate) project: Option<&'a str>,
    pub(crate) beta: Option<&'a str>,
}

/// The upstream request a translator made.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpstreamRequest {
    /// Below the upstream's base path, without the query.
    pub(crate) path: String,
    /// The provider's own query (without `?`); the client's query, if any, follows it.
    pub(crate) query: Option<String>,
    /// Headers the provider needs besides its credential.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// The body to send; `None`: the client's bytes as they came.
    pub(crate) body: Option<Vec<u8>>,
}

/// Token counts of an answer, when the translator saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
}

pub(crate) trait Provider: Sync {
    /// The translator of one request.
    fn translator(&self) -> Box<dyn Translator>;

    /// Backend auth: the headers that carry the credential, made from the final request
    /// (after translation, so a signature can cover the body; a provider that signs always
    /// returns the body it sends). `now_ms` reads the host clock.
    fn authorize(
        &self,
        api_key: Option<&str>,
        request: &UpstreamRequest,
        now_ms: &dyn Fn() -> u64,
    ) -> Result<Vec<(&'static str, String)>, GatewayError>;
}

/// One request's translation, both ways.
pub(crate) trait Translator {
    /// The upstream request for the client's. A provider that lacks the endpoint answers Err
    /// (a 400, never a 5xx).
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError>;

    /// True when 2xx answers are rewritten (false: OpenAI-shaped answers pass untouched).
    fn translates_responses(&self) -> bool;

    /// A complete successful answer into OpenAI's shape.
    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError>;

    /// One chunk of a streamed answer (it may end anywhere, even mid-event): appends the
    /// bytes for the client to `out`.
    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>);

    /// The streamed answer ended: flushes what is left.
    fn stream_end(&mut self, out: &mut Vec<u8>);

    /// A provider error into the OpenAI error shape (the status is kept by the caller).
    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8>;

    /// The answer's token counts, once a translated answer told them.
    fn usage(&self) -> Option<Usage>;
}

/// A request made ready for one provider: the upstream request with the credential headers
/// added after translation, and the translator that will bring the answer back.
pub(crate) struct Prepared {
    pub(crate) request: UpstreamRequest,
    pub(crate) translator: Box<dyn Translator>,
}

pub(crate) fn prepare(
    provider: &dyn Provider,
    api_key: Option<&str>,
    outbound: Outbound,
) -> Result<Prepared, GatewayError> {
    let now_ms = outbound.now_ms;
    let mut translator = provider.translator();
    let mut request = translator.request(outbound)?;
    let credential = provider.authorize(api_key, &request, now_ms)?;
    request.headers.extend(credential);
    Ok(Prepared { request, translator })
}

/// A provider the gateway knows by name.
pub(crate) struct ProviderSpec {
    pub(crate) name: &'static str,
    /// Built-in base URL; None when the provider is only reachable through `custom_host`.
    pub(crate) base_url: Option<&'static str>,
    pub(crate) kind: &'static dyn Provider,
}

static OPENAI: openai::OpenAi = openai::OpenAi;
static ANTHROPIC: anthropic::Anthropic = anthropic::Anthropic;

const fn compatible(name: &'static str, base_url: &'static str) -> ProviderSpec {
    ProviderSpec { name, base_url: Some(base_url), kind: &OPENAI }
}

pub(crate) static PROVIDERS: &[ProviderSpec] = &[
    compatible("openai", "https://api.openai.com/v1"),
    ProviderSpec { name: "anthropic", base_url: Some("https://api.anthropic.com/v1"), kind: &ANTHROPIC },
    // The generic name for any server that speaks OpenAI's API; needs `custom_host`.
    ProviderSpec { name: "openai-compatible", base_url: None, kind: &OPENAI },
    compatible("groq", "https://api.groq.com/openai/v1"),
    compatible("mistral-ai", "https://api.mistral.ai/v1"),
    compatible("together-ai", "https://api.together.xyz/v1"),
    compatible("deepseek", "https://api.deepseek.com/v1"),
    compatible("fireworks-ai", "https://api.fireworks.ai/inference/v1"),
    compatible("openrouter", "https://openrouter.ai/api/v1"),
    compatible("perplexity-ai", "https://api.perplexity.ai"),
    compatible("x-ai", "https://api.x.ai/v1"),
    compatible("cerebras", "https://api.cerebras.ai/v1"),
    compatible("deepinfra", "https://api.deepinfra.com/v1/openai"),
    ProviderSpec { name: "ollama", base_url: None, kind: &OPENAI },
    ProviderSpec { name: "vllm", base_url: None, kind: &OPENAI },
];

pub(crate) fn find(name: &str) -> Option<&'static ProviderSpec> {
    PROVIDERS.iter().find(|p| p.name == name)
}

/// The OpenAI error `type` that matches an HTTP status, for errors that carry none.
pub(crate) fn error_kind_for_status(status: u16) -> &'static str {
    match status {
        400 | 404 | 409 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        408 => "timeout_error",
        429 => "rate_limit_error",
        _ => "api_error",
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the translators

pub(crate) fn str_field<'a>(value: Option<&'a Value>, field: &str) -> Option<&'a str> {
    value.and_then(|v| v.get(field)).and_then(Value::as_str)
}

pub(crate) fn u64_field(value: Option<&Value>, field: &str) -> u64 {
    value.and_then(|v| v.get(field)).and_then(Value::as_u64).unwrap_or(0)
}

/// OpenAI's `usage` object.
pub(crate) fn usage_json(prompt_tokens: u64, completion_tokens: u64) -> Value {
    serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens.saturating_add(completion_tokens),
    })
}

/// One OpenAI `chat.completion.chunk`. With include_usage OpenAI sends `"usage": null` on
/// every chunk but the last, which has the counts and no choices.
pub(crate) fn chunk_json(id: &str, model: &str, ctx: &ResponseContext, choices: Value, usage: Value) -> Value {
    let mut chunk = serde_json::Map::new();
    chunk.insert("id".into(), id.into());
    chunk.insert("object".into(), "chat.completion.chunk".into());
    chunk.insert("created".into(), ctx.created.into());
    chunk.insert("model".into(), model.into());
    chunk.insert("choices".into(), choices);
    if ctx.include_usage {
        chunk.insert("usage".into(), usage);
    }
    Value::Object(chunk)
}

#[cfg(test)]
mod tests {
    //! A provider of the kind the cloud providers are (its path names the model, its auth
    //! signs the final body) needs nothing beyond these two traits.
    use super::*;
    use crate::hash::Hasher;
    use serde_json::json;

    struct ModelPath;

    struct Invoke;

    impl Provider for ModelPath {
        fn translator(&self) -> Box<dyn Translator> {
            Box::new(Invoke)
        }

        fn authorize(
            &self,
            api_key: Option<&str>,
            request: &UpstreamRequest,
            now_ms: &dyn Fn() -> u64,
        ) -> Result<Vec<(&'static str, String)>, GatewayError> {
            let body = request.body.as_deref().unwrap_or_default();
            let mut hasher = Hasher::new();
            hasher.part(api_key.map(str::as_bytes)).part(Some(request.path.as_bytes())).part(Some(body));
            let signature = format!("t={},h={:016x}", now_ms(), hasher.finish());
            Ok(vec![("x-signature", signature)])
        }
    }

    impl Translator for Invoke {
        fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
            let body = outbound.body.ok_or_else(|| GatewayError::invalid_param("body", "required"))?;
            let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
            let sent = json!({"input": body.get("messages")});
            Ok(UpstreamRequest {
                path: format!("/model/{model}/invoke"),
                query: None,
                headers: vec![],
                body: Some(sent.to_string().into_bytes()),
            })
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
        fn error(&self, _status: u16, _headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
            body.to_vec()
        }
        fn usage(&self) -> Option<Usage> {
            None
        }
    }

    #[test]
    fn the_path_comes_from_the_body_and_the_signature_covers_the_final_body() {
        let body = json!({"model": "m-1", "messages": [{"role": "user", "content": "Hi"}]});
        let outbound = Outbound {
            endpoint: Endpoint::ChatCompletions,
            path: "/chat/completions",
            body: Some(Cow::Owned(body)),
            overridden: false,
            strict_vendor_compliance: true,
            now_ms: &|| 42,
            organization: None,
            project: None,
            beta: None,
        };
        let prepared = prepare(&ModelPath, Some("key"), outbound).unwrap();
        assert_eq!(prepared.request.path, "/model/m-1/invoke");
        let sent = prepared.request.body.clone().unwrap();
        assert_eq!(sent, br#"{"input":[{"content":"Hi","role":"user"}]}"#);
        let mut hasher = Hasher::new();
        hasher.part(Some(b"key")).part(Some(b"/model/m-1/invoke")).part(Some(&sent));
        let expected = format!("t=42,h={:016x}", hasher.finish());
        assert_eq!(prepared.request.headers, vec![("x-signature", expected)]);
    }
}
