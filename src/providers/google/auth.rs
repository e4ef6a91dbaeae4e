//! A service account's access token, the pure pieces: the RS256-signed assertion (a JWT),
//! and the exchange's form-encoded request to the key file's `token_uri`. The gateway's core
//! (`exchange::tokens`) sends it, reads the answer and caches the token.
//!
//! Errors name the key file's field (`cloud_b_service_account_json.<field>`) and never carry
//! the key material.

use crate::errors::GatewayError;
use crate::providers::TokenRequest;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::{json, Map, Value};
use sha2::Sha256;

/// What the token may do: every Vertex AI call.
pub(crate) const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google accepts assertions valid for at most an hour.
const LIFETIME_S: u64 = 3600;
const CONFIG_FIELD: &str = "cloud_b_service_account_json";
/// `urn:ietf:params:oauth:grant-type:jwt-bearer`, form-encoded.
const GRANT_TYPE: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";

fn bad_field(field: &str, message: &str) -> GatewayError {
    GatewayError::invalid_param(format!("{CONFIG_FIELD}.{field}"), format!("{CONFIG_FIELD}.{field} {message}"))
}

fn string_field<'a>(service_account: &'a Map<String, Value>, field: &str) -> Result<&'a str, GatewayError> {
    match service_account.get(field) {
        Some(Value::String(value)) if !value.is_empty() => Ok(value),
        Some(_) => Err(bad_field(field, "must be a non-empty string")),
        None => Err(bad_field(field, "is missing")),
    }
}

/// The key file's `token_uri`: where the assertion is exchanged (any http(s) URL, so a local
/// emulator works too).
pub(crate) fn token_uri(service_account: &Map<String, Value>) -> Result<&str, GatewayError> {
    let uri = string_field(service_account, "token_uri")?;
    if uri.starts_with("https://") || uri.starts_with("http://") {
        Ok(uri)
    } else {
        Err(bad_field("token_uri", "must be an http(s) URL"))
    }
}

/// The signed assertion: header `{"alg":"RS256","typ":"JWT","kid":<private_key_id>}`, claims
/// `iss` = `client_email`, `aud` = `token_uri`, `scope`, `iat` = `now_s`, `exp` = an hour later.
pub(crate) fn assertion(service_account: &Map<String, Value>, now_s: u64) -> Result<String, GatewayError> {
    let email = string_field(service_account, "client_email")?;
    let key_id = string_field(service_account, "private_key_id")?;
    let audience = token_uri(service_account)?;
    let key = private_key(string_field(service_account, "private_key")?)?;
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": key_id});
    let claims = json!({
        "iss": email,
        "aud": audience,
        "scope": SCOPE,
        "iat": now_s,
        "exp": now_s.saturating_add(LIFETIME_S),
    });
    let signed =
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
    // PKCS#1 v1.5 signing is deterministic: this signs without a random source (none is
    // needed in the filter's sandbox).
    let signature = SigningKey::<Sha256>::new(key)
        .try_sign(signed.as_bytes())
        .map_err(|_| bad_field("private_key", "cannot sign (is it an RSA key of at least 2048 bits?)"))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes())))
}

/// The key file's PEM key: PKCS#8 (`BEGIN PRIVATE KEY`, what Google issues), or PKCS#1.
fn private_key(pem: &str) -> Result<RsaPrivateKey, GatewayError> {
    RsaPrivateKey::from_pkcs8_pem(pem)
        .or_else(|_| RsaPrivateKey::from_pkcs1_pem(pem))
        .map_err(|_| bad_field("private_key", "must be an RSA private key in PEM form"))
}

