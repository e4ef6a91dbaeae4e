//! JWT verification for `default.jwt` (spec 4.3), pure: the caller brings the JWKS and the
//! clock. Signatures are checked by the RustCrypto crates (`rsa`, `p256`, `p384`); this file
//! only picks the key and checks the claims. No `aud` or `iss` check, as the spec says.

use super::params::Rules;
use crate::json_check::shorten;
use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use rsa::signature::Verifier;
use rsa::{BigUint, RsaPublicKey};
use serde_json::{Map, Value};
use sha2::{Sha256, Sha384, Sha512};

/// A token whose `kid` the cached JWKS lacks refetches it at most this often (seconds).
pub(crate) const REFETCH_AFTER_S: u64 = 30;
/// Weaker RSA keys are refused.
const MIN_RSA_BITS: usize = 2048;
/// A JWKS without `kid` matching tries at most this many keys.
const MAX_KEYS_TRIED: usize = 8;

/// Base64url with or without padding (tokens have none; some JWKS publishers pad).
const B64: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Failure {
    /// The JWKS has no key with the token's `kid`: a newer JWKS may have it.
    UnknownKid(String),
    Invalid(String),
}

/// A token split and decoded, before any verification.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub(crate) alg: String,
    pub(crate) kid: Option<String>,
    /// `header.payload` as sent: what the signature covers.
    signed: String,
    signature: Vec<u8>,
    claims: Map<String, Value>,
}

impl Token {
    /// The claims, verified once `verify` said so.
    pub(crate) fn claims(&self) -> &Map<String, Value> {
        &self.claims
    }
}

/// Splits and decodes a compact JWS; `Err` says why it is malformed.
pub(crate) fn parse(token: &str) -> Result<Token, String> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the token is not three base64url parts separated by dots".to_string());
    };
    let json = |part: &str, what: &str| -> Result<Map<String, Value>, String> {
        let bytes = B64.decode(part).map_err(|_| format!("the token's {what} is not base64url"))?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(map)) => Ok(map),
            _ => Err(format!("the token's {what} is not a JSON object")),
        }
    };
    let header_map = json(header, "header")?;
    let claims = json(payload, "payload")?;
    let alg = header_map.get("alg").and_then(Value::as_str).ok_or("the token's header has no `alg`")?.to_string();
    let kid = match header_map.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err("the token's `kid` is not a string".to_string()),
    };
    let signature = B64.decode(signature).map_err(|_| "the token's signature is not base64url".to_string())?;
    let signed = format!("{header}.{payload}");
    Ok(Token { alg, kid, signed, signature, claims })
}

/// Whether the token's algorithm is on the allow-list (checked before any JWKS is fetched).
pub(super) fn allowed(token: &Token, rules: &Rules) -> Result<(), String> {
    if rules.algorithms.contains(&token.alg) {
        Ok(())
    } else {
        Err(format!("algorithm {} is not allowed", shorten(&token.alg)))
    }
}

/// Verifies `token` against the JWKS `jwks` (JSON) and `rules` at `now_s` (Unix seconds).
pub(crate) fn verify(token: &Token, jwks: &[u8], rules: &Rules, now_s: u64) -> Result<(), Failure> {
    let invalid = |m: String| Failure::Invalid(m);
    allowed(token, rules).map_err(invalid)?;
    let jwks: Value = serde_json::from_slice(jwks).map_err(|_| invalid("the JWKS is not JSON".to_string()))?;
    let keys = jwks.get("keys").and_then(Value::as_array).ok_or(invalid("the JWKS has no `keys` array".to_string()))?;
    let with_kid: Vec<&Value> = match &token.kid {
        Some(kid) => keys.iter().filter(|k| k.get("kid").and_then(Value::as_str) == Some(kid)).collect(),
        None => keys.iter().collect(),
    };
    if let (Some(kid), true) = (&token.kid, with_kid.is_empty()) {
        return Err(Failure::UnknownKid(format!("no key with kid {kid:?} in the JWKS")));
    }
    let usable: Vec<&Value> = with_kid.into_iter().filter(|k| fits(k, &token.alg)).take(MAX_KEYS_TRIED).collect();
    if usable.is_empty() {
        return Err(invalid(format!("no key in the JWKS fits algorithm {}", token.alg)));
    }
    let mut why = "the signature does not verify".to_string();
    let verified = usable.iter().any(|jwk| match signature_ok(jwk, token) {
        Ok(ok) => ok,
        Err(e) => {
            why = e;
            false
        }
    });
    if !verified {
        return Err(invalid(why));
    }
    claims_ok(&token.claims, rules, now_s).map_err(invalid)
}

