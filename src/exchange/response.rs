//! The routed response: its head read once from the host (status, content type, length,
//! encoding), what a failure means (recovery, or Envoy's reply in the gateway's shape), how it
//! is handled (its [`ResponseMode`]), and its body as it flows: passed, scanned for usage,
//! captured for the cache, watched by the output checks, or translated chunk by chunk. An
//! answer that is held whole is finished in `finish.rs`.

use super::finish::{Delivery, Whole};
use super::head::Head;
use super::recovery::count_circuits;
use super::reply::{self, response_mode, ResponseMode, Unreadable};
use super::usage::UsageScan;
use super::worker;
use super::{Action, Env, Exchange, Phase};
use crate::guardrails::{self, verdict};
use crate::pipeline::Call;
use crate::routing::attempts::Next;
use crate::routing::plan::Failure;
use crate::stream;

/// Whether a response of `status` carries a 2xx body (`head`: the request was a HEAD).
fn has_success_body(head: bool, status: u16) -> bool {
    reply::has_body(head, status) && (200..300).contains(&status)
}

/// What Envoy's `cluster_not_found` / `route_not_found` mean for the request's target: the
/// host Envoy (a mesh's, in `upstream` mode) has no way to its host.
fn missing_route(env: &Env, call: Option<&Call>, details: &str) -> Option<String> {
    if !matches!(details, "cluster_not_found" | "route_not_found") {
        return None;
    }
    let target = call?.target(call?.attempts.current)?;
    let cluster = env.settings.routed_cluster(&target.upstream);
    Some(reply::no_route_detail(&cluster, &target.upstream.host, details))
}

fn routed_call(phase: &Phase) -> Option<&Call> {
    match phase {
        Phase::Forwarded(routed) => Some(&routed.call),
        _ => None,
    }
}

/// The filter state (`wasm.gateway_client_api`) that tells Envoy's local reply mapper which
/// API the client of a held answer speaks.
const CLIENT_API_STATE: &str = "gateway_client_api";

impl Exchange {
    pub(super) fn response_headers(&mut self, env: &mut Env, end_of_stream: bool) -> Action {
        let mut routed = match std::mem::replace(&mut self.phase, Phase::Answered) {
            // The gateway's own answers already carry its headers (and their status is recorded).
            Phase::Answered => return Action::Continue,
            Phase::Recovering(recovery) => {
                let answered = recovery.answered;
                self.phase = Phase::Recovering(recovery);
                return if answered { Action::Continue } else { Action::Pause };
            }
            Phase::Forwarded(routed) => routed,
            Phase::Mcp(list) => return self.mcp_response(env, list),
            // Envoy answered before the request went upstream (e.g. 413 for a huge body).
            phase => return self.answered_by_envoy(env, phase),
        };
        routed.head = Head::read(env);
        let status = routed.head.status;
        self.record.status = status;
        // A status outside HTTP's range is a broken provider, as a 502 would say.
        let judged = if reply::valid_status(status) { status } else { 502 };
        // Only errors are failures; a redirect or not-modified passes as it is.
        if judged < 400 {
            routed.call.attempts.succeeded(status, env.io.host());
            count_circuits(env, &mut routed.call);
            // No later attempt: the request copies can go.
            routed.retained = None;
            routed.call.release_body();
            self.phase = Phase::Forwarded(routed);
            return self.respond(env, end_of_stream);
        }
        let details = env.io.response_details(env.id);
        let Some(failure) = reply::routed_failure(judged, &details) else {
            // Envoy's own answer passes (shaped by the config's local reply mapper).
            self.record.error_code = reply::envoys_own_answer(&details).map(|(_, code)| code);
            self.phase = Phase::Forwarded(routed);
            self.set_gateway_headers(env);
            return Action::Continue;
        };
        if routed.retained.is_some() {
            let next = routed.call.attempts.failed(failure, &routed.head.headers, env.io.host());
            count_circuits(env, &mut routed.call);
            if matches!(next, Next::Call { .. }) {
                return self.recover(env, *routed, failure, next);
            }
        } else {
            routed.call.attempts.failed_finally(failure, env.io.host());
            count_circuits(env, &mut routed.call);
        }
        self.phase = Phase::Forwarded(routed);
        // Envoy's own reply (timeout, no connection) gets the gateway's error shape.
        match failure {
            Failure::Timeout => self.answer_error(env, &reply::timeout_error()),
            Failure::Unreachable | Failure::CircuitOpen => {
                let detail = missing_route(env, routed_call(&self.phase), &details).unwrap_or(details);
                self.answer_error(env, &reply::unreachable_error(&detail))
            }
            Failure::Status(_) => self.respond(env, end_of_stream),
        }
    }

