//! Walks the strategy tree into a plan: the targets to try, in order, and for each one where a
//! failure leads. Fallback is the only mode that tries more than one target; loadbalance and
//! conditional choose one child while the plan is made.

use super::breaker::{circuit_id, is_open, CircuitId};
use super::{header_target, leaf_target, not_implemented, unavailable_feature, Target, TargetOptions};
use crate::catalog::Catalog;
use crate::config::{CircuitBreakerConfig, Config, StrategyMode};
use crate::errors::GatewayError;
use crate::ports::Host;
use crate::query;
use crate::request::headers::GatewayHeaders;
use crate::settings::Settings;
use serde_json::Value;

/// One target of the plan.
pub(crate) struct Attempt {
    pub(crate) target: Target,
    /// Where the target sits in the config, e.g. `targets[1].targets[0]`; empty for the root.
    pub(crate) path: String,
    pub(crate) circuit: Option<Circuit>,
    /// The fallbacks this target belongs to, innermost first.
    exits: Vec<Exit>,
}

pub(crate) struct Circuit {
    pub(crate) id: CircuitId,
    pub(crate) config: CircuitBreakerConfig,
}

/// How an attempt leaves one enclosing fallback when it fails.
struct Exit {
    /// The fallback's `on_status_codes`; `None`: every failure falls back.
    on_status_codes: Option<Vec<u16>>,
    /// The first attempt of the next target of that fallback; `None` when this was its last.
    next: Option<usize>,
}

/// Why an attempt did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The provider answered with a status that is not 2xx.
    Status(u16),
    /// No response headers within the request timeout.
    Timeout,
    /// No connection, or the connection broke before the response headers.
    Unreachable,
    /// The target's circuit is open: it was skipped without a call.
    CircuitOpen,
}

impl Failure {
    /// The status a user's status lists match: a timeout is a 408 and an unreachable provider
    /// a 502, as the client would see them.
    pub(crate) fn status(self) -> u16 {
        match self {
            Failure::Status(status) => status,
            Failure::Timeout => 408,
            Failure::Unreachable => 502,
            Failure::CircuitOpen => 503,
        }
    }

    /// The provider's status; `None` for failures without one.
    pub(crate) fn provider_status(self) -> Option<u16> {
        match self {
            Failure::Status(status) => Some(status),
            _ => None,
        }
    }
}

impl Exit {
    fn taken_on(&self, failure: Failure) -> bool {
        match (&self.on_status_codes, failure) {
            // Skipping an open circuit is not a failure the user lists: always move on.
            (_, Failure::CircuitOpen) | (None, _) => true,
            (Some(codes), failure) => codes.contains(&failure.status()),
        }
    }
}

pub(crate) struct Plan {
    pub(crate) attempts: Vec<Attempt>,
}

impl Plan {
    /// The attempt to go to when attempt `index` failed: each enclosing fallback, innermost
    /// first, either moves to its next target or (its codes do not match, or it has no next
    /// target) fails as a whole and leaves the decision to the fallback around it.
    #[cfg(test)]
    pub(crate) fn next_after(&self, index: usize, failure: Failure) -> Option<usize> {
        self.next_past(index, failure, 0).map(|(next, _)| next)
    }

    /// Like `next_after`, for an attempt that is being passed over (its circuit is open) on
    /// the way out of `failure`: its innermost `skipped_levels` fallbacks were entered only to
    /// pass it and always move on; the fallbacks around them decide by `failure`, as they
    /// would have without the open circuit. Also returns the fallback levels of the attempt it
    /// leads to that lie inside the fallback that moved on.
    pub(crate) fn next_past(&self, index: usize, failure: Failure, skipped_levels: usize) -> Option<(usize, usize)> {
        let exits = &self.attempts.get(index)?.exits;
        let (level, next) = exits.iter().enumerate().find_map(|(level, exit)| {
            let taken = level < skipped_levels || exit.taken_on(failure);
            exit.next.filter(|_| taken).map(|next| (level, next))
        })?;
        let outer_levels = exits.len() - level;
        let inner_levels = self.attempts.get(next)?.exits.len().saturating_sub(outer_levels);
        Some((next, inner_levels))
    }

    /// Whether any failure could lead to another call; only then must the request be kept.
    pub(crate) fn can_recover(&self) -> bool {
        self.attempts.len() > 1
            || self.attempts.iter().any(|a| a.target.options.retry.as_ref().is_some_and(|r| r.attempts > 0))
    }
}

