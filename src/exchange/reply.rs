//! How a provider's answer reaches the client: the response mode, finishing a buffered or
//! recovered answer, the gateway's own error answers, and what a failure was.

use crate::client_api;
use crate::errors::GatewayError;
use crate::pipeline::ResponsePlan;
use crate::request::endpoint::ClientApi;
use crate::routing::plan::Failure;

/// How the response of a forwarded attempt is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseMode {
    /// Passes as it comes.
    Passthrough,
    /// Hold the headers and buffer the body, then reshape a provider error.
    Error(u16),
    /// Hold the headers and buffer the body, then translate the answer.
    Translated,
    /// Translate a stream chunk by chunk.
    Stream,
    /// The answer cannot be what the client asked for: the gateway answers 502 instead.
    Unreadable(Unreadable),
}

/// Why a provider's answer cannot reach the client as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// A status outside HTTP's 100-599.
    Status(u16),
    /// An event stream for a request that asked for JSON.
    UnaskedStream,
    /// A success without a body, for a request that asked for JSON.
    Empty(u16),
}

/// Whether `status` is an HTTP status at all (a provider may send any three digits).
pub(crate) fn valid_status(status: u16) -> bool {
    (100..=599).contains(&status)
}

/// Whether a response can carry a body (not for HEAD, 1xx, 204 and 304).
pub(crate) fn has_body(head: bool, status: u16) -> bool {
    !head && status >= 200 && status != 204 && status != 304
}

/// Picks how a response is handled (`expects_json`: the client asked for a JSON answer, not
/// a stream; `event_stream`: the provider answered with a stream).
pub(crate) fn response_mode(
    plan: &ResponsePlan,
    head: bool,
    status: u16,
    expects_json: bool,
    event_stream: bool,
) -> ResponseMode {
    let translated = plan.translator.translates_responses();
    if !valid_status(status) {
        ResponseMode::Unreadable(Unreadable::Status(status))
    } else if !has_body(head, status) {
        ResponseMode::Passthrough
    } else if status >= 400 {
        ResponseMode::Error(status)
    } else if !translated && !expects_json {
        ResponseMode::Passthrough
    } else if event_stream {
        if expects_json {
            ResponseMode::Unreadable(Unreadable::UnaskedStream)
        } else {
            ResponseMode::Stream
        }
    } else if translated {
        ResponseMode::Translated
    } else {
        ResponseMode::Passthrough
    }
}

/// A finished answer: status, whether its body is the gateway's JSON (translated or an
/// error), and the body.
pub(crate) struct Finished {
    pub(crate) status: u16,
    pub(crate) json: bool,
    pub(crate) body: Vec<u8>,
    /// Set when the body is the gateway's own error.
    pub(crate) error_code: Option<&'static str>,
}

/// The one way a whole answer body is finished in `mode`: an error reshaped (the
/// translator sees the provider's headers too), an answer translated, a stream translated
/// whole (a recovered call's answer arrives in one piece), or the body as it came.
pub(crate) fn finish(
    plan: &mut ResponsePlan,
    mode: ResponseMode,
    status: u16,
    headers: &[(String, Vec<u8>)],
    body: Vec<u8>,
) -> Finished {
    let translator = &mut plan.translator;
    match mode {
        ResponseMode::Error(status) => {
            Finished { status, json: true, body: translator.error(status, headers, &body), error_code: None }
        }
        ResponseMode::Translated => match translator.response(&body) {
            Ok(body) => Finished { status, json: true, body, error_code: None },
            // A success the gateway cannot read is no success for the client.
            Err(error) => gateway_error(&error, plan.api),
        },
        ResponseMode::Stream => {
            let mut out = Vec::with_capacity(body.len());
            translator.stream(&body, &mut out);
            translator.stream_end(&mut out);
            Finished { status, json: false, body: out, error_code: None }
        }
        ResponseMode::Passthrough => Finished { status, json: false, body, error_code: None },
        ResponseMode::Unreadable(why) => gateway_error(&unreadable_error(plan.provider.name, why), plan.api),
    }
}

/// The gateway's 502 for an answer it cannot pass on, naming what the provider sent.
pub(crate) fn unreadable_error(provider: &str, why: Unreadable) -> GatewayError {
    let message = match why {
        Unreadable::Status(status) => format!("provider '{provider}' answered with an invalid HTTP status {status}"),
        Unreadable::UnaskedStream => format!(
            "provider '{provider}' answered with an event stream to a request that did not ask for one: \
             the answer could not be read"
        ),
        Unreadable::Empty(status) => {
            format!("provider '{provider}' answered {status} with an empty body: the answer could not be read")
        }
    };
    GatewayError::new(502, "api_error", message).with_code("invalid_provider_response")
}

/// The gateway's own error, in the shape of the client's API.
pub(crate) fn gateway_error(error: &GatewayError, api: ClientApi) -> Finished {
    let body = client_api::error_body(api, error.status, error.to_json());
    Finished { status: error.status, json: true, body, error_code: error.code }
}

pub(crate) fn timeout_error() -> GatewayError {
    GatewayError::new(408, "timeout_error", "the provider did not answer within the request timeout")
        .with_code("request_timeout")
}

/// Why a host Envoy (a mesh's, in `upstream` mode) cannot reach a target's host: it has no route
/// or cluster for it (`details`: Envoy's response details, or what the gateway saw).
pub(crate) fn no_route_detail(cluster: &str, host: &str, details: &str) -> String {
    format!("the proxy has no route or cluster '{cluster}' for host {host} ({details})")
}

pub(crate) fn unreachable_error(detail: &str) -> GatewayError {
    GatewayError::new(502, "api_error", format!("provider unreachable: {detail}")).with_code("upstream_unreachable")
}

