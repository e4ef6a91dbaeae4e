//! Request logs and feedback (issue 15): the batch the filter ships, the `GET /v1/logs`
//! query and the `POST /v1/feedback` body, checked here; storage is in `db::logs`.

use crate::db::logs::{LogQuery, NewFeedback, NewRecord, StoredFeedback, StoredRecord};
use crate::errors::{ApiError, ApiResult};
use crate::validate::{is_name, is_uuid, json_object, only_known_fields, only_known_keys, MAX_WORKSPACE};
use crate::AppState;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// At most this many records in one batch.
pub const MAX_BATCH: usize = 500;
/// At most this many bytes in one record (its JSON text).
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// The body of a full batch of full records, with room for the envelope.
pub const MAX_BATCH_BYTES: usize = MAX_BATCH * (MAX_RECORD_BYTES + 16) + 1024;
/// Page sizes of `GET /v1/logs`.
pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 100;
/// At most this many `metadata.<key>` filters in one query.
pub const MAX_METADATA_FILTERS: usize = 16;
/// Feedback trace ids: 1..=128 characters.
pub const MAX_TRACE_ID_CHARS: usize = 128;
/// Feedback metadata: at most this many bytes of JSON.
pub const MAX_FEEDBACK_METADATA_BYTES: usize = 16 * 1024;
/// A record's `record_id` (made by the filter): 1..=64 characters from [A-Za-z0-9._-].
pub const MAX_RECORD_ID: usize = 64;
/// Values longer than this are indexed by their digest (see `index_key`).
const MAX_INDEXED_BYTES: usize = 256;

/// The form a filterable value is stored and looked up in: itself, or (when longer than 256
/// bytes, or starting with U+0001 so it cannot pass for a digest) U+0001 `sha256:` and its
/// hex digest. PostgreSQL's B-tree entries are limited to about 2.7 kB.
pub fn index_key(text: &str) -> String {
    if text.len() <= MAX_INDEXED_BYTES && !text.starts_with('\u{1}') {
        return text.to_string();
    }
    let digest: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("\u{1}sha256:{digest}")
}

/// A metadata value as its filters compare it: a string as it is, anything else as JSON text.
pub fn metadata_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `POST /internal/v1/records`: `{"records": [<record>, ...]}`, at most 500 records of at most
/// 64 KiB each; every record an object with a string `workspace` (a valid workspace name), a
/// string `trace_id` and an integer `timestamp_ms` (Unix ms, not negative); `record_id`, when
/// given, a string of 1 to 64 characters from [A-Za-z0-9._-] (older filters send none). The other filter
/// columns (`span_id`, `provider`, `model`, `api_key_id`: strings; `status`: an integer;
/// `prompt_tokens`, `completion_tokens`: integers, not negative; `cost_usd`: a number, not
/// negative, kept in micro-USD) are taken when they have that type and left empty otherwise;
/// the record itself is kept whole, as sent.
///
/// Records are read where they lie in the body (their text borrowed, only the columns decoded):
/// a tree of every record's values, then their text written again, was a fifth of the ingest.
pub fn batch(body: &[u8]) -> ApiResult<Vec<NewRecord>> {
    let Ok(envelope) = serde_json::from_slice::<BTreeMap<Cow<str>, &RawValue>>(body) else {
        // Not an object: the common check says why (invalid, too deep, another type).
        json_object(body)?;
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    only_known_keys(envelope.keys().map(|k| k.as_ref()), |k| k == "records")?;
    let records = match envelope.get("records") {
        Some(records) => serde_json::from_str::<Vec<&RawValue>>(records.get())
            .map_err(|_| ApiError::invalid("records", "records must be an array"))?,
        None => return Err(ApiError::invalid("records", "records is required")),
    };
    if records.len() > MAX_BATCH {
        return Err(ApiError::invalid("records", &format!("at most {MAX_BATCH} records per batch")));
    }
    records.iter().enumerate().map(|(i, record)| new_record(i, record)).collect()
}

/// The fields of a record the control plane reads; the others stay in its text.
#[derive(Deserialize)]
struct Columns<'a> {
    #[serde(borrow)]
    workspace: Option<&'a RawValue>,
    #[serde(borrow)]
    trace_id: Option<&'a RawValue>,
    #[serde(borrow)]
    timestamp_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    record_id: Option<&'a RawValue>,
    #[serde(borrow)]
    span_id: Option<&'a RawValue>,
    #[serde(borrow)]
    provider: Option<&'a RawValue>,
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    status: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    cost_usd: Option<&'a RawValue>,
    #[serde(borrow)]
    api_key_id: Option<&'a RawValue>,
    #[serde(borrow)]
    client_api: Option<&'a RawValue>,
    #[serde(borrow)]
    path: Option<&'a RawValue>,
    #[serde(borrow)]
    duration_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    cache_status: Option<&'a RawValue>,
    #[serde(borrow)]
    guardrails: Option<&'a RawValue>,
}

