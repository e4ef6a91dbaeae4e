//! The request record: what one request did, filled in by the exchange as it goes. When the
//! request ends it becomes its metrics, the filter's log line (`Display`) and the access-log
//! JSON object (`to_json`).

use super::bodies::Bodies;
use crate::guardrails::spec::Feedback;
use crate::guardrails::verdict::{feedback_object, ItemResult};
use crate::providers::Usage;
use crate::request::endpoint::ClientApi;
use crate::request::headers::TraceFields;
use crate::routing::attempts::Move;
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt::{self, Write};

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) trace_id: String,
    pub(crate) trace: TraceFields,
    pub(crate) method: String,
    pub(crate) path: String,
    /// The API the client spoke.
    pub(crate) client_api: ClientApi,
    /// The provider that answered; empty when none was chosen.
    pub(crate) provider: &'static str,
    /// Where the answering target sits in the config (empty for the root).
    pub(crate) target: String,
    pub(crate) retries: u32,
    pub(crate) status: u16,
    /// The cache status the client saw; empty when the cache has no part.
    pub(crate) cache: &'static str,
    /// Token counts, when a translated answer told them.
    pub(crate) usage: Option<Usage>,
    /// The code of the gateway's own error answer (e.g. `invalid_api_key`, `request_timeout`).
    pub(crate) error_code: Option<&'static str>,
    /// Each hook's and guardrail's result, by stage (moved from the guard, not copied: the
    /// log line, the access log and the verdict metrics read them).
    pub(crate) guardrails: Vec<(HookStage, ItemResult)>,
    /// The model the answering attempt asked for (empty when the request names none).
    pub(crate) model: String,
    /// The client's `x-gateway-metadata`.
    pub(crate) metadata: Option<Map<String, Value>>,
    /// The client asked for a stream.
    pub(crate) stream: bool,
    /// Host clock (ms) when the request arrived, and when the first byte of a streamed
    /// answer went to the client.
    pub(crate) start_ms: u64,
    pub(crate) first_byte_ms: Option<u64>,
    /// Filled in when the request ends.
    pub(crate) duration_ms: u64,
    pub(crate) time_to_first_token_ms: Option<u64>,
    /// Retries and fallbacks, with the provider of the target that failed.
    pub(crate) moves: Vec<(&'static str, Move)>,
    /// The bytes of the answer the cache stored.
    pub(crate) cache_stored: Option<u64>,
    /// The caller's workspace (with a control plane; empty otherwise).
    pub(crate) workspace: String,
    /// The id of the caller's gateway key (none for the plugin configuration's keys).
    pub(crate) api_key_id: Option<String>,
    /// What the answer cost, in micro-USD: its usage at the model's price (none without
    /// either).
    pub(crate) cost_micro_usd: Option<u64>,
    /// The request and response bodies, for the shipped record only (`records.bodies`).
    pub(crate) bodies: Option<Box<Bodies>>,
    /// A request to an MCP server: which, what it asked and how it ended.
    pub(crate) mcp: Option<Box<crate::mcp::Facts>>,
}

/// When a hook or guardrail ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookStage {
    Before,
    After,
    Async,
}

impl HookStage {
    /// Its name in the access log and request logs.
    fn as_str(self) -> &'static str {
        match self {
            HookStage::Before => "before",
            HookStage::After => "after",
            HookStage::Async => "async",
        }
    }

    /// Its name in the log line.
    fn short(self) -> &'static str {
        match self {
            HookStage::Before => "in",
            HookStage::After => "out",
            HookStage::Async => "async",
        }
    }
}

impl Record {
    /// Each item's id and verdict (and its feedback's value), for the log line:
    /// `in:id=true out:id=false/-1 async:id=true`.
    pub(crate) fn hooks(&self) -> String {
        let parts = self.guardrails.iter().map(|(stage, result)| {
            let value = result.feedback.as_ref().and_then(|f| f.value).map(|v| format!("/{v}")).unwrap_or_default();
            format!("{}:{}={}{value}", stage.short(), result.id, result.verdict)
        });
        parts.collect::<Vec<_>>().join(" ")
    }

