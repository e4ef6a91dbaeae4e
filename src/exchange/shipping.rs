//! Request logs: each finished request's record (with a workspace, with a control plane) waits
//! in a bounded per-worker queue and goes to the control plane in batches,
//! `POST /internal/v1/records` with `{"records": [...]}`, dispatched from the root context's
//! timer. One batch is in flight at a time; a batch the control plane could not take (no
//! answer, 5xx) goes back to the front of the queue as far as the bound allows and is tried
//! again after a backoff; a batch it refused (4xx) and whatever does not fit is dropped and
//! counted. Nothing here touches a request's answer: records are queued after it was sent.

use super::{CallAnswer, Dispatch};
use crate::settings::ControlPlaneSettings;
use crate::usage_limits::leases::{Ask, Grant, Report};
use serde_json::Value;
use std::collections::VecDeque;
#[cfg(any(test, feature = "native"))]
use std::sync::Arc;

/// At most `records.max_queued` records wait per worker, and at most this many bytes of them.
pub(super) const MAX_QUEUED_BYTES: usize = 4 << 20;
/// A record larger than this is never shipped (the control plane's bound).
pub(super) const MAX_RECORD_BYTES: usize = 64 << 10;
/// At most this many records per batch ...
pub(super) const MAX_BATCH: usize = 500;
/// ... and at most this many bytes of records (at least one record).
pub(super) const MAX_BATCH_BYTES: usize = 1 << 20;
/// A batch leaves as soon as this many records wait (a full batch: each batch costs the control
/// plane ~2 ms of CPU besides its rows, a third of its ingest at batches of 100) ...
pub(super) const EAGER: usize = MAX_BATCH;
/// ... or this long after the oldest waiting record was queued.
pub(super) const WAIT_MS: u64 = 1000;
/// After a failed batch, the next waits this long, doubling per failure up to the maximum.
pub(super) const RETRY_MS: u64 = 1000;
pub(super) const MAX_RETRY_MS: u64 = 10_000;

pub(super) const PATH: &str = "/internal/v1/records";

/// A record's JSON, shared with the copies an idle native worker leaves with its relay (see
/// [`IdleCopies`]); the wasm filter's timer ticks without requests, and makes no copies.
#[cfg(any(test, feature = "native"))]
pub(crate) type RecordJson = Arc<Vec<u8>>;
#[cfg(not(any(test, feature = "native")))]
type RecordJson = Vec<u8>;

struct Queued {
    /// Records are numbered as they are queued, oldest lowest.
    #[cfg(any(test, feature = "native"))]
    number: u64,
    json: RecordJson,
    queued_ms: u64,
}

/// The records of one worker on their way to the control plane.
#[derive(Default)]
pub(super) struct Shipper {
    queue: VecDeque<Queued>,
    bytes: usize,
    /// The batch in flight, by its call's token.
    in_flight: Option<(u32, Vec<Queued>)>,
    /// After a failure, no batch leaves before this.
    not_before_ms: u64,
    failures: u32,
    /// The next record's number.
    #[cfg(any(test, feature = "native"))]
    next_number: u64,
    /// The first record not yet handed over (see `hand_over`).
    #[cfg(any(test, feature = "native"))]
    handed_from: u64,
}

impl Shipper {
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a record of `bytes` fits while at most `max_queued` records may wait.
    fn fits(&self, bytes: usize, max_queued: usize) -> bool {
        self.queue.len() < max_queued && self.bytes.saturating_add(bytes) <= MAX_QUEUED_BYTES
    }

    /// Queues one record at `now_ms`; false when it was dropped (too large, or the queue full).
    pub(super) fn push(&mut self, json: Vec<u8>, now_ms: u64, max_queued: usize) -> bool {
        if json.len() > MAX_RECORD_BYTES || !self.fits(json.len(), max_queued) {
            return false;
        }
        self.bytes = self.bytes.saturating_add(json.len());
        let record = Queued {
            #[cfg(any(test, feature = "native"))]
            number: self.numbered(),
            json: RecordJson::from(json),
            queued_ms: now_ms,
        };
        self.queue.push_back(record);
        true
    }

    /// When the next batch should leave; None while one is in flight or none waits.
    pub(super) fn due_ms(&self) -> Option<u64> {
        if self.in_flight.is_some() {
            return None;
        }
        let oldest = self.queue.front()?;
        let due = if self.queue.len() >= EAGER { 0 } else { oldest.queued_ms.saturating_add(WAIT_MS) };
        Some(due.max(self.not_before_ms))
    }

