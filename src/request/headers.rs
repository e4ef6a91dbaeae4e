//! The gateway headers of spec section 5, parsed and type-checked. Each header may also
//! arrive under the snake_case or camelCase names client libraries use (Envoy lowercases
//! names, so `apiKey` arrives as `apikey`).

use crate::cloud::CloudFields;
use crate::errors::GatewayError;
use crate::json_check::shorten;
use crate::wire_names::{is_header_name, CONTROL_PLANE_FETCH_HEADER};
use hashbrown::HashMap;
use serde_json::{Map, Value};
use std::sync::OnceLock;

/// Every gateway header, by field. The first name is the canonical one used in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    ApiKey,
    Provider,
    VirtualKey,
    Config,
    CustomHost,
    TraceId,
    SpanId,
    ParentSpanId,
    SpanName,
    Metadata,
    CacheForceRefresh,
    CacheNamespace,
    RequestTimeout,
    ForwardHeaders,
    AzureResourceName,
    AzureDeploymentId,
    AzureApiVersion,
    AzureModelName,
    GcpProjectId,
    GcpRegion,
    GcpRequestType,
    AwsSessionToken,
    AwsSecretAccessKey,
    AwsRegion,
    AwsAccessKeyId,
}

const HEADERS: &[(Field, &[&str])] = &[
    (Field::ApiKey, &["x-gateway-api-key", "api_key", "apikey"]),
    (Field::Provider, &["x-gateway-provider", "provider"]),
    (Field::VirtualKey, &["x-gateway-virtual-key", "virtual_key", "virtualkey"]),
    (Field::Config, &["x-gateway-config", "config"]),
    (Field::CustomHost, &["x-gateway-custom-host", "custom_host", "customhost"]),
    (Field::TraceId, &["x-gateway-trace-id", "trace_id", "traceid"]),
    (Field::SpanId, &["x-gateway-span-id"]),
    (Field::ParentSpanId, &["x-gateway-parent-span-id"]),
    (Field::SpanName, &["x-gateway-span-name"]),
    (Field::Metadata, &["x-gateway-metadata", "metadata"]),
    (Field::CacheForceRefresh, &["x-gateway-cache-force-refresh", "cache_force_refresh", "cacheforcerefresh"]),
    (Field::CacheNamespace, &["x-gateway-cache-namespace", "cache_namespace", "cachenamespace"]),
    (Field::RequestTimeout, &["x-gateway-request-timeout", "request_timeout", "requesttimeout"]),
    (Field::ForwardHeaders, &["x-gateway-forward-headers", "forward_headers", "forwardheaders"]),
    (Field::AzureResourceName, &["x-gateway-cloud-a-resource-name"]),
    (Field::AzureDeploymentId, &["x-gateway-cloud-a-deployment-id"]),
    (Field::AzureApiVersion, &["x-gateway-cloud-a-api-version"]),
    (Field::AzureModelName, &["x-gateway-cloud-a-model-name"]),
    (Field::GcpProjectId, &["x-gateway-cloud-b-project-id"]),
    (Field::GcpRegion, &["x-gateway-cloud-b-region"]),
    (Field::GcpRequestType, &["x-cloud-b-llm-request-type"]),
    (Field::AwsSessionToken, &["x-gateway-cloud-c-session-token"]),
    (Field::AwsSecretAccessKey, &["x-gateway-cloud-c-secret-access-key"]),
    (Field::AwsRegion, &["x-gateway-cloud-c-region"]),
    (Field::AwsAccessKeyId, &["x-gateway-cloud-c-access-key-id", "cloud_c_access_key_id", "cloudcaccesskeyid"]),
];

