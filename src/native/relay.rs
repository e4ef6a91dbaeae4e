//! The control plane's calls that outlive the request that started them (the wasm filter's root
//! context makes them): an entry several requests wait for, a batch of request records, the
//! limits' leases, a kept response. A stream's callout ends with its stream, and a worker thread
//! may have no stream at all when its records are due, so these go out from the main thread as
//! the config's callouts (the control plane's cluster is there; the internal listener that
//! other dispatched calls go through exists on worker threads only). Each answer comes back to
//! the worker thread that asked, through that thread's mailbox, which a `scheduled` hook of one
//! of its live streams empties (see `TickerShared::wake`), else its next stream's first hook.

use super::calls::{self, ffi::EnvoyConfig, ConfigScheduler};
use super::ticker::{after, unix_ms, MailState, TickerShared, ANSWERS};
use crate::exchange::{CallAnswer, Dispatch, IdleCalls, IdleCopies};
use crate::settings::ControlPlaneSettings;
use hashbrown::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What a filter config relays for its worker threads.
pub(super) struct Relay {
    /// None when Envoy made no scheduler, or once the config is gone: such calls then fail to
    /// start.
    scheduler: Mutex<Option<ConfigScheduler>>,
    /// Calls worker threads asked for, for the main thread to start.
    asked: Mutex<Vec<Asked>>,
    /// The main thread's calls in flight, by Envoy's callout id: who asked, and for what.
    flights: Mutex<HashMap<u64, (u64, For)>>,
    /// Each worker thread's mailbox, by its worker number.
    mailboxes: Mutex<HashMap<u64, Arc<Mailbox>>>,
    /// What worker threads leave here as they go idle, by worker number (see `defer`).
    idle: Mutex<HashMap<u64, Idle>>,
    /// The config's control plane, the records' copies go to.
    control_plane: Option<ControlPlaneSettings>,
}

/// What one worker left here: the records it handed over, and its calls since it last went idle.
#[derive(Default)]
struct Idle {
    copies: IdleCopies,
    round: Option<Round>,
    /// Rounds are numbered: a late answer to an earlier round's call counts for none.
    rounds: u64,
}

/// A worker's idle calls: made when its last stream ended, held until the grace is over, and
/// held again after a failure while the worker stays idle.
struct Round {
    number: u64,
    since_ms: u64,
    calls: Vec<Dispatch>,
    /// The records' copies are still to be made (on the ticker's thread, as they go).
    copy_records: bool,
    /// Some went: the worker applies them when it has a stream again (`woke`).
    sent: bool,
    /// Sent and not answered yet.
    unanswered: usize,
}

/// A worker whose idle call failed tries it again this much later (the control plane may be
/// down, or restarting), as long as no stream of the worker takes over.
const IDLE_RETRY_MS: u64 = 2000;

/// Whom a relayed call answers.
enum For {
    /// The worker's token, through its mailbox.
    Token(u32),
    /// No one (an idle call of the worker's round numbered so, kept to be tried again if it
    /// fails).
    Idle(u64, Dispatch),
}

struct Asked {
    worker: u64,
    call: Dispatch,
    answer: For,
}

/// A worker thread's answers, and how to wake the thread for them.
pub(super) struct Mailbox {
    /// Each with the time it arrived (Unix ms): a worker without streams takes it later.
    answers: Mutex<Vec<(u32, CallAnswer, u64)>>,
    /// Calls asked and not yet taken here: while there are any, a live stream of the thread
    /// keeps a scheduler to be woken with (`awaits`).
    awaiting: AtomicUsize,
    ticker: Arc<TickerShared>,
}

impl Mailbox {
    /// Whether an answer is still to be taken.
    pub(super) fn awaits(&self) -> bool {
        self.awaiting.load(Ordering::Relaxed) > 0
    }

    /// Whether answers wait to be taken.
    pub(super) fn has_answers(&self) -> bool {
        !locked(&self.answers).is_empty()
    }

    /// Where it stands, for the ticker.
    pub(super) fn state(&self) -> MailState {
        MailState { awaits: self.awaits(), has_answers: self.has_answers() }
    }

    /// The answers that arrived (with when), each taken once.
    pub(super) fn take(&self) -> Vec<(u32, CallAnswer, u64)> {
        let answers = std::mem::take(&mut *locked(&self.answers));
        if !answers.is_empty() {
            let taken = answers.len();
            let _ = self.awaiting.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(taken)));
        }
        answers
    }
}

