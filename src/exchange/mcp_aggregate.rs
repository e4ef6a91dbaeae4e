//! A request to the aggregate endpoint `/mcp` on its way through the exchange (docs/mcp.md):
//! answered by the gateway (`initialize`, `ping`, notifications), gathered from every server
//! with dispatched calls (`tools/list`, `prompts/list`), or routed to one server through
//! Envoy's router (`tools/call`, `prompts/get`) once the gateway holds a session there, its
//! answer passing as `/mcp/{server}`'s does. `crate::mcp::aggregate` decides; this applies.

use super::worker::Task;
use super::{Action, After, Dispatch, Env, Exchange, McpHeld, Phase, RawHeaders, Sent};
use crate::mcp::{self, Aggregate, AnswerRewrite, AnswerWatch, Backend, Bridge, Edit, List, Outcome, Plan};
use crate::pipeline::HeaderEdits;
use crate::request::headers;
use serde_json::Value;

/// How long a call the gateway makes to a server may take when the server sets no
/// `timeout_ms`.
const BACKEND_TIMEOUT_MS: u64 = 10_000;
/// How long a request sent again (a tool call, perhaps a long one) may take when the server
/// sets no `timeout_ms`: it is a dispatched call, which needs a bound (a routed one has the
/// stream idle timeout instead).
const RESENT_TIMEOUT_MS: u64 = 300_000;

/// What the held request waits for: its servers' answers.
#[derive(Debug)]
pub(super) struct Backends {
    purpose: Purpose,
    spoken: Spoken,
}

/// The servers the gateway speaks to for one request.
#[derive(Debug)]
struct Spoken {
    aggregate: Aggregate,
    /// The client's request id.
    id: Value,
    /// One per member (gathering) or the one routed to (by the member's index); with the token
    /// of its call in flight.
    backends: Vec<(usize, Backend, Option<u32>)>,
}

/// A request routed to a member in a session the gateway kept: what sends it again, in a new
/// session, when the server answers 404 (it no longer knows the kept one).
#[derive(Debug)]
pub(super) struct Resend {
    spoken: Spoken,
    /// The request as the server gets it.
    body: Vec<u8>,
}

/// A request sent again: to which server, and what its answer's edit is.
#[derive(Debug)]
pub(super) struct Resent {
    server: String,
    id: Value,
    edit: Option<Edit>,
}

#[derive(Debug)]
enum Purpose {
    /// `initialize`: the servers' sessions are opened, then sealed in the client's new session
    /// id, which is answered with this result.
    Open(Value),
    Gather(List),
    /// The request goes again once a new session is open, as a dispatched call: its server's
    /// first answer (404) is being drained, the call's answer is sent as a local reply.
    Resend(Vec<u8>),
    /// The request goes to the member once its session is open: its raw headers, its body
    /// (Envoy's buffer holds `size` bytes) as the server gets it, and a call's name unprefixed.
    Route {
        raw: RawHeaders,
        size: usize,
        body: Vec<u8>,
        name: Option<String>,
    },
}

impl Exchange {
    /// A GET (the aggregate has no stream of its own) or a DELETE (the client's session ends:
    /// so do the servers' sessions of it, each ended with a DELETE of its own and forgotten; the
    /// client's 204 waits for their answers).
    pub(super) fn aggregate_without_body(&mut self, env: &mut Env, aggregate: &Aggregate) -> Action {
        if self.record.method != "DELETE" {
            return self.answer_error(env, &mcp::no_aggregate_stream());
        }
        let sent = self.send_to_sessions(env, aggregate, ("DELETE", Vec::new()));
        if aggregate.client_session.is_some() {
            for member in &aggregate.members {
                mcp::keep_session(env.io.host().store(), &aggregate.session_identity(&member.id), None);
            }
        }
        self.answer_when_answered(env, sent, 204)
    }

