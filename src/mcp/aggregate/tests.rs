use super::*;
use crate::mcp::message::server_request_id;
use crate::ports::testing::FakeHost;
use crate::ports::Host;
use crate::unit_tests::test;
use gateway_schema::mcp_servers::Tools;

fn request(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
}

fn json_answer(id: &str, result: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string().into_bytes()
}

/// The server's answer to the gateway's `initialize`: session `session`, at `version`.
fn initialized_as(backend: &mut Backend, session: &str, version: &str) {
    let answer = json_answer(INITIALIZE_ID, json!({"protocolVersion": version}));
    backend.answered(200, Some(session), b"application/json", &answer);
}

#[test]
fn the_gateway_answers_initialize_ping_and_notifications_itself() {
    let id = json!(7);
    let Plan::Result { result, new_session: true } =
        plan(&request("initialize", json!({"protocolVersion": "2025-06-18"})), Some(&id), &[])
    else {
        panic!("initialize is the gateway's");
    };
    assert_eq!(result["protocolVersion"], "2025-06-18", "the client's version, when spoken");
    assert_eq!(result["capabilities"]["tools"], json!({"listChanged": false}));
    let Plan::Result { result, .. } =
        plan(&request("initialize", json!({"protocolVersion": "1999-01-01"})), Some(&id), &[])
    else {
        panic!();
    };
    assert_eq!(result["protocolVersion"], VERSIONS[0], "else the newest");
    assert_eq!(
        plan(&request("ping", json!({})), Some(&id), &[]),
        Plan::Result { result: json!({}), new_session: false }
    );
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(plan(&notification, None, &[]), Plan::Accepted);
    // A cancellation goes to the servers, as it came.
    let cancelled = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}});
    assert_eq!(plan(&cancelled, None, &[]), Plan::Broadcast(cancelled.to_string().into_bytes()));
    assert_eq!(plan(&json!({"jsonrpc": "2.0", "id": 1, "result": {}}), Some(&json!(1)), &[]), Plan::Accepted);
    let Plan::Error(body) = plan(&request("sampling/createMessage", json!({})), Some(&id), &[]) else {
        panic!();
    };
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((body["id"].clone(), body["error"]["code"].clone()), (id, json!(-32601)));
}

#[test]
fn calls_go_to_the_server_their_prefix_names_unless_withheld() {
    let id = json!(7);
    let policy = ToolPolicy::new("files", &Tools::Deny(vec!["delete".into()]), None).unwrap();
    let members: [(&str, Option<&ToolPolicy>); 2] = [("search", None), ("files", Some(&policy))];
    let call = |name: &str| {
        plan(&request("tools/call", json!({"name": name, "arguments": {"path": "a__b"}})), Some(&id), &members)
    };
    let routed = |plan: Plan| match plan {
        Plan::Route { member, name, body } => (member, name, serde_json::from_slice::<Value>(&body).unwrap()),
        other => panic!("{other:?}"),
    };
    let (member, name, sent) = routed(call("files__read"));
    assert_eq!((member, name.as_deref()), (1, Some("read")));
    assert_eq!(sent["params"], json!({"name": "read", "arguments": {"path": "a__b"}}), "the arguments as they came");
    assert_eq!(sent["id"], 7);
    let (member, name, _) = routed(call("search__web__deep"));
    assert_eq!((member, name.as_deref()), (0, Some("web__deep")), "the first __ splits");
    for refused in ["files__delete", "nope__read", "read", "files__", ""] {
        let Plan::Error(body) = call(refused) else {
            panic!("{refused}");
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], -32602);
        assert_eq!(body["error"]["message"], format!("Unknown tool: {refused}"));
    }
    // Prompts are not tools: the tool policy leaves them alone.
    let (member, name, _) =
        routed(plan(&request("prompts/get", json!({"name": "files__delete"})), Some(&id), &members));
    assert_eq!((member, name.as_deref()), (1, Some("delete")));
}

#[test]
fn a_clients_answer_goes_to_the_server_whose_request_it_answers() {
    let members: [(&str, Option<&ToolPolicy>); 2] = [("search", None), ("files", None)];
    for original in [json!(0), json!("elicit-1")] {
        let id = json!(server_request_id("files", &original));
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept"}});
        let Plan::Route { member: 1, name: None, body } = plan(&answer, Some(&id), &members) else {
            panic!("{original}");
        };
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((sent["id"].clone(), sent["result"].clone()), (original, json!({"action": "accept"})));
    }
    // An answer to no server's request, or to a server that is not one: no server waits for it.
    for id in [json!(3), json!("plain"), json!("nope__1"), json!("files__[1]"), json!("files__{")] {
        assert_eq!(plan(&json!({"jsonrpc": "2.0", "id": id, "result": {}}), Some(&id), &members), Plan::Accepted);
    }
}

