//! Limits, workspace prices and the limits' ledger (migration 0008). The accounting itself is
//! `ledger`'s; here each lease call runs in one transaction that first takes the write lock of
//! every limit it grants from, so control planes sharing a database never grant the same
//! allowance twice.

use super::{now_s, Db, DbResult};
use crate::ledger::{self, Decision, Grant};
use gateway_schema::limits::{Limit, LimitKind, Period};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};
use std::collections::HashMap;

/// A stored limit, with the workspace it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredLimit {
    pub limit: Limit,
    pub workspace: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One ask of a lease call: at least `need`, ideally `want`, of a limit's `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub limit: String,
    pub kind: LimitKind,
    pub need: i64,
    pub want: i64,
}

/// What a replica used of a lease it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub lease: String,
    pub used: i64,
    /// A window kind's use by admission: `(offset_ms, amount)`, the offset from when the lease
    /// was asked for, counted here from its grant (see `ledger`).
    pub uses: Vec<(i64, i64)>,
}

/// The answer to an ask: `None` when the limit is gone (deleted, or no longer bounding `kind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub ask: Ask,
    pub granted: Option<Granted>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The grant's id, when something was granted.
    pub lease: Option<String>,
    pub bound: u64,
    pub decision: Decision,
}

/// What a limit's ledger holds now, for `GET /v1/limits/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    /// What the replicas reported having used (of each kind: requests, tokens, micro-USD) ...
    pub requests: i64,
    pub tokens: i64,
    pub spent_micro_usd: i64,
    /// ... and what leases not reported yet hold (their replicas may have spent any of it).
    pub reserved: [i64; 3],
    pub period_start: i64,
}

