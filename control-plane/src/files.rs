//! Files the gateway keeps itself (issue 16): the managed batches' output and error files,
//! and files uploaded with `POST /v1/files` when the selected provider has no files API (the
//! filter relays those uploads here, streamed). An upload is read part by part and stored in
//! chunks as it arrives (never whole in memory), and becomes visible only once complete.
//! Everything is per workspace: another workspace's id is a 404.

use crate::auth;
use crate::db::batches::{Cursor, FileRow};
use crate::db::now_s;
use crate::errors::{ApiError, ApiResult};
use crate::gateway::workspace;
use crate::lists::{Listing, OwnItems};
use crate::validate::Path;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

/// The prefix of the ids of the files the gateway keeps.
pub const FILE_PREFIX: &str = "file-gw-";
/// Bytes of an upload per stored chunk.
const CHUNK_BYTES: usize = 1024 * 1024;
/// The longest `purpose` (and filename) taken.
const MAX_FIELD_CHARS: usize = 256;

fn file_object(file: &FileRow) -> Value {
    json!({
        "id": file.id, "object": "file", "bytes": file.bytes, "created_at": file.created_at,
        "filename": file.filename, "purpose": file.purpose, "status": "processed", "status_details": null,
    })
}

fn too_large(max: u64) -> ApiError {
    let message = format!("the file is larger than the gateway's limit of {max} bytes");
    ApiError::new(413, "invalid_request_error", &message, Some("file"), Some("file_too_large"))
}

/// Deletes the chunks of an upload that did not complete, however it ended (an error, or the
/// client gone and the handler dropped).
struct Partial {
    state: AppState,
    id: String,
    kept: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let (state, id) = (self.state.clone(), std::mem::take(&mut self.id));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = state.db.delete_file_chunks(&id).await {
                    eprintln!("control plane: deleting the chunks of an unfinished upload {id}: {e}");
                }
            });
        }
    }
}

/// `POST /internal/v1/files`: a multipart upload (`purpose`, `file`) of at most
/// `max_file_bytes`, answered with its file object.
pub async fn upload(State(s): State<AppState>, request: Request) -> ApiResult<Json<Value>> {
    let h = request.headers().clone();
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let max = s.batches.settings.max_file_bytes;
    let declared = h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max.saturating_add(64 * 1024)) {
        return Err(too_large(max));
    }
    let mut form = Multipart::from_request(request, &s)
        .await
        .map_err(|e| ApiError::invalid("file", &format!("the body must be multipart/form-data: {}", e.body_text())))?;
    let id = format!("{FILE_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let mut partial = Partial { state: s.clone(), id: id.clone(), kept: false };
    let (mut purpose, mut file) = (None, None);
    let broken = |e: axum::extract::multipart::MultipartError| ApiError::invalid("file", &e.body_text());
    while let Some(mut field) = form.next_field().await.map_err(broken)? {
        match field.name() {
            Some("purpose") => {
                let text = field.text().await.map_err(broken)?;
                if text.chars().count() > MAX_FIELD_CHARS {
                    return Err(ApiError::invalid("purpose", "purpose is too long"));
                }
                purpose = Some(text);
            }
            Some("file") if file.is_none() => {
                let filename = field.file_name().unwrap_or("upload").chars().take(MAX_FIELD_CHARS).collect::<String>();
                let (mut size, mut seq, mut pending) = (0u64, 0i64, Vec::with_capacity(CHUNK_BYTES));
                while let Some(bytes) = field.chunk().await.map_err(broken)? {
                    size = size.saturating_add(bytes.len() as u64);
                    if size > max {
                        return Err(too_large(max));
                    }
                    pending.extend_from_slice(&bytes);
                    while pending.len() >= CHUNK_BYTES {
                        let rest = pending.split_off(CHUNK_BYTES);
                        s.db.insert_file_chunk(&id, seq, &STANDARD.encode(&pending)).await?;
                        (pending, seq) = (rest, seq + 1);
                    }
                }
                if !pending.is_empty() {
                    s.db.insert_file_chunk(&id, seq, &STANDARD.encode(&pending)).await?;
                }
                file = Some((filename, size));
            }
            // Other fields (and a second file) are read and dropped, as OpenAI ignores them.
            _ => while field.chunk().await.map_err(broken)?.is_some() {},
        }
    }
    let Some((filename, size)) = file else {
        return Err(ApiError::invalid("file", "the form has no `file` part"));
    };
    let Some(purpose) = purpose.filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid("purpose", "the form has no `purpose` part"));
    };
    let row = FileRow {
        id,
        workspace,
        purpose,
        filename,
        bytes: i64::try_from(size).unwrap_or(i64::MAX),
        content: String::new(),
        created_at: now_s(),
    };
    s.db.insert_file(&row).await?;
    partial.kept = true;
    Ok(Json(file_object(&row)))
}