/// The API of a record without `client_api` (the filter names only the ones other than chat's),
/// from its path: `chat` for chat completions, else the path's first part after `/v1/`
/// (`embeddings`, `images`, ...).
fn api_of_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/")?;
    if rest == "chat/completions" || rest.starts_with("prompts/") {
        return Some("chat".to_string());
    }
    rest.split('/').next().filter(|part| !part.is_empty()).map(index_key)
}

/// The guardrails' verdict of a record: `fail` when an item's `verdict` is false, `pass` when
/// every item's is true, None when none ran (or the field is not a list of items).
fn guardrail_verdict(guardrails: Option<&RawValue>) -> Option<&'static str> {
    #[derive(Deserialize)]
    struct Item {
        verdict: Option<bool>,
    }
    let items = column::<Vec<Item>>(guardrails).filter(|items| !items.is_empty())?;
    Some(match items.iter().any(|item| item.verdict == Some(false)) {
        true => "fail",
        false => "pass",
    })
}

/// A column's value when it has type `T` (absent, `null` or another type: `None`).
fn column<'a, T: Deserialize<'a>>(value: Option<&'a RawValue>) -> Option<T> {
    value.and_then(|v| serde_json::from_str(v.get()).ok())
}

fn new_record(i: usize, record: &RawValue) -> ApiResult<NewRecord> {
    let at = |field: &str| if field.is_empty() { format!("records[{i}]") } else { format!("records[{i}].{field}") };
    let json = record.get();
    // A struct also reads a JSON array (its fields in order): only an object is a record.
    let fields = Some(json)
        .filter(|text| text.starts_with('{'))
        .and_then(|text| serde_json::from_str::<Columns>(text).ok())
        .ok_or_else(|| ApiError::invalid(&at(""), "a record must be a JSON object (each field once)"))?;
    if json.len() > MAX_RECORD_BYTES {
        return Err(ApiError::invalid(&at(""), &format!("a record is at most {MAX_RECORD_BYTES} bytes of JSON")));
    }
    let workspace = match column::<String>(fields.workspace) {
        Some(name) if is_name(&name, MAX_WORKSPACE) => name,
        _ => {
            return Err(ApiError::invalid(
                &at("workspace"),
                &format!("workspace must be a string of 1 to {MAX_WORKSPACE} characters from [A-Za-z0-9._-]"),
            ))
        }
    };
    let trace_id = match column::<Cow<str>>(fields.trace_id) {
        Some(id) => index_key(&id),
        None => return Err(ApiError::invalid(&at("trace_id"), "trace_id must be a string")),
    };
    let timestamp_ms = match column::<i64>(fields.timestamp_ms) {
        Some(ms) if ms >= 0 => ms,
        _ => return Err(ApiError::invalid(&at("timestamp_ms"), "timestamp_ms must be an integer (Unix milliseconds)")),
    };
    // Absent or `null` (an `Option` reads `null` as `None`): a record of an older filter.
    let record_key = match fields.record_id.map(|id| column::<String>(Some(id))) {
        None => None,
        Some(Some(id)) if is_name(&id, MAX_RECORD_ID) => Some(id),
        Some(_) => {
            return Err(ApiError::invalid(
                &at("record_id"),
                &format!("record_id must be a string of 1 to {MAX_RECORD_ID} characters from [A-Za-z0-9._-]"),
            ))
        }
    };
    let text = |value| column::<Cow<str>>(value).map(|text| index_key(&text));
    let metadata = column::<Map<String, Value>>(fields.metadata)
        .map(|map| map.iter().map(|(k, v)| (index_key(k), index_key(&metadata_text(v)))).collect())
        .unwrap_or_default();
    Ok(NewRecord {
        // Time-ordered: the primary key's index grows at its end.
        id: uuid::Uuid::now_v7().to_string(),
        workspace,
        record_key,
        trace_id,
        span_id: text(fields.span_id),
        provider: text(fields.provider),
        model: text(fields.model),
        status: column(fields.status),
        input_tokens: column::<u64>(fields.prompt_tokens).and_then(|n| i64::try_from(n).ok()),
        output_tokens: column::<u64>(fields.completion_tokens).and_then(|n| i64::try_from(n).ok()),
        cost_micro_usd: column::<f64>(fields.cost_usd).and_then(micro_usd),
        api_key_id: text(fields.api_key_id),
        client_api: text(fields.client_api).or_else(|| api_of_path(&column::<Cow<str>>(fields.path)?)),
        duration_ms: column::<u64>(fields.duration_ms).and_then(|n| i64::try_from(n).ok()),
        cache_status: text(fields.cache_status),
        guardrail_verdict: guardrail_verdict(fields.guardrails),
        timestamp_ms,
        json: json.to_string(),
        metadata,
    })
}

