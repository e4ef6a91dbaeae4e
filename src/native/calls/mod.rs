//! Envoy's callbacks behind safe wrappers: with its declarations (`ffi`), the only module of the
//! native adapter with `unsafe`. Each wrapper is called from a hook of the filter it names, on
//! that filter's worker thread, with a filter pointer Envoy handed to that hook or to an earlier
//! hook of the same live filter (the adapter forgets a filter's pointer in its `destroy` hook).
//! What Envoy returns is copied before the wrapper returns, or lent to a closure the wrapper
//! calls, so no Envoy-owned pointer outlives the call.

pub(crate) mod ffi;

use crate::exchange::metrics::Keeping;
use crate::exchange::{self, CallAnswer, Dispatch};
use crate::request::headers;
use ffi::{Callbacks, EnvoyBuffer, EnvoyConfig, EnvoyFilter, EnvoyHeader, ModuleBuffer, ModuleHeader};
use std::ffi::c_void;
use std::sync::OnceLock;

/// Envoy's callbacks, resolved once when the module loads (`resolve`); every hook runs after.
static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

/// Finds every callback in the process; the name of the first one missing otherwise.
pub(crate) fn resolve() -> Result<(), &'static str> {
    let callbacks = Callbacks::resolve()?;
    let _ = CALLBACKS.set(callbacks);
    Ok(())
}

fn envoy() -> Option<&'static Callbacks> {
    CALLBACKS.get()
}

/// Bytes Envoy owns, copied. SAFETY (of the callers): `ptr` points to `length` readable bytes
/// or is null with any length (read as empty).
unsafe fn copied(ptr: *const u8, length: usize) -> Vec<u8> {
    // SAFETY: as the callers say.
    unsafe { bytes(ptr, length) }.to_vec()
}

/// Bytes Envoy owns, lent for as long as the caller says. SAFETY (of the callers): as `copied`,
/// and the bytes stay valid and unchanged while the slice is used.
unsafe fn bytes<'a>(ptr: *const u8, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        return &[];
    }
    // SAFETY: as the callers say.
    unsafe { std::slice::from_raw_parts(ptr, length) }
}

pub(crate) fn log(level: u32, message: &str) {
    let Some(envoy) = envoy() else {
        return;
    };
    // SAFETY: the message is read during the call only.
    unsafe { (envoy.log)(level, ModuleBuffer::of(message.as_bytes())) }
}

pub(crate) fn log_enabled(level: u32) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    // SAFETY: no pointer is passed.
    unsafe { (envoy.log_enabled)(level) }
}

/// Every header of `map` (lower-case names, pseudo-headers included); empty when the map does
/// not exist yet.
pub(crate) fn headers(filter: EnvoyFilter, map: u32) -> Vec<(String, Vec<u8>)> {
    // SAFETY: Envoy's entries, each with its own buffers, valid during this hook.
    raw_headers(filter, map).map(|raw| unsafe { copied_headers(&raw) }).unwrap_or_default()
}

/// What `f` makes of the headers of `map` (names and values as Envoy holds them, not copied:
/// `f` must not change the map).
pub(crate) fn with_headers<R>(
    filter: EnvoyFilter,
    map: u32,
    f: impl for<'a> FnOnce(&[(&'a [u8], &'a [u8])]) -> R,
) -> R {
    let raw = raw_headers(filter, map).unwrap_or_default();
    // SAFETY: as `headers`; the views live no longer than this call, and `f` changes no header.
    let views: Vec<(&[u8], &[u8])> =
        raw.iter().map(|h| unsafe { (bytes(h.key_ptr, h.key_length), bytes(h.value_ptr, h.value_length)) }).collect();
    f(&views)
}

/// Envoy's entries for the headers of `map`, pointing into its own buffers; none when it has
/// none or cannot say.
fn raw_headers(filter: EnvoyFilter, map: u32) -> Option<Vec<EnvoyHeader>> {
    let envoy = envoy()?;
    // SAFETY: a live filter on its thread.
    let count = unsafe { (envoy.get_headers_size)(filter, map) };
    if count == 0 {
        return None;
    }
    let empty = EnvoyHeader { key_ptr: std::ptr::null(), key_length: 0, value_ptr: std::ptr::null(), value_length: 0 };
    let mut raw = vec![empty; count];
    // SAFETY: `raw` has room for the `count` headers Envoy writes.
    unsafe { (envoy.get_headers)(filter, map, raw.as_mut_ptr()) }.then_some(raw)
}

