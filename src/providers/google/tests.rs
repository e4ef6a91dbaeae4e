use super::*;
use crate::providers::testing::outbound;
use crate::request::endpoint::Endpoint;
use crate::stream::testing::payloads;
use crate::unit_tests::test;
use serde_json::json;

fn location() -> VertexLocation {
    VertexLocation { project: "my-project".into(), region: "europe-west4".into() }
}

fn ctx(include_usage: bool) -> ResponseContext {
    ResponseContext {
        model: "asked-model".into(),
        created: 1_700_000_000,
        include_usage,
        strict_vendor_compliance: true,
    }
}

fn request(body: Value) -> Value {
    convert_request(&body, "google").unwrap()
}

fn request_error(body: Value) -> GatewayError {
    convert_request(&body, "google").unwrap_err()
}

fn chat(messages: Value) -> Value {
    json!({"model": "gemini-2.5-flash", "messages": messages})
}

fn answer(body: Value) -> Value {
    let (answer, _) = convert_response(body.to_string().as_bytes(), &ctx(false), "google").unwrap();
    serde_json::from_slice(&answer).unwrap()
}

fn upstream(translator: &mut dyn Translator, body: Value) -> Result<UpstreamRequest, GatewayError> {
    translator.request(outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body)))
}

// --- paths ----------------------------------------------------------------------------

#[test]
fn paths_name_the_model_and_the_method() {
    let mut gemini = GeminiTranslator::new(GeminiTransport::GeminiApi);
    let sent = upstream(&mut gemini, chat(json!([{"role": "user", "content": "Hi"}]))).unwrap();
    assert_eq!((sent.path.as_str(), sent.query), ("/v1beta/models/gemini-2.5-flash:generateContent", None));
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["model"] = json!("models/gemini-2.5-flash");
    body["stream"] = json!(true);
    let sent = upstream(&mut GeminiTranslator::new(GeminiTransport::GeminiApi), body).unwrap();
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:streamGenerateContent");
    assert_eq!(sent.query.as_deref(), Some("alt=sse"));
    assert!(sent.headers.is_empty());

    let mut vertex = vertex_translator(location());
    let sent = upstream(vertex.as_mut(), chat(json!([{"role": "user", "content": "Hi"}]))).unwrap();
    assert_eq!(
        sent.path,
        "/v1/projects/my-project/locations/europe-west4/publishers/google/models/gemini-2.5-flash:generateContent"
    );
    let mut claude = vertex_translator(location());
    let body = json!({"model": "claude-opus-4-1@20250805", "messages": [{"role": "user", "content": "Hi"}],
        "stream": true});
    let sent = upstream(claude.as_mut(), body).unwrap();
    assert_eq!(
        sent.path,
        "/v1/projects/my-project/locations/europe-west4/publishers/anthropic/models/claude-opus-4-1@20250805:streamRawPredict"
    );
    let sent: Value = serde_json::from_slice(&sent.body.unwrap()).unwrap();
    assert_eq!((sent["stream"].clone(), sent.get("model")), (json!(true), None));
    assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
}

#[test]
fn path_segments_cannot_leave_their_place() {
    for model in ["../x", "a/b", "m?alt=json", "m#x", "", "gemini pro", ".."] {
        let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
        body["model"] = json!(model);
        let error = upstream(&mut GeminiTranslator::new(GeminiTransport::GeminiApi), body.clone()).unwrap_err();
        assert_eq!((error.status, error.param.as_deref()), (400, Some("model")), "{model}");
        assert_eq!(upstream(vertex_translator(location()).as_mut(), body).unwrap_err().status, 400);
    }
    let bad = VertexLocation { project: "p/../q".into(), region: "us-central1".into() };
    let error = bad.model_path("google", "m", "generateContent").unwrap_err();
    assert_eq!(error.param.as_deref(), Some("cloud_b_project_id"));
    let bad = VertexLocation { project: "p".into(), region: "".into() };
    assert_eq!(bad.model_path("google", "m", "x").unwrap_err().param.as_deref(), Some("cloud_b_region"));
}

#[test]
fn other_endpoints_are_400s() {
    let mut gemini = GeminiTranslator::new(GeminiTransport::GeminiApi);
    let error = gemini.request(outbound(Endpoint::Resource, "/batches", None)).unwrap_err();
    assert_eq!((error.status, error.code), (400, Some("unsupported_endpoint")));
    assert!(error.message.contains("'google'"), "{}", error.message);
    let error = vertex_translator(location()).request(outbound(Endpoint::Resource, "/files", None)).unwrap_err();
    assert!(error.message.contains("'vertex-ai'"), "{}", error.message);
}

