//! Providers: one file (or folder) per provider behind two small traits. A [`Provider`] makes a
//! [`Translator`] per request, which owns the upstream path, the provider's headers and
//! body, and how answers, streams and errors come back in OpenAI's shapes; then the
//! provider's backend auth runs on the final request (so a signature can cover the
//! translated body). Adding a provider means its own files and one line in `PROVIDERS`.

pub(crate) mod anthropic;
pub(crate) mod azure;
pub(crate) mod bedrock;
pub(crate) mod chat_input;
pub(crate) mod chunks;
#[cfg(test)]
mod fixtures;
pub(crate) mod google;
pub(crate) mod openai;

use crate::cloud::CloudFields;
use crate::errors::GatewayError;
use crate::request::chat;
use crate::request::endpoint::ClientApi;
use crate::request::endpoint::Endpoint;
use crate::upstream::Upstream;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::rc::Rc;

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
    /// The client's request headers (a native target reads its API's own, e.g.
    /// `anthropic-version`).
    pub(crate) headers: &'a [(String, Vec<u8>)],
}

/// The upstream request a translator made.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpstreamRequest {
    /// Below the upstream's base path, without the query.
    pub(crate) path: String,
    /// The provider's own query (e.g. Azure's `api-version`), sent before the client's; its
    /// parameters replace the client's of the same name.
    pub(crate) query: Option<String>,
    /// Headers the provider needs besides its credential.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// The body to send; `None`: the client's bytes as they came.
    pub(crate) body: Option<Vec<u8>>,
}

/// Token counts of an answer, when the translator saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Every prompt token, cached ones included (as OpenAI counts them).
    pub(crate) prompt_tokens: u64,
    /// Of `prompt_tokens`, those the provider read from its prompt cache (priced apart).
    pub(crate) cached_prompt_tokens: u64,
    /// Of `prompt_tokens`, those the provider wrote to its prompt cache (priced apart).
    pub(crate) cache_write_prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
}

impl Usage {
    /// Each count the larger of the two (usage told in parts, or again as the answer grew).
    pub(crate) fn merged(self, other: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.max(other.prompt_tokens),
            cached_prompt_tokens: self.cached_prompt_tokens.max(other.cached_prompt_tokens),
            cache_write_prompt_tokens: self.cache_write_prompt_tokens.max(other.cache_write_prompt_tokens),
            completion_tokens: self.completion_tokens.max(other.completion_tokens),
        }
    }

    /// The token counts of an OpenAI-shaped usage object: `prompt_tokens`/`completion_tokens`
    /// (chat, completions, embeddings) or `input_tokens`/`output_tokens` (Responses, and
    /// Anthropic's Messages, whose cache reads and writes count apart from `input_tokens`: they
    /// are prompt tokens too, as on the chat path). Cached tokens are chat's
    /// `prompt_tokens_details.cached_tokens`, the Responses API's
    /// `input_tokens_details.cached_tokens` or Anthropic's `cache_read_input_tokens`; written
    /// ones Anthropic's `cache_creation_input_tokens`.
    pub(crate) fn of_openai(value: &Value) -> Option<Usage> {
        let object = value.as_object()?;
        let count = |names: &[&str]| names.iter().find_map(|name| object.get(*name).and_then(Value::as_u64));
        let cache_read = count(&["cache_read_input_tokens"]);
        let cache_written = count(&["cache_creation_input_tokens"]).unwrap_or(0);
        let prompt = count(&["prompt_tokens", "input_tokens"])
            .map(|tokens| tokens.saturating_add(cache_read.unwrap_or(0)).saturating_add(cache_written));
        let completion = count(&["completion_tokens", "output_tokens"]);
        if prompt.is_none() && completion.is_none() {
            return None;
        }
        let details = |name: &str| object.get(name)?.get("cached_tokens")?.as_u64();
        let cached = details("prompt_tokens_details").or_else(|| details("input_tokens_details")).or(cache_read);
        Some(Usage {
            prompt_tokens: prompt.unwrap_or(0),
            cached_prompt_tokens: cached.unwrap_or(0),
            cache_write_prompt_tokens: cache_written,
            completion_tokens: completion.unwrap_or(0),
        })
    }
}

