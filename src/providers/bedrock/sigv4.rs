//! AWS Signature Version 4 (header form) for the final upstream request, computed in the
//! filter from the bytes actually sent: the signature covers the host, the path, the query
//! and a SHA-256 of the exact body, so it must be made after translation.

use crate::errors::GatewayError;
use crate::percent;
use crate::providers::Signable;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key pair, with the session token of temporary (STS) credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AwsCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    /// Sent (and signed) as `x-amz-security-token`; an empty token counts as none.
    pub(crate) session_token: Option<String>,
}

/// The headers to add to the request: `authorization`, `x-amz-date`, `x-amz-content-sha256`
/// and, with a session token, `x-amz-security-token`. The signed headers are `host` plus
/// these. Everything is signed exactly as sent: the authority verbatim, port included (AWS
/// checks the signature against the `Host` it receives), the path with its percent-encoding
/// and any `custom_host` base path, the query, the body. `now_ms` is the host clock (Unix
/// milliseconds).
pub(crate) fn sign(
    credentials: &AwsCredentials,
    region: &str,
    service: &str,
    request: &Signable,
    now_ms: u64,
) -> Result<Vec<(&'static str, String)>, GatewayError> {
    let (path, query) = request.path.split_once('?').unwrap_or((request.path, ""));
    let (date, timestamp) = amz_date(now_ms);
    let payload_hash = hex(&Sha256::digest(request.body));
    let token = credentials.session_token.as_deref().filter(|t| !t.is_empty());
    let mut signed: Vec<(&str, &str)> =
        vec![("host", request.authority), ("x-amz-content-sha256", &payload_hash), ("x-amz-date", &timestamp)];
    if let Some(token) = token {
        signed.push(("x-amz-security-token", token));
    }
    let (canonical, signed_headers) = canonical_request(request.method, path, query, &signed, &payload_hash);
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let signature = signature(&credentials.secret_access_key, &date, region, service, &timestamp, &canonical)?;
    let authorization = format!(
        "{ALGORITHM} Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        credentials.access_key_id
    );
    let mut headers = vec![("authorization", authorization), ("x-amz-date", timestamp.clone())];
    headers.push(("x-amz-content-sha256", payload_hash.clone()));
    if let Some(token) = token {
        headers.push(("x-amz-security-token", token.to_string()));
    }
    Ok(headers)
}

/// The canonical request and its signed-header list. `headers` are lower-case names with
/// the values as sent.
fn canonical_request(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
) -> (String, String) {
    let mut headers: Vec<(&str, String)> = headers.iter().map(|(name, value)| (*name, header_value(value))).collect();
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(name, value)| format!("{name}:{value}\n")).collect();
    let signed_headers = headers.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(";");
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{payload_hash}",
        method.to_ascii_uppercase(),
        canonical_uri(path),
        canonical_query(query),
    );
    (canonical, signed_headers)
}

/// The hex signature of a canonical request.
fn signature(
    secret: &str,
    date: &str,
    region: &str,
    service: &str,
    timestamp: &str,
    canonical_request: &str,
) -> Result<String, GatewayError> {
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!("{ALGORITHM}\n{timestamp}\n{scope}\n{}", hex(&Sha256::digest(canonical_request)));
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes())?;
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes())?;
    }
    Ok(hex(&hmac(&key, string_to_sign.as_bytes())?))
}

fn hmac(key: &[u8], data: &[u8]) -> Result<Vec<u8>, GatewayError> {
    // HMAC takes keys of any length; the error exists only in the trait's signature.
    let mut mac = Hmac::<Sha256>::new_from_slice(key)
        .map_err(|_| GatewayError::new(500, "api_error", "could not compute the AWS request signature"))?;
    mac.update(data);
    Ok(mac.finalize().into_bytes().to_vec())
}

/// Every path segment URI-encoded once more: AWS services other than S3 sign the encoding of
/// the path as sent, so a `%3A` sent is signed as `%253A`. An empty path is `/`.
fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".to_string();
    }
    path.split('/').map(percent::encode).collect::<Vec<_>>().join("/")
}

/// The query's parameters decoded, encoded strictly, and sorted by name then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent::encode(&percent::decode_lenient(name)), percent::encode(&percent::decode_lenient(value)))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(name, value)| format!("{name}={value}")).collect::<Vec<_>>().join("&")
}

