use super::eventstream::{encode_frame, event_frame};
use super::*;
use crate::cloud::CloudFields;
use crate::providers::testing::outbound;
use crate::request::endpoint::Endpoint;
use crate::stream::testing::payloads;
use crate::unit_tests::test;
use serde_json::{json, Value};

fn with_messages(messages: Value) -> Value {
    json!({"model": "amazon.nova-pro-v1:0", "messages": messages})
}

fn request(body: Value) -> (Value, String) {
    convert_request(body).unwrap()
}

fn request_error(body: Value) -> GatewayError {
    convert_request(body).unwrap_err()
}

#[test]
fn the_model_id_is_encoded_into_the_path() {
    let mut body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    body["model"] = json!("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0");
    let (sent, path) = request(body.clone());
    assert_eq!(
        path,
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.amazon.nova-pro-v1%3A0/converse"
    );
    assert!(sent.get("model").is_none());
    body["stream"] = json!(true);
    assert!(request(body.clone()).1.ends_with("/converse-stream"));
    body["model"] = json!("");
    assert_eq!(request_error(body).param.as_deref(), Some("model"));
}

#[test]
fn other_endpoints_are_refused() {
    let e = Converse::new().request(outbound(Endpoint::Embeddings, "/embeddings", None)).unwrap_err();
    assert_eq!((e.status, e.code), (400, Some("unsupported_endpoint")));
    assert_eq!(e.message, "provider 'bedrock' does not support /v1/embeddings");
}

#[test]
fn images_are_data_urls_only() {
    let (sent, _) = request(with_messages(json!([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/jpg;base64,AAA"}},
    ]}])));
    assert_eq!(
        sent["messages"][0]["content"],
        json!([{"text": "What is this?"}, {"image": {"format": "jpeg", "source": {"bytes": "AAA"}}}])
    );
    let url = |url: &str| {
        with_messages(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]))
    };
    for bad in ["https://example.com/cat.png", "data:image/bmp;base64,AAA", "data:image/png,AAA"] {
        assert_eq!(request_error(url(bad)).param.as_deref(), Some("messages[0].content[0].image_url.url"), "{bad}");
    }
}

#[test]
fn tool_choice_forms() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let body = |choice: Value| {
        let mut body = with_messages(json!([{"role": "user", "content": "Hi"}]));
        body["tools"] = tools.clone();
        body["tool_choice"] = choice;
        request(body).0
    };
    let named = body(json!({"type": "function", "function": {"name": "f"}}));
    assert_eq!(named["toolConfig"]["toolChoice"], json!({"tool": {"name": "f"}}));
    assert_eq!(
        named["toolConfig"]["tools"][0],
        json!({"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object", "properties": {}}}}})
    );
    // Converse has no `none`: the tools are not offered.
    assert!(body(json!("none")).get("toolConfig").is_none());
    assert!(body(Value::Null)["toolConfig"].get("toolChoice").is_none());
}

#[test]
fn unsupported_requests_are_refused() {
    let mut body = with_messages(json!([{"role": "user", "content": "Hi"}]));
    body["n"] = json!(2);
    assert_eq!(request_error(body).message, "provider 'bedrock' returns a single choice; 'n' must be 1");
    let e = request_error(with_messages(
        json!([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    ));
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
    let e = request_error(with_messages(json!([{"role": "function", "content": "x", "name": "f"}])));
    assert_eq!(e.param.as_deref(), Some("messages[0].role"));
}

#[test]
fn empty_text_is_no_block_and_user_turns_merge() {
    let (sent, _) = request(with_messages(json!([
        {"role": "system", "content": ""},
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
    ])));
    assert!(sent.get("system").is_none());
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
            {"role": "assistant", "content": [{"text": "c"}]},
        ])
    );
}

#[test]
fn stop_reasons() {
    for (reason, expected) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("content_filtered", "content_filter"),
        ("guardrail_intervened", "content_filter"),
    ] {
        assert_eq!(finish_reason(Some(reason)), expected);
    }
    assert_eq!(finish_reason(None), "stop");
}

fn error_of(status: u16, headers: &[(&str, &str)], body: &str) -> Value {
    let headers: Vec<(String, Vec<u8>)> = headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
    serde_json::from_slice(&Converse::new().error(status, &headers, body.as_bytes())).unwrap()
}

