//! A worker's leases of the allowance the control plane grants, one ledger per limit and kind.
//!
//! A request reserves its worst case from the ledger's active lease without any call; when the
//! lease has no room, the request waits for a grant (one call serves every request waiting).
//! The worker's timer renews a lease in use before it runs out, and reports each lease that is
//! no longer reserved from once every reservation on it settled: the control plane then counts
//! what was used instead of what was granted, and the rest is free for every replica again.
//!
//! The leases live in the worker (each Envoy worker is a replica of its own to the control
//! plane): a request never touches shared data for its limits, and no two workers can spend
//! the same allowance.

use super::{Demand, LedgerKey};
use gateway_schema::limits::LimitKind;
use serde::Serialize;
use serde_json::Value;
use std::rc::Rc;

/// A lease still reserved from after this long is reported with its reservations counted as
/// used (their requests never ended, or ended unseen).
pub(crate) const DRAIN_MS: u64 = 15 * 60 * 1000;
/// A lease in use is renewed this long before it ends, so requests need not wait for one.
pub(crate) const RENEW_AHEAD_MS: u64 = 1500;
/// Reports the control plane did not take are sent again this much later.
const RETRY_MS: u64 = 1000;
/// A lease's rate of use is measured over this share of its life at least (see
/// [`Lease::projected_use`]).
const RATE_FLOOR_DIVISOR: u64 = 20;
/// A ledger is renewed ahead only while requests used it this recently ...
const RENEW_WHILE_USED_MS: u64 = 10_000;
/// ... and forgotten once nothing used it for this long and nothing of it is left to report.
const FORGET_AFTER_MS: u64 = 120_000;

/// What the control plane said of one ledger with a grant.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Grant {
    /// The lease's id; None when nothing was granted.
    pub(crate) lease: Option<String>,
    pub(crate) granted: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) bound: u64,
    /// What is left for every replica after this grant.
    pub(crate) remaining: u64,
    /// Seconds until the allowance grows again (the window moves on, the period ends).
    pub(crate) reset_s: u64,
    /// Nothing was granted, but leases other replicas hold end within this many ms: asking
    /// again then may find their unused allowance.
    pub(crate) retry_ms: Option<u64>,
    /// The limit is gone (deleted, or no longer bounds this kind).
    pub(crate) gone: bool,
}

impl Grant {
    /// The control plane's answer for one ledger (`{"lease", "granted", "ttl_ms", ...}`).
    pub(crate) fn from_json(value: &Value) -> Grant {
        let number = |name: &str| value.get(name).and_then(Value::as_u64);
        Grant {
            lease: value.get("lease").and_then(Value::as_str).map(str::to_string),
            granted: number("granted").unwrap_or_default(),
            ttl_ms: number("ttl_ms").unwrap_or_default(),
            bound: number("bound").unwrap_or_default(),
            remaining: number("remaining").unwrap_or_default(),
            reset_s: number("reset_s").unwrap_or_default(),
            retry_ms: number("retry_ms"),
            gone: value.get("gone").and_then(Value::as_bool) == Some(true),
        }
    }
}

/// An ask for allowance, as the control plane takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Ask {
    pub(crate) limit: String,
    pub(crate) kind: LimitKind,
    /// At least this much, or nothing.
    pub(crate) need: u64,
    /// As much as this, if the allowance allows.
    pub(crate) want: u64,
}

impl Ask {
    /// The ledger the ask is for.
    pub(crate) fn key(&self) -> LedgerKey {
        LedgerKey { limit: Rc::from(self.limit.as_str()), kind: self.kind }
    }
}

/// A lease no longer reserved from, and what it used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    pub(crate) lease: String,
    pub(crate) used: u64,
    /// A window kind's use by when it was admitted: `[offset_ms, amount]`, the offset from when
    /// the ask that brought the lease was sent (rounded down, so the control plane, which adds
    /// it to when it granted the lease, later than that ask, never counts a use from before
    /// its admission, however late the report comes). Each use then counts in the window from
    /// its own admission, not from the report.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) uses: Vec<[u64; 2]>,
}