fn stored_limit(r: &AnyRow) -> DbResult<StoredLimit> {
    Ok(StoredLimit {
        limit: spec(r)?,
        workspace: r.try_get("workspace")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn spec(r: &AnyRow) -> DbResult<Limit> {
    serde_json::from_str(&r.try_get::<String, _>("spec")?).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The grants of a limit's `kind` that count at `now_ms`: a window kind's still in their
/// window, a budget's of the period starting at `period_start`.
async fn counted(
    conn: &mut AnyConnection,
    limit_id: &str,
    kind: LimitKind,
    period_start: i64,
    now_ms: i64,
) -> DbResult<Vec<Grant>> {
    let (filter, value) = match kind {
        LimitKind::Budget => ("period_start = $3", period_start),
        LimitKind::Requests | LimitKind::Tokens => ("counts_until_ms > $3", now_ms),
    };
    let sql = format!(
        "SELECT amount, used, counts_until_ms, active_until_ms, granted_at_ms FROM limit_grants \
         WHERE limit_id = $1 AND kind = $2 AND {filter}"
    );
    let rows = sqlx::query(&sql).bind(limit_id).bind(kind.as_str()).bind(value).fetch_all(conn).await?;
    rows.iter()
        .map(|r| {
            Ok(Grant {
                amount: r.try_get("amount")?,
                used: r.try_get("used")?,
                counts_until_ms: r.try_get("counts_until_ms")?,
                active_until_ms: r.try_get("active_until_ms")?,
                granted_at_ms: r.try_get("granted_at_ms")?,
            })
        })
        .collect()
}

impl Db {
    /// Creates or replaces limit `limit.id` of `workspace` (a replaced limit keeps its ledger).
    pub async fn put_limit(&self, workspace: &str, limit: &Limit) -> DbResult<StoredLimit> {
        let text = serde_json::to_string(limit).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        let now = now_s();
        let row = sqlx::query(
            "INSERT INTO limits (id, workspace, spec, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (id) DO UPDATE SET workspace = excluded.workspace, spec = excluded.spec, \
             updated_at = excluded.updated_at RETURNING id, workspace, spec, created_at, updated_at",
        )
        .bind(&limit.id)
        .bind(workspace)
        .bind(text)
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        stored_limit(&row)
    }

    pub async fn limit(&self, id: &str) -> DbResult<Option<StoredLimit>> {
        let row = sqlx::query("SELECT id, workspace, spec, created_at, updated_at FROM limits WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored_limit).transpose()
    }

    /// The limits of `workspace` (`None`: of every workspace), by id.
    pub async fn limits(&self, workspace: Option<&str>) -> DbResult<Vec<StoredLimit>> {
        let select = "SELECT id, workspace, spec, created_at, updated_at FROM limits";
        let rows = match workspace {
            Some(workspace) => {
                sqlx::query(&format!("{select} WHERE workspace = $1 ORDER BY id"))
                    .bind(workspace)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => sqlx::query(&format!("{select} ORDER BY id")).fetch_all(&self.pool).await?,
        };
        rows.iter().map(stored_limit).collect()
    }

    /// Deletes a limit with its ledger; whether there was one.
    pub async fn delete_limit(&self, id: &str) -> DbResult<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM limits WHERE id = $1").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM limit_grants WHERE limit_id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// What `limit`'s ledger holds at `now_ms`.
    pub async fn occupancy(&self, limit: &Limit, now_ms: i64) -> DbResult<Occupancy> {
        let mut conn = self.pool.acquire().await?;
        let (period_start, _) = ledger::budget_period(limit.budget_period, now_ms);
        let (mut used, mut reserved) = ([0; 3], [0; 3]);
        for (index, kind) in LimitKind::ALL.into_iter().enumerate() {
            let grants = counted(&mut conn, &limit.id, kind, period_start, now_ms).await?;
            let (reported, held) = ledger::reported_and_reserved(kind, &grants, now_ms);
            if let (Some(used), Some(reserved)) = (used.get_mut(index), reserved.get_mut(index)) {
                (*used, *reserved) = (reported, held);
            }
        }
        let [requests, tokens, spent_micro_usd] = used;
        Ok(Occupancy { requests, tokens, spent_micro_usd, reserved, period_start })
    }

    /// A lease call in one transaction: the write lock of every limit asked for (in id order, so
    /// that two calls never wait for each other in a circle), then the reports (each applied
    /// once: a report of a reported or unknown lease changes nothing), then each ask in order;
    /// all at the time `clock` tells once the locks are held (a time read before could be older
    /// than the grants made while this call waited for them).
    pub async fn lease(&self, asks: &[Ask], reports: &[Report], clock: impl Fn() -> i64) -> DbResult<Vec<Answer>> {
        let mut tx = self.pool.begin().await?;
        let mut ids: Vec<&str> = asks.iter().map(|a| a.limit.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut limits: HashMap<&str, Limit> = HashMap::new();
        for id in ids {
            let row = sqlx::query("UPDATE limits SET ledger_seq = ledger_seq + 1 WHERE id = $1 RETURNING spec")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = row {
                limits.insert(id, spec(&row)?);
            }
        }
        let now_ms = clock();
        let mut reports: Vec<&Report> = reports.iter().collect();
        reports.sort_unstable_by(|a, b| a.lease.cmp(&b.lease));
        for report in reports {
            apply_report(&mut tx, report, now_ms).await?;
        }
        let mut answers = Vec::with_capacity(asks.len());
        for ask in asks {
            let bounded = limits.get(ask.limit.as_str()).and_then(|l| Some((l.budget_period, l.bound(ask.kind)?)));
            let Some((period, bound)) = bounded else {
                answers.push(Answer { ask: ask.clone(), granted: None });
                continue;
            };
            let granted = grant(&mut tx, ask, period, bound, now_ms).await?;
            answers.push(Answer { ask: ask.clone(), granted: Some(granted) });
        }
        tx.commit().await?;
        Ok(answers)
    }

    /// Deletes the grants that count nowhere at `now_ms` any more: how many.
    pub async fn delete_spent_grants(&self, now_ms: i64) -> DbResult<u64> {
        let done = sqlx::query("DELETE FROM limit_grants WHERE counts_until_ms <= $1")
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Sets `workspace`'s price of `model` (`price`: its JSON text).
    pub async fn put_price(&self, workspace: &str, model: &str, price: &str) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO workspace_prices (workspace, model, price, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (workspace, model) DO UPDATE SET price = excluded.price, updated_at = excluded.updated_at",
        )
        .bind(workspace)
        .bind(model)
        .bind(price)
        .bind(now_s())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// `workspace`'s price of `model` (JSON text).
    pub async fn price(&self, workspace: &str, model: &str) -> DbResult<Option<String>> {
        let row = sqlx::query("SELECT price FROM workspace_prices WHERE workspace = $1 AND model = $2")
            .bind(workspace)
            .bind(model)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.try_get("price")).transpose()
    }

    /// Every price of `workspace`: (model, JSON text), by model.
    pub async fn prices(&self, workspace: &str) -> DbResult<Vec<(String, String)>> {
        let rows = sqlx::query("SELECT model, price FROM workspace_prices WHERE workspace = $1 ORDER BY model")
            .bind(workspace)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get("model")?, r.try_get("price")?))).collect()
    }
}

/// Applies a report of a lease not reported yet (else nothing changes). A window kind's uses
/// placed by admission become grants of their own, each counting a window from its admission
/// (those whose window already passed count no more); the rest of what was used counts a
/// window from the report.
async fn apply_report(conn: &mut AnyConnection, report: &Report, now_ms: i64) -> DbResult<()> {
    // The update claims the lease (`reported_at_ms IS NULL`) in one statement, so a report sent
    // twice by calls running at once is applied by one of them only.
    let placed = report.uses.iter().fold(0i64, |sum, (_, amount)| sum.saturating_add(*amount));
    let row = sqlx::query(
        "UPDATE limit_grants SET used = CASE WHEN kind = $3 THEN $1 ELSE $6 END, reported_at_ms = $2, \
         counts_until_ms = CASE WHEN kind = $3 THEN counts_until_ms ELSE $4 END \
         WHERE id = $5 AND reported_at_ms IS NULL \
         RETURNING limit_id, kind, granted_at_ms, active_until_ms, period_start",
    )
    .bind(report.used)
    .bind(now_ms)
    .bind(LimitKind::Budget.as_str())
    .bind(ledger::reported_end_ms(now_ms))
    .bind(&report.lease)
    .bind(report.used.saturating_sub(placed).max(0))
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let kind: String = row.try_get("kind")?;
    if kind == LimitKind::Budget.as_str() {
        return Ok(());
    }
    let granted_at_ms: i64 = row.try_get("granted_at_ms")?;
    for (index, &(offset_ms, amount)) in report.uses.iter().enumerate() {
        let counts_until_ms = ledger::admission_end_ms(granted_at_ms, offset_ms, now_ms);
        if amount == 0 || counts_until_ms <= now_ms {
            continue;
        }
        sqlx::query(
            "INSERT INTO limit_grants (id, limit_id, kind, amount, used, granted_at_ms, active_until_ms, \
                 reported_at_ms, period_start, counts_until_ms) VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $8, $9)",
        )
        .bind(format!("{}/{index}", report.lease))
        .bind(row.try_get::<String, _>("limit_id")?)
        .bind(&kind)
        .bind(amount)
        .bind(granted_at_ms)
        .bind(row.try_get::<i64, _>("active_until_ms")?)
        .bind(now_ms)
        .bind(row.try_get::<i64, _>("period_start")?)
        .bind(counts_until_ms)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Decides one ask of a locked limit and records what it grants.
async fn grant(conn: &mut AnyConnection, ask: &Ask, period: Period, bound: u64, now_ms: i64) -> DbResult<Granted> {
    let (period_start, _) = ledger::budget_period(period, now_ms);
    let grants = counted(&mut *conn, &ask.limit, ask.kind, period_start, now_ms).await?;
    let decision = ledger::decide(ask.kind, bound, period, &grants, ask.need, ask.want, now_ms);
    if decision.granted == 0 {
        return Ok(Granted { lease: None, bound, decision });
    }
    let lease = uuid::Uuid::now_v7().to_string();
    sqlx::query(
        "INSERT INTO limit_grants (id, limit_id, kind, amount, used, granted_at_ms, active_until_ms, \
             reported_at_ms, period_start, counts_until_ms) VALUES ($1, $2, $3, $4, NULL, $5, $6, NULL, $7, $8)",
    )
    .bind(&lease)
    .bind(&ask.limit)
    .bind(ask.kind.as_str())
    .bind(decision.granted)
    .bind(now_ms)
    .bind(now_ms.saturating_add(decision.ttl_ms))
    .bind(period_start)
    .bind(decision.counts_until_ms)
    .execute(conn)
    .await?;
    Ok(Granted { lease: Some(lease), bound, decision })
}
