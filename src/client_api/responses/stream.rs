//! OpenAI `chat.completion.chunk`s (a translated provider's stream) as the Responses event
//! sequence, each event written when its chunk arrives and numbered in order
//! (`sequence_number`): `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its part and delta events and their `...done` events, then
//! `response.completed` (or `response.incomplete`) carrying the whole response. A stream that
//! ends without `[DONE]`, or with an error chunk, ends with `response.failed`, so no client
//! takes it for a complete answer (the `openai` SDK's final response needs
//! `response.completed`).

use super::answer::{call_item, item_status, message_item, reasoning_item, status, text_part, usage, Echo};
use crate::client_api::{client_call_id, ChatEvents, Told};
use serde_json::{json, Map, Value};

/// An output item being written or written.
enum Item {
    /// Fed by `content_blocks` entry `source` (`None`: by `reasoning_content`).
    Reasoning {
        id: String,
        source: Option<u64>,
        text: String,
        signature: String,
    },
    Message {
        id: String,
        text: String,
    },
    /// Fed by the deltas of tool call `call` (chat's index).
    Call {
        id: String,
        call: u64,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    /// The item as `response.output_item.added` announces it: a message without content and a
    /// reasoning item without summary, whose parts come in events of their own (OpenAI's SDK
    /// appends each announced part to the item).
    fn added(&self) -> Value {
        match self {
            Item::Reasoning { id, .. } => json!({"type": "reasoning", "id": id, "summary": []}),
            Item::Message { id, .. } => message_item(id.clone(), "in_progress", Vec::new()),
            Item::Call { .. } => self.json("in_progress"),
        }
    }

    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text, signature, .. } => reasoning_item(id.clone(), text, signature),
            Item::Message { id, text } => message_item(id.clone(), status, vec![text_part(text)]),
            Item::Call { id, call_id, name, arguments, .. } => call_item(id.clone(), status, call_id, name, arguments),
        }
    }
}

/// Which item a delta feeds.
#[derive(Clone, Copy, PartialEq)]
enum Feed {
    Reasoning(Option<u64>),
    Message,
    Call(u64),
}

/// Chat chunks' events as the Responses event sequence (fed by a `client_api::ChatStream`).
pub(crate) struct ResponsesEvents {
    id: String,
    created_at: u64,
    request: Map<String, Value>,
    numbered: Numbered,
    started: bool,
    items: Vec<Item>,
    /// The index of the item being written.
    open: Option<usize>,
    pub(crate) told: Told,
    done: bool,
    failed: bool,
}

impl ResponsesEvents {
    pub(crate) fn new(echo: &Echo) -> Self {
        ResponsesEvents {
            id: echo.id.to_string(),
            created_at: echo.created_at,
            request: echo.request.clone(),
            numbered: Numbered::default(),
            started: false,
            items: Vec::new(),
            open: None,
            told: Told::default(),
            done: false,
            failed: false,
        }
    }

    /// The response the stream completed (or ended incomplete) with; None while it runs or
    /// when it failed.
    pub(crate) fn finished(&self) -> Option<Value> {
        (self.done && !self.failed).then(|| self.response(status(self.told.finish_reason.as_deref())))
    }

    /// The response as it stands, e.g. to store once the stream is done.
    pub(crate) fn response(&self, status: &str) -> Value {
        let echo = Echo { id: &self.id, created_at: self.created_at, request: &self.request };
        let last = self.items.len().saturating_sub(1);
        let output = self.items.iter().enumerate().map(|(i, item)| item.json(item_status(status, i == last))).collect();
        let usage = if status == "in_progress" { Value::Null } else { usage(self.told.usage.as_ref()) };
        echo.response(status, self.told.model.as_deref(), output, usage)
    }