/// Sets header `name` of `map` to `value` (replacing every value it had); an empty value
/// removes it (Envoy's rule).
pub(crate) fn set_header(filter: EnvoyFilter, map: u32, name: &str, value: &[u8]) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    let (key, value) = (ModuleBuffer::of(name.as_bytes()), ModuleBuffer::of(value));
    // SAFETY: a live filter on its thread; both buffers are copied during the call.
    unsafe { (envoy.set_header)(filter, map, key, value) }
}

/// Adds one more value of header `name` (a non-empty one).
pub(crate) fn add_header(filter: EnvoyFilter, map: u32, name: &str, value: &[u8]) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    let (key, value) = (ModuleBuffer::of(name.as_bytes()), ModuleBuffer::of(value));
    // SAFETY: as `set_header`.
    unsafe { (envoy.add_header)(filter, map, key, value) }
}

/// The request headers changed what routes match on: Envoy picks the route again.
pub(crate) fn clear_route_cache(filter: EnvoyFilter) {
    let Some(envoy) = envoy() else {
        return;
    };
    // SAFETY: a live filter on its thread.
    unsafe { (envoy.clear_route_cache)(filter) }
}

/// The bytes of `body` (a received chunk or what is buffered), copied.
pub(crate) fn body(filter: EnvoyFilter, body: u32) -> Vec<u8> {
    let Some(envoy) = envoy() else {
        return Vec::new();
    };
    // SAFETY: a live filter on its thread.
    let count = unsafe { (envoy.get_body_chunks_size)(filter, body) };
    if count == 0 {
        return Vec::new();
    }
    let mut chunks = vec![EnvoyBuffer { ptr: std::ptr::null(), length: 0 }; count];
    // SAFETY: `chunks` has room for the `count` slices Envoy writes.
    if !unsafe { (envoy.get_body_chunks)(filter, body, chunks.as_mut_ptr()) } {
        return Vec::new();
    }
    // SAFETY: Envoy's slices, valid until the body changes or the hook returns.
    unsafe { copied_chunks(&chunks) }
}

/// Envoy's headers, copied: each name as text (Envoy's are ASCII), each value as bytes. SAFETY
/// (of the callers): each entry's buffers are as `copied` takes them.
unsafe fn copied_headers(raw: &[EnvoyHeader]) -> Vec<(String, Vec<u8>)> {
    raw.iter()
        .map(|h| {
            // SAFETY: as the callers say.
            let (name, value) = unsafe { (copied(h.key_ptr, h.key_length), copied(h.value_ptr, h.value_length)) };
            // Names are ASCII (Envoy's codecs refuse others): the copy becomes the `String`.
            let name = String::from_utf8(name).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            (name, value)
        })
        .collect()
}

/// Envoy's chunks of a body, copied one after the other. SAFETY (of the callers): each chunk is
/// as `copied` takes it.
unsafe fn copied_chunks(chunks: &[EnvoyBuffer]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for chunk in chunks {
        // SAFETY: as the callers say.
        bytes.extend(unsafe { copied(chunk.ptr, chunk.length) });
    }
    bytes
}

/// Envoy's array of `length` items at `items`, or none when it is null. SAFETY (of the callers):
/// a non-null `items` points to `length` items, valid while the slice is used.
unsafe fn array<'a, T>(items: *const T, length: usize) -> &'a [T] {
    if items.is_null() {
        return &[];
    }
    // SAFETY: as the callers say.
    unsafe { std::slice::from_raw_parts(items, length) }
}

pub(crate) fn body_size(filter: EnvoyFilter, body: u32) -> usize {
    let Some(envoy) = envoy() else {
        return 0;
    };
    // SAFETY: a live filter on its thread.
    unsafe { (envoy.get_body_size)(filter, body) }
}

pub(crate) fn append_body(filter: EnvoyFilter, body: u32, data: &[u8]) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    // SAFETY: a live filter on its thread; `data` is copied during the call.
    unsafe { (envoy.append_body)(filter, body, ModuleBuffer::of(data)) }
}

pub(crate) fn drain_body(filter: EnvoyFilter, body: u32, bytes: usize) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    // SAFETY: a live filter on its thread.
    unsafe { (envoy.drain_body)(filter, body, bytes) }
}

