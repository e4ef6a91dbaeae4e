//! A thin, panic-free layer over the proxy-wasm ABI 0.2.1 host functions.
//!
//! The SDK's `hostcalls` end every call in `panic!("unexpected status")` and its trait methods
//! `.unwrap()` those results; with `panic = "abort"` that kills the worker's VM. Here every host
//! call returns `Result<_, HostError>` with the raw status, and the imports are declared with
//! plain integers (the SDK declares them returning its `Status` enum, so a status it does not
//! list, such as 6 `InvalidMemoryAccess`, is not even a valid value there).
//!
//! Names and signatures mirror proxy-wasm 0.2.5's `hostcalls.rs` exactly, so the module imports
//! the functions Envoy expects. Memory the host returns was allocated through the exported
//! [`proxy_on_memory_allocate`] (a boxed `[u8]` of exactly the requested size), so it is taken
//! over as `Vec::from_raw_parts(ptr, size, size)`.
//!
//! The module's own exports (the callbacks) are `host`'s; this layer only has the two that are
//! about memory and start-up: the allocator the host writes into, and the constructors.

use super::wire::{self, WireError};
use std::fmt;
use std::ptr::{null, null_mut};

/// A host call that did not succeed: the raw status the host returned, or a byte format that
/// could not be made or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostError {
    /// The host's status (proxy-wasm `WasmResult`).
    Status(u32),
    /// Our arguments could not be serialised, or the host's answer could not be read.
    Wire(WireError),
    /// A WASI call's errno (`random_get`).
    Errno(u32),
}

impl HostError {
    const NOT_FOUND: u32 = 1;
}

impl From<WireError> for HostError {
    fn from(error: WireError) -> Self {
        HostError::Wire(error)
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Status(status) => {
                // The names of proxy-wasm-cpp-host's `WasmResult`.
                let name = match status {
                    0 => "Ok",
                    1 => "NotFound",
                    2 => "BadArgument",
                    3 => "SerializationFailure",
                    4 => "ParseFailure",
                    5 => "BadExpression",
                    6 => "InvalidMemoryAccess",
                    7 => "Empty",
                    8 => "CasMismatch",
                    9 => "ResultMismatch",
                    10 => "InternalFailure",
                    11 => "BrokenConnection",
                    12 => "Unimplemented",
                    _ => "unknown",
                };
                write!(f, "host status {status} ({name})")
            }
            HostError::Wire(error) => write!(f, "host data: {error}"),
            HostError::Errno(errno) => write!(f, "WASI errno {errno}"),
        }
    }
}

const OK: u32 = 0;

fn check(status: u32) -> Result<(), HostError> {
    match status {
        OK => Ok(()),
        status => Err(HostError::Status(status)),
    }
}

/// Takes ownership of bytes the host returned. The host answers an empty value with a null
/// pointer (it allocates nothing for zero bytes).
///
/// # Safety
/// `data`, when not null, must come from `proxy_on_memory_allocate(size)` and not be owned by
/// anything else: that is what the host hands back from a successful call.
unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        // Nothing was allocated for an empty value (and were something, a capacity-0 Vec
        // would not free it either).
        return Vec::new();
    }
    // SAFETY: per the function's contract, `data` is a live `Box<[u8]>` of `size` bytes
    // allocated by the global allocator, which is exactly a Vec with length and capacity `size`.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// A header map (proxy-wasm `MapType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // `Map::RequestHeaders` names the ABI's map as it does
pub(crate) enum Map {
    RequestHeaders,
    ResponseHeaders,
    CallResponseHeaders,
}

impl Map {
    fn raw(self) -> u32 {
        match self {
            Map::RequestHeaders => 0,
            Map::ResponseHeaders => 2,
            Map::CallResponseHeaders => 6,
        }
    }
}

/// A byte buffer (proxy-wasm `BufferType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buffer {
    RequestBody,
    ResponseBody,
    CallResponseBody,
    PluginConfiguration,
}

impl Buffer {
    fn raw(self) -> u32 {
        match self {
            Buffer::RequestBody => 0,
            Buffer::ResponseBody => 1,
            Buffer::CallResponseBody => 4,
            Buffer::PluginConfiguration => 7,
        }
    }
}

// proxy-wasm ABI 0.2.1, as proxy-wasm 0.2.5 declares it, with its enums as the `u32`s they are.
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map_type: u32, return_map_data: *mut *mut u8, return_map_size: *mut usize) -> u32;
    fn proxy_set_header_map_pairs(map_type: u32, map_data: *const u8, map_size: usize) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_milliseconds: u32,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_define_metric(metric_type: u32, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_set_property(path_data: *const u8, path_size: usize, value_data: *const u8, value_size: usize) -> u32;
}

