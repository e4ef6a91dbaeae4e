//! Anthropic's stream events as OpenAI `chat.completion.chunk`s. [`EventConverter`] knows only
//! events, so any transport that carries Anthropic's events can use it; [`SseStream`] is
//! the one for server-sent events.

use super::{finish_reason, str_field};
use crate::providers::chunks::ChunkWriter;
use crate::providers::{ResponseContext, Usage};
use crate::stream::{Converter, Event};
use hashbrown::HashMap;
use serde_json::{json, Value};

/// Anthropic's events in, OpenAI's chunks out.
pub(crate) struct EventConverter {
    /// Its id and model come from `message_start`.
    chunks: ChunkWriter,
    /// Told in parts: the prompt's in `message_start`, the output's in `message_delta`.
    usage: Usage,
    /// Each Anthropic `tool_use` content block by its index: its OpenAI tool call.
    tool_blocks: HashMap<u64, ToolBlock>,
    /// The client stream is over (`[DONE]` or an error was sent).
    done: bool,
    /// Who sent the events (Anthropic, or Claude on a cloud), for the errors that name it.
    provider: &'static str,
}

/// A `tool_use` block on its way out as an OpenAI tool call.
struct ToolBlock {
    /// The tool call's index among the answer's.
    index: usize,
    /// Some of its arguments' text was sent (a tool without parameters streams none).
    has_arguments: bool,
}

impl EventConverter {
    pub(crate) fn new(ctx: ResponseContext, provider: &'static str) -> Self {
        EventConverter {
            provider,
            chunks: ChunkWriter::new(ctx, String::new()),
            usage: Usage::default(),
            tool_blocks: HashMap::new(),
            done: false,
        }
    }

    fn handle(&mut self, event: &Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        // The JSON `type` repeats the SSE event name and is always sent.
        let kind = str_field(Some(&data), "type").or(event.event.as_deref()).unwrap_or_default();
        match kind {
            "message_start" => self.on_message_start(&data, out),
            "content_block_start" => self.on_block_start(&data, out),
            "content_block_delta" => self.on_block_delta(&data, out),
            "content_block_stop" => self.on_block_stop(&data, out),
            "message_delta" => {
                self.tell_usage(data.get("usage"));
                let reason = finish_reason(str_field(data.get("delta"), "stop_reason"));
                self.chunks.delta(json!({}), Some(reason), out);
            }
            "message_stop" => {
                self.chunks.usage(self.usage, out);
                self.end(out);
            }
            "error" => {
                let error = data.get("error");
                let message = str_field(error, "message").unwrap_or("provider stream error");
                let kind = str_field(error, "type").unwrap_or("api_error");
                self.end_with_error(message, kind, out);
            }
            // ping and future events carry nothing for the client.
            _ => {}
        }
    }

    fn on_message_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        let message = data.get("message");
        self.chunks.id = str_field(message, "id").unwrap_or_default().to_string();
        if let Some(model) = str_field(message, "model") {
            self.chunks.model = model.to_string();
        }
        self.tell_usage(message.and_then(|m| m.get("usage")));
        self.chunks.delta(json!({"role": "assistant", "content": ""}), None, out);
    }

    fn on_block_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        let block = data.get("content_block");
        let Some(index) = data.get("index").and_then(Value::as_u64) else {
            return;
        };
        // Text and thinking arrive as deltas; a repeated start would announce the call twice.
        if str_field(block, "type") != Some("tool_use") || self.tool_blocks.contains_key(&index) {
            return;
        }
        let tool_index = self.tool_blocks.len();
        self.tool_blocks.insert(index, ToolBlock { index: tool_index, has_arguments: false });
        let call = json!({
            "index": tool_index,
            "id": str_field(block, "id").unwrap_or_default(),
            "type": "function",
            "function": {"name": str_field(block, "name").unwrap_or_default(), "arguments": ""},
        });
        self.chunks.delta(json!({"tool_calls": [call]}), None, out);
    }

    fn on_block_delta(&mut self, data: &Value, out: &mut Vec<u8>) {
        let Some(index) = data.get("index").and_then(Value::as_u64) else {
            return;
        };
        let delta = data.get("delta");
        match str_field(delta, "type") {
            Some("text_delta") => {
                if let Some(text) = str_field(delta, "text") {
                    self.chunks.delta(json!({"content": text}), None, out);
                }
            }
            Some("input_json_delta") => {
                let block = self.tool_blocks.get_mut(&index);
                if let (Some(block), Some(json)) = (block, str_field(delta, "partial_json")) {
                    block.has_arguments |= !json.is_empty();
                    let call = json!({"index": block.index, "function": {"arguments": json}});
                    self.chunks.delta(json!({"tool_calls": [call]}), None, out);
                }
            }
            Some("thinking_delta") => self.emit_block_delta(index, "thinking", str_field(delta, "thinking"), out),
            Some("signature_delta") => self.emit_block_delta(index, "signature", str_field(delta, "signature"), out),
            _ => {}
        }
    }

    /// A tool call whose arguments never came has none: `{}`, as the answer whole says.
    fn on_block_stop(&mut self, data: &Value, out: &mut Vec<u8>) {
        let index = data.get("index").and_then(Value::as_u64);
        let Some(block) = index.and_then(|index| self.tool_blocks.get_mut(&index)) else {
            return;
        };
        if !block.has_arguments {
            block.has_arguments = true;
            let call = json!({"index": block.index, "function": {"arguments": "{}"}});
            self.chunks.delta(json!({"tool_calls": [call]}), None, out);
        }
    }

    /// Thinking is not part of OpenAI's chunk; it is sent only to clients that accept extras.
    fn emit_block_delta(&self, index: u64, field: &str, value: Option<&str>, out: &mut Vec<u8>) {
        if self.chunks.ctx.strict_vendor_compliance {
            return;
        }
        if let Some(value) = value {
            let block = json!({"index": index, "delta": {field: value}});
            self.chunks.delta(json!({"content_blocks": [block]}), None, out);
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }

    fn tell_usage(&mut self, usage: Option<&Value>) {
        if let Some(usage) = usage.and_then(Usage::of_openai) {
            self.usage = self.usage.merged(usage);
        }
    }
}

impl Converter for EventConverter {
    fn provider(&self) -> &'static str {
        self.provider
    }

    fn on_event(&mut self, event: &Event, out: &mut Vec<u8>) {
        self.handle(event, out);
    }

    fn is_done(&self) -> bool {
        self.done
    }

    /// `message_stop` ends the client stream; an upstream that ends before it was cut short.
    fn close(&mut self) {
        self.done = true;
    }
}

/// Anthropic's server-sent event stream.
pub(crate) type SseStream = crate::stream::sse::SseStream<EventConverter>;
