//! A cached completion in both of its forms: a stored `chat.completion` / `text_completion`
//! replayed as the SSE stream OpenAI would have sent, and a streamed answer assembled back
//! into the complete object the cache stores.

use crate::request::endpoint::Endpoint;
use crate::stream::sse::{write_data, SseParser};
use crate::stream::Event;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Top-level fields OpenAI repeats on every chunk of a stream.
const CHUNK_HEADER_FIELDS: &[&str] = &["id", "created", "model", "system_fingerprint", "service_tier"];

/// The `object` of a complete answer and of its stream chunks; None for endpoints that do
/// not stream.
pub(crate) fn object_names(endpoint: Endpoint) -> Option<(&'static str, &'static str)> {
    match endpoint {
        Endpoint::ChatCompletions => Some(("chat.completion", "chat.completion.chunk")),
        Endpoint::Completions => Some(("text_completion", "text_completion")),
        _ => None,
    }
}

/// A choice's `index`, or its position when it has none (None when it is not a number).
fn choice_index(choice: &Value, position: usize) -> Option<u64> {
    match choice.get("index") {
        None => u64::try_from(position).ok(),
        Some(index) => index.as_u64(),
    }
}

// ---------------------------------------------------------------------------------------------
// Replay: complete answer -> OpenAI SSE

/// The SSE body OpenAI streams for `completion`, a stored complete answer of `endpoint`
/// (`chat.completion` or `text_completion`), ending with `data: [DONE]`. With
/// `include_usage` the stored usage comes last, in a chunk without choices. None when the
/// bytes are not such an answer: the caller treats the entry as a miss.
pub(crate) fn replay_sse(endpoint: Endpoint, completion: &[u8], include_usage: bool) -> Option<Vec<u8>> {
    let (object, chunk_object) = object_names(endpoint)?;
    let Ok(Value::Object(stored)) = serde_json::from_slice::<Value>(completion) else {
        return None;
    };
    if stored.get("object").and_then(Value::as_str) != Some(object) {
        return None;
    }
    let mut header = Map::new();
    for field in CHUNK_HEADER_FIELDS {
        if let Some(value) = stored.get(*field) {
            header.insert(field.to_string(), value.clone());
        }
    }
    header.insert("object".into(), chunk_object.into());
    let mut replay = Replay { header, include_usage, out: Vec::new() };

    for (position, choice) in stored.get("choices")?.as_array()?.iter().enumerate() {
        let index = choice_index(choice, position)?;
        match endpoint {
            Endpoint::ChatCompletions => replay.chat_choice(choice, index)?,
            _ => replay.text_choice(choice, index)?,
        }
    }
    if include_usage {
        if let Some(usage) = stored.get("usage").filter(|usage| !usage.is_null()) {
            replay.chunk(json!([]), usage.clone());
        }
    }
    write_data(&mut replay.out, b"[DONE]");
    Some(replay.out)
}

struct Replay {
    /// The fields every chunk carries besides `choices` and `usage`.
    header: Map<String, Value>,
    include_usage: bool,
    out: Vec<u8>,
}

impl Replay {
    fn chunk(&mut self, choices: Value, usage: Value) {
        let mut chunk = self.header.clone();
        chunk.insert("choices".into(), choices);
        // With include_usage OpenAI sends `"usage": null` on every chunk but the last.
        if self.include_usage {
            chunk.insert("usage".into(), usage);
        }
        write_data(&mut self.out, Value::Object(chunk).to_string().as_bytes());
    }