/// A header value as signed: trimmed, inner runs of spaces as one.
fn header_value(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `("YYYYMMDD", "YYYYMMDDTHHMMSSZ")` of a Unix time in milliseconds (UTC).
fn amz_date(now_ms: u64) -> (String, String) {
    let secs = now_ms / 1000;
    let (year, month, day) = civil_from_days(secs / 86_400);
    let second_of_day = secs % 86_400;
    let date = format!("{year:04}{month:02}{day:02}");
    let time = format!("{:02}{:02}{:02}", second_of_day / 3600, second_of_day % 3600 / 60, second_of_day % 60);
    (date.clone(), format!("{date}T{time}Z"))
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shifted to 0000-03-01 so that the leap day ends a year; eras are 400-year cycles.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    /// 2015-08-30T12:36:00Z, the time of the AWS SigV4 test suite.
    const SUITE_MS: u64 = 1_440_938_160_000;
    const SUITE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn suite_credentials(session_token: Option<&str>) -> AwsCredentials {
        AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SUITE_SECRET.into(),
            session_token: session_token.map(str::to_string),
        }
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(10_957), (2000, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        assert_eq!(amz_date(SUITE_MS + 999), ("20150830".into(), "20150830T123600Z".into()));
        assert_eq!(amz_date(1_700_000_000_123), ("20231114".into(), "20231114T221320Z".into()));
        assert_eq!(amz_date(951_868_799_000), ("20000229".into(), "20000229T235959Z".into()));
    }

    /// Every day from 1970 to 2200 follows the one before it.
    #[test]
    fn civil_dates_are_consecutive() {
        let days_in = |year: u64, month: u64| match month {
            2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut expected = (1970, 1, 1);
        for days in 0..84_000 {
            assert_eq!(civil_from_days(days), expected, "day {days}");
            let (year, month, day) = expected;
            expected = if day < days_in(year, month) {
                (year, month, day + 1)
            } else if month < 12 {
                (year, month + 1, 1)
            } else {
                (year + 1, 1, 1)
            };
        }
    }

    /// `get-vanilla` of the AWS SigV4 test suite (aws-sig-v4-test-suite): `GET /` with only
    /// `host` and `x-amz-date` signed. Its canonical request hash and signature are the
    /// published ones (botocore 1.44.5 computes the same signature).
    #[test]
    fn aws_test_suite_get_vanilla() {
        let headers = [("host", "example.amazonaws.com"), ("x-amz-date", "20150830T123600Z")];
        let (canonical, signed_headers) = canonical_request("GET", "/", "", &headers, EMPTY_SHA256);
        assert_eq!(
            canonical,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n".to_string()
                + EMPTY_SHA256
        );
        assert_eq!(signed_headers, "host;x-amz-date");
        assert_eq!(
            hex(&Sha256::digest(&canonical)),
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        let signature =
            signature(SUITE_SECRET, "20150830", "us-east-1", "service", "20150830T123600Z", &canonical).unwrap();
        assert_eq!(signature, "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    }

    /// `get-vanilla-query-order-key-case` of the AWS suite: parameters sorted by name (the
    /// signature checked with botocore 1.44.5 as well).
    #[test]
    fn aws_test_suite_query_order() {
        let headers = [("host", "example.amazonaws.com"), ("x-amz-date", "20150830T123600Z")];
        let (canonical, _) = canonical_request("GET", "/", "Param2=value2&Param1=value1", &headers, EMPTY_SHA256);
        assert!(canonical.starts_with("GET\n/\nParam1=value1&Param2=value2\n"), "{canonical}");
        let signature =
            signature(SUITE_SECRET, "20150830", "us-east-1", "service", "20150830T123600Z", &canonical).unwrap();
        assert_eq!(signature, "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
    }

    #[test]
    fn paths_are_encoded_again_and_queries_strictly() {
        assert_eq!(canonical_uri("/model/anthropic.claude-3%3A0/converse"), "/model/anthropic.claude-3%253A0/converse");
        assert_eq!(canonical_uri("/a b/c~d/"), "/a%20b/c~d/");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_query("b=2&a=%7e x&a=1&flag"), "a=1&a=~%20x&b=2&flag=");
        assert_eq!(canonical_query("k=%zz%4"), "k=%25zz%254");
        assert_eq!(header_value("  a   b "), "a b");
    }

    // The expected values of the two tests below were computed with Python botocore 1.44.5
    // (an implementation independent of ours): `botocore.auth.SigV4Auth(Credentials(...),
    // "bedrock", region).add_auth(AWSRequest(method, url, data=body, headers={"Host": authority,
    // "X-Amz-Content-SHA256": sha256(body)}))` with `datetime` patched to the test's time;
    // botocore signs every header the request has, so the signed set is the same as ours.

    #[test]
    fn converse_request_with_session_token_matches_botocore() {
        let body = br#"{"messages":[{"role":"user","content":[{"text":"Hi"}]}]}"#;
        let request = Signable {
            method: "POST",
            authority: "bedrock-runtime.us-east-1.amazonaws.com",
            path: "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse",
            token: None,
            body,
        };
        let headers =
            sign(&suite_credentials(Some("session-token/xyz=")), "us-east-1", "bedrock", &request, SUITE_MS).unwrap();
        assert_eq!(
            headers,
            vec![
                ("authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=66cb18a904a7b9e6e5a590ede9c40c266f03b37b5bd78f9769ea303b48bc14b1".to_string()),
                ("x-amz-date", "20150830T123600Z".to_string()),
                ("x-amz-content-sha256", "45e583fed2564dc00e823303d7609f8587af7f685b993cb0f998afc0d480b01d".to_string()),
                ("x-amz-security-token", "session-token/xyz=".to_string()),
            ]
        );
    }

    #[test]
    fn custom_host_with_port_and_prefix_matches_botocore() {
        let body = br#"{"inferenceConfig":{"maxTokens":5}}"#;
        let request = Signable {
            method: "POST",
            authority: "127.0.0.1:9000",
            path: "/proxy/model/us.meta.llama3-2-1b-instruct-v1%3A0/converse-stream?b=2&a=1",
            token: None,
            body,
        };
        let headers = sign(&suite_credentials(Some("")), "eu-west-3", "bedrock", &request, 1_700_000_000_123).unwrap();
        let authorization = &headers.first().unwrap().1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/eu-west-3/bedrock/aws4_request, \
             SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=261d01c3f5993ecd55fc3fd7edef439d337b3e61e8cf81773ebd7a2d46a79fd3"
        );
        assert_eq!(headers.len(), 3, "an empty session token is no token");
    }
}
