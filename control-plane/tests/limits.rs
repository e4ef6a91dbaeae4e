//! Limits, prices, usage and the limits' ledger (issue 26) in process (tower `oneshot`), against
//! SQLite in a temp dir, or against the database `TEST_DATABASE_URL` names (e.g.
//! `postgres://...`). Limit ids and workspaces carry a per-run suffix, so a reused database works
//! too. The ledger's windows are checked at given times (`Db::lease` takes the time), the lease
//! endpoint and its strictness under concurrency at the real time.

// Helpers outside `#[test]` functions: clippy.toml's test allowances do not reach them.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use axum::http::StatusCode;
use common::{Client, TOKEN};
use gateway_control_plane::db::limits::{Answer, Ask, Report};
use gateway_control_plane::ledger::{TTL_MS, WINDOW_MS};
use gateway_control_plane::{api, AppState, Settings};
use gateway_schema::limits::{LimitKind, Period};
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-1";
/// 2026-11-26T16:13:20Z, in ms; that day ends 28,000 s later.
const T: i64 = 1_795_709_600_000;
const DAY_END: i64 = 1_795_737_600_000;
/// How long an unreported window grant counts after it was made.
/// How long an unreported requests grant counts: its lease, then a window (it has nothing to settle).
const UNREPORTED_MS: i64 = TTL_MS + WINDOW_MS;

struct Run {
    c: Client,
    state: AppState,
    settings: Settings,
    run: String,
}

async fn start() -> Run {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-limits-test-{run}"));
    let settings = common::settings(&dir, &[ADMIN]);
    let state = AppState::open(&settings).await.unwrap();
    Run { c: Client { app: api::router(state.clone()) }, state, settings, run }
}

/// A second control plane on the database of `first` (its own state dir, the same master key).
async fn second_control_plane(first: &Settings) -> AppState {
    let dir = first.state_dir.with_extension("second");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(first.state_dir.join("master.key"), dir.join("master.key")).unwrap();
    let mut settings = common::settings(&dir, &[ADMIN]);
    if settings.database_url.is_none() {
        settings.database_url = Some(first.database_url());
    }
    AppState::open(&settings).await.unwrap()
}

impl Client {
    async fn put_limit(&self, id: &str, body: Value) -> Value {
        self.ok("PUT", &format!("/v1/limits/{id}"), ADMIN, Some(body)).await
    }

    async fn new_key(&self, workspace: &str) -> (String, String) {
        let created = self.ok("POST", "/v1/api-keys", ADMIN, Some(json!({"workspace": workspace}))).await;
        (created["key"].as_str().unwrap().to_string(), created["id"].as_str().unwrap().to_string())
    }

    /// `POST /internal/v1/leases`: the answer's grants.
    async fn lease(&self, grants: Value, reports: Value) -> Vec<Value> {
        let body = json!({"grants": grants, "reports": reports});
        let answer = self.ok("POST", "/internal/v1/leases", TOKEN, Some(body)).await;
        answer["grants"].as_array().unwrap().clone()
    }
}

fn ask(limit: &str, kind: LimitKind, need: i64, want: i64) -> Ask {
    Ask { limit: limit.to_string(), kind, need, want }
}

fn report(lease: &Option<String>, used: i64) -> Report {
    Report { lease: lease.clone().unwrap(), used, uses: Vec::new() }
}

/// One ask's answer at `now_ms`: (granted, lease, remaining, reset_s, ttl_ms).
async fn lease_at(state: &AppState, ask: Ask, reports: &[Report], now_ms: i64) -> (i64, Option<String>, i64, i64, i64) {
    let answers: Vec<Answer> = state.db.lease(&[ask], reports, || now_ms).await.unwrap();
    let granted = answers[0].granted.clone().unwrap();
    let d = granted.decision;
    (d.granted, granted.lease, d.remaining, d.reset_s, d.ttl_ms)
}