    fn chat_delta(&mut self, index: u64, delta: Value, logprobs: Value, finish_reason: Value) {
        let choice = json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason});
        self.chunk(json!([choice]), Value::Null);
    }

    /// The role chunk (which also carries the message's other fields, e.g. `refusal` or
    /// `reasoning_content`, so nothing stored is lost), the content with the logprobs, one
    /// chunk per tool call, and the finish chunk.
    fn chat_choice(&mut self, choice: &Value, index: u64) -> Option<()> {
        let message = choice.get("message")?.as_object()?;
        let content = match message.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(text)) => text.as_str(),
            Some(_) => return None,
        };
        let tool_calls = match message.get("tool_calls") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(calls)) => calls.as_slice(),
            Some(_) => return None,
        };

        let mut first = Map::new();
        let role = message.get("role").filter(|role| role.is_string());
        first.insert("role".into(), role.cloned().unwrap_or_else(|| "assistant".into()));
        first.insert("content".into(), "".into());
        for (field, value) in message {
            if !matches!(field.as_str(), "role" | "content" | "tool_calls") {
                first.insert(field.clone(), value.clone());
            }
        }
        self.chat_delta(index, Value::Object(first), Value::Null, Value::Null);

        let logprobs = choice.get("logprobs").cloned().unwrap_or(Value::Null);
        if !content.is_empty() || !logprobs.is_null() {
            self.chat_delta(index, json!({"content": content}), logprobs, Value::Null);
        }
        for (call_index, call) in tool_calls.iter().enumerate() {
            let mut call = call.as_object()?.clone();
            call.insert("index".into(), call_index.into());
            self.chat_delta(index, json!({"tool_calls": [call]}), Value::Null, Value::Null);
        }
        let finish_reason = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        self.chat_delta(index, json!({}), Value::Null, finish_reason);
        Some(())
    }

    /// The text with its logprobs, then an empty text with the finish reason.
    fn text_choice(&mut self, choice: &Value, index: u64) -> Option<()> {
        let text = choice.get("text")?.as_str()?;
        let logprobs = choice.get("logprobs").cloned().unwrap_or(Value::Null);
        let finish_reason = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        let pieces = [(text, logprobs, Value::Null), ("", Value::Null, finish_reason)];
        for (text, logprobs, finish_reason) in pieces {
            let choice = json!({"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason});
            self.chunk(json!([choice]), Value::Null);
        }
        Some(())
    }
}

// ---------------------------------------------------------------------------------------------
// Assembly: OpenAI SSE -> complete answer

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Streaming,
    /// `data: [DONE]` arrived; what follows is ignored.
    Done,
    /// The answer cannot be stored (error, bad chunk, overflow, too large): input is dropped.
    Failed,
}

/// What the chunks of one choice said so far.
#[derive(Debug, Default)]
struct ChoiceParts {
    role: Option<Value>,
    /// Delta fields (chat) or `text` (completions), appended chunk after chunk.
    fields: Map<String, Value>,
    logprobs: Value,
    finish_reason: Option<Value>,
}

/// Rebuilds the complete answer of a stream the client received, so that a streamed answer
/// can be cached like a non-streamed one. Fed the OpenAI SSE bytes in chunks that may end
/// anywhere; `finish` gives the answer only when the stream completed normally.
#[derive(Debug)]
pub(crate) struct StreamAssembler {
    endpoint: Endpoint,
    parser: SseParser,
    state: State,
    max_bytes: usize,
    /// Roughly the bytes the assembled answer has grown to (see `approximate_size`).
    assembled_bytes: usize,
    /// The first non-null value of each `CHUNK_HEADER_FIELDS` field.
    header: Map<String, Value>,
    usage: Option<Value>,
    choices: BTreeMap<u64, ChoiceParts>,
}

impl StreamAssembler {
    /// `max_bytes` bounds the answer: a larger one is not assembled (its memory is freed at
    /// once) and `finish` returns None. Endpoints other than chat and text completions never
    /// assemble.
    pub(crate) fn new(endpoint: Endpoint, max_bytes: usize) -> Self {
        let state = if object_names(endpoint).is_some() { State::Streaming } else { State::Failed };
        StreamAssembler {
            endpoint,
            parser: SseParser::new(),
            state,
            max_bytes,
            assembled_bytes: 0,
            header: Map::new(),
            usage: None,
            choices: BTreeMap::new(),
        }
    }

