//! A request's way through the gateway as plain decisions: the host adapter feeds it
//! headers and body and applies what it returns.

use crate::cache::settings::CacheMode;
use crate::cache::{self, Lookup, Origin, Tenant};
use crate::catalog::{self, Catalog, Entry, Kind, Ref, DEFAULT_WORKSPACE};
use crate::client_api;
use crate::config::{parse_config, Config, StrategyMode};
use crate::errors::GatewayError;
use crate::guardrails::spec::{parse_stored_guardrail, Guardrail};
use crate::guardrails::verdict::Item;
use crate::json_check::{beyond_depth, MAX_JSON_DEPTH};
use crate::ports::Host;
use crate::providers::openai::UsageStripped;
use crate::providers::{self, Backend, Destination, Outbound, Prepared, ProviderSpec, Translator};
use crate::request::chat;
use crate::request::endpoint::{classify, BodyMode, ClientApi, Endpoint, Route};
use crate::request::headers::{
    self, decode_value, is_gateway_header, is_secret_header, GatewayHeaders, PROVIDER_KEY_HEADER,
};
use crate::request::limits::{check_json_size, MAX_JSON_VALUES};
use crate::request::resources;
use crate::routing::attempts::Attempts;
use crate::routing::plan::{make_plan, Plan};
use crate::routing::{config_header, saved_config_unavailable, ConfigHeader, Target};
use crate::settings::Settings;
use crate::usage_limits;
use crate::wire_names::{
    control_plane_fetch_marker, CLIENT_AUTHORIZATION_HEADER, CONTROL_PLANE_FETCH_HEADER, WORKSPACE_HEADER,
};
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::rc::Rc;
use subtle::ConstantTimeEq;

/// The ids of the responses a translating target answered, which the gateway itself names and
/// keeps (with its control plane).
pub(crate) const KEPT_RESPONSE_PREFIX: &str = "resp_gw_";

/// Names the provider that served the request, on every provider response.
pub(crate) const PROVIDER_HEADER: &str = "x-gateway-provider";
pub(crate) const TRACE_HEADER: &str = "x-gateway-trace-id";
/// Where the target that answered sits in the config, e.g. `targets[1].targets[0]`.
pub(crate) const TARGET_HEADER: &str = "x-gateway-target";
/// How many retries the answer took (on requests whose config can retry or fall back).
pub(crate) const RETRIES_HEADER: &str = "x-gateway-retries";

/// Request headers as the host gives them: lowercase names, raw values (values the gateway
/// does not touch go upstream byte for byte).
pub(crate) type RawHeaders = [(String, Vec<u8>)];

/// Header edits for the upstream request: removals first, then sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HeaderEdits {
    pub(crate) remove: Vec<String>,
    pub(crate) set: Vec<(String, String)>,
}

impl HeaderEdits {
    /// The request headers after the edits, for one host call that replaces them all
    /// (each single-header call costs a host round trip and a route-cache clear). Borrowed:
    /// nothing is copied on the way to the host.
    pub(crate) fn apply<'a>(&'a self, headers: &'a RawHeaders) -> Vec<(&'a str, &'a [u8])> {
        let replaced = |name: &str| self.remove.iter().any(|r| r == name) || self.set.iter().any(|(s, _)| s == name);
        let kept = headers.iter().filter(|(name, _)| !replaced(name)).map(|(n, v)| (n.as_str(), v.as_slice()));
        kept.chain(self.set.iter().map(|(name, value)| (name.as_str(), value.as_bytes()))).collect()
    }
}

/// Who answers a forwarded request, and the translator that brings the answer back.
pub(crate) struct ResponsePlan {
    pub(crate) provider: &'static ProviderSpec,
    pub(crate) translator: Box<dyn Translator>,
    /// The client's API, whose shape the gateway's own errors take.
    pub(crate) api: ClientApi,
}

/// The upstream request of one attempt.
pub(crate) struct Forward {
    pub(crate) headers: HeaderEdits,
    /// The new body, when the gateway rewrote it (`None`: the client's bytes go as they came).
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) response: ResponsePlan,
}

/// What the request headers said, kept until the request is routed.
pub(crate) struct Intake {
    endpoint: Endpoint,
    method: String,
    path: String,
    query: Option<String>,
    gateway: GatewayHeaders,
    /// Shared with this worker's memo of inline configs.
    config: Option<Rc<Config>>,
    /// Whose request it is, for the cache: a hash of the gateway key, or with a control plane
    /// of the workspace.
    tenant: Tenant,
    /// The caller's workspace (`default` for the plugin configuration's keys).
    workspace: String,
    /// The id of the caller's gateway key (none for the plugin configuration's keys).
    key_id: Option<String>,
    /// The workspace's limits and prices, with a control plane.
    policy: Entry,
    /// The top-level config's stored guardrails, by the reference the config gave.
    guardrails: Vec<(String, Item)>,
    /// The stored prompt the chat request is rendered from.
    prompt: Option<Prompt>,
}

/// Where a request's stored prompt comes from.
enum Prompt {
    /// `POST /v1/prompts/{promptId}/completions`: the body is `variables` and hyperparameters.
    Endpoint(String),
    /// Config `prompt_id`: the body's `variables` fill it, its messages follow.
    Config(String),
}