    /// Envoy answered a request still in `phase`, before it went upstream. A request still
    /// waiting for a token, a check or a control-plane read is over: what arrives later finds
    /// nothing to send.
    fn answered_by_envoy(&mut self, env: &mut Env, phase: Phase) -> Action {
        if matches!(phase, Phase::Headers | Phase::AwaitingBody(..) | Phase::McpAwaitingBody(..)) {
            self.phase = phase;
        }
        self.record.status = Head::read(env).status;
        self.set_gateway_headers(env);
        Action::Continue
    }

    /// The provider's answer (a success, or an error it sent): how it reaches the client.
    fn respond(&mut self, env: &mut Env, end_of_stream: bool) -> Action {
        let Phase::Forwarded(routed) = &self.phase else {
            return Action::Continue;
        };
        let head = &routed.head;
        let status = head.status;
        let head_request = self.record.method == "HEAD";
        let (expects_json, is_stream) = (self.expects_json(), head.is_stream());
        let unannounced_length = head.content_length().is_none();
        let success = has_success_body(head_request, status);
        self.mode = response_mode(&routed.plan, head_request, status, expects_json, is_stream);
        let passthrough_json = expects_json && success && self.mode == ResponseMode::Passthrough;
        if passthrough_json && end_of_stream {
            self.mode = ResponseMode::Unreadable(Unreadable::Empty(status));
        }
        if let ResponseMode::Unreadable(why) = self.mode {
            return self.answer_error(env, &reply::unreadable_error(routed.plan.provider.name, why));
        }
        if success {
            self.guard_answer(env, end_of_stream);
        }
        self.set_gateway_headers(env);
        let flows = !self.hold && matches!(self.mode, ResponseMode::Passthrough | ResponseMode::Stream);
        if flows && success && self.cache.is_active() {
            // The content type of what the client gets (a whole answer starts its own capture).
            let content_type = match (&self.mode, &self.phase) {
                (ResponseMode::Stream, _) => "text/event-stream".to_string(),
                (_, Phase::Forwarded(routed)) => routed.head.content_type_text(),
                _ => String::new(),
            };
            self.cache.start_capture(env.settings, &content_type);
        }
        if flows && success && self.mode == ResponseMode::Passthrough && self.reports_usage {
            self.usage = Some(UsageScan::default());
        }
        match self.mode {
            // Held whole for the output checks.
            _ if self.hold => self.hold_answer(env),
            ResponseMode::Passthrough if passthrough_json && unannounced_length => {
                self.awaiting_first_byte = true;
                self.hold_answer(env)
            }
            ResponseMode::Passthrough => Action::Continue,
            ResponseMode::Stream => {
                // Translated chunks change the length; Envoy frames the stream.
                env.io.set_response_header(env.id, "content-length", None);
                let Phase::Forwarded(routed) = &self.phase else {
                    return Action::Continue;
                };
                if let Some(content_type) = stream::client_content_type(routed.head.content_type()) {
                    env.io.set_response_header(env.id, "content-type", Some(content_type));
                }
                Action::Continue
            }
            // No body will follow: answer with the finished one now.
            ResponseMode::Error(_) | ResponseMode::Translated if end_of_stream => {
                self.finish_routed(env, Vec::new(), Delivery::Reply);
                self.phase = Phase::Answered;
                Action::Pause
            }
            // Held until the whole body is in, so status and length can still change (an
            // unreadable answer was answered above).
            ResponseMode::Error(_) | ResponseMode::Translated | ResponseMode::Unreadable(_) => self.hold_answer(env),
        }
    }

