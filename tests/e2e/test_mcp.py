"""MCP servers behind the gateway (docs/mcp.md, issue 46): `/mcp/{server}` routed to an MCP server
written with the official Python SDK, reached by the SDK's own client through the gateway in both
protocol eras (2025's sessions and 2026-07-28's stateless requests), under the gateway key; the
gateway's refusals as JSON-RPC errors; each request's record and metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from typing import Annotated

import anyio
import httpx2 as httpx
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

import helpers
from pg_server import free_ports
from support import McpUpstream, access_lines, hooks, jwk, new_key, token, value  # noqa: F401 (hooks: a fixture)

SERVER_TOKEN = "mcp-server-own-token"  # the server's stored credential (its `headers`)
# The key that seals the aggregate's session ids, the same on the module's two gateways.
SESSION_KEY = base64.b64encode(bytes(range(32))).decode()
ERAS = ["legacy", "2026-07-28"]
# How long the progress tool waits for the client to see its progress before giving up.
PROGRESS_WAIT_S = 15


class Answer(BaseModel):
    reply: str


def ask(question: str) -> Elicit[Answer]:
    """The question of the `confirm` tool (module-level: its annotation is evaluated by name)."""
    return Elicit(question, Answer)


class UpstreamServer(McpUpstream):
    """The MCP server behind the gateway in these tests: tools (one that fails, one that streams
    progress), a prompt and a resource; it records the headers of every request it receives."""

    def __init__(self, era: str = "both", list_ttl_ms: int | None = None):
        # Set by the client's progress callback; the progress tool returns once it is set.
        self.progress_seen = threading.Event()
        self.added: list[tuple[int, int]] = []  # each call of `add` the server ran
        self.waiting = threading.Event()  # `wait_for_cancel` runs
        self.cancelled = threading.Event()  # and was cancelled
        # `list_ttl_ms`: the `ttlMs` of its tool lists in the stateless era (the SDK's default is 0).
        hints = {"tools/list": CacheHint(ttl_ms=list_ttl_ms)} if list_ttl_ms is not None else None
        server = MCPServer("gateway-e2e", cache_hints=hints)

        @server.tool()
        def add(a: int, b: int) -> int:
            """Adds two numbers."""
            self.added.append((a, b))
            return a + b

        @server.tool()
        def fail() -> str:
            """Always fails (the SDK answers a result with isError)."""
            raise ValueError("the tool failed on purpose")

        @server.tool()
        async def count_with_progress(ctx: Context) -> str:
            """Reports progress, then answers once the client has seen it (or gives up)."""
            await ctx.report_progress(1, 2, "half way")
            seen = await anyio.to_thread.run_sync(self.progress_seen.wait, PROGRESS_WAIT_S)
            return "the client saw the progress first" if seen else "no progress reached the client"

        @server.tool()
        async def confirm(question: str, answer: Annotated[ElicitationResult[Answer], Resolve(ask)]) -> str:
            """Asks the user (elicitation: in the session era a request of the server's on the call's
            stream, in the stateless era an `input_required` result the client answers in a retry)."""
            return f"{answer.action}: {answer.data.reply if answer.action == 'accept' else '-'}"

        @server.tool()
        async def wait_for_cancel() -> str:
            """Waits until the call is cancelled (or gives up)."""
            self.waiting.set()
            try:
                await anyio.sleep(PROGRESS_WAIT_S)
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()
                raise
            return "never cancelled"

        if era == "stateless":
            @server.tool()
            def locate(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
                """Names the region it was asked for (the argument travels in `Mcp-Param-Region` too)."""
                return f"in {region}"

        @server.prompt()
        def greet(name: str) -> str:
            """Greets someone."""
            return f"Hello, {name}!"

        @server.resource("test://static-text")
        def static_text() -> str:
            """A fixed text."""
            return "static text from the server"

        super().__init__(server, era)


@pytest.fixture(scope="module")
def upstream():
    with UpstreamServer() as server:
        yield server


def module_servers(upstream) -> dict:
    gone = free_ports(1)[0]  # nothing listens there
    return {
        "tools": {"url": upstream.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"}},
        "gone": {"url": f"http://127.0.0.1:{gone}/mcp"},
        # The same server with tools withheld, each way.
        "no-fail": {"url": upstream.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"},
                    "tools": {"deny": ["fail"]}},
        "adder": {"url": upstream.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"},
                  "tools": {"allow": ["ad*"]}},
    }


@pytest.fixture(scope="module")
def gw(upstream, start_gateway):
    env = {"GATEWAY_MCP_SERVERS": json.dumps(module_servers(upstream)), "GATEWAY_MCP_SESSION_KEY": SESSION_KEY}
    with start_gateway("mcp", None, env) as gateway:
        gateway.access_log = gateway.log_path  # by default the access log goes to Envoy's stdout
        yield gateway


@pytest.fixture(scope="module")
def replica_gw(upstream, start_gateway):
    """Another replica of `gw`: the same servers and session key, nothing shared with it."""
    env = {"GATEWAY_MCP_SERVERS": json.dumps(module_servers(upstream)), "GATEWAY_MCP_SESSION_KEY": SESSION_KEY}
    with start_gateway("mcp-replica", None, env) as gateway:
        yield gateway


def client(gw, mode: str, headers: dict | None = None, server: str = "tools") -> Client:
    """The SDK's client of `/mcp/{server}` through the gateway, with the gateway key as a bearer token."""
    http = httpx.AsyncClient(headers=headers or {"authorization": f"Bearer {helpers.KEY}"},
                             timeout=httpx.Timeout(30.0))
    return Client(streamable_http_client(f"{gw.origin}/mcp/{server}", http_client=http), mode=mode)


@pytest.mark.parametrize("mode", ERAS)
def test_sdk_client_lists_and_calls_tools_prompts_and_resources(gw, upstream, mode):
    upstream.seen_headers.clear()

    async def session():
        async with client(gw, mode) as c:
            tools = await c.list_tools()
            assert {t.name for t in tools.tools} == {"add", "fail", "count_with_progress", "confirm", "wait_for_cancel"}
            result = await c.call_tool("add", {"a": 2, "b": 3})
            assert not result.is_error
            assert [block.text for block in result.content] == ["5"]
            prompt = await c.get_prompt("greet", {"name": "Ada"})
            assert prompt.messages[0].content.text == "Hello, Ada!"
            resource = await c.read_resource("test://static-text")
            assert resource.contents[0].text == "static text from the server"

    asyncio.run(session())
    # Each era reached the server as itself: 2025's session, or 2026-07-28's per-request headers.
    if mode == "legacy":
        assert any("mcp-session-id" in headers for headers in upstream.seen_headers)
        assert not any("mcp-method" in headers for headers in upstream.seen_headers)
    else:
        assert {headers.get("mcp-protocol-version") for headers in upstream.seen_headers} == {mode}
        assert {"tools/list", "tools/call"} <= {headers.get("mcp-method") for headers in upstream.seen_headers}
    # The server heard only the gateway: its own credential and authority, never the gateway key.
    assert upstream.seen_headers
    for headers in upstream.seen_headers:
        assert headers.get("authorization") == f"Bearer {SERVER_TOKEN}"
        assert headers.get("host") == f"127.0.0.1:{upstream.port}"
        assert helpers.KEY not in json.dumps(headers)
        # Of the gateway's headers, only the request's trace id.
        assert [name for name in headers if name.startswith("x-gateway-")] == ["x-gateway-trace-id"]


