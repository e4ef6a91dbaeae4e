//! Gateway-managed batches (issue 16, `completion_window: "immediate"`). The filter relays
//! `POST /v1/batches` (and the requests about `batch_gw_` / `file-gw-` ids) here with the
//! internal token, the caller's workspace (`x-gateway-workspace`) and the caller's gateway
//! headers. The batch is answered at once (`validating`); a task per batch then reads the
//! input file through the gateway as the caller, checks every line, and sends each line's
//! body through the gateway (routing, retries, cache and guardrails apply) with bounded
//! concurrency, writing the output and error files (OpenAI batch output JSONL) at the end.
//! Each finished line is stored at once: a restart resumes without running it again.

use crate::auth;
use crate::db::batches::{BatchRow, Cursor, FileRow, PendingLine};
use crate::db::now_s;
use crate::errors::{ApiError, ApiResult};
use crate::files::{self, FILE_PREFIX};
use crate::gateway::{caller_headers, send, send_full, workspace};
use crate::lists::{Listing, OwnItems};
use crate::validate::{json_object, Path, WholeBody};
use crate::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The prefix of the ids of managed batches.
pub const MANAGED_BATCH_PREFIX: &str = "batch_gw_";

/// The endpoints a batch may run.
pub const ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];
/// At most this many lines in one batch, and this many errors reported.
pub const MAX_LINES: usize = 50_000;
const MAX_ERRORS: usize = 1_000;
/// The default lease of a running batch.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// How batches run: `GATEWAY_URL` (default `http://127.0.0.1:8787`), where each line and the
/// input file go, and `GATEWAY_BATCH_CONCURRENCY` (default 4), lines in flight per batch.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    pub gateway_url: String,
    pub concurrency: usize,
    /// How long a control plane's hold on a batch lasts unless renewed (renewed every third
    /// of it); a batch whose holder stopped is taken over once it expired.
    pub lease_ms: u64,
    /// The largest file uploaded to the gateway (`GATEWAY_MAX_FILE_BYTES`, default 200 MiB as
    /// OpenAI's batch input files).
    pub max_file_bytes: u64,
}

/// The default of `max_file_bytes`.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 200 * 1024 * 1024;

impl BatchSettings {
    pub fn from_env() -> BatchSettings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        BatchSettings {
            gateway_url: var("GATEWAY_URL").unwrap_or_else(|| "http://127.0.0.1:8787".to_string()),
            concurrency: var("GATEWAY_BATCH_CONCURRENCY")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|n| *n > 0)
                .unwrap_or(4),
            lease_ms: DEFAULT_LEASE_MS,
            max_file_bytes: var("GATEWAY_MAX_FILE_BYTES")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_MAX_FILE_BYTES),
        }
    }
}

