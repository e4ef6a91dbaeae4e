//! Which of a server's tools a caller may see and call: the server's own `tools` (allow or
//! deny patterns) and the caller's key's `mcp_tools` (`{server}__{tool}` patterns). A call to a
//! tool outside them is answered "unknown tool" without reaching the server; a `tools/list`
//! answer reaches the client without them, JSON or an SSE stream rewritten as it passes.

use super::message::Outcome;
use crate::stream::sse::MAX_EVENT_BYTES;
use gateway_schema::mcp_servers::{key_permits, Tools};
use serde_json::{json, Value};
use std::rc::Rc;

/// What a caller may use of one server; made only when something is withheld.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolPolicy {
    server_id: String,
    server: Tools,
    /// The key's patterns, `{server}__{tool}`.
    key: Option<Rc<[String]>>,
}

impl ToolPolicy {
    /// The policy of `server_id` (its `tools`) for a key with `key` patterns; None when every
    /// tool is permitted.
    pub(crate) fn new(server_id: &str, server: &Tools, key: Option<&Rc<[String]>>) -> Option<ToolPolicy> {
        if *server == Tools::All && key.is_none() {
            return None;
        }
        Some(ToolPolicy { server_id: server_id.to_string(), server: server.clone(), key: key.cloned() })
    }

    /// Whether the caller may see and call the server's tool `name`.
    pub(crate) fn permits(&self, name: &str) -> bool {
        let by_key = self.key.as_ref().is_none_or(|patterns| key_permits(patterns, &self.server_id, name));
        self.server.permits(name) && by_key
    }

    /// Removes the tools the caller may not use from `message` when it is the answer to
    /// the `tools/list` with `id`; its outcome then (None: another message, or one that is not
    /// a list's answer).
    fn filter_answer(&self, message: &mut Value, id: &Value) -> Option<Outcome> {
        if message.get("id") != Some(id) {
            return None;
        }
        if message.get("error").is_some() {
            return Some(Outcome::Error);
        }
        let tools = message.get_mut("result")?.get_mut("tools")?.as_array_mut()?;
        tools.retain(|tool| tool.get("name").and_then(Value::as_str).is_some_and(|name| self.permits(name)));
        Some(Outcome::Ok)
    }
}

/// The answer to a call of a tool the caller may not use, as a server answers a tool it does
/// not have (JSON-RPC's invalid params): it says no more.
pub(crate) fn unknown_tool(id: Option<&Value>, name: &str) -> Vec<u8> {
    let message = format!("Unknown tool: {}", name.chars().take(128).collect::<String>());
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": message}}).to_string().into_bytes()
}

/// What a rewrite changes in a server's answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Edit {
    /// A `tools/list` answer loses the tools the caller may not use.
    Tools(ToolPolicy),
    /// An answer routed through the aggregate endpoint from `server`: the server's own requests
    /// on a call's stream (elicitation, sampling) carry ids the endpoint routes the client's
    /// answers back by (`super::message::server_request_id`); `bridge`: what differs between
    /// the client's era and the server's.
    Member { server: String, bridge: Bridge },
}

/// What a member's answer needs when its server and the client speak different eras.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Bridge {
    /// One era: the answer passes as it is.
    Same,
    /// A session-era server, a stateless-era client: the result gains the `resultType` such a
    /// client needs. A request of the server's mid-call (such a client answers none) ends the
    /// call with an error naming it, rather than leave the server waiting.
    ToStateless,
    /// A stateless-era server, a session-era client: an `input_required` result (such a client
    /// cannot answer it: the gateway would have to hold the call across the client's answers)
    /// becomes an error naming what it asks.
    ToSession,
}

/// A server's answer on its way to the caller, rewritten (`Edit`): a JSON answer held whole and
/// rewritten at its end (a list's only: a JSON answer carries no request of the server's); an
/// SSE stream rewritten event by event (an event changed keeps its other lines, `id:` and
/// `event:`; every other event passes as it came).
#[derive(Debug)]
pub(crate) struct AnswerRewrite {
    id: Value,
    edit: Edit,
    form: Form,
    outcome: Option<Outcome>,
}

