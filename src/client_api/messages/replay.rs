//! A Messages stream and the `message` it streams, both ways: a whole stream assembled into
//! its message (what the cache stores and the output checks read), and a message written again
//! as the event sequence Anthropic streams (a cache hit for a request that asks for a stream).

use crate::providers::anthropic::write_event;
use crate::stream::Event;
use serde_json::{json, Map, Value};

/// The message a whole Messages stream streamed: `message_start`'s message with every content
/// block as its deltas built it and `message_delta`'s stop reason and usage. None for a stream
/// that did not reach `message_stop`, that reported an error, or whose pieces do not fit.
pub(crate) fn assemble(events: &[Event]) -> Option<Value> {
    let mut message: Option<Map<String, Value>> = None;
    let mut blocks: Vec<Value> = Vec::new();
    // A tool call's input arrives as pieces of JSON text, one string per block.
    let mut inputs: Vec<String> = Vec::new();
    for event in events {
        let data: Value = serde_json::from_str(&event.data).ok()?;
        match data.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => message = Some(data.get("message")?.as_object()?.clone()),
            "content_block_start" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                if index != blocks.len() {
                    return None;
                }
                blocks.push(data.get("content_block")?.clone());
                inputs.push(String::new());
            }
            "content_block_delta" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                let block = blocks.get_mut(index)?.as_object_mut()?;
                let delta = data.get("delta")?;
                match delta.get("type").and_then(Value::as_str).unwrap_or_default() {
                    "text_delta" => append(block, "text", delta.get("text")?.as_str()?),
                    "thinking_delta" => append(block, "thinking", delta.get("thinking")?.as_str()?),
                    "signature_delta" => append(block, "signature", delta.get("signature")?.as_str()?),
                    "input_json_delta" => inputs.get_mut(index)?.push_str(delta.get("partial_json")?.as_str()?),
                    "citations_delta" => {
                        let citations = block.entry("citations").or_insert_with(|| json!([]));
                        citations.as_array_mut()?.push(delta.get("citation")?.clone());
                    }
                    _ => return None,
                }
            }
            "content_block_stop" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                let input = inputs.get(index)?;
                if !input.is_empty() {
                    let parsed: Value = serde_json::from_str(input).ok()?;
                    blocks.get_mut(index)?.as_object_mut()?.insert("input".into(), parsed);
                }
            }
            "message_delta" => {
                let message = message.as_mut()?;
                for (name, value) in data.get("delta").and_then(Value::as_object).into_iter().flatten() {
                    message.insert(name.clone(), value.clone());
                }
                if let Some(Value::Object(told)) = data.get("usage") {
                    let usage = message.entry("usage").or_insert_with(|| json!({}));
                    for (name, value) in told.iter().filter(|(_, value)| !value.is_null()) {
                        usage.as_object_mut()?.insert(name.clone(), value.clone());
                    }
                }
            }
            "message_stop" => {
                let mut message = message?;
                message.insert("content".into(), Value::Array(blocks));
                return Some(Value::Object(message));
            }
            "error" => return None,
            _ => {}
        }
    }
    None
}

fn append(block: &mut Map<String, Value>, field: &str, piece: &str) {
    let held = block.entry(field).or_insert_with(|| Value::String(String::new()));
    if let Value::String(text) = held {
        text.push_str(piece);
    }
}

/// `message` as the event sequence Anthropic streams it in: `message_start` (the message
/// without content, its usage with no output yet), each block's start, one delta of each of its
/// parts and stop, `message_delta` with the stop reason and the whole usage, `message_stop`.
/// None when `message` is not a Messages answer.
pub(crate) fn replay(message: &Value) -> Option<Vec<u8>> {
    let fields = message.as_object().filter(|m| m.get("type").and_then(Value::as_str) == Some("message"))?;
    let mut out = Vec::new();
    let mut started = fields.clone();
    started.insert("content".into(), json!([]));
    started.insert("stop_reason".into(), Value::Null);
    started.insert("stop_sequence".into(), Value::Null);
    let usage = fields.get("usage").cloned().unwrap_or_else(|| json!({}));
    let mut usage_so_far = usage.clone();
    if let Some(told) = usage_so_far.as_object_mut() {
        told.insert("output_tokens".into(), 0.into());
    }
    started.insert("usage".into(), usage_so_far);
    write(&mut out, "message_start", json!({"type": "message_start", "message": started}));
    for (index, block) in fields.get("content")?.as_array()?.iter().enumerate() {
        replay_block(&mut out, index, block)?;
    }
    let delta = json!({"stop_reason": fields.get("stop_reason"), "stop_sequence": fields.get("stop_sequence")});
    write(&mut out, "message_delta", json!({"type": "message_delta", "delta": delta, "usage": usage}));
    write(&mut out, "message_stop", json!({"type": "message_stop"}));
    Some(out)
}