/// A body the gateway reads must come as sent: it decodes no `Content-Encoding` (gzip, br, ...),
/// and compressed bytes read as plain would be checked as something else (and, when they
/// parsed, forwarded under a header that misdescribes them). `identity` is no encoding.
pub(crate) fn check_plain_body(raw: &[(String, Vec<u8>)]) -> Result<(), GatewayError> {
    let values = raw.iter().filter(|(name, _)| name == "content-encoding").map(|(_, v)| String::from_utf8_lossy(v));
    for value in values {
        let coding = value.split(',').map(str::trim).find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
        if let Some(coding) = coding {
            let mut e = GatewayError::new(
                415,
                "invalid_request_error",
                format!(
                    "Content-Encoding '{}' is not supported: the gateway reads this endpoint's body, send it uncompressed",
                    shorten(coding)
                ),
            );
            e.param = Some("content-encoding".to_string());
            e.code = Some("unsupported_content_encoding");
            return Err(e);
        }
    }
    Ok(())
}

/// A header value as text. Gateway headers and credentials must be valid UTF-8 (a mangled
/// key or config must not pass silently); other headers are decoded leniently.
pub(crate) fn decode_value(name: &str, value: &[u8]) -> Result<String, GatewayError> {
    match std::str::from_utf8(value) {
        Ok(text) => Ok(text.to_string()),
        Err(_) if is_gateway_header(name) || name == "authorization" || name == PROVIDER_KEY_HEADER => {
            let canonical = lookup(name).map_or(name, |(_, canonical)| canonical);
            Err(GatewayError::invalid_header(canonical, "must be valid UTF-8 text"))
        }
        Err(_) => Ok(String::from_utf8_lossy(value).into_owned()),
    }
}

/// The first value of a header in raw request headers.
pub(crate) fn find<'a>(raw: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    raw.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
}

/// Header `name` set to `value` (replacing every value it had), or removed, as Envoy's
/// replace and remove calls do.
pub(crate) fn set(raw: &mut Vec<(String, Vec<u8>)>, name: &str, value: Option<&[u8]>) {
    raw.retain(|(n, _)| n != name);
    if let Some(value) = value {
        raw.push((name.to_string(), value.to_vec()));
    }
}

/// The first value carrying `field` under any of its names.
fn find_field(raw: &[(String, Vec<u8>)], field: Field) -> Option<&[u8]> {
    raw.iter().find(|(name, _)| lookup(name).is_some_and(|(f, _)| f == field)).map(|(_, v)| v.as_slice())
}

/// The gateway key as sent, before anything else is parsed.
pub(crate) fn api_key(raw: &[(String, Vec<u8>)]) -> Option<&[u8]> {
    find_field(raw, Field::ApiKey)
}

/// Trace fields for the log line and the trace id header, readable even from a request
/// the gateway rejects. Without a client trace id, the gateway makes one (`exchange::trace_id`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TraceFields {
    pub(crate) trace_id: Option<String>,
    pub(crate) span_id: String,
    pub(crate) parent_span_id: String,
    pub(crate) span_name: String,
}

pub(crate) fn trace_fields(raw: &[(String, Vec<u8>)]) -> TraceFields {
    // The first value of each, in one pass over the headers.
    let (mut trace_id, mut span_id, mut parent_span_id, mut span_name) = (None, None, None, None);
    for (name, value) in raw {
        let slot = match lookup(name).map(|(field, _)| field) {
            Some(Field::TraceId) => &mut trace_id,
            Some(Field::SpanId) => &mut span_id,
            Some(Field::ParentSpanId) => &mut parent_span_id,
            Some(Field::SpanName) => &mut span_name,
            _ => continue,
        };
        slot.get_or_insert(value.as_slice());
    }
    // A value that is not UTF-8 counts as absent: a garbled id is no id.
    let text = |value: Option<&[u8]>| {
        value.and_then(|v| std::str::from_utf8(v).ok()).map(|v| v.trim().to_string()).unwrap_or_default()
    };
    TraceFields {
        trace_id: Some(text(trace_id)).filter(|id| !id.is_empty()),
        span_id: text(span_id),
        parent_span_id: text(parent_span_id),
        span_name: text(span_name),
    }
}

