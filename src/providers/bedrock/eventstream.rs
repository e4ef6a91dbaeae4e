//! Incremental decoder of AWS's binary event stream (`application/vnd.amazon.eventstream`),
//! the framing of Bedrock's `converse-stream`. Each message is
//!
//! ```text
//! total length u32 | headers length u32 | prelude CRC32 u32 | headers | payload | message CRC32 u32
//! ```
//!
//! (big-endian; the prelude CRC covers the first 8 bytes, the message CRC everything before
//! it). Upstream chunks end anywhere, so bytes are buffered until a whole frame is there.

use std::fmt;

/// Largest frame accepted. Bedrock's frames are small deltas; the bound keeps a corrupt or
/// hostile length from making the worker buffer without end (wasm memory never shrinks).
pub(crate) const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Total and headers length, then the prelude's CRC.
const PRELUDE_BYTES: usize = 12;
const CRC_BYTES: usize = 4;

/// One decoded message: its string headers and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The headers of string type (`:message-type`, `:event-type`, `:exception-type`,
    /// `:content-type`, ...), in order; headers of other types are skipped.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) payload: Vec<u8>,
}

impl Frame {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// `event`, `exception` or `error`.
    pub(crate) fn message_type(&self) -> Option<&str> {
        self.header(":message-type")
    }

    /// The event's name, e.g. `contentBlockDelta`.
    pub(crate) fn event_type(&self) -> Option<&str> {
        self.header(":event-type")
    }

    /// The exception's name, e.g. `throttlingException`.
    pub(crate) fn exception_type(&self) -> Option<&str> {
        self.header(":exception-type")
    }
}

/// Why the byte stream is not a valid event stream; the decoder reads nothing after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// A declared total length shorter than an empty frame, or a headers length past its end.
    BadLength,
    TooLarge(usize),
    PreludeCrc,
    MessageCrc,
    /// A header cut short, of an unknown type, or with a name or string that is not UTF-8.
    BadHeader,
    /// The stream ended inside a frame.
    Truncated,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            DecodeError::BadLength => write!(f, "an event stream frame has an invalid length"),
            DecodeError::TooLarge(len) => {
                write!(f, "an event stream frame of {len} bytes is larger than {MAX_FRAME_BYTES} bytes")
            }
            DecodeError::PreludeCrc => write!(f, "an event stream frame failed its prelude checksum"),
            DecodeError::MessageCrc => write!(f, "an event stream frame failed its message checksum"),
            DecodeError::BadHeader => write!(f, "an event stream frame has a malformed header"),
            DecodeError::Truncated => write!(f, "the event stream ended inside a frame"),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// Bytes of frames not yet complete.
    buf: Vec<u8>,
    failed: Option<DecodeError>,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Decoder::default()
    }

    /// Feeds one chunk and appends the frames it completed to `frames`. On an error the
    /// frames before it are in `frames`, and the decoder refuses all further input.
    pub(crate) fn push(&mut self, chunk: &[u8], frames: &mut Vec<Frame>) -> Result<(), DecodeError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.buf.extend_from_slice(chunk);
        let mut consumed = 0;
        let result = loop {
            let rest = self.buf.get(consumed..).unwrap_or_default();
            match decode_frame(rest) {
                Ok(Some((frame, len))) => {
                    frames.push(frame);
                    consumed += len;
                }
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        self.buf.drain(..consumed.min(self.buf.len()));
        if let Err(error) = &result {
            self.fail(error.clone());
        }
        result
    }

    /// The stream ended: an error when it ended inside a frame.
    pub(crate) fn finish(&mut self) -> Result<(), DecodeError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if self.buf.is_empty() {
            Ok(())
        } else {
            self.fail(DecodeError::Truncated);
            Err(DecodeError::Truncated)
        }
    }

    fn fail(&mut self, error: DecodeError) {
        self.failed = Some(error);
        self.buf = Vec::new();
    }
}

