use super::*;
use crate::errors::GatewayError;
use crate::providers::testing::outbound;
use crate::providers::{Outbound, ResponseContext, Usage};
use crate::request::endpoint::Endpoint;
use crate::stream::sse::MAX_EVENT_BYTES;
use crate::stream::testing::payloads;
use crate::unit_tests::test;
use serde_json::{json, Value};

fn chat_response(body: &[u8], ctx: &ResponseContext) -> Result<Vec<u8>, GatewayError> {
    convert_response(body, ctx).map(|(answer, _)| answer)
}

fn request(body: Value) -> Value {
    convert_request(body).unwrap()
}

fn request_error(body: Value) -> GatewayError {
    convert_request(body).unwrap_err()
}

fn with_messages(messages: Value) -> Value {
    json!({"model": "claude-sonnet-4-5", "messages": messages})
}

fn ctx(strict: bool, include_usage: bool) -> ResponseContext {
    ResponseContext {
        model: "asked-model".into(),
        created: 1_700_000_000,
        include_usage,
        strict_vendor_compliance: strict,
    }
}

// --- endpoints and headers ------------------------------------------------------------

/// A target with this key (or none, behind a custom host).
fn prepare_with_key(key: Option<&str>, outbound: Outbound) -> crate::providers::Prepared {
    let cloud = crate::cloud::CloudFields::default();
    let fields =
        crate::providers::TargetFields { api_key: key, custom_host: key.is_none(), built_in: None, cloud: &cloud };
    let custom_host = if key.is_none() { Some("https://llm.internal/v1") } else { None };
    crate::providers::bind_and_prepare("anthropic", fields, custom_host, "POST", outbound).unwrap()
}

#[test]
fn chat_goes_to_messages_with_the_version_header_and_the_key() {
    let body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    let prepared =
        prepare_with_key(Some("sk-ant"), outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body)));
    assert_eq!(prepared.path, "/v1/messages");
    assert_eq!(prepared.request.path, "/messages");
    assert_eq!(
        prepared.request.headers,
        vec![("anthropic-version", "2023-06-01".to_string()), ("x-api-key", "sk-ant".to_string())]
    );
    let sent: Value = serde_json::from_slice(prepared.request.body.as_deref().unwrap()).unwrap();
    assert_eq!(sent["max_tokens"], 4096);
    assert!(prepared.translator.translates_responses());
    let body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    let keyless = prepare_with_key(None, outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body)));
    assert_eq!(keyless.request.headers, vec![("anthropic-version", "2023-06-01".to_string())]);
}

#[test]
fn other_endpoints_are_refused() {
    let e = Messages::new(Transport::Direct).request(outbound(Endpoint::Embeddings, "/embeddings", None)).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.kind, "invalid_request_error");
    assert_eq!(e.code, Some("unsupported_endpoint"));
    assert_eq!(e.message, "provider 'anthropic' does not support /v1/embeddings");
    assert!(Messages::new(Transport::Direct)
        .request(outbound(Endpoint::Resource, "/batches/b1/cancel", None))
        .is_err());
}

#[test]
fn the_translator_reports_usage_of_answers_and_streams() {
    let mut translator = Messages::new(Transport::Direct);
    let body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    translator.request(outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body))).unwrap();
    assert_eq!(translator.usage(), None);
    translator.response(sample_message().to_string().as_bytes()).unwrap();
    assert_eq!(
        translator.usage(),
        Some(Usage { prompt_tokens: 17, cached_prompt_tokens: 5, cache_write_prompt_tokens: 2, completion_tokens: 7 })
    );
}

// --- request ----------------------------------------------------------------------------

#[test]
fn minimal_request() {
    let out = request(with_messages(json!([{"role": "user", "content": "Hi"}])));
    assert_eq!(
        out,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": [{"role": "user", "content": "Hi"}]})
    );
}

#[test]
fn max_tokens_sources() {
    let mut body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    body["max_tokens"] = json!(100);
    assert_eq!(request(body.clone())["max_tokens"], 100);
    body["max_completion_tokens"] = json!(200);
    assert_eq!(request(body.clone())["max_tokens"], 200);
    body["max_completion_tokens"] = Value::Null;
    assert_eq!(request(body.clone())["max_tokens"], 100);
    body["max_tokens"] = Value::Null;
    let out = request(body);
    assert_eq!(out["max_tokens"], 4096);
    assert!(out.get("max_completion_tokens").is_none());
}

