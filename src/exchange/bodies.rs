//! Request and response bodies for the shipped record (`records.bodies`, off by default): what
//! the client sent and what it received, each kept up to `records.max_body_bytes` as it goes
//! by (never more is held, and nothing waits for it). They go to the control plane only,
//! never to the access log.

/// One body, its first `cap` bytes.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Capture {
    bytes: Vec<u8>,
    cap: usize,
    /// More went by than was kept.
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture { bytes: Vec::new(), cap, truncated: false }
    }

    /// How many more bytes are kept.
    pub(crate) fn room(&self) -> usize {
        self.cap.saturating_sub(self.bytes.len())
    }

    /// Keeps what fits of `chunk`.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.push_prefix(chunk, chunk.len());
    }

    /// Keeps what fits of `prefix`, the start of a chunk of `size` bytes (the rest was not read).
    pub(crate) fn push_prefix(&mut self, prefix: &[u8], size: usize) {
        let kept = prefix.len().min(self.room());
        self.truncated |= size > kept;
        self.bytes.extend_from_slice(prefix.get(..kept).unwrap_or_default());
    }

    /// The body as text of at most `limit` bytes (cut at a UTF-8 boundary; bytes that are not
    /// UTF-8 become U+FFFD) and whether it is cut.
    pub(crate) fn text(&self, limit: usize) -> (String, bool) {
        let mut end = self.bytes.len().min(limit);
        let cut = self.truncated || end < self.bytes.len();
        if cut {
            // A character split by the cut is left out rather than replaced.
            if let Err(error) = std::str::from_utf8(self.bytes.get(..end).unwrap_or_default()) {
                if error.error_len().is_none() {
                    end = error.valid_up_to();
                }
            }
        }
        (String::from_utf8_lossy(self.bytes.get(..end).unwrap_or_default()).into_owned(), cut)
    }
}

/// A request's two bodies.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Bodies {
    pub(crate) request: Capture,
    pub(crate) response: Capture,
}

impl Bodies {
    pub(crate) fn new(cap: usize) -> Bodies {
        Bodies { request: Capture::new(cap), response: Capture::new(cap) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn a_body_is_kept_up_to_its_cap_and_cut_at_a_character_boundary() {
        let mut body = Capture::new(8);
        body.push(b"abc");
        body.push(b"de");
        assert_eq!((body.room(), body.text(usize::MAX)), (3, ("abcde".to_string(), false)));
        body.push("fgé!".as_bytes());
        assert_eq!(body.room(), 0);
        assert_eq!(body.text(usize::MAX), ("abcdefg".to_string(), true), "é split by the cap is left out");
        assert_eq!(body.text(2), ("ab".to_string(), true));

        let mut unread = Capture::new(4);
        unread.push_prefix(b"ab", 2);
        assert_eq!(unread.text(usize::MAX), ("ab".to_string(), false));
        unread.push_prefix(b"", 10);
        assert_eq!(unread.text(usize::MAX), ("ab".to_string(), true), "a chunk not read is a cut");

        let mut binary = Capture::new(16);
        binary.push(&[0x66, 0xff, 0x67]);
        assert_eq!(binary.text(usize::MAX), ("f\u{fffd}g".to_string(), false));
    }
}