    /// Takes the next batch off the queue (when one is due at `now_ms`): its body.
    pub(super) fn take(&mut self, now_ms: u64) -> Option<Vec<u8>> {
        if self.due_ms()? > now_ms {
            return None;
        }
        let (count, bytes) = batch_of(self.queue.iter().map(|r| r.json.as_slice()));
        let batch: Vec<Queued> = self.queue.drain(..count).collect();
        self.bytes = self.bytes.saturating_sub(bytes);
        let body = body(batch.iter().map(|r| r.json.as_slice()), count, bytes);
        self.in_flight = Some((0, batch));
        Some(body)
    }

    /// The next record's number, taken.
    #[cfg(any(test, feature = "native"))]
    fn numbered(&mut self) -> u64 {
        let number = self.next_number;
        self.next_number = number.wrapping_add(1);
        number
    }

    /// What an idle worker hands its relay: the records queued since the last handover (in
    /// flight or not), and below which number every record was acknowledged. The relay keeps
    /// them across handovers ([`IdleCopies`]), so that going idle costs the worker its new
    /// records only (copying all of them each time cost a native cache hit 7% of its time).
    #[cfg(any(test, feature = "native"))]
    pub(super) fn hand_over(&mut self) -> Handover {
        let acknowledged_below = self.unacknowledged().next().map_or(self.next_number, |r| r.number);
        let from = self.handed_from;
        let mut new: Vec<(u64, RecordJson)> = self
            .unacknowledged()
            .rev()
            .take_while(|r| r.number >= from)
            .map(|r| (r.number, Arc::clone(&r.json)))
            .collect();
        new.reverse();
        self.handed_from = self.next_number;
        Handover { acknowledged_below, new }
    }

    /// The relay's copies of every record handed over were all stored: the queue empties (the
    /// records in flight wait for their batch's own answer).
    #[cfg(any(test, feature = "native"))]
    pub(super) fn copies_stored(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }

    /// The records the control plane has not acknowledged, oldest first: the batch in flight's,
    /// then the queue's.
    #[cfg(any(test, feature = "native"))]
    fn unacknowledged(&self) -> impl DoubleEndedIterator<Item = &Queued> {
        self.in_flight.iter().flat_map(|(_, batch)| batch.iter()).chain(self.queue.iter())
    }

    /// The batch just taken is on its way under `token`.
    pub(super) fn sent(&mut self, token: u32) {
        if let Some((t, _)) = &mut self.in_flight {
            *t = token;
        }
    }

    /// The batch in flight was answered with `status` (0: no answer, or it was not even sent)
    /// at `now_ms`: how many records were dropped (a failed batch goes back as far as
    /// `max_queued` allows).
    pub(super) fn answered(&mut self, status: u16, now_ms: u64, max_queued: usize) -> u64 {
        let Some((_, batch)) = self.in_flight.take() else {
            return 0;
        };
        match status {
            200..=299 => {
                self.failures = 0;
                self.not_before_ms = 0;
                0
            }
            400..=499 => {
                log::warn!("the control plane refused a batch of {} records ({status}); dropped", batch.len());
                count(batch.len())
            }
            _ => {
                self.failures = self.failures.saturating_add(1);
                let exponent = self.failures.saturating_sub(1).min(8);
                let delay = RETRY_MS.saturating_mul(1u64 << exponent).min(MAX_RETRY_MS);
                self.not_before_ms = now_ms.saturating_add(delay);
                log::warn!("the control plane did not take a batch of {} records ({status}); retried", batch.len());
                self.requeue(batch, max_queued)
            }
        }
    }

    /// A failed batch back at the front of the queue, its newest records first, as far as the
    /// bound allows: how many did not fit.
    fn requeue(&mut self, batch: Vec<Queued>, max_queued: usize) -> u64 {
        let mut dropped = 0usize;
        for record in batch.into_iter().rev() {
            if self.fits(record.json.len(), max_queued) {
                self.bytes = self.bytes.saturating_add(record.json.len());
                self.queue.push_front(record);
            } else {
                dropped += 1;
            }
        }
        count(dropped)
    }

    /// Everything waiting (the control plane is no longer configured): how many.
    pub(super) fn clear(&mut self) -> u64 {
        let dropped = self.queue.len() + self.in_flight.take().map_or(0, |(_, batch)| batch.len());
        self.queue.clear();
        self.bytes = 0;
        count(dropped)
    }

