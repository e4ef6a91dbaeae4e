//! The response cache's part in an exchange: the exact lookup, the embeddings call of
//! semantic mode, and capturing an answer as the client gets it until it can be stored.

use super::Dispatch;
use crate::cache::settings::CacheMode;
use crate::cache::store::{self, Entry};
use crate::cache::{semantic, Capture, Lookup, Status};
use crate::pipeline::CachePlan;
use crate::ports::Host;
use crate::settings::Settings;

/// The cache's part in a request.
pub(crate) enum CacheState {
    /// Not an endpoint the cache serves: no status header.
    Off,
    Disabled,
    Active(Box<Caching>),
    /// The request was answered from the cache.
    Served(Status),
}

/// A request the cache looked up and may store the answer of.
pub(crate) struct Caching {
    lookup: Lookup,
    pub(crate) status: Status,
    /// The request's embedding, stored with its answer.
    vector: Option<Vec<f32>>,
    capture: Capture,
}

/// A stored answer that serves the request: how it was found, its provider, content type and body.
pub(crate) struct Hit {
    pub(crate) status: Status,
    pub(crate) provider: String,
    pub(crate) content_type: String,
    pub(crate) body: Vec<u8>,
}

impl CacheState {
    /// Looks the request up; a hit answers it. Otherwise notes how the answer will be cached.
    /// A hit needs no validation: its key holds everything validation reads (the body after
    /// overrides, the provider, strictness), and the same request passed when it was stored.
    pub(crate) fn look_up(plan: CachePlan, settings: &Settings, host: &dyn Host) -> Result<CacheState, Hit> {
        let lookup = match plan {
            CachePlan::Uncached => return Ok(CacheState::Off),
            CachePlan::Disabled => return Ok(CacheState::Disabled),
            CachePlan::Lookup(lookup) => *lookup,
        };
        if !lookup.refresh {
            let found = store::find(host.store(), &settings.cache.layout, &lookup.key, host.now_ms());
            if let Some(hit) = found.and_then(|entry| hit(&lookup, Status::Hit, entry)) {
                return Err(hit);
            }
        }
        let status = if lookup.refresh { Status::Refresh } else { Status::Miss };
        Ok(CacheState::Active(Box::new(Caching { lookup, status, vector: None, capture: Capture::Off })))
    }

    pub(crate) fn status_header(&self) -> Option<&'static str> {
        match self {
            CacheState::Off => None,
            CacheState::Disabled => Some(Status::Disabled.as_str()),
            CacheState::Active(caching) => Some(caching.status.as_str()),
            CacheState::Served(status) => Some(status.as_str()),
        }
    }

    /// Semantic mode after an exact miss, once the request is known to be valid: the
    /// embeddings call to make. Without an embeddings provider the lookup stays exact.
    pub(crate) fn embeddings_call(&mut self, settings: &Settings) -> Option<Dispatch> {
        let CacheState::Active(caching) = self else {
            return None;
        };
        if caching.lookup.mode != CacheMode::Semantic || caching.lookup.refresh {
            return None;
        }
        let text = caching.lookup.conversation.as_deref()?;
        let call = embeddings_request(settings, text);
        if call.is_none() {
            caching.status = Status::MissSemanticUnavailable;
        }
        call
    }

    /// The embeddings call could not start: the lookup was exact only.
    pub(crate) fn semantic_unavailable(&mut self) {
        if let CacheState::Active(caching) = self {
            caching.status = Status::MissSemanticUnavailable;
        }
    }

    /// The embedding arrived (`None`: the call failed or its answer was unreadable). A
    /// similar stored answer is a hit; otherwise the request goes on.
    pub(crate) fn embedding_arrived(
        &mut self,
        vector: Option<Vec<f32>>,
        settings: &Settings,
        host: &dyn Host,
    ) -> Option<Hit> {
        let CacheState::Active(caching) = self else {
            return None;
        };
        let (Some(vector), Some(semantic)) = (vector, &settings.cache.semantic) else {
            caching.status = Status::MissSemanticUnavailable;
            return None;
        };
        let layout = &settings.cache.layout;
        let found =
            store::find_similar(host.store(), layout, &caching.lookup.key, &vector, semantic.threshold, host.now_ms());
        if let Some(hit) = found.and_then(|entry| hit(&caching.lookup, Status::SemanticHit, entry)) {
            return Some(hit);
        }
        caching.vector = Some(vector);
        None
    }

    /// Starts collecting a 2xx answer whose body the client gets with `content_type`.
    pub(crate) fn start_capture(&mut self, settings: &Settings, content_type: &str) {
        if let CacheState::Active(caching) = self {
            let max_bytes = usize::try_from(settings.cache.max_entry_bytes).unwrap_or(usize::MAX);
            caching.capture = Capture::start(caching.lookup.endpoint, content_type, max_bytes);
        }
    }

    pub(crate) fn capturing(&self) -> bool {
        matches!(self, CacheState::Active(caching) if !matches!(caching.capture, Capture::Off))
    }

    pub(crate) fn is_active(&self) -> bool {
        matches!(self, CacheState::Active(_))
    }

    /// Collects what the client receives; stores the answer once it is complete (a stream at
    /// its `[DONE]`: the client may ask again before the upstream's end). The bytes of the
    /// answer when it was stored.
    pub(crate) fn capture(
        &mut self,
        bytes: &[u8],
        end: bool,
        settings: &Settings,
        provider: &str,
        host: &dyn Host,
    ) -> Option<u64> {
        let CacheState::Active(caching) = self else {
            return None;
        };
        caching.capture.push(bytes);
        if !(end || caching.capture.is_complete()) {
            return None;
        }
        let (content_type, body) = std::mem::replace(&mut caching.capture, Capture::Off).finish()?;
        let stored = u64::try_from(body.len()).unwrap_or(u64::MAX);
        let now = host.now_ms();
        let entry = Entry {
            expires_ms: now.saturating_add(caching.lookup.max_age_ms),
            provider: provider.into(),
            content_type,
            body,
        };
        let layout = &settings.cache.layout;
        if store::put(host.store(), layout, &caching.lookup.key, &entry, caching.vector.as_deref(), now) {
            Some(stored)
        } else {
            log::debug!("answer not cached: larger than max_entry_bytes, or the store was contended");
            None
        }
    }
}

fn hit(lookup: &Lookup, status: Status, entry: Entry) -> Option<Hit> {
    let (content_type, body) = lookup.answer(&entry)?;
    Some(Hit { status, provider: entry.provider, content_type, body })
}

/// The embeddings call of semantic mode, through the recovery listener to the operator's
/// OpenAI-compatible provider.
fn embeddings_request(settings: &Settings, text: &str) -> Option<Dispatch> {
    let semantic = settings.cache.semantic.as_ref()?;
    let upstream = semantic.upstream.as_ref()?;
    let body = semantic::embeddings_request(&semantic.model, text);
    let path = format!("{}/embeddings", upstream.base_path);
    let headers = semantic.api_key.iter().map(|key| ("authorization".to_string(), format!("Bearer {key}"))).collect();
    Some(Dispatch::post(settings, upstream, &path, "application/json", body, headers, semantic.timeout_ms))
}