/// Headers that carry the gateway's own secrets (its key, stored-credential references,
/// configs with provider keys, cloud secrets, the control plane's mark): never forwarded,
/// whatever the request asks.
pub(crate) fn is_secret_header(name: &str) -> bool {
    name == CONTROL_PLANE_FETCH_HEADER
        || lookup(name).is_some_and(|(field, _)| {
            matches!(
                field,
                Field::ApiKey
                    | Field::VirtualKey
                    | Field::Config
                    | Field::AwsAccessKeyId
                    | Field::AwsSecretAccessKey
                    | Field::AwsSessionToken
            )
        })
}

/// Whether a request header is one of the gateway's own (never sent to a provider).
pub(crate) fn is_gateway_header(name: &str) -> bool {
    name.starts_with("x-gateway-") || lookup(name).is_some()
}

fn lookup(name: &str) -> Option<(Field, &'static str)> {
    // Canonical names start with `x-gateway-` (one cloud B name aside); the aliases client
    // libraries use have no hyphen. Most headers are neither and skip the table: this runs
    // several times per header on every request.
    let candidate = name.starts_with("x-gateway-")
        || name == "x-cloud-b-llm-request-type"
        || !(name.contains('-') || name.starts_with(':'));
    if !candidate {
        return None;
    }
    static BY_NAME: OnceLock<HashMap<&'static str, (Field, &'static str)>> = OnceLock::new();
    let by_name = BY_NAME.get_or_init(|| {
        let entries = HEADERS.iter().filter_map(|(field, names)| Some((*field, *names, *names.first()?)));
        entries
            .flat_map(|(field, names, canonical)| names.iter().map(move |name| (*name, (field, canonical))))
            .collect()
    });
    by_name.get(name).copied()
}

/// Anthropic's clients send the provider key in this header (the OpenAI side in
/// `Authorization: Bearer`); either is the client's provider credential.
pub(crate) const PROVIDER_KEY_HEADER: &str = "x-api-key";

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GatewayHeaders {
    pub(crate) provider: Option<String>,
    /// The token of `Authorization: Bearer <token>`.
    pub(crate) bearer: Option<String>,
    /// `x-api-key`, the provider key as Anthropic's clients send it.
    pub(crate) x_api_key: Option<String>,
    pub(crate) virtual_key: Option<String>,
    pub(crate) config: Option<String>,
    pub(crate) custom_host: Option<String>,
    pub(crate) metadata: Option<Map<String, Value>>,
    pub(crate) cache_force_refresh: Option<bool>,
    pub(crate) cache_namespace: Option<String>,
    pub(crate) request_timeout: Option<u64>,
    pub(crate) forward_headers: Option<Vec<String>>,
    pub(crate) vendor_beta: Option<String>,
    /// Cloud fields sent as headers (spec 5.3).
    pub(crate) cloud: CloudFields,
}

impl GatewayHeaders {
    /// Parses the request headers (names lowercase, as Envoy gives them).
    pub(crate) fn parse<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, GatewayError> {
        let mut parsed = GatewayHeaders::default();
        for (name, value) in headers {
            if name == "authorization" {
                parsed.bearer = bearer_token(value);
            } else if name == PROVIDER_KEY_HEADER {
                parsed.x_api_key = Some(value.trim().to_string()).filter(|key| !key.is_empty());
            } else if name == "vendor-beta" {
                parsed.vendor_beta = Some(value.to_string());
            } else if let Some((field, canonical)) = lookup(name) {
                parsed.set(field, canonical, value)?;
            }
        }
        Ok(parsed)
    }

    /// The provider credential the client sent: `Authorization: Bearer`, else `x-api-key`.
    pub(crate) fn provider_key(&self) -> Option<&String> {
        self.bearer.as_ref().or(self.x_api_key.as_ref())
    }