/// A request that needs its body before it can be routed.
pub(crate) struct Pending {
    intake: Intake,
}

/// A routed request: its plan and everything needed to build the upstream request of any
/// attempt (the first goes through Envoy's router, later ones as dispatched calls).
pub(crate) struct Call {
    intake: Intake,
    /// The client's JSON body, parsed when the gateway needs to read or change it.
    body: Option<Value>,
    pub(crate) attempts: Attempts,
    /// The id of the response a Responses request creates, when a translating target answers
    /// it (the gateway names it; a native target names its own).
    response_id: Option<String>,
}

/// What a routed request's attempt is, for the request record.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Facts {
    pub(crate) provider: &'static str,
    pub(crate) model: String,
    pub(crate) stream: bool,
    /// An endpoint whose answers carry token usage.
    pub(crate) reports_usage: bool,
}

pub(crate) enum Started {
    Health,
    Ready(Call),
    NeedsBody(Pending),
    /// The request needs this control-plane entry first; it is processed again once the entry
    /// is known.
    Lookup(Ref),
    /// A gateway-managed batch (or its file): the request goes as it came to the control
    /// plane, through Envoy's router, with `Relay::edits`.
    Relay(Relay),
}

/// Where the control plane serves a managed-batch request, and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relay {
    /// The control plane's path, e.g. `/internal/v1/batches/batch_gw_1`.
    pub(crate) path: String,
    pub(crate) workspace: String,
}

impl Relay {
    /// The header edits that send the request to the control plane: its cluster, authority
    /// and path, its bearer token and the caller's workspace; the caller's gateway headers
    /// stay (they select the provider of each line), the client's `Authorization` is renamed.
    /// `None` without a control plane.
    pub(crate) fn edits(&self, settings: &Settings, raw: &RawHeaders) -> Option<HeaderEdits> {
        let cp = settings.control_plane.as_ref()?;
        let mut edits = HeaderEdits::default();
        for (name, _) in raw {
            let ours = name == CLIENT_AUTHORIZATION_HEADER || name == CONTROL_PLANE_FETCH_HEADER;
            if name.starts_with("x-envoy-") || name == "accept-encoding" || ours {
                edits.remove.push(name.clone());
            }
        }
        if let Some(client) = headers::find(raw, "authorization") {
            edits.set.push((CLIENT_AUTHORIZATION_HEADER.into(), String::from_utf8_lossy(client).into_owned()));
        }
        edits.set.push((":path".into(), self.path.clone()));
        edits.set.push((":authority".into(), cp.authority.clone()));
        edits.set.push((settings.route_header().into(), cp.cluster.clone()));
        edits.set.push(("authorization".into(), format!("Bearer {}", cp.token)));
        edits.set.push((WORKSPACE_HEADER.into(), self.workspace.clone()));
        Some(edits)
    }
}

/// A pass that stopped at a ref the catalog does not know yet is a lookup, whatever error the
/// placeholder became on its way up.
fn or_lookup(result: Result<Started, GatewayError>, catalog: &mut Catalog) -> Result<Started, GatewayError> {
    match (result, catalog.take_needed()) {
        (Err(_), Some(needed)) => Ok(Started::Lookup(needed)),
        (result, _) => result,
    }
}

/// Whether the gateway reads the body of the request with headers `raw` (a JSON POST).
pub(crate) fn reads_body(raw: &RawHeaders) -> bool {
    let pseudo = |name: &str| headers::find(raw, name).map(String::from_utf8_lossy).unwrap_or_default();
    let method = pseudo(":method");
    matches!(classify(&method, &pseudo(":path")), Ok(Route::Api { body: BodyMode::Json, .. })) && method == "POST"
}

