//! Limits checked on the raw request body before it is parsed.

use crate::errors::GatewayError;
use crate::json_check::{lexemes, Lexeme};

/// Most JSON values a request body may hold. serde_json's `Value` tree costs far more than
/// the text it comes from: a 19 MiB body of `[],[],...` parses into ~20x its size, and wasm
/// linear memory never shrinks, so one such request would keep ~400 MB in the worker for
/// good. Real chat bodies hold far fewer values: long texts and base64 images are single
/// strings.
pub(crate) const MAX_JSON_VALUES: usize = 500_000;

/// Rejects a body with more than `max_values` JSON values, in one pass over its bytes and
/// without parsing it. Each `[`, `{` and `,` outside strings starts a value, plus the first
/// one; this is exact except that an empty `[]` or `{}` counts one extra. Invalid JSON is
/// left for the parser to reject.
pub(crate) fn check_json_size(body: &[u8], max_values: usize) -> Result<(), GatewayError> {
    let mut values: usize = 1;
    for lexeme in lexemes(body) {
        if !matches!(lexeme, Lexeme::Byte(b'[' | b'{' | b',')) {
            continue;
        }
        values += 1;
        // Stop at the limit: the rest of a huge body need not be read.
        if values > max_values {
            return Err(GatewayError::invalid_param(
                "body",
                format!(
                    "the request body has more than {max_values} JSON values; \
                     send long content as single strings or split the request"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    /// The count `check_json_size` makes: the smallest limit the body passes.
    fn count(body: &[u8]) -> usize {
        (1..=body.len() + 1).find(|&max| check_json_size(body, max).is_ok()).unwrap()
    }

    #[test]
    fn counts_values_outside_strings() {
        assert_eq!(count(b""), 1);
        assert_eq!(count(b"7"), 1);
        assert_eq!(count(b"[1,2,3]"), 4);
        assert_eq!(count(br#"{"a":1,"b":[true,null]}"#), 5);
        assert_eq!(count(b"[]"), 2);
        // Commas, brackets and escaped quotes inside strings do not count.
        assert_eq!(count(br#"{"text":"a, b, [c], {d}"}"#), 2);
        assert_eq!(count(br#"["say \"hi, there\"", "x\\", ","]"#), 4);
        assert_eq!(count(br#"["\\\"[,]"]"#), 2);
    }

    #[test]
    fn limit_is_inclusive() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(count(body), 5);
        assert!(check_json_size(body, 5).is_ok());
        let e = check_json_size(body, 4).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("body")));
        assert!(e.message.starts_with("the request body has more than 4 JSON values;"), "{}", e.message);
        assert!(check_json_size(body, MAX_JSON_VALUES).is_ok());
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed: u32 = 7;
        for len in [0, 1, 2, 100, 5000] {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) as u8
                })
                .collect();
            let _ = check_json_size(&bytes, 10);
            let _ = check_json_size(&bytes, 0);
        }
        // An unterminated string or a trailing backslash is not an error here.
        assert!(check_json_size(b"[\"abc\\", 2).is_ok());
    }

    #[test]
    fn huge_body_of_empty_arrays_is_rejected() {
        let mut body = b"[".to_vec();
        while body.len() < 19 * 1024 * 1024 {
            body.extend_from_slice(b"[],");
        }
        body.extend_from_slice(b"[]]");
        assert_eq!(check_json_size(&body, MAX_JSON_VALUES).unwrap_err().status, 400);
    }
}