/// A reservation a request holds until its answer ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hold {
    pub(crate) key: LedgerKey,
    lease: Rc<str>,
    pub(crate) amount: u64,
    /// Its admission's slot in the lease's `admitted`.
    admitted_at: u64,
}

/// A window kind's admissions are told to the control plane by the end of the slot of this
/// many ms they fall in (a lease of 5 s has at most 50 slots to report).
const ADMISSION_SLOT_MS: u64 = 100;

/// Where a ledger stands, for the client's `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Standing {
    pub(crate) bound: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_s: u64,
}

#[derive(Clone)]
struct Lease {
    id: Rc<str>,
    granted: u64,
    /// Reserved and settled so far.
    used: u64,
    /// Reservations not settled yet (tokens and budgets; a request counts when admitted).
    outstanding: u32,
    granted_ms: u64,
    /// When the ask that brought it was sent: its admissions' offsets count from then.
    asked_ms: u64,
    until_ms: u64,
    /// When requests stopped reserving from it.
    ended_ms: u64,
    /// A window kind's use by admission: `(slot end ms, amount)`, in the order admitted.
    admitted: Vec<(u64, u64)>,
}

impl Lease {
    fn room(&self) -> u64 {
        self.granted.saturating_sub(self.used)
    }

    /// Counts `amount` admitted at `now_ms` in its slot; the slot's end.
    fn admit(&mut self, kind: LimitKind, amount: u64, now_ms: u64) -> u64 {
        self.used = self.used.saturating_add(amount);
        let slot = now_ms.div_ceil(ADMISSION_SLOT_MS).saturating_mul(ADMISSION_SLOT_MS);
        // A budget counts its whole period: when its uses were admitted does not matter.
        if kind != LimitKind::Budget {
            match self.admitted.last_mut() {
                Some((last, admitted)) if *last == slot => *admitted = admitted.saturating_add(amount),
                _ => self.admitted.push((slot, amount)),
            }
        }
        slot
    }

    /// A reservation of `held` admitted in slot `at` settled as `actual`.
    fn settle(&mut self, held: u64, actual: u64, at: u64) {
        self.used = self.used.saturating_sub(held).saturating_add(actual);
        if let Some((_, admitted)) = self.admitted.iter_mut().rev().find(|(slot, _)| *slot == at) {
            *admitted = admitted.saturating_sub(held).saturating_add(actual);
        }
    }

    /// The report of what it used.
    fn report(&self) -> Report {
        let uses = self.admitted.iter().filter(|(_, amount)| *amount > 0);
        Report {
            lease: self.id.to_string(),
            used: self.used,
            uses: uses.map(|&(slot, amount)| [slot.saturating_sub(self.asked_ms), amount]).collect(),
        }
    }

    /// What it would use over its whole life at the rate it was used so far: a lease used up
    /// early asks for as much more as its life is longer. The rate is measured over a
    /// twentieth of its life at least, so a burst's first moments do not project without end.
    fn projected_use(&self, now_ms: u64) -> u64 {
        let life = self.until_ms.saturating_sub(self.granted_ms);
        let elapsed = now_ms.saturating_sub(self.granted_ms).clamp(life / RATE_FLOOR_DIVISOR, life).max(1);
        let projected = u128::from(self.used) * u128::from(life) / u128::from(elapsed);
        u64::try_from(projected).unwrap_or(u64::MAX).max(self.used)
    }
}

#[derive(Default, Clone)]
struct Ledger {
    active: Option<Lease>,
    draining: Vec<Lease>,
    bound: u64,
    /// What the control plane had left with its last grant, besides what this worker holds.
    remaining: u64,
    reset_at_ms: u64,
    used_ms: u64,
    /// What the last lease used ...
    last_used: u64,
    /// ... and the last one used would have used over its whole life at its rate: the next asks
    /// for twice as much.
    last_projected: u64,
    /// The timer asked to renew the lease; not asked again until answered.
    renewing: bool,
    /// A renewal was refused or not answered: none is asked again before this.
    renew_not_before_ms: u64,
}

