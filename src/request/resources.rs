//! Checks on the resource endpoints (batches, files, fine-tuning, assistants, threads, ...)
//! before any provider is called: path parameters, list queries, and the JSON bodies the
//! spec limits (spec 4.5 to 4.12 and 8). Requests that pass go upstream unchanged.
//!
//! A repeated query parameter the gateway checks (`limit`, `order`, `after`, `before`) is a
//! 400: providers differ on whether the first or the last one counts, so the gateway could
//! not know which value it checked.

use crate::errors::GatewayError;
use crate::percent;
use serde_json::{Map, Value};

/// Collections whose next path segment is an id, and that id's name.
const COLLECTIONS: &[(&str, &str)] = &[
    ("batches", "batch_id"),
    ("files", "file_id"),
    ("jobs", "fine_tuning_job_id"),
    ("checkpoints", "fine_tuned_model_checkpoint"),
    ("permissions", "permission_id"),
    ("assistants", "assistant_id"),
    ("threads", "thread_id"),
    ("messages", "message_id"),
    ("runs", "run_id"),
    ("steps", "step_id"),
    ("vector_stores", "vector_store_id"),
    ("file_batches", "batch_id"),
    ("uploads", "upload_id"),
    ("models", "model"),
];

/// One segment of a resource path: its text and, at an id position, the id's name.
struct Segment<'a> {
    raw: &'a str,
    param: Option<&'static str>,
}

/// `path` (after `/v1`, e.g. `/batches/b1/cancel`) cut into segments, ids named.
fn segments(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut id_name: Option<&'static str> = None;
    for raw in path.strip_prefix('/').unwrap_or(path).split('/') {
        let param = id_name.take();
        if param.is_none() {
            id_name = COLLECTIONS.iter().find(|(name, _)| *name == raw).map(|(_, id)| *id);
        }
        out.push(Segment { raw, param });
    }
    out
}

/// Every path parameter is one non-empty segment: an encoded `/` or `\`, a `.` or `..`
/// segment, or a control character (raw or encoded) would reach a different upstream path.
pub(crate) fn check_path(path: &str) -> Result<(), GatewayError> {
    for segment in segments(path) {
        let param = segment.param.unwrap_or("path");
        let bad = |why: &str| {
            GatewayError::invalid_param(param, format!("invalid path parameter `{param}`: {why}"))
                .with_code("invalid_value")
        };
        if segment.raw.is_empty() {
            return Err(match segment.param {
                Some(_) => bad("must not be empty"),
                None => bad("the path has an empty segment"),
            });
        }
        let decoded = percent::decode(segment.raw, false).ok_or_else(|| bad("broken percent-encoding"))?;
        let slash = |b: &u8| *b == b'/' || *b == b'\\';
        // Model ids may hold a `/` (`org/model`, which SDKs encode); never a dot segment.
        if segment.param != Some("model") && decoded.iter().any(slash) {
            return Err(bad("must be a single path segment (no encoded `/` or `\\`)"));
        }
        if decoded.split(slash).any(|part| part == b"." || part == b".." || part.is_empty()) {
            return Err(bad("`.` and `..` and empty segments are not allowed"));
        }
        if decoded.iter().any(|&b| b < 0x20 || b == 0x7f) {
            return Err(bad("control characters are not allowed"));
        }
    }
    Ok(())
}

/// The largest `limit` of a list endpoint: `Some(None)` when any positive integer goes,
/// `None` when `path` is not a list the gateway checks.
fn list_limit(path: &str) -> Option<Option<u64>> {
    let segments = segments(path);
    let last = segments.last().filter(|s| s.param.is_none())?;
    match last.raw {
        "batches" | "assistants" | "messages" | "runs" | "steps" | "vector_stores" => Some(Some(100)),
        // Top-level files list up to 10,000; a vector store's files up to 100.
        "files" if segments.len() == 1 => Some(Some(10_000)),
        "files" => Some(Some(100)),
        "jobs" | "events" | "checkpoints" | "permissions" => Some(None),
        _ => None,
    }
}