#[derive(Debug)]
enum Form {
    Json(Vec<u8>),
    Sse(Events),
}

impl AnswerRewrite {
    /// The rewrite of the answer to the request with `id`, of content type `content_type`; None
    /// for a type that carries no JSON-RPC message, or for a JSON answer with nothing to change
    /// (a server's requests travel on streams only).
    pub(crate) fn new(id: Value, edit: Edit, content_type: &[u8]) -> Option<AnswerRewrite> {
        let form = match (super::message::answer_form(content_type)?, &edit) {
            (super::message::AnswerForm::Json, Edit::Tools(_)) => Form::Json(Vec::new()),
            (super::message::AnswerForm::Json, Edit::Member { bridge: Bridge::Same, .. }) => return None,
            (super::message::AnswerForm::Json, Edit::Member { .. }) => Form::Json(Vec::new()),
            (super::message::AnswerForm::Sse, _) => Form::Sse(Events::default()),
        };
        Some(AnswerRewrite { id, edit, form, outcome: None })
    }

    /// Whether the whole answer is held until its end (JSON), rather than passed as it comes.
    pub(crate) fn holds(&self) -> bool {
        matches!(self.form, Form::Json(_))
    }

    /// A chunk of the answer (`end`: the last): what goes to the client in its place. A JSON
    /// list gives everything at its end; one that is not the answer's JSON becomes a JSON-RPC
    /// error rather than pass unfiltered, as does one past the bound of an event (a message
    /// either way).
    pub(crate) fn push(&mut self, chunk: &[u8], end: bool) -> Vec<u8> {
        match &mut self.form {
            Form::Json(held) => {
                if held.len() + chunk.len() > MAX_EVENT_BYTES {
                    *held = Vec::new();
                    self.outcome = Some(Outcome::Error);
                }
                if self.outcome.is_none() {
                    held.extend_from_slice(chunk);
                }
                if !end {
                    return Vec::new();
                }
                if self.outcome.is_some() {
                    return unreadable(&self.id);
                }
                let mut message: Value = serde_json::from_slice(held).unwrap_or(Value::Null);
                self.edit_message(&mut message);
                match self.outcome {
                    Some(_) => message.to_string().into_bytes(),
                    None => unreadable(&self.id),
                }
            }
            Form::Sse(events) => {
                let mut out = Vec::with_capacity(chunk.len());
                for event in events.push(chunk, end) {
                    match event {
                        Ok(event) => self.rewrite_event(event, &mut out),
                        // Too big to read: withheld, and the request answered with an error.
                        Err(Oversized) => {
                            out.extend_from_slice(b"event: message\ndata: ");
                            out.extend_from_slice(&unreadable(&self.id));
                            out.extend_from_slice(b"\n\n");
                            self.outcome = Some(Outcome::Error);
                        }
                    }
                }
                out
            }
        }
    }

    /// How the answer ended, once its message passed.
    pub(crate) fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Edits one message of the answer; whether it changed. The answer to the request sets the
    /// outcome.
    fn edit_message(&mut self, message: &mut Value) -> bool {
        if self.outcome.is_some() {
            return false;
        }
        match &self.edit {
            Edit::Tools(policy) => {
                self.outcome = policy.filter_answer(message, &self.id);
                self.outcome.is_some()
            }
            Edit::Member { server, bridge } => {
                self.outcome = super::message::answer_outcome(message, &self.id);
                let asks = super::message::input_asked(message);
                match (bridge, self.outcome, asks) {
                    (Bridge::ToSession, Some(_), Some(asked)) | (Bridge::ToStateless, None, Some(asked)) => {
                        *message = unanswerable_input(&self.id, server, *bridge, &asked);
                        self.outcome = Some(Outcome::Error);
                        return true;
                    }
                    (Bridge::ToStateless, Some(_), _) => {
                        if let Some(result) = message.get_mut("result") {
                            *result = super::message::for_era(std::mem::take(result), true);
                            return true;
                        }
                    }
                    _ => {}
                }
                let request = message.get("method").is_some();
                match message.get_mut("id").filter(|_| request) {
                    Some(id) => {
                        *id = Value::String(super::message::server_request_id(server, id));
                        true
                    }
                    None => false,
                }
            }
        }
    }

