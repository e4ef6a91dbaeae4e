//! From checks to verdicts: the items of a stage, running their checks (with the calls some
//! need), each item's verdict and feedback, the stage's outcome, and the JSON bodies
//! (`hook_results`, the 446 answer).

use super::calls::{CallSpec, Continuation, JwksUpdate, Reply};
use super::spec::{Check, Feedback, Guardrail, Hook, HookOutcome, InlineGuardrail};
use super::{evaluate, CheckResult, Env, Evaluation, Input, Stage};
use crate::errors::error_json;
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

/// The answer's status when a check failed and no failing item denies.
pub(crate) const FLAG_STATUS: u16 = 246;
/// The answer's status when a failing item denies.
pub(crate) const DENY_STATUS: u16 = 446;
const DENY_MESSAGE: &str =
    "The guardrail checks defined in the config failed. You can find more information in the `hook_results` object.";

/// A hook (2.6) or an inline guardrail (2.7), the same thing once read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    pub(crate) id: String,
    pub(crate) checks: Vec<Check>,
    /// The item's `deny`, or its `on_fail.deny`.
    pub(crate) deny: bool,
    pub(crate) is_async: bool,
    pub(crate) on_fail: Option<HookOutcome>,
    pub(crate) on_success: Option<HookOutcome>,
}

impl Item {
    pub(crate) fn from_hook(hook: &Hook) -> Item {
        Item {
            id: hook.id.clone(),
            checks: hook.checks.clone(),
            deny: hook.on_fail.as_ref().and_then(|o| o.deny).unwrap_or(false),
            is_async: hook.is_async,
            on_fail: hook.on_fail.clone(),
            on_success: hook.on_success.clone(),
        }
    }

    /// `fallback_id` names an inline guardrail without `id` in `hook_results`.
    pub(crate) fn from_inline(guardrail: &InlineGuardrail, fallback_id: String) -> Item {
        let on_fail_deny = guardrail.on_fail.as_ref().and_then(|o| o.deny);
        Item {
            id: guardrail.id.clone().unwrap_or(fallback_id),
            checks: guardrail.checks.clone(),
            deny: guardrail.deny.unwrap_or(false) || on_fail_deny.unwrap_or(false),
            is_async: guardrail.is_async.unwrap_or(false),
            on_fail: guardrail.on_fail.clone(),
            on_success: guardrail.on_success.clone(),
        }
    }
}

/// A stage's items: its hooks, then its guardrails (input guardrails are before-request
/// hooks, output guardrails after-request ones). A stored guardrail's reference is looked up
/// in `stored` (what the control plane gave); `Err` holds the first one it lacks.
pub(crate) fn items(
    hooks: &[Hook],
    guardrails: &[Guardrail],
    stage: Stage,
    stored: &dyn Fn(&str) -> Option<Item>,
) -> Result<Vec<Item>, String> {
    let list = match stage {
        Stage::Before => "input_guardrails",
        Stage::After => "output_guardrails",
    };
    let mut items: Vec<Item> = hooks.iter().map(Item::from_hook).collect();
    for (i, guardrail) in guardrails.iter().enumerate() {
        match guardrail {
            Guardrail::Inline(inline) => items.push(Item::from_inline(inline, format!("{list}[{i}]"))),
            Guardrail::Reference(reference) => items.push(stored(reference).ok_or_else(|| reference.clone())?),
        }
    }
    Ok(items)
}

/// One item's result, in `hook_results` as `{id, verdict, deny, async, execution_time,
/// checks, feedback}` (serialised directly: building `Value`s first cost more than the check).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ItemResult {
    pub(crate) id: String,
    /// True when every check passed.
    pub(crate) verdict: bool,
    pub(crate) deny: bool,
    #[serde(rename = "async")]
    pub(crate) is_async: bool,
    /// Milliseconds: the slowest check's (they run side by side).
    pub(crate) execution_time: u64,
    pub(crate) checks: Vec<CheckResult>,
    /// `on_fail`'s feedback when the verdict is false, `on_success`'s when true; for the record.
    #[serde(serialize_with = "feedback_object")]
    pub(crate) feedback: Option<Feedback>,
}

impl ItemResult {
    pub(crate) fn new(item: &Item, checks: Vec<CheckResult>) -> ItemResult {
        let verdict = checks.iter().all(|c| c.verdict);
        let outcome = if verdict { &item.on_success } else { &item.on_fail };
        ItemResult {
            id: item.id.clone(),
            verdict,
            deny: item.deny,
            is_async: item.is_async,
            execution_time: checks.iter().map(|c| c.execution_time).max().unwrap_or(0),
            checks,
            feedback: outcome.as_ref().and_then(|o| o.feedback.clone()),
        }
    }
}

/// The feedback as configured (only the fields it has), or null.
pub(crate) fn feedback_object<S: Serializer>(feedback: &Option<Feedback>, serializer: S) -> Result<S::Ok, S::Error> {
    feedback.as_ref().map(feedback_json).serialize(serializer)
}

/// The feedback as configured: only the fields it has.
fn feedback_json(feedback: &Feedback) -> Value {
    let mut map = Map::new();
    map.extend(feedback.value.map(|v| ("value".to_string(), json!(v))));
    map.extend(feedback.weight.map(|w| ("weight".to_string(), json!(w))));
    map.extend(feedback.metadata.clone().map(|m| ("metadata".to_string(), Value::Object(m))));
    Value::Object(map)
}

/// Where a check sits in a run: item `item`, check `check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) item: usize,
    pub(crate) check: usize,
}

/// A check waiting for a call: the core dispatches `call`, keeps `slot` and `then`, and
/// gives the answer to `StageRun::answer`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingCall {
    pub(crate) slot: Slot,
    pub(crate) call: CallSpec,
    pub(crate) then: Continuation,
}

