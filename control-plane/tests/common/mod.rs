//! What the control plane's in-process tests share: its settings over a temp dir (or the
//! database `TEST_DATABASE_URL` names) and a client of its router (tower `oneshot`).

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use base64::Engine;
use gateway_control_plane::Settings;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub const TOKEN: &str = "internal-token";

/// The control plane's settings with `admin_keys`, its state in `dir`.
pub fn settings(dir: &std::path::Path, admin_keys: &[&str]) -> Settings {
    Settings {
        addr: "127.0.0.1:0".into(),
        state_dir: dir.to_path_buf(),
        database_url: std::env::var("TEST_DATABASE_URL").ok().filter(|u| !u.is_empty()),
        master_key: None,
        admin_keys: admin_keys.iter().map(|k| k.to_string()).collect(),
        internal_token: TOKEN.into(),
    }
}

/// Everything the database of `settings` holds, as bytes: the SQLite files in the state dir
/// as they are on disk, or for PostgreSQL every row of every table as text (`t::text`, which
/// shows every column, a bytea as hex).
pub async fn raw_database(settings: &Settings) -> Vec<u8> {
    let Some(url) = &settings.database_url else {
        // SQLite removes its log files as the last connection closes, which may finish just after
        // the pools say they closed: a file listed and then gone means the listing is read again.
        let read_all = || -> std::io::Result<Vec<u8>> {
            let mut bytes = Vec::new();
            for entry in std::fs::read_dir(&settings.state_dir)? {
                let path = entry?.path();
                if path.file_name().unwrap().to_string_lossy().starts_with("gateway.db") {
                    bytes.extend(std::fs::read(&path)?);
                }
            }
            Ok(bytes)
        };
        let mut read = read_all();
        for _ in 0..50 {
            match &read {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    read = read_all();
                }
                _ => break,
            }
        }
        return read.unwrap();
    };
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(tables.len() > 1, "the control plane's tables: {tables:?}");
    let mut dump = String::new();
    for table in tables {
        let sql = format!("SELECT string_agg(t::text, E'\\n') FROM \"{table}\" t");
        let rows: Option<String> = sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap();
        dump.extend([table, "\n".into(), rows.unwrap_or_default(), "\n".into()]);
    }
    pool.close().await;
    dump.into_bytes()
}

/// Asserts that `secret` is stored in `raw` (see [`raw_database`]) in none of the forms it
/// could be read back from: as it is, in hex, or in base64 (standard or URL-safe, at any of
/// the three alignments it could have inside a longer encoded value).
pub fn assert_sealed(raw: &[u8], secret: &str) {
    let mut forms = vec![secret.to_string(), secret.bytes().map(|b| format!("{b:02x}")).collect()];
    for shift in 0..3 {
        let mut shifted = vec![0u8; shift];
        shifted.extend(secret.as_bytes());
        let encoded = base64::engine::general_purpose::STANDARD.encode(&shifted);
        // The first group holds the shift's bytes, the last one what follows the secret.
        let core = &encoded[if shift == 0 { 0 } else { 4 }..encoded.len() - 4];
        forms.push(core.to_string());
        forms.push(core.replace('+', "-").replace('/', "_"));
    }
    for form in forms {
        assert!(!raw.windows(form.len()).any(|w| w == form.as_bytes()), "the database holds {form:?} ({secret:?})");
    }
}

/// A response's status and whole body.
pub async fn read(response: Response<Body>) -> (StatusCode, Bytes) {
    let status = response.status();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

pub struct Client {
    pub app: Router,
}

impl Client {
    /// `key` goes as the bearer token of an internal path, else as the gateway key.
    pub async fn raw(&self, method: &str, path: &str, key: Option<&str>, body: Body) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(key) = key {
            request = if path.starts_with("/internal/") {
                request.header("authorization", format!("Bearer {key}"))
            } else {
                request.header("x-gateway-api-key", key)
            };
        }
        let (status, bytes) = read(self.app.clone().oneshot(request.body(body).unwrap()).await.unwrap()).await;
        let value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        (status, value)
    }

    pub async fn call(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> (StatusCode, Value) {
        self.raw(method, path, key, body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).await
    }

    pub async fn ok(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Value {
        let (status, value) = self.call(method, path, Some(key), body).await;
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value
    }

    /// A 4xx: asserts the status and the OpenAI error shape, returns `param`.
    pub async fn err(&self, want: u16, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> Value {
        let (status, value) = self.call(method, path, key, body).await;
        assert_eq!(status.as_u16(), want, "{method} {path}: {value}");
        let error = &value["error"];
        assert!(error["message"].is_string() && error["type"].is_string(), "{value}");
        error["param"].clone()
    }
}
