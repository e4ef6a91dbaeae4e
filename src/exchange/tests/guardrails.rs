//! Guardrails and hooks: the top-level config's checks before the request and after the
//! answer, with the calls some of them make.

use super::*;
use crate::unit_tests::test;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The OpenAI target on 9000 with `checks` (hooks and guardrails) beside it.
fn guarded(checks: Value) -> RawHeaders {
    let mut config = openai("sk-1", 9000);
    config.as_object_mut().unwrap().extend(checks.as_object().unwrap().clone());
    chat_with_config("gw-key", &config)
}

fn blocks(word: &str, deny: bool) -> Value {
    json!({"default.contains": {"words": [word], "operator": "none"}, "deny": deny})
}

fn webhook_hook(deny: bool, is_async: bool) -> Value {
    let mut hook = json!({"id": "wh", "type": "guardrail",
        "checks": [{"id": "default.webhook", "parameters": {"webhookURL": "http://127.0.0.1:9300/check", "timeout": 500}}]});
    // `deny` belongs to before-request hooks, `async` to after-request ones.
    if deny {
        hook["on_fail"] = json!({"deny": true});
    }
    if is_async {
        hook["async"] = json!(true);
    }
    hook
}

fn chat(text: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string().into_bytes()
}

/// The provider answers COMPLETION in `chunks` (none: in one piece) to a request whose verdicts
/// were all decided before: the answer flows; the client's status and body.
fn provider_answers_flowing(gw: &mut Gateway, id: u32, chunks: &[&[u8]]) -> (Option<String>, Vec<u8>) {
    let headers = [("content-type", "application/json"), ("content-length", "999")];
    let out = gw.response_headers(id, 200, &headers, "via_upstream");
    assert_eq!(out.action, Action::Continue, "not held");
    let chunks = if chunks.is_empty() { vec![COMPLETION] } else { chunks.to_vec() };
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(gw.response_body(id, chunk, i + 1 == chunks.len()).action, Action::Continue);
    }
    let grown = gw.client_header(id, "content-length").and_then(|l| l.parse::<usize>().ok());
    assert_eq!(grown, Some(999 - COMPLETION.len() + gw.client_body(id).len()), "grown by what was added");
    (gw.client_header(id, ":status"), gw.client_body(id))
}

/// The provider answers COMPLETION in one piece; the client's status and body.
fn provider_answers(gw: &mut Gateway, id: u32) -> (Output, Option<String>, Vec<u8>) {
    let out = gw.response_headers(id, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(out.action, Action::Pause, "held for the checks");
    let out = gw.response_body(id, COMPLETION, true);
    let status = gw.client_header(id, ":status");
    (out, status, gw.client_body(id))
}

fn forwarded(gw: &Gateway) -> bool {
    gw.io.writes.iter().any(|w| matches!(w, Write::RequestHeaders(..)))
}

#[test]
fn a_denying_input_guardrail_answers_446_and_nothing_goes_upstream() {
    let mut gw = Gateway::new(SETTINGS);
    let out = gw.post(1, guarded(json!({"input_guardrails": [blocks("secret", true)]})), &chat("tell the secret"));
    let (_, status, headers, body) = reply(&out);
    assert_eq!((status, headers["content-type"].as_str()), (446, "application/json"));
    assert_eq!(body["error"]["type"], "hooks_failed");
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!(
        (hook["id"].as_str(), hook["verdict"].as_bool(), hook["deny"].as_bool()),
        (Some("input_guardrails[0]"), Some(false), Some(true))
    );
    assert!(!forwarded(&gw), "the provider is never called");
    let record = gw.finished(1).unwrap();
    assert_eq!(record.status, 446);
    assert_eq!(record.hooks(), "in:input_guardrails[0]=false");
    assert!(record.to_string().contains(r#"hooks="in:input_guardrails[0]=false""#));
    // Counted once, for the provider and model it was meant for.
    assert_eq!((record.provider, record.model.as_str()), ("openai", "m"));
    let requests: Vec<String> = gw.metrics().into_iter().filter(|m| m.starts_with(metrics::REQUESTS)).collect();
    assert_eq!(
        requests,
        ["gen_ai_gateway_requests_total.provider.openai.status_class.4xx.cache_status.disabled.model.m 1"]
    );
}

#[test]
fn a_failing_check_without_deny_flags_the_answer_246_with_hook_results() {
    let mut gw = Gateway::new(SETTINGS);
    let out = gw.post(1, guarded(json!({"input_guardrails": [blocks("secret", false)]})), &chat("tell the secret"));
    assert_eq!(out, Output::proceed());
    assert!(forwarded(&gw));
    let (status, body) = provider_answers_flowing(&mut gw, 1, &[]);
    assert_eq!(status.as_deref(), Some("246"));
    let body = json_of(&body);
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(body["hook_results"]["before_request_hooks"][0]["verdict"], false);
    assert_eq!(body["hook_results"]["after_request_hooks"], json!([]));
    assert_eq!(gw.finished(1).unwrap().status, 246);
}

#[test]
fn passing_checks_keep_200_and_add_hook_results() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"input_guardrails": [blocks("secret", true)]})), &chat("hello"));
    let (status, body) = provider_answers_flowing(&mut gw, 1, &[]);
    assert_eq!(status.as_deref(), Some("200"));
    let body = json_of(&body);
    assert_eq!(body["hook_results"]["before_request_hooks"][0]["verdict"], true);
    assert_eq!(body, {
        let mut expected = json_of(COMPLETION);
        expected["hook_results"] = body["hook_results"].clone();
        expected
    });
}