#[test]
fn system_and_developer_strings_join() {
    let out = request(with_messages(json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "developer", "content": "Use French."},
    ])));
    assert_eq!(out["system"], "Be brief.\n\nUse French.");
    assert_eq!(out["messages"], json!([{"role": "user", "content": "Hi"}]));
}

#[test]
fn system_parts_become_blocks() {
    let out = request(with_messages(json!([
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": [
            {"type": "text", "text": "Cached.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "More."},
        ]},
        {"role": "user", "content": "Hi"},
    ])));
    assert_eq!(
        out["system"],
        json!([
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": "Cached.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "More."},
        ])
    );
}

#[test]
fn system_image_part_is_rejected() {
    let e = request_error(with_messages(json!([
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]},
    ])));
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
}

#[test]
fn user_parts_text_and_images() {
    let out = request(with_messages(json!([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"}},
    ]}])));
    assert_eq!(
        out["messages"][0]["content"],
        json!([
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        ])
    );
}

#[test]
fn bad_parts_are_rejected_with_their_path() {
    let e = request_error(with_messages(json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]},
    ])));
    assert_eq!(e.status, 400);
    assert_eq!(e.param.as_deref(), Some("messages[2].content[1].type"));
    assert!(e.message.contains("input_audio"), "{}", e.message);

    let e = request_error(with_messages(
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]),
    ));
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url.url"));
    let e = request_error(with_messages(
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,AAA"}}]}]),
    ));
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url.url"));
}

#[test]
fn assistant_tool_calls_become_tool_use_after_text() {
    let out = request(with_messages(json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": ""}},
        ]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
        ]},
    ])));
    assert_eq!(
        out["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
            {"type": "tool_use", "id": "call_3", "name": "noop", "input": {}},
        ]})
    );
}

#[test]
fn assistant_thinking_without_tool_calls_leads_its_text() {
    let out = request(with_messages(json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "content_blocks": [
            {"type": "text", "text": "Hello."},
            {"type": "thinking", "thinking": "Greet back.", "signature": "sig"},
        ]},
        {"role": "user", "content": "Again"},
    ])));
    assert_eq!(
        out["messages"][1]["content"],
        json!([
            {"type": "thinking", "thinking": "Greet back.", "signature": "sig"},
            {"type": "text", "text": "Hello."},
        ])
    );
}

#[test]
fn bad_content_blocks_name_their_field() {
    let cases = [
        (json!("thinking"), "messages[1].content_blocks"),
        (json!([{"type": "thinking", "thinking": "x"}]), "messages[1].content_blocks[0].signature"),
        (
            json!([{"type": "text", "text": "a"}, {"type": "redacted_thinking", "data": 7}]),
            "messages[1].content_blocks[1].data",
        ),
    ];
    for (blocks, param) in cases {
        let e = request_error(with_messages(json!([
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "content_blocks": blocks},
        ])));
        assert_eq!((e.status, e.param.as_deref()), (400, Some(param)));
    }
}

#[test]
fn assistant_without_content_and_empty_text() {
    let out = request(with_messages(json!([
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
    ])));
    assert_eq!(out["messages"][1]["content"], json!([{"type": "tool_use", "id": "c", "name": "f", "input": {}}]));
}

#[test]
fn invalid_tool_arguments_are_rejected() {
    for arguments in ["{not json", "[1,2]", "\"text\""] {
        let e = request_error(with_messages(json!([
            {"role": "user", "content": "Go"},
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": arguments}},
            ]},
        ])));
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[1].function.arguments"), "{arguments}");
    }
}

#[test]
fn tool_messages_merge_into_one_user_turn() {
    let out = request(with_messages(json!([
        {"role": "user", "content": "Go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "noon"}]},
        {"role": "user", "content": "Thanks"},
    ])));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "noon"}]},
            {"type": "text", "text": "Thanks"},
        ]})
    );
}

