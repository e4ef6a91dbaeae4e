//! Converse's event stream (`converse-stream`) as OpenAI `chat.completion.chunk`s: the binary
//! frames are decoded as they arrive, each event becomes the chunks it stands for.

use super::eventstream::{Decoder, Frame};
use super::{exception_message, finish_reason, invalid_stream, tokens};
use crate::providers::chunks::ChunkWriter;
use crate::providers::{str_field, ResponseContext, Usage};
use crate::stream::{self, sse::write_data};
use hashbrown::HashMap;
use serde_json::{json, Value};

pub(crate) struct EventStream {
    decoder: Decoder,
    chunks: ChunkWriter,
    usage: Usage,
    /// OpenAI tool call index of each Converse `toolUse` content block index.
    tool_blocks: HashMap<u64, usize>,
    /// `messageStop` arrived: the answer is complete (only the usage may follow).
    stopped: bool,
    /// The client stream is over (`[DONE]` or an error event was sent).
    done: bool,
}

impl EventStream {
    /// `id` is the chunks' id (Converse streams carry none).
    pub(crate) fn new(ctx: ResponseContext, id: String) -> Self {
        EventStream {
            decoder: Decoder::new(),
            chunks: ChunkWriter::new(ctx, id),
            usage: Usage::default(),
            tool_blocks: HashMap::new(),
            stopped: false,
            done: false,
        }
    }

    /// Consumes one upstream chunk (which may end anywhere, even mid-frame).
    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let mut frames = Vec::new();
        let decoded = self.decoder.push(chunk, &mut frames);
        for frame in &frames {
            self.on_frame(frame, out);
        }
        // A frame that broke after the stream ended (an exception in the same chunk) is nothing
        // more to tell: the client's stream is over.
        if let (Err(error), false) = (decoded, self.done) {
            self.fail(&invalid_stream(&error), "api_error", out);
        }
    }

    /// The upstream stream ended: a stream cut inside a frame or before `messageStop` is an
    /// error; one that ended without `metadata` still ends the client stream cleanly.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match self.decoder.finish() {
            Ok(()) if self.stopped => self.end(out),
            Ok(()) => self.fail(&stream::cut_short("bedrock"), "api_error", out),
            Err(error) => self.fail(&invalid_stream(&error), "api_error", out),
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }

    fn on_frame(&mut self, frame: &Frame, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let payload: Option<Value> = serde_json::from_slice(&frame.payload).ok();
        match frame.message_type() {
            Some("exception") => {
                let message = exception_message(frame);
                let kind = frame.exception_type().unwrap_or("api_error");
                self.fail(message.as_deref().unwrap_or("provider stream error"), kind, out);
            }
            Some("error") => {
                let message = frame.header(":error-message").unwrap_or("provider stream error");
                self.fail(message, frame.header(":error-code").unwrap_or("api_error"), out);
            }
            _ => {
                if let (Some(event), Some(payload)) = (frame.event_type(), payload) {
                    self.on_event(event, &payload, out);
                }
            }
        }
    }

    fn on_event(&mut self, event: &str, data: &Value, out: &mut Vec<u8>) {
        match event {
            "messageStart" => self.chunks.delta(json!({"role": "assistant", "content": ""}), None, out),
            "contentBlockStart" => self.on_block_start(data, out),
            "contentBlockDelta" => self.on_block_delta(data, out),
            "messageStop" => {
                self.stopped = true;
                let reason = finish_reason(str_field(Some(data), "stopReason"));
                self.chunks.delta(json!({}), Some(reason), out);
            }
            // The last event: it carries the usage.
            "metadata" => {
                self.usage = tokens(data.get("usage"));
                self.chunks.usage(self.usage, out);
                self.end(out);
            }
            // contentBlockStop and future events carry nothing for the client.
            _ => {}
        }
    }

    fn on_block_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        let (Some(index), Some(tool_use)) = (block_index(data), data.get("start").and_then(|s| s.get("toolUse")))
        else {
            return;
        };
        // A repeated start would announce the call twice.
        if self.tool_blocks.contains_key(&index) {
            return;
        }
        let tool_index = self.tool_blocks.len();
        self.tool_blocks.insert(index, tool_index);
        let call = json!({
            "index": tool_index,
            "id": str_field(Some(tool_use), "toolUseId").unwrap_or_default(),
            "type": "function",
            "function": {"name": str_field(Some(tool_use), "name").unwrap_or_default(), "arguments": ""},
        });
        self.chunks.delta(json!({"tool_calls": [call]}), None, out);
    }

    fn on_block_delta(&mut self, data: &Value, out: &mut Vec<u8>) {
        let (Some(index), Some(delta)) = (block_index(data), data.get("delta")) else {
            return;
        };
        if let Some(text) = str_field(Some(delta), "text") {
            self.chunks.delta(json!({"content": text}), None, out);
        } else if let Some(input) = str_field(delta.get("toolUse"), "input") {
            if let Some(tool_index) = self.tool_blocks.get(&index) {
                let call = json!({"index": tool_index, "function": {"arguments": input}});
                self.chunks.delta(json!({"tool_calls": [call]}), None, out);
            }
        } else if let Some(reasoning) = delta.get("reasoningContent") {
            // Reasoning is not part of OpenAI's chunk; it is sent only to clients that accept extras.
            if !self.chunks.ctx.strict_vendor_compliance {
                let block = json!({"index": index, "delta": reasoning_delta(reasoning)});
                self.chunks.delta(json!({"content_blocks": [block]}), None, out);
            }
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        write_data(out, b"[DONE]");
        self.done = true;
    }

    /// OpenAI's in-stream error event; the stream ends without `[DONE]` (the `openai` SDK
    /// then raises, as with OpenAI's own stream errors).
    fn fail(&mut self, message: &str, kind: &str, out: &mut Vec<u8>) {
        stream::write_error(out, message, kind);
        self.done = true;
    }
}

fn block_index(data: &Value) -> Option<u64> {
    data.get("contentBlockIndex").and_then(Value::as_u64)
}

/// Converse's reasoning delta in the names of Anthropic's thinking blocks, as answers have them.
fn reasoning_delta(reasoning: &Value) -> Value {
    match (str_field(Some(reasoning), "text"), str_field(Some(reasoning), "signature")) {
        (Some(text), _) => json!({"thinking": text}),
        (None, Some(signature)) => json!({"signature": signature}),
        (None, None) => reasoning.clone(),
    }
}
