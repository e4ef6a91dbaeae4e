//! Gateway-managed batches (`completion_window: "immediate"`): the filter relays them, and
//! the requests about their ids, to the control plane through Envoy's router; without a
//! control plane `immediate` is a 501.

use super::*;
use crate::unit_tests::test;
use crate::wire_names::{control_plane_fetch_marker, CONTROL_PLANE_FETCH_HEADER};

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

#[test]
fn the_batch_list_goes_to_the_control_plane_unless_the_control_plane_asks_for_the_providers() {
    let mut gw = Gateway::new(CP_SETTINGS);
    gw.request_headers(1, caller("GET", "/v1/batches?limit=2&after=batch_gw_1"), false);
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/internal/v1/batches?limit=2&after=batch_gw_1"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_control_plane"));
    assert_eq!(gw.upstream_header(1, "x-gateway-workspace").as_deref(), Some("default"));
    // The list's query is checked here first.
    let (_, status, _, body) = reply(&gw.request_headers(2, caller("GET", "/v1/batches?limit=0"), false));
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("limit")));
    // The control plane's own read of the provider's list, marked, goes to the provider
    // without the mark; a mark the client made up changes nothing.
    let marked = |id, mark: &str| {
        let mut headers = caller("GET", "/v1/batches?limit=2");
        headers.push((CONTROL_PLANE_FETCH_HEADER.to_string(), mark.as_bytes().to_vec()));
        (id, headers)
    };
    let (id, headers) = marked(3, &control_plane_fetch_marker("cp-secret"));
    gw.request_headers(id, headers, false);
    assert_eq!(gw.upstream_header(3, ":authority").as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(gw.upstream_header(3, ":path").as_deref(), Some("/v1/batches?limit=2"));
    assert_eq!(gw.upstream_header(3, CONTROL_PLANE_FETCH_HEADER), None);
    for (id, mark) in [(4, control_plane_fetch_marker("other-token")), (5, "cp-secret".to_string())] {
        let (id, headers) = marked(id, &mark);
        gw.request_headers(id, headers, false);
        assert_eq!(gw.upstream_header(id, ":path").as_deref(), Some("/internal/v1/batches?limit=2"), "{mark}");
        assert_eq!(gw.upstream_header(id, CONTROL_PLANE_FETCH_HEADER), None, "never relayed on");
    }
}

#[test]
fn the_mark_never_reaches_a_provider_even_when_forwarded_by_name() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let mut headers = caller("GET", "/v1/models");
    headers.push((CONTROL_PLANE_FETCH_HEADER.to_string(), control_plane_fetch_marker("cp-secret").into_bytes()));
    headers.push(("x-gateway-forward-headers".to_string(), CONTROL_PLANE_FETCH_HEADER.as_bytes().to_vec()));
    gw.request_headers(1, headers, false);
    assert_eq!(gw.upstream_header(1, ":authority").as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(gw.upstream_header(1, CONTROL_PLANE_FETCH_HEADER), None);
}

#[test]
fn uploads_go_to_the_control_plane_for_a_provider_without_a_files_api() {
    let mut gw = Gateway::new(CP_SETTINGS);
    let upload = |provider: &str| {
        request(
            "POST",
            "/v1/files",
            &[
                ("x-gateway-api-key", "gw-key"),
                ("x-gateway-provider", provider),
                ("x-gateway-custom-host", "http://127.0.0.1:9000/v1"),
                ("authorization", "Bearer sk-client"),
                ("content-type", "multipart/form-data; boundary=b"),
            ],
        )
    };
    let out = gw.request_headers(1, upload("anthropic"), false);
    assert_eq!(out.action, Action::Continue, "streamed: never held for its body");
    assert_eq!(gw.upstream_header(1, ":path").as_deref(), Some("/internal/v1/files"));
    assert_eq!(gw.upstream_header(1, CLUSTER_HEADER).as_deref(), Some("gateway_control_plane"));
    assert_eq!(gw.upstream_header(1, "content-type").as_deref(), Some("multipart/form-data; boundary=b"));
    gw.io.streams(1).request_body = vec![b'x'; 4096];
    assert_eq!(gw.worker.request_body(1, 4096, false, &mut gw.io).action, Action::Continue);
    // A provider with a files API gets the upload, as without a control plane.
    gw.request_headers(2, upload("openai"), false);
    assert_eq!(gw.upstream_header(2, ":authority").as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(gw.upstream_header(2, ":path").as_deref(), Some("/v1/files"));
    let mut plain = Gateway::new(r#"{"api_keys": ["gw-key"]}"#);
    let (_, status, _, body) = reply(&plain.request_headers(1, upload("anthropic"), false));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("unsupported_endpoint")));
}