/// The query of a `GET` list (`limit`, `order`, `after`, `before`), percent-decoded.
pub(crate) fn check_query(method: &str, path: &str, query: Option<&str>) -> Result<(), GatewayError> {
    let Some(max) = list_limit(path).filter(|_| matches!(method, "GET" | "HEAD")) else {
        return Ok(());
    };
    let mut seen: Vec<&str> = Vec::new();
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let broken = || {
            GatewayError::invalid_param("query", format!("broken percent-encoding in the query: `{pair}`"))
                .with_code("invalid_value")
        };
        let name = percent::decode(raw_name, true).ok_or_else(broken)?;
        let Some(name) = ["limit", "order", "after", "before"].into_iter().find(|n| n.as_bytes() == name) else {
            continue;
        };
        let bad = |why: String| GatewayError::invalid_param(name, why).with_code("invalid_value");
        if seen.contains(&name) {
            return Err(bad(format!("`{name}` is given more than once")));
        }
        seen.push(name);
        let value = percent::decode(raw_value, true).ok_or_else(broken)?;
        let value = String::from_utf8_lossy(&value);
        match name {
            "limit" => {
                let limit = value.parse::<u64>().ok().filter(|n| *n >= 1 && max.is_none_or(|m| *n <= m));
                if limit.is_none() {
                    return Err(bad(match max {
                        Some(m) => format!("`limit` must be an integer from 1 to {m}, got `{value}`"),
                        None => format!("`limit` must be a positive integer, got `{value}`"),
                    }));
                }
            }
            "order" if value != "asc" && value != "desc" => {
                return Err(bad(format!("`order` must be `asc` or `desc`, got `{value}`")));
            }
            "after" | "before" if value.is_empty() => {
                return Err(bad(format!("`{name}` must be a non-empty cursor")));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Which resource request bodies the gateway reads (JSON, checked, then sent as they came).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceBody {
    BatchCreate,
    Assistant,
    Message,
    /// `POST /threads`: the thread's first messages.
    ThreadCreate,
    /// `POST /threads/runs`: a thread made with its messages, and run.
    ThreadAndRun,
    /// `POST /threads/{id}/runs`: messages added before the run.
    RunCreate,
    FineTuningJob,
}

/// The body kind of `method path`, when the gateway checks it.
pub(crate) fn checked_body(method: &str, path: &str) -> Option<ResourceBody> {
    if method != "POST" {
        return None;
    }
    let segments = segments(path);
    let names: Vec<&str> = segments.iter().map(|s| if s.param.is_some() { "{}" } else { s.raw }).collect();
    match names.as_slice() {
        ["batches"] => Some(ResourceBody::BatchCreate),
        ["assistants"] | ["assistants", "{}"] => Some(ResourceBody::Assistant),
        ["threads", "{}", "messages"] | ["threads", "{}", "messages", "{}"] => Some(ResourceBody::Message),
        ["threads"] => Some(ResourceBody::ThreadCreate),
        // `runs` stands where a thread's id would.
        ["threads", "{}"] if segments.get(1).is_some_and(|s| s.raw == "runs") => Some(ResourceBody::ThreadAndRun),
        ["threads", "{}", "runs"] => Some(ResourceBody::RunCreate),
        ["fine_tuning", "jobs"] => Some(ResourceBody::FineTuningJob),
        _ => None,
    }
}

const BATCH_ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// The spec's limits on a resource body (spec 4.7 and 8).
pub(crate) fn check_body(kind: ResourceBody, body: &Map<String, Value>) -> Result<(), GatewayError> {
    match kind {
        ResourceBody::BatchCreate => check_batch(body)?,
        ResourceBody::Assistant => {
            for (field, max) in [("name", 256), ("description", 512), ("instructions", 256_000)] {
                check_text(body, field, max)?;
            }
            check_array(body, "tools", 128)?;
        }
        ResourceBody::Message => {}
        // Messages made inside other bodies keep a message's limits.
        ResourceBody::ThreadCreate => return check_messages(body.get("messages"), "messages"),
        ResourceBody::ThreadAndRun => {
            let messages = body.get("thread").and_then(|thread| thread.get("messages"));
            return check_messages(messages, "thread.messages");
        }
        ResourceBody::RunCreate => return check_messages(body.get("additional_messages"), "additional_messages"),
        ResourceBody::FineTuningJob => return check_array(body, "integrations", 5),
    }
    check_metadata(body.get("metadata"), "metadata")
}

/// The metadata of each message in `messages` (an array at `param`; anything else is the
/// provider's to refuse).
fn check_messages(messages: Option<&Value>, param: &str) -> Result<(), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Ok(());
    };
    for (index, message) in messages.iter().enumerate() {
        if let Some(metadata) = message.get("metadata") {
            check_metadata(Some(metadata), &format!("{param}[{index}].metadata"))?;
        }
    }
    Ok(())
}

fn check_batch(body: &Map<String, Value>) -> Result<(), GatewayError> {
    let required = |field: &str| {
        body.get(field).ok_or_else(|| {
            GatewayError::invalid_param(field, format!("`{field}` is required")).with_code("missing_required_parameter")
        })
    };
    let string = |field: &'static str| {
        required(field)?.as_str().ok_or_else(|| {
            GatewayError::invalid_param(field, format!("`{field}` must be a string")).with_code("invalid_type")
        })
    };
    if string("input_file_id")?.is_empty() {
        return Err(GatewayError::invalid_param("input_file_id", "`input_file_id` must not be empty")
            .with_code("invalid_value"));
    }
    let endpoint = string("endpoint")?;
    if !BATCH_ENDPOINTS.contains(&endpoint) {
        return Err(GatewayError::invalid_param(
            "endpoint",
            format!("`endpoint` must be one of {}, got `{endpoint}`", BATCH_ENDPOINTS.join(", ")),
        )
        .with_code("invalid_value"));
    }
    match string("completion_window")? {
        // `immediate` is the gateway's own batching: the pipeline sends it to the control
        // plane, or answers `immediate_unavailable` without one.
        "24h" | "immediate" => Ok(()),
        other => Err(GatewayError::invalid_param(
            "completion_window",
            format!("`completion_window` must be `24h` or `immediate`, got `{other}`"),
        )
        .with_code("invalid_value")),
    }
}

