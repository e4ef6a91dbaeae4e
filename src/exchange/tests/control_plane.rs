//! The control plane as the gateway reads it: gateway keys, saved configs, stored providers
//! and guardrails fetched by dispatched calls, kept fresh a while, served stale while the
//! control plane is down (within the grace period), and never shared between workspaces.

use super::*;
use crate::unit_tests::test;
use sha2::{Digest, Sha256};

const CP_SETTINGS: &str = r#"{"api_keys": ["gw-key"], "cache": {"byte_budget": 1048576, "max_entry_bytes": 65536},
    "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret",
                      "fresh_ms": 5000, "grace_ms": 600000, "timeout_ms": 3000}}"#;

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A chat request with `key` and `extra` gateway headers.
fn chat(key: &str, extra: &[(&str, &str)]) -> RawHeaders {
    let mut headers = vec![("x-gateway-api-key", key), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    request("POST", "/v1/chat/completions", &headers)
}

/// The header values the request goes upstream with (after `ResumeRequest` or `Continue`).
fn routed_to(gw: &mut Gateway, id: u32) -> (Option<String>, Option<String>) {
    (gw.upstream_header(id, ":authority"), gw.upstream_header(id, "authorization"))
}

/// Calls sent so far to the control plane, as their paths.
fn cp_paths(gw: &Gateway) -> Vec<String> {
    gw.io
        .sent
        .iter()
        .filter(|s| s.call.cluster == "gateway_control_plane")
        .map(|s| s.header(":path").unwrap_or_default().to_string())
        .collect()
}

/// The last call sent, which must be to the control plane at `path`; its token.
fn last_lookup(gw: &Gateway, path: &str) -> u32 {
    let sent = gw.io.sent.last().expect("a call was sent");
    assert_eq!(sent.call.cluster, "gateway_control_plane");
    assert_eq!(sent.header(":path"), Some(path));
    sent.token
}

fn value(v: Value) -> Vec<u8> {
    json!({"id": "0b7c", "slug": "s", "version_id": "v1", "value": v}).to_string().into_bytes()
}

fn stored_openai(key: &str) -> Value {
    json!({"provider": "openai", "api_key": key, "custom_host": "http://127.0.0.1:9000/v1"})
}

fn resumed(out: &Output, id: u32) -> bool {
    out.after == vec![After::ResumeRequest(id)]
}

#[test]
fn an_unknown_key_is_looked_up_by_its_hash_then_the_request_routes_and_a_warm_one_makes_no_call() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat(
        "gw-team-key",
        &[
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-c"),
        ],
    );
    let out = gw.request_headers(1, headers.clone(), true);
    assert_eq!(out, Output { action: Action::Pause, after: vec![] });
    let path = format!("/internal/v1/keys/{}", sha256_hex("gw-team-key"));
    let token = last_lookup(&gw, &path);
    let call = &gw.io.sent[0];
    assert_eq!(call.header(":authority"), Some("127.0.0.1:8790"));
    assert_eq!(call.header("authorization"), Some("Bearer cp-secret"));
    assert_eq!(call.call.timeout_ms, 3000);
    assert!(!call.call.headers.iter().any(|(_, v)| v.contains("gw-team-key")), "the key never leaves");
    // The body arrives meanwhile and is held.
    assert_eq!(gw.request_body(1, CHAT).action, Action::Pause);
    let out = gw.answer(token, 200, &[], br#"{"workspace": "team-a", "admin": false}"#);
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(routed_to(&mut gw, 1), (Some("127.0.0.1:9000".into()), Some("Bearer sk-c".into())));
    assert_eq!(gw.finished(1).unwrap().workspace, "team-a");

    // Warm: no call at all.
    assert_eq!(gw.post(2, headers, CHAT), Output::proceed());
    assert_eq!(cp_paths(&gw).len(), 1);

    // A key the control plane does not know: 401 as always (and that is remembered too).
    gw.request_headers(3, chat("gw-nope", &[("x-gateway-provider", "openai")]), true);
    let out = gw.answer(last_lookup(&gw, &format!("/internal/v1/keys/{}", sha256_hex("gw-nope"))), 404, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("invalid_api_key")));
    let out = gw.request_headers(4, chat("gw-nope", &[("x-gateway-provider", "openai")]), true);
    assert_eq!(reply(&out).1, 401);
    assert_eq!(cp_paths(&gw).len(), 2);
}

