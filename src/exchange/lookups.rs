//! Control-plane reads as tasks of the exchange: a request that needs an entry is held, one
//! dispatched call per entry (per worker) fetches it for every request waiting, and each
//! waiting request is processed again with the entry known. What was read is kept in shared
//! data (for every worker, fresh for `fresh_ms`) and in the request (so its progress never
//! depends on shared data); when the control plane cannot answer, an entry read within
//! `grace_ms` still serves.

use super::{metrics, CallAnswer, Dispatch, Io};
use crate::catalog::{self, Entry, Ref, Resolve};
use crate::errors::GatewayError;
use crate::ports::Host;
use crate::settings::{ControlPlaneSettings, Settings};
use hashbrown::HashMap;

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

/// The call that reads `r`.
pub(super) fn call(cp: &ControlPlaneSettings, r: &Ref) -> Dispatch {
    get(cp, r.path())
}

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