    /// Every check that ran (hooks and guardrails, all stages): its id and whether it passed.
    pub(crate) fn check_verdicts(&self) -> impl Iterator<Item = (&str, bool)> {
        let checks = self.guardrails.iter().flat_map(|(_, result)| &result.checks);
        checks.map(|check| (check.id.as_str(), check.verdict))
    }

    /// Bytes the client sent, for the shipped record (with `records.bodies`).
    pub(crate) fn client_sent(&mut self, bytes: &[u8]) {
        if let Some(bodies) = &mut self.bodies {
            bodies.request.push(bytes);
        }
    }

    /// Bytes the client receives, for the shipped record (with `records.bodies`).
    pub(crate) fn client_received(&mut self, bytes: &[u8]) {
        if let Some(bodies) = &mut self.bodies {
            bodies.response.push(bytes);
        }
    }

    /// The request's end at `now_ms`: its duration and, for a stream that succeeded, its time
    /// to first token (an error's body is no token).
    pub(crate) fn end(&mut self, now_ms: u64) {
        self.duration_ms = now_ms.saturating_sub(self.start_ms);
        let succeeded = (200..300).contains(&self.status);
        let first = self.first_byte_ms.filter(|_| self.stream && succeeded);
        self.time_to_first_token_ms = first.map(|first| first.saturating_sub(self.start_ms));
    }

    /// The access-log line: one JSON object of what the request did. Never a key, a prompt or
    /// an answer; the path without its query.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let count = |step: Move| self.moves.iter().filter(|(_, s)| *s == step).count();
        let reached = !self.provider.is_empty();
        let line = AccessLine {
            trace_id: &self.trace_id,
            span_id: text(&self.trace.span_id),
            parent_span_id: text(&self.trace.parent_span_id),
            span_name: text(&self.trace.span_name),
            metadata: self.metadata.as_ref(),
            method: &self.method,
            path: self.path.split('?').next().unwrap_or_default(),
            client_api: match &self.mcp {
                Some(_) => Some("mcp"),
                None => (self.client_api != ClientApi::Chat).then(|| self.client_api.name()),
            },
            provider: text(self.provider),
            model: text(&self.model),
            target: reached.then_some(self.target.as_str()),
            attempts: if reached { self.moves.len() + 1 } else { 0 },
            retries: count(Move::Retry),
            fallbacks: count(Move::Fallback),
            cache_status: text(self.cache),
            status: self.status,
            stream: self.stream,
            prompt_tokens: self.usage.map(|u| u.prompt_tokens),
            completion_tokens: self.usage.map(|u| u.completion_tokens),
            cost_usd: self.cost_micro_usd.map(crate::usage_limits::usd),
            duration_ms: self.duration_ms,
            time_to_first_token_ms: self.time_to_first_token_ms,
            error_code: self.error_code,
            workspace: text(&self.workspace),
            api_key_id: self.api_key_id.as_deref(),
            guardrails: Guardrails(&self.guardrails),
            // None for a request the aggregate endpoint answered itself.
            mcp_server: self.mcp.as_deref().map(|facts| facts.server.as_str()).filter(|server| !server.is_empty()),
            mcp_method: self.mcp.as_deref().and_then(|facts| facts.method.as_deref()),
            mcp_tool: self.mcp.as_deref().and_then(|facts| facts.tool.as_deref()),
            is_error: self.mcp.as_deref().map(|facts| facts.outcome == crate::mcp::Outcome::ToolError),
        };
        serde_json::to_vec(&line).unwrap_or_default()
    }
}

/// What the shipped record adds to the access-log line.
#[derive(Serialize)]
pub(crate) struct Shipped<'a> {
    /// Unix time (ms) the request arrived (the host clock is the wall clock).
    pub(crate) timestamp_ms: u64,
    /// Made once per record (128 random bits as hex), so a batch sent again is stored once;
    /// None when the host gave no randomness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) record_id: Option<&'a str>,
    /// With `records.bodies`: what the client sent and received, and whether each was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_body: Option<&'a str>,
    #[serde(skip_serializing_if = "is_false")]
    request_body_truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_body: Option<&'a str>,
    #[serde(skip_serializing_if = "is_false")]
    response_body_truncated: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

