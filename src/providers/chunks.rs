//! OpenAI `chat.completion.chunk`s of one streamed answer, for the translators that convert a
//! provider's stream events.

use super::{usage_json, ResponseContext, Usage};
use crate::stream::sse::write_data;
use serde_json::{json, Map, Value};

pub(crate) struct ChunkWriter {
    pub(crate) ctx: ResponseContext,
    /// The chunks' `id` and `model` (the provider's, once its stream tells them).
    pub(crate) id: String,
    pub(crate) model: String,
}

impl ChunkWriter {
    pub(crate) fn new(ctx: ResponseContext, id: String) -> Self {
        ChunkWriter { model: ctx.model.clone(), ctx, id }
    }

    /// A chunk of the one choice.
    pub(crate) fn delta(&self, delta: Value, finish_reason: Option<&str>, out: &mut Vec<u8>) {
        self.choice_delta(0, delta, finish_reason, out);
    }

    /// A chunk of choice `index`, for providers that stream several.
    pub(crate) fn choice_delta(&self, index: u64, delta: Value, finish_reason: Option<&str>, out: &mut Vec<u8>) {
        let choices = json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]);
        // With include_usage OpenAI sends `"usage": null` on every chunk but the last.
        write_data(out, self.chunk(choices, Value::Null).to_string().as_bytes());
    }

    /// With `stream_options.include_usage`, the last chunk: no choices, the usage.
    pub(crate) fn usage(&self, usage: Usage, out: &mut Vec<u8>) {
        if self.ctx.include_usage {
            let usage = usage_json(usage);
            write_data(out, self.chunk(json!([]), usage).to_string().as_bytes());
        }
    }

    fn chunk(&self, choices: Value, usage: Value) -> Value {
        let mut chunk = Map::new();
        chunk.insert("id".into(), self.id.as_str().into());
        chunk.insert("object".into(), "chat.completion.chunk".into());
        chunk.insert("created".into(), self.ctx.created.into());
        chunk.insert("model".into(), self.model.as_str().into());
        chunk.insert("choices".into(), choices);
        if self.ctx.include_usage {
            chunk.insert("usage".into(), usage);
        }
        Value::Object(chunk)
    }
}
