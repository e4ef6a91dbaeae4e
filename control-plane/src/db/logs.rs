//! Request records, their metadata and feedback (migrations 0002 and 0004). Filters are built from
//! fixed clauses with numbered placeholders; every value is bound.

use super::{now_ms, now_s, Db, DbResult};
use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, Row};
use std::collections::HashSet;

/// A record of a batch, ready to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRecord {
    pub id: String,
    pub workspace: String,
    /// The filter's `record_id`: a record sent again under it is stored once per workspace.
    pub record_key: Option<String>,
    pub trace_id: String,
    pub span_id: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub status: Option<i64>,
    /// `prompt_tokens` and `completion_tokens` as the filter counted them.
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// `cost_usd`, in micro-USD.
    pub cost_micro_usd: Option<i64>,
    /// The id of the stored key the request was made with (in `index_key` form).
    pub api_key_id: Option<String>,
    /// What the console reads of it: its `client_api`, `duration_ms` and `cache_status` (in
    /// `index_key` form), and its guardrails' verdict (`pass`, `fail`; None when none ran).
    pub client_api: Option<String>,
    pub duration_ms: Option<i64>,
    pub cache_status: Option<String>,
    pub guardrail_verdict: Option<&'static str>,
    pub timestamp_ms: i64,
    /// The record's JSON text as sent.
    pub json: String,
    /// (key, value) of its metadata, both in `index_key` form.
    pub metadata: Vec<(String, String)>,
}

/// The filters and page of `GET /v1/logs`; text values in `index_key` form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub status: Option<i64>,
    /// `2xx` to `5xx`: the status's hundreds.
    pub status_class: Option<i64>,
    /// The record's `client_api`, `cache_status`, guardrails' verdict and key id.
    pub api: Option<String>,
    pub cache_status: Option<String>,
    pub guardrail: Option<String>,
    pub api_key: Option<String>,
    /// Inclusive bounds on `timestamp_ms`.
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub metadata: Vec<(String, String)>,
    pub limit: usize,
    /// The id of the previous page's last record.
    pub after: Option<String>,
}

/// Feedback to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFeedback {
    /// As given (the answer echoes it).
    pub trace_id: String,
    /// JSON number texts.
    pub value: String,
    pub weight: String,
    /// JSON object text.
    pub metadata: Option<String>,
}

/// A stored record as `GET /v1/logs` answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub id: String,
    /// In `index_key` form (what feedback is looked up by).
    pub trace_key: String,
    pub timestamp_ms: i64,
    pub json: String,
}

/// Feedback as stored (`trace_key` in `index_key` form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFeedback {
    pub trace_key: String,
    pub value: String,
    pub weight: String,
    pub metadata: Option<String>,
    pub created_at_ms: i64,
}

/// What `GET /v1/usage` groups records by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKey {
    Model,
    Provider,
    ApiKey,
    Workspace,
}

impl UsageKey {
    pub const ALL: [UsageKey; 4] = [UsageKey::Model, UsageKey::Provider, UsageKey::ApiKey, UsageKey::Workspace];

    /// Its `group_by` value, and its field in a row.
    pub fn name(self) -> &'static str {
        match self {
            UsageKey::Model => "model",
            UsageKey::Provider => "provider",
            UsageKey::ApiKey => "api_key",
            UsageKey::Workspace => "workspace",
        }
    }

    fn column(self) -> &'static str {
        match self {
            UsageKey::ApiKey => "api_key_id",
            other => other.name(),
        }
    }
}

/// One group of `GET /v1/usage`: its keys' values (as the grouping named them) and its sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub keys: Vec<Option<String>>,
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_micro_usd: i64,
}

/// A value bound to a placeholder of a built query, borrowed from what the query is built of (a
/// batch's records are not copied to be bound).
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Int(i64),
    OptInt(Option<i64>),
}

/// Rows per insert statement: a few statements per batch, each well inside both databases'
/// parameter limits (its parameters are anonymous on SQLite, see `Built`), and a fixed size
/// keeps the statement's text, hence its prepared form, the same from batch to batch.
const RECORDS_PER_INSERT: usize = 100;
const METADATA_PER_INSERT: usize = 100;

/// A statement of a batch's `rows` rows of at most `full`: kept prepared when it has all `full`
/// (its text is then the same from batch to batch, so the database parses and plans it once per
/// connection), not kept otherwise: a connection's cache of prepared statements (the 100 last
/// used, each holding a program for every row) filled with the other sizes for as long as new
/// ones came.
pub(super) fn rows_statement(sql: &str, rows: usize, full: usize) -> Query<'_, Any, AnyArguments<'_>> {
    sqlx::query(sql).persistent(rows == full)
}

