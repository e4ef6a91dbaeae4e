//! Providers: one translator per provider behind one small interface, one file per provider.
//! Adding a provider means one file and one line in `PROVIDERS`.

pub(crate) mod anthropic;
pub(crate) mod openai;

use crate::errors::GatewayError;
use crate::request::endpoint::Endpoint;
use serde_json::Value;

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

pub(crate) trait Translator: Sync {
    /// Upstream path, appended to the provider's base path, for `endpoint`. `openai_path` is
    /// what the client called after `/v1`, e.g. `/chat/completions` or `/batches/b1/cancel`.
    /// A provider that lacks the endpoint answers Err (a 400, never a 5xx).
    fn upstream_path(&self, endpoint: Endpoint, openai_path: &str) -> Result<String, GatewayError>;

    /// Headers that carry the provider credential (when there is one) and any the provider
    /// always needs; the client's `authorization` is removed.
    fn auth_headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)>;

    /// Headers for `vendor_organization`, `vendor_project` and the client's `Vendor-Beta`;
    /// none unless the vendor has them.
    fn vendor_headers(
        &self,
        _organization: Option<&str>,
        _project: Option<&str>,
        _beta: Option<&str>,
    ) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Rewrites a validated OpenAI chat request body for the provider.
    fn chat_request(&self, body: Value, strict_vendor_compliance: bool) -> Result<Value, GatewayError>;

    /// True when chat responses must be rewritten (false for OpenAI-compatible providers,
    /// whose responses stream through untouched).
    fn translates_responses(&self) -> bool;

    /// A complete successful chat response body into an OpenAI `chat.completion`.
    fn chat_response(&self, body: &[u8], ctx: &ResponseContext) -> Result<Vec<u8>, GatewayError>;

    /// A translator for one streamed chat response (provider SSE in, OpenAI SSE out).
    fn chat_stream(&self, ctx: ResponseContext) -> Box<dyn StreamTranslator>;

    /// A provider error body into the OpenAI error shape (the status is kept by the caller).
    fn error_body(&self, status: u16, body: &[u8]) -> Vec<u8>;
}

pub(crate) trait StreamTranslator {
    /// Consumes one upstream chunk (which may end anywhere, even mid-event) and appends the
    /// bytes for the client to `out`.
    fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>);
    /// The upstream stream ended: flush what is left.
    fn finish(&mut self, out: &mut Vec<u8>);
}

/// A provider the gateway knows by name.
pub(crate) struct ProviderSpec {
    pub(crate) name: &'static str,
    /// Built-in base URL; None when the provider is only reachable through `custom_host`.
    pub(crate) base_url: Option<&'static str>,
    pub(crate) translator: &'static dyn Translator,
}

static OPENAI: openai::OpenAi = openai::OpenAi;
static ANTHROPIC: anthropic::Anthropic = anthropic::Anthropic;

const fn compatible(name: &'static str, base_url: &'static str) -> ProviderSpec {
    ProviderSpec { name, base_url: Some(base_url), translator: &OPENAI }
}

pub(crate) static PROVIDERS: &[ProviderSpec] = &[
    compatible("openai", "https://api.openai.com/v1"),
    ProviderSpec { name: "anthropic", base_url: Some("https://api.anthropic.com/v1"), translator: &ANTHROPIC },
    // The generic name for any server that speaks OpenAI's API; needs `custom_host`.
    ProviderSpec { name: "openai-compatible", base_url: None, translator: &OPENAI },
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
    ProviderSpec { name: "ollama", base_url: None, translator: &OPENAI },
    ProviderSpec { name: "vllm", base_url: None, translator: &OPENAI },
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