impl Ledger {
    /// The active lease ends at its time: no more reservations from it.
    fn retire_expired(&mut self, now_ms: u64) {
        if self.active.as_ref().is_some_and(|lease| lease.until_ms <= now_ms) {
            self.retire(now_ms);
        }
    }

    fn retire(&mut self, now_ms: u64) {
        if let Some(mut lease) = self.active.take() {
            lease.ended_ms = now_ms;
            self.last_used = lease.used;
            if lease.used > 0 {
                // A lease renewed while its load paused says nothing of the load's rate.
                self.last_projected = lease.projected_use(now_ms);
            }
            self.draining.push(lease);
        }
    }

    fn lease_mut(&mut self, id: &str) -> Option<&mut Lease> {
        self.active.iter_mut().chain(self.draining.iter_mut()).find(|lease| &*lease.id == id)
    }

    /// Whether the timer renews the active lease ahead: requests used it lately and no renewal
    /// is on its way.
    fn renews(&self, now_ms: u64) -> bool {
        !self.renewing && now_ms.saturating_sub(self.used_ms) <= RENEW_WHILE_USED_MS
    }

    /// When the timer renews the active lease ahead (it ends at `until_ms`).
    fn renew_at(&self, until_ms: u64) -> u64 {
        until_ms.saturating_sub(RENEW_AHEAD_MS).max(self.renew_not_before_ms)
    }

    /// Twice what the active lease (or the last one) would use over a whole life at its rate,
    /// so that a lease lasts until it is renewed ahead of its end.
    fn want(&self, need: u64, now_ms: u64) -> u64 {
        let last = self.last_projected;
        let in_use = self.active.as_ref().map_or(last, |lease| lease.projected_use(now_ms).max(last));
        need.max(in_use.saturating_mul(2))
    }
}

/// Every ledger a worker's requests reserve from.
#[derive(Default, Clone)]
pub(crate) struct Leases {
    /// By limit and kind: a worker holds few.
    ledgers: Vec<(LedgerKey, Ledger)>,
    /// Reports the control plane did not take yet: sent again with the next call.
    unsent: Vec<Report>,
    /// A reservation made an idle ledger's lease one to renew ahead: the timer must be set
    /// again (see [`Leases::take_woken`]).
    woken: bool,
}

impl Leases {
    fn ledger_mut(&mut self, key: &LedgerKey) -> Option<&mut Ledger> {
        self.ledgers.iter_mut().find(|(known, _)| known == key).map(|(_, ledger)| ledger)
    }

    /// `key`'s ledger, made when new (always `Some`).
    fn ledger_or_new(&mut self, key: &LedgerKey) -> Option<&mut Ledger> {
        if !self.ledgers.iter().any(|(known, _)| known == key) {
            self.ledgers.push((key.clone(), Ledger::default()));
        }
        self.ledger_mut(key)
    }

    /// Reserves `demand` from its ledger's active lease; None when no lease has room for it.
    pub(crate) fn reserve(&mut self, demand: &Demand, now_ms: u64) -> Option<Hold> {
        let ledger = self.ledger_or_new(&demand.key)?;
        let was_renewed = ledger.renews(now_ms);
        ledger.used_ms = now_ms;
        ledger.retire_expired(now_ms);
        let woken = !was_renewed && ledger.renews(now_ms) && ledger.active.is_some();
        let hold = ledger.active.as_mut().filter(|lease| lease.room() >= demand.amount).map(|lease| {
            let admitted_at = lease.admit(demand.key.kind, demand.amount, now_ms);
            if demand.key.kind != LimitKind::Requests {
                lease.outstanding = lease.outstanding.saturating_add(1);
            }
            Hold { key: demand.key.clone(), lease: Rc::clone(&lease.id), amount: demand.amount, admitted_at }
        });
        self.woken |= woken;
        hold
    }

