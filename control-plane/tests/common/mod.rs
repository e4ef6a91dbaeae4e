//! What the control plane's in-process tests share: its settings over a temp dir (or the
//! database `TEST_DATABASE_URL` names) and a client of its router (tower `oneshot`).

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
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
