//! A `chat.completion` (the translated provider's answer) as a `response` object.

use crate::client_api::client_call_id;
use serde_json::{json, Map, Value};

/// A response's identity and the request it repeats (OpenAI's response object echoes the
/// request's settings).
pub(crate) struct Echo<'a> {
    /// `resp_...`, made by the gateway (the id it stores the response under).
    pub(crate) id: &'a str,
    /// Unix seconds.
    pub(crate) created_at: u64,
    pub(crate) request: &'a Map<String, Value>,
}

impl Echo<'_> {
    /// The id of output item `n` of kind `prefix` (`msg`, `fc`, `rs`), unique with the response's.
    pub(crate) fn item_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.id.strip_prefix("resp_").unwrap_or(self.id))
    }

    /// The response object with `status`, `output` and `usage`; `model` is the provider's when
    /// it named one, else the request's.
    pub(crate) fn response(&self, status: &str, model: Option<&str>, output: Vec<Value>, usage: Value) -> Value {
        let asked =
            |name: &str, default: Value| self.request.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(default);
        let incomplete = match status {
            "incomplete" => json!({"reason": "max_output_tokens"}),
            _ => Value::Null,
        };
        let model = model.map(Value::from).unwrap_or_else(|| asked("model", "".into()));
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": incomplete,
            "instructions": asked("instructions", Value::Null),
            "max_output_tokens": asked("max_output_tokens", Value::Null),
            "model": model, "output": output,
            "parallel_tool_calls": asked("parallel_tool_calls", true.into()),
            "previous_response_id": asked("previous_response_id", Value::Null),
            "reasoning": asked("reasoning", json!({"effort": null, "summary": null})),
            "store": asked("store", true.into()),
            "temperature": asked("temperature", 1.into()),
            "text": asked("text", json!({"format": {"type": "text"}})),
            "tool_choice": asked("tool_choice", "auto".into()),
            "tools": asked("tools", json!([])),
            "top_p": asked("top_p", 1.into()),
            "truncation": asked("truncation", "disabled".into()),
            "usage": usage,
            "user": asked("user", Value::Null),
            "metadata": asked("metadata", json!({})),
        })
    }
}

/// Chat's `finish_reason` as a response's `status`.
pub(crate) fn status(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "incomplete",
        _ => "completed",
    }
}

/// The status of an output item in a response of `status` (`last`: the item written last).
/// The item being written when the answer was cut at its token limit is incomplete, as OpenAI
/// marks it; the others are done.
pub(crate) fn item_status(status: &str, last: bool) -> &'static str {
    match status {
        "in_progress" => "in_progress",
        "incomplete" if last => "incomplete",
        _ => "completed",
    }
}

/// Chat usage as Responses usage.
pub(crate) fn usage(usage: Option<&Value>) -> Value {
    let count = |pointer: &str| usage.and_then(|u| u.pointer(pointer)).and_then(Value::as_u64).unwrap_or(0);
    let (input, output) = (count("/prompt_tokens"), count("/completion_tokens"));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": count("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": count("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": input + output,
    })
}

/// A reasoning item: the thinking as its summary, thinking and signature sealed in its
/// `encrypted_content` (what a later request gives back, so the provider gets its signed
/// thinking again).
pub(crate) fn reasoning_item(id: String, thinking: &str, signature: &str) -> Value {
    let mut item = json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": thinking}]});
    if let (Some(fields), false) = (item.as_object_mut(), signature.is_empty()) {
        fields.insert("encrypted_content".into(), super::seal(thinking, signature).into());
    }
    item
}

pub(crate) fn message_item(id: String, status: &str, parts: Vec<Value>) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": parts})
}

pub(crate) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

pub(crate) fn call_item(id: String, status: &str, call_id: &str, name: &str, arguments: &str) -> Value {
    json!({"type": "function_call", "id": id, "status": status, "call_id": call_id, "name": name, "arguments": arguments})
}