impl Relay {
    pub(super) fn new(config: EnvoyConfig, control_plane: Option<ControlPlaneSettings>) -> Relay {
        Relay {
            scheduler: Mutex::new(ConfigScheduler::new(config)),
            asked: Mutex::new(Vec::new()),
            flights: Mutex::new(HashMap::new()),
            mailboxes: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
            control_plane,
        }
    }

    /// The mailbox of a new worker thread's state (`worker`: its number).
    pub(super) fn mailbox(&self, worker: u64, ticker: Arc<TickerShared>) -> Arc<Mailbox> {
        let mailbox = Arc::new(Mailbox { answers: Mutex::new(Vec::new()), awaiting: AtomicUsize::new(0), ticker });
        locked(&self.mailboxes).insert(worker, Arc::clone(&mailbox));
        mailbox
    }

    /// A worker thread's state went (its config was replaced): answers for it are dropped.
    pub(super) fn forget(&self, worker: u64) {
        locked(&self.mailboxes).remove(&worker);
        locked(&self.idle).remove(&worker);
    }

    /// From a worker thread whose last stream ended at `since_ms`: its records join those it
    /// handed over before, and its calls wait for `release`. False when there is nothing to send.
    pub(super) fn defer(&self, worker: u64, since_ms: u64, calls: IdleCalls) -> bool {
        let mut idle = locked(&self.idle);
        let idle = idle.entry(worker).or_default();
        idle.copies.take_over(calls.records);
        let copy_records = !idle.copies.is_empty();
        let calls: Vec<Dispatch> = calls.leases.into_iter().collect();
        let any = copy_records || !calls.is_empty();
        idle.rounds = idle.rounds.wrapping_add(1);
        let number = idle.rounds;
        idle.round = any.then_some(Round { number, since_ms, calls, copy_records, sent: false, unanswered: 0 });
        any
    }

    /// From the ticker's thread: the worker stayed idle, its calls go (their answers go to no
    /// worker; a failed one is held again, see `idle_answered`).
    pub(super) fn release(&self, worker: u64) {
        let (round, calls) = match locked(&self.idle).get_mut(&worker) {
            Some(Idle { copies, round: Some(round), .. }) => {
                let mut calls = std::mem::take(&mut round.calls);
                if std::mem::take(&mut round.copy_records) {
                    calls.extend(self.control_plane.as_ref().map(|cp| copies.calls(cp)).unwrap_or_default());
                }
                if calls.is_empty() {
                    return;
                }
                round.sent = true;
                round.unanswered = round.unanswered.saturating_add(calls.len());
                (round.number, calls)
            }
            _ => return,
        };
        let scheduler = locked(&self.scheduler);
        if let Some(scheduler) = scheduler.as_ref() {
            let asked = calls.into_iter().map(|call| Asked { worker, answer: For::Idle(round, call.clone()), call });
            locked(&self.asked).extend(asked);
            scheduler.commit();
        }
    }

    /// An idle call answered; one that failed is held again, and tried when the ticker's thread
    /// next says so, unless the worker has a stream again (its timer then sends what is due).
    fn idle_answered(&self, worker: u64, number: u64, call: Dispatch, answer: &CallAnswer) {
        let failed = !(200..300).contains(&answer.status);
        let mut idle = locked(&self.idle);
        match idle.get_mut(&worker).and_then(|idle| idle.round.as_mut()).filter(|round| round.number == number) {
            Some(round) => {
                round.unanswered = round.unanswered.saturating_sub(1);
                if !failed {
                    return;
                }
                round.calls.push(call);
            }
            None => return,
        }
        drop(idle);
        if let Some(mailbox) = locked(&self.mailboxes).get(&worker) {
            mailbox.ticker.idle_until(after(IDLE_RETRY_MS));
        }
    }

    /// From a worker thread that has a stream again: when its idle calls went, since when the
    /// worker was idle (it applies what they said) and whether every one was answered (the
    /// records handed over are then stored); None when they were dropped unsent.
    pub(super) fn woke(&self, worker: u64) -> Option<(u64, bool)> {
        let mut idle = locked(&self.idle);
        let idle = idle.get_mut(&worker)?;
        let round = idle.round.take().filter(|round| round.sent)?;
        let stored = round.calls.is_empty() && round.unanswered == 0;
        if stored {
            idle.copies.stored();
        }
        Some((round.since_ms, stored))
    }

