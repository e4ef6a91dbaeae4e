//! An MCP request's way through the exchange (docs/mcp.md): a POST held until its JSON-RPC
//! message is in and read (method, tool, id), then routed to its server through Envoy's router
//! with the edits `crate::mcp` decided; its answer (JSON or a stream) passes as it comes,
//! watched for its outcome; only a server Envoy could not reach gets the gateway's answer, a
//! JSON-RPC error naming the server.

use super::head::Head;
use super::reply;
use super::{unroute, Action, Env, Exchange, Phase, RawHeaders};
use crate::mcp::{self, AnswerWatch, Facts, Outcome};
use crate::pipeline::HeaderEdits;
use crate::routing::plan::Failure;

impl Exchange {
    /// Sends the request to its MCP server; a POST first waits for its message (`body`: the
    /// whole body, when the headers ended the request).
    pub(super) fn route_mcp(
        &mut self,
        env: &mut Env,
        routed: mcp::Routed,
        key_id: Option<String>,
        raw: RawHeaders,
        body: Option<(usize, Vec<u8>)>,
    ) -> Action {
        self.record.api_key_id = key_id;
        let facts = Facts { server: routed.server.clone(), id: None, method: None, tool: None, outcome: Outcome::Ok };
        self.record.mcp = Some(Box::new(facts));
        if self.record.method != "POST" {
            return self.send_mcp(env, routed, &raw);
        }
        match body {
            Some((_, body)) => self.read_mcp_message(env, routed, &raw, &body),
            None => {
                unroute(env, &raw);
                self.phase = Phase::McpAwaitingBody(Box::new((routed, raw)));
                Action::Pause
            }
        }
    }

    /// The held POST's body is complete (`size` bytes in Envoy's buffer).
    pub(super) fn mcp_body(&mut self, env: &mut Env, size: usize) -> Action {
        let Phase::McpAwaitingBody(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let (routed, raw) = *held;
        let body = env.io.request_body(env.id, size);
        self.record.client_sent(&body);
        self.read_mcp_message(env, routed, &raw, &body)
    }

    /// Reads the POSTed JSON-RPC message for the record (a body that is none is the client's
    /// JSON-RPC error), then sends it on unchanged.
    fn read_mcp_message(&mut self, env: &mut Env, routed: mcp::Routed, raw: &RawHeaders, body: &[u8]) -> Action {
        let message = match mcp::read_message(body) {
            Ok(message) => message,
            Err(error) => return self.answer_error(env, &error),
        };
        if let Some(facts) = self.record.mcp.as_deref_mut() {
            facts.id = message.id;
            facts.method = message.method;
            facts.tool = message.tool;
        }
        self.send_mcp(env, routed, raw)
    }

    fn send_mcp(&mut self, env: &mut Env, routed: mcp::Routed, raw: &RawHeaders) -> Action {
        let edits = HeaderEdits { remove: routed.remove, set: routed.set };
        env.io.set_request_headers(env.id, &edits.apply(raw));
        self.phase = Phase::Mcp(None);
        Action::Continue
    }

    /// The server's answer passes as it comes, with the gateway's headers; Envoy's own answer
    /// for a server it could not reach, or that outlived its `timeout_ms`, becomes the gateway's.
    /// The answer to a request (a message with an id) is watched for its outcome.
    pub(super) fn mcp_response(&mut self, env: &mut Env) -> Action {
        let head = Head::read(env);
        let status = head.status;
        self.record.status = status;
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
        // A compressed answer is not read (its outcome is its status's).
        let content_type = head.content_type().filter(|_| head.unencoded()).unwrap_or_default();
        let watch = facts.id.clone().and_then(|id| AnswerWatch::new(id, content_type)).map(Box::new);
        self.phase = Phase::Mcp(watch);
        self.set_gateway_headers(env);
        Action::Continue
    }

    /// A chunk of the server's answer passes; the watch reads it.
    pub(super) fn mcp_answer_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        let Phase::Mcp(Some(watch)) = &mut self.phase else {
            return Action::Continue;
        };
        if size > 0 {
            watch.push(&env.io.response_body(env.id, size));
        }
        if end_of_stream {
            let outcome = watch.finish();
            if let (Some(outcome), Some(facts)) = (outcome, self.record.mcp.as_deref_mut()) {
                facts.outcome = outcome;
            }
        }
        Action::Continue
    }
}