/// The frame at the start of `bytes` and its length, or None when it is not all there yet.
/// The prelude is checked as soon as it has arrived, so a bad length fails before buffering.
fn decode_frame(bytes: &[u8]) -> Result<Option<(Frame, usize)>, DecodeError> {
    let (Some(total), Some(headers_len), Some(prelude_crc)) = (be_u32(bytes, 0), be_u32(bytes, 4), be_u32(bytes, 8))
    else {
        return Ok(None);
    };
    if crc32fast::hash(bytes.get(..8).unwrap_or_default()) != prelude_crc {
        return Err(DecodeError::PreludeCrc);
    }
    let total = usize::try_from(total).map_err(|_| DecodeError::TooLarge(usize::MAX))?;
    let headers_len = usize::try_from(headers_len).map_err(|_| DecodeError::BadLength)?;
    if total > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge(total));
    }
    let headers_end = PRELUDE_BYTES.checked_add(headers_len).ok_or(DecodeError::BadLength)?;
    let payload_end = total.checked_sub(CRC_BYTES).ok_or(DecodeError::BadLength)?;
    if total < PRELUDE_BYTES + CRC_BYTES || headers_end > payload_end {
        return Err(DecodeError::BadLength);
    }
    let Some(message_crc) = be_u32(bytes, payload_end) else {
        return Ok(None);
    };
    if crc32fast::hash(bytes.get(..payload_end).unwrap_or_default()) != message_crc {
        return Err(DecodeError::MessageCrc);
    }
    let headers = decode_headers(bytes.get(PRELUDE_BYTES..headers_end).unwrap_or_default())?;
    let payload = bytes.get(headers_end..payload_end).unwrap_or_default().to_vec();
    Ok(Some((Frame { headers, payload }, total)))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    bytes.get(at..end)?.try_into().ok().map(u32::from_be_bytes)
}

/// The string headers; the other types are skipped by their sizes.
fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
    let mut headers = Vec::new();
    while let Some((&name_len, rest)) = bytes.split_first() {
        let (name, rest) = take(rest, usize::from(name_len))?;
        let (&kind, rest) = rest.split_first().ok_or(DecodeError::BadHeader)?;
        let (value, rest) = match kind {
            // true, false
            0 | 1 => (None, rest),
            // byte, short, int, long, timestamp, uuid
            2 => (None, take(rest, 1)?.1),
            3 => (None, take(rest, 2)?.1),
            4 => (None, take(rest, 4)?.1),
            5 | 8 => (None, take(rest, 8)?.1),
            9 => (None, take(rest, 16)?.1),
            // byte array and string: u16 length, then the bytes
            6 | 7 => {
                let (len, rest) = take(rest, 2)?;
                let len = len.try_into().map(u16::from_be_bytes).map_err(|_| DecodeError::BadHeader)?;
                let (value, rest) = take(rest, usize::from(len))?;
                ((kind == 7).then_some(value), rest)
            }
            _ => return Err(DecodeError::BadHeader),
        };
        if let Some(value) = value {
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| DecodeError::BadHeader);
            headers.push((text(name)?, text(value)?));
        }
        bytes = rest;
    }
    Ok(headers)
}

fn take(bytes: &[u8], len: usize) -> Result<(&[u8], &[u8]), DecodeError> {
    match (bytes.get(..len), bytes.get(len..)) {
        (Some(head), Some(tail)) => Ok((head, tail)),
        _ => Err(DecodeError::BadHeader),
    }
}

/// A frame with string headers, for the tests of the modules that read event streams.
#[cfg(test)]
pub(crate) fn encode_frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut encoded_headers = Vec::new();
    for (name, value) in headers {
        encoded_headers.push(name.len() as u8);
        encoded_headers.extend_from_slice(name.as_bytes());
        encoded_headers.push(7);
        encoded_headers.extend_from_slice(&(value.len() as u16).to_be_bytes());
        encoded_headers.extend_from_slice(value.as_bytes());
    }
    let total = PRELUDE_BYTES + encoded_headers.len() + payload.len() + CRC_BYTES;
    let mut frame = Vec::with_capacity(total);
    frame.extend_from_slice(&(total as u32).to_be_bytes());
    frame.extend_from_slice(&(encoded_headers.len() as u32).to_be_bytes());
    frame.extend_from_slice(&crc32fast::hash(&frame).to_be_bytes());
    frame.extend_from_slice(&encoded_headers);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(&crc32fast::hash(&frame).to_be_bytes());
    frame
}