def progress_recorder(upstream):
    """The progress a client's callback gets, and the callback (which lets the progress tool answer)."""
    progress = []

    async def on_progress(value, total, message):
        progress.append((value, total, message))
        upstream.progress_seen.set()

    return progress, on_progress


@pytest.mark.parametrize("mode", ERAS)
def test_progress_reaches_the_client_before_the_result(gw, upstream, mode):
    upstream.progress_seen.clear()
    progress, on_progress = progress_recorder(upstream)

    async def session():
        async with client(gw, mode) as c:
            return await c.call_tool("count_with_progress", {}, progress_callback=on_progress)

    result = asyncio.run(session())
    # The tool answered only after the client had its progress: the stream was not held back.
    assert [block.text for block in result.content] == ["the client saw the progress first"]
    assert progress == [(1, 2, "half way")]


def test_gateway_key_in_x_gateway_api_key_works_too(gw):
    async def session():
        async with client(gw, "2026-07-28", headers={"x-gateway-api-key": helpers.KEY}) as c:
            return await c.call_tool("add", {"a": 1, "b": 1})

    assert [block.text for block in asyncio.run(session()).content] == ["2"]


def test_a_control_plane_key_works_as_a_bearer_token(gw, upstream):
    """A key the control plane keeps: the filter reads it (the request held meanwhile), then routes."""
    key = helpers.workspace_key(gw)
    upstream.seen_headers.clear()

    async def session():
        async with client(gw, "legacy", headers={"authorization": f"Bearer {key}"}) as c:
            return await c.call_tool("add", {"a": 20, "b": 22})

    assert [block.text for block in asyncio.run(session()).content] == ["42"]
    assert upstream.seen_headers and key not in json.dumps(upstream.seen_headers)


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "curl", "version": "1"}}}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def rpc_error(response, status: int, code: int, rpc_id=None) -> str:
    """The JSON-RPC error of a refusal with `status` and `code`, answering the message with
    `rpc_id` (None: the gateway answered before reading it, or it had none); its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == rpc_id
    assert body["error"]["code"] == code
    assert body["error"]["data"]["status"] == status
    return body["error"]["message"]


@pytest.mark.parametrize("key_headers", [{}, {"authorization": "Bearer wrong-key"}, {"x-gateway-api-key": "wrong"}],
                         ids=["none", "wrong-bearer", "wrong-header"])
def test_no_or_wrong_key_is_401_with_www_authenticate(gw, upstream, key_headers):
    before = len(upstream.seen_headers)
    r = gw.http.post("/mcp/tools", json=INITIALIZE, headers={**MCP_HEADERS, **key_headers})
    message = rpc_error(r, 401, -32001)
    assert r.headers["www-authenticate"] == "Bearer"
    assert "key" in message
    assert len(upstream.seen_headers) == before


def test_foreign_origin_is_403_and_own_origin_passes(gw):
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp/tools", json=INITIALIZE, headers={**auth, "origin": "http://evil.example"})
    assert "Origin" in rpc_error(r, 403, -32600)
    r = gw.http.post("/mcp/tools", json=INITIALIZE, headers={**auth, "origin": gw.origin})
    assert r.status_code == 200, r.text


def test_unknown_server_is_404_naming_it(gw):
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp/nowhere", json=INITIALIZE, headers=auth)
    assert rpc_error(r, 404, -32600) == "unknown MCP server 'nowhere'"


def test_other_methods_are_405(gw):
    auth = {"authorization": f"Bearer {helpers.KEY}"}
    for method in ["PUT", "PATCH"]:
        r = gw.http.request(method, "/mcp/tools", headers=auth, content=b"{}")
        rpc_error(r, 405, -32600)
        assert r.headers["allow"] == "GET, POST, DELETE"


def test_get_and_delete_reach_the_server(gw):
    """A 2025-era session: its id comes from the server, GET opens the server's stream, DELETE ends it."""
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp/tools", json=INITIALIZE, headers=auth)
    assert r.status_code == 200, r.text
    session = r.headers["mcp-session-id"]
    session_headers = {**auth, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    with gw.http.stream("GET", "/mcp/tools", headers={**session_headers, "accept": "text/event-stream"}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
    r = gw.http.delete("/mcp/tools", headers=session_headers)
    assert r.status_code == 200, r.text
    # The server ended it: its status passes as it is.
    r = gw.http.post("/mcp/tools", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session_headers)
    assert r.status_code == 404, r.text


def test_unreachable_server_is_a_json_rpc_error_naming_it(gw):
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp/gone", json=INITIALIZE, headers=auth)
    message = rpc_error(r, 502, -32000, rpc_id=INITIALIZE["id"])
    assert message.startswith("MCP server 'gone' is unreachable"), message


@pytest.mark.parametrize("body, code, says", [
    (b"{not json", -32700, "not JSON"),
    (b"", -32700, "not JSON"),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600, "batch"),
    (b'{"id": 1, "method": "ping"}', -32600, '"jsonrpc": "2.0"'),
    (b'{"jsonrpc": "2.0", "id": [1], "method": "ping"}', -32600, "id"),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600, "no method"),
], ids=["not-json", "empty", "batch", "no-version", "array-id", "no-method"])
def test_a_body_that_is_not_one_json_rpc_message_is_refused_before_the_server(gw, upstream, body, code, says):
    before = len(upstream.seen_headers)
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp/tools", content=body, headers=auth)
    assert says in rpc_error(r, 400, code)
    assert len(upstream.seen_headers) == before, "the server never hears of it"