/// One content block: started without what its deltas carry, then those deltas, then stopped.
fn replay_block(out: &mut Vec<u8>, index: usize, block: &Value) -> Option<()> {
    let mut start = block.as_object()?.clone();
    let mut deltas = Vec::new();
    match block.get("type").and_then(Value::as_str).unwrap_or_default() {
        "text" => {
            start.insert("text".into(), "".into());
            deltas.push(json!({"type": "text_delta", "text": block.get("text")?.as_str()?}));
            if let Some(citations) = start.remove("citations").as_ref().and_then(Value::as_array) {
                start.insert("citations".into(), json!([]));
                deltas.extend(citations.iter().map(|c| json!({"type": "citations_delta", "citation": c})));
            }
        }
        "thinking" => {
            start.insert("thinking".into(), "".into());
            start.insert("signature".into(), "".into());
            deltas.push(json!({"type": "thinking_delta", "thinking": block.get("thinking")?.as_str()?}));
            if let Some(signature) = block.get("signature").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                deltas.push(json!({"type": "signature_delta", "signature": signature}));
            }
        }
        "tool_use" | "server_tool_use" => {
            start.insert("input".into(), json!({}));
            let input = block.get("input").map_or_else(|| "{}".to_string(), Value::to_string);
            deltas.push(json!({"type": "input_json_delta", "partial_json": input}));
        }
        // Blocks without deltas (redacted thinking, tool results of server tools) come whole.
        _ => {}
    }
    write(out, "content_block_start", json!({"type": "content_block_start", "index": index, "content_block": start}));
    for delta in deltas {
        write(out, "content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }
    write(out, "content_block_stop", json!({"type": "content_block_stop", "index": index}));
    Some(())
}

fn write(out: &mut Vec<u8>, event: &str, data: Value) {
    write_event(out, event, data.to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::sse::SseParser;
    use crate::unit_tests::test;

    fn events(stream: &[u8]) -> Vec<Event> {
        let mut parser = SseParser::new();
        let mut events = parser.push(stream);
        events.extend(parser.finish());
        events
    }

    fn message() -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-1",
               "content": [
                   {"type": "thinking", "thinking": "Read it first.", "signature": "sig-1"},
                   {"type": "text", "text": "I'll read it."},
                   {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
                   {"type": "redacted_thinking", "data": "opaque"}],
               "stop_reason": "tool_use", "stop_sequence": null,
               "usage": {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 2}})
    }

    #[test]
    fn a_message_replayed_as_a_stream_assembles_into_the_same_message() {
        let stream = replay(&message()).unwrap();
        let events = events(&stream);
        let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap_or_default()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        let start: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(start["message"]["content"], json!([]));
        assert_eq!(start["message"]["usage"]["input_tokens"], 11);
        assert_eq!(start["message"]["usage"]["output_tokens"], 0);
        assert_eq!(assemble(&events), Some(message()));
    }

    #[test]
    fn a_stream_cut_anywhere_or_ended_by_an_error_is_no_message() {
        let stream = replay(&message()).unwrap();
        let end = stream.windows(12).position(|w| w == b"message_stop").unwrap();
        assert_eq!(assemble(&events(&stream[..end])), None);
        let mut failed = stream[..end].to_vec();
        failed.extend_from_slice(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
        );
        assert_eq!(assemble(&events(&failed)), None);
        let bad_input = String::from_utf8(stream.clone()).unwrap().replace(r#"{\"path\":\"a.txt\"}"#, r#"{\"path\""#);
        assert_eq!(assemble(&events(bad_input.as_bytes())), None, "a tool input that is not JSON");
    }

    #[test]
    fn only_a_message_is_replayed() {
        assert_eq!(replay(&json!({"type": "error"})), None);
        assert_eq!(replay(&json!({"type": "message"})), None, "no content");
    }
}
