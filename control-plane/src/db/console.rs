//! The console's sessions and what its overview adds up from the request log.

use super::{now_ms, Db, DbResult};
use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, Row};

/// A signed-in console, as its cookie's hash finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub workspace: String,
    pub admin: bool,
    pub csrf_token: String,
    pub expires_at_ms: i64,
}

/// The upper bounds (ms) of the duration classes the overview's percentiles are read from; a
/// duration past the last is in a class of its own.
pub const DURATION_BOUNDS_MS: [i64; 26] = [
    1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 7_500, 10_000,
    20_000, 30_000, 60_000, 120_000,
];

/// What one group of records adds up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sums {
    pub requests: i64,
    /// Records with an HTTP status of 400 or more.
    pub errors: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_micro_usd: i64,
}

impl Sums {
    pub fn add(&mut self, other: &Sums) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_micro_usd += other.cost_micro_usd;
    }
}

/// One time slot's sums and its durations: how many records fell in each class (by
/// `DURATION_BOUNDS_MS`, the last the records past them; records without a duration in none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub sums: Sums,
    pub durations: Vec<i64>,
}

impl Slot {
    /// A slot of no records: every class counted, none yet.
    pub fn empty() -> Slot {
        Slot { sums: Sums::default(), durations: vec![0; DURATION_BOUNDS_MS.len() + 1] }
    }

    pub fn add(&mut self, other: &Slot) {
        self.sums.add(&other.sums);
        self.durations.iter_mut().zip(&other.durations).for_each(|(sum, count)| *sum += count);
    }
}

/// The records an overview reads: one workspace's, or (None) every workspace's, in
/// `from_ms <= timestamp_ms < until_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub workspace: Option<&'a str>,
    pub from_ms: i64,
    pub until_ms: i64,
}

/// The columns an overview breaks its records down by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Model,
    Provider,
    ApiKey,
    Workspace,
    Api,
}

impl Dimension {
    pub const ALL: [Dimension; 5] =
        [Dimension::Model, Dimension::Provider, Dimension::ApiKey, Dimension::Workspace, Dimension::Api];

    /// Its name in the overview.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Model => "model",
            Dimension::Provider => "provider",
            Dimension::ApiKey => "api_key",
            Dimension::Workspace => "workspace",
            Dimension::Api => "api",
        }
    }

    fn column(self) -> &'static str {
        match self {
            Dimension::Model => "model",
            Dimension::Provider => "provider",
            Dimension::ApiKey => "api_key_id",
            Dimension::Workspace => "workspace",
            Dimension::Api => "client_api",
        }
    }
}

/// The sums' columns, as every overview query selects them (PostgreSQL's SUM of BIGINTs is a
/// NUMERIC: cast back).
const SUMS: &str = "COUNT(*) AS requests, \
     CAST(COALESCE(SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END), 0) AS BIGINT) AS errors, \
     CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
     CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
     CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS cost_micro_usd";

fn sums(row: &sqlx::any::AnyRow) -> DbResult<Sums> {
    Ok(Sums {
        requests: row.try_get("requests")?,
        errors: row.try_get("errors")?,
        input_tokens: row.try_get("input_tokens")?,
        output_tokens: row.try_get("output_tokens")?,
        cost_micro_usd: row.try_get("cost_micro_usd")?,
    })
}

/// `WHERE` over a span: the time, and the workspace when it names one (`$1`, `$2`, `$3`).
fn span_filter(span: &Span) -> &'static str {
    match span.workspace {
        Some(_) => " WHERE timestamp_ms >= $1 AND timestamp_ms < $2 AND workspace = $3",
        None => " WHERE timestamp_ms >= $1 AND timestamp_ms < $2",
    }
}

/// `sql` (whose `WHERE` is `span_filter`'s) with the span's values bound.
fn span_query<'q>(sql: &'q str, span: &Span<'q>) -> Query<'q, Any, AnyArguments<'q>> {
    let query = sqlx::query(sql).bind(span.from_ms).bind(span.until_ms);
    match span.workspace {
        Some(workspace) => query.bind(workspace),
        None => query,
    }
}