    /// Whether `token` is the batch in flight.
    pub(super) fn carries(&self, token: u32) -> bool {
        self.in_flight.as_ref().is_some_and(|(t, _)| *t == token)
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// What [`Shipper::hand_over`] hands an idle worker's relay.
#[cfg(any(test, feature = "native"))]
pub(crate) struct Handover {
    /// Every record numbered below this was acknowledged.
    pub(crate) acknowledged_below: u64,
    /// The records queued since the last handover, by number, oldest first.
    pub(crate) new: Vec<(u64, RecordJson)>,
}

/// The records an idle native worker has handed its relay and that may not be stored yet: the
/// relay copies them to the control plane when the worker stays idle.
#[cfg(any(test, feature = "native"))]
#[derive(Default)]
pub(crate) struct IdleCopies {
    records: VecDeque<(u64, RecordJson)>,
}

#[cfg(any(test, feature = "native"))]
impl IdleCopies {
    /// Takes a handover: what was acknowledged since leaves, the new records join.
    pub(crate) fn take_over(&mut self, handover: Handover) {
        while self.records.front().is_some_and(|(number, _)| *number < handover.acknowledged_below) {
            self.records.pop_front();
        }
        self.records.extend(handover.new);
    }

    #[cfg(feature = "native")]
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The calls that copy every record kept, a batch each, oldest first (they stay kept, and
    /// the worker's timer sends them again unless told they were stored: the control plane
    /// stores each record id once).
    pub(crate) fn calls(&self, cp: &ControlPlaneSettings) -> Vec<Dispatch> {
        let records: Vec<&[u8]> = self.records.iter().map(|(_, json)| json.as_slice()).collect();
        let mut rest = records.as_slice();
        let mut calls = Vec::new();
        while !rest.is_empty() {
            let (count, bytes) = batch_of(rest.iter().copied());
            let (batch, after) = rest.split_at(count.clamp(1, rest.len()));
            calls.push(call(cp, body(batch.iter().copied(), batch.len(), bytes)));
            rest = after;
        }
        calls
    }

    /// The copies were all stored.
    pub(crate) fn stored(&mut self) {
        self.records.clear();
    }
}

/// How many of `records` (oldest first) a batch holds, and their bytes.
fn batch_of<'a>(records: impl Iterator<Item = &'a [u8]>) -> (usize, usize) {
    let mut count = 0;
    let mut bytes = 0usize;
    for next in records.take(MAX_BATCH) {
        if count > 0 && bytes.saturating_add(next.len()) > MAX_BATCH_BYTES {
            break;
        }
        bytes = bytes.saturating_add(next.len());
        count += 1;
    }
    (count, bytes)
}

/// `{"records":[...]}` of the batch (`count` records of `bytes` in all).
fn body<'a>(batch: impl Iterator<Item = &'a [u8]>, count: usize, bytes: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(bytes.saturating_add(count).saturating_add(16));
    body.extend_from_slice(b"{\"records\":[");
    for (i, record) in batch.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(record);
    }
    body.extend_from_slice(b"]}");
    body
}

/// The call that carries a batch.
pub(super) fn call(cp: &ControlPlaneSettings, body: Vec<u8>) -> Dispatch {
    write(cp, "POST", PATH.to_string(), body)
}

/// The call that keeps response `id` (and the conversation it answered) for `workspace`.
pub(super) fn keep_response(cp: &ControlPlaneSettings, workspace: &str, id: &str, kept: &Value) -> Dispatch {
    let path = format!("/internal/v1/workspaces/{workspace}/responses/{id}");
    write(cp, "PUT", path, kept.to_string().into_bytes())
}

/// The call that asks the control plane for the limits' allowance (`asks`) and reports the
/// leases that are done (`reports`).
pub(super) fn leases(cp: &ControlPlaneSettings, asks: &[Ask], reports: &[Report]) -> Dispatch {
    let body = serde_json::json!({"grants": asks, "reports": reports}).to_string().into_bytes();
    write(cp, "POST", LEASES_PATH.to_string(), body)
}

/// The control plane's endpoint for grants and reports.
pub(super) const LEASES_PATH: &str = "/internal/v1/leases";

/// The grants in the control plane's answer to a lease call, in the order asked; None when it
/// gave none.
pub(super) fn grants(answer: &CallAnswer) -> Option<Vec<Grant>> {
    if answer.status != 200 {
        return None;
    }
    let value: Value = serde_json::from_slice(&answer.body).ok()?;
    Some(value.get("grants")?.as_array()?.iter().map(Grant::from_json).collect())
}

