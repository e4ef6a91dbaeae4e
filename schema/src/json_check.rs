//! Building blocks shared by the validators of client JSON, chat requests (`request::chat`),
//! configs (`config`) and routing queries (`query`): JSON paths, array items,
//! enumerated strings, and how errors name a value's type and echo client text.
//!
//! Only what they do the same way lives here. Each validator keeps its own rules (chat reads
//! null as absent and rejects `2.0` as an integer, a config does neither), its own wording and
//! its own error type, so these helpers return plain values and leave the error to the caller.

use serde_json::Value;
use std::fmt::Write;

/// Keys and values echoed in errors are cut to this many characters, so a hostile config
/// cannot make the error response as large as itself.
const ECHO_MAX: usize = 64;

/// `s` cut to `ECHO_MAX` characters, for echoing client text in an error.
pub fn shorten(s: &str) -> String {
    match s.char_indices().nth(ECHO_MAX) {
        Some((end, _)) => format!("{}...", s.get(..end).unwrap_or_default()),
        None => s.to_string(),
    }
}

/// The JSON type of `v` as error messages name it ("got a string").
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Path of property `key` inside the value at `parent` ("" is the root).
pub fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Path of item `i` of the array at `path`.
pub fn index(path: &str, i: usize) -> String {
    let mut buffer = String::with_capacity(path.len() + 8);
    rewrite_index(&mut buffer, path, i);
    buffer
}

/// Runs `check` on each item with its path (`messages[3]`), stopping at the first error. The
/// paths are written in turn into one buffer: a long conversation made a new string per message.
pub fn each_item<T, E>(
    items: &[Value],
    path: &str,
    mut check: impl FnMut(&Value, &str) -> Result<T, E>,
) -> Result<Vec<T>, E> {
    let mut item_path = String::with_capacity(path.len() + 8);
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            rewrite_index(&mut item_path, path, i);
            check(item, &item_path)
        })
        .collect()
}

/// `buffer` made the path of item `i` of the array at `path`: the one place the format is
/// written (not generic, so every caller of `each_item` shares one copy of it).
fn rewrite_index(buffer: &mut String, path: &str, i: usize) {
    buffer.clear();
    let _ = write!(buffer, "{path}[{i}]");
}

/// The entry of `allowed` whose `name` is `s`. Otherwise the allowed names, each between
/// `quote`s and joined by ", ", for the caller's "must be one of" message.
pub fn one_of<T: Copy>(s: &str, allowed: &[T], name: fn(T) -> &'static str, quote: &str) -> Result<T, String> {
    allowed.iter().copied().find(|t| name(*t) == s).ok_or_else(|| {
        let names: Vec<String> = allowed.iter().map(|t| format!("{quote}{}{quote}", name(*t))).collect();
        names.join(", ")
    })
}

/// The most arrays and objects serde_json nests: it refuses text nested deeper ("recursion
/// limit exceeded"), which is a limit of the parser, not a fault of the JSON.
pub const MAX_JSON_DEPTH: usize = 127;

/// One step of the way to a value: a property or an array item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// An array or object open at some point of a scan: an object with the byte range of its
/// current key (quotes included), or an array with its current item's index.
enum Open {
    Object { key: Option<(usize, usize)>, expects_key: bool },
    Array { item: usize },
}

impl Open {
    fn step(&self, text: &[u8]) -> Step {
        match self {
            Open::Array { item } => Step::Index(*item),
            Open::Object { key, .. } => {
                let quoted = key.and_then(|(start, end)| text.get(start..end)).unwrap_or_default();
                let lossy = || String::from_utf8_lossy(quoted).into_owned();
                Step::Key(serde_json::from_slice(quoted).unwrap_or_else(|_| lossy()))
            }
        }
    }
}

/// What a scan of JSON text meets: a byte outside strings, or a whole string (its byte range,
/// quotes included).
pub enum Lexeme {
    Byte(u8),
    String { start: usize, end: usize },
}

/// The lexemes of `text`, in one pass over its bytes that never parses or recurses: the
/// checks that must hold before a body is parsed read its structure through this. Invalid
/// JSON gives lexemes that are meaningless but harmless.
pub fn lexemes(text: &[u8]) -> impl Iterator<Item = Lexeme> + '_ {
    let mut string_start = None;
    let mut escaped = false;
    text.iter().enumerate().filter_map(move |(at, &byte)| {
        let Some(start) = string_start else {
            if byte == b'"' {
                string_start = Some(at);
                return None;
            }
            return Some(Lexeme::Byte(byte));
        };
        if escaped {
            escaped = false;
        } else if byte == b'\\' {
            escaped = true;
        } else if byte == b'"' {
            string_start = None;
            return Some(Lexeme::String { start, end: at + 1 });
        }
        None
    })
}