    fn rewrite_event(&mut self, event: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let data: Vec<&[u8]> = event.iter().filter_map(|line| data_of(line)).collect();
        let mut message: Option<Value> = match data.as_slice() {
            [] => None,
            lines => serde_json::from_slice(&lines.join(&b'\n')).ok(),
        };
        let changed = message.as_mut().is_some_and(|message| self.edit_message(message));
        if !changed {
            for line in &event {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
            out.push(b'\n');
            return;
        }
        let mut wrote_data = false;
        for line in &event {
            if data_of(line).is_none() {
                out.extend_from_slice(line);
                out.push(b'\n');
            } else if !wrote_data {
                wrote_data = true;
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(message.as_ref().map(Value::to_string).unwrap_or_default().as_bytes());
                out.push(b'\n');
            }
        }
        out.push(b'\n');
    }
}

/// The error that ends a call whose server asks the client for input (`asked`: its methods)
/// in a way the client's era cannot answer through the aggregate.
fn unanswerable_input(id: &Value, server: &str, bridge: Bridge, asked: &str) -> Value {
    let (how, client) = match bridge {
        Bridge::ToSession => ("in the 2026-07-28 way (input_required)", "the session era"),
        _ => ("mid-call, in the session era's way", "the 2026-07-28 era"),
    };
    let message = format!(
        "MCP server '{server}' asks the client for input ({asked}) {how}, which a client of {client} \
         cannot answer through the gateway; a client of the server's era can"
    );
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}})
}

/// The error in place of an answer the gateway could not read (so could not rewrite).
fn unreadable(id: &Value) -> Vec<u8> {
    let message = "the MCP server's answer could not be read, so it was not passed";
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}}).to_string().into_bytes()
}

/// The value of a `data` line (`data:value`, one space after the colon dropped).
fn data_of(line: &[u8]) -> Option<&[u8]> {
    let value = line.strip_prefix(b"data")?;
    match value {
        [] => Some(value),
        [b':', b' ', rest @ ..] => Some(rest),
        [b':', rest @ ..] => Some(rest),
        _ => None,
    }
}

/// An event past [`MAX_EVENT_BYTES`].
#[derive(Debug)]
struct Oversized;

/// Splits an SSE stream into events (their lines, without terminators) at blank lines,
/// whatever the chunks: a line may end in `\n`, `\r\n` or `\r`, and a chunk anywhere.
#[derive(Debug, Default)]
struct Events {
    line: Vec<u8>,
    /// The current line has a byte (kept or, past the bound, dropped).
    line_started: bool,
    lines: Vec<Vec<u8>>,
    /// Bytes of the current event so far.
    size: usize,
    after_cr: bool,
    /// The current event outgrew the bound: its bytes are dropped until it ends.
    oversized: bool,
}

impl Events {
    fn push(&mut self, chunk: &[u8], end: bool) -> Vec<Result<Vec<Vec<u8>>, Oversized>> {
        let mut events = Vec::new();
        for &byte in chunk {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            if byte == b'\n' || byte == b'\r' {
                self.after_cr = byte == b'\r';
                self.end_line(&mut events);
                continue;
            }
            self.line_started = true;
            self.size += 1;
            if self.size > MAX_EVENT_BYTES {
                self.oversized = true;
                self.line = Vec::new();
                self.lines = Vec::new();
            } else if !self.oversized {
                self.line.push(byte);
            }
        }
        if end {
            if self.line_started {
                self.end_line(&mut events);
            }
            self.end_line(&mut events);
        }
        events
    }

