//! Retention: a periodic sweep deletes the limits' grants that count nowhere any more (their
//! window or budget period is over), and, with `GATEWAY_LOG_RETENTION_DAYS` set, request
//! records older than that many days (by `timestamp_ms`), with their metadata rows, and
//! feedback given before then. Unset, every record is kept.

use crate::db::{now_ms, Db, DbResult};
use crate::AppState;
use std::time::Duration;

/// Days are whole, 1 to 100 years' worth.
pub const MAX_DAYS: i64 = 36_500;
/// How often the sweep runs (and once at start).
const PERIOD: Duration = Duration::from_secs(3600);
const DAY_MS: i64 = 86_400_000;

/// `GATEWAY_LOG_RETENTION_DAYS`: None when unset or empty (keep forever).
pub fn days_from_env() -> Result<Option<i64>, String> {
    days(std::env::var("GATEWAY_LOG_RETENTION_DAYS").ok().as_deref())
}

fn days(value: Option<&str>) -> Result<Option<i64>, String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match value.parse::<i64>() {
        Ok(days) if (1..=MAX_DAYS).contains(&days) => Ok(Some(days)),
        _ => Err(format!("GATEWAY_LOG_RETENTION_DAYS must be a whole number of days from 1 to {MAX_DAYS}")),
    }
}

/// Deletes what is older than `days` before `now_ms`: how many records.
pub async fn sweep_once(db: &Db, days: i64, now_ms: i64) -> DbResult<u64> {
    db.delete_logs_before(now_ms.saturating_sub(days.saturating_mul(DAY_MS))).await
}

/// Runs the sweep now and every hour: spent grants, and records older than `days` when given.
pub async fn sweep(s: AppState, days: Option<i64>) {
    loop {
        if let Err(e) = s.db.delete_spent_grants(now_ms()).await {
            eprintln!("control plane: deleting spent limit grants: {e}");
        }
        if let Some(days) = days {
            match sweep_once(&s.db, days, now_ms()).await {
                Ok(0) => {}
                Ok(n) => eprintln!("control plane: deleted {n} request records older than {days} days"),
                Err(e) => eprintln!("control plane: deleting old request records: {e}"),
            }
        }
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_off_unless_a_whole_number_of_days_is_given() {
        assert_eq!(days(None), Ok(None));
        assert_eq!(days(Some(" ")), Ok(None));
        assert_eq!(days(Some("30")), Ok(Some(30)));
        assert_eq!(days(Some("36500")), Ok(Some(36_500)));
        for bad in ["0", "-1", "1.5", "x", "36501"] {
            assert!(days(Some(bad)).is_err(), "{bad}");
        }
    }
}