#[test]
fn a_read_two_requests_wait_for_is_the_root_contexts_call_and_outlives_the_first() {
    // Envoy cancels a context's calls when the context ends: a read dispatched on the request
    // that started it would be lost with that request, and every request that joined it would
    // wait for ever. The read is the root context's call (0 in the fake host).
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers =
        chat("gw-team-key", &[("x-gateway-provider", "openai"), ("x-gateway-custom-host", "http://127.0.0.1:9000/v1")]);
    assert_eq!(gw.post(1, headers.clone(), CHAT).action, Action::Pause);
    assert_eq!(gw.post(2, headers, CHAT).action, Action::Pause);
    let [call] = gw.io.sent.as_slice() else { panic!("one read for both: {:?}", gw.io.sent) };
    assert_eq!(call.id, 0, "dispatched on the root context");
    let token = call.token;
    // The first request's client leaves before the answer.
    assert!(gw.finished(1).is_some());
    let out = gw.answer(token, 200, &[], br#"{"workspace": "team-a", "admin": false}"#);
    assert!(resumed(&out, 2), "{out:?}");
}

#[test]
fn a_read_whose_call_never_answers_is_given_up_and_its_waiters_answered() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat("gw-team-key", &[("x-gateway-provider", "openai")]);
    assert_eq!(gw.post(1, headers.clone(), CHAT).action, Action::Pause);
    let token = gw.io.sent[0].token;
    assert_eq!(gw.io.ticks.last(), Some(&70_000), "the timer is set for when the read counts as lost");
    gw.advance_clock(69_999);
    assert_eq!(gw.tick(), Output::proceed(), "not yet");
    assert_eq!(gw.post(2, headers, CHAT).action, Action::Pause, "joins the read on its way");
    assert_eq!(gw.io.sent.len(), 1);
    gw.advance_clock(1);
    let out = gw.tick();
    let replies: Vec<u16> = out
        .after
        .iter()
        .filter_map(|after| match after {
            After::Reply { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(replies, [503, 503], "both waiters answered as when the control plane does not answer");
    // Its call's late answer finds nothing to do.
    assert_eq!(gw.answer(token, 200, &[], br#"{"workspace": "team-a", "admin": false}"#), Output::proceed());
}

#[test]
fn a_read_whose_call_the_host_lost_is_sent_again_for_its_waiters_or_forgotten_without_them() {
    // The native module's root calls ride on a stream, and Envoy cancels them with it.
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers =
        chat("gw-team-key", &[("x-gateway-provider", "openai"), ("x-gateway-custom-host", "http://127.0.0.1:9000/v1")]);
    assert_eq!(gw.post(1, headers.clone(), CHAT).action, Action::Pause);
    assert_eq!(gw.post(2, headers, CHAT).action, Action::Pause);
    let path = format!("/internal/v1/keys/{}", sha256_hex("gw-team-key"));
    let lost = last_lookup(&gw, &path);
    assert!(gw.finished(1).is_some());
    assert_eq!(gw.worker.call_lost(lost, &mut gw.io), Output::proceed(), "request 2 still waits");
    assert_eq!(gw.io.ticks.last(), Some(&1), "sent again from the next tick");
    gw.advance_clock(1);
    assert_eq!(gw.tick().after, Vec::new());
    let again = last_lookup(&gw, &path);
    assert_ne!(again, lost);
    assert_eq!(gw.answer(lost, 200, &[], br#"{"workspace": "team-a", "admin": false}"#), Output::proceed());
    let out = gw.answer(again, 200, &[], br#"{"workspace": "team-a", "admin": false}"#);
    assert!(resumed(&out, 2), "{out:?}");
    // Lost with nobody waiting: answered as failed, and the next request reads again.
    let headers = chat("gw-other-key", &[("x-gateway-provider", "openai")]);
    assert_eq!(gw.post(3, headers.clone(), CHAT).action, Action::Pause);
    let path = format!("/internal/v1/keys/{}", sha256_hex("gw-other-key"));
    let lost = last_lookup(&gw, &path);
    assert!(gw.finished(3).is_some());
    assert_eq!(gw.worker.call_lost(lost, &mut gw.io), Output::proceed());
    assert_eq!(gw.post(4, headers, CHAT).action, Action::Pause);
    assert_ne!(last_lookup(&gw, &path), lost, "a new read");
}

#[test]
fn a_saved_config_and_an_at_slug_are_read_one_after_the_other_then_the_request_routes() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat("gw-key", &[("x-gateway-config", "team-config")]);
    assert_eq!(gw.post(1, headers.clone(), CHAT).action, Action::Pause);
    let token = last_lookup(&gw, "/internal/v1/workspaces/default/configs/team-config");
    let config =
        json!({"strategy": {"mode": "fallback"}, "targets": [{"provider": "@prod"}, {"virtual_key": "backup"}]});
    let out = gw.answer(token, 200, &[], &value(config));
    assert!(out.after.is_empty(), "still waiting: {out:?}");
    let token = last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod");
    let out = gw.answer(token, 200, &[], &value(stored_openai("sk-prod")));
    assert!(out.after.is_empty(), "the fallback's second target is read too");
    let token = last_lookup(&gw, "/internal/v1/workspaces/default/providers/backup");
    let out = gw.answer(token, 200, &[], &value(stored_openai("sk-backup")));
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(routed_to(&mut gw, 1), (Some("127.0.0.1:9000".into()), Some("Bearer sk-prod".into())));
    assert_eq!(gw.upstream_header(1, TARGET_HEADER), None);

    // Warm, with the header provider too: no call.
    assert_eq!(gw.post(2, headers, CHAT), Output::proceed());
    assert_eq!(gw.post(3, chat("gw-key", &[("x-gateway-provider", "@prod")]), CHAT), Output::proceed());
    assert_eq!(cp_paths(&gw).len(), 3);
    // Plugin credentials come first and need no call.
    assert_eq!(routed_to(&mut gw, 3).1.as_deref(), Some("Bearer sk-prod"));
}

#[test]
fn requests_waiting_for_the_same_entry_share_one_call() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat("gw-key", &[("x-gateway-provider", "@shared"), ("x-gateway-trace-id", "t")]);
    for id in 1..=3 {
        assert_eq!(gw.post(id, headers.clone(), CHAT).action, Action::Pause);
    }
    assert_eq!(cp_paths(&gw), vec!["/internal/v1/workspaces/default/providers/shared".to_string()]);
    // One of them goes away meanwhile: the call still serves the others.
    gw.finished(2);
    let token = last_lookup(&gw, "/internal/v1/workspaces/default/providers/shared");
    let out = gw.answer(token, 200, &[], &value(stored_openai("sk-s")));
    assert_eq!(out.after, vec![After::ResumeRequest(1), After::ResumeRequest(3)]);
    assert_eq!(routed_to(&mut gw, 3).1.as_deref(), Some("Bearer sk-s"));
}

#[test]
fn unknown_ids_are_404s_in_openai_shape_and_odd_ids_are_never_sent() {
    let mut gw = Gateway::new(CP_SETTINGS);
    gw.post(1, chat("gw-key", &[("x-gateway-config", "nope")]), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/configs/nope"), 404, &[], b"{}");
    let (_, status, headers, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("config_not_found")));
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("'nope'"));
    assert_eq!(headers["content-type"], "application/json");
    // Absent is remembered like found: no second call.
    let out = gw.request_headers(2, chat("gw-key", &[("x-gateway-config", "nope")]), false);
    assert_eq!(reply(&out).1, 404);
    assert_eq!(cp_paths(&gw).len(), 1);

    gw.post(3, chat("gw-key", &[("x-gateway-provider", "@gone")]), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/gone"), 404, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("provider_not_found")));

    // Ids outside [A-Za-z0-9._-] are unknown without a call (never another upstream path).
    for (id, provider) in [(10, "@../x"), (11, "@a?b"), (12, "@a/b")] {
        let out = gw.post(id, chat("gw-key", &[("x-gateway-provider", provider)]), CHAT);
        let (_, status, _, body) = reply(&out);
        assert_eq!((status, body["error"]["code"].as_str()), (404, Some("provider_not_found")), "{provider}: {body}");
    }
    // A saved config id outside the charset likewise.
    let out = gw.request_headers(14, chat("gw-key", &[("x-gateway-config", "../keys/x")]), true);
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("config_not_found")));
    // (A percent-encoded header value is refused earlier still.)
    let out = gw.post(13, chat("gw-key", &[("x-gateway-virtual-key", "a%2F..%2Fkeys")]), CHAT);
    assert!(reply(&out).1 >= 400);
    assert_eq!(cp_paths(&gw).len(), 2);
}

#[test]
fn a_control_plane_that_is_down_serves_what_was_read_within_grace_and_503s_the_rest() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat("gw-key", &[("x-gateway-provider", "@prod")]);
    // Never read: 503 with a clear error (no answer, then a 5xx).
    gw.post(1, headers.clone(), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"), 0, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("control_plane_unavailable")));
    assert!(body["error"]["message"].as_str().unwrap().contains("stored provider 'prod'"), "{body}");
    gw.post(2, headers.clone(), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"), 503, &[], b"down");
    assert_eq!(reply(&out).1, 503);

    // Read once...
    gw.post(3, headers.clone(), CHAT);
    let out = gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"),
        200,
        &[],
        &value(stored_openai("sk-1")),
    );
    assert!(resumed(&out, 3));
    // ...fresh for 5 s: no call.
    gw.advance_clock(5000);
    assert_eq!(gw.post(4, headers.clone(), CHAT), Output::proceed());
    assert_eq!(cp_paths(&gw).len(), 3);
    // Then read again; the control plane is down: what was read serves.
    gw.advance_clock(1);
    assert_eq!(gw.post(5, headers.clone(), CHAT).action, Action::Pause);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"), 0, &[], b"");
    assert!(resumed(&out, 5), "{out:?}");
    assert_eq!(routed_to(&mut gw, 5).1.as_deref(), Some("Bearer sk-1"));
    // Meanwhile it is used without asking again for another 5 s (not one call per request).
    assert_eq!(gw.post(6, headers.clone(), CHAT), Output::proceed());
    assert_eq!(cp_paths(&gw).len(), 4);
    // Then asked again; the dispatch itself failing counts as down too.
    gw.advance_clock(5001);
    gw.io.dispatch_fails = true;
    assert_eq!(gw.post(9, headers.clone(), CHAT), Output::proceed());
    // Until the grace period (counted from the read) is over: then 503.
    gw.advance_clock(600_000 - 5001);
    let out = gw.post(7, headers.clone(), CHAT);
    assert_eq!(reply(&out).1, 503);
    gw.io.dispatch_fails = false;
    gw.post(8, headers, CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"), 500, &[], b"");
    assert_eq!(reply(&out).1, 503);
}

#[test]
fn workspaces_never_see_each_others_items_or_cached_answers() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let team_key = "gw-team-b";
    let key_path = format!("/internal/v1/keys/{}", sha256_hex(team_key));
    let with_config = |key: &str| chat(key, &[("x-gateway-config", "shared-name")]);
    let cached = {
        let mut target = stored_openai("sk-same");
        target["cache"] = json!({"mode": "simple"});
        target
    };

    // Workspace default: its own config under the name, answered and cached.
    gw.post(1, with_config("gw-key"), CHAT);
    let out = gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/configs/shared-name"),
        200,
        &[],
        &value(cached.clone()),
    );
    assert!(resumed(&out, 1));
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(1, STATUS_HEADER).as_deref(), Some("MISS"));
    gw.response_body(1, COMPLETION, true);
    gw.finished(1);

    // Workspace team-b: the same name is its own item, read under its own workspace...
    gw.post(2, with_config(team_key), CHAT);
    gw.answer(last_lookup(&gw, &key_path), 200, &[], br#"{"workspace": "team-b", "admin": false}"#);
    let out =
        gw.answer(last_lookup(&gw, "/internal/v1/workspaces/team-b/configs/shared-name"), 200, &[], &value(cached));
    assert!(resumed(&out, 2), "{out:?}");
    // ...and the same request is not answered from the other workspace's cache.
    gw.response_headers(2, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(gw.client_header(2, STATUS_HEADER).as_deref(), Some("MISS"));
    gw.response_body(2, COMPLETION, true);
    gw.finished(2);

    // A stored provider of team-b is not default's: its 404 is default's own.
    gw.post(3, chat("gw-key", &[("x-gateway-provider", "@team-b-only")]), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/providers/team-b-only"), 404, &[], b"");
    assert_eq!(reply(&out).1, 404);
    assert_eq!(gw.finished(3).unwrap().workspace, "default", "errors are recorded with the workspace too");

    // Within a workspace the cache is shared by its keys: default's static key hits.
    gw.request_headers(4, with_config("gw-key"), true);
    let out = gw.request_body(4, CHAT);
    let (_, status, headers, _) = reply(&out);
    assert_eq!((status, headers[STATUS_HEADER].as_str()), (200, "HIT"));
}

#[test]
fn a_stored_guardrail_runs_like_an_inline_one() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let mut config = stored_openai("sk-1");
    config["input_guardrails"] = json!(["no-secrets"]);
    let headers = chat_with_config("gw-key", &config);
    gw.post(
        1,
        headers.clone(),
        &json!({"model": "m", "messages": [{"role": "user", "content": "the secret"}]}).to_string().into_bytes(),
    );
    let guardrail = json!({"name": "No secrets", "checks": [
        {"id": "default.contains", "parameters": {"words": ["secret"], "operator": "none"}, "is_enabled": true},
        {"id": "default.contains", "parameters": {"words": ["the"], "operator": "none"}, "is_enabled": false}],
        "actions": {"deny": true, "async": false}});
    let out = gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/guardrails/no-secrets"),
        200,
        &[],
        &value(guardrail),
    );
    let (_, status, _, body) = reply(&out);
    assert_eq!(status, 446);
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!((hook["id"].as_str(), hook["deny"].as_bool()), (Some("no-secrets"), Some(true)));
    assert_eq!(hook["checks"].as_array().map(Vec::len), Some(1), "the disabled check does not run");
    // A clean prompt passes (warm: no call).
    assert_eq!(gw.post(2, headers, CHAT), Output::proceed());
    assert_eq!(cp_paths(&gw).len(), 1);
    // An unknown guardrail is a 404.
    config["input_guardrails"] = json!(["missing"]);
    gw.post(3, chat_with_config("gw-key", &config), CHAT);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/guardrails/missing"), 404, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("guardrail_not_found")));
}

#[test]
fn health_follows_the_control_plane() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let out = gw.request_headers(1, request("GET", "/health", &[]), false);
    assert_eq!(out, Output { action: Action::Pause, after: vec![] });
    let token = last_lookup(&gw, "/health");
    assert_eq!(gw.io.sent[0].header("authorization"), None);
    let (_, status, _, body) = reply(&gw.answer(token, 200, &[], br#"{"status":"ok"}"#));
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    // Never cached: each health check asks.
    gw.request_headers(2, request("GET", "/health", &[]), false);
    let (_, status, _, body) = reply(&gw.answer(last_lookup(&gw, "/health"), 0, &[], b""));
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("control_plane_unavailable")));
    gw.request_headers(3, request("GET", "/health", &[]), false);
    assert_eq!(reply(&gw.answer(last_lookup(&gw, "/health"), 503, &[], b"")).1, 503);
    gw.io.dispatch_fails = true;
    assert_eq!(reply(&gw.request_headers(4, request("GET", "/health", &[]), false)).1, 503);
}

#[test]
fn without_a_control_plane_nothing_is_looked_up() {
    let mut gw = Gateway::new(SETTINGS);
    let out = gw.request_headers(1, chat("gw-key", &[("x-gateway-config", "saved-id")]), true);
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("saved_config_unavailable")));
    let out = gw.request_headers(2, chat("gw-unknown", &[("x-gateway-provider", "openai")]), true);
    assert_eq!(reply(&out).1, 401);
    let out = gw.post(3, chat("gw-key", &[("x-gateway-provider", "@nope")]), CHAT);
    assert_eq!(reply(&out).1, 401);
    assert!(gw.io.sent.is_empty());
    assert_eq!(gw.finished(3).unwrap().workspace, "", "no workspace in the record");
}