pub(super) fn bind_all<'q>(
    mut query: Query<'q, Any, AnyArguments<'q>>,
    args: &[Arg<'q>],
) -> Query<'q, Any, AnyArguments<'q>> {
    for arg in args {
        query = match *arg {
            Arg::Text(text) => query.bind(text),
            Arg::OptText(text) => query.bind(text),
            Arg::Int(n) => query.bind(n),
            Arg::OptInt(n) => query.bind(n),
        };
    }
    query
}

/// SQL with its arguments; `?` in a clause becomes the next `$n` on PostgreSQL and stays an
/// anonymous `?` on SQLite: SQLite looks a numbered parameter up by a walk over all of them, so
/// binding the n parameters of a many-row insert by number costs n² (a fifth of the ingest's CPU
/// at 275 parameters).
pub(super) struct Built<'a> {
    pub(super) sql: String,
    pub(super) args: Vec<Arg<'a>>,
    anonymous: bool,
}

impl<'a> Built<'a> {
    pub(super) fn new(db: &Db, sql: &str) -> Built<'a> {
        Built { sql: sql.to_string(), args: Vec::new(), anonymous: db.sqlite }
    }

    pub(super) fn push(&mut self, clause: &str, args: impl IntoIterator<Item = Arg<'a>>) {
        let mut args = args.into_iter();
        for (i, part) in clause.split('?').enumerate() {
            if i > 0 {
                if let Some(arg) = args.next() {
                    self.args.push(arg);
                }
                if self.anonymous {
                    self.sql.push('?');
                } else {
                    self.sql.push_str(&format!("${}", self.args.len()));
                }
            }
            self.sql.push_str(part);
        }
    }
}

impl Db {
    /// Stores a batch in one transaction, a few statements for the whole batch (one per row
    /// made each batch cost the control plane about as much CPU as the proxy spent on its
    /// requests). A record whose `record_key` the workspace already holds (the batch was sent
    /// again) is skipped, with its metadata.
    pub async fn insert_records(&self, records: &[NewRecord]) -> DbResult<()> {
        let mut tx = self.records.begin().await?;
        let received_at = now_s();
        // The records stored now (not those the workspace held already): their metadata and rollups.
        let mut stored: Vec<&NewRecord> = Vec::with_capacity(records.len());
        for chunk in records.chunks(RECORDS_PER_INSERT) {
            let mut built = Built::new(
                self,
                "INSERT INTO log_records (id, workspace, record_key, trace_id, span_id, provider, model, status, \
                 input_tokens, output_tokens, cost_micro_usd, api_key_id, client_api, duration_ms, cache_status, \
                 guardrail_verdict, timestamp_ms, record, received_at) VALUES ",
            );
            for (i, r) in chunk.iter().enumerate() {
                let row = [
                    Arg::Text(&r.id),
                    Arg::Text(&r.workspace),
                    Arg::OptText(r.record_key.as_deref()),
                    Arg::Text(&r.trace_id),
                    Arg::OptText(r.span_id.as_deref()),
                    Arg::OptText(r.provider.as_deref()),
                    Arg::OptText(r.model.as_deref()),
                    Arg::OptInt(r.status),
                    Arg::OptInt(r.input_tokens),
                    Arg::OptInt(r.output_tokens),
                    Arg::OptInt(r.cost_micro_usd),
                    Arg::OptText(r.api_key_id.as_deref()),
                    Arg::OptText(r.client_api.as_deref()),
                    Arg::OptInt(r.duration_ms),
                    Arg::OptText(r.cache_status.as_deref()),
                    Arg::OptText(r.guardrail_verdict),
                    Arg::Int(r.timestamp_ms),
                    Arg::Text(&r.json),
                    Arg::Int(received_at),
                ];
                built.push(
                    if i == 0 {
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    } else {
                        ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    },
                    row,
                );
            }
            built.sql.push_str(" ON CONFLICT DO NOTHING");
            let statement = rows_statement(&built.sql, chunk.len(), RECORDS_PER_INSERT);
            let added = bind_all(statement, &built.args).execute(&mut *tx).await?.rows_affected();
            if usize::try_from(added).is_ok_and(|added| added == chunk.len()) {
                stored.extend(chunk);
                continue;
            }
            // Some were there already (a batch sent again): the ids made for this request name
            // the rows it added. Rare, so the common batch has no row to hand back per record
            // (`RETURNING` cost the ingest a message between sqlx's threads per record).
            let mut built = Built::new(self, "SELECT id FROM log_records WHERE id IN (");
            for (i, r) in chunk.iter().enumerate() {
                built.push(if i == 0 { "?" } else { ", ?" }, [Arg::Text(&r.id)]);
            }
            built.sql.push(')');
            let rows = bind_all(sqlx::query(&built.sql).persistent(false), &built.args).fetch_all(&mut *tx).await?;
            let added = rows.iter().map(|row| row.try_get::<String, _>(0)).collect::<Result<HashSet<_>, _>>()?;
            stored.extend(chunk.iter().filter(|r| added.contains(&r.id)));
        }
        let metadata: Vec<(&str, &str, &str)> = stored
            .iter()
            .flat_map(|r| r.metadata.iter().map(move |(key, value)| (r.id.as_str(), key.as_str(), value.as_str())))
            .collect();
        for chunk in metadata.chunks(METADATA_PER_INSERT) {
            let mut built = Built::new(self, "INSERT INTO log_metadata (record_id, meta_key, meta_value) VALUES ");
            for (i, (id, key, value)) in chunk.iter().enumerate() {
                let row = [Arg::Text(id), Arg::Text(key), Arg::Text(value)];
                built.push(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" }, row);
            }
            bind_all(rows_statement(&built.sql, chunk.len(), METADATA_PER_INSERT), &built.args)
                .execute(&mut *tx)
                .await?;
        }
        self.add_to_rollups(&mut tx, stored.into_iter()).await?;
        tx.commit().await
    }

    /// Deletes the records older than `cutoff_ms` (by `timestamp_ms`) with their metadata, the
    /// rollups' buckets that ended by then, and the feedback given before it, in one
    /// transaction: how many records.
    pub async fn delete_logs_before(&self, cutoff_ms: i64) -> DbResult<u64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM log_metadata WHERE record_id IN (SELECT id FROM log_records WHERE timestamp_ms < $1)")
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?;
        let records =
            sqlx::query("DELETE FROM log_records WHERE timestamp_ms < $1").bind(cutoff_ms).execute(&mut *tx).await?;
        self.delete_rollups_before(&mut tx, cutoff_ms).await?;
        sqlx::query("DELETE FROM log_feedback WHERE created_at_ms < $1").bind(cutoff_ms).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(records.rows_affected())
    }

