//! The response cache (spec 2.3): exact (simple) and semantic matching, kept in proxy-wasm
//! shared data by `store`, always scoped to the tenant.
//!
//! A request is looked up by its [`Key`]: the tenant (the gateway key it came with), the
//! namespace header, the endpoint, the provider and where it lives, and the body after
//! `override_params`, canonical (key order does not matter) and without
//! `stream`/`stream_options` (one answer serves both ways: a stream is stored as the
//! assembled completion and replayed as a stream when asked).

pub(crate) mod completion;
pub(crate) mod semantic;
pub(crate) mod store;

/// A config's `cache` settings, read by the shared crate.
pub(crate) use gateway_schema::cache as settings;

use crate::client_api;
use crate::hash::Hasher;
use crate::request::endpoint::{ClientApi, Endpoint};
use completion::StreamAssembler;
use serde_json::{Map, Value};
use settings::CacheMode;

/// The response header that tells how the cache served a request.
pub(crate) const STATUS_HEADER: &str = "x-gateway-cache-status";

/// How long an entry lives when the config gives no `max_age`: an hour bounds how stale an
/// answer gets as models and prompts change, and keeps repeated traffic of a session cached.
pub(crate) const DEFAULT_MAX_AGE_SECONDS: u64 = 3600;

/// The tenant: a 128-bit hash of the gateway key (the key itself is never stored).
pub(crate) type Tenant = [u8; 16];

pub(crate) fn tenant_of(gateway_key: &[u8]) -> Tenant {
    let mut tenant = [0u8; 16];
    tenant[..8].copy_from_slice(&Hasher::seeded(1).part(Some(gateway_key)).finish().to_le_bytes());
    tenant[8..].copy_from_slice(&Hasher::seeded(2).part(Some(gateway_key)).finish().to_le_bytes());
    tenant
}

/// What identifies a cached answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    pub(crate) tenant: Tenant,
    /// Everything else of the key, in full: a hit compares it byte for byte, so a hash
    /// collision can never serve another request's answer.
    pub(crate) identity: Vec<u8>,
    /// Hash of tenant and identity: where the entry is indexed.
    pub(crate) digest: u64,
    /// Hash of the tenant and the identity without the conversation: the entries a semantic
    /// lookup compares with.
    pub(crate) scope: u64,
}

/// Where the answer comes from and how it is shaped: the provider, its base URL, and
/// `strict_vendor_compliance` (which changes a translated answer).
pub(crate) struct Origin<'a> {
    pub(crate) provider: &'a str,
    pub(crate) authority: &'a str,
    pub(crate) base_path: &'a str,
    pub(crate) strict_vendor_compliance: bool,
}

/// The request body as the provider gets it: the client's fields with `override_params`
/// forced onto them, read without copying either.
pub(crate) struct Body<'a> {
    pub(crate) fields: &'a Map<String, Value>,
    pub(crate) overrides: &'a Map<String, Value>,
}

/// The bytes a canonical body starts with room for.
const CANONICAL_CAPACITY: usize = 512;

impl<'a> Body<'a> {
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.overrides.get(name).or_else(|| self.fields.get(name))
    }

    /// Compact JSON of the fields in key order (serde_json's maps are sorted: the order the
    /// client sent them in does not matter), leaving out `skip`.
    fn canonical(&self, skip: &[&str]) -> Vec<u8> {
        let mut names: Vec<&String> = Vec::with_capacity(self.fields.len() + self.overrides.len());
        names.extend(self.fields.keys().chain(self.overrides.keys()));
        names.sort_unstable();
        names.dedup();
        // Room for a chat request's body at once: grown from one byte, it was copied ~8 times.
        let mut out = Vec::with_capacity(CANONICAL_CAPACITY);
        out.push(b'{');
        for name in names.into_iter().filter(|n| !skip.contains(&n.as_str())) {
            if let Some(value) = self.get(name) {
                if out.len() > 1 {
                    out.push(b',');
                }
                // Writing JSON into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut out, name);
                out.push(b':');
                let _ = serde_json::to_writer(&mut out, value);
            }
        }
        out.push(b'}');
        out
    }
}