/// Answers the stream locally (Envoy's local reply, `details` its response code details).
pub(crate) fn send_response(filter: EnvoyFilter, status: u16, headers: &[(&str, &[u8])], body: &[u8], details: &str) {
    let Some(envoy) = envoy() else {
        return;
    };
    let mut headers: Vec<ModuleHeader> = headers.iter().map(|(n, v)| ModuleHeader::of(n, v)).collect();
    // SAFETY: a live filter on its thread; headers, body and details are copied during the call.
    unsafe {
        (envoy.send_response)(
            filter,
            u32::from(status),
            headers.as_mut_ptr(),
            headers.len(),
            ModuleBuffer::of(body),
            ModuleBuffer::of(details.as_bytes()),
        )
    }
}

pub(crate) fn continue_decoding(filter: EnvoyFilter) {
    let Some(envoy) = envoy() else {
        return;
    };
    // SAFETY: a live filter on its thread.
    unsafe { (envoy.continue_decoding)(filter) }
}

/// Starts a call on behalf of the stream (cancelled by Envoy when the stream ends); its id,
/// answered in the `http_callout_done` hook, or None when Envoy could not start it.
pub(crate) fn callout(filter: EnvoyFilter, call: &Dispatch) -> Option<u64> {
    let envoy = envoy()?;
    // SAFETY: a live filter on its thread; `id` is written by Envoy; the rest is copied.
    start_callout(call, |id, cluster, headers, length, body, timeout_ms| unsafe {
        (envoy.callout)(filter, id, cluster, headers, length, body, timeout_ms)
    })
}

/// Starts a call of the config's, from the main thread (it outlives every stream); its id,
/// answered in the `config_http_callout_done` hook, or None when Envoy could not start it.
pub(crate) fn config_callout(config: EnvoyConfig, call: &Dispatch) -> Option<u64> {
    let envoy = envoy()?;
    // SAFETY: the config Envoy passed to the running hook, on the main thread; `id` is written
    // by Envoy; the rest is copied.
    start_callout(call, |id, cluster, headers, length, body, timeout_ms| unsafe {
        (envoy.config_callout)(config, id, cluster, headers, length, body, timeout_ms)
    })
}

/// A call in the ABI's terms, started by `start`.
fn start_callout(
    call: &Dispatch,
    start: impl FnOnce(*mut u64, ModuleBuffer, *mut ModuleHeader, usize, ModuleBuffer, u64) -> u32,
) -> Option<u64> {
    let mut headers: Vec<ModuleHeader> = call.headers.iter().map(|(n, v)| ModuleHeader::of(n, v.as_bytes())).collect();
    let mut id = 0u64;
    let started = start(
        &mut id,
        ModuleBuffer::of(call.cluster.as_bytes()),
        headers.as_mut_ptr(),
        headers.len(),
        ModuleBuffer::of(&call.body),
        call.timeout_ms,
    );
    (started == ffi::CALLOUT_STARTED).then_some(id)
}

/// A scheduler Envoy made for a stream, owned here: committed from any thread, deleted once
/// (on drop). Its owner (the ticker) keeps it under a lock, so no commit races its deletion.
pub(crate) struct Scheduler(ffi::Scheduler);

// SAFETY: Envoy's scheduler is made to be committed from other threads (it posts to the
// stream's dispatcher); the pointer itself is only read.
unsafe impl Send for Scheduler {}

impl Scheduler {
    /// A scheduler of the stream's, made on its worker thread during one of its hooks.
    pub(crate) fn new(filter: EnvoyFilter) -> Option<Scheduler> {
        let envoy = envoy()?;
        // SAFETY: a live filter on its thread.
        let scheduler = unsafe { (envoy.scheduler_new)(filter) };
        (!scheduler.is_null()).then_some(Scheduler(scheduler))
    }

    /// Runs the stream's `scheduled` hook soon with `event`, on its worker thread (nothing
    /// once the stream is gone).
    pub(crate) fn commit(&self, event: u64) {
        let Some(envoy) = envoy() else {
            return;
        };
        // SAFETY: made by `new` and not yet deleted (that takes `self`).
        unsafe { (envoy.scheduler_commit)(self.0, event) }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let Some(envoy) = envoy() else {
            return;
        };
        // SAFETY: made by `new`; dropped once. Envoy allows it after the stream is gone.
        unsafe { (envoy.scheduler_delete)(self.0) }
    }
}