#[test]
fn a_backend_opens_a_session_then_follows_the_list_pages() {
    let mut backend = Backend::new("files", false, None, Some(List::Tools));
    let first = backend.next_call().unwrap();
    let body: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(body["method"], "initialize");
    assert!(!first.headers.iter().any(|(name, _)| name == "mcp-session-id"));
    // The answer as SSE, split anywhere, with a notification before it.
    let answer = json_answer(INITIALIZE_ID, json!({"protocolVersion": "2025-06-18", "capabilities": {}}));
    let mut sse = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n".to_vec();
    sse.extend_from_slice(b"event: message\r\ndata: ");
    sse.extend_from_slice(&answer);
    sse.extend_from_slice(b"\r\n\r\n");
    backend.answered(200, Some("s-1"), b"text/event-stream", &sse);
    let initialized = backend.next_call().unwrap();
    assert!(initialized.headers.contains(&("mcp-session-id".into(), "s-1".into())));
    assert!(initialized.headers.contains(&("mcp-protocol-version".into(), "2025-06-18".into())));
    backend.answered(202, None, b"", b"");
    let page = json_answer(LIST_ID, json!({"tools": [{"name": "a"}], "nextCursor": "c2"}));
    backend.answered(200, None, b"application/json", &page);
    let second: Value = serde_json::from_slice(&backend.next_call().unwrap().body).unwrap();
    assert_eq!(second["params"], json!({"cursor": "c2"}));
    backend.answered(
        200,
        None,
        b"application/json; charset=utf-8",
        &json_answer(LIST_ID, json!({"tools": [{"name": "b"}]})),
    );
    assert!(backend.is_done() && backend.failure().is_none());
    assert_eq!(backend.items, [json!({"name": "a"}), json!({"name": "b"})]);
    assert_eq!(backend.opened_session(), Some(&Session { id: Some("s-1".into()), version: "2025-06-18".into() }));
}

#[test]
fn a_kept_session_the_server_lost_is_opened_again_once() {
    let kept = Session { id: Some("old".into()), version: "2025-11-25".into() };
    let backend = Backend::new("files", false, Some(kept), None);
    assert!(backend.is_done(), "ready at once");
    let mut backend = Backend::new(
        "files",
        false,
        Some(Session { id: Some("old".into()), version: "v".into() }),
        Some(List::Prompts),
    );
    assert!(backend.next_call().unwrap().headers.contains(&("mcp-session-id".into(), "old".into())));
    backend.answered(404, None, b"application/json", b"{}");
    let again: Value = serde_json::from_slice(&backend.next_call().unwrap().body).unwrap();
    assert_eq!(again["method"], "initialize");
    initialized_as(&mut backend, "new", "2025-11-25");
    backend.answered(404, None, b"", b"");
    assert_eq!(backend.failure(), Some("it answered HTTP 404"), "a session it just opened is not opened again");
}

#[test]
fn backends_fail_with_a_reason() {
    let cases: [(u16, &[u8], &[u8], &str); 3] = [
        (0, b"", b"", "it did not answer"),
        (500, b"application/json", b"{}", "it answered HTTP 500"),
        (200, b"text/html", b"<html>", "its answer to initialize is not JSON-RPC"),
    ];
    for (status, content_type, body, why) in cases {
        let mut backend = Backend::new("s", false, None, Some(List::Tools));
        backend.answered(status, None, content_type, body);
        assert_eq!(backend.failure(), Some(why));
        assert_eq!(backend.next_call(), None);
    }
    let session = Session { id: None, version: "2025-06-18".into() };
    let mut backend = Backend::new("s", false, Some(session), Some(List::Tools));
    let error = br#"{"jsonrpc":"2.0","id":"gateway-list","error":{"code":-32000,"message":"database down"}}"#;
    backend.answered(200, None, b"application/json", error);
    assert_eq!(backend.failure(), Some("it answered the list with an error: database down"));
}

