//! The metrics of a finished request, as Envoy stats the host defines by name.
//!
//! proxy-wasm metrics have flat names, so labels are encoded in the name as `.label.value`
//! pairs after the metric's name, always in this order: `provider`, then `status_class`,
//! `cache_status` or `gen_ai_token_type`, and `model` last. The shipped Envoy config's
//! `stats_tags` turn them back into labels (Envoy files the stats under `wasmcustom.`, which
//! its Prometheus output drops). Every value but the model's is dot-free; the model comes last
//! so that its value may keep its dots (`gpt-4.1`): its tag takes the rest of the name.
//!
//! Cardinality is bounded: the model label is one of the configured models (or, without a
//! list, one of the first `max_models` distinct models this worker saw), else `other`.
//! Values keep only `[A-Za-z0-9_.:/-]` (anything else becomes `_`), at most 64 characters.

use super::Record;
use crate::guardrails::CHECK_IDS;
use crate::routing::attempts::Move;
use crate::settings::MetricsSettings;
use hashbrown::HashSet;
use std::borrow::Cow;

pub(crate) const REQUESTS: &str = "gen_ai_gateway_requests_total";
pub(crate) const TOKENS: &str = "gen_ai_client_token_usage_total";
pub(crate) const DURATION: &str = "gen_ai_server_request_duration";
pub(crate) const TIME_TO_FIRST_TOKEN: &str = "gen_ai_server_time_to_first_token";
pub(crate) const RETRIES: &str = "gen_ai_gateway_retries_total";
pub(crate) const FALLBACKS: &str = "gen_ai_gateway_fallbacks_total";
pub(crate) const CIRCUITS_OPENED: &str = "gen_ai_gateway_circuits_opened_total";
/// Circuits not closed now (open, or letting their one trial through), over every worker.
pub(crate) const CIRCUITS_OPEN: &str = "gen_ai_gateway_circuits_open";
pub(crate) const CACHE_STORES: &str = "gen_ai_gateway_cache_stores_total";
pub(crate) const CACHE_STORED_BYTES: &str = "gen_ai_gateway_cache_stored_bytes_total";
/// One per guardrail or hook check run, by `verdict` (`pass`/`fail`) and `check` (its id, last:
/// check ids have dots).
pub(crate) const GUARDRAIL_VERDICTS: &str = "gen_ai_gateway_guardrail_verdicts_total";
/// Request records the control plane never got (queue full, refused, or too large).
pub(crate) const RECORDS_DROPPED: &str = "gen_ai_gateway_records_dropped_total";
/// Calls that read the control plane, by `result`: `found`, `absent` (404) or `failed`.
pub(crate) const CONTROL_PLANE_LOOKUPS: &str = "gen_ai_gateway_control_plane_lookups_total";

/// What answers cost, in micro-USD (Envoy counters are integers), by provider and model.
pub(crate) const COST: &str = "gen_ai_gateway_cost_micro_usd_total";
/// Requests refused by a limit, by `kind` (`requests`, `tokens`, `budget`).
pub(crate) const LIMIT_REFUSALS: &str = "gen_ai_gateway_limit_refusals_total";
pub(crate) const MCP_REQUESTS: &str = "gen_ai_gateway_mcp_requests_total";
pub(crate) const MCP_DURATION: &str = "gen_ai_gateway_mcp_request_duration";

/// How a host keeps a family of stats.
#[cfg(any(test, feature = "native"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keeping {
    Counter,
    Histogram,
    Gauge,
}