/// A provider the gateway knows by name: it checks one target's fields and binds them into
/// the backend every request to that target goes through.
pub(crate) trait Provider: Sync {
    /// Checks the fields a target gives this provider (errors name the field: a 400 for a
    /// place that cannot work, a 401 without credentials) and binds them.
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError>;

    /// Whether its answers are OpenAI's own, passed untouched (OpenAI and the servers that
    /// speak its API).
    fn answers_as_openai(&self) -> bool {
        false
    }

    /// Whether OpenAI's resource endpoints (files, batches, ...) reach it as they came. The
    /// others serve chat only: with a control plane, files are uploaded to the gateway itself.
    fn serves_resources(&self) -> bool {
        false
    }
}

/// What one target names besides its provider: merged from the config node, the headers and
/// a stored credential.
pub(crate) struct TargetFields<'a> {
    pub(crate) api_key: Option<&'a str>,
    /// Whether `custom_host` replaces the base URL (fields used only to build it are optional).
    pub(crate) custom_host: bool,
    /// The provider's built-in base URL, if it has one.
    pub(crate) built_in: Option<&'static str>,
    pub(crate) cloud: &'a CloudFields,
}

/// A target bound to its provider.
pub(crate) struct Binding {
    /// The base URL the fields name (an Azure resource, a cloud region's host); `None`: the
    /// provider's built-in one.
    pub(crate) base_url: Option<String>,
    pub(crate) backend: Rc<dyn Backend>,
    /// The credential that tells the account apart (an API key, an access key id), so that
    /// accounts on one upstream have circuits of their own.
    pub(crate) account: Option<String>,
}

/// One target's provider with its options and credentials.
pub(crate) trait Backend {
    /// The translator of one request.
    fn translator(&self) -> Box<dyn Translator>;

    /// Backend auth: the headers that carry the credential, made from the final request
    /// (after translation, so a signature can cover the body and the path as sent).
    /// `now_ms` reads the host clock.
    fn authorize(
        &self,
        request: &Signable,
        now_ms: &dyn Fn() -> u64,
    ) -> Result<Vec<(&'static str, String)>, GatewayError>;

    /// A credential this backend fetches before its requests (an OAuth access token), which
    /// the gateway caches; `authorize` then finds it in `Signable::token`.
    fn token_source(&self) -> Option<&dyn TokenSource> {
        None
    }
}

/// A token a backend exchanges its credential for, at a token endpoint.
pub(crate) trait TokenSource {
    /// Names the credential in the shared token cache: a digest over the whole credential
    /// (its private key included), so that only the same credential finds the token; never
    /// the secret itself.
    fn cache_key(&self) -> &str;

    /// The token endpoint's request, made only when no cached token is fresh.
    fn request(&self, now_ms: u64) -> Result<TokenRequest, GatewayError>;
}

/// A POST to a token endpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenRequest {
    /// The endpoint's absolute URL.
    pub(crate) url: String,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
}

/// The upstream request as it will be sent, for backend auth.
pub(crate) struct Signable<'a> {
    pub(crate) method: &'a str,
    /// `host:port` as sent in `:authority`.
    pub(crate) authority: &'a str,
    /// The whole path as sent: the base path, the translator's path and the query.
    pub(crate) path: &'a str,
    /// The access token fetched for this target, when its backend has a token source.
    pub(crate) token: Option<&'a str>,
    /// The body as sent; empty when the client's bytes go as they came (providers that sign
    /// translate every request, so they always have the body).
    pub(crate) body: &'a [u8],
}

/// The API key of a provider that takes one, from the config, a stored credential or the
/// client's Bearer: required unless a custom host (a local server) is given.
pub(crate) fn required_key(name: &str, fields: &TargetFields) -> Result<Option<String>, GatewayError> {
    if !fields.custom_host && fields.built_in.is_none() {
        return Err(no_endpoint(name));
    }
    match fields.api_key {
        Some(key) => Ok(Some(key.to_string())),
        None if fields.custom_host => Ok(None),
        None => Err(missing_key(name)),
    }
}