def test_each_request_is_recorded_with_its_server_method_tool_and_outcome(gw, upstream):
    """The access log's line of each MCP request names the API, server, JSON-RPC method and tool,
    and `is_error` for a tool result with `isError`; the MCP metric counts each by outcome."""
    trace = f"mcp-{uuid.uuid4().hex[:12]}"
    sent_before = len(upstream.seen_headers)
    labels = {"server": "tools", "method": "tools/call"}
    before = {outcome: value(gw, "gen_ai_gateway_mcp_requests_total", **labels, outcome=outcome)
              for outcome in ["ok", "tool_error"]}

    async def session():
        async with client(gw, "legacy", {"authorization": f"Bearer {helpers.KEY}", "x-gateway-trace-id": trace}) as c:
            assert not (await c.call_tool("add", {"a": 1, "b": 1})).is_error
            assert (await c.call_tool("fail", {})).is_error

    asyncio.run(session())
    # The server got the trace id with each request, and nothing else of the gateway's.
    seen = upstream.seen_headers[sent_before:]
    assert seen and all(h.get("x-gateway-trace-id") == trace for h in seen), seen
    assert not any(name.startswith("x-gateway-") and name != "x-gateway-trace-id" for h in seen for name in h)
    # One line per request the server got, written as each ends (the client's GET stream may
    # reach the server after `seen` was taken) and in batches: read until both calls' are in.
    deadline = time.monotonic() + 10
    while True:
        lines = access_lines(gw, trace, count=len(seen) + 1, timeout=1)
        calls = {line.get("mcp_tool"): line for line in lines if line.get("mcp_method") == "tools/call"}
        if set(calls) == {"add", "fail"} or time.monotonic() > deadline:
            break
    assert set(calls) == {"add", "fail"}, lines
    for tool, is_error in [("add", False), ("fail", True)]:
        line = calls[tool]
        assert (line["client_api"], line["mcp_server"], line["status"], line["is_error"]) == \
            ("mcp", "tools", 200, is_error), line
    assert any(line.get("mcp_method") == "initialize" and "mcp_tool" not in line for line in lines), lines
    after = {outcome: value(gw, "gen_ai_gateway_mcp_requests_total", **labels, outcome=outcome)
             for outcome in ["ok", "tool_error"]}
    assert (after["ok"] - before["ok"], after["tool_error"] - before["tool_error"]) == (1, 1)


def test_an_unreachable_server_and_a_refused_call_count_as_errors(gw):
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    gone = {"server": "gone", "method": "initialize", "outcome": "error"}
    before = value(gw, "gen_ai_gateway_mcp_requests_total", **gone)
    assert gw.http.post("/mcp/gone", json=INITIALIZE, headers=auth).status_code == 502
    assert value(gw, "gen_ai_gateway_mcp_requests_total", **gone) == before + 1
    # A method MCP does not define, outside a session: the server refuses it (its status passes).
    # Its label is `other`, never the client's text.
    other = {"server": "tools", "method": "other", "outcome": "error"}
    before = value(gw, "gen_ai_gateway_mcp_requests_total", **other)
    r = gw.http.post("/mcp/tools", json={"jsonrpc": "2.0", "id": 5, "method": "made/up"}, headers=auth)
    assert r.status_code >= 400, r.text
    assert value(gw, "gen_ai_gateway_mcp_requests_total", **other) == before + 1
    scrape = httpx.get(f"http://127.0.0.1:{gw.admin_port}/stats/prometheus", timeout=5).text
    assert "made" not in scrape


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("server, seen", [("no-fail", {"add", "count_with_progress", "confirm", "wait_for_cancel"}), ("adder", {"add"})])
def test_tools_a_server_withholds_are_not_listed_and_a_call_never_reaches_it(gw, upstream, mode, server, seen):
    """`tools` (deny or allow patterns) narrows what callers see and call: the list, JSON or an SSE
    stream, loses the others; a call to one is "Unknown tool", answered by the gateway."""
    calls_before = len(upstream.seen_headers)

    async def session():
        async with client(gw, mode, server=server) as c:
            assert {t.name for t in (await c.list_tools()).tools} == seen
            listed = len(upstream.seen_headers)
            with pytest.raises(Exception, match="Unknown tool: fail"):
                result = await c.call_tool("fail", {})
                # An SDK that returns the error as a result rather than raising it.
                raise RuntimeError(result.content[0].text if result.is_error else "the call passed")
            assert len(upstream.seen_headers) == listed, "the server never heard of the call"
            assert [b.text for b in (await c.call_tool("add", {"a": 2, "b": 2})).content] == ["4"]

    asyncio.run(session())
    assert len(upstream.seen_headers) > calls_before


def test_a_workspace_keeps_its_own_servers_in_the_control_plane(gw, upstream):
    """`PUT /v1/mcp-servers/{id}` (through the gateway to its control plane) makes `/mcp/{id}` a
    server of that workspace alone, its stored headers sent to it and its `tools` applied."""
    key, other = helpers.workspace_key(gw), helpers.workspace_key(gw)
    stored = {"url": upstream.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"},
              "tools": {"deny": ["count_*"]}}
    r = gw.http.put("/v1/mcp-servers/kept", json=stored, headers={"x-gateway-api-key": key})
    assert r.status_code in (200, 201), r.text
    assert SERVER_TOKEN not in r.text, "a stored header is shown by its last four characters only"
    upstream.seen_headers.clear()

    async def session(caller: str):
        async with client(gw, "legacy", {"authorization": f"Bearer {caller}"}, server="kept") as c:
            return {t.name for t in (await c.list_tools()).tools}

    assert asyncio.run(session(key)) == {"add", "fail", "confirm", "wait_for_cancel"}
    assert upstream.seen_headers and all(h.get("authorization") == f"Bearer {SERVER_TOKEN}"
                                         for h in upstream.seen_headers)
    # Another workspace has no such server.
    r = gw.http.post("/mcp/kept", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {other}"})
    assert rpc_error(r, 404, -32600) == "unknown MCP server 'kept'"

    # The aggregate: the plugin configuration's servers and the workspace's own, one list.
    async def aggregated(caller: str):
        async with aggregate(gw, {"authorization": f"Bearer {caller}"}) as c:
            listed = {t.name for t in (await c.list_tools()).tools}
            called = None
            if "kept__add" in listed:
                called = [b.text for b in (await c.call_tool("kept__add", {"a": 3, "b": 4})).content]
            return listed, called

    assert asyncio.run(aggregated(key)) == (AGGREGATE_TOOLS | {"kept__add", "kept__fail", "kept__confirm", "kept__wait_for_cancel"}, ["7"])
    assert asyncio.run(aggregated(other)) == (AGGREGATE_TOOLS, None)


def test_a_key_narrowed_to_tools_sees_and_calls_only_those(gw, upstream):
    """A key made with `mcp_tools` (`{server}__{tool}` patterns) sees only the tools they match, on
    every server; a call to another is "Unknown tool" and never reaches the server."""
    r = gw.post("/v1/api-keys", {"workspace": f"team-{uuid.uuid4().hex[:8]}", "mcp_tools": ["tools__add", "*__count_*"]})
    assert r.status_code == 201, r.text
    key = r.json()["key"]

    async def session(server: str):
        async with client(gw, "2026-07-28", {"authorization": f"Bearer {key}"}, server=server) as c:
            listed = {t.name for t in (await c.list_tools()).tools}
            with pytest.raises(Exception, match="Unknown tool: fail"):
                result = await c.call_tool("fail", {})
                raise RuntimeError(result.content[0].text if result.is_error else "the call passed")
            return listed

    before = len(upstream.seen_headers)
    assert asyncio.run(session("tools")) == {"add", "count_with_progress"}
    assert asyncio.run(session("adder")) == set(), "the server's allow and the key's patterns both apply"
    calls = len(upstream.seen_headers) - before
    assert calls > 0 and not any(h.get("mcp-name") == "fail" for h in upstream.seen_headers[before:])


def test_forwarded_headers_reach_the_server_but_never_the_gateway_key(gw, upstream):
    """`x-gateway-forward-headers` passes what it names (here a cookie and a gateway header), never
    the caller's `Authorization` (the gateway key); a list that is not header names is a 400."""
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}", "cookie": "theme=dark",
            "x-gateway-metadata": '{"team": "a"}'}
    before = len(upstream.seen_headers)
    named = {**auth, "x-gateway-forward-headers": "cookie, x-gateway-metadata, authorization"}
    assert gw.http.post("/mcp/tools", json=INITIALIZE, headers=named).status_code == 200
    (seen,) = upstream.seen_headers[before:]
    assert (seen.get("cookie"), seen.get("x-gateway-metadata")) == ("theme=dark", '{"team": "a"}')
    assert seen.get("authorization") == f"Bearer {SERVER_TOKEN}" and helpers.KEY not in json.dumps(seen)
    r = gw.http.post("/mcp/tools", json=INITIALIZE, headers={**auth, "x-gateway-forward-headers": "not a name!"})
    assert "x-gateway-forward-headers" in rpc_error(r, 400, -32600)
    assert len(upstream.seen_headers) == before + 1