/// Every family of stats the filter makes, with its labels in the order its stat names hold
/// them: what a host with labelled metrics (the native module) defines once per config.
#[cfg(any(test, feature = "native"))]
pub(crate) const FAMILIES: &[(&str, Keeping, &[&str])] = &[
    (REQUESTS, Keeping::Counter, &["provider", "status_class", "cache_status", "model"]),
    (TOKENS, Keeping::Counter, &["provider", "gen_ai_token_type", "model"]),
    (DURATION, Keeping::Histogram, &["provider", "model"]),
    (TIME_TO_FIRST_TOKEN, Keeping::Histogram, &["provider", "model"]),
    (COST, Keeping::Counter, &["provider", "model"]),
    (RETRIES, Keeping::Counter, &["provider"]),
    (FALLBACKS, Keeping::Counter, &["provider"]),
    (CIRCUITS_OPENED, Keeping::Counter, &[]),
    (CIRCUITS_OPEN, Keeping::Gauge, &[]),
    (CACHE_STORES, Keeping::Counter, &[]),
    (CACHE_STORED_BYTES, Keeping::Counter, &[]),
    (GUARDRAIL_VERDICTS, Keeping::Counter, &["verdict", "check"]),
    (RECORDS_DROPPED, Keeping::Counter, &[]),
    (CONTROL_PLANE_LOOKUPS, Keeping::Counter, &["result"]),
    (LIMIT_REFUSALS, Keeping::Counter, &["kind"]),
    (MCP_REQUESTS, Keeping::Counter, &["server", "method", "outcome"]),
    (MCP_DURATION, Keeping::Histogram, &["server", "method"]),
];

/// The most labels a family has (the request counter's four).
#[cfg(any(test, feature = "native"))]
const MAX_LABELS: usize = most_labels(FAMILIES);

#[cfg(any(test, feature = "native"))]
const fn most_labels(families: &[(&str, Keeping, &[&str])]) -> usize {
    match families {
        [] => 0,
        [(_, _, labels), rest @ ..] => {
            let most = most_labels(rest);
            if labels.len() > most {
                labels.len()
            } else {
                most
            }
        }
    }
}

/// A stat's label values read back, in its family's order: on the stack (a stat is read back
/// on every metric update of the native module).
#[cfg(any(test, feature = "native"))]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LabelValues<'a> {
    values: [&'a str; MAX_LABELS],
    len: usize,
}

#[cfg(any(test, feature = "native"))]
impl<'a> LabelValues<'a> {
    pub(crate) fn as_slice(&self) -> &[&'a str] {
        self.values.get(..self.len).unwrap_or_default()
    }
}

/// A stat name read back: its family (an index into `FAMILIES`) and its label values, in the
/// family's order. Every value but the last is dot-free; the last takes the rest (see above).
#[cfg(any(test, feature = "native"))]
pub(crate) fn family_of(stat: &str) -> Option<(usize, LabelValues<'_>)> {
    let (metric, mut rest) = stat.split_at_checked(stat.find('.').unwrap_or(stat.len()))?;
    let index = FAMILIES.iter().position(|(name, _, _)| *name == metric)?;
    let labels = FAMILIES.get(index)?.2;
    let mut values = LabelValues { values: [""; MAX_LABELS], len: labels.len() };
    for (i, (label, slot)) in labels.iter().zip(values.values.iter_mut()).enumerate() {
        rest = rest.strip_prefix('.')?.strip_prefix(label)?.strip_prefix('.')?;
        let (value, after) = if i + 1 == labels.len() {
            (rest, "")
        } else {
            rest.split_at_checked(rest.find('.').unwrap_or(rest.len()))?
        };
        *slot = value;
        rest = after;
    }
    rest.is_empty().then_some((index, values))
}

/// The stat of a refusal by a limit of `kind`.
pub(crate) fn limit_refusal(kind: gateway_schema::limits::LimitKind) -> String {
    name(LIMIT_REFUSALS, &[("kind", kind.as_str())])
}

/// The stat of a control-plane read's `result`.
pub(crate) fn lookup(result: &'static str) -> String {
    name(CONTROL_PLANE_LOOKUPS, &[("result", result)])
}

/// The label value of a model past the bound.
const OTHER: &str = "other";
/// The label value when a request names no model (e.g. `GET /v1/models`).
const NO_MODEL: &str = "none";
const MAX_VALUE_CHARS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    /// Envoy histograms record integers: durations are in milliseconds.
    Histogram,
}

