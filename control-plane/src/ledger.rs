//! The limits' ledger (issue 26) as pure functions of a limit's grants and the time: what a
//! window or a budget period holds, how much a lease call grants, and when allowance frees up.
//! `db::limits` reads the grants and writes new ones inside the limit's write lock; nothing here
//! reads a clock.
//!
//! Window kinds (requests, tokens): a grant counts until `counts_until`. Unreported, its
//! `amount` counts until 60 s after its lease ended, for tokens plus the drain time (its replica
//! may still be settling what it admitted, or may have died; a request counts whole when it is
//! admitted, so a requests lease has nothing left to settle). A report says when each use was
//! admitted: each use becomes a grant of its own counting 60 s from its admission (`db::limits`
//! writes them), and what the report does not place counts 60 s from the report. A use never
//! counts from before its admission (its offset, which the replica measures from when it sent
//! the ask that brought the lease, is added to when the lease was granted, which came after), so
//! the window never admits more than the bound, and a use leaves the window 60 s after it was
//! admitted whatever lease it came from. A grant made later than the time asked about (another
//! control plane's clock ahead of this one's) counts too: counting more is safe.
//! Budgets: every grant of the period counts, `used` once reported, else `amount` (a replica
//! that never reports may have spent it all).

use gateway_schema::limits::{LimitKind, Period, WINDOW_SECONDS};

/// The rate and token limits' window, in ms.
pub const WINDOW_MS: i64 = WINDOW_SECONDS as i64 * 1000;
/// How long an unreported window grant still counts after its lease ended, before its window.
pub const DRAIN_MS: i64 = 15 * 60 * 1000;
/// How long a lease lasts (a budget's ends with its period at the latest).
pub const TTL_MS: i64 = 5000;
/// A replica reports a lease as it ends; an ask refused while other leases may still come back
/// is told to ask again this long after the earliest of them ends.
pub const REPORT_GRACE_MS: i64 = 500;

/// A grant as the accounting reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub amount: i64,
    /// What its replica reported having used (`None` until it reports).
    pub used: Option<i64>,
    /// When it stops counting (see `unreported_end_ms`, `reported_end_ms`, `budget_period`).
    pub counts_until_ms: i64,
    /// When its lease ends.
    pub active_until_ms: i64,
    /// When it was granted.
    pub granted_at_ms: i64,
}

impl Grant {
    /// What the grant holds: its reported use, else all of it.
    fn held(&self) -> i64 {
        self.used.unwrap_or(self.amount)
    }

    /// Whether it counts in the window at `now_ms`.
    fn in_window(&self, now_ms: i64) -> bool {
        now_ms < self.counts_until_ms
    }

    /// Its replica still uses it, or is about to report it.
    fn out(&self, now_ms: i64) -> bool {
        self.used.is_none() && self.active_until_ms.saturating_add(REPORT_GRACE_MS) > now_ms
    }

    /// When what it holds frees, as far as is known at `now_ms`: a lease still out, a window
    /// after it was granted (its first use was admitted then at the earliest; its report will
    /// place the rest), so that no window kind's reset is later than a window from now but for
    /// leases their replicas never reported.
    fn frees_at(&self, now_ms: i64) -> i64 {
        match self.out(now_ms) {
            true => self.counts_until_ms.min(self.granted_at_ms.saturating_add(WINDOW_MS)),
            false => self.counts_until_ms,
        }
    }
}

/// When an unreported window grant stops counting: a window after its lease ended (tokens:
/// and the drain time, while its reservations may still settle).
pub fn unreported_end_ms(kind: LimitKind, active_until_ms: i64) -> i64 {
    let drain = if kind == LimitKind::Requests { 0 } else { DRAIN_MS };
    active_until_ms.saturating_add(drain).saturating_add(WINDOW_MS)
}

/// When a reported window grant stops counting: a window after its report.
pub fn reported_end_ms(reported_at_ms: i64) -> i64 {
    reported_at_ms.saturating_add(WINDOW_MS)
}

/// When a use reported with `offset_ms` stops counting: a window after its admission, which is
/// `offset_ms` after its lease was granted and never after the report arrived at `now_ms`.
pub fn admission_end_ms(granted_at_ms: i64, offset_ms: i64, now_ms: i64) -> i64 {
    granted_at_ms.saturating_add(offset_ms.max(0)).min(now_ms).saturating_add(WINDOW_MS)
}