# --------------------------------------------------------------------------- the aggregate `/mcp`

def aggregate(gw, headers: dict | None = None, mode: str = "legacy") -> Client:
    """The SDK's client of the aggregate endpoint `/mcp`, with the gateway key."""
    http = httpx.AsyncClient(headers=headers or {"authorization": f"Bearer {helpers.KEY}"},
                             timeout=httpx.Timeout(30.0))
    return Client(streamable_http_client(f"{gw.origin}/mcp", http_client=http), mode=mode)


# The module's servers as one: `gone` (nothing listens) is left out of every list.
AGGREGATE_TOOLS = {"tools__add", "tools__fail", "tools__count_with_progress", "tools__confirm", "tools__wait_for_cancel",
                   "no-fail__add", "no-fail__count_with_progress", "no-fail__confirm", "no-fail__wait_for_cancel",
                   "adder__add"}


@pytest.mark.parametrize("mode", ERAS)
def test_the_aggregate_lists_every_servers_tools_prefixed_and_calls_each_through_its_prefix(gw, upstream, mode):
    left_out = [{"server": "gone", "method": method, "outcome": "error"} for method in ["tools/list", "prompts/list"]]
    left_out_before = [value(gw, "gen_ai_gateway_mcp_requests_total", **labels) for labels in left_out]
    upstream.seen_headers.clear()
    progress, on_progress = progress_recorder(upstream)

    async def session():
        async with aggregate(gw, mode=mode) as c:
            tools = (await c.list_tools()).tools
            assert {t.name for t in tools} == AGGREGATE_TOOLS
            # A tool's description and schema are kept as the server gave them.
            add = next(t for t in tools if t.name == "tools__add")
            assert add.description == "Adds two numbers."
            assert set(add.input_schema["properties"]) == {"a", "b"}
            assert [b.text for b in (await c.call_tool("tools__add", {"a": 2, "b": 3})).content] == ["5"]
            assert [b.text for b in (await c.call_tool("adder__add", {"a": 1, "b": 1})).content] == ["2"]
            assert (await c.call_tool("tools__fail", {})).is_error
            # A withheld tool, a server that is not one, and an unprefixed name are unknown.
            for name in ["no-fail__fail", "adder__fail", "nope__add", "add"]:
                with pytest.raises(Exception, match=f"Unknown tool: {name}"):
                    result = await c.call_tool(name, {})
                    raise RuntimeError(result.content[0].text if result.is_error else "the call passed")
            prompts = (await c.list_prompts()).prompts
            assert {p.name for p in prompts} == {"tools__greet", "no-fail__greet", "adder__greet"}
            prompt = await c.get_prompt("tools__greet", {"name": "Ada"})
            assert prompt.messages[0].content.text == "Hello, Ada!"
            upstream.progress_seen.clear()
            result = await c.call_tool("tools__count_with_progress", {}, progress_callback=on_progress)
            assert [b.text for b in result.content] == ["the client saw the progress first"]

    asyncio.run(session())
    assert progress == [(1, 2, "half way")], "the progress passed as it came"
    # The servers heard only the gateway, in sessions of their own.
    assert upstream.seen_headers
    for headers in upstream.seen_headers:
        assert headers.get("authorization") == f"Bearer {SERVER_TOKEN}"
        assert helpers.KEY not in json.dumps(headers)
    # The server speaks both eras, so it hears the client's: a 2025 client's lists and calls go in
    # the server's sessions; a 2026-07-28 client's in none, a call naming the tool as the server does.
    sessions = any("mcp-session-id" in h for h in upstream.seen_headers)
    assert sessions == (mode == "legacy"), "the servers' sessions were used for the session era only"
    if mode == "2026-07-28":
        named = {h.get("mcp-name") for h in upstream.seen_headers if h.get("mcp-method") == "tools/call"}
        assert named == {"add", "fail", "count_with_progress"}, named
    assert [value(gw, "gen_ai_gateway_mcp_requests_total", **labels) - before
            for labels, before in zip(left_out, left_out_before)] == [1, 1], \
        "the unreachable server counted once per list it was left out of"