/// One update of one stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metric {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) value: u64,
}

/// The model label values a worker has given out.
#[derive(Debug, Default)]
pub(crate) struct ModelLabels {
    seen: HashSet<String>,
}

impl ModelLabels {
    /// The label of `model`, within the settings' bound.
    pub(crate) fn label<'a>(&mut self, settings: &MetricsSettings, model: &'a str) -> Cow<'a, str> {
        if model.is_empty() {
            return Cow::Borrowed(NO_MODEL);
        }
        let value = sanitise(model);
        let known = match &settings.models {
            Some(models) => models.iter().any(|m| sanitise(m) == value),
            None if self.seen.contains(value.as_ref()) => true,
            None if self.seen.len() < settings.max_models => {
                self.seen.insert(value.to_string());
                true
            }
            None => false,
        };
        if known {
            value
        } else {
            Cow::Borrowed(OTHER)
        }
    }
}

/// A label value made safe for a stat name (borrowed when it is already: the common case).
pub(crate) fn sanitise(value: &str) -> Cow<'_, str> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '/' | '-');
    if value.len() <= MAX_VALUE_CHARS && value.chars().all(safe) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(value.chars().take(MAX_VALUE_CHARS).map(|c| if safe(c) { c } else { '_' }).collect())
}

/// `status_class`: `2xx`, `4xx`, ...; `none` when no status was sent (the client left).
/// The methods MCP defines (both eras): the `method` label's values, with `stream` (a GET, the
/// server's stream), `session_end` (a DELETE), `response` (a client's answer to a server's
/// request) and `other` (a method MCP does not define: a client names it, so it is no label).
const MCP_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// The `server` label: the server's id, or `_gateway` for a request the aggregate endpoint
/// answered itself (server ids never start with `_`).
fn mcp_server(server: &str) -> Cow<'_, str> {
    match server {
        "" => Cow::Borrowed("_gateway"),
        server => sanitise(server),
    }
}

/// The counter of one request to MCP server `server` with JSON-RPC `method` that ended so
/// (the aggregate's calls to its servers count there too).
pub(crate) fn mcp_request(server: &str, method: &str, outcome: crate::mcp::Outcome) -> String {
    let server = mcp_server(server);
    let labels = [("server", &*server), ("method", mcp_method("POST", Some(method))), ("outcome", outcome.as_str())];
    name(MCP_REQUESTS, &labels)
}

fn mcp_method(http_method: &str, method: Option<&str>) -> &'static str {
    match (http_method, method) {
        ("GET", _) => "stream",
        ("DELETE", _) => "session_end",
        (_, None) => "response",
        (_, Some(method)) => MCP_METHODS.iter().find(|known| **known == method).copied().unwrap_or(OTHER),
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

/// `cache_status`, from the status the client saw (no cache part reads as `disabled`).
fn cache_status(header: &str) -> &'static str {
    match header {
        "HIT" => "hit",
        "SEMANTIC_HIT" => "semantic_hit",
        "REFRESH" => "refresh",
        h if h.starts_with("MISS") => "miss",
        _ => "disabled",
    }
}

/// A stat name: the metric, then its labels.
fn name(metric: &str, labels: &[(&str, &str)]) -> String {
    let mut name = String::with_capacity(96);
    name.push_str(metric);
    for (label, value) in labels {
        name.push('.');
        name.push_str(label);
        name.push('.');
        name.push_str(value);
    }
    name
}

