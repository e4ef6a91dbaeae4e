//! Routing: which provider targets a request goes to and what happens when one fails.
//! `plan` walks the strategy tree into an ordered plan of attempts, `attempts` drives it
//! through failures (retries, fallback, circuit breaker); this file builds single targets.

pub(crate) mod attempts;
pub(crate) mod breaker;
pub(crate) mod plan;
pub(crate) mod retry;

use crate::cache::settings::CacheConfig;
use crate::catalog::{Catalog, Kind};
use crate::cloud::CloudFields;
use crate::config::{nested_too_deep, parse_config, CircuitBreakerConfig, Config, RetryConfig};
use crate::credential::Credential;
use crate::errors::GatewayError;
use crate::guardrails::spec::Guardrail;
use crate::memo::{self, Memo};
use crate::ports::Host;
use crate::providers::{self, Backend, ProviderSpec, TargetFields};
use crate::request::headers::GatewayHeaders;
use crate::settings::Settings;
use crate::upstream::Upstream;
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::rc::Rc;

/// Per-target options a config sets; children inherit them from their parents.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TargetOptions {
    pub(crate) override_params: Map<String, Value>,
    pub(crate) forward_headers: Vec<String>,
    pub(crate) strict_vendor_compliance: bool,
    pub(crate) request_timeout: Option<u64>,
    pub(crate) retry: Option<RetryConfig>,
    pub(crate) cb_config: Option<CircuitBreakerConfig>,
    pub(crate) cache: Option<CacheConfig>,
}

impl TargetOptions {
    pub(crate) fn from_headers(headers: &GatewayHeaders) -> Self {
        TargetOptions {
            override_params: Map::new(),
            forward_headers: headers.forward_headers.clone().unwrap_or_default(),
            strict_vendor_compliance: true,
            request_timeout: headers.request_timeout,
            retry: None,
            cb_config: None,
            cache: None,
        }
    }

    /// The options of `node` on top of its parent's: set values win, override params merge.
    pub(crate) fn inherit(&self, node: &Config) -> Self {
        let mut merged = self.clone();
        if let Some(params) = &node.override_params {
            merged.override_params.extend(params.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if let Some(names) = &node.forward_headers {
            for name in names {
                if !merged.forward_headers.contains(name) {
                    merged.forward_headers.push(name.clone());
                }
            }
        }
        if let Some(strict) = node.strict_vendor_compliance {
            merged.strict_vendor_compliance = strict;
        }
        // The header's timeout is the caller's own limit; a config value replaces it.
        if node.request_timeout.is_some() {
            merged.request_timeout = node.request_timeout;
        }
        if node.retry.is_some() {
            merged.retry = node.retry.clone();
        }
        if node.cb_config.is_some() {
            merged.cb_config = node.cb_config.clone();
        }
        if node.cache.is_some() {
            merged.cache = node.cache.clone();
        }
        merged
    }
}

/// The provider one attempt goes to.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) provider: &'static ProviderSpec,
    /// The provider bound to this target's options and credentials.
    pub(crate) backend: Rc<dyn Backend>,
    /// The credential that tells this target's account apart (its circuit is its own).
    pub(crate) account: Option<String>,
    pub(crate) upstream: Upstream,
    pub(crate) vendor_organization: Option<String>,
    pub(crate) vendor_project: Option<String>,
    pub(crate) options: TargetOptions,
}

/// A provider choice before its location is known.
struct Choice {
    provider: String,
    api_key: Option<String>,
    custom_host: Option<String>,
    vendor_organization: Option<String>,
    vendor_project: Option<String>,
    cloud: CloudFields,
}

/// The config header: a JSON config object, or the id of a saved config.
pub(crate) enum ConfigHeader<'a> {
    Inline(Rc<Config>),
    Saved(&'a str),
}

/// Inline configs a worker keeps (see `config_header`).
const CONFIG_MEMO_ENTRIES: usize = 32;

thread_local! {
    /// This worker's validated inline configs by the header's exact text: clients send the
    /// same config with every request. A config read from the header is a function of its
    /// text alone (an `@slug` or a stored guardrail stays a name, resolved per request in the
    /// caller's workspace), so one entry serves every caller sending that text.
    static CONFIG_MEMO: RefCell<Memo<Config>> = RefCell::new(Memo::new(CONFIG_MEMO_ENTRIES));
}

/// Reads the config header: JSON (an object; anything else is refused as a config), or a
/// saved config's id or slug (any text that is not JSON; one outside the id characters is
/// then unknown). A valid inline config comes from this worker's memo when it read the same
/// text lately.
pub(crate) fn config_header(raw: &str) -> Result<ConfigHeader<'_>, GatewayError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        let why = "empty: give a config object (JSON) or a saved config's id";
        return Err(GatewayError::invalid_header("x-gateway-config", why).with_code("invalid_config"));
    }
    let json = trimmed.starts_with(['{', '[']);
    if !json && crate::catalog::valid_id(trimmed) {
        return Ok(ConfigHeader::Saved(trimmed));
    }
    // Text that is not JSON is a saved config's name, or an error when it looks like JSON.
    let mut not_json = None;
    let parsed = memo::cached(&CONFIG_MEMO, raw, || {
        let value = serde_json::from_str::<Value>(raw).map_err(|e| match nested_too_deep(raw.as_bytes()) {
            Some(deep) => Some(deep.to_gateway_error()),
            None => {
                not_json = Some(e);
                None
            }
        })?;
        parse_config(&value).map_err(|e| Some(e.to_gateway_error()))
    });
    match (parsed, not_json) {
        (Ok(config), _) => Ok(ConfigHeader::Inline(config)),
        (Err(Some(error)), _) => Err(error),
        (Err(None), Some(e)) if json => {
            Err(GatewayError::invalid_header("x-gateway-config", format!("not valid JSON: {e}"))
                .with_code("invalid_config"))
        }
        (Err(None), _) => Ok(ConfigHeader::Saved(trimmed)),
    }
}