/// The token exchange: the assertion, form-encoded, to the key file's `token_uri`.
pub(crate) fn token_request(service_account: &Map<String, Value>, now_s: u64) -> Result<TokenRequest, GatewayError> {
    let assertion = assertion(service_account, now_s)?;
    // A JWT is base64url parts and dots, which form encoding leaves as they are.
    let body = format!("grant_type={GRANT_TYPE}&assertion={assertion}").into_bytes();
    let url = token_uri(service_account)?.to_string();
    Ok(TokenRequest { url, content_type: "application/x-www-form-urlencoded", body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use rsa::pkcs1v15::{Signature, VerifyingKey};
    use rsa::signature::Verifier;
    use rsa::RsaPublicKey;

    /// A throwaway key made for these tests (see testdata/README.md).
    const TEST_KEY: &str = include_str!("testdata/test_key.pem");

    fn service_account() -> Map<String, Value> {
        let key = json!({
            "type": "service_account",
            "project_id": "my-project",
            "private_key_id": "0123456789abcdef",
            "private_key": TEST_KEY,
            "client_email": "gateway@my-project.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "token_uri": "https://oauth2.googleapis.com/token",
        });
        key.as_object().unwrap().clone()
    }

    fn decoded(part: &str) -> Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn the_assertion_is_an_rs256_jwt_that_verifies() {
        let jwt = assertion(&service_account(), 1_700_000_000).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(decoded(parts[0]), json!({"alg": "RS256", "typ": "JWT", "kid": "0123456789abcdef"}));
        assert_eq!(
            decoded(parts[1]),
            json!({
                "iss": "gateway@my-project.iam.gserviceaccount.com",
                "aud": "https://oauth2.googleapis.com/token",
                "scope": "https://www.googleapis.com/auth/cloud-platform",
                "iat": 1_700_000_000u64,
                "exp": 1_700_003_600u64,
            })
        );
        // Checked with the rsa crate's verifier against the public half of the key.
        let public = RsaPublicKey::from(RsaPrivateKey::from_pkcs8_pem(TEST_KEY).unwrap());
        let verifier = VerifyingKey::<Sha256>::new(public);
        let signature = Signature::try_from(URL_SAFE_NO_PAD.decode(parts[2]).unwrap().as_slice()).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        verifier.verify(signed.as_bytes(), &signature).unwrap();
        assert!(verifier.verify(b"something else", &signature).is_err());
        // Signing is deterministic.
        assert_eq!(assertion(&service_account(), 1_700_000_000).unwrap(), jwt);
    }

    #[test]
    fn the_exchange_posts_the_form_to_the_key_files_token_uri() {
        let mut key = service_account();
        key.insert("token_uri".into(), json!("http://127.0.0.1:8089/token"));
        let request = token_request(&key, 1_700_000_000).unwrap();
        assert_eq!(request.url, "http://127.0.0.1:8089/token");
        assert_eq!(request.content_type, "application/x-www-form-urlencoded");
        let body = std::str::from_utf8(&request.body).unwrap();
        let (grant, assertion_part) = body.split_once("&assertion=").unwrap();
        assert_eq!(grant, "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer");
        assert_eq!(assertion_part, assertion(&key, 1_700_000_000).unwrap());
        assert!(assertion_part.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
    }

    #[test]
    fn bad_key_files_are_400s_naming_the_field_without_the_key() {
        let cases: Vec<(&str, Option<Value>)> = vec![
            ("client_email", None),
            ("client_email", Some(json!(7))),
            ("private_key_id", None),
            ("token_uri", None),
            ("token_uri", Some(json!("file:///etc/passwd"))),
            ("private_key", None),
            ("private_key", Some(json!(""))),
            ("private_key", Some(json!("-----BEGIN PRIVATE KEY-----\nMIIBVQ==\n-----END PRIVATE KEY-----\n"))),
            // A valid PEM of something else: the base64 of the test key, mangled.
            ("private_key", Some(json!(TEST_KEY.replace("A", "B")))),
        ];
        for (field, value) in cases {
            let mut key = service_account();
            match value {
                Some(value) => key.insert(field.into(), value),
                None => key.remove(field),
            };
            let error = assertion(&key, 0).unwrap_err();
            assert_eq!(error.status, 400, "{field}");
            let param = format!("cloud_b_service_account_json.{field}");
            assert_eq!(error.param.as_deref(), Some(param.as_str()));
            assert!(error.message.contains(&param), "{}", error.message);
            assert!(!error.message.contains("MII") && !error.message.contains("BEGIN"), "{}", error.message);
            assert!(token_request(&key, 0).is_err());
        }
        // A key that is not RSA at all.
        let ec = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";
        let mut key = service_account();
        key.insert("private_key".into(), json!(ec));
        assert_eq!(assertion(&key, 0).unwrap_err().param.as_deref(), Some("cloud_b_service_account_json.private_key"));
    }
}
