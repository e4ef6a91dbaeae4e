//! Verdicts added to an answer that flows to the client chunk by chunk, never held whole:
//! `hook_results` spliced into a JSON object answer as its first key, and one SSE event put
//! just before a stream's `data: [DONE]`. Chunks may end anywhere (a chunk may be empty, or
//! hold one byte of `{` or of `[DONE]`), so each keeps the little state it needs between
//! chunks. Both give an [`Edit`]: what the host does with a chunk it passes on.

use crate::stream::sse;

/// Replace the chunk's first `replaced` bytes with `with` (a prefix replacement is what a
/// proxy-wasm host can do to a body chunk besides replacing it whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edit {
    pub(crate) replaced: usize,
    pub(crate) with: Vec<u8>,
}

fn first_content(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| !b.is_ascii_whitespace())
}

/// Puts `"hook_results":{...}` right after the opening `{` of a JSON object answer. The
/// answer grows by exactly `added_len` bytes whatever it holds (whitespace makes up the
/// difference when no `,` is needed, or when it is no object), so its length stays known.
#[derive(Debug)]
pub(crate) struct ObjectSplice {
    /// `"hook_results":{...}`.
    member: Vec<u8>,
    state: Splice,
    added: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Splice {
    /// The `{` has not arrived yet.
    Open,
    /// The member is in; a `,` goes before the object's next member, if it has one.
    Separate,
    Done,
}

impl ObjectSplice {
    /// `hook_results`: their JSON.
    pub(crate) fn new(hook_results: &[u8]) -> ObjectSplice {
        let mut member = b"\"hook_results\":".to_vec();
        member.extend_from_slice(hook_results);
        ObjectSplice { member, state: Splice::Open, added: 0 }
    }

    /// How many bytes the answer grows by.
    pub(crate) fn added_len(&self) -> usize {
        self.member.len() + 1
    }

    /// The edit of the answer's next chunk (`end`: its last), if it needs one. An answer that
    /// is not a JSON object passes unchanged but for trailing whitespace.
    pub(crate) fn push(&mut self, chunk: &[u8], end: bool) -> Option<Edit> {
        let edit = self.splice(chunk);
        if let Some(edit) = &edit {
            self.added += edit.with.len() - edit.replaced;
        }
        let missing = self.added_len().saturating_sub(self.added);
        if !end || missing == 0 {
            return edit;
        }
        self.added += missing;
        let mut with = match edit {
            Some(Edit { replaced, with }) => [with.as_slice(), chunk.get(replaced..).unwrap_or_default()].concat(),
            None => chunk.to_vec(),
        };
        with.resize(with.len() + missing, b' ');
        Some(Edit { replaced: chunk.len(), with })
    }

    fn splice(&mut self, chunk: &[u8]) -> Option<Edit> {
        let at = first_content(chunk)?;
        match self.state {
            Splice::Done => None,
            Splice::Open => {
                if chunk.get(at) != Some(&b'{') {
                    self.state = Splice::Done;
                    return None;
                }
                let opened = at + 1;
                let mut with = chunk.get(..opened)?.to_vec();
                with.extend_from_slice(&self.member);
                let next = chunk.get(opened..).and_then(first_content).and_then(|i| chunk.get(opened + i));
                self.state = match next {
                    None => Splice::Separate,
                    Some(next) => {
                        with.push(if *next == b'}' { b' ' } else { b',' });
                        Splice::Done
                    }
                };
                Some(Edit { replaced: opened, with })
            }
            Splice::Separate => {
                self.state = Splice::Done;
                let mut with = chunk.get(..at)?.to_vec();
                with.push(if chunk.get(at) == Some(&b'}') { b' ' } else { b',' });
                Some(Edit { replaced: at, with })
            }
        }
    }
}

/// How a stream's end is written, with or without the space after `data:`.
const DONE_LINES: [&[u8]; 2] = [b"data: [DONE]", b"data:[DONE]"];

/// Puts one event just before a stream's `data: [DONE]` (at the stream's end when it has
/// none). The bytes at the end of a chunk that may be the start of that line are held back
/// until the next chunk tells.
#[derive(Debug)]
pub(crate) struct BeforeDone {
    held: Vec<u8>,
    /// The next byte starts a line.
    line_start: bool,
    placed: bool,
}

impl Default for BeforeDone {
    fn default() -> Self {
        BeforeDone { held: Vec::new(), line_start: true, placed: false }
    }
}

impl BeforeDone {
    /// The edit of the stream's next chunk (`end`: the last), if it needs one; `event` gives
    /// the event's JSON payload when its place is found (it is asked at most once).
    pub(crate) fn push(&mut self, chunk: &[u8], end: bool, event: &mut dyn FnMut() -> Vec<u8>) -> Option<Edit> {
        if self.placed {
            return None;
        }
        let had_held = !self.held.is_empty();
        let mut bytes = std::mem::take(&mut self.held);
        bytes.extend_from_slice(chunk);
        let (done_at, keep) = self.scan(&bytes);
        let at = match done_at {
            Some(at) => Some(at),
            None if end => Some(bytes.len()),
            None => None,
        };
        let with = match at {
            Some(at) => {
                self.placed = true;
                let (before, after) = bytes.split_at(at.min(bytes.len()));
                let mut with = before.to_vec();
                sse::write_data(&mut with, &event());
                with.extend_from_slice(after);
                with
            }
            None => {
                let (now, later) = bytes.split_at(keep.min(bytes.len()));
                // Held bytes always start a line.
                self.line_start = !later.is_empty() || ends_line(now, self.line_start);
                if !had_held && later.is_empty() {
                    return None;
                }
                self.held = later.to_vec();
                now.to_vec()
            }
        };
        Some(Edit { replaced: chunk.len(), with })
    }

