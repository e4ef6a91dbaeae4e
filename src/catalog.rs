//! What the control plane holds, as the filter reads it: gateway keys, saved configs, stored
//! providers, guardrails and prompts, each named by a [`Ref`] (kind, workspace, id).
//!
//! Routing asks a [`Catalog`] for the refs it needs. An entry known to the request (read
//! during this request) or fresh in shared data answers at once; any other ref is *needed*:
//! the catalog notes it and routing stops with a placeholder error, which the pipeline turns
//! into a lookup (the exchange fetches it with a dispatched call and replays the request).
//!
//! Shared data holds what was read in a fixed number of slots (keys and items in slots of
//! their own, so callers with made-up keys cannot push items out). A ref may sit in either of
//! two slots picked by its hash, so another ref landing on one of them does not push it out
//! (what was read must keep serving while the control plane is down); each value names its
//! ref in full, so a collision is a miss, never another ref's data, and an absent entry never
//! replaces another ref's entry that is still usable.

use crate::errors::GatewayError;
use crate::hash::Hasher;
use crate::ports::{Host, SharedStore};
use crate::settings::Settings;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::rc::Rc;

/// The workspace of the plugin configuration's own keys.
pub(crate) const DEFAULT_WORKSPACE: &str = "default";
/// Shared-data slots of the lookup cache, for items (`cp:0` .. `cp:1023`) and for gateway keys
/// (`cp:key:0` ..), each created on first use.
pub(crate) const SLOTS: u64 = 1024;
/// Larger answers are used by the requests that read them but not kept in shared data.
pub(crate) const MAX_ENTRY_BYTES: usize = 64 << 10;
/// Lookups one request may make: each replay adds one known ref, so this bounds the refs of
/// one request (a key, a config, its guardrails, prompt and stored providers).
pub(crate) const MAX_LOOKUPS: u32 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Key,
    Config,
    Provider,
    Guardrail,
    Prompt,
    /// A response the gateway keeps (the Responses API's `store`, on a translating target).
    Response,
    /// A workspace's limits and prices (one entry per workspace, id [`POLICY_ID`]).
    Policy,
    /// An MCP server of the workspace (`/v1/mcp-servers/{id}`).
    McpServer,
    /// Every MCP server of the workspace (one entry per workspace, id [`ALL_ID`]).
    McpServers,
}

/// The id of a workspace's entry that holds all of its items of a kind.
pub(crate) const ALL_ID: &str = "all";

/// The id of a workspace's policy entry.
pub(crate) const POLICY_ID: &str = "policy";

impl Kind {
    /// The path segment of the internal endpoint.
    fn segment(self) -> &'static str {
        match self {
            Kind::Key => "keys",
            Kind::Config => "configs",
            Kind::Provider => "providers",
            Kind::Guardrail => "guardrails",
            Kind::Prompt => "prompts",
            Kind::Response => "responses",
            Kind::Policy => "policy",
            Kind::McpServer | Kind::McpServers => "mcp-servers",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Key => "gateway key",
            Kind::Config => "saved config",
            Kind::Provider => "stored provider",
            Kind::Guardrail => "guardrail",
            Kind::Prompt => "prompt",
            Kind::Response => "stored response",
            Kind::Policy => "limits and prices",
            Kind::McpServer => "MCP server",
            Kind::McpServers => "MCP servers",
        }
    }
}

/// One thing the control plane holds, in one workspace (keys: no workspace, the id is the
/// lowercase hex SHA-256 of the key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ref {
    pub(crate) kind: Kind,
    pub(crate) workspace: String,
    pub(crate) id: String,
}

impl Ref {
    /// The ref of gateway key `key`: only its hash leaves the filter.
    pub(crate) fn key(key: &[u8]) -> Ref {
        let digest = Sha256::digest(key);
        let mut id = String::with_capacity(64);
        for byte in digest {
            let _ = write!(id, "{byte:02x}");
        }
        Ref { kind: Kind::Key, workspace: String::new(), id }
    }

    /// The path of the control plane's internal endpoint for this ref.
    pub(crate) fn path(&self) -> String {
        match self.kind {
            Kind::Key => format!("/internal/v1/keys/{}", self.id),
            Kind::Policy => format!("/internal/v1/workspaces/{}/policy", self.workspace),
            Kind::McpServers => format!("/internal/v1/workspaces/{}/mcp-servers", self.workspace),
            kind => format!("/internal/v1/workspaces/{}/{}/{}", self.workspace, kind.segment(), self.id),
        }
    }