#[test]
fn an_entry_that_arrives_before_the_body_lets_the_body_route_the_request() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = chat(
        "gw-team",
        &[
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-c"),
            (CLUSTER_HEADER, "gateway_recovery"),
        ],
    );
    assert_eq!(gw.request_headers(1, headers, true).action, Action::Pause);
    // Held meanwhile, and routed nowhere should Envoy let it go.
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some(UNROUTED));
    gw.io.streams(1).request_body.extend_from_slice(&CHAT[..10]);
    assert_eq!(gw.worker.request_body(1, 10, false, &mut gw.io).action, Action::Pause);
    // The key is read before the body is complete: nothing to resume yet.
    let path = format!("/internal/v1/keys/{}", sha256_hex("gw-team"));
    let out = gw.answer(last_lookup(&gw, &path), 200, &[], br#"{"workspace": "team"}"#);
    assert!(out.after.is_empty(), "{out:?}");
    gw.io.streams(1).request_body.extend_from_slice(&CHAT[10..]);
    assert_eq!(gw.worker.request_body(1, CHAT.len(), true, &mut gw.io), Output::proceed());
    assert_eq!(routed_to(&mut gw, 1).1.as_deref(), Some("Bearer sk-c"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_upstream_plain"));
}

#[test]
fn a_request_without_a_body_is_resumed_once_its_entries_arrived() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let out = gw.request_headers(
        1,
        request("GET", "/v1/models", &[("x-gateway-api-key", "gw-key"), ("x-gateway-virtual-key", "vk")]),
        false,
    );
    assert_eq!(out.action, Action::Pause);
    let out = gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/providers/vk"),
        200,
        &[],
        &value(stored_openai("sk-v")),
    );
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/v1/models"));
    assert_eq!(routed_to(&mut gw, 1).1.as_deref(), Some("Bearer sk-v"));
}

