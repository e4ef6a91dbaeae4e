//! The query language of the `conditional` routing strategy: whether a request matches the
//! `query` of a condition. Mongo-like, over the input
//! `{"metadata": {...}, "params": {...request body...}, "url": {"pathname": "/v1/..."}}`.
//!
//! - A query is an object whose entries must all match (an empty query matches everything).
//!   A key is a combinator or a field path:
//!   - `$and`: a non-empty array of queries that must all match;
//!   - `$or`: a non-empty array of queries of which at least one must match;
//!   - `$not`: a query that must not match.
//! - A field path is dotted, any depth: `metadata._user`, `params.model`, `url.pathname`. A
//!   segment of digits indexes an array (`params.messages.0.role`). Arrays are values like any
//!   other: there is no Mongo-style matching of a field against each item of an array.
//! - A field's value is an operator object (every key starts with `$`; several operators must
//!   all match, as in `{"$gte": 0.5, "$lt": 1}`) or a plain value, which means `$eq`. An object
//!   without `$` keys is a plain value: `$eq` against that object.
//! - Operators:
//!   - `$eq`, `$ne`: JSON equality; numbers compare by value (`1` equals `1.0`), arrays item by
//!     item, objects key by key whatever their order.
//!   - `$gt`, `$gte`, `$lt`, `$lte`: the field and the operand must both be numbers, or both
//!     strings (compared character by character, by Unicode code point); any other pair,
//!     `"5"` against `4` included, does not match. The operand must be a number or a string.
//!   - `$in`, `$nin`: the field equals one / none of the items of the operand array.
//!   - `$regex`: the field is a string the pattern matches somewhere in (`query::regex`, the
//!     `regex-lite` dialect; anchor with `^` and `$`, `(?i)` ignores case).
//!   - `$exists`: `true` matches a field that is present and not null, `false` one that is
//!     missing or null. JSON clients send null to mean "not set" (the chat validator reads it
//!     so too), so a null field does not exist here.
//! - A missing field equals nothing, null included: `$eq`, `$in`, the comparisons and
//!   `$regex` fail, `$ne` and `$nin` match. `{"params.user": null}` therefore matches only an
//!   explicit null; to match "not set", use `{"$exists": false}`.
//!
//! `validate` checks a query when the config is parsed; `matches` answers for a request and
//! never panics. Both are the same walk (see `eval`), so they cannot disagree on what is valid:
//! a query that does not validate matches nothing.

pub mod regex;
use crate::json_check::{index, join, kind_of, shorten};
use serde_json::{Map, Number, Value};
use std::cmp::Ordering;

/// Queries nest (`$and`, `$or`, `$not`) at most this deep, so a hostile config cannot make
/// the walk recurse deeply.
const MAX_DEPTH: usize = 16;

/// Why a query is invalid, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    /// Relative to the query object, e.g. `$and[1].params.model.$regex`.
    pub path: String,
    pub message: String,
}

impl QueryError {
    /// An error about the value being checked; the callers above add its path.
    fn new(message: impl Into<String>) -> Self {
        QueryError { path: String::new(), message: message.into() }
    }

    /// The error as seen from the value that holds this one at `segment`.
    fn under(mut self, segment: &str) -> Self {
        self.path = if self.path.is_empty() { segment.to_string() } else { join(segment, &self.path) };
        self
    }
}

/// Checks a query: operators, operand types, regular expressions and nesting depth.
pub fn validate(query: &Map<String, Value>) -> Result<(), QueryError> {
    // Every check comes before the field is read, so any input reaches all of them.
    eval(query, &Value::Null, 0).map(|_| ())
}

/// Whether `input` matches `query`. An invalid query matches nothing.
pub fn matches(query: &Map<String, Value>, input: &Value) -> bool {
    eval(query, input, 0).unwrap_or(false)
}