impl Default for BatchSettings {
    fn default() -> BatchSettings {
        BatchSettings {
            gateway_url: "http://127.0.0.1:8787".to_string(),
            concurrency: 4,
            lease_ms: DEFAULT_LEASE_MS,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// What the runner shares: settings, one HTTP client, the batches running in this process.
pub struct Runner {
    pub settings: BatchSettings,
    pub(crate) client: reqwest::Client,
    running: std::sync::Mutex<HashSet<String>>,
    /// This process's name in the batches' leases.
    owner: String,
}

impl Runner {
    /// `owner`: this control plane's name in the leases; the same across its restarts (see
    /// `runner_id`), so a restarted control plane takes its batches back at once.
    pub fn new(settings: BatchSettings, owner: String) -> Result<Runner, String> {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(Runner { settings, client, running: std::sync::Mutex::new(HashSet::new()), owner })
    }

    /// Marks `id` running; false when it already is.
    fn claim(&self, id: &str) -> bool {
        self.running.lock().map(|mut set| set.insert(id.to_string())).unwrap_or(false)
    }

    fn release(&self, id: &str) {
        if let Ok(mut set) = self.running.lock() {
            set.remove(id);
        }
    }
}

/// This control plane's name in the batches' leases: `<state>/batch-runner.id`, made on first
/// start.
pub fn runner_id(state_dir: &std::path::Path) -> Result<String, String> {
    let path = state_dir.join("batch-runner.id");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        _ => {
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::write(&path, &id).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(id)
        }
    }
}

// ---- endpoints (internal: the filter relays them) ----

/// `POST /internal/v1/batches`: the batch, `validating`, at once; its task does the rest.
pub async fn create(State(s): State<AppState>, h: HeaderMap, WholeBody(body): WholeBody) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let NewBatch { input, endpoint, metadata } = new_batch(&body)?;
    let headers = Value::Object(caller_headers(&h)).to_string();
    let sealed = s.key.seal(headers.as_bytes()).map_err(ApiError::internal)?;
    let id = format!("{MANAGED_BATCH_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let until = now_ms().saturating_add(i64::try_from(s.batches.settings.lease_ms).unwrap_or(i64::MAX));
    let lease = (s.batches.owner.as_str(), until);
    s.db.insert_batch(&id, &workspace, endpoint, &input, "immediate", metadata.as_deref(), &sealed, lease).await?;
    let row = s.db.batch(&id, Some(&workspace)).await?.ok_or_else(|| ApiError::internal("the new batch is gone"))?;
    // Created with this process's lease: its task starts at once.
    if s.batches.claim(&id) {
        start(&s, &id);
    }
    Ok(Json(batch_object(&row)))
}

/// What a `POST /internal/v1/batches` body asks for.
pub(crate) struct NewBatch {
    pub input: String,
    pub endpoint: &'static str,
    /// The metadata object's JSON text.
    pub metadata: Option<String>,
}

/// The body of a `POST /internal/v1/batches`: `input_file_id`, an `endpoint` of `ENDPOINTS`,
/// `completion_window` `immediate` and `metadata` (an object, or none); a 400 naming the field
/// at fault.
pub(crate) fn new_batch(body: &[u8]) -> ApiResult<NewBatch> {
    let body = json_object(body)?;
    let text = |field: &str| body.get(field).and_then(Value::as_str).filter(|t| !t.is_empty());
    let input = text("input_file_id").ok_or_else(|| ApiError::invalid("input_file_id", "input_file_id is required"))?;
    let endpoint = text("endpoint")
        .and_then(|e| ENDPOINTS.iter().copied().find(|known| *known == e))
        .ok_or_else(|| ApiError::invalid("endpoint", &format!("endpoint must be one of {}", ENDPOINTS.join(", "))))?;
    if text("completion_window") != Some("immediate") {
        return Err(ApiError::invalid("completion_window", "managed batches have completion_window `immediate`"));
    }
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(Value::Object(map.clone()).to_string()),
        Some(_) => return Err(ApiError::invalid("metadata", "metadata must be an object")),
    };
    Ok(NewBatch { input: input.to_string(), endpoint, metadata })
}

/// `GET /internal/v1/batches/{id}`.
pub async fn get(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let row = s.db.batch(&id, Some(&workspace)).await?.ok_or_else(|| ApiError::not_found("batch"))?;
    Ok(Json(batch_object(&row)))
}

/// The managed batches of a workspace, in the batch list: newest first (OpenAI's default of
/// 20 per page, at most 100), before the provider's.
pub(crate) struct ManagedBatches {
    s: AppState,
    workspace: String,
}

impl OwnItems for ManagedBatches {
    const LISTING: Listing = Listing {
        resource: "batches",
        item: "batch",
        prefix: MANAGED_BATCH_PREFIX,
        default_limit: 20,
        max_limit: 100,
        ordered: false,
    };

    fn of(s: &AppState, workspace: String, _params: &[(String, String)]) -> Self {
        ManagedBatches { s: s.clone(), workspace }
    }

    async fn position(&self, id: &str) -> ApiResult<Option<(i64, String)>> {
        Ok(self.s.db.batch(id, Some(&self.workspace)).await?.map(|b| (b.created_at, b.id)))
    }