    fn set(&mut self, field: Field, header: &str, value: &str) -> Result<(), GatewayError> {
        let text = Some(value.trim().to_string());
        match field {
            // Read straight from the raw headers, before and apart from this parse, by
            // `api_key` (checked first) and `trace_fields` (needed even for rejected requests).
            Field::ApiKey | Field::TraceId | Field::SpanId | Field::ParentSpanId | Field::SpanName => {}
            Field::Provider => self.provider = text,
            Field::VirtualKey => self.virtual_key = text,
            Field::Config => self.config = text,
            Field::CustomHost => self.custom_host = text,
            Field::Metadata => self.metadata = Some(parse_metadata(header, value)?),
            Field::CacheForceRefresh => self.cache_force_refresh = Some(parse_bool(header, value)?),
            Field::CacheNamespace => self.cache_namespace = text,
            Field::RequestTimeout => self.request_timeout = Some(parse_timeout(header, value)?),
            Field::ForwardHeaders => self.forward_headers = Some(parse_header_list(header, value)?),
            Field::AzureResourceName => self.cloud.resource_name = text,
            Field::AzureDeploymentId => self.cloud.deployment_id = text,
            Field::AzureApiVersion => self.cloud.api_version = text,
            Field::AzureModelName => self.cloud.azure_model_name = text,
            Field::GcpProjectId => self.cloud.gcp_project_id = text,
            Field::GcpRegion => self.cloud.gcp_region = text,
            Field::GcpRequestType => self.cloud.gcp_request_type = text,
            Field::AwsSessionToken => self.cloud.aws_session_token = text,
            Field::AwsSecretAccessKey => self.cloud.aws_secret_access_key = text,
            Field::AwsRegion => self.cloud.aws_region = text,
            Field::AwsAccessKeyId => self.cloud.aws_access_key_id = text,
        }
        Ok(())
    }
}

fn bearer_token(value: &str) -> Option<String> {
    let value = value.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

fn parse_metadata(header: &str, value: &str) -> Result<Map<String, Value>, GatewayError> {
    match serde_json::from_str::<Value>(value) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(GatewayError::invalid_header(header, "must be a JSON object")),
        Err(_) => Err(GatewayError::invalid_header(header, "must be a JSON object (the value is not valid JSON)")),
    }
}

fn parse_bool(header: &str, value: &str) -> Result<bool, GatewayError> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(GatewayError::invalid_header(header, "must be `true` or `false`")),
    }
}

fn parse_timeout(header: &str, value: &str) -> Result<u64, GatewayError> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms >= 1 => Ok(ms),
        _ => Err(GatewayError::invalid_header(header, "must be a positive integer number of milliseconds")),
    }
}