/// The budget period holding `now_ms`: its start (Unix s) and its end in ms (`i64::MAX`: never).
pub fn budget_period(period: Period, now_ms: i64) -> (i64, i64) {
    let now_s = u64::try_from(now_ms.div_euclid(1000)).unwrap_or(0);
    let start = i64::try_from(period.start(now_s)).unwrap_or(0);
    let end = period.end(now_s).and_then(|s| i64::try_from(s).ok()).map_or(i64::MAX, |s| s.saturating_mul(1000));
    (start, end)
}

/// What `grants` hold of the bound at `now_ms`: for a window kind those in the window, for a
/// budget all of them (the grants of the current period).
pub fn occupied(kind: LimitKind, grants: &[Grant], now_ms: i64) -> i64 {
    let counted = grants.iter().filter(|g| kind == LimitKind::Budget || g.in_window(now_ms));
    counted.fold(0, |sum, g| sum.saturating_add(g.held()))
}

/// What `grants` hold at `now_ms` (as `occupied` counts them), split into what their replicas
/// reported having used and what leases not reported yet hold whole.
pub fn reported_and_reserved(kind: LimitKind, grants: &[Grant], now_ms: i64) -> (i64, i64) {
    let counted = grants.iter().filter(|g| kind == LimitKind::Budget || g.in_window(now_ms));
    counted.fold((0, 0), |(reported, reserved), g| match g.used {
        Some(used) => (reported.saturating_add(used), reserved),
        None => (reported, reserved.saturating_add(g.amount)),
    })
}

/// The answer to one ask of a lease call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// 0: refused (less than `need` remains).
    pub granted: i64,
    /// What remains of the bound once this grant is made.
    pub remaining: i64,
    /// How long the lease lasts.
    pub ttl_ms: i64,
    /// Seconds until more fits (see `decide`).
    pub reset_s: i64,
    /// When the new grant stops counting.
    pub counts_until_ms: i64,
    /// Refused, but leases not reported yet would make `need` fit if they came back unused:
    /// the ms until the earliest of them ends, and its report with it.
    pub retry_ms: Option<i64>,
}

/// One ask of a lease call: at least `need`, ideally `want`, of `bound` (whose ledger holds
/// `grants`: a window kind's grants still counting, or a budget's grants of the current period)
/// at `now_ms`. The grant shrinks as the allowance runs out: a quarter of what remains unless
/// less is wanted, never less than `need`. `reset_s`, for a window kind, is the seconds until
/// enough of what is counted stops counting for `need` more to fit (granted: for anything more
/// to fit); for a budget, the seconds until its period ends (0 for `total`).
pub fn decide(
    kind: LimitKind,
    bound: u64,
    period: Period,
    grants: &[Grant],
    need: i64,
    want: i64,
    now_ms: i64,
) -> Decision {
    let bound = i64::try_from(bound).unwrap_or(i64::MAX);
    let available = bound.saturating_sub(occupied(kind, grants, now_ms)).max(0);
    let granted = if available < need { 0 } else { grant_size(available, need, want) };
    let remaining = available - granted;
    let retry_ms = if granted == 0 { retry_ms(grants, available, need, now_ms) } else { None };
    if kind == LimitKind::Budget {
        let (_, end_ms) = budget_period(period, now_ms);
        let until_end = end_ms.saturating_sub(now_ms);
        let reset_s = if end_ms == i64::MAX { 0 } else { ceil_seconds(until_end) };
        let ttl_ms = TTL_MS.min(until_end);
        return Decision { granted, remaining, ttl_ms, reset_s, counts_until_ms: end_ms, retry_ms };
    }
    let active_until_ms = now_ms.saturating_add(TTL_MS);
    let counts_until_ms = unreported_end_ms(kind, active_until_ms);
    let new = Grant { amount: granted, used: None, counts_until_ms, active_until_ms, granted_at_ms: now_ms };
    let to_free = if granted == 0 { need.saturating_sub(available).max(1) } else { 1 };
    let reset_s = ceil_seconds(until_freed(grants.iter().chain([&new]), to_free, now_ms));
    Decision { granted, remaining, ttl_ms: TTL_MS, reset_s, counts_until_ms, retry_ms }
}