    /// How the ref is written in its shared-data value.
    fn identity(&self) -> String {
        // A server's id may be the list's ("all"): the list's entry is told apart.
        let kind = if self.kind == Kind::McpServers { "mcp-server-list" } else { self.kind.segment() };
        format!("{kind}\n{}\n{}", self.workspace, self.id)
    }

    /// The two slots the ref may sit in (from the hash's low bits and from bits 32 and up).
    fn slots(&self) -> [String; 2] {
        let hash = Hasher::seeded(3).part(Some(self.identity().as_bytes())).finish();
        let prefix = if self.kind == Kind::Key { "cp:key:" } else { "cp:" };
        [format!("{prefix}{}", hash % SLOTS), format!("{prefix}{}", (hash >> 32) % SLOTS)]
    }
}

/// A looked-up entry: the stored value, or `None` when the control plane has no such item.
pub(crate) type Entry = Option<Rc<Value>>;

/// Whether `id` may name something at the control plane: `[A-Za-z0-9._-]{1,128}`. Any other
/// id is unknown without a call (and never becomes a different path upstream).
pub(crate) fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn valid_workspace(name: &str) -> bool {
    name.len() <= 64 && valid_id(name)
}

/// Where a request's refs are looked up: what this request already read, then shared data.
pub(crate) trait Resolve {
    /// The entry of `r` when it is known and fresh; `None` when it must be fetched.
    fn get(&mut self, r: &Ref, host: &dyn Host) -> Option<Entry>;
}

/// A resolver that knows nothing (tests and fuzzing without a control plane).
#[cfg(any(test, fuzzing))]
pub(crate) struct Nothing;

#[cfg(any(test, fuzzing))]
impl Resolve for Nothing {
    fn get(&mut self, _: &Ref, _: &dyn Host) -> Option<Entry> {
        None
    }
}

/// The control plane as routing sees it, for one pass over a request.
pub(crate) struct Catalog<'a> {
    enabled: bool,
    resolve: &'a mut dyn Resolve,
    /// The caller's workspace, once its key is known.
    pub(crate) workspace: String,
    needed: Option<Ref>,
}