/// Evaluates `query` on `input`, or says why the query is invalid. Nothing is short-cut: an
/// invalid part is found wherever it is, whatever the input, so `validate` can run this on
/// an empty input.
fn eval(query: &Map<String, Value>, input: &Value, depth: usize) -> Result<bool, QueryError> {
    if depth > MAX_DEPTH {
        return Err(QueryError::new(format!("queries nest more than {MAX_DEPTH} levels deep")));
    }
    let mut all = true;
    for (key, value) in query {
        all &= entry(key, value, input, depth)?;
    }
    Ok(all)
}

/// One entry of a query. Errors are relative to the query, so they start with `key`.
fn entry(key: &str, value: &Value, input: &Value, depth: usize) -> Result<bool, QueryError> {
    match key {
        "$and" => {
            let (matched, total) = each_query(key, value, input, depth)?;
            Ok(matched == total)
        }
        "$or" => Ok(each_query(key, value, input, depth)?.0 > 0),
        "$not" => {
            let query = value.as_object().ok_or_else(|| expected("a query object", value).under(key))?;
            Ok(!eval(query, input, depth + 1).map_err(|e| e.under(key))?)
        }
        _ if key.starts_with('$') => Err(QueryError::new(format!(
            "unknown operator `{}`; a query holds field paths and `$and`, `$or`, `$not`",
            shorten(key)
        ))
        .under(&shorten(key))),
        path => field(lookup(input, path), value).map_err(|e| e.under(&shorten(path))),
    }
}

/// The queries of `$and` or `$or` (`key`): how many match, out of how many.
fn each_query(key: &str, value: &Value, input: &Value, depth: usize) -> Result<(usize, usize), QueryError> {
    let queries = value.as_array().ok_or_else(|| expected("a non-empty array of queries", value).under(key))?;
    if queries.is_empty() {
        return Err(QueryError::new("must not be empty").under(key));
    }
    let mut matched = 0;
    for (i, item) in queries.iter().enumerate() {
        let path = index(key, i);
        let query = item.as_object().ok_or_else(|| expected("a query object", item).under(&path))?;
        if eval(query, input, depth + 1).map_err(|e| e.under(&path))? {
            matched += 1;
        }
    }
    Ok((matched, queries.len()))
}

/// The value at dotted `path` in `input`, if there is one.
fn lookup<'a>(input: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(input, |value, segment| match value {
        Value::Object(fields) => fields.get(segment),
        // Digits only: `parse` would also take `+1`.
        Value::Array(items) if segment.bytes().all(|b| b.is_ascii_digit()) => {
            segment.parse::<usize>().ok().and_then(|i| items.get(i))
        }
        _ => None,
    })
}

/// Whether the field (`found`, None when missing) matches `condition`, an operator object
/// or a plain value. Errors are relative to `condition`.
fn field(found: Option<&Value>, condition: &Value) -> Result<bool, QueryError> {
    match condition {
        Value::Object(operators) if operators.keys().any(|k| k.starts_with('$')) => {
            let mut all = true;
            for (name, operand) in operators {
                all &= operator(name, operand, found).map_err(|e| e.under(&shorten(name)))?;
            }
            Ok(all)
        }
        plain => Ok(found.is_some_and(|f| json_eq(f, plain))),
    }
}

/// One operator of an operator object. Errors are relative to `operand`.
fn operator(name: &str, operand: &Value, found: Option<&Value>) -> Result<bool, QueryError> {
    match name {
        "$eq" => Ok(found.is_some_and(|f| json_eq(f, operand))),
        "$ne" => Ok(!found.is_some_and(|f| json_eq(f, operand))),
        "$gt" => compare(found, operand, Ordering::is_gt),
        "$gte" => compare(found, operand, Ordering::is_ge),
        "$lt" => compare(found, operand, Ordering::is_lt),
        "$lte" => compare(found, operand, Ordering::is_le),
        "$in" => is_in(found, operand),
        "$nin" => Ok(!is_in(found, operand)?),
        "$exists" => {
            let wanted = operand.as_bool().ok_or_else(|| expected("a boolean", operand))?;
            Ok(found.is_some_and(|f| !f.is_null()) == wanted)
        }
        "$regex" => {
            let pattern = operand.as_str().ok_or_else(|| expected("a string", operand))?;
            let regex = regex::cached(pattern)
                .map_err(|e| QueryError::new(format!("is not a valid regular expression: {e}")))?;
            Ok(found.and_then(Value::as_str).is_some_and(|s| regex.is_match(s)))
        }
        "$and" | "$or" | "$not" => {
            Err(QueryError::new(format!("`{name}` combines queries: it goes beside field paths, not inside a field")))
        }
        _ if name.starts_with('$') => Err(QueryError::new(format!(
            "unknown operator `{}`; a field takes $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $regex, $exists",
            shorten(name)
        ))),
        _ => Err(QueryError::new(
            "is not an operator: a field's object either has only `$` operators or is a plain value",
        )),
    }
}

