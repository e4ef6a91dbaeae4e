use super::*;
use crate::guardrails::tests::jwt_tests::{es256, jwks, token};
use crate::unit_tests::test;

const NOW: u64 = 1_800_000_000;

fn oauth() -> OAuth {
    let raw = json!({"issuer": "https://idp.example.com", "jwks_uri": "http://127.0.0.1:9/jwks",
                     "resource": "https://gw.example.com/mcp", "workspace_claim": "team"});
    deserialize(raw).unwrap().unwrap()
}

fn claims(extra: Value) -> Value {
    let mut claims = json!({"iss": "https://idp.example.com", "aud": "https://gw.example.com/mcp", "sub": "ada",
                            "team": "research", "exp": NOW + 600});
    if let (Some(fields), Value::Object(extra)) = (claims.as_object_mut(), extra) {
        fields.extend(extra);
    }
    claims
}

#[test]
fn serves_its_metadata_and_names_it_in_the_challenge() {
    let oauth = oauth();
    assert_eq!(
        oauth.challenge,
        r#"Bearer resource_metadata="https://gw.example.com/.well-known/oauth-protected-resource/mcp""#
    );
    let metadata: Value = serde_json::from_slice(&oauth.metadata).unwrap();
    assert_eq!(
        metadata,
        json!({"resource": "https://gw.example.com/mcp", "authorization_servers": ["https://idp.example.com"],
               "bearer_methods_supported": ["header"]})
    );
    let error = |raw: Value| deserialize(raw).unwrap_err().to_string();
    assert!(error(json!({"issuer": "i", "jwks_uri": "ftp://x", "resource": "https://g/mcp"}))
        .starts_with("mcp_oauth.jwks_uri"));
    assert!(error(json!({"issuer": "i", "jwks_uri": "http://x", "resource": "g"})).starts_with("mcp_oauth.resource"));
    assert!(error(json!({"issuer": "", "jwks_uri": "http://x", "resource": "https://g"})).contains("issuer"));
    assert!(error(json!({"issuer": "i", "jwks_uri": "http://x", "resource": "https://g", "scope": 1}))
        .contains("unknown field"));
}

#[test]
fn a_token_of_the_issuer_for_the_resource_names_its_workspace() {
    let oauth = oauth();
    let key = es256("k1", "oauth");
    let cached = CachedJwks { json: jwks(&[&key]), fetched_at_s: NOW - 60 };
    let verify = |claims: Value| oauth.verify(&token(&key, claims), Some(&cached), NOW);
    let subject = r#"["https://idp.example.com","ada","research"]"#.into();
    let caller = Verified::Caller { workspace: "research".into(), subject };
    assert_eq!(verify(claims(json!({}))), caller);
    assert_eq!(verify(claims(json!({"aud": ["other", "https://gw.example.com/mcp"]}))), caller);
    let refused = |claims: Value| match verify(claims) {
        Verified::Refused(why) => why,
        other => panic!("{other:?}"),
    };
    assert!(refused(claims(json!({"iss": "https://evil.example.com"}))).contains("issuer"));
    assert!(refused(claims(json!({"aud": "https://gw.example.com/mcp/files"}))).contains("aud"));
    assert!(refused(claims(json!({"team": 5}))).contains("`team`"));
    assert!(refused(claims(json!({"sub": ""}))).contains("`sub`"));
    // One `sub` in another workspace is another caller (its sessions are sealed apart).
    match verify(claims(json!({"team": "other"}))) {
        Verified::Caller { subject, .. } => assert_eq!(subject, r#"["https://idp.example.com","ada","other"]"#),
        other => panic!("{other:?}"),
    }
    assert!(refused(claims(json!({"exp": NOW - 3600}))).contains("expired"));
    let mut no_exp = claims(json!({}));
    no_exp.as_object_mut().unwrap().remove("exp");
    assert!(refused(no_exp).contains("exp"));
    // Another key's signature is refused; a kid the JWKS lacks fetches it again, once in a while.
    let stranger = es256("k1", "someone else");
    assert!(matches!(oauth.verify(&token(&stranger, claims(json!({}))), Some(&cached), NOW), Verified::Refused(_)));
    let rotated = es256("k2", "rotated");
    assert_eq!(oauth.verify(&token(&rotated, claims(json!({}))), Some(&cached), NOW), Verified::NeedsJwks);
    let just_fetched = CachedJwks { json: jwks(&[&key]), fetched_at_s: NOW };
    assert!(matches!(
        oauth.verify(&token(&rotated, claims(json!({}))), Some(&just_fetched), NOW),
        Verified::Refused(_)
    ));
    // None cached, or cached too long ago: fetched first.
    assert_eq!(oauth.verify(&token(&key, claims(json!({}))), None, NOW), Verified::NeedsJwks);
    let old = CachedJwks { json: jwks(&[&key]), fetched_at_s: NOW - JWKS_MAX_AGE_S };
    assert_eq!(oauth.verify(&token(&key, claims(json!({}))), Some(&old), NOW), Verified::NeedsJwks);
    assert!(matches!(oauth.verify("eyJ.not.a-token", Some(&cached), NOW), Verified::Refused(_)));
    assert!(looks_like_jwt(token(&key, claims(json!({}))).as_bytes()) && !looks_like_jwt(b"gw-key.with.dots"));
}
