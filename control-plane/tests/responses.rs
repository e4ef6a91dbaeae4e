//! Kept responses in process (tower `oneshot`), against SQLite in a temp dir or the database
//! `TEST_DATABASE_URL` names: the filter's writes and reads, and the client's operations it
//! relays. Workspaces and ids are per run, so a reused database works too.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::expect_used, clippy::panic)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use common::{Client, TOKEN};
use gateway_control_plane::{api, AppState};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tower::ServiceExt;

struct Run {
    c: Client,
    /// Two workspaces of this run.
    a: String,
    b: String,
}

async fn start() -> Run {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("cp-responses-test-{run}"));
    let state = AppState::open(&common::settings(&dir, &[])).await.unwrap();
    let short = &run[..8];
    Run { c: Client { app: api::router(state) }, a: format!("ws-a-{short}"), b: format!("ws-b-{short}") }
}

/// An id as the filter makes them.
fn new_id() -> String {
    format!("resp_gw_{}", uuid::Uuid::new_v4().simple())
}

fn kept_path(ws: &str, id: &str) -> String {
    format!("/internal/v1/workspaces/{ws}/responses/{id}")
}

fn response(id: &str, text: &str) -> Value {
    json!({"id": id, "object": "response", "created_at": 1_700_000_000, "status": "completed", "model": "m",
        "output": [{"type": "message", "id": "msg_out", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}})
}

fn input(count: usize) -> Value {
    (0..count).map(|i| json!({"role": "user", "content": format!("turn {i}")})).collect()
}

/// The filter's write of response `id` in `ws`.
async fn put(c: &Client, ws: &str, id: &str, response: &Value, input: &Value) {
    let body = json!({"response": response, "input": input});
    let answer = c.ok("PUT", &kept_path(ws, id), TOKEN, Some(body)).await;
    assert_eq!(answer, json!({"id": id}));
}

/// A relayed request as the filter sends it: its token and the caller's workspace.
async fn relay(app: &Router, method: &str, path: &str, ws: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {TOKEN}"));
    if let Some(ws) = ws {
        request = request.header("x-gateway-workspace", ws);
    }
    let (status, bytes) = common::read(app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()).await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Asserts an OpenAI error with `status`; returns its `error` object.
fn error(answer: (StatusCode, Value), status: u16) -> Value {
    assert_eq!(answer.0.as_u16(), status, "{}", answer.1);
    let error = answer.1["error"].clone();
    assert!(error["message"].is_string() && error["type"].is_string() && error.get("code").is_some(), "{error}");
    error
}

fn not_found(answer: (StatusCode, Value), id: &str) {
    let error = error(answer, 404);
    assert_eq!(error["message"], format!("No response found with id '{id}'."));
    assert_eq!(error["type"], "invalid_request_error");
}

#[tokio::test]
async fn a_kept_response_is_read_back_by_its_workspace_only() {
    let Run { c, a, b } = start().await;
    let id = new_id();
    let (first, conversation) = (response(&id, "one"), input(2));
    put(&c, &a, &id, &first, &conversation).await;

    let read = c.ok("GET", &kept_path(&a, &id), TOKEN, None).await;
    assert_eq!(read, json!({"value": {"response": first, "input": conversation}}));
    not_found(c.call("GET", &kept_path(&b, &id), Some(TOKEN), None).await, &id);
    let unknown = new_id();
    not_found(c.call("GET", &kept_path(&a, &unknown), Some(TOKEN), None).await, &unknown);

    // A second write of the id replaces it; the same id in another workspace is another response.
    let (second, longer) = (response(&id, "two"), input(4));
    put(&c, &a, &id, &second, &longer).await;
    let other = response(&id, "b's");
    put(&c, &b, &id, &other, &input(1)).await;
    assert_eq!(
        c.ok("GET", &kept_path(&a, &id), TOKEN, None).await["value"],
        json!({"response": second, "input": longer})
    );
    assert_eq!(c.ok("GET", &kept_path(&b, &id), TOKEN, None).await["value"]["response"], other);

    // The client's view, relayed: the response object as kept, for its workspace.
    assert_eq!(relay(&c.app, "GET", &format!("/internal/v1/responses/{id}"), Some(&a)).await, (StatusCode::OK, second));
    let stranger = format!("{b}-none");
    for (method, path) in [
        ("GET", format!("/internal/v1/responses/{id}")),
        ("GET", format!("/internal/v1/responses/{id}/input_items")),
        ("POST", format!("/internal/v1/responses/{id}/cancel")),
        ("DELETE", format!("/internal/v1/responses/{id}")),
    ] {
        not_found(relay(&c.app, method, &path, Some(&stranger)).await, &id);
    }
    // Nothing of it was deleted by the stranger.
    assert_eq!(c.ok("GET", &kept_path(&a, &id), TOKEN, None).await["value"]["input"], longer);
}

#[tokio::test]
async fn the_responses_path_is_not_taken_for_an_item_kind() {
    let Run { c, a, .. } = start().await;
    // Without the static route, `responses` would be an unknown kind: "kind not found".
    let id = new_id();
    not_found(c.call("GET", &kept_path(&a, &id), Some(TOKEN), None).await, &id);
    // The item kinds still reach their own route.
    let answer = c.call("GET", &format!("/internal/v1/workspaces/{a}/configs/nope"), Some(TOKEN), None).await;
    assert_eq!(error(answer, 404)["message"], "config not found");
}

#[tokio::test]
async fn delete_removes_it_and_cancel_is_refused() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    put(&c, &a, &id, &response(&id, "x"), &input(1)).await;

    let cancel = error(relay(&c.app, "POST", &format!("/internal/v1/responses/{id}/cancel"), Some(&a)).await, 400);
    assert_eq!(cancel["message"], "Cannot cancel a synchronous response.");
    assert_eq!(cancel["type"], "invalid_request_error");
    // Still there, unchanged.
    assert_eq!(relay(&c.app, "GET", &format!("/internal/v1/responses/{id}"), Some(&a)).await.1, response(&id, "x"));

    let deleted = relay(&c.app, "DELETE", &format!("/internal/v1/responses/{id}"), Some(&a)).await;
    assert_eq!(deleted, (StatusCode::OK, json!({"id": id, "object": "response", "deleted": true})));
    not_found(relay(&c.app, "GET", &format!("/internal/v1/responses/{id}"), Some(&a)).await, &id);
    not_found(relay(&c.app, "DELETE", &format!("/internal/v1/responses/{id}"), Some(&a)).await, &id);
    not_found(relay(&c.app, "POST", &format!("/internal/v1/responses/{id}/cancel"), Some(&a)).await, &id);
    not_found(relay(&c.app, "GET", &format!("/internal/v1/responses/{id}/input_items"), Some(&a)).await, &id);
    // The filter's read finds it gone too (a later previous_response_id is refused).
    not_found(c.call("GET", &kept_path(&a, &id), Some(TOKEN), None).await, &id);
}

#[tokio::test]
async fn input_items_are_listed_and_paged_as_openai_does() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    let stem = id.strip_prefix("resp_").unwrap();
    let conversation = json!([
        {"role": "user", "content": "first"},
        {"type": "message", "id": "msg_kept", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"role": "user", "content": "last"},
    ]);
    put(&c, &a, &id, &response(&id, "x"), &conversation).await;
    let ids =
        [format!("msg_{stem}_0"), "msg_kept".into(), "fc_1".into(), format!("msg_{stem}_3"), format!("msg_{stem}_4")];
    let items = |query: &str| {
        let path = format!("/internal/v1/responses/{id}/input_items{query}");
        let (app, a) = (c.app.clone(), a.clone());
        async move { relay(&app, "GET", &path, Some(&a)).await }
    };
    let data_ids = |list: &Value| -> Vec<String> {
        list["data"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap().to_string()).collect()
    };

    // Newest first by default, all of them in one page of 20.
    let (status, list) = items("").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(data_ids(&list), ids.iter().rev().cloned().collect::<Vec<_>>());
    assert_eq!(
        (&list["first_id"], &list["last_id"], &list["has_more"]),
        (&json!(ids[4]), &json!(ids[0]), &json!(false))
    );
    // Items as OpenAI lists them: a message's text as a content part; the rest as kept.
    assert_eq!(
        list["data"][4],
        json!({"id": ids[0], "type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]})
    );
    assert_eq!(list["data"][2], conversation[2]);
    // The made-up ids are the same on every read.
    assert_eq!(data_ids(&items("").await.1), data_ids(&list));

    // Oldest first, two at a time, each page after the last one's last id.
    let page = items("?order=asc&limit=2").await.1;
    assert_eq!((data_ids(&page), &page["has_more"]), (ids[..2].to_vec(), &json!(true)));
    let page = items(&format!("?order=asc&limit=2&after={}", page["last_id"].as_str().unwrap())).await.1;
    assert_eq!((data_ids(&page), &page["has_more"]), (ids[2..4].to_vec(), &json!(true)));
    let page = items(&format!("?order=asc&limit=2&after={}", ids[3])).await.1;
    assert_eq!((data_ids(&page), &page["has_more"]), (ids[4..].to_vec(), &json!(false)));
    // After the last: an empty page.
    let page = items(&format!("?order=asc&after={}", ids[4])).await.1;
    assert_eq!(
        (&page["data"], &page["first_id"], &page["last_id"], &page["has_more"]),
        (&json!([]), &Value::Null, &Value::Null, &json!(false))
    );
    // Newest first, paged.
    let page = items(&format!("?limit=3&after={}", ids[4])).await.1;
    assert_eq!(
        (data_ids(&page), &page["has_more"]),
        (vec![ids[3].clone(), ids[2].clone(), ids[1].clone()], &json!(true))
    );
    let page = items("?order=desc&limit=5").await.1;
    assert_eq!(page["has_more"], false);
    // The SDK's `include[]` is taken (items are kept whole).
    assert_eq!(items("?include[]=message.input_image.image_url&limit=1").await.1["first_id"], json!(ids[4]));

    // A bad value is a 400 naming its parameter.
    for (query, param) in [
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?limit=two", "limit"),
        ("?order=newest", "order"),
        ("?after=msg_nobody", "after"),
        ("?after=", "after"),
        ("?limit=1&limit=2", "limit"),
        ("?before=msg_kept", "before"),
    ] {
        assert_eq!(error(items(query).await, 400)["param"], param, "{query}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_waits_for_a_response_written_meanwhile() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    let reader = {
        let (app, path) = (c.app.clone(), format!("{}?wait_ms=2000", kept_path(&a, &id)));
        tokio::spawn(async move {
            let asked = Instant::now();
            let answer = Client { app }.call("GET", &path, Some(TOKEN), None).await;
            (asked, answer, asked.elapsed())
        })
    };
    // The write lands while the read waits (the filter writes just before its client's answer).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let written = Instant::now();
    put(&c, &a, &id, &response(&id, "late"), &input(1)).await;
    let (asked, (status, read), took) = reader.await.unwrap();
    assert!(asked < written, "the read was asked before the write");
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["value"]["response"], response(&id, "late"));
    assert!(took < Duration::from_millis(1500), "found when written, not at the end of the wait: {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clients_read_waits_for_the_response_it_names() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    let reader = {
        let (app, ws, path) = (c.app.clone(), a.clone(), format!("/internal/v1/responses/{id}"));
        tokio::spawn(async move { relay(&app, "GET", &path, Some(&ws)).await })
    };
    // The client asked again before the filter's write landed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(&c, &a, &id, &response(&id, "just kept"), &input(1)).await;
    let (status, read) = reader.await.unwrap();
    assert_eq!((status, read), (StatusCode::OK, response(&id, "just kept")));
}

#[tokio::test]
async fn a_read_waits_no_longer_than_wait_ms() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    let asked = Instant::now();
    not_found(c.call("GET", &format!("{}?wait_ms=300", kept_path(&a, &id)), Some(TOKEN), None).await, &id);
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(1500), "{took:?}");
    // Without wait_ms it does not wait.
    let asked = Instant::now();
    not_found(c.call("GET", &kept_path(&a, &id), Some(TOKEN), None).await, &id);
    assert!(asked.elapsed() < Duration::from_millis(300));
    for bad in ["2001", "-1", "soon", ""] {
        let answer = c.call("GET", &format!("{}?wait_ms={bad}", kept_path(&a, &id)), Some(TOKEN), None).await;
        assert_eq!(error(answer, 400)["param"], "wait_ms", "{bad:?}");
    }
}