    /// From a worker thread: `call` for the main thread to start, answered to `token` in the
    /// worker's mailbox. False when it cannot be asked.
    pub(super) fn ask(&self, mailbox: &Mailbox, worker: u64, token: u32, call: &Dispatch) -> bool {
        let scheduler = locked(&self.scheduler);
        let Some(scheduler) = scheduler.as_ref() else {
            return false;
        };
        locked(&self.asked).push(Asked { worker, call: call.clone(), answer: For::Token(token) });
        mailbox.awaiting.fetch_add(1, Ordering::Relaxed);
        scheduler.commit();
        true
    }

    /// How many times the relay asked the main thread to start calls (Envoy would run the
    /// config's `scheduled` hook), once there were `count` or `timeout` passed.
    #[cfg(test)]
    pub(super) fn commits(&self, count: usize, timeout: std::time::Duration) -> usize {
        let commits = locked(&self.scheduler).as_ref().map(ConfigScheduler::commits);
        commits.map_or(0, |commits| commits.after(count, timeout))
    }

    /// On the main thread, as Envoy destroys the config: its scheduler goes with it (worker
    /// threads may hold the relay longer).
    pub(super) fn close(&self) {
        drop(locked(&self.scheduler).take());
    }

    /// On the main thread: starts the calls asked for, each by `start` (Envoy's callout id, or
    /// None when it could not start).
    pub(super) fn start_asked(&self, mut start: impl FnMut(&Dispatch) -> Option<u64>) {
        let asked = std::mem::take(&mut *locked(&self.asked));
        for Asked { worker, call, answer } in asked {
            match start(&call) {
                // Envoy answers a started call in the done hook, never inside the call.
                Some(id) => {
                    locked(&self.flights).insert(id, (worker, answer));
                }
                None => {
                    calls::log(calls::ffi::LOG_WARN, &format!("a call to cluster {} could not start", call.cluster));
                    self.answer(worker, answer, CallAnswer::FAILED);
                }
            }
        }
    }

    /// On the main thread: call `id` answered.
    pub(super) fn answered(&self, id: u64, answer: CallAnswer) {
        let flight = locked(&self.flights).remove(&id);
        if let Some((worker, to)) = flight {
            self.answer(worker, to, answer);
        }
    }

    fn answer(&self, worker: u64, to: For, answer: CallAnswer) {
        match to {
            For::Token(token) => self.deliver(worker, token, answer),
            For::Idle(round, call) => self.idle_answered(worker, round, call, &answer),
        }
    }

    /// Puts an answer in its worker's mailbox and wakes the thread (through a live stream;
    /// without one, the thread's next stream takes it).
    fn deliver(&self, worker: u64, token: u32, answer: CallAnswer) {
        let mailbox = locked(&self.mailboxes).get(&worker).cloned();
        let Some(mailbox) = mailbox else {
            return;
        };
        locked(&mailbox.answers).push((token, answer, unix_ms()));
        mailbox.ticker.wake(ANSWERS);
    }
}

/// A worker thread's way to the relay, from one hook.
pub(super) struct Asker<'a> {
    relay: &'a Relay,
    mailbox: &'a Mailbox,
    worker: u64,
    /// The control plane's cluster (None: no control plane, nothing relayed).
    cluster: Option<&'a str>,
}

impl Relay {
    pub(super) fn asker<'a>(
        relay: &'a Relay,
        mailbox: &'a Mailbox,
        worker: u64,
        cluster: Option<&'a str>,
    ) -> Asker<'a> {
        Asker { relay, mailbox, worker, cluster }
    }
}

impl Asker<'_> {
    /// Whether the main thread makes `call` (a call to the control plane).
    pub(super) fn relays(&self, call: &Dispatch) -> bool {
        self.cluster == Some(call.cluster.as_str())
    }

    /// Asks for `call`, answered to `token`; false when it cannot be asked.
    pub(super) fn ask(&self, token: u32, call: &Dispatch) -> bool {
        self.relay.ask(self.mailbox, self.worker, token, call)
    }

    /// The answers in the thread's mailbox (with when they arrived), each taken once.
    pub(super) fn mail(&self) -> Vec<(u32, CallAnswer, u64)> {
        self.mailbox.take()
    }
}

