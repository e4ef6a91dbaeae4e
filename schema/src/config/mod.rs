//! Config object (spec 2.1-2.7, 7.1): schema and validation.
//!
//! Validation is written by hand over `serde_json::Value` rather than derived, so that every
//! error names the exact JSON path at fault (`targets[1].cb_config.cooldown_interval`), and
//! so that no input, however hostile, can panic the worker.

mod parts;
#[cfg(test)]
mod tests;

use crate::cache::{cache_config, CacheConfig};
use crate::cloud::{AzureDeploymentType, CloudFields};
use crate::guardrails::spec::{self, Guardrail, Hook, Stage};
use crate::json_check::{beyond_depth, index, join, Step, MAX_JSON_DEPTH};
use crate::value_check::{self, boolean, header_text, integer, object, one_of, status_codes, string, ConfigError, Obj};
use serde_json::{Map, Value};

/// A config or a target (targets are configs). Field names are the JSON property names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub name: Option<String>,
    pub strategy: Option<Strategy>,
    pub targets: Vec<Config>,
    pub provider: Option<String>,
    pub api_key: Option<String>,
    pub virtual_key: Option<String>,
    pub custom_host: Option<String>,
    pub weight: Option<f64>,
    pub on_status_codes: Option<Vec<u16>>,
    pub override_params: Option<Map<String, Value>>,
    /// Milliseconds.
    pub request_timeout: Option<u64>,
    pub cache: Option<CacheConfig>,
    pub retry: Option<RetryConfig>,
    pub cb_config: Option<CircuitBreakerConfig>,
    /// Lowercased header names.
    pub forward_headers: Option<Vec<String>>,
    pub prompt_id: Option<String>,
    pub strict_vendor_compliance: Option<bool>,
    pub before_request_hooks: Vec<Hook>,
    pub after_request_hooks: Vec<Hook>,
    pub input_guardrails: Vec<Guardrail>,
    pub output_guardrails: Vec<Guardrail>,
    pub vendor_organization: Option<String>,
    pub vendor_project: Option<String>,
    /// Where a cloud provider's target lives and its credentials.
    pub cloud: CloudFields,
}