/// A JSON array of header names or a comma-separated list; names are lowercased.
pub(crate) fn parse_header_list(header: &str, value: &str) -> Result<Vec<String>, GatewayError> {
    let value = value.trim();
    let names: Vec<String> = if value.starts_with('[') {
        let items: Vec<Value> = serde_json::from_str(value).map_err(|_| {
            GatewayError::invalid_header(header, "must be a JSON array of header names or a comma-separated list")
        })?;
        items
            .into_iter()
            .map(|item| match item {
                Value::String(name) => Ok(name),
                _ => Err(GatewayError::invalid_header(header, "every item must be a header name string")),
            })
            .collect::<Result<_, _>>()?
    } else {
        value.split(',').map(|name| name.trim().to_string()).filter(|name| !name.is_empty()).collect()
    };
    names
        .into_iter()
        .map(|name| {
            if is_header_name(&name) {
                Ok(name.to_ascii_lowercase())
            } else {
                Err(GatewayError::invalid_header(header, format!("'{name}' is not a valid header name")))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn parse(headers: &[(&str, &str)]) -> Result<GatewayHeaders, GatewayError> {
        GatewayHeaders::parse(headers.iter().copied())
    }

    #[test]
    fn reads_canonical_names_and_aliases() {
        let pairs = [
            ("apikey", "gw"),
            ("provider", "openai"),
            ("authorization", "Bearer sk-1"),
            ("customhost", "http://127.0.0.1:1/v1"),
            ("traceid", "t-1"),
            ("x-gateway-span-id", "s"),
            ("cloud_c_access_key_id", "AKIA"),
            ("x-cloud-b-llm-request-type", "embeddings"),
        ];
        let h = parse(&pairs).unwrap();
        assert_eq!(h.provider.as_deref(), Some("openai"));
        assert_eq!(h.bearer.as_deref(), Some("sk-1"));
        assert_eq!(h.custom_host.as_deref(), Some("http://127.0.0.1:1/v1"));
        assert_eq!(h.cloud.aws_access_key_id.as_deref(), Some("AKIA"));
        assert_eq!(h.cloud.gcp_request_type.as_deref(), Some("embeddings"));
        // The key and the trace fields are read from the raw headers, under the same aliases.
        let raw: Vec<(String, Vec<u8>)> = pairs.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
        assert_eq!(api_key(&raw), Some(&b"gw"[..]));
        let trace = trace_fields(&raw);
        assert_eq!((trace.trace_id.as_deref(), trace.span_id.as_str()), (Some("t-1"), "s"));
    }

    #[test]
    fn metadata_must_be_a_json_object() {
        assert!(parse(&[("x-gateway-metadata", r#"{"_user":"u1"}"#)]).unwrap().metadata.is_some());
        for bad in ["not-json", "[1]", "\"s\"", "1"] {
            let err = parse(&[("x-gateway-metadata", bad)]).unwrap_err();
            assert_eq!(err.status, 400);
            assert!(err.message.contains("x-gateway-metadata"), "{}", err.message);
        }
        let err = parse(&[("metadata", "[]")]).unwrap_err();
        assert!(err.message.contains("x-gateway-metadata"));
    }

    #[test]
    fn timeout_must_be_a_positive_integer() {
        assert_eq!(parse(&[("x-gateway-request-timeout", "1500")]).unwrap().request_timeout, Some(1500));
        for bad in ["abc", "1.5", "-1", "0", "99999999999999999999999"] {
            let err = parse(&[("x-gateway-request-timeout", bad)]).unwrap_err();
            assert!(err.message.contains("x-gateway-request-timeout"), "{bad}");
        }
    }

    #[test]
    fn force_refresh_must_be_a_boolean() {
        assert_eq!(parse(&[("x-gateway-cache-force-refresh", "true")]).unwrap().cache_force_refresh, Some(true));
        assert_eq!(parse(&[("cacheforcerefresh", "false")]).unwrap().cache_force_refresh, Some(false));
        for bad in ["maybe", "1", "TRUE "] {
            assert!(parse(&[("x-gateway-cache-force-refresh", bad)]).is_err(), "{bad}");
        }
    }

    #[test]
    fn forward_headers_accept_json_array_and_comma_list() {
        let h = parse(&[("x-gateway-forward-headers", r#"["X-A", "x-b"]"#)]).unwrap();
        assert_eq!(h.forward_headers, Some(vec!["x-a".to_string(), "x-b".to_string()]));
        let h = parse(&[("forward_headers", "X-A, x-b")]).unwrap();
        assert_eq!(h.forward_headers, Some(vec!["x-a".to_string(), "x-b".to_string()]));
        for bad in [r#"{"a":1}"#, "[1]", "[\"bad header\"]", "a b"] {
            let err = parse(&[("x-gateway-forward-headers", bad)]).unwrap_err();
            assert!(err.message.contains("x-gateway-forward-headers"), "{bad}");
        }
    }

    #[test]
    fn bearer_needs_the_scheme() {
        assert_eq!(parse(&[("authorization", "bearer tok")]).unwrap().bearer.as_deref(), Some("tok"));
        assert_eq!(parse(&[("authorization", "Basic abc")]).unwrap().bearer, None);
        assert_eq!(parse(&[("authorization", "Bearer ")]).unwrap().bearer, None);
        // Anthropic's clients send the key in x-api-key; a Bearer wins when both come.
        assert_eq!(parse(&[("x-api-key", "sk-ant")]).unwrap().provider_key().map(String::as_str), Some("sk-ant"));
        let both = parse(&[("x-api-key", "sk-ant"), ("authorization", "Bearer tok")]).unwrap();
        assert_eq!(both.provider_key().map(String::as_str), Some("tok"));
        assert_eq!(parse(&[("x-api-key", " ")]).unwrap().provider_key(), None);
    }

    #[test]
    fn gateway_header_values_must_be_utf8() {
        assert_eq!(decode_value("x-gateway-config", b"{}").unwrap(), "{}");
        let err = decode_value("metadata", b"{\"a\":\"\xff\"}").unwrap_err();
        assert!(err.message.contains("x-gateway-metadata"));
        assert!(decode_value("authorization", b"Bearer \xfe").is_err());
        assert_eq!(decode_value("x-other", b"a\xffb").unwrap(), "a\u{fffd}b");
    }

    #[test]
    fn trace_fields_are_the_clients_and_never_envoys_request_id() {
        let raw = |pairs: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
            pairs.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect()
        };
        let t = trace_fields(&raw(&[
            ("x-request-id", "envoy-id"),
            ("traceid", " client-id "),
            ("x-gateway-span-id", "s1"),
        ]));
        assert_eq!((t.trace_id.as_deref(), t.span_id.as_str()), (Some("client-id"), "s1"));
        assert_eq!(trace_fields(&raw(&[("x-request-id", "envoy-id"), ("x-gateway-trace-id", " ")])).trace_id, None);
        assert_eq!(trace_fields(&raw(&[])).trace_id, None);
        let garbled = vec![
            ("x-gateway-trace-id".to_string(), b"\xff\xfe".to_vec()),
            ("x-request-id".to_string(), b"r1".to_vec()),
        ];
        assert_eq!(trace_fields(&garbled).trace_id, None);
        assert_eq!(api_key(&raw(&[("apikey", "k")])), Some(&b"k"[..]));
    }

    #[test]
    fn every_table_name_passes_the_lookup_shortcut() {
        for (field, names) in HEADERS {
            for name in *names {
                assert_eq!(lookup(name).map(|(f, _)| f), Some(*field), "{name}");
            }
        }
        for other in [":authority", "content-type", "x-request-id", "accept", "host"] {
            assert_eq!(lookup(other), None, "{other}");
        }
    }

    #[test]
    fn gateway_headers_are_recognised() {
        assert!(is_gateway_header("x-gateway-anything"));
        assert!(is_gateway_header("apikey"));
        assert!(is_gateway_header("x-cloud-b-llm-request-type"));
        assert!(!is_gateway_header("x-custom-thing"));
    }

    #[test]
    fn a_body_the_gateway_reads_comes_unencoded() {
        let with = |values: &[&str]| -> Vec<(String, Vec<u8>)> {
            let mut raw = vec![(":method".to_string(), b"POST".to_vec())];
            raw.extend(values.iter().map(|v| ("content-encoding".to_string(), v.as_bytes().to_vec())));
            raw
        };
        for plain in [&[][..], &["identity"], &["Identity"], &[" identity , identity"], &[""]] {
            assert_eq!(check_plain_body(&with(plain)), Ok(()), "{plain:?}");
        }
        for (values, named) in [
            (&["gzip"][..], "gzip"),
            (&["br"], "br"),
            (&["identity, deflate"], "deflate"),
            (&["identity", "zstd"], "zstd"),
            (&["x-unknown-coding"], "x-unknown-coding"),
        ] {
            let e = check_plain_body(&with(values)).unwrap_err();
            assert_eq!(
                (e.status, e.kind, e.param.as_deref()),
                (415, "invalid_request_error", Some("content-encoding"))
            );
            assert_eq!(e.code, Some("unsupported_content_encoding"));
            assert!(e.message.contains(&format!("'{named}'")), "{}", e.message);
        }
        // Client text is echoed cut short.
        let long = "z".repeat(10_000);
        assert!(check_plain_body(&with(&[&long])).unwrap_err().message.len() < 300);
    }
}
