//! Request logs and feedback (issue 15) in process (tower `oneshot`), against SQLite in a temp
//! dir, or against the database `TEST_DATABASE_URL` names (e.g. `postgres://...`). Every
//! workspace carries a per-run suffix, so a reused database works too.

// Helpers outside `#[test]` functions: clippy.toml's test allowances do not reach them.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use axum::body::Body;
use axum::http::StatusCode;
use common::{Client, TOKEN};
use gateway_control_plane::{api, AppState};
use serde_json::{json, Map, Value};

const ADMIN: &str = "admin-key-1";
/// 2023-11-14T22:13:20Z, in ms.
const T: i64 = 1_700_000_000_000;
const T_S: i64 = T / 1000;

impl Client {
    async fn ship(&self, records: Vec<Value>) {
        let n = records.len();
        let (status, body) =
            self.call("POST", "/internal/v1/records", Some(TOKEN), Some(json!({"records": records}))).await;
        assert_eq!((status, body), (StatusCode::ACCEPTED, json!({"accepted": n})));
    }

    /// `GET /v1/logs?<query>`: the whole answer.
    async fn logs(&self, key: &str, query: &str) -> Value {
        let answer = self.ok("GET", &format!("/v1/logs?{query}"), key, None).await;
        assert_eq!(answer["object"], "list", "{answer}");
        assert!(answer["has_more"].is_boolean(), "{answer}");
        answer
    }

    /// The trace and span ids (`trace/span`) of the records `GET /v1/logs?<query>` finds.
    async fn spans(&self, key: &str, query: &str) -> Vec<String> {
        let answer = self.logs(key, query).await;
        answer["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{}/{}", r["trace_id"].as_str().unwrap(), r["span_id"].as_str().unwrap_or("-")))
            .collect()
    }

    async fn new_key(&self, workspace: &str) -> String {
        let created = self.ok("POST", "/v1/api-keys", ADMIN, Some(json!({"workspace": workspace}))).await;
        created["key"].as_str().unwrap().to_string()
    }
}

async fn start() -> (Client, AppState, std::path::PathBuf, String) {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-logs-test-{run}"));
    let state = AppState::open(&common::settings(&dir, &[ADMIN])).await.unwrap();
    (Client { app: api::router(state.clone()) }, state, dir, run)
}

/// A record as the filter ships it: the access-log fields plus `timestamp_ms`.
fn record(workspace: &str, trace: &str, span: Option<&str>, ms: i64, extra: Value) -> Value {
    let mut r = json!({"trace_id": trace, "span_id": span, "parent_span_id": null, "span_name": null,
        "metadata": null, "method": "POST", "path": "/v1/chat/completions", "provider": null, "model": null,
        "target": null, "attempts": 1, "retries": 0, "fallbacks": 0, "cache_status": null, "status": 200,
        "stream": false, "prompt_tokens": 5, "completion_tokens": 7, "duration_ms": 12,
        "time_to_first_token_ms": null, "error_code": null, "workspace": workspace, "hooks": "",
        "timestamp_ms": ms});
    let fields = r.as_object_mut().unwrap();
    for (k, v) in extra.as_object().unwrap() {
        fields.insert(k.clone(), v.clone());
    }
    r
}

/// A returned entry without what `GET /v1/logs` adds: the record as shipped.
fn shipped(entry: &Value) -> Value {
    let mut fields: Map<String, Value> = entry.as_object().unwrap().clone();
    for key in ["id", "object", "created_at", "feedback"] {
        fields.remove(key);
    }
    Value::Object(fields)
}