/// The key of a request whose `body` goes to `origin`.
pub(crate) fn key(tenant: Tenant, namespace: Option<&str>, endpoint: Endpoint, origin: &Origin, body: &Body) -> Key {
    let strict = if origin.strict_vendor_compliance { "strict" } else { "lenient" };
    let parts = [
        namespace,
        Some(endpoint_name(endpoint)),
        Some(origin.provider),
        Some(origin.authority),
        Some(origin.base_path),
        Some(strict),
    ];
    // Tagged and length-prefixed: no namespace and an empty one differ, parts never run together.
    let mut identity = Vec::with_capacity(256);
    for part in parts {
        match part {
            Some(text) => {
                identity.push(1);
                identity.extend_from_slice(&(text.len() as u32).to_le_bytes());
                identity.extend_from_slice(text.as_bytes());
            }
            None => identity.push(0),
        }
    }
    // One answer serves a request asking for a stream and one that does not.
    const NOT_IN_KEY: [&str; 2] = ["stream", "stream_options"];
    // The scope leaves out what semantic matching compares by meaning.
    let scoped = body.canonical(&[NOT_IN_KEY[0], NOT_IN_KEY[1], "messages", "prompt"]);
    let scope = Hasher::new().part(Some(&tenant)).part(Some(&identity)).part(Some(&scoped)).finish();
    identity.extend_from_slice(&body.canonical(&NOT_IN_KEY));
    let digest = Hasher::new().part(Some(&tenant)).part(Some(&identity)).finish();
    Key { tenant, identity, digest, scope }
}

fn endpoint_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => "chat/completions",
        Endpoint::Completions => "completions",
        Endpoint::Embeddings => "embeddings",
        Endpoint::Messages => "messages",
        Endpoint::Responses => "responses",
        _ => "other",
    }
}

/// Endpoints whose answers are cached: their answer depends only on the request body. A
/// stream is stored as the answer it assembles into and replayed from it.
pub(crate) fn is_cached_endpoint(endpoint: Endpoint) -> bool {
    matches!(
        endpoint,
        Endpoint::ChatCompletions
            | Endpoint::Completions
            | Endpoint::Embeddings
            | Endpoint::Messages
            | Endpoint::Responses
    )
}

/// How the cache served a request (the value of [`STATUS_HEADER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// No cache config applies.
    Disabled,
    Miss,
    Hit,
    SemanticHit,
    /// `x-gateway-cache-force-refresh`: the provider was called and the entry replaced.
    Refresh,
    /// Semantic mode without a usable embedding (not configured, failed, unreadable): the
    /// lookup was exact only.
    MissSemanticUnavailable,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Disabled => "DISABLED",
            Status::Miss => "MISS",
            Status::Hit => "HIT",
            Status::SemanticHit => "SEMANTIC_HIT",
            Status::Refresh => "REFRESH",
            Status::MissSemanticUnavailable => "MISS; semantic=unavailable",
        }
    }
}

/// A cached request: what to look up and how to store its answer.
#[derive(Debug, Clone)]
pub(crate) struct Lookup {
    pub(crate) key: Key,
    pub(crate) mode: CacheMode,
    pub(crate) max_age_ms: u64,
    /// Force refresh: no lookup, the answer replaces the entry.
    pub(crate) refresh: bool,
    pub(crate) endpoint: Endpoint,
    /// The request asked for a stream (a hit is replayed as one).
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// The text semantic mode embeds (None in simple mode or when there is no conversation).
    pub(crate) conversation: Option<String>,
}

impl Lookup {
    /// The content type and body a hit answers with; None when the stored answer cannot be
    /// replayed as the stream the request asks for.
    pub(crate) fn answer(&self, entry: &store::Entry) -> Option<(String, Vec<u8>)> {
        if !self.stream {
            return Some((entry.content_type.clone(), entry.body.clone()));
        }
        let replay = match self.endpoint.client_api() {
            ClientApi::Chat => completion::replay_sse(self.endpoint, &entry.body, self.include_usage)?,
            api => client_api::replay_stream(api, &entry.body)?,
        };
        Some(("text/event-stream".to_string(), replay))
    }
}