/// The files a workspace keeps in the gateway (only those of the query's `purpose`), in the
/// file list: `order` `desc` by default; OpenAI's default and largest page, 10,000.
pub(crate) struct GatewayFiles {
    s: AppState,
    workspace: String,
    purpose: Option<String>,
}

impl OwnItems for GatewayFiles {
    const LISTING: Listing = Listing {
        resource: "files",
        item: "file",
        prefix: FILE_PREFIX,
        default_limit: 10_000,
        max_limit: 10_000,
        ordered: true,
    };

    fn of(s: &AppState, workspace: String, params: &[(String, String)]) -> Self {
        let purpose =
            params.iter().find(|(name, _)| name == "purpose").map(|(_, v)| v.clone()).filter(|v| !v.is_empty());
        GatewayFiles { s: s.clone(), workspace, purpose }
    }

    async fn position(&self, id: &str) -> ApiResult<Option<(i64, String)>> {
        Ok(self.s.db.file(id, &self.workspace).await?.map(|f| (f.created_at, f.id)))
    }

    async fn page(&self, cursor: &Cursor, newest_first: bool, limit: usize) -> ApiResult<Vec<Value>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let purpose = self.purpose.as_deref();
        let files = self.s.db.list_files(&self.workspace, purpose, cursor, newest_first, limit).await?;
        Ok(files.iter().map(file_object).collect())
    }
}

/// `GET /internal/v1/files/{id}`.
pub async fn file(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let file = s.db.file(&id, &workspace).await?.ok_or_else(|| ApiError::not_found("file"))?;
    Ok(Json(file_object(&file)))
}

/// `DELETE /internal/v1/files/{id}`.
pub async fn delete(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    if !s.db.delete_file(&id, &workspace).await? {
        return Err(ApiError::not_found("file"));
    }
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}

/// `GET /internal/v1/files/{id}/content`: its bytes, streamed chunk by chunk.
pub async fn content(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    let workspace = workspace(&h)?;
    let file = s.db.file(&id, &workspace).await?.ok_or_else(|| ApiError::not_found("file"))?;
    let first = Bytes::from(file.content.into_bytes());
    let chunks = futures_util::stream::unfold(Some((s, file.id, 0i64)), |next| async move {
        let (s, id, seq) = next?;
        match read_chunk(&s, &id, seq).await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some((s, id, seq + 1)))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    let leading = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(first) });
    let body = Body::from_stream(futures_util::StreamExt::chain(leading, chunks));
    let kind = if file.purpose == "batch_output" { "application/jsonl" } else { "application/octet-stream" };
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, kind)], body).into_response())
}

async fn read_chunk(s: &AppState, id: &str, seq: i64) -> Result<Option<Bytes>, String> {
    let data = s.db.file_chunk(id, seq).await.map_err(|e| format!("database: {e}"))?;
    data.map(|d| STANDARD.decode(d).map(Bytes::from).map_err(|e| format!("file {id} chunk {seq}: {e}"))).transpose()
}

/// The whole of `workspace`'s file `id` (a managed batch's input), or `None` when it has none.
pub async fn read_all(s: &AppState, id: &str, workspace: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(file) = s.db.file(id, workspace).await.map_err(|e| format!("database: {e}"))? else {
        return Ok(None);
    };
    let mut bytes = file.content.into_bytes();
    let mut seq = 0;
    while let Some(chunk) = read_chunk(s, id, seq).await? {
        bytes.extend_from_slice(&chunk);
        seq += 1;
    }
    Ok(Some(bytes))
}