#[test]
fn errors_take_their_type_from_the_header() {
    let v = error_of(429, &[("X-Amzn-ErrorType", "ThrottlingException")], r#"{"Message":"Slow down"}"#);
    assert_eq!(
        v,
        json!({"error": {"message": "Slow down", "type": "ThrottlingException", "param": null, "code": null}})
    );
    let v = error_of(403, &[], r#"{"message":"The security token included in the request is invalid."}"#);
    assert_eq!(v["error"]["type"], "permission_error");
    let v = error_of(503, &[("x-amzn-errortype", ":x")], "");
    assert_eq!(
        v["error"],
        json!({"message": "provider returned status 503", "type": "api_error", "param": null, "code": null})
    );
}

/// A short stream: text, then the stop and the usage.
fn stream_bytes() -> Vec<u8> {
    [
        event_frame("messageStart", r#"{"role":"assistant"}"#),
        event_frame("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"Hé"}}"#),
        event_frame("contentBlockStop", r#"{"contentBlockIndex":0}"#),
        event_frame("messageStop", r#"{"stopReason":"max_tokens"}"#),
        event_frame("metadata", r#"{"usage":{"inputTokens":3,"outputTokens":4,"totalTokens":7}}"#),
    ]
    .concat()
}

fn streamed(chunks: &[&[u8]]) -> (Vec<u8>, Option<Usage>) {
    let mut translator = Converse::new();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": true});
    translator.request(outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body))).unwrap();
    let mut out = Vec::new();
    for chunk in chunks {
        translator.stream(chunk, &mut out);
    }
    translator.stream_end(&mut out);
    (out, translator.usage())
}

#[test]
fn every_split_of_the_stream_gives_the_same_answer() {
    let bytes = stream_bytes();
    let (whole, usage) = streamed(&[&bytes]);
    assert_eq!(usage, Some(Usage { prompt_tokens: 3, completion_tokens: 4, ..Default::default() }));
    let events = payloads(&whole);
    assert_eq!(events.len(), 4);
    assert_eq!(events[1]["choices"][0]["delta"], json!({"content": "Hé"}));
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3], "[DONE]");
    for i in 0..=bytes.len() {
        let (a, b) = bytes.split_at(i);
        assert_eq!(streamed(&[a, b]).0, whole, "split at {i}");
    }
}

#[test]
fn a_corrupt_or_cut_stream_ends_with_an_error_event() {
    let mut bytes = stream_bytes();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let events = payloads(&streamed(&[&bytes]).0);
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[3]["error"]["type"], "api_error");
    assert_eq!(
        events[3]["error"]["message"],
        "provider 'bedrock' sent an invalid event stream: an event stream frame failed its message checksum"
    );

    let bytes = stream_bytes();
    let events = payloads(&streamed(&[&bytes[..bytes.len() - 3]]).0);
    assert_eq!(
        events.last().unwrap()["error"]["message"],
        "provider 'bedrock' sent an invalid event stream: the event stream ended inside a frame"
    );
}

#[test]
fn a_stream_that_ends_before_message_stop_ends_with_an_error_and_no_done() {
    let frames = [
        event_frame("messageStart", r#"{"role":"assistant"}"#),
        event_frame("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"Hé"}}"#),
    ];
    let events = payloads(&streamed(&[&frames.concat()]).0);
    assert_eq!(events[1]["choices"][0]["delta"], json!({"content": "Hé"}));
    let cut = json!({"error": {"message": "provider 'bedrock' ended the stream before it was complete",
        "type": "api_error", "param": null, "code": null}});
    assert_eq!(events[2..], *std::slice::from_ref(&cut));
    assert_eq!(payloads(&streamed(&[]).0), [cut]);
    // After `messageStop` the answer is whole, even without the usage that follows it.
    let stopped = [frames.concat(), event_frame("messageStop", r#"{"stopReason":"end_turn"}"#)].concat();
    assert_eq!(payloads(&streamed(&[&stopped]).0).last(), Some(&json!("[DONE]")));
}

#[test]
fn an_error_message_frame_ends_the_stream() {
    let frame = encode_frame(
        &[(":message-type", "error"), (":error-code", "InternalFailure"), (":error-message", "boom")],
        b"",
    );
    let events = payloads(&streamed(&[&event_frame("messageStart", "{}"), &frame]).0);
    assert_eq!(
        events[1],
        json!({"error": {"message": "boom", "type": "InternalFailure", "param": null, "code": null}})
    );
    assert_eq!(events.len(), 2);
}

#[test]
fn reasoning_goes_to_clients_that_accept_extras() {
    let body = br#"{"output":{"message":{"role":"assistant","content":[
        {"reasoningContent":{"reasoningText":{"text":"think","signature":"sig"}}},{"text":"Hi"}]}},
        "stopReason":"end_turn","usage":{"inputTokens":1,"outputTokens":2}}"#;
    let mut ctx =
        ResponseContext { model: "m".into(), created: 1, include_usage: false, strict_vendor_compliance: true };
    let (answer, _) = convert_response(body, &ctx, "id-1").unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["choices"][0]["message"], json!({"role": "assistant", "content": "Hi"}));
    ctx.strict_vendor_compliance = false;
    let (answer, _) = convert_response(body, &ctx, "id-1").unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content_blocks"],
        json!([{"type": "thinking", "thinking": "think", "signature": "sig"}, {"type": "text", "text": "Hi"}])
    );
    assert_eq!(convert_response(b"{}", &ctx, "id").unwrap_err().status, 502);
}

