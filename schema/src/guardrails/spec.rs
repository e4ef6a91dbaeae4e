//! What a config's hooks (spec 2.6) and guardrails (spec 2.7) and a stored guardrail (spec 4.3)
//! say, and how they are read: the config reads its lists of them here.

use super::params::{self, CheckParams};
use crate::json_check::join;
use crate::value_check::{boolean, expected, number, object, shorten, string, ConfigError, Obj};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    pub id: String,
    /// JSON `type`.
    pub kind: Option<String>,
    pub checks: Vec<Check>,
    pub on_fail: Option<HookOutcome>,
    pub on_success: Option<HookOutcome>,
    /// JSON `async`; only after-request hooks may set it.
    pub is_async: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub id: String,
    /// As given: the checks that call out read them as they run.
    pub parameters: Map<String, Value>,
    /// Read when the check was: what the check runs with.
    pub params: CheckParams,
}

impl Check {
    /// A check whose parameters are read now; `Err` says which one is wrong (an id this
    /// gateway does not run is no error here: the check fails when it runs).
    pub fn new(id: String, parameters: Map<String, Value>) -> Result<Check, String> {
        let params = params::read(&id, &parameters)?;
        Ok(Check { id, parameters, params })
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct HookOutcome {
    pub feedback: Option<Feedback>,
    /// Only in before-request hooks and output guardrails.
    pub deny: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Feedback {
    pub value: Option<f64>,
    pub weight: Option<f64>,
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Guardrail {
    /// The id or slug of a stored guardrail.
    Reference(String),
    Inline(InlineGuardrail),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct InlineGuardrail {
    pub id: Option<String>,
    pub deny: Option<bool>,
    /// JSON `async`.
    pub is_async: Option<bool>,
    pub on_fail: Option<HookOutcome>,
    pub on_success: Option<HookOutcome>,
    /// Every further property (a check id with its parameters, an object), in key order.
    pub checks: Vec<Check>,
}

/// Which side of the upstream call a hook or guardrail list runs on.
#[derive(Clone, Copy, PartialEq)]
pub enum Stage {
    /// `before_request_hooks`, `input_guardrails`.
    Request,
    /// `after_request_hooks`, `output_guardrails`.
    Response,
}

const HOOK_KEYS: &[&str] = &["id", "type", "checks", "on_fail", "on_success"];
/// Only a response hook may run asynchronously: a request hook's verdict is awaited.
const RESPONSE_HOOK_KEYS: &[&str] = &["id", "type", "checks", "on_fail", "on_success", "async"];
/// Inline guardrail properties with a fixed meaning; every other property is a check.
const GUARDRAIL_KEYS: &[&str] = &["id", "deny", "async", "on_fail", "on_success"];

pub fn hook(v: &Value, path: &str, stage: Stage) -> Result<Hook, ConfigError> {
    let known = match stage {
        Stage::Request => HOOK_KEYS,
        Stage::Response => RESPONSE_HOOK_KEYS,
    };
    let obj = Obj::new(v, path, known)?;
    // Spec 2.6: `deny` belongs to the outcomes of before-request hooks only.
    let deny = stage == Stage::Request;
    Ok(Hook {
        id: obj.req("id", string)?,
        kind: obj.opt("type", string)?,
        checks: obj.list("checks", check)?,
        on_fail: obj.opt("on_fail", |v, p| outcome(v, p, deny))?,
        on_success: obj.opt("on_success", |v, p| outcome(v, p, deny))?,
        is_async: obj.opt("async", boolean)?.unwrap_or(false),
    })
}

fn check(v: &Value, path: &str) -> Result<Check, ConfigError> {
    let obj = Obj::new(v, path, &["id", "parameters"])?;
    let (id, parameters) = (obj.req("id", string)?, obj.req("parameters", object)?);
    Check::new(id, parameters).map_err(|message| ConfigError::new(obj.path("parameters"), message))
}

/// `on_fail` / `on_success`; `deny` tells whether the outcome may carry `deny`.
fn outcome(v: &Value, path: &str, deny: bool) -> Result<HookOutcome, ConfigError> {
    let known: &[&str] = if deny { &["feedback", "deny"] } else { &["feedback"] };
    let obj = Obj::new(v, path, known)?;
    Ok(HookOutcome { feedback: obj.opt("feedback", feedback)?, deny: obj.opt("deny", boolean)? })
}

fn feedback(v: &Value, path: &str) -> Result<Feedback, ConfigError> {
    let obj = Obj::new(v, path, &["value", "weight", "metadata"])?;
    Ok(Feedback {
        value: obj.opt("value", number)?,
        weight: obj.opt("weight", number)?,
        metadata: obj.opt("metadata", object)?,
    })
}

pub fn guardrail(v: &Value, path: &str, stage: Stage) -> Result<Guardrail, ConfigError> {
    if let Value::String(reference) = v {
        if reference.is_empty() {
            return Err(ConfigError::new(path, "must not be empty"));
        }
        return Ok(Guardrail::Reference(reference.clone()));
    }
    if !v.is_object() {
        return Err(expected(path, "a string or an object", v));
    }
    let obj = Obj::open(v, path)?;
    let mut checks = Vec::new();
    for (key, value) in obj.map.iter().filter(|(k, _)| !GUARDRAIL_KEYS.contains(&k.as_str())) {
        // The key is client text, cut short where it is echoed in an error's path.
        let at = join(path, &shorten(key));
        let check = Check::new(key.clone(), object(value, &at)?).map_err(|message| ConfigError::new(at, message))?;
        checks.push(check);
    }
    // Spec 2.7: only output guardrails' outcomes carry `deny`.
    let deny = stage == Stage::Response;
    Ok(Guardrail::Inline(InlineGuardrail {
        id: obj.opt("id", string)?,
        deny: obj.opt("deny", boolean)?,
        is_async: obj.opt("async", boolean)?,
        on_fail: obj.opt("on_fail", |v, p| outcome(v, p, deny))?,
        on_success: obj.opt("on_success", |v, p| outcome(v, p, deny))?,
        checks,
    }))
}

/// Properties of a stored guardrail (spec 4.3).
const STORED_KEYS: &[&str] = &["name", "checks", "actions"];
const STORED_CHECK_KEYS: &[&str] = &["id", "parameters", "name", "is_enabled"];
const ACTION_KEYS: &[&str] = &["deny", "async", "on_success", "on_fail"];

/// A stored guardrail (spec 4.3: `{name, checks: [{id, parameters, name, is_enabled}],
/// actions: {deny, async, on_success, on_fail}}`), read into the inline guardrail the filter
/// runs: its enabled checks (in id order; of one id the last), each check id one the gateway
/// ships and its parameters read. `id` names it in `hook_results`.
pub fn parse_stored_guardrail(v: &Value, id: &str) -> Result<InlineGuardrail, ConfigError> {
    let obj = Obj::new(v, "", STORED_KEYS)?;
    obj.opt("name", string)?;
    let items = obj.req("checks", |v, p| v.as_array().cloned().ok_or_else(|| expected(p, "an array", v)))?;
    if items.is_empty() {
        return Err(ConfigError::new("checks", "must have at least one item"));
    }
    let mut checks = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let path = crate::json_check::index("checks", i);
        let check = Obj::new(item, &path, STORED_CHECK_KEYS)?;
        let id = check.req("id", string)?;
        let parameters = check.opt("parameters", object)?.unwrap_or_default();
        check.opt("name", string)?;
        let enabled = check.opt("is_enabled", boolean)?.unwrap_or(true);
        let params = params::read_known(&id, &parameters).map_err(|message| {
            let at = if message.starts_with("unknown check") { check.path("id") } else { check.path("parameters") };
            ConfigError::new(at, message)
        })?;
        if enabled {
            checks.insert(id.clone(), Check { id, parameters, params });
        }
    }
    let actions = match obj.map.get("actions") {
        Some(actions) => Some(Obj::new(actions, "actions", ACTION_KEYS)?),
        None => None,
    };
    let action = |key: &str| -> Result<Option<HookOutcome>, ConfigError> {
        actions.as_ref().map_or(Ok(None), |a| a.opt(key, stored_outcome))
    };
    Ok(InlineGuardrail {
        id: Some(id.to_string()),
        deny: actions.as_ref().map_or(Ok(None), |a| a.opt("deny", boolean))?,
        is_async: actions.as_ref().map_or(Ok(None), |a| a.opt("async", boolean))?,
        on_fail: action("on_fail")?,
        on_success: action("on_success")?,
        checks: checks.into_values().collect(),
    })
}

/// A stored guardrail's `on_fail` / `on_success`: `feedback {value, weight, metadata}`, where
/// `metadata` is a string (spec 4.3; kept as `{"text": ...}`) or, as in a config, an object.
fn stored_outcome(v: &Value, path: &str) -> Result<HookOutcome, ConfigError> {
    let obj = Obj::new(v, path, &["feedback"])?;
    let feedback = obj.opt("feedback", |v, p| {
        let fb = Obj::new(v, p, &["value", "weight", "metadata"])?;
        let metadata = fb.opt("metadata", |v, p| match v {
            Value::String(text) => Ok(Map::from_iter([("text".to_string(), Value::String(text.clone()))])),
            _ => object(v, p).map_err(|_| expected(p, "a string or an object", v)),
        })?;
        Ok(Feedback { value: fb.opt("value", number)?, weight: fb.opt("weight", number)?, metadata })
    })?;
    Ok(HookOutcome { feedback, deny: None })
}