fn greeting() -> Vec<u8> {
    value(json!({"string": "Hello {{name}}", "model": "gpt-x", "parameters": {"temperature": 0.2, "max_tokens": 9}}))
}

/// The body the request goes upstream with.
fn upstream_body(gw: &mut Gateway, id: u32) -> Value {
    json_of(&gw.io.streams(id).request_body)
}

#[test]
fn a_config_prompt_id_renders_the_stored_prompt_into_the_chat_request() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let mut config = stored_openai("sk-1");
    config["prompt_id"] = json!("greet");
    let headers = chat_with_config("gw-key", &config);
    // Read as soon as the headers are in.
    assert_eq!(gw.request_headers(1, headers.clone(), true).action, Action::Pause);
    let token = last_lookup(&gw, "/internal/v1/workspaces/default/prompts/greet");
    // The body may omit model and messages; its own messages follow, its fields win.
    let body = json!({"variables": {"name": "Ada"}, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "and more"}]});
    assert_eq!(gw.request_body(1, body.to_string().as_bytes()).action, Action::Pause);
    let out = gw.answer(token, 200, &[], &greeting());
    assert!(resumed(&out, 1), "{out:?}");
    let sent = upstream_body(&mut gw, 1);
    assert_eq!(sent["model"], "gpt-x");
    assert_eq!((sent["temperature"].as_f64(), sent["max_tokens"].as_u64()), (Some(0.2), Some(5)));
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": "Hello Ada"}, {"role": "user", "content": "and more"}])
    );
    assert!(sent.get("variables").is_none(), "variables never go upstream");
    assert_eq!(gw.finished(1).unwrap().model, "gpt-x");

    // Warm; a missing variable is a 400 naming it.
    let out = gw.post(2, headers.clone(), br#"{"variables": {}}"#);
    let (_, status, _, body) = reply(&out);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("name"), "{body}");
    assert_eq!(cp_paths(&gw).len(), 1);

    // Validation runs on the merged request.
    let out = gw.post(3, headers, br#"{"variables": {"name": "x"}, "messages": "no"}"#);
    assert_eq!(reply(&out).1, 400);

    // An unknown prompt is a 404 before the body is even read.
    config["prompt_id"] = json!("nope");
    gw.request_headers(4, chat_with_config("gw-key", &config), true);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/prompts/nope"), 404, &[], b"");
    let (_, status, _, body) = reply(&out);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("prompt_not_found")));
}