    /// Whether a reservation since the last call made a lease one to renew ahead (the
    /// worker's timer was set for its end only).
    pub(crate) fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    /// The ask for `demand` when no lease has room: at least the demand, and twice what the
    /// ledger's lease would use over a whole life at the rate it was used (smaller grants come
    /// back as the allowance runs out). The ledger's lease without room is given back with it:
    /// the reports of its leases whose reservations all settled go in the same call, so what
    /// they did not use counts for this ask already.
    pub(crate) fn ask(&mut self, demand: &Demand, now_ms: u64) -> (Ask, Vec<Report>) {
        let Some(ledger) = self.ledger_mut(&demand.key) else {
            let ask = Ask {
                limit: demand.key.limit.to_string(),
                kind: demand.key.kind,
                need: demand.amount,
                want: demand.amount,
            };
            return (ask, Vec::new());
        };
        let want = ledger.want(demand.amount, now_ms);
        ledger.retire(now_ms);
        let mut reports = Vec::new();
        ledger.draining.retain(|lease| {
            let settled = lease.outstanding == 0;
            if settled {
                reports.push(lease.report());
            }
            !settled
        });
        let ask = Ask { limit: demand.key.limit.to_string(), kind: demand.key.kind, need: demand.amount, want };
        (ask, reports)
    }

    /// The request's answer ended having used `actual` (requests: 1 when it was admitted, 0
    /// when it never was): the hold becomes that. True when that made a lease no longer
    /// reserved from ready to be reported.
    pub(crate) fn settle(&mut self, hold: &Hold, actual: u64) -> bool {
        let Some(ledger) = self.ledger_mut(&hold.key) else {
            return false;
        };
        let active = ledger.active.as_ref().is_some_and(|lease| lease.id == hold.lease);
        let Some(lease) = ledger.lease_mut(&hold.lease) else {
            // Reported already (drained too long): the control plane counted the hold whole.
            return false;
        };
        lease.settle(hold.amount, actual, hold.admitted_at);
        if hold.key.kind != LimitKind::Requests {
            lease.outstanding = lease.outstanding.saturating_sub(1);
        }
        !active && lease.outstanding == 0
    }

    /// What the control plane granted for `key` at `now_ms`, asked at `asked_ms`: a new active
    /// lease (the one before is reported once settled).
    pub(crate) fn granted(&mut self, key: &LedgerKey, grant: &Grant, asked_ms: u64, now_ms: u64) {
        if let Some(ledger) = self.ledger_mut(key) {
            ledger.renewing = false;
            if grant.granted == 0 {
                // Refused (or gone): asking again at once would only be refused again.
                ledger.renew_not_before_ms = now_ms.saturating_add(RETRY_MS);
            }
        }
        if grant.gone {
            // Nothing to renew; what is left is reported.
            if let Some(ledger) = self.ledger_mut(key) {
                ledger.retire(now_ms);
            }
            return;
        }
        let Some(ledger) = self.ledger_or_new(key) else {
            return;
        };
        ledger.bound = grant.bound;
        ledger.remaining = grant.remaining;
        ledger.reset_at_ms = now_ms.saturating_add(grant.reset_s.saturating_mul(1000));
        if let (Some(id), true) = (&grant.lease, grant.granted > 0) {
            ledger.retire(now_ms);
            ledger.active = Some(Lease {
                id: Rc::from(id.as_str()),
                granted: grant.granted,
                used: 0,
                outstanding: 0,
                granted_ms: now_ms,
                asked_ms: asked_ms.min(now_ms),
                until_ms: now_ms.saturating_add(grant.ttl_ms),
                ended_ms: 0,
                admitted: Vec::new(),
            });
        }
    }

