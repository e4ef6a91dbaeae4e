//! The request record: what one request did, filled in by the exchange as it goes and
//! written by the host adapter as the access log line when the request ends.

use crate::providers::Usage;
use crate::request::headers::TraceFields;
use std::fmt;

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) trace_id: String,
    pub(crate) trace: TraceFields,
    pub(crate) method: String,
    pub(crate) path: String,
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
    /// Each hook's and guardrail's id and verdict (and feedback value), e.g. `in:pii=false/-1`.
    pub(crate) hooks: String,
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
        if !self.hooks.is_empty() {
            write!(f, " hooks={:?}", self.hooks)?;
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
        record.usage = Some(Usage { prompt_tokens: 3, completion_tokens: 5 });
        assert!(record.to_string().ends_with(r#"cache="-" prompt_tokens=3 completion_tokens=5"#));
        record.error_code = Some("request_timeout");
        assert!(record.to_string().ends_with(r#"cache="-" error=request_timeout prompt_tokens=3 completion_tokens=5"#));
    }
}