    async fn page(&self, cursor: &Cursor, _newest_first: bool, limit: usize) -> ApiResult<Vec<Value>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Ok(self.s.db.list_batches(&self.workspace, cursor, limit).await?.iter().map(batch_object).collect())
    }
}

/// `POST /internal/v1/batches/{id}/cancel`: `cancelling` (with `cancelling_at`) at once; its
/// task stops sending lines and makes it `cancelled`.
pub async fn cancel(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let row = s.db.batch(&id, Some(&workspace)).await?.ok_or_else(|| ApiError::not_found("batch"))?;
    let moved = s.db.move_batch(&id, &["validating", "in_progress"], "cancelling", "cancelling_at").await?;
    let row = if moved { s.db.batch(&id, Some(&workspace)).await?.unwrap_or(row) } else { row };
    if !moved && row.status != "cancelling" && row.status != "cancelled" {
        let message = format!("cannot cancel a batch with status {}", row.status);
        return Err(ApiError::new(409, "invalid_request_error", &message, None, Some("batch_not_cancellable")));
    }
    if moved {
        // Its task may be gone (e.g. between restarts): it finishes the cancel.
        spawn(&s, &id);
    }
    Ok(Json(batch_object(&row)).into_response())
}

/// The batch object of spec 2.12.
pub fn batch_object(b: &BatchRow) -> Value {
    let parse = |text: &Option<String>| text.as_deref().and_then(|t| serde_json::from_str::<Value>(t).ok());
    json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": parse(&b.errors),
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": b.created_at,
        "in_progress_at": b.in_progress_at,
        "expires_at": null,
        "finalizing_at": b.finalizing_at,
        "completed_at": b.completed_at,
        "failed_at": b.failed_at,
        "expired_at": null,
        "cancelling_at": b.cancelling_at,
        "cancelled_at": b.cancelled_at,
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "metadata": parse(&b.metadata),
    })
}

// ---- input checks ----

/// One problem of the input file, as `errors.data[]` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub code: &'static str,
    pub message: String,
    /// 1-based; `None` for the file as a whole.
    pub line: Option<usize>,
    pub param: Option<&'static str>,
}

impl LineError {
    fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message, "line": self.line, "param": self.param})
    }
}

/// Checks every line of the input file (blank lines are skipped): a JSON object with a
/// unique string `custom_id`, `method` POST, `url` equal to `endpoint`, an object `body`.
/// The lines to run, or every problem found.
pub fn check_input(text: &str, endpoint: &str) -> Result<Vec<PendingLine>, Vec<LineError>> {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let error = |code, param, message: String| LineError { code, message, line: Some(number), param };
        let fields = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(fields)) => fields,
            _ => {
                errors.push(error("invalid_json_line", None, format!("line {number} is not a JSON object")));
                continue;
            }
        };
        let custom_id = match fields.get("custom_id").and_then(Value::as_str) {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => {
                errors.push(error(
                    "missing_custom_id",
                    Some("custom_id"),
                    "custom_id must be a non-empty string".into(),
                ));
                continue;
            }
        };
        if !seen.insert(custom_id.clone()) {
            errors.push(error(
                "duplicate_custom_id",
                Some("custom_id"),
                format!("custom_id `{custom_id}` is used twice"),
            ));
            continue;
        }
        if fields.get("method").and_then(Value::as_str) != Some("POST") {
            errors.push(error("invalid_method", Some("method"), "method must be POST".into()));
            continue;
        }
        if fields.get("url").and_then(Value::as_str) != Some(endpoint) {
            errors.push(error("invalid_url", Some("url"), format!("url must be the batch's endpoint {endpoint}")));
            continue;
        }
        let Some(body @ Value::Object(_)) = fields.get("body") else {
            errors.push(error("invalid_body", Some("body"), "body must be a JSON object".into()));
            continue;
        };
        let line = i64::try_from(number).unwrap_or(i64::MAX);
        lines.push(PendingLine { line, custom_id, body: body.to_string() });
    }
    if errors.is_empty() && lines.is_empty() {
        errors.push(LineError {
            code: "empty_file",
            message: "the input file has no lines".into(),
            line: None,
            param: None,
        });
    }
    if errors.is_empty() && lines.len() > MAX_LINES {
        let message = format!("a batch has at most {MAX_LINES} lines");
        errors.push(LineError { code: "too_many_lines", message, line: None, param: Some("input_file_id") });
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(errors)
    }
}

