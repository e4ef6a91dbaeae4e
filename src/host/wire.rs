//! The proxy-wasm ABI's byte formats, as pure Rust (no host calls), so they are tested natively
//! and inside wasm.
//!
//! A header map is: a little-endian `u32` count, then per pair a `u32` name length and a `u32`
//! value length, then per pair the name bytes, a NUL, the value bytes, a NUL. A property path is
//! its segments joined with NUL.
//!
//! Parsing checks every length against the input: a truncated or lying serialisation is an
//! error, never a panic or an out-of-bounds read.

use std::fmt;

/// Why a serialisation could not be made or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The input ends before what its lengths announce.
    Truncated,
    /// A name or value is not followed by the NUL the format puts after it.
    MissingNul,
    /// A header name is not UTF-8.
    NameNotUtf8,
    /// A count or length does not fit the format's `u32`.
    TooLong,
    /// A property path segment contains a NUL, which would split it into two segments.
    NulInPath,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "header map shorter than its lengths say",
            WireError::MissingNul => "header map entry not NUL-terminated",
            WireError::NameNotUtf8 => "header name is not UTF-8",
            WireError::TooLong => "header map count or length exceeds u32",
            WireError::NulInPath => "property path segment contains NUL",
        })
    }
}

/// Serialises header pairs in the ABI's map format.
pub(crate) fn serialize_map(pairs: &[(&str, &[u8])]) -> Result<Vec<u8>, WireError> {
    let count = u32::try_from(pairs.len()).map_err(|_| WireError::TooLong)?;
    // The exact size, computed with checked arithmetic so that an impossible size is an error
    // rather than an overflow or a capacity panic.
    let size = pairs.iter().try_fold(4usize, |size, (name, value)| {
        size.checked_add(name.len())?.checked_add(value.len())?.checked_add(10)
    });
    let size = size.filter(|size| isize::try_from(*size).is_ok()).ok_or(WireError::TooLong)?;
    let mut bytes = Vec::with_capacity(size);
    bytes.extend_from_slice(&count.to_le_bytes());
    for (name, value) in pairs {
        let name_len = u32::try_from(name.len()).map_err(|_| WireError::TooLong)?;
        let value_len = u32::try_from(value.len()).map_err(|_| WireError::TooLong)?;
        bytes.extend_from_slice(&name_len.to_le_bytes());
        bytes.extend_from_slice(&value_len.to_le_bytes());
    }
    for (name, value) in pairs {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value);
        bytes.push(0);
    }
    Ok(bytes)
}

/// Reads a map in the ABI's format. Empty input is an empty map (the host answers an empty map
/// with no bytes at all). Bytes after the last pair are ignored.
pub(crate) fn parse_map(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, WireError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut header = Reader { bytes, at: 0 };
    let count = usize::try_from(header.u32()?).map_err(|_| WireError::TooLong)?;
    // The lengths table must be there in full before anything is allocated for it.
    let table = count.checked_mul(8).ok_or(WireError::Truncated)?;
    let data_start = table.checked_add(4).ok_or(WireError::Truncated)?;
    if data_start > bytes.len() {
        return Err(WireError::Truncated);
    }
    let mut data = Reader { bytes, at: data_start };
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        let name_len = usize::try_from(header.u32()?).map_err(|_| WireError::TooLong)?;
        let value_len = usize::try_from(header.u32()?).map_err(|_| WireError::TooLong)?;
        let name = data.terminated(name_len)?;
        let value = data.terminated(value_len)?;
        let name = std::str::from_utf8(name).map_err(|_| WireError::NameNotUtf8)?;
        pairs.push((name.to_owned(), value.to_vec()));
    }
    Ok(pairs)
}

/// Serialises a property path (`["request", "path"]` becomes `request\0path`).
pub(crate) fn serialize_path(path: &[&str]) -> Result<Vec<u8>, WireError> {
    if path.iter().any(|segment| segment.as_bytes().contains(&0)) {
        return Err(WireError::NulInPath);
    }
    Ok(path.join("\0").into_bytes())
}