#[test]
fn hook_results_reach_an_answer_that_arrives_in_tiny_pieces() {
    for size in 1..=3 {
        let mut gw = Gateway::new(SETTINGS);
        gw.post(1, guarded(json!({"input_guardrails": [blocks("secret", false)]})), &chat("the secret"));
        let mut chunks: Vec<&[u8]> = vec![b""];
        chunks.extend(COMPLETION.chunks(size));
        let (status, body) = provider_answers_flowing(&mut gw, 1, &chunks);
        assert_eq!(status.as_deref(), Some("246"));
        let body = json_of(&body);
        assert_eq!(body["choices"][0]["message"]["content"], "Hello!", "{size}");
        assert_eq!(body["hook_results"]["before_request_hooks"][0]["verdict"], false, "{size}");
    }
}

#[test]
fn a_webhook_holds_the_request_until_it_answers() {
    let mut gw = Gateway::new(SETTINGS);
    let headers = guarded(json!({"before_request_hooks": [webhook_hook(true, false)]}));
    let out = gw.post(1, headers.clone(), &chat("hi"));
    assert_eq!(out.action, Action::Pause, "{out:?}");
    assert!(!forwarded(&gw));
    let call = gw.io.sent[0].clone();
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":path"), Some("/check"));
    assert_eq!(call.header(":authority"), Some("127.0.0.1:9300"));
    assert_eq!(call.call.timeout_ms, 500);
    assert_eq!(json_of(&call.call.body)["request"]["messages"][0]["content"], "hi");
    assert!(gw.worker.awaits(call.token));
    let out = gw.answer(call.token, 200, &[], br#"{"verdict": true}"#);
    assert_eq!(out.after, vec![After::ResumeRequest(1)]);
    assert!(forwarded(&gw));

    // A false verdict denies.
    assert_eq!(gw.post(2, headers, &chat("hi")).action, Action::Pause);
    let token = gw.io.sent[1].token;
    let (_, status, _, body) = reply(&gw.answer(token, 200, &[], br#"{"verdict": false}"#));
    assert_eq!(status, 446);
    assert_eq!(body["hook_results"]["before_request_hooks"][0]["checks"][0]["verdict"], false);
}

#[test]
fn a_webhook_that_times_out_fails_its_check() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"before_request_hooks": [webhook_hook(true, false)]})), &chat("hi"));
    let token = gw.io.sent[0].token;
    let (_, status, _, body) = reply(&gw.answer(token, 0, &[], b""));
    assert_eq!(status, 446);
    let check = &body["hook_results"]["before_request_hooks"][0]["checks"][0];
    assert!(check["error"]["message"].as_str().unwrap().contains("failed or timed out"), "{check}");
    assert!(!forwarded(&gw));
}

