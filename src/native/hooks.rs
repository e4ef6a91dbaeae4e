//! The hooks Envoy calls on a stream: headers, bodies, trailers, its end, its calls' answers
//! and its scheduler's events.

use super::calls::{
    self,
    ffi::{self, EnvoyFilter},
};
use super::guarded;
use super::io::Stream;
use super::thread::{answer_mail, run, tick_pending, unmarked, went_idle, with_worker, Filter, THREADS};
use super::ticker::{ANSWERS, TICK};
use crate::exchange::{Action, Io, Output, Worker};
use std::ffi::c_void;

/// The module's filter behind a hook's pointer (made in filter_new, freed in destroy).
fn filter<'a>(module: *const c_void) -> Option<&'a Filter> {
    calls::module_ref::<Filter>(module)
}

/// A headers hook: the core holds the headers (`held`: how) or lets them go.
fn headers_hook(
    module: *const c_void,
    end_of_stream: bool,
    event: fn(&mut Worker, u32, bool, &mut dyn Io) -> Output,
    held: fn(&Filter) -> u32,
) -> u32 {
    guarded(ffi::HEADERS_STOP_ITERATION, || {
        let Some(filter) = filter(module) else {
            return ffi::HEADERS_CONTINUE;
        };
        match run(filter, |worker, io| event(worker, filter.id, end_of_stream, io), unmarked) {
            Some(Action::Continue) => ffi::HEADERS_CONTINUE,
            _ => held(filter),
        }
    })
}