/// A record's `cost_usd` in micro-USD (rounded), when it is a cost at all (finite, not negative).
fn micro_usd(usd: f64) -> Option<i64> {
    let micro = (usd * 1e6).round();
    // Below 2^63 µUSD (i64::MAX as f64 rounds up to 2^63, itself out of range).
    (micro >= 0.0 && micro < i64::MAX as f64).then_some(micro as i64)
}

/// Seconds beyond this (year 2^43 ms or so) are refused rather than overflowing.
const MAX_SECONDS: i64 = i64::MAX / 1000 - 1;

/// The query string's pairs (decoded) as a `LogQuery`: every value checked, a parameter given
/// twice or unknown is a 400 naming it.
pub fn log_query(pairs: &[(String, String)]) -> ApiResult<LogQuery> {
    let mut q = LogQuery {
        trace_id: None,
        span_id: None,
        provider: None,
        model: None,
        status: None,
        status_class: None,
        api: None,
        cache_status: None,
        guardrail: None,
        api_key: None,
        from_ms: None,
        to_ms: None,
        metadata: Vec::new(),
        limit: DEFAULT_LIMIT,
        after: None,
    };
    let mut seen: Vec<&str> = Vec::new();
    let (mut from, mut to) = (None, None);
    for (name, value) in pairs {
        if seen.contains(&name.as_str()) {
            return Err(ApiError::invalid(name, &format!("{name} is given more than once")));
        }
        seen.push(name);
        let text = || -> ApiResult<Option<String>> {
            if value.is_empty() {
                return Err(ApiError::invalid(name, &format!("{name} must not be empty")));
            }
            Ok(Some(index_key(value)))
        };
        match name.as_str() {
            "trace_id" => q.trace_id = text()?,
            "span_id" => q.span_id = text()?,
            "provider" => q.provider = text()?,
            "model" => q.model = text()?,
            "api" => q.api = text()?,
            "cache_status" => q.cache_status = text()?,
            "api_key" => q.api_key = text()?,
            "guardrail" => match value.as_str() {
                "pass" | "fail" => q.guardrail = text()?,
                _ => return Err(ApiError::invalid(name, "guardrail must be pass or fail")),
            },
            "status_class" => {
                let class = match value.as_str() {
                    "1xx" => 1,
                    "2xx" => 2,
                    "3xx" => 3,
                    "4xx" => 4,
                    "5xx" => 5,
                    _ => return Err(ApiError::invalid(name, "status_class must be one of 1xx, 2xx, 3xx, 4xx, 5xx")),
                };
                q.status_class = Some(class);
            }
            "status" => {
                q.status = Some(value.parse::<i64>().map_err(|_| ApiError::invalid(name, "status must be an integer"))?)
            }
            "from" => from = Some(seconds(name, value)?),
            "to" => to = Some(seconds(name, value)?),
            "limit" => {
                q.limit = value.parse::<usize>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                    ApiError::invalid(name, &format!("limit must be an integer from 1 to {MAX_LIMIT}"))
                })?
            }
            "after" => {
                if !is_uuid(value) {
                    return Err(ApiError::invalid(name, "after must be the id of a log record"));
                }
                q.after = Some(value.to_ascii_lowercase());
            }
            other => match other.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() => {
                    if q.metadata.len() >= MAX_METADATA_FILTERS {
                        return Err(ApiError::invalid(
                            name,
                            &format!("at most {MAX_METADATA_FILTERS} metadata filters"),
                        ));
                    }
                    q.metadata.push((index_key(key), index_key(value)));
                }
                _ => {
                    return Err(ApiError::invalid(
                        name,
                        &format!(
                            "unknown parameter `{name}` (filters: trace_id, span_id, metadata.<key>, provider, \
                             model, status, from, to; paging: limit, after)"
                        ),
                    ))
                }
            },
        }
    }
    if let (Some(from), Some(to)) = (from, to) {
        if from > to {
            return Err(ApiError::invalid("from", "from must not be after to"));
        }
    }
    q.from_ms = from.map(|s| s * 1000);
    q.to_ms = to.map(|s| s * 1000 + 999);
    Ok(q)
}