/// Request headers arrived: authenticate, parse the gateway headers and the config, and route
/// the request when no body is needed. Control-plane entries come from `catalog`.
pub(crate) fn start(
    settings: &Settings,
    raw: &RawHeaders,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Started, GatewayError> {
    let started = start_pass(settings, raw, host, catalog);
    or_lookup(started, catalog)
}

fn start_pass(
    settings: &Settings,
    raw: &RawHeaders,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Started, GatewayError> {
    let pseudo = |name: &str| headers::find(raw, name).map(String::from_utf8_lossy).unwrap_or_default();
    let method = pseudo(":method");
    let Route::Api { endpoint, body, path, query, prompt } = classify(&method, &pseudo(":path"))? else {
        return Ok(Started::Health);
    };
    // The key comes first: a caller without one learns nothing else about the request.
    let (workspace, key_id) = match headers::api_key(raw) {
        Some(key) if settings.authenticate(key) => (DEFAULT_WORKSPACE.to_string(), None),
        Some(key) if catalog.enabled() => {
            let owner = catalog.key_owner(key, host)?.ok_or_else(|| catalog::not_found(Kind::Key, ""))?;
            (owner.workspace, owner.key_id)
        }
        Some(_) => {
            return Err(GatewayError::new(401, "authentication_error", "invalid x-gateway-api-key")
                .with_code("invalid_api_key"))
        }
        None => {
            return Err(GatewayError::new(
                401,
                "authentication_error",
                "missing x-gateway-api-key header: every request needs a gateway API key",
            )
            .with_code("missing_api_key"))
        }
    };
    // Without a control plane each key is its own tenant; with one, each workspace is.
    let tenant = match (catalog.enabled(), headers::api_key(raw)) {
        (false, Some(key)) => cache::tenant_of(key),
        _ => cache::tenant_of(workspace.as_bytes()),
    };
    catalog.workspace.clone_from(&workspace);
    // Limits and prices apply to every request of the workspace.
    let policy = if catalog.enabled() { catalog.policy(host)? } else { None };
    // Only the headers the gateway reads are decoded (the others go upstream as they came).
    let read = |name: &str| {
        name == "authorization" || name == PROVIDER_KEY_HEADER || name == "vendor-beta" || is_gateway_header(name)
    };
    let decoded = raw
        .iter()
        .filter(|(name, _)| read(name))
        .map(|(name, value)| decode_value(name, value).map(|text| (name.as_str(), text)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut gateway = GatewayHeaders::parse(decoded.iter().map(|(name, value)| (*name, value.as_str())))?;
    let config = gateway.config.as_deref().map(|raw| config_of(raw, catalog, host)).transpose()?;
    let guardrails = match &config {
        Some(config) if catalog.enabled() => stored_guardrails(config, catalog, host)?,
        _ => Vec::new(),
    };
    let prompt = match (prompt, config.as_ref().and_then(|c| c.prompt_id.as_ref())) {
        (Some(id), _) => Some(Prompt::Endpoint(id)),
        (None, Some(id)) if catalog.enabled() => {
            if endpoint != Endpoint::ChatCompletions {
                return Err(GatewayError::invalid_param(
                    "prompt_id",
                    "a config's prompt_id applies to chat completions only",
                )
                .with_code("invalid_config"));
            }
            Some(Prompt::Config(id.clone()))
        }
        // Without a control plane, routing refuses prompt_id (501).
        (None, _) => None,
    };
    if let Some(Prompt::Endpoint(id) | Prompt::Config(id)) = &prompt {
        if !catalog.enabled() {
            return Err(crate::routing::not_implemented("prompt completions (prompts need the control plane)"));
        }
        // Read before the body arrives: an unknown prompt is a 404 at once.
        let version = catalog.require(Kind::Prompt, id, host)?;
        // The prompt's own virtual key selects the provider when the headers name none (a
        // config's provider still wins).
        if gateway.provider.is_none() && gateway.virtual_key.is_none() {
            let own = version.get("virtual_key").and_then(Value::as_str).filter(|k| !k.is_empty());
            gateway.virtual_key = own.map(str::to_string);
        }
    }
    if endpoint == Endpoint::Resource {
        resources::check_path(&path)?;
        resources::check_query(&method, &path, query.as_deref())?;
        if catalog.enabled() {
            if let Some(path) = resources::managed_path(&method, &path) {
                return Ok(Started::Relay(Relay { path, workspace }));
            }
        }
    }
    if endpoint == Endpoint::StoredResponse {
        if let Some(path) = kept_response_path(&path, query.as_deref()) {
            if !catalog.enabled() {
                return Err(GatewayError::new(
                    404,
                    "invalid_request_error",
                    "No response found: the gateway keeps responses only with its control plane",
                )
                .with_code("response_not_found"));
            }
            return Ok(Started::Relay(Relay { path, workspace }));
        }
    }
    let json_post = body == BodyMode::Json && method == "POST";
    let method = method.into_owned();
    let intake = Intake {
        endpoint,
        method,
        path,
        query,
        gateway,
        config,
        tenant,
        workspace,
        key_id,
        policy,
        guardrails,
        prompt,
    };
    if json_post {
        headers::check_plain_body(raw)?;
        return Ok(Started::NeedsBody(Pending { intake }));
    }
    let plan = plan_of(settings, &intake, None, host, catalog)?;
    if let Some(relay) = shared_relay(settings, raw, &intake, &plan) {
        return Ok(Started::Relay(relay));
    }
    let attempts = Attempts::start(plan, host)?;
    Ok(Started::Ready(Call { intake, body: None, attempts, response_id: None }))
}

/// Where the control plane serves an operation on a response the gateway keeps (`path` is
/// `/responses/{id}...` after `/v1`); None for a provider's own response.
fn kept_response_path(path: &str, query: Option<&str>) -> Option<String> {
    path.strip_prefix("/responses/").filter(|rest| rest.starts_with(KEPT_RESPONSE_PREFIX))?;
    Some(match query {
        Some(query) => format!("/internal/v1{path}?{query}"),
        None => format!("/internal/v1{path}"),
    })
}

/// A resource request the control plane serves once its provider is known (the batch list,
/// an upload for a provider without a files API): the provider must be selected first, as
/// for any resource.
fn shared_relay(settings: &Settings, raw: &RawHeaders, intake: &Intake, plan: &Plan) -> Option<Relay> {
    let cp = settings.control_plane.as_ref()?;
    if intake.endpoint != Endpoint::Resource {
        return None;
    }
    let fetch = headers::find(raw, CONTROL_PLANE_FETCH_HEADER)
        .is_some_and(|mark| bool::from(mark.ct_eq(control_plane_fetch_marker(&cp.token).as_bytes())));
    let serves_resources = plan.attempts.first().is_none_or(|a| a.target.provider.kind.serves_resources());
    let path = resources::shared_path(&intake.method, &intake.path, intake.query.as_deref(), fetch, serves_resources)?;
    Some(Relay { path, workspace: intake.workspace.clone() })
}

/// The config of the config header: inline JSON, or a saved config of the caller's workspace.
fn config_of(raw: &str, catalog: &mut Catalog, host: &dyn Host) -> Result<Rc<Config>, GatewayError> {
    match config_header(raw)? {
        ConfigHeader::Inline(config) => Ok(config),
        ConfigHeader::Saved(id) if catalog.enabled() => {
            let value = catalog.require(Kind::Config, id, host)?;
            parse_config(&value).map(Rc::new).map_err(|e| {
                let mut error = e.to_gateway_error();
                error.message = format!("saved config '{id}': {}", error.message);
                error
            })
        }
        ConfigHeader::Saved(id) => Err(saved_config_unavailable(id)),
    }
}

/// The stored guardrails the top-level config names, read from the control plane.
fn stored_guardrails(
    config: &Config,
    catalog: &mut Catalog,
    host: &dyn Host,
) -> Result<Vec<(String, Item)>, GatewayError> {
    let mut items: Vec<(String, Item)> = Vec::new();
    for guardrail in config.input_guardrails.iter().chain(&config.output_guardrails) {
        let Guardrail::Reference(reference) = guardrail else {
            continue;
        };
        if items.iter().any(|(known, _)| known == reference) {
            continue;
        }
        let value = catalog.require(Kind::Guardrail, reference, host)?;
        let inline = parse_stored_guardrail(&value, reference).map_err(|e| {
            GatewayError::new(502, "api_error", format!("stored guardrail '{reference}' is not usable: {e}"))
                .with_code("invalid_stored_guardrail")
        })?;
        items.push((reference.clone(), Item::from_inline(&inline, reference.clone())));
    }
    Ok(items)
}

/// The whole request body arrived: parse it when the gateway reads or changes it, and route
/// (`Ready`, or `Lookup` when a control-plane entry is needed first).
pub(crate) fn finish(
    settings: &Settings,
    pending: Pending,
    body: &[u8],
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Started, GatewayError> {
    catalog.workspace.clone_from(&pending.intake.workspace);
    let finished = finish_pass(settings, pending, body, host, catalog);
    or_lookup(finished, catalog)
}

fn finish_pass(
    settings: &Settings,
    pending: Pending,
    body: &[u8],
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Started, GatewayError> {
    let intake = pending.intake;
    if intake.endpoint == Endpoint::Resource {
        // Checked, then dropped: the client's bytes go upstream as they came.
        if let Some(kind) = resources::checked_body(&intake.method, &intake.path) {
            let fields = parse_object(body)?;
            resources::check_body(kind, &fields)?;
            if resources::is_immediate(kind, &fields) {
                // The gateway's own batching: the control plane runs it.
                if settings.control_plane.is_none() {
                    return Err(resources::immediate_unavailable());
                }
                // Its lines and input file go to the provider the headers select: one must be
                // (spec 4), as for any batch. The plan itself is not used here.
                plan_of(settings, &intake, None, host, catalog)?;
                let path = "/internal/v1/batches".to_string();
                return Ok(Started::Relay(Relay { path, workspace: intake.workspace }));
            }
        }
        return route(settings, intake, None, host, catalog).map(Started::Ready);
    }
    // Every JSON body the gateway holds is read: translators place requests by the model
    // (a deployment, a model in the path), the cache and conditions read the rest.
    let mut body = parse_object(body)?;
    if let Some(Prompt::Endpoint(id) | Prompt::Config(id)) = &intake.prompt {
        let version = catalog.require(Kind::Prompt, id, host)?;
        let rendered = match &intake.prompt {
            Some(Prompt::Endpoint(_)) => crate::prompts::render(&version, &body),
            _ => crate::prompts::apply_to_chat(&version, body),
        };
        body = rendered.map_err(|e| prompt_error(id, &e))?;
    }
    if intake.endpoint == Endpoint::Responses {
        continue_kept(&mut body, catalog, host)?;
    }
    route(settings, intake, Some(Value::Object(body)), host, catalog).map(Started::Ready)
}

/// A Responses request whose `previous_response_id` names a response the gateway keeps: the
/// kept conversation goes before its input (whichever target answers it next).
fn continue_kept(body: &mut Map<String, Value>, catalog: &mut Catalog, host: &dyn Host) -> Result<(), GatewayError> {
    let previous = body.get("previous_response_id").and_then(Value::as_str);
    let Some(previous) = previous.filter(|id| id.starts_with(KEPT_RESPONSE_PREFIX)).map(str::to_string) else {
        return Ok(());
    };
    if !catalog.enabled() {
        return Err(GatewayError::invalid_param(
            "previous_response_id",
            "previous_response_id: the gateway keeps responses only with its control plane, which is not configured",
        )
        .with_code("unsupported_parameter"));
    }
    let earlier = catalog.item(Kind::Response, &previous, host)?.ok_or_else(|| {
        let mut error = catalog::not_found(Kind::Response, &previous);
        error.status = 400;
        error.param = Some("previous_response_id".into());
        error
    })?;
    crate::client_api::responses::request::continued(body, &earlier);
    Ok(())
}

/// A prompt that cannot be rendered with the request (a missing variable, a bad field).
fn prompt_error(id: &str, e: &crate::errors::SharedError) -> GatewayError {
    let message = format!("prompt '{}': {}", id.chars().take(64).collect::<String>(), e.message());
    let mut error = GatewayError::new(e.status, "invalid_request_error", message).with_code("invalid_prompt_request");
    error.param = e.param();
    error
}

fn is_conditional(node: &Config) -> bool {
    node.strategy.as_ref().is_some_and(|s| s.mode == StrategyMode::Conditional)
}

/// What conditions read: the metadata, the body and the path (built only when a condition asks).
fn condition_input(intake: &Intake, body: Option<&Value>) -> Value {
    if intake.config.as_ref().is_some_and(|c| c.any_node(&is_conditional)) {
        json!({
            "metadata": intake.gateway.metadata.clone().unwrap_or_default(),
            "params": body.cloned().unwrap_or(Value::Null),
            "url": {"pathname": intake.path},
        })
    } else {
        Value::Null
    }
}

fn route(
    settings: &Settings,
    intake: Intake,
    body: Option<Value>,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Call, GatewayError> {
    let plan = plan_of(settings, &intake, body.as_ref(), host, catalog)?;
    let attempts = Attempts::start(plan, host)?;
    let response_id = (intake.endpoint == Endpoint::Responses)
        .then(|| format!("{KEPT_RESPONSE_PREFIX}{:016x}{:016x}", host.random(), host.random()));
    Ok(Call { intake, body, attempts, response_id })
}

/// The request's plan of attempts (which needs a selected provider).
fn plan_of(
    settings: &Settings,
    intake: &Intake,
    body: Option<&Value>,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Plan, GatewayError> {
    let input = condition_input(intake, body);
    make_plan(settings, &intake.gateway, intake.config.as_deref(), &input, host, catalog)
}

/// Whether and how a request is cached.
pub(crate) enum CachePlan {
    /// Not an endpoint the cache serves: no cache status either.
    Uncached,
    /// No cache config applies.
    Disabled,
    Lookup(Box<Lookup>),
}

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
    /// `index` sends to (`override_params` win over the client's model), whether the client
    /// asked for a stream, and its metadata. Read before `forward`, which may move the body.
    pub(crate) fn facts(&self, index: usize) -> Facts {
        let target = self.attempts.plan.attempts.get(index).map(|a| &a.target);
        let field = |name: &str| self.body.as_ref().and_then(|b| b.get(name));
        Facts {
            provider: target.map_or("", |t| t.provider.name),
            model: self.model_of(index).to_string(),
            stream: field("stream").and_then(Value::as_bool) == Some(true),
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
        self.intake.guardrails.iter().find(|(known, _)| known == reference).map(|(_, item)| item)
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

    /// Where the current attempt's target sits in the config (empty for the root).
    pub(crate) fn target_path(&self) -> &str {
        self.attempts.plan.attempts.get(self.attempts.current).map_or("", |a| a.path.as_str())
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
        // cut a stream that has started).
        edits.set.push((TIMEOUT_HEADER.into(), ms.to_string()));
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
fn with_usage(request: Cow<Value>) -> Value {
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

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    check_json_size(body, MAX_JSON_VALUES)?;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(GatewayError::invalid_param("body", "the request body must be a JSON object")),
        Err(_) if beyond_depth(body, MAX_JSON_DEPTH).is_some() => Err(GatewayError::invalid_param(
            "body",
            format!("the request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"),
        )),
        Err(e) => Err(GatewayError::invalid_param("body", format!("the request body is not valid JSON: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::testing::FakeHost;
    use crate::settings::CLUSTER_HEADER;
    use crate::unit_tests::test;

    fn settings() -> Settings {
        Settings::parse(br#"{"api_keys": ["gw-key"]}"#).unwrap()
    }

    fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        let mut h = vec![(":method".to_string(), method.into()), (":path".to_string(), path.into())];
        h.extend(extra.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())));
        h
    }

    const OPENAI_LOCAL: &[(&str, &str)] = &[
        ("x-gateway-api-key", "gw-key"),
        ("x-gateway-provider", "openai"),
        ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
        ("authorization", "Bearer sk-local"),
        ("x-custom-thing", "kept"),
        ("accept-encoding", "gzip"),
    ];

    fn started(h: &RawHeaders) -> Result<Started, GatewayError> {
        let settings = settings();
        let mut nothing = catalog::Nothing;
        start(&settings, h, &mut FakeHost::new(0), &mut Catalog::new(&settings, &mut nothing))
    }

    /// The call `h` and `body` make.
    fn routed(settings: &Settings, h: &RawHeaders, body: &[u8]) -> Result<Call, GatewayError> {
        let mut host = FakeHost::new(0);
        let mut nothing = catalog::Nothing;
        let mut catalog = Catalog::new(settings, &mut nothing);
        let started = match start(settings, h, &mut host, &mut catalog)? {
            Started::NeedsBody(pending) => finish(settings, pending, body, &mut host, &mut catalog)?,
            started => started,
        };
        match started {
            Started::Ready(call) => Ok(call),
            _ => panic!("not routed"),
        }
    }

    /// The first attempt's upstream request for headers `h` and `body`.
    fn forwarded(h: &RawHeaders, body: &[u8]) -> Result<Forward, GatewayError> {
        forwarded_with(&settings(), h, body)
    }

    fn forwarded_with(settings: &Settings, h: &RawHeaders, body: &[u8]) -> Result<Forward, GatewayError> {
        let mut call = routed(settings, h, body)?;
        call.forward(settings, h, call.attempts.current, None, &|| 1)
    }

    #[test]
    fn an_openai_stream_asks_for_usage_the_client_did_not() {
        let settings = Settings::parse(br#"{"api_keys": ["gw-key"]}"#).unwrap();
        let off = Settings::parse(br#"{"api_keys": ["gw-key"], "metrics": {"stream_usage": false}}"#).unwrap();
        let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        let stream =
            br#"{"model":"m","stream":true,"stream_options":{"x":1},"messages":[{"role":"user","content":"hi"}]}"#;
        let sent: Value =
            serde_json::from_slice(&forwarded_with(&settings, &h, stream).unwrap().body.unwrap()).unwrap();
        assert_eq!(sent["stream_options"], json!({"x": 1, "include_usage": true}));
        let stream = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let forward = forwarded_with(&settings, &h, stream).unwrap();
        let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
        assert_eq!(sent["stream_options"], json!({"include_usage": true}));
        assert!(forward.response.translator.translates_responses(), "the client's stream is rewritten");
        // The client asked itself, or no stream, or the setting off: the body goes as it came.
        let asked = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(forwarded_with(&settings, &h, asked).unwrap().body, None);
        assert_eq!(forwarded_with(&settings, &h, CHAT).unwrap().body, None);
        assert_eq!(forwarded_with(&off, &h, stream).unwrap().body, None);
        // A bad stream_options is the validation's to refuse, never replaced.
        let bad = br#"{"model":"m","stream":true,"stream_options":"x","messages":[{"role":"user","content":"hi"}]}"#;
        assert!(forwarded_with(&settings, &h, bad).is_err());
    }

    const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

    #[test]
    fn health_needs_no_key() {
        assert!(matches!(started(&request("GET", "/health", &[])), Ok(Started::Health)));
    }

    #[test]
    fn gateway_key_is_required() {
        let err = started(&request("POST", "/v1/chat/completions", &[])).err().unwrap();
        assert_eq!((err.status, err.code), (401, Some("missing_api_key")));
        assert!(err.message.contains("x-gateway-api-key"));
        let err = started(&request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "nope")])).err().unwrap();
        assert_eq!((err.status, err.code), (401, Some("invalid_api_key")));
        // Other header errors come only after the key: no key, no details.
        let err = started(&request("POST", "/v1/chat/completions", &[("x-gateway-metadata", "[1]")])).err().unwrap();
        assert_eq!(err.status, 401);
    }

    #[test]
    fn gateway_secrets_are_never_forwarded() {
        let mut h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        h.push((
            "x-gateway-forward-headers".into(),
            b"x-gateway-api-key, apikey, x-gateway-config, x-gateway-provider".to_vec(),
        ));
        h.push(("apikey".into(), b"gw-key".to_vec()));
        let edits = forwarded(&h, CHAT).ok().unwrap().headers;
        for gone in ["x-gateway-api-key", "apikey"] {
            assert!(edits.remove.iter().any(|n| n == gone), "{gone}");
        }
        // A non-secret gateway header may be forwarded on request.
        assert!(!edits.remove.iter().any(|n| n == "x-gateway-provider"));
    }

    #[test]
    fn other_header_bytes_pass_untouched() {
        let mut h = request("GET", "/v1/batches", OPENAI_LOCAL);
        h.push(("x-latin1".into(), b"caf\xe9".to_vec()));
        assert!(matches!(started(&h), Ok(Started::Ready(_))));
        let forward = forwarded(&h, b"").ok().unwrap();
        let upstream = forward.headers.apply(&h);
        assert!(upstream.contains(&("x-latin1", &b"caf\xe9"[..])));
        let mut bad = request("GET", "/v1/batches", OPENAI_LOCAL);
        bad.push(("x-gateway-metadata".into(), b"{\"a\":\"\xff\"}".to_vec()));
        assert_eq!(started(&bad).err().unwrap().param.as_deref(), Some("x-gateway-metadata"));
    }

    #[test]
    fn plans_upstream_headers() {
        let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        assert!(matches!(started(&h), Ok(Started::NeedsBody(_))), "chat needs the body");
        let forward = forwarded(&h, CHAT).ok().unwrap();
        let edits = &forward.headers;
        for gone in ["x-gateway-api-key", "x-gateway-provider", "x-gateway-custom-host", "accept-encoding"] {
            assert!(edits.remove.iter().any(|n| n == gone), "{gone}");
        }
        assert!(!edits.remove.iter().any(|n| n == "x-custom-thing"));
        let set = |name: &str| edits.set.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(set(":authority"), Some("127.0.0.1:9000"));
        assert_eq!(set(":path"), Some("/v1/chat/completions"));
        assert_eq!(set(CLUSTER_HEADER), Some("gateway_upstream_plain"));
        assert_eq!(set("authorization"), Some("Bearer sk-local"));
    }

    #[test]
    fn header_edits_apply_to_the_whole_map() {
        let edits = HeaderEdits {
            remove: vec!["x-gateway-api-key".into()],
            set: vec![(":authority".into(), "up:80".into()), ("x-new".into(), "1".into())],
        };
        let before = request("POST", "/p", &[(":authority", "gw"), ("x-gateway-api-key", "k"), ("x-keep", "v")]);
        let after = edits.apply(&before);
        let names: Vec<&str> = after.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, vec![":method", ":path", "x-keep", ":authority", "x-new"]);
        assert_eq!(after[3].1, b"up:80".as_slice());
    }

    #[test]
    fn passthrough_endpoints_keep_the_query() {
        let forward = forwarded(&request("GET", "/v1/batches?limit=2", OPENAI_LOCAL), b"").ok().unwrap();
        assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/batches?limit=2".to_string())));
    }

    #[test]
    fn resource_requests_are_checked_then_sent_as_they_came() {
        let bad = started(&request("GET", "/v1/batches?limit=101", OPENAI_LOCAL)).err().unwrap();
        assert_eq!((bad.status, bad.param.as_deref()), (400, Some("limit")));
        let bad = started(&request("GET", "/v1/batches/a%2Fb", OPENAI_LOCAL)).err().unwrap();
        assert_eq!(bad.param.as_deref(), Some("batch_id"));
        // The key still comes first.
        assert_eq!(started(&request("GET", "/v1/batches?limit=0", &[])).err().unwrap().status, 401);
        let h = request("POST", "/v1/batches?x=%20", OPENAI_LOCAL);
        assert!(matches!(started(&h), Ok(Started::NeedsBody(_))), "a batch body is read");
        let bad = forwarded(&h, br#"{"input_file_id":"f","endpoint":"/v1/chat/completions","completion_window":"1h"}"#);
        assert_eq!(bad.err().unwrap().param.as_deref(), Some("completion_window"));
        // override_params never reach a resource body: the client's bytes go.
        let config = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","override_params":{"model":"forced"}}"#;
        let h = request("POST", "/v1/batches?x=%20", &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
        let body = br#"{"input_file_id":"f", "endpoint":"/v1/embeddings","completion_window":"24h"}"#;
        let forward = forwarded(&h, body).ok().unwrap();
        assert_eq!(forward.body, None);
        assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/batches?x=%20".to_string())));
        assert!(!forward.headers.set.iter().any(|(n, _)| n == "content-length"));
        // Without a provider: the headers that select one are named.
        let h = request("GET", "/v1/batches", &[("x-gateway-api-key", "gw-key")]);
        let missing = started(&h).err().unwrap();
        assert_eq!(missing.code, Some("missing_provider"));
        assert!(missing.message.contains("x-gateway-provider") && missing.message.contains("x-gateway-virtual-key"));
    }

    #[test]
    fn untouched_openai_chat_keeps_its_bytes() {
        let forward = forwarded(&request("POST", "/v1/chat/completions", OPENAI_LOCAL), CHAT).ok().unwrap();
        assert!(forward.body.is_none());
        assert!(!forward.response.translator.translates_responses());
    }

    #[test]
    fn override_params_rewrite_the_body() {
        let config = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","override_params":{"model":"forced"}}"#;
        let h =
            request("POST", "/v1/chat/completions", &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
        let forward = forwarded(&h, CHAT).ok().unwrap();
        let body: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
        assert_eq!(body["model"], "forced");
        let length = forward.headers.set.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.clone());
        assert_eq!(length, Some(body.to_string().len().to_string()));
    }

    #[test]
    fn bad_bodies_are_400s() {
        let too_many_values = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES));
        for body in
            [&b"not json"[..], b"[1]", b"{\"model\":\"m\",\"messages\":[]}", b"\xff\xfe", too_many_values.as_bytes()]
        {
            let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
            assert_eq!(forwarded(&h, body).err().unwrap().status, 400);
        }
    }

    fn cache_plan(config: &str, path: &str, body: &[u8]) -> CachePlan {
        let h = request("POST", path, &[("x-gateway-api-key", "gw-key"), ("x-gateway-config", config)]);
        routed(&settings(), &h, body).ok().unwrap().cache_plan()
    }

    fn cache_key(config: &str, body: &[u8]) -> cache::Key {
        match cache_plan(config, "/v1/chat/completions", body) {
            CachePlan::Lookup(lookup) => lookup.key,
            _ => panic!("not cached"),
        }
    }

    #[test]
    fn the_cache_key_is_taken_after_override_params() {
        let plain =
            r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple"}}"#;
        let forced = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple"},"override_params":{"model":"forced"}}"#;
        let same = r#"{"provider":"openai","api_key":"k2","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"simple","max_age":5},"override_params":{"model":"m"}}"#;
        assert_ne!(cache_key(plain, CHAT), cache_key(forced, CHAT));
        // The provider credential and max_age are not part of it; the same resulting body is.
        assert_eq!(cache_key(plain, CHAT), cache_key(same, CHAT));
        let other = br#"{"model":"forced","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(cache_key(forced, CHAT), cache_key(plain, other));
    }

    #[test]
    fn cache_plans_by_endpoint_and_config() {
        let cached =
            r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1","cache":{"mode":"semantic"}}"#;
        let uncached = r#"{"provider":"openai","api_key":"k","custom_host":"http://127.0.0.1:9/v1"}"#;
        assert!(matches!(cache_plan(uncached, "/v1/chat/completions", CHAT), CachePlan::Disabled));
        assert!(matches!(cache_plan(cached, "/v1/moderations", br#"{"input":"x"}"#), CachePlan::Uncached));
        let CachePlan::Lookup(lookup) = cache_plan(cached, "/v1/embeddings", br#"{"model":"e","input":"x"}"#) else {
            panic!("embeddings are cached");
        };
        assert_eq!((lookup.conversation, lookup.max_age_ms), (None, cache::DEFAULT_MAX_AGE_SECONDS * 1000));
        let stream = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
        let CachePlan::Lookup(lookup) = cache_plan(cached, "/v1/chat/completions", stream) else {
            panic!("chat is cached");
        };
        assert!(lookup.stream && lookup.include_usage && !lookup.refresh);
        assert_eq!(lookup.conversation.as_deref(), Some("user: hi"));
        assert_eq!(lookup.key, cache_key(cached, CHAT));
    }

    #[test]
    fn a_translated_request_leaves_the_clients_query_behind() {
        let messages = br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
        let h = request("POST", "/v1/messages?beta=true", OPENAI_LOCAL);
        let forward = forwarded(&h, messages).ok().unwrap();
        assert!(forward.headers.set.contains(&(":path".to_string(), "/v1/chat/completions".to_string())));
        let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
        assert_eq!(sent["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn a_count_goes_to_a_provider_that_counts_and_only_there() {
        let count = br#"{"model":"gemini-2.5-flash","system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#;
        let google = [
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-provider", "google"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000"),
            ("x-api-key", "gm-key"),
        ];
        let forward = forwarded(&request("POST", "/v1/messages/count_tokens", &google), count).ok().unwrap();
        let path = forward.headers.set.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.as_str());
        assert_eq!(path, Some("/v1beta/models/gemini-2.5-flash:countTokens"));
        let sent: Value = serde_json::from_slice(&forward.body.unwrap()).unwrap();
        assert_eq!(sent["generateContentRequest"]["model"], "models/gemini-2.5-flash");
        assert!(sent["generateContentRequest"]["contents"].is_array());
        let mut translator = forward.response.translator;
        let answer = translator.response(br#"{"totalTokens": 12}"#).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&answer).unwrap(), json!({"input_tokens": 12}));
        // A provider that cannot count is told so, before any call.
        let error = forwarded(&request("POST", "/v1/messages/count_tokens", OPENAI_LOCAL), count).err().unwrap();
        assert_eq!(error.status, 400);
        assert!(error.message.contains("cannot count tokens"), "{}", error.message);
    }

    #[test]
    fn kept_responses_need_the_control_plane() {
        let h = request("POST", "/v1/responses", OPENAI_LOCAL);
        let body = br#"{"model":"m","input":"more","previous_response_id":"resp_gw_0123"}"#;
        let error = forwarded(&h, body).err().unwrap();
        assert_eq!((error.status, error.param.as_deref()), (400, Some("previous_response_id")));
        assert!(error.message.contains("control plane"), "{}", error.message);
        // A provider's own id goes to the provider that speaks Responses (it keeps its own).
        let body = br#"{"model":"m","input":"more","previous_response_id":"resp_abc"}"#;
        assert!(forwarded(&h, body).is_ok());
        let missing = started(&request("GET", "/v1/responses/resp_gw_0123", OPENAI_LOCAL)).err().unwrap();
        assert_eq!(missing.status, 404);
        assert!(matches!(started(&request("GET", "/v1/responses/resp_abc", OPENAI_LOCAL)), Ok(Started::Ready(_))));
        assert_eq!(
            kept_response_path("/responses/resp_gw_1/input_items", Some("limit=2")).as_deref(),
            Some("/internal/v1/responses/resp_gw_1/input_items?limit=2")
        );
        assert_eq!(kept_response_path("/responses/resp_1", None), None);
    }

    #[test]
    fn thinking_needs_non_strict_mode() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}"#;
        let h = request("POST", "/v1/chat/completions", OPENAI_LOCAL);
        assert_eq!(forwarded(&h, body).err().unwrap().param.as_deref(), Some("thinking"));
    }
}