/// How a request's held headers stop: the body still comes to the filter, unless the lookup
/// gate holds them.
fn request_held(filter: &Filter) -> u32 {
    if filter.gate {
        ffi::HEADERS_STOP_ALL_AND_WATERMARK
    } else {
        ffi::HEADERS_STOP_ITERATION
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    guarded((), || {
        if let Some(filter) = filter(module) {
            run_pending_tick(filter);
        }
    });
    headers_hook(module, end_of_stream, Worker::request_headers, request_held)
}

/// The worker's timer, when a tick came that it has not run: the ticking stream's `scheduled`
/// hook runs it, or, when that stream ended first, the next stream's first hook.
fn run_pending_tick(filter: &Filter) {
    if tick_pending(filter) {
        run(filter, |worker, io| worker.tick(io), unmarked);
    }
}

/// Which way a body goes.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

impl Side {
    /// The chunk of the current body hook.
    fn received(self) -> u32 {
        match self {
            Side::Request => ffi::RECEIVED_REQUEST_BODY,
            Side::Response => ffi::RECEIVED_RESPONSE_BODY,
        }
    }

    /// Whether the filter held a chunk of this body (Envoy buffers it).
    fn buffered(self, stream: &mut Stream) -> &mut bool {
        match self {
            Side::Request => &mut stream.request_buffered,
            Side::Response => &mut stream.response_buffered,
        }
    }
}

/// A body hook: the body so far goes to the core (see `gather`), which holds it or lets it go.
fn body_hook(envoy: EnvoyFilter, module: *const c_void, end_of_stream: bool, side: Side) -> u32 {
    guarded(ffi::BODY_STOP_AND_BUFFER, || {
        let Some(filter) = filter(module) else {
            return ffi::BODY_CONTINUE;
        };
        let action = run(
            filter,
            |worker, io| {
                let at = match side {
                    Side::Request => io.request_body_at(filter.id),
                    Side::Response => io.response_body_at(filter.id),
                };
                let kind = at.map_or(side.received(), |(_, kind)| kind);
                let size = calls::body_size(envoy, gather(envoy, kind, side.received()));
                match side {
                    Side::Request => worker.request_body(filter.id, size, end_of_stream, io),
                    Side::Response => worker.response_body(filter.id, size, end_of_stream, io),
                }
            },
            |stream, action| *side.buffered(stream) |= action == Action::Pause,
        );
        match action {
            Some(Action::Continue) => ffi::BODY_CONTINUE,
            _ => ffi::BODY_STOP_AND_BUFFER,
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body_hook(envoy, module, end_of_stream, Side::Request)
}

/// Where the body so far is (`kind`): when it is the buffer of chunks held before, this hook's
/// chunk joins them there first, so the core sees the whole body so far as proxy-wasm shows it.
fn gather(envoy: EnvoyFilter, kind: u32, received: u32) -> u32 {
    if kind != received {
        let chunk = calls::body(envoy, received);
        if !chunk.is_empty() {
            calls::append_body(envoy, kind, &chunk);
            calls::drain_body(envoy, received, chunk.len());
        }
    }
    kind
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: EnvoyFilter,
    module: *const c_void,
) -> u32 {
    guarded(ffi::TRAILERS_STOP_ITERATION, || {
        let Some(filter) = filter(module) else {
            return ffi::TRAILERS_CONTINUE;
        };
        match run(filter, |worker, io| worker.request_trailers(filter.id, io), unmarked) {
            Some(Action::Continue) => ffi::TRAILERS_CONTINUE,
            _ => ffi::TRAILERS_STOP_ITERATION,
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    headers_hook(module, end_of_stream, Worker::response_headers, |_| ffi::HEADERS_STOP_ITERATION)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: EnvoyFilter,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body_hook(envoy, module, end_of_stream, Side::Response)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: EnvoyFilter,
    _module: *const c_void,
) -> u32 {
    ffi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_envoy: EnvoyFilter, module: *const c_void) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let record = with_worker(filter, |worker, io| worker.finished(filter.id, io), |_, record| record).flatten();
        // At `debug` only, as the wasm filter's (the access log has the record).
        if let Some(record) = record {
            if calls::log_enabled(ffi::LOG_DEBUG) {
                calls::log(ffi::LOG_DEBUG, &record.to_string());
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let idle = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            Some(threads.get_mut(&filter.config)?.stream_ended(filter.id))
        });
        // The last stream went: nothing ticks before the next one. The answers that came are
        // taken, and what the timer would send (records, leases' reports) goes if no request
        // comes soon.
        if idle == Some(true) {
            run(filter, answer_mail, unmarked);
            went_idle(filter);
        }
        calls::drop_module::<Filter>(module);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: EnvoyFilter,
    module: *const c_void,
    callout: u64,
    result: u32,
    headers: *const ffi::EnvoyHeader,
    headers_length: usize,
    chunks: *const ffi::EnvoyBuffer,
    chunks_length: usize,
) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        let answer = calls::callout_answer(result, headers, headers_length, chunks, chunks_length);
        run(
            filter,
            |worker, io| match io.calls.remove(&(filter.id, callout)) {
                Some(call) => worker.call_answered(call.token, answer, io),
                None => Output { action: Action::Continue, after: Vec::new() },
            },
            unmarked,
        );
    })
}

// Hooks Envoy requires of every HTTP filter module, for features this filter does not use
// (streamed callouts, per-stream schedulers, a terminal filter's flow control).

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset() {}

/// The ticker committed this stream's scheduler: the worker's tick runs (see `Ticker`); or the
/// stream was asked to report the orphaned root calls (see `Orphans`), or to take the relayed
/// answers (see `relay`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: EnvoyFilter,
    module: *const c_void,
    event: u64,
) {
    guarded((), || {
        let Some(filter) = filter(module) else {
            return;
        };
        match event {
            TICK => {
                run_pending_tick(filter);
                return;
            }
            ANSWERS => {
                run(filter, answer_mail, unmarked);
                return;
            }
            _ => {}
        }
        let orphaned = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            let orphans = &mut threads.get_mut(&filter.config)?.orphans;
            orphans.waker = None;
            Some(std::mem::take(&mut orphans.tokens))
        });
        for token in orphaned.unwrap_or_default() {
            run(filter, |worker, io| worker.call_lost(token, io), unmarked);
        }
    })
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark() {}