    fn end_line(&mut self, events: &mut Vec<Result<Vec<Vec<u8>>, Oversized>>) {
        if std::mem::take(&mut self.line_started) {
            let line = std::mem::take(&mut self.line);
            if !self.oversized {
                self.lines.push(line);
            }
            return;
        }
        // A blank line: the event ends.
        self.size = 0;
        if std::mem::take(&mut self.oversized) {
            events.push(Err(Oversized));
        } else if !self.lines.is_empty() {
            events.push(Ok(std::mem::take(&mut self.lines)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn policy(server: Tools, key: Option<&[&str]>) -> Option<ToolPolicy> {
        let key: Option<Rc<[String]>> = key.map(|patterns| patterns.iter().map(|p| p.to_string()).collect());
        ToolPolicy::new("files", &server, key.as_ref())
    }

    #[test]
    fn the_server_and_the_key_both_decide() {
        assert_eq!(policy(Tools::All, None), None, "nothing withheld: no policy");
        let allow = policy(Tools::Allow(vec!["read_*".into()]), None).unwrap();
        assert!(allow.permits("read_file") && !allow.permits("write_file"));
        let deny = policy(Tools::Deny(vec!["write_*".into()]), None).unwrap();
        assert!(deny.permits("read_file") && !deny.permits("write_file"));
        let key = policy(Tools::All, Some(&["files__read_*", "search__*"])).unwrap();
        assert!(key.permits("read_file") && !key.permits("write_file"));
        let other_server = policy(Tools::All, Some(&["search__*"])).unwrap();
        assert!(!other_server.permits("read_file"), "a key's patterns name their server");
        let both = policy(Tools::Deny(vec!["read_secret".into()]), Some(&["*__read_*"])).unwrap();
        assert!(both.permits("read_file") && !both.permits("read_secret") && !both.permits("list"));
        let across = policy(Tools::All, Some(&["*__read_*"])).unwrap();
        assert!(across.permits("read_y") && !across.permits("x__read_y"), "a pattern's * never reaches across __");
    }

    #[test]
    fn an_unknown_tool_is_answered_as_a_server_would() {
        let body: Value = serde_json::from_slice(&unknown_tool(Some(&json!(4)), "write_file")).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32602, "message": "Unknown tool: write_file"}})
        );
    }

    const LIST: &str = r#"{"jsonrpc":"2.0","id":9,"result":{"tools":[{"name":"read_file","inputSchema":{}},{"name":"write_file"}],"nextCursor":"c2"}}"#;

    fn rewrite(content_type: &str) -> AnswerRewrite {
        let policy = policy(Tools::Deny(vec!["write_*".into()]), None).unwrap();
        AnswerRewrite::new(json!(9), Edit::Tools(policy), content_type.as_bytes()).unwrap()
    }

    #[test]
    fn a_json_list_is_held_and_loses_the_tools_withheld() {
        let mut list = rewrite("application/json");
        assert!(list.holds());
        let out: Value = serde_json::from_slice(&list.push(LIST.as_bytes(), true)).unwrap();
        assert_eq!(out["result"]["tools"], json!([{"name": "read_file", "inputSchema": {}}]));
        assert_eq!(out["result"]["nextCursor"], "c2", "pagination passes");
        assert_eq!(list.outcome(), Some(Outcome::Ok));
        let mut garbled = rewrite("application/json");
        let out: Value = serde_json::from_slice(&garbled.push(b"{\"tools\": [", true)).unwrap();
        assert_eq!(out["error"]["code"], -32603, "never passed unfiltered");
        assert!(AnswerRewrite::new(json!(9), Edit::Tools(policy(Tools::Deny(vec![]), None).unwrap()), b"text/html")
            .is_none());
    }