fn errors_json(errors: &[LineError]) -> String {
    let data: Vec<Value> = errors.iter().take(MAX_ERRORS).map(LineError::to_json).collect();
    json!({"object": "list", "data": data}).to_string()
}

// ---- the runner ----

/// Starts a task for every unfinished batch nobody holds (at start, and from `sweep`); how
/// many this process took.
pub async fn resume(s: &AppState) -> Result<usize, String> {
    let ids = s.db.unfinished_batches().await.map_err(|e| format!("database: {e}"))?;
    let mut taken = 0;
    for id in &ids {
        if s.batches.claim(id) {
            if lease(s, id).await? {
                taken += 1;
                start(s, id);
            } else {
                s.batches.release(id);
            }
        }
    }
    Ok(taken)
}

/// Resumes unfinished batches now, then every half lease: those of a control plane that
/// stopped are taken over once their lease expired.
pub async fn sweep(s: AppState) {
    let period = Duration::from_millis((s.batches.settings.lease_ms / 2).max(100));
    loop {
        if let Err(e) = resume(&s).await {
            eprintln!("control plane: resuming managed batches: {e}");
        }
        tokio::time::sleep(period).await;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Takes or renews this process's lease on batch `id`.
async fn lease(s: &AppState, id: &str) -> RunResult<bool> {
    let now = now_ms();
    let until = now.saturating_add(i64::try_from(s.batches.settings.lease_ms).unwrap_or(i64::MAX));
    db(s.db.lease_batch(id, &s.batches.owner, now, until).await)
}

/// Starts batch `id`'s task (a new batch, or a cancel) unless it runs here already.
pub fn spawn(s: &AppState, id: &str) {
    if !s.batches.claim(id) {
        return;
    }
    let state = s.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        match lease(&state, &id).await {
            Ok(true) => start(&state, &id),
            // Another control plane runs it.
            Ok(false) => state.batches.release(&id),
            Err(e) => {
                eprintln!("control plane: batch {id}: {e}");
                state.batches.release(&id);
            }
        }
    });
}

/// Runs batch `id` (claimed and leased), renewing its lease meanwhile.
fn start(s: &AppState, id: &str) {
    let state = s.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        let renewing = {
            let (state, id) = (state.clone(), id.clone());
            let period = Duration::from_millis((state.batches.settings.lease_ms / 3).max(50));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    if let Err(e) = lease(&state, &id).await {
                        eprintln!("control plane: batch {id}: renewing its lease: {e}");
                    }
                }
            })
        };
        if let Err(e) = run(&state, &id).await {
            eprintln!("control plane: batch {id}: {e}");
        }
        renewing.abort();
        if let Err(e) = state.db.release_batch(&id, &state.batches.owner).await {
            eprintln!("control plane: batch {id}: releasing its lease: {e}");
        }
        state.batches.release(&id);
    });
}

type RunResult<T> = Result<T, String>;

fn db<T>(result: Result<T, sqlx::Error>) -> RunResult<T> {
    result.map_err(|e| format!("database: {e}"))
}

async fn run(s: &AppState, id: &str) -> RunResult<()> {
    let Some(batch) = db(s.db.batch(id, None).await)? else {
        return Ok(());
    };
    let opened = s.key.open(&batch.headers)?;
    let headers: Map<String, Value> = serde_json::from_slice(&opened).map_err(|e| format!("sealed headers: {e}"))?;
    if batch.status == "validating" {
        validate(s, &batch, &headers).await?;
    }
    let status = db(s.db.batch(id, None).await)?.map(|b| b.status).unwrap_or_default();
    if status == "in_progress" {
        run_lines(s, &batch, &headers).await?;
    }
    finish(s, &batch).await
}