/// For a refused ask: when the leases still out (ending, or ended a moment ago and about to be
/// reported) would make `need` fit if they came back unused, the ms until the earliest of them
/// ends and is reported. None when even all of them could not make it fit.
fn retry_ms(grants: &[Grant], available: i64, need: i64, now_ms: i64) -> Option<i64> {
    let out = grants.iter().filter(|g| g.out(now_ms));
    let (returnable, earliest) = out
        .fold((0i64, i64::MAX), |(sum, earliest), g| (sum.saturating_add(g.amount), earliest.min(g.active_until_ms)));
    (earliest != i64::MAX && available.saturating_add(returnable) >= need)
        .then(|| earliest.saturating_sub(now_ms).max(0).saturating_add(REPORT_GRACE_MS))
}

/// `min(available, max(need, min(want, ⌈available / 4⌉)))`.
fn grant_size(available: i64, need: i64, want: i64) -> i64 {
    let quarter = available / 4 + i64::from(available % 4 != 0);
    available.min(need.max(want.min(quarter)))
}

/// Milliseconds until at least `amount` of what `grants` hold in the window at `now_ms` has
/// stopped counting (see `Grant::frees_at`); when they never free that much, until all of it
/// has; 0 when none counts.
fn until_freed<'a>(grants: impl Iterator<Item = &'a Grant>, amount: i64, now_ms: i64) -> i64 {
    let mut ends: Vec<(i64, i64)> =
        grants.filter(|g| g.in_window(now_ms) && g.held() > 0).map(|g| (g.frees_at(now_ms), g.held())).collect();
    ends.sort_unstable();
    let mut freed = 0i64;
    let mut last = now_ms;
    for (end, held) in ends {
        freed = freed.saturating_add(held);
        last = end;
        if freed >= amount {
            break;
        }
    }
    last.saturating_sub(now_ms)
}

