//! A JSON Schema validator for the common subset, for `default.jsonSchema`: `type`,
//! `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`, `minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `minLength`, `maxLength`, `pattern`
//! (the linear-time `query::regex` dialect), `minItems`, `maxItems`, `minProperties`,
//! `maxProperties`, `anyOf`, `allOf`, `oneOf`, `not`. Other annotation keywords (`title`,
//! `description`, `$schema`, `format`...) are ignored, as JSON Schema says; `$ref` and the
//! other keywords that would change what passes are refused, so a schema never passes more
//! than its author meant. (The `jsonschema` crate covers everything, but with its regex
//! engines and resolvers it would multiply the filter's size.)

use crate::json_check::kind_of;
use crate::query::regex;
use serde_json::Value;

/// Schemas nest at most this deep (a config is bounded, but the recursion should be too).
const MAX_DEPTH: usize = 32;
/// At most this many errors are reported.
const MAX_ERRORS: usize = 10;

/// Keywords that constrain values and that this validator does not implement.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "$dynamicRef",
    "patternProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "if",
    "prefixItems",
    "contains",
    "uniqueItems",
    "multipleOf",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// The ways `value` breaks `schema` (empty when it is valid), or what is wrong with the
/// schema itself.
pub(super) fn validate(schema: &Value, value: &Value) -> Result<Vec<String>, String> {
    let mut errors = Vec::new();
    check(schema, value, "$", 0, &mut errors)?;
    errors.truncate(MAX_ERRORS);
    Ok(errors)
}

fn check(schema: &Value, value: &Value, path: &str, depth: usize, errors: &mut Vec<String>) -> Result<(), String> {
    let schema = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => {
            errors.push(format!("{path}: no value is allowed here"));
            return Ok(());
        }
        Value::Object(schema) => schema,
        other => return Err(format!("a schema must be an object or a boolean, got {}", kind_of(other))),
    };
    if depth > MAX_DEPTH {
        return Err(format!("the schema nests deeper than {MAX_DEPTH} levels"));
    }
    if let Some(keyword) = UNSUPPORTED.iter().find(|k| schema.contains_key(**k)) {
        return Err(format!("schema keyword `{keyword}` is not supported"));
    }
    let mut fail = |message: String| errors.push(format!("{path}: {message}"));
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => return Err("`type` must be a string or an array of strings".to_string()),
        };
        if !types.iter().any(|t| has_type(value, t)) {
            fail(format!("must be of type {}, got {}", types.join(" or "), kind_of(value)));
        }
    }
    if let Some(allowed) = schema.get("enum") {
        let allowed = allowed.as_array().ok_or("`enum` must be an array")?;
        if !allowed.iter().any(|a| same(a, value)) {
            fail("must be one of the `enum` values".to_string());
        }
    }
    if let Some(c) = schema.get("const") {
        if !same(c, value) {
            fail("must equal the `const` value".to_string());
        }
    }
    if let Some(n) = value.as_f64() {
        let bound = |key: &str| -> Result<Option<f64>, String> {
            schema.get(key).map(|b| b.as_f64().ok_or(format!("`{key}` must be a number"))).transpose()
        };
        if bound("minimum")?.is_some_and(|m| n < m) {
            fail("is below `minimum`".to_string());
        }
        if bound("maximum")?.is_some_and(|m| n > m) {
            fail("is above `maximum`".to_string());
        }
        if bound("exclusiveMinimum")?.is_some_and(|m| n <= m) {
            fail("is not above `exclusiveMinimum`".to_string());
        }
        if bound("exclusiveMaximum")?.is_some_and(|m| n >= m) {
            fail("is not below `exclusiveMaximum`".to_string());
        }
    }
    let size = |key: &str| -> Result<Option<u64>, String> {
        schema.get(key).map(|b| b.as_u64().ok_or(format!("`{key}` must be a non-negative integer"))).transpose()
    };
    if let Value::String(s) = value {
        let chars = s.chars().count() as u64;
        if size("minLength")?.is_some_and(|m| chars < m) {
            fail("is shorter than `minLength`".to_string());
        }
        if size("maxLength")?.is_some_and(|m| chars > m) {
            fail("is longer than `maxLength`".to_string());
        }
        if let Some(pattern) = schema.get("pattern") {
            let pattern = pattern.as_str().ok_or("`pattern` must be a string")?;
            let regex = regex::cached(pattern).map_err(|e| format!("`pattern` is not valid: {e}"))?;
            if !regex.is_match(s) {
                fail("does not match `pattern`".to_string());
            }
        }
    }
    if let Value::Array(items) = value {
        let n = items.len() as u64;
        if size("minItems")?.is_some_and(|m| n < m) {
            fail("has fewer items than `minItems`".to_string());
        }
        if size("maxItems")?.is_some_and(|m| n > m) {
            fail("has more items than `maxItems`".to_string());
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(item_schema, item, &format!("{path}[{i}]"), depth + 1, errors)?;
            }
        }
    }
    if let Value::Object(object) = value {
        let n = object.len() as u64;
        if size("minProperties")?.is_some_and(|m| n < m) {
            errors.push(format!("{path}: has fewer properties than `minProperties`"));
        }
        if size("maxProperties")?.is_some_and(|m| n > m) {
            errors.push(format!("{path}: has more properties than `maxProperties`"));
        }
        if let Some(required) = schema.get("required") {
            let required = required.as_array().ok_or("`required` must be an array")?;
            for key in required.iter().filter_map(Value::as_str).filter(|k| !object.contains_key(*k)) {
                errors.push(format!("{path}: misses required property `{key}`"));
            }
        }
        let properties = match schema.get("properties") {
            Some(p) => Some(p.as_object().ok_or("`properties` must be an object")?),
            None => None,
        };
        for (key, item) in object {
            let child = format!("{path}.{key}");
            match (properties.and_then(|p| p.get(key)), schema.get("additionalProperties")) {
                (Some(property_schema), _) => check(property_schema, item, &child, depth + 1, errors)?,
                (None, Some(Value::Bool(false))) => errors.push(format!("{child}: is not an allowed property")),
                (None, Some(extra)) => check(extra, item, &child, depth + 1, errors)?,
                (None, None) => {}
            }
        }
    }
    combinators(schema, value, path, depth, errors)
}