#[tokio::test]
async fn limits_are_created_read_listed_replaced_and_deleted_by_admin_keys() {
    let Run { c, run, .. } = start().await;
    let (wa, wb) = (format!("wa-{run}"), format!("wb-{run}"));
    let (ka, ka_id) = c.new_key(&wa).await;
    let (kb, _) = c.new_key(&wb).await;
    let (team, keyed) = (format!("team.{run}"), format!("key_{run}"));

    let made = c.put_limit(&team, json!({"workspace": wa, "requests_per_minute": 60, "budget_usd": 12.5})).await;
    assert_eq!(made["id"], team.as_str());
    assert_eq!((&made["workspace"], &made["requests_per_minute"]), (&json!(wa), &json!(60)));
    assert_eq!((&made["budget_usd"], &made["budget_period"]), (&json!(12.5), &json!("month")));
    assert!(made["created_at"].as_i64().unwrap() > 0 && made.get("usage").is_none(), "{made}");
    let body = json!({"api_key_id": ka_id, "model": "gpt-4o", "tokens_per_minute": 1000});
    let by_key = c.put_limit(&keyed, body).await;
    assert_eq!((&by_key["api_key_id"], &by_key["model"]), (&json!(ka_id), &json!("gpt-4o")));
    assert!(by_key.get("workspace").is_none(), "{by_key}");

    // Reads: an admin key any limit; a workspace key its workspace's (its key's limits too).
    let read = c.ok("GET", &format!("/v1/limits/{team}"), &ka, None).await;
    assert_eq!(
        read["usage"],
        json!({"requests": 0, "tokens": 0, "spent_usd": 0.0,
        "period_start": Period::Month.start(gateway_control_plane::db::now_s() as u64),
        "reserved": {"requests": 0, "tokens": 0, "usd": 0.0}})
    );
    assert_eq!(read["requests_per_minute"], 60);
    c.ok("GET", &format!("/v1/limits/{keyed}"), &ka, None).await;
    c.ok("GET", &format!("/v1/limits/{keyed}"), ADMIN, None).await;
    c.err(404, "GET", &format!("/v1/limits/{team}"), Some(&kb), None).await;
    c.err(404, "GET", &format!("/v1/limits/nothing-{run}"), Some(ADMIN), None).await;
    c.err(401, "GET", &format!("/v1/limits/{team}"), None, None).await;
    let ids = |list: &Value| -> Vec<String> {
        assert_eq!((&list["object"], &list["has_more"]), (&json!("list"), &json!(false)), "{list}");
        let data = list["data"].as_array().unwrap();
        data.iter().map(|l| l["id"].as_str().unwrap().to_string()).filter(|id| id.ends_with(&run)).collect()
    };
    assert_eq!(ids(&c.ok("GET", "/v1/limits", &ka, None).await), [keyed.clone(), team.clone()]);
    assert!(ids(&c.ok("GET", "/v1/limits", &kb, None).await).is_empty());
    assert_eq!(ids(&c.ok("GET", "/v1/limits", ADMIN, None).await), [keyed.clone(), team.clone()]);

    // Only admin keys write.
    c.err(
        403,
        "PUT",
        &format!("/v1/limits/{team}"),
        Some(&ka),
        Some(json!({"workspace": wa, "requests_per_minute": 1})),
    )
    .await;
    c.err(403, "DELETE", &format!("/v1/limits/{team}"), Some(&ka), None).await;

    // Every bad field is named.
    let bad = |id: String, body: Value| {
        let c = &c;
        async move { c.err(400, "PUT", &format!("/v1/limits/{id}"), Some(ADMIN), Some(body)).await }
    };
    let ok_body = json!({"workspace": wa, "requests_per_minute": 1});
    assert_eq!(bad("a%20b".into(), ok_body.clone()).await, "id");
    assert_eq!(bad("x".repeat(129), ok_body.clone()).await, "id");
    assert_eq!(bad(team.clone(), json!({"api_key_id": "no-such-key", "requests_per_minute": 1})).await, "api_key_id");
    assert_eq!(bad(team.clone(), json!({"workspace": "a/b", "requests_per_minute": 1})).await, "workspace");
    assert_eq!(
        bad(team.clone(), json!({"workspace": wa, "api_key_id": ka_id, "requests_per_minute": 1})).await,
        "api_key_id"
    );
    assert_eq!(bad(team.clone(), json!({"requests_per_minute": 1})).await, "workspace");
    assert_eq!(bad(team.clone(), json!({"workspace": wa, "requests_per_minute": 0})).await, "requests_per_minute");
    assert_eq!(bad(team.clone(), json!({"workspace": wa, "tokens_per_minute": "9"})).await, "tokens_per_minute");
    assert_eq!(bad(team.clone(), json!({"workspace": wa, "budget_usd": -1})).await, "budget_usd");
    assert_eq!(
        bad(team.clone(), json!({"workspace": wa, "budget_usd": 1, "budget_period": "week"})).await,
        "budget_period"
    );
    assert_eq!(bad(team.clone(), json!({"workspace": wa, "rpm": 1})).await, "rpm");
    assert_eq!(bad(team.clone(), json!({"workspace": wa})).await, "body");
    assert_eq!(bad(team.clone(), json!([1])).await, "body");

    // Replaced: the new fields, the same creation time.
    let replaced = c.put_limit(&team, json!({"workspace": wa, "budget_usd": 3, "budget_period": "day"})).await;
    assert_eq!((&replaced["budget_period"], &replaced["created_at"]), (&json!("day"), &made["created_at"]));
    assert!(replaced.get("requests_per_minute").is_none(), "{replaced}");

    // The filter's policy of the workspace: its limits and its keys' limits.
    c.err(401, "GET", &format!("/internal/v1/workspaces/{wa}/policy"), Some(ADMIN), None).await;
    let policy = c.ok("GET", &format!("/internal/v1/workspaces/{wa}/policy"), TOKEN, None).await;
    let limits: Vec<&str> = policy["limits"].as_array().unwrap().iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(limits, [keyed.as_str(), team.as_str()]);
    assert_eq!(
        policy["limits"][0],
        json!({"id": keyed, "api_key_id": ka_id, "model": "gpt-4o",
        "tokens_per_minute": 1000, "budget_period": "month"})
    );
    assert_eq!(policy["prices"], json!({}));
    let empty = json!({"limits": [], "prices": {}});
    assert_eq!(c.ok("GET", &format!("/internal/v1/workspaces/{wb}/policy"), TOKEN, None).await, empty);
    assert_eq!(c.ok("GET", "/internal/v1/workspaces/a%20b/policy", TOKEN, None).await, empty);

    // Deleted: gone from reads, lists and the policy.
    let deleted = c.ok("DELETE", &format!("/v1/limits/{team}"), ADMIN, None).await;
    assert_eq!(deleted, json!({"id": team, "deleted": true}));
    c.err(404, "DELETE", &format!("/v1/limits/{team}"), Some(ADMIN), None).await;
    c.err(404, "GET", &format!("/v1/limits/{team}"), Some(ADMIN), None).await;
    assert_eq!(ids(&c.ok("GET", "/v1/limits", &ka, None).await), [keyed]);
    let policy = c.ok("GET", &format!("/internal/v1/workspaces/{wa}/policy"), TOKEN, None).await;
    assert_eq!(policy["limits"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn prices_come_from_the_workspace_or_the_catalog() {
    let Run { c, run, .. } = start().await;
    let (wa, wb) = (format!("wa-{run}"), format!("wb-{run}"));
    let (ka, _) = c.new_key(&wa).await;
    let (kb, _) = c.new_key(&wb).await;

    let catalog = c.ok("GET", "/v1/prices/gpt-4o-mini", &ka, None).await;
    assert_eq!(
        catalog,
        json!({"model": "gpt-4o-mini", "input_per_million": 0.15, "output_per_million": 0.6,
        "cached_input_per_million": 0.075, "max_output_tokens": 16384, "source": "catalog", "date": "2025-08-07"})
    );
    // A dated name takes its model's price.
    let dated = c.ok("GET", "/v1/prices/gpt-4o-mini-2024-07-18", &ka, None).await;
    assert_eq!((&dated["model"], &dated["source"]), (&json!("gpt-4o-mini-2024-07-18"), &json!("catalog")));
    assert_eq!((&dated["input_per_million"], &dated["date"]), (&json!(0.15), &json!("2025-08-07")));
    c.err(404, "GET", "/v1/prices/my-model", Some(&ka), None).await;
    c.err(401, "GET", "/v1/prices/gpt-4o", None, None).await;

    // A workspace's own price (any key of it), over the catalog's, for that workspace only.
    let mine = json!({"input_per_million": 1, "output_per_million": 2.5});
    let put = c.ok("PUT", "/v1/prices/my-model", &ka, Some(mine.clone())).await;
    assert_eq!(
        put,
        json!({"model": "my-model", "input_per_million": 1.0, "output_per_million": 2.5, "source": "workspace"})
    );
    assert_eq!(c.ok("GET", "/v1/prices/my-model", &ka, None).await, put);
    c.err(404, "GET", "/v1/prices/my-model", Some(&kb), None).await;
    // Over the catalog's: an admin key's to set (a team's key could otherwise escape its budget).
    let cheaper = json!({"input_per_million": 0.1, "output_per_million": 0.2, "cached_input_per_million": 0.05});
    c.err(403, "PUT", "/v1/prices/gpt-4o-mini", Some(&ka), Some(cheaper.clone())).await;
    assert_eq!(c.ok("GET", "/v1/prices/gpt-4o-mini", &ka, None).await["source"], "catalog");
    c.ok("PUT", &format!("/v1/prices/gpt-4o-mini?workspace={wa}"), ADMIN, Some(cheaper)).await;
    let over = c.ok("GET", "/v1/prices/gpt-4o-mini", &ka, None).await;
    assert_eq!(
        (&over["source"], &over["input_per_million"], over.get("date")),
        (&json!("workspace"), &json!(0.1), None)
    );
    assert_eq!(c.ok("GET", "/v1/prices/gpt-4o-mini", &kb, None).await["source"], "catalog");

    // Names with `/`, `@`, `:`, as they are or percent-encoded.
    c.ok("PUT", "/v1/prices/org/model@2025:1", &ka, Some(mine.clone())).await;
    assert_eq!(c.ok("GET", "/v1/prices/org%2Fmodel%402025%3A1", &ka, None).await["model"], "org/model@2025:1");

    // An admin key sets and reads another workspace's prices; a workspace key only its own.
    c.ok("PUT", &format!("/v1/prices/admin-set?workspace={wb}"), ADMIN, Some(mine.clone())).await;
    assert_eq!(c.ok("GET", "/v1/prices/admin-set", &kb, None).await["source"], "workspace");
    assert_eq!(c.ok("GET", &format!("/v1/prices/admin-set?workspace={wb}"), ADMIN, None).await["source"], "workspace");
    c.err(403, "PUT", &format!("/v1/prices/x?workspace={wb}"), Some(&ka), Some(mine.clone())).await;
    c.ok("PUT", &format!("/v1/prices/own?workspace={wa}"), &ka, Some(mine.clone())).await;

    // Every bad field is named.
    let bad = |path: &str, body: Value| {
        let (c, path, key) = (&c, path.to_string(), ka.clone());
        async move { c.err(400, "PUT", &path, Some(&key), Some(body)).await }
    };
    assert_eq!(bad("/v1/prices/m", json!({"input_per_million": 1})).await, "output_per_million");
    assert_eq!(
        bad("/v1/prices/m", json!({"input_per_million": -1, "output_per_million": 1})).await,
        "input_per_million"
    );
    assert_eq!(bad("/v1/prices/m", json!({"input_per_million": 1, "output_per_million": 1, "eur": 1})).await, "eur");
    assert_eq!(bad("/v1/prices/a%20b", mine.clone()).await, "model");
    assert_eq!(bad(&format!("/v1/prices/{}", "m".repeat(257)), mine.clone()).await, "model");
    assert_eq!(bad("/v1/prices/m?workspace=a%2Fb", mine.clone()).await, "workspace");
    assert_eq!(bad("/v1/prices/m?region=eu", mine.clone()).await, "region");
    assert_eq!(bad("/v1/prices/m", json!("x")).await, "body");

    // The filter's policy carries the workspace's prices.
    let policy = c.ok("GET", &format!("/internal/v1/workspaces/{wa}/policy"), TOKEN, None).await;
    let models: Vec<&String> = policy["prices"].as_object().unwrap().keys().collect();
    assert_eq!(models, ["gpt-4o-mini", "my-model", "org/model@2025:1", "own"]);
    assert_eq!(policy["prices"]["my-model"], json!({"input_per_million": 1.0, "output_per_million": 2.5}));
}

#[tokio::test]
async fn usage_adds_up_the_workspaces_records_by_group() {
    let Run { c, run, .. } = start().await;
    let (wa, wb) = (format!("wa-{run}"), format!("wb-{run}"));
    let (ka, _) = c.new_key(&wa).await;
    let (kb, _) = c.new_key(&wb).await;
    let s = T / 1000;
    let record = |ws: &str, at: i64, model: &str, provider: &str, extra: Value| {
        let mut r = json!({"workspace": ws, "trace_id": format!("t{at}"), "timestamp_ms": at * 1000 + 500,
            "model": model, "provider": provider, "status": 200});
        r.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        r
    };
    let used = |input: i64, output: i64, cost: Option<f64>, key: Option<&str>| {
        let mut fields = json!({"prompt_tokens": input, "completion_tokens": output});
        if let Some(cost) = cost {
            fields["cost_usd"] = json!(cost);
        }
        if let Some(key) = key {
            fields["api_key_id"] = json!(key);
        }
        fields
    };
    let records = vec![
        record(&wa, s, "gpt-4o", "openai", used(10, 5, Some(0.001), Some("k1"))),
        record(&wa, s + 1, "gpt-4o", "azure-openai", used(20, 10, Some(0.002), Some("k2"))),
        record(&wa, s + 2, "claude", "anthropic", used(1, 1, None, None)),
        record(&wa, s + 3, "gpt-4o", "openai", used(5, 5, Some(0.0005), Some("k1"))),
        // A record of an older filter: counted, with no tokens or cost.
        record(&wa, s + 4, "gpt-4o", "openai", json!({})),
        record(&wb, s, "gpt-4o", "openai", used(100, 100, Some(1.0), None)),
    ];
    let (status, _) = c.call("POST", "/internal/v1/records", Some(TOKEN), Some(json!({"records": records}))).await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let usage = |key: &str, query: String| {
        let (c, key) = (&c, key.to_string());
        async move {
            let answer = c.ok("GET", &format!("/v1/usage?{query}"), &key, None).await;
            assert_eq!(answer["object"], "list", "{answer}");
            answer["data"].clone()
        }
    };
    let range = format!("start={s}&end={}", s + 10);
    let sums = |requests: i64, input: i64, output: i64, cost: f64| json!({"requests": requests, "input_tokens": input, "output_tokens": output, "cost_usd": cost});
    let with = |keys: Value, sums: Value| {
        let mut row = sums;
        row.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        row
    };
    assert_eq!(usage(&ka, range.clone()).await, json!([sums(5, 36, 21, 0.0035)]));
    assert_eq!(
        usage(&ka, format!("{range}&group_by=model")).await,
        json!([
            with(json!({"model": "claude"}), sums(1, 1, 1, 0.0)),
            with(json!({"model": "gpt-4o"}), sums(4, 35, 20, 0.0035))
        ])
    );
    assert_eq!(
        usage(&ka, format!("{range}&group_by=provider&group_by=model")).await,
        json!([
            with(json!({"provider": "anthropic", "model": "claude"}), sums(1, 1, 1, 0.0)),
            with(json!({"provider": "azure-openai", "model": "gpt-4o"}), sums(1, 20, 10, 0.002)),
            with(json!({"provider": "openai", "model": "gpt-4o"}), sums(3, 15, 10, 0.0015)),
        ])
    );
    assert_eq!(
        usage(&ka, format!("{range}&group_by=api_key")).await,
        json!([
            with(json!({"api_key": null}), sums(2, 1, 1, 0.0)),
            with(json!({"api_key": "k1"}), sums(2, 15, 10, 0.0015)),
            with(json!({"api_key": "k2"}), sums(1, 20, 10, 0.002)),
        ])
    );
    assert_eq!(
        usage(&ka, format!("{range}&group_by=workspace")).await,
        json!([with(json!({"workspace": wa}), sums(5, 36, 21, 0.0035))])
    );
    // `start` inclusive, `end` exclusive; by default from 0 to now.
    assert_eq!(usage(&ka, format!("start={}&end={}", s + 1, s + 3)).await, json!([sums(2, 21, 11, 0.002)]));
    assert_eq!(usage(&ka, String::new()).await, json!([sums(5, 36, 21, 0.0035)]));
    assert_eq!(usage(&ka, format!("start={}&end={}&group_by=model", s + 20, s + 30)).await, json!([]));
    // Another workspace sees its own records; an admin key names the workspace.
    assert_eq!(usage(&kb, range.clone()).await, json!([sums(1, 100, 100, 1.0)]));
    assert_eq!(usage(ADMIN, format!("{range}&workspace={wb}")).await, json!([sums(1, 100, 100, 1.0)]));
    c.err(403, "GET", &format!("/v1/usage?workspace={wa}"), Some(&kb), None).await;
    c.err(401, "GET", "/v1/usage", None, None).await;
    for (query, param) in [
        ("group_by=team", "group_by"),
        ("start=x", "start"),
        ("end=-1", "end"),
        ("start=5&end=4", "start"),
        ("start=1&start=2", "start"),
        ("bogus=1", "bogus"),
    ] {
        assert_eq!(c.err(400, "GET", &format!("/v1/usage?{query}"), Some(&ka), None).await, param, "{query}");
    }
}

#[tokio::test]
async fn the_lease_call_answers_each_ask_in_order() {
    let Run { c, run, .. } = start().await;
    let ws = format!("ws-{run}");
    let (rpm, gone) = (format!("rpm-{run}"), format!("gone-{run}"));
    c.put_limit(&rpm, json!({"workspace": ws, "requests_per_minute": 10})).await;
    c.put_limit(&gone, json!({"workspace": ws, "requests_per_minute": 10})).await;

    let first = c
        .lease(
            json!([{"limit": rpm, "kind": "requests", "need": 1, "want": 4},
                {"limit": rpm, "kind": "budget", "need": 1, "want": 1},
                {"limit": format!("none-{run}"), "kind": "tokens", "need": 1, "want": 1},
                {"limit": gone, "kind": "requests", "need": 2, "want": 100}]),
            json!([]),
        )
        .await;
    assert_eq!(first.len(), 4);
    let lease = first[0]["lease"].as_str().unwrap().to_string();
    assert_eq!(
        first[0],
        json!({"limit": rpm, "kind": "requests", "lease": lease, "granted": 3, "ttl_ms": TTL_MS,
        "bound": 10, "remaining": 7, "reset_s": WINDOW_MS / 1000})
    );
    let gone_answer = |limit: &str, kind: &str| {
        json!({"limit": limit, "kind": kind, "lease": null, "granted": 0, "ttl_ms": 0, "bound": 0,
            "remaining": 0, "reset_s": 0, "gone": true})
    };
    assert_eq!(first[1], gone_answer(&rpm, "budget"), "a kind the limit does not bound");
    assert_eq!(first[2], gone_answer(&format!("none-{run}"), "tokens"), "no such limit");
    assert_eq!((&first[3]["granted"], &first[3]["remaining"]), (&json!(3), &json!(7)));

    // A deleted limit is gone; its leases' reports are taken all the same.
    c.ok("DELETE", &format!("/v1/limits/{gone}"), ADMIN, None).await;
    let old = first[3]["lease"].as_str().unwrap();
    let after = c
        .lease(json!([{"limit": gone, "kind": "requests", "need": 1, "want": 1}]), json!([{"lease": old, "used": 3}]))
        .await;
    assert_eq!(after, [gone_answer(&gone, "requests")]);

    // The reports come first: the unused allowance is free at once.
    let next = c
        .lease(
            json!([{"limit": rpm, "kind": "requests", "need": 7, "want": 7}]),
            json!([{"lease": lease, "used": 0}, {"lease": "unknown", "used": 5}]),
        )
        .await;
    assert_eq!((&next[0]["granted"], &next[0]["remaining"]), (&json!(7), &json!(3)));
    let refused = c.lease(json!([{"limit": rpm, "kind": "requests", "need": 4, "want": 4}]), json!([])).await;
    assert_eq!(
        (&refused[0]["granted"], &refused[0]["lease"], &refused[0]["remaining"]),
        (&json!(0), &Value::Null, &json!(3))
    );
    assert_eq!(refused[0]["bound"], 10);

    // The usage of a limit: what its window holds now, reported or held by leases not
    // reported yet (here: 7 held).
    let read = c.ok("GET", &format!("/v1/limits/{rpm}"), ADMIN, None).await;
    assert_eq!((&read["usage"]["requests"], &read["usage"]["reserved"]["requests"]), (&json!(0), &json!(7)));

    // Only the filter calls it, with a well-formed body.
    c.err(401, "POST", "/internal/v1/leases", None, Some(json!({}))).await;
    c.err(401, "POST", "/internal/v1/leases", Some(ADMIN), Some(json!({}))).await;
    let bad = c
        .err(
            400,
            "POST",
            "/internal/v1/leases",
            Some(TOKEN),
            Some(json!({"grants": [{"limit": rpm, "kind": "requests", "need": -1}]})),
        )
        .await;
    assert_eq!(bad, "grants[0].need");
    let bad =
        c.err(400, "POST", "/internal/v1/leases", Some(TOKEN), Some(json!({"reports": [{"lease": lease}]}))).await;
    assert_eq!(bad, "reports[0].used");
    assert_eq!(c.err(400, "POST", "/internal/v1/leases", Some(TOKEN), Some(json!([]))).await, "body");
}

#[tokio::test]
async fn a_request_window_frees_unused_allowance_at_the_report_and_used_allowance_a_window_later() {
    let Run { c, state, run, .. } = start().await;
    let rpm = format!("rpm-{run}");
    c.put_limit(&rpm, json!({"workspace": format!("ws-{run}"), "requests_per_minute": 10})).await;
    let requests = |need, want| ask(&rpm, LimitKind::Requests, need, want);

    let (granted, all, remaining, reset_s, ttl_ms) = lease_at(&state, requests(10, 10), &[], T).await;
    assert_eq!((granted, remaining, reset_s, ttl_ms), (10, 0, 60, TTL_MS), "its first use leaves in a window");
    // Unreported, the grant holds the window (until its lease and a window ended); while it is
    // out, the reset is a window after its grant, when its first use leaves at the earliest.
    let (granted, lease, remaining, reset_s, _) = lease_at(&state, requests(1, 1), &[], T + 1000).await;
    assert_eq!((granted, lease, remaining, reset_s), (0, None, 0, 59));
    // Reported (4 used) at T + 6 s: the 6 unused are free at once, a quarter of them granted.
    let (granted, quarter, remaining, reset_s, _) =
        lease_at(&state, requests(1, 100), &[report(&all, 4)], T + 6000).await;
    assert_eq!((granted, remaining, reset_s), (2, 4, 60), "the 4 used free a window after the report");
    // Reporting again changes nothing.
    let (granted, _, remaining, reset_s, _) = lease_at(&state, requests(5, 5), &[report(&all, 0)], T + 7000).await;
    assert_eq!((granted, remaining, reset_s), (0, 4, 59));
    let usage = state.db.occupancy(&state.db.limit(&rpm).await.unwrap().unwrap().limit, T + 7000).await.unwrap();
    assert_eq!((usage.requests, usage.reserved[0]), (4, 2), "4 reported, 2 in a lease not reported yet");
    // A window after the report its 4 are free; the unreported 2 still count.
    let (granted, rest, remaining, _, _) = lease_at(&state, requests(8, 8), &[], T + 66_000).await;
    assert_eq!((granted, remaining), (8, 0));
    let reports = [report(&quarter, 2), report(&rest, 0)];
    let (granted, _, remaining, reset_s, _) = lease_at(&state, requests(9, 9), &reports, T + 70_000).await;
    assert_eq!((granted, remaining, reset_s), (0, 8, 60));
    let (granted, _, _, _, _) = lease_at(&state, requests(10, 10), &[], T + 130_000).await;
    assert_eq!(granted, 10);
}

/// Issue 45: a use counts a window from its admission, whatever lease it came from and
/// whenever that lease was reported.
#[tokio::test]
async fn each_use_a_report_places_leaves_the_window_a_window_after_its_admission() {
    let Run { c, state, run, .. } = start().await;
    let rpm = format!("rpm-{run}");
    c.put_limit(&rpm, json!({"workspace": format!("ws-{run}"), "requests_per_minute": 3})).await;
    let one = || ask(&rpm, LimitKind::Requests, 1, 1);
    let placed = |lease: &Option<String>, uses: Vec<(i64, i64)>| Report {
        lease: lease.clone().unwrap(),
        used: uses.iter().map(|(_, amount)| amount).sum(),
        uses,
    };
    // One admitted at T (reported with the next ask; its offset from its grant is 0), two at
    // T + 50.5 s, reported 11 s later.
    let (_, first, _, reset_s, _) = lease_at(&state, one(), &[], T).await;
    assert_eq!(reset_s, 60);
    let (_, second, _, _, _) = lease_at(&state, one(), &[placed(&first, vec![(0, 1)])], T + 50_500).await;
    let (_, third, _, _, _) = lease_at(&state, one(), &[], T + 50_500).await;
    let (granted, _, _, reset_s, _) = lease_at(&state, one(), &[], T + 51_000).await;
    assert_eq!((granted, reset_s), (0, 9), "the first leaves at T + 60 s");
    // At T + 61.5 s the first has left: exactly one more.
    let reports = [placed(&second, vec![(0, 1)]), placed(&third, vec![(0, 1)])];
    let (granted, _, _, reset_s, _) = lease_at(&state, one(), &reports, T + 61_500).await;
    assert_eq!((granted, reset_s), (1, 49), "the two of T + 50.5 s leave at T + 110.5 s");
    assert_eq!(lease_at(&state, one(), &[], T + 61_500).await.0, 0);
    // An offset reaching past the report counts from the report (from the offset, it would
    // stay in the window longer).
    let (_, late, _, _, _) = lease_at(&state, one(), &[], T + 200_000).await;
    let report = Report { lease: late.clone().unwrap(), used: 1, uses: vec![(90_000, 1)] };
    let (granted, _, _, _, _) = lease_at(&state, one(), &[report], T + 205_000).await;
    assert_eq!(granted, 1);
    // At T + 266 s it has left (T + 265 s); the lease granted at T + 205 s still counts.
    let two = ask(&rpm, LimitKind::Requests, 2, 2);
    assert_eq!(lease_at(&state, two, &[], T + 266_000).await.0, 2, "placed at T + 290 s, it would still count");
}

#[tokio::test]
async fn tokens_reported_beyond_the_grant_hold_the_window() {
    let Run { c, state, run, .. } = start().await;
    let tpm = format!("tpm-{run}");
    c.put_limit(&tpm, json!({"workspace": format!("ws-{run}"), "tokens_per_minute": 1000})).await;
    let tokens = |need, want| ask(&tpm, LimitKind::Tokens, need, want);
    let (granted, lease, remaining, _, _) = lease_at(&state, tokens(300, 300), &[], T).await;
    assert_eq!((granted, remaining), (300, 700));
    // The provider reported 1200 tokens where 300 were reserved: the window is full for a minute.
    let (granted, _, remaining, reset_s, _) = lease_at(&state, tokens(1, 1), &[report(&lease, 1200)], T + 5000).await;
    assert_eq!((granted, remaining, reset_s), (0, 0, 60));
    assert_eq!(lease_at(&state, tokens(1, 1), &[], T + 65_000).await.0, 1);
}

#[tokio::test]
async fn budgets_count_their_period_and_free_unspent_reservations_at_once() {
    let Run { c, state, run, .. } = start().await;
    let (daily, total) = (format!("daily-{run}"), format!("total-{run}"));
    let ws = format!("ws-{run}");
    c.put_limit(&daily, json!({"workspace": ws, "budget_usd": 1, "budget_period": "day"})).await;
    c.put_limit(&total, json!({"workspace": ws, "budget_usd": 0.5, "budget_period": "total"})).await;
    let budget = |need, want| ask(&daily, LimitKind::Budget, need, want);
    let until_day_end = (DAY_END - T) / 1000;

    let (granted, first, remaining, reset_s, ttl_ms) = lease_at(&state, budget(300_000, 300_000), &[], T).await;
    assert_eq!((granted, remaining, reset_s, ttl_ms), (300_000, 700_000, until_day_end, TTL_MS));
    let (granted, _, remaining, reset_s, _) = lease_at(&state, budget(800_000, 800_000), &[], T + 1000).await;
    assert_eq!((granted, remaining, reset_s), (0, 700_000, until_day_end - 1));
    // 100,000 of 300,000 spent: the rest is free at once.
    let (granted, _, remaining, _, _) =
        lease_at(&state, budget(800_000, 800_000), &[report(&first, 100_000)], T + 2000).await;
    assert_eq!((granted, remaining), (800_000, 100_000));
    // That grant is never reported (its replica died): it stays spent for the whole period.
    let later = T + 2 * 3_600_000;
    let (granted, _, remaining, _, _) = lease_at(&state, budget(100_001, 100_001), &[], later).await;
    assert_eq!((granted, remaining), (0, 100_000));
    let usage = state.db.occupancy(&state.db.limit(&daily).await.unwrap().unwrap().limit, later).await.unwrap();
    assert_eq!((usage.spent_micro_usd, usage.period_start), (100_000, DAY_END / 1000 - 86_400));
    assert_eq!(usage.reserved[2], 800_000, "the dead replica's lease is held for the period");
    // A lease ends with its period at the latest.
    let (granted, _, _, reset_s, ttl_ms) = lease_at(&state, budget(1, 1), &[], DAY_END - 1500).await;
    assert_eq!((granted, reset_s, ttl_ms), (1, 2, 1500));
    // The next day starts from nothing.
    let (granted, _, remaining, reset_s, _) = lease_at(&state, budget(1_000_000, 1_000_000), &[], DAY_END).await;
    assert_eq!((granted, remaining, reset_s), (1_000_000, 0, 86_400));
    // A total budget never resets.
    let (granted, _, remaining, reset_s, ttl_ms) =
        lease_at(&state, ask(&total, LimitKind::Budget, 1, 1000), &[], T).await;
    assert_eq!((granted, remaining, reset_s, ttl_ms), (1000, 499_000, 0, TTL_MS));
}

/// Concurrent lease calls over two control planes sharing one database: each grant is made
/// under the limit's lock, so they add up to exactly the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_lease_calls_on_two_control_planes_never_grant_past_the_bound() {
    let Run { c, settings, run, .. } = start().await;
    let second = second_control_plane(&settings).await;
    let apps = [c.app.clone(), api::router(second)];
    let ws = format!("ws-{run}");
    let (rpm, budget) = (format!("rpm-{run}"), format!("budget-{run}"));
    c.put_limit(&rpm, json!({"workspace": ws, "requests_per_minute": 10})).await;
    // Exactly five reservations of 0.1 USD.
    c.put_limit(&budget, json!({"workspace": ws, "budget_usd": 0.5, "budget_period": "total"})).await;

    let burst = |calls: usize, grants: Value| {
        let tasks: Vec<_> = (0..calls)
            .map(|i| {
                let client = Client { app: apps[i % 2].clone() };
                let grants = grants.clone();
                tokio::spawn(async move { client.lease(grants, json!([])).await })
            })
            .collect();
        async move {
            let mut granted = Vec::new();
            for task in tasks {
                let answer = task.await.unwrap();
                granted.push(answer[0]["granted"].as_i64().unwrap());
            }
            granted
        }
    };
    let requests = burst(40, json!([{"limit": rpm, "kind": "requests", "need": 1, "want": 1}])).await;
    assert_eq!(requests.iter().sum::<i64>(), 10, "{requests:?}");
    assert_eq!(requests.iter().filter(|g| **g == 1).count(), 10);
    let wanting_more = burst(20, json!([{"limit": rpm, "kind": "requests", "need": 1, "want": 5}])).await;
    assert_eq!(wanting_more.iter().sum::<i64>(), 0, "the window is full: {wanting_more:?}");
    let spends = burst(20, json!([{"limit": budget, "kind": "budget", "need": 100_000, "want": 100_000}])).await;
    assert_eq!(spends.iter().filter(|g| **g == 100_000).count(), 5, "{spends:?}");
    assert_eq!(spends.iter().sum::<i64>(), 500_000);

    let read = c.ok("GET", &format!("/v1/limits/{budget}"), ADMIN, None).await;
    // Nothing reported yet: all of it is held by the leases.
    assert_eq!((&read["usage"]["reserved"]["usd"], &read["usage"]["period_start"]), (&json!(0.5), &json!(0)));
    let rpm_read = c.ok("GET", &format!("/v1/limits/{rpm}"), ADMIN, None).await;
    assert_eq!(rpm_read["usage"]["reserved"]["requests"], 10);
}

/// The other limits' bounds, in a burst of mixed calls: grants from several limits in one call
/// lock them in id order, so calls asking for them in opposite orders finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_naming_limits_in_opposite_orders_all_finish() {
    let Run { c, settings, run, .. } = start().await;
    let second = second_control_plane(&settings).await;
    let apps = [c.app.clone(), api::router(second)];
    let (a, b) = (format!("a-{run}"), format!("b-{run}"));
    for id in [&a, &b] {
        c.put_limit(id, json!({"workspace": format!("ws-{run}"), "requests_per_minute": 30})).await;
    }
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let client = Client { app: apps[i % 2].clone() };
            let (first, then) = if i % 3 == 0 { (&b, &a) } else { (&a, &b) };
            let grants = json!([{"limit": first, "kind": "requests", "need": 1, "want": 1},
                {"limit": then, "kind": "requests", "need": 1, "want": 1}]);
            tokio::spawn(async move { client.lease(grants, json!([])).await })
        })
        .collect();
    let mut per_limit = std::collections::HashMap::<String, i64>::new();
    for task in tasks {
        for answer in task.await.unwrap() {
            *per_limit.entry(answer["limit"].as_str().unwrap().to_string()).or_default() +=
                answer["granted"].as_i64().unwrap();
        }
    }
    assert_eq!((per_limit[&a], per_limit[&b]), (30, 30));
}