@pytest.mark.parametrize("first", ["list", "call"])
def test_the_aggregate_reopens_a_server_session_the_server_ended(gw, upstream, first):
    """A server that forgot the gateway's session (it ended, or restarted) gets a new one and the
    client never notices: a list asks again, a call is sent again, in a new session."""
    upstream.seen_headers.clear()
    upstream.added.clear()
    # A workspace of its own: no list is kept for it yet, so the first one opens the sessions.
    own = {"authorization": f"Bearer {helpers.workspace_key(gw)}"}

    async def end_the_servers_sessions():
        """Ends every session the server holds for the gateway, behind its back."""
        ended = {h["mcp-session-id"] for h in upstream.seen_headers if "mcp-session-id" in h}
        assert ended
        async with httpx.AsyncClient() as direct:
            for session_id in ended:
                r = await direct.delete(upstream.url, headers={"mcp-session-id": session_id,
                                                              "authorization": f"Bearer {SERVER_TOKEN}"})
                assert r.status_code in (200, 204), r.text

    async def session():
        async with aggregate(gw, own) as c:
            assert {t.name for t in (await c.list_tools()).tools} == AGGREGATE_TOOLS
            await end_the_servers_sessions()
            if first == "list":
                assert {t.name for t in (await c.list_tools()).tools} == AGGREGATE_TOOLS
            result = await c.call_tool("tools__add", {"a": 4, "b": 4})
            assert not result.is_error
            texts = [b.text for b in result.content]
            # The session the call opened is kept: the next call goes in it at once.
            before = len(upstream.seen_headers)
            assert [b.text for b in (await c.call_tool("tools__add", {"a": 1, "b": 2})).content] == ["3"]
            return texts, len(upstream.seen_headers) - before

    assert asyncio.run(session()) == (["8"], 1)
    assert upstream.added == [(4, 4), (1, 2)], "each call ran once"


def list_twice(gateway, servers: list, mode: str = "legacy") -> list[list[int]]:
    """Lists the aggregate's tools twice as a key of a new workspace: how many `tools/list` requests
    each of `servers` got for each."""
    key = helpers.workspace_key(gateway)

    async def session():
        counts = []
        async with aggregate(gateway, {"authorization": f"Bearer {key}"}, mode=mode) as c:
            for _ in range(2):
                before = [server.seen_methods.count("tools/list") for server in servers]
                await c.list_tools()
                counts.append([s.seen_methods.count("tools/list") - b for s, b in zip(servers, before)])
        return counts
    return asyncio.run(session())


def test_the_aggregate_keeps_each_servers_list_for_its_ttl_per_workspace(gw, upstream, eras_gw, era_servers):
    """A list asked again while fresh is the kept one: for the server's `ttlMs`, else (the session
    era says none) a few seconds; a `ttlMs` of 0 is never kept; another workspace's is its own."""
    # Three members (`tools`, `no-fail`, `adder`) are one server: each asks it once, then none.
    assert list_twice(gw, [upstream]) == [[3], [0]]
    assert list_twice(gw, [upstream]) == [[3], [0]], "a workspace's lists are its own"
    # In the stateless era this server says `ttlMs: 0`: asked each time.
    assert list_twice(gw, [upstream], mode="2026-07-28") == [[3], [3]]
    # A session-era server (no ttlMs) and a stateless one (a minute).
    assert list_twice(eras_gw, list(era_servers), mode="2026-07-28") == [[1, 1], [0, 0]]


def post_rpc(gateway, message: dict, session: str, key: str = helpers.KEY):
    """POSTs one JSON-RPC message to the aggregate in a client session; the answer (JSON, or the
    message of an SSE stream) or None for a 202."""
    headers = {**MCP_HEADERS, "authorization": f"Bearer {key}", "mcp-protocol-version": "2025-11-25",
               "mcp-session-id": session}
    r = gateway.http.post("/mcp", json=message, headers=headers)
    assert r.status_code in (200, 202), r.text
    if r.status_code == 202:
        return None
    if r.headers["content-type"].startswith("text/event-stream"):
        return json.loads(next(line[5:] for line in r.text.splitlines() if line.startswith("data:")))
    return r.json()


def test_any_replica_serves_an_aggregate_session_from_the_servers_sessions_sealed_in_its_id(gw, replica_gw, upstream):
    """`initialize` opens the servers' sessions and seals them in the client's session id; another
    replica with the same key calls in those sessions, having never seen the client."""
    upstream.seen_headers.clear()
    upstream.seen_methods.clear()
    r = gw.http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"})
    assert r.status_code == 200, r.text
    session = r.headers["mcp-session-id"]
    # The three members that are this server got `initialize` before the client's answer.
    assert upstream.seen_methods.count("initialize") == 3, upstream.seen_methods
    opened = {h["mcp-session-id"] for h in upstream.seen_headers if "mcp-session-id" in h}
    assert len(opened) == 3 and session.startswith("gw1.")
    assert not any(server_session in session for server_session in opened), "sealed, not readable"
    upstream.seen_headers.clear()
    upstream.seen_methods.clear()

    assert post_rpc(replica_gw, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session) is None
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "tools__add", "arguments": {"a": 2, "b": 2}}}
    assert post_rpc(replica_gw, call, session)["result"]["content"][0]["text"] == "4"
    assert upstream.seen_methods == ["tools/call"], "no session was opened again"
    assert [h.get("mcp-session-id") in opened for h in upstream.seen_headers] == [True]

    # The id is the caller's own: another key holding it gets no session of it.
    upstream.seen_headers.clear()
    upstream.seen_methods.clear()
    assert post_rpc(replica_gw, call, session, key=helpers.KEY2)["result"]["content"][0]["text"] == "4"
    assert upstream.seen_methods[0] == "initialize" and upstream.seen_methods[-1] == "tools/call"
    assert upstream.seen_headers[-1]["mcp-session-id"] not in opened

    # Ending the client's session (on either replica) ends the servers' sessions sealed in it.
    upstream.seen_headers.clear()
    auth = {"authorization": f"Bearer {helpers.KEY}", "mcp-session-id": session}
    assert replica_gw.http.delete("/mcp", headers=auth).status_code == 204
    assert {h["mcp-session-id"] for h in upstream.seen_headers if h[":method"] == "DELETE"} == opened


def test_the_aggregate_answers_its_own_requests_and_refuses_a_get(gw):
    auth = {**MCP_HEADERS, "authorization": f"Bearer {helpers.KEY}"}
    r = gw.http.post("/mcp", json=INITIALIZE, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["protocolVersion"] == "2025-11-25"
    session = r.headers["mcp-session-id"]
    assert session.startswith("gw1.")
    in_session = {**auth, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    note = gw.http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=in_session)
    assert (note.status_code, note.text) == (202, "")
    assert gw.http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=in_session).json() == \
        {"jsonrpc": "2.0", "id": 2, "result": {}}
    made_up = gw.http.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "made/up"}, headers=in_session)
    assert made_up.status_code == 200
    assert made_up.json() == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "Method not found: made/up"}}
    rpc_error(gw.http.post("/mcp", content=b"[]", headers=in_session), 400, -32600)
    get = gw.http.get("/mcp", headers=in_session)
    assert (get.status_code, get.headers["allow"]) == (405, "POST, DELETE")
    assert gw.http.delete("/mcp", headers=in_session).status_code == 204
    rpc_error(gw.http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS), 401, -32001)