/// A cursor over the input; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(len).ok_or(WireError::Truncated)?;
        let taken = self.bytes.get(self.at..end).ok_or(WireError::Truncated)?;
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let raw: [u8; 4] = self.take(4)?.try_into().map_err(|_| WireError::Truncated)?;
        Ok(u32::from_le_bytes(raw))
    }

    /// `len` bytes followed by a NUL, which is consumed but not returned.
    fn terminated(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        let taken = self.take(len)?;
        match self.take(1)? {
            [0] => Ok(taken),
            _ => Err(WireError::MissingNul),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    // The SDK's own fixture (proxy-wasm 0.2.5, hostcalls::utils::tests::SERIALIZED_MAP).
    const PAIRS: &[(&str, &[u8])] =
        &[(":method", b"GET"), (":path", b"/bytes/1"), (":authority", b"httpbin.org"), ("Powered-By", b"proxy-wasm")];
    #[rustfmt::skip]
    const SERIALIZED: &[u8] = &[
        4, 0, 0, 0,
        7, 0, 0, 0, 3, 0, 0, 0,
        5, 0, 0, 0, 8, 0, 0, 0,
        10, 0, 0, 0, 11, 0, 0, 0,
        10, 0, 0, 0, 10, 0, 0, 0,
        b':', b'm', b'e', b't', b'h', b'o', b'd', 0,
        b'G', b'E', b'T', 0,
        b':', b'p', b'a', b't', b'h', 0,
        b'/', b'b', b'y', b't', b'e', b's', b'/', b'1', 0,
        b':', b'a', b'u', b't', b'h', b'o', b'r', b'i', b't', b'y', 0,
        b'h', b't', b't', b'p', b'b', b'i', b'n', b'.', b'o', b'r', b'g', 0,
        b'P', b'o', b'w', b'e', b'r', b'e', b'd', b'-', b'B', b'y', 0,
        b'p', b'r', b'o', b'x', b'y', b'-', b'w', b'a', b's', b'm', 0,
    ];

    fn owned(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect()
    }

    #[test]
    fn serializes_like_the_sdk() {
        assert_eq!(serialize_map(PAIRS).unwrap(), SERIALIZED);
        assert_eq!(serialize_map(&[]).unwrap(), [0, 0, 0, 0]);
    }

    #[test]
    fn parses_the_sdk_fixture() {
        assert_eq!(parse_map(SERIALIZED).unwrap(), owned(PAIRS));
    }

    #[test]
    fn round_trips_binary_values_and_empty_strings() {
        let pairs: &[(&str, &[u8])] =
            &[("", b""), ("x-bin", &[0, 255, 0x80, 0]), ("x-empty", b""), ("ünïcode", "välue".as_bytes())];
        let bytes = serialize_map(pairs).unwrap();
        assert_eq!(parse_map(&bytes).unwrap(), owned(pairs));
    }

    #[test]
    fn empty_input_is_an_empty_map() {
        assert_eq!(parse_map(&[]).unwrap(), vec![]);
        assert_eq!(parse_map(&[0, 0, 0, 0]).unwrap(), vec![]);
    }

    #[test]
    fn every_truncation_is_an_error() {
        for len in 1..SERIALIZED.len() {
            assert!(parse_map(&SERIALIZED[..len]).is_err(), "prefix of {len} bytes parsed");
        }
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        let mut bytes = SERIALIZED.to_vec();
        bytes.extend_from_slice(b"junk");
        assert_eq!(parse_map(&bytes).unwrap(), owned(PAIRS));
    }

    #[test]
    fn lying_lengths_are_errors() {
        // A count far beyond the input: no allocation for it, no read past the end.
        assert_eq!(parse_map(&[0xff, 0xff, 0xff, 0xff]), Err(WireError::Truncated));
        assert_eq!(parse_map(&[0xff, 0xff, 0xff, 0x1f, 0, 0, 0, 0]), Err(WireError::Truncated));
        // One pair whose name length runs past the end.
        assert_eq!(parse_map(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, b'a', 0, 0]), Err(WireError::Truncated));
        // A value length one short: the byte where the NUL should be is not one.
        assert_eq!(
            parse_map(&[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, b'a', 0, b'b', b'c', 0]),
            Err(WireError::MissingNul)
        );
        // A count one larger than the pairs there are.
        let mut bytes = SERIALIZED.to_vec();
        bytes[0] = 5;
        assert!(parse_map(&bytes).is_err());
        // Fewer than four bytes of count.
        assert_eq!(parse_map(&[1, 0]), Err(WireError::Truncated));
    }

    #[test]
    fn every_corrupted_byte_is_handled() {
        // Whatever single byte is changed, parsing returns without panicking.
        for at in 0..SERIALIZED.len() {
            for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bytes = SERIALIZED.to_vec();
                bytes[at] = value;
                let _ = parse_map(&bytes);
            }
        }
    }

    #[test]
    fn non_utf8_names_are_errors() {
        let bytes = [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0, b'v', 0];
        assert_eq!(parse_map(&bytes), Err(WireError::NameNotUtf8));
    }

    #[test]
    fn paths_join_with_nul() {
        assert_eq!(serialize_path(&["request", "path"]).unwrap(), b"request\0path");
        assert_eq!(serialize_path(&["plugin_name"]).unwrap(), b"plugin_name");
        assert_eq!(serialize_path(&[]).unwrap(), b"");
        assert_eq!(serialize_path(&["a", "b\0c"]), Err(WireError::NulInPath));
    }
}