    /// The message POSTed to the aggregate, read (`body`: its bytes, `size` of them in Envoy's
    /// buffer).
    pub(super) fn aggregate_message(
        &mut self,
        env: &mut Env,
        aggregate: Aggregate,
        raw: RawHeaders,
        mut message: mcp::Message,
        (size, body): (usize, &[u8]),
    ) -> Action {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let id = message.id.clone();
        let plan = mcp::aggregate::plan(&value, id.as_ref(), &aggregate.policies());
        let message_is_call = message.method.as_deref() == Some("tools/call");
        let params = message.params.take();
        self.note_mcp(message, Outcome::Ok);
        let id = id.unwrap_or(Value::Null);
        match plan {
            Plan::Result { result, new_session: true } => {
                // The client's session id holds the servers' sessions: they are opened first.
                let backends = aggregate.members.iter().enumerate();
                let backends =
                    backends.map(|(index, member)| (index, Backend::new(&member.id, false, None, None), None));
                let backends = backends.collect();
                let spoken = Spoken { aggregate, id, backends };
                self.speak(env, Backends { purpose: Purpose::Open(result), spoken })
            }
            Plan::Result { result, new_session: false } => {
                let result = mcp::for_era(result, aggregate.stateless);
                self.answer(env, 200, mcp::aggregate::result(&id, result))
            }
            Plan::Accepted => self.answer(env, 202, Vec::new()),
            Plan::Broadcast(body) => {
                let sent = self.send_to_sessions(env, &aggregate, ("POST", body));
                self.answer_when_answered(env, sent, 202)
            }
            Plan::Error(body) => {
                self.note_outcome(Outcome::Error);
                self.answer(env, 200, body)
            }
            Plan::Gather(list) => {
                let host = env.io.host();
                let (store, now_ms) = (host.store(), host.now_ms());
                let backends = aggregate.members.iter().enumerate().map(|(index, member)| {
                    let listed = mcp::aggregate::kept_list(store, &aggregate.list_identity(member, list), now_ms);
                    if let Some(items) = listed {
                        return (index, Backend::listed(&member.id, items), None);
                    }
                    let kept = aggregate.kept_session(store, &member.id);
                    (index, Backend::new(&member.id, aggregate.stateless, kept, Some(list)), None)
                });
                let backends = backends.collect();
                self.speak(env, Backends { purpose: Purpose::Gather(list), spoken: Spoken { aggregate, id, backends } })
            }
            Plan::Route { member, name, body } => {
                let Some(server) = aggregate.members.get(member).map(|m| m.id.clone()) else {
                    return self.answer(env, 200, mcp::aggregate::error(&id, -32603, "no such server"));
                };
                if let Some(facts) = self.record.mcp.as_deref_mut() {
                    facts.server = server.clone();
                    facts.tool = name.clone().filter(|_| facts.method.as_deref() == Some("tools/call"));
                }
                let host = env.io.host();
                let kept = aggregate.kept_session(host.store(), &server);
                let mut backend = Backend::new(&server, aggregate.stateless, kept, None);
                let call = name.clone().filter(|_| message_is_call);
                if let Some(tool) = &call {
                    // A stateless server's tools kept for the caller may hold the call's schema.
                    let listed = aggregate.members.get(member).filter(|_| backend.is_stateless()).and_then(|m| {
                        mcp::aggregate::kept_list(host.store(), &aggregate.list_identity(m, List::Tools), host.now_ms())
                    });
                    backend = backend.for_call(tool, listed);
                }
                let backends = vec![(member, backend, None)];
                if call.is_some() {
                    self.keep_tool_call(params, &raw);
                }
                let purpose = Purpose::Route { raw, size, body, name };
                let held = Backends { purpose, spoken: Spoken { aggregate, id, backends } };
                match call {
                    Some(tool) => self.limit_tool_call(env, &tool, McpHeld::Aggregate(Box::new(held))),
                    None => self.speak(env, held),
                }
            }
        }
    }

