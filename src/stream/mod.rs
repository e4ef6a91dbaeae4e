//! Incremental stream parsers.

pub(crate) mod sse;

/// One event of a provider's stream, whatever framed it (server-sent events today; the
/// AWS event stream's messages decode to the same), so converters do not depend on the
/// transport.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    /// The event's type (SSE `event:`); None when absent or empty (SSE's default "message").
    pub(crate) event: Option<String>,
    /// The payload (SSE `data:` lines joined with `\n`).
    pub(crate) data: String,
}

/// Whether a provider's answer is a stream its translator reads as it comes, by the content
/// type: server-sent events, or AWS's binary event stream (Bedrock's `converse-stream`).
pub(crate) fn is_stream(content_type: &[u8]) -> bool {
    content_type.starts_with(b"text/event-stream") || content_type.starts_with(b"application/vnd.amazon.eventstream")
}

/// The content type the client gets for a translated stream, which is always OpenAI's
/// server-sent events: `None` keeps the provider's when it is already SSE (its parameters,
/// e.g. a charset, as sent).
pub(crate) fn client_content_type(provider: Option<&[u8]>) -> Option<&'static str> {
    match provider {
        Some(content_type) if content_type.starts_with(b"text/event-stream") => None,
        _ => Some("text/event-stream"),
    }
}

/// One provider's stream events in, OpenAI's `chat.completion.chunk`s out.
pub(crate) trait Converter {
    /// The provider's name, for the errors the gateway itself puts in the stream.
    fn provider(&self) -> &'static str;
    fn on_event(&mut self, event: &Event, out: &mut Vec<u8>);
    /// The client stream is over; nothing more is sent.
    fn is_done(&self) -> bool;
    /// Marks the client stream over without sending anything.
    fn close(&mut self);
    /// Ends the client stream (`data: [DONE]`); nothing more is sent.
    fn end(&mut self, out: &mut Vec<u8>) {
        sse::write_data(out, b"[DONE]");
        self.close();
    }
    /// The provider's own error event: OpenAI's in-stream error chunk ends the client stream,
    /// without `[DONE]` (which says the answer is whole), as a stream cut short ends.
    fn end_with_error(&mut self, message: &str, kind: &str, out: &mut Vec<u8>) {
        write_error(out, message, kind);
        self.close();
    }
    /// The upstream stream ended: a converter whose provider's stream was complete ends the
    /// client stream (if it is not over yet); an unfinished one is left to [`sse::SseStream`],
    /// which reports it cut short.
    fn finish(&mut self, _out: &mut Vec<u8>) {}
}

/// OpenAI's in-stream error chunk.
pub(crate) fn write_error(out: &mut Vec<u8>, message: &str, kind: &str) {
    sse::write_data(out, &crate::errors::error_json(message, kind, None, None));
}

/// Why a provider's stream that ended before its last event is an error.
pub(crate) fn cut_short(provider: &str) -> String {
    format!("provider '{provider}' ended the stream before it was complete")
}

/// Helpers for the tests of every module that reads or writes streams.
#[cfg(test)]
pub(crate) mod testing {
    use serde_json::{json, Value};

    /// The `data:` payloads of an OpenAI SSE body, JSON-parsed (`[DONE]` as a string).
    pub(crate) fn payloads(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        assert!(text.ends_with("\n\n"), "{text}");
        text.split_terminator("\n\n")
            .map(|event| {
                let data = event.strip_prefix("data: ").unwrap();
                if data == "[DONE]" {
                    json!("[DONE]")
                } else {
                    serde_json::from_str(data).unwrap()
                }
            })
            .collect()
    }

    /// `len` pseudo-random bytes, the same on every run.
    pub(crate) fn garbage(len: usize) -> Vec<u8> {
        let mut seed: u32 = 12345;
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (seed >> 16) as u8
            })
            .collect()
    }
}
