//! What the gateway reads of MCP's JSON-RPC: the message a client POSTs (its id, method and,
//! for `tools/call`, the tool), and the server's answer to it, JSON or an SSE stream, watched
//! as it passes for its outcome (a JSON-RPC error, or a tool result with `isError`). Nothing
//! here changes a byte of either.

use crate::errors::GatewayError;
use crate::stream::sse::SseParser;
use serde_json::Value;

/// A method or tool name longer than this is cut in the record (names are short; a client's
/// garbage must not fill the logs).
const MAX_NAME_CHARS: usize = 128;

/// A JSON answer is watched up to this size; past it, its outcome is its HTTP status's (a
/// tool result this big is rare, and buffering it would cost every such call its memory).
const MAX_WATCHED_JSON: usize = 1024 * 1024;

/// The JSON-RPC message a client POSTed, as the gateway reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Message {
    /// A request's id (a string or a number); none for a notification or a client's answer
    /// to a server's request.
    pub(crate) id: Option<Value>,
    /// None for a client's answer (it carries `result` or `error`).
    pub(crate) method: Option<String>,
    /// The tool a `tools/call` names.
    pub(crate) tool: Option<String>,
    /// A `tools/call`'s params, for the config's checks.
    pub(crate) params: Option<Value>,
}

/// Reads the body of a POST: one JSON-RPC 2.0 message (MCP has had no batches since
/// 2025-06-18). Anything else is the error the client gets, with JSON-RPC's code for it.
pub(crate) fn read(body: &[u8]) -> Result<Message, GatewayError> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        GatewayError::new(400, "invalid_request_error", format!("the body is not JSON: {error}"))
            .with_code("parse_error")
    })?;
    let mut fields = match value {
        Value::Object(fields) => fields,
        Value::Array(_) => {
            return Err(invalid(
                "a JSON-RPC batch is not supported (MCP has none since 2025-06-18): send one message per request",
            ))
        }
        _ => return Err(invalid("the body must be a JSON-RPC message (an object)")),
    };
    if fields.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("the message must carry \"jsonrpc\": \"2.0\""));
    }
    let id = match fields.get("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
        Some(_) => return Err(invalid("a message's id must be a string or a number")),
    };
    let method = match fields.get("method") {
        None if fields.contains_key("result") || fields.contains_key("error") => None,
        None => return Err(invalid("the message has no method (and is no answer: no result or error)")),
        Some(Value::String(method)) => Some(cut(method)),
        Some(_) => return Err(invalid("a message's method must be a string")),
    };
    let params = fields.remove("params").filter(|_| method.as_deref() == Some("tools/call"));
    let tool = params.as_ref().and_then(|p| p.get("name")).and_then(Value::as_str).map(cut);
    Ok(Message { id, method, tool, params })
}

fn invalid(message: &str) -> GatewayError {
    GatewayError::new(400, "invalid_request_error", message).with_code("invalid_json_rpc")
}

fn cut(name: &str) -> String {
    name.chars().take(MAX_NAME_CHARS).collect()
}

/// Between a server's id and a name (or request id) of its own in the aggregate endpoint's
/// names (server ids never hold `__`, so the first one splits).
pub(crate) const SEPARATOR: &str = "__";

/// A tool's or prompt's name through the aggregate endpoint: its server's id, then its name.
pub(crate) fn prefixed(server: &str, name: &str) -> String {
    format!("{server}{SEPARATOR}{name}")
}

/// The id a server's request `id` carries to the client through the aggregate endpoint: the
/// server's id, then the request's id as JSON (a number stays told apart from a string).
pub(crate) fn server_request_id(server: &str, id: &Value) -> String {
    format!("{server}{SEPARATOR}{id}")
}

/// How an MCP request ended, for its record and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    /// A JSON-RPC error, or an HTTP error status (the gateway's or the server's).
    Error,
    /// A tool's result with `isError: true`: the call went through, the tool failed.
    ToolError,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::ToolError => "tool_error",
        }
    }
}

/// The outcome `message` tells, when it is the answer to the request with `id`.
pub(super) fn answer_outcome(message: &Value, id: &Value) -> Option<Outcome> {
    if message.get("id") != Some(id) {
        return None;
    }
    if message.get("error").is_some() {
        return Some(Outcome::Error);
    }
    let result = message.get("result")?;
    Some(match result.get("isError") {
        Some(Value::Bool(true)) => Outcome::ToolError,
        _ => Outcome::Ok,
    })
}

/// What a message asks of the client, as the methods it names: a request of the server's (the
/// session era's way), or a result that is `input_required` (the 2026-07-28 era's); None for
/// any other message.
pub(super) fn input_asked(message: &Value) -> Option<String> {
    if let (Some(Value::String(method)), Some(_)) = (message.get("method"), message.get("id")) {
        return Some(method.clone());
    }
    let result = message.get("result")?;
    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return None;
    }
    let methods = match result.get("inputRequests") {
        Some(Value::Object(requests)) => {
            requests.values().filter_map(|request| request.get("method")?.as_str()).collect()
        }
        _ => Vec::new(),
    };
    Some(match methods.is_empty() {
        true => "input_required".to_string(),
        false => methods.join(", "),
    })
}

