//! The filter's metrics, the shipped Envoy config's `stats_tags` and the metrics table of docs/observability.md
//! cannot drift apart: every metric `exchange/metrics.rs` defines is made as the filter makes
//! it (its labels in the stat name), put through the tag extraction of the rendered config
//! (`envoy/envoy.yaml`, which `tests/e2e/test_envoy_config.py` keeps equal to what
//! `envoy/render.py` makes of the template, as `./build.sh config` does) the way Envoy applies
//! it, and must come out under its own name with exactly the labels docs/observability.md lists for it,
//! each holding the value the filter put in.

use crate::exchange::metrics::{self, ModelLabels};
use crate::exchange::record::HookStage;
use crate::exchange::Record;
use crate::guardrails::verdict::{Item, ItemResult};
use crate::guardrails::CheckResult;
use crate::providers::Usage;
use crate::query::regex::Regex;
use crate::routing::attempts::Move;
use crate::settings::MetricsSettings;
use crate::unit_tests::test;
use std::collections::{BTreeMap, BTreeSet};

const METRICS_SOURCE: &str = include_str!("exchange/metrics.rs");
const RENDERED_CONFIG: &str = include_str!("../envoy/envoy.yaml");
const METRICS_DOC: &str = include_str!("../docs/observability.md");

/// The metric names `metrics.rs` defines: its `"gen_ai_..."` constants.
fn defined_metrics() -> BTreeSet<String> {
    METRICS_SOURCE
        .lines()
        .filter(|line| line.starts_with("pub(crate) const "))
        .filter_map(|line| line.split('"').nth(1))
        .filter(|name| name.starts_with("gen_ai_"))
        .map(str::to_string)
        .collect()
}

/// Every stat name the filter makes, with the label values it put in: a request that fills
/// every per-request metric, a control-plane lookup, and the stats without labels.
fn stat_names() -> Vec<String> {
    let checks = [CheckResult::new("default.regexMatch", false, serde_json::Value::Null)];
    let item =
        Item { id: "g".into(), checks: Vec::new(), deny: true, is_async: false, on_fail: None, on_success: None };
    let record = Record {
        provider: "openai",
        model: "gpt-4.1-mini".into(),
        status: 200,
        cache: "MISS",
        usage: Some(Usage { prompt_tokens: 12, completion_tokens: 5, ..Default::default() }),
        duration_ms: 41,
        time_to_first_token_ms: Some(7),
        moves: vec![("openai", Move::Retry), ("openai", Move::Fallback)],
        cache_stored: Some(300),
        cost_micro_usd: Some(9),
        guardrails: vec![(HookStage::Before, ItemResult::new(&item, checks.into()))],
        ..Record::default()
    };
    let settings = MetricsSettings::default();
    let mut names: Vec<String> =
        metrics::of_request(&record, &settings, &mut ModelLabels::default()).into_iter().map(|m| m.name).collect();
    let facts = crate::mcp::Facts {
        server: "files".into(),
        id: None,
        method: Some("tools/call".into()),
        tool: Some("read".into()),
        outcome: crate::mcp::Outcome::ToolError,
    };
    let mcp = Record { method: "POST".into(), mcp: Some(Box::new(facts)), duration_ms: 3, ..Record::default() };
    names.extend(metrics::of_request(&mcp, &settings, &mut ModelLabels::default()).into_iter().map(|m| m.name));
    names.push(metrics::lookup("found"));
    names.push(metrics::limit_refusal(gateway_schema::limits::LimitKind::Budget));
    for bare in [metrics::CIRCUITS_OPENED, metrics::CIRCUITS_OPEN, metrics::RECORDS_DROPPED] {
        names.push(bare.to_string());
    }
    names
}

/// The rendered config's `stats_tags`: each tag's name and regex, in order.
fn stats_tags() -> Vec<(String, Regex)> {
    let section = RENDERED_CONFIG.split("stats_tags:").nth(1).expect("the rendered config has stats_tags");
    let mut tags = Vec::new();
    let mut lines =
        section.lines().skip(1).map(str::trim).take_while(|line| line.starts_with('-') || line.starts_with("regex"));
    while let Some(line) = lines.next() {
        let name = line.strip_prefix("- tag_name:").expect("a tag_name line").trim();
        let regex = lines.next().and_then(|l| l.strip_prefix("regex:")).expect("its regex line").trim();
        // A YAML single-quoted scalar: `''` is a quote.
        let regex =
            regex.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')).expect("a quoted regex").replace("''", "'");
        tags.push((name.to_string(), Regex::new(&regex).expect("a tag regex compiles")));
    }
    assert!(!tags.is_empty(), "no stats_tags found in the rendered config");
    tags
}