impl<'a> Catalog<'a> {
    pub(crate) fn new(settings: &Settings, resolve: &'a mut dyn Resolve) -> Catalog<'a> {
        Catalog { enabled: settings.control_plane.is_some(), resolve, workspace: String::new(), needed: None }
    }

    /// Whether a control plane is configured.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// The ref this pass stopped at, if any.
    pub(crate) fn take_needed(&mut self) -> Option<Ref> {
        self.needed.take()
    }

    fn get(&mut self, r: Ref, host: &dyn Host) -> Result<Entry, GatewayError> {
        match self.resolve.get(&r, host) {
            Some(entry) => Ok(entry),
            None => {
                self.needed = Some(r);
                // A placeholder: the pipeline turns it into a lookup of the needed ref.
                Err(GatewayError::new(503, "api_error", "waiting for the control plane")
                    .with_code("control_plane_unavailable"))
            }
        }
    }

    /// Item `id` of `kind` in the caller's workspace; `Ok(None)` when there is none (an id
    /// outside the allowed characters included, without a call).
    pub(crate) fn item(&mut self, kind: Kind, id: &str, host: &dyn Host) -> Result<Entry, GatewayError> {
        if !valid_id(id) || !valid_workspace(&self.workspace) {
            return Ok(None);
        }
        let r = Ref { kind, workspace: self.workspace.clone(), id: id.to_string() };
        self.get(r, host)
    }

    /// Item `id` of `kind`, or the 404 that names it.
    pub(crate) fn require(&mut self, kind: Kind, id: &str, host: &dyn Host) -> Result<Rc<Value>, GatewayError> {
        self.item(kind, id, host)?.ok_or_else(|| not_found(kind, id))
    }

    /// The workspace of gateway key `key` and the key's id; `None` when the control plane does
    /// not know the key.
    pub(crate) fn key_owner(&mut self, key: &[u8], host: &dyn Host) -> Result<Option<KeyOwner>, GatewayError> {
        let entry = self.get(Ref::key(key), host)?;
        Ok(entry.and_then(|value| {
            let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
            let mcp_tools = value.get("mcp_tools").and_then(Value::as_array).map(|patterns| {
                patterns.iter().filter_map(Value::as_str).map(str::to_string).collect::<Rc<[String]>>()
            });
            Some(KeyOwner { workspace: text("workspace")?, key_id: text("id"), mcp_tools })
        }))
    }

    /// The caller's workspace's limits and prices.
    pub(crate) fn policy(&mut self, host: &dyn Host) -> Result<Entry, GatewayError> {
        self.whole(Kind::Policy, POLICY_ID, host)
    }

    /// Every MCP server of the caller's workspace: the control plane's list (`data`, each with
    /// its `id` and `value`).
    pub(crate) fn mcp_servers(&mut self, host: &dyn Host) -> Result<Entry, GatewayError> {
        self.whole(Kind::McpServers, ALL_ID, host)
    }

    /// The workspace's one entry of `kind`, named `id`.
    fn whole(&mut self, kind: Kind, id: &str, host: &dyn Host) -> Result<Entry, GatewayError> {
        if !valid_workspace(&self.workspace) {
            return Ok(None);
        }
        self.get(Ref { kind, workspace: self.workspace.clone(), id: id.to_string() }, host)
    }
}

/// Whose a gateway key is: its workspace, and its id (a key of the plugin configuration has
/// none).
pub(crate) struct KeyOwner {
    pub(crate) workspace: String,
    pub(crate) key_id: Option<String>,
    /// The MCP tools the key may use (`{server}__{tool}` patterns); None: every tool.
    pub(crate) mcp_tools: Option<Rc<[String]>>,
}

/// The 404 of an unknown item, in the OpenAI error shape. A stored provider's name may be a
/// virtual key, itself a secret: it is not echoed.
pub(crate) fn not_found(kind: Kind, id: &str) -> GatewayError {
    let (code, message) = match kind {
        Kind::Key => ("invalid_api_key", "invalid x-gateway-api-key".to_string()),
        Kind::Config => ("config_not_found", format!("saved config '{}' not found in this workspace", shorten(id))),
        Kind::Provider => {
            ("provider_not_found", "stored provider (virtual key or @slug) not found in this workspace".into())
        }
        Kind::Guardrail => ("guardrail_not_found", format!("guardrail '{}' not found in this workspace", shorten(id))),
        Kind::Prompt => ("prompt_not_found", format!("prompt '{}' not found in this workspace", shorten(id))),
        Kind::Response => ("response_not_found", format!("Previous response with id '{}' not found.", shorten(id))),
        Kind::Policy => ("policy_not_found", "the workspace's limits were not found".to_string()),
        Kind::McpServer => ("unknown_mcp_server", format!("unknown MCP server '{}'", shorten(id))),
        Kind::McpServers => ("unknown_mcp_server", "the workspace's MCP servers were not found".to_string()),
    };
    let kind_name = if kind == Kind::Key { "authentication_error" } else { "invalid_request_error" };
    let status = if kind == Kind::Key { 401 } else { 404 };
    GatewayError::new(status, kind_name, message).with_code(code)
}

/// The 503 of a ref the control plane could not give and that was never read (or too long ago).
pub(crate) fn unavailable(r: &Ref, why: &str) -> GatewayError {
    let what = match r.kind {
        Kind::Key => "the gateway key".to_string(),
        kind => format!("{} '{}'", kind.noun(), shorten(&r.id)),
    };
    GatewayError::new(
        503,
        "api_error",
        format!("the control plane is unavailable ({why}) and {what} was not read before"),
    )
    .with_code("control_plane_unavailable")
}

fn shorten(id: &str) -> String {
    id.chars().take(64).collect()
}

/// The entry in a control-plane answer: 200 is found (a key's answer as it is, an item's
/// `value`), 404 absent; anything else is a failure, described for the log and the 503.
pub(crate) fn from_answer(r: &Ref, status: u16, body: &[u8]) -> Result<Entry, String> {
    match status {
        404 => return Ok(None),
        200 => {}
        0 => return Err("no answer".to_string()),
        status => return Err(format!("it answered {status}")),
    }
    let value: Value = serde_json::from_slice(body).map_err(|_| "its answer is not JSON".to_string())?;
    let value = match r.kind {
        Kind::Key => {
            let workspace = value.get("workspace").and_then(Value::as_str).filter(|w| valid_workspace(w));
            if workspace.is_none() {
                return Err("its answer names no valid workspace".to_string());
            }
            value
        }
        // The policy and a list are the answer itself.
        Kind::Policy | Kind::McpServers if value.is_object() => value,
        Kind::Policy | Kind::McpServers => return Err("its answer is not an object".to_string()),
        _ => match value {
            Value::Object(mut fields) => fields.remove("value").ok_or("its answer has no value")?,
            _ => return Err("its answer is not an object".to_string()),
        },
    };
    Ok(Some(Rc::new(value)))
}

/// A slot's value read apart: when it was read, until when it is used without asking again,
/// found or absent, whose it is, the payload.
struct Slot<'a> {
    fetched_ms: u64,
    fresh_until_ms: u64,
    found: bool,
    identity: &'a [u8],
    payload: &'a [u8],
}

