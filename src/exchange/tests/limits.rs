//! Limits as a client and the control plane see them: a request under a limit waits for its
//! worker's first grant, later ones spend the lease without a call, one that does not fit is a
//! 429 that reached no provider, and what a request used is settled and reported.

use super::*;
use crate::unit_tests::test;

const CP_SETTINGS: &str = r#"{"api_keys": ["gw-key"], "cache": {"byte_budget": 1048576, "max_entry_bytes": 65536},
    "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret",
                      "fresh_ms": 5000, "grace_ms": 600000, "timeout_ms": 3000}}"#;

/// A chat request of the key `gw-team-key` (workspace `limited`, key id `key_1`).
fn chat(body: &str) -> (RawHeaders, Vec<u8>) {
    let headers = request(
        "POST",
        "/v1/chat/completions",
        &[
            ("x-gateway-api-key", "gw-team-key"),
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-c"),
            ("content-type", "application/json"),
        ],
    );
    (headers, body.as_bytes().to_vec())
}

const SMALL: &str = r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;

/// The last call sent, to the control plane at `path`: its token and JSON body.
fn last_call(gw: &Gateway, path: &str) -> (u32, Value) {
    let sent = gw.io.sent.last().expect("a call was sent");
    assert_eq!(sent.call.cluster, "gateway_control_plane");
    assert_eq!(sent.header(":path"), Some(path));
    (sent.token, serde_json::from_slice(&sent.call.body).unwrap_or(Value::Null))
}

/// Request 1 of a gateway whose key and policy are read first: the request then waits for
/// its lease call (its token and body).
fn first_request(gw: &mut Gateway, policy: Value) -> (u32, Value) {
    let (headers, body) = chat(SMALL);
    assert_eq!(gw.post(1, headers, &body).action, Action::Pause);
    let (token, _) =
        last_call(gw, "/internal/v1/keys/fca388cde4bdb3d2378087b069302e60f05aa76e56da3eddc327dedaabc85dc9");
    gw.answer(token, 200, &[], br#"{"workspace": "limited", "admin": false, "id": "key_1"}"#);
    let (token, _) = last_call(gw, "/internal/v1/workspaces/limited/policy");
    gw.answer(token, 200, &[], policy.to_string().as_bytes());
    lease_call(gw)
}

/// The root's next tick sends the asks for allowance requests wait for (and the timer's own
/// calls): the last call, to the control plane's lease endpoint.
fn lease_call(gw: &mut Gateway) -> (u32, Value) {
    gw.tick();
    last_call(gw, "/internal/v1/leases")
}

fn grant(lease: &str, granted: u64, bound: u64, remaining: u64, reset_s: u64) -> Vec<u8> {
    json!({"grants": [{"limit": "rpm", "kind": "requests", "lease": lease, "granted": granted, "ttl_ms": 5000,
                       "bound": bound, "remaining": remaining, "reset_s": reset_s}]})
    .to_string()
    .into_bytes()
}

fn rpm(limit: u64) -> Value {
    json!({"limits": [{"id": "rpm", "workspace": "limited", "requests_per_minute": limit}], "prices": {}})
}

#[test]
fn a_request_waits_for_its_workers_first_grant_then_later_ones_spend_the_lease_without_a_call() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let (token, asked) = first_request(&mut gw, rpm(3));
    assert_eq!(asked, json!({"grants": [{"limit": "rpm", "kind": "requests", "need": 1, "want": 1}], "reports": []}));
    let out = gw.answer(token, 200, &[], &grant("l1", 2, 3, 1, 60));
    assert_eq!(out.after, vec![After::ResumeRequest(1)]);
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:9000"));
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    // What is left: the control plane's 1 and the lease's 1.
    assert_eq!(gw.client_header(1, "x-ratelimit-limit-requests").as_deref(), Some("3"));
    assert_eq!(gw.client_header(1, "x-ratelimit-remaining-requests").as_deref(), Some("2"));
    assert_eq!(gw.client_header(1, "x-ratelimit-reset-requests").as_deref(), Some("60s"));

    let calls = gw.io.sent.len();
    let (headers, body) = chat(SMALL);
    assert_eq!(gw.post(2, headers, &body), Output::proceed(), "the lease has room: no call");
    assert_eq!(gw.io.sent.len(), calls);

    // The third does not fit: the control plane has nothing left for it.
    let (headers, body) = chat(SMALL);
    assert_eq!(gw.post(3, headers, &body).action, Action::Pause);
    let (token, asked) = lease_call(&mut gw);
    // Twice what the lease would use over its 5 s at the rate it was used (2 at once, counted
    // as 2 in its first 250 ms).
    assert_eq!(asked["grants"][0]["want"], 80, "twice its rate over a whole lease");
    // Asked from the root context: its answer never depends on a request that may end first.
    assert_eq!(gw.io.sent.last().map(|s| s.id), Some(0));
    let out = gw.answer(
        token,
        200,
        &[],
        &json!({"grants": [{"limit": "rpm", "kind": "requests", "lease": null,
        "granted": 0, "bound": 3, "remaining": 0, "reset_s": 42}]})
        .to_string()
        .into_bytes(),
    );
    let (id, status, headers, body) = reply(&out);
    assert_eq!((id, status), (3, 429));
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    assert_eq!(headers["retry-after"], "42");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(gw.upstream_header(3, ":authority").as_deref(), Some("gateway.local"), "no provider was called");
    let record = gw.finished(3).unwrap();
    assert_eq!((record.status, record.api_key_id.as_deref()), (429, Some("key_1")));
    assert!(gw.metrics().contains(&"gen_ai_gateway_limit_refusals_total.kind.requests 1".to_string()));
}