    pub(super) fn note_outcome(&mut self, outcome: Outcome) {
        if let Some(facts) = self.record.mcp.as_deref_mut() {
            facts.outcome = outcome;
        }
    }

    /// Makes each backend's next call; once every backend is done, answers (a list) or sends
    /// the request on (a routed one).
    pub(super) fn speak(&mut self, env: &mut Env, mut held: Backends) -> Action {
        let spoken = &mut held.spoken;
        for (index, backend, token) in spoken.backends.iter_mut() {
            if token.is_some() || backend.is_done() {
                continue;
            }
            let Some(call) = backend.next_call() else {
                continue;
            };
            let member = spoken.aggregate.members.get(*index);
            let started = member.and_then(|member| {
                self.call_member(env, &member.server, "POST", (call.body, call.headers), BACKEND_TIMEOUT_MS)
            });
            match started {
                Some(call) => *token = Some(call),
                // A call that cannot start fails its backend, as one without an answer.
                None => backend.answered(0, None, b"", b""),
            }
        }
        if spoken.backends.iter().any(|(_, backend, token)| token.is_some() || !backend.is_done()) {
            self.phase = Phase::McpBackends(Box::new(held));
            return Action::Pause;
        }
        // The sessions opened for a new client session are sealed in its id instead.
        if !matches!(held.purpose, Purpose::Open(_)) {
            let store = env.io.host().store();
            for (_, backend, _) in &spoken.backends {
                if let Some(session) = backend.opened_session() {
                    mcp::keep_session(store, &spoken.aggregate.session_identity(&backend.server), Some(session));
                }
            }
        }
        match held.purpose {
            Purpose::Open(result) => self.opened(env, &held.spoken, result),
            Purpose::Gather(list) => self.gathered(env, list, &held.spoken),
            Purpose::Route { raw, size, body, name } => {
                self.route_to_member(env, held.spoken, raw, (size, body), name.as_deref())
            }
            Purpose::Resend(body) => self.send_again(env, &held.spoken, body),
        }
    }

    /// The servers' sessions for a new client session are open (those that could be): the
    /// client's session id seals them, and `initialize` is answered with it. Sessions past what
    /// an id holds are kept in shared data instead.
    fn opened(&mut self, env: &mut Env, held: &Spoken, result: Value) -> Action {
        let opened = held.backends.iter().filter_map(|(_, backend, _)| {
            if let Some(why) = backend.failure() {
                log::warn!("MCP server '{}' has no session yet: {why}", backend.server);
            }
            Some((backend.server.clone(), backend.opened_session()?.clone()))
        });
        let (sealed, over) = mcp::sealed::fitting(opened.collect());
        let host = env.io.host();
        let key = mcp::sealed::SessionKey::or_own(env.settings.mcp_session_key.as_ref(), host);
        let nonce = mcp::sealed::nonce(host);
        let client_session = mcp::sealed::seal(&key, nonce, &held.aggregate.caller, &sealed);
        for (server, session) in &over {
            let identity = mcp::aggregate::session_identity(&held.aggregate.caller, Some(&client_session), server);
            mcp::keep_session(host.store(), &identity, Some(session));
        }
        let extra = vec![("mcp-session-id".to_string(), client_session)];
        self.answer_with(env, 200, mcp::aggregate::result(&held.id, result), extra)
    }

    /// The server answered 404 to a request in the session the gateway kept for it (it ended, or
    /// the server restarted): a new session is opened and the request sent again, unnoticed by
    /// the client (its answer is then sent whole).
    pub(super) fn resend(&mut self, env: &mut Env, resend: Resend) -> Action {
        let Resend { mut spoken, body } = resend;
        for (_, backend, token) in spoken.backends.iter_mut() {
            *backend = Backend::new(&backend.server, spoken.aggregate.stateless, None, None);
            *token = None;
        }
        self.speak(env, Backends { purpose: Purpose::Resend(body), spoken })
    }

