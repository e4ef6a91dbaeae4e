//! Every endpoint in process (tower `oneshot`), against SQLite in a temp dir, or against the
//! database `TEST_DATABASE_URL` names (e.g. `postgres://...`). Slugs carry a per-run suffix
//! and fresh workspaces are per run, so a reused database works too.

// Helpers outside `#[test]` functions: clippy.toml's test allowances do not reach them.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use axum::http::StatusCode;
use common::{Client, TOKEN};
use gateway_control_plane::crypto::key_hash;
use gateway_control_plane::{api, AppState, Settings};
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-1";

fn settings(dir: &std::path::Path) -> Settings {
    common::settings(dir, &[ADMIN, "admin-key-2"])
}

async fn start(settings: &Settings) -> (Client, AppState) {
    let state = AppState::open(settings).await.unwrap();
    (Client { app: api::router(state.clone()) }, state)
}

#[tokio::test]
async fn every_endpoint_end_to_end() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{run}"));
    let settings = settings(&dir);
    let (c, state) = start(&settings).await;
    let (provider, config, guard, prompt, team) = (
        format!("oai-{run}"),
        format!("cfg-{run}"),
        format!("jwt-{run}"),
        format!("hello-{run}"),
        format!("team-{run}"),
    );

    // Health and authentication.
    assert_eq!(c.call("GET", "/health", None, None).await, (StatusCode::OK, json!({"status": "ok"})));
    c.err(401, "GET", &format!("/v1/prompts/{prompt}"), None, None).await;
    c.err(401, "GET", &format!("/v1/prompts/{prompt}"), Some("nope"), None).await;
    c.err(404, "GET", "/v1/unknown", Some(ADMIN), None).await;

    // Providers: checked by the filter's credential parser, secrets masked on read.
    let secret = "sk-live-0123456789abcd";
    let p = c
        .ok("PUT", &format!("/v1/providers/{provider}"), ADMIN, Some(json!({"provider": "openai", "api_key": secret})))
        .await;
    assert_eq!(p["slug"], provider.as_str());
    assert!(p["id"].as_str().unwrap().len() == 36 && p["version_id"].as_str().unwrap().len() == 36);
    let got = c.ok("GET", &format!("/v1/providers/{provider}"), ADMIN, None).await;
    assert_eq!((got["provider"].as_str(), got["api_key"].as_str()), (Some("openai"), Some("abcd")));
    assert!(!got.to_string().contains(secret));
    let param =
        c.err(400, "PUT", &format!("/v1/providers/{provider}"), Some(ADMIN), Some(json!({"api_key": "k"}))).await;
    assert_eq!(param, "provider");
    let param = c
        .err(400, "PUT", &format!("/v1/providers/{provider}"), Some(ADMIN), Some(json!({"provider": "openai", "x": 1})))
        .await;
    assert_eq!(param, "x");
    c.err(400, "PUT", "/v1/providers/bad$slug", Some(ADMIN), Some(json!({"provider": "openai"}))).await;
    c.err(400, "PUT", &format!("/v1/providers/{provider}"), Some(ADMIN), None).await;

    // Configs: the body is the config; the filter's parser names the path.
    let cfg = json!({"provider": "openai", "retry": {"attempts": 2}});
    let cf = c.ok("PUT", &format!("/v1/configs/{config}"), ADMIN, Some(cfg.clone())).await;
    let got = c.ok("GET", &format!("/v1/configs/{}", cf["id"].as_str().unwrap()), ADMIN, None).await;
    assert_eq!((&got["config"], &got["slug"], &got["version_id"]), (&cfg, &json!(config), &cf["version_id"]));
    let param = c
        .err(400, "PUT", &format!("/v1/configs/{config}"), Some(ADMIN), Some(json!({"retry": {"attempts": "x"}})))
        .await;
    assert_eq!(param, "retry.attempts");

    // Guardrails: known check ids, jwt parameters checked for form; PUT by UUID versions it.
    let jwt = json!({"name": "jwt", "checks": [{"id": "default.jwt", "name": "jwt", "is_enabled": true,
        "parameters": {"jwksUri": "http://127.0.0.1:9/jwks.json", "maxTokenAge": "30m", "algorithms": ["RS256"]}}],
        "actions": {"deny": true, "async": false, "on_fail": {"feedback": {"value": -1, "weight": 1, "metadata": "m"}}}});
    let g1 = c.ok("PUT", &format!("/v1/guardrails/{guard}"), ADMIN, Some(jwt.clone())).await;
    let gid = g1["id"].as_str().unwrap().to_string();
    let g2 = c.ok("PUT", &format!("/v1/guardrails/{gid}"), ADMIN, Some(jwt.clone())).await;
    assert_eq!(g2["id"], g1["id"]);
    assert_ne!(g2["version_id"], g1["version_id"]);
    let got = c.ok("GET", &format!("/v1/guardrails/{guard}"), ADMIN, None).await;
    assert_eq!((&got["checks"], &got["version_id"]), (&jwt["checks"], &g2["version_id"]));
    let contains = json!({"id": "default.contains", "parameters": {"words": ["a"], "operator": "any"}});
    let bad = json!({"name": "g", "checks": [contains, {"id": "vendor.nope", "parameters": {}}]});
    assert_eq!(c.err(400, "PUT", &format!("/v1/guardrails/{guard}"), Some(ADMIN), Some(bad)).await, "checks[1].id");
    let rule = json!({"name": "g", "checks": [{"id": "default.regexMatch", "parameters": {"rule": "(a"}}]});
    assert_eq!(
        c.err(400, "PUT", &format!("/v1/guardrails/{guard}"), Some(ADMIN), Some(rule)).await,
        "checks[0].parameters"
    );
    let hs = json!({"name": "g", "checks": [{"id": "default.jwt", "parameters": {"jwksUri": "https://a/j", "algorithms": ["HS256"]}}]});
    assert_eq!(
        c.err(400, "PUT", &format!("/v1/guardrails/{guard}"), Some(ADMIN), Some(hs)).await,
        "checks[0].parameters"
    );
    assert_eq!(
        c.err(400, "PUT", &format!("/v1/guardrails/{guard}"), Some(ADMIN), Some(json!({"checks": []}))).await,
        "checks"
    );
    let unknown_uuid = uuid::Uuid::new_v4().to_string();
    c.err(404, "PUT", &format!("/v1/guardrails/{unknown_uuid}"), Some(ADMIN), Some(jwt.clone())).await;
    c.err(404, "GET", &format!("/v1/guardrails/{unknown_uuid}"), Some(ADMIN), None).await;

    // Prompts: versions, patch, GET one version, render.
    let v1 = c.ok("PUT", &format!("/v1/prompts/{prompt}"), ADMIN,
        Some(json!({"string": "Hello {{name}} <{{tag}}>", "model": "gpt-4o", "parameters": {"temperature": 0.5, "max_tokens": 20}}))).await;
    let pid = v1["id"].as_str().unwrap().to_string();
    let v2 = c.ok("PUT", &format!("/v1/prompts/{pid}"), ADMIN, Some(json!({"patch": true, "model": "gpt-4.1"}))).await;
    assert_eq!((&v2["id"], &v2["slug"]), (&v1["id"], &json!(prompt)));
    assert_ne!(v2["prompt_version_id"], v1["prompt_version_id"]);
    let latest = c.ok("GET", &format!("/v1/prompts/{prompt}"), ADMIN, None).await;
    assert_eq!((&latest["model"], &latest["string"]), (&json!("gpt-4.1"), &json!("Hello {{name}} <{{tag}}>")));
    assert_eq!(latest["prompt_version_id"], v2["prompt_version_id"]);
    let old = c
        .ok("GET", &format!("/v1/prompts/{prompt}?version={}", v1["prompt_version_id"].as_str().unwrap()), ADMIN, None)
        .await;
    assert_eq!(old["model"], "gpt-4o");
    c.err(404, "GET", &format!("/v1/prompts/{prompt}?version={unknown_uuid}"), Some(ADMIN), None).await;
    assert_eq!(
        c.err(400, "PUT", &format!("/v1/prompts/{prompt}"), Some(ADMIN), Some(json!({"model": "m"}))).await,
        "string"
    );
    assert_eq!(
        c.err(400, "PUT", &format!("/v1/prompts/{prompt}"), Some(ADMIN), Some(json!({"string": "s", "tools": {}})))
            .await,
        "tools"
    );
    c.err(404, "PUT", &format!("/v1/prompts/{unknown_uuid}"), Some(ADMIN), Some(json!({"string": "s"}))).await;
    let rendered = c
        .ok(
            "POST",
            &format!("/v1/prompts/{prompt}/render"),
            ADMIN,
            Some(json!({"variables": {"name": "Ann & Bo", "tag": "<b>"}, "temperature": 0.9})),
        )
        .await;
    assert_eq!(
        rendered,
        json!({"success": true, "data": {"model": "gpt-4.1", "temperature": 0.9, "max_tokens": 20,
        "messages": [{"role": "user", "content": "Hello Ann & Bo <<b>>"}]}})
    );
    let render = format!("/v1/prompts/{prompt}/render");
    assert_eq!(
        c.err(400, "POST", &render, Some(ADMIN), Some(json!({"variables": {"name": "A"}}))).await,
        "variables.tag"
    );
    assert_eq!(c.err(400, "POST", &render, Some(ADMIN), Some(json!({"temperature": 1}))).await, "variables");
    let nested = json!({"variables": {"name": "A", "tag": "t"}, "hyperparameters": {"temperature": 1}});
    assert_eq!(c.err(400, "POST", &render, Some(ADMIN), Some(nested)).await, "hyperparameters");
    c.err(404, "POST", "/v1/prompts/missing-prompt/render", Some(ADMIN), Some(json!({"variables": {}}))).await;

    // API keys: admin only; a new workspace on first use; isolation.
    let created = c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team}))).await;
    assert_eq!(created.0, StatusCode::CREATED);
    let (team_key, team_key_id) =
        (created.1["key"].as_str().unwrap().to_string(), created.1["id"].as_str().unwrap().to_string());
    assert!(team_key.starts_with("gw-") && team_key.len() == 35);
    assert_eq!((&created.1["workspace"], &created.1["admin"]), (&json!(team), &json!(false)));
    let listed = c.ok("GET", "/v1/api-keys", ADMIN, None).await;
    assert_eq!(listed["object"], "list");
    let entry = listed["data"].as_array().unwrap().iter().find(|k| k["id"] == team_key_id.as_str()).unwrap().clone();
    assert_eq!((&entry["last_four"], &entry["admin"]), (&json!(&team_key[31..]), &json!(false)));
    assert!(!listed.to_string().contains(&team_key));
    c.err(403, "POST", "/v1/api-keys", Some(&team_key), Some(json!({"workspace": team}))).await;
    c.err(403, "GET", "/v1/api-keys", Some(&team_key), None).await;
    c.err(403, "DELETE", &format!("/v1/api-keys/{team_key_id}"), Some(&team_key), None).await;
    assert_eq!(c.err(400, "POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": "a/b"}))).await, "workspace");
    // A key may have a name: listed with it; a blank, overlong or multi-line one is refused.
    let named =
        c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team, "name": "CI pipeline"}))).await;
    assert_eq!((named.0, &named.1["name"]), (StatusCode::CREATED, &json!("CI pipeline")));
    let listed = c.ok("GET", "/v1/api-keys", ADMIN, None).await;
    let name_of =
        |id: &Value| listed["data"].as_array().unwrap().iter().find(|k| &k["id"] == id).unwrap()["name"].clone();
    assert_eq!((name_of(&named.1["id"]), name_of(&json!(team_key_id))), (json!("CI pipeline"), Value::Null));
    for bad in [json!(" "), json!("a\nb"), json!("x".repeat(101)), json!(7)] {
        let body = json!({"workspace": team, "name": bad});
        assert_eq!(c.err(400, "POST", "/v1/api-keys", Some(ADMIN), Some(body)).await, "name");
    }
    for path in [
        format!("/v1/prompts/{prompt}"),
        format!("/v1/prompts/{pid}"),
        format!("/v1/providers/{provider}"),
        format!("/v1/configs/{config}"),
        format!("/v1/guardrails/{gid}"),
    ] {
        c.err(404, "GET", &path, Some(&team_key), None).await;
    }
    c.err(404, "POST", &render, Some(&team_key), Some(json!({"variables": {"name": "A", "tag": "t"}}))).await;
    c.err(404, "PUT", &format!("/v1/prompts/{pid}"), Some(&team_key), Some(json!({"string": "x"}))).await;
    // The same slug in another workspace is another prompt.
    let theirs = c.ok("PUT", &format!("/v1/prompts/{prompt}"), &team_key, Some(json!({"string": "Team {{x}}"}))).await;
    assert_ne!(theirs["id"], v1["id"]);
    assert_eq!(c.ok("GET", &format!("/v1/prompts/{prompt}"), ADMIN, None).await["model"], "gpt-4.1");

    // Internal endpoints.
    c.err(401, "GET", &format!("/internal/v1/keys/{}", key_hash(&team_key)), None, None).await;
    c.err(401, "GET", &format!("/internal/v1/keys/{}", key_hash(&team_key)), Some("wrong"), None).await;
    let k = c.ok("GET", &format!("/internal/v1/keys/{}", key_hash(&team_key)), TOKEN, None).await;
    assert_eq!(k, json!({"id": team_key_id, "workspace": team, "admin": false}));
    // A static key has no id.
    let k = c.ok("GET", &format!("/internal/v1/keys/{}", key_hash("admin-key-2")), TOKEN, None).await;
    assert_eq!(k, json!({"workspace": "default", "admin": true}));
    c.err(404, "GET", &format!("/internal/v1/keys/{}", key_hash("nope")), Some(TOKEN), None).await;
    let ip = c.ok("GET", &format!("/internal/v1/workspaces/default/providers/{provider}"), TOKEN, None).await;
    assert_eq!(ip["value"], json!({"provider": "openai", "api_key": secret}));
    assert_eq!((&ip["id"], &ip["version_id"]), (&p["id"], &p["version_id"]));
    let iprompt = c.ok("GET", &format!("/internal/v1/workspaces/default/prompts/{pid}"), TOKEN, None).await;
    assert_eq!((&iprompt["version_id"], &iprompt["value"]["model"]), (&v2["prompt_version_id"], &json!("gpt-4.1")));
    let iteam = c.ok("GET", &format!("/internal/v1/workspaces/{team}/prompts/{prompt}"), TOKEN, None).await;
    assert_eq!(iteam["id"], theirs["id"]);
    let icfg = c.ok("GET", &format!("/internal/v1/workspaces/default/configs/{config}"), TOKEN, None).await;
    assert_eq!(icfg["value"], cfg);
    let ig = c.ok("GET", &format!("/internal/v1/workspaces/default/guardrails/{guard}"), TOKEN, None).await;
    assert_eq!(ig["value"], jwt);
    c.err(404, "GET", &format!("/internal/v1/workspaces/{team}/providers/{provider}"), Some(TOKEN), None).await;
    c.err(404, "GET", "/internal/v1/workspaces/default/widgets/x", Some(TOKEN), None).await;
    c.err(401, "GET", &format!("/internal/v1/workspaces/default/configs/{config}"), Some(ADMIN), None).await;

    // Revocation.
    assert_eq!(
        c.ok("DELETE", &format!("/v1/api-keys/{team_key_id}"), ADMIN, None).await,
        json!({"id": team_key_id, "deleted": true})
    );
    c.err(401, "GET", &format!("/v1/prompts/{prompt}"), Some(&team_key), None).await;
    c.err(404, "GET", &format!("/internal/v1/keys/{}", key_hash(&team_key)), Some(TOKEN), None).await;
    c.err(404, "DELETE", &format!("/v1/api-keys/{team_key_id}"), Some(ADMIN), None).await;

    // Restart: the same database and master key keep everything.
    state.db.close().await;
    drop((c, state));
    let (c, state) = start(&settings).await;
    let again = c.ok("GET", &format!("/v1/prompts/{prompt}"), ADMIN, None).await;
    assert_eq!((&again["prompt_version_id"], &again["model"]), (&v2["prompt_version_id"], &json!("gpt-4.1")));
    let ip = c.ok("GET", &format!("/internal/v1/workspaces/default/providers/{provider}"), TOKEN, None).await;
    assert_eq!(ip["value"]["api_key"], secret);
    c.ok("GET", &format!("/v1/guardrails/{gid}"), ADMIN, None).await;
    c.ok("GET", &format!("/v1/configs/{config}"), ADMIN, None).await;
    c.err(401, "GET", &format!("/v1/prompts/{prompt}"), Some(&team_key), None).await;
    state.db.close().await;
    if settings.database_url.is_none() {
        assert!(dir.join("gateway.db").exists() && dir.join("master.key").exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn concurrent_puts_of_one_slug_make_one_item_and_distinct_versions() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{run}"));
    let settings = settings(&dir);
    let (c, state) = start(&settings).await;
    let c = std::sync::Arc::new(c);
    let path = format!("/v1/configs/race-{run}");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (c, path) = (c.clone(), path.clone());
            tokio::spawn(async move {
                c.ok("PUT", &path, ADMIN, Some(json!({"retry": {"attempts": 2}, "request_timeout": 1000 + i}))).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let ids: std::collections::HashSet<_> = answers.iter().map(|a| a["id"].to_string()).collect();
    let versions: std::collections::HashSet<_> = answers.iter().map(|a| a["version_id"].to_string()).collect();
    assert_eq!((ids.len(), versions.len()), (1, 8));
    state.db.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_stored_providers_key_and_the_gateway_keys_are_sealed_at_rest() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{}", &run[..8]));
    let settings = settings(&dir);
    let (c, state) = start(&settings).await;
    let (provider, team) = (format!("sealed-{run}"), format!("sealed-team-{run}"));
    let secret = format!("sk-sealed-{run}");
    c.ok("PUT", &format!("/v1/providers/{provider}"), ADMIN, Some(json!({"provider": "openai", "api_key": secret})))
        .await;
    let created = c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team}))).await;
    assert_eq!(created.0, StatusCode::CREATED);
    let gateway_key = created.1["key"].as_str().unwrap().to_string();
    // Both are stored: the filter gets them back.
    let ip = c.ok("GET", &format!("/internal/v1/workspaces/default/providers/{provider}"), TOKEN, None).await;
    assert_eq!(ip["value"]["api_key"], secret.as_str());
    c.ok("GET", &format!("/internal/v1/keys/{}", key_hash(&gateway_key)), TOKEN, None).await;
    state.db.close().await;
    drop((c, state));

    let raw = common::raw_database(&settings).await;
    // What is stored in the clear is there: the dump is of this database.
    for plain in [&provider, &team] {
        assert!(raw.windows(plain.len()).any(|w| w == plain.as_bytes()), "{plain} is not in the dump");
    }
    common::assert_sealed(&raw, &secret);
    common::assert_sealed(&raw, &gateway_key);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_key_may_be_narrowed_to_mcp_tools() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{}", &run[..8]));
    let settings = settings(&dir);
    let (c, state) = start(&settings).await;
    let team = format!("tools-{run}");
    let longest = format!("{}__{}", "s".repeat(32), "t".repeat(128));
    let tools = json!(["files__*", "search__web_search", "*__read_*", longest]);

    // Narrowed: the create answer, the list and the filter's read carry the patterns as given.
    let created =
        c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team, "mcp_tools": tools}))).await;
    assert_eq!(created.0, StatusCode::CREATED, "{}", created.1);
    let (key, id) = (created.1["key"].as_str().unwrap().to_string(), created.1["id"].clone());
    let expected = json!({"id": id, "key": key, "name": null, "workspace": team, "admin": false, "mcp_tools": tools});
    assert_eq!(created.1, expected);
    // Not narrowed: no `mcp_tools` anywhere.
    let plain = c.ok("POST", "/v1/api-keys", ADMIN, Some(json!({"workspace": team}))).await;
    assert_eq!(plain.get("mcp_tools"), None, "{plain}");
    let listed = c.ok("GET", "/v1/api-keys", ADMIN, None).await;
    let entry = |id: &serde_json::Value| listed["data"].as_array().unwrap().iter().find(|k| k["id"] == *id).cloned();
    let narrowed = entry(&id).unwrap();
    assert_eq!((&narrowed["workspace"], &narrowed["mcp_tools"]), (&json!(team), &tools));
    assert_eq!(entry(&plain["id"]).unwrap().get("mcp_tools"), None);
    let read = c.ok("GET", &format!("/internal/v1/keys/{}", key_hash(&key)), TOKEN, None).await;
    assert_eq!(read, json!({"id": id, "workspace": team, "admin": false, "mcp_tools": tools}));
    let plain_key = plain["key"].as_str().unwrap();
    let read = c.ok("GET", &format!("/internal/v1/keys/{}", key_hash(plain_key)), TOKEN, None).await;
    assert_eq!(read, json!({"id": plain["id"], "workspace": team, "admin": false}));
    // A narrowed key is still a key of its workspace at the control plane.
    assert_eq!(c.ok("GET", "/v1/mcp-servers", &key, None).await["data"], json!([]));

    // Bad values: a 400 naming the list or the pattern at fault; no key made.
    let too_many: Vec<String> = (0..257).map(|i| format!("s__t{i}")).collect();
    for (value, param) in [
        (json!([]), "mcp_tools"),
        (json!("files__*"), "mcp_tools"),
        (json!(null), "mcp_tools"),
        (json!({"allow": ["files__*"]}), "mcp_tools"),
        (json!(too_many), "mcp_tools"),
        (json!(["files"]), "mcp_tools[0]"),
        (json!(["files__*", "files__"]), "mcp_tools[1]"),
        (json!(["files__*", "ok__x", "__x"]), "mcp_tools[2]"),
        (json!(["Files__x"]), "mcp_tools[0]"),
        (json!(["files_x__y"]), "mcp_tools[0]"),
        (json!(["f*__x"]), "mcp_tools[0]"),
        (json!(["files__a b"]), "mcp_tools[0]"),
        (json!(["files__a/b"]), "mcp_tools[0]"),
        (json!([format!("{}__x", "s".repeat(33))]), "mcp_tools[0]"),
        (json!([format!("s__{}", "t".repeat(129))]), "mcp_tools[0]"),
        (json!(["files__*", 7]), "mcp_tools[1]"),
    ] {
        let body = json!({"workspace": format!("refused-{run}"), "mcp_tools": value});
        assert_eq!(c.err(400, "POST", "/v1/api-keys", Some(ADMIN), Some(body)).await, param, "{value}");
    }
    let (_, empty) =
        c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team, "mcp_tools": []}))).await;
    assert_eq!(empty["error"]["message"], "mcp_tools must not be empty: omit mcp_tools to allow every tool");
    let listed = c.ok("GET", "/v1/api-keys", ADMIN, None).await;
    assert!(!listed.to_string().contains(&format!("refused-{run}")), "a refused key was made");

    // Kept across a restart.
    state.db.close().await;
    drop((c, state));
    let (c, state) = start(&settings).await;
    let read = c.ok("GET", &format!("/internal/v1/keys/{}", key_hash(&key)), TOKEN, None).await;
    assert_eq!(read["mcp_tools"], tools);
    state.db.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn mcp_servers_are_kept_per_workspace_checked_masked_and_sealed() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{}", &run[..8]));
    let settings = settings(&dir);
    let (c, state) = start(&settings).await;
    let (files, search, team) = (format!("files-{}", &run[..8]), format!("search-{}", &run[..8]), format!("mcp-{run}"));
    let (token, api_key) = (format!("Bearer tok-{run}"), format!("key-{run}"));
    let server = json!({"url": "https://mcp.example.com/files",
        "headers": {"Authorization": token, "X-Api-Key": api_key},
        "tools": {"allow": ["read_*", "list"]}, "timeout_ms": 30000, "failure": "closed"});
    let path = format!("/v1/mcp-servers/{files}");

    // Created: answered as a GET answers, every header as its last four characters.
    let put = c.ok("PUT", &path, ADMIN, Some(server.clone())).await;
    let masked = json!({"Authorization": &token[token.len() - 4..], "X-Api-Key": &api_key[api_key.len() - 4..]});
    assert_eq!((&put["id"], &put["headers"]), (&json!(files), &masked));
    assert_eq!(
        (&put["url"], &put["tools"], &put["timeout_ms"], &put["failure"]),
        (&server["url"], &server["tools"], &json!(30000), &json!("closed"))
    );
    assert!(put["version_id"].as_str().unwrap().len() == 36 && put["updated_at"].as_i64().unwrap() > 0);
    let got = c.ok("GET", &path, ADMIN, None).await;
    assert_eq!(got, put);
    for answer in [&put, &got] {
        assert!(!answer.to_string().contains(&run), "{answer}");
    }
    // Only `url` is required.
    let plain =
        c.ok("PUT", &format!("/v1/mcp-servers/{search}"), ADMIN, Some(json!({"url": "http://127.0.0.1:9/mcp"}))).await;
    assert_eq!((&plain["id"], plain.get("headers")), (&json!(search), None));
    let listed = c.ok("GET", "/v1/mcp-servers", ADMIN, None).await;
    assert_eq!(listed["object"], "list");
    let ours: Vec<&serde_json::Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["id"] == files.as_str() || s["id"] == search.as_str())
        .collect();
    assert_eq!(ours, [&got, &plain], "by id");
    assert!(!listed.to_string().contains(&run));

    // A PUT replaces the server (a new version); what it leaves out is gone.
    let replaced = c
        .ok(
            "PUT",
            &path,
            ADMIN,
            Some(json!({"url": "https://mcp.example.com/v2", "headers": {"Authorization": token}})),
        )
        .await;
    assert_ne!(replaced["version_id"], put["version_id"]);
    let got = c.ok("GET", &path, ADMIN, None).await;
    assert_eq!(
        (&got["url"], &got["headers"], got.get("tools")),
        (&json!("https://mcp.example.com/v2"), &json!({"Authorization": &token[token.len() - 4..]}), None)
    );

    // Bad input: a 400 naming the field; nothing stored.
    for (body, param) in [
        (json!({"headers": {}}), "url"),
        (json!({"url": "ftp://mcp.example.com"}), "url"),
        (json!({"url": "http://a", "name": "x"}), "name"),
        (json!({"url": "http://a", "headers": {"Host": "x"}}), "headers.Host"),
        (json!({"url": "http://a", "headers": {"x-api-key": 5}}), "headers.x-api-key"),
        (json!({"url": "http://a", "tools": {"allow": ["ok", "no spaces"]}}), "tools.allow[1]"),
        (json!({"url": "http://a", "tools": {"allow": ["a"], "deny": ["b"]}}), "tools"),
        (json!({"url": "http://a", "tools": {"except": ["b"]}}), "tools.except"),
        (json!({"url": "http://a", "timeout_ms": 0}), "timeout_ms"),
        (json!({"url": "http://a", "timeout_ms": 3_600_001}), "timeout_ms"),
        (json!({"url": "http://a", "failure": "sometimes"}), "failure"),
        (json!(["http://a"]), "body"),
    ] {
        assert_eq!(c.err(400, "PUT", &path, Some(ADMIN), Some(body.clone())).await, param, "{body}");
    }
    let secret_in_error =
        c.call("PUT", &path, Some(ADMIN), Some(json!({"url": "http://a", "headers": {"a": format!("{run}\n")}}))).await;
    assert_eq!(
        (secret_in_error.0, &secret_in_error.1["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("headers.a"))
    );
    assert!(!secret_in_error.1.to_string().contains(&run));
    for id in ["Files", "files_2", &"a".repeat(33)] {
        assert_eq!(
            c.err(400, "PUT", &format!("/v1/mcp-servers/{id}"), Some(ADMIN), Some(json!({"url": "http://a"}))).await,
            "id"
        );
        c.err(404, "GET", &format!("/v1/mcp-servers/{id}"), Some(ADMIN), None).await;
    }
    assert_eq!(c.ok("GET", &path, ADMIN, None).await["version_id"], replaced["version_id"]);
    c.err(401, "GET", &path, None, None).await;
    c.err(401, "GET", "/v1/mcp-servers", Some("nope"), None).await;

    // Another workspace sees none of it, and keeps its own server of the same id.
    let created = c.call("POST", "/v1/api-keys", Some(ADMIN), Some(json!({"workspace": team}))).await;
    let team_key = created.1["key"].as_str().unwrap().to_string();
    c.err(404, "GET", &path, Some(&team_key), None).await;
    c.err(404, "DELETE", &path, Some(&team_key), None).await;
    assert_eq!(c.ok("GET", "/v1/mcp-servers", &team_key, None).await["data"], json!([]));
    let theirs = c.ok("PUT", &path, &team_key, Some(json!({"url": "http://127.0.0.1:8/team"}))).await;
    assert_eq!(c.ok("GET", "/v1/mcp-servers", &team_key, None).await["data"], json!([theirs]));
    assert_eq!(c.ok("GET", &path, ADMIN, None).await["url"], "https://mcp.example.com/v2");

    // The filter's reads: the server opened, one or all of a workspace.
    let internal = format!("/internal/v1/workspaces/default/mcp-servers/{files}");
    let read = c.ok("GET", &internal, TOKEN, None).await;
    assert_eq!((&read["slug"], &read["version_id"]), (&json!(files), &replaced["version_id"]));
    assert_eq!(read["value"], json!({"url": "https://mcp.example.com/v2", "headers": {"Authorization": token}}));
    let read = c.ok("GET", &format!("/internal/v1/workspaces/{team}/mcp-servers/{files}"), TOKEN, None).await;
    assert_eq!(read["value"], json!({"url": "http://127.0.0.1:8/team"}));
    c.err(401, "GET", &internal, Some(ADMIN), None).await;
    let all = c.ok("GET", "/internal/v1/workspaces/default/mcp-servers", TOKEN, None).await;
    let opened = all["data"].as_array().unwrap().iter().find(|s| s["id"] == files.as_str()).unwrap();
    assert_eq!(
        (&opened["version_id"], &opened["value"]["headers"]["Authorization"]),
        (&replaced["version_id"], &json!(token))
    );
    let all = c.ok("GET", &format!("/internal/v1/workspaces/{team}/mcp-servers"), TOKEN, None).await;
    assert_eq!(
        all["data"],
        json!([{"id": files, "version_id": theirs["version_id"], "value": {"url": "http://127.0.0.1:8/team"}}])
    );
    assert_eq!(
        c.ok("GET", "/internal/v1/workspaces/no-such-workspace-here/mcp-servers", TOKEN, None).await["data"],
        json!([])
    );
    c.err(401, "GET", "/internal/v1/workspaces/default/mcp-servers", None, None).await;

    // Deleted: gone for every read, in this workspace only.
    assert_eq!(c.ok("DELETE", &path, &team_key, None).await, json!({"id": files, "deleted": true}));
    c.err(404, "GET", &path, Some(&team_key), None).await;
    c.err(404, "GET", &format!("/internal/v1/workspaces/{team}/mcp-servers/{files}"), Some(TOKEN), None).await;
    assert_eq!(c.ok("GET", "/v1/mcp-servers", &team_key, None).await["data"], json!([]));
    c.err(404, "DELETE", &path, Some(&team_key), None).await;
    c.err(404, "DELETE", "/v1/mcp-servers/Bad", Some(&team_key), None).await;
    assert_eq!(c.ok("GET", &path, ADMIN, None).await["version_id"], replaced["version_id"]);
    c.ok("DELETE", &format!("/v1/mcp-servers/{search}"), ADMIN, None).await;
    // Put again after its deletion, a server starts over.
    let again = c.ok("PUT", &path, &team_key, Some(json!({"url": "http://127.0.0.1:8/again"}))).await;
    assert_ne!(again["version_id"], theirs["version_id"]);
    assert_eq!(c.ok("GET", "/v1/mcp-servers", &team_key, None).await["data"], json!([again]));

    // The headers are stored sealed.
    state.db.close().await;
    drop((c, state));
    let raw = common::raw_database(&settings).await;
    assert!(raw.windows(files.len()).any(|w| w == files.as_bytes()), "{files} is not in the dump");
    common::assert_sealed(&raw, &token);
    common::assert_sealed(&raw, &api_key);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn prompts_guardrails_configs_and_providers_are_listed_per_workspace_and_deleted() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let dir = std::env::temp_dir().join(format!("cp-test-{run}"));
    let (c, _) = start(&settings(&dir)).await;
    let team = format!("team-{run}");
    let created = c.ok("POST", "/v1/api-keys", ADMIN, Some(json!({"workspace": team}))).await;
    let key = created["key"].as_str().unwrap().to_string();
    let items = [
        ("prompts", json!({"string": "Hello {{name}}", "model": "gpt-4o"})),
        (
            "guardrails",
            json!({"checks": [{"id": "default.contains", "parameters": {"words": ["x"], "operator": "none"}}]}),
        ),
        ("configs", json!({"provider": "openai", "retry": {"attempts": 2}})),
        ("providers", json!({"provider": "openai", "api_key": "sk-listed-secret-123456"})),
    ];
    for (kind, body) in &items {
        for slug in ["b-item", "a-item"] {
            c.ok("PUT", &format!("/v1/{kind}/{slug}-{run}"), &key, Some(body.clone())).await;
        }
        let listed = c.ok("GET", &format!("/v1/{kind}"), &key, None).await;
        let slugs: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|i| i["slug"].as_str().unwrap()).collect();
        assert_eq!(slugs, [format!("a-item-{run}"), format!("b-item-{run}")], "{kind}: by slug");
        assert!(!listed.to_string().contains("sk-listed"), "{kind}: a list holds no value, so no secret");
        assert!(listed["data"][0]["version_id"].is_string() && listed["data"][0]["created_at"].is_i64());
        // Another workspace sees none of them.
        let theirs = c.ok("GET", &format!("/v1/{kind}"), ADMIN, None).await;
        assert!(!theirs.to_string().contains(&format!("item-{run}")), "{kind}: {theirs}");

        // Deleted by slug or id: gone from the list and from GET; again, a 404.
        let id = listed["data"][1]["id"].as_str().unwrap().to_string();
        let deleted = c.ok("DELETE", &format!("/v1/{kind}/a-item-{run}"), &key, None).await;
        assert_eq!(deleted["deleted"], true);
        c.ok("DELETE", &format!("/v1/{kind}/{id}"), &key, None).await;
        assert_eq!(c.ok("GET", &format!("/v1/{kind}"), &key, None).await["data"], json!([]));
        c.err(404, "GET", &format!("/v1/{kind}/a-item-{run}"), Some(&key), None).await;
        c.err(404, "DELETE", &format!("/v1/{kind}/a-item-{run}"), Some(&key), None).await;
    }
}