/// Reads the input file through the gateway as the caller and checks it: `in_progress`
/// with its lines, or `failed` with `errors`.
async fn validate(s: &AppState, batch: &BatchRow, headers: &Map<String, Value>) -> RunResult<()> {
    let read = if batch.input_file_id.starts_with(FILE_PREFIX) {
        // A file the gateway keeps (uploaded to it, or another batch's output): read here.
        match files::read_all(s, &batch.input_file_id, &batch.workspace).await? {
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Ok((200, text)),
                Err(_) => Ok((400, "the file is not UTF-8 text".to_string())),
            },
            None => Ok((404, format!("no file {} in this workspace", batch.input_file_id))),
        }
    } else {
        let url = format!("{}/v1/files/{}/content", s.batches.settings.gateway_url, batch.input_file_id);
        send(s.batches.client.get(url), headers).await
    };
    let text = match read {
        Ok((status, text)) if (200..300).contains(&status) => text,
        Ok((status, text)) => {
            let detail: String = text.chars().take(300).collect();
            let message = format!("the input file could not be read (status {status}): {detail}");
            return fail(s, batch, "input_file_unreadable", message).await;
        }
        Err(e) => {
            return fail(s, batch, "input_file_unreadable", format!("the input file could not be read: {e}")).await
        }
    };
    match check_input(&text, &batch.endpoint) {
        Ok(lines) => {
            db(s.db.start_batch(&batch.id, &lines).await)?;
        }
        Err(errors) => {
            db(s.db.fail_batch(&batch.id, &errors_json(&errors)).await)?;
        }
    }
    Ok(())
}

async fn fail(s: &AppState, batch: &BatchRow, code: &'static str, message: String) -> RunResult<()> {
    let error = LineError { code, message, line: None, param: Some("input_file_id") };
    db(s.db.fail_batch(&batch.id, &errors_json(&[error])).await)?;
    Ok(())
}

/// Sends each pending line through the gateway, `concurrency` at a time, until none is left
/// or the batch is being cancelled.
async fn run_lines(s: &AppState, batch: &BatchRow, headers: &Map<String, Value>) -> RunResult<()> {
    let lines = db(s.db.pending_lines(&batch.id).await)?;
    let permits = Arc::new(Semaphore::new(s.batches.settings.concurrency.max(1)));
    let headers = Arc::new(headers.clone());
    let mut tasks = JoinSet::new();
    for line in lines {
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let status = db(s.db.batch(&batch.id, None).await)?.map(|b| b.status).unwrap_or_default();
        if status != "in_progress" {
            break;
        }
        let (state, headers, id, endpoint) = (s.clone(), headers.clone(), batch.id.clone(), batch.endpoint.clone());
        tasks.spawn(async move {
            let result = run_line(&state, &endpoint, &headers, &line).await;
            let stored = state.db.finish_line(&id, line.line, result.0, &result.1).await;
            drop(permit);
            stored.map_err(|e| format!("database: {e}"))
        });
        // Finished lines are collected as they come (errors surface early).
        while let Some(done) = tasks.try_join_next() {
            done.map_err(|e| format!("line task: {e}"))??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("line task: {e}"))??;
    }
    Ok(())
}

/// One line through the gateway: (`succeeded` or `failed`, its output-file line).
async fn run_line(
    s: &AppState,
    endpoint: &str,
    headers: &Map<String, Value>,
    line: &PendingLine,
) -> (&'static str, String) {
    let url = format!("{}{}", s.batches.settings.gateway_url, endpoint);
    let request =
        s.batches.client.post(url).header(header::CONTENT_TYPE.as_str(), "application/json").body(line.body.clone());
    let id = format!("batch_req_{}", uuid::Uuid::new_v4().simple());
    match send_full(request, headers).await {
        Ok((status, request_id, text)) => {
            let body = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
            let ok = (200..300).contains(&status);
            let out = json!({
                "id": id, "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": request_id, "body": body},
                "error": null,
            });
            (if ok { "succeeded" } else { "failed" }, out.to_string())
        }
        Err(e) => {
            let out = json!({
                "id": id, "custom_id": line.custom_id, "response": null,
                "error": {"code": "request_failed", "message": e},
            });
            ("failed", out.to_string())
        }
    }
}