#[test]
fn a_budget_is_settled_at_the_reported_usage_and_the_lease_reported_once_it_ended() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let policy = json!({"limits": [{"id": "rpm", "workspace": "limited", "budget_usd": 1}],
                        "prices": {"m": {"input_per_million": 1000, "output_per_million": 1000}}});
    let (token, asked) = first_request(&mut gw, policy);
    // The worst case: the body's bytes and max_tokens at $1000 per million, in micro-USD.
    let worst = (SMALL.len() as u64 + 10) * 1000;
    assert_eq!(asked["grants"][0], json!({"limit": "rpm", "kind": "budget", "need": worst, "want": worst}));
    let answer = json!({"grants": [{"limit": "rpm", "kind": "budget", "lease": "b1", "granted": 500000,
        "ttl_ms": 5000, "bound": 1000000, "remaining": 500000, "reset_s": 86400}]});
    gw.answer(token, 200, &[], answer.to_string().as_bytes());
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    gw.response_body(1, COMPLETION_WITH_USAGE, true);
    let record = gw.finished(1).unwrap();
    // 9 + 4 tokens at $1000 per million.
    assert_eq!(record.cost_micro_usd, Some(13_000));
    assert_eq!(json_of(&record.to_json())["cost_usd"], 0.013);

    // The lease ends: the timer reports what it used.
    gw.advance_clock(5000);
    gw.tick();
    let (_, sent) = lease_call(&mut gw);
    assert_eq!(sent, json!({"grants": [], "reports": [{"lease": "b1", "used": 13000}]}));
}

#[test]
fn cached_prompt_tokens_are_charged_at_their_own_price() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let price = json!({"input_per_million": 1000, "cached_input_per_million": 100, "output_per_million": 1000});
    let policy = json!({"limits": [{"id": "rpm", "workspace": "limited", "budget_usd": 1}], "prices": {"m": price}});
    let (token, _) = first_request(&mut gw, policy);
    let answer = json!({"grants": [{"limit": "rpm", "kind": "budget", "lease": "b1", "granted": 500000,
        "ttl_ms": 5000, "bound": 1000000, "remaining": 500000, "reset_s": 86400}]});
    gw.answer(token, 200, &[], answer.to_string().as_bytes());
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    let completion = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}}"#;
    gw.response_body(1, completion, true);
    // 1 prompt token and 4 output tokens at $1000 per million, the 8 cached ones at $100.
    assert_eq!(gw.finished(1).unwrap().cost_micro_usd, Some(5_800));
    gw.advance_clock(5000);
    gw.tick();
    let (_, sent) = lease_call(&mut gw);
    assert_eq!(sent["reports"], json!([{"lease": "b1", "used": 5800}]));
}

#[test]
fn a_refusal_by_one_limit_frees_what_the_others_reserved() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let policy = json!({"limits": [
        {"id": "rpm", "workspace": "limited", "requests_per_minute": 10},
        {"id": "tpm", "api_key_id": "key_1", "tokens_per_minute": 50}
    ], "prices": {}});
    let (token, _) = first_request(&mut gw, policy);
    gw.answer(token, 200, &[], &grant("r1", 5, 10, 5, 60));
    let (token, asked) = lease_call(&mut gw);
    assert_eq!(asked["grants"][0]["kind"], "tokens");
    let none = json!({"grants": [{"limit": "tpm", "kind": "tokens", "lease": null, "granted": 0, "bound": 50,
        "remaining": 50, "reset_s": 0}]});
    let out = gw.answer(token, 200, &[], none.to_string().as_bytes());
    let (_, status, headers, body) = reply(&out);
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("tokens")));
    assert_eq!(headers["retry-after"], "1", "at least a second");
    gw.finished(1);
    // The request reservation was given back: the lease reports nothing used.
    gw.advance_clock(5000);
    gw.tick();
    let (_, sent) = lease_call(&mut gw);
    assert_eq!(sent["reports"], json!([{"lease": "r1", "used": 0}]));
}