/// The checks of a stage's items while some still wait for their calls.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StageRun {
    items: Vec<Item>,
    results: Vec<Vec<Option<CheckResult>>>,
}

/// What starting a stage gives the core.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) run: StageRun,
    /// Calls whose answers decide checks.
    pub(crate) pending: Vec<PendingCall>,
    /// Calls to send without waiting (`default.log`).
    pub(crate) sends: Vec<CallSpec>,
}

impl StageRun {
    /// Evaluates every check of `items`, starting at `started_ms`; `clock_ms` reads the host
    /// clock for the checks' execution times (one read per check: a check starts when the one
    /// before it ended).
    pub(crate) fn start(
        items: Vec<Item>,
        input: &Input,
        env: &Env,
        started_ms: u64,
        clock_ms: &dyn Fn() -> u64,
    ) -> Started {
        let mut pending = Vec::new();
        let mut sends = Vec::new();
        let mut results = Vec::with_capacity(items.len());
        let mut started = started_ms;
        for (i, item) in items.iter().enumerate() {
            let mut row = Vec::with_capacity(item.checks.len());
            for (c, check) in item.checks.iter().enumerate() {
                let mut timed = |mut r: CheckResult| {
                    let ended = clock_ms();
                    r.execution_time = ended.saturating_sub(started);
                    started = ended;
                    Some(r)
                };
                row.push(match evaluate(check, input, env) {
                    Evaluation::Done(r) => timed(r),
                    Evaluation::DoneAndSend(r, call) => {
                        sends.push(call);
                        timed(r)
                    }
                    Evaluation::Needs(call, then) => {
                        pending.push(PendingCall { slot: Slot { item: i, check: c }, call, then });
                        None
                    }
                });
            }
            results.push(row);
        }
        Started { run: StageRun { items, results }, pending, sends }
    }

    /// A pending call answered (`status` 0: it failed or timed out). `execution_time` is the
    /// milliseconds since the check started; the JWKS to cache, if one was fetched.
    pub(crate) fn answer(
        &mut self,
        slot: Slot,
        then: Continuation,
        reply: Reply,
        now_s: u64,
        execution_time: u64,
    ) -> Option<JwksUpdate> {
        let mut finished = then.finish(reply, now_s);
        finished.result.execution_time = execution_time;
        if let Some(place) = self.results.get_mut(slot.item).and_then(|row| row.get_mut(slot.check)) {
            *place = Some(finished.result);
        }
        finished.jwks
    }

    /// Whether every check has its result.
    pub(crate) fn is_done(&self) -> bool {
        self.results.iter().flatten().all(Option::is_some)
    }

    /// Each item's result; a check still without one (its call never came back) fails.
    pub(crate) fn finish(self) -> Vec<ItemResult> {
        let StageRun { items, results } = self;
        items
            .iter()
            .zip(results)
            .map(|(item, row)| {
                let checks = row
                    .into_iter()
                    .zip(&item.checks)
                    .map(|(r, check)| r.unwrap_or_else(|| CheckResult::failed(&check.id, "no answer", Value::Null)))
                    .collect();
                ItemResult::new(item, checks)
            })
            .collect()
    }
}

/// What a stage's verdicts do to the answer; ordered, so two stages combine with `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    /// Every awaited item passed: the answer keeps its status (`hook_results` added).
    Pass,
    /// An item failed, none that denies: status `FLAG_STATUS`, `hook_results` added.
    Flag,
    /// A denying item failed: status `DENY_STATUS` with `denied_body`.
    Deny,
}

/// The outcome of a stage's results. Async items never change the answer.
pub(crate) fn outcome(results: &[ItemResult]) -> Outcome {
    let failed = results.iter().filter(|r| !r.is_async && !r.verdict);
    failed.fold(Outcome::Pass, |acc, r| acc.max(if r.deny { Outcome::Deny } else { Outcome::Flag }))
}

/// `{"before_request_hooks": [...], "after_request_hooks": [...]}`, serialised.
pub(crate) fn hook_results(before: &[ItemResult], after: &[ItemResult]) -> Vec<u8> {
    #[derive(Serialize)]
    struct HookResults<'a> {
        before_request_hooks: &'a [ItemResult],
        after_request_hooks: &'a [ItemResult],
    }
    let results = HookResults { before_request_hooks: before, after_request_hooks: after };
    serde_json::to_vec(&results).unwrap_or_else(|_| br#"{"before_request_hooks":[],"after_request_hooks":[]}"#.to_vec())
}

/// `body` (a JSON object) with `hook_results` as its last top-level key, spliced in so the
/// provider's bytes and key order stay as they were. None when `body` is not a JSON object.
pub(crate) fn with_hook_results(body: &[u8], hook_results: &[u8]) -> Option<Vec<u8>> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).ok()?;
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if body.get(start) != Some(&b'{') || body.get(end) != Some(&b'}') {
        return None;
    }
    let inner = body.get(start + 1..end)?;
    let separator: &[u8] = if inner.iter().all(u8::is_ascii_whitespace) { b"" } else { b"," };
    let mut out = Vec::with_capacity(body.len() + 256);
    out.extend_from_slice(body.get(..end)?);
    out.extend_from_slice(separator);
    out.extend_from_slice(b"\"hook_results\":");
    out.extend_from_slice(hook_results);
    out.push(b'}');
    Some(out)
}

/// The `DENY_STATUS` answer: an OpenAI-shaped error with `hook_results` beside it.
pub(crate) fn denied_body(hook_results: &[u8]) -> Vec<u8> {
    let error = error_json(DENY_MESSAGE, "hooks_failed", None, None);
    with_hook_results(&error, hook_results).unwrap_or(error)
}
