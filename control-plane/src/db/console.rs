//! The console's sessions, and the request log's rollups its overview reads (migration 0011).

use super::logs::{bind_all, rows_statement, Arg, Built, NewRecord};
use super::{now_ms, Db, DbResult};
use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, Row};
use std::collections::BTreeMap;

/// A signed-in console, as its cookie's hash finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// The hash of the key the session signed in with (empty for a session from before it
    /// was kept: such a session has ended).
    pub key_hash: String,
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

    /// Its name in the overview (and in the rollups, where it has rows of its own).
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Model => "model",
            Dimension::Provider => "provider",
            Dimension::ApiKey => "api_key",
            Dimension::Workspace => "workspace",
            Dimension::Api => "api",
        }
    }
}

/// The rollups' dimension of duration classes: every record is in one of its rows per bucket,
/// so it gives the totals too.
const DURATION: &str = "duration";

/// The lengths of the rollups' buckets: a minute for an hour's overview, an hour for longer
/// ones.
pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 3_600_000;

/// The class of a duration by `DURATION_BOUNDS_MS` (the last class: past them all).
fn duration_class(duration_ms: i64) -> usize {
    DURATION_BOUNDS_MS.iter().position(|&bound| duration_ms <= bound).unwrap_or(DURATION_BOUNDS_MS.len())
}

/// A rollup row's value: `=` and the record's value, or empty for none (migration 0011).
fn rollup_value(value: Option<&str>) -> String {
    value.map(|value| format!("={value}")).unwrap_or_default()
}

fn value_of_rollup(value: String) -> Option<String> {
    value.strip_prefix('=').map(str::to_string)
}

/// The key of one rollup row: bucket length, workspace, dimension, bucket start, value (the
/// order of the table's primary key, so that batches add to rows in one order and two
/// PostgreSQL transactions never wait on each other in a circle).
type RollupKey = (i64, String, &'static str, i64, String);

/// What a batch's records add to the rollups, row by row.
fn rollup_deltas<'a>(records: impl Iterator<Item = &'a NewRecord>) -> BTreeMap<RollupKey, Sums> {
    let mut deltas: BTreeMap<RollupKey, Sums> = BTreeMap::new();
    for record in records {
        let sums = Sums {
            requests: 1,
            errors: i64::from(record.status.is_some_and(|status| status >= 400)),
            input_tokens: record.input_tokens.unwrap_or(0),
            output_tokens: record.output_tokens.unwrap_or(0),
            cost_micro_usd: record.cost_micro_usd.unwrap_or(0),
        };
        let class = record.duration_ms.map(|ms| duration_class(ms).to_string());
        let values = [
            (Dimension::Model.name(), record.model.as_deref()),
            (Dimension::Provider.name(), record.provider.as_deref()),
            (Dimension::ApiKey.name(), record.api_key_id.as_deref()),
            (Dimension::Api.name(), record.client_api.as_deref()),
            (DURATION, class.as_deref()),
        ];
        for bucket_len in [MINUTE_MS, HOUR_MS] {
            let bucket_ms = record.timestamp_ms - record.timestamp_ms.rem_euclid(bucket_len);
            for (dimension, value) in values {
                let key = (bucket_len, record.workspace.clone(), dimension, bucket_ms, rollup_value(value));
                deltas.entry(key).or_default().add(&sums);
            }
        }
    }
    deltas
}

/// Rollup rows per upsert statement (10 parameters each).
const ROLLUPS_PER_UPSERT: usize = 100;

/// The sums' columns, as every overview query selects them (PostgreSQL's SUM of BIGINTs is a
/// NUMERIC: cast back).
const SUMS: &str = "CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(errors) AS BIGINT) AS errors, \
     CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
     CAST(SUM(cost_micro_usd) AS BIGINT) AS cost_micro_usd";

fn sums(row: &sqlx::any::AnyRow) -> DbResult<Sums> {
    Ok(Sums {
        requests: row.try_get("requests")?,
        errors: row.try_get("errors")?,
        input_tokens: row.try_get("input_tokens")?,
        output_tokens: row.try_get("output_tokens")?,
        cost_micro_usd: row.try_get("cost_micro_usd")?,
    })
}

/// `WHERE` over a span's rollup rows of one dimension: the bucket length (`$1`), the
/// dimension (`$2`), the time (`$3`, `$4`), and the workspace when it names one (`$5`).
fn span_filter(span: &Span) -> &'static str {
    match span.workspace {
        Some(_) => {
            " WHERE bucket_len = $1 AND dimension = $2 AND bucket_ms >= $3 AND bucket_ms < $4 AND workspace = $5"
        }
        None => " WHERE bucket_len = $1 AND dimension = $2 AND bucket_ms >= $3 AND bucket_ms < $4",
    }
}

/// `sql` (whose `WHERE` is `span_filter`'s) with the span's values bound.
fn span_query<'q>(sql: &'q str, span: &Span<'q>, dimension: &'static str) -> Query<'q, Any, AnyArguments<'q>> {
    let query = sqlx::query(sql).bind(span.bucket_len()).bind(dimension).bind(span.from_ms).bind(span.until_ms);
    match span.workspace {
        Some(workspace) => query.bind(workspace),
        None => query,
    }
}