#[test]
fn lists_merge_prefixed_without_withheld_tools_and_failures_follow_the_servers_failure() {
    let ready = |server: &str, items: Value| {
        let session = Session { id: None, version: "2025-06-18".into() };
        let mut backend = Backend::new(server, false, Some(session), Some(List::Tools));
        backend.answered(200, None, b"application/json", &json_answer(LIST_ID, json!({ "tools": items })));
        backend
    };
    let files = ready(
        "files",
        json!([{"name": "read", "inputSchema": {"type": "object"}}, {"name": "delete"}, {"no": "name"}]),
    );
    let search = ready("search", json!([{"name": "web", "annotations": {"readOnlyHint": true}}]));
    let mut broken = Backend::new("broken", false, None, Some(List::Tools));
    broken.answered(0, None, b"", b"");
    let policy = ToolPolicy::new("files", &Tools::Deny(vec!["delete".into()]), None).unwrap();
    let id = json!("l1");
    let open = merged(
        List::Tools,
        &id,
        &[(&files, Some(&policy), Failure::Open), (&broken, None, Failure::Open), (&search, None, Failure::Open)],
        false,
    )
    .unwrap();
    let open: Value = serde_json::from_slice(&open).unwrap();
    assert_eq!(open["id"], "l1");
    assert_eq!(
        open["result"]["tools"],
        json!([
            {"name": "files__read", "inputSchema": {"type": "object"}},
            {"name": "search__web", "annotations": {"readOnlyHint": true}},
        ])
    );
    let closed =
        merged(List::Tools, &id, &[(&files, None, Failure::Open), (&broken, None, Failure::Closed)], true).unwrap_err();
    let closed: Value = serde_json::from_slice(&closed).unwrap();
    assert_eq!(closed["error"]["code"], -32000);
    assert_eq!(closed["error"]["message"], "MCP server 'broken' could not list its tools: it did not answer");
}

#[test]
fn sessions_are_kept_per_identity_and_forgotten() {
    let host = FakeHost::new(0);
    let store = host.store();
    let mine = session_identity("key-a", Some("c1"), "files");
    let theirs = session_identity("key-b", Some("c1"), "files");
    let session = Session { id: Some("s-1".into()), version: "2025-06-18".into() };
    keep_session(store, &mine, Some(&session));
    assert_eq!(kept_session(store, &mine), Some(session));
    assert_eq!(kept_session(store, &theirs), None, "another caller's identity");
    keep_session(store, &mine, None);
    assert_eq!(kept_session(store, &mine), None);
    let stateless = Session { id: None, version: "2025-06-18".into() };
    keep_session(store, &mine, Some(&stateless));
    assert_eq!(kept_session(store, &mine), Some(stateless));
    assert_eq!(client_session(Some(b"abc")), Some("abc"));
    assert_eq!(client_session(Some(b"a b")), None);
    assert_eq!(client_session(Some(&[b'a'; MAX_SESSION_ID])).map(str::len), Some(MAX_SESSION_ID));
    assert_eq!(client_session(Some(&[b'a'; MAX_SESSION_ID + 1])), None);
}

#[test]
fn stateless_names_travel_in_a_header() {
    assert_eq!(name_header("read_file"), "read_file");
    assert_eq!(name_header("café"), "=?base64?Y2Fmw6k=?=");
    assert_eq!(name_header(" edge"), "=?base64?IGVkZ2U=?=");
}

fn header<'a>(call: &'a BackendCall, name: &str) -> Option<&'a str> {
    call.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn discovered(versions: Value) -> Vec<u8> {
    json_answer(DISCOVER_ID, json!({"supportedVersions": versions, "capabilities": {}}))
}