/// An event frame as Bedrock sends them.
#[cfg(test)]
pub(crate) fn event_frame(event_type: &str, payload: &str) -> Vec<u8> {
    let headers = [(":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")];
    encode_frame(&headers, payload.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    /// Three frames written with Python's `struct` and `zlib.crc32` (not with our encoder) and
    /// decoded by botocore 1.44.5's `EventStreamBuffer`, which checks both CRCs. The first has
    /// headers of every type (bool true and false, byte, short, int, long, byte array, string,
    /// timestamp, uuid) around the string `:event-type`; the second has no header and an empty
    /// payload; the third is an exception.
    const PYTHON_FRAMES: &str = "0000009800000071a356f2120174000166010162027f02736803fffe016904000000070b3a6576656e742d74797065070011636f6e74656e74426c6f636b44656c7461016c050000010000000000026261060003000102027473080000018bcfe56800017509000102030405060708090a0b0c0d0e0f0173070002c3a97b2264656c7461223a7b2274657874223a224869227d7ddc398a9e000000100000000005c248eb7d98c8ff00000090000000618e91a9b70f3a657863657074696f6e2d747970650700137468726f74746c696e67457863657074696f6e0d3a636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e0d3a6d6573736167652d74797065070009657863657074696f6e7b226d657373616765223a22546f6f206d616e79207265717565737473227de67f8005";

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    fn decode_all(chunks: &[&[u8]]) -> Result<Vec<Frame>, DecodeError> {
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        for chunk in chunks {
            decoder.push(chunk, &mut frames)?;
        }
        decoder.finish()?;
        Ok(frames)
    }

    fn python_frames() -> Vec<Frame> {
        vec![
            Frame {
                headers: vec![(":event-type".into(), "contentBlockDelta".into()), ("s".into(), "é".into())],
                payload: br#"{"delta":{"text":"Hi"}}"#.to_vec(),
            },
            Frame { headers: vec![], payload: vec![] },
            Frame {
                headers: vec![
                    (":exception-type".into(), "throttlingException".into()),
                    (":content-type".into(), "application/json".into()),
                    (":message-type".into(), "exception".into()),
                ],
                payload: br#"{"message":"Too many requests"}"#.to_vec(),
            },
        ]
    }

    #[test]
    fn decodes_frames_written_by_another_implementation() {
        let bytes = unhex(PYTHON_FRAMES);
        let frames = decode_all(&[&bytes]).unwrap();
        assert_eq!(frames, python_frames());
        assert_eq!(frames[0].event_type(), Some("contentBlockDelta"));
        assert_eq!(frames[0].message_type(), None);
        assert_eq!(frames[2].message_type(), Some("exception"));
        assert_eq!(frames[2].exception_type(), Some("throttlingException"));
    }

    #[test]
    fn every_split_gives_the_same_frames() {
        let mut bytes = unhex(PYTHON_FRAMES);
        bytes.extend(event_frame("messageStop", r#"{"stopReason":"end_turn"}"#));
        let whole = decode_all(&[&bytes]).unwrap();
        assert_eq!(whole.len(), 4);
        for i in 0..=bytes.len() {
            let (a, b) = bytes.split_at(i);
            assert_eq!(decode_all(&[a, b]).unwrap(), whole, "split at {i}");
            for j in (i..=bytes.len()).step_by(7) {
                let (b, c) = b.split_at(j - i);
                assert_eq!(decode_all(&[a, b, c]).unwrap(), whole, "split at {i} and {j}");
            }
        }
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(decode_all(&bytewise).unwrap(), whole);
    }

    #[test]
    fn a_bad_message_crc_is_an_error_after_the_good_frames() {
        let good = event_frame("messageStart", r#"{"role":"assistant"}"#);
        let mut bad = event_frame("contentBlockDelta", r#"{"delta":{"text":"Hi"}}"#);
        let at = bad.len() - 6;
        bad[at] ^= 0x20;
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        assert_eq!(decoder.push(&[good, bad].concat(), &mut frames), Err(DecodeError::MessageCrc));
        assert_eq!(frames.len(), 1);
        // Nothing more is read.
        assert_eq!(decoder.push(&event_frame("messageStop", "{}"), &mut frames), Err(DecodeError::MessageCrc));
        assert_eq!(frames.len(), 1);
        assert_eq!(decoder.finish(), Err(DecodeError::MessageCrc));
    }

    #[test]
    fn a_bad_prelude_fails_before_the_frame_arrives() {
        let mut frame = event_frame("messageStart", "{}");
        frame[2] ^= 1;
        let mut frames = Vec::new();
        assert_eq!(Decoder::new().push(&frame[..12], &mut frames), Err(DecodeError::PreludeCrc));
        // Eleven bytes are not a prelude yet.
        assert_eq!(Decoder::new().push(&frame[..11], &mut frames), Ok(()));
    }

    /// A prelude with a valid CRC around the given lengths.
    fn prelude(total: u32, headers_len: u32) -> Vec<u8> {
        let mut bytes = [total.to_be_bytes(), headers_len.to_be_bytes()].concat();
        bytes.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
        bytes
    }

    #[test]
    fn lengths_are_bounded() {
        let mut frames = Vec::new();
        let huge = prelude(MAX_FRAME_BYTES as u32 + 1, 0);
        assert_eq!(Decoder::new().push(&huge, &mut frames), Err(DecodeError::TooLarge(MAX_FRAME_BYTES + 1)));
        assert_eq!(
            Decoder::new().push(&prelude(u32::MAX, 0), &mut frames),
            Err(DecodeError::TooLarge(u32::MAX as usize))
        );
        assert_eq!(Decoder::new().push(&prelude(15, 0), &mut frames), Err(DecodeError::BadLength));
        assert_eq!(Decoder::new().push(&prelude(20, 5), &mut frames), Err(DecodeError::BadLength));
        assert_eq!(Decoder::new().push(&prelude(20, u32::MAX), &mut frames), Err(DecodeError::BadLength));
        assert!(frames.is_empty());
    }

    /// A frame with the given header bytes and a valid CRC.
    fn with_header_bytes(headers: &[u8]) -> Vec<u8> {
        let mut frame = prelude((PRELUDE_BYTES + headers.len() + CRC_BYTES) as u32, headers.len() as u32);
        frame.extend_from_slice(headers);
        frame.extend_from_slice(&crc32fast::hash(&frame).to_be_bytes());
        frame
    }

    #[test]
    fn malformed_headers_are_errors() {
        for headers in [
            &b"\x01a\x0a"[..],            // unknown type 10
            b"\x05ab",                    // name cut short
            b"\x01a",                     // no type
            b"\x01a\x07\x00\x05abc",      // string cut short
            b"\x01a\x04\x00\x00",         // int cut short
            b"\x01a\x07\x00\x02\xff\xfe", // string not UTF-8
            b"\x01\xff\x07\x00\x00",      // name not UTF-8
        ] {
            let mut frames = Vec::new();
            let result = Decoder::new().push(&with_header_bytes(headers), &mut frames);
            assert_eq!(result, Err(DecodeError::BadHeader), "{headers:?}");
        }
        let frames = decode_all(&[&with_header_bytes(b"\x01a\x06\x00\x01z\x01b\x07\x00\x01y")]).unwrap();
        assert_eq!(frames[0].headers, vec![("b".to_string(), "y".to_string())]);
    }

    #[test]
    fn a_stream_ending_inside_a_frame_is_truncated() {
        let frame = event_frame("messageStop", "{}");
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        decoder.push(&frame[..frame.len() - 1], &mut frames).unwrap();
        assert!(frames.is_empty());
        assert_eq!(decoder.finish(), Err(DecodeError::Truncated));
        assert_eq!(DecodeError::Truncated.to_string(), "the event stream ended inside a frame");
    }
}