#[test]
fn prompt_completions_render_then_go_as_a_chat_completion() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = request(
        "POST",
        "/v1/prompts/greet/completions",
        &[
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-c"),
        ],
    );
    assert_eq!(gw.request_headers(1, headers.clone(), true).action, Action::Pause);
    gw.request_body(1, br#"{"variables": {"name": "Bo"}, "temperature": 0.9}"#);
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/prompts/greet"), 200, &[], &greeting());
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/v1/chat/completions"));
    let sent = upstream_body(&mut gw, 1);
    assert_eq!((sent["model"].as_str(), sent["temperature"].as_f64()), (Some("gpt-x"), Some(0.9)));
    assert_eq!(sent["messages"], json!([{"role": "user", "content": "Hello Bo"}]));
    assert!(sent.get("variables").is_none());
    // The answer comes back as the chat completion it is.
    gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    gw.response_body(1, COMPLETION, true);
    assert_eq!(json_of(&gw.client_body(1))["object"], "chat.completion");

    // Another workspace does not see the prompt: its own 404.
    let mut other = headers.clone();
    set_header(&mut other, "x-gateway-api-key", Some(b"gw-team"));
    gw.request_headers(2, other, true);
    gw.answer(
        last_lookup(&gw, &format!("/internal/v1/keys/{}", sha256_hex("gw-team"))),
        200,
        &[],
        br#"{"workspace": "team"}"#,
    );
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/team/prompts/greet"), 404, &[], b"");
    assert_eq!(reply(&out).1, 404);

    // Without a control plane there are no prompts.
    let mut gw = Gateway::new(SETTINGS);
    let out = gw.request_headers(1, headers, true);
    assert_eq!(reply(&out).1, 501);
}