    /// A 2xx answer and the checks: held whole for the output checks, or flowing with the
    /// verdicts known before it (`hook_results` spliced in, a flag in its status).
    fn guard_answer(&mut self, env: &mut Env, end_of_stream: bool) {
        let (Some(guard), Phase::Forwarded(routed)) = (&mut self.guard, &self.phase) else {
            return;
        };
        let head = &routed.head;
        let passthrough = self.mode == ResponseMode::Passthrough;
        let stream = self.mode == ResponseMode::Stream || head.is_stream();
        // Only JSON answers are held whole (not audio or images).
        let json = self.mode == ResponseMode::Translated
            || head.content_type().is_some_and(|v| v.windows(4).any(|w| w == b"json"));
        self.hold = if stream { guard.holds_streams() } else { json && guard.shapes_answer() };
        // A flowing answer of a flagged request: its status says so.
        let mut flag = |record: &mut super::Record| {
            record.status = verdict::FLAG_STATUS;
            env.io.set_response_header(env.id, ":status", Some(&verdict::FLAG_STATUS.to_string()));
        };
        let flagged = guard.outcome() == verdict::Outcome::Flag;
        // Verdicts known before the answer: an answer that passes untouched flows, with
        // `hook_results` spliced in on its way (it grows by a known length).
        let untouched = passthrough && head.unencoded();
        // (A body must follow: its chunks carry what the new length announces.)
        if self.hold && !stream && !end_of_stream && untouched && guard.decided_before_answer() {
            self.hold = false;
            let added = guard.splice_answer();
            let length = head.content_length().map(|length| length.saturating_add(added).to_string());
            if flagged {
                flag(&mut self.record);
            }
            env.io.set_response_header(env.id, "content-length", length.as_deref());
        } else if stream && !self.hold {
            // The stream flows: a flagged request shows in its status only.
            guard.watch_stream();
            if flagged {
                flag(&mut self.record);
            }
        }
    }

    /// Holds the provider's answer in Envoy until its body is in. Should the provider break
    /// off meanwhile, Envoy answers itself, past the filter: its reply (in the gateway's error
    /// shape, by the config's local reply mapper) gets the gateway's headers from here.
    pub(super) fn hold_answer(&mut self, env: &mut Env) -> Action {
        self.awaiting_end = true;
        // Only the headers the mapper reads: each is a host call on every held answer.
        self.each_own_header(&mut |name, value| env.io.publish_header(env.id, name, value));
        // The mapper answers in the client's API's error shape (the path is the provider's by now).
        env.io.publish_header(env.id, CLIENT_API_STATE, self.record.client_api.name());
        Action::Pause
    }