/// A checked `POST /batches` body asking for the gateway's own batching.
pub(crate) fn is_immediate(kind: ResourceBody, body: &Map<String, Value>) -> bool {
    kind == ResourceBody::BatchCreate && body.get("completion_window").and_then(Value::as_str) == Some("immediate")
}

/// `completion_window: "immediate"` without a control plane.
pub(crate) fn immediate_unavailable() -> GatewayError {
    GatewayError::new(
        501,
        "invalid_request_error",
        "completion_window `immediate` is the gateway's own batching, which needs the control plane; \
         none is configured (use `24h` for the provider's batch API)",
    )
    .with_code("not_implemented")
}

/// Prefixes of the ids the control plane gives managed batches and their output files.
pub(crate) const MANAGED_BATCH_PREFIX: &str = "batch_gw_";
pub(crate) const MANAGED_FILE_PREFIX: &str = "file-gw-";

/// The control plane's path of a request about a managed batch or file (`GET /batches/{id}`,
/// `POST /batches/{id}/cancel`, `GET` and `DELETE /files/{id}`, `GET /files/{id}/content`;
/// `path` after `/v1`, already checked by `check_path`), or `None` when the provider serves it.
pub(crate) fn managed_path(method: &str, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let managed = match (method, parts.as_slice()) {
        ("GET", ["batches", id]) | ("POST", ["batches", id, "cancel"]) => id.starts_with(MANAGED_BATCH_PREFIX),
        ("GET" | "DELETE", ["files", id]) | ("GET", ["files", id, "content"]) => id.starts_with(MANAGED_FILE_PREFIX),
        _ => false,
    };
    managed.then(|| format!("/internal/v1{path}"))
}

