//! The native host adapter: the same core as the wasm filter (`host/`), loaded by Envoy 1.40 as
//! a dynamic module (`envoy.filters.http.dynamic_modules`). Its hooks feed events to the
//! exchange's [`Worker`] and run what comes back; every call into Envoy goes through `calls`.
//!
//! Each Envoy worker thread has its own `Worker` per filter config, as each has its own wasm VM.
//! Metrics are Envoy's labelled stats, defined per config from `metrics::FAMILIES` (no
//! `stats_tags` needed). The root's calls to the control plane (its entries, record batches,
//! leases, kept responses) go out from the main thread (see `relay`); its other calls (a fetch
//! several requests share: a JWKS, an access token) ride on the stream whose hook starts them
//! (see `Call`). Not yet here (issue 29): an async hook's call, which outlives its request.
//!
//! Where to read what:
//!
//! | file | what |
//! |---|---|
//! | `config.rs` | the module's and each config's life: loading, settings, stats, a new stream's worker |
//! | `hooks.rs` | the hooks Envoy calls on a stream: headers, bodies, trailers, end, answers, scheduler |
//! | `thread.rs` | a worker thread's state: streams, calls in flight, orphans, idle calls; running an event |
//! | `io.rs` | the host as the exchange sees it from one hook (`NativeIo`), the shared store |
//! | `ticker.rs` | the worker thread's timer: ticks, and when an idle worker's calls go |
//! | `relay.rs` | the control plane's calls, made from the main thread; each worker's mailbox |
//! | `calls/` | Envoy's callbacks behind safe wrappers, and their declarations (`ffi.rs`) |

pub(crate) mod calls;
mod config;
mod hooks;
mod io;
mod relay;
mod thread;
mod ticker;

use calls::ffi;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The worker's root id: stream ids start at 1.
const ROOT: u32 = 0;

/// The id Envoy gave each family of `metrics::FAMILIES`, in its order (None: Envoy refused it).
type MetricIds = Arc<[Option<usize>]>;

/// Runs a hook, turning a panic into `fallback` (a panic must not cross into Envoy).
fn guarded<T>(fallback: T, hook: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(hook)).unwrap_or_else(|_| {
        calls::log(ffi::LOG_CRITICAL, "the gateway's native filter panicked; the stream is held");
        fallback
    })
}
