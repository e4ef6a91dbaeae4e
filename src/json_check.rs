//! Building blocks shared by the validators of client JSON, chat requests (`request::chat`),
//! configs (`config`) and routing queries (`query`): JSON paths, array items,
//! enumerated strings, and how errors name a value's type and echo client text.
//!
//! Only what they do the same way lives here. Each validator keeps its own rules (chat reads
//! null as absent and rejects `2.0` as an integer, a config does neither), its own wording and
//! its own error type, so these helpers return plain values and leave the error to the caller.

use serde_json::Value;

/// Keys and values echoed in errors are cut to this many characters, so a hostile config
/// cannot make the error response as large as itself.
const ECHO_MAX: usize = 64;

/// `s` cut to `ECHO_MAX` characters, for echoing client text in an error.
pub(crate) fn shorten(s: &str) -> String {
    match s.char_indices().nth(ECHO_MAX) {
        Some((end, _)) => format!("{}...", s.get(..end).unwrap_or_default()),
        None => s.to_string(),
    }
}

/// The JSON type of `v` as error messages name it ("got a string").
pub(crate) fn kind_of(v: &Value) -> &'static str {
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
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Path of item `i` of the array at `path`.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// Runs `check` on each item with its path (`messages[3]`), stopping at the first error.
pub(crate) fn each_item<T, E>(
    items: &[Value],
    path: &str,
    mut check: impl FnMut(&Value, &str) -> Result<T, E>,
) -> Result<Vec<T>, E> {
    items.iter().enumerate().map(|(i, item)| check(item, &index(path, i))).collect()
}

/// The entry of `allowed` whose `name` is `s`. Otherwise the allowed names, each between
/// `quote`s and joined by ", ", for the caller's "must be one of" message.
pub(crate) fn one_of<T: Copy>(s: &str, allowed: &[T], name: fn(T) -> &'static str, quote: &str) -> Result<T, String> {
    allowed.iter().copied().find(|t| name(*t) == s).ok_or_else(|| {
        let names: Vec<String> = allowed.iter().map(|t| format!("{quote}{}{quote}", name(*t))).collect();
        names.join(", ")
    })
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
}