/// Collects a 2xx answer as it passes to the client, for storing once it is complete.
pub(crate) enum Capture {
    /// A JSON answer, stored as it is.
    Json { content_type: String, body: Vec<u8>, max_bytes: usize },
    /// An OpenAI stream, stored as the completion it assembles into.
    Stream(StreamAssembler),
    /// A Messages or Responses stream, stored as the answer it streamed once it ended.
    ClientStream { api: ClientApi, bytes: Vec<u8>, max_bytes: usize },
    /// Nothing to store (too large, or not a kind of answer the cache keeps).
    Off,
}

impl Capture {
    /// `content_type` of the answer the client gets (after translation to OpenAI's shape).
    pub(crate) fn start(endpoint: Endpoint, content_type: &str, max_bytes: usize) -> Capture {
        let streams = matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions);
        let client_api = matches!(endpoint, Endpoint::Messages | Endpoint::Responses);
        if content_type.starts_with("text/event-stream") && streams {
            Capture::Stream(StreamAssembler::new(endpoint, max_bytes))
        } else if content_type.starts_with("text/event-stream") && client_api {
            // Its events take a few times the bytes of the answer they assemble into.
            Capture::ClientStream {
                api: endpoint.client_api(),
                bytes: Vec::new(),
                max_bytes: max_bytes.saturating_mul(4),
            }
        } else if content_type.starts_with("application/json") {
            Capture::Json { content_type: content_type.to_string(), body: Vec::new(), max_bytes }
        } else {
            Capture::Off
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        match self {
            Capture::Json { body, max_bytes, .. } if body.len() + chunk.len() <= *max_bytes => {
                body.extend_from_slice(chunk)
            }
            Capture::ClientStream { bytes, max_bytes, .. } if bytes.len() + chunk.len() <= *max_bytes => {
                bytes.extend_from_slice(chunk)
            }
            Capture::Json { .. } | Capture::ClientStream { .. } => *self = Capture::Off,
            Capture::Stream(assembler) => assembler.push(chunk),
            Capture::Off => {}
        }
    }

    /// A stream whose `[DONE]` arrived can be stored before the upstream's end.
    pub(crate) fn is_complete(&self) -> bool {
        matches!(self, Capture::Stream(assembler) if assembler.is_done())
    }