    /// The new session is open (or could not be): the request goes as a dispatched call.
    fn send_again(&mut self, env: &mut Env, held: &Spoken, body: Vec<u8>) -> Action {
        let member = match self.member_of(env, held) {
            Ok(member) => member,
            Err(action) => return action,
        };
        let Some((_, backend, _)) = held.backends.first() else {
            return Action::Continue;
        };
        let message = (body, backend.session_headers());
        if self.call_member(env, &member.server, "POST", message, RESENT_TIMEOUT_MS).is_none() {
            let error = mcp::unreachable_error(&backend.server, "the call could not start");
            return self.answer_error(env, &error);
        }
        let edit = answer_edit(&held.aggregate, backend);
        let resent = Resent { server: backend.server.clone(), id: held.id.clone(), edit };
        self.phase = Phase::McpResent(Box::new(resent));
        Action::Pause
    }

    /// The request sent again was answered (status 0: it failed): the client's answer, with
    /// the server's requests on it named for the aggregate.
    fn resent_answered(&mut self, env: &mut Env, resent: Resent, answer: super::CallAnswer) {
        if answer.status == 0 {
            let error = mcp::unreachable_error(&resent.server, "the request sent again in a new session failed");
            self.answer_error(env, &error);
            return;
        }
        let content_type = headers::find(&answer.headers, "content-type").unwrap_or_default();
        let mut body = answer.body.clone();
        if let Some(mut rewrite) =
            resent.edit.and_then(|edit| AnswerRewrite::new(resent.id.clone(), edit, content_type))
        {
            body = rewrite.push(&body, true);
        }
        if let Some(mut watch) = AnswerWatch::new(resent.id, content_type) {
            watch.push(&body);
            if let Some(outcome) = watch.finish() {
                self.note_outcome(outcome);
            }
        }
        let content_type = String::from_utf8_lossy(content_type).into_owned();
        self.reply(env, super::guard::Answer { status: answer.status, content_type, body });
    }

    /// Starts the gateway's `method` call of `server` with a message (`body`, none for a DELETE)
    /// and `headers` (the session's), besides the server's own headers and the trace id; bounded
    /// by the server's `timeout_ms`, else `default_timeout_ms`. Its answer comes to
    /// `backend_answered`; its token, or None when it could not start.
    fn call_member(
        &self,
        env: &mut Env,
        server: &mcp::Server,
        method: &str,
        (body, mut headers): (Vec<u8>, Vec<(String, String)>),
        default_timeout_ms: u64,
    ) -> Option<u32> {
        if !body.is_empty() {
            headers.push(("content-type".to_string(), "application/json".to_string()));
        }
        headers.extend(server.headers.iter().cloned());
        headers.push((crate::pipeline::TRACE_HEADER.to_string(), self.record.trace_id.clone()));
        let timeout_ms = server.timeout_ms.unwrap_or(default_timeout_ms);
        let path = server.upstream.path_or_root();
        let dispatch = Dispatch::request(env.settings, &server.upstream, method, path, body, headers, timeout_ms);
        let call = env.io.dispatch(env.id, &dispatch)?;
        env.tasks.calls.insert(call, (env.id, Task::McpBackend));
        Some(call)
    }

    /// A client's notification (a POST of its body) or the end of its session (a DELETE) goes to
    /// every server the gateway holds a session with for the client's session: how many calls
    /// went (the client is answered once they are answered: a call would end with the client's
    /// request). A stateless-era client has no session there: its requests end with their own
    /// exchanges.
    fn send_to_sessions(&mut self, env: &mut Env, aggregate: &Aggregate, (method, body): (&str, Vec<u8>)) -> usize {
        if aggregate.stateless || aggregate.client_session.is_none() {
            return 0;
        }
        let mut sent = 0;
        for member in &aggregate.members {
            let kept = aggregate.kept_session(env.io.host().store(), &member.id);
            // A server of the stateless era has no session the notification could go in.
            let Some(session) = kept.filter(|session| session.id.is_some()) else {
                continue;
            };
            let headers = Backend::new(&member.id, false, Some(session), None).session_headers();
            match self.call_member(env, &member.server, method, (body.clone(), headers), BACKEND_TIMEOUT_MS) {
                Some(_) => sent += 1,
                None => log::warn!("a {method} to MCP server '{}' could not start", member.id),
            }
        }
        sent
    }