/// The config header without a control plane: a saved id is refused.
#[cfg(test)]
pub(crate) fn parse_config_header(raw: &str) -> Result<Rc<Config>, GatewayError> {
    match config_header(raw)? {
        ConfigHeader::Inline(config) => Ok(config),
        ConfigHeader::Saved(id) => Err(saved_config_unavailable(id)),
    }
}

pub(crate) fn saved_config_unavailable(id: &str) -> GatewayError {
    GatewayError::new(
        400,
        "invalid_request_error",
        format!(
            "x-gateway-config '{}' looks like a saved config id; saved configs need the control plane, \
             which this gateway is not configured with: send the config as a JSON object",
            id.chars().take(64).collect::<String>()
        ),
    )
    .with_code("saved_config_unavailable")
}

/// The target a config node without a strategy names: its provider or virtual key, else
/// (a config that sets only options such as retry) the provider the headers select.
pub(crate) fn leaf_target(
    settings: &Settings,
    headers: &GatewayHeaders,
    node: &Config,
    options: TargetOptions,
    catalog: &mut Catalog,
    host: &dyn Host,
) -> Result<Target, GatewayError> {
    let choice = if let Some(provider) = &node.provider {
        match provider.strip_prefix('@') {
            Some(slug) => choice_from_credential(settings, slug, headers, catalog, host)?,
            None => Choice {
                provider: provider.clone(),
                // Credentials in the config win over the client's Authorization header.
                api_key: node.api_key.clone().or_else(|| headers.provider_key().cloned()),
                custom_host: node.custom_host.clone(),
                vendor_organization: None,
                vendor_project: None,
                cloud: headers.cloud.clone(),
            },
        }
    } else if let Some(virtual_key) = &node.virtual_key {
        choice_from_credential(settings, virtual_key, headers, catalog, host)?
    } else {
        choice_from_headers(settings, headers, catalog, host)?
    };
    let choice = Choice {
        vendor_organization: node.vendor_organization.clone().or(choice.vendor_organization),
        vendor_project: node.vendor_project.clone().or(choice.vendor_project),
        cloud: node.cloud.clone().or(&choice.cloud),
        ..choice
    };
    build_target(settings, choice, options)
}

/// The target the headers alone select (no config).
pub(crate) fn header_target(
    settings: &Settings,
    headers: &GatewayHeaders,
    catalog: &mut Catalog,
    host: &dyn Host,
) -> Result<Target, GatewayError> {
    let choice = choice_from_headers(settings, headers, catalog, host)?;
    build_target(settings, choice, TargetOptions::from_headers(headers))
}

