//! An MCP request's way through the exchange (docs/mcp.md): a POST held until its JSON-RPC
//! message is in and read (method, tool, id), then routed to its server through Envoy's router
//! with the edits `crate::mcp` decided; its answer (JSON or a stream) passes as it comes,
//! watched for its outcome; only a server Envoy could not reach gets the gateway's answer, a
//! JSON-RPC error naming the server.

use super::guard::{Answer, Guard, Progress};
use super::head::Head;
use super::limits::Allowance;
use super::reply;
use super::{unroute, Action, After, Env, Exchange, McpHeld, Phase, RawHeaders, Sent};
use crate::guardrails::verdict;
use crate::mcp::{self, AnswerRewrite, AnswerWatch, Edit, Facts, Outcome, Target};
use crate::pipeline::{HeaderEdits, TRACE_HEADER};
use crate::routing::plan::Failure;
use serde_json::Value;

impl Exchange {
    /// Sends the request to its MCP server; a POST first waits for its message (`body`: the
    /// whole body, when the headers ended the request).
    pub(super) fn route_mcp(
        &mut self,
        env: &mut Env,
        target: Target,
        key_id: Option<String>,
        raw: RawHeaders,
        body: Option<(usize, Vec<u8>)>,
    ) -> Action {
        self.record.api_key_id = key_id;
        let server = match &target {
            Target::Server(routed) => routed.server.clone(),
            // The aggregate's own requests name no server.
            Target::Aggregate(_) => String::new(),
        };
        let facts = Facts { server, id: None, method: None, tool: None, outcome: Outcome::Ok };
        self.record.mcp = Some(Box::new(facts));
        if self.record.method != "POST" {
            return match target {
                Target::Server(routed) => self.send_mcp(env, routed, &raw, None),
                Target::Aggregate(aggregate) => self.aggregate_without_body(env, &aggregate),
            };
        }
        match body {
            Some((size, body)) => self.read_mcp_message(env, target, raw, size, &body),
            None => {
                unroute(env, &raw);
                self.phase = Phase::McpAwaitingBody(Box::new((target, raw)));
                Action::Pause
            }
        }
    }

