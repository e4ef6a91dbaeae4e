//! Our declarations of the part of Envoy's dynamic-module ABI ("v0.2.0", Envoy 1.40) the
//! native adapter uses: the callbacks Envoy's binary exports, and the C types they take.
//! Written from Envoy's ABI header as a contract, not copied from it.
//!
//! Every pointer Envoy hands out (`EnvoyFilter`, `EnvoyConfig`, buffers, header arrays) is valid
//! only as the header says: a filter's until its `destroy` hook, a buffer until the hook it was
//! read in returns. The safe wrappers in `calls` copy what they read before returning.

use std::ffi::c_void;

/// The ABI version this adapter was written against; `on_program_init` returns it.
pub(crate) const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Envoy's filter object of one stream (valid until `on_http_filter_destroy`).
pub(crate) type EnvoyFilter = *mut c_void;
/// A scheduler Envoy made for a filter (a config): committing it (from any thread) runs the
/// filter's `scheduled` hook on its worker thread (the config's on the main thread); the adapter
/// deletes it exactly once.
pub(crate) type Scheduler = *mut c_void;
/// Envoy's filter config object (valid until `on_http_filter_config_destroy`).
pub(crate) type EnvoyConfig = *mut c_void;

/// Bytes Envoy owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct EnvoyBuffer {
    pub(crate) ptr: *const u8,
    pub(crate) length: usize,
}

/// Bytes the module owns, read by Envoy during the call only.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ModuleBuffer {
    pub(crate) ptr: *const u8,
    pub(crate) length: usize,
}

impl ModuleBuffer {
    pub(crate) fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }
}

/// A header Envoy owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct EnvoyHeader {
    pub(crate) key_ptr: *const u8,
    pub(crate) key_length: usize,
    pub(crate) value_ptr: *const u8,
    pub(crate) value_length: usize,
}

/// A header the module owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ModuleHeader {
    pub(crate) key_ptr: *const u8,
    pub(crate) key_length: usize,
    pub(crate) value_ptr: *const u8,
    pub(crate) value_length: usize,
}

