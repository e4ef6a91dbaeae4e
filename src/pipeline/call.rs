//! The upstream request of each attempt of a routed request: the body after `override_params`
//! as the target's API takes it, translated and authenticated by its backend, the header edits
//! for Envoy's router; and what the request record and the limits read of the attempt.

use super::target_api::with_usage;
use super::{in_target_api, CachePlan, Call, Facts, Forward, HeaderEdits, RawHeaders, ResponsePlan, TargetRequest};
use crate::cache::settings::CacheMode;
use crate::cache::{self, Lookup, Origin};
use crate::client_api;
use crate::config::Config;
use crate::errors::GatewayError;
use crate::guardrails::verdict::Item;
use crate::providers::openai::UsageStripped;
use crate::providers::{self, Backend, Destination, Outbound, Prepared, Translator};
use crate::request::chat;
use crate::request::endpoint::Endpoint;
use crate::request::headers::{is_gateway_header, is_secret_header, PROVIDER_KEY_HEADER};
use crate::routing::Target;
use crate::settings::Settings;
use crate::usage_limits;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::rc::Rc;

impl Call {
    /// The cache lookup of the current attempt's target, by the body it would send. Called
    /// before `forward`, which may move the body.
    pub(crate) fn cache_plan(&self) -> CachePlan {
        let endpoint = self.intake.endpoint;
        if !cache::is_cached_endpoint(endpoint) {
            return CachePlan::Uncached;
        }
        let target = match self.attempts.plan.attempts.get(self.attempts.current) {
            Some(attempt) => &attempt.target,
            None => return CachePlan::Disabled,
        };
        let (Some(config), Some(body)) = (&target.options.cache, &self.body) else {
            return CachePlan::Disabled;
        };
        let Value::Object(fields) = body else {
            return CachePlan::Disabled;
        };
        let body = cache::Body { fields, overrides: &target.options.override_params };
        let origin = Origin {
            provider: target.provider.name,
            authority: &target.upstream.authority,
            base_path: &target.upstream.base_path,
            strict_vendor_compliance: target.options.strict_vendor_compliance,
        };
        let gateway = &self.intake.gateway;
        let key = cache::key(self.intake.tenant, gateway.cache_namespace.as_deref(), endpoint, &origin, &body);
        let conversation = if config.mode == CacheMode::Semantic { cache::semantic::conversation(&body) } else { None };
        CachePlan::Lookup(Box::new(Lookup {
            key,
            mode: config.mode,
            max_age_ms: config.max_age.unwrap_or(cache::DEFAULT_MAX_AGE_SECONDS).saturating_mul(1000),
            refresh: gateway.cache_force_refresh == Some(true),
            endpoint,
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            include_usage: chat::include_usage(body.get("stream_options")),
            conversation,
        }))
    }