    /// Feeds the next bytes of the stream.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.state != State::Streaming {
            return;
        }
        for event in self.parser.push(chunk) {
            self.on_event(event);
        }
        self.fail_if_overflowed();
    }

    /// `data: [DONE]` arrived: the stream is complete for OpenAI clients, which may send
    /// their next request before the connection's end reaches the gateway.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The stream's `id`, `created`, `model` (and the other chunk header fields) seen so far.
    pub(crate) fn header(&self) -> &Map<String, Value> {
        &self.header
    }

    /// The complete answer as JSON bytes (`chat.completion` or `text_completion`), or None
    /// unless `[DONE]` arrived after valid chunks only, with no error, every choice finished,
    /// within `max_bytes`. An incomplete answer must never be stored.
    pub(crate) fn finish(mut self) -> Option<Vec<u8>> {
        if self.state == State::Streaming {
            for event in self.parser.finish() {
                self.on_event(event);
            }
            self.fail_if_overflowed();
        }
        if self.state != State::Done || self.choices.is_empty() {
            return None;
        }
        let (object, _) = object_names(self.endpoint)?;
        let mut answer = std::mem::take(&mut self.header);
        answer.insert("object".into(), object.into());
        let mut choices = Vec::with_capacity(self.choices.len());
        for (index, parts) in std::mem::take(&mut self.choices) {
            let finish_reason = parts.finish_reason?;
            let mut choice = match self.endpoint {
                Endpoint::ChatCompletions => chat_choice(parts.role, parts.fields),
                _ => text_choice(parts.fields),
            };
            choice.insert("index".into(), index.into());
            choice.insert("logprobs".into(), parts.logprobs);
            choice.insert("finish_reason".into(), finish_reason);
            choices.push(Value::Object(choice));
        }
        answer.insert("choices".into(), Value::Array(choices));
        if let Some(usage) = self.usage {
            answer.insert("usage".into(), usage);
        }
        let bytes = Value::Object(answer).to_string().into_bytes();
        (bytes.len() <= self.max_bytes).then_some(bytes)
    }

    /// Stops assembling and frees what was buffered.
    fn fail(&mut self) {
        self.state = State::Failed;
        self.parser = SseParser::new();
        self.header = Map::new();
        self.usage = None;
        self.choices = BTreeMap::new();
    }

    fn fail_if_overflowed(&mut self) {
        if self.state == State::Streaming && self.parser.overflowed() {
            self.fail();
        }
    }

    fn on_event(&mut self, event: Event) {
        if self.state != State::Streaming {
            return;
        }
        if event.event.as_deref() == Some("error") {
            self.fail();
            return;
        }
        if event.data.trim() == "[DONE]" {
            self.state = State::Done;
            return;
        }
        let chunk = match serde_json::from_str::<Value>(&event.data) {
            Ok(Value::Object(chunk)) if !chunk.contains_key("error") => chunk,
            _ => {
                self.fail();
                return;
            }
        };
        if self.absorb(chunk).is_none() || self.assembled_bytes > self.max_bytes {
            self.fail();
        }
    }

    /// Adds one chunk to the answer; None when it is not shaped like an OpenAI chunk (its
    /// content could not be kept, so the answer would be wrong).
    fn absorb(&mut self, mut chunk: Map<String, Value>) -> Option<()> {
        for field in CHUNK_HEADER_FIELDS {
            let Some(value) = chunk.remove(*field) else {
                continue;
            };
            if self.header.get(*field).is_none_or(Value::is_null) {
                self.header.insert(field.to_string(), value);
            }
        }
        if let Some(usage) = chunk.remove("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(usage);
        }
        let choices = match chunk.remove("choices") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(choices)) => choices,
            Some(_) => return None,
        };
        for (position, choice) in choices.into_iter().enumerate() {
            let index = choice_index(&choice, position)?;
            let Value::Object(mut choice) = choice else {
                return None;
            };
            let parts = self.choices.entry(index).or_default();
            let pieces = match self.endpoint {
                Endpoint::ChatCompletions => match choice.remove("delta") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(delta)) => delta,
                    Some(_) => return None,
                },
                _ => choice.remove("text").map(|text| Map::from_iter([("text".to_string(), text)])).unwrap_or_default(),
            };
            for (field, piece) in pieces {
                // Set, not appended; some servers repeat it, or send null, on later chunks.
                if field == "role" {
                    if piece.is_string() {
                        parts.role = Some(piece);
                    }
                    continue;
                }
                self.assembled_bytes = self.assembled_bytes.saturating_add(approximate_size(&piece));
                append(parts.fields.entry(field).or_insert(Value::Null), piece);
            }
            if let Some(logprobs) = choice.remove("logprobs") {
                self.assembled_bytes = self.assembled_bytes.saturating_add(approximate_size(&logprobs));
                append(&mut parts.logprobs, logprobs);
            }
            if let Some(reason) = choice.remove("finish_reason").filter(|reason| !reason.is_null()) {
                parts.finish_reason = Some(reason);
            }
        }
        Some(())
    }
}