fn ceil_seconds(ms: i64) -> i64 {
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_709_600_000; // 2026-11-26T16:13:20Z

    fn window(amount: i64, used: Option<i64>, granted_at_ms: i64, reported_at_ms: Option<i64>) -> Grant {
        let active_until_ms = granted_at_ms + TTL_MS;
        let counts_until_ms =
            reported_at_ms.map_or(unreported_end_ms(LimitKind::Tokens, active_until_ms), reported_end_ms);
        Grant { amount, used, counts_until_ms, active_until_ms, granted_at_ms }
    }

    fn requests(grants: &[Grant], need: i64, want: i64, now: i64) -> Decision {
        decide(LimitKind::Requests, 10, Period::Month, grants, need, want, now)
    }

    #[test]
    fn grants_shrink_as_the_allowance_runs_out() {
        assert_eq!(grant_size(100, 1, 50), 25);
        assert_eq!(grant_size(100, 1, 10), 10);
        assert_eq!(grant_size(100, 40, 10), 40);
        assert_eq!(grant_size(10, 1, 100), 3);
        assert_eq!(grant_size(3, 1, 100), 1);
        assert_eq!(grant_size(3, 3, 100), 3);
        assert_eq!(grant_size(0, 0, 5), 0);
        assert_eq!(grant_size(i64::MAX, 1, i64::MAX), i64::MAX / 4 + 1);
        // Grant after grant of a bound of 10 wanting 100 each: 3, 2, 2, 1, 1, 1, then none.
        let mut grants = Vec::new();
        let mut sizes = Vec::new();
        for i in 0..8 {
            let d = requests(&grants, 1, 100, NOW + i);
            sizes.push(d.granted);
            grants.push(window(d.granted, None, NOW + i, None));
        }
        assert_eq!(sizes, [3, 2, 2, 1, 1, 1, 0, 0]);
    }

    #[test]
    fn an_unreported_window_grant_counts_until_its_lease_the_drain_and_the_window_ended() {
        let grant = window(10, None, NOW, None);
        let end = NOW + TTL_MS + DRAIN_MS + WINDOW_MS;
        assert_eq!(grant.counts_until_ms, end);
        // Made after the time asked about (another control plane's clock is ahead): counted.
        for (at, held) in [(NOW - 1, 10), (NOW, 10), (NOW + TTL_MS + DRAIN_MS, 10), (end - 1, 10), (end, 0)] {
            assert_eq!(occupied(LimitKind::Requests, &[grant], at), held, "at {at}");
        }
        let refused = requests(&[grant], 1, 1, NOW + 1000);
        assert_eq!((refused.granted, refused.remaining), (0, 0));
        // Its lease still out, what it holds frees a window after its grant at the earliest (its
        // report will tell when each use was admitted) ...
        assert_eq!(refused.reset_s, (WINDOW_MS - 1000) / 1000);
        // ... but never reported (its replica died), only at its end.
        let late = NOW + TTL_MS + REPORT_GRACE_MS;
        assert_eq!(requests(&[grant], 1, 1, late).reset_s, (end - late + 999) / 1000);
        assert_eq!(requests(&[grant], 1, 1, end).granted, 1);
        // A requests lease has nothing to settle: it counts a window after it ended.
        assert_eq!(unreported_end_ms(LimitKind::Requests, NOW), NOW + WINDOW_MS);
    }

    #[test]
    fn a_refused_ask_asks_again_when_leases_still_out_could_make_it_fit() {
        let out = window(4, None, NOW, None); // its lease ends at NOW + 5 s
        let spent = window(6, Some(6), NOW - 10_000, Some(NOW - 5000));
        let refused = requests(&[out, spent], 1, 1, NOW + 1000);
        assert_eq!((refused.granted, refused.retry_ms), (0, Some(4000 + REPORT_GRACE_MS)));
        // Ended a moment ago, not reported yet: its report is about to come.
        assert_eq!(requests(&[out, spent], 1, 1, NOW + TTL_MS + 100).retry_ms, Some(REPORT_GRACE_MS));
        // Ended long ago, never reported (its replica died): nothing to wait for.
        assert_eq!(requests(&[out, spent], 1, 1, NOW + TTL_MS + REPORT_GRACE_MS).retry_ms, None);
        // Even all of it back would not fit: refused at once.
        assert_eq!(requests(&[out, spent], 5, 5, NOW + 1000).retry_ms, None);
        assert_eq!(requests(&[spent], 1, 1, NOW).retry_ms, None, "granted: nothing to retry");
    }

    #[test]
    fn a_report_frees_the_unused_part_now_and_the_used_part_a_window_after_it() {
        let reported = NOW + 7000;
        let grant = window(10, Some(4), NOW, Some(reported));
        assert_eq!(occupied(LimitKind::Requests, &[grant], reported), 4);
        let d = requests(&[grant], 1, 100, reported);
        assert_eq!((d.granted, d.remaining), (2, 4), "6 left: a quarter, rounded up");
        assert_eq!(d.reset_s, 60, "the reported grant's 4 free a window after its report");
        let refused = requests(&[grant], 7, 7, reported + 500);
        assert_eq!((refused.granted, refused.reset_s), (0, 60), "59.5 s, rounded up");
        assert_eq!(occupied(LimitKind::Requests, &[grant], reported + WINDOW_MS), 0);
        assert_eq!(requests(&[grant], 10, 10, reported + WINDOW_MS).granted, 10);
        // Reported used more than granted (the provider counted more tokens than reserved).
        let over = window(10, Some(25), NOW, Some(reported));
        assert_eq!(decide(LimitKind::Tokens, 20, Period::Month, &[over], 1, 1, reported).remaining, 0);
    }

    #[test]
    fn reset_is_when_enough_frees_for_the_need() {
        let grants = [
            window(3, Some(3), NOW, Some(NOW + 1000)),   // frees at NOW + 61 s
            window(2, Some(0), NOW, Some(NOW + 1000)),   // holds nothing
            window(5, Some(5), NOW, Some(NOW + 30_000)), // frees at NOW + 90 s
            window(2, None, NOW + 2000, None),           // out: frees at NOW + 62 s at the earliest
        ];
        assert_eq!(occupied(LimitKind::Requests, &grants, NOW + 2000), 10);
        assert_eq!(requests(&grants, 1, 1, NOW + 2000).reset_s, 59);
        assert_eq!(requests(&grants, 4, 4, NOW + 2000).reset_s, 60);
        assert_eq!(requests(&grants, 9, 9, NOW + 2000).reset_s, 88);
        assert_eq!(requests(&grants, 11, 11, NOW + 2000).reset_s, 88, "never fits");
        // Nothing counted: a grant's reset is a window (its first use is admitted now).
        let fresh = requests(&[], 1, 1, NOW);
        assert_eq!((fresh.granted, fresh.ttl_ms, fresh.reset_s), (1, TTL_MS, WINDOW_MS / 1000));
    }

    /// Issue 45's case: 3 requests a minute; one admitted at 0 s, two at 50.5 s, each from a
    /// lease of its own reported as it ended: at 61.5 s the first has left the window, so exactly
    /// one more fits; no reset is ever over the window.
    #[test]
    fn each_request_leaves_the_window_a_window_after_it_was_admitted() {
        let bound = |grants: &[Grant], now: i64| decide(LimitKind::Requests, 3, Period::Month, grants, 1, 1, now);
        let mut grants = Vec::new();
        let admit = |grants: &mut Vec<Grant>, at: i64| {
            let d = bound(grants, at);
            assert_eq!(d.granted, 1, "admitted at {at}");
            assert!(d.reset_s <= WINDOW_MS / 1000, "reset {} s at {at}", d.reset_s);
            // Reported at its lease's end, admitted as the lease came: offset 0 from its grant.
            let reported = at + TTL_MS;
            let use_end = admission_end_ms(at, 0, reported);
            grants.push(Grant {
                amount: 1,
                used: Some(1),
                counts_until_ms: use_end,
                active_until_ms: reported,
                granted_at_ms: at,
            });
        };
        admit(&mut grants, 0);
        admit(&mut grants, 50_500);
        admit(&mut grants, 50_500);
        let refused = bound(&grants, 60_000 - 1);
        assert_eq!((refused.granted, refused.reset_s), (0, 1));
        admit(&mut grants, 61_500);
        let refused = bound(&grants, 61_500);
        assert_eq!((refused.granted, refused.reset_s), (0, 49), "the first of 50.5 s frees at 110.5 s");
    }

    #[test]
    fn a_use_counts_from_its_admission_never_after_its_report() {
        assert_eq!(admission_end_ms(NOW - 9000, 4000, NOW), NOW - 5000 + WINDOW_MS);
        assert_eq!(admission_end_ms(NOW - 3000, 4000, NOW), NOW + WINDOW_MS, "after its report: from the report");
        assert_eq!(admission_end_ms(NOW - 3000, 0, NOW), NOW - 3000 + WINDOW_MS);
    }

    #[test]
    fn budgets_count_the_period_and_reset_at_its_end() {
        let budget = |grants: &[Grant], period: Period, need: i64, now: i64| {
            decide(LimitKind::Budget, 1_000_000, period, grants, need, need, now)
        };
        let (start, end) = budget_period(Period::Day, NOW);
        assert_eq!((start, end), (1_795_651_200, 1_795_737_600_000));
        let spent = Grant {
            amount: 400_000,
            used: Some(100_000),
            counts_until_ms: end,
            active_until_ms: NOW - 9000,
            granted_at_ms: NOW - 14_000,
        };
        let lost = Grant { amount: 300_000, used: None, counts_until_ms: end, ..spent };
        assert_eq!(occupied(LimitKind::Budget, &[spent, lost], NOW), 400_000, "a lost grant stays counted");
        let d = budget(&[spent, lost], Period::Day, 600_000, NOW);
        assert_eq!((d.granted, d.remaining, d.ttl_ms), (600_000, 0, TTL_MS));
        assert_eq!((d.reset_s, d.counts_until_ms), ((end - NOW) / 1000, end));
        let refused = budget(&[spent, lost], Period::Day, 600_001, NOW);
        assert_eq!((refused.granted, refused.remaining), (0, 600_000));
        // A lease never outlasts its period; a total budget never resets.
        let near_end = budget(&[], Period::Day, 1, end - 1200);
        assert_eq!((near_end.ttl_ms, near_end.reset_s), (1200, 2));
        let total = budget(&[], Period::Total, 1, NOW);
        assert_eq!((total.ttl_ms, total.reset_s, total.counts_until_ms), (TTL_MS, 0, i64::MAX));
        assert_eq!(budget_period(Period::Total, NOW), (0, i64::MAX));
        assert_eq!(budget_period(Period::Month, NOW).0, 1_793_491_200);
    }
}