    /// The upstream request of attempt `index`: its target's provider translates the request
    /// (path, headers, body), then its backend auth runs on the result. `now_ms` reads the
    /// host clock, only when a translator needs it. When no later attempt can follow, the
    /// parsed body is moved into the request rather than copied.
    pub(crate) fn forward(
        &mut self,
        settings: &Settings,
        raw: &RawHeaders,
        index: usize,
        token: Option<&str>,
        now_ms: &dyn Fn() -> u64,
    ) -> Result<Forward, GatewayError> {
        let Call { intake, body, attempts, response_id } = self;
        let target = match attempts.plan.attempts.get(index) {
            Some(attempt) => &attempt.target,
            None => return Err(GatewayError::new(500, "api_error", "no such attempt")),
        };
        let request =
            if attempts.plan.can_recover() { body.as_ref().map(Cow::Borrowed) } else { body.take().map(Cow::Owned) };
        let overrides = &target.options.override_params;
        let request = match request {
            Some(request) if !overrides.is_empty() => Some(Cow::Owned(overridden(request, overrides))),
            request => request,
        };
        // Usage the gateway asks for on the client's behalf, for its metrics.
        let asks_usage = settings.metrics.stream_usage
            && intake.endpoint == Endpoint::ChatCompletions
            && target.provider.kind.answers_as_openai()
            && request.as_ref().is_some_and(|r| {
                let options = r.get("stream_options");
                r.get("stream").and_then(Value::as_bool) == Some(true)
                    && options.is_none_or(Value::is_object)
                    && !chat::include_usage(options)
            });
        let request = match request {
            Some(request) if asks_usage => Some(Cow::Owned(with_usage(request))),
            request => request,
        };
        let api = intake.endpoint.client_api();
        let translator = target.backend.translator();
        let asked = TargetRequest {
            endpoint: intake.endpoint,
            path: &intake.path,
            query: intake.query.as_deref(),
            body: request,
            strict_vendor_compliance: target.options.strict_vendor_compliance,
        };
        let (sent, shape) =
            in_target_api(asked, target.provider.name, translator.as_ref(), response_id.as_deref(), now_ms)?;
        let outbound = Outbound {
            endpoint: sent.endpoint,
            path: sent.path,
            body: sent.body,
            // A rendered prompt or a translated request is not the client's body: it is
            // always sent as rewritten.
            overridden: !overrides.is_empty() || asks_usage || intake.prompt.is_some() || shape.is_some(),
            strict_vendor_compliance: sent.strict_vendor_compliance,
            now_ms,
            organization: target.vendor_organization.as_deref(),
            project: target.vendor_project.as_deref(),
            beta: intake.gateway.vendor_beta.as_deref(),
            headers: raw,
        };
        let destination = Destination {
            backend: target.backend.as_ref(),
            upstream: &target.upstream,
            method: &intake.method,
            query: sent.query,
            token,
        };
        let prepared = providers::prepare(destination, translator, outbound)?;
        let mut headers = upstream_headers(settings, raw, target, &prepared);
        let translator: Box<dyn Translator> = match shape {
            // The client's own API headers mean nothing to a provider that got chat.
            Some(shape) => {
                let anthropic = raw.iter().filter(|(name, _)| name.starts_with("anthropic-"));
                headers.remove.extend(anthropic.map(|(name, _)| name.clone()));
                Box::new(client_api::Reply::new(prepared.translator, shape))
            }
            None if asks_usage => Box::new(UsageStripped::new(prepared.translator)),
            None => prepared.translator,
        };
        let response = ResponsePlan { provider: target.provider, translator, api };
        Ok(Forward { headers, body: prepared.request.body, response })
    }

    /// The target of attempt `index`.
    pub(crate) fn target(&self, index: usize) -> Option<&Target> {
        self.attempts.plan.attempts.get(index).map(|attempt| &attempt.target)
    }

    /// The token source of attempt `index`'s backend, when it fetches a token first.
    pub(crate) fn token_source(&self, index: usize) -> Option<Rc<dyn Backend>> {
        let attempt = self.attempts.plan.attempts.get(index)?;
        attempt.target.backend.token_source().is_some().then(|| Rc::clone(&attempt.target.backend))
    }

    /// What the request says of itself for the record: the provider and model attempt
    /// `index` sends to and whether it asks for a stream (`override_params` win over the
    /// client's body), and its metadata. Read before `forward`, which may move the body.
    pub(crate) fn facts(&self, index: usize) -> Facts {
        let target = self.attempts.plan.attempts.get(index).map(|a| &a.target);
        let forced = target.and_then(|t| t.options.override_params.get("stream"));
        let stream = forced.or_else(|| self.body.as_ref().and_then(|b| b.get("stream")));
        Facts {
            provider: target.map_or("", |t| t.provider.name),
            model: self.model_of(index).to_string(),
            stream: stream.and_then(Value::as_bool) == Some(true),
            reports_usage: matches!(
                self.intake.endpoint,
                Endpoint::ChatCompletions
                    | Endpoint::Completions
                    | Endpoint::Embeddings
                    | Endpoint::Messages
                    | Endpoint::Responses
            ),
        }
    }

    /// The client's `x-gateway-metadata`.
    /// The model attempt `index` asks for (`override_params` win over the client's model).
    fn model_of(&self, index: usize) -> &str {
        let target = self.attempts.plan.attempts.get(index).map(|a| &a.target);
        let forced = target.and_then(|t| t.options.override_params.get("model"));
        let client = || self.body.as_ref().and_then(|b| b.get("model"));
        forced.or_else(client).and_then(Value::as_str).unwrap_or_default()
    }

    /// The workspace's limits and prices, with a control plane.
    pub(crate) fn policy(&self) -> Option<&Rc<Value>> {
        self.intake.policy.as_ref()
    }