/// Makes the plan of a request. `input` is what conditions query:
/// `{"metadata": ..., "params": <request body>, "url": {"pathname": ...}}`.
pub(crate) fn make_plan(
    settings: &Settings,
    headers: &GatewayHeaders,
    config: Option<&Config>,
    input: &Value,
    host: &mut dyn Host,
    catalog: &mut Catalog,
) -> Result<Plan, GatewayError> {
    let attempts = match config {
        Some(config) => {
            // Every target is looked at, chosen or not: a loadbalance or conditional would
            // otherwise refuse a target's feature only when it picks that target.
            if let Some(feature) = unavailable_in_tree(config, true, settings.control_plane.is_some()) {
                return Err(not_implemented(feature));
            }
            let mut resolver = Resolver { settings, headers, input, host, catalog };
            resolver.resolve(config, String::new(), &TargetOptions::from_headers(headers))?
        }
        None => vec![Attempt {
            target: header_target(settings, headers, catalog, &*host)?,
            path: String::new(),
            circuit: None,
            exits: vec![],
        }],
    };
    Ok(Plan { attempts })
}

struct Resolver<'a, 'c> {
    settings: &'a Settings,
    headers: &'a GatewayHeaders,
    input: &'a Value,
    host: &'a mut dyn Host,
    catalog: &'a mut Catalog<'c>,
}

/// The first feature of `node` or a target below it that this gateway cannot serve.
fn unavailable_in_tree(node: &Config, root: bool, control_plane: bool) -> Option<&'static str> {
    unavailable_feature(node, root, control_plane)
        .or_else(|| node.targets.iter().find_map(|target| unavailable_in_tree(target, false, control_plane)))
}

fn child_path(path: &str, index: usize) -> String {
    if path.is_empty() {
        format!("targets[{index}]")
    } else {
        format!("{path}.targets[{index}]")
    }
}

impl Resolver<'_, '_> {
    fn resolve(
        &mut self,
        node: &Config,
        path: String,
        inherited: &TargetOptions,
    ) -> Result<Vec<Attempt>, GatewayError> {
        let options = inherited.inherit(node);
        let (Some(strategy), Some(first)) = (node.strategy.as_ref(), node.targets.first()) else {
            return Ok(vec![self.leaf(node, path, options)?]);
        };
        match strategy.mode {
            StrategyMode::Single => self.resolve(first, child_path(&path, 0), &options),
            StrategyMode::LoadBalance => self.load_balance(node, &path, &options),
            StrategyMode::Conditional => {
                let wanted = strategy
                    .conditions
                    .iter()
                    .find(|condition| query::matches(&condition.query, self.input))
                    .map(|condition| &condition.then)
                    .or(strategy.default.as_ref())
                    .ok_or_else(no_condition_matched)?;
                // Validation made sure every name refers to exactly one target.
                let (index, child) = node
                    .targets
                    .iter()
                    .enumerate()
                    .find(|(_, t)| t.name.as_ref() == Some(wanted))
                    .ok_or_else(no_condition_matched)?;
                self.resolve(child, child_path(&path, index), &options)
            }
            StrategyMode::Fallback => {
                // The fallback's codes: its strategy's, else those beside its strategy.
                let codes = strategy.on_status_codes.as_ref().or(node.on_status_codes.as_ref());
                let mut groups = Vec::with_capacity(node.targets.len());
                for (index, child) in node.targets.iter().enumerate() {
                    let attempts = self.resolve(child, child_path(&path, index), &options)?;
                    // A target's own codes decide for its failures, unless it is a fallback
                    // itself (then they were that fallback's).
                    let own = child.on_status_codes.as_ref().filter(|_| !is_fallback(child));
                    groups.push((attempts, own.or(codes).cloned()));
                }
                Ok(chain(groups))
            }
        }
    }

    fn leaf(&mut self, node: &Config, path: String, options: TargetOptions) -> Result<Attempt, GatewayError> {
        let target = leaf_target(self.settings, self.headers, node, options, self.catalog, &*self.host)?;
        let circuit = target.options.cb_config.clone().map(|config| Circuit {
            id: circuit_id(
                target.provider.name,
                &format!("{}{}", target.upstream.authority, target.upstream.base_path),
                target.account.as_deref(),
            ),
            config,
        });
        Ok(Attempt { target, path, circuit, exits: vec![] })
    }