#[test]
fn consecutive_same_role_messages_merge() {
    let out = request(with_messages(json!([
        {"role": "user", "content": "One"},
        {"role": "user", "content": [{"type": "text", "text": "Two"}]},
        {"role": "assistant", "content": "A"},
        {"role": "assistant", "content": "B"},
    ])));
    assert_eq!(
        out["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        ])
    );
}

#[test]
fn function_role_is_rejected() {
    let e = request_error(with_messages(
        json!([{"role": "user", "content": "Go"}, {"role": "function", "name": "f", "content": "x"}]),
    ));
    assert_eq!(e.param.as_deref(), Some("messages[1].role"));
    assert!(e.message.contains("tools"), "{}", e.message);
}

#[test]
fn tools_and_tool_choice() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["tools"] = json!([
        {"type": "function", "function": {"name": "weather", "description": "Get weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "time"}},
    ]);
    let out = request(body.clone());
    assert_eq!(
        out["tools"],
        json!([
            {"name": "weather", "description": "Get weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"name": "time", "input_schema": {"type": "object", "properties": {}}},
        ])
    );
    assert!(out.get("tool_choice").is_none());

    for (choice, expected) in [
        (json!("auto"), json!({"type": "auto"})),
        (json!("required"), json!({"type": "any"})),
        (json!("none"), json!({"type": "none"})),
        (json!({"type": "function", "function": {"name": "time"}}), json!({"type": "tool", "name": "time"})),
    ] {
        body["tool_choice"] = choice;
        assert_eq!(request(body.clone())["tool_choice"], expected);
    }
    body["tool_choice"] = json!("sometimes");
    assert_eq!(request_error(body).param.as_deref(), Some("tool_choice"));
}

#[test]
fn parallel_tool_calls_false_disables_parallel_use() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    body["parallel_tool_calls"] = json!(false);
    let out = request(body.clone());
    assert_eq!(out["tool_choice"], json!({"type": "auto", "disable_parallel_tool_use": true}));
    assert!(out.get("parallel_tool_calls").is_none());

    body["tool_choice"] = json!("required");
    assert_eq!(request(body.clone())["tool_choice"], json!({"type": "any", "disable_parallel_tool_use": true}));
    body["tool_choice"] = json!("none");
    assert_eq!(request(body.clone())["tool_choice"], json!({"type": "none"}));
    body["parallel_tool_calls"] = json!(true);
    body["tool_choice"] = json!("auto");
    assert_eq!(request(body)["tool_choice"], json!({"type": "auto"}));
}

#[test]
fn non_function_tool_is_rejected() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["tools"] = json!([{"type": "function", "function": {"name": "f"}}, {"type": "custom", "custom": {}}]);
    assert_eq!(request_error(body).param.as_deref(), Some("tools[1].type"));
}

#[test]
fn sampling_stop_user_and_stream() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["stop"] = json!("END");
    body["temperature"] = json!(0.5);
    body["top_p"] = Value::Null;
    body["stream"] = json!(true);
    body["user"] = json!("u-42");
    let out = request(body.clone());
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["temperature"], 0.5);
    assert!(out.get("top_p").is_none());
    assert_eq!(out["stream"], true);
    assert_eq!(out["metadata"], json!({"user_id": "u-42"}));
    assert!(out.get("user").is_none() && out.get("stop").is_none());

    body["stop"] = json!(["a", "b"]);
    body["top_p"] = json!(0.9);
    let out = request(body);
    assert_eq!(out["stop_sequences"], json!(["a", "b"]));
    assert_eq!(out["top_p"], 0.9);
}

#[test]
fn unknown_fields_pass_through_and_merge_user() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["top_k"] = json!(5);
    body["metadata"] = json!({"user_id": "forced", "other": 1});
    body["user"] = json!("u-42");
    let out = request(body);
    assert_eq!(out["top_k"], 5);
    assert_eq!(out["metadata"], json!({"user_id": "forced", "other": 1}));
}

#[test]
fn thinking_passes_through() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let out = convert_request(body).unwrap();
    assert_eq!(out["thinking"], json!({"type": "enabled", "budget_tokens": 1024}));
}