// --- requests -------------------------------------------------------------------------

#[test]
fn images_and_audio_become_inline_or_file_data() {
    let body = request(chat(json!([{"role": "user", "content": [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.JPG?size=2"}},
        {"type": "image_url", "image_url": {"url": "gs://bucket/doc"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ]}])));
    assert_eq!(
        body["contents"][0]["parts"],
        json!([
            {"text": "Compare"},
            {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
            {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/cat.JPG?size=2"}},
            {"fileData": {"fileUri": "gs://bucket/doc"}},
            {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}},
        ])
    );
    for url in ["data:image/png,abc", "ftp://x/y.png", "file:///etc/passwd"] {
        let error = request_error(chat(json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])));
        assert_eq!(error.param.as_deref(), Some("messages[0].content[0].image_url.url"), "{url}");
    }
    let error = request_error(chat(json!([{"role": "user", "content": [{"type": "file", "file": {}}]}])));
    assert_eq!(error.param.as_deref(), Some("messages[0].content[0].type"));
}

#[test]
fn generation_config_and_response_format() {
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    let fields = json!({"n": 2, "presence_penalty": 0.5, "frequency_penalty": 0.25, "max_completion_tokens": 64,
        "max_tokens": 999, "stop": ["a", "b"], "top_k": 40, "temperature": null,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": true, "schema": {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}, "additionalProperties": false}},
            "additionalProperties": false}}},
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}, "topK": 1},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "user": "u", "store": true, "parallel_tool_calls": false, "stream_options": {"include_usage": true}});
    for (key, value) in fields.as_object().unwrap() {
        body[key] = value.clone();
    }
    let sent = request(body);
    assert_eq!(
        sent["generationConfig"],
        json!({"candidateCount": 2, "presencePenalty": 0.5, "frequencyPenalty": 0.25, "maxOutputTokens": 64,
            "stopSequences": ["a", "b"], "topK": 40, "thinkingConfig": {"thinkingBudget": 0},
            "responseMimeType": "application/json",
            "responseSchema": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}})
    );
    assert_eq!(sent["safetySettings"][0]["threshold"], "BLOCK_NONE");
    let keys: Vec<&String> = sent.as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["contents", "generationConfig", "safetySettings"]);

    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["response_format"] = json!({"type": "json_object"});
    assert_eq!(request(body)["generationConfig"], json!({"responseMimeType": "application/json"}));
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["response_format"] = json!({"type": "text"});
    assert_eq!(request(body).get("generationConfig"), None);
    for (field, value) in [("logprobs", json!(true)), ("stop", json!(3)), ("response_format", json!({"type": "x"}))] {
        let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
        body[field] = value;
        assert_eq!(request_error(body).status, 400, "{field}");
    }
}

#[test]
fn tool_choice_modes() {
    for (choice, config) in [
        (json!("auto"), json!({"mode": "AUTO"})),
        (json!("none"), json!({"mode": "NONE"})),
        (json!("required"), json!({"mode": "ANY"})),
        (json!({"type": "function", "function": {"name": "f"}}), json!({"mode": "ANY", "allowedFunctionNames": ["f"]})),
    ] {
        let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
        body["tool_choice"] = choice;
        assert_eq!(request(body)["toolConfig"], json!({"functionCallingConfig": config}));
    }
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["tool_choice"] = json!("sometimes");
    assert_eq!(request_error(body).param.as_deref(), Some("tool_choice"));
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["tools"] = json!([{"type": "web_search"}]);
    assert_eq!(request_error(body).param.as_deref(), Some("tools[0].type"));
}

#[test]
fn turns_roles_and_tool_results() {
    let sent = request(chat(json!([
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "b"}]},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": "c", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{\"k\":1}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": "[1,"}, {"type": "text", "text": "2]"}]},
        {"role": "tool", "tool_call_id": "y", "name": "g", "content": "ok"},
    ])));
    assert_eq!(
        sent["contents"],
        json!([
            {"role": "user", "parts": [{"text": "a"}, {"text": "b"}]},
            {"role": "model", "parts": [{"text": "c"}, {"functionCall": {"name": "f", "args": {"k": 1}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "f", "response": {"content": "[1,\n2]"}}},
                {"functionResponse": {"name": "g", "response": {"content": "ok"}}},
            ]},
        ])
    );
    let error = request_error(chat(json!([{"role": "tool", "tool_call_id": "nope", "content": "x"}])));
    assert_eq!(error.param.as_deref(), Some("messages[0].tool_call_id"));
    assert!(error.message.contains("'nope'"), "{}", error.message);
    let error = request_error(chat(json!([{"role": "assistant", "content": null, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}])));
    assert_eq!(error.param.as_deref(), Some("messages[0].tool_calls[0].function.arguments"));
    for role in ["function", "robot"] {
        let error = request_error(chat(json!([{"role": role, "content": "x"}])));
        assert_eq!(error.param.as_deref(), Some("messages[0].role"), "{role}");
    }
    let error = request_error(chat(json!([{"role": "system", "content": [{"type": "image_url"}]}])));
    assert_eq!(error.param.as_deref(), Some("messages[0].content[0].type"));
}

