//! Token usage of an answer that passes untouched (OpenAI-shaped JSON or server-sent events),
//! read as its chunks pass: each `"usage": {...}` object is parsed where it stands; the body
//! is never collected (at most one unfinished usage object, or a split key, is kept).

use crate::providers::Usage;
use serde_json::Value;

const KEY: &[u8] = b"\"usage\"";
/// A usage object is a few hundred bytes; an unfinished one longer than this is dropped.
const MAX_OBJECT: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct UsageScan {
    /// The bytes still needed from earlier chunks: a key split at a chunk's end, or a usage
    /// value that has not ended yet (from its key on).
    pending: Vec<u8>,
    usage: Option<Usage>,
}

impl UsageScan {
    /// The usage of a whole body.
    pub(crate) fn of(body: &[u8]) -> Option<Usage> {
        let mut scan = UsageScan::default();
        scan.push(body);
        scan.usage
    }

    /// The usage seen so far: each count the largest any usage object gave (an Anthropic
    /// stream tells its input tokens first, its output tokens last).
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.usage
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.pending.is_empty() {
            self.scan(chunk);
        } else {
            let mut joined = std::mem::take(&mut self.pending);
            joined.extend_from_slice(chunk);
            self.scan(&joined);
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while let Some(found) = find(bytes.get(at..).unwrap_or_default(), KEY) {
            let key = at + found;
            let after = key + KEY.len();
            match value_after(bytes.get(after..).unwrap_or_default()) {
                Parsed::Value(value, used) => {
                    if let Some(usage) = Usage::of_openai(&value) {
                        self.usage = Some(self.usage.map_or(usage, |seen| seen.merged(usage)));
                    }
                    at = after + used;
                }
                Parsed::Unfinished => {
                    let rest = bytes.get(key..).unwrap_or_default();
                    if rest.len() <= MAX_OBJECT {
                        self.pending = rest.to_vec();
                    }
                    return;
                }
                Parsed::NotAValue => at = after,
            }
        }
        // The end may be the start of a key the next chunk completes.
        let keep = bytes.len().saturating_sub(KEY.len() - 1).max(at);
        self.pending = bytes.get(keep..).unwrap_or_default().to_vec();
    }
}

enum Parsed {
    /// The value and the bytes it took (from just after the key).
    Value(Value, usize),
    Unfinished,
    NotAValue,
}

/// The JSON value after a key: `: <value>`, with any whitespace.
fn value_after(bytes: &[u8]) -> Parsed {
    let space = |b: &u8| b.is_ascii_whitespace();
    let colon = bytes.iter().position(|b| !space(b));
    let Some(colon) = colon else { return Parsed::Unfinished };
    if bytes.get(colon) != Some(&b':') {
        return Parsed::NotAValue;
    }
    let start = colon + 1;
    let rest = bytes.get(start..).unwrap_or_default();
    if rest.iter().all(space) {
        return Parsed::Unfinished;
    }
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Parsed::Value(value, start + values.byte_offset()),
        Some(Err(error)) if error.is_eof() => Parsed::Unfinished,
        _ => Parsed::NotAValue,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn usage(prompt_tokens: u64, completion_tokens: u64) -> Option<Usage> {
        Some(Usage { prompt_tokens, cached_prompt_tokens: 0, cache_write_prompt_tokens: 0, completion_tokens })
    }

    fn cached(usage: Option<Usage>, cached_prompt_tokens: u64) -> Option<Usage> {
        usage.map(|usage| Usage { cached_prompt_tokens, ..usage })
    }

    #[test]
    fn a_json_answer_gives_its_usage() {
        let body = br#"{"id":"c","choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\": 99}"}}],
            "usage" : {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 0}}}"#;
        assert_eq!(UsageScan::of(body), usage(12, 3));
        assert_eq!(UsageScan::of(br#"{"object":"list","usage":{"prompt_tokens":4,"total_tokens":4}}"#), usage(4, 0));
        assert_eq!(UsageScan::of(br#"{"usage":null}"#), None);
        assert_eq!(UsageScan::of(br#"{"role":"usage","x":1}"#), None);
        assert_eq!(UsageScan::of(b"not json \"usage\": {\"prompt_tokens\": 1"), None);
    }

    #[test]
    fn every_split_of_a_stream_gives_the_same_usage() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        )
        .as_bytes();
        for size in 1..stream.len() {
            let mut scan = UsageScan::default();
            for chunk in stream.chunks(size) {
                scan.push(chunk);
            }
            assert_eq!(scan.usage(), usage(7, 2), "chunks of {size} bytes");
            assert!(scan.pending.len() <= KEY.len(), "nothing of the stream is kept");
        }
    }

    #[test]
    fn an_anthropic_stream_gives_input_then_output_tokens() {
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
        );
        assert_eq!(UsageScan::of(stream.as_bytes()), usage(25, 15));
        // Cache reads and writes are prompt tokens, as on the chat path, each counted apart too.
        let read = br#"{"type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1830,"output_tokens":11}}"#;
        let written = cached(usage(1942, 11), 1830).map(|usage| Usage { cache_write_prompt_tokens: 100, ..usage });
        assert_eq!(UsageScan::of(read), written);
    }

    #[test]
    fn an_unfinished_usage_object_is_bounded() {
        let mut scan = UsageScan::default();
        scan.push(b"{\"usage\": {\"prompt_tokens\": [");
        scan.push(&b"1,".repeat(MAX_OBJECT / 2));
        assert!(scan.pending.is_empty(), "dropped past the bound");
        assert_eq!(scan.usage(), None);
    }
}