    /// Where `key`'s ledger stands now.
    pub(crate) fn standing(&self, key: &LedgerKey, now_ms: u64) -> Option<Standing> {
        let (_, ledger) = self.ledgers.iter().find(|(known, _)| known == key)?;
        let room = ledger.active.as_ref().filter(|lease| lease.until_ms > now_ms).map_or(0, Lease::room);
        Some(Standing {
            bound: ledger.bound,
            remaining: ledger.remaining.saturating_add(room).min(ledger.bound),
            reset_s: ledger.reset_at_ms.saturating_sub(now_ms).div_ceil(1000),
        })
    }

    /// The timer's work at `now_ms`: reports of the leases that are done, and asks that renew
    /// the ledgers in use before their lease runs out.
    pub(crate) fn due(&mut self, now_ms: u64) -> (Vec<Report>, Vec<Ask>) {
        let mut reports = std::mem::take(&mut self.unsent);
        let mut asks = Vec::new();
        self.ledgers.retain_mut(|(key, ledger)| {
            ledger.retire_expired(now_ms);
            ledger.draining.retain(|lease| {
                let done = lease.outstanding == 0 || now_ms.saturating_sub(lease.ended_ms) >= DRAIN_MS;
                if done {
                    reports.push(lease.report());
                }
                !done
            });
            let ending = ledger.active.as_ref().is_some_and(|lease| ledger.renew_at(lease.until_ms) <= now_ms);
            if ledger.renews(now_ms) && ending {
                ledger.renewing = true;
                let need = if key.kind == LimitKind::Requests { 1 } else { ledger.last_used.max(1) };
                asks.push(Ask { limit: key.limit.to_string(), kind: key.kind, need, want: ledger.want(need, now_ms) });
            }
            let forgotten = now_ms.saturating_sub(ledger.used_ms) > FORGET_AFTER_MS;
            !(forgotten && ledger.active.is_none() && ledger.draining.is_empty())
        });
        (reports, asks)
    }

    /// The timer's call was not answered: its reports go with the next one, its renewals may
    /// be asked again.
    pub(crate) fn call_failed(&mut self, reports: Vec<Report>, asks: &[Ask], now_ms: u64) {
        self.unsent.extend(reports);
        for ask in asks {
            if let Some(ledger) = self.ledger_mut(&ask.key()) {
                ledger.renewing = false;
                ledger.renew_not_before_ms = now_ms.saturating_add(RETRY_MS);
            }
        }
    }

    /// Ends every active lease at `now_ms` (each is reported once settled): a worker that can
    /// no longer tick (the native host's timer rides on its streams, and its last one ended)
    /// must not hold allowance it would neither renew nor report before it expires.
    #[cfg(any(test, feature = "native"))]
    pub(crate) fn retire_all(&mut self, now_ms: u64) {
        for (_, ledger) in &mut self.ledgers {
            ledger.retire(now_ms);
        }
    }

    /// The reports the timer would send at `now_ms` if every active lease ended then (nothing
    /// changes: see `Worker::idle_calls`).
    #[cfg(any(test, feature = "native"))]
    pub(crate) fn idle_reports(&self, now_ms: u64) -> Vec<Report> {
        let mut ended = self.clone();
        ended.retire_all(now_ms);
        ended.due(now_ms).0
    }

    /// When the timer should next run: a lease to renew ahead, one that ends, one whose
    /// reservations settled.
    pub(crate) fn next_due_ms(&self, now_ms: u64) -> Option<u64> {
        let retry = (!self.unsent.is_empty()).then_some(now_ms.saturating_add(RETRY_MS));
        let ledgers = self.ledgers.iter().flat_map(|(_, ledger)| {
            let renew = ledger.active.as_ref().map(|lease| match ledger.renews(now_ms) {
                true => ledger.renew_at(lease.until_ms).min(lease.until_ms),
                false => lease.until_ms,
            });
            let drained = ledger.draining.iter().map(|lease| match lease.outstanding {
                0 => now_ms,
                _ => lease.ended_ms.saturating_add(DRAIN_MS),
            });
            renew.into_iter().chain(drained)
        });
        ledgers.chain(retry).min()
    }
}

#[cfg(test)]
mod tests;
