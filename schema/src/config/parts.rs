//! The config's sub-objects (strategy, cache, retry, circuit breaker, deployments) and the
//! properties whose strings have a shape (custom_host, forward_headers, weight).

use super::{CircuitBreakerConfig, Condition, RetryConfig, Strategy, StrategyMode};
use crate::cloud::Deployment;
use crate::json_check::join;
use crate::query;
use crate::upstream::Upstream;
use crate::value_check::{array_of, boolean, integer, number, object, one_of, status_codes, string, ConfigError, Obj};
use crate::wire_names::is_header_name;
use serde_json::Value;

/// Unbounded retries are a footgun (one request fanning out into a retry storm). The
/// reference gateway caps attempts at 5; we allow up to 10.
const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Spec 2.5: minimum cooldown of the circuit breaker, in milliseconds.
const MIN_COOLDOWN_MS: u64 = 30_000;

pub(super) fn strategy(v: &Value, path: &str) -> Result<Strategy, ConfigError> {
    let obj = Obj::new(v, path, &["mode", "conditions", "default", "on_status_codes"])?;
    let mode = obj.req("mode", |v, p| one_of(v, p, &StrategyMode::ALL, StrategyMode::as_str))?;
    let strategy = Strategy {
        mode,
        conditions: obj.list("conditions", condition)?,
        default: obj.opt("default", string)?,
        on_status_codes: obj.opt("on_status_codes", status_codes)?,
    };
    // A property of another mode is an error rather than silently ignored: it means the
    // caller expects a behaviour they will not get.
    only_in_mode(&obj, "conditions", mode, StrategyMode::Conditional)?;
    only_in_mode(&obj, "default", mode, StrategyMode::Conditional)?;
    only_in_mode(&obj, "on_status_codes", mode, StrategyMode::Fallback)?;
    let conditional = mode == StrategyMode::Conditional;
    if conditional && strategy.conditions.is_empty() {
        return Err(ConfigError::new(
            obj.path("conditions"),
            "at least one condition is required in mode `conditional`",
        ));
    }
    if conditional && strategy.default.is_none() {
        return Err(ConfigError::new(obj.path("default"), "is required in mode `conditional`"));
    }
    Ok(strategy)
}

/// Property `key` of the strategy may only be given in mode `only`.
fn only_in_mode(obj: &Obj, key: &str, mode: StrategyMode, only: StrategyMode) -> Result<(), ConfigError> {
    if obj.has(key) && mode != only {
        return Err(ConfigError::new(obj.path(key), format!("is only allowed in mode `{}`", only.as_str())));
    }
    Ok(())
}

fn condition(v: &Value, path: &str) -> Result<Condition, ConfigError> {
    let obj = Obj::new(v, path, &["query", "then"])?;
    let query = obj.req("query", object)?;
    // Errors of the query language name their place inside `query`.
    query::validate(&query).map_err(|e| ConfigError::new(join(&obj.path("query"), &e.path), e.message))?;
    Ok(Condition { query, then: obj.req("then", string)? })
}

pub(super) fn retry(v: &Value, path: &str) -> Result<RetryConfig, ConfigError> {
    let obj = Obj::new(v, path, &["attempts", "on_status_codes", "use_retry_after_headers"])?;
    Ok(RetryConfig {
        attempts: obj.req("attempts", |v, p| integer(v, p, 0, MAX_RETRY_ATTEMPTS))?,
        on_status_codes: obj.opt("on_status_codes", status_codes)?,
        use_retry_after_headers: obj.opt("use_retry_after_headers", boolean)?.unwrap_or(false),
    })
}

pub(super) fn circuit_breaker(v: &Value, path: &str) -> Result<CircuitBreakerConfig, ConfigError> {
    let obj = Obj::new(v, path, &["failure_threshold", "cooldown_interval", "failure_status_codes"])?;
    Ok(CircuitBreakerConfig {
        // The spec types it as "number"; a failure count is whole, so only integers pass.
        failure_threshold: obj.req("failure_threshold", |v, p| integer(v, p, 1, u32::MAX))?,
        cooldown_interval: obj.req("cooldown_interval", |v, p| integer(v, p, MIN_COOLDOWN_MS, u64::MAX))?,
        failure_status_codes: obj.opt("failure_status_codes", status_codes)?,
    })
}

pub(super) fn deployment(v: &Value, path: &str) -> Result<Deployment, ConfigError> {
    let obj = Obj::new(v, path, &["deployment_id", "alias", "api_version", "is_default"])?;
    Ok(Deployment {
        deployment_id: obj.req("deployment_id", string)?,
        alias: obj.req("alias", string)?,
        api_version: obj.req("api_version", string)?,
        is_default: obj.opt("is_default", boolean)?.unwrap_or(false),
    })
}

pub(super) fn weight(v: &Value, path: &str) -> Result<f64, ConfigError> {
    let w = number(v, path)?;
    if w < 0.0 {
        return Err(ConfigError::new(path, "must be at least 0"));
    }
    Ok(w)
}

pub(super) fn forward_headers(v: &Value, path: &str) -> Result<Vec<String>, ConfigError> {
    array_of(v, path, header_name)
}

/// An HTTP header name (RFC 9110 token), lowercased as HTTP/2 and Envoy spell headers.
fn header_name(v: &Value, path: &str) -> Result<String, ConfigError> {
    let name = string(v, path)?;
    if !is_header_name(&name) {
        return Err(ConfigError::new(path, "must be a valid HTTP header name"));
    }
    Ok(name.to_ascii_lowercase())
}

/// `custom_host`: only its shape is checked here; which hosts may be reached is decided
/// where requests are routed.
pub(super) fn custom_host(v: &Value, path: &str) -> Result<String, ConfigError> {
    let url = string(v, path)?;
    Upstream::parse(&url).map_err(|message| ConfigError::new(path, message))?;
    Ok(url)
}