#[test]
fn json_response_formats_are_rejected() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    for format in [json!({"type": "json_object"}), json!({"type": "json_schema", "json_schema": {"name": "n"}})] {
        body["response_format"] = format;
        let e = request_error(body.clone());
        assert_eq!((e.status, e.param.as_deref()), (400, Some("response_format")));
        assert!(e.message.contains("no JSON mode"), "{}", e.message);
    }
    for format in [json!({"type": "text"}), Value::Null] {
        body["response_format"] = format;
        assert!(request(body.clone()).get("response_format").is_none());
    }
}

#[test]
fn openai_only_fields_are_dropped_or_rejected() {
    let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
    for (field, value) in [
        ("n", json!(1)),
        ("logprobs", json!(false)),
        ("top_logprobs", json!(2)),
        ("logit_bias", json!({"1": 2})),
        ("presence_penalty", json!(0.1)),
        ("frequency_penalty", json!(0.1)),
        ("seed", json!(7)),
        ("response_format", json!({"type": "text"})),
        ("stream_options", json!({"include_usage": true})),
        ("functions", json!([])),
        ("function_call", Value::Null),
        ("store", json!(false)),
    ] {
        body[field] = value;
    }
    let out = request(body.clone());
    assert_eq!(
        out,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": [{"role": "user", "content": "Go"}]})
    );

    for (field, value) in [
        ("n", json!(2)),
        ("logprobs", json!(true)),
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!("auto")),
    ] {
        let mut bad = body.clone();
        bad[field] = value;
        let e = request_error(bad);
        assert_eq!((e.status, e.param.as_deref()), (400, Some(field)));
    }
}

#[test]
fn malformed_messages_are_rejected() {
    assert_eq!(request_error(json!({"model": "m"})).param.as_deref(), Some("messages"));
    assert_eq!(request_error(json!("text")).status, 400);
    let e = request_error(with_messages(json!([{"role": "critic", "content": "x"}])));
    assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    let e = request_error(with_messages(json!([{"role": "user", "content": null}])));
    assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    let e = request_error(with_messages(json!([{"role": "tool", "content": "x"}])));
    assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
}

// --- response ---------------------------------------------------------------------------