    fn on_chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        self.told.read(chunk);
        self.start(out);
        if let Some(delta) = chunk.pointer("/choices/0/delta") {
            self.on_delta(delta, out);
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let response = self.response("in_progress");
        self.write(out, "response.created", json!({"response": response}));
        self.write(out, "response.in_progress", json!({"response": response}));
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<u8>) {
        for entry in delta.get("content_blocks").and_then(Value::as_array).into_iter().flatten() {
            let feed = Feed::Reasoning(entry.get("index").and_then(Value::as_u64));
            let block = entry.get("delta");
            if let Some(text) = block.and_then(|d| d.get("thinking")).and_then(Value::as_str) {
                self.reasoning_delta(feed, text, out);
            }
            if let Some(signature) = block.and_then(|d| d.get("signature")).and_then(Value::as_str) {
                let index = self.enter(feed, None, out);
                if let Some(Item::Reasoning { signature: held, .. }) = self.items.get_mut(index) {
                    held.push_str(signature);
                }
            }
        }
        if let Some(text) = delta.get("reasoning_content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            self.reasoning_delta(Feed::Reasoning(None), text, out);
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let index = self.enter(Feed::Message, None, out);
            if let Some(Item::Message { id, text: held }) = self.items.get_mut(index) {
                held.push_str(text);
                let event =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []});
                self.write(out, "response.output_text.delta", event);
            }
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let Some(call_index) = call.get("index").and_then(Value::as_u64) else {
                continue;
            };
            let written =
                self.items.iter().position(|item| matches!(item, Item::Call { call, .. } if *call == call_index));
            // A later piece of a call another one closed still lands on its item.
            let index = match written {
                Some(index) if self.open != Some(index) => index,
                _ => self.enter(Feed::Call(call_index), Some(call), out),
            };
            let arguments = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default();
            if let (false, Some(Item::Call { id, arguments: held, .. })) =
                (arguments.is_empty(), self.items.get_mut(index))
            {
                held.push_str(arguments);
                let event = json!({"item_id": id, "output_index": index, "delta": arguments});
                self.write(out, "response.function_call_arguments.delta", event);
            }
        }
    }

    fn reasoning_delta(&mut self, feed: Feed, text: &str, out: &mut Vec<u8>) {
        let index = self.enter(feed, None, out);
        if let Some(Item::Reasoning { id, text: held, .. }) = self.items.get_mut(index) {
            held.push_str(text);
            let event = json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": text});
            self.write(out, "response.reasoning_summary_text.delta", event);
        }
    }

    /// The index of the item `feed` writes, opened now (the open one closed) unless it is the
    /// open one.
    fn enter(&mut self, feed: Feed, call: Option<&Value>, out: &mut Vec<u8>) -> usize {
        if let Some(index) = self.open {
            if self.items.get(index).map(feeds) == Some(feed) {
                return index;
            }
        }
        self.close("completed", out);
        let index = self.items.len();
        let echo = Echo { id: &self.id, created_at: self.created_at, request: &self.request };
        let field = |pointer: &str| {
            call.and_then(|c| c.pointer(pointer)).and_then(Value::as_str).unwrap_or_default().to_string()
        };
        let item = match feed {
            Feed::Reasoning(source) => {
                Item::Reasoning { id: echo.item_id("rs", index), source, text: String::new(), signature: String::new() }
            }
            Feed::Message => Item::Message { id: echo.item_id("msg", index), text: String::new() },
            Feed::Call(call_index) => Item::Call {
                id: echo.item_id("fc", index),
                call: call_index,
                call_id: call.map(client_call_id).unwrap_or_default(),
                name: field("/function/name"),
                arguments: String::new(),
            },
        };
        let (id, added) = (item.id().to_string(), item.added());
        self.items.push(item);
        self.open = Some(index);
        self.write(out, "response.output_item.added", json!({"output_index": index, "item": added}));
        match feed {
            Feed::Message => {
                let event = json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")});
                self.write(out, "response.content_part.added", event);
            }
            Feed::Reasoning(_) => {
                let part = json!({"type": "summary_text", "text": ""});
                let event = json!({"item_id": id, "output_index": index, "summary_index": 0, "part": part});
                self.write(out, "response.reasoning_summary_part.added", event);
            }
            Feed::Call(_) => {}
        }
        index
    }

    /// Closes the open item, done with `status`.
    fn close(&mut self, status: &str, out: &mut Vec<u8>) {
        let Some(index) = self.open.take() else {
            return;
        };
        let Some(item) = self.items.get(index) else {
            return;
        };
        let (id, done) = (item.id().to_string(), item.json(status));
        let closing: Vec<(&str, Value)> = match item {
            Item::Message { text, .. } => vec![
                (
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ),
                (
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(text)}),
                ),
            ],
            Item::Reasoning { text, .. } => vec![
                (
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
                ),
                (
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "part": {"type": "summary_text", "text": text}}),
                ),
            ],
            Item::Call { name, arguments, .. } => {
                vec![(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
                )]
            }
        };
        for (event, data) in closing {
            self.write(out, event, data);
        }
        self.write(out, "response.output_item.done", json!({"output_index": index, "item": done}));
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        let status = status(self.told.finish_reason.as_deref());
        // The open item is the last one: the one an answer cut at its token limit was writing.
        self.close(item_status(status, true), out);
        let response = self.response(status);
        let event = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.write(out, event, json!({"response": response}));
        self.done = true;
    }

    fn write(&mut self, out: &mut Vec<u8>, event: &str, fields: Value) {
        self.numbered.write(out, event, fields);
    }
}

/// Writes Responses events numbered in order.
#[derive(Default)]
pub(crate) struct Numbered {
    sequence: u64,
}

impl Numbered {
    /// One event: its `type` and `sequence_number` go first in its data.
    pub(crate) fn write(&mut self, out: &mut Vec<u8>, event: &str, fields: Value) {
        let mut data = Map::new();
        data.insert("type".into(), event.into());
        data.insert("sequence_number".into(), self.sequence.into());
        if let Value::Object(fields) = fields {
            data.extend(fields);
        }
        self.sequence += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(Value::Object(data).to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }
}

fn feeds(item: &Item) -> Feed {
    match item {
        Item::Reasoning { source, .. } => Feed::Reasoning(*source),
        Item::Message { .. } => Feed::Message,
        Item::Call { call, .. } => Feed::Call(*call),
    }
}

impl ChatEvents for ResponsesEvents {
    fn on_chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        self.on_chunk(chunk, out);
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.end(out);
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        self.start(out);
        self.failed = true;
        let mut response = self.response("failed");
        if let Some(fields) = response.as_object_mut() {
            fields.insert("error".into(), json!({"code": "server_error", "message": message}));
        }
        self.write(out, "response.failed", json!({"response": response}));
        self.done = true;
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_api::ChatStream;
    use crate::unit_tests::test;