#[tokio::test]
async fn records_are_found_by_every_filter_and_only_in_their_workspace() {
    let (c, state, dir, run) = start().await;
    let (wa, wb, ghost) = (format!("wa-{run}"), format!("wb-{run}"), format!("ghost-{run}"));

    // Authentication of all three endpoints.
    c.err(401, "POST", "/internal/v1/records", None, Some(json!({"records": []}))).await;
    c.err(401, "POST", "/internal/v1/records", Some(ADMIN), Some(json!({"records": []}))).await;
    c.err(401, "GET", "/v1/logs", None, None).await;
    c.err(401, "GET", "/v1/logs", Some("gw-nope"), None).await;
    c.err(401, "POST", "/v1/feedback", None, Some(json!({"trace_id": "t", "value": 1}))).await;
    c.err(401, "POST", "/v1/feedback", Some("gw-nope"), Some(json!({"trace_id": "t", "value": 1}))).await;

    let (ka, kb) = (c.new_key(&wa).await, c.new_key(&wb).await);
    let r1 = record(
        &wa,
        "t1",
        Some("s1"),
        T,
        json!({"provider": "openai", "model": "gpt-4o",
        "metadata": {"_user": "u-7", "n": 1}}),
    );
    let r2 = record(
        &wa,
        "t2",
        Some("s2"),
        T + 1000,
        json!({"provider": "anthropic", "model": "claude",
        "status": 500, "error_code": "upstream", "metadata": {"_user": "u-8", "flag": true, "team name": "a b&c"}}),
    );
    let r3 = record(
        &wa,
        "t1",
        Some("s3"),
        T + 2500,
        json!({"provider": "openai", "model": "gpt-4o-mini",
        "metadata": {"_user": "u-7"}}),
    );
    let r4 = record(&wa, "t3", None, T + 60_000, json!({"status": 446, "attempts": 0}));
    let other = record(
        &wb,
        "t1",
        Some("s1"),
        T,
        json!({"provider": "openai", "model": "gpt-4o",
        "metadata": {"_user": "u-7"}}),
    );
    // A workspace nobody has a key of yet: stored all the same.
    let early = record(&ghost, "t1", Some("g1"), T, json!({}));
    c.ship(vec![r1.clone(), r2.clone(), other.clone(), r3.clone(), early, r4.clone()]).await;

    // Everything, newest first, with the fields the answer adds.
    let all = c.logs(&ka, "").await;
    assert_eq!(all["has_more"], false);
    let data = all["data"].as_array().unwrap();
    assert_eq!(data.iter().map(shipped).collect::<Vec<_>>(), [r4.clone(), r3.clone(), r2.clone(), r1.clone()]);
    for (entry, ms) in data.iter().zip([T + 60_000, T + 2500, T + 1000, T]) {
        assert_eq!(entry["object"], "gateway.log");
        assert_eq!(entry["created_at"], ms / 1000);
        assert_eq!(entry["feedback"], json!([]));
        assert!(uuid::Uuid::try_parse(entry["id"].as_str().unwrap()).is_ok(), "{entry}");
    }

    // Each filter, alone and together.
    let cases: &[(&str, &[&str])] = &[
        ("trace_id=t1", &["t1/s3", "t1/s1"]),
        ("trace_id=t9", &[]),
        ("span_id=s2", &["t2/s2"]),
        ("provider=openai", &["t1/s3", "t1/s1"]),
        ("model=claude", &["t2/s2"]),
        ("model=gpt-4o", &["t1/s1"]),
        ("status=200", &["t1/s3", "t1/s1"]),
        ("status=446", &["t3/-"]),
        ("status=404", &[]),
        (&format!("from={}", T_S + 1), &["t3/-", "t1/s3", "t2/s2"]),
        (&format!("to={}", T_S + 2), &["t1/s3", "t2/s2", "t1/s1"]),
        (&format!("from={0}&to={0}", T_S + 2), &["t1/s3"]),
        (&format!("from={}&to={}", T_S + 3, T_S + 59), &[]),
        ("metadata._user=u-7", &["t1/s3", "t1/s1"]),
        ("metadata._user=u-8", &["t2/s2"]),
        ("metadata.n=1", &["t1/s1"]),
        ("metadata.flag=true", &["t2/s2"]),
        ("metadata.team%20name=a+b%26c", &["t2/s2"]),
        ("metadata._user=nobody", &[]),
        ("metadata.missing=x", &[]),
        ("metadata._user=u-7&provider=openai&model=gpt-4o", &["t1/s1"]),
        ("metadata._user=u-7&metadata.n=1", &["t1/s1"]),
        ("trace_id=t1&status=200&provider=openai&span_id=s3", &["t1/s3"]),
    ];
    for (query, want) in cases {
        assert_eq!(c.spans(&ka, query).await, *want, "{query}");
    }

    // Only the caller's workspace.
    let theirs = c.logs(&kb, "trace_id=t1").await;
    assert_eq!(theirs["data"].as_array().unwrap().iter().map(shipped).collect::<Vec<_>>(), [other]);
    assert_eq!(c.spans(&kb, "metadata._user=u-7").await, ["t1/s1"]);
    assert_eq!(c.spans(&ka, "span_id=g1").await, Vec::<String>::new());
    let kg = c.new_key(&ghost).await;
    assert_eq!(c.spans(&kg, "").await, ["t1/g1"]);

    // Feedback after its records: on each record of the trace, in its workspace only.
    let fb = c
        .call(
            "POST",
            "/v1/feedback",
            Some(&ka),
            Some(json!({"trace_id": "t1", "value": -1, "weight": 0.5,
        "metadata": {"reason": "bad"}})),
        )
        .await;
    assert_eq!(fb, (StatusCode::ACCEPTED, json!({"status": "accepted", "trace_id": "t1"})));
    let t1 = c.logs(&ka, "trace_id=t1").await;
    for entry in t1["data"].as_array().unwrap() {
        let feedback = entry["feedback"].as_array().unwrap();
        assert_eq!(feedback.len(), 1, "{entry}");
        assert_eq!((&feedback[0]["value"], &feedback[0]["weight"]), (&json!(-1), &json!(0.5)));
        assert_eq!(feedback[0]["metadata"], json!({"reason": "bad"}));
        assert!(feedback[0]["created_at"].as_i64().unwrap() > 1_700_000_000);
    }
    assert_eq!(c.logs(&kb, "trace_id=t1").await["data"][0]["feedback"], json!([]));
    assert_eq!(c.logs(&ka, "trace_id=t2").await["data"][0]["feedback"], json!([]));
    c.ok("POST", "/v1/feedback", &ka, Some(json!({"trace_id": "t1", "value": 2}))).await;
    let feedback = c.logs(&ka, "span_id=s1").await["data"][0]["feedback"].clone();
    assert_eq!(feedback.as_array().unwrap().len(), 2);
    assert_eq!(
        (&feedback[1]["value"], &feedback[1]["weight"], &feedback[1]["metadata"]),
        (&json!(2), &json!(1), &Value::Null)
    );

    // Feedback before its record (it overtook the batch).
    c.ok("POST", "/v1/feedback", &kb, Some(json!({"trace_id": "late", "value": 1}))).await;
    assert_eq!(c.spans(&kb, "trace_id=late").await, Vec::<String>::new());
    c.ship(vec![record(&wb, "late", Some("l1"), T + 5, json!({}))]).await;
    let late = c.logs(&kb, "trace_id=late").await;
    assert_eq!(late["data"][0]["feedback"][0]["value"], 1);
    assert_eq!(late["data"][0]["feedback"][0]["weight"], 1);

    // A long trace id (indexed by its digest) is found, and feedback reaches it.
    let long = "L".repeat(100);
    let long_ingested = format!("{long}{long}{long}");
    c.ship(vec![record(&wa, &long_ingested, Some("long"), T, json!({"metadata": {"big": long_ingested}}))]).await;
    assert_eq!(c.spans(&ka, &format!("trace_id={long_ingested}")).await, [format!("{long_ingested}/long")]);
    assert_eq!(c.spans(&ka, &format!("metadata.big={long_ingested}")).await, [format!("{long_ingested}/long")]);
    assert_eq!(c.spans(&ka, &format!("trace_id={long}")).await, Vec::<String>::new());

    // Bad feedback.
    for (body, param) in [
        (json!({"value": 1}), "trace_id"),
        (json!({"trace_id": "", "value": 1}), "trace_id"),
        (json!({"trace_id": "x".repeat(129), "value": 1}), "trace_id"),
        (json!({"trace_id": 1, "value": 1}), "trace_id"),
        (json!({"trace_id": "t1"}), "value"),
        (json!({"trace_id": "t1", "value": "good"}), "value"),
        (json!({"trace_id": "t1", "value": 1, "weight": "heavy"}), "weight"),
        (json!({"trace_id": "t1", "value": 1, "metadata": "m"}), "metadata"),
        (json!({"trace_id": "t1", "value": 1, "score": 1}), "score"),
        (json!([1]), "body"),
    ] {
        assert_eq!(c.err(400, "POST", "/v1/feedback", Some(&ka), Some(body.clone())).await, param, "{body}");
    }
    let (status, _) = c.raw("POST", "/v1/feedback", Some(&ka), Body::from("{nope")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Bad query parameters, each named.
    let their_id = theirs["data"][0]["id"].as_str().unwrap().to_string();
    let unknown = uuid::Uuid::new_v4().to_string();
    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=x", "limit"),
        ("status=x", "status"),
        ("from=yesterday", "from"),
        ("to=-1", "to"),
        (&format!("from={}&to={}", T_S + 1, T_S) as &str, "from"),
        (&format!("after={unknown}"), "after"),
        (&format!("after={their_id}"), "after"),
        ("after=nope", "after"),
        ("trace_id=", "trace_id"),
        ("provider=a&provider=b", "provider"),
        ("metadata.=x", "metadata."),
        ("colour=blue", "colour"),
    ] {
        assert_eq!(c.err(400, "GET", &format!("/v1/logs?{query}"), Some(&ka), None).await, param, "{query}");
    }

    // Bad batches: refused whole, nothing of them stored.
    let good = record(&wa, "never", Some("n"), T, json!({}));
    let mut no_workspace = good.clone();
    no_workspace.as_object_mut().unwrap().remove("workspace");
    let mut float_time = good.clone();
    float_time["timestamp_ms"] = json!(1.5e12);
    let huge = record(&wa, "never", Some("h"), T, json!({"metadata": {"pad": "x".repeat(64 * 1024)}}));
    for (body, param) in [
        (json!({"records": [good.clone(), no_workspace]}), "records[1].workspace"),
        (json!({"records": [good.clone(), float_time]}), "records[1].timestamp_ms"),
        (json!({"records": [good.clone(), {"workspace": wa, "timestamp_ms": T}]}), "records[1].trace_id"),
        (json!({"records": [huge]}), "records[0]"),
        (json!({"records": [good.clone(), "x"]}), "records[1]"),
        (json!({"records": vec![good.clone(); 501]}), "records"),
        (json!({"records": {}}), "records"),
        (json!({"batch": []}), "batch"),
    ] {
        assert_eq!(c.err(400, "POST", "/internal/v1/records", Some(TOKEN), Some(body)).await, param);
    }
    let (status, _) = c.raw("POST", "/internal/v1/records", Some(TOKEN), Body::from("not json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(c.spans(&ka, "trace_id=never").await, Vec::<String>::new());
    // The largest batch goes in.
    c.ship(vec![good.clone(); 500]).await;
    assert_eq!(c.logs(&ka, "trace_id=never&limit=100").await["has_more"], true);

    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn pages_are_stable_and_complete() {
    let (c, state, dir, run) = start().await;
    let ws = format!("pages-{run}");
    let key = c.new_key(&ws).await;
    // 45 records, three to a millisecond (ties broken by id), shipped out of order.
    let mut records: Vec<Value> = (0..45)
        .map(|i| {
            let parity = if i % 2 == 0 { "even" } else { "odd" };
            record(
                &ws,
                &format!("p{i}"),
                Some(&format!("s{i}")),
                T + (i / 3) * 1000,
                json!({"metadata": {"parity": parity}}),
            )
        })
        .collect();
    records.reverse();
    records.swap(3, 30);
    c.ship(records).await;

    let everything = c.logs(&key, "limit=100").await;
    let all: Vec<Value> = everything["data"].as_array().unwrap().clone();
    assert_eq!((all.len(), &everything["has_more"]), (45, &json!(false)));
    let times: Vec<i64> = all.iter().map(|r| r["timestamp_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    assert_eq!(c.logs(&key, "").await["data"].as_array().unwrap().len(), 20);

    // Three pages of 20, 20 and 5 give the same records in the same order.
    let mut paged = Vec::new();
    let mut query = "limit=20".to_string();
    for (want, more) in [(20, true), (20, true), (5, false)] {
        let page = c.logs(&key, &query).await;
        let data = page["data"].as_array().unwrap().clone();
        assert_eq!((data.len(), &page["has_more"]), (want, &json!(more)), "{query}");
        query = format!("limit=20&after={}", data.last().unwrap()["id"].as_str().unwrap());
        paged.extend(data);
    }
    assert_eq!(paged, all);
    // An exact last page says there is no more.
    let last = c.logs(&key, &format!("limit=5&after={}", all[39]["id"].as_str().unwrap())).await;
    assert_eq!((last["data"].as_array().unwrap().len(), &last["has_more"]), (5, &json!(false)));
    assert_eq!(last["data"][4], all[44]);

    // Paging under a filter, by ones: the filtered part of the whole list.
    let even: Vec<Value> = all.iter().filter(|r| r["metadata"]["parity"] == "even").cloned().collect();
    let mut paged = Vec::new();
    let mut query = "metadata.parity=even&limit=7".to_string();
    loop {
        let page = c.logs(&key, &query).await;
        let data = page["data"].as_array().unwrap().clone();
        let Some(last) = data.last() else { break };
        query = format!("metadata.parity=even&limit=7&after={}", last["id"].as_str().unwrap());
        paged.extend(data);
        if page["has_more"] == false {
            break;
        }
    }
    assert_eq!((paged.len(), &paged), (23, &even));
    // A time window with paging.
    let window = c.spans(&key, &format!("from={}&to={}&limit=100", T_S + 2, T_S + 3)).await;
    assert_eq!(
        window,
        all[33..39]
            .iter()
            .map(|r| format!("{}/{}", r["trace_id"].as_str().unwrap(), r["span_id"].as_str().unwrap()))
            .collect::<Vec<_>>()
    );

    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn concurrent_batches_feedback_and_reads_all_land() {
    let (c, state, dir, run) = start().await;
    let ws = format!("busy-{run}");
    let key = c.new_key(&ws).await;
    let c = std::sync::Arc::new(c);
    let mut tasks = Vec::new();
    for batch in 0..8_i64 {
        let (c, ws, key) = (c.clone(), ws.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let records = (0..50_i64)
                .map(|i| {
                    record(
                        &ws,
                        &format!("b{batch}-{i}"),
                        Some("s"),
                        T + batch * 100 + i,
                        json!({"metadata": {"batch": batch}}),
                    )
                })
                .collect();
            c.ship(records).await;
            c.ok("POST", "/v1/feedback", &key, Some(json!({"trace_id": format!("b{batch}-0"), "value": batch}))).await;
            c.logs(&key, "limit=100").await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for batch in 0..8 {
        let page = c.logs(&key, &format!("metadata.batch={batch}&limit=100")).await;
        assert_eq!(page["data"].as_array().unwrap().len(), 50, "batch {batch}");
        let first = c.logs(&key, &format!("trace_id=b{batch}-0")).await;
        assert_eq!(first["data"][0]["feedback"][0]["value"], batch);
    }
    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_batch_sent_again_is_stored_once() {
    let (c, state, dir, run) = start().await;
    let (wa, wb) = (format!("again-a-{run}"), format!("again-b-{run}"));
    let (ka, kb) = (c.new_key(&wa).await, c.new_key(&wb).await);
    let id = |n: u32| json!({"record_id": format!("{n:032x}"), "metadata": {"n": n}});
    let batch = vec![record(&wa, "t1", Some("s1"), T, id(1)), record(&wa, "t2", Some("s2"), T + 1, id(2))];
    c.ship(batch.clone()).await;
    // The filter timed out on the first answer and sends the same batch again, with a new record.
    let mut again = batch.clone();
    again.push(record(&wa, "t3", Some("s3"), T + 2, id(3)));
    c.ship(again).await;
    assert_eq!(c.spans(&ka, "").await, ["t3/s3", "t2/s2", "t1/s1"]);
    // Its metadata was not stored twice either.
    assert_eq!(c.spans(&ka, "metadata.n=1").await, ["t1/s1"]);

    // The same id in another workspace is another record.
    c.ship(vec![record(&wb, "t1", Some("s1"), T, id(1))]).await;
    assert_eq!(c.spans(&kb, "").await, ["t1/s1"]);
    assert_eq!(c.spans(&ka, "trace_id=t1").await, ["t1/s1"]);

    // Records of older filters (no record_id) are all stored, twice if sent twice.
    let old = record(&wb, "old", Some("o1"), T + 5, json!({}));
    c.ship(vec![old.clone()]).await;
    c.ship(vec![old]).await;
    assert_eq!(c.spans(&kb, "trace_id=old").await, ["old/o1", "old/o1"]);

    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_retention_sweep_deletes_older_records_with_their_metadata() {
    let (c, state, dir, run) = start().await;
    let ws = format!("old-{run}");
    let key = c.new_key(&ws).await;
    const DAY: i64 = 86_400_000;
    // Years before the other tests' records (T...), which a shared database holds meanwhile.
    let base = T - 1000 * DAY;
    let meta = |user: &str| json!({"metadata": {"_user": user}});
    c.ship(vec![
        record(&ws, "old", Some("o"), base, meta("u-old")),
        record(&ws, "edge", Some("e"), base + DAY, meta("u-edge")),
        record(&ws, "new", Some("n"), base + 31 * DAY, meta("u-new")),
    ])
    .await;
    c.ok("POST", "/v1/feedback", &key, Some(json!({"trace_id": "new", "value": 1}))).await;

    // 30 days kept, seen from base + 31 days: the record of base goes, the one a day later stays.
    let now = base + 31 * DAY;
    let deleted = gateway_control_plane::retention::sweep_once(&state.db, 30, now).await.unwrap();
    assert!(deleted >= 1, "a reused database may hold older ones of earlier runs");
    assert_eq!(c.spans(&key, "").await, ["new/n", "edge/e"]);
    assert!(c.spans(&key, "metadata._user=u-old").await.is_empty());
    assert_eq!(c.spans(&key, "metadata._user=u-edge").await, ["edge/e"]);
    assert_eq!(c.logs(&key, "trace_id=new").await["data"][0]["feedback"][0]["value"], 1, "recent feedback stays");
    assert_eq!(gateway_control_plane::retention::sweep_once(&state.db, 30, now).await.unwrap(), 0, "swept again");

    state.db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