/// The control plane's path (with the client's query) of a routed resource request it
/// serves instead of the provider: the batch and file lists, which it answers with the
/// managed batches and the files kept by the gateway beside the provider's (unless `fetch`:
/// the control plane's own read of the provider's list), and a file upload when the provider
/// has no files API (`serves_resources` false).
pub(crate) fn shared_path(
    method: &str,
    path: &str,
    query: Option<&str>,
    fetch: bool,
    serves_resources: bool,
) -> Option<String> {
    match (method, path) {
        ("GET", "/batches" | "/files") if !fetch => Some(match query {
            Some(query) => format!("/internal/v1{path}?{query}"),
            None => format!("/internal/v1{path}"),
        }),
        ("POST", "/files") if !serves_resources => Some("/internal/v1/files".to_string()),
        _ => None,
    }
}

/// A string (or null) of at most `max` characters.
fn check_text(body: &Map<String, Value>, field: &str, max: usize) -> Result<(), GatewayError> {
    let size = |value: &Value| value.as_str().map(|text| text.chars().count());
    check_size(body, field, max, size, ("a string", "characters", "string_above_max_length"))
}

/// An array (or null) of at most `max` items.
fn check_array(body: &Map<String, Value>, field: &str, max: usize) -> Result<(), GatewayError> {
    let size = |value: &Value| value.as_array().map(Vec::len);
    check_size(body, field, max, size, ("an array", "items", "array_above_max_length"))
}

