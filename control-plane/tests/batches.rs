//! Gateway-managed batches in process: the control plane's router (tower `oneshot`) against
//! SQLite in a temp dir (or `TEST_DATABASE_URL`), and a tiny fake gateway (axum on
//! 127.0.0.1:0) that serves input files and answers chat completions, counting the calls.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::expect_used, clippy::panic)]

mod common;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use common::TOKEN;
use gateway_control_plane::batches::BatchSettings;
use gateway_control_plane::{api, AppState};
use gateway_schema::{control_plane_fetch_marker, CONTROL_PLANE_FETCH_HEADER};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

const CHAT: &str = "/v1/chat/completions";
/// The runners' lease: a stopped control plane's batches are free again this soon.
const LEASE_MS: u64 = 300;

// ---- the fake gateway ----

#[derive(Default)]
struct Seen {
    files: HashMap<String, String>,
    /// Calls per line tag (`body.tag`).
    calls: HashMap<String, usize>,
    /// The headers of the last chat call.
    headers: Vec<(String, String)>,
    file_headers: Vec<(String, String)>,
}

type Fake = Arc<Mutex<Seen>>;

fn header_list(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap_or_default().to_string())).collect()
}

async fn fake_file(State(fake): State<Fake>, h: HeaderMap, Path(id): Path<String>) -> Response {
    let mut seen = fake.lock().unwrap();
    seen.file_headers = header_list(&h);
    match seen.files.get(&id) {
        Some(text) => (StatusCode::OK, text.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, r#"{"error":{"message":"no such file"}}"#).into_response(),
    }
}

/// Echoes the request; `fail: true` answers 500, `sleep_ms` delays the answer.
async fn fake_chat(State(fake): State<Fake>, h: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    let tag = body["tag"].as_str().unwrap_or_default().to_string();
    {
        let mut seen = fake.lock().unwrap();
        *seen.calls.entry(tag.clone()).or_default() += 1;
        seen.headers = header_list(&h);
    }
    if let Some(ms) = body["sleep_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if body["fail"] == json!(true) {
        return (StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":{"message":"boom"}}"#).into_response();
    }
    let answer = json!({"object": "chat.completion", "echo": tag});
    ([("x-request-id", format!("req-{tag}"))], axum::Json(answer)).into_response()
}

/// The provider's two batches, paged by `limit`; only the control plane's marked read gets
/// them (anything else would be the filter relaying the list back).
async fn fake_batches(h: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Response {
    let mark = gateway_control_plane_mark();
    if h.get(CONTROL_PLANE_FETCH_HEADER).and_then(|v| v.to_str().ok()) != Some(mark.as_str()) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "unmarked").into_response();
    }
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(20);
    let ids = ["batch_p1", "batch_p2"];
    let start = q.get("after").and_then(|a| ids.iter().position(|id| id == a)).map_or(0, |i| i + 1);
    let data: Vec<Value> = ids.iter().skip(start).take(limit).map(|id| json!({"id": id})).collect();
    axum::Json(json!({"object": "list", "data": data, "has_more": start + limit < ids.len()})).into_response()
}

fn gateway_control_plane_mark() -> String {
    control_plane_fetch_marker(TOKEN)
}

/// Starts the fake gateway on its own runtime (it outlives the control planes of a test).
fn fake_gateway() -> (Fake, String) {
    let fake: Fake = Arc::default();
    let app = Router::new()
        .route("/v1/files/{id}/content", get(fake_file))
        .route(CHAT, post(fake_chat))
        .route("/v1/batches", get(fake_batches))
        .with_state(fake.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (fake, format!("http://{addr}"))
}

// ---- the control plane ----

fn temp_dir() -> std::path::PathBuf {
    let run = uuid::Uuid::new_v4().simple().to_string();
    std::env::temp_dir().join(format!("cp-batches-test-{run}"))
}

async fn open(dir: &std::path::Path, gateway: &str, concurrency: usize) -> (Router, AppState) {
    let batch =
        BatchSettings { gateway_url: gateway.to_string(), concurrency, lease_ms: LEASE_MS, ..BatchSettings::default() };
    let state = AppState::open_with(&common::settings(dir, &[]), batch).await.unwrap();
    (api::router(state.clone()), state)
}

/// A relayed request as the filter sends it (workspace `ws`).
async fn call(app: &Router, method: &str, path: &str, ws: &str, body: Option<Value>) -> (StatusCode, Value, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("x-gateway-workspace", ws)
        .header("x-gateway-api-key", "gw-key")
        .header("x-gateway-provider", "openai")
        .header("x-gateway-client-authorization", "Bearer sk-client")
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let (status, bytes) = common::read(app.clone().oneshot(request).await.unwrap()).await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), text)
}