    fn events(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        text.split_terminator("\n\n")
            .enumerate()
            .map(|(n, event)| {
                let (name, data) = event.split_once('\n').unwrap();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name.strip_prefix("event: ").unwrap());
                assert_eq!(data["sequence_number"], n, "numbered in order");
                data
            })
            .collect()
    }

    fn chat_stream(done: bool) -> Vec<u8> {
        let chunks = [
            json!({"id": "c1", "model": "claude-x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content_blocks": [{"index": 0, "delta": {"thinking": "Use ls."}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content_blocks": [{"index": 0, "delta": {"signature": "sig"}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Running "}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": "ls."}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "shell", "arguments": "{\"c\":"}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4}}),
        ];
        let mut sse: Vec<u8> = chunks.iter().flat_map(|c| format!("data: {c}\n\n").into_bytes()).collect();
        if done {
            sse.extend_from_slice(b"data: [DONE]\n\n");
        }
        sse
    }

    fn run(sse: &[u8], piece: usize) -> Vec<u8> {
        let request = json!({"model": "m", "input": "list files", "tools": []});
        let echo = Echo { id: "resp_9", created_at: 3, request: request.as_object().unwrap() };
        let mut stream = ChatStream::new(ResponsesEvents::new(&echo));
        let mut out = Vec::new();
        for chunk in sse.chunks(piece) {
            stream.push(chunk, &mut out);
        }
        stream.finish(&mut out);
        assert!(stream.events().is_done());
        out
    }

    #[test]
    fn chunks_become_the_responses_event_sequence_in_any_pieces() {
        let sse = chat_stream(true);
        let whole = run(&sse, sse.len());
        let got = events(&whole);
        let types: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        assert_eq!(got[0]["response"]["status"], "in_progress");
        // Announced empty: their parts come in events of their own.
        assert_eq!(got[2]["item"], json!({"type": "reasoning", "id": "rs_9_0", "summary": []}));
        assert_eq!(
            got[8]["item"],
            json!({"type": "message", "id": "msg_9_1", "status": "in_progress", "role": "assistant", "content": []})
        );
        assert_eq!(
            got[7]["item"],
            json!({"type": "reasoning", "id": "rs_9_0", "summary": [{"type": "summary_text", "text": "Use ls."}], "encrypted_content": crate::client_api::responses::seal("Use ls.", "sig")})
        );
        assert_eq!(got[12]["text"], "Running ls.");
        assert_eq!(
            got[15]["item"],
            json!({"type": "function_call", "id": "fc_9_2", "status": "in_progress", "call_id": "call_1", "name": "shell", "arguments": ""})
        );
        assert_eq!((&got[18]["name"], &got[18]["arguments"]), (&json!("shell"), &json!("{\"c\":1}")));
        let response = &got[20]["response"];
        assert_eq!(
            (&response["status"], &response["model"], &response["id"]),
            (&json!("completed"), &json!("claude-x"), &json!("resp_9"))
        );
        assert_eq!(response["output"].as_array().unwrap().len(), 3);
        assert_eq!(response["usage"]["total_tokens"], 15);
        for piece in 1..=3 {
            assert_eq!(run(&sse, piece), whole, "pieces of {piece} bytes");
        }
    }

    #[test]
    fn a_cut_stream_fails() {
        let got = events(&run(&chat_stream(false), 2));
        let last = got.last().unwrap();
        assert_eq!((&last["type"], &last["response"]["status"]), (&json!("response.failed"), &json!("failed")));
        assert!(got.iter().all(|e| e["type"] != "response.completed"));
        let failed = events(&run(b"data: {\"error\": {\"message\": \"boom\"}}\n\n", 3));
        let types: Vec<&str> = failed.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["response.created", "response.in_progress", "response.failed"]);
        assert_eq!(failed[2]["response"]["error"]["message"], "boom");
    }

    #[test]
    fn a_stream_cut_at_the_token_limit_is_incomplete_and_so_is_its_last_item() {
        let chunks = [
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Once upon"}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        ];
        let mut sse: Vec<u8> = chunks.iter().flat_map(|c| format!("data: {c}\n\n").into_bytes()).collect();
        sse.extend_from_slice(b"data: [DONE]\n\n");
        let got = events(&run(&sse, 2));
        let done = got.iter().find(|e| e["type"] == "response.output_item.done").unwrap();
        assert_eq!(done["item"]["status"], "incomplete");
        let last = got.last().unwrap();
        assert_eq!((&last["type"], &last["response"]["status"]), (&json!("response.incomplete"), &json!("incomplete")));
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    }
}
