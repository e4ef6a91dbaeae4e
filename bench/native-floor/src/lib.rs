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
//! - `edit` (`native_floor_edit`): the same as `hold`, and every call into Envoy the gateway makes
//!   for the benchmark's provider-header request, with fixed values and none of its logic: it
//!   reads the request's headers, removes the three `x-gateway-*` headers the gateway consumes,
//!   reads the answer's headers and adds the gateway's three, and at the answer's end adds to
//!   three labelled counters, records a labelled histogram and leaves an access-log record of the
//!   gateway's size in the filter state. What Envoy spends on that is the least any module that
//!   keeps the gateway's contract with Envoy can cost; what the gateway spends over it is its own.
//!
//! No state per stream: each filter's pointer is its config's.

use std::ffi::c_void;

/// The ABI version these declarations follow (Envoy 1.40's, as the gateway's module).
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// The route's `cluster_header` and the gateway's cluster for plain-HTTP custom hosts.
const CLUSTER_HEADER: &[u8] = b"x-gateway-upstream-cluster";
const PLAIN_CLUSTER: &[u8] = b"gateway_upstream_plain";

const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const HEADERS_CONTINUE: u32 = 0;
const HEADERS_STOP_ITERATION: u32 = 1;
const BODY_CONTINUE: u32 = 0;
const BODY_STOP_AND_BUFFER: u32 = 1;
const TRAILERS_CONTINUE: u32 = 0;

/// The request headers the gateway consumes (the benchmark sends them), and the answer headers it
/// adds, with values of their usual length.
const CONSUMED: [&[u8]; 3] = [b"x-gateway-api-key", b"x-gateway-provider", b"x-gateway-custom-host"];
const ADDED: [(&[u8], &[u8]); 3] = [
    (b"x-gateway-trace-id", b"0193a5c4-1b2e-7c3d-8e4f-a1b2c3d4e5f6"),
    (b"x-gateway-provider", b"openai"),
    (b"x-gateway-cache-status", b"DISABLED"),
];
/// The gateway's access-log record for the benchmark's request (its key and a record of its size).
const ACCESS_LOG_STATE: &[u8] = b"wasm.gateway_record";
const ACCESS_LOG_RECORD: &[u8] = br#"{"trace_id":"0193a5c4-1b2e-7c3d-8e4f-a1b2c3d4e5f6","span_id":null,"parent_span_id":null,"span_name":null,"metadata":null,"method":"POST","path":"/v1/chat/completions","provider":"openai","model":"bench-model","target":"","attempts":1,"retries":0,"fallbacks":0,"cache_status":"DISABLED","status":200,"stream":false,"prompt_tokens":9,"completion_tokens":5,"duration_ms":0,"time_to_first_token_ms":null,"error_code":null,"workspace":"default"}"#;

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

/// A header as Envoy lends it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Header {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

// Envoy's binary exports these; the module is loaded into it.
extern "C" {
    fn envoy_dynamic_module_callback_http_set_header(filter: *mut c_void, map: u32, key: Buffer, value: Buffer)
        -> bool;
    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: *mut c_void);
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: *mut c_void, map: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(filter: *mut c_void, map: u32, out: *mut Header) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: *mut c_void,
        key: Buffer,
        value: Buffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: *mut c_void,
        name: Buffer,
        labels: *const Buffer,
        labels_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: *mut c_void,
        name: Buffer,
        labels: *const Buffer,
        labels_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: *mut c_void,
        id: usize,
        values: *const Buffer,
        values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: *mut c_void,
        id: usize,
        values: *const Buffer,
        values_length: usize,
        value: u64,
    ) -> u32;
}

#[derive(PartialEq)]
enum Mode {
    Pass,
    Hold,
    Edit,
}

struct Config {
    mode: Mode,
    authority: Vec<u8>,
    metrics: Metrics,
}

/// The edit floor's metrics, as the gateway defines them (ids given by Envoy).
#[derive(Default)]
struct Metrics {
    requests: usize,
    tokens: usize,
    duration: usize,
}

/// A define callback's shape (counters and histograms alike) and an update's.
type Define = unsafe extern "C" fn(*mut c_void, Buffer, *const Buffer, usize, *mut usize) -> u32;
type Update = unsafe extern "C" fn(*mut c_void, usize, *const Buffer, usize, u64) -> u32;

/// Defines metric `name` with `labels` on `envoy`'s config; its id.
fn define<const N: usize>(define: Define, envoy: *mut c_void, name: &[u8], labels: [&[u8]; N]) -> usize {
    let labels = labels.map(Buffer::of);
    let mut id = 0;
    // SAFETY: Envoy's config object, valid during `config_new`; the buffers are ours and outlive
    // the call; `id` is written by Envoy.
    unsafe { define(envoy, Buffer::of(name), labels.as_ptr(), N, &mut id) };
    id
}

