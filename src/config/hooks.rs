//! Hooks (spec 2.6) and guardrails (spec 2.7).

use super::check::{boolean, expected, number, object, shorten, string, Obj};
use super::{Check, ConfigError, Feedback, Guardrail, Hook, HookOutcome, InlineGuardrail};
use crate::json_check::join;
use serde_json::{Map, Value};

/// Which side of the upstream call a hook or guardrail list runs on.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Stage {
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

pub(super) fn hook(v: &Value, path: &str, stage: Stage) -> Result<Hook, ConfigError> {
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
    Ok(Check { id: obj.req("id", string)?, parameters: obj.req("parameters", object)? })
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

pub(super) fn guardrail(v: &Value, path: &str, stage: Stage) -> Result<Guardrail, ConfigError> {
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
    let mut checks = Map::new();
    for (key, value) in obj.map.iter().filter(|(k, _)| !GUARDRAIL_KEYS.contains(&k.as_str())) {
        // The key is client text, cut short where it is echoed in an error's path.
        checks.insert(key.clone(), Value::Object(object(value, &join(path, &shorten(key)))?));
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

/// A guardrail stored at the control plane (`{"name", "checks": [{"id", "parameters",
/// "is_enabled"}], "actions": {"deny", "async", "on_fail", "on_success"}}`) as a hook:
/// disabled checks are left out; the second value is `actions.deny`.
pub(crate) fn stored_guardrail(v: &Value, id: &str) -> Result<(Hook, bool), ConfigError> {
    let obj = Obj::open(v, "")?;
    let checks = obj.list("checks", |v, path| {
        let check = Obj::open(v, path)?;
        let enabled = check.opt("is_enabled", boolean)?.unwrap_or(true);
        let parameters = check.opt("parameters", object)?.unwrap_or_default();
        Ok(enabled.then_some(Check { id: check.req("id", string)?, parameters }))
    })?;
    let actions = Value::Object(obj.opt("actions", object)?.unwrap_or_default());
    let actions = Obj::open(&actions, "actions")?;
    let hook = Hook {
        id: id.to_string(),
        kind: Some("guardrail".to_string()),
        checks: checks.into_iter().flatten().collect(),
        on_fail: actions.opt("on_fail", |v, p| outcome(v, p, true))?,
        on_success: actions.opt("on_success", |v, p| outcome(v, p, true))?,
        is_async: actions.opt("async", boolean)?.unwrap_or(false),
    };
    Ok((hook, actions.opt("deny", boolean)?.unwrap_or(false)))
}