/// The header a provider's API key goes in.
#[derive(Clone, Copy)]
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer <key>`.
    Bearer,
    Named(&'static str),
}

/// A target of a provider that takes an API key and has a built-in base URL.
pub(crate) fn bind_keyed(
    name: &str,
    fields: TargetFields,
    header: KeyHeader,
    translator: fn() -> Box<dyn Translator>,
) -> Result<Binding, GatewayError> {
    let key = required_key(name, &fields)?;
    Ok(Binding { base_url: None, account: key.clone(), backend: Rc::new(Keyed { key, header, translator }) })
}

struct Keyed {
    key: Option<String>,
    header: KeyHeader,
    translator: fn() -> Box<dyn Translator>,
}

impl Backend for Keyed {
    fn translator(&self) -> Box<dyn Translator> {
        (self.translator)()
    }

    fn authorize(&self, _: &Signable, _: &dyn Fn() -> u64) -> Result<Vec<(&'static str, String)>, GatewayError> {
        let credential = self.key.iter().map(|key| match self.header {
            KeyHeader::Bearer => ("authorization", format!("Bearer {key}")),
            KeyHeader::Named(name) => (name, key.clone()),
        });
        Ok(credential.collect())
    }
}

pub(crate) fn missing_key(name: &str) -> GatewayError {
    GatewayError::new(
        401,
        "authentication_error",
        format!(
            "no credential for provider '{name}': send Authorization: Bearer <provider key> or api_key in the config"
        ),
    )
    .with_code("missing_provider_key")
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

    /// A response the gateway keeps for the client (the Responses API's `store`), once the
    /// answer completed: its id and what the control plane stores (given once).
    fn kept(&mut self) -> Option<(String, Value)> {
        None
    }

    /// Whether the provider counts a chat request's tokens for `model` (a Messages
    /// `count_tokens` request, as chat, at `Endpoint::MessagesCountTokens`), answering
    /// `{"input_tokens": n}`.
    fn counts_tokens(&self, _model: &str) -> bool {
        false
    }

    /// Whether the provider speaks client API `api` itself for `model` (then the request goes
    /// as the client sent it; otherwise it arrives as a chat request).
    fn speaks(&self, _api: ClientApi, _model: &str) -> bool {
        false
    }

    /// Whether a request in a client API this target speaks (see [`Translator::speaks`]) keeps
    /// the client's query, which belongs to that API's own service (Claude Code's `?beta=true`
    /// on Anthropic's). A cloud that serves the API through an operation of its own (Vertex's
    /// `rawPredict`, Bedrock's `InvokeModel`) gets none.
    fn takes_api_query(&self) -> bool {
        true
    }
}

/// A value that goes into the path as one segment. Model ids, projects and regions are made
/// of these characters (Vertex's Anthropic ids carry `@`); anything else could reach another
/// path or a query, so it is refused rather than escaped.
pub(crate) fn path_segment<'a>(field: &str, value: &'a str) -> Result<&'a str, GatewayError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@');
    if value.is_empty() || !value.chars().all(allowed) || value.starts_with('.') {
        return Err(GatewayError::invalid_param(
            field,
            format!("'{field}' must be non-empty and made of letters, digits, '-', '_', '.' and '@'"),
        ));
    }
    Ok(value)
}

/// A name that becomes one label of a host name: letters, digits and hyphens only, so it can
/// never move the request to another host.
pub(crate) fn host_label<'a>(field: &str, value: &'a str) -> Result<&'a str, GatewayError> {
    let valid = !value.is_empty() && value.len() <= 63 && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid {
        Ok(value)
    } else {
        Err(GatewayError::invalid_param(
            field,
            format!("`{field}` must be letters, digits and hyphens (a host name label)"),
        )
        .with_code("invalid_config"))
    }
}

/// A target that names no address for a provider without a public endpoint.
pub(crate) fn no_endpoint(name: &str) -> GatewayError {
    GatewayError::invalid_param(
        "custom_host",
        format!("provider '{name}' has no public endpoint: give its address as custom_host"),
    )
}

/// A request made ready for one target: the upstream request with the credential headers
/// added after translation, the whole path as sent, and the translator that will bring the
/// answer back.
pub(crate) struct Prepared {
    pub(crate) request: UpstreamRequest,
    /// The base path, the translator's path, then its query and the client's.
    pub(crate) path: String,
    pub(crate) translator: Box<dyn Translator>,
}

/// Where and how a request is sent, besides what the translator decides.
pub(crate) struct Destination<'a> {
    pub(crate) backend: &'a dyn Backend,
    pub(crate) upstream: &'a Upstream,
    pub(crate) method: &'a str,
    /// The client's query string, passed on as given.
    pub(crate) query: Option<&'a str>,
    /// The backend's access token, when it has a token source.
    pub(crate) token: Option<&'a str>,
}

/// Prepares `outbound` for `to` with `translator` (one of `to.backend`'s).
pub(crate) fn prepare(
    to: Destination,
    mut translator: Box<dyn Translator>,
    outbound: Outbound,
) -> Result<Prepared, GatewayError> {
    let now_ms = outbound.now_ms;
    let mut request = translator.request(outbound)?;
    let path = upstream_path(&to.upstream.base_path, &request, to.query);
    let signable = Signable {
        method: to.method,
        authority: &to.upstream.authority,
        path: &path,
        token: to.token,
        body: request.body.as_deref().unwrap_or_default(),
    };
    let credential = to.backend.authorize(&signable, now_ms)?;
    request.headers.extend(credential);
    Ok(Prepared { request, path, translator })
}

/// The upstream `:path`: the base path, the provider's path, then the provider's query (e.g.
/// Azure's `api-version`, Gemini's `alt=sse`) and the client's, joined with `&`. A parameter
/// the provider's query sets is dropped from the client's: the upstream gets it once, with the
/// value the target's config chose (the `AzureOpenAI` SDK always sends its own `api-version`).
fn upstream_path(base: &str, request: &UpstreamRequest, client_query: Option<&str>) -> String {
    let own = request.query.as_deref().filter(|q| !q.is_empty());
    if own.is_none() && client_query.is_none_or(str::is_empty) {
        // No query at all (most requests): the path alone, in one allocation.
        return [base, request.path.as_str()].concat();
    }
    let own_names: Vec<Vec<u8>> = own.into_iter().flat_map(|q| q.split('&')).map(parameter_name).collect();
    // The client's other pairs go as written, in order.
    let client: Vec<&str> =
        client_query.unwrap_or_default().split('&').filter(|pair| !own_names.contains(&parameter_name(pair))).collect();
    let client = client.join("&");
    let query: Vec<&str> = [own, Some(client.as_str())].into_iter().flatten().filter(|q| !q.is_empty()).collect();
    match query.as_slice() {
        [] => format!("{base}{}", request.path),
        parts => format!("{base}{}?{}", request.path, parts.join("&")),
    }
}

/// A query pair's name as a server reads it: percent-decoded, ASCII case folded (Azure reads
/// `API-Version` as `api-version`).
fn parameter_name(pair: &str) -> Vec<u8> {
    let raw = pair.split_once('=').map_or(pair, |(name, _)| name);
    let mut name = crate::percent::decode(raw, true).unwrap_or_else(|| raw.as_bytes().to_vec());
    name.make_ascii_lowercase();
    name
}

/// What routing does for one target, for translator tests and fixtures: the named provider
/// bound to the fields, and its upstream (the built-in base URL unless a custom host is given).
#[cfg(test)]
pub(crate) fn bind_target(
    name: &str,
    fields: TargetFields,
    custom_host: Option<&str>,
) -> Result<(Rc<dyn Backend>, Upstream), GatewayError> {
    let spec = find(name).ok_or_else(|| GatewayError::invalid_param("provider", "unknown provider"))?;
    let binding = spec.kind.bind(name, TargetFields { built_in: spec.base_url, ..fields })?;
    let base_url = custom_host.or(binding.base_url.as_deref()).or(spec.base_url).unwrap_or("http://127.0.0.1:1");
    let upstream = Upstream::parse(base_url).map_err(|e| GatewayError::invalid_param("custom_host", e))?;
    Ok((binding.backend, upstream))
}

/// What routing and the pipeline do for one target, for translator tests: [`bind_target`], then
/// one request prepared as the translator takes it (the fixtures also take the pipeline's
/// client-API step, `pipeline::in_target_api`).
#[cfg(test)]
pub(crate) fn bind_and_prepare(
    name: &str,
    fields: TargetFields,
    custom_host: Option<&str>,
    method: &str,
    outbound: Outbound,
) -> Result<Prepared, GatewayError> {
    let (backend, upstream) = bind_target(name, fields, custom_host)?;
    let to = Destination { backend: backend.as_ref(), upstream: &upstream, method, query: None, token: None };
    prepare(to, backend.translator(), outbound)
}

/// A provider the gateway knows by name.
pub(crate) struct ProviderSpec {
    pub(crate) name: &'static str,
    /// Built-in base URL; None when the provider builds it from the target's fields, or is
    /// only reachable through `custom_host`.
    pub(crate) base_url: Option<&'static str>,
    pub(crate) kind: &'static dyn Provider,
}

static OPENAI: openai::OpenAi = openai::OpenAi;
static ANTHROPIC: anthropic::Anthropic = anthropic::Anthropic;
static AZURE_OPENAI: azure::AzureOpenAi = azure::AzureOpenAi;
static AZURE_AI: azure::AzureAi = azure::AzureAi;
static GEMINI: google::Gemini = google::Gemini;
static VERTEX_AI: google::VertexAi = google::VertexAi;
static BEDROCK: bedrock::Bedrock = bedrock::Bedrock;

const fn compatible(name: &'static str, base_url: &'static str) -> ProviderSpec {
    ProviderSpec { name, base_url: Some(base_url), kind: &OPENAI }
}

pub(crate) static PROVIDERS: &[ProviderSpec] = &[
    compatible("openai", "https://api.openai.com/v1"),
    ProviderSpec { name: "anthropic", base_url: Some("https://api.anthropic.com/v1"), kind: &ANTHROPIC },
    // Cloud A: base URLs built from the resource, or the endpoint and region.
    ProviderSpec { name: "azure-openai", base_url: None, kind: &AZURE_OPENAI },
    ProviderSpec { name: "azure-ai", base_url: None, kind: &AZURE_AI },
    // Cloud B: the Gemini API, and Vertex AI (its host from the region).
    ProviderSpec { name: "google", base_url: Some("https://generativelanguage.googleapis.com"), kind: &GEMINI },
    ProviderSpec { name: "vertex-ai", base_url: None, kind: &VERTEX_AI },
    // Cloud C: Bedrock's runtime host from the region, SigV4 over the request as sent.
    ProviderSpec { name: "bedrock", base_url: None, kind: &BEDROCK },
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

/// OpenAI's `usage` object (with `prompt_tokens_details.cached_tokens` when the provider read
/// some of the prompt from its cache).
pub(crate) fn usage_json(usage: Usage) -> Value {
    let mut json = json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens.saturating_add(usage.completion_tokens),
    });
    if let (true, Value::Object(fields)) = (usage.cached_prompt_tokens > 0, &mut json) {
        fields.insert("prompt_tokens_details".into(), json!({"cached_tokens": usage.cached_prompt_tokens}));
    }
    json
}

/// The chat body of a request to a provider that serves only chat completions, and what the
/// answer needs of it; any other endpoint is a 400 (never a 5xx).
pub(crate) fn chat_only<'a>(
    provider: &str,
    outbound: Outbound<'a>,
) -> Result<(Cow<'a, Value>, ResponseContext), GatewayError> {
    let Outbound { endpoint, path, body, now_ms, strict_vendor_compliance, .. } = outbound;
    let body = match (endpoint, body) {
        (Endpoint::ChatCompletions, Some(body)) => body,
        _ => {
            let message = format!("provider '{provider}' does not support /v1{path}");
            return Err(GatewayError::new(400, "invalid_request_error", message).with_code("unsupported_endpoint"));
        }
    };
    let ctx = ResponseContext {
        model: body.get("model").and_then(Value::as_str).unwrap_or_default().to_string(),
        created: now_ms() / 1000,
        include_usage: chat::include_usage(body.get("stream_options")),
        strict_vendor_compliance,
    };
    Ok((body, ctx))
}

/// The assistant's reply of a translated answer, gathered block by block.
#[derive(Default)]
pub(crate) struct Reply {
    text: Option<String>,
    tool_calls: Vec<Value>,
    /// Every block, for clients that accept non-standard parts.
    pub(crate) content_blocks: Vec<Value>,
}

impl Reply {
    pub(crate) fn text(&mut self, part: &str) {
        self.text.get_or_insert_with(String::new).push_str(part);
        self.content_blocks.push(json!({"type": "text", "text": part}));
    }

    /// A tool call; its arguments are the JSON text of `input`.
    pub(crate) fn tool_call(&mut self, id: &str, name: &str, input: Option<&Value>) {
        self.tool_calls.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": input.map_or_else(|| "{}".to_string(), Value::to_string)},
        }));
    }

    /// The `chat.completion` of one choice.
    pub(crate) fn completion(
        self,
        id: &str,
        model: &str,
        ctx: &ResponseContext,
        finish_reason: &str,
        usage: Usage,
    ) -> Vec<u8> {
        let mut message = serde_json::Map::new();
        message.insert("role".into(), "assistant".into());
        message.insert("content".into(), self.text.map_or(Value::Null, Value::String));
        if !self.tool_calls.is_empty() {
            message.insert("tool_calls".into(), Value::Array(self.tool_calls));
        }
        if !ctx.strict_vendor_compliance {
            message.insert("content_blocks".into(), Value::Array(self.content_blocks));
        }
        let response = json!({
            "id": id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason}],
            "usage": usage_json(usage),
        });
        response.to_string().into_bytes()
    }
}

/// Helpers for the tests of the translators.
#[cfg(test)]
pub(crate) mod testing {
    use super::Outbound;
    use crate::request::endpoint::Endpoint;
    use serde_json::Value;

    /// A client request at 1_700_000_000_123 ms, strict.
    pub(crate) fn outbound(endpoint: Endpoint, path: &'static str, body: Option<Value>) -> Outbound<'static> {
        Outbound {
            endpoint,
            path,
            body: body.map(std::borrow::Cow::Owned),
            overridden: false,
            strict_vendor_compliance: true,
            now_ms: &|| 1_700_000_000_123,
            organization: None,
            project: None,
            beta: None,
            headers: &[],
        }
    }
}

#[cfg(test)]
mod tests {
    //! A provider of the kind the cloud providers are (its path names the model, its auth
    //! signs the final body) needs nothing beyond these two traits.
    use super::*;
    use crate::hash::Hasher;
    use crate::unit_tests::test;
    use serde_json::json;

    /// Lives in a region named by the target's fields; signs what is sent.
    struct Regional;

    struct Signing {
        secret: String,
    }

    struct Invoke;

    impl Provider for Regional {
        fn bind(&self, _name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
            let region = fields.cloud.aws_region.as_deref();
            let base_url = match region {
                Some(region) => Some(format!("https://runtime.{region}.example.com")),
                None if fields.custom_host => None,
                None => return Err(GatewayError::invalid_param("cloud_c_region", "required")),
            };
            let secret = fields.cloud.aws_secret_access_key.clone().unwrap_or_default();
            Ok(Binding { base_url, backend: Rc::new(Signing { secret }), account: None })
        }
    }

    impl Backend for Signing {
        fn translator(&self) -> Box<dyn Translator> {
            Box::new(Invoke)
        }

        fn authorize(
            &self,
            request: &Signable,
            now_ms: &dyn Fn() -> u64,
        ) -> Result<Vec<(&'static str, String)>, GatewayError> {
            let mut hasher = Hasher::new();
            let parts = [self.secret.as_bytes(), request.authority.as_bytes(), request.path.as_bytes(), request.body];
            for part in parts {
                hasher.part(Some(part));
            }
            Ok(vec![("x-signature", format!("t={},h={:016x}", now_ms(), hasher.finish()))])
        }
    }

    impl Translator for Invoke {
        fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
            let body = outbound.body.ok_or_else(|| GatewayError::invalid_param("body", "required"))?;
            let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
            let sent = json!({"input": body.get("messages")});
            Ok(UpstreamRequest {
                path: format!("/model/{model}/invoke"),
                query: Some("v=2".to_string()),
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
    fn the_registry_ships_the_providers_a_stored_credential_may_name() {
        let names: Vec<&str> = PROVIDERS.iter().map(|p| p.name).collect();
        assert_eq!(names, crate::credential::PROVIDER_NAMES);
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
            headers: &[],
        };
        let cloud = CloudFields {
            aws_region: Some("eu-1".into()),
            aws_secret_access_key: Some("s3cret".into()),
            ..CloudFields::default()
        };
        let fields = TargetFields { api_key: None, custom_host: false, built_in: None, cloud: &cloud };
        let to = Regional.bind("regional", fields).unwrap();
        let upstream = Upstream::parse(&to.base_url.unwrap()).unwrap();
        let destination =
            Destination { backend: to.backend.as_ref(), upstream: &upstream, method: "POST", query: None, token: None };
        let prepared = prepare(destination, to.backend.translator(), outbound).unwrap();
        assert_eq!(prepared.path, "/model/m-1/invoke?v=2");
        let sent = prepared.request.body.clone().unwrap();
        assert_eq!(sent, br#"{"input":[{"content":"Hi","role":"user"}]}"#);
        let mut hasher = Hasher::new();
        for part in [&b"s3cret"[..], b"runtime.eu-1.example.com:443", b"/model/m-1/invoke?v=2", &sent] {
            hasher.part(Some(part));
        }
        let expected = format!("t=42,h={:016x}", hasher.finish());
        assert_eq!(prepared.request.headers, vec![("x-signature", expected)]);
        let nowhere =
            TargetFields { api_key: None, custom_host: false, built_in: None, cloud: &CloudFields::default() };
        assert_eq!(Regional.bind("regional", nowhere).err().map(|e| e.param), Some(Some("cloud_c_region".into())));
    }

    #[test]
    fn the_providers_query_goes_before_the_clients() {
        let mut request = UpstreamRequest { path: "/m:stream".into(), query: None, headers: vec![], body: None };
        assert_eq!(upstream_path("/base", &request, None), "/base/m:stream");
        assert_eq!(upstream_path("/base", &request, Some("a=1")), "/base/m:stream?a=1");
        assert_eq!(upstream_path("/base", &request, Some("a=1&&b")), "/base/m:stream?a=1&&b");
        request.query = Some("alt=sse".into());
        assert_eq!(upstream_path("", &request, None), "/m:stream?alt=sse");
        assert_eq!(upstream_path("", &request, Some("a=1&b=2")), "/m:stream?alt=sse&a=1&b=2");
        assert_eq!(upstream_path("", &request, Some("")), "/m:stream?alt=sse");
    }

    #[test]
    fn a_parameter_the_provider_sets_is_dropped_from_the_clients_query() {
        let request = UpstreamRequest {
            path: "/files".into(),
            query: Some("api-version=2024-10-21".into()),
            headers: vec![],
            body: None,
        };
        let path = |client| upstream_path("/openai", &request, Some(client));
        assert_eq!(path("api-version=2025-01-01"), "/openai/files?api-version=2024-10-21");
        // However the client spells the name, the server reads it as the same parameter.
        assert_eq!(
            path("limit=2&API-Version=x&api%2Dversion=y&api-version&purpose=batch&after=a%20b"),
            "/openai/files?api-version=2024-10-21&limit=2&purpose=batch&after=a%20b"
        );
        // A name like it, or a value that mentions it, is another parameter.
        assert_eq!(
            path("api-versions=1&x=api-version%3D1&api-version%=2"),
            "/openai/files?api-version=2024-10-21&api-versions=1&x=api-version%3D1&api-version%=2"
        );
    }
}
