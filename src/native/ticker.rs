//! The worker thread's timer (`Ticker`): the wasm root's tick, which the ABI lacks, and the
//! moment an idle worker's calls go.

use super::calls::{
    self,
    ffi::{self, EnvoyFilter},
};
use super::relay::Mailbox;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A worker thread's timer: the wasm root's tick, which the ABI lacks (no timer or scheduler
/// of a worker thread's own). A thread sleeps for the period, then commits the scheduler of one
/// live stream of the worker thread (the ticking stream), whose `scheduled` hook runs the
/// worker's tick on the worker thread. When that stream ends, another live stream takes over.
/// A worker with no stream left sends at once what its timer would send later (`Worker::idle`).
pub(super) struct Ticker {
    pub(super) shared: Arc<TickerShared>,
}

pub(super) struct TickerShared {
    beat: Mutex<Beat>,
    /// Signalled when the period changes or the ticker stops.
    changed: Condvar,
    /// The ticking stream and its scheduler.
    ticking: Mutex<Option<(u32, calls::Scheduler)>>,
}

/// When the ticker's thread commits next, as proxy-wasm's tick period has it: the first tick a
/// period after it is set (a shorter period set during a long wait takes effect at once), then
/// every period.
#[derive(Default)]
struct Beat {
    /// 0: no ticks.
    period_ms: u64,
    next: Option<Instant>,
    /// When the worker's idle calls go (see `went_idle`), unless a request comes first.
    idle_due: Option<Instant>,
    stopped: bool,
}

/// The events a stream's scheduler runs in its `scheduled` hook.
pub(super) const TICK: u64 = 0;
pub(super) const ANSWER_ORPHANED: u64 = 1;
/// Relayed answers wait in the thread's mailbox (see `relay`).
pub(super) const ANSWERS: u64 = 2;

impl Ticker {
    /// `on_idle`: run on the ticker's thread when the idle time set (`idle_until`) comes.
    pub(super) fn start(on_idle: impl Fn() + Send + 'static) -> Ticker {
        let shared = Arc::new(TickerShared {
            beat: Mutex::new(Beat::default()),
            changed: Condvar::new(),
            ticking: Mutex::new(None),
        });
        let ticker = Arc::clone(&shared);
        let started = std::thread::Builder::new().name("gateway-ticker".into()).spawn(move || ticker.run(on_idle));
        if let Err(error) = started {
            calls::log(ffi::LOG_ERROR, &format!("the gateway's timer thread did not start: {error}"));
        }
        Ticker { shared }
    }

    pub(super) fn set_period(&self, period_ms: u64) {
        let mut beat = self.shared.beat();
        if beat.period_ms != period_ms {
            beat.period_ms = period_ms;
            beat.next = (period_ms > 0).then(|| after(period_ms)).flatten();
            self.shared.changed.notify_one();
        }
    }

    /// Makes live stream `stream` the ticking one when no stream ticks and ticks are asked for
    /// or the worker awaits a relayed answer (which wakes it the same way); then wakes the
    /// ticking stream for answers that came while none could be woken (they are taken in a
    /// `scheduled` hook of their own, never inside another event).
    pub(super) fn keep_awake(&self, stream: Option<(u32, EnvoyFilter)>, mailbox: &Mailbox) {
        if let Some((id, envoy)) = stream {
            if self.shared.beat().period_ms > 0 || mailbox.awaits() {
                if let Ok(mut ticking) = self.shared.ticking.lock() {
                    if ticking.is_none() {
                        *ticking = calls::Scheduler::new(envoy).map(|scheduler| (id, scheduler));
                    }
                }
            }
        }
        if mailbox.has_answers() {
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
    /// When `on_idle` runs (None: not at all).
    pub(super) fn idle_until(&self, due: Option<Instant>) {
        let mut beat = self.beat();
        if beat.idle_due != due {
            beat.idle_due = due;
            self.changed.notify_one();
        }
    }

    /// The beat, also after a panic elsewhere (each use leaves it consistent).
    fn beat(&self) -> MutexGuard<'_, Beat> {
        self.beat.lock().unwrap_or_else(PoisonError::into_inner)
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
            match beat.next.into_iter().chain(beat.idle_due).min() {
                None => beat = self.changed.wait(beat).unwrap_or_else(PoisonError::into_inner),
                Some(at) if at > now => {
                    beat = self.changed.wait_timeout(beat, at - now).unwrap_or_else(PoisonError::into_inner).0;
                }
                Some(_) if beat.idle_due.is_some_and(|due| due <= now) => {
                    beat.idle_due = None;
                    // Not under the beat's lock: the relay takes its own.
                    drop(beat);
                    on_idle();
                    beat = self.beat();
                }
                Some(_) => {
                    beat.next = after(beat.period_ms);
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
    Instant::now().checked_add(Duration::from_millis(ms))
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
