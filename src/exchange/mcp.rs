//! An MCP request's way through the exchange (docs/mcp.md): routed to its server through
//! Envoy's router with the edits `crate::mcp` decided, its answer (JSON or a stream) passing as
//! it comes; only a server Envoy could not reach gets the gateway's answer, a JSON-RPC error
//! naming the server.

use super::head::Head;
use super::reply;
use super::{Action, Env, Exchange, Phase, RawHeaders};
use crate::mcp;
use crate::pipeline::HeaderEdits;
use crate::routing::plan::Failure;

impl Exchange {
    /// Sends the request to its MCP server.
    pub(super) fn route_mcp(
        &mut self,
        env: &mut Env,
        routed: mcp::Routed,
        key_id: Option<String>,
        raw: &RawHeaders,
    ) -> Action {
        self.record.api_key_id = key_id;
        let mcp::Routed { server, remove, set } = routed;
        let edits = HeaderEdits { remove, set };
        env.io.set_request_headers(env.id, &edits.apply(raw));
        self.phase = Phase::Mcp(server.into_boxed_str());
        Action::Continue
    }

    /// The server's answer passes as it comes, with the gateway's headers; Envoy's own answer
    /// for a server it could not reach, or that outlived its `timeout_ms`, becomes the gateway's.
    pub(super) fn mcp_response(&mut self, env: &mut Env, server: Box<str>) -> Action {
        let status = Head::read(env).status;
        self.record.status = status;
        if status >= 400 {
            let details = env.io.response_details(env.id);
            match reply::routed_failure(status, &details) {
                Some(Failure::Timeout) => return self.answer_error(env, &mcp::timeout_error(&server)),
                Some(Failure::Unreachable | Failure::CircuitOpen) => {
                    return self.answer_error(env, &mcp::unreachable_error(&server, &details))
                }
                Some(Failure::Status(_)) | None => {}
            }
        }
        self.phase = Phase::Mcp(server);
        self.set_gateway_headers(env);
        Action::Continue
    }
}
