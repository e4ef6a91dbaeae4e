//! STUB (replaced by the query branch).
use serde_json::{Map, Value};
pub fn matches(_query: &Map<String, Value>, _input: &Value) -> bool { false }
