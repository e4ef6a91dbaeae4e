//! A request's way through the gateway as plain decisions: the host adapter feeds it
//! headers and body and applies what it returns. Here: what the request headers and then the
//! body decide (authentication, gateway headers, config, validation, the plan); the upstream
//! request of each attempt in `call.rs`; a request as each target's API takes it (a client
//! API's request as chat for a target that does not speak it) in `target_api.rs`.

mod call;
mod mcp_start;
mod target_api;

pub(crate) use target_api::{in_target_api, TargetRequest};

use crate::cache::{self, Lookup, Tenant};
use crate::catalog::{self, Catalog, Entry, KeyOwner, Kind, Ref, DEFAULT_WORKSPACE};
use crate::config::{parse_config, Config, StrategyMode};
use crate::errors::GatewayError;
use crate::guardrails::spec::{parse_stored_guardrail, Guardrail};
use crate::guardrails::verdict::Item;
use crate::json_check::{beyond_depth, MAX_JSON_DEPTH};
use crate::mcp;
use crate::ports::Host;
use crate::providers::{ProviderSpec, Translator};
use crate::request::endpoint::{classify, BodyMode, ClientApi, Endpoint, Route};
use crate::request::headers::{self, decode_value, is_gateway_header, GatewayHeaders, PROVIDER_KEY_HEADER};
use crate::request::limits::{check_json_size, MAX_JSON_VALUES};
use crate::request::resources;
use crate::routing::attempts::Attempts;
use crate::routing::plan::{make_plan, Plan};
use crate::routing::{config_header, saved_config_unavailable, ConfigHeader};
use crate::settings::Settings;
use crate::wire_names::{
    control_plane_fetch_marker, CLIENT_AUTHORIZATION_HEADER, CONTROL_PLANE_FETCH_HEADER, WORKSPACE_HEADER,
};
use serde_json::{json, Map, Value};
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
    /// The MCP endpoints' OAuth metadata (RFC 9728), when `mcp_oauth` is set.
    McpMetadata,
    /// An MCP request whose access token needs the issuer's JWKS at this URI first; it is
    /// processed again once the JWKS is in.
    Jwks(String),
    Ready(Call),
    NeedsBody(Pending),
    /// The request needs this control-plane entry first; it is processed again once the entry
    /// is known.
    Lookup(Ref),
    /// A gateway-managed batch (or its file): the request goes as it came to the control
    /// plane, through Envoy's router, with `Relay::edits`.
    Relay(Relay),
    /// A request to an MCP server, routed through Envoy's router with `routed`'s edits.
    Mcp {
        target: mcp::Target,
        key_id: Option<String>,
        /// The workspace's limits (its MCP limits count tool calls).
        policy: Entry,
        /// The config header's hooks and guardrails, which check tool calls.
        checks: Option<Box<ToolChecks>>,
    },
}

/// The config an MCP request names (`x-gateway-config`) and the stored guardrails it refers
/// to: its hooks and guardrails check each tool call's arguments and result (docs/mcp.md).
pub(crate) struct ToolChecks {
    pub(crate) config: Rc<Config>,
    pub(crate) stored: Vec<(String, Item)>,
}

impl ToolChecks {
    /// The checks of the config header `raw` names (inline, or saved in the workspace).
    fn of(raw: &str, catalog: &mut Catalog, host: &dyn Host) -> Result<ToolChecks, GatewayError> {
        let config = config_of(raw, catalog, host)?;
        let stored = match catalog.enabled() {
            true => stored_guardrails(&config, catalog, host)?,
            false => Vec::new(),
        };
        Ok(ToolChecks { config, stored })
    }

    /// A stored guardrail the config refers to, as the control plane gave it.
    pub(crate) fn stored_guardrail(&self, reference: &str) -> Option<&Item> {
        find_stored(&self.stored, reference)
    }
}

fn find_stored<'a>(stored: &'a [(String, Item)], reference: &str) -> Option<&'a Item> {
    stored.iter().find(|(known, _)| known == reference).map(|(_, item)| item)
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

/// Whether the gateway reads the body of the request with headers `raw` (a JSON POST, or a
/// POST's JSON-RPC message to an MCP endpoint).
pub(crate) fn reads_body(raw: &RawHeaders) -> bool {
    let pseudo = |name: &str| headers::find(raw, name).map(String::from_utf8_lossy).unwrap_or_default();
    let method = pseudo(":method");
    let read =
        matches!(classify(&method, &pseudo(":path")), Ok(Route::Api { body: BodyMode::Json, .. } | Route::Mcp { .. }));
    read && method == "POST"
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
    let (endpoint, body, path, query, prompt) = match classify(&method, &pseudo(":path"))? {
        Route::Health => return Ok(Started::Health),
        Route::McpMetadata => return Ok(Started::McpMetadata),
        Route::Mcp { path, query } => {
            return mcp_start::start_mcp(settings, raw, &method, &path, query.as_deref(), host, catalog)
        }
        Route::Api { endpoint, body, path, query, prompt } => (endpoint, body, path, query, prompt),
    };
    // The key comes first: a caller without one learns nothing else about the request.
    let refusals = Refusals { missing: missing_key, invalid: invalid_key };
    let KeyOwner { workspace, key_id, .. } = caller(settings, headers::api_key(raw), &refusals, host, catalog)?;
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

/// The answers to a request without a key, and with a wrong one.
struct Refusals {
    missing: fn() -> GatewayError,
    invalid: fn() -> GatewayError,
}

fn missing_key() -> GatewayError {
    GatewayError::new(
        401,
        "authentication_error",
        "missing x-gateway-api-key header: every request needs a gateway API key",
    )
    .with_code("missing_api_key")
}

/// (The catalog's answer for a key it does not know.)
fn invalid_key() -> GatewayError {
    catalog::not_found(Kind::Key, "")
}

/// The caller's workspace, key id and MCP tools, from the gateway key it `presented`: a key of
/// the plugin configuration (the default workspace, every tool), else with a control plane one
/// of its keys.
fn caller(
    settings: &Settings,
    presented: Option<&[u8]>,
    refusals: &Refusals,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<KeyOwner, GatewayError> {
    match presented {
        Some(key) if settings.authenticate(key) => {
            Ok(KeyOwner { workspace: DEFAULT_WORKSPACE.to_string(), key_id: None, mcp_tools: None })
        }
        Some(key) if catalog.enabled() => catalog.key_owner(key, host)?.ok_or_else(refusals.invalid),
        Some(_) => Err((refusals.invalid)()),
        None => Err((refusals.missing)()),
    }
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
mod tests;
