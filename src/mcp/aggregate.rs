//! The aggregate endpoint `POST /mcp` (docs/mcp.md): every server the caller may use, as one
//! MCP server of the 2025 era. The gateway answers `initialize`, `ping` and notifications
//! itself; a list (`tools/list`, `prompts/list`) is gathered from every server, each name
//! prefixed `{server}__` (server ids never hold `__`, so the prefix is unambiguous); a
//! `tools/call` or `prompts/get` goes to the server its prefix names, the name unprefixed.
//!
//! The gateway speaks to each server in the client's era when the server has it, else in the
//! other ([`Backend`]): in the session era, in a session of the server's own for each client
//! session, opened on first use (`initialize`, then `notifications/initialized`); in the
//! stateless era, in none, once `server/discover` said the server speaks it. What was found is
//! kept in shared data, so any worker finds it; a session that expired, or that another replica
//! never saw, is opened again without the client noticing.

use super::message::{answer_in, for_era};
use super::message::{prefixed, SEPARATOR};
use super::tools::ToolPolicy;
use crate::hash::Hasher;
use crate::ports::SharedStore;
use base64::Engine as _;
use gateway_schema::mcp_servers::Failure;
use serde_json::{json, Value};

/// The protocol versions of the session era the endpoint speaks, newest first.
const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The stateless era's version: a client of it sends it on every request, asks
/// `server/discover` instead of `initialize`, and refuses a result without `resultType`.
pub(crate) const STATELESS_VERSION: &str = "2026-07-28";
/// Pages of one server's list followed at most (a server whose cursor never ends is cut).
const MAX_PAGES: u32 = 20;
/// Slots of the servers' sessions in shared data (`mcp:session:0` ..).
const SESSION_SLOTS: u64 = 1024;
/// Slots of the servers' lists in shared data (`mcp:list:0` ..).
const LIST_SLOTS: u64 = 256;
/// A server's list larger than this (as JSON) is not kept.
const MAX_KEPT_LIST: usize = 256 * 1024;
/// How long a server's list is kept when it does not say (the session era's never do).
const DEFAULT_LIST_TTL_MS: u64 = 5_000;
/// The longest a list is kept, whatever its server says: a changed list is seen this soon.
const MAX_LIST_TTL_MS: u64 = 600_000;
/// A client's session id longer than this is not one of the gateway's (a sealed one is at most
/// ~5.5 KB: `super::sealed`).
pub(crate) const MAX_SESSION_ID: usize = 8192;
/// A server's session id longer than this is not kept (the server then keeps none for us).
const MAX_SERVER_SESSION_ID: usize = 1024;

/// What a list gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Tools,
    Prompts,
}

impl List {
    pub(crate) fn method(self) -> &'static str {
        match self {
            List::Tools => "tools/list",
            List::Prompts => "prompts/list",
        }
    }

    /// The result's field that holds the items.
    fn field(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
        }
    }
}

/// What the gateway does with a message POSTed to the aggregate endpoint.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// Answered with this result; `initialize` also starts a session.
    Result { result: Value, new_session: bool },
    /// A notification or a client's answer: accepted, nothing to say (202).
    Accepted,
    /// A notification every server of the client's session gets as it is (202 to the client).
    Broadcast(Vec<u8>),
    /// Gathered from every server.
    Gather(List),
    /// Sent to one server (by its index among the members) as `body`: a call with the name
    /// unprefixed (`name`), or a client's answer to the server's request, its id restored.
    Route { member: usize, name: Option<String>, body: Vec<u8> },
    /// A JSON-RPC error answer (200: the request was read).
    Error(Vec<u8>),
}