/// A result as a client of `era` reads it: a stateless-era client's carries `resultType`.
pub(crate) fn for_era(mut result: Value, stateless: bool) -> Value {
    if let (true, Some(fields)) = (stateless, result.as_object_mut()) {
        fields.insert("resultType".to_string(), Value::String("complete".to_string()));
    }
    result
}

/// The JSON-RPC error code of a tool call the config's guardrails denied.
const DENIED_CODE: i64 = -32003;
const DENIED_MESSAGE: &str = "the gateway's guardrails denied this tool call: see hook_results";

/// The answer to a tool call (request `id`) that the config's guardrails denied, their
/// verdicts (`hook_results`) in the error's data: JSON, or the one event of a stream when
/// the server's answer (of `content_type`) was one.
pub(crate) fn denied_answer(content_type: &[u8], id: Option<&Value>, hook_results: &[u8]) -> Vec<u8> {
    let results: Value = serde_json::from_slice(hook_results).unwrap_or(Value::Null);
    let data = serde_json::json!({"hook_results": results});
    let error = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": DENIED_CODE, "message": DENIED_MESSAGE, "data": data}});
    match answer_form(content_type) {
        Some(AnswerForm::Sse) => format!("event: message\ndata: {error}\n\n").into_bytes(),
        _ => error.to_string().into_bytes(),
    }
}

/// How a server's answer carries its JSON-RPC message (streamable HTTP has two ways).
pub(super) enum AnswerForm {
    Json,
    Sse,
}

/// The form of an answer of `content_type`; None for a type that carries no message.
pub(super) fn answer_form(content_type: &[u8]) -> Option<AnswerForm> {
    let essence = content_type.split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
    if essence.eq_ignore_ascii_case(b"text/event-stream") {
        Some(AnswerForm::Sse)
    } else if essence.eq_ignore_ascii_case(b"application/json") {
        Some(AnswerForm::Json)
    } else {
        None
    }
}

/// The answer to the request with `id` in a server's whole answer body of `content_type` (a
/// dispatched call's): the JSON body, or the SSE event that carries it; None when there is
/// none.
pub(crate) fn answer_in(content_type: &[u8], body: &[u8], id: &Value) -> Option<Value> {
    // An answer carries the id and a result or an error (a request of the server's may reuse it).
    let is_answer = |message: &Value| {
        message.get("id") == Some(id) && (message.get("result").is_some() || message.get("error").is_some())
    };
    match answer_form(content_type)? {
        AnswerForm::Json => serde_json::from_slice(body).ok().filter(is_answer),
        AnswerForm::Sse => {
            let mut parser = SseParser::new();
            let mut events = parser.push(body);
            events.extend(parser.finish());
            events.iter().filter_map(|event| serde_json::from_str(&event.data).ok()).find(is_answer)
        }
    }
}

/// Watches a server's answer to one request as it passes, for its outcome: a JSON body
/// (gathered up to [`MAX_WATCHED_JSON`]) or an SSE stream (each event read as it completes;
/// the stream's other messages, progress notifications and the server's own requests, are not
/// the answer).
#[derive(Debug)]
pub(crate) struct AnswerWatch {
    id: Value,
    form: Form,
    outcome: Option<Outcome>,
}

#[derive(Debug)]
enum Form {
    /// The JSON so far; None once it outgrew the bound.
    Json(Option<Vec<u8>>),
    Sse(Box<SseParser>),
}

impl AnswerWatch {
    /// A watch on the answer to request `id` whose content type is `content_type`; none for
    /// a type that carries no JSON-RPC message.
    pub(crate) fn new(id: Value, content_type: &[u8]) -> Option<AnswerWatch> {
        let form = match answer_form(content_type)? {
            AnswerForm::Sse => Form::Sse(Box::default()),
            AnswerForm::Json => Form::Json(Some(Vec::new())),
        };
        Some(AnswerWatch { id, form, outcome: None })
    }

