//! Answers in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use gateway_schema::SharedError;

#[derive(Debug)]
pub struct ApiError(pub SharedError);

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: u16, kind: &str, message: &str, param: Option<&str>, code: Option<&str>) -> ApiError {
        ApiError(SharedError::new(status, kind, message, param, code))
    }

    /// 400 naming the field at fault.
    pub fn invalid(param: &str, message: &str) -> ApiError {
        ApiError::new(400, "invalid_request_error", message, Some(param), None)
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(404, "invalid_request_error", &format!("{what} not found"), None, Some("not_found"))
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError::new(401, "authentication_error", message, None, Some("invalid_api_key"))
    }

    pub fn forbidden(message: &str) -> ApiError {
        ApiError::new(403, "permission_error", message, None, Some("admin_required"))
    }

    /// A failure of ours; the detail goes to the log, not to the client.
    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        eprintln!("control plane error: {detail}");
        ApiError::new(500, "server_error", "the control plane failed; see its log", None, None)
    }
}

impl From<SharedError> for ApiError {
    fn from(e: SharedError) -> ApiError {
        ApiError(e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        if database_unavailable(&e) {
            eprintln!("control plane: database unavailable: {e}");
            return ApiError::new(
                503,
                "server_error",
                "the control plane's database is unavailable; retry",
                None,
                Some("database_unavailable"),
            );
        }
        ApiError::internal(format!("database: {e}"))
    }
}

/// Whether the database could not be reached or is restarting (a retry may succeed), rather
/// than refusing what was asked: no connection, a connection lost, PostgreSQL shutting down or
/// starting up (SQLSTATE class 08, 57P01-57P03, 53300), SQLite busy past its timeout.
fn database_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| match code.parse::<i32>() {
            // SQLite's (extended) result codes: SQLITE_BUSY and SQLITE_LOCKED in the low byte.
            Ok(sqlite) => matches!(sqlite & 0xff, 5 | 6),
            Err(_) => code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03" | "53300"),
        }),
        _ => false,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, [(header::CONTENT_TYPE, "application/json")], self.0.body).into_response()
    }
}