/// A scheduler Envoy made for a filter config, owned by it: committed from any thread, deleted
/// once (on drop, with the config).
#[cfg(not(test))]
pub(crate) struct ConfigScheduler(ffi::Scheduler);

// SAFETY: as `Scheduler`'s: Envoy's config scheduler posts to the main thread's dispatcher from
// any thread, and the pointer itself is only read.
#[cfg(not(test))]
unsafe impl Send for ConfigScheduler {}
// SAFETY: `commit` takes `&self` from several threads; Envoy's commit is made for that.
#[cfg(not(test))]
unsafe impl Sync for ConfigScheduler {}

#[cfg(not(test))]
impl ConfigScheduler {
    /// A scheduler of the config's, made in its `config_new` hook on the main thread.
    pub(crate) fn new(config: EnvoyConfig) -> Option<ConfigScheduler> {
        let envoy = envoy()?;
        // SAFETY: the config Envoy passed to the running `config_new` hook.
        let scheduler = unsafe { (envoy.config_scheduler_new)(config) };
        (!scheduler.is_null()).then_some(ConfigScheduler(scheduler))
    }

    /// Runs the config's `scheduled` hook soon, on the main thread.
    pub(crate) fn commit(&self) {
        let Some(envoy) = envoy() else {
            return;
        };
        // SAFETY: made by `new` and not yet deleted (that takes `self`).
        unsafe { (envoy.config_scheduler_commit)(self.0, 0) }
    }
}

#[cfg(not(test))]
impl Drop for ConfigScheduler {
    fn drop(&mut self) {
        let Some(envoy) = envoy() else {
            return;
        };
        // SAFETY: made by `new`; dropped once, with the config.
        unsafe { (envoy.config_scheduler_delete)(self.0) }
    }
}

/// The unit tests' config scheduler, without Envoy: it counts its commits, for a test to wait on
/// the main thread's `scheduled` hook that Envoy would run.
#[cfg(test)]
pub(crate) struct ConfigScheduler(std::sync::Arc<Commits>);

#[cfg(test)]
#[derive(Default)]
pub(crate) struct Commits {
    count: std::sync::Mutex<usize>,
    changed: std::sync::Condvar,
}

#[cfg(test)]
impl Commits {
    /// How many commits there were, once there were `count` or `timeout` passed.
    pub(crate) fn after(&self, count: usize, timeout: std::time::Duration) -> usize {
        let commits = self.count.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let waited = self.changed.wait_timeout_while(commits, timeout, |commits| *commits < count);
        waited.map_or(0, |(commits, _)| *commits)
    }
}

#[cfg(test)]
impl ConfigScheduler {
    pub(crate) fn new(_config: EnvoyConfig) -> Option<ConfigScheduler> {
        Some(ConfigScheduler(std::sync::Arc::default()))
    }

    pub(crate) fn commit(&self) {
        *self.0.count.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        self.0.changed.notify_all();
    }

    pub(crate) fn commits(&self) -> std::sync::Arc<Commits> {
        std::sync::Arc::clone(&self.0)
    }
}

/// Stores `value` in the stream's filter state under `key` (as a string Envoy's access log and
/// local reply formatters read with `%FILTER_STATE(key:PLAIN)%`).
pub(crate) fn set_filter_state(filter: EnvoyFilter, key: &str, value: &[u8]) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    // SAFETY: a live filter on its thread; key and value are copied during the call.
    unsafe { (envoy.set_filter_state_bytes)(filter, ModuleBuffer::of(key.as_bytes()), ModuleBuffer::of(value)) }
}

/// What a metric does with a value.
#[derive(Clone, Copy)]
pub(crate) enum Record {
    AddToCounter,
    Sample,
    AddToGauge,
    TakeFromGauge,
}