    /// The held POST's body is complete (`size` bytes in Envoy's buffer).
    pub(super) fn mcp_body(&mut self, env: &mut Env, size: usize) -> Action {
        let Phase::McpAwaitingBody(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let (target, raw) = *held;
        let body = env.io.request_body(env.id, size);
        self.record.client_sent(&body);
        self.read_mcp_message(env, target, raw, size, &body)
    }

    /// Reads the POSTed JSON-RPC message for the record (a body that is none is the client's
    /// JSON-RPC error), then sends it on unchanged; a call of a tool the caller may not use is
    /// answered here, as the server answers a tool it does not have.
    fn read_mcp_message(&mut self, env: &mut Env, target: Target, raw: RawHeaders, size: usize, body: &[u8]) -> Action {
        let mut message = match mcp::read_message(body) {
            Ok(message) => message,
            Err(error) => return self.answer_error(env, &error),
        };
        let mut routed = match target {
            Target::Server(routed) => routed,
            Target::Aggregate(aggregate) => return self.aggregate_message(env, *aggregate, raw, message, (size, body)),
        };
        let policy = routed.tools.take();
        let method = message.method.as_deref();
        if let (Some(policy), Some("tools/call"), Some(tool)) = (&policy, method, &message.tool) {
            if !policy.permits(tool) {
                let body = mcp::unknown_tool(message.id.as_ref(), tool);
                self.note_mcp(message, Outcome::Error);
                return self.answer(env, 200, body);
            }
        }
        // Only a list's answer is rewritten; the other requests' answers pass as they come.
        let list = policy.filter(|_| method == Some("tools/list") && message.id.is_some());
        let sent = list.map(|list| Box::new(Sent { edit: Some(Edit::Tools(*list)), session: None, resend: None }));
        let call = message.tool.clone().filter(|_| method == Some("tools/call"));
        let params = message.params.take();
        self.note_mcp(message, Outcome::Ok);
        if call.is_some() {
            self.keep_tool_call(params, &raw);
        }
        let held = McpHeld::Server(Box::new((routed, raw, sent)));
        match call {
            Some(tool) => self.limit_tool_call(env, &tool, held),
            None => self.mcp_admitted(env, held),
        }
    }

    pub(super) fn note_mcp(&mut self, message: mcp::Message, outcome: Outcome) {
        if let Some(facts) = self.record.mcp.as_deref_mut() {
            facts.id = message.id;
            facts.method = message.method;
            facts.tool = message.tool;
            facts.outcome = outcome;
        }
    }

    /// A tool call (its `params`, and the server and tool `record.mcp` names) is kept for the
    /// config's checks, if it has some.
    pub(super) fn keep_tool_call(&mut self, params: Option<Value>, raw: &RawHeaders) {
        let (Some(guard), Some(facts)) = (self.guard.as_mut(), self.record.mcp.as_deref()) else {
            return;
        };
        let tool = mcp::prefixed(&facts.server, facts.tool.as_deref().unwrap_or_default());
        guard.keep_tool_call(params.unwrap_or(Value::Null), raw, tool);
    }

    /// A `tools/call` of `tool` (as its server names it) reserves what the MCP limits that apply
    /// to it count, then goes on (`held`), waits for an allowance, or is refused (429).
    pub(super) fn limit_tool_call(&mut self, env: &mut Env, tool: &str, held: McpHeld) -> Action {
        let server = self.record.mcp.as_deref().map(|facts| facts.server.clone()).unwrap_or_default();
        match self.reserve_tool_call(env, &server, tool) {
            Allowance::Admitted => self.mcp_admitted(env, held),
            Allowance::Waiting => {
                self.phase = Phase::McpAwaitingAllowance(Box::new(held));
                Action::Pause
            }
            Allowance::Refused(error) => self.answer_error(env, &error),
        }
    }

    /// A request every limit admitted goes on: a tool call once the config's input checks
    /// passed it.
    pub(super) fn mcp_admitted(&mut self, env: &mut Env, held: McpHeld) -> Action {
        let call = self.record.mcp.as_deref().is_some_and(|facts| facts.method.as_deref() == Some("tools/call"));
        if let Some(guard) = self.guard.as_mut().filter(|_| call) {
            if guard.start_tool_call(env) == Progress::Waiting {
                self.phase = Phase::McpAwaitingChecks(Box::new(held));
                return Action::Pause;
            }
        }
        self.mcp_checked(env, held)
    }

    /// The input checks decided: a denied call is answered with a JSON-RPC error carrying
    /// their verdicts (its server never hears of it), the others go on.
    pub(super) fn mcp_checked(&mut self, env: &mut Env, held: McpHeld) -> Action {
        if let Some(guard) = self.guard.as_deref().filter(|guard| guard.outcome() == verdict::Outcome::Deny) {
            let id = self.record.mcp.as_deref().and_then(|facts| facts.id.as_ref());
            let body = mcp::denied_answer(b"application/json", id, &guard.hook_results());
            self.note_outcome(Outcome::Error);
            return self.answer(env, 200, body);
        }
        match held {
            McpHeld::Server(held) => {
                let (routed, raw, sent) = *held;
                self.send_mcp(env, routed, &raw, sent)
            }
            McpHeld::Aggregate(backends) => self.speak(env, *backends),
        }
    }

    fn send_mcp(&mut self, env: &mut Env, routed: mcp::Routed, raw: &RawHeaders, sent: Option<Box<Sent>>) -> Action {
        let mut edits = HeaderEdits { remove: routed.remove, set: routed.set };
        // The server's logs can name the request as the gateway's do.
        edits.set.push((TRACE_HEADER.to_string(), self.record.trace_id.clone()));
        env.io.set_request_headers(env.id, &edits.apply(raw));
        self.phase = Phase::Mcp(sent);
        Action::Continue
    }

    /// The server's answer passes as it comes, with the gateway's headers; Envoy's own answer
    /// for a server it could not reach, or that outlived its `timeout_ms`, becomes the gateway's.
    /// The answer to a request (a message with an id) is watched for its outcome; a
    /// `tools/list` answer loses the tools the caller may not use (`list`), or, when it cannot
    /// be read, is not passed.
    pub(super) fn mcp_response(&mut self, env: &mut Env, sent: Option<Box<Sent>>) -> Action {
        let head = Head::read(env);
        let status = head.status;
        self.record.status = status;
        let Sent { edit, session, resend } = sent.map(|sent| *sent).unwrap_or_default();
        if let (404, Some((identity, id))) = (status, session) {
            mcp::forget_session(env.io.host().store(), &identity, id.as_deref());
            if let Some(resend) = resend {
                return self.resend(env, *resend);
            }
        }
        let checks_result = self.guard.as_deref().is_some_and(Guard::checks_results);
        let Some(facts) = self.record.mcp.as_deref_mut() else {
            return Action::Continue;
        };
        if status >= 400 {
            facts.outcome = Outcome::Error;
            let details = env.io.response_details(env.id);
            let server = facts.server.clone();
            match reply::routed_failure(status, &details) {
                Some(Failure::Timeout) => return self.answer_error(env, &mcp::timeout_error(&server)),
                Some(Failure::Unreachable | Failure::CircuitOpen) => {
                    return self.answer_error(env, &mcp::unreachable_error(&server, &details))
                }
                Some(Failure::Status(_)) | None => {}
            }
        }
        let readable = head.content_type().filter(|_| head.unencoded());
        let ok = (200..300).contains(&status);
        let answer = match (edit, facts.id.clone()) {
            (Some(edit @ Edit::Tools(_)), Some(id)) if ok => {
                let Some(rewrite) = readable.and_then(|content_type| AnswerRewrite::new(id, edit, content_type)) else {
                    let error = mcp::unreadable_answer_error(&facts.server, "tools/list");
                    return self.answer_error(env, &error);
                };
                // Its length changes.
                env.io.set_response_header(env.id, "content-length", None);
                Some(Box::new(McpAnswer::Rewrite(rewrite)))
            }
            (Some(edit @ Edit::Member { .. }), Some(id)) if ok => {
                match readable.and_then(|content_type| AnswerRewrite::new(id.clone(), edit, content_type)) {
                    Some(rewrite) => {
                        // Its length changes.
                        env.io.set_response_header(env.id, "content-length", None);
                        Some(Box::new(McpAnswer::Rewrite(rewrite)))
                    }
                    None => AnswerWatch::new(id, readable.unwrap_or_default()).map(|w| Box::new(McpAnswer::Watch(w))),
                }
            }
            (_, Some(id)) => {
                let watch = AnswerWatch::new(id, readable.unwrap_or_default());
                watch.map(|watch| Box::new(McpAnswer::Watch(watch)))
            }
            (_, None) => None,
        };
        if checks_result && ok && facts.method.as_deref() == Some("tools/call") {
            // Held whole: its result passes the config's output checks before the client sees it.
            let id = facts.id.clone().unwrap_or(Value::Null);
            let Some(checked) = readable.and_then(|content_type| Checked::new(id, content_type, answer)) else {
                let error = mcp::unreadable_answer_error(&facts.server, "tools/call");
                return self.answer_error(env, &error);
            };
            self.phase = Phase::McpAnswer(Some(Box::new(McpAnswer::Checked(checked))));
            self.set_gateway_headers(env);
            return Action::Pause;
        }
        self.phase = Phase::McpAnswer(answer);
        self.set_gateway_headers(env);
        Action::Continue
    }

    /// A chunk of the server's answer: watched as it passes, or rewritten (a list's).
    pub(super) fn mcp_answer_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        let Phase::McpAnswer(Some(answer)) = &mut self.phase else {
            return Action::Continue;
        };
        // A held list or checked call is read whole at its end (Envoy buffers it meanwhile).
        if matches!(answer.as_ref(), McpAnswer::Rewrite(rewrite) if rewrite.holds()) && !end_of_stream {
            return Action::Pause;
        }
        if matches!(answer.as_ref(), McpAnswer::Checked(_)) {
            return match end_of_stream {
                true => self.check_result(env, size),
                false => Action::Pause,
            };
        }
        let chunk = if size > 0 { env.io.response_body(env.id, size) } else { Vec::new() };
        let outcome = match answer.as_mut() {
            McpAnswer::Watch(watch) => {
                watch.push(&chunk);
                // A stream's outcome counts as soon as it is read: the client may leave first.
                if end_of_stream {
                    watch.finish()
                } else {
                    watch.outcome()
                }
            }
            McpAnswer::Rewrite(rewrite) => {
                let out = rewrite.push(&chunk, end_of_stream);
                env.io.set_response_body(env.id, size, &out);
                rewrite.outcome()
            }
            McpAnswer::Checked(_) => None,
        };
        if let (Some(outcome), Some(facts)) = (outcome, self.record.mcp.as_deref_mut()) {
            facts.outcome = outcome;
        }
        Action::Continue
    }