#[tokio::test]
async fn the_sweep_deletes_grants_that_count_nowhere() {
    let Run { c, state, settings, run } = start().await;
    let (rpm, daily) = (format!("rpm-{run}"), format!("daily-{run}"));
    let ws = format!("ws-{run}");
    c.put_limit(&rpm, json!({"workspace": ws, "requests_per_minute": 10})).await;
    c.put_limit(&daily, json!({"workspace": ws, "budget_usd": 1, "budget_period": "day"})).await;
    // 2001-09-09T01:46:40Z: no other test's grants end near it; that day ends 80,000 s later.
    let t0: i64 = 1_000_000_000_000;
    let day_end = t0 + 80_000_000;
    let (_, reported, _, _, _) = lease_at(&state, ask(&rpm, LimitKind::Requests, 2, 2), &[], t0).await;
    lease_at(&state, ask(&rpm, LimitKind::Requests, 3, 3), &[report(&reported, 2)], t0 + 1000).await;
    lease_at(&state, ask(&daily, LimitKind::Budget, 5, 5), &[], t0).await;
    let pool = sqlx::AnyPool::connect(&settings.database_url()).await.unwrap();
    let left = |limit: String| {
        let pool = pool.clone();
        async move {
            let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM limit_grants WHERE limit_id = $1")
                .bind(limit)
                .fetch_one(&pool)
                .await
                .unwrap();
            count
        }
    };
    assert_eq!((left(rpm.clone()).await, left(daily.clone()).await), (2, 1));
    let sweep = |at: i64| state.db.delete_spent_grants(at);
    sweep(t0 + 1000 + WINDOW_MS - 1).await.unwrap();
    assert_eq!(left(rpm.clone()).await, 2, "the reported grant counts for a window after its report");
    sweep(t0 + 1000 + WINDOW_MS).await.unwrap();
    assert_eq!(left(rpm.clone()).await, 1);
    sweep(t0 + 1000 + UNREPORTED_MS).await.unwrap();
    assert_eq!(left(rpm.clone()).await, 0, "the unreported one after its lease and a window");
    assert_eq!(left(daily.clone()).await, 1, "a budget's grant counts for its period");
    sweep(day_end).await.unwrap();
    assert_eq!(left(daily.clone()).await, 0);
    // Deleting a limit deletes its ledger.
    lease_at(&state, ask(&daily, LimitKind::Budget, 5, 5), &[], t0).await;
    c.ok("DELETE", &format!("/v1/limits/{daily}"), ADMIN, None).await;
    assert_eq!(left(daily).await, 0);
    pool.close().await;
}
