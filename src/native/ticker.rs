//! The worker thread's timer (`Ticker`): the wasm root's tick, which the ABI lacks, and the
//! moment an idle worker's calls go.

use super::calls::{
    self,
    ffi::{self, EnvoyFilter},
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Where a worker's mailbox stands, for `Ticker::keep_awake`.
#[derive(Clone, Copy)]
pub(super) struct MailState {
    /// A relayed answer is still to come.
    pub(super) awaits: bool,
    /// Answers wait to be taken.
    pub(super) has_answers: bool,
}

/// A worker thread's timer: the wasm root's tick, which the ABI lacks (no timer or scheduler
/// of a worker thread's own). A thread sleeps for the period, then commits the scheduler of one
/// live stream of the worker thread (the ticking stream), whose `scheduled` hook runs the
/// worker's tick on the worker thread. When that stream ends, another live stream takes over.
/// A worker with no stream left has its thread run `on_idle` when the idle time set comes
/// (`idle_until`): its idle calls go then (see `ThreadState::went_idle`).
pub(super) struct Ticker {
    pub(super) shared: Arc<TickerShared>,
}

pub(super) struct TickerShared {
    beat: Mutex<Beat>,
    /// Signalled when the period changes or the ticker stops.
    changed: Condvar,
    /// The ticking stream and its scheduler.
    ticking: Mutex<Option<(u32, calls::Scheduler)>>,
    /// A tick came and the worker has not run it yet: the ticking stream may end before its
    /// `scheduled` hook runs (Envoy then drops the event), or no stream ticked. Under a load of
    /// short requests (cache hits end in their body hook) that was nearly every tick, and the
    /// records waited until the queue's bound dropped them; the next stream's first hook runs
    /// the tick instead (`take_tick`).
    tick_pending: AtomicBool,
}

/// When the ticker's thread commits next, as proxy-wasm's tick period has it: the first tick a
/// period after it is set (a shorter period set during a long wait takes effect at once), then
/// every period.
#[derive(Default)]
struct Beat {
    /// 0: no ticks.
    period_ms: u64,
    next: Option<Instant>,
    /// When the worker's idle calls go (see `ThreadState::went_idle`), unless a request comes first.
    idle_due: Option<Instant>,
    stopped: bool,
    /// Until when the ticker's thread sleeps, while it does (`Some(None)`: until woken).
    sleeps_until: Option<Option<Instant>>,
}

/// What the ticker's thread does next.
#[derive(Debug, PartialEq)]
enum Step {
    /// Waits until the beat changes, or this long at most.
    Wait(Option<Duration>),
    /// Runs `on_idle`.
    Idle,
    /// Commits the ticking stream's scheduler.
    Tick,
}

impl Beat {
    /// A new period from `now` on; false when it is the period already (its beat goes on).
    fn set_period(&mut self, period_ms: u64, now: Instant) -> bool {
        if self.period_ms == period_ms {
            return false;
        }
        self.period_ms = period_ms;
        self.next = (period_ms > 0).then(|| later(now, period_ms)).flatten();
        true
    }

    /// The earliest of the next tick and the idle time.
    fn due(&self) -> Option<Instant> {
        self.next.into_iter().chain(self.idle_due).min()
    }

    /// Whether the sleeping ticker's thread must be woken for what changed: only when something
    /// is now due before it wakes anyway. A later or withdrawn time waits for that wake (one
    /// spare step): a worker going idle and busy again between requests sets and clears its
    /// idle time each time, and waking the thread for each cost two context switches a request.
    fn needs_waking(&self) -> bool {
        match (self.sleeps_until, self.due()) {
            (Some(None), Some(_)) => true,
            (Some(Some(wakes)), Some(due)) => due < wakes,
            _ => false,
        }
    }

    /// What is due at `now`: the idle time before a tick due too; a tick's next one a period on.
    fn step(&mut self, now: Instant) -> Step {
        match self.due() {
            None => Step::Wait(None),
            Some(at) if at > now => Step::Wait(Some(at - now)),
            Some(_) if self.idle_due.is_some_and(|due| due <= now) => {
                self.idle_due = None;
                Step::Idle
            }
            Some(_) => {
                self.next = later(now, self.period_ms);
                Step::Tick
            }
        }
    }
}

/// The events a stream's scheduler runs in its `scheduled` hook.
pub(super) const TICK: u64 = 0;
pub(super) const ANSWER_ORPHANED: u64 = 1;
/// Relayed answers wait in the thread's mailbox (see `relay`).
pub(super) const ANSWERS: u64 = 2;

impl Ticker {
    /// `on_idle`: run on the ticker's thread when the idle time set (`idle_until`) comes.
    pub(super) fn start(on_idle: impl Fn() + Send + 'static) -> Ticker {
        let shared = Arc::new(TickerShared::new());
        let ticker = Arc::clone(&shared);
        let started = std::thread::Builder::new().name("gateway-ticker".into()).spawn(move || ticker.run(on_idle));
        if let Err(error) = started {
            calls::log(ffi::LOG_ERROR, &format!("the gateway's timer thread did not start: {error}"));
        }
        Ticker { shared }
    }

    pub(super) fn set_period(&self, period_ms: u64) {
        let mut beat = self.shared.beat();
        if beat.set_period(period_ms, Instant::now()) && beat.needs_waking() {
            self.shared.changed.notify_one();
        }
    }

    /// Makes live stream `stream` the ticking one when no stream ticks and ticks are asked for
    /// or the worker awaits a relayed answer (which wakes it the same way); then wakes the
    /// ticking stream for answers that came while none could be woken (they are taken in a
    /// `scheduled` hook of their own, never inside another event).
    pub(super) fn keep_awake(&self, stream: Option<(u32, EnvoyFilter)>, mail: MailState) {
        if let Some((id, envoy)) = stream {
            if self.shared.beat().period_ms > 0 || mail.awaits {
                if let Ok(mut ticking) = self.shared.ticking.lock() {
                    if ticking.is_none() {
                        *ticking = calls::Scheduler::new(envoy).map(|scheduler| (id, scheduler));
                    }
                }
            }
        }
        if mail.has_answers {
            self.shared.wake(ANSWERS);
        }
    }

    /// Stream `id` ended: if it was ticking, its scheduler goes (another live stream adopts).
    pub(super) fn forget(&self, id: u32) {
        if let Ok(mut ticking) = self.shared.ticking.lock() {
            if ticking.as_ref().is_some_and(|(ticker, _)| *ticker == id) {
                *ticking = None;
            }
        }
    }
}

impl TickerShared {
    pub(super) fn new() -> TickerShared {
        TickerShared {
            beat: Mutex::new(Beat::default()),
            changed: Condvar::new(),
            ticking: Mutex::new(None),
            tick_pending: AtomicBool::new(false),
        }
    }

    /// When `on_idle` runs (None: not at all).
    pub(super) fn idle_until(&self, due: Option<Instant>) {
        let mut beat = self.beat();
        if beat.idle_due != due {
            beat.idle_due = due;
            if beat.needs_waking() {
                self.changed.notify_one();
            }
        }
    }

    /// When `on_idle` runs next (None: not at all).
    #[cfg(test)]
    pub(super) fn idle_due(&self) -> Option<Instant> {
        self.beat().idle_due
    }

    /// The beat, also after a panic elsewhere (each use leaves it consistent).
    fn beat(&self) -> MutexGuard<'_, Beat> {
        self.beat.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a tick came that the worker has not run yet; it is then the caller's to run.
    pub(super) fn take_tick(&self) -> bool {
        // A load first: most hooks find none, and a swap would write the shared line each time.
        self.tick_pending.load(Ordering::Relaxed) && self.tick_pending.swap(false, Ordering::AcqRel)
    }

    /// Runs the ticking stream's `scheduled` hook with `event` soon, if a stream ticks.
    pub(super) fn wake(&self, event: u64) {
        if let Ok(ticking) = self.ticking.lock() {
            if let Some((_, scheduler)) = ticking.as_ref() {
                scheduler.commit(event);
            }
        }
    }

    /// The ticker's thread: waits for each tick's time, then commits the ticking stream's
    /// scheduler; and runs `on_idle` when the idle time comes.
    fn run(&self, on_idle: impl Fn()) {
        let mut beat = self.beat();
        while !beat.stopped {
            let now = Instant::now();
            match beat.step(now) {
                Step::Wait(None) => {
                    beat.sleeps_until = Some(None);
                    beat = self.changed.wait(beat).unwrap_or_else(PoisonError::into_inner);
                    beat.sleeps_until = None;
                }
                Step::Wait(Some(time)) => {
                    beat.sleeps_until = Some(now.checked_add(time));
                    beat = self.changed.wait_timeout(beat, time).unwrap_or_else(PoisonError::into_inner).0;
                    beat.sleeps_until = None;
                }
                Step::Idle => {
                    // Not under the beat's lock: the relay takes its own.
                    drop(beat);
                    on_idle();
                    beat = self.beat();
                }
                Step::Tick => {
                    self.tick_pending.store(true, Ordering::Release);
                    self.wake(TICK);
                }
            }
        }
    }
}

/// The time in Unix milliseconds.
pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The instant `ms` from now; None past what the clock can say (a period that never ends).
pub(super) fn after(ms: u64) -> Option<Instant> {
    later(Instant::now(), ms)
}

/// The instant `ms` after `from`; None past what the clock can say.
fn later(from: Instant, ms: u64) -> Option<Instant> {
    from.checked_add(Duration::from_millis(ms))
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.beat().stopped = true;
        self.shared.changed.notify_one();
        if let Ok(mut ticking) = self.shared.ticking.lock() {
            *ticking = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn without_ticks_or_an_idle_time_the_ticker_waits_for_a_change() {
        assert_eq!(Beat::default().step(Instant::now()), Step::Wait(None));
    }

    #[test]
    fn the_first_tick_comes_a_period_after_it_is_set_then_a_period_after_each_tick() {
        let start = Instant::now();
        let mut beat = Beat::default();
        assert!(beat.set_period(100, start));
        assert_eq!(beat.step(start), Step::Wait(Some(ms(100))));
        assert_eq!(beat.step(start + ms(60)), Step::Wait(Some(ms(40))));
        assert_eq!(beat.step(start + ms(100)), Step::Tick);
        assert_eq!(beat.step(start + ms(100)), Step::Wait(Some(ms(100))));
        // A late tick: the next one is a period after it.
        assert_eq!(beat.step(start + ms(250)), Step::Tick);
        assert_eq!(beat.step(start + ms(250)), Step::Wait(Some(ms(100))));
    }

    #[test]
    fn the_same_period_set_again_keeps_the_beat_and_a_new_one_starts_over() {
        let start = Instant::now();
        let mut beat = Beat::default();
        beat.set_period(100, start);
        assert!(!beat.set_period(100, start + ms(90)), "the period it has");
        assert_eq!(beat.step(start + ms(100)), Step::Tick);
        // A shorter period set during a long wait takes effect at once.
        let mut beat = Beat::default();
        beat.set_period(60_000, start);
        assert!(beat.set_period(100, start + ms(50)));
        assert_eq!(beat.step(start + ms(150)), Step::Tick);
    }

    #[test]
    fn a_period_of_zero_stops_the_ticks() {
        let start = Instant::now();
        let mut beat = Beat::default();
        beat.set_period(100, start);
        assert!(beat.set_period(0, start + ms(50)));
        assert_eq!(beat.step(start + ms(1000)), Step::Wait(None));
    }

    #[test]
    fn the_idle_time_comes_once_and_before_a_tick_due_with_it() {
        let start = Instant::now();
        let mut beat = Beat::default();
        beat.set_period(100, start);
        beat.idle_due = Some(start + ms(100));
        assert_eq!(beat.step(start + ms(100)), Step::Idle);
        assert_eq!(beat.step(start + ms(100)), Step::Tick);
        assert_eq!(beat.step(start + ms(100)), Step::Wait(Some(ms(100))), "no second idle run");
        // Without ticks, the ticker waits for the idle time alone.
        let mut beat = Beat { idle_due: Some(start + ms(1000)), ..Beat::default() };
        assert_eq!(beat.step(start), Step::Wait(Some(ms(1000))));
        assert_eq!(beat.step(start + ms(1000)), Step::Idle);
        assert_eq!(beat.step(start + ms(1000)), Step::Wait(None));
    }

    #[test]
    fn the_sleeping_thread_is_woken_only_for_what_is_due_before_it_wakes() {
        let start = Instant::now();
        let mut beat = Beat { idle_due: Some(start + ms(1000)), ..Beat::default() };
        assert!(!beat.needs_waking(), "a running thread steps again before it sleeps");
        beat.sleeps_until = Some(Some(start + ms(1000)));
        // A worker busy again, then idle again: its idle time withdrawn, then set later.
        beat.idle_due = None;
        assert!(!beat.needs_waking(), "withdrawn: the thread finds nothing due when it wakes");
        beat.idle_due = Some(start + ms(1200));
        assert!(!beat.needs_waking(), "later: it waits on when it wakes");
        assert_eq!(beat.step(start + ms(1000)), Step::Wait(Some(ms(200))));
        // A tick due sooner than the thread wakes does wake it.
        beat.set_period(100, start);
        assert!(beat.needs_waking());
        // A thread asleep until woken is woken for anything due.
        let mut beat = Beat { sleeps_until: Some(None), ..Beat::default() };
        assert!(!beat.needs_waking());
        beat.idle_due = Some(start + ms(60_000));
        assert!(beat.needs_waking());
    }

    #[test]
    fn the_tickers_thread_runs_on_idle_each_time_the_idle_time_set_comes() {
        let (idled, idle) = std::sync::mpsc::channel();
        let ticker = Ticker::start(move || {
            let _ = idled.send(Instant::now());
        });
        let set = Instant::now();
        ticker.shared.idle_until(Some(set + ms(50)));
        let ran = idle.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(ran >= set + ms(50), "not before its time");
        assert_eq!(ticker.shared.idle_due(), None, "once");
        ticker.shared.idle_until(Some(Instant::now()));
        assert!(idle.recv_timeout(Duration::from_secs(10)).is_ok(), "set again, it runs again");
    }
}