    /// A chunk of the answer passed.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.outcome.is_some() {
            return;
        }
        match &mut self.form {
            Form::Json(gathered) => {
                let fits = gathered.as_ref().is_some_and(|so_far| so_far.len() + chunk.len() <= MAX_WATCHED_JSON);
                match gathered {
                    Some(so_far) if fits => so_far.extend_from_slice(chunk),
                    _ => *gathered = None,
                }
            }
            Form::Sse(parser) => {
                let events = parser.push(chunk);
                self.outcome = events.iter().find_map(|event| {
                    let message: Value = serde_json::from_str(&event.data).ok()?;
                    answer_outcome(&message, &self.id)
                });
            }
        }
    }

    /// The outcome read so far (a stream's, as soon as its answer event passed: the client may
    /// leave before the stream ends).
    pub(crate) fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// The answer ended: its outcome, when it carried the request's answer.
    pub(crate) fn finish(&mut self) -> Option<Outcome> {
        if let (None, Form::Json(Some(body))) = (self.outcome, &self.form) {
            let message: Option<Value> = serde_json::from_slice(body).ok();
            self.outcome = message.and_then(|message| answer_outcome(&message, &self.id));
        }
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn reads_a_request_a_notification_and_an_answer() {
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":1}}}"#;
        let message = read(call).unwrap();
        assert_eq!(
            message,
            Message {
                id: Some(json!(7)),
                method: Some("tools/call".into()),
                tool: Some("add".into()),
                params: Some(json!({"name": "add", "arguments": {"a": 1}}))
            }
        );
        let note = read(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!((note.id, note.method.as_deref(), note.tool), (None, Some("notifications/initialized"), None));
        let answer = read(br#"{"jsonrpc":"2.0","id":"s-1","result":{"action":"accept"}}"#).unwrap();
        assert_eq!((answer.id, answer.method), (Some(json!("s-1")), None));
        let list = read(br#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{"name":"n"}}"#).unwrap();
        assert_eq!(list.tool, None, "only tools/call names a tool");
    }

    #[test]
    fn refuses_what_is_not_one_json_rpc_message() {
        let code = |body: &[u8]| read(body).map(|_| ()).map_err(|e| (e.status, e.code));
        assert_eq!(code(b"{not json"), Err((400, Some("parse_error"))));
        assert_eq!(code(b""), Err((400, Some("parse_error"))));
        for body in [
            &br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#[..],
            br#""ping""#,
            br#"{"id":1,"method":"ping"}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
        ] {
            assert_eq!(code(body), Err((400, Some("invalid_json_rpc"))), "{}", String::from_utf8_lossy(body));
        }
        let batch = read(br#"[]"#).unwrap_err();
        assert!(batch.message.contains("batch"), "{}", batch.message);
    }

    #[test]
    fn names_are_cut_for_the_record() {
        let long = "t".repeat(1000);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": long}});
        let message = read(body.to_string().as_bytes()).unwrap();
        assert_eq!(message.tool.map(|t| t.len()), Some(MAX_NAME_CHARS));
    }

    fn watched(content_type: &str, chunks: &[&[u8]]) -> Option<Outcome> {
        let mut watch = AnswerWatch::new(json!(3), content_type.as_bytes())?;
        chunks.iter().for_each(|chunk| watch.push(chunk));
        watch.finish()
    }

    #[test]
    fn a_json_answer_tells_its_outcome_whatever_its_chunks() {
        let tool_error = br#"{"jsonrpc":"2.0","id":3,"result":{"content":[],"isError":true}}"#;
        let (head, tail) = tool_error.split_at(20);
        assert_eq!(watched("application/json; charset=utf-8", &[head, tail]), Some(Outcome::ToolError));
        let ok = br#"{"jsonrpc":"2.0","id":3,"result":{"content":[],"isError":false}}"#;
        assert_eq!(watched("application/json", &[ok]), Some(Outcome::Ok));
        let error = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"unknown tool"}}"#;
        assert_eq!(watched("application/json", &[error]), Some(Outcome::Error));
        let other = br#"{"jsonrpc":"2.0","id":4,"result":{"isError":true}}"#;
        assert_eq!(watched("application/json", &[other]), None, "another request's answer");
        assert_eq!(watched("text/plain", &[ok]), None);
    }

    #[test]
    fn a_json_answer_past_the_bound_is_not_gathered() {
        let big = vec![b' '; MAX_WATCHED_JSON];
        let tool_error = br#"{"jsonrpc":"2.0","id":3,"result":{"isError":true}}"#;
        assert_eq!(watched("application/json", &[&big, tool_error]), None);
    }

    #[test]
    fn a_stream_tells_the_outcome_of_its_answer_not_of_its_other_messages() {
        let stream = concat!(
            "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",",
            "\"params\":{\"progress\":1}}\r\n\r\n",
            ": keep-alive\n\n",
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"elicit-1\",\"method\":\"elicitation/create\"}\n\n",
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"isError\":true}}\n\n",
        )
        .as_bytes();
        // Cut at every byte: the outcome never depends on where the chunks end.
        for at in 0..stream.len() {
            let (head, tail) = stream.split_at(at);
            assert_eq!(watched("text/event-stream", &[head, tail]), Some(Outcome::ToolError), "cut at {at}");
        }
        // Known once the answer's event passed, before the stream ends.
        let mut watch = AnswerWatch::new(json!(3), b"text/event-stream").unwrap();
        watch.push(stream);
        assert_eq!(watch.outcome(), Some(Outcome::ToolError));
        let unanswered = b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n";
        assert_eq!(watched("text/event-stream", &[unanswered]), None);
    }
}