impl ModuleHeader {
    pub(crate) fn of(name: &str, value: &[u8]) -> ModuleHeader {
        ModuleHeader {
            key_ptr: name.as_ptr(),
            key_length: name.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// Which header map (`envoy_dynamic_module_type_http_header_type`).
pub(crate) const REQUEST_HEADERS: u32 = 0;
pub(crate) const RESPONSE_HEADERS: u32 = 2;

/// Which body (`envoy_dynamic_module_type_http_body_type`): the chunk of the current hook, or
/// what the filter chain buffered before it.
pub(crate) const RECEIVED_REQUEST_BODY: u32 = 0;
pub(crate) const BUFFERED_REQUEST_BODY: u32 = 1;
pub(crate) const RECEIVED_RESPONSE_BODY: u32 = 2;
pub(crate) const BUFFERED_RESPONSE_BODY: u32 = 3;

/// Log levels (`envoy_dynamic_module_type_log_level`).
pub(crate) const LOG_TRACE: u32 = 0;
pub(crate) const LOG_DEBUG: u32 = 1;
pub(crate) const LOG_INFO: u32 = 2;
pub(crate) const LOG_WARN: u32 = 3;
pub(crate) const LOG_ERROR: u32 = 4;
pub(crate) const LOG_CRITICAL: u32 = 5;

/// `response.code_details` (`envoy_dynamic_module_type_attribute_id`).
pub(crate) const ATTRIBUTE_RESPONSE_CODE_DETAILS: u32 = 16;

/// Callout results (`envoy_dynamic_module_type_http_callout_init_result`, `..._result`).
pub(crate) const CALLOUT_STARTED: u32 = 0;
pub(crate) const CALLOUT_SUCCEEDED: u32 = 0;

/// A metrics callback's result (`envoy_dynamic_module_type_metrics_result`): `Success`.
pub(crate) const METRICS_SUCCESS: u32 = 0;

/// What a header hook returns (`Http::FilterHeadersStatus`).
pub(crate) const HEADERS_CONTINUE: u32 = 0;
pub(crate) const HEADERS_STOP_ITERATION: u32 = 1;
/// Stops the stream, its body held back with flow control (`StopAllIterationAndWatermark`).
pub(crate) const HEADERS_STOP_ALL_AND_WATERMARK: u32 = 4;
/// What a body hook returns (`Http::FilterDataStatus`).
pub(crate) const BODY_CONTINUE: u32 = 0;
pub(crate) const BODY_STOP_AND_BUFFER: u32 = 1;
/// What a trailers hook returns (`Http::FilterTrailersStatus`).
pub(crate) const TRAILERS_CONTINUE: u32 = 0;
pub(crate) const TRAILERS_STOP_ITERATION: u32 = 1;

/// The callbacks the adapter calls: each resolved by name in the process (Envoy's binary exports
/// them) when the module is loaded, before any is called (`on_program_init`). The module has no
/// undefined symbol: an Envoy that lacks one still loads it, and its init says which.
macro_rules! callbacks {
    ($($field:ident: $symbol:ident($($arg:ident: $type:ty),*) $(-> $ret:ty)?;)*) => {
        /// Envoy's callbacks, by what they do.
        // The unit tests' config scheduler is a double (see `calls::ConfigScheduler`).
        #[cfg_attr(test, allow(dead_code))]
        pub(crate) struct Callbacks {
            $(pub(crate) $field: unsafe extern "C" fn($($type),*) $(-> $ret)?,)*
        }

        impl Callbacks {
            /// Every callback, found in the process; else the name of the first one missing.
            pub(crate) fn resolve() -> Result<Callbacks, &'static str> {
                Ok(Callbacks {
                    $($field: {
                        let name = concat!(stringify!($symbol), "\0");
                        // SAFETY: a NUL-terminated constant; dlsym only reads it.
                        let address = unsafe { dlsym(RTLD_DEFAULT, name.as_ptr()) };
                        if address.is_null() {
                            return Err(stringify!($symbol));
                        }
                        // SAFETY: Envoy exports this symbol as a function of exactly this C
                        // signature (ABI v0.2.0, the one these declarations follow).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($type),*) $(-> $ret)?>(address)
                        }
                    },)*
                })
            }
        }
    };
}

callbacks! {
    log: envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    log_enabled: envoy_dynamic_module_callback_log_enabled(level: u32) -> bool;
    get_headers_size: envoy_dynamic_module_callback_http_get_headers_size(filter: EnvoyFilter, map: u32) -> usize;
    get_headers: envoy_dynamic_module_callback_http_get_headers(filter: EnvoyFilter, map: u32, out: *mut EnvoyHeader) -> bool;
    set_header: envoy_dynamic_module_callback_http_set_header(filter: EnvoyFilter, map: u32, key: ModuleBuffer, value: ModuleBuffer) -> bool;
    add_header: envoy_dynamic_module_callback_http_add_header(filter: EnvoyFilter, map: u32, key: ModuleBuffer, value: ModuleBuffer) -> bool;
    clear_route_cache: envoy_dynamic_module_callback_http_clear_route_cache(filter: EnvoyFilter);
    get_body_chunks_size: envoy_dynamic_module_callback_http_get_body_chunks_size(filter: EnvoyFilter, body: u32) -> usize;
    get_body_chunks: envoy_dynamic_module_callback_http_get_body_chunks(filter: EnvoyFilter, body: u32, out: *mut EnvoyBuffer) -> bool;
    get_body_size: envoy_dynamic_module_callback_http_get_body_size(filter: EnvoyFilter, body: u32) -> usize;
    append_body: envoy_dynamic_module_callback_http_append_body(filter: EnvoyFilter, body: u32, data: ModuleBuffer) -> bool;
    drain_body: envoy_dynamic_module_callback_http_drain_body(filter: EnvoyFilter, body: u32, bytes: usize) -> bool;
    send_response: envoy_dynamic_module_callback_http_send_response(filter: EnvoyFilter, status: u32, headers: *mut ModuleHeader, headers_length: usize, body: ModuleBuffer, details: ModuleBuffer);
    continue_decoding: envoy_dynamic_module_callback_http_filter_continue_decoding(filter: EnvoyFilter);
    callout: envoy_dynamic_module_callback_http_filter_http_callout(filter: EnvoyFilter, callout_id: *mut u64, cluster: ModuleBuffer, headers: *mut ModuleHeader, headers_length: usize, body: ModuleBuffer, timeout_ms: u64) -> u32;
    scheduler_new: envoy_dynamic_module_callback_http_filter_scheduler_new(filter: EnvoyFilter) -> Scheduler;
    scheduler_commit: envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: Scheduler, event: u64);
    scheduler_delete: envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: Scheduler);
    config_scheduler_new: envoy_dynamic_module_callback_http_filter_config_scheduler_new(config: EnvoyConfig) -> Scheduler;
    config_scheduler_commit: envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler: Scheduler, event: u64);
    config_scheduler_delete: envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: Scheduler);
    config_callout: envoy_dynamic_module_callback_http_filter_config_http_callout(config: EnvoyConfig, callout_id: *mut u64, cluster: ModuleBuffer, headers: *mut ModuleHeader, headers_length: usize, body: ModuleBuffer, timeout_ms: u64) -> u32;
    set_filter_state_bytes: envoy_dynamic_module_callback_http_set_filter_state_bytes(filter: EnvoyFilter, key: ModuleBuffer, value: ModuleBuffer) -> bool;
    get_attribute_string: envoy_dynamic_module_callback_http_filter_get_attribute_string(filter: EnvoyFilter, attribute: u32, out: *mut EnvoyBuffer) -> bool;
    define_counter: envoy_dynamic_module_callback_http_filter_config_define_counter(config: EnvoyConfig, name: ModuleBuffer, labels: *const ModuleBuffer, labels_length: usize, id: *mut usize) -> u32;
    define_histogram: envoy_dynamic_module_callback_http_filter_config_define_histogram(config: EnvoyConfig, name: ModuleBuffer, labels: *const ModuleBuffer, labels_length: usize, id: *mut usize) -> u32;
    define_gauge: envoy_dynamic_module_callback_http_filter_config_define_gauge(config: EnvoyConfig, name: ModuleBuffer, labels: *const ModuleBuffer, labels_length: usize, id: *mut usize) -> u32;
    increment_counter: envoy_dynamic_module_callback_http_filter_increment_counter(filter: EnvoyFilter, id: usize, values: *const ModuleBuffer, values_length: usize, value: u64) -> u32;
    record_histogram_value: envoy_dynamic_module_callback_http_filter_record_histogram_value(filter: EnvoyFilter, id: usize, values: *const ModuleBuffer, values_length: usize, value: u64) -> u32;
    increment_gauge: envoy_dynamic_module_callback_http_filter_increment_gauge(filter: EnvoyFilter, id: usize, values: *const ModuleBuffer, values_length: usize, value: u64) -> u32;
    decrement_gauge: envoy_dynamic_module_callback_http_filter_decrement_gauge(filter: EnvoyFilter, id: usize, values: *const ModuleBuffer, values_length: usize, value: u64) -> u32;
}

extern "C" {
    /// libc's symbol lookup in the process (Envoy's binary exports the callbacks).
    pub(crate) fn dlsym(handle: *mut c_void, symbol: *const u8) -> *mut c_void;
}

/// `RTLD_DEFAULT`: search the process's global symbols.
pub(crate) const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();
