//! The module's and each filter config's life: loading, Envoy's log, a config's settings and
//! stats, a new stream's worker, and the main thread's relayed calls.

use super::calls::{
    self,
    ffi::{self, EnvoyFilter},
};
use super::io::ProcessStore;
use super::relay::Relay;
use super::thread::{Filter, ThreadState, THREADS};
use super::{guarded, MetricIds};
use crate::exchange::{self, metrics};
use crate::settings::Settings;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a filter config holds: its settings' bytes (each worker thread parses its own copy, as
/// each wasm VM does), its number, and the ids of its stats.
struct Config {
    id: u64,
    bytes: Vec<u8>,
    /// The lookup gate's config (see `Filter::gate`).
    gate: bool,
    metrics: MetricIds,
    relay: Arc<Relay>,
}

/// The configs Envoy holds now, by number (a config's address may be reused by the next one).
static LIVE_CONFIGS: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static NEXT_CONFIG: AtomicU64 = AtomicU64::new(1);

/// The `log` crate's lines (the core's) into Envoy's log, under its `dynamic_modules` component.
struct EnvoyLogger;

impl log::Log for EnvoyLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        calls::log_enabled(envoy_level(metadata.level()))
    }

    fn log(&self, record: &log::Record) {
        let level = envoy_level(record.level());
        if calls::log_enabled(level) {
            calls::log(level, &record.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn envoy_level(level: log::Level) -> u32 {
    match level {
        log::Level::Trace => ffi::LOG_TRACE,
        log::Level::Debug => ffi::LOG_DEBUG,
        log::Level::Info => ffi::LOG_INFO,
        log::Level::Warn => ffi::LOG_WARN,
        log::Level::Error => ffi::LOG_ERROR,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    guarded(std::ptr::null(), || {
        if let Err(missing) = calls::resolve() {
            // Envoy's own log may be what is missing: stderr is where Envoy's log goes too.
            eprintln!(
                "model gateway: this Envoy lacks the callback {missing}: the module is built for Envoy 1.40's dynamic-module ABI {}, and does not load",
                String::from_utf8_lossy(ffi::ABI_VERSION.strip_suffix(b"\0").unwrap_or_default())
            );
            return std::ptr::null();
        }
        // Envoy's level decides (checked per line): the `log` crate lets every line through.
        if log::set_logger(&EnvoyLogger).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
        ffi::ABI_VERSION.as_ptr()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ffi::EnvoyConfig,
    _name: ffi::EnvoyBuffer,
    config: ffi::EnvoyBuffer,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        let bytes = calls::hook_bytes(config);
        let settings = match Settings::parse(&bytes) {
            Ok(settings) => settings,
            Err(message) => {
                calls::log(ffi::LOG_ERROR, &message);
                return std::ptr::null();
            }
        };
        exchange::prepare_store(&ProcessStore, &settings);
        let id = NEXT_CONFIG.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut live) = LIVE_CONFIGS.lock() {
            live.push(id);
        }
        let metrics = metrics::FAMILIES
            .iter()
            .map(|(name, keeping, labels)| calls::define_metric(envoy, *keeping, name, labels))
            .collect();
        let gate = settings.lookup_gate;
        let relay = Arc::new(Relay::new(envoy, settings.control_plane.clone()));
        calls::into_module(Config { id, bytes, gate, metrics, relay })
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            config.relay.close();
            if let Ok(mut live) = LIVE_CONFIGS.lock() {
                live.retain(|id| *id != config.id);
            }
        }
        calls::drop_module::<Config>(config);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void, envoy: EnvoyFilter) -> *const c_void {
    guarded(std::ptr::null(), || {
        let Some(config_ref) = calls::module_ref::<Config>(config) else {
            return std::ptr::null();
        };
        let key = config_ref.id;
        let id = THREADS.with(|threads| {
            let mut threads = threads.try_borrow_mut().ok()?;
            if !threads.contains_key(&key) {
                // A config Envoy replaced: its workers here go (their streams ended before it).
                if let Ok(live) = LIVE_CONFIGS.lock() {
                    threads.retain(|id, state| {
                        let keep = live.contains(id);
                        if !keep {
                            state.relay.forget(state.number);
                        }
                        keep
                    });
                }
                let state = ThreadState::new(&config_ref.bytes, &config_ref.relay, &config_ref.metrics)?;
                threads.insert(key, state);
            }
            let id = threads.get_mut(&key)?.stream_started(envoy);
            Some(id)
        });
        match id {
            Some(id) => calls::into_module(Filter { config: key, id, gate: config_ref.gate }),
            None => std::ptr::null(),
        }
    })
}

/// A worker thread asked for a call to the control plane (`relay`): the main thread starts it.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    envoy: ffi::EnvoyConfig,
    config: *const c_void,
    _event: u64,
) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            config.relay.start_asked(|call| calls::config_callout(envoy, call));
        }
    })
}

/// A call the main thread started for a worker thread answered: to that thread's mailbox.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _envoy: ffi::EnvoyConfig,
    config: *const c_void,
    callout: u64,
    result: u32,
    headers: *const ffi::EnvoyHeader,
    headers_length: usize,
    chunks: *const ffi::EnvoyBuffer,
    chunks_length: usize,
) {
    guarded((), || {
        if let Some(config) = calls::module_ref::<Config>(config) {
            let answer = calls::callout_answer(result, headers, headers_length, chunks, chunks_length);
            config.relay.answered(callout, answer);
        }
    })
}