/// The way to the first array or object of `text` nested more than `max_depth` deep (as
/// serde_json counts: the outermost is 1), or `None` when nothing is. One pass over
/// [`lexemes`], so it costs nothing like a parse and cannot recurse; invalid JSON gives a way
/// that is meaningless but harmless.
pub fn beyond_depth(text: &[u8], max_depth: usize) -> Option<Vec<Step>> {
    let mut open: Vec<Open> = Vec::new();
    for lexeme in lexemes(text) {
        match lexeme {
            Lexeme::String { start, end } => {
                if let Some(Open::Object { key, expects_key }) = open.last_mut() {
                    if *expects_key {
                        *key = Some((start, end));
                        *expects_key = false;
                    }
                }
            }
            Lexeme::Byte(byte @ (b'{' | b'[')) => {
                if open.len() == max_depth {
                    return Some(open.iter().map(|o| o.step(text)).collect());
                }
                open.push(if byte == b'{' {
                    Open::Object { key: None, expects_key: true }
                } else {
                    Open::Array { item: 0 }
                });
            }
            Lexeme::Byte(b'}' | b']') => {
                open.pop();
            }
            Lexeme::Byte(b',') => match open.last_mut() {
                Some(Open::Array { item }) => *item += 1,
                Some(Open::Object { expects_key, .. }) => *expects_key = true,
                None => {}
            },
            Lexeme::Byte(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn paths() {
        assert_eq!(join("", "model"), "model");
        assert_eq!(join(&index("messages", 2), "content"), "messages[2].content");
    }

    #[test]
    fn items_stop_at_the_first_error() {
        let mut seen = Vec::new();
        let result = each_item(&[json!(1), json!("x"), json!(2)], "stop", |v, path| {
            seen.push(path.to_string());
            v.as_i64().ok_or(path.to_string())
        });
        assert_eq!(result, Err("stop[1]".to_string()));
        assert_eq!(seen, ["stop[0]", "stop[1]"]);
        assert_eq!(each_item(&[json!(1), json!(2)], "n", |v, _| v.as_i64().ok_or(())), Ok(vec![1, 2]));
    }

    #[test]
    fn one_of_finds_or_lists() {
        let allowed = ["none", "auto"];
        assert_eq!(one_of("auto", &allowed, |s| s, ""), Ok("auto"));
        assert_eq!(one_of("x", &allowed, |s| s, ""), Err("none, auto".to_string()));
        assert_eq!(one_of("x", &allowed, |s| s, "`"), Err("`none`, `auto`".to_string()));
    }

    fn deep(depth: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn depth_is_counted_as_serde_json_counts_it() {
        for depth in [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1] {
            let text = deep(depth, "1");
            let parsed = serde_json::from_str::<Value>(&text);
            assert_eq!(parsed.is_err(), beyond_depth(text.as_bytes(), MAX_JSON_DEPTH).is_some(), "{depth}");
        }
        assert!(serde_json::from_str::<Value>(&deep(MAX_JSON_DEPTH, "1")).is_ok());
    }

    #[test]
    fn the_way_to_the_first_container_too_deep() {
        let text = br#"{"a": [1, {"x": "[[[{", "b\"c": {"d": [[]]}}], "e": 2}"#;
        assert_eq!(beyond_depth(text, 6), None);
        let way = vec![Step::Key("a".into()), Step::Index(1), Step::Key("b\"c".into()), Step::Key("d".into())];
        assert_eq!(beyond_depth(text, 4), Some(way));
        assert_eq!(beyond_depth(b"[[1], [2, [3]]]", 2), Some(vec![Step::Index(1), Step::Index(1)]));
        assert_eq!(beyond_depth(b"{}", 0), Some(Vec::new()));
        // Brackets and quotes inside strings do not count; garbage never panics.
        assert_eq!(beyond_depth(br#"["[[[[", "\\", "\"[["]"#, 1), None);
        for garbage in [&b"]]]}}}"[..], b"{\"", b"{\"a\":[,,,{", b"\xff{\"\xfe\":["] {
            let _ = beyond_depth(garbage, 1);
        }
    }
}