    /// The `timestamp_ms` of a record of the workspace (where a page after it starts).
    pub async fn record_time(&self, workspace: &str, id: &str) -> DbResult<Option<i64>> {
        let row = sqlx::query("SELECT timestamp_ms FROM log_records WHERE workspace = $1 AND id = $2")
            .bind(workspace)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.try_get::<i64, _>("timestamp_ms")).transpose()
    }

    /// Records of the workspace matching `q`, newest first (ties by id, descending), after the
    /// record at `after` = (timestamp_ms, id) when given; at most `limit` rows.
    pub async fn query_records(
        &self,
        workspace: &str,
        q: &LogQuery,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> DbResult<Vec<StoredRecord>> {
        let mut b = Built::new(self, "SELECT id, trace_id, timestamp_ms, record FROM log_records");
        b.push(" WHERE workspace = ?", [Arg::Text(workspace)]);
        let text_filters = [
            ("trace_id", &q.trace_id),
            ("span_id", &q.span_id),
            ("provider", &q.provider),
            ("model", &q.model),
            ("client_api", &q.api),
            ("cache_status", &q.cache_status),
            ("guardrail_verdict", &q.guardrail),
            ("api_key_id", &q.api_key),
        ];
        for (column, value) in text_filters {
            if let Some(value) = value {
                b.push(&format!(" AND {column} = ?"), [Arg::Text(value)]);
            }
        }
        // A status is read through its class's index (migration 0012 indexes `status / 100`, which
        // truncates as Rust does). The exact status is `+status`: a plain `status = ?` made SQLite
        // read the whole workspace by time instead, as if that term had an index of its own.
        if let Some(class) = q.status_class.or(q.status.map(|status| status / 100)) {
            b.push(" AND status / 100 = ?", [Arg::Int(class)]);
        }
        if let Some(status) = q.status {
            b.push(" AND +status = ?", [Arg::Int(status)]);
        }
        if let Some(from) = q.from_ms {
            b.push(" AND timestamp_ms >= ?", [Arg::Int(from)]);
        }
        if let Some(to) = q.to_ms {
            b.push(" AND timestamp_ms <= ?", [Arg::Int(to)]);
        }
        for (key, value) in &q.metadata {
            b.push(
                " AND EXISTS (SELECT 1 FROM log_metadata m WHERE m.record_id = log_records.id \
                 AND m.meta_key = ? AND m.meta_value = ?)",
                [Arg::Text(key), Arg::Text(value)],
            );
        }
        if let Some((time, id)) = after {
            b.push(
                " AND (timestamp_ms < ? OR (timestamp_ms = ? AND id < ?))",
                [Arg::Int(time), Arg::Int(time), Arg::Text(id)],
            );
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        b.push(" ORDER BY timestamp_ms DESC, id DESC LIMIT ?", [Arg::Int(limit)]);
        let rows = bind_all(sqlx::query(&b.sql), &b.args).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(StoredRecord {
                    id: r.try_get("id")?,
                    trace_key: r.try_get("trace_id")?,
                    timestamp_ms: r.try_get("timestamp_ms")?,
                    json: r.try_get("record")?,
                })
            })
            .collect()
    }

    /// The workspace's records with `from_ms <= timestamp_ms < until_ms`, added up per value of
    /// the `group` columns (one row of them all without any), sorted by those values (no value
    /// first).
    pub async fn usage(
        &self,
        workspace: &str,
        from_ms: i64,
        until_ms: i64,
        group: &[UsageKey],
    ) -> DbResult<Vec<UsageRow>> {
        let columns: Vec<&str> = group.iter().map(|key| key.column()).collect();
        let mut sql = String::from("SELECT ");
        for column in &columns {
            sql.push_str(&format!("{column}, "));
        }
        // PostgreSQL's SUM of BIGINTs is a NUMERIC: cast back.
        sql.push_str(
            "COUNT(*) AS requests, CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
             CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
             CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS cost_micro_usd FROM log_records \
             WHERE workspace = $1 AND timestamp_ms >= $2 AND timestamp_ms < $3",
        );
        if !columns.is_empty() {
            sql.push_str(&format!(" GROUP BY {}", columns.join(", ")));
        }
        let rows = sqlx::query(&sql).bind(workspace).bind(from_ms).bind(until_ms).fetch_all(&self.pool).await?;
        let mut usage = rows
            .iter()
            .map(|r| {
                Ok(UsageRow {
                    keys: columns.iter().map(|c| r.try_get::<Option<String>, _>(*c)).collect::<DbResult<_>>()?,
                    requests: r.try_get("requests")?,
                    input_tokens: r.try_get("input_tokens")?,
                    output_tokens: r.try_get("output_tokens")?,
                    cost_micro_usd: r.try_get("cost_micro_usd")?,
                })
            })
            .collect::<DbResult<Vec<_>>>()?;
        usage.sort_unstable_by(|a, b| a.keys.cmp(&b.keys));
        Ok(usage)
    }

    /// Feedback of the workspace on any of `trace_keys`, oldest first.
    pub async fn feedback_for(&self, workspace: &str, trace_keys: &[&str]) -> DbResult<Vec<StoredFeedback>> {
        if trace_keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut b = Built::new(self, "SELECT trace_id, value, weight, metadata, created_at_ms FROM log_feedback");
        b.push(" WHERE workspace = ? AND trace_id IN (", [Arg::Text(workspace)]);
        for (i, key) in trace_keys.iter().enumerate() {
            b.push(if i == 0 { "?" } else { ", ?" }, [Arg::Text(key)]);
        }
        b.push(") ORDER BY created_at_ms, id", Vec::new());
        let rows = bind_all(sqlx::query(&b.sql), &b.args).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(StoredFeedback {
                    trace_key: r.try_get("trace_id")?,
                    value: r.try_get("value")?,
                    weight: r.try_get("weight")?,
                    metadata: r.try_get("metadata")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                })
            })
            .collect()
    }

    /// Stores feedback on a trace of the workspace (`trace_key` in `index_key` form); its
    /// creation time (Unix ms).
    pub async fn insert_feedback(&self, workspace: &str, trace_key: &str, f: &NewFeedback) -> DbResult<i64> {
        let created = now_ms();
        sqlx::query(
            "INSERT INTO log_feedback (id, workspace, trace_id, value, weight, metadata, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(workspace)
        .bind(trace_key)
        .bind(&f.value)
        .bind(&f.weight)
        .bind(f.metadata.as_deref())
        .bind(created)
        .execute(&self.pool)
        .await?;
        Ok(created)
    }
}