#[test]
fn a_denying_output_guardrail_replaces_a_json_answer() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"output_guardrails": [blocks("Hello", true)]})), &chat("hi"));
    let (out, status, body) = provider_answers(&mut gw, 1);
    assert_eq!(out.action, Action::Continue);
    assert_eq!(status.as_deref(), Some("446"));
    let body = json_of(&body);
    assert_eq!(body["error"]["type"], "hooks_failed");
    assert_eq!(body["hook_results"]["after_request_hooks"][0]["verdict"], false);
    assert_eq!(gw.finished(1).unwrap().status, 446);
}

const SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",",
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",",
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

const STREAM_CHAT: &[u8] = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn a_denying_output_guardrail_holds_a_stream_and_answers_446_json() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"output_guardrails": [blocks("Hello", true)]})), STREAM_CHAT);
    let out = gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    assert_eq!(out.action, Action::Pause);
    let (first, second) = SSE.as_bytes().split_at(100);
    assert_eq!(gw.response_body(1, first, false).action, Action::Pause, "no SSE bytes go out first");
    assert_eq!(gw.response_body(1, second, true).action, Action::Continue);
    assert_eq!(gw.client_header(1, ":status").as_deref(), Some("446"));
    assert_eq!(gw.client_header(1, "content-type").as_deref(), Some("application/json"));
    assert_eq!(json_of(&gw.client_body(1))["error"]["type"], "hooks_failed");

    // An answer that passes is released as it came.
    gw.post(2, guarded(json!({"output_guardrails": [blocks("Goodbye", true)]})), STREAM_CHAT);
    gw.response_headers(2, 200, &[("content-type", "text/event-stream")], "via_upstream");
    assert_eq!(gw.response_body(2, SSE.as_bytes(), true).action, Action::Continue);
    assert_eq!(gw.client_header(2, ":status").as_deref(), Some("200"));
    assert_eq!(gw.client_body(2), SSE.as_bytes());
}

#[test]
fn without_deny_a_stream_flows_and_the_verdict_goes_to_the_record() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"output_guardrails": [blocks("Hello", false)]})), STREAM_CHAT);
    let out = gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    assert_eq!(out.action, Action::Continue);
    let (first, second) = SSE.as_bytes().split_at(100);
    assert_eq!(gw.response_body(1, first, false).action, Action::Continue);
    gw.response_body(1, second, true);
    assert_eq!(gw.client_body(1), SSE.as_bytes());
    assert_eq!(gw.finished(1).unwrap().hooks(), "out:output_guardrails[0]=false");
}