    /// A weighted random child; children whose every target has an open circuit are left out
    /// while others remain.
    fn load_balance(
        &mut self,
        node: &Config,
        path: &str,
        options: &TargetOptions,
    ) -> Result<Vec<Attempt>, GatewayError> {
        let mut weights: Vec<f64> = node.targets.iter().map(|t| t.weight.unwrap_or(1.0).max(0.0)).collect();
        if weights.iter().all(|w| *w <= 0.0) {
            return Err(GatewayError::new(400, "invalid_request_error", "every loadbalance target has weight 0")
                .with_code("invalid_config"));
        }
        let mut open_choice = None;
        while let Some(index) = pick_weighted(&weights, self.host.random()) {
            let (Some(child), Some(weight)) = (node.targets.get(index), weights.get_mut(index)) else {
                break;
            };
            *weight = 0.0;
            let attempts = self.resolve(child, child_path(path, index), options)?;
            if !self.all_open(&attempts) {
                return Ok(attempts);
            }
            open_choice = Some(attempts);
        }
        // Every child is open: the plan holds one, which the circuit check then refuses.
        open_choice.ok_or_else(|| GatewayError::new(400, "invalid_request_error", "no loadbalance target"))
    }

    fn all_open(&self, attempts: &[Attempt]) -> bool {
        let now = self.host.now_ms();
        attempts
            .iter()
            .all(|attempt| attempt.circuit.as_ref().is_some_and(|c| is_open(self.host.store(), c.id, &c.config, now)))
    }
}

fn is_fallback(node: &Config) -> bool {
    node.strategy.as_ref().is_some_and(|strategy| strategy.mode == StrategyMode::Fallback)
}

/// The targets of a fallback one after another, each with the codes that decide for its
/// failures: a failure of the last attempt of a target leads to the first attempt of the
/// next one, when those codes match.
fn chain(groups: Vec<(Vec<Attempt>, Option<Vec<u16>>)>) -> Vec<Attempt> {
    let count = groups.len();
    let mut attempts = Vec::with_capacity(groups.iter().map(|(group, _)| group.len()).sum());
    let mut start = 0;
    for (k, (group, on_status_codes)) in groups.into_iter().enumerate() {
        let end = start + group.len();
        let next = (k + 1 < count).then_some(end);
        for mut attempt in group {
            for exit in &mut attempt.exits {
                exit.next = exit.next.map(|n| n + start);
            }
            attempt.exits.push(Exit { on_status_codes: on_status_codes.clone(), next });
            attempts.push(attempt);
        }
        start = end;
    }
    attempts
}