/// `$gt` and the like: whether the field's order against `operand` is `accepted`.
fn compare(found: Option<&Value>, operand: &Value, accepted: fn(Ordering) -> bool) -> Result<bool, QueryError> {
    if !operand.is_number() && !operand.is_string() {
        return Err(expected("a number or a string", operand));
    }
    let order = match (found, operand) {
        (Some(Value::Number(a)), Value::Number(b)) => number_order(a, b),
        (Some(Value::String(a)), Value::String(b)) => Some(a.cmp(b)),
        _ => None,
    };
    Ok(order.is_some_and(accepted))
}

/// `$in`: whether the field equals an item of the `operand` array.
fn is_in(found: Option<&Value>, operand: &Value) -> Result<bool, QueryError> {
    let items = operand.as_array().ok_or_else(|| expected("an array", operand))?;
    Ok(found.is_some_and(|f| items.iter().any(|item| json_eq(f, item))))
}

fn expected(what: &str, v: &Value) -> QueryError {
    QueryError::new(format!("must be {what}, got {}", kind_of(v)))
}

/// JSON equality with numbers compared by value (serde_json's `==` tells `1` from `1.0`).
/// The recursion is as deep as the shallower value, and serde_json parses at most 128 deep.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => number_order(a, b) == Some(Ordering::Equal),
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| json_eq(a, b)),
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(key, a)| b.get(key).is_some_and(|b| json_eq(a, b)))
        }
        _ => a == b,
    }
}