/// The plan for `message` (already read as one JSON-RPC message, `id` its id) among `members`:
/// the servers the caller may use, each with what it may use of their tools (None: every tool).
pub(crate) fn plan(message: &Value, id: Option<&Value>, members: &[(&str, Option<&ToolPolicy>)]) -> Plan {
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return answer_plan(message, id, members);
    };
    let Some(id) = id else {
        // The server the cancelled request went to stops it; the others ignore a request id
        // they do not know, as the spec lets them.
        if method == "notifications/cancelled" {
            return Plan::Broadcast(message.to_string().into_bytes());
        }
        return Plan::Accepted;
    };
    let params = message.get("params");
    match method {
        "initialize" => {
            let asked = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str);
            let version = VERSIONS.iter().find(|v| Some(**v) == asked).unwrap_or(&VERSIONS[0]);
            let result = json!({
                "protocolVersion": version,
                "capabilities": capabilities(),
                "serverInfo": {"name": "model-gateway", "version": env!("CARGO_PKG_VERSION")},
                "instructions": INSTRUCTIONS,
            });
            Plan::Result { result, new_session: true }
        }
        "server/discover" => {
            let mut versions = vec![STATELESS_VERSION];
            versions.extend(VERSIONS);
            let result = json!({
                "supportedVersions": versions,
                "capabilities": capabilities(),
                "instructions": INSTRUCTIONS,
                "ttlMs": 0,
                "cacheScope": "private",
            });
            Plan::Result { result, new_session: false }
        }
        "ping" => Plan::Result { result: json!({}), new_session: false },
        "tools/list" => Plan::Gather(List::Tools),
        "prompts/list" => Plan::Gather(List::Prompts),
        "resources/list" => Plan::Result { result: json!({"resources": []}), new_session: false },
        "resources/templates/list" => Plan::Result { result: json!({"resourceTemplates": []}), new_session: false },
        "tools/call" | "prompts/get" => {
            let what = if method == "tools/call" { "tool" } else { "prompt" };
            let full = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
            let unknown = || Plan::Error(error(id, -32602, &format!("Unknown {what}: {}", cut(full))));
            let Some((server, name)) = full.split_once(SEPARATOR) else {
                return unknown();
            };
            let Some(member) = members.iter().position(|(id, _)| *id == server) else {
                return unknown();
            };
            let policy = members.get(member).and_then(|(_, policy)| *policy);
            let withheld = what == "tool" && policy.is_some_and(|policy| !policy.permits(name));
            if withheld || name.is_empty() {
                return unknown();
            }
            Plan::Route { member, name: Some(name.to_string()), body: unprefixed(message.clone(), name) }
        }
        _ => Plan::Error(error(id, METHOD_NOT_FOUND, &format!("Method not found: {}", cut(method)))),
    }
}

const INSTRUCTIONS: &str = "Every MCP server this gateway key may use; each tool and prompt is named {server}__{name}.";

fn capabilities() -> Value {
    json!({"tools": {"listChanged": false}, "prompts": {"listChanged": false}})
}

/// A client's answer (`result` or `error`) to a server's request: to the server whose request
/// id it carries (`server_request_id`), the id restored. An answer to none of theirs is
/// accepted and dropped: no server waits for it.
fn answer_plan(message: &Value, id: Option<&Value>, members: &[(&str, Option<&ToolPolicy>)]) -> Plan {
    let routed = id.and_then(Value::as_str).and_then(|id| {
        let (server, original) = id.split_once(SEPARATOR)?;
        let member = members.iter().position(|(known, _)| *known == server)?;
        let original = serde_json::from_str::<Value>(original).ok().filter(|v| v.is_string() || v.is_number())?;
        Some((member, original))
    });
    let Some((member, original)) = routed else {
        return Plan::Accepted;
    };
    let mut message = message.clone();
    if let Some(fields) = message.as_object_mut() {
        fields.insert("id".to_string(), original);
    }
    Plan::Route { member, name: None, body: message.to_string().into_bytes() }
}

fn cut(text: &str) -> String {
    text.chars().take(128).collect()
}

/// A JSON-RPC error answer to request `id`.
pub(crate) fn error(id: &Value, code: i64, message: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string().into_bytes()
}

/// A JSON-RPC result answer to request `id`.
pub(crate) fn result(id: &Value, result: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string().into_bytes()
}

/// `message` (a `tools/call` or `prompts/get`) as its server gets it: its name unprefixed.
fn unprefixed(mut message: Value, name: &str) -> Vec<u8> {
    if let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) {
        params.insert("name".to_string(), Value::String(name.to_string()));
    }
    message.to_string().into_bytes()
}

/// The `Mcp-Name` header of a stateless-era request naming `name`: the name as it is when it is
/// printable ASCII without edge spaces, else in the spec's `=?base64?...?=` form.
pub(crate) fn name_header(name: &str) -> String {
    let plain = name.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && name.trim() == name;
    if plain && !(name.starts_with("=?base64?") && name.ends_with("?=")) {
        return name.to_string();
    }
    format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(name))
}