/// Why a routed attempt did not succeed, from Envoy's response details: the provider's
/// status, or Envoy's own reply for a timeout or an unreachable provider. `None`: Envoy
/// answered for a reason that says nothing about the provider (e.g. overload); that reply
/// passes as it is.
pub(crate) fn routed_failure(status: u16, details: &str) -> Option<Failure> {
    match details {
        "via_upstream" => Some(Failure::Status(status)),
        "upstream_per_try_timeout" | "upstream_response_timeout" => Some(Failure::Timeout),
        // (A host whose cluster or route the host Envoy lacks, in `upstream` mode, is as unreachable.)
        d if d.starts_with("upstream_reset_before_response_started")
            || d.starts_with("no_healthy_upstream")
            || d.starts_with("dns_resolution_failure")
            || d == "cluster_not_found"
            || d == "route_not_found" =>
        {
            Some(Failure::Unreachable)
        }
        _ => None,
    }
}

/// Envoy's own answer to a held answer, from its response details: the provider broke off
/// after its response headers (a reset, a bad chunk: 502), or went silent for the stream idle
/// timeout (504). Envoy then answers past the filter: the Envoy config's local reply mapper
/// gives its answer the gateway's error shape and these codes.
pub(crate) fn envoys_own_answer(details: &str) -> Option<(u16, &'static str)> {
    if details.starts_with("upstream_reset_after_response_started") {
        Some((502, "upstream_incomplete"))
    } else if details == "stream_idle_timeout" {
        Some((504, "upstream_stalled"))
    } else {
        None
    }
}

/// Why a dispatched call did not succeed: Envoy's own text answers of a call that never
/// reached a provider, no answer at all (status 0), or the provider's status. `None`: a 2xx.
pub(crate) fn call_failure(status: u16, body: &[u8]) -> Option<Failure> {
    match status {
        0 => Some(Failure::Unreachable),
        // Not an HTTP status: a broken provider, as a 502 would say.
        s if !valid_status(s) => Some(Failure::Status(502)),
        504 if body == b"upstream request timeout" => Some(Failure::Timeout),
        503 if body.starts_with(b"upstream connect error") || body.starts_with(b"no healthy upstream") => {
            Some(Failure::Unreachable)
        }
        200..=299 => None,
        _ => Some(Failure::Status(status)),
    }
}

/// The provider's response headers a local answer may carry (Envoy frames the body; a
/// gateway JSON body has its own content type; the gateway's own headers are the gateway's
/// to set, never an upstream's).
pub(crate) fn provider_headers(headers: &[(String, Vec<u8>)], json: bool) -> Vec<(String, String)> {
    let framing = ["content-length", "transfer-encoding", "connection", "keep-alive"];
    let mut kept: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| !name.starts_with(':') && !framing.contains(&name.as_str()))
        .filter(|(name, _)| !name.starts_with("x-gateway-"))
        .filter(|(name, _)| !(json && name == "content-type"))
        .map(|(name, value)| (name.clone(), String::from_utf8_lossy(value).into_owned()))
        .collect();
    if json {
        kept.push(("content-type".into(), "application/json".into()));
    }
    kept
}

/// A `:status` value; 0 when absent or garbled.
pub(crate) fn parse_status(value: Option<&[u8]>) -> u16 {
    value.and_then(|s| std::str::from_utf8(s).ok()?.parse::<u16>().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn failures_are_read_from_envoy_details_and_call_bodies() {
        assert_eq!(routed_failure(500, "via_upstream"), Some(Failure::Status(500)));
        assert_eq!(routed_failure(504, "upstream_per_try_timeout"), Some(Failure::Timeout));
        assert_eq!(
            routed_failure(503, "upstream_reset_before_response_started{connection_failure}"),
            Some(Failure::Unreachable)
        );
        assert_eq!(routed_failure(503, "overload_manager"), None);
        assert_eq!(call_failure(0, b""), Some(Failure::Unreachable));
        assert_eq!(call_failure(504, b"upstream request timeout"), Some(Failure::Timeout));
        assert_eq!(call_failure(504, b"{\"error\": 1}"), Some(Failure::Status(504)));
        assert_eq!(call_failure(503, b"no healthy upstream"), Some(Failure::Unreachable));
        assert_eq!(call_failure(201, b""), None);
        assert_eq!(call_failure(429, b""), Some(Failure::Status(429)));
        // Three digits that are no HTTP status: a broken provider, as a 502 would say.
        assert_eq!(call_failure(999, b"{}"), Some(Failure::Status(502)));
        assert_eq!(call_failure(42, b""), Some(Failure::Status(502)));
    }

    #[test]
    fn local_answers_keep_provider_headers_but_not_framing() {
        let headers = vec![
            (":status".to_string(), b"200".to_vec()),
            ("content-length".to_string(), b"10".to_vec()),
            ("content-type".to_string(), b"text/plain".to_vec()),
            ("x-request-id".to_string(), b"abc".to_vec()),
            ("x-gateway-provider".to_string(), b"forged".to_vec()),
        ];
        assert_eq!(
            provider_headers(&headers, true),
            vec![("x-request-id".into(), "abc".into()), ("content-type".into(), "application/json".into())]
        );
        assert_eq!(
            provider_headers(&headers, false),
            vec![("content-type".into(), "text/plain".into()), ("x-request-id".into(), "abc".into())]
        );
    }

    #[test]
    fn statuses_parse_or_read_as_zero() {
        assert_eq!(parse_status(Some(b"204")), 204);
        assert_eq!(parse_status(Some(b"2x4")), 0);
        assert_eq!(parse_status(None), 0);
    }
}
