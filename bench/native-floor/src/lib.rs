//! The benchmark's native floor modules: what any Envoy dynamic module must do to route like the
//! gateway under the gateway's Envoy config, and nothing else (the native twin of
//! `bench/minimal-filter`). The filter config is `<mode> <authority>` (`authority` is the
//! upstream's `host:port`):
//! - `pass` (`native_floor_pass`): on the request headers it sets the route's `cluster_header`
//!   and `:authority` and clears the route cache (Envoy chooses the route again), as the module
//!   does to route a custom-host request; every other hook continues.
//! - `hold` (`native_floor_hold`): the same, and it holds the request's headers until its body
//!   has been buffered whole, and the answer's headers until its body has, as the module does.
//!   The bodies are never read: reading them is the gateway's own work.
//!
//! No state per stream: each filter's pointer is its config's.

use std::ffi::c_void;

/// The ABI version these declarations follow (Envoy 1.40's, as the gateway's module).
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// The route's `cluster_header` and the gateway's cluster for plain-HTTP custom hosts.
const CLUSTER_HEADER: &[u8] = b"x-gateway-upstream-cluster";
const PLAIN_CLUSTER: &[u8] = b"gateway_upstream_plain";

const REQUEST_HEADERS: u32 = 0;
const HEADERS_CONTINUE: u32 = 0;
const HEADERS_STOP_ITERATION: u32 = 1;
const BODY_CONTINUE: u32 = 0;
const BODY_STOP_AND_BUFFER: u32 = 1;
const TRAILERS_CONTINUE: u32 = 0;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Buffer {
    ptr: *const u8,
    length: usize,
}

impl Buffer {
    fn of(bytes: &[u8]) -> Buffer {
        Buffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }
}

// Envoy's binary exports these; the module is loaded into it.
extern "C" {
    fn envoy_dynamic_module_callback_http_set_header(filter: *mut c_void, map: u32, key: Buffer, value: Buffer)
        -> bool;
    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: *mut c_void);
}

struct Config {
    hold: bool,
    authority: Vec<u8>,
}

fn config<'a>(pointer: *const c_void) -> Option<&'a Config> {
    // SAFETY: null or made by `config_new` and not yet destroyed (Envoy destroys a config after
    // its filters).
    unsafe { pointer.cast::<Config>().as_ref() }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    ABI_VERSION.as_ptr()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _envoy: *mut c_void,
    _name: Buffer,
    config: Buffer,
) -> *const c_void {
    // SAFETY: Envoy's buffer, valid during this hook.
    let bytes =
        if config.ptr.is_null() { &[][..] } else { unsafe { std::slice::from_raw_parts(config.ptr, config.length) } };
    let text = String::from_utf8_lossy(bytes);
    let (mode, authority) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
    if mode != "pass" && mode != "hold" {
        return std::ptr::null();
    }
    let config = Config { hold: mode == "hold", authority: authority.trim().as_bytes().to_vec() };
    Box::into_raw(Box::new(config)).cast::<c_void>().cast_const()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: made by `config_new`; Envoy destroys each config once.
        drop(unsafe { Box::from_raw(config.cast::<Config>().cast_mut()) });
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void, _envoy: *mut c_void) -> *const c_void {
    config
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_filter: *const c_void) {}

/// Whether a side's headers or body are held until its end.
fn held(filter: *const c_void, end_of_stream: bool) -> bool {
    !end_of_stream && config(filter).is_some_and(|config| config.hold)
}

/// # Safety
/// Envoy calls it with its stream's filter object, valid during the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    if let Some(config) = config(filter) {
        // SAFETY: the stream's filter object, valid during this hook; the buffers are ours.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                envoy,
                REQUEST_HEADERS,
                Buffer::of(CLUSTER_HEADER),
                Buffer::of(PLAIN_CLUSTER),
            );
            if !config.authority.is_empty() {
                envoy_dynamic_module_callback_http_set_header(
                    envoy,
                    REQUEST_HEADERS,
                    Buffer::of(b":authority"),
                    Buffer::of(&config.authority),
                );
            }
            envoy_dynamic_module_callback_http_clear_route_cache(envoy);
        }
    }
    headers(held(filter, end_of_stream))
}

fn headers(held: bool) -> u32 {
    if held {
        HEADERS_STOP_ITERATION
    } else {
        HEADERS_CONTINUE
    }
}

fn body(held: bool) -> u32 {
    if held {
        BODY_STOP_AND_BUFFER
    } else {
        BODY_CONTINUE
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body(held(filter, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    headers(held(filter, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    body(held(filter, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: *mut c_void,
    _filter: *const c_void,
) -> u32 {
    TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: *mut c_void,
    _filter: *const c_void,
) -> u32 {
    TRAILERS_CONTINUE
}

// Hooks Envoy requires of every HTTP filter module, for what a floor never does.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done() {}
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
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark() {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark() {}
