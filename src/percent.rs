//! Percent-encoding (RFC 3986) by the `percent-encoding` crate, for every place that reads or
//! writes it: resource paths and queries, Azure's `api-version`, AWS's signed paths and queries.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986's unreserved characters `A-Z a-z 0-9 - . _ ~`.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `text` with everything but unreserved characters percent-encoded, upper-case hex (as AWS
/// signs paths and queries, and as a query value is safe anywhere).
pub(crate) fn encode(text: &str) -> String {
    utf8_percent_encode(text, NOT_UNRESERVED).to_string()
}

/// `text` percent-decoded (`+` as a space when `plus` is set, as in a query); `None` when a `%`
/// is not followed by two hex digits.
pub(crate) fn decode(text: &str, plus: bool) -> Option<Vec<u8>> {
    let well_formed = text
        .split('%')
        .skip(1)
        .all(|after| after.as_bytes().get(..2).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)));
    if !well_formed {
        return None;
    }
    let bytes =
        if plus { percent_decode_str(&text.replace('+', " ")).collect() } else { percent_decode_str(text).collect() };
    Some(bytes)
}

/// `text` percent-decoded where it can be (a malformed escape stays as it is), read as UTF-8
/// lossily: how AWS reads a query it signs.
pub(crate) fn decode_lenient(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn unreserved_characters_stay_and_the_rest_is_encoded_in_upper_case() {
        assert_eq!(encode("aZ09-._~"), "aZ09-._~");
        assert_eq!(encode("a b/c:d%é+"), "a%20b%2Fc%3Ad%25%C3%A9%2B");
    }

    #[test]
    fn strict_decoding_refuses_a_broken_escape() {
        assert_eq!(decode("a%2Fb%20c", false).as_deref(), Some(&b"a/b c"[..]));
        assert_eq!(decode("a+b%2B", true).as_deref(), Some(&b"a b+"[..]));
        assert_eq!(decode("a+b", false).as_deref(), Some(&b"a+b"[..]));
        for broken in ["%", "a%2", "%zz", "%+5", "%%20"] {
            assert_eq!(decode(broken, false), None, "{broken}");
        }
    }

    #[test]
    fn lenient_decoding_keeps_a_broken_escape() {
        assert_eq!(decode_lenient("%7e x%zz%4"), "~ x%zz%4");
        assert_eq!(decode_lenient("%C3%A9%FF"), "é\u{FFFD}");
    }
}
