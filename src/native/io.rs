//! The host as the exchange sees it from one hook (`NativeIo`): headers, bodies, calls,
//! metrics, the clock and the store shared by every worker thread.

use super::calls::{
    self,
    ffi::{self, EnvoyFilter},
};
use super::relay;
use super::ticker::{unix_ms, Ticker};
use super::ROOT;
use crate::entropy::Entropy;
use crate::exchange::metrics::{self, Kind};
use crate::exchange::{Dispatch, Io};
use crate::ports::{compare_and_set, Entries, Host, SharedStore};
use hashbrown::HashMap;
use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

/// One stream, as its thread's state knows it.
pub(super) struct Stream {
    pub(super) envoy: EnvoyFilter,
    /// The filter held a request (response) body chunk: Envoy buffers it, and later chunks are
    /// moved to that buffer so the core sees the whole body so far, as proxy-wasm shows it.
    pub(super) request_buffered: bool,
    pub(super) response_buffered: bool,
}

/// A call in flight: the worker's token, and whether it is the root's, carried by the stream
/// that started it (the ABI starts a worker thread's calls only on a stream's behalf, and
/// cancels them when the stream ends; the root's call is then lost, see `thread::Orphans`).
#[derive(Clone, Copy)]
pub(super) struct Call {
    pub(super) token: u32,
    pub(super) carried: bool,
}

/// The store every worker thread shares (proxy-wasm's shared data).
static STORE: OnceLock<Mutex<Entries>> = OnceLock::new();

pub(super) struct ProcessStore;

impl SharedStore for ProcessStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let store = STORE.get_or_init(Default::default).lock().ok()?;
        store.get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        let Ok(mut store) = STORE.get_or_init(Default::default).lock() else {
            return false;
        };
        compare_and_set(&mut store, key, value, cas)
    }
}

/// The host as the exchange sees it, from one hook.
pub(super) struct NativeIo<'a> {
    /// The stream of the hook.
    pub(super) current: Option<EnvoyFilter>,
    pub(super) current_id: u32,
    pub(super) metrics: &'a [Option<usize>],
    /// How the root's calls to the control plane are asked of the main thread.
    pub(super) relay: relay::Asker<'a>,
    pub(super) ticker: &'a Ticker,
    pub(super) streams: &'a HashMap<u32, Stream>,
    pub(super) calls: &'a mut HashMap<(u32, u64), Call>,
    pub(super) next_token: &'a mut u32,
    pub(super) random: &'a mut Entropy,
    pub(super) now_ms: Cell<Option<u64>>,
}

impl NativeIo<'_> {
    /// Records `value` in stat `name` (the core's flat name, read back into its family's labels),
    /// through the hook's stream: the ABI's per-stream metric calls.
    fn record_metric(&self, name: &str, record: calls::Record, value: u64) {
        let (Some(filter), Some((family, values))) = (self.current, metrics::family_of(name)) else {
            return;
        };
        if let Some(id) = self.metrics.get(family).copied().flatten() {
            calls::record_metric(filter, record, id, values.as_slice(), value);
        }
    }

    /// The live stream `id` of this thread; None once it ended (nothing is done for it).
    fn stream(&self, id: u32) -> Option<&Stream> {
        self.streams.get(&id)
    }

    fn filter(&self, id: u32) -> Option<EnvoyFilter> {
        self.stream(id).map(|s| s.envoy)
    }

    /// Which request body holds what the core has seen so far.
    pub(super) fn request_body_at(&self, id: u32) -> Option<(EnvoyFilter, u32)> {
        let stream = self.stream(id)?;
        let kind = if stream.request_buffered { ffi::BUFFERED_REQUEST_BODY } else { ffi::RECEIVED_REQUEST_BODY };
        Some((stream.envoy, kind))
    }

    pub(super) fn response_body_at(&self, id: u32) -> Option<(EnvoyFilter, u32)> {
        let stream = self.stream(id)?;
        let kind = if stream.response_buffered { ffi::BUFFERED_RESPONSE_BODY } else { ffi::RECEIVED_RESPONSE_BODY };
        Some((stream.envoy, kind))
    }
}

