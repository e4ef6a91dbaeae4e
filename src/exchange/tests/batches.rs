//! Gateway-managed batches (`completion_window: "immediate"`): the filter relays them, and
//! the requests about their ids, to the control plane through Envoy's router; without a
//! control plane `immediate` is a 501.

use super::*;

const CP_SETTINGS: &str = r#"{"api_keys": ["gw-key"],
    "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret",
                      "fresh_ms": 5000, "grace_ms": 600000, "timeout_ms": 3000}}"#;

const IMMEDIATE: &[u8] =
    br#"{"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "immediate"}"#;

fn caller(method: &str, path: &str) -> RawHeaders {
    request(
        method,
        path,
        &[
            ("x-gateway-api-key", "gw-key"),
            ("x-gateway-provider", "openai"),
            ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
            ("authorization", "Bearer sk-client"),
            ("content-type", "application/json"),
            ("accept-encoding", "gzip"),
            ("x-envoy-max-retries", "3"),
            ("x-gateway-workspace", "someone-else"),
        ],
    )
}

#[test]
fn an_immediate_batch_goes_to_the_control_plane_with_the_callers_headers() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let out = gw.post(1, caller("POST", "/v1/batches"), IMMEDIATE);
    assert_eq!(out, Output { action: Action::Continue, after: vec![] });
    assert!(gw.io.sent.is_empty(), "nothing dispatched: Envoy's router takes it");
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/internal/v1/batches"));
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:8790"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_control_plane"));
    assert_eq!(gw.upstream_header(1, "authorization").as_deref(), Some("Bearer cp-secret"));
    assert_eq!(gw.upstream_header(1, "x-gateway-workspace").as_deref(), Some("default"), "never the client's");
    assert_eq!(gw.upstream_header(1, "x-gateway-client-authorization").as_deref(), Some("Bearer sk-client"));
    // The headers that select the provider of each line stay.
    assert_eq!(gw.upstream_header(1, "x-gateway-api-key").as_deref(), Some("gw-key"));
    assert_eq!(gw.upstream_header(1, "x-gateway-provider").as_deref(), Some("openai"));
    assert_eq!(gw.upstream_header(1, "x-gateway-custom-host").as_deref(), Some("http://127.0.0.1:9000/v1"));
    assert_eq!(gw.upstream_header(1, "accept-encoding"), None);
    assert_eq!(gw.upstream_header(1, "x-envoy-max-retries"), None);
    // The body goes as it came; the control plane's answer passes back untouched.
    assert!(!gw.io.writes.iter().any(|w| matches!(w, Write::RequestBody(..))));
    let out = gw.response_headers(1, 200, &[("content-type", "application/json")], "via_upstream");
    assert_eq!(out.action, Action::Continue);
    assert_eq!(gw.response_body(1, br#"{"id":"batch_gw_1"}"#, true).action, Action::Continue);
    assert_eq!(gw.client_body(1), br#"{"id":"batch_gw_1"}"#.to_vec());
}

#[test]
fn managed_ids_go_to_the_control_plane_and_the_providers_ids_to_the_provider() {
    let mut gw = Gateway::new(CP_SETTINGS);
    for (id, method, path, internal) in [
        (1, "GET", "/v1/batches/batch_gw_abc", "/internal/v1/batches/batch_gw_abc"),
        (2, "POST", "/v1/batches/batch_gw_abc/cancel", "/internal/v1/batches/batch_gw_abc/cancel"),
        (3, "GET", "/v1/files/file-gw-1", "/internal/v1/files/file-gw-1"),
        (4, "GET", "/v1/files/file-gw-1/content", "/internal/v1/files/file-gw-1/content"),
    ] {
        let out = gw.request_headers(id, caller(method, path), false);
        assert_eq!(out.action, Action::Continue, "{path}");
        assert_eq!(gw.upstream_header(id, ":path").as_deref(), Some(internal));
        assert_eq!(gw.upstream_header(id, CLUSTER_HEADER).as_deref(), Some("gateway_control_plane"));
        assert_eq!(gw.upstream_header(id, "authorization").as_deref(), Some("Bearer cp-secret"));
        assert_eq!(gw.upstream_header(id, "x-gateway-workspace").as_deref(), Some("default"));
    }
    // A provider's batch and a 24h batch go to the provider.
    gw.request_headers(5, caller("GET", "/v1/batches/batch_abc"), false);
    assert_eq!(gw.upstream_header(5, ":authority").as_deref(), Some("127.0.0.1:9000"));
    let body = br#"{"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "24h"}"#;
    gw.post(6, caller("POST", "/v1/batches"), body);
    assert_eq!(gw.upstream_header(6, ":path").as_deref(), Some("/v1/batches"));
    assert_eq!(gw.upstream_header(6, "authorization").as_deref(), Some("Bearer sk-client"));
    // An invalid immediate batch is a 400 here, never relayed.
    let bad = br#"{"input_file_id": "", "endpoint": "/v1/chat/completions", "completion_window": "immediate"}"#;
    let (_, status, _, body) = reply(&gw.post(7, caller("POST", "/v1/batches"), bad));
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("input_file_id")));
}

#[test]
fn without_a_control_plane_immediate_is_a_501_and_managed_ids_go_to_the_provider() {
    let mut gw = Gateway::new(r#"{"api_keys": ["gw-key"]}"#);
    let (_, status, _, body) = reply(&gw.post(1, caller("POST", "/v1/batches"), IMMEDIATE));
    assert_eq!((status, body["error"]["code"].as_str()), (501, Some("not_implemented")));
    gw.request_headers(2, caller("GET", "/v1/batches/batch_gw_abc"), false);
    assert_eq!(gw.upstream_header(2, ":authority").as_deref(), Some("127.0.0.1:9000"));
}

#[test]
fn an_immediate_batch_needs_a_selected_provider() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let headers =
        request("POST", "/v1/batches", &[("x-gateway-api-key", "gw-key"), ("content-type", "application/json")]);
    let (_, status, _, body) = reply(&gw.post(1, headers, IMMEDIATE));
    assert!(matches!(status, 400 | 401), "{status} {body}");
    assert!(gw.io.sent.is_empty());
}