/// The metrics of a finished request. A request that never reached provider selection (no
/// key, a health check) counts in none of the per-request metrics.
pub(crate) fn of_request(record: &Record, settings: &MetricsSettings, models: &mut ModelLabels) -> Vec<Metric> {
    let mut out = Vec::new();
    let counter = |name: String, value: u64| Metric { kind: Kind::Counter, name, value };
    let histogram = |name: String, value: u64| Metric { kind: Kind::Histogram, name, value };
    for (provider, step) in &record.moves {
        let metric = match step {
            Move::Retry => RETRIES,
            Move::Fallback => FALLBACKS,
        };
        out.push(counter(name(metric, &[("provider", &sanitise(provider))]), 1));
    }
    for (check, passed) in record.check_verdicts() {
        let verdict = if passed { "pass" } else { "fail" };
        // A client names the checks of an inline hook: only the ids the gateway runs are labels.
        let check = if CHECK_IDS.contains(&check) { check } else { OTHER };
        out.push(counter(name(GUARDRAIL_VERDICTS, &[("verdict", verdict), ("check", check)]), 1));
    }
    if let Some(bytes) = record.cache_stored {
        out.push(counter(CACHE_STORES.to_string(), 1));
        out.push(counter(CACHE_STORED_BYTES.to_string(), bytes));
    }
    if let Some(facts) = &record.mcp {
        let (server, method) = (mcp_server(&facts.server), mcp_method(&record.method, facts.method.as_deref()));
        let labels = [("server", &*server), ("method", method), ("outcome", facts.outcome.as_str())];
        out.push(counter(name(MCP_REQUESTS, &labels), 1));
        out.push(histogram(name(MCP_DURATION, &[("server", &*server), ("method", method)]), record.duration_ms));
    }
    if record.provider.is_empty() {
        return out;
    }
    let provider = sanitise(record.provider);
    let model = models.label(settings, &record.model);
    let labels = [
        ("provider", &*provider),
        ("status_class", status_class(record.status)),
        ("cache_status", cache_status(record.cache)),
        ("model", &*model),
    ];
    out.push(counter(name(REQUESTS, &labels), 1));
    let by_model = [("provider", &*provider), ("model", &*model)];
    out.push(histogram(name(DURATION, &by_model), record.duration_ms));
    if let Some(ttft) = record.time_to_first_token_ms {
        out.push(histogram(name(TIME_TO_FIRST_TOKEN, &by_model), ttft));
    }
    if let Some(cost) = record.cost_micro_usd.filter(|cost| *cost > 0) {
        out.push(counter(name(COST, &by_model), cost));
    }
    if let Some(usage) = record.usage {
        for (kind, count) in [("input", usage.prompt_tokens), ("output", usage.completion_tokens)] {
            if count > 0 {
                let labels = [("provider", &*provider), ("gen_ai_token_type", kind), ("model", &*model)];
                out.push(counter(name(TOKENS, &labels), count));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::record::HookStage;
    use crate::guardrails::verdict::{Item, ItemResult};
    use crate::guardrails::CheckResult;
    use crate::providers::Usage;
    use crate::unit_tests::test;

    fn names(metrics: &[Metric]) -> Vec<(&str, u64)> {
        metrics.iter().map(|m| (m.name.as_str(), m.value)).collect()
    }

    #[test]
    fn a_request_counts_once_with_its_labels_and_tokens() {
        let record = Record {
            provider: "openai",
            model: "gpt-4.1-mini".into(),
            status: 200,
            cache: "MISS",
            usage: Some(Usage { prompt_tokens: 12, completion_tokens: 0, ..Default::default() }),
            duration_ms: 41,
            time_to_first_token_ms: Some(7),
            ..Record::default()
        };
        let metrics = of_request(&record, &MetricsSettings::default(), &mut ModelLabels::default());
        assert_eq!(
            names(&metrics),
            vec![
                ("gen_ai_gateway_requests_total.provider.openai.status_class.2xx.cache_status.miss.model.gpt-4.1-mini", 1),
                ("gen_ai_server_request_duration.provider.openai.model.gpt-4.1-mini", 41),
                ("gen_ai_server_time_to_first_token.provider.openai.model.gpt-4.1-mini", 7),
                ("gen_ai_client_token_usage_total.provider.openai.gen_ai_token_type.input.model.gpt-4.1-mini", 12),
            ]
        );
        assert_eq!(metrics.iter().filter(|m| m.kind == Kind::Histogram).count(), 2);
    }

    #[test]
    fn retries_fallbacks_and_stores_count_without_a_provider_too() {
        let record = Record {
            status: 401,
            moves: vec![("openai", Move::Retry), ("openai", Move::Fallback)],
            cache_stored: Some(300),
            ..Record::default()
        };
        let metrics = of_request(&record, &MetricsSettings::default(), &mut ModelLabels::default());
        assert_eq!(
            names(&metrics),
            vec![
                ("gen_ai_gateway_retries_total.provider.openai", 1),
                ("gen_ai_gateway_fallbacks_total.provider.openai", 1),
                ("gen_ai_gateway_cache_stores_total", 1),
                ("gen_ai_gateway_cache_stored_bytes_total", 300),
            ]
        );
    }

    #[test]
    fn each_check_run_counts_its_verdict_and_unknown_ids_are_other() {
        let checks = [("default.contains", false), ("default.regexMatch", true), ("made.up.by.a.client", true)];
        let checks = checks.iter().map(|(id, passed)| CheckResult::new(id, *passed, serde_json::Value::Null));
        let item =
            Item { id: "g".into(), checks: Vec::new(), deny: true, is_async: false, on_fail: None, on_success: None };
        let result = ItemResult::new(&item, checks.collect());
        let record = Record { status: 446, guardrails: vec![(HookStage::Before, result)], ..Record::default() };
        let metrics = of_request(&record, &MetricsSettings::default(), &mut ModelLabels::default());
        assert_eq!(
            names(&metrics),
            vec![
                ("gen_ai_gateway_guardrail_verdicts_total.verdict.fail.check.default.contains", 1),
                ("gen_ai_gateway_guardrail_verdicts_total.verdict.pass.check.default.regexMatch", 1),
                ("gen_ai_gateway_guardrail_verdicts_total.verdict.pass.check.other", 1),
            ]
        );
    }

    #[test]
    fn status_and_cache_classes() {
        assert_eq!(
            [status_class(0), status_class(204), status_class(446), status_class(503)],
            ["none", "2xx", "4xx", "5xx"]
        );
        let statuses = ["HIT", "SEMANTIC_HIT", "MISS", "MISS; semantic=unavailable", "REFRESH", "DISABLED", ""];
        assert_eq!(
            statuses.map(cache_status),
            ["hit", "semantic_hit", "miss", "miss", "refresh", "disabled", "disabled"]
        );
    }

    #[test]
    fn model_labels_are_bounded_and_sanitised() {
        let capped = MetricsSettings { models: None, max_models: 2, stream_usage: false };
        let mut labels = ModelLabels::default();
        assert_eq!(labels.label(&capped, "a"), "a");
        assert_eq!(labels.label(&capped, "b c{}"), "b_c__");
        assert_eq!(labels.label(&capped, "third"), "other", "past the cap");
        assert_eq!(labels.label(&capped, "a"), "a", "a model seen before keeps its label");
        assert_eq!(labels.label(&capped, ""), "none");
        assert_eq!(labels.label(&capped, &"x".repeat(100)).len(), 5, "other: the cut value is a new one");
        let listed = MetricsSettings {
            models: Some(vec!["gpt-4o".into(), "anthropic.claude-v2:1".into()]),
            max_models: 0,
            stream_usage: false,
        };
        assert_eq!(labels.label(&listed, "gpt-4o"), "gpt-4o");
        assert_eq!(labels.label(&listed, "anthropic.claude-v2:1"), "anthropic.claude-v2:1");
        assert_eq!(labels.label(&listed, "a"), "other", "only the listed models");
        assert_eq!(sanitise("meta/llama-3@8b\n"), "meta/llama-3_8b_");
        assert_eq!(sanitise(&"m".repeat(200)).len(), MAX_VALUE_CHARS);
    }
}