const HEAD: usize = 21;

fn read_slot(value: &[u8]) -> Option<Slot<'_>> {
    let (fetched, rest) = value.split_first_chunk::<8>()?;
    let (fresh_until, rest) = rest.split_first_chunk::<8>()?;
    let (found, rest) = rest.split_first()?;
    let (length, rest) = rest.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_le_bytes(*length)).ok()?;
    Some(Slot {
        fetched_ms: u64::from_le_bytes(*fetched),
        fresh_until_ms: u64::from_le_bytes(*fresh_until),
        found: *found != 0,
        identity: rest.get(..length)?,
        payload: rest.get(length..)?,
    })
}

/// The slot that holds `r`: its key, its value (which [`read_slot`] reads) and the value's
/// compare-and-set token.
fn find(store: &dyn SharedStore, r: &Ref) -> Option<(String, Vec<u8>, u32)> {
    let identity = r.identity();
    r.slots().into_iter().find_map(|key| {
        let (value, cas) = store.get(&key)?;
        read_slot(&value).filter(|slot| slot.identity == identity.as_bytes())?;
        Some((key, value, cas))
    })
}

fn entry_of(slot: &Slot) -> Option<Entry> {
    match slot.found {
        false => Some(None),
        true => serde_json::from_slice(slot.payload).ok().map(|v| Some(Rc::new(v))),
    }
}

/// The entry of `r` in shared data while it is fresh (used without asking again), with the
/// end of its freshness.
pub(crate) fn fresh(store: &dyn SharedStore, r: &Ref, now_ms: u64) -> Option<(Entry, u64)> {
    let (_, value, _) = find(store, r)?;
    let slot = read_slot(&value).filter(|slot| now_ms <= slot.fresh_until_ms)?;
    entry_of(&slot).map(|entry| (entry, slot.fresh_until_ms))
}

/// The entry of `r` in shared data, when it was read at most `max_age_ms` before `now_ms`.
pub(crate) fn within(store: &dyn SharedStore, r: &Ref, now_ms: u64, max_age_ms: u64) -> Option<Entry> {
    let (_, value, _) = find(store, r)?;
    read_slot(&value).filter(|slot| now_ms.saturating_sub(slot.fetched_ms) <= max_age_ms).as_ref().and_then(entry_of)
}

/// `r`'s entry is used without asking again until `fresh_until_ms` (the control plane could
/// not answer: one call per window asks again, not one per request). When it was read is
/// kept, so the grace period still counts from there.
pub(crate) fn extend(store: &dyn SharedStore, r: &Ref, fresh_until_ms: u64) {
    let Some((key, mut value, cas)) = find(store, r) else {
        return;
    };
    if let Some(field) = value.get_mut(8..16) {
        field.copy_from_slice(&fresh_until_ms.to_le_bytes());
        // Another worker's newer write wins.
        store.set(&key, &value, cas);
    }
}

/// How much a slot's current value is worth keeping, lowest first: nothing (or garbage), an
/// absent entry, a found entry past the grace period, then found entries by when they were read.
fn worth(value: Option<&[u8]>, now_ms: u64, grace_ms: u64) -> (u8, u64) {
    match value.and_then(read_slot) {
        None => (0, 0),
        Some(slot) if !slot.found => (1, slot.fetched_ms),
        Some(slot) if now_ms.saturating_sub(slot.fetched_ms) > grace_ms => (2, slot.fetched_ms),
        Some(slot) => (3, slot.fetched_ms),
    }
}

