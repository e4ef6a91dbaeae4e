//! Recovery: when the routed attempt fails in a way the plan retries or falls back on, its
//! response is held (its body dropped) and the later attempts run as dispatched calls
//! through the recovery listener, each after its delay on the root's timer and with its
//! backend's access token; the latest outcome is finished and sent as a local answer.

use super::finish::{Delivery, Whole};
use super::head::Head;
use super::reply::response_mode;
use super::request::{token_for, Token};
use super::worker::{rearm, Task, Timer, Wake};
use super::{metrics, reply, Action, CallAnswer, Dispatch, Env, Exchange, Phase, RawHeaders, Routed};
use crate::errors::GatewayError;
use crate::pipeline::{Call, Forward, ResponsePlan};
use crate::routing::attempts::Next;
use crate::routing::plan::Failure;
use crate::routing::Target;
use crate::settings::Settings;

/// A dispatched call needs a timeout of its own; the request timeout is Envoy's per-try
/// timeout of the internal listener's router (until the response headers), as for routed
/// requests. This one bounds a whole generation, like Envoy's default stream idle timeout
/// bounds a silent client connection.
const CALL_TIMEOUT_MS: u64 = 300_000;

/// A request whose first attempt failed and whose plan goes on.
pub(super) struct Recovery {
    pub(super) call: Call,
    /// The client's request headers and body, to build every later attempt.
    raw: RawHeaders,
    body: Vec<u8>,
    /// The response plan of the latest attempt.
    pub(super) plan: ResponsePlan,
    latest: Outcome,
    /// The attempt waiting for its backend's access token.
    awaiting_token: Option<usize>,
    /// The answer was sent.
    pub(super) answered: bool,
}

/// How the latest attempt ended, kept for the final answer.
enum Outcome {
    Response(Head, Vec<u8>),
    Timeout,
    /// Why the target could not be reached.
    Unreachable(String),
}

impl Outcome {
    /// A failed attempt's outcome; the response is kept when the provider sent one.
    fn of(failure: Failure, head: Head, body: Vec<u8>) -> Outcome {
        match failure {
            Failure::Status(_) => Outcome::Response(head, body),
            Failure::Timeout => Outcome::Timeout,
            Failure::Unreachable | Failure::CircuitOpen => {
                Outcome::Unreachable("the connection failed before a response".into())
            }
        }
    }
}

impl Exchange {
    /// The routed attempt failed and the plan goes on: hold this response and run the next
    /// attempts as dispatched calls.
    pub(super) fn recover(&mut self, env: &mut Env, routed: Routed, failure: Failure, next: Next) -> Action {
        let Some((raw, body)) = routed.retained else {
            return Action::Continue;
        };
        // The failed response's status and headers (its body is dropped chunk by chunk): the
        // answer when no later attempt can even be dispatched.
        let status = match failure {
            Failure::Status(status) => status,
            Failure::Timeout | Failure::Unreachable | Failure::CircuitOpen => 0,
        };
        let head = Head { status, headers: routed.head.headers };
        self.phase = Phase::Recovering(Box::new(Recovery {
            call: routed.call,
            raw,
            body,
            plan: routed.plan,
            latest: Outcome::of(failure, head, Vec::new()),
            awaiting_token: None,
            answered: false,
        }));
        self.step(env, next);
        self.hold_answer(env)
    }

    /// Carries out `next` until a call is on its way, a timer is set, or the answer is sent.
    pub(super) fn step(&mut self, env: &mut Env, mut next: Next) {
        loop {
            next = match next {
                Next::GiveUp => return self.answer_recovered(env),
                Next::Call { index, delay_ms } if delay_ms > 0 => {
                    let due_ms = env.io.host().now_ms().saturating_add(delay_ms);
                    env.tasks.timers.push(Timer { due_ms, owner: env.id, wake: Wake::Attempt(index) });
                    return rearm(env.tasks, env.io);
                }
                Next::Call { index, .. } => match self.dispatch_attempt(env, index, None) {
                    Some(failed) => failed,
                    None => return,
                },
            };
        }
    }

    /// The access token a recovery attempt waited for (or why there is none).
    pub(super) fn attempt_token_arrived(&mut self, env: &mut Env, fetched: &Result<String, GatewayError>) {
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        let Some(index) = recovery.awaiting_token.take() else {
            return;
        };
        let next = match fetched {
            Ok(token) => match self.dispatch_attempt(env, index, Some(token)) {
                Some(next) => next,
                None => return,
            },
            Err(error) => {
                log::warn!("attempt {index} skipped: {}", error.message);
                recovery.call.attempts.skip(env.io.host())
            }
        };
        self.step(env, next);
    }