/// Unix seconds, not negative.
pub(crate) fn seconds(name: &str, value: &str) -> ApiResult<i64> {
    value
        .parse::<i64>()
        .ok()
        .filter(|s| (0..=MAX_SECONDS).contains(s))
        .ok_or_else(|| ApiError::invalid(name, &format!("{name} must be a Unix time in seconds (an integer)")))
}

/// `POST /v1/feedback`: `trace_id` (string, 1..=128 characters) and `value` (number) required,
/// `weight` (number, default 1) and `metadata` (object, or null for none) optional.
pub fn feedback(body: &Map<String, Value>) -> ApiResult<NewFeedback> {
    const FIELDS: &[&str] = &["trace_id", "value", "weight", "metadata"];
    only_known_fields(body, |k| FIELDS.contains(&k))?;
    let trace_id = match body.get("trace_id") {
        Some(Value::String(id)) if (1..=MAX_TRACE_ID_CHARS).contains(&id.chars().count()) => id.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "trace_id",
                &format!("trace_id must be a string of 1 to {MAX_TRACE_ID_CHARS} characters"),
            ))
        }
        None => return Err(ApiError::invalid("trace_id", "trace_id is required")),
    };
    let value = match body.get("value") {
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err(ApiError::invalid("value", "value must be a number")),
        None => return Err(ApiError::invalid("value", "value is required")),
    };
    let weight = match body.get("weight") {
        Some(Value::Number(n)) => n.to_string(),
        None => "1".to_string(),
        Some(_) => return Err(ApiError::invalid("weight", "weight must be a number")),
    };
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => None,
        Some(meta @ Value::Object(_)) => {
            let text = meta.to_string();
            if text.len() > MAX_FEEDBACK_METADATA_BYTES {
                return Err(ApiError::invalid(
                    "metadata",
                    &format!("metadata is at most {MAX_FEEDBACK_METADATA_BYTES} bytes of JSON"),
                ));
            }
            Some(text)
        }
        Some(_) => return Err(ApiError::invalid("metadata", "metadata must be an object")),
    };
    Ok(NewFeedback { trace_id, value, weight, metadata })
}

/// A record as `GET /v1/logs` answers it: `id`, `object`, `created_at` (Unix s of its
/// `timestamp_ms`), the record's own fields, and `feedback` (those of its trace, oldest first:
/// `{"value", "weight", "metadata", "created_at"}`).
pub fn log_entry(record: &StoredRecord, feedback: &[StoredFeedback]) -> ApiResult<Value> {
    let stored = |e: serde_json::Error| ApiError::internal(format!("a stored log record is not JSON: {e}"));
    let fields: Map<String, Value> = serde_json::from_str(&record.json).map_err(stored)?;
    let mut out = Map::new();
    out.insert("id".into(), Value::String(record.id.clone()));
    out.insert("object".into(), Value::String("gateway.log".into()));
    out.insert("created_at".into(), Value::from(record.timestamp_ms.div_euclid(1000)));
    for (key, value) in fields {
        if !["id", "object", "created_at", "feedback"].contains(&key.as_str()) {
            out.insert(key, value);
        }
    }
    let mut entries = Vec::new();
    for f in feedback.iter().filter(|f| f.trace_key == record.trace_key) {
        let metadata = match &f.metadata {
            Some(text) => serde_json::from_str(text).map_err(stored)?,
            None => Value::Null,
        };
        let mut entry = Map::new();
        entry.insert("value".into(), serde_json::from_str(&f.value).map_err(stored)?);
        entry.insert("weight".into(), serde_json::from_str(&f.weight).map_err(stored)?);
        entry.insert("metadata".into(), metadata);
        entry.insert("created_at".into(), Value::from(f.created_at_ms.div_euclid(1000)));
        entries.push(Value::Object(entry));
    }
    out.insert("feedback".into(), Value::Array(entries));
    Ok(Value::Object(out))
}