/// The class of a record's duration (-1: none), as SQL.
fn duration_class() -> String {
    let mut sql = String::from("CASE WHEN duration_ms IS NULL THEN -1");
    for (class, bound) in DURATION_BOUNDS_MS.iter().enumerate() {
        sql.push_str(&format!(" WHEN duration_ms <= {bound} THEN {class}"));
    }
    sql.push_str(&format!(" ELSE {} END", DURATION_BOUNDS_MS.len()));
    sql
}

impl Db {
    /// Keeps a new console session under its cookie's hash (and forgets the ones that ended).
    pub async fn insert_console_session(&self, id_hash: &str, session: &ConsoleSession) -> DbResult<()> {
        sqlx::query("DELETE FROM console_sessions WHERE expires_at_ms <= $1")
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (id_hash, workspace, admin, csrf_token, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id_hash)
        .bind(&session.workspace)
        .bind(i64::from(session.admin))
        .bind(&session.csrf_token)
        .bind(session.expires_at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The console session a cookie's hash names, while it has not ended.
    pub async fn console_session(&self, id_hash: &str) -> DbResult<Option<ConsoleSession>> {
        let row = sqlx::query(
            "SELECT workspace, admin, csrf_token, expires_at_ms FROM console_sessions \
             WHERE id_hash = $1 AND expires_at_ms > $2",
        )
        .bind(id_hash)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(ConsoleSession {
                workspace: r.try_get("workspace")?,
                admin: r.try_get::<i64, _>("admin")? != 0,
                csrf_token: r.try_get("csrf_token")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
            })
        })
        .transpose()
    }

    pub async fn delete_console_session(&self, id_hash: &str) -> DbResult<()> {
        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1").bind(id_hash).execute(&self.pool).await?;
        Ok(())
    }

    /// The span's records in `slots` slots of `slot_ms` from its start, each with its sums and
    /// its durations by class.
    pub async fn overview_slots(&self, span: &Span<'_>, slot_ms: i64, slots: usize) -> DbResult<Vec<Slot>> {
        let sql = format!(
            "SELECT (timestamp_ms - $1) / {slot_ms} AS slot, {} AS class, {SUMS} FROM log_records{} GROUP BY 1, 2",
            duration_class(),
            span_filter(span),
        );
        let mut out = vec![Slot::empty(); slots];
        for row in span_query(&sql, span).fetch_all(&self.records).await? {
            let slot = usize::try_from(row.try_get::<i64, _>("slot")?).ok();
            let Some(slot) = slot.and_then(|slot| out.get_mut(slot)) else {
                continue;
            };
            let row_sums = sums(&row)?;
            let class = usize::try_from(row.try_get::<i64, _>("class")?).ok();
            if let Some(count) = class.and_then(|class| slot.durations.get_mut(class)) {
                *count += row_sums.requests;
            }
            slot.sums.add(&row_sums);
        }
        Ok(out)
    }

    /// The span's records added up per value of `dimension` (None: no value), most requests
    /// first.
    pub async fn overview_breakdown(
        &self,
        span: &Span<'_>,
        dimension: Dimension,
    ) -> DbResult<Vec<(Option<String>, Sums)>> {
        let column = dimension.column();
        let sql = format!("SELECT {column} AS value, {SUMS} FROM log_records{} GROUP BY {column}", span_filter(span));
        let mut rows = span_query(&sql, span)
            .fetch_all(&self.records)
            .await?
            .iter()
            .map(|row| Ok((row.try_get::<Option<String>, _>("value")?, sums(row)?)))
            .collect::<DbResult<Vec<_>>>()?;
        rows.sort_by(|(a, x), (b, y)| y.requests.cmp(&x.requests).then_with(|| a.cmp(b)));
        Ok(rows)
    }
}
