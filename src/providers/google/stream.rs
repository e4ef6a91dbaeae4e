//! Gemini's stream (`streamGenerateContent?alt=sse`: each `data:` a `GenerateContentResponse`
//! with the next piece of each candidate) as OpenAI `chat.completion.chunk`s.

use super::{finish_reason, tool_call, usage_of};
use crate::providers::chunks::ChunkWriter;
use crate::providers::{error_kind_for_status, str_field, ResponseContext, Usage};
use crate::stream::{Converter, Event};
use hashbrown::{HashMap, HashSet};
use serde_json::{json, Value};

/// Gemini's responses in, OpenAI's chunks out.
pub(crate) struct GeminiEvents {
    provider: &'static str,
    /// Its id and model come from the responses (`responseId`, `modelVersion`).
    chunks: ChunkWriter,
    /// The tool calls sent so far of each candidate seen (its role chunk went out).
    candidates: HashMap<u64, usize>,
    /// The candidates whose finish reason arrived: the stream is complete once every one has.
    finished: HashSet<u64>,
    /// The latest counts (each response repeats the totals so far).
    usage: Usage,
    /// The client stream is over (`[DONE]` or an error was sent).
    done: bool,
}

impl GeminiEvents {
    /// `provider` names the provider in the gateway's own stream errors.
    pub(crate) fn new(ctx: ResponseContext, provider: &'static str) -> Self {
        GeminiEvents {
            provider,
            chunks: ChunkWriter::new(ctx, String::new()),
            candidates: HashMap::new(),
            finished: HashSet::new(),
            usage: Usage::default(),
            done: false,
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }

    fn on_candidate(&mut self, candidate: &Value, position: usize, out: &mut Vec<u8>) {
        let index = candidate.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
        if !self.candidates.contains_key(&index) {
            self.candidates.insert(index, 0);
            self.chunks.choice_delta(index, json!({"role": "assistant", "content": ""}), None, out);
        }
        let parts = candidate.get("content").and_then(|c| c.get("parts")).and_then(Value::as_array);
        for part in parts.map(Vec::as_slice).unwrap_or_default() {
            if part.get("functionCall").is_some() {
                let calls = self.candidates.entry(index).or_insert(0);
                let call_index = *calls;
                *calls = call_index.saturating_add(1);
                let mut delta = tool_call(part, call_index);
                if let Value::Object(delta) = &mut delta {
                    delta.insert("index".into(), call_index.into());
                }
                self.chunks.choice_delta(index, json!({"tool_calls": [delta]}), None, out);
            } else if let Some(text) = str_field(Some(part), "text") {
                // Thoughts are not part of OpenAI's answer; empty texts say nothing.
                if part.get("thought") != Some(&Value::Bool(true)) && !text.is_empty() {
                    self.chunks.choice_delta(index, json!({"content": text}), None, out);
                }
            }
        }
        if let Some(reason) = str_field(Some(candidate), "finishReason") {
            let called = self.candidates.get(&index).is_some_and(|calls| *calls > 0);
            self.finished.insert(index);
            self.chunks.choice_delta(index, json!({}), Some(finish_reason(Some(reason), called)), out);
        }
    }
}

impl Converter for GeminiEvents {
    fn provider(&self) -> &'static str {
        self.provider
    }

    fn on_event(&mut self, event: &Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        // An error after the stream started comes as an event of Google's error shape.
        if let Some(error) = data.get("error") {
            let message = str_field(Some(error), "message").unwrap_or("provider stream error");
            let code = error.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok());
            self.end_with_error(message, error_kind_for_status(code.unwrap_or(500)), out);
            return;
        }
        if self.chunks.id.is_empty() {
            if let Some(id) = str_field(Some(&data), "responseId") {
                self.chunks.id = id.to_string();
            }
        }
        if let Some(model) = str_field(Some(&data), "modelVersion") {
            self.chunks.model = model.to_string();
        }
        if let Some(metadata) = data.get("usageMetadata") {
            self.usage = usage_of(Some(metadata));
        }
        let candidates = data.get("candidates").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for (position, candidate) in candidates.iter().enumerate() {
            self.on_candidate(candidate, position, out);
        }
        // A blocked prompt gets no candidate, only the reason.
        let blocked = str_field(data.get("promptFeedback"), "blockReason").is_some();
        if candidates.is_empty() && self.candidates.is_empty() && blocked {
            self.candidates.insert(0, 0);
            self.finished.insert(0);
            self.chunks.choice_delta(0, json!({"role": "assistant", "content": ""}), None, out);
            self.chunks.choice_delta(0, json!({}), Some("content_filter"), out);
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn close(&mut self) {
        self.done = true;
    }

    /// Gemini's stream simply ends after the response that has the finish reason: the usage
    /// chunk (when asked for) and `[DONE]` go then. Before every candidate's finish reason
    /// it was cut short.
    fn finish(&mut self, out: &mut Vec<u8>) {
        let complete = !self.candidates.is_empty() && self.candidates.keys().all(|i| self.finished.contains(i));
        if self.done || !complete {
            return;
        }
        self.chunks.usage(self.usage, out);
        self.end(out);
    }
}
