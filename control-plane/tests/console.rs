//! The console's sessions and overview (issue 47) in process (tower `oneshot`), against SQLite in
//! a temp dir, or against the database `TEST_DATABASE_URL` names (e.g. `postgres://...`). Every
//! workspace carries a per-run suffix, so a reused database works too.

// Helpers outside `#[test]` functions: clippy.toml's test allowances do not reach them.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use common::{Client, TOKEN};
use gateway_control_plane::api;
use gateway_control_plane::AppState;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const ADMIN: &str = "admin-key-console";

/// A console request's answer: status, headers, JSON body (Null when empty).
async fn send(
    client: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, HeaderMap, Value) {
    let mut request = Request::builder().method(method).uri(path).header("host", "gateway.test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = client.app.clone().oneshot(request.body(body).unwrap()).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    (status, headers, value)
}

/// Signs in with `key`: the cookie (`name=value`) and the session's description.
async fn sign_in(client: &Client, key: &str) -> (String, Value) {
    let (status, headers, body) = send(client, "POST", "/console/session", &[], Some(json!({"key": key}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cookie = headers["set-cookie"].to_str().unwrap();
    (cookie.split(';').next().unwrap().to_string(), body)
}

async fn start() -> (Client, AppState, String) {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-console-test-{run}"));
    let state = AppState::open(&common::settings(&dir, &[ADMIN])).await.unwrap();
    (Client { app: api::router(state.clone()) }, state, run)
}

async fn new_key(client: &Client, workspace: &str) -> String {
    let created = client.ok("POST", "/v1/api-keys", ADMIN, Some(json!({"workspace": workspace}))).await;
    created["key"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_key_signs_in_to_a_session_in_a_cookie_that_holds_no_key_and_ends_on_sign_out() {
    let (client, _, run) = start().await;
    let workspace = format!("team-{run}");
    let key = new_key(&client, &workspace).await;

    // A wrong key, an empty one, another field, another origin: no session.
    for (body, origin, want) in [
        (json!({"key": "gw-not-a-key"}), None, 401),
        (json!({"key": ""}), None, 400),
        (json!({"key": key, "remember": true}), None, 400),
        (json!({"key": key}), Some("https://evil.test"), 403),
    ] {
        let headers: Vec<(&str, &str)> = origin.iter().map(|o| ("origin", *o)).collect();
        let (status, answer, body) = send(&client, "POST", "/console/session", &headers, Some(body)).await;
        assert_eq!(status.as_u16(), want, "{body}");
        assert!(answer.get("set-cookie").is_none());
        assert!(body["error"]["message"].is_string(), "{body}");
    }

    let (status, headers, body) =
        send(&client, "POST", "/console/session", &[("origin", "http://gateway.test")], Some(json!({"key": key})))
            .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let set_cookie = headers["set-cookie"].to_str().unwrap();
    for attribute in ["Path=/console", "HttpOnly", "SameSite=Strict", "Max-Age=43200"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(!set_cookie.contains(&key), "the key is not in the cookie");
    assert_eq!((body["workspace"].as_str(), body["admin"].as_bool()), (Some(workspace.as_str()), Some(false)));
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(headers["cache-control"], "no-store");
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let csrf = body["csrf_token"].as_str().unwrap().to_string();

    let (status, _, session) = send(&client, "GET", "/console/session", &[("cookie", &cookie)], None).await;
    assert_eq!((status, session["workspace"].as_str()), (StatusCode::OK, Some(workspace.as_str())));
    let (status, _, _) = send(&client, "GET", "/console/session", &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(&client, "GET", "/console/session", &[("cookie", "gateway_console=made-up")], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Signing out is a write: the session's token, from the console's own origin.
    let (status, _, _) = send(&client, "DELETE", "/console/session", &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no CSRF token");
    let foreign = [("cookie", cookie.as_str()), ("x-console-csrf", csrf.as_str()), ("origin", "https://evil.test")];
    let (status, _, _) = send(&client, "DELETE", "/console/session", &foreign, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another origin");
    let own = [("cookie", cookie.as_str()), ("x-console-csrf", csrf.as_str())];
    let (status, headers, _) = send(&client, "DELETE", "/console/session", &own, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    let (status, _, _) = send(&client, "GET", "/console/session", &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the session ended");
}

#[tokio::test]
async fn a_session_ends_with_the_key_it_signed_in_with() {
    let (client, _, run) = start().await;
    let made = json!({"workspace": format!("team-{run}"), "admin": true});
    let created = client.ok("POST", "/v1/api-keys", ADMIN, Some(made)).await;
    let (cookie, session) = sign_in(&client, created["key"].as_str().unwrap()).await;
    let csrf = session["csrf_token"].as_str().unwrap();
    let (status, _, _) = send(&client, "GET", "/console/api/v1/api-keys", &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::OK);

    client.ok("DELETE", &format!("/v1/api-keys/{}", created["id"].as_str().unwrap()), ADMIN, None).await;
    // Neither a read nor a write (a new admin key, say) of its session works any more.
    let own = [("cookie", cookie.as_str()), ("x-console-csrf", csrf)];
    let escalate = json!({"workspace": format!("other-{run}"), "admin": true});
    let (status, _, body) = send(&client, "POST", "/console/api/v1/api-keys", &own, Some(escalate)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, body) = send(&client, "GET", "/console/session", &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("sign in again"), "{body}");
}

#[tokio::test]
async fn the_overview_adds_up_a_workspaces_requests_as_usage_does_and_shows_no_other_workspace() {
    let (client, _, run) = start().await;
    let (team, other) = (format!("team-{run}"), format!("other-{run}"));
    let key = new_key(&client, &team).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let record = |workspace: &str, i: i64, model: &str, status: i64, api: &str| {
        json!({"workspace": workspace, "trace_id": format!("t-{i}"), "record_id": format!("r-{i}"),
            "timestamp_ms": now - 60_000 - i * 1000,
            "provider": "openai", "model": model, "status": status, "client_api": api, "duration_ms": 100 + i * 10,
            "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.25, "cache_status": "MISS",
            "guardrails": [{"stage": "before", "id": "g", "verdict": status < 400}]})
    };
    let mut records: Vec<Value> = (0..4).map(|i| record(&team, i, "gpt-4o", 200, "chat")).collect();
    records.push(record(&team, 4, "claude-3", 502, "messages"));
    records.push(record(&other, 5, "gpt-4o", 200, "chat"));
    // Sent twice, as a filter does when its first send timed out: counted once.
    for _ in 0..2 {
        let (status, body) =
            client.call("POST", "/internal/v1/records", Some(TOKEN), Some(json!({"records": records}))).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }

    let (cookie, _) = sign_in(&client, &key).await;
    let (status, _, overview) =
        send(&client, "GET", "/console/api/overview?range=hour", &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    let totals = &overview["totals"];
    assert_eq!((totals["requests"].as_i64(), totals["errors"].as_i64()), (Some(5), Some(1)), "{overview}");
    assert_eq!((totals["input_tokens"].as_i64(), totals["output_tokens"].as_i64()), (Some(50), Some(25)));
    assert_eq!(totals["cost_usd"].as_f64(), Some(1.25));
    // Durations 100, 110, 120, 130, 140 ms: the median is in (100, 150].
    let p50 = totals["p50_ms"].as_f64().unwrap();
    assert!((100.0..=150.0).contains(&p50), "{totals}");
    assert_eq!(overview["series"].as_array().unwrap().len(), 60);
    let in_series: i64 = overview["series"].as_array().unwrap().iter().map(|p| p["requests"].as_i64().unwrap()).sum();
    assert_eq!(in_series, 5);
    let models: Vec<(&str, i64)> = overview["breakdown"]["model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row["value"].as_str().unwrap(), row["requests"].as_i64().unwrap()))
        .collect();
    assert_eq!(models, [("gpt-4o", 4), ("claude-3", 1)]);
    let apis: Vec<&str> =
        overview["breakdown"]["api"].as_array().unwrap().iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(apis, ["chat", "messages"]);
    assert_eq!(overview["top_models_by_cost"][0]["value"], "gpt-4o");
    assert_eq!(overview["error_rate_by_provider"][0]["error_rate"].as_f64(), Some(0.2));
    let workspaces = overview["breakdown"]["workspace"].as_array().unwrap();
    assert_eq!(workspaces.len(), 1, "another workspace's requests are never shown: {workspaces:?}");

    // The longer ranges read the hourly rollups: the same records.
    for range in ["day", "week", "month"] {
        let path = format!("/console/api/overview?range={range}");
        let (_, _, longer) = send(&client, "GET", &path, &[("cookie", &cookie)], None).await;
        for field in ["requests", "errors", "input_tokens", "output_tokens", "cost_usd", "p50_ms", "p95_ms"] {
            assert_eq!(longer["totals"][field], totals[field], "{range} {field}: {longer}");
        }
        assert_eq!(longer["breakdown"]["model"], overview["breakdown"]["model"], "{range}");
    }

    // The same period in `/v1/usage`: the same numbers.
    let (from, to) = (overview["from"].as_i64().unwrap(), overview["to"].as_i64().unwrap());
    let usage = client.ok("GET", &format!("/v1/usage?start={from}&end={to}"), &key, None).await;
    let usage = &usage["data"][0];
    assert_eq!(usage["requests"], totals["requests"]);
    assert_eq!((&usage["input_tokens"], &usage["output_tokens"]), (&totals["input_tokens"], &totals["output_tokens"]));
    assert_eq!(usage["cost_usd"], totals["cost_usd"]);

    // A workspace key cannot name another workspace; an admin sees every one, or the one named.
    let path = format!("/console/api/overview?range=hour&workspace={other}");
    let (status, _, _) = send(&client, "GET", &path, &[("cookie", &cookie)], None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (admin, session) = sign_in(&client, ADMIN).await;
    assert_eq!(session["admin"], true);
    let (_, _, named) = send(&client, "GET", &path, &[("cookie", &admin)], None).await;
    assert_eq!(named["totals"]["requests"], 1, "{named}");
    let (_, _, all) = send(&client, "GET", "/console/api/overview?range=hour", &[("cookie", &admin)], None).await;
    let seen: Vec<&str> =
        all["breakdown"]["workspace"].as_array().unwrap().iter().filter_map(|r| r["value"].as_str()).collect();
    assert!(seen.contains(&team.as_str()) && seen.contains(&other.as_str()), "{seen:?}");

    // The request log's filters the console's table gives (`/v1/logs`'s), through its cookie.
    let traces = |path: String, cookie: String| {
        let client = &client;
        async move {
            let (status, _, page) = send(client, "GET", &path, &[("cookie", &cookie)], None).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["trace_id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    for (filter, want) in [
        ("status_class=5xx", vec!["t-4"]),
        ("api=messages", vec!["t-4"]),
        ("guardrail=fail", vec!["t-4"]),
        ("guardrail=pass&model=gpt-4o", vec!["t-0", "t-1", "t-2", "t-3"]),
        ("cache_status=HIT", vec![]),
    ] {
        assert_eq!(traces(format!("/console/api/logs?{filter}"), cookie.clone()).await, want, "{filter}");
    }
    assert_eq!(traces(format!("/console/api/logs?workspace={other}"), admin.clone()).await, ["t-5"]);
    let path = format!("/console/api/logs?workspace={other}");
    assert_eq!(send(&client, "GET", &path, &[("cookie", &cookie)], None).await.0, StatusCode::FORBIDDEN);
    for (bad, param) in [
        ("status_class=2xxx", "status_class"),
        ("guardrail=maybe", "guardrail"),
        ("workspace=a&workspace=b", "workspace"),
    ] {
        let (status, _, body) =
            send(&client, "GET", &format!("/console/api/logs?{bad}"), &[("cookie", &admin)], None).await;
        assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{body}");
    }

    for bad in ["range=year", "range=hour&limit=3", "workspace=a&workspace=b"] {
        let (status, _, body) =
            send(&client, "GET", &format!("/console/api/overview?{bad}"), &[("cookie", &cookie)], None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    let (status, _, _) = send(&client, "GET", "/console/api/overview", &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "signed out");
}

#[tokio::test]
async fn the_console_calls_the_gateway_api_as_its_sessions_caller_with_its_checks() {
    let (client, _, run) = start().await;
    let workspace = format!("team-{run}");
    let key = new_key(&client, &workspace).await;
    let (team, _) = sign_in(&client, &key).await;
    let (admin, session) = sign_in(&client, ADMIN).await;
    let csrf = session["csrf_token"].as_str().unwrap().to_string();

    // The session's caller: a workspace key's cannot list keys (an admin's endpoint), its own
    // limits it can; without a session, nothing.
    let (status, _, body) = send(&client, "GET", "/console/api/v1/api-keys", &[("cookie", &team)], None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _, body) = send(&client, "GET", "/console/api/v1/limits", &[("cookie", &team)], None).await;
    assert_eq!((status, &body["object"]), (StatusCode::OK, &json!("list")), "{body}");
    assert_eq!(send(&client, "GET", "/console/api/v1/limits", &[], None).await.0, StatusCode::UNAUTHORIZED);

    // A write needs the session's CSRF token and the console's own origin.
    let create = json!({"workspace": workspace});
    let (status, _, _) =
        send(&client, "POST", "/console/api/v1/api-keys", &[("cookie", &admin)], Some(create.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let foreign = [("cookie", admin.as_str()), ("x-console-csrf", csrf.as_str()), ("origin", "https://evil.test")];
    assert_eq!(
        send(&client, "POST", "/console/api/v1/api-keys", &foreign, Some(create.clone())).await.0,
        StatusCode::FORBIDDEN
    );
    let own = [("cookie", admin.as_str()), ("x-console-csrf", csrf.as_str()), ("content-type", "application/json")];
    let (status, _, created) = send(&client, "POST", "/console/api/v1/api-keys", &own, Some(create)).await;
    assert_eq!((status, &created["workspace"]), (StatusCode::CREATED, &json!(workspace)), "{created}");
    assert!(created["key"].as_str().unwrap().starts_with("gw-"));

    // The API's own checks, with their `param`.
    let bad = json!({"workspace": workspace, "requests_per_minute": 0});
    let (status, _, error) = send(&client, "PUT", "/console/api/v1/limits/l1", &own, Some(bad)).await;
    assert_eq!((status, &error["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("requests_per_minute")), "{error}");

    // Only /v1 is reachable so, and the caller's header is the console's own.
    let (status, _, _) =
        send(&client, "GET", "/console/api/v1/../internal/v1/batches", &[("cookie", &admin)], None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let forged = [("x-gateway-console-caller", "guess 1 default")];
    assert_eq!(send(&client, "GET", "/v1/api-keys", &forged, None).await.0, StatusCode::UNAUTHORIZED);
}

/// The records a database held before the rollups came (migration 0011) are in them: the
/// migration adds them up as the control plane adds new ones. (SQLite: a database of its own.)
#[tokio::test]
async fn records_stored_before_the_rollups_are_in_the_overview() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-console-backfill-{run}"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("gateway.db").display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let mut before = sqlx::migrate!("./migrations");
    let kept = before.migrations.iter().take_while(|m| m.version < 11).cloned().collect::<Vec<_>>();
    before.migrations = kept.into();
    before.run(&pool).await.unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // Two requests of gpt-4o (one failed, one without tokens or a duration) and one of no model.
    // (id, model, status, tokens and cost, duration)
    type Row<'a> = (&'a str, Option<&'a str>, i64, Option<i64>, Option<i64>);
    let rows: [Row; 3] = [
        ("a", Some("gpt-4o"), 200, Some(10), Some(120)),
        ("b", Some("gpt-4o"), 503, None, None),
        ("c", None, 200, Some(7), Some(40)),
    ];
    for (id, model, status, tokens, duration) in rows {
        sqlx::query(
            "INSERT INTO log_records (id, workspace, trace_id, model, status, input_tokens, output_tokens, \
             cost_micro_usd, duration_ms, timestamp_ms, record, received_at) \
             VALUES ($1, 'team', $1, $2, $3, $4, $4, $4, $5, $6, '{}', 0)",
        )
        .bind(id)
        .bind(model)
        .bind(status)
        .bind(tokens)
        .bind(duration)
        .bind(now - 120_000)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let mut settings = common::settings(&dir, &[ADMIN]);
    settings.database_url = Some(url);
    let state = AppState::open(&settings).await.unwrap();
    let client = Client { app: api::router(state.clone()) };
    let key = new_key(&client, "team").await;
    let (cookie, _) = sign_in(&client, &key).await;
    for range in ["hour", "month"] {
        let path = format!("/console/api/overview?range={range}");
        let (_, _, overview) = send(&client, "GET", &path, &[("cookie", &cookie)], None).await;
        let totals = &overview["totals"];
        assert_eq!((totals["requests"].as_i64(), totals["errors"].as_i64()), (Some(3), Some(1)), "{overview}");
        assert_eq!((totals["input_tokens"].as_i64(), totals["cost_usd"].as_f64()), (Some(17), Some(17e-6)));
        // Durations 40 and 120 ms: the median is in (30, 50], the 95th in (100, 150].
        let (p50, p95) = (totals["p50_ms"].as_f64().unwrap(), totals["p95_ms"].as_f64().unwrap());
        assert!((30.0..=50.0).contains(&p50) && (100.0..=150.0).contains(&p95), "{totals}");
        let models: Vec<(Value, i64)> = overview["breakdown"]["model"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| (row["value"].clone(), row["requests"].as_i64().unwrap()))
            .collect();
        assert_eq!(models, [(json!("gpt-4o"), 2), (Value::Null, 1)], "{range}");
    }
    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The retention sweep takes old records out of the overview, not only out of the log.
#[tokio::test]
async fn records_the_retention_sweep_deletes_leave_the_overview() {
    let (client, state, run) = start().await;
    let team = format!("team-{run}");
    let key = new_key(&client, &team).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    const DAY: i64 = 86_400_000;
    let records: Vec<Value> = [now - 60_000, now - 3 * DAY]
        .iter()
        .enumerate()
        .map(|(i, at)| json!({"workspace": team, "trace_id": format!("t-{i}"), "timestamp_ms": at, "status": 200}))
        .collect();
    let (status, body) =
        client.call("POST", "/internal/v1/records", Some(TOKEN), Some(json!({"records": records}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (cookie, _) = sign_in(&client, &key).await;
    let month = |cookie: String| {
        let client = &client;
        async move {
            let (_, _, overview) =
                send(client, "GET", "/console/api/overview?range=month", &[("cookie", &cookie)], None).await;
            overview["totals"]["requests"].as_i64().unwrap()
        }
    };
    assert_eq!(month(cookie.clone()).await, 2);
    gateway_control_plane::retention::sweep_once(&state.db, 2, now).await.unwrap();
    assert_eq!(month(cookie).await, 1);
}