    /// Answers `status` once the `sent` calls to the servers are answered (at once when none went).
    fn answer_when_answered(&mut self, env: &mut Env, sent: usize, status: u16) -> Action {
        if sent == 0 {
            return self.answer(env, status, Vec::new());
        }
        self.phase = Phase::McpNotifying { waiting: sent, status };
        Action::Pause
    }

    /// A server answered one of the gateway's calls.
    pub(super) fn backend_answered(&mut self, env: &mut Env, token: u32, answer: super::CallAnswer) {
        if matches!(self.phase, Phase::McpResent(_)) {
            if let Phase::McpResent(resent) = std::mem::replace(&mut self.phase, Phase::Headers) {
                self.resent_answered(env, *resent, answer);
            }
            return;
        }
        if let Phase::McpNotifying { waiting, status } = &mut self.phase {
            *waiting = waiting.saturating_sub(1);
            let status = *status;
            if *waiting == 0 && self.answer(env, status, Vec::new()) == Action::Continue {
                env.after.push(After::ResumeRequest(env.id));
            }
            return;
        }
        if !matches!(self.phase, Phase::McpBackends(_)) {
            return;
        }
        let Phase::McpBackends(mut held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return;
        };
        if let Some((_, backend, waiting)) =
            held.spoken.backends.iter_mut().find(|(_, _, waiting)| *waiting == Some(token))
        {
            *waiting = None;
            let session = headers::find(&answer.headers, "mcp-session-id").and_then(|v| std::str::from_utf8(v).ok());
            let content_type = headers::find(&answer.headers, "content-type").unwrap_or_default();
            backend.answered(answer.status, session, content_type, &answer.body);
        }
        if self.speak(env, *held) == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
    }

    /// Every server of a list answered (or failed): the merged list, or the error of a server
    /// whose failure fails it.
    fn gathered(&mut self, env: &mut Env, list: List, held: &Spoken) -> Action {
        let mut parts = Vec::with_capacity(held.backends.len());
        let now_ms = env.io.host().now_ms();
        for (index, backend, _) in &held.backends {
            let Some(member) = held.aggregate.members.get(*index) else {
                continue;
            };
            if let Some(ttl_ms) = backend.list_ttl_ms() {
                let identity = held.aggregate.list_identity(member, list);
                mcp::aggregate::keep_list(env.io.host().store(), &identity, &backend.items, (ttl_ms, now_ms));
            }
            if let Some(why) = backend.failure() {
                log::warn!("MCP server '{}' left out of {}: {why}", member.id, list.method());
                let name = super::metrics::mcp_request(&member.id, list.method(), Outcome::Error);
                env.io.metric(super::metrics::Kind::Counter, &name, 1);
            }
            parts.push((backend, member.routed.tools.as_deref(), member.server.failure));
        }
        match mcp::aggregate::merged(list, &held.id, &parts, held.aggregate.stateless) {
            Ok(body) => self.answer(env, 200, body),
            Err(body) => {
                self.note_outcome(Outcome::Error);
                self.answer(env, 200, body)
            }
        }
    }