/// The `message` of an assembled chat choice. As in OpenAI's answers, content is null when
/// the model only called tools or refused.
fn chat_choice(role: Option<Value>, mut fields: Map<String, Value>) -> Map<String, Value> {
    let tool_calls = match fields.remove("tool_calls") {
        Some(Value::Array(mut calls)) if !calls.is_empty() => {
            calls.sort_by_key(|call| call.get("index").and_then(Value::as_u64));
            for call in &mut calls {
                if let Value::Object(call) = call {
                    call.remove("index");
                }
            }
            Some(Value::Array(calls))
        }
        _ => None,
    };
    let refused = fields.get("refusal").is_some_and(Value::is_string);
    let content = match fields.remove("content") {
        Some(content) if !content.is_null() && content.as_str() != Some("") => content,
        _ if tool_calls.is_some() || refused => Value::Null,
        _ => Value::String(String::new()),
    };
    let mut message = fields;
    message.insert("role".into(), role.unwrap_or_else(|| "assistant".into()));
    message.insert("content".into(), content);
    if let Some(tool_calls) = tool_calls {
        message.insert("tool_calls".into(), tool_calls);
    }
    let mut choice = Map::new();
    choice.insert("message".into(), Value::Object(message));
    choice
}

fn text_choice(mut fields: Map<String, Value>) -> Map<String, Value> {
    let text = fields.remove("text").filter(Value::is_string).unwrap_or_else(|| "".into());
    Map::from_iter([("text".to_string(), text)])
}

/// Appends a streamed piece to what was assembled so far, the way OpenAI's SDK accumulates
/// deltas: strings concatenate; arrays extend, except that an item with the `index` of an
/// existing one (a tool call, a content block) is appended to it; objects are appended field
/// by field, where `index` and `type` are replaced rather than concatenated; null adds
/// nothing; any other value replaces.
fn append(assembled: &mut Value, piece: Value) {
    match (assembled, piece) {
        (_, Value::Null) => {}
        (Value::String(text), Value::String(more)) => text.push_str(&more),
        (Value::Array(items), Value::Array(more)) => {
            for item in more {
                let index = item.get("index").and_then(Value::as_u64);
                let existing = index.and_then(|index| {
                    items.iter_mut().find(|existing| existing.get("index").and_then(Value::as_u64) == Some(index))
                });
                match existing {
                    Some(existing) => append(existing, item),
                    None => items.push(item),
                }
            }
        }
        (Value::Object(fields), Value::Object(more)) => {
            for (field, value) in more {
                if field == "index" || field == "type" {
                    if !value.is_null() {
                        fields.insert(field, value);
                    }
                } else {
                    append(fields.entry(field).or_insert(Value::Null), value);
                }
            }
        }
        (assembled, piece) => *assembled = piece,
    }
}