/// Config features this build validates but cannot run yet. Those that change the request
/// or guard it are refused rather than skipped: silently dropping a guardrail or a prompt
/// template would send something the user did not intend. (The cache only makes a call
/// cheaper, so it is accepted.)
/// `control_plane`: stored guardrails and the prompt of the top-level config are read from it.
pub(crate) fn unavailable_feature(node: &Config, root: bool, control_plane: bool) -> Option<&'static str> {
    let has_hooks = !node.input_guardrails.is_empty()
        || !node.output_guardrails.is_empty()
        || !node.before_request_hooks.is_empty()
        || !node.after_request_hooks.is_empty();
    let stored =
        node.input_guardrails.iter().chain(&node.output_guardrails).any(|g| matches!(g, Guardrail::Reference(_)));
    if node.prompt_id.is_some() && !(root && control_plane) {
        Some(if root {
            "prompt_id (prompt templates need the control plane)"
        } else {
            "prompt_id on a target (only the top-level config's applies; move it there)"
        })
    } else if stored && root && !control_plane {
        Some("a stored guardrail (a string in input_guardrails/output_guardrails needs the control plane; write the guardrail inline)")
    } else if has_hooks && !root {
        Some("hooks and guardrails on a target (only the top-level config's apply; move them there)")
    } else {
        None
    }
}

pub(crate) fn not_implemented(feature: &str) -> GatewayError {
    GatewayError::new(501, "api_error", format!("{feature} is not available in this gateway build yet"))
        .with_code("not_implemented")
}

/// A stored credential (the plugin configuration's, else the control plane's in the caller's
/// workspace); the cloud headers fill only the fields it leaves unset.
fn choice_from_credential(
    settings: &Settings,
    name: &str,
    headers: &GatewayHeaders,
    catalog: &mut Catalog,
    host: &dyn Host,
) -> Result<Choice, GatewayError> {
    let stored;
    let credential = match settings.credentials.get(name) {
        Some(credential) => credential,
        None if catalog.enabled() => {
            let value = catalog.require(Kind::Provider, name, host)?;
            stored = Credential::try_from(value.as_ref().clone()).map_err(|why| {
                GatewayError::new(502, "api_error", format!("the stored provider is not usable: {why}"))
                    .with_code("invalid_stored_provider")
            })?;
            &stored
        }
        None => settings.credential(name)?,
    };
    Ok(Choice {
        provider: credential.provider.clone(),
        api_key: credential.api_key.clone(),
        custom_host: credential.custom_host.clone(),
        vendor_organization: credential.vendor_organization.clone(),
        vendor_project: credential.vendor_project.clone(),
        cloud: credential.cloud.clone().or(&headers.cloud),
    })
}

fn choice_from_headers(
    settings: &Settings,
    headers: &GatewayHeaders,
    catalog: &mut Catalog,
    host: &dyn Host,
) -> Result<Choice, GatewayError> {
    if let Some(virtual_key) = &headers.virtual_key {
        return choice_from_credential(settings, virtual_key, headers, catalog, host);
    }
    match &headers.provider {
        Some(provider) => match provider.strip_prefix('@') {
            Some(slug) => choice_from_credential(settings, slug, headers, catalog, host),
            None => Ok(Choice {
                provider: provider.clone(),
                api_key: headers.provider_key().cloned(),
                custom_host: headers.custom_host.clone(),
                vendor_organization: None,
                vendor_project: None,
                cloud: headers.cloud.clone(),
            }),
        },
        None => Err(GatewayError::new(
            400,
            "invalid_request_error",
            "no provider selected: send x-gateway-provider (a provider name with Authorization: Bearer, \
             or @slug), x-gateway-virtual-key, or x-gateway-config",
        )
        .with_code("missing_provider")),
    }
}