#[test]
fn a_stateless_clients_backend_discovers_the_server_and_lists_in_no_session() {
    let mut backend = Backend::new("files", true, None, Some(List::Tools));
    let discover = backend.next_call().unwrap();
    let body: Value = serde_json::from_slice(&discover.body).unwrap();
    assert_eq!(body["method"], "server/discover");
    assert_eq!(body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"], STATELESS_VERSION);
    assert_eq!(header(&discover, "mcp-protocol-version"), Some(STATELESS_VERSION));
    assert_eq!(header(&discover, "mcp-method"), Some("server/discover"));
    backend.answered(200, None, b"application/json", &discovered(json!(["2026-07-28", "2025-11-25"])));
    let page = backend.next_call().unwrap();
    let body: Value = serde_json::from_slice(&page.body).unwrap();
    assert_eq!(body["method"], "tools/list");
    assert!(body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"].is_object());
    assert_eq!(header(&page, "mcp-method"), Some("tools/list"));
    assert_eq!(header(&page, "mcp-session-id"), None);
    backend.answered(200, None, b"application/json", &json_answer(LIST_ID, json!({"tools": [{"name": "a"}]})));
    assert!(backend.is_done() && backend.failure().is_none() && backend.is_stateless());
    let kept = Session { id: None, version: STATELESS_VERSION.into() };
    assert_eq!(backend.opened_session(), Some(&kept));
    // Kept, it needs no handshake; a routed request carries the era's method header.
    let again = Backend::new("files", false, Some(kept), None);
    assert!(again.is_done() && again.method_header("tools/call") == Some(("mcp-method".into(), "tools/call".into())));
}

#[test]
fn a_server_that_refuses_one_eras_handshake_gets_the_others() {
    // A session-only server refuses `server/discover`: the stateless client is served in a session.
    let mut backend = Backend::new("old", true, None, None);
    backend.answered(400, None, b"application/json", br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600}}"#);
    let initialize: Value = serde_json::from_slice(&backend.next_call().unwrap().body).unwrap();
    assert_eq!(initialize["method"], "initialize");
    initialized_as(&mut backend, "s-1", "2025-11-25");
    backend.answered(202, None, b"", b"");
    assert!(backend.is_done() && !backend.is_stateless() && backend.method_header("tools/call").is_none());
    assert_eq!(backend.session_id(), Some("s-1"));
    // A stateless-only server refuses `initialize` (an error, or a 4xx): a session-era client's
    // requests go to it in the stateless era.
    for (status, refusal) in [(200, json!({"code": -32601, "message": "no"})), (400, json!({"code": -32600}))] {
        let mut backend = Backend::new("new", false, None, None);
        let answer = json!({"jsonrpc": "2.0", "id": INITIALIZE_ID, "error": refusal}).to_string();
        backend.answered(status, None, b"application/json", answer.as_bytes());
        let discover: Value = serde_json::from_slice(&backend.next_call().unwrap().body).unwrap();
        assert_eq!(discover["method"], "server/discover");
        backend.answered(200, None, b"application/json", &discovered(json!(["2026-07-28"])));
        assert!(backend.is_done() && backend.is_stateless(), "{status}");
    }
    // A server that speaks neither fails, naming why; one that does not answer fails at once.
    let mut backend = Backend::new("odd", false, None, None);
    backend.answered(405, None, b"", b"");
    backend.answered(200, None, b"application/json", &discovered(json!(["2027-01-01"])));
    assert_eq!(backend.failure(), Some("it speaks neither protocol era the gateway does"));
    for (status, why) in [(0, "it did not answer"), (401, "it answered HTTP 401")] {
        let mut backend = Backend::new("down", true, None, None);
        backend.answered(status, None, b"", b"");
        assert_eq!(backend.failure(), Some(why));
    }
}

#[test]
fn a_session_era_clients_request_gets_the_stateless_envelope_keeping_its_own_meta() {
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"progressToken":3}}}"#;
    let sent: Value = serde_json::from_slice(&enveloped(body)).unwrap();
    let meta = &sent["params"]["_meta"];
    assert_eq!((meta["progressToken"].clone(), sent["params"]["name"].clone()), (json!(3), json!("a")));
    assert_eq!(meta["io.modelcontextprotocol/protocolVersion"], STATELESS_VERSION);
    let bare: Value = serde_json::from_slice(&enveloped(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)).unwrap();
    assert!(bare["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"].is_object());
}