/// The lines are done (or the batch is being cancelled): `finalizing` → `completed` with its
/// files, or `cancelling` → `cancelled` with the files of what finished.
async fn finish(s: &AppState, batch: &BatchRow) -> RunResult<()> {
    let Some(now) = db(s.db.batch(&batch.id, None).await)? else {
        return Ok(());
    };
    match now.status.as_str() {
        "in_progress" => {
            if !db(s.db.move_batch(&batch.id, &["in_progress"], "finalizing", "finalizing_at").await)? {
                // Cancelled meanwhile.
                return Box::pin(finish(s, batch)).await;
            }
            write_files(s, &now).await?;
            db(s.db.move_batch(&batch.id, &["finalizing"], "completed", "completed_at").await)?;
        }
        "finalizing" => {
            write_files(s, &now).await?;
            db(s.db.move_batch(&batch.id, &["finalizing"], "completed", "completed_at").await)?;
        }
        "cancelling" => {
            write_files(s, &now).await?;
            db(s.db.move_batch(&batch.id, &["cancelling"], "cancelled", "cancelled_at").await)?;
        }
        _ => {}
    }
    Ok(())
}

/// The output file (succeeded lines) and the error file (failed ones), when any.
async fn write_files(s: &AppState, batch: &BatchRow) -> RunResult<()> {
    if batch.output_file_id.is_some() || batch.error_file_id.is_some() {
        return Ok(());
    }
    let mut ids = [None, None];
    for (slot, (status, name)) in ids.iter_mut().zip([("succeeded", "output"), ("failed", "error")]) {
        let lines = db(s.db.line_results(&batch.id, status).await)?;
        if lines.is_empty() {
            continue;
        }
        let mut content = lines.join("\n");
        content.push('\n');
        let id = format!("{FILE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let file = FileRow {
            id: id.clone(),
            workspace: batch.workspace.clone(),
            purpose: "batch_output".into(),
            filename: format!("{}_{name}.jsonl", batch.id),
            bytes: i64::try_from(content.len()).unwrap_or(i64::MAX),
            content,
            created_at: now_s(),
        };
        db(s.db.insert_file(&file).await)?;
        *slot = Some(id);
    }
    let [output, error] = ids;
    db(s.db.set_batch_files(&batch.id, output.as_deref(), error.as_deref()).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = "/v1/chat/completions";

    #[test]
    fn input_lines_are_checked_one_by_one() {
        let good = r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}"#;
        let lines = check_input(&format!("{good}\n\n"), CHAT).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!((lines[0].line, lines[0].custom_id.as_str()), (1, "a"));
        let text = [
            good,
            "not json",
            r#"{"method": "POST", "url": "/v1/chat/completions", "body": {}}"#,
            good,
            r#"{"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": {}}"#,
            r#"{"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}"#,
            r#"{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": []}"#,
        ]
        .join("\n");
        let errors = check_input(&text, CHAT).unwrap_err();
        let got: Vec<(&str, Option<usize>)> = errors.iter().map(|e| (e.code, e.line)).collect();
        assert_eq!(
            got,
            vec![
                ("invalid_json_line", Some(2)),
                ("missing_custom_id", Some(3)),
                ("duplicate_custom_id", Some(4)),
                ("invalid_method", Some(5)),
                ("invalid_url", Some(6)),
                ("invalid_body", Some(7)),
            ]
        );
        assert_eq!(check_input("\n", CHAT).unwrap_err()[0].code, "empty_file");
    }
}