    /// Where `data: [DONE]` starts in `bytes`, if it does; else how many bytes can go now
    /// (the rest may be its start).
    fn scan(&self, bytes: &[u8]) -> (Option<usize>, usize) {
        let breaks = bytes.iter().enumerate().filter(|(_, b)| matches!(b, b'\n' | b'\r')).map(|(i, _)| i + 1);
        let starts = self.line_start.then_some(0).into_iter().chain(breaks);
        let mut last = None;
        for start in starts {
            let rest = bytes.get(start..).unwrap_or_default();
            if DONE_LINES.iter().any(|line| rest.starts_with(line)) {
                return (Some(start), start);
            }
            last = Some(start);
        }
        let keep = match last {
            Some(start) => {
                let rest = bytes.get(start..).unwrap_or_default();
                if DONE_LINES.iter().any(|line| line.starts_with(rest)) {
                    start
                } else {
                    bytes.len()
                }
            }
            None => bytes.len(),
        };
        (None, keep)
    }
}

/// Whether the byte after `bytes` starts a line (`line_start`: whether `bytes` itself did).
fn ends_line(bytes: &[u8], line_start: bool) -> bool {
    match bytes.last() {
        Some(last) => matches!(last, b'\n' | b'\r'),
        None => line_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::{json, Value};

    fn apply(chunk: &[u8], edit: Option<Edit>) -> Vec<u8> {
        match edit {
            Some(Edit { replaced, with }) => [with.as_slice(), &chunk[replaced..]].concat(),
            None => chunk.to_vec(),
        }
    }

    fn spliced(chunks: &[&[u8]]) -> Vec<u8> {
        let mut splice = ObjectSplice::new(br#"{"before_request_hooks":[],"after_request_hooks":[]}"#);
        let last = chunks.len().saturating_sub(1);
        let out: Vec<u8> =
            chunks.iter().enumerate().flat_map(|(i, chunk)| apply(chunk, splice.push(chunk, i == last))).collect();
        let original: usize = chunks.iter().map(|chunk| chunk.len()).sum();
        assert_eq!(out.len(), original + splice.added_len(), "the announced length");
        out
    }

    /// Every way of cutting `body` into chunks of 1 to 3 bytes, and an empty chunk first.
    fn cuttings(body: &[u8]) -> Vec<Vec<&[u8]>> {
        let mut all = vec![vec![&body[..0], body]];
        for size in 1..=3 {
            all.extend(Some(body.chunks(size).collect::<Vec<_>>()).filter(|chunks| !chunks.is_empty()));
        }
        for at in 0..=body.len() {
            all.push(vec![&body[..at], &body[at..]]);
        }
        all
    }

    #[test]
    fn hook_results_become_the_first_key_however_the_object_is_cut() {
        for body in [&b"{\"id\":\"x\",\"choices\":[]}"[..], b"  \n{ \"id\" : 1 }", b"{}", b"{ \n }"] {
            let original: Value = serde_json::from_slice(body).unwrap();
            for chunks in cuttings(body) {
                let out = spliced(&chunks);
                let text = String::from_utf8_lossy(&out).into_owned();
                let value: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{text}: {e}"));
                let mut expected = original.as_object().unwrap().clone();
                expected.insert("hook_results".into(), json!({"before_request_hooks": [], "after_request_hooks": []}));
                assert_eq!(value, Value::Object(expected), "{chunks:?}");
                assert!(text.trim_start().starts_with("{\"hook_results\""), "{text}");
            }
        }
    }

    #[test]
    fn an_answer_that_is_not_an_object_passes_unchanged_but_for_trailing_whitespace() {
        for body in [&b"[1,2]"[..], b"not json", b""] {
            for chunks in cuttings(body) {
                let out = spliced(&chunks);
                assert_eq!(out.trim_ascii_end(), body);
            }
        }
    }

    fn placed(chunks: &[&[u8]]) -> (Vec<u8>, usize) {
        let mut before_done = BeforeDone::default();
        let mut asked = 0;
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let edit = before_done.push(chunk, i + 1 == chunks.len(), &mut || {
                asked += 1;
                b"{\"hook\":1}".to_vec()
            });
            out.extend(apply(chunk, edit));
        }
        (out, asked)
    }

    #[test]
    fn the_event_goes_just_before_done_however_the_stream_is_cut() {
        let streams: [(&[u8], &[u8]); 3] = [
            (b"data: {\"a\":1}\n\ndata: [DONE]\n\n", b"data: {\"a\":1}\n\ndata: {\"hook\":1}\n\ndata: [DONE]\n\n"),
            (
                b"data:{\"a\":\"data: [DONE]\"}\r\n\r\ndata:[DONE]\r\n\r\n",
                b"data:{\"a\":\"data: [DONE]\"}\r\n\r\ndata: {\"hook\":1}\n\ndata:[DONE]\r\n\r\n",
            ),
            (b"data: [DONE]\n\n", b"data: {\"hook\":1}\n\ndata: [DONE]\n\n"),
        ];
        for (stream, expected) in streams {
            for mut chunks in cuttings(stream) {
                // The last chunk ends the stream: an empty one after it too.
                chunks.push(b"");
                let (out, asked) = placed(&chunks);
                assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(expected), "{chunks:?}");
                assert_eq!(asked, 1);
            }
        }
    }

    #[test]
    fn a_stream_without_done_gets_the_event_at_its_end() {
        for chunks in cuttings(b"data: {\"a\":1}\n\n") {
            let (out, asked) = placed(&chunks);
            assert_eq!(out, b"data: {\"a\":1}\n\ndata: {\"hook\":1}\n\n");
            assert_eq!(asked, 1);
        }
    }
}