/// The first choice of a chat answer as a response.
pub(crate) fn from_chat(chat: &Value, echo: &Echo) -> Value {
    let choice = chat.pointer("/choices/0");
    let message = choice.and_then(|c| c.get("message"));
    let field = |value: Option<&Value>, name: &str| {
        value.and_then(|v| v.get(name)).and_then(Value::as_str).unwrap_or_default().to_string()
    };
    let mut output = Vec::new();
    for block in message.and_then(|m| m.get("content_blocks")).and_then(Value::as_array).into_iter().flatten() {
        if block.get("type").and_then(Value::as_str) == Some("thinking") {
            let id = echo.item_id("rs", output.len());
            output.push(reasoning_item(id, &field(Some(block), "thinking"), &field(Some(block), "signature")));
        }
    }
    let mut parts = Vec::new();
    let text = field(message, "content");
    if !text.is_empty() {
        parts.push(text_part(&text));
    }
    if let Some(refusal) = message.and_then(|m| m.get("refusal")).and_then(Value::as_str) {
        parts.push(json!({"type": "refusal", "refusal": refusal}));
    }
    let status = status(choice.and_then(|c| c.get("finish_reason")).and_then(Value::as_str));
    let calls =
        message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if !parts.is_empty() {
        output.push(message_item(echo.item_id("msg", output.len()), item_status(status, calls.is_empty()), parts));
    }
    for (n, call) in calls.iter().enumerate() {
        let function = call.get("function");
        let id = echo.item_id("fc", output.len());
        output.push(call_item(
            id,
            item_status(status, n + 1 == calls.len()),
            &client_call_id(call),
            &field(function, "name"),
            &field(function, "arguments"),
        ));
    }
    echo.response(status, chat.get("model").and_then(Value::as_str), output, usage(chat.get("usage")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn a_chat_answer_becomes_a_response() {
        let request =
            json!({"model": "claude", "input": "hi", "store": false, "tools": [{"type": "function", "name": "shell"}]});
        let echo = Echo { id: "resp_abc", created_at: 7, request: request.as_object().unwrap() };
        let chat = json!({
            "id": "chatcmpl-1", "model": "claude-sonnet-4-5",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Running ls.",
                "content_blocks": [{"type": "thinking", "thinking": "Use ls.", "signature": "sig"}],
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 40}}
        });
        let response = from_chat(&chat, &echo);
        assert_eq!(
            response["output"],
            json!([
                {"type": "reasoning", "id": "rs_abc_0", "summary": [{"type": "summary_text", "text": "Use ls."}], "encrypted_content": crate::client_api::responses::seal("Use ls.", "sig")},
                {"type": "message", "id": "msg_abc_1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Running ls.", "annotations": [], "logprobs": []}]},
                {"type": "function_call", "id": "fc_abc_2", "status": "completed", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"}
            ])
        );
        assert_eq!(
            (
                &response["id"],
                &response["object"],
                &response["status"],
                &response["model"],
                &response["store"],
                &response["created_at"]
            ),
            (
                &json!("resp_abc"),
                &json!("response"),
                &json!("completed"),
                &json!("claude-sonnet-4-5"),
                &json!(false),
                &json!(7)
            )
        );
        assert_eq!(response["tools"], request["tools"]);
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 9,
                   "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 59})
        );
    }

    #[test]
    fn a_cut_answer_is_incomplete() {
        let request = json!({"model": "m", "input": "hi"});
        let echo = Echo { id: "resp_1", created_at: 0, request: request.as_object().unwrap() };
        let chat = json!({"choices": [{"finish_reason": "length", "message": {"content": "Once upon"}}]});
        let response = from_chat(&chat, &echo);
        assert_eq!(
            (&response["status"], &response["incomplete_details"], &response["model"]),
            (&json!("incomplete"), &json!({"reason": "max_output_tokens"}), &json!("m"))
        );
        // The message being written when the answer was cut is incomplete too.
        assert_eq!(response["output"][0]["status"], "incomplete");
        // Cut in a call: the text before it is complete, the call is not.
        let call = json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a"}});
        let chat =
            json!({"choices": [{"finish_reason": "length", "message": {"content": "Once", "tool_calls": [call]}}]});
        let statuses: Vec<Value> =
            from_chat(&chat, &echo)["output"].as_array().unwrap().iter().map(|i| i["status"].clone()).collect();
        assert_eq!(statuses, [json!("completed"), json!("incomplete")]);
    }
}