#[test]
fn nothing_granted_while_other_replicas_hold_leases_asks_again_when_they_end() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let (token, _) = first_request(&mut gw, rpm(3));
    let wait = json!({"grants": [{"limit": "rpm", "kind": "requests", "lease": null, "granted": 0, "bound": 3,
        "remaining": 0, "reset_s": 60, "retry_ms": 800}]});
    assert_eq!(gw.answer(token, 200, &[], wait.to_string().as_bytes()).after, vec![]);
    assert_eq!(gw.io.ticks.last(), Some(&800));
    gw.advance_clock(800);
    gw.tick();
    let (token, _) = lease_call(&mut gw);
    let out = gw.answer(token, 200, &[], &grant("l2", 1, 3, 0, 60));
    assert_eq!(out.after, vec![After::ResumeRequest(1)]);
}

#[test]
fn a_control_plane_that_grants_nothing_is_a_503_never_a_pass() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let (token, _) = first_request(&mut gw, rpm(3));
    let out = gw.answer(token, 0, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("limits_unavailable")));
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("gateway.local"));
}

#[test]
fn a_stream_the_client_left_is_charged_at_most_its_input_and_what_reached_the_client() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let policy = json!({"limits": [{"id": "rpm", "workspace": "limited", "tokens_per_minute": 100000}], "prices": {}});
    let body = r#"{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (headers, bytes) = chat(body);
    gw.post(1, headers, &bytes);
    let (token, _) =
        last_call(&gw, "/internal/v1/keys/fca388cde4bdb3d2378087b069302e60f05aa76e56da3eddc327dedaabc85dc9");
    gw.answer(token, 200, &[], br#"{"workspace": "limited", "id": "key_1"}"#);
    let (token, _) = last_call(&gw, "/internal/v1/workspaces/limited/policy");
    gw.answer(token, 200, &[], policy.to_string().as_bytes());
    let (token, asked) = lease_call(&mut gw);
    assert_eq!(asked["grants"][0]["need"], body.len() + 1000);
    let answer = json!({"grants": [{"limit": "rpm", "kind": "tokens", "lease": "t1", "granted": 5000,
        "ttl_ms": 5000, "bound": 100000, "remaining": 90000, "reset_s": 60}]});
    gw.answer(token, 200, &[], answer.to_string().as_bytes());
    gw.response_headers(1, 200, &[("content-type", "text/event-stream")], "via_upstream");
    let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    gw.response_body(1, chunk, false);
    // The client leaves: no usage ever came.
    gw.finished(1);
    gw.advance_clock(5000);
    gw.tick();
    let (_, sent) = lease_call(&mut gw);
    // Admitted as its lease came, which the fake clock puts at the ask: offset 0.
    let used = body.len() + chunk.len();
    assert_eq!(sent["reports"], json!([{"lease": "t1", "used": used, "uses": [[0, used]]}]));
}

/// The leases' report among the calls a worker gone idle at `now_ms` would make (its records'
/// copy is the other one).
fn idle_report(gw: &mut Gateway, now_ms: u64) -> Option<Value> {
    let calls = gw.idle_calls(now_ms);
    let path = |call: &Dispatch| call.headers.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.clone());
    let leases = calls.iter().find(|call| path(call).as_deref() == Some("/internal/v1/leases"))?;
    serde_json::from_slice(&leases.body).ok()
}

#[test]
fn a_worker_gone_idle_reports_its_leases_only_when_its_idle_calls_went() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let (token, _) = first_request(&mut gw, rpm(10));
    gw.answer(token, 200, &[], &grant("l1", 4, 10, 6, 60));
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    gw.finished(1).unwrap();

    // The last stream ended: the lease is reported as if it ended now, and nothing changes.
    let now_ms = gw.io.host.now_ms.get();
    let report = json!({"lease": "l1", "used": 1, "uses": [[0, 1]]});
    assert_eq!(idle_report(&mut gw, now_ms), Some(json!({"grants": [], "reports": [report]})));
    // A request came before the calls went: they were dropped, and the lease still serves.
    let calls = gw.io.sent.len();
    let (headers, body) = chat(SMALL);
    assert_eq!(gw.post(2, headers, &body), Output::proceed(), "the lease has room: no call");
    gw.response_headers(2, 200, &[("content-type", "application/json")], "via_upstream");
    gw.finished(2).unwrap();
    assert_eq!(gw.io.sent.len(), calls);

    // This time the calls went: the lease ended then, and it is not reported again.
    assert_eq!(
        idle_report(&mut gw, now_ms).map(|r| r["reports"].clone()),
        Some(json!([{"lease": "l1", "used": 2, "uses": [[0, 2]]}]))
    );
    gw.idle_sent(now_ms, false);
    assert_eq!(idle_report(&mut gw, now_ms), None, "nothing left to report");
    let (headers, body) = chat(SMALL);
    assert_eq!(gw.post(3, headers, &body).action, Action::Pause, "no lease: the request waits for a grant");
    let (_, asked) = lease_call(&mut gw);
    assert_eq!(asked["reports"], json!([]));
    assert_eq!(asked["grants"][0]["want"], 80, "twice the ended lease's rate over a whole lease");
}