    /// A tool call's answer held whole (`size` bytes in Envoy's buffer) is in: its result
    /// passes the config's output checks, or waits for their calls (then it is sent as a local
    /// reply).
    fn check_result(&mut self, env: &mut Env, size: usize) -> Action {
        let Phase::McpAnswer(Some(answer)) = std::mem::replace(&mut self.phase, Phase::McpAnswer(None)) else {
            return Action::Continue;
        };
        let McpAnswer::Checked(mut checked) = *answer else {
            return Action::Continue;
        };
        let mut body = env.io.response_body(env.id, size);
        if let Some(rewrite) = &mut checked.rewrite {
            body = rewrite.push(&body, true);
        }
        checked.watch.push(&body);
        if let Some(outcome) = checked.watch.finish() {
            self.note_outcome(outcome);
        }
        // An error has no result to check.
        let result = mcp::answer_in(&checked.content_type, &body, &checked.id)
            .and_then(|mut m| m.get_mut("result").map(Value::take));
        let progress = match (result, self.guard.as_deref_mut()) {
            (Some(result), Some(guard)) => guard.start_result(env, &result),
            _ => Progress::Done,
        };
        checked.body = body;
        if progress == Progress::Waiting {
            self.phase = Phase::McpAnswer(Some(Box::new(McpAnswer::Checked(checked))));
            return Action::Pause;
        }
        let body = self.checked_body(*checked);
        env.io.set_response_header(env.id, "content-length", Some(&body.len().to_string()));
        env.io.set_response_body(env.id, size, &body);
        self.record.client_received(&body);
        Action::Continue
    }