/// The client's session id, when it may be one of the gateway's.
pub(crate) fn client_session(header: Option<&[u8]>) -> Option<&str> {
    std::str::from_utf8(header?).ok().filter(|id| is_session_id(id, MAX_SESSION_ID))
}

/// Whether `id` may be a session id (visible ASCII, as MCP says), at most `max` bytes.
fn is_session_id(id: &str, max: usize) -> bool {
    (1..=max).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A server's session, as the gateway holds it: the server's `Mcp-Session-Id` (none for a
/// server that keeps none) and the protocol version it answered ([`STATELESS_VERSION`]: the
/// server speaks the stateless era, and there is no session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) id: Option<String>,
    pub(crate) version: String,
}

impl Session {
    fn is_stateless(&self) -> bool {
        self.version == STATELESS_VERSION
    }

    /// The session as text, after whose it is (`owner`): the form shared data and sealed session
    /// ids keep it in (`owner\0id\0version`; neither an owner nor an id nor a version holds `\0`).
    pub(crate) fn text(&self, owner: &str) -> String {
        format!("{owner}\0{}\0{}", self.id.as_deref().unwrap_or_default(), self.version)
    }

    /// A session's [`Session::text`]: whose it is, and the session.
    pub(crate) fn from_text(text: &str) -> Option<(&str, Session)> {
        let mut parts = text.split('\0');
        let (owner, id, version) = (parts.next()?, parts.next()?, parts.next()?);
        let id = (!id.is_empty()).then(|| id.to_string());
        Some((owner, Session { id, version: version.to_string() }))
    }
}

/// Whose a server's session is: the caller (its key), the client's session with the gateway,
/// and the server. Never the key itself.
pub(crate) fn session_identity(caller: &str, client_session: Option<&str>, server: &str) -> String {
    format!("{caller}\n{}\n{server}", client_session.unwrap_or_default())
}

fn session_slot(identity: &str) -> String {
    let hash = Hasher::seeded(7).part(Some(identity.as_bytes())).finish();
    format!("mcp:session:{}", hash % SESSION_SLOTS)
}

/// The session kept for `identity`, if its slot still holds it.
pub(crate) fn kept_session(store: &dyn SharedStore, identity: &str) -> Option<Session> {
    let (value, _) = store.get(&session_slot(identity))?;
    let (owner, session) = Session::from_text(std::str::from_utf8(&value).ok()?)?;
    (owner == identity).then_some(session)
}

/// Forgets the session kept for `identity` when it is still the one with `id` (a session
/// opened since by another request stays).
pub(crate) fn forget_session(store: &dyn SharedStore, identity: &str, id: Option<&str>) {
    if kept_session(store, identity).is_some_and(|kept| kept.id.as_deref() == id) {
        keep_session(store, identity, None);
    }
}

/// Keeps `session` for `identity` (the latest wins the slot); None forgets it.
pub(crate) fn keep_session(store: &dyn SharedStore, identity: &str, session: Option<&Session>) {
    let value = match session {
        Some(session) => session.text(identity),
        None if kept_session(store, identity).is_some() => String::new(),
        None => return,
    };
    store.set(&session_slot(identity), value.as_bytes(), 0);
}

/// Whose a server's kept list is: the workspace (lists are kept per workspace), the server (by
/// its id and URL: a server moved elsewhere is asked again) and the list.
pub(crate) fn list_identity(workspace: &str, id: &str, server: &super::Server, list: List) -> String {
    let upstream = &server.upstream;
    let scheme = if upstream.tls { "https" } else { "http" };
    format!("{workspace}\n{id}\n{scheme}://{}{}\n{}", upstream.authority, upstream.base_path, list.method())
}

/// The two slots a list may sit in (two ways: lists whose first slots collide both stay kept,
/// unless their second slots collide too).
fn list_slots(identity: &str) -> [String; 2] {
    let hash = Hasher::seeded(11).part(Some(identity.as_bytes())).finish();
    [hash % LIST_SLOTS, (hash / LIST_SLOTS) % LIST_SLOTS].map(|slot| format!("mcp:list:{slot}"))
}

/// A kept list's entry in a slot: whose it is, until when it is fresh, and the items as JSON.
fn list_entry(value: &[u8]) -> Option<(&[u8], u64, &[u8])> {
    let mut parts = value.splitn(3, |byte| *byte == 0);
    let identity = parts.next()?;
    let expires = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    Some((identity, expires, parts.next()?))
}

/// The list kept for `identity`, while it is fresh at `now_ms`.
pub(crate) fn kept_list(store: &dyn SharedStore, identity: &str, now_ms: u64) -> Option<Vec<Value>> {
    list_slots(identity).iter().find_map(|slot| {
        let (value, _) = store.get(slot)?;
        let (whose, expires, items) = list_entry(&value)?;
        if whose != identity.as_bytes() || now_ms >= expires {
            return None;
        }
        serde_json::from_slice(items).ok()
    })
}

/// Keeps a server's list (`items`) for `identity` for `ttl_ms` from `now_ms`: in its slot that
/// holds it already, or is free or stale, else in its first; a list too large to keep is not.
pub(crate) fn keep_list(store: &dyn SharedStore, identity: &str, items: &[Value], (ttl_ms, now_ms): (u64, u64)) {
    let Ok(json) = serde_json::to_vec(items) else {
        return;
    };
    if json.len() > MAX_KEPT_LIST {
        return;
    }
    let [first, second] = list_slots(identity);
    let usable = |slot: &String| match store.get(slot) {
        None => true,
        Some((value, _)) => {
            list_entry(&value).is_none_or(|(whose, expires, _)| whose == identity.as_bytes() || now_ms >= expires)
        }
    };
    let slot = if !usable(&first) && usable(&second) { second } else { first };
    let mut value = format!("{identity}\0{}\0", now_ms.saturating_add(ttl_ms)).into_bytes();
    value.extend_from_slice(&json);
    store.set(&slot, &value, 0);
}

/// One call the gateway makes to a server: its body and the MCP headers it carries.
#[derive(Debug, PartialEq)]
pub(crate) struct BackendCall {
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Vec<(String, String)>,
}

/// What the gateway wants of one server: its session opened (to route a request there), or a
/// list gathered from it. Without a kept session, the handshake of the client's era goes first
/// (`server/discover` or `initialize`); a server that refuses it gets the other era's.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) server: String,
    session: Option<Session>,
    /// Whether the client speaks the stateless era (its handshake goes first).
    client_stateless: bool,
    /// Handshakes tried since the session was last opened (the second is the last).
    handshakes: u8,
    /// Whether the session was opened by this backend (to be kept once the server took
    /// `notifications/initialized`).
    opened: bool,
    initialized: bool,
    step: Step,
    list: Option<List>,
    /// The list's items so far, as the server named them.
    pub(crate) items: Vec<Value>,
    /// The shortest `ttlMs` of the list's pages so far.
    ttl_ms: Option<u64>,
    /// Whether the items came from the list kept in shared data.
    kept: bool,
    /// The tool whose input schema a session-era client's call to a stateless server needs
    /// (its `Mcp-Param-*` headers), found by listing the server's tools until it shows.
    schema_of: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Step {
    Discover,
    Initialize,
    Initialized,
    /// Asking for the list's page after `cursor`.
    Page {
        cursor: Option<String>,
        pages: u32,
    },
    Ready,
    Failed(String),
}

/// JSON-RPC's code for a method the server does not have.
const METHOD_NOT_FOUND: i64 = -32601;

/// The ids of the gateway's own requests to servers.
const INITIALIZE_ID: &str = "gateway-initialize";
const DISCOVER_ID: &str = "gateway-discover";
const LIST_ID: &str = "gateway-list";

impl Backend {
    /// `server`'s backend for a client of the stateless era or not, with the session kept for
    /// it (if any); `list`: what to gather.
    pub(crate) fn new(server: &str, client_stateless: bool, session: Option<Session>, list: Option<List>) -> Backend {
        let step = match (&session, list) {
            (None, _) => Step::Initialize,
            (Some(_), Some(_)) => Step::Page { cursor: None, pages: 0 },
            (Some(_), None) => Step::Ready,
        };
        let mut backend = Backend {
            server: server.to_string(),
            session,
            client_stateless,
            handshakes: 0,
            opened: false,
            initialized: false,
            step,
            list,
            items: Vec::new(),
            ttl_ms: None,
            kept: false,
            schema_of: None,
        };
        if backend.step == Step::Initialize {
            backend.step = backend.handshake();
        }
        backend
    }

    /// This backend for a call of `tool` by a session-era client: to a server of the stateless
    /// era it also finds the tool's input schema, in `listed` (the tools kept for the server)
    /// or else by listing them.
    pub(crate) fn for_call(mut self, tool: &str, listed: Option<Vec<Value>>) -> Backend {
        if self.client_stateless {
            return self;
        }
        self.schema_of = Some(tool.to_string());
        self.items = listed.unwrap_or_default();
        if self.step == Step::Ready {
            self.step = self.after_handshake();
        }
        self
    }

    /// The input schema of the tool a call needs it of, once found.
    pub(crate) fn input_schema(&self) -> Option<&Value> {
        let tool = self.schema_of.as_deref()?;
        let item = self.items.iter().find(|item| item.get("name").and_then(Value::as_str) == Some(tool))?;
        item.get("inputSchema")
    }

    /// What it gathers: its list, or the tools a call's schema is found in (a stateless server's,
    /// for a session-era client, until the tool shows).
    fn gathers(&self) -> Option<List> {
        let schema_wanted = self.schema_of.is_some() && self.is_stateless() && self.input_schema().is_none();
        self.list.or(schema_wanted.then_some(List::Tools))
    }

    /// `server`'s backend whose list is the one kept for it: nothing to ask.
    pub(crate) fn listed(server: &str, items: Vec<Value>) -> Backend {
        let mut backend = Backend::new(server, false, None, None);
        backend.step = Step::Ready;
        backend.items = items;
        backend.kept = true;
        backend
    }

    /// How long the list it gathered may be kept: None when it was kept already, failed, or
    /// its server said not to keep it (`ttlMs: 0`).
    pub(crate) fn list_ttl_ms(&self) -> Option<u64> {
        if self.kept || self.list.is_none() || self.step != Step::Ready {
            return None;
        }
        let ttl = self.ttl_ms.unwrap_or(DEFAULT_LIST_TTL_MS).min(MAX_LIST_TTL_MS);
        (ttl > 0).then_some(ttl)
    }

    /// The next handshake to try: the client's era's first, then the other's (None once both
    /// were tried).
    fn handshake(&mut self) -> Step {
        self.handshakes += 1;
        match (self.handshakes, self.client_stateless) {
            (1, true) | (2, false) => Step::Discover,
            (1, false) | (2, true) => Step::Initialize,
            _ => Step::Failed("it speaks neither protocol era the gateway does".to_string()),
        }
    }

    /// Whether requests to the server go in the stateless era.
    pub(crate) fn is_stateless(&self) -> bool {
        self.session.as_ref().is_some_and(Session::is_stateless)
    }

    /// The call to make now; None once ready or failed.
    pub(crate) fn next_call(&self) -> Option<BackendCall> {
        let body = match &self.step {
            Step::Discover => {
                let params = json!({"_meta": envelope()});
                let body = json!({"jsonrpc": "2.0", "id": DISCOVER_ID, "method": "server/discover", "params": params});
                let mut headers = self.session_headers();
                headers.push(("mcp-protocol-version".to_string(), STATELESS_VERSION.to_string()));
                headers.push(("mcp-method".to_string(), "server/discover".to_string()));
                return Some(BackendCall { body: body.to_string().into_bytes(), headers });
            }
            Step::Initialize => json!({"jsonrpc": "2.0", "id": INITIALIZE_ID, "method": "initialize", "params": {
                "protocolVersion": VERSIONS[0],
                // What the server may ask on a call's stream: the client answers through the
                // gateway (one that cannot answers an error, as it would the server directly).
                "capabilities": {"elicitation": {}, "sampling": {}},
                "clientInfo": {"name": "model-gateway", "version": env!("CARGO_PKG_VERSION")},
            }}),
            Step::Initialized => json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            Step::Page { cursor, .. } => {
                let method = self.gathers().map(List::method).unwrap_or_default();
                let mut params = match cursor {
                    Some(cursor) => json!({"cursor": cursor}),
                    None => json!({}),
                };
                if let (true, Some(fields)) = (self.is_stateless(), params.as_object_mut()) {
                    fields.insert("_meta".to_string(), envelope());
                }
                let mut headers = self.session_headers();
                headers.extend(self.method_header(method));
                let body = json!({"jsonrpc": "2.0", "id": LIST_ID, "method": method, "params": params});
                return Some(BackendCall { body: body.to_string().into_bytes(), headers });
            }
            Step::Ready | Step::Failed(_) => return None,
        };
        Some(BackendCall { body: body.to_string().into_bytes(), headers: self.session_headers() })
    }

    /// The `Mcp-Method` header a request of `method` carries to a server of the stateless era.
    pub(crate) fn method_header(&self, method: &str) -> Option<(String, String)> {
        self.is_stateless().then(|| ("mcp-method".to_string(), method.to_string()))
    }

    /// The headers that put a request in the server's session.
    pub(crate) fn session_headers(&self) -> Vec<(String, String)> {
        let mut headers = vec![("accept".to_string(), "application/json, text/event-stream".to_string())];
        if let Some(session) = &self.session {
            headers.push(("mcp-protocol-version".to_string(), session.version.clone()));
            if let Some(id) = &session.id {
                headers.push(("mcp-session-id".to_string(), id.clone()));
            }
        }
        headers
    }

    /// The answer to the last call: `status` (0: none), the answer's `session_id` header
    /// and content type, and its body.
    pub(crate) fn answered(&mut self, status: u16, session_id: Option<&str>, content_type: &[u8], body: &[u8]) {
        let step = std::mem::replace(&mut self.step, Step::Ready);
        // A call's schema is looked for, not needed: without it the call goes on (the server
        // then says what it misses).
        let schema_only = matches!(step, Step::Page { .. }) && self.list.is_none();
        self.step = match step {
            // A session the server no longer knows (it expired, or was another replica's):
            // opened again, once.
            _ if status == 404 && self.session.is_some() && !self.opened => {
                self.session = None;
                // The list starts again in the new session.
                self.items.clear();
                self.ttl_ms = None;
                self.handshakes = 0;
                self.handshake()
            }
            // A server that refuses one era's handshake (as a bad request, an unknown path or
            // method, or with an error) may speak the other; one that refuses the caller (401,
            // 403, 429) fails with its status.
            Step::Discover | Step::Initialize if matches!(status, 400 | 404 | 405 | 406) => self.handshake(),
            Step::Discover => match answer_in(content_type, body, &json!(DISCOVER_ID)) {
                Some(answer) => {
                    let versions = answer.pointer("/result/supportedVersions").and_then(Value::as_array);
                    match versions.is_some_and(|v| v.iter().any(|v| v == STATELESS_VERSION)) {
                        true => {
                            self.session = Some(Session { id: None, version: STATELESS_VERSION.to_string() });
                            self.opened = true;
                            self.initialized = true;
                            self.after_handshake()
                        }
                        false => self.handshake(),
                    }
                }
                None if (200..300).contains(&status) => self.handshake(),
                None => Step::Failed(Backend::unanswered(status)),
            },
            _ if !(200..300).contains(&status) => Step::Failed(Backend::unanswered(status)),
            Step::Initialize => match answer_in(content_type, body, &json!(INITIALIZE_ID)) {
                // A version goes in a header and a sealed session id: visible ASCII only.
                Some(answer) => match answer.pointer("/result/protocolVersion").and_then(Value::as_str) {
                    Some(version) if is_session_id(version, 64) => {
                        let id = session_id.filter(|id| is_session_id(id, MAX_SERVER_SESSION_ID));
                        self.session = Some(Session { id: id.map(str::to_string), version: version.to_string() });
                        self.opened = true;
                        Step::Initialized
                    }
                    _ => self.handshake(),
                },
                None => Step::Failed("its answer to initialize is not JSON-RPC".to_string()),
            },
            Step::Initialized => {
                self.initialized = true;
                self.after_handshake()
            }
            Step::Page { pages, .. } => self.page(content_type, body, pages + 1),
            done => done,
        };
        if schema_only && matches!(self.step, Step::Failed(_)) {
            self.step = Step::Ready;
        }
    }

    fn after_handshake(&self) -> Step {
        match self.gathers() {
            Some(_) => Step::Page { cursor: None, pages: 0 },
            None => Step::Ready,
        }
    }

    fn unanswered(status: u16) -> String {
        match status {
            0 => "it did not answer".to_string(),
            status => format!("it answered HTTP {status}"),
        }
    }

    fn page(&mut self, content_type: &[u8], body: &[u8], pages: u32) -> Step {
        let field = self.gathers().map(List::field).unwrap_or_default();
        let Some(answer) = answer_in(content_type, body, &json!(LIST_ID)) else {
            return Step::Failed("its list is not JSON-RPC".to_string());
        };
        // A server without prompts (or tools) may not know the list's method: it has none.
        if answer.pointer("/error/code").and_then(Value::as_i64) == Some(METHOD_NOT_FOUND) {
            return Step::Ready;
        }
        if let Some(message) = answer.pointer("/error/message").and_then(Value::as_str) {
            return Step::Failed(format!("it answered the list with an error: {}", cut(message)));
        }
        let Some(items) = answer.get("result").and_then(|r| r.get(field)).and_then(Value::as_array) else {
            return Step::Failed(format!("its list has no {field}"));
        };
        self.items.extend(items.iter().cloned());
        if let Some(ttl) = answer.pointer("/result/ttlMs").and_then(Value::as_u64) {
            self.ttl_ms = Some(self.ttl_ms.map_or(ttl, |kept| kept.min(ttl)));
        }
        match answer.pointer("/result/nextCursor").and_then(Value::as_str) {
            Some(cursor) if pages < MAX_PAGES && self.gathers().is_some() => {
                Step::Page { cursor: Some(cursor.to_string()), pages }
            }
            _ => Step::Ready,
        }
    }

    /// Why the server could not serve, once it could not.
    pub(crate) fn failure(&self) -> Option<&str> {
        match &self.step {
            Step::Failed(why) => Some(why),
            _ => None,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.step, Step::Ready | Step::Failed(_))
    }

    /// The server's id of the session requests go in.
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.session.as_ref().and_then(|session| session.id.as_deref())
    }

    /// The session this backend opened, to be kept for the next request (its list may still
    /// have failed).
    pub(crate) fn opened_session(&self) -> Option<&Session> {
        self.session.as_ref().filter(|_| self.opened && self.initialized)
    }
}