    /// Dispatches attempt `index` (`token`: its backend's access token, just fetched); what to
    /// do instead when it cannot even start.
    fn dispatch_attempt(&mut self, env: &mut Env, index: usize, token: Option<&str>) -> Option<Next> {
        let Phase::Recovering(recovery) = &mut self.phase else {
            return None;
        };
        let cached = match token {
            Some(_) => None,
            None => match token_for(env, &recovery.call, index) {
                Ok(Token::Unneeded) => None,
                Ok(Token::Ready(token)) => Some(token),
                Ok(Token::Awaited) => {
                    recovery.awaiting_token = Some(index);
                    return None;
                }
                Err(error) => {
                    log::warn!("attempt {index} skipped: {}", error.message);
                    return Some(recovery.call.attempts.skip(env.io.host()));
                }
            },
        };
        let token = token.or(cached.as_deref());
        let facts = recovery.call.facts(index);
        self.record.model = facts.model;
        let host = env.io.host();
        let forward = match recovery.call.forward(env.settings, &recovery.raw, index, token, &|| host.now_ms()) {
            Ok(forward) => forward,
            Err(error) => {
                log::warn!("attempt {index} skipped, its request cannot be built: {}", error.message);
                return Some(recovery.call.attempts.skip(env.io.host()));
            }
        };
        let Forward { headers, body, response } = forward;
        let target = recovery.call.target(index);
        let call = attempt_call(env.settings, target, &headers.apply(&recovery.raw), body, &recovery.body);
        match env.io.dispatch(env.id, &call) {
            Some(token) => {
                // The answer will be this attempt's (until then the latest outcome is the
                // previous attempt's, answered by its own provider's translator).
                recovery.call.attempts.sending();
                recovery.plan = response;
                env.tasks.calls.insert(token, (env.id, Task::Attempt));
                None
            }
            // The gateway's own fault (e.g. no recovery cluster), not the provider's: the next
            // target is tried. In `upstream` mode the call goes to the host's cluster for the
            // target's host: that it has none is this target's answer unless a later one
            // answers, as when a routed request finds none.
            None => {
                log::warn!("dispatching to cluster {} failed", call.cluster);
                if let (Some(_), Some(target)) = (&env.settings.upstream, target) {
                    let detail = reply::no_route_detail(&call.cluster, &target.upstream.host, "cluster_not_found");
                    recovery.latest = Outcome::Unreachable(detail);
                    recovery.call.attempts.sending();
                }
                Some(recovery.call.attempts.skip(env.io.host()))
            }
        }
    }

    pub(super) fn attempt_answered(&mut self, env: &mut Env, answer: CallAnswer) {
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        let CallAnswer { status, headers, body } = answer;
        let next = match reply::call_failure(status, &body) {
            None => {
                recovery.call.attempts.succeeded(status, env.io.host());
                count_circuits(env, &mut recovery.call);
                recovery.latest = Outcome::Response(Head { status, headers }, body);
                Next::GiveUp
            }
            Some(failure) => {
                let next = recovery.call.attempts.failed(failure, &headers, env.io.host());
                count_circuits(env, &mut recovery.call);
                recovery.latest = Outcome::of(failure, Head { status, headers }, body);
                next
            }
        };
        self.step(env, next);
    }

    /// Sends the latest outcome of a recovered request as a local answer.
    fn answer_recovered(&mut self, env: &mut Env) {
        let expects_json = self.expects_json();
        let head_request = self.record.method == "HEAD";
        let Phase::Recovering(recovery) = &mut self.phase else {
            return;
        };
        recovery.answered = true;
        let whole = match std::mem::replace(&mut recovery.latest, Outcome::Timeout) {
            Outcome::Response(head, body) => {
                let mode = response_mode(&recovery.plan, head_request, head.status, expects_json, head.is_stream());
                Whole::Provider { mode, head, body }
            }
            Outcome::Timeout => Whole::Gateway(reply::timeout_error()),
            Outcome::Unreachable(detail) => Whole::Gateway(reply::unreachable_error(&detail)),
        };
        self.finish_answer(env, whole, Delivery::Recovered);
    }
}

/// Adds the circuits the request's latest outcome opened to the host's counter, and how it
/// changed the circuits open now to the gauge.
pub(super) fn count_circuits(env: &mut Env, call: &mut Call) {
    let opened = std::mem::take(&mut call.attempts.circuits_opened);
    if opened > 0 {
        env.io.metric(metrics::Kind::Counter, metrics::CIRCUITS_OPENED, u64::from(opened));
    }
    let change = std::mem::take(&mut call.attempts.circuits_open_change);
    if change != 0 {
        env.io.add_to_gauge(metrics::CIRCUITS_OPEN, i64::from(change));
    }
}

/// The dispatched call of a later attempt: the attempt's request headers and body (the
/// client's, when the translator kept them), through the recovery listener (whose router reads
/// the cluster and per-try timeout headers), or straight to the target host's cluster (then
/// the attempt's timeout bounds the call, and those headers are not sent).
fn attempt_call(
    settings: &Settings,
    target: Option<&Target>,
    headers: &[(&str, &[u8])],
    body: Option<Vec<u8>>,
    original_body: &[u8],
) -> Dispatch {
    let body = body.unwrap_or_else(|| original_body.to_vec());
    let (cluster, direct) = match (&settings.upstream, target) {
        (Some(host), Some(target)) => (host.cluster(&target.upstream), Some(target.options.request_timeout)),
        _ => (settings.recovery_cluster.clone(), None),
    };
    let route_header = settings.route_header();
    let framing = ["content-length", "transfer-encoding"];
    let mut headers: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| !framing.contains(name))
        .filter(|(name, _)| direct.is_none() || !(*name == route_header || name.starts_with("x-envoy-")))
        .map(|(name, value)| (name.to_string(), String::from_utf8_lossy(value).into_owned()))
        .collect();
    headers.push(("content-length".into(), body.len().to_string()));
    let timeout_ms = direct.flatten().unwrap_or(CALL_TIMEOUT_MS);
    Dispatch { cluster, headers, body, timeout_ms }
}