impl Span<'_> {
    /// The rollups' bucket length it reads: minutes for an hour or less, else hours (a span's
    /// ends and slots are whole hours then).
    fn bucket_len(&self) -> i64 {
        match self.until_ms - self.from_ms <= HOUR_MS {
            true => MINUTE_MS,
            false => HOUR_MS,
        }
    }
}

impl Db {
    /// Keeps a new console session under its cookie's hash (and forgets the ones that ended).
    pub async fn insert_console_session(&self, id_hash: &str, session: &ConsoleSession) -> DbResult<()> {
        sqlx::query("DELETE FROM console_sessions WHERE expires_at_ms <= $1")
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (id_hash, key_hash, workspace, admin, csrf_token, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id_hash)
        .bind(&session.key_hash)
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
            "SELECT key_hash, workspace, admin, csrf_token, expires_at_ms FROM console_sessions \
             WHERE id_hash = $1 AND expires_at_ms > $2",
        )
        .bind(id_hash)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(ConsoleSession {
                key_hash: r.try_get::<Option<String>, _>("key_hash")?.unwrap_or_default(),
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

    /// Adds a batch's stored records to the rollups, in the transaction that stored them.
    pub(super) async fn add_to_rollups<'a>(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        records: impl Iterator<Item = &'a NewRecord>,
    ) -> DbResult<()> {
        let deltas: Vec<_> = rollup_deltas(records).into_iter().collect();
        for chunk in deltas.chunks(ROLLUPS_PER_UPSERT) {
            let mut built = Built::new(
                self,
                "INSERT INTO log_rollups (bucket_len, workspace, dimension, bucket_ms, value, requests, errors, \
                 input_tokens, output_tokens, cost_micro_usd) VALUES ",
            );
            for (i, ((bucket_len, workspace, dimension, bucket_ms, value), sums)) in chunk.iter().enumerate() {
                let row = [
                    Arg::Int(*bucket_len),
                    Arg::Text(workspace),
                    Arg::Text(dimension),
                    Arg::Int(*bucket_ms),
                    Arg::Text(value),
                    Arg::Int(sums.requests),
                    Arg::Int(sums.errors),
                    Arg::Int(sums.input_tokens),
                    Arg::Int(sums.output_tokens),
                    Arg::Int(sums.cost_micro_usd),
                ];
                built.push(
                    if i == 0 { "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" } else { ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" },
                    row,
                );
            }
            built.sql.push_str(
                " ON CONFLICT (bucket_len, workspace, dimension, bucket_ms, value) DO UPDATE SET \
                 requests = log_rollups.requests + excluded.requests, errors = log_rollups.errors + excluded.errors, \
                 input_tokens = log_rollups.input_tokens + excluded.input_tokens, \
                 output_tokens = log_rollups.output_tokens + excluded.output_tokens, \
                 cost_micro_usd = log_rollups.cost_micro_usd + excluded.cost_micro_usd",
            );
            bind_all(rows_statement(&built.sql, chunk.len(), ROLLUPS_PER_UPSERT), &built.args)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Deletes the rollups' buckets that ended by `cutoff_ms`, in the retention sweep's
    /// transaction. A bucket the cutoff falls in keeps counting the records of it that went.
    pub(super) async fn delete_rollups_before(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        cutoff_ms: i64,
    ) -> DbResult<()> {
        // The first bound (no bucket is shorter than a minute) lets the sweep read `log_rollups_age`.
        sqlx::query("DELETE FROM log_rollups WHERE bucket_ms <= $2 AND bucket_ms + bucket_len <= $1")
            .bind(cutoff_ms)
            .bind(cutoff_ms.saturating_sub(MINUTE_MS))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// The span's records in `slots` slots of `slot_ms` from its start (a whole number of the
    /// rollups' buckets), each with its sums and its durations by class.
    pub async fn overview_slots(&self, span: &Span<'_>, slot_ms: i64, slots: usize) -> DbResult<Vec<Slot>> {
        let sql = format!(
            "SELECT (bucket_ms - $3) / {slot_ms} AS slot, value, {SUMS} FROM log_rollups{} GROUP BY 1, 2",
            span_filter(span),
        );
        let mut out = vec![Slot::empty(); slots];
        for row in span_query(&sql, span, DURATION).fetch_all(&self.records).await? {
            let slot = usize::try_from(row.try_get::<i64, _>("slot")?).ok();
            let Some(slot) = slot.and_then(|slot| out.get_mut(slot)) else {
                continue;
            };
            let row_sums = sums(&row)?;
            let class = value_of_rollup(row.try_get("value")?).and_then(|class| class.parse::<usize>().ok());
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
        // A workspace's records are its rows of any one dimension; the others have rows of their own.
        let (rows_of, column) = match dimension {
            Dimension::Workspace => (DURATION, "workspace"),
            other => (other.name(), "value"),
        };
        let sql = format!("SELECT {column} AS value, {SUMS} FROM log_rollups{} GROUP BY {column}", span_filter(span));
        let mut rows = span_query(&sql, span, rows_of)
            .fetch_all(&self.records)
            .await?
            .iter()
            .map(|row| {
                let stored: String = row.try_get("value")?;
                let value = match dimension {
                    Dimension::Workspace => Some(stored),
                    _ => value_of_rollup(stored),
                };
                Ok((value, sums(row)?))
            })
            .collect::<DbResult<Vec<_>>>()?;
        rows.sort_by(|(a, x), (b, y)| y.requests.cmp(&x.requests).then_with(|| a.cmp(b)));
        Ok(rows)
    }
}
