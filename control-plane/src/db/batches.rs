//! Gateway-managed batches, their lines and output files (migration 0003). Status changes
//! are conditional updates (`WHERE status = ...`), so a cancel and the runner never undo
//! each other.

use super::{now_s, Db, DbResult};
use sqlx::any::AnyRow;
use sqlx::Row;

/// A batch as stored (`headers` still sealed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    pub id: String,
    pub workspace: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: String,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// JSON text of the `errors` object.
    pub errors: Option<String>,
    /// JSON text of the `metadata` object.
    pub metadata: Option<String>,
    pub headers: String,
}

/// A line waiting to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingLine {
    pub line: i64,
    pub custom_id: String,
    pub body: String,
}

/// A file the control plane made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    pub id: String,
    pub workspace: String,
    pub purpose: String,
    pub filename: String,
    pub bytes: i64,
    pub content: String,
    pub created_at: i64,
}

/// A file's row; its `content` read apart (a list does not read it).
fn file_row(r: &AnyRow, content: String) -> DbResult<FileRow> {
    Ok(FileRow {
        id: r.try_get("id")?,
        workspace: r.try_get("workspace")?,
        purpose: r.try_get("purpose")?,
        filename: r.try_get("filename")?,
        bytes: r.try_get("bytes")?,
        content,
        created_at: r.try_get("created_at")?,
    })
}

const BATCH_COLUMNS: &str = "id, workspace, endpoint, input_file_id, completion_window, status, created_at, \
    in_progress_at, finalizing_at, completed_at, failed_at, cancelling_at, cancelled_at, total, completed, failed, \
    output_file_id, error_file_id, errors, metadata, headers";

fn batch_row(r: &AnyRow) -> DbResult<BatchRow> {
    Ok(BatchRow {
        id: r.try_get("id")?,
        workspace: r.try_get("workspace")?,
        endpoint: r.try_get("endpoint")?,
        input_file_id: r.try_get("input_file_id")?,
        completion_window: r.try_get("completion_window")?,
        status: r.try_get("status")?,
        created_at: r.try_get("created_at")?,
        in_progress_at: r.try_get("in_progress_at")?,
        finalizing_at: r.try_get("finalizing_at")?,
        completed_at: r.try_get("completed_at")?,
        failed_at: r.try_get("failed_at")?,
        cancelling_at: r.try_get("cancelling_at")?,
        cancelled_at: r.try_get("cancelled_at")?,
        total: r.try_get("total")?,
        completed: r.try_get("completed")?,
        failed: r.try_get("failed")?,
        output_file_id: r.try_get("output_file_id")?,
        error_file_id: r.try_get("error_file_id")?,
        errors: r.try_get("errors")?,
        metadata: r.try_get("metadata")?,
        headers: r.try_get("headers")?,
    })
}

/// The statuses whose batch still has work (resumed at start).
pub const UNFINISHED: &[&str] = &["validating", "in_progress", "finalizing", "cancelling"];

impl Db {
    /// A new batch, `validating`, leased to its creator (`lease`: owner, until in Unix ms).
    #[allow(clippy::too_many_arguments)]
    pub async fn insert_batch(
        &self,
        id: &str,
        workspace: &str,
        endpoint: &str,
        input_file_id: &str,
        completion_window: &str,
        metadata: Option<&str>,
        sealed_headers: &str,
        lease: (&str, i64),
    ) -> DbResult<()> {
        self.ensure_workspace(workspace).await?;
        sqlx::query(
            "INSERT INTO managed_batches (id, workspace, endpoint, input_file_id, completion_window, status, \
             created_at, total, completed, failed, metadata, headers, lease_owner, lease_until) \
             VALUES ($1, $2, $3, $4, $5, 'validating', $6, 0, 0, 0, $7, $8, $9, $10)",
        )
        .bind(id)
        .bind(workspace)
        .bind(endpoint)
        .bind(input_file_id)
        .bind(completion_window)
        .bind(now_s())
        .bind(metadata)
        .bind(sealed_headers)
        .bind(lease.0)
        .bind(lease.1)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Batch `id`; with `workspace`, only when it is that workspace's.
    pub async fn batch(&self, id: &str, workspace: Option<&str>) -> DbResult<Option<BatchRow>> {
        let row = sqlx::query(&format!(
            "SELECT {BATCH_COLUMNS} FROM managed_batches WHERE id = $1 AND ($2 = '' OR workspace = $2)"
        ))
        .bind(id)
        .bind(workspace.unwrap_or_default())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(batch_row).transpose()
    }

    /// The ids of the batches that still have work.
    pub async fn unfinished_batches(&self) -> DbResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM managed_batches WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling') \
             ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| r.try_get("id")).collect()
    }