fn build_target(settings: &Settings, choice: Choice, options: TargetOptions) -> Result<Target, GatewayError> {
    let provider = providers::find(&choice.provider).ok_or_else(|| {
        let known: Vec<&str> = providers::PROVIDERS.iter().map(|p| p.name).collect();
        GatewayError::invalid_param(
            "provider",
            format!("unknown provider '{}'; known providers: {}", choice.provider, known.join(", ")),
        )
        .with_code("unknown_provider")
    })?;
    let custom = match &choice.custom_host {
        Some(custom_host) => {
            let upstream = Upstream::parse(custom_host)
                .map_err(|e| GatewayError::invalid_param("custom_host", format!("custom host {e}")))?;
            settings.require_allowed("custom host", &upstream.host)?;
            Some(upstream)
        }
        None => None,
    };
    let fields = TargetFields {
        api_key: choice.api_key.as_deref(),
        custom_host: custom.is_some(),
        built_in: provider.base_url,
        cloud: &choice.cloud,
    };
    let binding = provider.kind.bind(provider.name, fields)?;
    let upstream = match (custom, binding.base_url.as_deref().or(provider.base_url)) {
        (Some(custom), _) => custom,
        (None, Some(base_url)) => Upstream::parse(base_url)
            .map_err(|e| GatewayError::new(500, "api_error", format!("built-in base URL {e}")))?,
        (None, None) => return Err(providers::no_endpoint(provider.name)),
    };
    Ok(Target {
        provider,
        backend: binding.backend,
        account: binding.account,
        upstream,
        vendor_organization: choice.vendor_organization,
        vendor_project: choice.vendor_project,
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn settings() -> Settings {
        Settings::parse(
            br#"{"api_keys": ["gw"], "credentials": {
                "openai-prod": {"provider": "openai", "api_key": "sk-stored"},
                "vk-local": {"provider": "anthropic", "api_key": "sk-ant", "custom_host": "http://127.0.0.1:9/v1"},
                "azure-prod": {"provider": "azure-openai", "api_key": "az-stored", "resource_name": "contoso",
                               "api_version": "2024-10-21"},
                "vertex-prod": {"provider": "vertex-ai", "cloud_b_region": "europe-west4",
                                "cloud_b_project_id": "stored-project", "api_key": "ya29.stored"}}}"#,
        )
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> GatewayHeaders {
        GatewayHeaders::parse(pairs.iter().copied()).unwrap()
    }

    /// The first target of the plan the headers make.
    fn select_target(settings: &Settings, headers: &GatewayHeaders, random: u64) -> Result<Target, GatewayError> {
        let config = headers.config.as_deref().map(parse_config_header).transpose()?;
        let mut host = crate::ports::testing::FakeHost::new(random);
        let mut nothing = crate::catalog::Nothing;
        let mut catalog = Catalog::new(settings, &mut nothing);
        let plan = plan::make_plan(settings, headers, config.as_deref(), &Value::Null, &mut host, &mut catalog)?;
        plan.attempts
            .into_iter()
            .next()
            .map(|a| a.target)
            .ok_or_else(|| GatewayError::new(500, "api_error", "empty plan"))
    }

    fn select(pairs: &[(&str, &str)]) -> Result<Target, GatewayError> {
        select_target(&settings(), &headers(pairs), 0)
    }

    #[test]
    fn provider_name_with_bearer() {
        let t = select(&[("x-gateway-provider", "openai"), ("authorization", "Bearer sk-1")]).unwrap();
        assert_eq!(t.provider.name, "openai");
        assert_eq!(t.account.as_deref(), Some("sk-1"));
        assert_eq!(t.upstream.authority, "api.openai.com:443");
    }

    #[test]
    fn slug_and_virtual_key_use_stored_credentials() {
        let t = select(&[("x-gateway-provider", "@openai-prod")]).unwrap();
        assert_eq!(t.account.as_deref(), Some("sk-stored"));
        let t = select(&[("x-gateway-virtual-key", "vk-local")]).unwrap();
        assert_eq!(t.provider.name, "anthropic");
        assert_eq!(t.upstream.authority, "127.0.0.1:9");
        assert_eq!(select(&[("x-gateway-virtual-key", "nope")]).err().unwrap().status, 401);
    }

    #[test]
    fn cloud_fields_come_from_the_config_the_headers_and_stored_credentials() {
        // A stored credential's fields; the headers fill the ones it leaves unset.
        let t = select(&[("x-gateway-provider", "@azure-prod"), ("x-gateway-cloud-a-deployment-id", "gpt4o")]).unwrap();
        assert_eq!(
            (t.upstream.authority.as_str(), t.account.as_deref()),
            ("contoso.openai.azure.com:443", Some("az-stored"))
        );
        // Without the header the stored credential lacks a deployment: a 400 naming it.
        let err = select(&[("x-gateway-provider", "@azure-prod")]).err().unwrap();
        assert_eq!((err.status, err.param.as_deref()), (400, Some("deployment_id")));
        // A config's field wins over the header's.
        let config = r#"{"provider": "vertex-ai", "cloud_b_region": "us-east5", "cloud_b_project_id": "p"}"#;
        let t = select(&[
            ("x-gateway-config", config),
            ("x-gateway-cloud-b-region", "asia-south1"),
            ("authorization", "Bearer ya29.t"),
        ])
        .unwrap();
        assert_eq!(t.upstream.authority, "us-east5-aiplatform.googleapis.com:443");
        let t = select(&[("x-gateway-provider", "@vertex-prod")]).unwrap();
        assert_eq!(t.upstream.authority, "europe-west4-aiplatform.googleapis.com:443");
    }

    #[test]
    fn stored_credentials_are_checked_as_config_targets() {
        let bad = br#"{"api_keys": ["gw"], "credentials": {"x": {"provider": "openai", "api_key": "k", "retry": {}}}}"#;
        // (The message gives the place, never the values: the configuration holds keys.)
        assert!(Settings::parse(bad).is_err());
        let slug = br#"{"api_keys": ["gw"], "credentials": {"x": {"provider": "@other", "api_key": "k"}}}"#;
        assert!(Settings::parse(slug).is_err());
        let shape = br#"{"api_keys": ["gw"], "credentials": {"x": {"provider": "bedrock", "cloud_c_region": 5}}}"#;
        assert!(Settings::parse(shape).is_err());
        let good = br#"{"api_keys": ["gw"], "credentials": {"x": {"provider": "bedrock", "cloud_c_region": "us-east-1",
            "cloud_c_access_key_id": "AK", "cloud_c_secret_access_key": "SK"}}}"#;
        assert_eq!(Settings::parse(good).unwrap().credentials["x"].cloud.aws_region.as_deref(), Some("us-east-1"));
    }

    #[test]
    fn an_inline_config_is_read_once_per_worker_by_its_exact_text() {
        let text = r#"{"provider": "@team-openai", "input_guardrails": ["pg-1"]}"#;
        let first = parse_config_header(text).unwrap();
        assert!(Rc::ptr_eq(&first, &parse_config_header(text).unwrap()));
        // Names stay names: the caller's workspace resolves them on every request.
        assert_eq!(first.provider.as_deref(), Some("@team-openai"));
        assert_eq!(first.input_guardrails, vec![Guardrail::Reference("pg-1".into())]);
        let spaced = format!(" {text}");
        assert!(!Rc::ptr_eq(&first, &parse_config_header(&spaced).unwrap()));
        let invalid = r#"{"retry": {"attempts": 99}}"#;
        for _ in 0..2 {
            assert_eq!(parse_config_header(invalid).err().unwrap().code, Some("invalid_config"));
        }
        assert_eq!(parse_config_header("{bad").err().unwrap().code, Some("invalid_config"));
        for empty in ["", "  "] {
            let error = parse_config_header(empty).err().unwrap();
            assert_eq!(
                (error.status, error.code, error.param.as_deref()),
                (400, Some("invalid_config"), Some("x-gateway-config"))
            );
        }
        assert_eq!(parse_config_header("pc-1").err().unwrap().code, Some("saved_config_unavailable"));
    }

    #[test]
    fn custom_hosts_follow_the_allow_list() {
        let t =
            select(&[("x-gateway-provider", "openai"), ("x-gateway-custom-host", "http://localhost:8000/v1")]).unwrap();
        assert!(!t.upstream.tls);
        let err =
            select(&[("x-gateway-provider", "openai"), ("x-gateway-custom-host", "http://10.1.2.3/v1")]).err().unwrap();
        assert_eq!((err.status, err.kind), (403, "permission_error"));
    }

    #[test]
    fn missing_pieces_are_clear_errors() {
        assert_eq!(select(&[]).err().unwrap().code, Some("missing_provider"));
        assert_eq!(select(&[("x-gateway-provider", "openai")]).err().unwrap().status, 401);
        assert_eq!(
            select(&[("x-gateway-provider", "nope"), ("authorization", "Bearer k")]).err().unwrap().code,
            Some("unknown_provider")
        );
        assert_eq!(select(&[("x-gateway-provider", "ollama")]).err().unwrap().param.as_deref(), Some("custom_host"));
        assert_eq!(select(&[("x-gateway-config", "pc-123")]).err().unwrap().code, Some("saved_config_unavailable"));
        assert_eq!(select(&[("x-gateway-config", "{bad")]).err().unwrap().code, Some("invalid_config"));
        assert_eq!(select(&[("x-gateway-config", "[1]")]).err().unwrap().code, Some("invalid_config"));
    }

    #[test]
    fn config_options_inherit_and_merge() {
        let config = r#"{"strategy": {"mode": "loadbalance"}, "override_params": {"model": "a", "temperature": 0.5},
            "forward_headers": ["x-a"], "request_timeout": 100,
            "targets": [{"provider": "openai", "api_key": "k", "override_params": {"model": "b"}, "strict_vendor_compliance": false,
                         "vendor_organization": "org"}]}"#;
        let t = select(&[("x-gateway-config", config), ("x-gateway-forward-headers", "x-h")]).unwrap();
        assert_eq!(t.options.override_params.get("model"), Some(&Value::from("b")));
        assert_eq!(t.options.override_params.get("temperature"), Some(&Value::from(0.5)));
        assert_eq!(t.options.forward_headers, vec!["x-h".to_string(), "x-a".to_string()]);
        assert_eq!(t.options.request_timeout, Some(100));
        assert!(!t.options.strict_vendor_compliance);
        assert_eq!(t.vendor_organization.as_deref(), Some("org"));
    }

    #[test]
    fn options_only_config_takes_the_provider_from_headers() {
        let t = select(&[
            ("x-gateway-config", r#"{"retry": {"attempts": 1}, "override_params": {"model": "m"}}"#),
            ("x-gateway-provider", "openai"),
            ("authorization", "Bearer sk-h"),
        ])
        .unwrap();
        assert_eq!(t.account.as_deref(), Some("sk-h"));
        assert_eq!(t.options.override_params.get("model"), Some(&Value::from("m")));
    }

    #[test]
    fn features_that_cannot_run_yet_are_refused() {
        for config in [
            r#"{"provider":"openai","api_key":"k","prompt_id":"p1"}"#,
            r#"{"provider":"openai","api_key":"k","input_guardrails":["pii"]}"#,
            r#"{"strategy":{"mode":"fallback"},"targets":[{"provider":"openai","api_key":"k","before_request_hooks":[{"id":"h","checks":[{"id":"default.contains","parameters":{"words":["x"],"operator":"any"}}]}]}]}"#,
        ] {
            let err = select(&[("x-gateway-config", config)]).err().unwrap();
            assert_eq!((err.status, err.code), (501, Some("not_implemented")), "{config}");
        }
        // The top-level config's inline guardrails and hooks run.
        assert!(select(&[(
            "x-gateway-config",
            r#"{"provider":"openai","api_key":"k","input_guardrails":[{"default.contains":{"words":["x"],"operator":"any"}}],"before_request_hooks":[{"id":"h","checks":[{"id":"default.contains","parameters":{"words":["x"],"operator":"any"}}]}]}"#
        )])
        .is_ok());
        assert!(select(&[(
            "x-gateway-config",
            r#"{"provider":"openai","api_key":"k","retry":{"attempts":2},"cache":{"mode":"simple"}}"#
        )])
        .is_ok());
    }

    #[test]
    fn loadbalance_follows_weights() {
        let lb = |w0: f64, w1: f64, random: u64| {
            let config = format!(
                r#"{{"strategy": {{"mode": "loadbalance"}}, "targets": [
                {{"provider": "openai", "api_key": "first", "weight": {w0}}},
                {{"provider": "openai", "api_key": "second", "weight": {w1}}}]}}"#
            );
            select_target(&settings(), &headers(&[("x-gateway-config", &config)]), random).map(|t| t.account.unwrap())
        };
        assert_eq!(lb(1.0, 1.0, 0).unwrap(), "first");
        assert_eq!(lb(1.0, 1.0, u64::MAX).unwrap(), "second");
        assert_eq!(lb(0.0, 1.0, 0).unwrap(), "second");
        assert_eq!(lb(1.0, 0.0, u64::MAX).unwrap(), "first");
        assert_eq!(lb(0.0, 0.0, 0).unwrap_err().status, 400);
    }
}