#[test]
fn an_async_hook_does_not_delay_the_answer() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"after_request_hooks": [webhook_hook(false, true)]})), &chat("hi"));
    let (out, status, body) = provider_answers(&mut gw, 1);
    assert_eq!(out, Output::proceed());
    assert_eq!(status.as_deref(), Some("200"));
    assert_eq!(json_of(&body)["choices"][0]["message"]["content"], "Hello!");
    let call = gw.io.sent.last().unwrap().clone();
    assert_eq!(call.header(":path"), Some("/check"));
    assert_eq!(json_of(&call.call.body)["response"]["choices"][0]["message"]["content"], "Hello!");
    assert!(!gw.worker.awaits(call.token), "nobody waits for it");
    assert_eq!(gw.answer(call.token, 200, &[], br#"{"verdict": false}"#), Output::proceed());
}

#[test]
fn an_output_webhook_holds_the_answer_then_replies() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"after_request_hooks": [webhook_hook(false, false)]})), &chat("hi"));
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.response_body(1, COMPLETION, true).action, Action::Pause);
    let token = gw.io.sent.last().unwrap().token;
    let (_, status, headers, body) = reply(&gw.answer(token, 200, &[], br#"{"verdict": false}"#));
    assert_eq!((status, headers["content-type"].as_str()), (246, "application/json"));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(body["hook_results"]["after_request_hooks"][0]["verdict"], false);
}

#[test]
fn a_cached_answer_passes_the_output_checks() {
    let mut gw = Gateway::new(SETTINGS);
    let mut config = openai("sk-1", 9000);
    config["cache"] = json!({"mode": "simple"});
    config["output_guardrails"] = json!([blocks("Hello", false)]);
    let headers = chat_with_config("gw-key", &config);
    gw.post(1, headers.clone(), CHAT);
    provider_answers(&mut gw, 1);
    gw.finished(1);
    gw.request_headers(2, headers, true);
    let (_, status, headers, body) = reply(&gw.request_body(2, CHAT));
    assert_eq!((status, headers[STATUS_HEADER].as_str()), (246, "HIT"));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert!(body["hook_results"].get("hook_results").is_none(), "the stored answer has none");
    assert_eq!(body["hook_results"]["after_request_hooks"][0]["verdict"], false);
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

#[test]
fn a_jwks_is_fetched_once_then_read_from_shared_data() {
    use p256::ecdsa::signature::Signer;
    let key = p256::ecdsa::SigningKey::from_slice(&Sha256::digest("story")).unwrap();
    let point = key.verifying_key().to_encoded_point(false);
    let jwk =
        json!({"kty": "EC", "crv": "P-256", "kid": "k1", "x": b64(point.x().unwrap()), "y": b64(point.y().unwrap())});
    let jwks = json!({"keys": [jwk]}).to_string();
    // FakeHost's clock starts at 1,000,000 ms.
    let now_s: u64 = 1000;
    let header = b64(json!({"alg": "ES256", "kid": "k1"}).to_string().as_bytes());
    let claims = b64(json!({"sub": "u", "iat": now_s - 5, "exp": now_s + 600}).to_string().as_bytes());
    let signed = format!("{header}.{claims}");
    let signature: p256::ecdsa::Signature = key.sign(signed.as_bytes());
    let token = format!("{signed}.{}", b64(&signature.to_bytes()));

    let hook = json!({"id": "jwt", "type": "guardrail", "on_fail": {"deny": true}, "checks": [{"id": "default.jwt",
        "parameters": {"jwksUri": "http://127.0.0.1:9301/jwks.json", "headerKey": "x-user-token", "algorithms": ["ES256"]}}]});
    let mut headers = guarded(json!({"before_request_hooks": [hook.clone()]}));
    headers.push(("x-user-token".into(), format!("Bearer {token}").into_bytes()));

    let mut gw = Gateway::new(SETTINGS);
    assert_eq!(gw.post(1, headers.clone(), CHAT).action, Action::Pause);
    // A second request meanwhile waits for the same fetch; one that ended waits no more.
    assert_eq!(gw.post(10, headers.clone(), CHAT).action, Action::Pause);
    assert_eq!(gw.post(11, headers.clone(), CHAT).action, Action::Pause);
    gw.finished(11);
    assert_eq!(gw.io.sent.len(), 1);
    let fetch = gw.io.sent[0].clone();
    assert_eq!((fetch.header(":method"), fetch.header(":path")), (Some("GET"), Some("/jwks.json")));
    assert_eq!(fetch.header("content-length"), None);
    let out = gw.answer(fetch.token, 200, &[], jwks.as_bytes());
    assert_eq!(out.after, vec![After::ResumeRequest(1), After::ResumeRequest(10)]);

    // The next requests verify against the cached set: no fetch, no wait.
    for id in 2..5 {
        assert_eq!(gw.post(id, headers.clone(), CHAT), Output::proceed());
    }
    assert_eq!(gw.io.sent.len(), 1);

    // A wrong token is denied at once.
    let mut bad = guarded(json!({"before_request_hooks": [hook]}));
    bad.push(("x-user-token".into(), format!("{signed}.{}", b64(b"nope")).into_bytes()));
    let (_, status, _, _) = reply(&gw.post(9, bad, CHAT));
    assert_eq!(status, 446);
}

#[test]
fn a_recovered_answer_passes_the_output_checks() {
    let mut gw = Gateway::new(SETTINGS);
    let mut config = fallback(vec![openai("a", 9001), openai("b", 9002)]);
    config["output_guardrails"] = json!([blocks("Hello", false)]);
    gw.post(1, chat_with_config("gw-key", &config), CHAT);
    gw.response_headers(1, 500, &[], "via_upstream");
    let token = gw.io.sent[0].token;
    let (_, status, headers, body) = reply(&gw.answer(token, 200, &[("content-type", "application/json")], COMPLETION));
    assert_eq!((status, headers["content-type"].as_str()), (246, "application/json"));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(body["hook_results"]["after_request_hooks"][0]["verdict"], false);
    assert_eq!(gw.finished(1).unwrap().status, 246);
}

#[test]
fn hooks_on_a_target_and_stored_guardrails_are_refused() {
    let mut gw = Gateway::new(SETTINGS);
    let mut target = openai("a", 9001);
    target["input_guardrails"] = json!([blocks("x", true)]);
    gw.request_headers(1, chat_with_config("gw-key", &fallback(vec![target])), true);
    let (_, status, _, body) = reply(&gw.request_body(1, CHAT));
    assert_eq!(status, 501);
    assert!(body["error"]["message"].as_str().unwrap().contains("top-level"), "{body}");
    let out = gw.post(2, guarded(json!({"output_guardrails": ["pg-pii-1"]})), CHAT);
    let (_, status, _, body) = reply(&out);
    assert_eq!(status, 501);
    assert!(body["error"]["message"].as_str().unwrap().contains("control plane"), "{body}");
}

#[test]
fn a_held_answer_still_tells_its_usage() {
    let mut gw = Gateway::new(SETTINGS);
    gw.post(1, guarded(json!({"input_guardrails": [blocks("secret", false)]})), &chat("hello"));
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    let answer = br#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;
    gw.response_body(1, answer, true);
    let usage = gw.finished(1).unwrap().usage;
    assert_eq!(usage, Some(crate::providers::Usage { prompt_tokens: 9, completion_tokens: 4, ..Default::default() }));
}

/// The filter's own cost of one inline input guardrail, natively (the benchmark measures it in
/// Envoy): `cargo test --release --lib -- --ignored --nocapture guardrail_cost`.
#[test]
#[ignore = "a timing, not a test"]
fn guardrail_cost() {
    let mut gw = Gateway::new(SETTINGS);
    let rule = json!({"default.regexMatch": {"rule": "\\b(password|ssn)\\b", "not": true}, "deny": true});
    let plain = guarded(json!({}));
    let with_guardrail = guarded(json!({"input_guardrails": [rule]}));
    let mut time = |headers: &RawHeaders| {
        let start = std::time::Instant::now();
        for id in 10..20_010 {
            assert_eq!(gw.post(id, headers.clone(), &chat("hello")), Output::proceed());
            gw.response_headers(id, 200, &[("content-type", "application/json")], "via_upstream");
            gw.response_body(id, COMPLETION, true);
            gw.finished(id);
            gw.io.streams.remove(&id);
            gw.io.writes.clear();
        }
        start.elapsed().as_nanos() / 20_000
    };
    let (a, b) = (time(&plain), time(&with_guardrail));
    let (a, b) = (a.min(time(&plain)), b.min(time(&with_guardrail)));
    println!("warm request: one-target config {a} ns, with an input regexMatch guardrail {b} ns");
}
