//! Responses the gateway keeps (migration 0007): one row per workspace and id, its response
//! object and input items as JSON text.

use super::{now_s, Db, DbResult};
use sqlx::Row;

/// A kept response as stored: both values JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptResponse {
    pub response: String,
    pub input: String,
}

impl Db {
    /// Stores `workspace`'s response `id`, replacing what the same id held.
    pub async fn keep_response(&self, workspace: &str, id: &str, kept: &KeptResponse) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO kept_responses (workspace, id, created_at, response, input) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (workspace, id) DO UPDATE SET created_at = excluded.created_at, \
             response = excluded.response, input = excluded.input",
        )
        .bind(workspace)
        .bind(id)
        .bind(now_s())
        .bind(&kept.response)
        .bind(&kept.input)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn kept_response(&self, workspace: &str, id: &str) -> DbResult<Option<KeptResponse>> {
        let row = sqlx::query("SELECT response, input FROM kept_responses WHERE workspace = $1 AND id = $2")
            .bind(workspace)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(KeptResponse { response: r.try_get("response")?, input: r.try_get("input")? })).transpose()
    }

    /// Deletes `workspace`'s response `id`; whether there was one.
    pub async fn delete_kept_response(&self, workspace: &str, id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM kept_responses WHERE workspace = $1 AND id = $2")
            .bind(workspace)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
