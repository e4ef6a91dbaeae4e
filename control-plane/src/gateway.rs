//! The control plane's side of the gateway: what requests the filter relays here carry (the
//! caller's workspace, its gateway headers) and the requests it sends back through the gateway
//! as the caller (a batch's lines and input file, the provider's part of a list).

use crate::errors::{ApiError, ApiResult};
use axum::http::HeaderMap;
use gateway_schema::{CLIENT_AUTHORIZATION_HEADER, CONTROL_PLANE_FETCH_HEADER, WORKSPACE_HEADER};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// How long a batch waits for the gateway to accept connections before a line fails.
const MAX_CONNECT_WAIT: Duration = Duration::from_secs(60);

/// The caller's workspace, as the filter names it on a relayed request.
pub fn workspace(h: &HeaderMap) -> ApiResult<String> {
    h.get(WORKSPACE_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|w| crate::validate::is_name(w, crate::validate::MAX_WORKSPACE))
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid(WORKSPACE_HEADER, "the relayed request names no valid workspace"))
}

/// The caller's headers a line is sent with: its gateway headers, and the client's
/// `Authorization` under its own name again.
pub(crate) fn caller_headers(h: &HeaderMap) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, value) in h {
        let name = name.as_str();
        let Ok(value) = value.to_str() else { continue };
        if name == CLIENT_AUTHORIZATION_HEADER {
            out.insert("authorization".into(), json!(value));
        } else if name.starts_with("x-gateway-") && name != WORKSPACE_HEADER && name != CONTROL_PLANE_FETCH_HEADER {
            out.insert(name.into(), json!(value));
        }
    }
    out
}

fn with_headers(mut request: reqwest::RequestBuilder, headers: &Map<String, Value>) -> reqwest::RequestBuilder {
    for (name, value) in headers {
        if let Some(value) = value.as_str() {
            request = request.header(name.as_str(), value);
        }
    }
    request
}

/// Sends a request to the gateway with the caller's headers: its status and body.
pub(crate) async fn send(
    request: reqwest::RequestBuilder,
    headers: &Map<String, Value>,
) -> Result<(u16, String), String> {
    send_full(request, headers).await.map(|(status, _, text)| (status, text))
}

/// As `send`, with the answer's request id (`x-request-id`, else `x-gateway-trace-id`).
pub(crate) async fn send_full(
    request: reqwest::RequestBuilder,
    headers: &Map<String, Value>,
) -> Result<(u16, String, String), String> {
    let request = with_headers(request, headers);
    // The gateway not listening (yet: at start the control plane may be up before Envoy) is
    // ours to wait out, not the line's failure: connecting is retried for about a minute. Any
    // other failure (the request may have gone out) is the line's.
    let mut delay = Duration::from_millis(250);
    let mut waited = Duration::ZERO;
    let response = loop {
        let Some(attempt) = request.try_clone() else {
            break request.send().await;
        };
        match attempt.send().await {
            Err(e) if e.is_connect() && waited < MAX_CONNECT_WAIT => {
                tokio::time::sleep(delay).await;
                waited += delay;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            result => break result,
        }
    };
    let response = response.map_err(|e| format!("the gateway did not answer: {e}"))?;
    let status = response.status().as_u16();
    let request_id = ["x-request-id", "x-gateway-trace-id"]
        .iter()
        .find_map(|name| response.headers().get(*name).and_then(|v| v.to_str().ok()).map(str::to_string))
        .unwrap_or_default();
    let text = response.text().await.map_err(|e| format!("the gateway's answer broke off: {e}"))?;
    Ok((status, request_id, text))
}
