//! Incremental server-sent events parser (WHATWG HTML "event stream interpretation").
//!
//! Upstream chunks may end anywhere: mid-line, between `\r` and `\n`, or inside a UTF-8
//! sequence. The parser therefore buffers raw bytes and decodes only complete lines.

/// Largest line or event `data` the parser buffers. Real events are small (Anthropic sends
/// deltas), but an upstream that never ends a line would otherwise grow the buffer until the
/// worker runs out of memory, and wasm linear memory never shrinks.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

use super::{Converter, Event};

/// Writes one `data:` event (the form of every OpenAI stream chunk).
pub(crate) fn write_data(out: &mut Vec<u8>, payload: &[u8]) {
    // An event's data is its lines joined by `\n` (as the parser joins them): each goes back
    // as a `data:` line of its own, or its second half would be no event's.
    for line in payload.split(|byte| *byte == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
}

#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous line ended with `\r`: a `\n` right after it belongs to that terminator.
    after_cr: bool,
    /// A line has been completed (only the first may start with a byte order mark).
    started: bool,
    event: Option<String>,
    /// None until the event has a `data:` line; events without one are not dispatched.
    data: Option<String>,
    /// A line or an event exceeded `MAX_EVENT_BYTES`; all further input is dropped.
    overflowed: bool,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        SseParser::default()
    }

    /// Feeds one chunk and returns the events it completed. Check `overflowed` afterwards:
    /// the events returned came before the overflow.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        for &byte in chunk {
            if self.overflowed {
                break;
            }
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            if byte == b'\n' || byte == b'\r' {
                self.after_cr = byte == b'\r';
                self.end_line(&mut events);
            } else if self.line.len() < MAX_EVENT_BYTES {
                self.line.push(byte);
            } else {
                self.overflow();
            }
        }
        events
    }

    /// The stream ended: dispatches a last event that lacked its terminating blank line.
    /// An overflow stays visible afterwards.
    pub(crate) fn finish(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.dispatch(&mut events);
        *self = SseParser { overflowed: self.overflowed, ..SseParser::new() };
        events
    }

    /// True once a line or an event's data exceeded `MAX_EVENT_BYTES`; from then on the
    /// parser returns no events.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Frees the buffers so the oversized event is never dispatched.
    fn overflow(&mut self) {
        self.overflowed = true;
        self.line = Vec::new();
        self.event = None;
        self.data = None;
    }

    fn end_line(&mut self, events: &mut Vec<Event>) {
        let bytes = std::mem::take(&mut self.line);
        let decoded = String::from_utf8_lossy(&bytes);
        let mut line: &str = &decoded;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        if line.starts_with(':') {
            return; // comment
        }
        // A line without a colon is a field name with an empty value.
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {} // `id`, `retry` and unknown fields do not matter to a proxy
        }
        // Each line is bounded, but an event may have any number of them.
        if self.data.as_ref().is_some_and(|data| data.len() > MAX_EVENT_BYTES) {
            self.overflow();
        }
    }

    fn dispatch(&mut self, events: &mut Vec<Event>) {
        let event = self.event.take().filter(|e| !e.is_empty());
        if let Some(data) = self.data.take() {
            events.push(Event { event, data });
        }
    }
}

/// A provider's server-sent event stream through its [`Converter`]: the framing, the end of
/// the stream and the bound on event size are the same for every provider.
pub(crate) struct SseStream<C> {
    parser: SseParser,
    events: C,
}

impl<C: Converter> SseStream<C> {
    pub(crate) fn new(events: C) -> Self {
        SseStream { parser: SseParser::new(), events }
    }