#[test]
fn a_streamed_upload_waits_for_the_key_then_goes_as_it_came() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = request(
        "POST",
        "/v1/files",
        &[
            ("x-gateway-api-key", "gw-team"),
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-c"),
            ("content-type", "multipart/form-data; boundary=b"),
        ],
    );
    assert_eq!(gw.request_headers(1, headers, true).action, Action::Pause);
    assert_eq!(gw.request_body(1, b"--b\r\n...file...\r\n--b--").action, Action::Pause, "buffered by Envoy");
    let path = format!("/internal/v1/keys/{}", sha256_hex("gw-team"));
    let out = gw.answer(last_lookup(&gw, &path), 200, &[], br#"{"workspace": "team"}"#);
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/v1/files"));
    assert!(!gw.io.writes_of(1).iter().any(|w| matches!(w, Write::RequestBody(..))), "the body goes as it came");
    // Trailers before the body ended: refused, never sent on unchecked.
    gw.request_headers(2, chat("gw-other-team", &[("x-gateway-provider", "openai")]), true);
    let out = gw.worker.request_trailers(2, &mut gw.io);
    assert_eq!(reply(&out).1, 400);
}

#[test]
fn a_prompt_with_its_own_virtual_key_needs_no_provider_header() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers = request("POST", "/v1/prompts/greet/completions", &[("x-gateway-api-key", "gw-key")]);
    gw.post(1, headers, br#"{"variables": {"name": "Cy"}}"#);
    let version = json!({"string": "Hi {{name}}", "model": "gpt-x", "virtual_key": "prompt-vk"});
    let out = gw.answer(last_lookup(&gw, "/internal/v1/workspaces/default/prompts/greet"), 200, &[], &value(version));
    assert!(out.after.is_empty());
    let out = gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/providers/prompt-vk"),
        200,
        &[],
        &value(stored_openai("sk-vk")),
    );
    assert!(resumed(&out, 1), "{out:?}");
    assert_eq!(routed_to(&mut gw, 1).1.as_deref(), Some("Bearer sk-vk"));
}