impl Shipped<'_> {
    pub(crate) fn new(timestamp_ms: u64, record_id: Option<&str>) -> Shipped<'_> {
        Shipped {
            timestamp_ms,
            record_id,
            request_body: None,
            request_body_truncated: false,
            response_body: None,
            response_body_truncated: false,
        }
    }
}

/// The shipped record of `line` with `extra` and the request's `bodies`: the bodies are cut
/// further (by halves) while the record would be over `max_bytes`, so a record is never lost
/// for its bodies.
pub(crate) fn shipped_with_bodies(
    line: &[u8],
    extra: &Shipped,
    bodies: Option<&Bodies>,
    max_bytes: usize,
) -> Option<Vec<u8>> {
    let Some(bodies) = bodies else {
        return shipped(line, extra);
    };
    let mut limit = usize::MAX;
    loop {
        let (request, request_cut) = bodies.request.text(limit);
        let (response, response_cut) = bodies.response.text(limit);
        let with_bodies = Shipped {
            request_body: Some(&request),
            request_body_truncated: request_cut,
            response_body: Some(&response),
            response_body_truncated: response_cut,
            ..*extra
        };
        let record = shipped(line, &with_bodies)?;
        if record.len() <= max_bytes || limit == 0 {
            return Some(record);
        }
        limit = request.len().max(response.len()) / 2;
    }
}

/// The object shipped to the control plane: access-log `line` with the fields of `extra`
/// spliced in rather than serialised again; None when the line is not an object.
pub(crate) fn shipped(line: &[u8], extra: &Shipped) -> Option<Vec<u8>> {
    let (b'}', head) = line.split_last()? else {
        return None;
    };
    let extra = serde_json::to_vec(extra).ok()?;
    let (b'{', fields) = extra.split_first()? else {
        return None;
    };
    let mut shipped = Vec::with_capacity(line.len().saturating_add(extra.len()));
    shipped.extend_from_slice(head);
    if head.len() > 1 {
        shipped.push(b',');
    }
    shipped.extend_from_slice(fields);
    Some(shipped)
}

/// A record id: the time in ms (12 hex digits) then 64 random bits, so ids follow time and the
/// control plane's index of them grows at its end rather than at a random page per record;
/// None when the random part is 0 (the host's randomness failed: ids that repeat would make
/// the control plane drop records as sent twice).
pub(crate) fn record_id(now_ms: u64, random: u64) -> Option<String> {
    (random != 0).then(|| {
        let mut id = String::with_capacity(28);
        let _ = write!(id, "{now_ms:012x}{random:016x}");
        id
    })
}

/// An empty text as `null`.
fn text(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}

/// The access-log object, serialised straight from the record's fields.
#[derive(Serialize)]
struct AccessLine<'a> {
    trace_id: &'a str,
    span_id: Option<&'a str>,
    parent_span_id: Option<&'a str>,
    span_name: Option<&'a str>,
    metadata: Option<&'a Map<String, Value>>,
    method: &'a str,
    path: &'a str,
    /// Named for the client APIs besides chat (`messages`, `responses`).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_api: Option<&'static str>,
    provider: Option<&'a str>,
    model: Option<&'a str>,
    target: Option<&'a str>,
    attempts: usize,
    retries: usize,
    fallbacks: usize,
    cache_status: Option<&'a str>,
    status: u16,
    stream: bool,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    /// US dollars: the usage at the model's price.
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_usd: Option<f64>,
    duration_ms: u64,
    time_to_first_token_ms: Option<u64>,
    error_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_id: Option<&'a str>,
    /// Present when hooks or guardrails ran.
    #[serde(skip_serializing_if = "Guardrails::is_empty")]
    guardrails: Guardrails<'a>,
    /// An MCP request's (`client_api` is `mcp`): the server, the JSON-RPC method and tool its
    /// message named, and whether a tool's result was an error (`isError`).
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp_server: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp_method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp_tool: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
}