#[tokio::test]
async fn bad_ids_and_bodies_are_400s_naming_the_field() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    let good = json!({"response": response(&id, "x"), "input": input(1)});
    let put = |ws: String, id: String, body: Body| {
        let c = Client { app: c.app.clone() };
        async move { c.raw("PUT", &kept_path(&ws, &id), Some(TOKEN), body).await }
    };
    let json_body = |value: Value| Body::from(value.to_string());

    for (ws, bad_id, param) in [
        (a.clone(), "resp.1".into(), "id"),
        (a.clone(), "a".repeat(129), "id"),
        ("team%20a".into(), id.clone(), "workspace"),
    ] {
        assert_eq!(error(put(ws.clone(), bad_id.clone(), json_body(good.clone())).await, 400)["param"], param);
        let answer = c.call("GET", &kept_path(&ws, &bad_id), Some(TOKEN), None).await;
        assert_eq!(error(answer, 400)["param"], param);
    }
    // 128 characters is an id.
    let longest = "b".repeat(128);
    let body = json!({"response": response(&longest, "x"), "input": []});
    assert_eq!(put(a.clone(), longest.clone(), json_body(body)).await.0, StatusCode::OK);

    let mut wrong_id = good.clone();
    wrong_id["response"]["id"] = json!("resp_gw_other");
    for (body, param) in [
        (Body::from("not json"), "body"),
        (json_body(json!([1])), "body"),
        (json_body(json!({"input": []})), "response"),
        (json_body(json!({"response": "text", "input": []})), "response"),
        (json_body(wrong_id), "response.id"),
        (json_body(json!({"response": {}})), "input"),
        (json_body(json!({"response": {}, "input": {"role": "user"}})), "input"),
        (json_body(json!({"response": {}, "input": [{"role": "user"}, "hi"]})), "input[1]"),
        (json_body(json!({"response": {}, "input": [], "extra": 1})), "extra"),
    ] {
        assert_eq!(error(put(a.clone(), id.clone(), body).await, 400)["param"], param);
    }
    // Nothing of those was kept.
    not_found(c.call("GET", &kept_path(&a, &id), Some(TOKEN), None).await, &id);

    // A body over the limit is a 413 naming it.
    let huge = "x".repeat(gateway_control_plane::responses::MAX_KEPT_BYTES);
    let body = json!({"response": {}, "input": [{"role": "user", "content": huge}]});
    let too_large = error(put(a.clone(), id.clone(), json_body(body)).await, 413);
    assert_eq!(too_large["param"], "body");

    // The relayed operations: a bad id names `response_id`; no workspace names the header.
    let answer = relay(&c.app, "GET", "/internal/v1/responses/resp.1", Some(&a)).await;
    assert_eq!(error(answer, 400)["param"], "response_id");
    let answer = relay(&c.app, "GET", &format!("/internal/v1/responses/{id}"), None).await;
    assert_eq!(error(answer, 400)["param"], "x-gateway-workspace");
}

#[tokio::test]
async fn the_internal_endpoints_need_the_token() {
    let Run { c, a, .. } = start().await;
    let id = new_id();
    put(&c, &a, &id, &response(&id, "x"), &input(1)).await;
    let body = || Some(json!({"response": {}, "input": []}));
    for (method, path, body) in [
        ("PUT", kept_path(&a, &id), body()),
        ("GET", kept_path(&a, &id), None),
        ("GET", format!("/internal/v1/responses/{id}"), None),
        ("DELETE", format!("/internal/v1/responses/{id}"), None),
        ("GET", format!("/internal/v1/responses/{id}/input_items"), None),
        ("POST", format!("/internal/v1/responses/{id}/cancel"), None),
    ] {
        for key in [None, Some("wrong-token")] {
            let answer = c.call(method, &path, key, body.clone()).await;
            assert_eq!(error(answer, 401)["type"], "authentication_error", "{method} {path}");
        }
    }
    // Still there, unchanged: the refused PUT and DELETE did nothing.
    assert_eq!(c.ok("GET", &kept_path(&a, &id), TOKEN, None).await["value"]["response"], response(&id, "x"));
}