#[test]
fn reasoning_sent_back_leads_the_assistant_turn_as_converse_blocks() {
    // The blocks a non-strict answer gave, the redacted one kept in Converse's own shape.
    let redacted = json!({"reasoningContent": {"redactedContent": "b3BhcXVl"}});
    let (sent, _) = request(with_messages(json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "content_blocks": [
            {"type": "thinking", "thinking": "call it", "signature": "sig"},
            redacted.clone(),
            {"type": "redacted_thinking", "data": "c2VjcmV0"},
        ], "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
    ])));
    assert_eq!(
        sent["messages"][1]["content"],
        json!([
            {"reasoningContent": {"reasoningText": {"text": "call it", "signature": "sig"}}},
            redacted,
            {"reasoningContent": {"redactedContent": "c2VjcmV0"}},
            {"toolUse": {"toolUseId": "t1", "name": "weather", "input": {}}},
        ])
    );
}

// --- binding and signing -----------------------------------------------------------------

const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

fn keys(region: Option<&str>) -> CloudFields {
    CloudFields {
        aws_access_key_id: Some("AKIDEXAMPLE".into()),
        aws_secret_access_key: Some(SECRET.into()),
        aws_region: region.map(str::to_string),
        ..CloudFields::default()
    }
}

fn bind(cloud: &CloudFields, custom_host: bool) -> Result<Binding, GatewayError> {
    Bedrock.bind("bedrock", TargetFields { api_key: None, custom_host, built_in: None, cloud })
}

#[test]
fn the_region_names_the_host() {
    let binding = bind(&keys(Some("eu-west-3")), false).unwrap();
    assert_eq!(binding.base_url.as_deref(), Some("https://bedrock-runtime.eu-west-3.amazonaws.com"));
    assert_eq!(binding.account.as_deref(), Some("AKIDEXAMPLE"));
    // A custom host replaces the host; the region is then optional.
    assert_eq!(bind(&keys(Some("eu-west-3")), true).unwrap().base_url, None);
    assert_eq!(bind(&keys(None), true).unwrap().base_url, None);
    let e = bind(&keys(None), false).err().unwrap();
    assert_eq!((e.status, e.param.as_deref(), e.code), (400, Some("cloud_c_region"), Some("invalid_config")));
    // A region is one host label: it cannot move the request to another host.
    let e = bind(&keys(Some("evil.com/x")), false).err().unwrap();
    assert_eq!((e.status, e.param.as_deref()), (400, Some("cloud_c_region")));
}

#[test]
fn both_keys_are_required_and_never_echoed() {
    let without = |strip: fn(&mut CloudFields)| {
        let mut cloud = keys(Some("us-east-1"));
        strip(&mut cloud);
        bind(&cloud, false).err().unwrap()
    };
    for e in [
        without(|c| c.aws_access_key_id = None),
        without(|c| c.aws_secret_access_key = None),
        without(|c| c.aws_secret_access_key = Some(String::new())),
    ] {
        assert_eq!((e.status, e.code), (401, Some("missing_provider_key")));
        assert!(e.message.contains("cloud_c_secret_access_key"), "{}", e.message);
        assert!(e.message.contains("x-gateway-cloud-c-access-key-id"), "{}", e.message);
        assert!(!e.message.contains("AKIDEXAMPLE") && !e.message.contains(SECRET), "{}", e.message);
    }
}

/// What is signed is what is sent: the custom host's authority with its port, its base path
/// before the model's path, the model id's `%3A` as sent, the translated body; the region
/// defaults to us-east-1. The expected headers were computed with Python botocore 1.44.5
/// (`SigV4Auth(Credentials("AKIDEXAMPLE", secret, "tok"), "bedrock", "us-east-1")` over
/// `POST http://127.0.0.1:9000/proxy/model/...%3A0/converse` with that body, at 1_700_000_000 s).
#[test]
fn the_request_is_signed_as_sent() {
    let cloud = CloudFields { aws_session_token: Some("tok".into()), ..keys(None) };
    let fields = TargetFields { api_key: None, custom_host: true, built_in: None, cloud: &cloud };
    let body = json!({"model": "us.anthropic.claude-3-5-haiku-20241022-v1:0", "messages": [{"role": "user", "content": "Hi"}]});
    let outbound = outbound(Endpoint::ChatCompletions, "/chat/completions", Some(body));
    let prepared =
        crate::providers::bind_and_prepare("bedrock", fields, Some("http://127.0.0.1:9000/proxy"), "POST", outbound)
            .unwrap();
    assert_eq!(prepared.path, "/proxy/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse");
    assert_eq!(
        prepared.request.body.as_deref(),
        Some(&br#"{"messages":[{"content":[{"text":"Hi"}],"role":"user"}]}"#[..])
    );
    let headers: Vec<(&str, &str)> = prepared.request.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    assert_eq!(
        headers,
        vec![
            (
                "authorization",
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/us-east-1/bedrock/aws4_request, \
                 SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, \
                 Signature=4f22310776d6e8af1c5b29d8e4885263388274160e079aa8d11017d590f39945"
            ),
            ("x-amz-date", "20231114T221320Z"),
            ("x-amz-content-sha256", "d0cf73810a68223dbb8e96c7aca7e7c3c34a4a8312cda45e2cd5832fe615b2ac"),
            ("x-amz-security-token", "tok"),
        ]
    );
}