/// A page of the workspace's records, as `GET /v1/logs` (and the console) answers the query
/// `pairs`.
pub(crate) async fn page(s: &AppState, workspace: &str, pairs: &[(String, String)]) -> ApiResult<Value> {
    let q = log_query(pairs)?;
    let after = match q.after.as_deref() {
        Some(id) => {
            let time = s.db.record_time(workspace, id).await?;
            let time = time.ok_or_else(|| ApiError::invalid("after", "after names no log record of this workspace"))?;
            Some((time, id))
        }
        None => None,
    };
    let mut rows = s.db.query_records(workspace, &q, after, q.limit + 1).await?;
    let has_more = rows.len() > q.limit;
    rows.truncate(q.limit);
    let mut traces: Vec<&str> = rows.iter().map(|r| r.trace_key.as_str()).collect();
    traces.sort_unstable();
    traces.dedup();
    let feedback = s.db.feedback_for(workspace, &traces).await?;
    let data = rows.iter().map(|r| log_entry(r, &feedback)).collect::<ApiResult<Vec<Value>>>()?;
    Ok(json!({"object": "list", "data": data, "has_more": has_more}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn body(v: Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    fn param<T: std::fmt::Debug>(r: ApiResult<T>) -> String {
        let e = r.unwrap_err().0;
        assert_eq!(e.status, 400);
        e.param().unwrap()
    }

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_records_api_is_its_client_api_else_read_from_its_path() {
        let api = |record: Value| batch(&body(json!({"records": [record]}))).unwrap()[0].client_api.clone();
        let base = json!({"workspace": "w", "trace_id": "t", "timestamp_ms": 1});
        let with = |extra: Value| {
            let mut record = base.clone();
            record.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            record
        };
        assert_eq!(api(with(json!({"client_api": "messages", "path": "/v1/messages"}))).as_deref(), Some("messages"));
        assert_eq!(api(with(json!({"client_api": null, "path": "/v1/chat/completions"}))).as_deref(), Some("chat"));
        assert_eq!(api(with(json!({"path": "/v1/embeddings"}))).as_deref(), Some("embeddings"));
        assert_eq!(api(with(json!({"path": "/mcp"}))), None);
        assert_eq!(api(base.clone()), None);
    }

    #[test]
    fn batches_need_workspace_trace_id_and_timestamp() {
        let ok = json!({"workspace": "w", "trace_id": "t", "timestamp_ms": 1_700_000_000_123_i64, "status": 200,
            "provider": "openai", "model": null, "span_id": 5, "metadata": {"_user": "u-7", "n": 1, "b": true}});
        let records = batch(&body(json!({"records": [ok.clone()]}))).unwrap();
        let r = &records[0];
        assert_eq!((r.workspace.as_str(), r.trace_id.as_str(), r.timestamp_ms), ("w", "t", 1_700_000_000_123));
        assert_eq!(
            (r.status, r.provider.as_deref(), r.model.as_deref(), r.span_id.as_deref()),
            (Some(200), Some("openai"), None, None)
        );
        let mut meta = r.metadata.clone();
        meta.sort();
        assert_eq!(meta, [("_user".into(), "u-7".into()), ("b".into(), "true".into()), ("n".into(), "1".into())]);
        assert_eq!(serde_json::from_str::<Value>(&r.json).unwrap(), ok);
        assert!(batch(&body(json!({"records": []}))).unwrap().is_empty());

        assert_eq!(param(batch(&body(json!({})))), "records");
        assert_eq!(param(batch(&body(json!({"records": {}})))), "records");
        assert_eq!(param(batch(&body(json!({"records": [], "x": 1})))), "x");
        assert_eq!(param(batch(&body(json!({"records": vec![ok.clone(); 501]})))), "records");
        assert_eq!(batch(&body(json!({"records": vec![ok.clone(); 500]}))).unwrap().len(), 500);
        assert_eq!(param(batch(&body(json!({"records": [ok.clone(), 1]})))), "records[1]");
        assert_eq!(param(batch(&body(json!({"records": [["w", "t", 1]]})))), "records[0]", "an array is no record");
        let twice = br#"{"records": [{"workspace": "w", "trace_id": "t", "trace_id": "u", "timestamp_ms": 1}]}"#;
        assert_eq!(param(batch(twice)), "records[0]", "a field given twice");
        assert_eq!(param(batch(b"[1]")), "body");
        assert_eq!(param(batch(b"{\"records\": [")), "body");
        let spaced = br#"{"records": [ {"workspace": "w", "trace_id": "t", "timestamp_ms": 1, "x": [1, 2]} ]}"#;
        assert_eq!(
            batch(spaced).unwrap()[0].json,
            r#"{"workspace": "w", "trace_id": "t", "timestamp_ms": 1, "x": [1, 2]}"#
        );
        let without = |field: &str| {
            let mut r = ok.as_object().cloned().unwrap();
            r.remove(field);
            json!({"records": [ok.clone(), r]})
        };
        assert_eq!(param(batch(&body(without("workspace")))), "records[1].workspace");
        assert_eq!(param(batch(&body(without("trace_id")))), "records[1].trace_id");
        assert_eq!(param(batch(&body(without("timestamp_ms")))), "records[1].timestamp_ms");
        let bad = |field: &str, value: Value| {
            let mut r = ok.as_object().cloned().unwrap();
            r.insert(field.into(), value);
            param(batch(&body(json!({"records": [r]}))))
        };
        assert_eq!(bad("workspace", json!("a/b")), "records[0].workspace");
        assert_eq!(bad("trace_id", json!(7)), "records[0].trace_id");
        assert_eq!(bad("timestamp_ms", json!(1.5)), "records[0].timestamp_ms");
        assert_eq!(bad("timestamp_ms", json!(-1)), "records[0].timestamp_ms");
        assert_eq!(bad("timestamp_ms", json!("1")), "records[0].timestamp_ms");
        assert_eq!(bad("record_id", json!("")), "records[0].record_id");
        assert_eq!(bad("record_id", json!("a b")), "records[0].record_id");
        assert_eq!(bad("record_id", json!("x".repeat(65))), "records[0].record_id");
        assert_eq!(bad("record_id", json!(7)), "records[0].record_id");
        assert_eq!(r.record_key, None, "older filters send no record_id");
        let mut null_id = ok.as_object().cloned().unwrap();
        null_id.insert("record_id".into(), Value::Null);
        assert_eq!(batch(&body(json!({"records": [null_id]}))).unwrap()[0].record_key, None, "null is no record_id");
        let mut with_id = ok.as_object().cloned().unwrap();
        with_id.insert("record_id".into(), json!("0123456789abcdef0123456789abcdef"));
        let records = batch(&body(json!({"records": [with_id]}))).unwrap();
        assert_eq!(records[0].record_key.as_deref(), Some("0123456789abcdef0123456789abcdef"));
        assert_eq!(bad("big", json!("x".repeat(MAX_RECORD_BYTES))), "records[0]");
    }

    #[test]
    fn usage_columns_are_taken_when_they_have_their_type() {
        let base = json!({"workspace": "w", "trace_id": "t", "timestamp_ms": 1});
        let columns = |extra: Value| {
            let mut r = base.as_object().cloned().unwrap();
            r.extend(extra.as_object().cloned().unwrap());
            let r = batch(&body(json!({"records": [r]}))).unwrap().remove(0);
            (r.input_tokens, r.output_tokens, r.cost_micro_usd, r.api_key_id)
        };
        assert_eq!(
            columns(json!({"prompt_tokens": 12, "completion_tokens": 3, "cost_usd": 0.0012345, "api_key_id": "k1"})),
            (Some(12), Some(3), Some(1235), Some("k1".into()))
        );
        assert_eq!(columns(json!({})), (None, None, None, None), "a record of an older filter");
        assert_eq!(
            columns(json!({"prompt_tokens": -1, "completion_tokens": 1.5, "cost_usd": -0.1, "api_key_id": 7})),
            (None, None, None, None)
        );
        assert_eq!(columns(json!({"prompt_tokens": null, "cost_usd": 1e300})), (None, None, None, None));
        assert_eq!(columns(json!({"cost_usd": 0})).2, Some(0));
    }

    #[test]
    fn long_values_are_indexed_by_digest() {
        assert_eq!(index_key("short"), "short");
        let long = "x".repeat(300);
        assert!(index_key(&long).starts_with("\u{1}sha256:") && index_key(&long).len() == 72);
        assert_eq!(index_key(&long), index_key(&long));
        assert_ne!(index_key(&long), index_key(&"x".repeat(301)));
        assert_ne!(index_key("\u{1}x"), "\u{1}x");
    }

    #[test]
    fn log_queries_check_every_value() {
        let q = log_query(&pairs(&[
            ("trace_id", "t"),
            ("metadata._user", "u-7"),
            ("status", "200"),
            ("from", "10"),
            ("to", "10"),
            ("limit", "100"),
            ("after", "9F1C2B3A-0000-4000-8000-000000000000"),
        ]))
        .unwrap();
        assert_eq!(
            (q.trace_id.as_deref(), q.status, q.from_ms, q.to_ms, q.limit),
            (Some("t"), Some(200), Some(10_000), Some(10_999), 100)
        );
        assert_eq!(q.metadata, [("_user".to_string(), "u-7".to_string())]);
        assert_eq!(q.after.as_deref(), Some("9f1c2b3a-0000-4000-8000-000000000000"));
        assert_eq!(log_query(&[]).unwrap().limit, 20);
        for (name, value) in [
            ("limit", "0"),
            ("limit", "101"),
            ("limit", "x"),
            ("limit", "-1"),
            ("status", "x"),
            ("status", "2.5"),
            ("from", "x"),
            ("to", "-5"),
            ("from", "99999999999999999999"),
            ("after", "nope"),
            ("trace_id", ""),
            ("provider", ""),
            ("metadata.", "x"),
            ("bogus", "1"),
        ] {
            assert_eq!(param(log_query(&pairs(&[(name, value)]))), name, "{name}={value}");
        }
        assert_eq!(param(log_query(&pairs(&[("from", "11"), ("to", "10")]))), "from");
        assert_eq!(param(log_query(&pairs(&[("model", "a"), ("model", "b")]))), "model");
        assert_eq!(log_query(&pairs(&[("metadata.k", "")])).unwrap().metadata, [("k".to_string(), String::new())]);
    }

    #[test]
    fn feedback_bodies() {
        let f = feedback(&map(json!({"trace_id": "t", "value": -1}))).unwrap();
        assert_eq!(f, NewFeedback { trace_id: "t".into(), value: "-1".into(), weight: "1".into(), metadata: None });
        let f = feedback(&map(json!({"trace_id": "t", "value": 0.5, "weight": 2, "metadata": {"a": 1}}))).unwrap();
        assert_eq!((f.value.as_str(), f.weight.as_str(), f.metadata.as_deref()), ("0.5", "2", Some(r#"{"a":1}"#)));
        assert_eq!(param(feedback(&map(json!({"value": 1})))), "trace_id");
        assert_eq!(param(feedback(&map(json!({"trace_id": "", "value": 1})))), "trace_id");
        assert_eq!(param(feedback(&map(json!({"trace_id": "x".repeat(129), "value": 1})))), "trace_id");
        assert!(feedback(&map(json!({"trace_id": "é".repeat(128), "value": 1}))).is_ok());
        assert_eq!(param(feedback(&map(json!({"trace_id": 5, "value": 1})))), "trace_id");
        assert_eq!(param(feedback(&map(json!({"trace_id": "t"})))), "value");
        assert_eq!(param(feedback(&map(json!({"trace_id": "t", "value": "1"})))), "value");
        assert_eq!(param(feedback(&map(json!({"trace_id": "t", "value": 1, "weight": null})))), "weight");
        assert_eq!(param(feedback(&map(json!({"trace_id": "t", "value": 1, "metadata": []})))), "metadata");
        assert_eq!(param(feedback(&map(json!({"trace_id": "t", "value": 1, "extra": 1})))), "extra");
    }
}