/// Whether a JWK may verify `alg`: a matching key type and curve, and no other `alg` or
/// `use` declared (a JWK without `alg` suits any algorithm of its type).
fn fits(jwk: &Value, alg: &str) -> bool {
    let field = |name: &str| jwk.get(name).and_then(Value::as_str);
    let kind_fits = match alg {
        "RS256" | "RS384" | "RS512" | "PS256" => field("kty") == Some("RSA"),
        "ES256" => field("kty") == Some("EC") && field("crv") == Some("P-256"),
        "ES384" => field("kty") == Some("EC") && field("crv") == Some("P-384"),
        _ => false,
    };
    kind_fits && field("alg").is_none_or(|a| a == alg) && field("use").is_none_or(|u| u == "sig")
}

/// Whether the signature verifies with `jwk`; `Err` when the key itself is unusable.
fn signature_ok(jwk: &Value, token: &Token) -> Result<bool, String> {
    let bytes = |name: &str| -> Result<Vec<u8>, String> {
        let text = jwk.get(name).and_then(Value::as_str).ok_or(format!("a JWK has no `{name}`"))?;
        B64.decode(text).map_err(|_| format!("a JWK's `{name}` is not base64url"))
    };
    let message = token.signed.as_bytes();
    let sig = token.signature.as_slice();
    if token.alg.starts_with("ES") {
        // SEC1 uncompressed point: 0x04, then x and y at the curve's full width.
        let (x, y) = (bytes("x")?, bytes("y")?);
        let width = if token.alg == "ES256" { 32 } else { 48 };
        if x.len() != width || y.len() != width {
            return Err("a JWK's EC coordinates have the wrong length".to_string());
        }
        let point = [&[4u8][..], &x, &y].concat();
        let bad_key = |_| "a JWK is not a valid EC public key".to_string();
        return Ok(if token.alg == "ES256" {
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(bad_key)?;
            p256::ecdsa::Signature::from_slice(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
        } else {
            let key = p384::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(bad_key)?;
            p384::ecdsa::Signature::from_slice(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
        });
    }
    let n = BigUint::from_bytes_be(&bytes("n")?);
    if n.bits() < MIN_RSA_BITS {
        return Err(format!("a JWK's RSA key is shorter than {MIN_RSA_BITS} bits"));
    }
    let key = RsaPublicKey::new(n, BigUint::from_bytes_be(&bytes("e")?))
        .map_err(|_| "a JWK is not a valid RSA public key".to_string())?;
    use rsa::{pkcs1v15, pss};
    let pkcs1 = || pkcs1v15::Signature::try_from(sig).ok();
    Ok(match token.alg.as_str() {
        "RS256" => pkcs1().is_some_and(|s| pkcs1v15::VerifyingKey::<Sha256>::new(key).verify(message, &s).is_ok()),
        "RS384" => pkcs1().is_some_and(|s| pkcs1v15::VerifyingKey::<Sha384>::new(key).verify(message, &s).is_ok()),
        "RS512" => pkcs1().is_some_and(|s| pkcs1v15::VerifyingKey::<Sha512>::new(key).verify(message, &s).is_ok()),
        "PS256" => pss::Signature::try_from(sig)
            .is_ok_and(|s| pss::VerifyingKey::<Sha256>::new(key).verify(message, &s).is_ok()),
        _ => false,
    })
}

/// `exp`, `nbf` and `iat` (numbers of seconds) against the clock, each with the tolerance.
fn claims_ok(claims: &Map<String, Value>, rules: &Rules, now_s: u64) -> Result<(), String> {
    let time = |name: &str| -> Result<Option<f64>, String> {
        claims.get(name).map(|v| v.as_f64().ok_or(format!("the token's `{name}` is not a number"))).transpose()
    };
    let (now, tolerance) = (now_s as f64, rules.clock_tolerance_s as f64);
    if time("exp")?.is_some_and(|exp| now > exp + tolerance) {
        return Err("the token has expired".to_string());
    }
    if time("nbf")?.is_some_and(|nbf| now + tolerance < nbf) {
        return Err("the token is not valid yet (nbf)".to_string());
    }
    let iat = time("iat")?;
    if iat.is_some_and(|iat| iat > now + tolerance) {
        return Err("the token was issued in the future (iat)".to_string());
    }
    if let Some(max_age) = rules.max_token_age_s {
        let iat = iat.ok_or("the token has no `iat`, which maxTokenAge needs")?;
        if now - iat > max_age as f64 + tolerance {
            return Err("the token is older than maxTokenAge".to_string());
        }
    }
    Ok(())
}