    pub(super) fn response_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        self.awaiting_end &= !end_of_stream;
        let routed = match &mut self.phase {
            Phase::Recovering(recovery) if recovery.answered => return Action::Continue,
            // The failed attempt's body: emptied chunk by chunk, so it never fills the buffer.
            Phase::Recovering(_) => {
                env.io.set_response_body(env.id, size, &[]);
                return Action::Pause;
            }
            Phase::Forwarded(routed) => routed,
            Phase::McpAnswer(_) => return self.mcp_answer_body(env, size, end_of_stream),
            // An MCP server's 404 to a request sent again (see `mcp_aggregate::Resend`): emptied
            // chunk by chunk, as a failed attempt's.
            Phase::McpBackends(_) | Phase::McpResent(_) => {
                env.io.set_response_body(env.id, size, &[]);
                return Action::Pause;
            }
            _ => return Action::Continue,
        };
        if self.awaiting_first_byte {
            if size == 0 && !end_of_stream {
                return Action::Pause;
            }
            self.awaiting_first_byte = false;
            if size == 0 {
                // Nothing came: answered in place of the empty body (`finish_answer` says why).
                return self.finish_routed(env, Vec::new(), Delivery::InPlace(0));
            }
            // The headers go on with this first byte: a break from now on cuts the client's answer.
            self.awaiting_end = false;
        }
        if size > 0 && self.record.stream && self.record.first_byte_ms.is_none() {
            self.record.first_byte_ms = Some(env.io.host().now_ms());
        }
        if let Some(limited) = &mut self.limits {
            limited.answered_bytes = limited.answered_bytes.saturating_add(size as u64);
        }
        let whole = self.hold
            || matches!(self.mode, ResponseMode::Error(_) | ResponseMode::Translated | ResponseMode::Unreadable(_));
        if whole {
            // Held until the whole body is in, then finished.
            if !end_of_stream {
                return Action::Pause;
            }
            let body = env.io.response_body(env.id, size);
            return self.finish_routed(env, body, Delivery::InPlace(size));
        }
        let watching = self.guard.as_ref().is_some_and(|g| g.follows_answer());
        match self.mode {
            ResponseMode::Stream => {
                let body = env.io.response_body(env.id, size);
                let mut out = Vec::with_capacity(body.len() + 256);
                routed.plan.translator.stream(&body, &mut out);
                if end_of_stream {
                    self.stream_ended = true;
                    routed.plan.translator.stream_end(&mut out);
                    self.record.usage = routed.plan.translator.usage();
                    worker::keep(env, &self.record.workspace, routed.plan.translator.kept());
                }
                self.capture(env, &out, end_of_stream);
                if let Some(edit) = self.watched(env, &out, end_of_stream) {
                    out.splice(..edit.replaced.min(out.len()), edit.with);
                }
                env.io.set_response_body(env.id, size, &out);
                self.record.client_received(&out);
            }
            _ if self.cache.capturing() || watching || self.usage.is_some() => {
                let body = env.io.response_body(env.id, size);
                if let Some(scan) = &mut self.usage {
                    scan.push(&body);
                    if end_of_stream {
                        self.record.usage = scan.usage();
                    }
                }
                self.record.client_received(&body);
                self.capture(env, &body, end_of_stream);
                if let Some(edit) = self.watched(env, &body, end_of_stream) {
                    env.io.set_response_body(env.id, edit.replaced, &edit.with);
                }
            }
            _ => {
                // Only what the record keeps is read.
                if let Some(bodies) = &mut self.record.bodies {
                    let room = bodies.response.room().min(size);
                    let kept = if room > 0 { env.io.response_body(env.id, room) } else { Vec::new() };
                    bodies.response.push_prefix(&kept, size);
                }
            }
        }
        Action::Continue
    }

    /// The whole body of a routed answer, finished for the client (an error reshaped with the
    /// provider's headers in view).
    fn finish_routed(&mut self, env: &mut Env, body: Vec<u8>, delivery: Delivery) -> Action {
        let Phase::Forwarded(routed) = &mut self.phase else {
            return Action::Continue;
        };
        let head = std::mem::take(&mut routed.head);
        self.finish_answer(env, Whole::Provider { mode: self.mode, head, body }, delivery)
    }

    /// The bytes of an answer that flows, for the guard: what to change in them, if anything.
    fn watched(&mut self, env: &mut Env, bytes: &[u8], end: bool) -> Option<guardrails::inject::Edit> {
        self.guard.as_mut()?.watched(env, bytes, end)
    }

    pub(super) fn capture(&mut self, env: &mut Env, bytes: &[u8], end: bool) {
        if let Some(stored) = self.cache.capture(bytes, end, env.settings, self.record.provider, env.io.host()) {
            self.record.cache_stored = Some(stored);
        }
    }
}