/// An index drawn with probability proportional to its weight; `None` when no weight is
/// positive.
fn pick_weighted(weights: &[f64], random: u64) -> Option<usize> {
    // Weights are taken relative to the largest: a sum of huge ones would be infinite.
    let largest = weights.iter().copied().fold(0.0, f64::max);
    if largest <= 0.0 {
        return None;
    }
    let total: f64 = weights.iter().map(|weight| weight / largest).sum();
    let mut point = (random >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut last_positive = None;
    for (index, weight) in weights.iter().map(|weight| weight / largest).enumerate() {
        if weight > 0.0 {
            if point < weight {
                return Some(index);
            }
            point -= weight;
            last_positive = Some(index);
        }
    }
    // Rounding can leave `point` a hair above the last weight.
    last_positive
}

fn no_condition_matched() -> GatewayError {
    GatewayError::new(
        400,
        "invalid_request_error",
        "no condition of the conditional strategy matched the request and it has no default target",
    )
    .with_code("no_matching_target")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_config;
    use crate::ports::testing::FakeHost;
    use crate::unit_tests::test;
    use serde_json::json;

    fn plan_of(config: Value, input: Value) -> Result<Plan, GatewayError> {
        let settings = Settings::parse(br#"{"api_keys": ["gw"]}"#).unwrap();
        let headers = GatewayHeaders::parse([]).unwrap();
        let config = parse_config(&config).map_err(|e| e.to_gateway_error())?;
        let mut nothing = crate::catalog::Nothing;
        let mut catalog = Catalog::new(&settings, &mut nothing);
        make_plan(&settings, &headers, Some(&config), &input, &mut FakeHost::new(0), &mut catalog)
    }

    fn target(key: &str) -> Value {
        json!({"provider": "openai", "api_key": key, "name": key})
    }

    fn keys(plan: &Plan) -> Vec<&str> {
        plan.attempts.iter().map(|a| a.target.account.as_deref().unwrap_or("")).collect()
    }

    #[test]
    fn fallback_lists_targets_in_order_with_their_paths() {
        let plan =
            plan_of(json!({"strategy": {"mode": "fallback"}, "targets": [target("a"), target("b")]}), Value::Null)
                .unwrap();
        assert_eq!(keys(&plan), ["a", "b"]);
        assert_eq!(plan.attempts[1].path, "targets[1]");
        assert_eq!(plan.next_after(0, Failure::Status(500)), Some(1));
        assert_eq!(plan.next_after(0, Failure::Timeout), Some(1));
        assert_eq!(plan.next_after(1, Failure::Status(500)), None);
        assert!(plan.can_recover());
    }

    #[test]
    fn on_status_codes_limit_fallback() {
        let config = json!({"strategy": {"mode": "fallback", "on_status_codes": [429, 408]}, "targets": [target("a"), target("b")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_after(0, Failure::Status(429)), Some(1));
        assert_eq!(plan.next_after(0, Failure::Status(500)), None);
        assert_eq!(plan.next_after(0, Failure::Timeout), Some(1), "a timeout counts as 408");
        assert_eq!(plan.next_after(0, Failure::Unreachable), None);
        assert_eq!(plan.next_after(0, Failure::CircuitOpen), Some(1), "open circuits are always skipped");
    }

    #[test]
    fn on_status_codes_beside_the_strategy_or_on_a_target_limit_fallback_too() {
        // Beside the strategy: the fallback's codes, when its strategy names none.
        let config =
            json!({"strategy": {"mode": "fallback"}, "on_status_codes": [429], "targets": [target("a"), target("b")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_after(0, Failure::Status(429)), Some(1));
        assert_eq!(plan.next_after(0, Failure::Status(500)), None);
        // On a target: its own failures, in place of the fallback's codes.
        let mut a = target("a");
        a["on_status_codes"] = json!([503]);
        let config = json!({"strategy": {"mode": "fallback", "on_status_codes": [429]}, "targets": [a, target("b"), target("c")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_after(0, Failure::Status(503)), Some(1));
        assert_eq!(plan.next_after(0, Failure::Status(429)), None);
        assert_eq!(plan.next_after(1, Failure::Status(429)), Some(2), "the others keep the fallback's");
        assert_eq!(plan.next_after(1, Failure::Status(503)), None);
        // A target that is a fallback itself: its codes were its own fallback's.
        let inner =
            json!({"strategy": {"mode": "fallback"}, "on_status_codes": [503], "targets": [target("a"), target("b")]});
        let config =
            json!({"strategy": {"mode": "fallback", "on_status_codes": [429]}, "targets": [inner, target("c")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_after(0, Failure::Status(503)), Some(1));
        assert_eq!(plan.next_after(0, Failure::Status(429)), Some(2));
        assert_eq!(plan.next_after(1, Failure::Status(503)), None);
    }

    #[test]
    fn nested_fallbacks_leave_inner_ones_by_the_outer_rule() {
        // fallback(429 only)[ fallback(any)[a, b], c ]
        let inner = json!({"strategy": {"mode": "fallback"}, "targets": [target("a"), target("b")]});
        let config =
            json!({"strategy": {"mode": "fallback", "on_status_codes": [429]}, "targets": [inner, target("c")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(keys(&plan), ["a", "b", "c"]);
        assert_eq!(plan.attempts[1].path, "targets[0].targets[1]");
        assert_eq!(plan.next_after(0, Failure::Status(500)), Some(1), "inner fallback takes any failure");
        assert_eq!(plan.next_after(1, Failure::Status(429)), Some(2), "outer fallback on 429");
        assert_eq!(plan.next_after(1, Failure::Status(500)), None, "outer fallback ignores 500");
        // An inner fallback that does not fall back on a status fails as a whole.
        let inner =
            json!({"strategy": {"mode": "fallback", "on_status_codes": [503]}, "targets": [target("a"), target("b")]});
        let config = json!({"strategy": {"mode": "fallback"}, "targets": [inner, target("c")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_after(0, Failure::Status(500)), Some(2));
        assert_eq!(plan.next_after(0, Failure::Status(503)), Some(1));
    }

    #[test]
    fn passing_an_open_target_keeps_the_outer_rule() {
        // fallback(429 only)[ fallback(any)[a, b], c ]: a fails with 500, b is passed over.
        let inner = json!({"strategy": {"mode": "fallback"}, "targets": [target("a"), target("b")]});
        let config =
            json!({"strategy": {"mode": "fallback", "on_status_codes": [429]}, "targets": [inner, target("c")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_past(0, Failure::Status(500), 0), Some((1, 0)));
        assert_eq!(plan.next_past(1, Failure::Status(500), 0), None, "the outer fallback does not take 500");
        assert_eq!(plan.next_past(1, Failure::Status(429), 0), Some((2, 0)));
        // fallback(any)[ a, fallback(429 only)[b, c], d ]: a fails with 500, b is open: the
        // inner fallback was entered only to pass b, so it moves on to c.
        let inner =
            json!({"strategy": {"mode": "fallback", "on_status_codes": [429]}, "targets": [target("b"), target("c")]});
        let config = json!({"strategy": {"mode": "fallback"}, "targets": [target("a"), inner, target("d")]});
        let plan = plan_of(config, Value::Null).unwrap();
        assert_eq!(plan.next_past(0, Failure::Status(500), 0), Some((1, 1)));
        assert_eq!(plan.next_past(1, Failure::Status(500), 1), Some((2, 0)));
    }

    #[test]
    fn a_feature_of_a_target_not_chosen_is_refused_too() {
        let mut hooked = target("b");
        hooked["input_guardrails"] = json!([{"id": "g", "default.contains": {"words": ["x"], "operator": "none"}}]);
        let mut weightless = hooked.clone();
        weightless["weight"] = json!(0);
        let balanced = json!({"strategy": {"mode": "loadbalance"}, "targets": [target("a"), weightless]});
        let never = json!([{"query": {"metadata.tier": {"$eq": "none"}}, "then": "b"}]);
        let conditional = json!({"strategy": {"mode": "conditional", "conditions": never, "default": "a"},
                                 "targets": [target("a"), hooked]});
        for config in [balanced, conditional] {
            let error = plan_of(config, Value::Null).err().unwrap();
            assert_eq!((error.status, error.code), (501, Some("not_implemented")), "{}", error.message);
        }
    }

    #[test]
    fn loadbalance_inside_fallback_picks_one() {
        let lb = json!({"strategy": {"mode": "loadbalance"}, "targets": [target("a"), target("b")]});
        let plan =
            plan_of(json!({"strategy": {"mode": "fallback"}, "targets": [lb, target("c")]}), Value::Null).unwrap();
        assert_eq!(keys(&plan), ["a", "c"]);
        assert_eq!(plan.attempts[0].path, "targets[0].targets[0]");
    }

    #[test]
    fn options_inherit_down_the_tree() {
        let config = json!({
            "strategy": {"mode": "fallback"}, "retry": {"attempts": 2}, "request_timeout": 500,
            "cb_config": {"failure_threshold": 3, "cooldown_interval": 30000},
            "targets": [target("a"), {"provider": "openai", "api_key": "b", "retry": {"attempts": 0}, "request_timeout": 100}]});
        let plan = plan_of(config, Value::Null).unwrap();
        let (a, b) = (&plan.attempts[0].target.options, &plan.attempts[1].target.options);
        assert_eq!((a.retry.as_ref().unwrap().attempts, a.request_timeout), (2, Some(500)));
        assert_eq!((b.retry.as_ref().unwrap().attempts, b.request_timeout), (0, Some(100)));
        assert!(plan.attempts.iter().all(|a| a.circuit.is_some()));
    }

    #[test]
    fn single_plans_do_not_recover() {
        let plan = plan_of(target("a"), Value::Null).unwrap();
        assert!(!plan.can_recover());
        assert_eq!(plan.attempts[0].path, "");
        let plan =
            plan_of(json!({"provider": "openai", "api_key": "a", "retry": {"attempts": 1}}), Value::Null).unwrap();
        assert!(plan.can_recover());
    }

    #[test]
    fn every_weight_zero_is_a_config_error() {
        let config = json!({"strategy": {"mode": "loadbalance"}, "targets": [
            {"provider": "openai", "api_key": "a", "weight": 0}, {"provider": "openai", "api_key": "b", "weight": 0}]});
        assert_eq!(plan_of(config, Value::Null).err().unwrap().status, 400);
    }

    #[test]
    fn weighted_picks_follow_the_weights() {
        assert_eq!(pick_weighted(&[1.0, 1.0], 0), Some(0));
        assert_eq!(pick_weighted(&[1.0, 1.0], u64::MAX), Some(1));
        assert_eq!(pick_weighted(&[0.0, 1.0], 0), Some(1));
        assert_eq!(pick_weighted(&[1.0, 0.0], u64::MAX), Some(0));
        assert_eq!(pick_weighted(&[0.0, 0.0], 7), None);
        // Weights whose sum is beyond f64 still share by their ratio.
        assert_eq!(pick_weighted(&[1e308, 1e308], 0), Some(0));
        assert_eq!(pick_weighted(&[1e308, 1e308], 1 << 62), Some(0));
        assert_eq!(pick_weighted(&[1e308, 1e308], 3 << 62), Some(1));
    }
}
