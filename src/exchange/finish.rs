//! Finishing a whole answer, the one sequence every answer held whole goes through (a routed
//! answer buffered to be translated or reshaped, one held for the output checks, a recovered
//! attempt's): translate, read its usage, store it in the cache, pass it through the output
//! checks, then send it with the gateway's headers, in place of the provider's body or as a
//! local reply.

use super::guard::{Answer, Progress};
use super::head::Head;
use super::reply::{self, finish, gateway_error, provider_headers, ResponseMode, Unreadable};
use super::usage::UsageScan;
use super::worker;
use super::{Action, After, Env, Exchange, GatewayError, Phase};
use crate::pipeline::ResponsePlan;
use crate::stream;

/// A whole answer before it is finished.
pub(super) enum Whole {
    /// The provider's, finished in `mode` (its head: status and headers).
    Provider { mode: ResponseMode, head: Head, body: Vec<u8> },
    /// The gateway's own error, when the provider gave no answer to pass on.
    Gateway(GatewayError),
}

/// How a finished answer reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// In place of the routed provider's body (`size` bytes of it in Envoy's buffer): its
    /// status and headers change in place (the gateway's are set already).
    InPlace(usize),
    /// As a local reply with the gateway's headers: a routed answer whose body never came.
    Reply,
    /// As a local reply that keeps the provider's headers (framing and the gateway's own
    /// dropped): a recovered attempt's answer.
    Recovered,
}

const JSON: &str = "application/json";
const EVENT_STREAM: &str = "text/event-stream";

impl Exchange {
    /// Finishes `whole` and sends it as `delivery` says. Pause while the output checks wait
    /// for their calls (the answer then goes as a local reply once they decided).
    pub(super) fn finish_answer(&mut self, env: &mut Env, whole: Whole, delivery: Delivery) -> Action {
        let expects_json = self.expects_json();
        let Some(plan) = plan(&mut self.phase) else {
            return Action::Continue;
        };
        let provider = plan.provider.name;
        // 1. Translated (or reshaped), with its usage.
        let (finished, content_type, mut headers) = match whole {
            Whole::Provider { mut mode, head, body } => {
                // A success without a body (a provider that closed without one) is no answer.
                let success = (200..300).contains(&head.status) && reply::has_body(false, head.status);
                let read_whole = matches!(mode, ResponseMode::Passthrough | ResponseMode::Translated);
                if read_whole && body.is_empty() && success && expects_json {
                    mode = ResponseMode::Unreadable(Unreadable::Empty(head.status));
                }
                let finished = finish(plan, mode, head.status, &head.headers, body);
                self.record.usage = plan.translator.usage();
                worker::keep(env, &self.record.workspace, plan.translator.kept());
                // An answer that passes untouched tells its usage itself.
                if mode == ResponseMode::Passthrough && self.reports_usage && (200..300).contains(&head.status) {
                    self.record.usage = UsageScan::of(&finished.body);
                }
                let content_type = client_content_type(mode, finished.json, &head, delivery);
                let headers = match delivery {
                    Delivery::Recovered => provider_headers(&head.headers, finished.json),
                    _ => Vec::new(),
                };
                (finished, content_type, headers)
            }
            Whole::Gateway(error) => (gateway_error(&error, plan.api), Some(JSON.to_string()), Vec::new()),
        };
        // 2. The record (the status the client's response headers carry until now, too).
        let success = (200..300).contains(&finished.status);
        let routed_status = self.record.status;
        if delivery == Delivery::Recovered {
            // A recovered answer is a stream only when it succeeded.
            self.record.stream &= success;
            self.first_byte(env);
            self.record.provider = provider;
        }
        self.record.status = finished.status;
        self.record.error_code = finished.error_code;
        // 3. Stored in the cache as it was finished.
        let content_type = content_type.unwrap_or_default();
        if success {
            self.cache.start_capture(env.settings, &content_type);
            self.capture(env, &finished.body, true);
        }
        let mut answer = Answer { status: finished.status, content_type, body: finished.body };
        // 4. The output checks: a held answer, and any other 2xx, passes them.
        if self.guard.is_some() && (self.hold || success) {
            answer = match self.checked_answer(env, answer) {
                Some(answer) => answer,
                None => return Action::Pause,
            };
        }
        // 5. Sent, with the gateway's headers (set already on a response changed in place).
        self.record.status = answer.status;
        self.record.client_received(&answer.body);
        let Delivery::InPlace(size) = delivery else {
            headers.retain(|(name, _)| name != "content-type");
            if !answer.content_type.is_empty() {
                headers.push(("content-type".into(), answer.content_type));
            }
            headers.extend(self.gateway_headers());
            env.after.push(After::Reply { id: env.id, status: answer.status, headers, body: answer.body });
            return Action::Pause;
        };
        if answer.status != routed_status {
            env.io.set_response_header(env.id, ":status", Some(&answer.status.to_string()));
        }
        env.io.set_response_header(env.id, "content-type", Some(&answer.content_type));
        env.io.set_response_header(env.id, "content-length", Some(&answer.body.len().to_string()));
        env.io.set_response_body(env.id, size, &answer.body);
        Action::Continue
    }

    /// A 2xx answer passes the output checks: the answer to send now, or None while their
    /// calls are awaited (the answer is then sent as a local reply).
    pub(super) fn checked_answer(&mut self, env: &mut Env, answer: Answer) -> Option<Answer> {
        let guard = self.guard.as_mut()?;
        match guard.start_after(env, answer) {
            Progress::Waiting => None,
            Progress::Done => {
                let held = guard.held.take();
                held.map(|answer| guard.compose(env, answer))
            }
        }
    }

    /// Sends `answer` as a local reply.
    pub(super) fn reply(&mut self, env: &mut Env, answer: Answer) {
        self.record.status = answer.status;
        let mut headers = vec![("content-type".to_string(), answer.content_type)];
        headers.extend(self.gateway_headers());
        self.phase = Phase::Answered;
        self.record.client_received(&answer.body);
        env.after.push(After::Reply { id: env.id, status: answer.status, headers, body: answer.body });
    }
}

/// The content type the client gets with a finished answer (None: the provider sent none).
/// A held stream sent in place says the type its cache entry says; a recovered one keeps the
/// provider's parameters, as a stream that flows does.
fn client_content_type(mode: ResponseMode, json: bool, head: &Head, delivery: Delivery) -> Option<String> {
    match mode {
        _ if json => Some(JSON.to_string()),
        ResponseMode::Stream if matches!(delivery, Delivery::InPlace(_)) => Some(EVENT_STREAM.to_string()),
        ResponseMode::Stream => Some(
            stream::client_content_type(head.content_type()).map_or_else(|| head.content_type_text(), str::to_string),
        ),
        _ => head.content_type().map(|_| head.content_type_text()),
    }
}

/// The response plan of the answer being finished: the routed attempt's or the latest
/// recovered one's.
fn plan(phase: &mut Phase) -> Option<&mut ResponsePlan> {
    match phase {
        Phase::Forwarded(routed) => Some(&mut routed.plan),
        Phase::Recovering(recovery) => Some(&mut recovery.plan),
        _ => None,
    }
}