    /// Takes (or renews) the lease of batch `id` for `owner` until `until_ms`: when nobody
    /// holds it, `owner` does, or it expired (`now_ms`). Whether `owner` holds it now.
    pub async fn lease_batch(&self, id: &str, owner: &str, now_ms: i64, until_ms: i64) -> DbResult<bool> {
        let done = sqlx::query(
            "UPDATE managed_batches SET lease_owner = $2, lease_until = $4 WHERE id = $1 \
             AND (lease_owner IS NULL OR lease_owner = $2 OR lease_until < $3)",
        )
        .bind(id)
        .bind(owner)
        .bind(now_ms)
        .bind(until_ms)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Gives the lease of batch `id` up (when `owner` holds it).
    pub async fn release_batch(&self, id: &str, owner: &str) -> DbResult<()> {
        sqlx::query(
            "UPDATE managed_batches SET lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// `validating` → `failed` with `errors` (JSON text). Whether it moved.
    pub async fn fail_batch(&self, id: &str, errors: &str) -> DbResult<bool> {
        let done = sqlx::query(
            "UPDATE managed_batches SET status = 'failed', failed_at = $2, errors = $3 \
             WHERE id = $1 AND status = 'validating'",
        )
        .bind(id)
        .bind(now_s())
        .bind(errors)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// `validating` → `in_progress` with its lines, in one transaction (a restart finds
    /// either no lines and `validating`, or all of them). Whether it moved.
    pub async fn start_batch(&self, id: &str, lines: &[PendingLine]) -> DbResult<bool> {
        let mut tx = self.pool.begin().await?;
        let total = i64::try_from(lines.len()).unwrap_or(i64::MAX);
        let done = sqlx::query(
            "UPDATE managed_batches SET status = 'in_progress', in_progress_at = $2, total = $3 \
             WHERE id = $1 AND status = 'validating'",
        )
        .bind(id)
        .bind(now_s())
        .bind(total)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        for line in lines {
            sqlx::query(
                "INSERT INTO managed_batch_lines (batch_id, line, custom_id, body, status) \
                 VALUES ($1, $2, $3, $4, 'pending')",
            )
            .bind(id)
            .bind(line.line)
            .bind(&line.custom_id)
            .bind(&line.body)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    pub async fn pending_lines(&self, id: &str) -> DbResult<Vec<PendingLine>> {
        let rows = sqlx::query(
            "SELECT line, custom_id, body FROM managed_batch_lines WHERE batch_id = $1 AND status = 'pending' \
             ORDER BY line",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(PendingLine {
                    line: r.try_get("line")?,
                    custom_id: r.try_get("custom_id")?,
                    body: r.try_get("body")?,
                })
            })
            .collect()
    }

    /// Line `line` finished (`succeeded` or `failed`) with its output-file line, counted once
    /// in the batch's counts. The counts are incremented, not recounted: on PostgreSQL two
    /// lines finishing at once would each count without the other's uncommitted row.
    pub async fn finish_line(&self, id: &str, line: i64, status: &str, result: &str) -> DbResult<()> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE managed_batch_lines SET status = $3, result = $4 WHERE batch_id = $1 AND line = $2 \
             AND status = 'pending'",
        )
        .bind(id)
        .bind(line)
        .bind(status)
        .bind(result)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            let succeeded = i64::from(status == "succeeded");
            sqlx::query("UPDATE managed_batches SET completed = completed + $2, failed = failed + $3 WHERE id = $1")
                .bind(id)
                .bind(succeeded)
                .bind(1 - succeeded)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The output-file lines of the finished lines with `status`, in line order.
    pub async fn line_results(&self, id: &str, status: &str) -> DbResult<Vec<String>> {
        let rows =
            sqlx::query("SELECT result FROM managed_batch_lines WHERE batch_id = $1 AND status = $2 ORDER BY line")
                .bind(id)
                .bind(status)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| r.try_get("result")).collect()
    }

    /// `from` → `to`, setting timestamp column `at` (a fixed name). Whether it moved.
    pub async fn move_batch(&self, id: &str, from: &[&str], to: &str, at: &str) -> DbResult<bool> {
        let column = match at {
            "finalizing_at" | "completed_at" | "cancelled_at" | "cancelling_at" | "failed_at" => at,
            _ => return Err(sqlx::Error::Protocol(format!("no timestamp column {at}"))),
        };
        // At most four statuses: placeholders $3.. for each.
        let list: Vec<String> = (0..from.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "UPDATE managed_batches SET status = $2, {column} = {} WHERE id = $1 AND status IN ({})",
            now_s(),
            list.join(", ")
        );
        let mut query = sqlx::query(&sql).bind(id).bind(to);
        for status in from {
            query = query.bind(*status);
        }
        let done = query.execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records the batch's output and error files (both may be absent).
    pub async fn set_batch_files(&self, id: &str, output: Option<&str>, error: Option<&str>) -> DbResult<()> {
        sqlx::query("UPDATE managed_batches SET output_file_id = $2, error_file_id = $3 WHERE id = $1")
            .bind(id)
            .bind(output)
            .bind(error)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn insert_file(&self, file: &FileRow) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO managed_files (id, workspace, purpose, filename, bytes, content, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&file.id)
        .bind(&file.workspace)
        .bind(&file.purpose)
        .bind(&file.filename)
        .bind(file.bytes)
        .bind(&file.content)
        .bind(file.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn file(&self, id: &str, workspace: &str) -> DbResult<Option<FileRow>> {
        let row = sqlx::query(
            "SELECT id, workspace, purpose, filename, bytes, content, created_at FROM managed_files \
             WHERE id = $1 AND workspace = $2",
        )
        .bind(id)
        .bind(workspace)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| file_row(&r, r.try_get("content")?)).transpose()
    }
}

/// Where a page of a workspace's items starts, in a list ordered by `(created_at, id)`: after
/// or before an item's `(created_at, id)` in the list's order, or at the list's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    Start,
    After(i64, String),
    Before(i64, String),
}

/// A page of a workspace's rows of `table`, listed by `(created_at, id)`.
struct Page<'a> {
    table: &'static str,
    columns: &'static str,
    workspace: &'a str,
    /// Only the rows whose column has this value.
    only: Option<(&'static str, &'a str)>,
    cursor: &'a Cursor,
    newest_first: bool,
    limit: i64,
}

/// The columns a file list reads: not its content.
const FILE_LIST_COLUMNS: &str = "id, workspace, purpose, filename, bytes, created_at";

impl Db {
    /// Up to `limit` of `workspace`'s managed batches from `cursor`, newest first.
    pub async fn list_batches(&self, workspace: &str, cursor: &Cursor, limit: i64) -> DbResult<Vec<BatchRow>> {
        let page = Page {
            table: "managed_batches",
            columns: BATCH_COLUMNS,
            workspace,
            only: None,
            cursor,
            newest_first: true,
            limit,
        };
        self.page(page).await?.iter().map(batch_row).collect()
    }

    /// Up to `limit` of `workspace`'s files (only those of `purpose`, when given) from `cursor`,
    /// newest first or oldest first; their `content` is left empty.
    pub async fn list_files(
        &self,
        workspace: &str,
        purpose: Option<&str>,
        cursor: &Cursor,
        newest_first: bool,
        limit: i64,
    ) -> DbResult<Vec<FileRow>> {
        let only = purpose.map(|purpose| ("purpose", purpose));
        let page =
            Page { table: "managed_files", columns: FILE_LIST_COLUMNS, workspace, only, cursor, newest_first, limit };
        self.page(page).await?.iter().map(|r| file_row(r, String::new())).collect()
    }

    /// The rows of `page`, in the list's order.
    async fn page(&self, page: Page<'_>) -> DbResult<Vec<AnyRow>> {
        // A `Before` page is read backwards from its cursor, then turned round.
        let backwards = matches!(page.cursor, Cursor::Before(..));
        let read_newest_first = page.newest_first != backwards;
        let (compare, order) = if read_newest_first { ("<", "DESC") } else { (">", "ASC") };
        let mut sql = format!("SELECT {} FROM {} WHERE workspace = $1", page.columns, page.table);
        let mut next = 2;
        if let Cursor::After(..) | Cursor::Before(..) = page.cursor {
            sql.push_str(&format!(" AND (created_at {compare} $2 OR (created_at = $2 AND id {compare} $3))"));
            next = 4;
        }
        if let Some((column, _)) = page.only {
            sql.push_str(&format!(" AND {column} = ${next}"));
            next += 1;
        }
        sql.push_str(&format!(" ORDER BY created_at {order}, id {order} LIMIT ${next}"));
        let mut query = sqlx::query(&sql).bind(page.workspace);
        if let Cursor::After(at, id) | Cursor::Before(at, id) = page.cursor {
            query = query.bind(*at).bind(id.as_str());
        }
        if let Some((_, value)) = page.only {
            query = query.bind(value);
        }
        let mut rows = query.bind(page.limit).fetch_all(&self.pool).await?;
        if backwards {
            rows.reverse();
        }
        Ok(rows)
    }

    /// Chunk `seq` of file `file_id` (base64).
    pub async fn insert_file_chunk(&self, file_id: &str, seq: i64, data: &str) -> DbResult<()> {
        sqlx::query("INSERT INTO managed_file_chunks (file_id, seq, data) VALUES ($1, $2, $3)")
            .bind(file_id)
            .bind(seq)
            .bind(data)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Chunk `seq` of file `file_id` (base64), when there is one.
    pub async fn file_chunk(&self, file_id: &str, seq: i64) -> DbResult<Option<String>> {
        let row = sqlx::query("SELECT data FROM managed_file_chunks WHERE file_id = $1 AND seq = $2")
            .bind(file_id)
            .bind(seq)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.try_get("data")).transpose()
    }

    pub async fn delete_file_chunks(&self, file_id: &str) -> DbResult<()> {
        sqlx::query("DELETE FROM managed_file_chunks WHERE file_id = $1").bind(file_id).execute(&self.pool).await?;
        Ok(())
    }

    /// Deletes `workspace`'s file `id` and its chunks; whether there was one.
    pub async fn delete_file(&self, id: &str, workspace: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM managed_files WHERE id = $1 AND workspace = $2")
            .bind(id)
            .bind(workspace)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        self.delete_file_chunks(id).await?;
        Ok(true)
    }
}