def test_the_aggregates_requests_are_recorded(gw, upstream):
    trace = f"agg-{uuid.uuid4().hex[:12]}"

    async def session():
        async with aggregate(gw, {"authorization": f"Bearer {helpers.KEY}", "x-gateway-trace-id": trace}) as c:
            await c.list_tools()
            assert not (await c.call_tool("tools__add", {"a": 1, "b": 2})).is_error

    asyncio.run(session())
    deadline = time.monotonic() + 10
    while True:
        lines = access_lines(gw, trace, count=4, timeout=1)
        methods = {line.get("mcp_method"): line for line in lines}
        if {"tools/list", "tools/call"} <= set(methods) or time.monotonic() > deadline:
            break
    listed, called = methods["tools/list"], methods["tools/call"]
    assert (listed["client_api"], listed["status"], listed.get("mcp_server")) == ("mcp", 200, None), listed
    assert (called["mcp_server"], called["mcp_tool"], called["is_error"]) == ("tools", "add", False), called


def test_a_servers_request_on_a_call_reaches_the_client_and_its_answer_the_server(gw, upstream):
    """Elicitation through the aggregate: the server's request on the call's stream reaches the
    client with an id the gateway routes the client's answer back by, to that server."""
    asked = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"reply": "yes, go ahead"})

    async def session():
        http = httpx.AsyncClient(headers={"authorization": f"Bearer {helpers.KEY}"}, timeout=httpx.Timeout(30.0))
        transport = streamable_http_client(f"{gw.origin}/mcp", http_client=http)
        async with Client(transport, mode="legacy", elicitation_callback=on_elicit) as c:
            result = await c.call_tool("tools__confirm", {"question": "Delete the draft?"})
            return [b.text for b in result.content]

    assert asyncio.run(session()) == ["accept: yes, go ahead"]
    assert asked == ["Delete the draft?"]