/// A lock's value, also after a panic elsewhere (what it holds stays consistent: each use is
/// one push, insert, remove or take).
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Handover;
    use crate::unit_tests::test;
    use std::time::{Duration, Instant};

    /// Long enough for any machine; a test waits for an event, never this long when it holds.
    const WAIT: Duration = Duration::from_secs(10);

    fn relay() -> Relay {
        let cp = r#"{"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret"}"#;
        Relay::new(std::ptr::null_mut(), Some(serde_json::from_str(cp).unwrap()))
    }

    /// What a worker going idle hands over: maybe its leases' report, and records (by number),
    /// every one below `acknowledged_below` acknowledged.
    fn idle(leases: bool, acknowledged_below: u64, new: &[u64]) -> IdleCalls {
        let new = new.iter().map(|n| (*n, Arc::new(format!("{{\"n\":{n}}}").into_bytes()))).collect();
        IdleCalls { leases: leases.then(|| call("leases")), records: Handover { acknowledged_below, new } }
    }

    /// The body of the call that copies records `numbers`.
    fn copied(numbers: &[u64]) -> String {
        let records: Vec<String> = numbers.iter().map(|n| format!("{{\"n\":{n}}}")).collect();
        format!("{{\"records\":[{}]}}", records.join(","))
    }

    fn call(body: &str) -> Dispatch {
        Dispatch { cluster: "gateway_control_plane".into(), headers: Vec::new(), body: body.into(), timeout_ms: 3000 }
    }

    fn answer(status: u16) -> CallAnswer {
        CallAnswer { status, headers: vec![(":status".into(), status.to_string().into())], body: b"{}".to_vec() }
    }

    /// The main thread's `scheduled` hook: starts what was asked, Envoy's callout ids counting
    /// from `first`; the bodies started, by id.
    fn start(relay: &Relay, first: u64) -> Vec<(u64, String)> {
        let mut started = Vec::new();
        relay.start_asked(|call| {
            let id = first + started.len() as u64;
            started.push((id, String::from_utf8_lossy(&call.body).into_owned()));
            Some(id)
        });
        started
    }

    /// What a mailbox holds: (token, status) each.
    fn mail(mailbox: &Mailbox) -> Vec<(u32, u16)> {
        mailbox.take().into_iter().map(|(token, answer, _)| (token, answer.status)).collect()
    }

    #[test]
    fn a_call_a_worker_asks_for_starts_on_the_main_thread_and_its_answer_waits_in_that_workers_mailbox() {
        let relay = relay();
        let mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        let other = relay.mailbox(2, Arc::new(TickerShared::new()));
        assert!(relay.ask(&mailbox, 1, 7, &call("entries")));
        assert!(mailbox.awaits(), "a stream of the worker keeps a scheduler for the answer");
        assert_eq!(relay.commits(1, WAIT), 1, "the main thread is asked to start it");
        assert_eq!(start(&relay, 100), [(100, "entries".to_string())]);
        assert!(start(&relay, 200).is_empty(), "each asked call starts once");
        assert!(!mailbox.has_answers());

        let before = unix_ms();
        relay.answered(100, answer(200));
        assert!(mailbox.has_answers() && !other.has_answers());
        let [(token, answered, arrived)]: [(u32, CallAnswer, u64); 1] = mailbox.take().try_into().ok().unwrap();
        assert_eq!((token, answered.status, answered.body), (7, 200, b"{}".to_vec()));
        assert!((before..=unix_ms()).contains(&arrived), "an answer carries when it arrived");
        assert!(!mailbox.awaits() && !mailbox.has_answers(), "taken once");
        relay.answered(100, answer(200));
        assert!(mail(&mailbox).is_empty(), "a callout answers once");
    }

    #[test]
    fn a_call_envoy_could_not_start_is_answered_as_failed_to_its_token() {
        let relay = relay();
        let mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        assert!(relay.ask(&mailbox, 1, 3, &call("batch")));
        relay.start_asked(|_| None);
        assert_eq!(mail(&mailbox), [(3, 0)]);
    }

    #[test]
    fn once_its_config_is_gone_the_relay_asks_for_nothing() {
        let relay = relay();
        let mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        relay.close();
        assert!(!relay.ask(&mailbox, 1, 3, &call("batch")), "the call fails to start");
        assert!(!mailbox.awaits());
        assert!(start(&relay, 1).is_empty());
    }

    #[test]
    fn answers_for_a_worker_whose_config_was_replaced_are_dropped() {
        let relay = relay();
        let mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        assert!(relay.ask(&mailbox, 1, 3, &call("batch")));
        let [(id, _)]: [(u64, String); 1] = start(&relay, 1).try_into().ok().unwrap();
        relay.forget(1);
        relay.answered(id, answer(200));
        assert!(!mailbox.has_answers());
    }

    #[test]
    fn an_idle_workers_calls_wait_for_the_ticker_then_go_and_answer_no_one() {
        let relay = relay();
        let mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        assert!(relay.defer(1, 5000, idle(true, 0, &[0])));
        assert_eq!(relay.commits(0, Duration::ZERO), 0, "held until the grace is over");
        assert!(start(&relay, 1).is_empty());

        relay.release(1);
        assert_eq!(relay.commits(1, WAIT), 1);
        let started = start(&relay, 10);
        assert_eq!(started, [(10, "leases".to_string()), (11, copied(&[0]))]);
        relay.answered(10, answer(200));
        relay.answered(11, answer(201));
        assert!(!mailbox.has_answers() && !mailbox.awaits(), "the worker asked for no answer");
        assert_eq!(relay.woke(1), Some((5000, true)), "they went, every one answered");
        assert_eq!(relay.woke(1), None, "told once");
        assert!(!relay.defer(1, 6000, idle(false, 1, &[])), "the records are stored: nothing to send");
    }

    #[test]
    fn an_idle_call_that_fails_is_held_and_tried_again_two_seconds_later() {
        let relay = relay();
        let ticker = Arc::new(TickerShared::new());
        let _mailbox = relay.mailbox(1, Arc::clone(&ticker));
        relay.defer(1, 5000, idle(true, 0, &[0]));
        relay.release(1);
        assert_eq!(start(&relay, 10).len(), 2);
        let before = Instant::now();
        relay.answered(11, answer(503));
        let due = ticker.idle_due().unwrap();
        assert!(due >= before + Duration::from_millis(IDLE_RETRY_MS), "not before 2 s");
        assert!(due <= Instant::now() + Duration::from_millis(IDLE_RETRY_MS));
        relay.answered(10, CallAnswer::FAILED);

        // The ticker's thread says the 2 s passed: both go again.
        relay.release(1);
        assert_eq!(relay.commits(2, WAIT), 2);
        assert_eq!(start(&relay, 20), [(20, copied(&[0])), (21, "leases".to_string())]);
        relay.answered(20, answer(200));
        relay.answered(21, answer(200));
        assert_eq!(relay.woke(1), Some((5000, true)));
    }

    #[test]
    fn a_worker_that_wakes_before_its_idle_calls_are_answered_hears_they_may_not_have_been_stored() {
        let relay = relay();
        let _mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        relay.defer(1, 5000, idle(false, 0, &[0]));
        relay.release(1);
        let [(id, _)]: [(u64, String); 1] = start(&relay, 1).try_into().ok().unwrap();
        assert_eq!(relay.woke(1), Some((5000, false)));
        // Its answer comes late and fails: nothing is held for a worker that is not idle.
        relay.answered(id, CallAnswer::FAILED);
        relay.release(1);
        assert!(start(&relay, 2).is_empty());

        // Nor for its next round: that round's own answers say whether the records were stored.
        relay.defer(1, 7000, idle(false, 0, &[1]));
        relay.release(1);
        let [(next, body)]: [(u64, String); 1] = start(&relay, 3).try_into().ok().unwrap();
        assert_eq!(body, copied(&[0, 1]), "record 0 may not be stored: copied again");
        relay.answered(id, answer(200));
        assert_eq!(relay.woke(1), Some((7000, false)), "an answer to the earlier round counts for none");
        relay.answered(next, answer(200));
    }

    #[test]
    fn idle_calls_a_stream_comes_before_are_dropped_unsent_and_the_records_kept() {
        let relay = relay();
        let _mailbox = relay.mailbox(1, Arc::new(TickerShared::new()));
        relay.defer(1, 5000, idle(false, 0, &[0, 1]));
        assert_eq!(relay.woke(1), None, "none went: the worker's timer sends what is due");
        relay.release(1);
        assert_eq!(relay.commits(0, Duration::ZERO), 0);
        assert!(start(&relay, 1).is_empty());

        // The worker goes idle again: record 0 was acknowledged since, record 2 is new.
        relay.defer(1, 6000, idle(false, 1, &[2]));
        relay.release(1);
        assert_eq!(start(&relay, 2), [(2, copied(&[1, 2]))]);
    }
}