/// Keeps `entry` of `r`, read at `now_ms`, in the slot that holds `r`, else in whichever of
/// its two slots is worth least (unless the entry is too large). An absent entry does not
/// replace another ref's found entry read within `grace_ms`: unknown ids (or made-up keys)
/// never push out what serves others while the control plane is down.
pub(crate) fn remember(store: &dyn SharedStore, r: &Ref, entry: &Entry, now_ms: u64, fresh_ms: u64, grace_ms: u64) {
    let payload = match entry {
        Some(value) => match serde_json::to_vec(value.as_ref()) {
            Ok(bytes) => bytes,
            Err(_) => return,
        },
        None => Vec::new(),
    };
    let identity = r.identity();
    if payload.len() + identity.len() > MAX_ENTRY_BYTES {
        return;
    }
    let key = match find(store, r) {
        Some((key, _, _)) => key,
        None => {
            let [first, second] = r.slots();
            let worth_of = |key: &str| worth(store.get(key).as_ref().map(|(v, _)| v.as_slice()), now_ms, grace_ms);
            let (first_worth, second_worth) = (worth_of(&first), worth_of(&second));
            let (key, worth) = if second_worth < first_worth { (second, second_worth) } else { (first, first_worth) };
            if entry.is_none() && worth.0 == 3 {
                return;
            }
            key
        }
    };
    let Ok(length) = u32::try_from(identity.len()) else {
        return;
    };
    let mut value = Vec::with_capacity(HEAD + identity.len() + payload.len());
    value.extend_from_slice(&now_ms.to_le_bytes());
    value.extend_from_slice(&now_ms.saturating_add(fresh_ms).to_le_bytes());
    value.push(u8::from(entry.is_some()));
    value.extend_from_slice(&length.to_le_bytes());
    value.extend_from_slice(identity.as_bytes());
    value.extend_from_slice(&payload);
    // Unconditional: the latest read wins the slot.
    if !store.set(&key, &value, 0) {
        log::warn!("a control-plane entry could not be kept in shared data");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::testing::FakeHost;
    use crate::unit_tests::test;
    use serde_json::json;

    const FRESH: u64 = 5000;
    const GRACE: u64 = 600_000;

    fn config(workspace: &str, id: &str) -> Ref {
        Ref { kind: Kind::Config, workspace: workspace.into(), id: id.into() }
    }

    #[test]
    fn keys_are_looked_up_by_their_hash_only() {
        let r = Ref::key(b"gw-secret");
        assert_eq!(r.id.len(), 64);
        assert!(!r.path().contains("gw-secret"));
        // sha256("abc")
        assert_eq!(
            Ref::key(b"abc").path(),
            "/internal/v1/keys/ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(config("team-a", "cfg.1").path(), "/internal/v1/workspaces/team-a/configs/cfg.1");
    }

    #[test]
    fn ids_outside_the_charset_are_never_sent() {
        for bad in ["", "a/b", "..%2f", "a b", "é", &"x".repeat(129)] {
            assert!(!valid_id(bad), "{bad}");
        }
        for good in ["a", "A-b_c.9", "123e4567-e89b-12d3-a456-426614174000"] {
            assert!(valid_id(good), "{good}");
        }
    }

    #[test]
    fn entries_are_fresh_then_stale_and_collisions_are_misses() {
        let host = FakeHost::new(0);
        let store = host.store();
        let a = config("ws", "a");
        assert_eq!(fresh(store, &a, 0), None);
        remember(store, &a, &Some(Rc::new(json!({"provider": "openai"}))), 1000, FRESH, GRACE);
        assert_eq!(fresh(store, &a, 6000).map(|(e, _)| e), Some(Some(Rc::new(json!({"provider": "openai"})))));
        assert_eq!(fresh(store, &a, 6001), None, "stale");
        assert!(within(store, &a, 6001, GRACE).is_some(), "within grace");
        assert!(within(store, &a, 1001 + GRACE, GRACE).is_none(), "past grace");
        // The control plane did not answer: fresh again for a while, grace still from the read.
        extend(store, &a, 12_000);
        assert!(fresh(store, &a, 12_000).is_some());
        assert!(within(store, &a, 1001 + GRACE, GRACE).is_none());
        // Another workspace's ref with the same id is another entry.
        assert_eq!(fresh(store, &config("other", "a"), 1000), None);
        // Absent entries are kept too.
        let b = config("ws", "b");
        remember(store, &b, &None, 1000, FRESH, GRACE);
        assert_eq!(fresh(store, &b, 1000).map(|(e, _)| e), Some(None));
        // A ref sharing a slot with `a` is a miss there, and never extends `a`'s entry.
        let [first, second] = a.slots();
        let sharing = |slot: &str, from: usize| {
            (from..100_000).map(|i| config("ws", &format!("x{i}"))).find(|r| r.slots().contains(&slot.to_string()))
        };
        let other = sharing(&first, 0).unwrap();
        assert_eq!(fresh(store, &other, 1000), None);
        extend(store, &other, 99_999);
        assert_eq!(fresh(store, &other, 1000), None, "never extends another's entry");
        // Writes 5,000 other refs' entries (five times the slots) at `at`: whether `target` is gone.
        let push_out = |target: &Ref, entry: Entry, at: u64| {
            for i in 0..5000 {
                remember(store, &config(&format!("p{at}"), &format!("{i}")), &entry, at, FRESH, GRACE);
            }
            within(store, target, at, u64::MAX).is_none()
        };
        // Absent never pushes out a usable found entry.
        assert!(!push_out(&a, None, 2000), "kept");
        // A found entry takes the other slot: both serve.
        let beside = (0..100_000)
            .map(|i| config("ws", &format!("y{i}")))
            .find(|r| r.slots().contains(&first) && !r.slots().contains(&second))
            .unwrap();
        remember(store, &beside, &Some(Rc::new(json!(2))), 3000, FRESH, GRACE);
        assert!(fresh(store, &a, 3000).is_some(), "a kept beside it");
        assert_eq!(fresh(store, &beside, 3000).map(|(e, _)| e), Some(Some(Rc::new(json!(2)))));
        // A hundred later reads of other refs leave it in place.
        for i in 0..100 {
            remember(store, &config("many", &format!("{i}")), &Some(Rc::new(json!(i))), 3500, FRESH, GRACE);
        }
        assert!(within(store, &a, 3500, GRACE).is_some(), "still read");
        // Later reads of other refs in both of its slots push it out.
        assert!(push_out(&a, Some(Rc::new(json!(3))), 4000), "pushed out by later reads");
        // Absent entries replace found ones past the grace period.
        let late = config("ws", "late");
        remember(store, &late, &Some(Rc::new(json!(1))), 0, FRESH, GRACE);
        assert!(push_out(&late, None, GRACE + 1), "replaced once past grace");
        // Keys have slots of their own.
        assert!(Ref::key(b"k").slots().iter().all(|slot| slot.starts_with("cp:key:")));
    }

    #[test]
    fn large_entries_are_not_kept() {
        let host = FakeHost::new(0);
        let big = config("ws", "big");
        remember(host.store(), &big, &Some(Rc::new(json!("x".repeat(MAX_ENTRY_BYTES)))), 0, FRESH, GRACE);
        assert_eq!(fresh(host.store(), &big, 0), None);
    }

    #[test]
    fn answers_become_entries_or_failures() {
        let key = Ref::key(b"k");
        assert_eq!(
            from_answer(&key, 200, br#"{"workspace":"team-a","admin":false}"#).unwrap().unwrap()["workspace"],
            "team-a"
        );
        assert!(from_answer(&key, 200, br#"{"workspace":"a/b"}"#).is_err());
        let c = config("ws", "c");
        assert_eq!(
            from_answer(&c, 200, br#"{"id":"u","value":{"retry":{"attempts":1}}}"#).unwrap().unwrap()["retry"]
                ["attempts"],
            1
        );
        assert_eq!(from_answer(&c, 404, b"").unwrap(), None);
        for (status, body) in [(0, &b""[..]), (500, b"{}"), (401, b"{}"), (200, b"nope"), (200, b"{}")] {
            assert!(from_answer(&c, status, body).is_err(), "{status}");
        }
    }
}