    /// A held tool call's answer once its output checks decided: as the server gave it, or,
    /// denied, a JSON-RPC error carrying their verdicts.
    fn checked_body(&mut self, checked: Checked) -> Vec<u8> {
        let Checked { id, content_type, body, .. } = checked;
        match self.guard.as_deref().filter(|guard| guard.outcome() == verdict::Outcome::Deny) {
            Some(guard) => {
                let denied = mcp::denied_answer(&content_type, Some(&id), &guard.hook_results());
                self.note_outcome(Outcome::Error);
                denied
            }
            None => body,
        }
    }

    /// A check's call answered while an MCP request waited for its checks: the held call goes
    /// on (or is denied), or the held answer is sent. False when no MCP request waited.
    pub(super) fn mcp_checks_decided(&mut self, env: &mut Env) -> bool {
        match std::mem::replace(&mut self.phase, Phase::Headers) {
            Phase::McpAwaitingChecks(held) => {
                if self.mcp_checked(env, *held) == Action::Continue {
                    env.after.push(After::ResumeRequest(env.id));
                }
                true
            }
            Phase::McpAnswer(Some(answer)) if matches!(answer.as_ref(), McpAnswer::Checked(_)) => {
                let McpAnswer::Checked(checked) = *answer else {
                    return true;
                };
                let content_type = String::from_utf8_lossy(&checked.content_type).into_owned();
                let body = self.checked_body(*checked);
                self.reply(env, Answer { status: self.record.status, content_type, body });
                true
            }
            phase => {
                self.phase = phase;
                false
            }
        }
    }
}

/// How the gateway reads a server's answer to a request.
pub(super) enum McpAnswer {
    /// For its outcome, as it passes.
    Watch(AnswerWatch),
    /// Rewritten as it passes (see `mcp::Edit`).
    Rewrite(AnswerRewrite),
    /// Held whole for the config's output checks (a tool call's).
    Checked(Box<Checked>),
}

/// A tool call's answer held for the output checks: watched for its outcome, with the rewrite
/// its server's requests get through the aggregate, and its bytes while the checks wait.
pub(super) struct Checked {
    id: Value,
    content_type: Vec<u8>,
    watch: AnswerWatch,
    rewrite: Option<AnswerRewrite>,
    body: Vec<u8>,
}

impl Checked {
    /// The answer to request `id` of `content_type`, which would have been read as `answer`;
    /// none when it carries no JSON-RPC message.
    fn new(id: Value, content_type: &[u8], answer: Option<Box<McpAnswer>>) -> Option<Box<Checked>> {
        let watch = AnswerWatch::new(id.clone(), content_type)?;
        let rewrite = match answer.map(|answer| *answer) {
            Some(McpAnswer::Rewrite(rewrite)) => Some(rewrite),
            _ => None,
        };
        Some(Box::new(Checked { id, content_type: content_type.to_vec(), watch, rewrite, body: Vec::new() }))
    }
}