// WASI's random source (Envoy implements it; Rust's std imports it too). WASI's errno is a u16,
// an i32 in wasm, as the `wasi` crate declares it.
#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn random_get(buf: *mut u8, buf_len: usize) -> u16;
}

/// All pairs of a header map.
pub(crate) fn get_map(map: Map) -> Result<Vec<(String, Vec<u8>)>, HostError> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: the out-pointers are valid for writes; on success the host hands over `data`.
    let bytes = unsafe {
        check(proxy_get_header_map_pairs(map.raw(), &mut data, &mut size))?;
        take(data, size)
    };
    Ok(wire::parse_map(&bytes)?)
}

/// Replaces a whole header map.
pub(crate) fn set_map(map: Map, pairs: &[(&str, &[u8])]) -> Result<(), HostError> {
    let bytes = wire::serialize_map(pairs)?;
    // SAFETY: the pointer and length describe a live slice.
    check(unsafe { proxy_set_header_map_pairs(map.raw(), bytes.as_ptr(), bytes.len()) })
}

/// Sets a header, replacing every value it had (adds it when absent).
pub(crate) fn replace_map_value(map: Map, name: &str, value: &[u8]) -> Result<(), HostError> {
    // SAFETY: both pointer and length pairs describe live slices.
    check(unsafe { proxy_replace_header_map_value(map.raw(), name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Removes a header (absent is fine).
pub(crate) fn remove_map_value(map: Map, name: &str) -> Result<(), HostError> {
    // SAFETY: the pointer and length describe a live slice.
    check(unsafe { proxy_remove_header_map_value(map.raw(), name.as_ptr(), name.len()) })
}

/// Up to `size` bytes of a buffer from `start`; a buffer the host does not have is empty.
pub(crate) fn get_buffer(buffer: Buffer, start: usize, size: usize) -> Result<Vec<u8>, HostError> {
    // Nothing to read (a body's last, empty callback): no host call.
    if size == 0 {
        return Ok(Vec::new());
    }
    let mut data: *mut u8 = null_mut();
    let mut returned: usize = 0;
    // SAFETY: the out-pointers are valid for writes; on success the host hands over `data`.
    unsafe {
        match proxy_get_buffer_bytes(buffer.raw(), start, size, &mut data, &mut returned) {
            OK => Ok(take(data, returned)),
            HostError::NOT_FOUND => Ok(Vec::new()),
            status => Err(HostError::Status(status)),
        }
    }
}

/// Replaces `size` bytes of a buffer from `start` with `value` (`0, usize::MAX` replaces all).
pub(crate) fn set_buffer(buffer: Buffer, start: usize, size: usize, value: &[u8]) -> Result<(), HostError> {
    // SAFETY: the pointer and length describe a live slice.
    check(unsafe { proxy_set_buffer_bytes(buffer.raw(), start, size, value.as_ptr(), value.len()) })
}

/// A host property (`["request", "path"]`); `None` when the host has no such property. An
/// existing empty property is `Some` of nothing (the SDK answers `None` for both).
pub(crate) fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, HostError> {
    let path = wire::serialize_path(path)?;
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: the path is a live slice, the out-pointers are valid for writes; on success the
    // host hands over `data`.
    unsafe {
        match proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) {
            OK => Ok(Some(take(data, size))),
            HostError::NOT_FOUND => Ok(None),
            status => Err(HostError::Status(status)),
        }
    }
}

/// Answers the stream locally with this status, headers and body (no gRPC status).
pub(crate) fn send_local_response(status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Result<(), HostError> {
    let headers = wire::serialize_map(headers)?;
    // SAFETY: every pointer and length pair describes a live slice (the details are null, 0).
    // The ABI's order is details, body, headers.
    check(unsafe {
        proxy_send_local_response(
            u32::from(status),
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// Dispatches an HTTP call to a cluster on the current effective context (Envoy answers it
/// there, and cancels it when that context ends); the token its answer will carry.
pub(crate) fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
    timeout_ms: u32,
) -> Result<u32, HostError> {
    let headers = wire::serialize_map(headers)?;
    let trailers = wire::serialize_map(&[])?;
    let body_data = if body.is_empty() { null() } else { body.as_ptr() };
    let mut token: u32 = 0;
    // SAFETY: every pointer and length pair describes a live slice (or null, 0), the
    // out-pointer is valid for writes.
    check(unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body_data,
            body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    })?;
    Ok(token)
}

/// Makes later host calls act on this context (an HTTP stream's id, from its root's timer or
/// call answer).
pub(crate) fn set_effective_context(context_id: u32) -> Result<(), HostError> {
    // SAFETY: no pointers.
    check(unsafe { proxy_set_effective_context(context_id) })
}

/// A shared-data value and its CAS; `None` when the key is absent.
pub(crate) fn get_shared_data(key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    let mut cas: u32 = 0;
    // SAFETY: the key is a live slice, the out-pointers are valid for writes; on success the
    // host hands over `data`.
    unsafe {
        match proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) {
            OK => Ok(Some((take(data, size), cas))),
            HostError::NOT_FOUND => Ok(None),
            status => Err(HostError::Status(status)),
        }
    }
}

/// Stores a shared-data value. `cas` 0 writes unconditionally; any other value writes only if
/// the stored CAS still is that (else `HostError::is_cas_mismatch`).
pub(crate) fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
    // SAFETY: both pointer and length pairs describe live slices.
    check(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) })
}

/// The host's wall-clock time in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> Result<u64, HostError> {
    let mut nanos: u64 = 0;
    // SAFETY: the out-pointer is valid for writes.
    check(unsafe { proxy_get_current_time_nanoseconds(&mut nanos) })?;
    Ok(nanos / 1_000_000)
}

/// Sets the root context's timer period (0 stops it).
pub(crate) fn set_tick_period_ms(period: u32) -> Result<(), HostError> {
    // SAFETY: no pointers.
    check(unsafe { proxy_set_tick_period_milliseconds(period) })
}

/// A metric's kind (proxy-wasm `MetricType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// Defines (or finds) a metric by name; its id. Envoy files it under `wasmcustom.<name>`.
pub(crate) fn define_metric(kind: MetricType, name: &str) -> Result<u32, HostError> {
    let raw = match kind {
        MetricType::Counter => 0,
        MetricType::Gauge => 1,
        MetricType::Histogram => 2,
    };
    let mut id: u32 = 0;
    // SAFETY: the name is a live slice, the out-pointer is valid for writes.
    check(unsafe { proxy_define_metric(raw, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Adds `by` to a counter, or to a gauge (negative: subtracts).
pub(crate) fn increment_metric(id: u32, by: i64) -> Result<(), HostError> {
    // SAFETY: no pointers.
    check(unsafe { proxy_increment_metric(id, by) })
}

/// Records one value of a histogram.
pub(crate) fn record_metric(id: u32, value: u64) -> Result<(), HostError> {
    // SAFETY: no pointers.
    check(unsafe { proxy_record_metric(id, value) })
}

/// Sets a property of the current request (Envoy: filter state `wasm.<path>`, which the
/// access log reads with `%FILTER_STATE(wasm.<path>:PLAIN)%`).
pub(crate) fn set_property(path: &[&str], value: &[u8]) -> Result<(), HostError> {
    let path = wire::serialize_path(path)?;
    // SAFETY: both pointer and length pairs describe live slices.
    check(unsafe { proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len()) })
}

/// Resumes a request paused in a request callback (proxy-wasm `StreamType::HttpRequest`).
pub(crate) fn resume_request() -> Result<(), HostError> {
    // SAFETY: no pointers.
    check(unsafe { proxy_continue_stream(0) })
}

/// Fills `buf` from the host's random source (WASI `random_get`; its error is a WASI errno).
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<(), HostError> {
    // SAFETY: the pointer and length describe a live, writable slice.
    match unsafe { random_get(buf.as_mut_ptr(), buf.len()) } {
        0 => Ok(()),
        errno => Err(HostError::Errno(u32::from(errno))),
    }
}

/// Writes one line to the host's log at `level` (proxy-wasm `LogLevel`: 0 trace .. 5 critical).
pub(crate) fn log(level: u32, message: &str) -> Result<(), HostError> {
    // SAFETY: the pointer and length describe a live slice.
    check(unsafe { proxy_log(level, message.as_ptr(), message.len()) })
}

/// The host's log level for this plugin (proxy-wasm `LogLevel`: 0 trace .. 5 critical).
pub(crate) fn log_level() -> Result<u32, HostError> {
    let mut level: u32 = 0;
    // SAFETY: the out-pointer is valid for writes.
    check(unsafe { proxy_get_log_level(&mut level) })?;
    Ok(level)
}

/// Memory the host writes what it hands over into (header maps, buffers, properties): a boxed
/// `[u8]` of exactly `size` bytes, which [`take`] turns back into a `Vec`.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    Box::into_raw(Box::<[u8]>::new_uninit_slice(size)).cast::<u8>()
}

#[cfg(target_os = "wasi")]
extern "C" {
    /// Runs the module's static constructors (wasm-ld's; a WASI reactor calls it itself).
    fn __wasm_call_ctors();
}

/// Runs the module's static constructors, once, before anything else (from `_initialize`).
pub(crate) fn call_constructors() {
    #[cfg(target_os = "wasi")]
    // SAFETY: no arguments; called once, by the start-up export, before any other code runs.
    unsafe {
        __wasm_call_ctors();
    }
}