#[test]
fn thought_signatures_go_out_with_the_tool_call_and_come_back_with_it() {
    let part = json!({"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2lnbg=="});
    let candidate = json!({"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"});
    let out = answer(json!({"candidates": [candidate.clone()]}));
    let call = &out["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["extra_content"], json!({"google": {"thought_signature": "c2lnbg=="}}));
    // Streamed, the call's one delta carries it the same way.
    let event = format!("data: {}\n\n", json!({"candidates": [candidate]}));
    let payloads = payloads(&run_stream(false, &[event.as_bytes()]));
    let delta = &payloads[1]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(delta["extra_content"], call["extra_content"]);

    let sent = request(chat(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [call, {"id": "x", "type": "function",
            "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "1"},
        {"role": "tool", "tool_call_id": "x", "content": "2"},
    ])));
    assert_eq!(
        sent["contents"][1]["parts"],
        json!([
            {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2lnbg=="},
            {"functionCall": {"name": "g", "args": {}}},
        ])
    );
}

// --- answers --------------------------------------------------------------------------

#[test]
fn finish_reasons() {
    for (reason, calls, expected) in [
        ("STOP", false, "stop"),
        ("STOP", true, "tool_calls"),
        ("MAX_TOKENS", true, "length"),
        ("SAFETY", false, "content_filter"),
        ("RECITATION", false, "content_filter"),
        ("BLOCKLIST", false, "content_filter"),
        ("PROHIBITED_CONTENT", false, "content_filter"),
        ("SPII", false, "content_filter"),
        ("OTHER", false, "stop"),
    ] {
        assert_eq!(finish_reason(Some(reason), calls), expected, "{reason}");
    }
    assert_eq!(finish_reason(None, false), "stop");
}

#[test]
fn answers_with_several_candidates_thoughts_and_blocks() {
    let v = answer(json!({
        "candidates": [
            {"index": 0, "finishReason": "MAX_TOKENS", "content": {"role": "model", "parts": [
                {"text": "thinking...", "thought": true}, {"text": "Hel"}, {"text": "lo"}]}},
            {"index": 1, "finishReason": "SAFETY"},
        ],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 7},
    }));
    assert_eq!(v["model"], "asked-model");
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "Hello"}));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["choices"][1],
        json!({"index": 1, "message": {"role": "assistant", "content": null},
        "logprobs": null, "finish_reason": "content_filter"})
    );
    assert_eq!(v["usage"], json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}));

    let blocked =
        answer(json!({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 9}}));
    assert_eq!(blocked["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(blocked["choices"][0]["message"]["content"], Value::Null);

    for bad in [&b"not json"[..], b"[]", b"\"x\""] {
        let error = convert_response(bad, &ctx(false), "vertex-ai").unwrap_err();
        assert_eq!((error.status, error.message.as_str()), (502, "invalid response from provider vertex-ai"));
    }
}

#[test]
fn the_translator_reports_the_answers_usage() {
    let mut gemini = GeminiTranslator::new(GeminiTransport::GeminiApi);
    upstream(&mut gemini, chat(json!([{"role": "user", "content": "Hi"}]))).unwrap();
    assert!(gemini.translates_responses());
    assert_eq!(gemini.usage(), None);
    let body = json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "thoughtsTokenCount": 3}});
    let v: Value = serde_json::from_slice(&gemini.response(body.to_string().as_bytes()).unwrap()).unwrap();
    assert_eq!(v["created"], 1_700_000_000u64);
    assert_eq!(v["model"], "gemini-2.5-flash");
    assert_eq!(gemini.usage(), Some(Usage { prompt_tokens: 5, completion_tokens: 5, ..Default::default() }));
}

// --- errors ---------------------------------------------------------------------------

fn error_of(status: u16, body: &str) -> Value {
    serde_json::from_slice(&error(status, body.as_bytes())).unwrap()
}