    /// Consumes one upstream chunk (which may end anywhere, even mid-event).
    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        // After the end nothing is sent, so nothing needs parsing or buffering.
        if self.events.is_done() {
            return;
        }
        for event in self.parser.push(chunk) {
            self.events.on_event(&event, out);
        }
        self.end_if_overflowed(out);
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        if self.events.is_done() {
            return;
        }
        for event in self.parser.finish() {
            self.events.on_event(&event, out);
        }
        self.end_if_overflowed(out);
        self.events.finish(out);
        // Cut short: the error and no `[DONE]`, so no client (the `openai` SDK raises) takes
        // it for a complete answer.
        if !self.events.is_done() {
            super::write_error(out, &super::cut_short(self.events.provider()), "api_error");
            self.events.close();
        }
    }

    pub(crate) fn converter(&self) -> &C {
        &self.events
    }

    fn end_if_overflowed(&mut self, out: &mut Vec<u8>) {
        if self.parser.overflowed() && !self.events.is_done() {
            let message = format!(
                "provider '{}' sent a stream event larger than {MAX_EVENT_BYTES} bytes",
                self.events.provider()
            );
            self.events.end_with_error(&message, "api_error", out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn ev(event: Option<&str>, data: &str) -> Event {
        Event { event: event.map(str::to_string), data: data.to_string() }
    }

    fn parse_whole(input: &[u8]) -> Vec<Event> {
        let mut p = SseParser::new();
        let mut events = p.push(input);
        events.extend(p.finish());
        events
    }

    fn parse_split(input: &[u8], at: usize) -> Vec<Event> {
        let (a, b) = input.split_at(at);
        let mut p = SseParser::new();
        let mut events = p.push(a);
        events.extend(p.push(b));
        events.extend(p.finish());
        events
    }

    fn parse_bytewise(input: &[u8]) -> Vec<Event> {
        let mut p = SseParser::new();
        let mut events = Vec::new();
        for b in input {
            events.extend(p.push(std::slice::from_ref(b)));
        }
        events.extend(p.finish());
        events
    }

    const STREAM: &str = "\u{feff}: keep-alive comment\r\n\
        event: message_start\r\n\
        data: {\"a\":1}\r\n\
        \r\n\
        id: 7\n\
        retry: 100\n\
        data:first\n\
        data:  two spaces\n\
        data\n\
        \n\
        event: only-event\n\
        \n\
        data: h\u{e9}llo \u{1f600} w\u{f6}rld\r\
        \r\
        event: delta\r\n\
        data: last";

    fn expected() -> Vec<Event> {
        vec![
            ev(Some("message_start"), "{\"a\":1}"),
            ev(None, "first\n two spaces\n"),
            ev(None, "h\u{e9}llo \u{1f600} w\u{f6}rld"),
            ev(Some("delta"), "last"),
        ]
    }

    #[test]
    fn parses_whole_stream() {
        assert_eq!(parse_whole(STREAM.as_bytes()), expected());
    }

    #[test]
    fn identical_at_every_split_offset() {
        let input = STREAM.as_bytes();
        for at in 0..=input.len() {
            assert_eq!(parse_split(input, at), expected(), "split at {at}");
        }
    }

    #[test]
    fn identical_byte_by_byte() {
        assert_eq!(parse_bytewise(STREAM.as_bytes()), expected());
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"data: a\r"), vec![]);
        // The `\n` completes the `\r\n` of the data line; only the next `\r\n` is blank.
        assert_eq!(p.push(b"\n"), vec![]);
        assert_eq!(p.push(b"data: b\r"), vec![]);
        // A lone `\r` already ends the blank line; the `\n` after it is not a second one.
        assert_eq!(p.push(b"\n\r"), vec![ev(None, "a\nb")]);
        assert_eq!(p.push(b"\ndata: c\r\n\r\n"), vec![ev(None, "c")]);
        assert_eq!(p.finish(), vec![]);
    }

    #[test]
    fn lone_cr_ends_lines() {
        assert_eq!(parse_whole(b"data: a\rdata: b\r\r"), vec![ev(None, "a\nb")]);
    }

    #[test]
    fn comments_are_ignored() {
        assert_eq!(parse_whole(b": ping\n\n:another\ndata: x\n\n"), vec![ev(None, "x")]);
    }

    #[test]
    fn multi_line_data_is_joined() {
        assert_eq!(parse_whole(b"data: a\ndata: b\ndata: c\n\n"), vec![ev(None, "a\nb\nc")]);
    }

    #[test]
    fn empty_data_line_dispatches_empty_data() {
        assert_eq!(parse_whole(b"data:\n\n"), vec![ev(None, "")]);
    }

    #[test]
    fn event_type_resets_after_dispatch() {
        let got = parse_whole(b"event: a\ndata: 1\n\ndata: 2\n\nevent: b\n\ndata: 3\n\n");
        assert_eq!(got, vec![ev(Some("a"), "1"), ev(None, "2"), ev(None, "3")]);
    }

    #[test]
    fn finish_flushes_unterminated_event() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"event: e\ndata: x\n"), vec![]);
        assert_eq!(p.finish(), vec![ev(Some("e"), "x")]);
        // Nothing is left afterwards.
        assert_eq!(p.finish(), vec![]);
    }

    #[test]
    fn finish_flushes_partial_last_line() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"data: par"), vec![]);
        assert_eq!(p.finish(), vec![ev(None, "par")]);
    }

    #[test]
    fn finish_without_data_dispatches_nothing() {
        let mut p = SseParser::new();
        p.push(b"event: e\n: comment");
        assert_eq!(p.finish(), vec![]);
    }

    #[test]
    fn utf8_split_inside_a_character() {
        let input = "data: \u{1f600}\n\n".as_bytes();
        let mut p = SseParser::new();
        assert_eq!(p.push(&input[..8]), vec![]);
        assert_eq!(p.push(&input[8..]), vec![ev(None, "\u{1f600}")]);
    }

    #[test]
    fn invalid_utf8_is_decoded_lossily() {
        assert_eq!(parse_whole(b"data: a\xffb\n\n"), vec![ev(None, "a\u{fffd}b")]);
    }

    #[test]
    fn overlong_line_overflows_and_input_is_dropped() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"data: a\n\ndata: "), vec![ev(None, "a")]);
        assert!(!p.overflowed());
        // A line of exactly the limit is still buffered.
        assert_eq!(p.push(&vec![b'x'; MAX_EVENT_BYTES - 6]), vec![]);
        assert!(!p.overflowed());
        // One byte more overflows; the events completed before it are still returned.
        let mut p = SseParser::new();
        let mut chunk = b"data: b\n\n".to_vec();
        chunk.resize(chunk.len() + MAX_EVENT_BYTES + 1, b'y');
        assert_eq!(p.push(&chunk), vec![ev(None, "b")]);
        assert!(p.overflowed());
        assert_eq!(p.push(b"\n\ndata: c\n\n"), vec![]);
        assert_eq!(p.finish(), vec![]);
        assert!(p.overflowed());
    }

    #[test]
    fn overlong_event_of_many_lines_overflows() {
        // Two lines of half the limit make an event just over it (with the joining `\n`).
        let half = "h".repeat(MAX_EVENT_BYTES / 2);
        let mut p = SseParser::new();
        assert_eq!(p.push(format!("data: {half}\n").as_bytes()), vec![]);
        assert!(!p.overflowed());
        assert_eq!(p.push(format!("data: {half}\n\n").as_bytes()), vec![]);
        assert!(p.overflowed());
        // The last, unterminated line may also overflow the event in `finish`.
        let mut p = SseParser::new();
        p.push(format!("data: {half}\ndata: {half}").as_bytes());
        assert!(!p.overflowed());
        assert_eq!(p.finish(), vec![]);
        assert!(p.overflowed());
    }

    #[test]
    fn garbage_does_not_panic() {
        let bytes = crate::stream::testing::garbage(4096);
        let whole = parse_whole(&bytes);
        assert_eq!(parse_bytewise(&bytes), whole);
    }
}