def test_an_mcp_limit_counts_a_servers_tool_calls_and_refuses_past_it_with_429(gw, upstream):
    """`PUT /v1/limits/{id}` with `mcp_server` (and `mcp_tool`): such a limit counts the calls of that
    tool, through `/mcp` and `/mcp/{server}` alike; past it a call is HTTP 429 carrying a JSON-RPC
    error and `retry-after`, and never reaches the server. Lists and other tools are not counted."""
    workspace = f"team-{uuid.uuid4().hex[:8]}"
    r = gw.post("/v1/api-keys", {"workspace": workspace})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    limit = {"workspace": workspace, "mcp_server": "tools", "mcp_tool": "add", "requests_per_minute": 2}
    r = gw.http.put(f"/v1/limits/mcp-{uuid.uuid4().hex[:8]}", json=limit, headers={"x-gateway-api-key": helpers.KEY})
    assert r.status_code in (200, 201), r.text
    auth = {**MCP_HEADERS, "authorization": f"Bearer {key}"}

    def call(name: str, rpc_id: int):
        body = {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call",
                "params": {"name": name, "arguments": {"a": 1, "b": 2}}}
        return gw.http.post("/mcp", json=body, headers=auth)

    listed = gw.http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=auth)
    assert listed.status_code == 200 and "tools__add" in listed.text
    assert [call("tools__add", n).status_code for n in (2, 3)] == [200, 200]
    assert call("tools__fail", 4).status_code == 200, "another tool of the server is not counted"
    seen = len(upstream.seen_headers)
    refused = call("tools__add", 5)
    message = rpc_error(refused, 429, -32600, 5)
    assert "limit" in message, message
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(upstream.seen_headers) == seen, "a refused call never reaches the server"
    # The same server's endpoint counts against the same limit.
    direct = {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    rpc_error(gw.http.post("/mcp/tools", json=direct, headers=auth), 429, -32600, 6)
    assert len(upstream.seen_headers) == seen


# --------------------------------------------------------------------------- guardrails on tool calls

def refuses(word: str) -> dict:
    return {"id": f"no-{word}", "deny": True, "default.contains": {"words": [word], "operator": "none"}}


def checked_by(config: dict) -> dict:
    return {"authorization": f"Bearer {helpers.KEY}", "x-gateway-config": json.dumps(config)}


def denied_stage(denied: MCPError, stage: str) -> list:
    """The verdicts of `stage` in a denied call's JSON-RPC error (-32003)."""
    assert denied.code == -32003, denied
    return [(item["id"], item["verdict"]) for item in denied.data["hook_results"][stage]]


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("endpoint", ["server", "aggregate"])
def test_a_configs_guardrails_check_a_tool_calls_arguments_and_its_result(gw, upstream, mode, endpoint):
    """The config in `x-gateway-config` checks tool calls: its input guardrails read the arguments (a
    denied call never reaches the server), its output guardrails the result (a denied result never
    reaches the client); a deny is a JSON-RPC error carrying the verdicts. Lists are not checked."""
    headers = checked_by({"input_guardrails": [refuses("666")], "output_guardrails": [refuses("42")]})
    name = "add" if endpoint == "server" else "tools__add"
    upstream.added.clear()

    async def session():
        async with client(gw, mode, headers) if endpoint == "server" else aggregate(gw, headers, mode) as c:
            assert name in {tool.name for tool in (await c.list_tools()).tools}
            passed = await c.call_tool(name, {"a": 2, "b": 3})
            assert [block.text for block in passed.content] == ["5"]
            with pytest.raises(MCPError) as before:
                await c.call_tool(name, {"a": 666, "b": 1})
            assert denied_stage(before.value, "before_request_hooks") == [("no-666", False)]
            with pytest.raises(MCPError) as after:
                await c.call_tool(name, {"a": 40, "b": 2})
            assert denied_stage(after.value, "before_request_hooks") == [("no-666", True)]
            assert denied_stage(after.value, "after_request_hooks") == [("no-42", False)]

    asyncio.run(session())
    assert upstream.added == [(2, 3), (40, 2)], "the call denied before never reached the server"


def test_a_tool_calls_webhooks_see_its_call_and_result_and_decide(gw, upstream, hooks):
    """A webhook check (a dispatched call the tool call waits for) gets the call's params before, and
    its result after; its verdict decides; every verdict is in the call's record."""
    hooks.reset()

    def webhook(path: str) -> dict:
        return {"id": f"wh-{path.strip('/')}", "type": "guardrail",
                "checks": [{"id": "default.webhook", "parameters": {"webhookURL": hooks.url + path}}]}

    trace = f"mcp-{uuid.uuid4().hex[:12]}"
    config = {"before_request_hooks": [{**webhook("/mcp-in"), "on_fail": {"deny": True}}],
              "after_request_hooks": [webhook("/mcp-out")]}
    headers = {**checked_by(config), "x-gateway-trace-id": trace}
    upstream.added.clear()

    async def call(a: int):
        async with client(gw, "2026-07-28", headers) as c:
            try:
                return await c.call_tool("add", {"a": a, "b": 1})
            except MCPError as error:
                return error

    assert [block.text for block in asyncio.run(call(1)).content] == ["2"]
    ((_, _, before),) = hooks.of("/mcp-in")
    assert (before["request"]["name"], before["request"]["arguments"]) == ("add", {"a": 1, "b": 1})
    ((_, _, after),) = hooks.of("/mcp-out")
    assert after["response"]["content"] == [{"type": "text", "text": "2"}]
    hooks.verdict = False
    assert denied_stage(asyncio.run(call(7)), "before_request_hooks") == [("wh-mcp-in", False)]
    assert upstream.added == [(1, 1)]
    # Each call's line carries its verdicts (the denied call's has no output stage).
    deadline = time.monotonic() + 10
    while True:
        lines = access_lines(gw, trace, count=2, timeout=1)
        calls = [line for line in lines if line.get("mcp_method") == "tools/call"]
        if len(calls) == 2 or time.monotonic() > deadline:
            break
    verdicts = sorted(sorted((item["stage"], item["id"], item["verdict"]) for item in line["guardrails"]) for line in calls)
    assert verdicts == [[("after", "wh-mcp-out", True), ("before", "wh-mcp-in", True)],
                        [("before", "wh-mcp-in", False)]], calls


def test_a_call_the_client_cancels_through_the_aggregate_is_cancelled_at_its_server(gw, upstream):
    """A client that gives up on a call sends `notifications/cancelled` to the aggregate; it reaches
    the servers of the client's session, and the one running the call cancels it."""
    upstream.waiting.clear()
    upstream.cancelled.clear()

    async def session():
        async with aggregate(gw) as c:
            with pytest.raises(Exception):
                # The SDK cancels the request when it times out.
                await c.call_tool("tools__wait_for_cancel", {}, read_timeout_seconds=2)
            assert upstream.waiting.is_set(), "the call reached the server"
            return await anyio.to_thread.run_sync(upstream.cancelled.wait, 10)

    assert asyncio.run(session()), "the server's call was not cancelled"


@pytest.fixture(scope="module")
def era_servers():
    """A server that speaks only the session era, and one that speaks only the stateless era (whose
    tool lists say they stay fresh a minute)."""
    with UpstreamServer("session") as old, UpstreamServer("stateless", list_ttl_ms=60_000) as new:
        yield old, new


@pytest.fixture(scope="module")
def eras_gw(era_servers, start_gateway):
    old, new = era_servers
    servers = {"old": {"url": old.url}, "new": {"url": new.url}}
    with start_gateway("mcp-eras", None, {"GATEWAY_MCP_SERVERS": json.dumps(servers)}) as gateway:
        yield gateway


@pytest.mark.parametrize("mode", ERAS)
def test_a_client_of_either_era_reaches_servers_of_either_era_through_the_aggregate(eras_gw, era_servers, mode):
    """The gateway speaks to each server the client's era when the server has it, else the other,
    and bridges what differs: a 2026-07-28 client gets the `resultType` a session-era server does
    not send, and a session-era client's request reaches a stateless server with the era's
    envelope and headers."""
    old, new = era_servers
    for server in era_servers:
        server.seen_headers.clear()

    async def session():
        async with aggregate(eras_gw, mode=mode) as c:
            tools = {t.name for t in (await c.list_tools()).tools}
            assert {"old__add", "new__add", "old__confirm", "new__confirm"} <= tools, tools
            for server in ["old", "new"]:
                result = await c.call_tool(f"{server}__add", {"a": 20, "b": 22})
                assert [b.text for b in result.content] == ["42"], (server, result)
                prompt = await c.get_prompt(f"{server}__greet", {"name": "Ada"})
                assert prompt.messages[0].content.text == "Hello, Ada!"

    asyncio.run(session())
    assert old.added == [(20, 22)] and new.added == [(20, 22)], "each server ran the call once"
    # Each server heard only its own era: the old one in its session, the new one in none, with
    # the method and the unprefixed name in headers.
    calls = [h for h in old.seen_headers if h.get("mcp-session-id")]
    assert calls and all(h["mcp-protocol-version"] == "2025-11-25" for h in calls), old.seen_headers
    assert all(h.get("mcp-protocol-version") == "2026-07-28" and "mcp-session-id" not in h for h in new.seen_headers)
    assert {(h["mcp-method"], h.get("mcp-name")) for h in new.seen_headers} >= \
        {("tools/call", "add"), ("prompts/get", "greet")}, new.seen_headers
    old.added.clear()
    new.added.clear()



@pytest.mark.parametrize("mode", ERAS)
def test_a_servers_question_reaches_a_client_of_its_era_and_fails_clearly_for_the_other(eras_gw, era_servers, mode):
    """Elicitation through the aggregate: a client of the server's era answers it (mid-call in the
    session era, by `input_required` and a retry in the stateless one); a client of the other era
    cannot (the gateway would have to hold the call across the client's answers), so the call ends
    at once with an error saying why, rather than hang or pass a result the client misreads."""
    asked = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"reply": "yes"})

    async def call(server: str):
        http = httpx.AsyncClient(headers={"authorization": f"Bearer {helpers.KEY}"}, timeout=httpx.Timeout(30.0))
        transport = streamable_http_client(f"{eras_gw.origin}/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=on_elicit) as c:
            try:
                result = await c.call_tool(f"{server}__confirm", {"question": f"Ask {server}?"})
                return [b.text for b in result.content]
            except MCPError as error:
                return error.error.message

    own, other = ("old", "new") if mode == "legacy" else ("new", "old")
    assert asyncio.run(call(own)) == ["accept: yes"]
    assert asked == [f"Ask {own}?"]
    message = asyncio.run(call(other))
    if mode == "legacy":
        # The gateway declares no capability for a session-era client to a stateless server (it
        # could not bridge the question), so the server says what it lacks.
        assert "elicitation capability" in message, message
    else:
        assert f"MCP server '{other}' asks the client for input (elicitation/create)" in message, message
    assert asked == [f"Ask {own}?"], "the other era's question never reached the client"



@pytest.mark.parametrize("mode, listed", [("legacy", False), ("legacy", True), ("2026-07-28", True)])
def test_a_calls_param_headers_reach_a_stateless_server_from_a_client_of_either_era(eras_gw, era_servers, mode, listed):
    """A stateless server refuses a `tools/call` whose `Mcp-Param-*` headers miss an argument its
    tool's schema marks (`x-mcp-header`). A client of that era writes them, and they pass; for a
    session-era client the gateway writes them, from the schema in the tools it keeps for the
    caller (`listed`), else by listing the server's tools first."""
    _, new = era_servers
    key = helpers.workspace_key(eras_gw)

    async def session():
        async with aggregate(eras_gw, {"authorization": f"Bearer {key}"}, mode=mode) as c:
            if listed:
                await c.list_tools()
            new.seen_headers.clear()
            new.seen_methods.clear()
            result = await c.call_tool("new__locate", {"region": "Zürich"})
            return [b.text for b in result.content], result.is_error

    assert asyncio.run(session()) == (["in Zürich"], False)
    call = next(h for h in new.seen_headers if h.get("mcp-method") == "tools/call")
    assert call["mcp-param-region"] == "=?base64?" + base64.b64encode("Zürich".encode()).decode() + "?="
    # (The SDK's client may list the tools after a call, for the result's schema.)
    up_to_call = new.seen_methods[:new.seen_methods.index("tools/call") + 1]
    assert up_to_call == (["tools/call"] if listed else ["tools/list", "tools/call"]), new.seen_methods


# --------------------------------------------------------------------------- OAuth (resource server)

RESOURCE = "https://mcp.gateway.test/mcp"  # the gateway's MCP URL, as tokens' `aud` names it
ISSUER = "https://idp.test"


@pytest.fixture(scope="module")
def idp_key():
    return new_key()


@pytest.fixture(scope="module")
def oauth_gw(upstream, hooks, idp_key, start_gateway):
    """A gateway that also takes access tokens of ISSUER, whose JWKS the hooks server serves."""
    hooks.jwks = {"keys": [jwk(idp_key, "idp-1")]}
    oauth = {"issuer": ISSUER, "jwks_uri": hooks.url + "/oauth-jwks", "resource": RESOURCE, "workspace_claim": "team"}
    servers = {"tools": {"url": upstream.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"}}}
    env = {"GATEWAY_MCP_SERVERS": json.dumps(servers), "GATEWAY_MCP_OAUTH": json.dumps(oauth)}
    with start_gateway("mcp-oauth", None, env) as gateway:
        gateway.access_log = gateway.log_path
        yield gateway


def test_the_gateway_serves_its_oauth_metadata_and_names_it_in_each_401(oauth_gw, gw):
    """RFC 9728: the resource's metadata at its well-known path, named in `WWW-Authenticate`."""
    r = oauth_gw.http.get("/.well-known/oauth-protected-resource/mcp")
    assert r.status_code == 200, r.text
    assert r.json() == {"resource": RESOURCE, "authorization_servers": [ISSUER], "bearer_methods_supported": ["header"]}
    assert oauth_gw.http.head("/.well-known/oauth-protected-resource/mcp").status_code == 200
    r = oauth_gw.http.post("/.well-known/oauth-protected-resource/mcp", json={})
    assert (r.status_code, r.headers["allow"], r.json()["error"]["code"]) == (405, "GET, HEAD", "method_not_allowed")
    r = oauth_gw.http.post("/mcp/tools", json=INITIALIZE, headers=MCP_HEADERS)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == \
        'Bearer resource_metadata="https://mcp.gateway.test/.well-known/oauth-protected-resource/mcp"'
    # A gateway without `mcp_oauth` is no resource server.
    assert gw.http.get("/.well-known/oauth-protected-resource/mcp").status_code == 404
    assert gw.http.post("/mcp/tools", json=INITIALIZE, headers=MCP_HEADERS).headers["www-authenticate"] == "Bearer"


def test_an_access_token_of_the_issuer_calls_tools_in_its_claims_workspace(oauth_gw, upstream, hooks, idp_key):
    """A token for the gateway's MCP URL reaches the servers through `/mcp/{server}` and `/mcp` as a
    gateway key does; its `team` claim is the workspace; the token never reaches a server; the
    issuer's JWKS is fetched once for every request."""
    fetched_before = len(hooks.of("/oauth-jwks"))
    access = token(idp_key, "idp-1", iss=ISSUER, aud=RESOURCE, team="research")
    trace = f"mcp-{uuid.uuid4().hex[:12]}"
    headers = {"authorization": f"Bearer {access}", "x-gateway-trace-id": trace}
    upstream.seen_headers.clear()

    async def session():
        async with client(oauth_gw, "legacy", headers) as c:
            one = [b.text for b in (await c.call_tool("add", {"a": 2, "b": 2})).content]
        async with aggregate(oauth_gw, headers) as c:
            both = [b.text for b in (await c.call_tool("tools__add", {"a": 3, "b": 3})).content]
        return one, both

    assert asyncio.run(session()) == (["4"], ["6"])
    assert upstream.seen_headers and access not in json.dumps(upstream.seen_headers)
    assert {h.get("authorization") for h in upstream.seen_headers} == {f"Bearer {SERVER_TOKEN}"}
    assert len(hooks.of("/oauth-jwks")) - fetched_before <= 1, "one fetch serves every request"
    lines = access_lines(oauth_gw, trace, count=2)
    assert lines and {line["workspace"] for line in lines} == {"research"}, lines


@pytest.mark.parametrize("claims, says", [
    ({"aud": "https://elsewhere.test/mcp"}, "aud"),
    ({"iss": "https://evil.test"}, "issuer"),
    ({"exp": 1_000_000}, "expired"),
    ({"team": None}, "team"),
])
def test_a_token_not_for_this_gateway_is_refused_with_401(oauth_gw, upstream, idp_key, claims, says):
    base = {"iss": ISSUER, "aud": RESOURCE, "team": "research"}
    # A claim set to None is left out.
    access = token(idp_key, "idp-1", **{k: v for k, v in {**base, **claims}.items() if v is not None})
    before = len(upstream.seen_headers)
    r = oauth_gw.http.post("/mcp/tools", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {access}"})
    message = rpc_error(r, 401, -32001)
    assert message.startswith("invalid access token") and says in message, message
    assert "resource_metadata=" in r.headers["www-authenticate"]
    # Another key's token, made to look like the issuer's, is refused too.
    forged = token(new_key(), "idp-1", **base)
    r = oauth_gw.http.post("/mcp/tools", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {forged}"})
    assert "invalid access token" in rpc_error(r, 401, -32001)
    assert len(upstream.seen_headers) == before, "no server heard of a refused token"