/// Defines a family of stats with its label names in `config` (from its `config_new` hook,
/// before Envoy freezes the config's stats); its id, or None when Envoy refused.
pub(crate) fn define_metric(config: EnvoyConfig, keeping: Keeping, name: &str, labels: &[&str]) -> Option<usize> {
    let envoy = envoy()?;
    let define = match keeping {
        Keeping::Counter => envoy.define_counter,
        Keeping::Histogram => envoy.define_histogram,
        Keeping::Gauge => envoy.define_gauge,
    };
    let labels: Vec<ModuleBuffer> = labels.iter().map(|l| ModuleBuffer::of(l.as_bytes())).collect();
    let mut id = 0;
    // SAFETY: the config Envoy passed to the running `config_new` hook; the name and the label
    // array are copied during the call; `id` is written by Envoy.
    let result = unsafe { define(config, ModuleBuffer::of(name.as_bytes()), labels.as_ptr(), labels.len(), &mut id) };
    (result == ffi::METRICS_SUCCESS).then_some(id)
}

/// The most label values a metric update carries (the gateway's families have at most four).
const MAX_METRIC_LABELS: usize = 8;

/// Records `value` in stat `id` of the filter's config, with one value per label of its family.
pub(crate) fn record_metric(filter: EnvoyFilter, record: Record, id: usize, values: &[&str], value: u64) -> bool {
    let Some(envoy) = envoy() else {
        return false;
    };
    let callback = match record {
        Record::AddToCounter => envoy.increment_counter,
        Record::Sample => envoy.record_histogram_value,
        Record::AddToGauge => envoy.increment_gauge,
        Record::TakeFromGauge => envoy.decrement_gauge,
    };
    // On the stack: a metric update is made several times a request.
    let mut buffers = [ModuleBuffer::of(&[]); MAX_METRIC_LABELS];
    if values.len() > buffers.len() {
        return false;
    }
    for (buffer, v) in buffers.iter_mut().zip(values) {
        *buffer = ModuleBuffer::of(v.as_bytes());
    }
    // SAFETY: a live filter on its thread; `id` was defined in its config; the values are
    // copied during the call, and the first `values.len()` buffers hold them.
    let result = unsafe { callback(filter, id, buffers.as_ptr(), values.len(), value) };
    result == ffi::METRICS_SUCCESS
}

/// A string attribute of the stream (e.g. `response.code_details`); None when unavailable.
pub(crate) fn attribute(filter: EnvoyFilter, attribute: u32) -> Option<Vec<u8>> {
    let envoy = envoy()?;
    let mut out = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
    // SAFETY: a live filter on its thread; `out` is written by Envoy.
    if !unsafe { (envoy.get_attribute_string)(filter, attribute, &mut out) } {
        return None;
    }
    // SAFETY: Envoy's buffer, valid during this hook.
    Some(unsafe { copied(out.ptr, out.length) })
}

/// An object of the module's, as the pointer Envoy keeps for it (a config or a stream's filter).
pub(crate) fn into_module<T>(object: T) -> *const c_void {
    Box::into_raw(Box::new(object)).cast::<c_void>().cast_const()
}

/// The module's object behind a pointer Envoy hands back. SAFETY (of the callers, the hooks):
/// `pointer` is null or was made by `into_module::<T>` and not yet given to `drop_module`; Envoy
/// calls no hook with a pointer after the hook that destroys it.
pub(crate) fn module_ref<'a, T>(pointer: *const c_void) -> Option<&'a T> {
    // SAFETY: as above.
    unsafe { pointer.cast::<T>().as_ref() }
}

/// Frees the module's object of `pointer` (from its destroy hook, which Envoy calls once).
pub(crate) fn drop_module<T>(pointer: *const c_void) {
    if !pointer.is_null() {
        // SAFETY: made by `into_module::<T>`; the destroy hooks run once per object.
        drop(unsafe { Box::from_raw(pointer.cast::<T>().cast_mut()) });
    }
}

/// Bytes Envoy passed to a hook, copied.
pub(crate) fn hook_bytes(buffer: EnvoyBuffer) -> Vec<u8> {
    // SAFETY: a buffer Envoy passed to the running hook, valid during it.
    unsafe { copied(buffer.ptr, buffer.length) }
}