    /// The content type and body to store, when the answer completed as one.
    pub(crate) fn finish(self) -> Option<(String, Vec<u8>)> {
        match self {
            Capture::Json { content_type, body, .. } => {
                let complete = serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok();
                complete.then_some((content_type, body))
            }
            Capture::Stream(assembler) => assembler.finish().map(|body| ("application/json".to_string(), body)),
            Capture::ClientStream { api, bytes, .. } => {
                let answer = client_api::stream_answer(api, &bytes)?;
                Some(("application/json".to_string(), answer.to_string().into_bytes()))
            }
            Capture::Off => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    const ORIGIN: Origin = Origin {
        provider: "openai",
        authority: "api.openai.com:443",
        base_path: "/v1",
        strict_vendor_compliance: true,
    };

    fn keyed(tenant: &[u8], namespace: Option<&str>, endpoint: Endpoint, origin: &Origin, body: &Value) -> Key {
        let no_overrides = Map::new();
        let fields = body.as_object().unwrap();
        key(tenant_of(tenant), namespace, endpoint, origin, &Body { fields, overrides: &no_overrides })
    }

    fn key_of(body: Value) -> Key {
        keyed(b"gw-key", None, Endpoint::ChatCompletions, &ORIGIN, &body)
    }

    #[test]
    fn the_key_is_the_body_after_overrides() {
        let body = json!({"model": "m", "temperature": 0.5, "messages": []});
        let overrides = json!({"temperature": 1, "seed": 3});
        let (fields, overrides) = (body.as_object().unwrap(), overrides.as_object().unwrap());
        let overridden =
            key(tenant_of(b"gw-key"), None, Endpoint::ChatCompletions, &ORIGIN, &Body { fields, overrides });
        assert_eq!(overridden, key_of(json!({"seed": 3, "model": "m", "temperature": 1, "messages": []})));
        let canonical = Body { fields, overrides }.canonical(&["messages"]);
        assert_eq!(String::from_utf8(canonical).unwrap(), r#"{"model":"m","seed":3,"temperature":1}"#);
        assert_eq!(Body { fields, overrides }.get("temperature"), Some(&json!(1)));
    }

    #[test]
    fn key_order_and_stream_do_not_matter() {
        let a = key_of(json!({"model": "m", "temperature": 0.5, "messages": [{"role": "user", "content": "hi"}]}));
        let b = key_of(json!({"messages": [{"content": "hi", "role": "user"}], "stream": true,
                              "stream_options": {"include_usage": true}, "temperature": 0.5, "model": "m"}));
        assert_eq!(a, b);
    }

    #[test]
    fn what_changes_the_answer_changes_the_key() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let base = key_of(body.clone());
        let other_model = key_of(json!({"model": "n", "messages": [{"role": "user", "content": "hi"}]}));
        let other_params =
            key_of(json!({"model": "m", "temperature": 1, "messages": [{"role": "user", "content": "hi"}]}));
        let other_tenant = keyed(b"gw-other", None, Endpoint::ChatCompletions, &ORIGIN, &body);
        let namespaced = keyed(b"gw-key", Some("team-a"), Endpoint::ChatCompletions, &ORIGIN, &body);
        let empty_namespace = keyed(b"gw-key", Some(""), Endpoint::ChatCompletions, &ORIGIN, &body);
        let other_endpoint = keyed(b"gw-key", None, Endpoint::Completions, &ORIGIN, &body);
        let elsewhere = Origin { authority: "127.0.0.1:9000", ..ORIGIN };
        let other_host = keyed(b"gw-key", None, Endpoint::ChatCompletions, &elsewhere, &body);
        let lenient = Origin { strict_vendor_compliance: false, ..ORIGIN };
        let other_shape = keyed(b"gw-key", None, Endpoint::ChatCompletions, &lenient, &body);
        let keys = [
            &base,
            &other_model,
            &other_params,
            &other_tenant,
            &namespaced,
            &empty_namespace,
            &other_endpoint,
            &other_host,
            &other_shape,
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a.digest, b.digest);
                assert!(a.identity != b.identity || a.tenant != b.tenant);
            }
        }
    }

    #[test]
    fn the_scope_leaves_out_the_conversation_only() {
        let a = key_of(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let b = key_of(json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}));
        let c = key_of(json!({"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}));
        assert_ne!(a.digest, b.digest);
        assert_eq!(a.scope, b.scope);
        assert_ne!(a.scope, c.scope);
    }

    #[test]
    fn tenants_differ_by_key() {
        assert_eq!(tenant_of(b"gw-a"), tenant_of(b"gw-a"));
        assert_ne!(tenant_of(b"gw-a"), tenant_of(b"gw-b"));
    }

    #[test]
    fn captures_complete_json_answers_within_the_cap() {
        let mut capture = Capture::start(Endpoint::ChatCompletions, "application/json", 100);
        capture.push(br#"{"id":"#);
        capture.push(br#""x"}"#);
        assert_eq!(capture.finish(), Some(("application/json".to_string(), br#"{"id":"x"}"#.to_vec())));
        let mut capture = Capture::start(Endpoint::ChatCompletions, "application/json", 10);
        capture.push(br#"{"id":"long enough"}"#);
        assert_eq!(capture.finish(), None);
        let mut cut = Capture::start(Endpoint::Embeddings, "application/json", 100);
        cut.push(br#"{"id":"#);
        assert_eq!(cut.finish(), None);
        assert!(matches!(Capture::start(Endpoint::Embeddings, "text/event-stream", 100), Capture::Off));
        let mut stream = Capture::start(Endpoint::ChatCompletions, "text/event-stream", 10_000);
        stream.push(br#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#);
        stream.push(b"\n\n");
        assert!(!stream.is_complete());
        stream.push(b"data: [DONE]\n\n");
        assert!(stream.is_complete(), "complete at [DONE], before the upstream ends");
        assert!(stream.finish().is_some());
        assert!(matches!(Capture::start(Endpoint::ChatCompletions, "text/plain", 100), Capture::Off));
    }
}