    /// The member's session is open: the request goes there through Envoy's router, its name
    /// unprefixed (`body`, of which Envoy's buffer holds `size` bytes), in the gateway's session
    /// with the server, or to a server of the stateless era in none (with its `Mcp-Method`, its
    /// `Mcp-Name` unprefixed, and a session-era client's request given the era's envelope).
    fn route_to_member(
        &mut self,
        env: &mut Env,
        held: Spoken,
        raw: RawHeaders,
        (size, body): (usize, Vec<u8>),
        name: Option<&str>,
    ) -> Action {
        let member = match self.member_of(env, &held) {
            Ok(member) => member,
            Err(action) => return action,
        };
        let Some((_, backend, _)) = held.backends.first() else {
            return Action::Continue;
        };
        let mut routed = member.routed.clone();
        routed.tools = None;
        // The client's session and version are the gateway's; the server's are its own.
        for header in ["mcp-session-id", "mcp-protocol-version", "mcp-name", "mcp-method", "content-length"] {
            routed.remove.push(header.to_string());
        }
        let method = self.record.mcp.as_deref().and_then(|facts| facts.method.as_deref());
        routed.set.extend(method.and_then(|method| backend.method_header(method)));
        if let (true, Some(name)) = (backend.is_stateless(), name) {
            routed.set.push(("mcp-name".to_string(), mcp::aggregate::name_header(name)));
        }
        if let Some(schema) = backend.input_schema() {
            let arguments = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|mut call| call.pointer_mut("/params/arguments").map(Value::take));
            routed.set.extend(mcp::params::headers(schema, &arguments.unwrap_or(Value::Null)));
        }
        let body = match backend.is_stateless() && !held.aggregate.stateless {
            true => mcp::aggregate::enveloped(&body),
            false => body,
        };
        routed.set.extend(backend.session_headers().into_iter().filter(|(name, _)| name != "accept"));
        routed.set.push(("content-length".to_string(), body.len().to_string()));
        env.io.set_request_body(env.id, size, &body);
        let mut edits = HeaderEdits { remove: routed.remove, set: routed.set };
        edits.set.push((crate::pipeline::TRACE_HEADER.to_string(), self.record.trace_id.clone()));
        env.io.set_request_headers(env.id, &edits.apply(&raw));
        // A session the server no longer knows is not used again; the server's own requests on
        // the answer's stream (the session era's) carry ids its answers are routed back by.
        let identity = held.aggregate.session_identity(&backend.server);
        let session = Some((identity, backend.session_id().map(str::to_string)));
        let edit = answer_edit(&held.aggregate, backend);
        // Only a kept session may have ended unseen: one opened for this request is not tried
        // again.
        let kept = !backend.is_stateless() && backend.opened_session().is_none();
        let resend = kept.then(|| Box::new(Resend { spoken: held, body }));
        self.phase = Phase::Mcp(Some(Box::new(Sent { edit, session, resend })));
        Action::Continue
    }

    /// The member a request goes to, once its session is open; else the client's answer (an
    /// error naming the server).
    fn member_of<'a>(&mut self, env: &mut Env, held: &'a Spoken) -> Result<&'a mcp::Member, Action> {
        let Some((index, backend, _)) = held.backends.first() else {
            let error = mcp::aggregate::error(&held.id, -32603, "no server to send the request to");
            return Err(self.answer(env, 200, error));
        };
        let member = held.aggregate.members.get(*index);
        let (Some(member), None) = (member, backend.failure()) else {
            let why = backend.failure().unwrap_or("it is unknown");
            let message = format!("MCP server '{}' could not be reached: {why}", backend.server);
            self.note_outcome(Outcome::Error);
            return Err(self.answer(env, 200, mcp::aggregate::error(&held.id, -32000, &message)));
        };
        Ok(member)
    }
}

/// How a member's answer is edited on its way to the client: the server's requests on a
/// session-era stream get routable ids, and what differs between the client's era and the
/// server's is bridged (`Bridge`). Between two of the stateless era it passes as it is.
fn answer_edit(aggregate: &Aggregate, backend: &Backend) -> Option<Edit> {
    let bridge = match (aggregate.stateless, backend.is_stateless()) {
        (true, true) => return None,
        (true, false) => Bridge::ToStateless,
        (false, true) => Bridge::ToSession,
        (false, false) => Bridge::Same,
    };
    Some(Edit::Member { server: backend.server.clone(), bridge })
}
