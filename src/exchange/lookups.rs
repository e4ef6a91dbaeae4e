//! Control-plane reads as tasks of the exchange: a request that needs an entry is held, one
//! dispatched call per entry (per worker) fetches it for every request waiting, and each
//! waiting request is processed again with the entry known. What was read is kept in shared
//! data (for every worker, fresh for `fresh_ms`) and in the request (so its progress never
//! depends on shared data); when the control plane cannot answer, an entry read within
//! `grace_ms` still serves.

use super::waiters::{Fetch, Waiter};
use super::{metrics, unroute, CallAnswer, Dispatch, Env, Io, RawHeaders};
use crate::catalog::{self, Catalog, Entry, Kind, Ref, Resolve, MAX_LOOKUPS};
use crate::errors::GatewayError;
use crate::pipeline::{self, Pending, Started};
use crate::ports::Host;
use crate::settings::{ControlPlaneSettings, Settings};
use hashbrown::HashMap;

/// The control-plane entries one request read (so its progress never depends on shared
/// data), and how many reads it waited for.
#[derive(Default)]
pub(super) struct Reads {
    known: HashMap<Ref, Entry>,
    waited: u32,
}

/// Where reading an entry left a request.
pub(super) enum Read {
    /// Held until the entry arrives (see [`Stalled`]).
    Waiting,
    /// The entry is known now (read within the grace period): the request is processed again.
    Known,
}

impl Reads {
    /// The pipeline's start of a request (finished at once when its whole `body` is in) with
    /// the entries it can know; and the caller's workspace, once its key is known.
    pub(super) fn start(
        &self,
        env: &mut Env,
        raw: &RawHeaders,
        body: Option<&[u8]>,
    ) -> (Result<Started, GatewayError>, Option<String>) {
        let mut known = Known::new(&self.known, &mut env.tasks.recent);
        let mut catalog = Catalog::new(env.settings, &mut known);
        let started = match pipeline::start(env.settings, raw, env.io.host(), &mut catalog) {
            Ok(Started::NeedsBody(pending)) => match body {
                // A JSON endpoint whose body is in (or that was called without one).
                Some(bytes) => pipeline::finish(env.settings, pending, bytes, env.io.host(), &mut catalog),
                None => Ok(Started::NeedsBody(pending)),
            },
            started => started,
        };
        let workspace = (catalog.enabled() && !catalog.workspace.is_empty()).then(|| catalog.workspace.clone());
        (started, workspace)
    }

    /// The pipeline's finish of a request whose body arrived.
    pub(super) fn finish(&self, env: &mut Env, pending: Pending, body: &[u8]) -> Result<Started, GatewayError> {
        let mut known = Known::new(&self.known, &mut env.tasks.recent);
        let mut catalog = Catalog::new(env.settings, &mut known);
        pipeline::finish(env.settings, pending, body, env.io.host(), &mut catalog)
    }

    /// Reads entry `r` for the request with headers `raw`: one read per entry serves every
    /// request of this worker waiting for it. Err: the request's answer.
    pub(super) fn read(&mut self, env: &mut Env, r: Ref, raw: &RawHeaders) -> Result<Read, GatewayError> {
        let Some(cp) = &env.settings.control_plane else {
            return Err(catalog::unavailable(&r, "not configured"));
        };
        self.waited += 1;
        if self.waited > MAX_LOOKUPS {
            return Err(GatewayError::new(500, "api_error", "the request needs too many control-plane reads"));
        }
        unroute(env, raw);
        let fetch = Fetch::Lookup(r.clone());
        if env.tasks.waiters.join(&fetch, || Waiter::request(env.id)) {
            return Ok(Read::Waiting);
        }
        let id = env.id;
        if super::start_fetch(env, &call(cp, &r), fetch, |_| Waiter::request(id)).is_none() {
            // Not even sent (e.g. no such cluster): as when it does not answer.
            count(env.io, "failed");
            let entry = failed(cp, &r, "it could not be called", env.io.host())?;
            self.known.insert(r, entry);
            return Ok(Read::Known);
        }
        Ok(Read::Waiting)
    }

    /// The entry a request waited for arrived.
    pub(super) fn arrived(&mut self, r: &Ref, entry: &Entry) {
        self.known.insert(r.clone(), entry.clone());
    }
}

/// A request waiting for a control-plane entry: its headers, and its body once complete
/// (when the gateway reads it).
pub(super) struct Stalled {
    pub(super) raw: RawHeaders,
    pub(super) body: Option<(usize, Vec<u8>)>,
    /// The body is complete (or there is none).
    pub(super) ended: bool,
}

impl Stalled {
    pub(super) fn new(raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Box<Stalled> {
        let ended = body.is_some();
        Box::new(Stalled { raw, body, ended })
    }

    /// The request's body ended (`size` bytes in Envoy's buffer): kept when the gateway reads
    /// it (a body it does not read stays in Envoy's buffer). The body read, the first time.
    pub(super) fn body_ended(&mut self, env: &mut Env, size: usize) -> Option<&[u8]> {
        if self.ended {
            return None;
        }
        self.ended = true;
        if !pipeline::reads_body(&self.raw) {
            return None;
        }
        let body = env.io.request_body(env.id, size);
        Some(&self.body.insert((size, body)).1)
    }
}

/// What one request read, then what this worker read lately (while it is fresh), then what
/// is fresh in shared data. A warm request makes neither a call nor a shared-data read, nor
/// parses an entry again.
pub(super) struct Known<'a> {
    local: &'a HashMap<Ref, Entry>,
    recent: &'a mut Recent,
}