/// The envelope a request of the stateless era carries in `params._meta`: the version, and
/// what the gateway can answer of the server's (nothing: a stateless server cannot ask).
fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "model-gateway", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// A session-era client's request (`body`) as a server of the stateless era takes it: with the
/// envelope in `params._meta` (what the client put there stays).
pub(crate) fn enveloped(body: &[u8]) -> Vec<u8> {
    let Ok(mut message) = serde_json::from_slice::<Value>(body) else {
        return body.to_vec();
    };
    if let Some(fields) = message.as_object_mut() {
        let params = fields.entry("params").or_insert_with(|| json!({}));
        if let Some(params) = params.as_object_mut() {
            let meta = params.entry("_meta").or_insert_with(|| json!({}));
            if let (Some(meta), Value::Object(envelope)) = (meta.as_object_mut(), envelope()) {
                for (key, value) in envelope {
                    meta.entry(key).or_insert(value);
                }
            }
        }
    }
    message.to_string().into_bytes()
}

/// The aggregate's answer to a list: every server's items, in the members' order, each name
/// prefixed with its server's id, the tools a caller may not use left out. A server that
/// failed is left out (`failure: open`), or fails the list (`closed`): the error then.
pub(crate) fn merged(
    list: List,
    id: &Value,
    backends: &[(&Backend, Option<&ToolPolicy>, Failure)],
    stateless: bool,
) -> Result<Vec<u8>, Vec<u8>> {
    let mut items = Vec::new();
    for (backend, policy, failure) in backends {
        if let Some(why) = backend.failure() {
            if *failure == Failure::Closed {
                let message = format!("MCP server '{}' could not list its {}: {why}", backend.server, list.field());
                return Err(error(id, -32000, &message));
            }
            continue;
        }
        for item in &backend.items {
            let Some(name) = item.get("name").and_then(Value::as_str) else {
                continue;
            };
            if list == List::Tools && policy.is_some_and(|policy| !policy.permits(name)) {
                continue;
            }
            let mut item = item.clone();
            if let Some(fields) = item.as_object_mut() {
                fields.insert("name".to_string(), Value::String(prefixed(&backend.server, name)));
            }
            items.push(item);
        }
    }
    let list = match stateless {
        // Lists are the stateless era's cacheable results: this one is the caller's own, and
        // asked again each time (the servers' own ttlMs are not read yet).
        true => json!({ list.field(): items, "ttlMs": 0, "cacheScope": "private" }),
        false => json!({ list.field(): items }),
    };
    Ok(result(id, for_era(list, stateless)))
}

#[cfg(test)]
mod tests;