/// `field` absent, null, or a value whose `size` (None: the wrong type) is at most `max`;
/// the last three name the type, the unit and the error code.
fn check_size(
    body: &Map<String, Value>,
    field: &str,
    max: usize,
    size: impl Fn(&Value) -> Option<usize>,
    (kind, unit, code): (&str, &str, &'static str),
) -> Result<(), GatewayError> {
    let Some(value) = body.get(field).filter(|v| !v.is_null()) else {
        return Ok(());
    };
    match size(value) {
        Some(n) if n <= max => Ok(()),
        Some(_) => {
            Err(GatewayError::invalid_param(field, format!("`{field}` must have at most {max} {unit}")).with_code(code))
        }
        None => {
            Err(GatewayError::invalid_param(field, format!("`{field}` must be {kind} or null"))
                .with_code("invalid_type"))
        }
    }
}

/// Metadata: null, or at most 16 pairs of string keys up to 64 characters and string
/// values up to 512.
/// Metadata at `param`: up to 16 pairs, keys up to 64 characters, string values up to 512.
fn check_metadata(metadata: Option<&Value>, param: &str) -> Result<(), GatewayError> {
    let bad = |why: String| GatewayError::invalid_param(param, why).with_code("invalid_value");
    let pairs = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(pairs)) => pairs,
        Some(_) => return Err(bad(format!("`{param}` must be an object of string values or null"))),
    };
    if pairs.len() > 16 {
        return Err(bad(format!("`{param}` may have at most 16 pairs, got {}", pairs.len())));
    }
    for (key, value) in pairs {
        if key.chars().count() > 64 {
            return Err(bad(format!("`{param}` keys must be at most 64 characters: `{key}`")));
        }
        match value {
            Value::String(text) if text.chars().count() <= 512 => {}
            Value::String(_) => return Err(bad(format!("`{param}.{key}` must be at most 512 characters"))),
            _ => return Err(bad(format!("`{param}.{key}` must be a string"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn path_param(path: &str) -> Option<String> {
        check_path(path).err().map(|e| {
            assert_eq!((e.status, e.code), (400, Some("invalid_value")), "{path}");
            e.param.unwrap_or_default()
        })
    }

    #[test]
    fn path_parameters_are_single_segments() {
        for ok in [
            "/batches",
            "/batches/batch_1/cancel",
            "/files/file-1/content",
            "/fine_tuning/jobs/ftjob-1/checkpoints",
            "/threads/t1/messages/m1",
            "/threads/t1/runs/r1/steps/s1",
            "/models/ft:gpt-4o:org::x",
            "/assistants/a%3Fb",
            "/batches/a.b",
            "/batches/...",
            "/models/meta-llama%2FLlama-3.1-8B",
        ] {
            assert_eq!(path_param(ok), None, "{ok}");
        }
        for (path, param) in [
            ("/batches/", "batch_id"),
            ("/batches//cancel", "batch_id"),
            ("/batches/a%2Fb", "batch_id"),
            ("/batches/a%2fb/cancel", "batch_id"),
            ("/batches/a%5Cb", "batch_id"),
            ("/batches/..", "batch_id"),
            ("/batches/.", "batch_id"),
            ("/batches/%2e%2e/cancel", "batch_id"),
            ("/batches/%2E", "batch_id"),
            ("/batches/a%00", "batch_id"),
            ("/batches/a%0Ab", "batch_id"),
            ("/batches/a\tb", "batch_id"),
            ("/batches/a%7f", "batch_id"),
            ("/batches/a%zz", "batch_id"),
            ("/batches/a%2", "batch_id"),
            ("/fine_tuning/jobs/%2e%2e/cancel", "fine_tuning_job_id"),
            ("/fine_tuning/jobs/x%2F..%2Fy/checkpoints", "fine_tuning_job_id"),
            ("/assistants/..", "assistant_id"),
            ("/threads/..%2F/messages/m", "thread_id"),
            ("/threads/t/messages/%2e", "message_id"),
            ("/files/a%2fb/content", "file_id"),
            ("/fine_tuning/../batches", "path"),
            ("/fine_tuning//jobs", "path"),
            ("/models/..%2Fbatches", "model"),
            ("/models/a%2F%2E", "model"),
            ("/models/a%2F", "model"),
        ] {
            assert_eq!(path_param(path).as_deref(), Some(param), "{path}");
        }
    }

    fn query_error(method: &str, path: &str, query: &str) -> Option<String> {
        check_query(method, path, Some(query)).err().map(|e| {
            assert_eq!((e.status, e.code), (400, Some("invalid_value")), "{query}");
            e.param.unwrap_or_default()
        })
    }

    #[test]
    fn list_queries() {
        for (path, query) in [
            ("/batches", "limit=1"),
            ("/batches", "limit=100&after=batch_1"),
            ("/assistants", "order=asc&before=a&limit=20"),
            ("/assistants", "order=%64esc"),
            ("/assistants", "unknown=&x&&"),
            ("/fine_tuning/jobs/j/checkpoints", "limit=100000"),
            ("/fine_tuning/jobs", "limit=1000"),
            ("/files", "limit=10000&order=desc"),
            ("/threads/t/messages", "limit=100&order=asc"),
            // Not lists: nothing is checked.
            ("/batches/b1", "limit=0"),
            ("/files/f/content", "limit=0"),
            ("/models", "limit=0"),
        ] {
            assert_eq!(query_error("GET", path, query), None, "{path}?{query}");
        }
        // Only GET lists are checked.
        assert_eq!(query_error("POST", "/batches", "limit=0"), None);
        assert!(check_query("GET", "/batches", None).is_ok());
        for (path, query, param) in [
            ("/batches", "limit=0", "limit"),
            ("/batches", "limit=101", "limit"),
            ("/batches", "limit=-1", "limit"),
            ("/batches", "limit=1.5", "limit"),
            ("/batches", "limit=", "limit"),
            ("/batches", "limit", "limit"),
            ("/batches", "limit=%31%30%31", "limit"),
            ("/batches", "l%69mit=0", "limit"),
            ("/batches", "limit=+5", "limit"),
            ("/batches", "limit=2&limit=3", "limit"),
            ("/batches", "after=", "after"),
            ("/batches", "limit=%zz", "query"),
            ("/assistants", "order=sideways", "order"),
            ("/assistants", "order=ASC", "order"),
            ("/assistants", "before=", "before"),
            ("/assistants", "limit=101", "limit"),
            ("/fine_tuning/jobs/j/checkpoints", "limit=0", "limit"),
            ("/fine_tuning/jobs/j/checkpoints", "limit=99999999999999999999999", "limit"),
            ("/fine_tuning/jobs/j/events", "limit=x", "limit"),
            ("/fine_tuning/jobs", "after=", "after"),
            ("/files", "limit=10001", "limit"),
            ("/threads/t/messages", "limit=101", "limit"),
            ("/threads/t/messages", "order=up", "order"),
        ] {
            assert_eq!(query_error("GET", path, query).as_deref(), Some(param), "{path}?{query}");
        }
    }

    #[test]
    fn managed_batches_and_files_go_to_the_control_plane() {
        assert_eq!(managed_path("GET", "/batches/batch_gw_1"), Some("/internal/v1/batches/batch_gw_1".into()));
        assert_eq!(
            managed_path("POST", "/batches/batch_gw_1/cancel"),
            Some("/internal/v1/batches/batch_gw_1/cancel".into())
        );
        assert_eq!(managed_path("GET", "/files/file-gw-9"), Some("/internal/v1/files/file-gw-9".into()));
        assert_eq!(
            managed_path("GET", "/files/file-gw-9/content"),
            Some("/internal/v1/files/file-gw-9/content".into())
        );
        // The provider's own ids, other methods and lists stay with the provider.
        assert_eq!(managed_path("GET", "/batches/batch_abc"), None);
        assert_eq!(managed_path("GET", "/files/file-abc/content"), None);
        assert_eq!(managed_path("DELETE", "/files/file-gw-9"), Some("/internal/v1/files/file-gw-9".into()));
        assert_eq!(managed_path("DELETE", "/files/file-abc"), None);
        assert_eq!(managed_path("DELETE", "/batches/batch_gw_1"), None);
        assert_eq!(managed_path("POST", "/batches/batch_gw_1"), None);
        assert_eq!(managed_path("GET", "/batches"), None);
    }

    #[test]
    fn the_lists_and_uploads_without_a_files_api_go_to_the_control_plane() {
        let shared = |method, path, query, fetch, serves| shared_path(method, path, query, fetch, serves);
        assert_eq!(shared("GET", "/batches", None, false, true), Some("/internal/v1/batches".into()));
        assert_eq!(
            shared("GET", "/batches", Some("limit=2&after=batch_gw_1"), false, false),
            Some("/internal/v1/batches?limit=2&after=batch_gw_1".into())
        );
        // The control plane's own read of the provider's list goes to the provider.
        assert_eq!(shared("GET", "/batches", Some("limit=2"), true, true), None);
        assert_eq!(shared("POST", "/files", None, false, false), Some("/internal/v1/files".into()));
        assert_eq!(shared("POST", "/files", None, false, true), None);
        for serves in [false, true] {
            let path = shared("GET", "/files", Some("purpose=batch&order=asc"), false, serves);
            assert_eq!(path, Some("/internal/v1/files?purpose=batch&order=asc".into()));
        }
        assert_eq!(shared("GET", "/files", None, true, true), None);
        assert_eq!(shared("GET", "/files/file-1", None, false, false), None);
        assert_eq!(shared("POST", "/batches", None, false, false), None);
    }

    #[test]
    fn which_bodies_are_read() {
        assert_eq!(checked_body("POST", "/batches"), Some(ResourceBody::BatchCreate));
        assert_eq!(checked_body("POST", "/assistants"), Some(ResourceBody::Assistant));
        assert_eq!(checked_body("POST", "/assistants/a1"), Some(ResourceBody::Assistant));
        assert_eq!(checked_body("POST", "/threads/t/messages"), Some(ResourceBody::Message));
        assert_eq!(checked_body("POST", "/threads/t/messages/m"), Some(ResourceBody::Message));
        assert_eq!(checked_body("POST", "/fine_tuning/jobs"), Some(ResourceBody::FineTuningJob));
        assert_eq!(checked_body("POST", "/threads"), Some(ResourceBody::ThreadCreate));
        assert_eq!(checked_body("POST", "/threads/runs"), Some(ResourceBody::ThreadAndRun));
        assert_eq!(checked_body("POST", "/threads/t/runs"), Some(ResourceBody::RunCreate));
        for (method, path) in [
            ("POST", "/files"),
            ("POST", "/uploads/u/parts"),
            ("POST", "/batches/b/cancel"),
            ("POST", "/threads/t"),
            ("POST", "/threads/t/runs/r"),
            ("GET", "/batches"),
            ("DELETE", "/assistants/a"),
        ] {
            assert_eq!(checked_body(method, path), None, "{method} {path}");
        }
    }

    fn body_error(kind: ResourceBody, body: Value) -> Option<(u16, String, &'static str)> {
        let Value::Object(map) = body else { panic!("an object") };
        check_body(kind, &map).err().map(|e| (e.status, e.param.unwrap_or_default(), e.code.unwrap_or_default()))
    }

    fn batch(extra: Value) -> Value {
        let mut body =
            json!({"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        body
    }

    #[test]
    fn batch_create() {
        for endpoint in BATCH_ENDPOINTS {
            assert_eq!(body_error(ResourceBody::BatchCreate, batch(json!({"endpoint": endpoint}))), None);
        }
        let metadata: Map<String, Value> = (0..16).map(|i| (format!("{i:0>64}"), json!("v".repeat(512)))).collect();
        assert_eq!(body_error(ResourceBody::BatchCreate, batch(json!({"metadata": metadata}))), None);
        assert_eq!(body_error(ResourceBody::BatchCreate, batch(json!({"metadata": null}))), None);
        let e = |extra| body_error(ResourceBody::BatchCreate, batch(extra)).unwrap();
        assert_eq!(e(json!({"completion_window": "48h"})), (400, "completion_window".into(), "invalid_value"));
        assert_eq!(body_error(ResourceBody::BatchCreate, batch(json!({"completion_window": "immediate"}))), None);
        let immediate = batch(json!({"completion_window": "immediate"}));
        assert!(is_immediate(ResourceBody::BatchCreate, immediate.as_object().unwrap()));
        assert!(!is_immediate(ResourceBody::BatchCreate, batch(json!({})).as_object().unwrap()));
        assert_eq!(immediate_unavailable().status, 501);
        assert_eq!(e(json!({"completion_window": 24})), (400, "completion_window".into(), "invalid_type"));
        assert_eq!(e(json!({"endpoint": "/v1/images/generations"})), (400, "endpoint".into(), "invalid_value"));
        assert_eq!(e(json!({"endpoint": "/chat/completions"})), (400, "endpoint".into(), "invalid_value"));
        assert_eq!(e(json!({"input_file_id": 7})), (400, "input_file_id".into(), "invalid_type"));
        assert_eq!(e(json!({"input_file_id": ""})), (400, "input_file_id".into(), "invalid_value"));
        let mut too_many = metadata.clone();
        too_many.insert("x".into(), json!("y"));
        for bad in [
            json!(too_many),
            json!({"k".repeat(65): "v"}),
            json!({"k": "v".repeat(513)}),
            json!({"k": 1}),
            json!(["k"]),
            json!("k"),
        ] {
            assert_eq!(e(json!({"metadata": bad})), (400, "metadata".into(), "invalid_value"));
        }
        // Characters, not bytes.
        assert_eq!(
            body_error(ResourceBody::BatchCreate, batch(json!({"metadata": {"é".repeat(64): "é".repeat(512)}}))),
            None
        );
        for field in ["input_file_id", "endpoint", "completion_window"] {
            let Value::Object(mut body) = batch(json!({})) else { panic!() };
            body.remove(field);
            let error = check_body(ResourceBody::BatchCreate, &body).unwrap_err();
            assert_eq!((error.param.as_deref(), error.code), (Some(field), Some("missing_required_parameter")));
        }
    }

    #[test]
    fn assistants_messages_and_fine_tuning() {
        let a = |body| body_error(ResourceBody::Assistant, body);
        let full = json!({"model": "m", "name": "n".repeat(256), "description": "d".repeat(512),
            "instructions": "i".repeat(256_000), "tools": vec![json!({"type": "code_interpreter"}); 128],
            "metadata": {"k": "v"}});
        assert_eq!(a(full), None);
        assert_eq!(a(json!({"name": null, "description": null, "instructions": null, "tools": null})), None);
        assert_eq!(a(json!({"name": "n".repeat(257)})), Some((400, "name".into(), "string_above_max_length")));
        assert_eq!(a(json!({"description": "d".repeat(513)})).unwrap().1, "description");
        assert_eq!(a(json!({"instructions": "i".repeat(256_001)})).unwrap().1, "instructions");
        assert_eq!(a(json!({"name": 1})), Some((400, "name".into(), "invalid_type")));
        let tools = vec![json!({"type": "function"}); 129];
        assert_eq!(a(json!({"tools": tools})), Some((400, "tools".into(), "array_above_max_length")));
        assert_eq!(a(json!({"tools": {}})), Some((400, "tools".into(), "invalid_type")));
        assert_eq!(a(json!({"metadata": {"k": 1}})).unwrap().1, "metadata");
        let m = |body| body_error(ResourceBody::Message, body);
        assert_eq!(m(json!({"role": "user", "content": "hi", "metadata": {"k": "v"}})), None);
        assert_eq!(m(json!({"metadata": {"k": "v".repeat(513)}})).unwrap().1, "metadata");
        // Messages made inside a thread's or a run's body keep a message's limits.
        let seventeen: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let message = json!({"role": "user", "content": "hi", "metadata": seventeen});
        let ok = json!({"role": "user", "content": "hi", "metadata": {"k": "v"}});
        let thread = |body| body_error(ResourceBody::ThreadCreate, body);
        assert_eq!(
            thread(json!({"messages": [ok, message]})),
            Some((400, "messages[1].metadata".into(), "invalid_value"))
        );
        assert_eq!(thread(json!({"messages": [ok], "metadata": {"thread": "not a message"}})), None);
        let run =
            body_error(ResourceBody::ThreadAndRun, json!({"assistant_id": "a", "thread": {"messages": [message]}}));
        assert_eq!(run.unwrap().1, "thread.messages[0].metadata");
        let run = body_error(ResourceBody::RunCreate, json!({"assistant_id": "a", "additional_messages": [message]}));
        assert_eq!(run.unwrap().1, "additional_messages[0].metadata");
        assert_eq!(body_error(ResourceBody::RunCreate, json!({"assistant_id": "a", "metadata": seventeen})), None);
        let f = |body| body_error(ResourceBody::FineTuningJob, body);
        assert_eq!(f(json!({"integrations": vec![json!({"type": "wandb"}); 5]})), None);
        let six = vec![json!({"type": "wandb"}); 6];
        assert_eq!(f(json!({"integrations": six})), Some((400, "integrations".into(), "array_above_max_length")));
    }
}