#[test]
fn a_server_without_the_list_has_none_and_its_session_is_kept_even_when_its_list_fails() {
    let opened = |list: List, answer: &[u8]| {
        let mut backend = Backend::new("s", false, None, Some(list));
        initialized_as(&mut backend, "s-9", "2025-06-18");
        backend.answered(202, None, b"", b"");
        backend.answered(200, None, b"application/json", answer);
        backend
    };
    let none = br#"{"jsonrpc":"2.0","id":"gateway-list","error":{"code":-32601,"message":"Method not found"}}"#;
    let backend = opened(List::Prompts, none);
    assert!(backend.is_done() && backend.failure().is_none() && backend.items.is_empty());
    let broken = opened(List::Tools, br#"{"jsonrpc":"2.0","id":"gateway-list","error":{"code":-32603,"message":"x"}}"#);
    assert!(broken.failure().is_some());
    assert_eq!(broken.opened_session().and_then(|s| s.id.as_deref()), Some("s-9"), "kept for the next request");
}

#[test]
fn a_list_started_again_in_a_new_session_has_no_items_twice() {
    let session = Session { id: Some("old".into()), version: "2025-06-18".into() };
    let mut backend = Backend::new("s", false, Some(session), Some(List::Tools));
    let first = json_answer(LIST_ID, json!({"tools": [{"name": "a"}], "nextCursor": "2"}));
    backend.answered(200, None, b"application/json", &first);
    backend.answered(404, None, b"", b"");
    initialized_as(&mut backend, "new", "2025-06-18");
    backend.answered(202, None, b"", b"");
    backend.answered(200, None, b"application/json", &json_answer(LIST_ID, json!({"tools": [{"name": "a"}]})));
    assert_eq!(backend.items, [json!({"name": "a"})]);
}

#[test]
fn a_session_is_forgotten_only_while_it_is_the_one_kept() {
    let host = FakeHost::new(0);
    let store = host.store();
    let identity = session_identity("k", Some("c"), "files");
    keep_session(store, &identity, Some(&Session { id: Some("newer".into()), version: "v".into() }));
    forget_session(store, &identity, Some("older"));
    assert!(kept_session(store, &identity).is_some(), "a newer session stays");
    forget_session(store, &identity, Some("newer"));
    assert_eq!(kept_session(store, &identity), None);
}

#[test]
fn a_list_is_kept_for_its_servers_shortest_ttl_else_a_few_seconds_and_never_past_ten_minutes() {
    let listed = |pages: &[Value]| {
        let mut backend =
            Backend::new("s", true, Some(Session { id: None, version: STATELESS_VERSION.into() }), Some(List::Tools));
        for page in pages {
            backend.answered(200, None, b"application/json", &json_answer(LIST_ID, page.clone()));
        }
        backend
    };
    let two_pages =
        [json!({"tools": [{"name": "a"}], "ttlMs": 60000, "nextCursor": "c"}), json!({"tools": [], "ttlMs": 30000})];
    assert_eq!(listed(&two_pages).list_ttl_ms(), Some(30_000));
    assert_eq!(listed(&[json!({"tools": []})]).list_ttl_ms(), Some(DEFAULT_LIST_TTL_MS));
    assert_eq!(listed(&[json!({"tools": [], "ttlMs": 86_400_000})]).list_ttl_ms(), Some(MAX_LIST_TTL_MS));
    assert_eq!(listed(&[json!({"tools": [], "ttlMs": 0})]).list_ttl_ms(), None, "the server said not to keep it");
    assert_eq!(listed(&[json!({"nope": []})]).list_ttl_ms(), None, "a failed list is not kept");
    assert_eq!(Backend::listed("s", vec![json!({"name": "a"})]).list_ttl_ms(), None, "kept already");
    let routed = Backend::new("s", false, Some(Session { id: None, version: "2025-06-18".into() }), None);
    assert_eq!(routed.list_ttl_ms(), None, "no list");
}

#[test]
fn a_kept_list_serves_its_identity_until_it_expires() {
    let host = FakeHost::new(0);
    let store = host.store();
    let items = vec![json!({"name": "a", "description": "x"})];
    keep_list(store, "w1\ns\nhttp://h/mcp\ntools/list", &items, (5_000, 1_000));
    assert_eq!(kept_list(store, "w1\ns\nhttp://h/mcp\ntools/list", 5_999), Some(items.clone()));
    assert_eq!(kept_list(store, "w1\ns\nhttp://h/mcp\ntools/list", 6_000), None, "expired");
    assert_eq!(kept_list(store, "w2\ns\nhttp://h/mcp\ntools/list", 1_000), None, "another workspace's");
    let huge = vec![json!({"name": "x".repeat(MAX_KEPT_LIST)})];
    keep_list(store, "w3\ns\nhttp://h/mcp\ntools/list", &huge, (5_000, 1_000));
    assert_eq!(kept_list(store, "w3\ns\nhttp://h/mcp\ntools/list", 1_000), None, "too large to keep");
    // Two lists whose first slots collide are both kept (in their two ways).
    let identity = |i: u32| format!("w{i}\ns\nhttp://h/mcp\ntools/list");
    let [first, second] = list_slots(&identity(0));
    let other = (1..).map(identity).find(|other| {
        let [f, s] = list_slots(other);
        f == first && s != second
    });
    let other = other.unwrap();
    keep_list(store, &identity(0), &items, (5_000, 1_000));
    keep_list(store, &other, &items, (5_000, 1_000));
    assert!(kept_list(store, &identity(0), 1_000).is_some() && kept_list(store, &other, 1_000).is_some());
    // A stale entry's slot is taken again.
    let third = (1..).map(identity).find(|third| list_slots(third) == [first.clone(), second.clone()]).unwrap();
    keep_list(store, &third, &items, (5_000, 9_000));
    assert!(kept_list(store, &third, 9_000).is_some());
}