    /// The request as limits see it: whose it is, the models its attempts ask for, its body.
    pub(crate) fn limits_ask(&self) -> usage_limits::Ask<'_> {
        usage_limits::Ask {
            workspace: &self.intake.workspace,
            key_id: self.intake.key_id.as_deref(),
            models: (0..self.attempts.plan.attempts.len()).map(|index| self.model_of(index)).collect(),
            body: self.body.as_ref(),
            tokens: match self.intake.endpoint {
                Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Messages | Endpoint::Responses => {
                    usage_limits::TokenUse::InputAndOutput
                }
                Endpoint::Embeddings => usage_limits::TokenUse::Input,
                _ => usage_limits::TokenUse::None,
            },
        }
    }

    /// The id of the caller's gateway key (none for the plugin configuration's keys).
    pub(crate) fn key_id(&self) -> Option<&str> {
        self.intake.key_id.as_deref()
    }

    pub(crate) fn metadata(&self) -> Option<&Map<String, Value>> {
        self.intake.gateway.metadata.as_ref()
    }

    /// Frees the parsed body once no later attempt can need it.
    pub(crate) fn release_body(&mut self) {
        self.body = None;
    }

    /// A stored guardrail of the top-level config, as the control plane gave it.
    pub(crate) fn stored_guardrail(&self, reference: &str) -> Option<&Item> {
        super::find_stored(&self.intake.guardrails, reference)
    }

    /// The top-level config node, whose hooks and guardrails apply to the request.
    pub(crate) fn root_config(&self) -> Option<&Config> {
        self.intake.config.as_deref()
    }

    /// The client's parsed JSON body (until `forward` or `release_body` let it go).
    pub(crate) fn request_json(&self) -> Option<&Value> {
        self.body.as_ref()
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        self.intake.endpoint
    }

    /// Where the target of the attempt sent last sits in the config (empty for the root).
    pub(crate) fn target_path(&self) -> &str {
        self.attempts.plan.attempts.get(self.attempts.sent).map_or("", |a| a.path.as_str())
    }
}

fn upstream_headers(settings: &Settings, raw: &RawHeaders, target: &Target, prepared: &Prepared) -> HeaderEdits {
    let forwarded = |name: &str| target.options.forward_headers.iter().any(|f| f == name);
    let mut edits = HeaderEdits::default();
    for (name, _) in raw {
        // Gateway headers and the client's credential stay here unless the user forwards them;
        // gateway secrets never leave; accept-encoding goes so responses arrive uncompressed
        // and can be translated; a client's Envoy control headers (timeouts, retries) never
        // reach the router, which gets only the ones the gateway sets.
        let private = is_gateway_header(name) || name == "authorization" || name == PROVIDER_KEY_HEADER;
        let envoy_control = name.starts_with("x-envoy-");
        if is_secret_header(name) || (private && !forwarded(name)) || name == "accept-encoding" || envoy_control {
            edits.remove.push(name.clone());
        }
    }
    let request = &prepared.request;
    edits.set.push((":authority".into(), target.upstream.authority.clone()));
    edits.set.push((":path".into(), prepared.path.clone()));
    edits.set.push((settings.route_header().into(), settings.routed_cluster(&target.upstream)));
    edits.set.extend(request.headers.iter().map(|(name, value)| (name.to_string(), value.clone())));
    if let Some(body) = &request.body {
        edits.set.push(("content-length".into(), body.len().to_string()));
        edits.set.push(("content-type".into(), "application/json".into()));
    }
    if let Some(ms) = target.options.request_timeout {
        // Envoy's per-try timer stops at the response headers (the route timer would also
        // cut a stream that has started). At most what a dispatched attempt's timer takes (u32
        // ms, ~49 days): Envoy reads the header into signed milliseconds.
        edits.set.push((TIMEOUT_HEADER.into(), ms.min(u64::from(u32::MAX)).to_string()));
    }
    edits
}

/// Envoy's per-try timeout of a routed request.
const TIMEOUT_HEADER: &str = "x-envoy-upstream-rq-per-try-timeout-ms";

/// The request with `override_params` forced onto it.
fn overridden(request: Cow<Value>, overrides: &Map<String, Value>) -> Value {
    let mut value = request.into_owned();
    if let Value::Object(map) = &mut value {
        for (key, v) in overrides {
            map.insert(key.clone(), v.clone());
        }
    }
    value
}
