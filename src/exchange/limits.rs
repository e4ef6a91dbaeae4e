//! Limits in the exchange: a routed request reserves its worst case of every limit that applies
//! before anything else runs (a refused request reaches no check and no provider), waits for a
//! grant when its worker's lease has no room, and settles its reservations with its usage
//! when it ends. The worker's timer renews leases in use and reports the ones that are done.

use super::waiters::{Fetch, Waiter};
use super::worker::{rearm, Tasks, Timer, Wake};
use super::{metrics, Env, Exchange};
use crate::errors::GatewayError;
use crate::pipeline::Call;
use crate::providers::Usage;
use crate::usage_limits::leases::{Grant, Hold, Leases};
use crate::usage_limits::{self, Demand};
use gateway_schema::limits::LimitKind;

/// A request waits for at most this many grants (each ask serves every request waiting) ...
const MAX_WAITS: u32 = 16;
/// ... and, while other replicas' leases may still free allowance, at most this long.
const MAX_WAIT_MS: u64 = 10_000;

/// What a request under limits holds.
pub(super) struct Limited {
    demands: Vec<Demand>,
    /// The request's input-token estimate (with a token or budget limit).
    input_estimate: u64,
    /// Bytes of the answer that reached the client: an upper bound of its output tokens when
    /// the provider reported no usage (a stream the client left).
    pub(super) answered_bytes: u64,
    /// Answered from the cache: no provider was called, no token used.
    pub(super) from_cache: bool,
    /// One per demand, in order, as they were reserved.
    holds: Vec<Hold>,
    waits: u32,
    since_ms: u64,
    /// The `x-ratelimit-*` headers of its answer (and `retry-after` when refused).
    headers: Vec<(&'static str, String)>,
}

/// Where reserving left a request.
pub(super) enum Allowance {
    /// Every limit that applies holds its reservation (or none applies).
    Admitted,
    /// Waiting for a grant (or for the time to ask again).
    Waiting,
    Refused(GatewayError),
}

impl Exchange {
    /// Reserves the request's worst case of every limit that applies to it.
    pub(super) fn reserve(&mut self, env: &mut Env, call: &Call) -> Allowance {
        let Some(policy) = self.policy.as_ref().filter(|p| p.has_limits()) else {
            return Allowance::Admitted;
        };
        match usage_limits::demands(policy, &call.limits_ask()) {
            Ok((demands, input_estimate)) => self.reserve_demands(env, demands, input_estimate),
            Err(error) => Allowance::Refused(error),
        }
    }

    /// Reserves one request of every MCP limit that applies to a call of `server`'s `tool`.
    pub(super) fn reserve_tool_call(&mut self, env: &mut Env, server: &str, tool: &str) -> Allowance {
        let Some(policy) = self.policy.as_ref().filter(|p| p.has_limits()) else {
            return Allowance::Admitted;
        };
        let (workspace, key_id) = (self.record.workspace.as_str(), self.record.api_key_id.as_deref());
        let demands = usage_limits::tool_demands(policy, workspace, key_id, server, tool);
        self.reserve_demands(env, demands, 0)
    }

    fn reserve_demands(&mut self, env: &mut Env, demands: Vec<Demand>, input_estimate: u64) -> Allowance {
        if demands.is_empty() {
            return Allowance::Admitted;
        }
        let since_ms = env.io.host().now_ms();
        self.limits = Some(Box::new(Limited {
            holds: Vec::with_capacity(demands.len()),
            demands,
            input_estimate,
            answered_bytes: 0,
            from_cache: false,
            waits: 0,
            since_ms,
            headers: Vec::new(),
        }));
        self.reserve_again(env)
    }

    /// A grant this request waited for arrived (or the time to ask again came): reserves
    /// again, or refuses with the grant's word.
    pub(super) fn allowance_arrived(&mut self, env: &mut Env, grant: Option<&Grant>) -> Allowance {
        let Some(limited) = self.limits.as_deref_mut() else {
            return Allowance::Admitted;
        };
        let Some(demand) = limited.demands.get(limited.holds.len()).cloned() else {
            return Allowance::Admitted;
        };
        let now_ms = env.io.host().now_ms();
        match grant {
            None => return refuse(env, limited, &demand, usage_limits::unavailable(&demand), None),
            Some(grant) if grant.gone => {
                // The limit was deleted since the request read its policy: it applies no more.
                limited.demands.retain(|d| d.key.limit != demand.key.limit);
            }
            Some(grant) if grant.granted == 0 => {
                let waited = now_ms.saturating_sub(limited.since_ms);
                match grant.retry_ms {
                    Some(retry_ms) if limited.waits < MAX_WAITS && waited + retry_ms <= MAX_WAIT_MS => {
                        limited.waits += 1;
                        env.tasks.timers.push(Timer {
                            due_ms: now_ms + retry_ms,
                            owner: env.id,
                            wake: Wake::Allowance,
                        });
                        rearm(env.tasks, env.io);
                        return Allowance::Waiting;
                    }
                    _ => {
                        let retry_after = grant.reset_s.max(1);
                        let error = usage_limits::refusal(&demand, retry_after);
                        return refuse(env, limited, &demand, error, Some(retry_after));
                    }
                }
            }
            Some(_) => {}
        }
        self.reserve_again(env)
    }

