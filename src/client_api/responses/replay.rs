//! A stored `response` written again as the Responses event sequence (a cache hit for a
//! request that asks for a stream): the same events, in the same order, as a live stream of it.

use super::stream::Numbered;
use serde_json::{json, Value};

/// `response` as the events that stream it: `response.created` and `response.in_progress`
/// (no output yet), each output item added, its parts' events with one delta each, and done,
/// then `response.completed` (or `response.incomplete`) with the whole response. None when
/// `response` is not a finished response.
pub(crate) fn replay(response: &Value) -> Option<Vec<u8>> {
    let fields = response.as_object().filter(|r| r.get("object").and_then(Value::as_str) == Some("response"))?;
    let last = match fields.get("status").and_then(Value::as_str) {
        Some("completed") => "response.completed",
        Some("incomplete") => "response.incomplete",
        _ => return None,
    };
    let (mut out, mut events) = (Vec::new(), Numbered::default());
    let mut running = fields.clone();
    running.insert("status".into(), "in_progress".into());
    running.insert("output".into(), json!([]));
    running.insert("usage".into(), Value::Null);
    events.write(&mut out, "response.created", json!({"response": running}));
    events.write(&mut out, "response.in_progress", json!({"response": running}));
    for (index, item) in fields.get("output")?.as_array()?.iter().enumerate() {
        replay_item(&mut out, &mut events, index, item)?;
    }
    events.write(&mut out, last, json!({"response": response}));
    Some(out)
}

/// One output item: announced without what its part events carry, those events, then done.
fn replay_item(out: &mut Vec<u8>, events: &mut Numbered, index: usize, item: &Value) -> Option<()> {
    let mut added = item.as_object()?.clone();
    let id = item.get("id").cloned().unwrap_or(Value::Null);
    let mut parts = Vec::new();
    match item.get("type").and_then(Value::as_str).unwrap_or_default() {
        "message" => {
            added.insert("status".into(), "in_progress".into());
            added.insert("content".into(), json!([]));
            for (j, part) in item.get("content")?.as_array()?.iter().enumerate() {
                let at = json!({"item_id": id, "output_index": index, "content_index": j});
                parts.extend(content_part_events(at, part)?);
            }
        }
        "function_call" => {
            added.insert("status".into(), "in_progress".into());
            added.insert("arguments".into(), "".into());
            let arguments = item.get("arguments")?.as_str()?;
            let at = json!({"item_id": id, "output_index": index});
            parts.push(("response.function_call_arguments.delta", with(&at, "delta", arguments.into())));
            let mut done = with(&at, "arguments", arguments.into());
            if let (Some(done), Some(name)) = (done.as_object_mut(), item.get("name")) {
                done.insert("name".into(), name.clone());
            }
            parts.push(("response.function_call_arguments.done", done));
        }
        "reasoning" => {
            added.insert("summary".into(), json!([]));
            for (j, summary) in item.get("summary").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let at = json!({"item_id": id, "output_index": index, "summary_index": j});
                let text = summary.get("text").and_then(Value::as_str).unwrap_or_default();
                let empty = json!({"type": "summary_text", "text": ""});
                parts.push(("response.reasoning_summary_part.added", with(&at, "part", empty)));
                parts.push(("response.reasoning_summary_text.delta", with(&at, "delta", text.into())));
                parts.push(("response.reasoning_summary_text.done", with(&at, "text", text.into())));
                parts.push(("response.reasoning_summary_part.done", with(&at, "part", summary.clone())));
            }
        }
        // Items without part events (hosted tools' calls) come whole.
        _ => {}
    }
    events.write(out, "response.output_item.added", json!({"output_index": index, "item": added}));
    for (event, fields) in parts {
        events.write(out, event, fields);
    }
    events.write(out, "response.output_item.done", json!({"output_index": index, "item": item}));
    Some(())
}

/// A message's content part: added empty, its text (or refusal) in one delta, done.
fn content_part_events(at: Value, part: &Value) -> Option<Vec<(&'static str, Value)>> {
    let mut empty = part.as_object()?.clone();
    let mut events = Vec::new();
    match part.get("type").and_then(Value::as_str).unwrap_or_default() {
        "output_text" => {
            let text = part.get("text")?.as_str()?;
            empty.insert("text".into(), "".into());
            empty.insert("annotations".into(), json!([]));
            let mut delta = with(&at, "delta", text.into());
            let mut done = with(&at, "text", text.into());
            for event in [&mut delta, &mut done] {
                if let Some(fields) = event.as_object_mut() {
                    fields.insert("logprobs".into(), json!([]));
                }
            }
            events.push(("response.output_text.delta", delta));
            events.push(("response.output_text.done", done));
        }
        "refusal" => {
            let refusal = part.get("refusal")?.as_str()?;
            empty.insert("refusal".into(), "".into());
            events.push(("response.refusal.delta", with(&at, "delta", refusal.into())));
            events.push(("response.refusal.done", with(&at, "refusal", refusal.into())));
        }
        _ => {}
    }
    events.insert(0, ("response.content_part.added", with(&at, "part", empty.into())));
    events.push(("response.content_part.done", with(&at, "part", part.clone())));
    Some(events)
}

/// `at` (where an event applies) with one more field.
fn with(at: &Value, name: &str, value: Value) -> Value {
    let mut fields = at.as_object().cloned().unwrap_or_default();
    fields.insert(name.into(), value);
    Value::Object(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_api::stream_answer;
    use crate::request::endpoint::ClientApi;
    use crate::stream::sse::SseParser;
    use crate::unit_tests::test;

    fn response() -> Value {
        json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "gpt-mock",
               "output": [
                   {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use ls."}]},
                   {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Listing.", "annotations": [], "logprobs": []}]},
                   {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_1",
                    "name": "shell", "arguments": "{\"cmd\":\"ls\"}"}],
               "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}})
    }

    #[test]
    fn a_response_replayed_as_a_stream_is_numbered_and_completes_with_itself() {
        let stream = replay(&response()).unwrap();
        let mut parser = SseParser::new();
        let events = parser.push(&stream);
        let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap_or_default()).collect();
        assert_eq!(
            names,
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
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (n, event) in events.iter().enumerate() {
            let data: Value = serde_json::from_str(&event.data).unwrap();
            assert_eq!(data["sequence_number"], n, "numbered in order");
        }
        let created: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(
            (created["response"]["status"].as_str(), created["response"]["output"].clone()),
            (Some("in_progress"), json!([]))
        );
        assert_eq!(stream_answer(ClientApi::Responses, &stream), Some(response()));
    }

    #[test]
    fn only_a_finished_response_is_replayed() {
        let mut running = response();
        running["status"] = "in_progress".into();
        assert_eq!(replay(&running), None);
        assert_eq!(replay(&json!({"object": "chat.completion"})), None);
        let mut incomplete = response();
        incomplete["status"] = "incomplete".into();
        let stream = String::from_utf8(replay(&incomplete).unwrap()).unwrap();
        assert!(stream.contains("event: response.incomplete\n"), "{stream}");
    }
}
