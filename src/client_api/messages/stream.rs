//! OpenAI `chat.completion.chunk`s (a translated provider's stream, as its translator wrote
//! it) as Anthropic's Messages events, each written when its chunk arrives: `message_start`,
//! then per content block `content_block_start`, its `content_block_delta`s (`text_delta`,
//! `thinking_delta`, `signature_delta`, `input_json_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`. The chunks may be cut anywhere;
//! a stream that ends without `[DONE]`, or with an error chunk, ends with an `error` event and
//! no `message_stop`, so no client takes it for a complete answer.

use super::answer::{stop_reason, usage};
use crate::client_api::{client_call_id, ChatEvents, Told};
use crate::providers::anthropic::{error_type, write_event};
use serde_json::{json, Value};

/// The content block being written, by what feeds it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Block {
    Text,
    /// Fed by `content_blocks` entry `source` (or by `reasoning_content`: `None`).
    Thinking {
        source: Option<u64>,
    },
    /// Fed by the deltas of tool call `call` (chat's index).
    Tool {
        call: u64,
    },
}

/// Chat chunks' events as Messages events (fed by a `client_api::ChatStream`).
pub(crate) struct MessagesEvents {
    /// The client's model, which the message names unless a chunk names the provider's.
    model: String,
    started: bool,
    /// The open block and its index.
    open: Option<(Block, u64)>,
    /// Index of the next block.
    blocks: u64,
    /// Tool calls already given a block: (chat index, block index).
    tools: Vec<(u64, u64)>,
    pub(crate) told: Told,
    done: bool,
}

impl MessagesEvents {
    pub(crate) fn new(model: &str) -> Self {
        MessagesEvents {
            model: model.to_string(),
            started: false,
            open: None,
            blocks: 0,
            tools: Vec::new(),
            told: Told::default(),
            done: false,
        }
    }