/// The entries a worker read lately, each with the end of its freshness (bounded: emptied when
/// full, the shared data still has them).
#[derive(Default)]
pub(super) struct Recent(HashMap<Ref, (u64, Entry)>);

const RECENT_ENTRIES: usize = 256;

impl<'a> Known<'a> {
    pub(super) fn new(local: &'a HashMap<Ref, Entry>, recent: &'a mut Recent) -> Known<'a> {
        Known { local, recent }
    }
}

impl Resolve for Known<'_> {
    fn get(&mut self, r: &Ref, host: &dyn Host) -> Option<Entry> {
        if let Some(entry) = self.local.get(r) {
            return Some(entry.clone());
        }
        let now_ms = host.now_ms();
        if let Some((fresh_until_ms, entry)) = self.recent.0.get(r) {
            if now_ms <= *fresh_until_ms {
                return Some(entry.clone());
            }
        }
        let (entry, fresh_until_ms) = catalog::fresh(host.store(), r, now_ms)?;
        if self.recent.0.len() >= RECENT_ENTRIES {
            self.recent.0.clear();
        }
        self.recent.0.insert(r.clone(), (fresh_until_ms, entry.clone()));
        Some(entry)
    }
}

fn get(cp: &ControlPlaneSettings, path: String) -> Dispatch {
    let headers = vec![
        (":method".to_string(), "GET".to_string()),
        (":path".to_string(), path),
        (":authority".to_string(), cp.authority.clone()),
        ("authorization".to_string(), format!("Bearer {}", cp.token)),
        ("accept".to_string(), "application/json".to_string()),
    ];
    Dispatch { cluster: cp.cluster.clone(), headers, body: Vec::new(), timeout_ms: cp.timeout_ms }
}

/// The call that reads `r`. A kept response may still be on its way to the control plane (it
/// is written as its answer reaches the client): the control plane waits for it a while.
pub(super) fn call(cp: &ControlPlaneSettings, r: &Ref) -> Dispatch {
    match r.kind {
        Kind::Response => get(cp, format!("{}?wait_ms={}", r.path(), (cp.timeout_ms / 2).min(MAX_RESPONSE_WAIT_MS))),
        _ => get(cp, r.path()),
    }
}

/// How long the control plane waits for a kept response that is not there yet.
const MAX_RESPONSE_WAIT_MS: u64 = 1000;

/// The control plane's health check (never cached).
pub(super) fn health_call(cp: &ControlPlaneSettings) -> Dispatch {
    let mut call = get(cp, "/health".to_string());
    call.headers.retain(|(name, _)| name != "authorization");
    call
}

/// Counts one control-plane read by its result (`found`, `absent` or `failed`).
pub(super) fn count(io: &mut dyn Io, result: &'static str) {
    io.metric(metrics::Kind::Counter, &metrics::lookup(result), 1);
}

/// The entry `r` becomes after the control plane's answer: kept when it answered, else the
/// entry read within the grace period, else a 503. The read is counted.
pub(super) fn settle(
    settings: &Settings,
    r: &Ref,
    answer: &CallAnswer,
    io: &mut dyn Io,
) -> Result<Entry, GatewayError> {
    let from_answer = catalog::from_answer(r, answer.status, &answer.body);
    count(
        io,
        match &from_answer {
            Ok(Some(_)) => "found",
            Ok(None) => "absent",
            Err(_) => "failed",
        },
    );
    let host = io.host();
    let Some(cp) = &settings.control_plane else {
        return Err(catalog::unavailable(r, "not configured"));
    };
    let now_ms = host.now_ms();
    match from_answer {
        // A response not kept yet may be kept a moment later: its absence is not remembered.
        Ok(None) if r.kind == Kind::Response => Ok(None),
        Ok(entry) => {
            catalog::remember(host.store(), r, &entry, now_ms, cp.fresh_ms, cp.grace_ms);
            Ok(entry)
        }
        Err(why) => failed(cp, r, &why, host),
    }
}

/// The control plane could not give `r` (`why`): the entry read within the grace period (used
/// again without a call for another freshness window), or a 503.
pub(super) fn failed(cp: &ControlPlaneSettings, r: &Ref, why: &str, host: &dyn Host) -> Result<Entry, GatewayError> {
    log::warn!("control plane read of {} failed: {why}", r.path());
    let now_ms = host.now_ms();
    let entry = catalog::within(host.store(), r, now_ms, cp.grace_ms).ok_or_else(|| catalog::unavailable(r, why))?;
    catalog::extend(host.store(), r, now_ms.saturating_add(cp.fresh_ms));
    Ok(entry)
}