/// Adds or records `value` in metric `id` with label `values`, through the stream `envoy`. The
/// values stay on the stack, as the gateway's native host keeps them.
fn update<const N: usize>(update: Update, envoy: *mut c_void, id: usize, values: [&[u8]; N], value: u64) {
    let values = values.map(Buffer::of);
    // SAFETY: the stream's filter object, valid during the hook; the buffers are ours and outlive
    // the call.
    unsafe { update(envoy, id, values.as_ptr(), N, value) };
}

impl Metrics {
    /// Defines the gateway's request counter, token counter and duration histogram on `envoy`'s
    /// config, with their labels.
    fn define(envoy: *mut c_void) -> Metrics {
        let counter: Define = envoy_dynamic_module_callback_http_filter_config_define_counter;
        let histogram: Define = envoy_dynamic_module_callback_http_filter_config_define_histogram;
        let requests = [&b"provider"[..], b"status_class", b"cache_status", b"model"];
        let tokens = [&b"provider"[..], b"gen_ai_token_type", b"model"];
        Metrics {
            requests: define(counter, envoy, b"gen_ai_gateway_requests_total", requests),
            tokens: define(counter, envoy, b"gen_ai_client_token_usage_total", tokens),
            duration: define(histogram, envoy, b"gen_ai_server_request_duration", [b"provider", b"model"]),
        }
    }

    /// What the gateway records at a request's end: the request, its input and output tokens,
    /// its duration.
    fn record(&self, envoy: *mut c_void) {
        let add: Update = envoy_dynamic_module_callback_http_filter_increment_counter;
        let sample: Update = envoy_dynamic_module_callback_http_filter_record_histogram_value;
        update(add, envoy, self.requests, [b"openai", b"2xx", b"disabled", b"bench-model"], 1);
        update(add, envoy, self.tokens, [b"openai", b"input", b"bench-model"], 9);
        update(add, envoy, self.tokens, [b"openai", b"output", b"bench-model"], 5);
        update(sample, envoy, self.duration, [b"openai", b"bench-model"], 1);
    }
}

/// Reads a header map whole, as the gateway does once per side (the values are not used).
///
/// # Safety
/// `envoy` is the stream's filter object, valid during the hook.
unsafe fn read_headers(envoy: *mut c_void, map: u32) {
    // SAFETY: as the function's; `out` has room for the size Envoy gave.
    unsafe {
        let size = envoy_dynamic_module_callback_http_get_headers_size(envoy, map);
        let empty = Header { key_ptr: std::ptr::null(), key_length: 0, value_ptr: std::ptr::null(), value_length: 0 };
        let mut out = vec![empty; size];
        envoy_dynamic_module_callback_http_get_headers(envoy, map, out.as_mut_ptr());
    }
}

fn edits<'a>(filter: *const c_void) -> Option<&'a Config> {
    config(filter).filter(|config| config.mode == Mode::Edit)
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
    envoy: *mut c_void,
    _name: Buffer,
    config: Buffer,
) -> *const c_void {
    // SAFETY: Envoy's buffer, valid during this hook.
    let bytes =
        if config.ptr.is_null() { &[][..] } else { unsafe { std::slice::from_raw_parts(config.ptr, config.length) } };
    let text = String::from_utf8_lossy(bytes);
    let (mode, authority) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
    let mode = match mode {
        "pass" => Mode::Pass,
        "hold" => Mode::Hold,
        "edit" => Mode::Edit,
        _ => return std::ptr::null(),
    };
    let metrics = if mode == Mode::Edit { Metrics::define(envoy) } else { Metrics::default() };
    let config = Config { mode, authority: authority.trim().as_bytes().to_vec(), metrics };
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
    !end_of_stream && config(filter).is_some_and(|config| config.mode != Mode::Pass)
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
            if config.mode == Mode::Edit {
                read_headers(envoy, REQUEST_HEADERS);
                for name in CONSUMED {
                    // An empty value removes the header.
                    envoy_dynamic_module_callback_http_set_header(
                        envoy,
                        REQUEST_HEADERS,
                        Buffer::of(name),
                        Buffer::of(b""),
                    );
                }
            }
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

/// # Safety
/// Envoy calls it with its stream's filter object, valid during the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    if edits(filter).is_some() {
        // SAFETY: the stream's filter object, valid during this hook; the buffers are ours.
        unsafe {
            read_headers(envoy, RESPONSE_HEADERS);
            for (name, value) in ADDED {
                envoy_dynamic_module_callback_http_set_header(
                    envoy,
                    RESPONSE_HEADERS,
                    Buffer::of(name),
                    Buffer::of(value),
                );
            }
        }
    }
    headers(held(filter, end_of_stream))
}

/// # Safety
/// Envoy calls it with its stream's filter object, valid during the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    if let Some(config) = edits(filter).filter(|_| end_of_stream) {
        config.metrics.record(envoy);
        // SAFETY: the stream's filter object, valid during this hook; the buffers are ours.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                envoy,
                Buffer::of(ACCESS_LOG_STATE),
                Buffer::of(ACCESS_LOG_RECORD),
            );
        }
    }
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