/// Roughly the bytes `value` adds to the assembled JSON: its text and keys, and a flat 8 for
/// each number or bool. Null counts nothing, since `append` drops it and every chunk carries
/// `"logprobs": null`. Bounds memory while assembling; `finish` checks the exact size.
fn approximate_size(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(approximate_size).fold(0, usize::saturating_add),
        Value::Object(fields) => fields
            .iter()
            .map(|(field, value)| field.len().saturating_add(approximate_size(value)))
            .fold(0, usize::saturating_add),
        Value::Null => 0,
        Value::Bool(_) | Value::Number(_) => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::testing::{garbage, payloads};
    use crate::unit_tests::test;

    const MAX: usize = 1 << 20;

    fn assemble_chunks(endpoint: Endpoint, chunks: &[&[u8]]) -> Option<Value> {
        let mut assembler = StreamAssembler::new(endpoint, MAX);
        for chunk in chunks {
            assembler.push(chunk);
        }
        assembler.finish().map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    fn assemble(endpoint: Endpoint, stream: &[u8]) -> Option<Value> {
        assemble_chunks(endpoint, &[stream])
    }

    fn replay(endpoint: Endpoint, completion: &Value, include_usage: bool) -> Vec<u8> {
        replay_sse(endpoint, completion.to_string().as_bytes(), include_usage).unwrap()
    }

    fn chat_completion(choices: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000u64,
            "model": "gpt-4o-mini", "system_fingerprint": "fp_1", "choices": choices,
            "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
        })
    }

    fn content_completion() -> Value {
        chat_completion(json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "H\u{e9}llo \u{1f600} world", "refusal": null,
                "annotations": [], "reasoning_content": "Think first."},
            "logprobs": null, "finish_reason": "stop",
        }]))
    }

    fn tool_completion() -> Value {
        chat_completion(json!([{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
            ]},
            "logprobs": null, "finish_reason": "tool_calls",
        }]))
    }

    fn multi_choice_completion() -> Value {
        chat_completion(json!([
            {"index": 0, "message": {"role": "assistant", "content": "one"}, "logprobs": null, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "two, longer"}, "logprobs": null, "finish_reason": "length"},
            {"index": 2, "message": {"role": "assistant", "content": null, "refusal": "I can't."},
                "logprobs": {"content": null, "refusal": [{"token": "I", "logprob": -0.5, "bytes": [73], "top_logprobs": []}]},
                "finish_reason": "stop"},
        ]))
    }

    fn text_completion() -> Value {
        json!({
            "id": "cmpl-1", "object": "text_completion", "created": 1_700_000_000u64, "model": "gpt-3.5-turbo-instruct",
            "choices": [
                {"text": " world", "index": 0, "logprobs": null, "finish_reason": "stop"},
                {"text": " there \u{1f600}", "index": 1,
                    "logprobs": {"tokens": [" there"], "token_logprobs": [-0.1], "top_logprobs": null, "text_offset": [5]},
                    "finish_reason": "length"},
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
        })
    }

    #[test]
    fn chat_round_trips() {
        for stored in [content_completion(), tool_completion(), multi_choice_completion()] {
            for include_usage in [true, false] {
                let assembled =
                    assemble(Endpoint::ChatCompletions, &replay(Endpoint::ChatCompletions, &stored, include_usage))
                        .unwrap();
                let mut expected = stored.clone();
                if !include_usage {
                    expected.as_object_mut().unwrap().remove("usage");
                }
                assert_eq!(assembled, expected, "include_usage {include_usage}");
            }
        }
    }

    #[test]
    fn text_round_trips() {
        let stored = text_completion();
        let assembled = assemble(Endpoint::Completions, &replay(Endpoint::Completions, &stored, true)).unwrap();
        assert_eq!(assembled, stored);
    }

    #[test]
    fn replay_chat_chunks_are_openai_shaped() {
        let out = replay(Endpoint::ChatCompletions, &tool_completion(), false);
        let payloads = payloads(&out);
        let header = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": "gpt-4o-mini", "system_fingerprint": "fp_1"});
        let with_choice = |delta: Value, finish_reason: Value| {
            let mut chunk = header.clone();
            chunk["choices"] = json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]);
            chunk
        };
        assert_eq!(
            payloads,
            vec![
                with_choice(json!({"role": "assistant", "content": ""}), Value::Null),
                with_choice(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
                    Value::Null
                ),
                with_choice(
                    json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                        "function": {"name": "time", "arguments": "{}"}}]}),
                    Value::Null
                ),
                with_choice(json!({}), json!("tool_calls")),
                json!("[DONE]"),
            ]
        );
    }

    #[test]
    fn replay_keeps_extra_message_fields_and_usage_only_when_asked() {
        let with_usage = payloads(&replay(Endpoint::ChatCompletions, &content_completion(), true));
        assert_eq!(with_usage.len(), 5);
        assert_eq!(
            with_usage[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": "", "refusal": null, "annotations": [], "reasoning_content": "Think first."})
        );
        assert_eq!(with_usage[1]["choices"][0]["delta"], json!({"content": "H\u{e9}llo \u{1f600} world"}));
        assert_eq!(with_usage[2]["choices"][0]["finish_reason"], "stop");
        for chunk in &with_usage[..3] {
            assert_eq!(chunk["usage"], Value::Null);
            assert!(chunk.as_object().unwrap().contains_key("usage"));
        }
        assert_eq!(with_usage[3]["choices"], json!([]));
        assert_eq!(with_usage[3]["usage"], content_completion()["usage"]);
        assert_eq!(with_usage[3]["id"], "chatcmpl-1");
        assert_eq!(with_usage[4], "[DONE]");

        let without = payloads(&replay(Endpoint::ChatCompletions, &content_completion(), false));
        assert_eq!(without.len(), 4);
        assert!(without.iter().all(|chunk| chunk.get("usage").is_none()));
        assert_eq!(without[3], "[DONE]");
    }

    #[test]
    fn replay_text_chunks() {
        let payloads = payloads(&replay(Endpoint::Completions, &text_completion(), false));
        assert_eq!(payloads.len(), 5);
        assert_eq!(
            payloads[0],
            json!({"id": "cmpl-1", "object": "text_completion", "created": 1_700_000_000u64, "model": "gpt-3.5-turbo-instruct",
                "choices": [{"text": " world", "index": 0, "logprobs": null, "finish_reason": null}]})
        );
        assert_eq!(
            payloads[1]["choices"],
            json!([{"text": "", "index": 0, "logprobs": null, "finish_reason": "stop"}])
        );
        assert_eq!(payloads[4], "[DONE]");
    }

    #[test]
    fn replay_rejects_what_is_not_a_stored_answer() {
        let chat = content_completion().to_string();
        let text = text_completion().to_string();
        assert!(replay_sse(Endpoint::Completions, chat.as_bytes(), false).is_none());
        assert!(replay_sse(Endpoint::ChatCompletions, text.as_bytes(), false).is_none());
        assert!(replay_sse(Endpoint::Embeddings, chat.as_bytes(), false).is_none());
        let bad: &[&[u8]] = &[
            b"",
            b"not json",
            b"[]",
            b"{\"object\":\"chat.completion\"}",
            b"{\"object\":\"chat.completion\",\"choices\":{}}",
            b"{\"object\":\"chat.completion\",\"choices\":[{\"index\":0}]}",
            b"{\"object\":\"chat.completion\",\"choices\":[{\"index\":-1,\"message\":{}}]}",
            b"{\"object\":\"chat.completion\",\"choices\":[{\"message\":{\"content\":5}}]}",
            b"{\"object\":\"chat.completion\",\"choices\":[{\"message\":{\"tool_calls\":[1]}}]}",
            b"\xff\xfe garbage",
        ];
        for bytes in bad {
            assert!(replay_sse(Endpoint::ChatCompletions, bytes, true).is_none(), "{}", String::from_utf8_lossy(bytes));
        }
        assert!(replay_sse(Endpoint::Completions, b"{\"object\":\"text_completion\",\"choices\":[{}]}", true).is_none());
    }

    /// What OpenAI streams with `stream_options.include_usage` (a tool call in pieces too).
    const OPENAI_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"H\u{e9}l\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \u{1f600}\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"weather\",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000001,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_9\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":7,\"total_tokens\":27}}\n\n",
        "data: [DONE]\n\n",
    );

    fn openai_stream_answer() -> Value {
        json!({
            "id": "chatcmpl-9", "object": "chat.completion", "created": 1_700_000_001u64,
            "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_9",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "H\u{e9}llo \u{1f600}", "refusal": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                ]},
                "logprobs": null, "finish_reason": "tool_calls",
            }],
            "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
        })
    }

    #[test]
    fn realistic_openai_stream_assembles() {
        assert_eq!(assemble(Endpoint::ChatCompletions, OPENAI_STREAM.as_bytes()).unwrap(), openai_stream_answer());
    }

    #[test]
    fn identical_at_every_split_offset_and_byte_by_byte() {
        let replayed = replay(Endpoint::ChatCompletions, &multi_choice_completion(), true);
        for (input, expected) in
            [(OPENAI_STREAM.as_bytes(), openai_stream_answer()), (&replayed[..], multi_choice_completion())]
        {
            for at in 0..=input.len() {
                let (a, b) = input.split_at(at);
                assert_eq!(assemble_chunks(Endpoint::ChatCompletions, &[a, b]).unwrap(), expected, "split at {at}");
            }
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            assert_eq!(assemble_chunks(Endpoint::ChatCompletions, &bytes).unwrap(), expected);
        }
    }

    #[test]
    fn done_without_final_blank_line_still_completes() {
        let stream = OPENAI_STREAM.strip_suffix("\n\n").unwrap();
        assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()).unwrap(), openai_stream_answer());
    }

    #[test]
    fn missing_done_is_not_an_answer() {
        let stream = OPENAI_STREAM.strip_suffix("data: [DONE]\n\n").unwrap();
        assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()), None);
        assert_eq!(assemble(Endpoint::ChatCompletions, b""), None);
        assert_eq!(assemble(Endpoint::ChatCompletions, b"data: [DONE]\n\n"), None);
    }

    #[test]
    fn error_events_are_not_an_answer() {
        // The error arrives before the finish chunk (the seventh event).
        let events: Vec<&str> = OPENAI_STREAM.split_inclusive("\n\n").collect();
        assert!(events[6].contains("\"finish_reason\":\"tool_calls\""));
        for error in [
            "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"api_error\",\"param\":null,\"code\":null}}\n\n",
            "event: error\ndata: {\"message\":\"boom\"}\n\n",
            "data: {\"id\":\"x\",\"choices\":[],\"error\":null}\n\n",
        ] {
            let stream = format!("{}{error}{}", events[..6].concat(), events[6..].concat());
            assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()), None, "{error}");
        }
        // An error after `[DONE]` comes after a complete answer.
        let stream = format!("{OPENAI_STREAM}data: {{\"error\":{{}}}}\n\n");
        assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()).unwrap(), openai_stream_answer());
    }

    #[test]
    fn malformed_chunks_are_not_an_answer() {
        for bad in [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}\n\n",
            "data: 42\n\n",
            "data: {\"choices\":{}}\n\n",
            "data: {\"choices\":[7]}\n\n",
            "data: {\"choices\":[{\"index\":\"0\",\"delta\":{}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":\"x\"}]}\n\n",
        ] {
            let stream = format!("{bad}{OPENAI_STREAM}");
            assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn every_choice_needs_a_finish_reason() {
        let stream = OPENAI_STREAM.replace("\"finish_reason\":\"tool_calls\"", "\"finish_reason\":null");
        assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()), None);
        // A second choice that never finished.
        let unfinished =
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"half\"},\"finish_reason\":null}]}\n\n";
        let stream = format!("{unfinished}{OPENAI_STREAM}");
        assert_eq!(assemble(Endpoint::ChatCompletions, stream.as_bytes()), None);
    }

    #[test]
    fn over_max_bytes_is_not_an_answer() {
        let stored = content_completion();
        let stream = replay(Endpoint::ChatCompletions, &stored, true);
        let size = stored.to_string().len();
        let with_limit = |max_bytes| {
            let mut assembler = StreamAssembler::new(Endpoint::ChatCompletions, max_bytes);
            assembler.push(&stream);
            assembler.finish()
        };
        assert_eq!(with_limit(size).unwrap(), stored.to_string().into_bytes());
        assert_eq!(with_limit(size - 1), None);
        // A long answer stops being assembled while it streams.
        let long = content_completion_with("x".repeat(10_000));
        let mut assembler = StreamAssembler::new(Endpoint::ChatCompletions, 1000);
        assembler.push(&replay(Endpoint::ChatCompletions, &long, false));
        assert_eq!(assembler.state, State::Failed);
        assert!(assembler.choices.is_empty());
        assert_eq!(assembler.finish(), None);
    }

    #[test]
    fn token_by_token_stream_is_measured_by_its_text() {
        // Each chunk says `"logprobs": null` and a one-byte delta; the answer is what counts.
        let mut stream = String::new();
        for _ in 0..2000 {
            stream.push_str("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        }
        stream.push_str("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        let mut assembler = StreamAssembler::new(Endpoint::ChatCompletions, 2200);
        assembler.push(stream.as_bytes());
        let answer: Value = serde_json::from_slice(&assembler.finish().unwrap()).unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "x".repeat(2000));
    }

    fn content_completion_with(content: String) -> Value {
        let mut completion = content_completion();
        completion["choices"][0]["message"]["content"] = content.into();
        completion
    }

    #[test]
    fn parser_overflow_is_not_an_answer() {
        let mut assembler = StreamAssembler::new(Endpoint::ChatCompletions, usize::MAX);
        assembler.push(b"data: ");
        assembler.push(&vec![b'x'; crate::stream::sse::MAX_EVENT_BYTES + 1]);
        assembler.push(b"\n\ndata: [DONE]\n\n");
        assert_eq!(assembler.finish(), None);
    }

    #[test]
    fn openai_text_stream_assembles() {
        let stream = concat!(
            "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1700000002,\"choices\":[{\"text\":\"Hel\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}],\"model\":\"gpt-3.5-turbo-instruct\",\"usage\":null}\n\n",
            "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1700000002,\"choices\":[{\"text\":\"lo\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}],\"model\":\"gpt-3.5-turbo-instruct\",\"usage\":null}\n\n",
            "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1700000002,\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"length\"}],\"model\":\"gpt-3.5-turbo-instruct\",\"usage\":null}\n\n",
            "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1700000002,\"choices\":[],\"model\":\"gpt-3.5-turbo-instruct\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            assemble(Endpoint::Completions, stream.as_bytes()).unwrap(),
            json!({"id": "cmpl-2", "object": "text_completion", "created": 1_700_000_002u64, "model": "gpt-3.5-turbo-instruct",
                "choices": [{"text": "Hello", "index": 0, "logprobs": null, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
        );
    }

    #[test]
    fn streamed_extras_are_accumulated() {
        // The gateway's own Anthropic translation sends thinking as indexed `content_blocks`.
        let stream = concat!(
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content_blocks\":[{\"index\":0,\"delta\":{\"thinking\":\"Let me \"}}]}}]}\n\n",
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content_blocks\":[{\"index\":0,\"delta\":{\"thinking\":\"think.\"}}]}}]}\n\n",
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"reasoning_content\":\"a\"}}]}\n\n",
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"b\",\"content\":\"Hi\"}}]}\n\n",
            "data: {\"id\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let answer = assemble(Endpoint::ChatCompletions, stream.as_bytes()).unwrap();
        assert_eq!(
            answer["choices"][0]["message"],
            json!({"role": "assistant", "content": "Hi", "reasoning_content": "ab",
                "content_blocks": [{"index": 0, "delta": {"thinking": "Let me think."}}]})
        );
        assert!(answer.get("usage").is_none());
    }

    #[test]
    fn other_endpoints_never_assemble() {
        let mut assembler = StreamAssembler::new(Endpoint::Embeddings, MAX);
        assembler.push(OPENAI_STREAM.as_bytes());
        assert_eq!(assembler.finish(), None);
    }

    #[test]
    fn garbage_is_not_an_answer() {
        let bytes = garbage(4096);
        assert!(replay_sse(Endpoint::ChatCompletions, &bytes, true).is_none());
        assert_eq!(assemble(Endpoint::ChatCompletions, &bytes), None);
        let mut with_done = bytes.clone();
        with_done.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        assert_eq!(assemble(Endpoint::ChatCompletions, &with_done), None);
        assert_eq!(assemble(Endpoint::Completions, &with_done), None);
    }
}
