//! Access tokens a backend fetches before its requests (an OAuth token for a service
//! account). A token lives in shared data, so every worker uses it until shortly before it
//! expires; when none is fresh, one dispatched call to the token endpoint fetches it.

use super::{CallAnswer, Dispatch};
use crate::errors::GatewayError;
use crate::ports::SharedStore;
use crate::providers::TokenRequest;
use crate::settings::Settings;
use crate::upstream::Upstream;
use serde_json::Value;

/// A token is used until this long before it expires, so none expires on its way.
const MARGIN_MS: u64 = 60_000;
const FETCH_TIMEOUT_MS: u64 = 10_000;
/// Token endpoints reached without the custom-host allow-list (the clouds' own).
const KNOWN_HOSTS: &[&str] = &["oauth2.googleapis.com"];

fn slot(key: &str) -> String {
    format!("token:{key}")
}

/// The cached token of credential `key`, when it is still fresh at `now_ms`.
pub(crate) fn cached(store: &dyn SharedStore, key: &str, now_ms: u64) -> Option<String> {
    let (value, _) = store.get(&slot(key))?;
    let (expiry, token) = value.split_first_chunk::<8>()?;
    let fresh = now_ms < u64::from_le_bytes(*expiry) && !token.is_empty();
    fresh.then(|| String::from_utf8(token.to_vec()).ok()).flatten()
}

/// Keeps `token` for credential `key` until a margin before it expires. A token that lives
/// no longer than the margin serves only the requests that waited for it.
pub(crate) fn remember(store: &dyn SharedStore, key: &str, token: &str, expires_in_s: u64, now_ms: u64) {
    let lifetime = expires_in_s.saturating_mul(1000);
    if lifetime <= MARGIN_MS {
        return;
    }
    let mut value = now_ms.saturating_add(lifetime - MARGIN_MS).to_le_bytes().to_vec();
    value.extend_from_slice(token.as_bytes());
    // Unconditional: two workers that fetched at once both store a fresh token.
    if !store.set(&slot(key), &value, 0) {
        log::warn!("an access token could not be cached in shared data");
    }
}

/// The dispatched call of a token request. The endpoint must be a known one or pass the
/// custom-host allow-list, like every URL a config names.
pub(crate) fn call(settings: &Settings, request: &TokenRequest) -> Result<Dispatch, GatewayError> {
    let refused = |why: &str| {
        GatewayError::new(400, "invalid_request_error", format!("token endpoint {why}")).with_code("invalid_token_uri")
    };
    let upstream = Upstream::parse(&request.url).map_err(refused)?;
    if !KNOWN_HOSTS.contains(&upstream.host.as_str()) {
        settings.require_allowed("token endpoint host", &upstream.host)?;
    }
    let path = upstream.path_or_root();
    let headers = vec![("accept".to_string(), "application/json".to_string())];
    Ok(Dispatch::post(settings, &upstream, path, request.content_type, request.body.clone(), headers, FETCH_TIMEOUT_MS))
}

/// The token and its lifetime in seconds from the endpoint's answer (RFC 6749 5.1); the
/// error says what the endpoint said (RFC 6749 5.2), never the credential.
pub(crate) fn from_answer(answer: &CallAnswer) -> Result<(String, u64), GatewayError> {
    let failed = |status: u16, why: String| {
        let kind = if status == 401 { "authentication_error" } else { "api_error" };
        GatewayError::new(status, kind, format!("could not obtain an access token: {why}"))
            .with_code("token_exchange_failed")
    };
    if answer.status == 0 {
        return Err(failed(502, "the token endpoint did not answer".to_string()));
    }
    let body: Option<Value> = serde_json::from_slice(&answer.body).ok();
    let field = |name: &str| body.as_ref().and_then(|b| b.get(name));
    if !(200..300).contains(&answer.status) {
        let said = field("error_description").or_else(|| field("error")).and_then(Value::as_str);
        let said = said.map_or_else(|| format!("status {}", answer.status), |s| s.chars().take(300).collect());
        // The credential was refused (4xx) or the endpoint failed (5xx).
        let status = if answer.status < 500 { 401 } else { 502 };
        return Err(failed(status, format!("the token endpoint answered {}: {said}", answer.status)));
    }
    let token = field("access_token").and_then(Value::as_str).filter(|t| !t.is_empty() && !t.contains(['\r', '\n']));
    let token = token.ok_or_else(|| failed(502, "the token endpoint's answer has no access_token".to_string()))?;
    // Without a lifetime, assume Google's usual hour.
    let expires_in = field("expires_in").and_then(Value::as_u64).unwrap_or(3600);
    Ok((token.to_string(), expires_in))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::testing::FakeHost;
    use crate::ports::Host;
    use crate::unit_tests::test;

    fn answer(status: u16, body: &str) -> CallAnswer {
        CallAnswer { status, headers: vec![], body: body.as_bytes().to_vec() }
    }

    #[test]
    fn a_token_is_used_until_a_minute_before_it_expires() {
        let host = FakeHost::new(0);
        let now = host.now_ms();
        assert_eq!(cached(host.store(), "sa", now), None);
        remember(host.store(), "sa", "ya29.t", 3600, now);
        assert_eq!(cached(host.store(), "sa", now + 3_539_000).as_deref(), Some("ya29.t"));
        assert_eq!(cached(host.store(), "sa", now + 3_540_000), None, "never sent in its last minute");
        assert_eq!(cached(host.store(), "other", now), None);
        remember(host.store(), "short", "t", 60, now);
        assert_eq!(cached(host.store(), "short", now), None, "a token of a minute or less is not kept");
    }

    #[test]
    fn answers_become_tokens_or_clear_errors() {
        let ok = answer(200, r#"{"access_token":"ya29.a","expires_in":3599,"token_type":"Bearer"}"#);
        assert_eq!(from_answer(&ok).unwrap(), ("ya29.a".to_string(), 3599));
        let refused = answer(400, r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#);
        let e = from_answer(&refused).unwrap_err();
        assert_eq!((e.status, e.code), (401, Some("token_exchange_failed")));
        assert!(e.message.contains("Invalid JWT Signature."), "{}", e.message);
        assert_eq!(from_answer(&answer(503, "busy")).unwrap_err().status, 502);
        assert_eq!(from_answer(&answer(0, "")).unwrap_err().status, 502);
        assert_eq!(from_answer(&answer(200, r#"{"token_type":"Bearer"}"#)).unwrap_err().status, 502);
        assert_eq!(from_answer(&answer(200, r#"{"access_token":"a\r\nx: y"}"#)).unwrap_err().status, 502);
    }

    #[test]
    fn token_endpoints_follow_the_allow_list() {
        let settings = Settings::default();
        let request = |url: &str| TokenRequest {
            url: url.to_string(),
            content_type: "application/x-www-form-urlencoded",
            body: b"grant_type=x".to_vec(),
        };
        let google = call(&settings, &request("https://oauth2.googleapis.com/token")).unwrap();
        let header = |name: &str| google.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(header(":path"), Some("/token"));
        assert_eq!(header(":authority"), Some("oauth2.googleapis.com:443"));
        assert_eq!(header("content-type"), Some("application/x-www-form-urlencoded"));
        assert!(call(&settings, &request("http://127.0.0.1:9/token")).is_ok(), "loopback is allowed by default");
        assert_eq!(call(&settings, &request("https://evil.example/token")).unwrap_err().status, 403);
        assert_eq!(call(&settings, &request("file:///etc/passwd")).unwrap_err().status, 400);
    }
}