/// Integers compare exactly; anything else as floats.
fn number_order(a: &Number, b: &Number) -> Option<Ordering> {
    if let (Some(a), Some(b)) = (a.as_i64(), b.as_i64()) {
        return Some(a.cmp(&b));
    }
    if let (Some(a), Some(b)) = (a.as_u64(), b.as_u64()) {
        return Some(a.cmp(&b));
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn input() -> Value {
        json!({
            "metadata": {"_user": "ada", "tier": "pro", "score": 7, "beta": null},
            "params": {
                "model": "gpt-4o-mini",
                "temperature": 0.5,
                "max_tokens": 100,
                "stream": false,
                "stop": ["\n", "END"],
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello"}
                ],
                "response_format": {"type": "json_object"}
            },
            "url": {"pathname": "/v1/chat/completions"}
        })
    }

    fn query(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(map) => map,
            other => panic!("not a query: {other}"),
        }
    }

    /// Whether the test input matches `q`, after checking `q` validates.
    fn hit(q: Value) -> bool {
        let q = query(q);
        if let Err(e) = validate(&q) {
            panic!("{q:?} is invalid: {e:?}");
        }
        matches(&q, &input())
    }

    fn invalid(q: Value, path: &str, message: &str) {
        let q = query(q);
        match validate(&q) {
            Ok(()) => panic!("{q:?} validated"),
            Err(e) => {
                assert_eq!(e.path, path, "{e:?}");
                assert!(e.message.contains(message), "expected {message:?} in {e:?}");
            }
        }
        // Unvalidated, an invalid query matches nothing (and does not panic).
        assert!(!matches(&q, &input()));
    }

    #[test]
    fn plain_values_and_eq() {
        assert!(hit(json!({})));
        assert!(hit(json!({"params.model": "gpt-4o-mini"})));
        assert!(!hit(json!({"params.model": "gpt-4o"})));
        assert!(hit(json!({"params.model": {"$eq": "gpt-4o-mini"}, "metadata.tier": "pro"})));
        assert!(!hit(json!({"params.model": "gpt-4o-mini", "metadata.tier": "free"})));
        assert!(hit(json!({"url.pathname": "/v1/chat/completions"})));
        assert!(hit(json!({"params.stream": false})));
        assert!(hit(json!({"metadata.beta": null})));
        // Objects without `$` keys and arrays are plain values, compared whole.
        assert!(hit(json!({"params.response_format": {"type": "json_object"}})));
        assert!(!hit(json!({"params.response_format": {}})));
        assert!(hit(json!({"params.stop": ["\n", "END"]})));
        assert!(!hit(json!({"params.stop": "END"})));
        assert!(!hit(json!({"params.stop": ["END", "\n"]})));
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(hit(json!({"params.max_tokens": 100.0})));
        assert!(hit(json!({"params.temperature": {"$eq": 0.5}})));
        assert!(hit(json!({"metadata.score": {"$in": [1, 7.0]}})));
        // Inside objects too, whatever the key order.
        assert!(hit(json!({"metadata": {"beta": null, "score": 7.0, "tier": "pro", "_user": "ada"}})));
        assert!(!hit(json!({"params.max_tokens": "100"})));
        let big = json!({"n": u64::MAX, "neg": i64::MIN});
        assert!(matches(&query(json!({"n": u64::MAX})), &big));
        assert!(!matches(&query(json!({"n": u64::MAX - 1})), &big));
        assert!(matches(&query(json!({"neg": {"$lt": u64::MAX}})), &big));
    }

    #[test]
    fn ne_in_nin() {
        assert!(hit(json!({"params.model": {"$ne": "gpt-4o"}})));
        assert!(!hit(json!({"params.model": {"$ne": "gpt-4o-mini"}})));
        assert!(hit(json!({"params.model": {"$in": ["gpt-4o", "gpt-4o-mini"]}})));
        assert!(!hit(json!({"params.model": {"$in": []}})));
        assert!(hit(json!({"params.model": {"$nin": ["gpt-4o"]}})));
        assert!(!hit(json!({"params.model": {"$nin": ["gpt-4o", "gpt-4o-mini"]}})));
        assert!(hit(json!({"params.stop": {"$in": [["\n", "END"]]}})));
    }

    #[test]
    fn comparisons_need_two_numbers_or_two_strings() {
        assert!(hit(json!({"params.temperature": {"$gt": 0.4}})));
        assert!(!hit(json!({"params.temperature": {"$gt": 0.5}})));
        assert!(hit(json!({"params.temperature": {"$gte": 0.5}})));
        assert!(hit(json!({"params.temperature": {"$lt": 1}})));
        assert!(hit(json!({"params.temperature": {"$lte": 0.5}})));
        assert!(!hit(json!({"params.temperature": {"$lte": 0.4}})));
        assert!(hit(json!({"params.temperature": {"$gte": 0.5, "$lt": 1}})));
        assert!(!hit(json!({"params.temperature": {"$gte": 0.5, "$lt": 0.5}})));
        assert!(hit(json!({"metadata.tier": {"$gt": "free"}})));
        assert!(hit(json!({"params.model": {"$gte": "gpt-4", "$lt": "gpt-5"}})));
        assert!(!hit(json!({"metadata.tier": {"$gt": "zzz"}})));
        // Mixed types never compare.
        assert!(!hit(json!({"metadata.score": {"$gt": "5"}})));
        assert!(!hit(json!({"metadata.score": {"$lt": "5"}})));
        assert!(!hit(json!({"metadata.tier": {"$gt": 0}})));
        assert!(!hit(json!({"params.stream": {"$lt": 1}})));
    }

    #[test]
    fn regex_matches_strings_only() {
        assert!(hit(json!({"params.model": {"$regex": "^gpt-4o"}})));
        assert!(hit(json!({"params.model": {"$regex": "mini"}})));
        assert!(!hit(json!({"params.model": {"$regex": "^mini"}})));
        assert!(hit(json!({"params.model": {"$regex": "(?i)GPT"}})));
        assert!(hit(json!({"url.pathname": {"$regex": "/chat/"}})));
        assert!(!hit(json!({"metadata.score": {"$regex": "7"}})));
        assert!(!hit(json!({"params.stop": {"$regex": "END"}})));
    }

    #[test]
    fn exists_treats_null_as_absent() {
        assert!(hit(json!({"metadata._user": {"$exists": true}})));
        assert!(!hit(json!({"metadata._user": {"$exists": false}})));
        assert!(hit(json!({"params.stream": {"$exists": true}})));
        assert!(!hit(json!({"metadata.beta": {"$exists": true}})));
        assert!(hit(json!({"metadata.beta": {"$exists": false}})));
        assert!(hit(json!({"metadata.nope": {"$exists": false}})));
        assert!(!hit(json!({"metadata.nope": {"$exists": true}})));
    }

    #[test]
    fn missing_fields() {
        for path in ["metadata.nope", "params.model.deeper", "nope", "params.messages.9.role", ""] {
            let on = |op: &str, operand: Value| hit(json!({path: {op: operand}}));
            assert!(!hit(json!({path: "x"})), "{path}");
            assert!(!hit(json!({path: null})), "{path}");
            assert!(!on("$eq", json!("x")), "{path}");
            assert!(on("$ne", json!("x")), "{path}");
            assert!(on("$ne", json!(null)), "{path}");
            assert!(!on("$in", json!(["x", null])), "{path}");
            assert!(on("$nin", json!(["x"])), "{path}");
            assert!(!on("$gt", json!(0)), "{path}");
            assert!(!on("$lte", json!("z")), "{path}");
            assert!(!on("$regex", json!("")), "{path}");
            assert!(on("$exists", json!(false)), "{path}");
        }
    }

    #[test]
    fn paths_index_arrays() {
        assert!(hit(json!({"params.messages.0.role": "system"})));
        assert!(hit(json!({"params.messages.1.content": {"$regex": "^Hel"}})));
        assert!(hit(json!({"params.stop.1": "END"})));
        assert!(!hit(json!({"params.messages.2.role": {"$exists": true}})));
        assert!(!hit(json!({"params.messages.+1.role": "user"})));
        assert!(!hit(json!({"params.messages.-1.role": "user"})));
        assert!(!hit(json!({"params.messages.99999999999999999999999.role": "user"})));
        assert!(!hit(json!({"params.messages.role": "user"})));
        // A digit segment on an object is a key.
        assert!(matches(&query(json!({"a.0": 1})), &json!({"a": {"0": 1}})));
    }

    #[test]
    fn combinators_nest() {
        assert!(hit(json!({"$and": [{"metadata.tier": "pro"}, {"params.model": {"$regex": "^gpt"}}]})));
        assert!(!hit(json!({"$and": [{"metadata.tier": "pro"}, {"params.model": "x"}]})));
        assert!(hit(json!({"$or": [{"metadata.tier": "free"}, {"params.model": {"$regex": "mini$"}}]})));
        assert!(!hit(json!({"$or": [{"metadata.tier": "free"}, {"params.model": "x"}]})));
        assert!(hit(json!({"$not": {"metadata.tier": "free"}})));
        assert!(!hit(json!({"$not": {"metadata.tier": "pro"}})));
        assert!(!hit(json!({"$not": {}})));
        assert!(hit(json!({
            "url.pathname": {"$regex": "^/v1/"},
            "$or": [
                {"$and": [{"metadata.tier": "pro"}, {"$not": {"params.stream": true}}]},
                {"metadata._user": {"$in": ["bob"]}}
            ],
            "$not": {"$or": [{"params.temperature": {"$gt": 1}}, {"params.max_tokens": {"$lt": 10}}]}
        })));
        assert!(!hit(json!({"$and": [{}, {"$or": [{"$not": {}}]}]})));
    }

    #[test]
    fn unknown_operators_are_invalid() {
        invalid(json!({"params.model": {"$foo": 1}}), "params.model.$foo", "unknown operator `$foo`");
        invalid(json!({"$foo": 1}), "$foo", "unknown operator `$foo`");
        invalid(json!({"$eq": 1}), "$eq", "unknown operator `$eq`");
        invalid(json!({"params.model": {"$not": {"$eq": "x"}}}), "params.model.$not", "combines queries");
        invalid(json!({"params.model": {"$eq": "x", "plain": 1}}), "params.model.plain", "is not an operator");
        let nested = json!({"$and": [{"$or": [{"a": 1}, {"b": {"$size": 1}}]}]});
        invalid(nested, "$and[0].$or[1].b.$size", "unknown operator");
        let long = format!("${}", "x".repeat(500));
        let q = query(json!({ "params.model": { long.as_str(): 1 } }));
        let e = validate(&q).err().unwrap_or_else(|| panic!("validated"));
        assert!(e.path.len() < 100 && e.message.len() < 200, "{e:?}");
    }

    #[test]
    fn operand_types_are_checked() {
        let cases = [
            (json!({"a": {"$in": "x"}}), "a.$in", "must be an array, got a string"),
            (json!({"a": {"$nin": {}}}), "a.$nin", "must be an array, got an object"),
            (json!({"a": {"$exists": 1}}), "a.$exists", "must be a boolean, got a number"),
            (json!({"a": {"$regex": 1}}), "a.$regex", "must be a string, got a number"),
            (json!({"a": {"$gt": true}}), "a.$gt", "must be a number or a string, got a boolean"),
            (json!({"a": {"$lte": null}}), "a.$lte", "must be a number or a string, got null"),
            (json!({"a": {"$gte": [1]}}), "a.$gte", "got an array"),
            (json!({"a": {"$lt": {}}}), "a.$lt", "got an object"),
            (json!({"$and": {}}), "$and", "must be a non-empty array of queries, got an object"),
            (json!({"$or": []}), "$or", "must not be empty"),
            (json!({"$or": [{}, 1]}), "$or[1]", "must be a query object, got a number"),
            (json!({"$not": [{}]}), "$not", "must be a query object, got an array"),
            (
                json!({"$not": {"$and": [{"x": {"$regex": "("}}]}}),
                "$not.$and[0].x.$regex",
                "is not a valid regular expression: found open group without closing ')'",
            ),
            (json!({"params.model": {"$regex": "a{10000}"}}), "params.model.$regex", "size limit"),
        ];
        for (q, path, message) in cases {
            invalid(q, path, message);
        }
    }

    #[test]
    fn invalid_parts_fail_the_whole_query_even_under_not() {
        // The invalid part comes after a false one and sits under `$not`: still no match.
        let q = query(json!({"$not": {"metadata.tier": "free", "x": {"$regex": "("}}}));
        assert!(validate(&q).is_err());
        assert!(!matches(&q, &input()));
        let q = query(json!({"$or": [{"metadata.tier": "pro"}, {"x": {"$in": 1}}]}));
        assert!(!matches(&q, &input()));
    }

    #[test]
    fn nesting_is_bounded() {
        let nest = |levels: usize| {
            let mut q = json!({"metadata.tier": "pro"});
            for _ in 0..levels {
                q = json!({"$and": [q]});
            }
            query(q)
        };
        assert!(validate(&nest(MAX_DEPTH)).is_ok());
        assert!(matches(&nest(MAX_DEPTH), &input()));
        let e = validate(&nest(MAX_DEPTH + 1)).err().unwrap_or_else(|| panic!("validated"));
        assert_eq!(e.path, ["$and[0]"; MAX_DEPTH + 1].join("."));
        assert!(e.message.contains("nest more than 16"));
        assert!(!matches(&nest(MAX_DEPTH + 1), &input()));
        assert!(!matches(&nest(100), &input()));
    }

    #[test]
    fn any_input_shape_is_safe() {
        let q = query(json!({"params.model": {"$regex": "gpt"}, "url.pathname": {"$gt": "/"}}));
        for input in [json!(null), json!([]), json!("gpt"), json!({"params": [1]}), json!({"params": {"model": 5}})] {
            assert!(!matches(&q, &input), "{input}");
        }
    }
}