    fn on_chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        self.told.read(chunk);
        // The message starts with the first chunk of its choice, which names it: Azure's first
        // chunk (prompt filter results) has no choices and an empty id.
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        self.start(chunk, out);
        if let Some(delta) = choice.get("delta") {
            self.on_delta(delta, out);
        }
    }

    fn start(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": chunk.get("id").and_then(Value::as_str).unwrap_or_default(),
            "type": "message", "role": "assistant", "model": self.told.model.as_ref().unwrap_or(&self.model), "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        write(out, "message_start", json!({"type": "message_start", "message": message}));
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<u8>) {
        for entry in delta.get("content_blocks").and_then(Value::as_array).into_iter().flatten() {
            let source = entry.get("index").and_then(Value::as_u64);
            let block_delta = entry.get("delta");
            for (field, kind) in [("thinking", "thinking_delta"), ("signature", "signature_delta")] {
                if let Some(text) = block_delta.and_then(|d| d.get(field)).and_then(Value::as_str) {
                    let index = self.enter(Block::Thinking { source }, None, out);
                    write_delta(out, index, json!({"type": kind, field: text}));
                }
            }
        }
        if let Some(text) = delta.get("reasoning_content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let index = self.enter(Block::Thinking { source: None }, None, out);
            write_delta(out, index, json!({"type": "thinking_delta", "thinking": text}));
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let index = self.enter(Block::Text, None, out);
            write_delta(out, index, json!({"type": "text_delta", "text": text}));
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let Some(call_index) = call.get("index").and_then(Value::as_u64) else {
                continue;
            };
            let index = match self.tools.iter().find(|(c, _)| *c == call_index) {
                // A later piece of a call whose block another one closed: deltas carry their
                // block's index, so it still lands on its call.
                Some((_, index)) if self.open.map(|(b, _)| b) != Some(Block::Tool { call: call_index }) => *index,
                _ => self.enter(Block::Tool { call: call_index }, Some(call), out),
            };
            let arguments = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default();
            if !arguments.is_empty() {
                write_delta(out, index, json!({"type": "input_json_delta", "partial_json": arguments}));
            }
        }
    }

    /// The index of `block`, opened now (the open one closed) unless it is the open one.
    fn enter(&mut self, block: Block, call: Option<&Value>, out: &mut Vec<u8>) -> u64 {
        if let Some((open, index)) = self.open {
            if open == block {
                return index;
            }
        }
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        let start = match block {
            Block::Text => json!({"type": "text", "text": ""}),
            Block::Thinking { .. } => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Tool { call: call_index } => {
                self.tools.push((call_index, index));
                let field =
                    |pointer: &str| call.and_then(|c| c.pointer(pointer)).and_then(Value::as_str).unwrap_or_default();
                let id = call.map(client_call_id).unwrap_or_default();
                json!({"type": "tool_use", "id": id, "name": field("/function/name"), "input": {}})
            }
        };
        write(
            out,
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        self.open = Some((block, index));
        index
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            write(out, "content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.start(&Value::Null, out);
        self.close(out);
        let delta = json!({"stop_reason": stop_reason(self.told.finish_reason.as_deref()), "stop_sequence": null});
        let usage = usage(self.told.usage.as_ref());
        write(out, "message_delta", json!({"type": "message_delta", "delta": delta, "usage": usage}));
        write(out, "message_stop", json!({"type": "message_stop"}));
        self.done = true;
    }
}

impl ChatEvents for MessagesEvents {
    fn on_chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        self.on_chunk(chunk, out);
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.end(out);
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        let error = json!({"type": "error", "error": {"type": error_type(502), "message": message}});
        write(out, "error", error);
        self.done = true;
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

fn write(out: &mut Vec<u8>, event: &str, data: Value) {
    write_event(out, event, data.to_string().as_bytes());
}

fn write_delta(out: &mut Vec<u8>, index: u64, delta: Value) {
    write(out, "content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_api::ChatStream;
    use crate::unit_tests::test;

    /// (event, data) of a Messages stream.
    fn events(out: &[u8]) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(out).unwrap();
        text.split_terminator("\n\n")
            .map(|event| {
                let (name, data) = event.split_once('\n').unwrap();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name.strip_prefix("event: ").unwrap(), "the data names its event");
                (name.strip_prefix("event: ").unwrap().to_string(), data)
            })
            .collect()
    }

    fn chat_stream() -> Vec<u8> {
        let chunks = [
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content_blocks": [{"index": 0, "delta": {"thinking": "Plan: "}}]}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content_blocks": [{"index": 0, "delta": {"signature": "sig"}}]}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": "Héllo"}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}]}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"p\":"}}]}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "c1", "model": "gpt-4o", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 7}}),
        ];
        let mut sse: Vec<u8> = chunks.iter().flat_map(|c| format!("data: {c}\n\n").into_bytes()).collect();
        sse.extend_from_slice(b"data: [DONE]\n\n");
        sse
    }

    #[test]
    fn chunks_become_messages_events_in_any_pieces() {
        let sse = chat_stream();
        let mut whole = Vec::new();
        let mut stream = ChatStream::new(MessagesEvents::new("asked"));
        stream.push(&sse, &mut whole);
        stream.finish(&mut whole);
        let got = events(&whole);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[0].1["message"]["model"], "gpt-4o");
        assert_eq!(got[2].1["delta"], json!({"type": "thinking_delta", "thinking": "Plan: "}));
        assert_eq!(got[3].1["delta"], json!({"type": "signature_delta", "signature": "sig"}));
        assert_eq!(
            (&got[6].1["index"], &got[6].1["delta"]),
            (&json!(1), &json!({"type": "text_delta", "text": "Héllo"}))
        );
        assert_eq!(got[8].1["content_block"], json!({"type": "tool_use", "id": "call_1", "name": "read", "input": {}}));
        assert_eq!(got[10].1["delta"], json!({"type": "input_json_delta", "partial_json": "1}"}));
        assert_eq!(
            got[12].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})
        );
        for size in 1..=3 {
            let mut pieces = Vec::new();
            let mut stream = ChatStream::new(MessagesEvents::new("asked"));
            for piece in sse.chunks(size) {
                stream.push(piece, &mut pieces);
            }
            stream.finish(&mut pieces);
            assert_eq!(pieces, whole, "pieces of {size} bytes");
        }
    }

    #[test]
    fn a_cut_or_failed_stream_ends_with_an_error_event() {
        let sse = chat_stream();
        let cut = &sse[..sse.len() - b"data: [DONE]\n\n".len()];
        let mut out = Vec::new();
        let mut stream = ChatStream::new(MessagesEvents::new("m"));
        stream.push(cut, &mut out);
        stream.finish(&mut out);
        let got = events(&out);
        assert_eq!(got.last().unwrap().0, "error");
        assert!(got.iter().all(|(name, _)| name != "message_stop"));

        let mut out = Vec::new();
        let mut stream = ChatStream::new(MessagesEvents::new("m"));
        stream.push(b"data: {\"error\": {\"message\": \"overloaded\", \"type\": \"api_error\"}}\n\n", &mut out);
        stream.push(b"data: [DONE]\n\n", &mut out);
        stream.finish(&mut out);
        assert_eq!(
            events(&out),
            [("error".to_string(), json!({"type": "error", "error": {"type": "api_error", "message": "overloaded"}}))]
        );
    }

    #[test]
    fn the_message_starts_with_the_first_chunk_of_its_choice() {
        // Azure's first chunk: prompt filter results, no choices, no id.
        let filter = json!({"choices": [], "created": 0, "id": "", "model": "", "prompt_filter_results": []});
        let mut out = Vec::new();
        let mut stream = ChatStream::new(MessagesEvents::new("asked"));
        stream.push(format!("data: {filter}\n\n").as_bytes(), &mut out);
        assert!(out.is_empty());
        stream.push(&chat_stream(), &mut out);
        stream.finish(&mut out);
        let got = events(&out);
        assert_eq!((&got[0].1["message"]["id"], &got[0].1["message"]["model"]), (&json!("c1"), &json!("gpt-4o")));
    }

    #[test]
    fn an_empty_answer_is_still_a_whole_message() {
        let mut out = Vec::new();
        let mut stream = ChatStream::new(MessagesEvents::new("m"));
        stream.push(b"data: [DONE]\n\n", &mut out);
        stream.finish(&mut out);
        let names: Vec<String> = events(&out).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["message_start", "message_delta", "message_stop"]);
        assert!(stream.events().is_done());
    }
}