    /// Reserves what is left to reserve (after a grant, or when the time to ask again came).
    pub(super) fn reserve_again(&mut self, env: &mut Env) -> Allowance {
        let Some(limited) = self.limits.as_deref_mut() else {
            return Allowance::Admitted;
        };
        let now_ms = env.io.host().now_ms();
        while let Some(demand) = limited.demands.get(limited.holds.len()) {
            match env.tasks.leases.reserve(demand, now_ms) {
                Some(hold) => limited.holds.push(hold),
                None if limited.waits >= MAX_WAITS => {
                    let demand = demand.clone();
                    return refuse(env, limited, &demand, usage_limits::refusal(&demand, 1), Some(1));
                }
                None => {
                    limited.waits += 1;
                    return ask(env, limited, demand.clone());
                }
            }
        }
        limited.headers = standing_headers(env.tasks, &limited.demands, now_ms, None);
        if env.tasks.leases.take_woken() {
            rearm(env.tasks, env.io);
        }
        Allowance::Admitted
    }

    /// The request ended: each reservation becomes what it used (what the provider reported,
    /// at its cost), and the request's cost is written in its record. True when a lease is
    /// ready to be reported now.
    pub(super) fn settle(&mut self, leases: &mut Leases) -> bool {
        let (record, policy) = (&mut self.record, self.policy.as_deref());
        let usage = record.usage;
        if let Some(usage) = usage {
            record.cost_micro_usd = usage_limits::cost(policy, &record.model, usage);
        }
        let Some(limited) = self.limits.as_deref() else {
            return false;
        };
        // An answer without usage: nothing was used when the provider failed or was never
        // reached; else (a stream the client left) at most its input estimate and one token per
        // byte that reached the client, and never more than the reservation.
        let failed = record.status >= 400 || record.status == 0;
        let (input, output) = (limited.input_estimate, limited.answered_bytes);
        let mut reportable = false;
        for hold in &limited.holds {
            let actual = match (hold.key.kind, usage) {
                (LimitKind::Requests, _) => 1,
                _ if limited.from_cache => 0,
                (LimitKind::Tokens, Some(usage)) => usage.prompt_tokens.saturating_add(usage.completion_tokens),
                (LimitKind::Budget, Some(_)) => record.cost_micro_usd.unwrap_or(hold.amount),
                (_, None) if failed => 0,
                (LimitKind::Tokens, None) => input.saturating_add(output).min(hold.amount),
                (LimitKind::Budget, None) => {
                    let most = Usage { prompt_tokens: input, completion_tokens: output, ..Default::default() };
                    usage_limits::most_cost(policy, &record.model, most).map_or(hold.amount, |c| c.min(hold.amount))
                }
            };
            reportable |= leases.settle(hold, actual);
        }
        reportable
    }

    /// The `x-ratelimit-*` (and `retry-after`) headers of a request under limits.
    pub(super) fn limit_headers(&self) -> &[(&'static str, String)] {
        self.limits.as_deref().map_or(&[], |limited| limited.headers.as_slice())
    }
}

/// Asks the control plane for `demand`'s allowance (one ask serves every request of the worker
/// waiting for the same ledger).
fn ask(env: &mut Env, limited: &mut Limited, demand: Demand) -> Allowance {
    if env.settings.control_plane.is_none() {
        return refuse(env, limited, &demand, usage_limits::unavailable(&demand), None);
    }
    let fetch = Fetch::Allowance(demand.key.clone());
    if env.tasks.waiters.join(&fetch, || Waiter::request(env.id)) {
        return Allowance::Waiting;
    }
    // Asked from the root context's timer, not from here: a call that cannot be sent answers
    // every request waiting for it, this one included, which is in the middle of its event.
    let now_ms = env.io.host().now_ms();
    let (ask, reports) = env.tasks.leases.ask(&demand, now_ms);
    let Some(cp) = &env.settings.control_plane else {
        return refuse(env, limited, &demand, usage_limits::unavailable(&demand), None);
    };
    let call = super::shipping::leases(cp, std::slice::from_ref(&ask), &reports);
    env.tasks.waiters.started(fetch.clone(), Waiter::request(env.id), now_ms, &call);
    env.tasks.to_send.push((fetch, call, reports));
    rearm(env.tasks, env.io);
    Allowance::Waiting
}

/// Refuses the request: what it reserved of other limits is freed, and its answer says how
/// the limits stand.
fn refuse(
    env: &mut Env,
    limited: &mut Limited,
    demand: &Demand,
    error: GatewayError,
    retry_after: Option<u64>,
) -> Allowance {
    let mut reportable = false;
    for hold in limited.holds.drain(..) {
        reportable |= env.tasks.leases.settle(&hold, 0);
    }
    if reportable {
        rearm(env.tasks, env.io);
    }
    let now_ms = env.io.host().now_ms();
    limited.headers = standing_headers(env.tasks, &limited.demands, now_ms, retry_after);
    if error.status == 429 {
        env.io.metric(metrics::Kind::Counter, &metrics::limit_refusal(demand.key.kind), 1);
    }
    Allowance::Refused(error)
}

/// OpenAI's `x-ratelimit-*` headers: of each kind, the limit with the least left.
fn standing_headers(
    tasks: &Tasks,
    demands: &[Demand],
    now_ms: u64,
    retry_after: Option<u64>,
) -> Vec<(&'static str, String)> {
    const KINDS: [(LimitKind, [&str; 3]); 2] = [
        (
            LimitKind::Requests,
            ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"],
        ),
        (LimitKind::Tokens, ["x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"]),
    ];
    let mut headers = Vec::new();
    for (kind, [limit, remaining, reset]) in KINDS {
        let standings =
            demands.iter().filter(|d| d.key.kind == kind).filter_map(|d| tasks.leases.standing(&d.key, now_ms));
        if let Some(least) = standings.min_by_key(|s| s.remaining) {
            headers.push((limit, least.bound.to_string()));
            headers.push((remaining, least.remaining.to_string()));
            headers.push((reset, format!("{}s", least.reset_s)));
        }
    }
    if let Some(seconds) = retry_after {
        headers.push(("retry-after", seconds.to_string()));
    }
    headers
}