/// A JSON write to the control plane.
pub(super) fn write(cp: &ControlPlaneSettings, method: &str, path: String, body: Vec<u8>) -> Dispatch {
    let headers = vec![
        (":method".to_string(), method.to_string()),
        (":path".to_string(), path),
        (":authority".to_string(), cp.authority.clone()),
        ("authorization".to_string(), format!("Bearer {}", cp.token)),
        ("content-type".to_string(), "application/json".to_string()),
        ("content-length".to_string(), body.len().to_string()),
    ];
    Dispatch { cluster: cp.cluster.clone(), headers, body, timeout_ms: cp.timeout_ms }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    /// The default `records.max_queued`.
    const MAX_QUEUED: usize = 2000;

    fn record(i: usize) -> Vec<u8> {
        format!("{{\"n\":{i}}}").into_bytes()
    }

    #[test]
    fn the_queue_is_bounded_by_count_and_bytes_and_records_by_size() {
        let mut shipper = Shipper::default();
        assert!(!shipper.push(vec![b'x'; MAX_RECORD_BYTES + 1], 0, MAX_QUEUED));
        for i in 0..MAX_QUEUED {
            assert!(shipper.push(record(i), 0, MAX_QUEUED));
        }
        assert!(!shipper.push(record(0), 0, MAX_QUEUED));
        let mut shipper = Shipper::default();
        let big = vec![b'x'; MAX_RECORD_BYTES];
        let fit = MAX_QUEUED_BYTES / MAX_RECORD_BYTES;
        for _ in 0..fit {
            assert!(shipper.push(big.clone(), 0, MAX_QUEUED));
        }
        assert!(!shipper.push(big, 0, MAX_QUEUED));
    }

    #[test]
    fn the_configured_bound_holds_for_the_queue_and_a_failed_batch() {
        let mut shipper = Shipper::default();
        for i in 0..4 {
            assert_eq!(shipper.push(record(i), 0, 3), i < 3);
        }
        shipper.take(WAIT_MS).unwrap();
        for i in 0..4 {
            assert_eq!(shipper.push(record(i), WAIT_MS, 3), i < 3, "the batch in flight holds no room");
        }
        assert_eq!(shipper.answered(0, WAIT_MS, 3), 3, "the failed batch finds the queue full");
        assert_eq!(shipper.len(), 3);
    }

    #[test]
    fn batches_are_at_most_500_records_and_one_mib() {
        let mut shipper = Shipper::default();
        for i in 0..600 {
            shipper.push(record(i), 0, MAX_QUEUED);
        }
        let body = shipper.take(0).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["records"].as_array().unwrap().len(), MAX_BATCH);
        assert_eq!(shipper.due_ms(), None, "one batch in flight");
        assert_eq!(shipper.answered(200, 0, MAX_QUEUED), 0);
        assert_eq!(shipper.due_ms(), Some(1000), "fewer than 500 wait: due a second after the oldest");

        let mut shipper = Shipper::default();
        let record = format!("\"{}\"", "x".repeat((60 << 10) - 2)).into_bytes();
        for _ in 0..40 {
            shipper.push(record.clone(), 0, MAX_QUEUED);
        }
        let body = shipper.take(WAIT_MS).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["records"].as_array().unwrap().len(), 17, "1 MiB of 60 KiB records");
    }

    #[test]
    fn failures_back_off_doubling_up_to_the_maximum() {
        let mut shipper = Shipper::default();
        shipper.push(record(1), 0, MAX_QUEUED);
        assert_eq!(shipper.take(999), None);
        assert!(shipper.take(1000).is_some());
        assert_eq!(shipper.answered(0, 1000, MAX_QUEUED), 0);
        assert_eq!(shipper.due_ms(), Some(2000));
        shipper.take(2000).unwrap();
        assert_eq!(shipper.answered(503, 2000, MAX_QUEUED), 0);
        assert_eq!(shipper.due_ms(), Some(4000));
        for _ in 0..10 {
            let now = shipper.due_ms().unwrap();
            shipper.take(now).unwrap();
            shipper.answered(0, now, MAX_QUEUED);
        }
        let due = shipper.due_ms().unwrap();
        shipper.take(due).unwrap();
        shipper.answered(0, due, MAX_QUEUED);
        assert_eq!(shipper.due_ms(), Some(due + MAX_RETRY_MS));
        shipper.take(due + MAX_RETRY_MS).unwrap();
        assert_eq!(shipper.answered(202, due + MAX_RETRY_MS, MAX_QUEUED), 0);
        assert_eq!((shipper.len(), shipper.due_ms()), (0, None));
    }
}