/// A callout's answer as the done hook receives it, copied. The pointers are the hook's
/// arguments: each null or Envoy's array of the given length, valid during the hook.
pub(crate) fn callout_answer(
    result: u32,
    headers: *const EnvoyHeader,
    headers_length: usize,
    chunks: *const EnvoyBuffer,
    chunks_length: usize,
) -> CallAnswer {
    if result != ffi::CALLOUT_SUCCEEDED {
        return CallAnswer::FAILED;
    }
    // SAFETY: Envoy's arrays of `headers_length` headers and `chunks_length` slices (or null),
    // each header's and slice's buffers valid during the hook.
    let (headers, body) =
        unsafe { (copied_headers(array(headers, headers_length)), copied_chunks(array(chunks, chunks_length))) };
    let status = exchange::parse_status(headers::find(&headers, ":status"));
    CallAnswer { status, headers, body }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn header(name: &[u8], value: &[u8]) -> EnvoyHeader {
        EnvoyHeader {
            key_ptr: name.as_ptr(),
            key_length: name.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }

    fn chunk(bytes: &[u8]) -> EnvoyBuffer {
        EnvoyBuffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }

    #[test]
    fn a_calls_answer_is_its_headers_in_order_its_chunks_joined_and_its_status() {
        let headers = [header(b":status", b"429"), header(b"retry-after", b"2"), header(b"x-\xffname", b"\x00\xff")];
        let chunks = [chunk(b"{\"error\": "), chunk(b""), chunk(b"{}}")];
        let answer = callout_answer(ffi::CALLOUT_SUCCEEDED, headers.as_ptr(), 3, chunks.as_ptr(), 3);
        assert_eq!(answer.status, 429);
        let expected: Vec<(String, Vec<u8>)> = vec![
            (":status".into(), b"429".to_vec()),
            ("retry-after".into(), b"2".to_vec()),
            ("x-\u{fffd}name".into(), b"\x00\xff".to_vec()),
        ];
        assert_eq!(answer.headers, expected);
        assert_eq!(answer.body, b"{\"error\": {}}");
    }

    #[test]
    fn a_failed_call_null_arrays_and_null_buffers_read_as_nothing() {
        let headers = [header(b":status", b"200")];
        let failed = callout_answer(1, headers.as_ptr(), 1, std::ptr::null(), 4);
        assert_eq!((failed.status, failed.headers.len(), failed.body.len()), (0, 0, 0));
        let bare = callout_answer(ffi::CALLOUT_SUCCEEDED, std::ptr::null(), 3, std::ptr::null(), 2);
        assert_eq!((bare.status, bare.headers.len(), bare.body.len()), (0, 0, 0), "no :status: 0");
        let nulls =
            [EnvoyHeader { key_ptr: std::ptr::null(), key_length: 7, value_ptr: std::ptr::null(), value_length: 3 }];
        let null_chunks = [EnvoyBuffer { ptr: std::ptr::null(), length: 5 }];
        let answer = callout_answer(ffi::CALLOUT_SUCCEEDED, nulls.as_ptr(), 1, null_chunks.as_ptr(), 1);
        assert_eq!(answer.headers, vec![(String::new(), Vec::new())]);
        assert!(answer.body.is_empty());
    }

    #[test]
    fn a_config_is_its_bytes() {
        let config = br#"{"api_keys": ["gw-key"]}"#;
        assert_eq!(hook_bytes(chunk(config)), config);
        assert!(hook_bytes(EnvoyBuffer { ptr: std::ptr::null(), length: 9 }).is_empty());
    }

    /// The `native_abi` fuzz target's reference decoding holds on inputs that reach each branch:
    /// a 200 with chunks and a config, a `+503`, a failed call, null arrays, status not a number.
    #[test]
    fn the_abi_fuzz_target_takes_these_inputs() {
        let with = |status: &[u8]| {
            let mut input = vec![0, 0, 2, 0, 7];
            input.extend(b":status");
            input.push(u8::try_from(status.len()).unwrap());
            input.extend(status);
            // A header whose value is null, then two chunks, the second null.
            input.extend(b"\x02\x01x\x01y");
            input.extend(b"\x02\x01\x03\x00{}}\x00\x02\x00ab");
            input.extend(br#"{"api_keys": ["gw-key"]}"#);
            input
        };
        for status in [&b"200"[..], b"+503", b"65536", b"2x", b"", b"-1"] {
            crate::fuzz::native_abi(&with(status));
        }
        let mut failed = with(b"200");
        failed[0] = 0xff;
        crate::fuzz::native_abi(&failed);
        let mut nulls = with(b"200");
        nulls[1] = 7;
        crate::fuzz::native_abi(&nulls);
    }
}