#[test]
fn google_errors_keep_the_message_and_name_the_status() {
    let v = error_of(404, r#"{"error":{"code":404,"message":"Publisher model not found.","status":"NOT_FOUND"}}"#);
    assert_eq!(
        v,
        json!({"error": {"message": "Publisher model not found.", "type": "invalid_request_error", "param": null,
            "code": "NOT_FOUND"}})
    );
    let v = error_of(429, r#"[{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED"}}]"#);
    assert_eq!(
        (v["error"]["message"].clone(), v["error"]["type"].clone()),
        (json!("Quota exceeded."), json!("rate_limit_error"))
    );
    assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
    // Other shapes go through the generic reshaping (Anthropic's errors on Vertex among them).
    let v = error_of(400, r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#);
    assert_eq!(
        (v["error"]["message"].clone(), v["error"]["type"].clone()),
        (json!("bad"), json!("invalid_request_error"))
    );
    let v = error_of(500, r#"[{"error":{"message":"boom"}}]"#);
    assert_eq!(v["error"]["message"], "boom");
    assert_eq!(error_of(503, "upstream connect error")["error"]["message"], "upstream connect error");
    assert_eq!(error_of(500, "[]")["error"]["message"], "[]");
}

// --- streams --------------------------------------------------------------------------

const STREAM: &str = concat!(
    "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"Hi\"}]},\"index\":0}],\"responseId\":\"r1\"}\n\n",
    "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"hmm\",\"thought\":true},",
    "{\"functionCall\":{\"name\":\"f\",\"args\":{\"a\":1}}},{\"functionCall\":{\"id\":\"g1\",\"name\":\"g\",\"args\":{}}}]},",
    "\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":6}}\n\n",
);

fn run_stream(include_usage: bool, chunks: &[&[u8]]) -> Vec<u8> {
    let mut stream = SseStream::new(GeminiEvents::new(ctx(include_usage), "google"));
    let mut out = Vec::new();
    for chunk in chunks {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

#[test]
fn stream_without_usage_has_no_usage_fields() {
    let out = run_stream(false, &[STREAM.as_bytes()]);
    let payloads = payloads(&out);
    let deltas: Vec<Value> = payloads.iter().filter_map(|p| p.get("choices")).map(|c| c[0]["delta"].clone()).collect();
    assert_eq!(
        deltas,
        vec![
            json!({"role": "assistant", "content": ""}),
            json!({"content": "Hi"}),
            json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\":1}"}}]}),
            json!({"tool_calls": [{"index": 1, "id": "g1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}),
            json!({}),
        ]
    );
    assert_eq!(payloads[4]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(payloads[0]["id"], "r1");
    assert_eq!(payloads[0]["model"], "asked-model");
    assert!(payloads.iter().all(|p| p.get("usage").is_none()));
    assert_eq!(payloads.last().unwrap(), &json!("[DONE]"));
}

#[test]
fn stream_split_at_every_offset_is_the_same() {
    let whole = run_stream(true, &[STREAM.as_bytes()]);
    let bytes = STREAM.as_bytes();
    for at in 0..bytes.len() {
        assert_eq!(run_stream(true, &[&bytes[..at], &bytes[at..]]), whole, "split at {at}");
    }
    let usage = &payloads(&whole)[5];
    assert_eq!(usage["usage"], json!({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}));
}

#[test]
fn a_stream_cut_before_every_finish_reason_ends_with_an_error_and_no_done() {
    let cut = json!({"error": {"message": "provider 'vertex-ai' ended the stream before it was complete",
        "type": "api_error", "param": null, "code": null}});
    let run = |input: &str| {
        let mut stream = SseStream::new(GeminiEvents::new(ctx(true), "vertex-ai"));
        let mut out = Vec::new();
        stream.push(input.as_bytes(), &mut out);
        stream.finish(&mut out);
        payloads(&out)
    };
    // Before the finish reason, in the middle of its event, or before anything.
    let first = STREAM.split_inclusive("\n\n").next().unwrap();
    let sent = run(first);
    assert_eq!(sent[1]["choices"][0]["delta"], json!({"content": "Hi"}));
    assert_eq!(sent[2..], *std::slice::from_ref(&cut));
    assert_eq!(run(&STREAM[..STREAM.len() - 20]).last(), Some(&cut));
    assert_eq!(run(""), *std::slice::from_ref(&cut));
    // Two candidates, only one of which finished.
    let two = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]},\"index\":0},",
        "{\"content\":{\"parts\":[{\"text\":\"b\"}]},\"index\":1}]}\n\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[]},\"finishReason\":\"STOP\",\"index\":0}]}\n\n",
    );
    assert_eq!(run(two).last(), Some(&cut));
    // Complete: the usage chunk and `[DONE]`, no error.
    let whole = run(STREAM);
    assert_eq!(whole.last(), Some(&json!("[DONE]")));
    assert!(whole.iter().all(|p| p.get("error").is_none()));
}

#[test]
fn stream_errors_and_blocked_prompts() {
    let error =
        "data: {\"error\":{\"code\":429,\"message\":\"Resource exhausted.\",\"status\":\"RESOURCE_EXHAUSTED\"}}\n\n";
    let out = run_stream(
        false,
        &[STREAM.split("\n\n").next().unwrap().as_bytes(), b"\n\n", error.as_bytes(), STREAM.as_bytes()],
    );
    let sent = payloads(&out);
    assert_eq!(sent.len(), 3, "no [DONE] after the error");
    assert_eq!(
        sent[2],
        json!({"error": {"message": "Resource exhausted.", "type": "rate_limit_error", "param": null, "code": null}})
    );

    let blocked = "data: {\"promptFeedback\":{\"blockReason\":\"PROHIBITED_CONTENT\"},\"usageMetadata\":{\"promptTokenCount\":7}}\n\n";
    let sent = payloads(&run_stream(true, &[blocked.as_bytes()]));
    assert_eq!(sent[1]["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(sent[2]["usage"]["prompt_tokens"], 7);

    // An event larger than the bound ends the stream with an error naming the provider.
    let mut stream = SseStream::new(GeminiEvents::new(ctx(false), "vertex-ai"));
    let mut out = Vec::new();
    stream.push(b"data: ", &mut out);
    stream.push(&vec![b'x'; crate::stream::sse::MAX_EVENT_BYTES + 1], &mut out);
    stream.finish(&mut out);
    let payloads = payloads(&out);
    assert!(payloads[0]["error"]["message"].as_str().unwrap().starts_with("provider 'vertex-ai' sent a stream event"));
}

#[test]
fn vertex_translator_streams_through_the_chosen_translator() {
    let mut vertex = vertex_translator(location());
    assert_eq!(vertex.usage(), None);
    let mut body = chat(json!([{"role": "user", "content": "Hi"}]));
    body["stream"] = json!(true);
    upstream(vertex.as_mut(), body).unwrap();
    let mut out = Vec::new();
    vertex.stream(STREAM.as_bytes(), &mut out);
    vertex.stream_end(&mut out);
    assert_eq!(payloads(&out).len(), 6);
    assert_eq!(vertex.usage(), Some(Usage { prompt_tokens: 4, completion_tokens: 6, ..Default::default() }));
    let error: Value = serde_json::from_slice(&vertex.error(
        400,
        &[],
        br#"{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}"#,
    ))
    .unwrap();
    assert_eq!(error["error"]["code"], "INVALID_ARGUMENT");

    let mut claude = vertex_translator(location());
    let body = json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "Hi"}]});
    upstream(claude.as_mut(), body).unwrap();
    let answer = br#"{"id":"m","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Yo"}],"stop_reason":"end_turn","usage":{"input_tokens":2,"output_tokens":1}}"#;
    let v: Value = serde_json::from_slice(&claude.response(answer).unwrap()).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Yo");
    assert_eq!(claude.usage(), Some(Usage { prompt_tokens: 2, completion_tokens: 1, ..Default::default() }));
    let error: Value = serde_json::from_slice(&claude.error(
        404,
        &[],
        br#"{"error":{"code":404,"message":"Publisher Model not found.","status":"NOT_FOUND"}}"#,
    ))
    .unwrap();
    assert_eq!(error["error"]["code"], "NOT_FOUND");
}

#[test]
fn claude_on_vertex_counts_tokens_with_its_count_tokens_model() {
    let mut claude = vertex_translator(location());
    let body = json!({"model": "claude-opus-4-1@20250805", "messages": [{"role": "user", "content": "Hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let sent = claude.request(outbound(Endpoint::MessagesCountTokens, "/messages/count_tokens", Some(body.clone())));
    let sent = sent.unwrap();
    assert_eq!(
        sent.path,
        "/v1/projects/my-project/locations/europe-west4/publishers/anthropic/models/count-tokens:rawPredict"
    );
    let mut expected = body;
    expected["anthropic_version"] = json!("vertex-2023-10-16");
    assert_eq!(serde_json::from_slice::<Value>(&sent.body.unwrap()).unwrap(), expected, "the model kept");
    // Anthropic's count comes back as it is.
    assert!(!claude.translates_responses());
}