fn line(tag: &str, extra: Value) -> String {
    let mut body = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "tag": tag});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    json!({"custom_id": format!("c-{tag}"), "method": "POST", "url": CHAT, "body": body}).to_string()
}

async fn create(app: &Router, ws: &str, file: &str) -> Value {
    let body =
        json!({"input_file_id": file, "endpoint": CHAT, "completion_window": "immediate", "metadata": {"k": "v"}});
    let (status, batch, text) = call(app, "POST", "/internal/v1/batches", ws, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    batch
}

/// Polls the batch until `done` holds (10 s at most).
async fn wait(app: &Router, ws: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..1000 {
        let (status, batch, _) = call(app, "GET", &format!("/internal/v1/batches/{id}"), ws, None).await;
        assert_eq!(status, StatusCode::OK);
        if done(&batch) {
            return batch;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("batch {id} never got there");
}

fn is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |b: &Value| b["status"] == status
}

async fn content(app: &Router, ws: &str, id: &str) -> Vec<Value> {
    let (status, _, text) = call(app, "GET", &format!("/internal/v1/files/{id}/content"), ws, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_runs_to_completed_with_its_output_and_error_files() {
    let (fake, gateway) = fake_gateway();
    let input = [line("1", json!({})), line("2", json!({"fail": true})), line("3", json!({}))].join("\n") + "\n";
    fake.lock().unwrap().files.insert("file-in".into(), input);
    let dir = temp_dir();
    let (app, _state) = open(&dir, &gateway, 2).await;

    let batch = create(&app, "team-a", "file-in").await;
    let id = batch["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("batch_gw_") && id.len() == "batch_gw_".len() + 32, "{id}");
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["completion_window"], "immediate");
    assert_eq!(batch["metadata"], json!({"k": "v"}));
    assert!(batch["created_at"].is_i64());

    let done = wait(&app, "team-a", &id, is("completed")).await;
    assert_eq!(done["request_counts"], json!({"total": 3, "completed": 2, "failed": 1}));
    for at in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[at].is_i64(), "{at}: {done}");
    }
    assert!(done["failed_at"].is_null() && done["cancelled_at"].is_null());

    // The lines went through the gateway as the caller: its gateway headers and its
    // Authorization, never the internal token or the workspace header.
    {
        let seen = fake.lock().unwrap();
        for headers in [&seen.headers, &seen.file_headers] {
            let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
            assert_eq!(get("authorization"), Some("Bearer sk-client"));
            assert_eq!(get("x-gateway-api-key"), Some("gw-key"));
            assert_eq!(get("x-gateway-provider"), Some("openai"));
            assert_eq!(get("x-gateway-workspace"), None);
            assert_eq!(get("x-gateway-client-authorization"), None);
        }
        assert_eq!(seen.calls.values().sum::<usize>(), 3);
    }

    // The output file: the succeeded lines in line order.
    let output_id = done["output_file_id"].as_str().unwrap();
    assert!(output_id.starts_with("file-gw-"));
    let output = content(&app, "team-a", output_id).await;
    let ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["c-1", "c-3"]);
    assert_eq!(output[0]["response"]["status_code"], 200);
    assert_eq!(output[0]["response"]["request_id"], "req-1");
    assert_eq!(output[0]["response"]["body"]["echo"], "1");
    assert!(output[0]["id"].as_str().unwrap().starts_with("batch_req_"));
    assert!(output[0]["error"].is_null());
    // The error file: the failed line, with the gateway's answer.
    let errors = content(&app, "team-a", done["error_file_id"].as_str().unwrap()).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "c-2");
    assert_eq!(errors[0]["response"]["status_code"], 500);
    // File metadata.
    let (status, file, _) = call(&app, "GET", &format!("/internal/v1/files/{output_id}"), "team-a", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((file["object"].as_str(), file["purpose"].as_str()), (Some("file"), Some("batch_output")));
    assert!(file["bytes"].as_i64().unwrap() > 0);

    // Another workspace sees none of it.
    for path in [
        format!("/internal/v1/batches/{id}"),
        format!("/internal/v1/files/{output_id}"),
        format!("/internal/v1/files/{output_id}/content"),
    ] {
        assert_eq!(call(&app, "GET", &path, "team-b", None).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    let cancel = format!("/internal/v1/batches/{id}/cancel");
    assert_eq!(call(&app, "POST", &cancel, "team-b", None).await.0, StatusCode::NOT_FOUND);
    // A finished batch cannot be cancelled.
    assert_eq!(call(&app, "POST", &cancel, "team-a", None).await.0, StatusCode::CONFLICT);

    // The caller's secrets are sealed at rest.
    common::assert_sealed(&common::raw_database(&common::settings(&dir, &[])).await, "sk-client");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_lines_fail_the_batch_with_their_line_numbers_and_nothing_runs() {
    let (fake, gateway) = fake_gateway();
    let bad_url = json!({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}}).to_string();
    let input = [line("1", json!({})), bad_url, line("1", json!({}))].join("\n");
    fake.lock().unwrap().files.insert("file-bad".into(), input);
    let (app, _state) = open(&temp_dir(), &gateway, 4).await;
    let id = create(&app, "team-a", "file-bad").await["id"].as_str().unwrap().to_string();
    let failed = wait(&app, "team-a", &id, is("failed")).await;
    assert!(failed["failed_at"].is_i64());
    let data = failed["errors"]["data"].as_array().unwrap();
    let got: Vec<(&str, i64, &str)> = data
        .iter()
        .map(|e| (e["code"].as_str().unwrap(), e["line"].as_i64().unwrap(), e["param"].as_str().unwrap()))
        .collect();
    assert_eq!(got, vec![("invalid_url", 2, "url"), ("duplicate_custom_id", 3, "custom_id")]);
    assert_eq!(failed["errors"]["object"], "list");
    assert!(fake.lock().unwrap().calls.is_empty(), "no line ran");
    // An input file the gateway cannot read fails the batch too.
    let id = create(&app, "team-a", "file-missing").await["id"].as_str().unwrap().to_string();
    let failed = wait(&app, "team-a", &id, is("failed")).await;
    assert_eq!(failed["errors"]["data"][0]["code"], "input_file_unreadable");
    assert_eq!(failed["errors"]["data"][0]["param"], "input_file_id");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_is_cancelling_at_once_then_cancelled_and_stops_the_lines() {
    let (fake, gateway) = fake_gateway();
    let input: Vec<String> = (0..20).map(|i| line(&i.to_string(), json!({"sleep_ms": 50}))).collect();
    fake.lock().unwrap().files.insert("file-slow".into(), input.join("\n"));
    let (app, _state) = open(&temp_dir(), &gateway, 1).await;
    let id = create(&app, "team-a", "file-slow").await["id"].as_str().unwrap().to_string();
    wait(&app, "team-a", &id, |b| b["request_counts"]["completed"].as_i64().unwrap_or(0) >= 2).await;
    let (status, cancelling, _) =
        call(&app, "POST", &format!("/internal/v1/batches/{id}/cancel"), "team-a", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cancelling["status"], "cancelling");
    assert!(cancelling["cancelling_at"].is_i64());
    let cancelled = wait(&app, "team-a", &id, is("cancelled")).await;
    assert!(cancelled["cancelled_at"].is_i64());
    let completed = cancelled["request_counts"]["completed"].as_i64().unwrap();
    assert!((2..20).contains(&completed), "{cancelled}");
    assert_eq!(cancelled["request_counts"]["total"], 20);
    let calls: usize = fake.lock().unwrap().calls.values().sum();
    assert!(calls < 20, "the lines stopped ({calls} sent)");
    // What finished is downloadable.
    let output = content(&app, "team-a", cancelled["output_file_id"].as_str().unwrap()).await;
    assert_eq!(i64::try_from(output.len()).unwrap(), completed);
}

#[test]
fn a_restart_resumes_without_running_a_finished_line_twice() {
    let (fake, gateway) = fake_gateway();
    // Line 3 is slow: the first control plane stops while it runs.
    let input: Vec<String> =
        (1..=6).map(|i| line(&i.to_string(), if i == 3 { json!({"sleep_ms": 400}) } else { json!({}) })).collect();
    fake.lock().unwrap().files.insert("file-r".into(), input.join("\n"));
    let dir = temp_dir();

    let first = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let id = first.block_on(async {
        let (app, _state) = open(&dir, &gateway, 1).await;
        let id = create(&app, "team-a", "file-r").await["id"].as_str().unwrap().to_string();
        wait(&app, "team-a", &id, |b| b["request_counts"]["completed"] == 2).await;
        id
    });
    // The process stops: its tasks are dropped mid-batch.
    first.shutdown_timeout(Duration::from_millis(100));
    assert_eq!(fake.lock().unwrap().calls.get("4"), None, "line 4 had not started");

    let second = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    second.block_on(async {
        let (app, state) = open(&dir, &gateway, 1).await;
        let (_, batch, _) = call(&app, "GET", &format!("/internal/v1/batches/{id}"), "team-a", None).await;
        assert_eq!(batch["status"], "in_progress");
        // The same control plane (same state dir) takes its batch back at once, its lease
        // unexpired. (A shared test database may hold other tests' unfinished batches too.)
        assert!(gateway_control_plane::batches::resume(&state).await.unwrap() >= 1);
        let done = wait(&app, "team-a", &id, is("completed")).await;
        assert_eq!(done["request_counts"], json!({"total": 6, "completed": 6, "failed": 0}));
        let output = content(&app, "team-a", done["output_file_id"].as_str().unwrap()).await;
        let ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
        assert_eq!(ids, vec!["c-1", "c-2", "c-3", "c-4", "c-5", "c-6"]);
    });
    let seen = fake.lock().unwrap();
    for tag in ["1", "2", "4", "5", "6"] {
        assert_eq!(seen.calls.get(tag), Some(&1), "line {tag} ran once");
    }
    // The line in flight when the process stopped ran again (at least once, at most twice).
    assert!(matches!(seen.calls.get("3"), Some(1 | 2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_another_control_plane_runs_is_not_taken_over() {
    let (fake, gateway) = fake_gateway();
    let input: Vec<String> = (0..6).map(|i| line(&format!("o{i}"), json!({"sleep_ms": 100}))).collect();
    fake.lock().unwrap().files.insert("file-o".into(), input.join("\n"));
    let dir = temp_dir();
    let (app, _one) = open(&dir, &gateway, 1).await;
    let id = create(&app, "team-a", "file-o").await["id"].as_str().unwrap().to_string();
    wait(&app, "team-a", &id, is("in_progress")).await;
    // A second control plane on the same database (and master key, its own state dir) sweeps
    // meanwhile: the first one's lease is renewed, so nothing runs twice.
    let other = temp_dir();
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(dir.join("master.key"), other.join("master.key")).unwrap();
    let mut settings = common::settings(&other, &[]);
    if settings.database_url.is_none() {
        settings.database_url = Some(format!("sqlite://{}", dir.join("gateway.db").display()));
    }
    let batch =
        BatchSettings { gateway_url: gateway.clone(), concurrency: 1, lease_ms: LEASE_MS, ..BatchSettings::default() };
    let two = AppState::open_with(&settings, batch).await.unwrap();
    for _ in 0..4 {
        gateway_control_plane::batches::resume(&two).await.unwrap();
        tokio::time::sleep(Duration::from_millis(LEASE_MS / 2)).await;
    }
    wait(&app, "team-a", &id, is("completed")).await;
    let seen = fake.lock().unwrap();
    for i in 0..6 {
        assert_eq!(seen.calls.get(&format!("o{i}")), Some(&1), "line o{i} ran once");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_not_listening_yet_is_waited_for() {
    // A port nothing listens on (yet): the fake gateway starts there a moment later.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let fake: Fake = Arc::default();
    fake.lock().unwrap().files.insert("file-late".into(), line("1", json!({})));
    let app = Router::new()
        .route("/v1/files/{id}/content", get(fake_file))
        .route(CHAT, post(fake_chat))
        .with_state(fake.clone());
    let (cp, _state) = open(&temp_dir(), &format!("http://127.0.0.1:{port}"), 1).await;
    let id = create(&cp, "team-a", "file-late").await["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let done = wait(&cp, "team-a", &id, |b| b["status"] == "completed" || b["status"] == "failed").await;
    assert_eq!(done["request_counts"], json!({"total": 1, "completed": 1, "failed": 0}), "{done}");
}

#[tokio::test]
async fn lists_show_the_managed_batches_first_then_the_providers_page_by_page() {
    let (fake, gateway) = fake_gateway();
    // Workspaces of their own: a PostgreSQL database outlives the test.
    let (ws, other) = (unique("ws-list"), unique("ws-other"));
    fake.lock().unwrap().files.insert("file-1".into(), line("a", json!({})));
    let dir = temp_dir();
    let (app, _) = open(&dir, &gateway, 1).await;
    let first = create(&app, &ws, "file-1").await["id"].as_str().unwrap().to_string();
    let second = create(&app, &ws, "file-1").await["id"].as_str().unwrap().to_string();
    create(&app, &other, "file-1").await;
    let ids = |page: &Value| {
        page["data"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let (status, all, text) = call(&app, "GET", "/internal/v1/batches", &ws, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let mut managed = vec![first.clone(), second.clone()];
    managed.sort_by(|a, b| b.cmp(a));
    // Newest first (same second: by id, descending), never another workspace's, then the provider's.
    let want: Vec<String> = managed.iter().cloned().chain(["batch_p1".to_string(), "batch_p2".to_string()]).collect();
    assert_eq!(ids(&all), want);
    assert_eq!((all["has_more"].clone(), all["first_id"].clone()), (json!(false), json!(want[0])));
    // limit=1 walks all of them, one page each.
    let mut walked = Vec::new();
    let mut path = "/internal/v1/batches?limit=1".to_string();
    loop {
        let (status, page, text) = call(&app, "GET", &path, &ws, None).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        walked.extend(ids(&page));
        if page["has_more"] == json!(false) {
            break;
        }
        path = format!("/internal/v1/batches?limit=1&after={}", page["last_id"].as_str().unwrap());
        assert!(walked.len() < 10, "{walked:?}");
    }
    assert_eq!(walked, want);
    // The managed part fills the page: has_more tells the provider's follow.
    let (_, page, _) = call(&app, "GET", "/internal/v1/batches?limit=2", &ws, None).await;
    assert_eq!((ids(&page), page["has_more"].clone()), (managed.clone(), json!(true)));
    let before = format!("/internal/v1/batches?before={}", managed[1]);
    let (_, page, _) = call(&app, "GET", &before, &ws, None).await;
    assert_eq!(ids(&page), vec![managed[0].clone()]);
    let (status, _, _) = call(&app, "GET", "/internal/v1/batches?after=batch_gw_unknown", &ws, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let _ = std::fs::remove_dir_all(&dir);
}

fn unique(name: &str) -> String {
    format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// A multipart upload as the filter relays it.
async fn upload(app: &Router, ws: &str, purpose: &str, content: &[u8]) -> (StatusCode, Value) {
    let mut body = format!(
        "--b\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n--b\r\n\
         content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(b"\r\n--b--\r\n");
    let request = Request::builder()
        .method("POST")
        .uri("/internal/v1/files")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("x-gateway-workspace", ws)
        .header("content-type", "multipart/form-data; boundary=b")
        .body(Body::from(body))
        .unwrap();
    let (status, bytes) = common::read(app.clone().oneshot(request).await.unwrap()).await;
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn uploaded_files_are_kept_per_workspace_and_feed_managed_batches() {
    let (fake, gateway) = fake_gateway();
    let (ws, other) = (unique("ws-f"), unique("ws-g"));
    let dir = temp_dir();
    let batch = BatchSettings { gateway_url: gateway, concurrency: 1, lease_ms: LEASE_MS, max_file_bytes: 3_000_000 };
    let state = AppState::open_with(&common::settings(&dir, &[]), batch).await.unwrap();
    let app = api::router(state);
    // Over two chunks of storage, read back byte for byte.
    let big: Vec<u8> = (0..2_500_000u32).map(|i| (i % 251) as u8).collect();
    let (status, file) = upload(&app, &ws, "assistants", &big).await;
    assert_eq!(status, StatusCode::OK, "{file}");
    let id = file["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("file-gw-"));
    assert_eq!(
        (file["bytes"].clone(), file["purpose"].clone(), file["filename"].clone()),
        (json!(2_500_000), json!("assistants"), json!("in.jsonl"))
    );
    let (_, meta, _) = call(&app, "GET", &format!("/internal/v1/files/{id}"), &ws, None).await;
    assert_eq!(meta, file);
    let request = Request::builder()
        .uri(format!("/internal/v1/files/{id}/content"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("x-gateway-workspace", &ws)
        .body(Body::empty())
        .unwrap();
    let (status, bytes) = common::read(app.clone().oneshot(request).await.unwrap()).await;
    assert_eq!((status, bytes.len()), (StatusCode::OK, big.len()));
    assert!(bytes.as_ref() == big.as_slice());
    let (status, _, _) = call(&app, "GET", &format!("/internal/v1/files/{id}"), &other, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another workspace's");
    // Over the limit: 413, nothing kept.
    let (status, error) = upload(&app, &ws, "batch", &vec![b'x'; 3_000_001]).await;
    assert_eq!((status, error["error"]["param"].clone()), (StatusCode::PAYLOAD_TOO_LARGE, json!("file")));
    let (status, error) = upload(&app, &ws, "", b"x").await;
    assert_eq!((status, error["error"]["param"].clone()), (StatusCode::BAD_REQUEST, json!("purpose")));
    // Deleted: gone, for its workspace only.
    let path = format!("/internal/v1/files/{id}");
    assert_eq!(call(&app, "DELETE", &path, &other, None).await.0, StatusCode::NOT_FOUND);
    let (status, deleted, _) = call(&app, "DELETE", &path, &ws, None).await;
    assert_eq!((status, deleted), (StatusCode::OK, json!({"id": id, "object": "file", "deleted": true})));
    assert_eq!(call(&app, "GET", &path, &ws, None).await.0, StatusCode::NOT_FOUND);
    // A managed batch reads an uploaded input file from the store, not through the gateway.
    let input = format!("{}\n{}\n", line("u1", json!({})), line("u2", json!({})));
    let (_, file) = upload(&app, &ws, "batch", input.as_bytes()).await;
    let batch = create(&app, &ws, file["id"].as_str().unwrap()).await;
    let done = wait(&app, &ws, batch["id"].as_str().unwrap(), |b| b["status"] == json!("completed")).await;
    assert_eq!(done["request_counts"], json!({"total": 2, "completed": 2, "failed": 0}));
    assert!(fake.lock().unwrap().file_headers.is_empty(), "the gateway's files API was not asked");
    let theirs = create(&app, &other, file["id"].as_str().unwrap()).await;
    let failed = wait(&app, &other, theirs["id"].as_str().unwrap(), |b| b["status"] == json!("failed")).await;
    assert_eq!(failed["errors"]["data"][0]["code"], json!("input_file_unreadable"));
    let _ = std::fs::remove_dir_all(&dir);
}