/// What `/stats/prometheus` shows of stat `stat`: Envoy searches each tag's regex in the whole
/// name; its first group is cut from the name and its second (or only) group is the tag's value.
/// The Prometheus name then drops the `wasmcustom.` of custom stats and writes any character
/// outside `[a-zA-Z0-9_:]` as `_`.
fn as_prometheus(tags: &[(String, Regex)], stat: &str) -> (String, BTreeMap<String, String>) {
    let mut cut = vec![false; stat.len()];
    let mut labels = BTreeMap::new();
    for (name, regex) in tags {
        let Some(found) = regex.captures(stat) else { continue };
        let removed = found.get(1).expect("a tag regex has a group");
        let value = found.get(2).unwrap_or(removed);
        labels.insert(name.clone(), value.as_str().to_string());
        cut[removed.range()].iter_mut().for_each(|c| *c = true);
    }
    let rest: String = stat.char_indices().filter(|(i, _)| !cut[*i]).map(|(_, c)| c).collect();
    let rest = rest.strip_prefix("wasmcustom.").unwrap_or(&rest);
    let name = rest.chars().map(|c| if c.is_ascii_alphanumeric() || c == ':' { c } else { '_' }).collect();
    (name, labels)
}

/// The metrics table of docs/observability.md: each metric's labels (the backquoted words of the labels column
/// outside parentheses, which hold their values).
fn readme_labels() -> BTreeMap<String, BTreeSet<String>> {
    let mut table = BTreeMap::new();
    for row in METRICS_DOC.lines().filter(|line| line.starts_with("| `gen_ai_")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (names, labels) = (cells[1], cells[3]);
        let mut outside = String::new();
        let mut depth = 0;
        for c in labels.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => outside.push(c),
                _ => {}
            }
        }
        let labels: BTreeSet<String> = outside.split('`').skip(1).step_by(2).map(str::to_string).collect();
        for name in names.split('`').skip(1).step_by(2) {
            table.insert(name.to_string(), labels.clone());
        }
    }
    table
}

/// The label values the filter put into `stat` (after the metric's name, `.label.value` pairs;
/// the last value keeps its dots).
fn labels_put_in(stat: &str, metric: &str, readme: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut rest = stat.strip_prefix(metric).unwrap_or_default();
    let mut labels = BTreeMap::new();
    while let Some(after) = rest.strip_prefix('.') {
        let (label, after) = after.split_once('.').expect("a label has a value");
        // The value runs to the next `.label.` the table knows of, or to the end.
        let end = readme.iter().filter_map(|next| after.find(&format!(".{next}."))).min().unwrap_or(after.len());
        labels.insert(label.to_string(), after[..end].to_string());
        rest = &after[end..];
    }
    labels
}

#[test]
fn every_metric_comes_out_of_envoys_tags_with_the_labels_the_docs_list() {
    let tags = stats_tags();
    let readme = readme_labels();
    let defined = defined_metrics();
    let mut seen = BTreeSet::new();
    let mut failures = Vec::new();
    for stat in stat_names() {
        let (name, labels) = as_prometheus(&tags, &format!("wasmcustom.{stat}"));
        seen.insert(name.clone());
        let Some(listed) = readme.get(&name) else {
            failures.push(format!(
                "{stat}: comes out as `{name}`, which the metrics table of docs/observability.md does not list"
            ));
            continue;
        };
        let got: BTreeSet<String> = labels.keys().cloned().collect();
        if &got != listed {
            failures.push(format!("{stat}: labels {got:?} out of Envoy, docs/observability.md lists {listed:?}"));
        }
        let put_in = labels_put_in(&stat, &name, listed);
        if labels != put_in {
            failures.push(format!("{stat}: Envoy's label values {labels:?}, the filter put in {put_in:?}"));
        }
    }
    for metric in defined.difference(&seen) {
        failures.push(format!("{metric}: defined in metrics.rs, but no stat of it was checked (add it to stat_names)"));
    }
    for metric in readme.keys().filter(|m| !defined.contains(*m)) {
        failures.push(format!("{metric}: in the metrics table of docs/observability.md, not defined in metrics.rs"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The check above can fail: a label the regexes do not know stays in the name.
#[test]
fn a_label_without_a_tag_stays_in_the_prometheus_name() {
    let (name, labels) =
        as_prometheus(&stats_tags(), "wasmcustom.gen_ai_gateway_retries_total.provider.openai.region.eu");
    assert_eq!(name, "gen_ai_gateway_retries_total_region_eu");
    assert_eq!(labels.get("provider").map(String::as_str), Some("openai"));
}

/// The native module defines each family with its labels (`metrics::FAMILIES`) and reads every
/// stat name back into them: the same names, labels and values as the wasm build's tags give.
#[test]
fn every_stat_reads_back_as_its_family_with_the_labels_envoys_tags_give() {
    let tags = stats_tags();
    for stat in stat_names() {
        let (name, labels) = as_prometheus(&tags, &format!("wasmcustom.{stat}"));
        let (family, values) = metrics::family_of(&stat).unwrap_or_else(|| panic!("{stat}: no family"));
        let (family_name, _, label_names) = metrics::FAMILIES[family];
        let read: BTreeMap<String, String> =
            label_names.iter().zip(values.as_slice()).map(|(l, v)| (l.to_string(), v.to_string())).collect();
        assert_eq!((family_name, &read), (name.as_str(), &labels), "{stat}");
    }
    for stat in ["gen_ai_gateway_retries_total.provider", "gen_ai_gateway_retries_total.region.eu", "nope"] {
        assert_eq!(metrics::family_of(stat), None, "{stat}");
    }
}