/// The first `size` bytes of a body (none when the stream is gone).
fn body_prefix(body: Option<(EnvoyFilter, u32)>, size: usize) -> Vec<u8> {
    let Some((filter, kind)) = body else {
        return Vec::new();
    };
    let mut bytes = calls::body(filter, kind);
    bytes.truncate(size);
    bytes
}

/// Replaces the first `size` bytes of `body` with `bytes`.
fn replace_body(filter: EnvoyFilter, body: u32, size: usize, bytes: &[u8]) {
    let whole = calls::body(filter, body);
    let rest = whole.get(size..).unwrap_or_default().to_vec();
    calls::drain_body(filter, body, whole.len());
    calls::append_body(filter, body, bytes);
    if !rest.is_empty() {
        calls::append_body(filter, body, &rest);
    }
}

/// The values `wanted` gives header `name`, in order.
fn values_of<'a>(wanted: &'a [(&'a str, &'a [u8])], name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    wanted.iter().filter(move |(n, _)| *n == name).map(|(_, v)| *v)
}

impl Io for NativeIo<'_> {
    fn host(&mut self) -> &mut dyn Host {
        self
    }

    fn request_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.filter(id).map(|f| calls::headers(f, ffi::REQUEST_HEADERS)).unwrap_or_default()
    }

    fn request_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        body_prefix(self.request_body_at(id), size)
    }

    fn set_request_headers(&mut self, id: u32, wanted: &[(&str, &[u8])]) {
        let Some(filter) = self.filter(id) else {
            return;
        };
        // Only what differs is written: each write is a header-map edit in Envoy, and most of
        // a request's headers pass unchanged. The edits are worked out on Envoy's own copy of
        // the headers (not copied again), then made.
        let (removed, changed_names) = calls::with_headers(filter, ffi::REQUEST_HEADERS, |current| {
            // Owned, and few: the map changes as they are removed.
            let mut removed: Vec<String> = Vec::new();
            for (name, _) in current {
                if !wanted.iter().any(|(n, _)| n.as_bytes() == *name) && !removed.iter().any(|r| r.as_bytes() == *name)
                {
                    removed.push(String::from_utf8_lossy(name).into_owned());
                }
            }
            let mut changed_names: Vec<&str> = Vec::new();
            for (i, (name, _)) in wanted.iter().enumerate() {
                if wanted.iter().take(i).any(|(n, _)| n == name) {
                    continue;
                }
                let have = current.iter().filter(|(n, _)| *n == name.as_bytes()).map(|(_, v)| *v);
                if !values_of(wanted, name).eq(have) {
                    changed_names.push(name);
                }
            }
            (removed, changed_names)
        });
        for name in &removed {
            calls::set_header(filter, ffi::REQUEST_HEADERS, name, b"");
        }
        for name in &changed_names {
            // The ABI has no empty value: a wanted header whose value is empty is removed.
            let mut values = values_of(wanted, name);
            if let Some(first) = values.next() {
                calls::set_header(filter, ffi::REQUEST_HEADERS, name, first);
            }
            for value in values {
                calls::add_header(filter, ffi::REQUEST_HEADERS, name, value);
            }
        }
        if !removed.is_empty() || !changed_names.is_empty() {
            calls::clear_route_cache(filter);
        }
    }

    fn set_request_header(&mut self, id: u32, name: &str, value: &str) {
        if let Some(filter) = self.filter(id) {
            calls::set_header(filter, ffi::REQUEST_HEADERS, name, value.as_bytes());
            calls::clear_route_cache(filter);
        }
    }

    fn set_request_body(&mut self, id: u32, size: usize, body: &[u8]) {
        if let Some((filter, kind)) = self.request_body_at(id) {
            replace_body(filter, kind, size, body);
        }
    }

    fn response_headers(&mut self, id: u32) -> Vec<(String, Vec<u8>)> {
        self.filter(id).map(|f| calls::headers(f, ffi::RESPONSE_HEADERS)).unwrap_or_default()
    }

    fn response_details(&mut self, id: u32) -> String {
        let details = self.filter(id).and_then(|f| calls::attribute(f, ffi::ATTRIBUTE_RESPONSE_CODE_DETAILS));
        String::from_utf8_lossy(&details.unwrap_or_default()).into_owned()
    }

    fn response_body(&mut self, id: u32, size: usize) -> Vec<u8> {
        body_prefix(self.response_body_at(id), size)
    }

    fn set_response_header(&mut self, id: u32, name: &str, value: Option<&str>) {
        if let Some(filter) = self.filter(id) {
            // The ABI has no empty value: `Some("")`, like `None`, removes the header.
            calls::set_header(filter, ffi::RESPONSE_HEADERS, name, value.unwrap_or_default().as_bytes());
        }
    }

    fn set_response_body(&mut self, id: u32, size: usize, body: &[u8]) {
        if let Some((filter, kind)) = self.response_body_at(id) {
            replace_body(filter, kind, size, body);
        }
    }

    fn dispatch(&mut self, id: u32, call: &Dispatch) -> Option<u32> {
        let token = *self.next_token;
        if id == ROOT && self.relay.relays(call) {
            // It outlives every stream: the main thread makes it (see `relay`).
            if !self.relay.ask(token, call) {
                return None;
            }
        } else {
            // The root's other calls ride on the stream of the running hook (see `Call`).
            let carrier = if id == ROOT { self.current_id } else { id };
            let Some(filter) = self.filter(carrier) else {
                calls::log(ffi::LOG_WARN, "a call of the gateway's has no live stream to start on");
                return None;
            };
            let callout = calls::callout(filter, call)?;
            self.calls.insert((carrier, callout), Call { token, carried: id == ROOT });
        }
        *self.next_token = token.wrapping_add(1).max(1);
        Some(token)
    }

    fn tick_every(&mut self, period_ms: u64) {
        // The hook's stream ticks from the end of the hook on (`with_worker`, `keep_awake`).
        self.ticker.set_period(period_ms);
    }

    fn access_log(&mut self, line: &[u8]) {
        if let Some(filter) = self.current {
            calls::set_filter_state(filter, ACCESS_LOG_STATE, line);
        }
    }

    fn publish_header(&mut self, id: u32, name: &str, value: &str) {
        if let Some(filter) = self.filter(id) {
            calls::set_filter_state(filter, &format!("wasm.{name}"), value.as_bytes());
        }
    }

    fn metric(&mut self, kind: Kind, name: &str, value: u64) {
        let record = match kind {
            // Adding 0 changes nothing (the wasm filter skips it too); a sample of 0 counts.
            Kind::Counter if value == 0 => return,
            Kind::Counter => calls::Record::AddToCounter,
            Kind::Histogram => calls::Record::Sample,
        };
        self.record_metric(name, record, value);
    }

    fn add_to_gauge(&mut self, name: &str, delta: i64) {
        let record = if delta < 0 { calls::Record::TakeFromGauge } else { calls::Record::AddToGauge };
        self.record_metric(name, record, delta.unsigned_abs());
    }
}

/// The filter state the shipped access log writes: the wasm build's key, so that one Envoy
/// config serves both builds.
const ACCESS_LOG_STATE: &str = "wasm.gateway_record";

impl Host for NativeIo<'_> {
    fn random(&mut self) -> u64 {
        self.random.next_u64(|bytes| {
            let read =
                std::fs::File::open("/dev/urandom").and_then(|mut file| std::io::Read::read_exact(&mut file, bytes));
            if let Err(error) = &read {
                // Never on Linux.
                log::error!("/dev/urandom could not be read ({error}): random draws are 0");
            }
            read.is_ok()
        })
    }

    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = unix_ms();
        self.now_ms.set(Some(now));
        now
    }

    fn store(&self) -> &dyn SharedStore {
        &ProcessStore
    }
}