/// Each item in the access log and request logs: its stage, id, verdict and feedback (no check
/// data, which may quote the request), serialised from the results as they are.
struct Guardrails<'a>(&'a [(HookStage, ItemResult)]);

impl Guardrails<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Guardrails<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// Keys in the order a JSON object of them always had (sorted).
        #[derive(Serialize)]
        struct Entry<'a> {
            #[serde(serialize_with = "feedback")]
            feedback: &'a Option<Feedback>,
            id: &'a str,
            stage: &'static str,
            verdict: bool,
        }
        fn feedback<S: serde::Serializer>(feedback: &&Option<Feedback>, serializer: S) -> Result<S::Ok, S::Error> {
            feedback_object(feedback, serializer)
        }
        serializer.collect_seq(self.0.iter().map(|(stage, result)| Entry {
            feedback: &result.feedback,
            id: &result.id,
            stage: stage.as_str(),
            verdict: result.verdict,
        }))
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Client-given values are quoted ({:?}) so they cannot forge fields of the line.
        write!(
            f,
            "trace_id={:?} span_id={:?} parent_span_id={:?} span_name={:?} method={:?} path={:?} provider={} \
             target={:?} retries={} status={} cache={:?}",
            self.trace_id,
            self.trace.span_id,
            self.trace.parent_span_id,
            self.trace.span_name,
            self.method,
            self.path,
            if self.provider.is_empty() { "-" } else { self.provider },
            self.target,
            self.retries,
            self.status,
            if self.cache.is_empty() { "-" } else { self.cache },
        )?;
        if let Some(code) = self.error_code {
            write!(f, " error={code}")?;
        }
        if !self.guardrails.is_empty() {
            write!(f, " hooks={:?}", self.hooks())?;
        }
        match self.usage {
            Some(usage) => {
                write!(f, " prompt_tokens={} completion_tokens={}", usage.prompt_tokens, usage.completion_tokens)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn the_log_line_quotes_client_values_and_adds_usage_when_known() {
        let mut record = Record {
            trace_id: "t\" status=1".into(),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            provider: "anthropic",
            status: 200,
            ..Record::default()
        };
        assert_eq!(
            record.to_string(),
            r#"trace_id="t\" status=1" span_id="" parent_span_id="" span_name="" method="POST" path="/v1/chat/completions" provider=anthropic target="" retries=0 status=200 cache="-""#
        );
        record.usage = Some(Usage { prompt_tokens: 3, completion_tokens: 5, ..Default::default() });
        assert!(record.to_string().ends_with(r#"cache="-" prompt_tokens=3 completion_tokens=5"#));
        record.error_code = Some("request_timeout");
        assert!(record.to_string().ends_with(r#"cache="-" error=request_timeout prompt_tokens=3 completion_tokens=5"#));
    }

    #[test]
    fn bodies_go_only_to_the_shipped_record_and_are_cut_to_keep_it_under_the_bound() {
        let mut bodies = Bodies::new(100);
        bodies.request.push(br#"{"messages":"hi \"you\" and more"}"#);
        bodies.response.push(&[b'x'; 150]);
        let record = Record { trace_id: "t".into(), bodies: Some(Box::new(bodies.clone())), ..Record::default() };
        let line = record.to_json();
        assert!(!String::from_utf8_lossy(&line).contains("body"), "never in the access log");
        let extra = Shipped::new(1, None);
        let shipped: Value =
            serde_json::from_slice(&shipped_with_bodies(&line, &extra, Some(&bodies), 64 << 10).unwrap()).unwrap();
        assert_eq!(shipped["request_body"], json!(r#"{"messages":"hi \"you\" and more"}"#));
        assert_eq!(shipped.get("request_body_truncated"), None);
        assert_eq!(
            (shipped["response_body"].as_str().unwrap().len(), &shipped["response_body_truncated"]),
            (100, &json!(true))
        );
        let without: Value =
            serde_json::from_slice(&shipped_with_bodies(&line, &extra, None, 64 << 10).unwrap()).unwrap();
        assert_eq!((without.get("request_body"), without.get("response_body")), (None, None));

        // Over the bound: both bodies are cut by halves until the record fits.
        let full = shipped_with_bodies(&line, &extra, Some(&bodies), usize::MAX).unwrap();
        let small = shipped_with_bodies(&line, &extra, Some(&bodies), full.len() - 50).unwrap();
        let small: Value = serde_json::from_slice(&small).unwrap();
        assert_eq!((small["response_body"].as_str().unwrap().len(), small.get("request_body_truncated")), (50, None));
        let smaller = shipped_with_bodies(&line, &extra, Some(&bodies), full.len() - 51).unwrap();
        let smaller: Value = serde_json::from_slice(&smaller).unwrap();
        assert_eq!(
            (smaller["response_body"].as_str().unwrap().len(), &smaller["request_body_truncated"]),
            (25, &json!(true))
        );
        let tiny: Value =
            serde_json::from_slice(&shipped_with_bodies(&line, &extra, Some(&bodies), 10).unwrap()).unwrap();
        assert_eq!((&tiny["request_body"], &tiny["response_body"]), (&json!(""), &json!("")), "the record stays");
    }

    #[test]
    fn the_access_log_object_has_every_field() {
        let mut record = Record {
            trace_id: "t-1".into(),
            method: "POST".into(),
            path: "/v1/chat/completions?api-version=1".into(),
            provider: "openai",
            model: "gpt-4o".into(),
            status: 200,
            cache: "MISS",
            stream: true,
            start_ms: 1000,
            first_byte_ms: Some(1040),
            moves: vec![("openai", Move::Retry), ("openai", Move::Fallback)],
            usage: Some(Usage { prompt_tokens: 3, completion_tokens: 5, ..Default::default() }),
            ..Record::default()
        };
        record.trace.span_id = "s".into();
        record.end(1100);
        let line: Value = serde_json::from_slice(&record.to_json()).unwrap();
        assert_eq!(
            line,
            json!({"trace_id": "t-1", "span_id": "s", "parent_span_id": null, "span_name": null, "metadata": null,
                   "method": "POST", "path": "/v1/chat/completions", "provider": "openai", "model": "gpt-4o",
                   "target": "", "attempts": 3, "retries": 1, "fallbacks": 1, "cache_status": "MISS", "status": 200,
                   "stream": true, "prompt_tokens": 3, "completion_tokens": 5, "duration_ms": 100,
                   "time_to_first_token_ms": 40, "error_code": null})
        );
        assert!(line.get("timestamp_ms").is_none(), "the access log has no timestamp (Envoy's own has)");
        let extra = Shipped::new(record.start_ms, Some("ab"));
        let shipped: Value = serde_json::from_slice(&shipped(&record.to_json(), &extra).unwrap()).unwrap();
        assert_eq!((&shipped["timestamp_ms"], &shipped["record_id"]), (&json!(1000), &json!("ab")));
        let bare = Shipped::new(7, None);
        assert_eq!(super::shipped(b"{}", &bare).as_deref(), Some(&br#"{"timestamp_ms":7}"#[..]));
        assert_eq!(super::shipped(b"", &bare), None, "a line that failed to serialise is not shipped");
        assert_eq!(record_id(0x19ac, 1).as_deref(), Some("0000000019ac0000000000000001"));
        assert!(record_id(1, u64::MAX) < record_id(2, 1), "ids follow time");
        assert_eq!(record_id(0x19ac, 0), None);
        let refused = Record { status: 401, error_code: Some("invalid_api_key"), ..Record::default() };
        let line: Value = serde_json::from_slice(&refused.to_json()).unwrap();
        assert_eq!((line["attempts"].clone(), line["provider"].clone()), (json!(0), Value::Null));
    }
}