/// `allOf`, `anyOf`, `oneOf` and `not`.
fn combinators(
    schema: &serde_json::Map<String, Value>,
    value: &Value,
    path: &str,
    depth: usize,
    errors: &mut Vec<String>,
) -> Result<(), String> {
    let list = |key: &str| -> Result<Option<&Vec<Value>>, String> {
        schema
            .get(key)
            .map(|l| l.as_array().filter(|a| !a.is_empty()).ok_or(format!("`{key}` must be a non-empty array")))
            .transpose()
    };
    // How many of `schemas` the value satisfies; their own errors are not reported.
    let passing = |schemas: &[Value]| -> Result<usize, String> {
        let mut n = 0;
        for s in schemas {
            let mut scratch = Vec::new();
            check(s, value, path, depth + 1, &mut scratch)?;
            n += usize::from(scratch.is_empty());
        }
        Ok(n)
    };
    if let Some(all) = list("allOf")? {
        for s in all {
            check(s, value, path, depth + 1, errors)?;
        }
    }
    if let Some(any) = list("anyOf")? {
        if passing(any)? == 0 {
            errors.push(format!("{path}: matches none of `anyOf`"));
        }
    }
    if let Some(one) = list("oneOf")? {
        let n = passing(one)?;
        if n != 1 {
            errors.push(format!("{path}: matches {n} of `oneOf`, not exactly one"));
        }
    }
    if let Some(not) = schema.get("not") {
        if passing(std::slice::from_ref(not))? == 1 {
            errors.push(format!("{path}: matches the `not` schema"));
        }
    }
    Ok(())
}

fn has_type(value: &Value, t: &str) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        // JSON Schema counts 1.0 as an integer.
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