fn sample_message() -> Value {
    json!({
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me "},
            {"type": "text", "text": "check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2, "output_tokens": 7},
    })
}

fn response(message: &Value, ctx: &ResponseContext) -> Value {
    let out = chat_response(message.to_string().as_bytes(), ctx).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn response_with_tool_use_strict() {
    let out = response(&sample_message(), &ctx(true, false));
    assert_eq!(
        out,
        json!({
            "id": "msg_01",
            "object": "chat.completion",
            "created": 1_700_000_000u64,
            "model": "claude-sonnet-4-5-20250929",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [{"id": "toolu_1", "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}],
                },
                "logprobs": null,
                "finish_reason": "tool_calls",
            }],
            // Cache reads and writes are prompt tokens; the reads are cached ones.
            "usage": {"prompt_tokens": 17, "completion_tokens": 7, "total_tokens": 24, "prompt_tokens_details": {"cached_tokens": 5}},
        })
    );
}

#[test]
fn response_content_blocks_when_not_strict() {
    let out = response(&sample_message(), &ctx(false, false));
    assert_eq!(
        out["choices"][0]["message"]["content_blocks"],
        json!([
            {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me "},
            {"type": "text", "text": "check."},
        ])
    );
    assert_eq!(out["choices"][0]["message"]["content"], "Let me check.");
}

#[test]
fn response_without_text_has_null_content_and_ctx_model() {
    let message =
        json!({"id": "m", "content": [], "stop_reason": null, "usage": {"input_tokens": 1, "output_tokens": 0}});
    let out = response(&message, &ctx(true, false));
    assert_eq!(out["choices"][0]["message"], json!({"role": "assistant", "content": null}));
    assert_eq!(out["model"], "asked-model");
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
}

#[test]
fn finish_reason_mapping() {
    for (stop, expected) in [
        (json!("end_turn"), "stop"),
        (json!("stop_sequence"), "stop"),
        (json!("max_tokens"), "length"),
        (json!("tool_use"), "tool_calls"),
        (json!("refusal"), "content_filter"),
        (json!("pause_turn"), "stop"),
        (Value::Null, "stop"),
    ] {
        let message = json!({"id": "m", "content": [{"type": "text", "text": "x"}], "stop_reason": stop});
        assert_eq!(response(&message, &ctx(true, false))["choices"][0]["finish_reason"], expected);
    }
}

#[test]
fn unparseable_response_is_502() {
    for body in [&b"not json"[..], b"{\"type\":\"message\"}", b"[]", b""] {
        let e = chat_response(body, &ctx(true, false)).unwrap_err();
        assert_eq!((e.status, e.kind), (502, "api_error"));
        assert_eq!(e.message, "invalid response from provider anthropic");
    }
}

// --- stream -----------------------------------------------------------------------------

const TRANSCRIPT: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",",
    "\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,",
    "\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me think.\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig==\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"H\u{e9}llo \u{1f600}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"weather\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Par\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"is\\\"}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_02\",\"name\":\"time\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":3}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

fn run_stream(ctx: ResponseContext, chunks: &[&[u8]]) -> Vec<u8> {
    let mut stream = SseStream::new(stream::EventConverter::new(ctx, "anthropic"));
    let mut out = Vec::new();
    for chunk in chunks {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

fn deltas(payloads: &[Value]) -> Vec<Value> {
    payloads.iter().map(|p| p["choices"][0]["delta"].clone()).collect()
}

#[test]
fn stream_transcript_not_strict() {
    let out = run_stream(ctx(false, true), &[TRANSCRIPT.as_bytes()]);
    let payloads = payloads(&out);
    let first = &payloads[0];
    assert_eq!(
        first,
        &json!({"id": "msg_01", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": "claude-sonnet-4-5", "usage": null,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]})
    );
    assert_eq!(
        deltas(&payloads[..9]),
        vec![
            json!({"role": "assistant", "content": ""}),
            json!({"content_blocks": [{"index": 0, "delta": {"thinking": "Let me think."}}]}),
            json!({"content_blocks": [{"index": 0, "delta": {"signature": "sig=="}}]}),
            json!({"content": "H\u{e9}llo \u{1f600}"}),
            json!({"tool_calls": [{"index": 0, "id": "toolu_01", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Par"}}]}),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "is\"}"}}]}),
            json!({"tool_calls": [{"index": 1, "id": "toolu_02", "type": "function", "function": {"name": "time", "arguments": ""}}]}),
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        ]
    );
    assert_eq!(payloads[9]["choices"][0]["delta"], json!({}));
    assert_eq!(payloads[9]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(payloads[10]["choices"], json!([]));
    assert_eq!(
        payloads[10]["usage"],
        json!({"prompt_tokens": 30, "completion_tokens": 42, "total_tokens": 72, "prompt_tokens_details": {"cached_tokens": 5}})
    );
    assert_eq!(payloads[10]["id"], "msg_01");
    assert_eq!(payloads[11], "[DONE]");
    assert_eq!(payloads.len(), 12);
}

#[test]
fn a_streamed_tool_call_without_arguments_has_the_empty_object() {
    // Anthropic streams a tool without parameters as one empty `partial_json` (or none).
    let tool = |index: u32, pieces: &[&str]| {
        let start = json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": format!("toolu_{index}"), "name": "now", "input": {}}});
        let mut events = vec![format!("event: content_block_start\ndata: {start}\n\n")];
        for piece in pieces {
            let delta = json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}});
            events.push(format!("event: content_block_delta\ndata: {delta}\n\n"));
        }
        let stop = json!({"type": "content_block_stop", "index": index});
        events.push(format!("event: content_block_stop\ndata: {stop}\n\n"));
        events.concat()
    };
    let start = r#"{"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":1}}}"#;
    let stream =
        format!("event: message_start\ndata: {start}\n\n{}{}{}", tool(0, &[""]), tool(1, &[]), tool(2, &["{}"]));
    let payloads = payloads(&run_stream(ctx(true, false), &[stream.as_bytes()]));
    let arguments = |call: usize| -> String {
        let pieces = payloads.iter().filter_map(|p| p["choices"][0]["delta"]["tool_calls"].get(0).cloned());
        pieces
            .filter(|c| c["index"] == call)
            .filter_map(|c| c["function"]["arguments"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!((arguments(0), arguments(1), arguments(2)), ("{}".into(), "{}".into(), "{}".into()));
}

#[test]
fn stream_transcript_strict_drops_thinking_and_usage() {
    let out = run_stream(ctx(true, false), &[TRANSCRIPT.as_bytes()]);
    let payloads = payloads(&out);
    assert_eq!(payloads.len(), 9);
    assert_eq!(
        deltas(&payloads[..2]),
        vec![json!({"role": "assistant", "content": ""}), json!({"content": "H\u{e9}llo \u{1f600}"})]
    );
    assert!(payloads[0].get("usage").is_none());
    assert_eq!(payloads[7]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(payloads[8], "[DONE]");
}

#[test]
fn stream_output_identical_at_every_split_and_byte_by_byte() {
    let input = TRANSCRIPT.as_bytes();
    for strict in [true, false] {
        let whole = run_stream(ctx(strict, true), &[input]);
        for at in 0..=input.len() {
            let (a, b) = input.split_at(at);
            assert_eq!(run_stream(ctx(strict, true), &[a, b]), whole, "split at {at}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run_stream(ctx(strict, true), &bytes), whole);
    }
}

#[test]
fn stream_error_event_ends_stream() {
    let input = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":1}}}\n\n",
        "event: error\n",
        "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );
    let out = run_stream(ctx(true, true), &[input.as_bytes()]);
    let text = String::from_utf8(out).unwrap();
    // The error ends the stream; no `[DONE]`, which would say the answer is whole.
    assert!(text.ends_with(
        "data: {\"error\":{\"code\":null,\"message\":\"Overloaded\",\"param\":null,\"type\":\"overloaded_error\"}}\n\n"
    ));
    assert_eq!(text.matches("[DONE]").count(), 0);
}

#[test]
fn stream_event_too_large_ends_stream_with_error() {
    let start = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
        "event: content_block_delta\n",
        "data: ",
    );
    let huge = vec![b'x'; MAX_EVENT_BYTES];
    let after = b"\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let out = run_stream(ctx(true, false), &[start.as_bytes(), &huge, after]);
    let payloads = payloads(&out);
    assert_eq!(deltas(&payloads[..1]), vec![json!({"role": "assistant", "content": ""})]);
    assert_eq!(
        payloads[1],
        json!({"error": {"message": "provider 'anthropic' sent a stream event larger than 16777216 bytes",
            "type": "api_error", "param": null, "code": null}})
    );
    assert_eq!(payloads.len(), 2, "no [DONE] after the error");
}

#[test]
fn a_stream_without_message_stop_ends_with_an_error_and_no_done() {
    let input = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"cut\"}}",
    );
    let sent = payloads(&run_stream(ctx(true, false), &[input.as_bytes()]));
    assert_eq!(deltas(&sent[..2]), vec![json!({"role": "assistant", "content": ""}), json!({"content": "cut"})]);
    let cut = json!({"error": {"message": "provider 'anthropic' ended the stream before it was complete",
        "type": "api_error", "param": null, "code": null}});
    assert_eq!(sent[2..], *std::slice::from_ref(&cut), "an error, and no [DONE]");
    // Cut after the finish reason, before `message_stop`, or before anything at all.
    let stopped = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n",
    );
    let after_stop_reason = payloads(&run_stream(ctx(true, false), &[stopped.as_bytes()]));
    assert_eq!(after_stop_reason.last(), Some(&cut));
    assert_eq!(payloads(&run_stream(ctx(true, false), &[])), [cut]);
}

// --- errors -----------------------------------------------------------------------------

fn error(status: u16, body: &[u8]) -> Value {
    serde_json::from_slice(&normalize_error(status, body)).unwrap()
}

#[test]
fn error_body_variants() {
    assert_eq!(
        error(429, br#"{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"}}"#),
        json!({"error": {"message": "Slow down", "type": "rate_limit_error", "param": null, "code": null}})
    );
    assert_eq!(
        error(400, br#"{"error":{"message":"Bad","type":"invalid_request_error","param":"model","code":"bad_model"}}"#),
        json!({"error": {"message": "Bad", "type": "invalid_request_error", "param": "model", "code": "bad_model"}})
    );
    assert_eq!(
        error(503, b"upstream connect error\n"),
        json!({"error": {"message": "upstream connect error", "type": "api_error", "param": null, "code": null}})
    );
    assert_eq!(
        error(401, b""),
        json!({"error": {"message": "provider returned status 401", "type": "authentication_error", "param": null, "code": null}})
    );
    assert_eq!(error(404, br#"{"error":"nope"}"#)["error"]["message"], "nope");
    let long = vec![b'x'; 5000];
    assert_eq!(error(500, &long)["error"]["message"].as_str().unwrap().len(), 1000);
    assert_eq!(error(500, b"bad \xff byte")["error"]["message"], "bad \u{fffd} byte");
}

// --- nonsense input never panics ----------------------------------------------------------

fn weird_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(2.5),
        json!(u64::MAX),
        json!(""),
        json!("x"),
        json!("data:"),
        json!([]),
        json!({}),
        json!([null, 1, "a", {}]),
        json!({"type": "text"}),
    ]
}

/// Copies of `value` with one node (at any depth) replaced by each weird value.
fn mutations(value: &Value) -> Vec<Value> {
    let mut out = weird_values();
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                for replacement in mutations(item) {
                    let mut copy = items.clone();
                    copy[i] = replacement;
                    out.push(Value::Array(copy));
                }
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                for replacement in mutations(item) {
                    let mut copy = fields.clone();
                    copy.insert(key.clone(), replacement);
                    out.push(Value::Object(copy));
                }
            }
        }
        _ => {}
    }
    out
}

fn garbage(len: usize, mut seed: u32) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (seed >> 16) as u8
        })
        .collect()
}

#[test]
fn nonsense_never_panics() {
    let full_request = json!({
        "model": "m", "max_tokens": 5, "max_completion_tokens": 6, "n": 1, "logprobs": false,
        "functions": [], "function_call": null, "thinking": {"type": "enabled"}, "user": "u",
        "stop": ["s"], "metadata": {"k": "v"}, "parallel_tool_calls": false, "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "s"}]},
            {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": "a", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ],
    });
    for body in mutations(&full_request) {
        let _ = convert_request(body);
    }

    for message in mutations(&sample_message()) {
        for strict in [true, false] {
            let _ = chat_response(message.to_string().as_bytes(), &ctx(strict, true));
        }
    }

    let events: Vec<(&str, Value)> = TRANSCRIPT
        .split_terminator("\n\n")
        .filter_map(|e| e.split_once("\ndata: "))
        .map(|(name, data)| (name.trim_start_matches("event: "), serde_json::from_str(data).unwrap()))
        .collect();
    for (i, (_, data)) in events.iter().enumerate() {
        for mutated in mutations(data) {
            let mut input = String::new();
            for (j, (other_name, other)) in events.iter().enumerate() {
                let payload = if i == j { &mutated } else { other };
                input.push_str(&format!("event: {other_name}\ndata: {payload}\n\n"));
            }
            let _ = run_stream(ctx(false, true), &[input.as_bytes()]);
        }
    }

    for seed in 0..20 {
        let bytes = garbage(2000, seed);
        let _ = chat_response(&bytes, &ctx(false, true));
        let _ = normalize_error(500, &bytes);
        // Never a complete answer: the stream ends with the gateway's error.
        let out = payloads(&run_stream(ctx(false, true), &[&bytes]));
        assert_eq!(
            out.last().and_then(|p| p["error"]["message"].as_str()),
            Some(crate::stream::cut_short("anthropic").as_str())
        );
    }
    let _ = normalize_error(0, b"{\"error\":{\"message\":5,\"type\":[]}}");
}

#[test]
fn a_token_count_goes_to_anthropic_as_the_client_sent_it() {
    let mut translator = Messages::new(Transport::Direct);
    let body = json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "Hi"}]});
    let sent = translator.request(outbound(Endpoint::MessagesCountTokens, "/messages/count_tokens", Some(body)));
    let sent = sent.unwrap();
    assert_eq!(sent.path, "/messages/count_tokens");
    assert_eq!(sent.body, None, "the client's bytes");
    assert_eq!(sent.headers, vec![("anthropic-version", API_VERSION.to_string())]);
    assert!(!translator.translates_responses());
}