#[test]
#[ignore = "a timing, not a check: cargo test --release -- --ignored --nocapture warm_cost"]
fn warm_cost() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let saved = chat("gw-key", &[("x-gateway-config", "cfg")]);
    gw.post(1, saved.clone(), CHAT);
    gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/configs/cfg"),
        200,
        &[],
        &value(json!({"provider": "@prod"})),
    );
    gw.answer(
        last_lookup(&gw, "/internal/v1/workspaces/default/providers/prod"),
        200,
        &[],
        &value(stored_openai("sk-p")),
    );
    let inline = chat_with_config("gw-key", &stored_openai("sk-p"));
    let mut time = |headers: &RawHeaders| {
        let start = std::time::Instant::now();
        for id in 10..20_010 {
            assert_eq!(gw.post(id, headers.clone(), CHAT), Output::proceed());
            gw.finished(id);
            gw.io.streams.remove(&id);
            gw.io.writes.clear();
        }
        start.elapsed().as_nanos() / 20_000
    };
    let (a, b) = (time(&inline), time(&saved));
    let (a, b) = (a.min(time(&inline)), b.min(time(&saved)));
    println!("warm request: config in the header {a} ns, saved config + @slug {b} ns");
}

#[test]
fn a_lookup_gate_reads_the_entries_then_lets_the_request_pass_untouched() {
    let mut gw = Gateway::new(&CP_SETTINGS.replacen('{', r#"{"lookup_gate": true, "#, 1));
    let headers = chat("gw-team-key", &[("x-gateway-config", "team-config")]);
    assert_eq!(gw.request_headers(1, headers.clone(), false).action, Action::Pause);
    let token = last_lookup(&gw, &format!("/internal/v1/keys/{}", sha256_hex("gw-team-key")));
    let out = gw.answer(token, 200, &[], br#"{"workspace": "team-a", "admin": false}"#);
    assert!(out.after.is_empty(), "the saved config is read next: {out:?}");
    let token = last_lookup(&gw, "/internal/v1/workspaces/team-a/configs/team-config");
    let config = json!({"provider": "openai", "api_key": "sk-a", "custom_host": "http://127.0.0.1:9000/v1"});
    assert!(resumed(&gw.answer(token, 200, &[], &value(config)), 1));
    // Nothing changed, answered or recorded: the main instance does that, with the entries read.
    assert!(gw.io.writes.is_empty(), "{:?}", gw.io.writes);
    assert_eq!(gw.request_body(1, CHAT).action, Action::Continue);
    assert!(gw.finished(1).is_none() && gw.io.access_lines.is_empty());

    // Warm: passes at once. A request the gate cannot place (an error) passes to the main
    // instance, which answers it; so does one whose read failed.
    assert_eq!(gw.request_headers(2, headers, false), Output::proceed());
    let keyless = request("POST", "/v1/chat/completions", &[("content-type", "application/json")]);
    assert_eq!(gw.request_headers(3, keyless, false), Output::proceed());
    assert_eq!(gw.request_headers(4, chat("gw-other-key", &[]), false).action, Action::Pause);
    let token = last_lookup(&gw, &format!("/internal/v1/keys/{}", sha256_hex("gw-other-key")));
    assert!(resumed(&gw.answer(token, 503, &[], b"down"), 4));
    assert!(gw.io.writes.is_empty(), "{:?}", gw.io.writes);
    assert_eq!(cp_paths(&gw).len(), 3);
}