    #[test]
    fn a_streamed_list_is_rewritten_event_by_event_whatever_the_chunks() {
        let stream = format!(
            "id: e1\r\nevent: message\r\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}}\r\n\r\n\
             : keep-alive\n\nid: e2\nevent: message\ndata: {LIST}\n\n"
        );
        let expected_list =
            r#"{"id":9,"jsonrpc":"2.0","result":{"nextCursor":"c2","tools":[{"inputSchema":{},"name":"read_file"}]}}"#;
        for at in 0..stream.len() {
            let mut list = rewrite("text/event-stream");
            assert!(!list.holds());
            let (head, tail) = stream.as_bytes().split_at(at);
            let mut out = list.push(head, false);
            out.extend(list.push(tail, true));
            let text = String::from_utf8(out).unwrap();
            let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
            assert_eq!(events.len(), 3, "cut at {at}: {text}");
            assert!(events[0].starts_with("id: e1\nevent: message\ndata: {\"jsonrpc\""), "{text}");
            assert_eq!(events[1], ": keep-alive");
            let (head, data) = events[2].split_once("data: ").unwrap();
            assert_eq!(head, "id: e2\nevent: message\n");
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data, serde_json::from_str::<Value>(expected_list).unwrap(), "cut at {at}");
            assert_eq!(list.outcome(), Some(Outcome::Ok));
        }
    }

    #[test]
    fn a_json_answer_past_the_bound_of_an_event_is_not_held_nor_passed() {
        let edit = Edit::Member { server: "files".into(), bridge: Bridge::ToSession };
        let mut json = AnswerRewrite::new(json!(4), edit, b"application/json").unwrap();
        let big = vec![b'x'; MAX_EVENT_BYTES / 2 + 1];
        assert!(json.push(br#"{"jsonrpc":"2.0","id":4,"result":{"text":""#, false).is_empty());
        assert!(json.push(&big, false).is_empty() && json.push(&big, false).is_empty());
        let error = message_of(&json.push(br#""}}"#, true));
        assert_eq!((&error["id"], &error["error"]["code"]), (&json!(4), &json!(-32603)), "{error}");
        assert_eq!(json.outcome(), Some(Outcome::Error));
    }

    #[test]
    fn an_event_past_the_bound_is_not_passed() {
        let mut list = rewrite("text/event-stream");
        let mut out = list.push(b"data: ", false);
        let big = vec![b'x'; 1024 * 1024];
        for _ in 0..MAX_EVENT_BYTES / big.len() + 1 {
            out.extend(list.push(&big, false));
        }
        out.extend(list.push(b"\n\n", true));
        let text = String::from_utf8(out).unwrap();
        assert!(text.len() < 1024 && text.contains("-32603"), "{}", &text[..text.len().min(200)]);
        assert_eq!(list.outcome(), Some(Outcome::Error));
    }

    #[test]
    fn a_servers_requests_on_a_calls_stream_get_routable_ids() {
        let edit = Edit::Member { server: "files".into(), bridge: Bridge::Same };
        assert!(AnswerRewrite::new(json!(4), edit.clone(), b"application/json").is_none(), "JSON carries none");
        let mut rewrite = AnswerRewrite::new(json!(4), edit, b"text/event-stream").unwrap();
        let stream = concat!(
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n",
            "id: e1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"elicitation/create\"}\n\n",
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{\"isError\":true}}\n\n",
        );
        let mut out = Vec::new();
        for (i, piece) in stream.as_bytes().chunks(7).enumerate() {
            out.extend(rewrite.push(piece, (i + 1) * 7 >= stream.len()));
        }
        let text = String::from_utf8(out).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3, "{text}");
        assert!(events[0].contains("notifications/progress"), "a notification passes as it came");
        assert!(events[1].starts_with("id: e1\nevent: message\ndata: "), "{}", events[1]);
        let request: Value = serde_json::from_str(events[1].rsplit("data: ").next().unwrap()).unwrap();
        assert_eq!(request["id"], "files__0");
        assert!(events[2].contains("\"id\":4"), "the answer passes as it came");
        assert_eq!(rewrite.outcome(), Some(Outcome::ToolError));
    }

    #[test]
    fn a_session_era_servers_result_gains_the_result_type_a_stateless_client_needs() {
        let edit = Edit::Member { server: "files".into(), bridge: Bridge::ToStateless };
        let mut json = AnswerRewrite::new(json!(4), edit.clone(), b"application/json").unwrap();
        assert!(json.push(br#"{"jsonrpc":"2.0","id":4,"res"#, false).is_empty(), "held whole");
        let out: Value = serde_json::from_slice(&json.push(br#"ult":{"content":[]}}"#, true)).unwrap();
        assert_eq!(out, json!({"jsonrpc": "2.0", "id": 4, "result": {"content": [], "resultType": "complete"}}));
        let mut sse = AnswerRewrite::new(json!(4), edit, b"text/event-stream").unwrap();
        let stream = concat!(
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n",
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{\"isError\":true}}\n\n",
        );
        let text = String::from_utf8(sse.push(stream.as_bytes(), true)).unwrap();
        let (progress, answer) = text.split_once("\n\n").unwrap();
        assert!(progress.ends_with(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#));
        let answer: Value =
            serde_json::from_str(answer.trim().strip_prefix("event: message\ndata: ").unwrap()).unwrap();
        assert_eq!(answer["result"], json!({"isError": true, "resultType": "complete"}));
        assert_eq!(sse.outcome(), Some(Outcome::ToolError));
    }

    /// The message of an answer to the client that is one SSE event, or JSON.
    fn message_of(out: &[u8]) -> Value {
        let text = String::from_utf8(out.to_vec()).unwrap();
        let data = text.lines().find_map(|line| line.strip_prefix("data: ")).unwrap_or(&text);
        serde_json::from_str(data).unwrap()
    }

    #[test]
    fn a_servers_request_mid_call_ends_a_stateless_clients_call_with_an_error_naming_it() {
        let edit = Edit::Member { server: "files".into(), bridge: Bridge::ToStateless };
        let mut sse = AnswerRewrite::new(json!(4), edit, b"text/event-stream").unwrap();
        let asked = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"elicitation/create\"}\n\n";
        let error = message_of(&sse.push(asked.as_bytes(), false));
        assert_eq!((&error["id"], &error["error"]["code"]), (&json!(4), &json!(-32603)), "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("'files'") && message.contains("(elicitation/create)"), "{message}");
        assert_eq!(sse.outcome(), Some(Outcome::Error));
    }

    #[test]
    fn an_input_required_result_becomes_an_error_for_a_session_client_naming_what_it_asks() {
        let edit = Edit::Member { server: "files".into(), bridge: Bridge::ToSession };
        let answer = json!({"jsonrpc": "2.0", "id": 4, "result": {"resultType": "input_required", "requestState": "s",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {}}}}});
        for content_type in [&b"application/json"[..], b"text/event-stream"] {
            let mut rewrite = AnswerRewrite::new(json!(4), edit.clone(), content_type).unwrap();
            let body = match content_type {
                b"application/json" => answer.to_string(),
                _ => format!("event: message\ndata: {answer}\n\n"),
            };
            let error = message_of(&rewrite.push(body.as_bytes(), true));
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains("(elicitation/create) in the 2026-07-28 way"), "{message}");
            assert_eq!(rewrite.outcome(), Some(Outcome::Error));
        }
        // A complete result passes as it came.
        let mut json = AnswerRewrite::new(json!(4), edit, b"application/json").unwrap();
        let complete = json!({"jsonrpc": "2.0", "id": 4, "result": {"resultType": "complete", "content": []}});
        assert_eq!(message_of(&json.push(complete.to_string().as_bytes(), true)), complete);
    }
}