impl Config {
    /// Whether this node or any target below it satisfies `test`.
    pub fn any_node(&self, test: &dyn Fn(&Config) -> bool) -> bool {
        test(self) || self.targets.iter().any(|t| t.any_node(test))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    pub mode: StrategyMode,
    /// Non-empty in mode conditional, empty otherwise.
    pub conditions: Vec<Condition>,
    /// The `name` of a target; present exactly in mode conditional.
    pub default: Option<String>,
    /// Only in mode fallback.
    pub on_status_codes: Option<Vec<u16>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyMode {
    Single,
    LoadBalance,
    Fallback,
    Conditional,
}

impl StrategyMode {
    const ALL: [StrategyMode; 4] = [Self::Single, Self::LoadBalance, Self::Fallback, Self::Conditional];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::LoadBalance => "loadbalance",
            Self::Fallback => "fallback",
            Self::Conditional => "conditional",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub query: Map<String, Value>,
    /// The `name` of a target.
    pub then: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// 0 to 10.
    pub attempts: u32,
    pub on_status_codes: Option<Vec<u16>>,
    pub use_retry_after_headers: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CircuitBreakerConfig {
    /// At least 1.
    pub failure_threshold: u32,
    /// Milliseconds, at least 30000.
    pub cooldown_interval: u64,
    pub failure_status_codes: Option<Vec<u16>>,
}

/// Validates a config (the parsed `x-gateway-config` header or a saved config).
pub fn parse_config(value: &Value) -> Result<Config, ConfigError> {
    parse_node(value, "", 0)
}

/// Why a config text serde_json could not read is refused, when it nests deeper than the
/// parser reads (`None`: it does not, so it is not valid JSON). Targets nested too deep get the
/// error `parse_config` gives 9 to 63 levels; anything else nested too deep is named at the root.
pub fn nested_too_deep(text: &[u8]) -> Option<ConfigError> {
    let way = beyond_depth(text, MAX_JSON_DEPTH)?;
    let mut path = String::new();
    // Each level of targets is two steps: the property `targets`, then the item.
    for (level, steps) in way.chunks(2).enumerate() {
        match steps {
            [Step::Key(key), Step::Index(item)] if key == "targets" => path = index(&join(&path, "targets"), *item),
            _ => break,
        }
        if level == MAX_TARGET_DEPTH {
            return Some(targets_too_deep(&path));
        }
    }
    Some(ConfigError::new("", format!("nests arrays and objects more than {MAX_JSON_DEPTH} levels deep")))
}

fn targets_too_deep(path: &str) -> ConfigError {
    ConfigError::new(path, format!("targets nest more than {MAX_TARGET_DEPTH} levels deep"))
}

/// Targets nest at most this deep; recursion on hostile input would otherwise exhaust the
/// stack and kill the worker.
const MAX_TARGET_DEPTH: usize = 8;

const OWN_KEYS: &[&str] = &[
    "name",
    "strategy",
    "targets",
    "provider",
    "api_key",
    "virtual_key",
    "custom_host",
    "weight",
    "on_status_codes",
    "override_params",
    "request_timeout",
    "cache",
    "retry",
    "cb_config",
    "forward_headers",
    "prompt_id",
    "strict_vendor_compliance",
    "before_request_hooks",
    "after_request_hooks",
    "input_guardrails",
    "output_guardrails",
    "vendor_organization",
    "vendor_project",
];

/// One config node: the root (`depth` 0) or a target.
fn parse_node(value: &Value, path: &str, depth: usize) -> Result<Config, ConfigError> {
    if depth > MAX_TARGET_DEPTH {
        return Err(targets_too_deep(path));
    }
    let keys: Vec<&str> = OWN_KEYS.iter().chain(CloudFields::KEYS).copied().collect();
    let obj = Obj::new(value, path, &keys)?;
    let config = Config {
        name: obj.opt("name", string)?,
        strategy: obj.opt("strategy", parts::strategy)?,
        targets: obj.list("targets", |v, p| parse_node(v, p, depth + 1))?,
        provider: obj.opt("provider", string)?,
        api_key: obj.opt("api_key", header_text)?,
        virtual_key: obj.opt("virtual_key", string)?,
        custom_host: obj.opt("custom_host", parts::custom_host)?,
        weight: obj.opt("weight", parts::weight)?,
        on_status_codes: obj.opt("on_status_codes", status_codes)?,
        override_params: obj.opt("override_params", object)?,
        request_timeout: obj.opt("request_timeout", |v, p| integer(v, p, 1, u64::MAX))?,
        cache: obj.opt("cache", cache_config)?,
        retry: obj.opt("retry", parts::retry)?,
        cb_config: obj.opt("cb_config", parts::circuit_breaker)?,
        forward_headers: obj.opt("forward_headers", parts::forward_headers)?,
        prompt_id: obj.opt("prompt_id", string)?,
        strict_vendor_compliance: obj.opt("strict_vendor_compliance", boolean)?,
        before_request_hooks: obj.list("before_request_hooks", |v, p| spec::hook(v, p, Stage::Request))?,
        after_request_hooks: obj.list("after_request_hooks", |v, p| spec::hook(v, p, Stage::Response))?,
        input_guardrails: obj.list("input_guardrails", |v, p| spec::guardrail(v, p, Stage::Request))?,
        output_guardrails: obj.list("output_guardrails", |v, p| spec::guardrail(v, p, Stage::Response))?,
        vendor_organization: obj.opt("vendor_organization", header_text)?,
        vendor_project: obj.opt("vendor_project", header_text)?,
        cloud: cloud_fields(&obj)?,
    };
    check_targets(&obj, &config)?;
    if !does_something(&config) {
        return Err(ConfigError::new(
            path,
            "a config needs one of: provider with api_key or custom_host, an @provider-slug, virtual_key, \
             strategy with targets, cache, retry, prompt_id, forward_headers, request_timeout, \
             provider with cloud credentials, hooks or guardrails",
        ));
    }
    Ok(config)
}

fn cloud_fields(obj: &Obj) -> Result<CloudFields, ConfigError> {
    Ok(CloudFields {
        resource_name: obj.opt("resource_name", string)?,
        deployment_id: obj.opt("deployment_id", string)?,
        api_version: obj.opt("api_version", string)?,
        deployments: obj.list("deployments", parts::deployment)?,
        azure_model_name: None,
        azure_region: obj.opt("cloud_a_region", string)?,
        azure_deployment_name: obj.opt("cloud_a_deployment_name", header_text)?,
        azure_deployment_type: obj.opt("cloud_a_deployment_type", |v, p| {
            one_of(v, p, &AzureDeploymentType::ALL, AzureDeploymentType::as_str)
        })?,
        azure_endpoint_name: obj.opt("cloud_a_endpoint_name", string)?,
        azure_api_version: obj.opt("cloud_a_api_version", string)?,
        gcp_project_id: obj.opt("cloud_b_project_id", string)?,
        gcp_region: obj.opt("cloud_b_region", string)?,
        gcp_service_account_json: obj.opt("cloud_b_service_account_json", object)?,
        gcp_request_type: None,
        aws_access_key_id: obj.opt("cloud_c_access_key_id", header_text)?,
        aws_secret_access_key: obj.opt("cloud_c_secret_access_key", string)?,
        aws_region: obj.opt("cloud_c_region", string)?,
        aws_session_token: obj.opt("cloud_c_session_token", header_text)?,
    })
}

/// `targets` and `strategy` go together; conditional routing must refer to real targets.
fn check_targets(obj: &Obj, config: &Config) -> Result<(), ConfigError> {
    let Some(strategy) = &config.strategy else {
        if obj.has("targets") {
            return Err(ConfigError::new(obj.path("targets"), "targets need a strategy"));
        }
        return Ok(());
    };
    if strategy.mode != StrategyMode::Single && config.targets.is_empty() {
        return Err(ConfigError::new(
            obj.path("targets"),
            format!("at least one target is required in mode `{}`", strategy.mode.as_str()),
        ));
    }
    if strategy.mode == StrategyMode::Conditional {
        check_target_references(obj, strategy, &config.targets)?;
    }
    Ok(())
}

/// Conditional routing names its targets, so each name must pick exactly one target.
fn check_target_references(obj: &Obj, strategy: &Strategy, targets: &[Config]) -> Result<(), ConfigError> {
    let targets_path = obj.path("targets");
    let mut names = hashbrown::HashSet::new();
    for (i, target) in targets.iter().enumerate() {
        if let Some(name) = &target.name {
            if !names.insert(name.as_str()) {
                return Err(ConfigError::new(
                    join(&index(&targets_path, i), "name"),
                    format!("duplicate target name `{}`", value_check::shorten(name)),
                ));
            }
        }
    }
    let no_such_target = |path: String, name: &str| {
        ConfigError::new(path, format!("no target is named `{}`", value_check::shorten(name)))
    };
    let strategy_path = obj.path("strategy");
    let conditions_path = join(&strategy_path, "conditions");
    for (i, condition) in strategy.conditions.iter().enumerate() {
        if !names.contains(condition.then.as_str()) {
            return Err(no_such_target(join(&index(&conditions_path, i), "then"), &condition.then));
        }
    }
    match &strategy.default {
        Some(default) if !names.contains(default.as_str()) => {
            Err(no_such_target(join(&strategy_path, "default"), default))
        }
        _ => Ok(()),
    }
}

/// Spec 2.1: a config must contain at least one of the listed property sets. A provider given
/// as an `@slug` names a managed provider with its credentials, so it counts on its own.
/// Lists count only when non-empty, as an empty list does nothing.
fn does_something(c: &Config) -> bool {
    let provider = c.provider.is_some();
    let managed_slug = c.provider.as_deref().is_some_and(|p| p.starts_with('@'));
    let cloud = &c.cloud;
    let azure_kind = cloud.azure_deployment_type.is_some();
    managed_slug
        || provider && (c.api_key.is_some() || c.custom_host.is_some())
        || c.virtual_key.is_some()
        || c.strategy.is_some() && !c.targets.is_empty()
        || c.cache.is_some()
        || c.retry.is_some()
        || c.prompt_id.is_some()
        || c.forward_headers.as_ref().is_some_and(|h| !h.is_empty())
        || c.request_timeout.is_some()
        || provider && cloud.aws_access_key_id.is_some() && cloud.aws_secret_access_key.is_some()
        || provider
            && cloud.gcp_region.is_some()
            && (cloud.gcp_service_account_json.is_some() || cloud.gcp_project_id.is_some())
        || provider
            && azure_kind
            && cloud.azure_deployment_name.is_some()
            && cloud.azure_region.is_some()
            && cloud.azure_api_version.is_some()
        || provider && azure_kind && cloud.azure_endpoint_name.is_some()
        || !c.before_request_hooks.is_empty()
        || !c.after_request_hooks.is_empty()
        || !c.input_guardrails.is_empty()
        || !c.output_guardrails.is_empty()
}
