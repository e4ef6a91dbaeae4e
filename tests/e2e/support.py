"""What several suites share beyond helpers.py: waiting on an outcome, the guards every Envoy a
test starts runs under, the control plane's API, Envoy's metrics and access log, the providers'
configs, the hooks server (webhooks and JWKS), an MCP server of the official SDK and the mesh-shaped
Envoy. Test files import these from here, never from one another."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import http.client

import anthropic
import httpx2 as httpx
import jwt
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp.server.mcpserver import MCPServer

import helpers
from helpers import AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, CHAT, KEY, chat_body, config, provider_config
from pg_server import free_ports, stop_group

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- waiting on an outcome

# The filter's control-plane lookups stay fresh for 5 s: a change shows within 10 s.
VISIBLE_WITHIN = 10.0
# Envoy merges worker histograms at its stats flush (every 5 s).
FLUSHED_WITHIN = 20.0


def eventually(check: Callable[[], Any], within: float = VISIBLE_WITHIN) -> Any:
    """``check()``'s result once it no longer raises AssertionError, asking again until
    ``within`` seconds have passed (then its last AssertionError is raised)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.25)  # the pace of asking


def reaches(read: Callable[[], Any], expected: Any) -> Callable[[], Any]:
    """A check for ``eventually``: ``read()`` equals ``expected``."""
    def check():
        got = read()
        assert got == expected, f"{got!r} != {expected!r}"
        return got
    return check


# --------------------------------------------------------------------------- the guards of every Envoy

# Every gateway running now (the session's, a module's, an Envoy a test started), for the
# VM-reload guard (conftest's autouse `_no_vm_reload`).
LIVE_GATEWAYS: list[helpers.Gateway] = []


def end_of_run_problems(gw: helpers.Gateway, other_logs: Iterable[Path] = ()) -> list[str]:
    """Checks over a gateway's whole run, made while Envoy still serves: the filter VM was
    never reloaded (under FAIL_RELOAD a trap is otherwise invisible to the tests) and no
    secret ever reached the gateway's log (nor ``other_logs``: its control plane's)."""
    problems = []
    try:
        counters = gw.vm_reload_counters()
    except httpx.HTTPError as e:
        problems.append(f"cannot read Envoy's /stats: {e!r}")
    except pytest.fail.Exception as e:
        problems.append(str(e))
    else:
        if any(counters.values()):
            problems.append(f"the filter VM trapped and was reloaded during the run: {counters}")
    try:
        helpers.assert_no_secrets_in_log(gw)
    except AssertionError as e:
        problems.append(str(e))
    for path in other_logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = [s for s in helpers.SECRETS if s in text]
        if found:
            problems.append(f"secrets in {path}: {found}")
    return problems


@contextmanager
def under_guards(gw: helpers.Gateway, other_logs: Iterable[Path] = ()) -> Iterator[helpers.Gateway]:
    """Runs ``gw`` (a started Envoy) under the guards of the session's gateway: a test during
    which its filter VM was reloaded fails, and on a normal exit, while Envoy still serves, its
    whole run is checked (never reloaded, no secret in its log or ``other_logs``); a failed
    check fails the caller. Stop Envoy after this exits."""
    LIVE_GATEWAYS.append(gw)
    try:
        yield gw
    finally:
        LIVE_GATEWAYS.remove(gw)
    problems = end_of_run_problems(gw, other_logs)
    if problems:
        pytest.fail(f"at the end of the run of the Envoy on port {gw.port} ({gw.log_path}):\n" + "\n".join(problems),
                    pytrace=False)


# --------------------------------------------------------------------------- the control plane's API


def put(gw, path: str, body, key: str = KEY) -> httpx.Response:
    return gw.request("PUT", path, key=key, json=body)


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code in (200, 201), f"{resp.status_code}: {resp.text[:500]}"
    return resp.json()


def new_slug(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def new_workspace_key(gw, workspace: str | None = None, admin: bool = False) -> dict:
    body = {"workspace": workspace or new_slug("team")}
    if admin:
        body["admin"] = True
    created = ok(gw.post("/v1/api-keys", body))
    assert created["key"] and created["id"] and created["workspace"] == body["workspace"]
    return created


def put_limit(gw, body: dict, limit_id: str | None = None) -> dict:
    limit_id = limit_id or f"limit-{uuid.uuid4().hex[:8]}"
    limit = ok(gw.request("PUT", f"/v1/limits/{limit_id}", json=body))
    assert limit["id"] == limit_id
    return limit


def put_price(gw, key: str, model: str, **price) -> dict:
    return ok(gw.request("PUT", f"/v1/prices/{model}", key=key, json=price))


def unique_model() -> str:
    return f"gpt-mock-{uuid.uuid4().hex[:6]}"


def logged(gw, trace_id: str, within: float = VISIBLE_WITHIN) -> dict:
    """The one record of ``trace_id`` in `GET /v1/logs`, once it is there."""
    def record():
        r = gw.get("/v1/logs", params={"trace_id": trace_id})
        assert r.status_code == 200, r.text
        records = r.json()["data"]
        assert len(records) == 1, f"{len(records)} records of {trace_id}: {records}"
        return records[0]
    return eventually(record, within)


# --------------------------------------------------------------------------- Envoy's metrics and access log

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def prometheus(gw) -> list[tuple[str, dict, float]]:
    r = httpx.get(f"http://127.0.0.1:{gw.admin_port}/stats/prometheus", timeout=5)
    r.raise_for_status()
    samples = []
    for line in r.text.splitlines():
        m = _LINE.match(line)
        if m and not line.startswith("#"):
            samples.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return samples


def value(gw, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include ``labels`` (0 when there is none)."""
    return sum(v for n, ls, v in prometheus(gw) if n == name and all(ls.get(k) == w for k, w in labels.items()))


def access_lines(gw, trace_id: str, count: int = 1, timeout: float = FLUSHED_WITHIN) -> list[dict]:
    """The access-log objects of ``trace_id`` in ``gw.access_log`` once there are ``count`` of
    them (Envoy writes the file in batches), or those there are after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        text = gw.access_log.read_text() if gw.access_log.exists() else ""
        lines = [json.loads(line) for line in text.splitlines() if f'"trace_id":"{trace_id}"' in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


# --------------------------------------------------------------------------- providers' configs

GEMINI = "gemini-2.0-flash"
BEDROCK_MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
BEDROCK_MODEL_PATH = "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0"  # as Bedrock's path has it
CLAUDE = "claude-test-1"
READ_TOOL = {"name": "read_file", "description": "Read a file",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def sa_config(vertex_mock, key_file, **extra):
    return {"provider": "vertex-ai", "cloud_b_region": "us-central1", "cloud_b_service_account_json": key_file,
            "custom_host": vertex_mock.base_url, **extra}


def fresh_key_file(google_token_mock, tag):
    """The token mock's key file, told apart from other tests' by an extra field: a credential
    of its own for the gateway's token cache, so each test sees its own exchanges."""
    return {**google_token_mock.service_account_json(), "x_test": tag}


def bedrock_config(mock, **extra):
    return {"provider": "bedrock", "custom_host": mock.base_url, "cloud_c_region": "us-east-1",
            "cloud_c_access_key_id": AWS_ACCESS_KEY_ID, "cloud_c_secret_access_key": AWS_SECRET_ACCESS_KEY,
            **extra}


def signed_by(rec) -> str:
    """The access key id of the request's SigV4 credential scope."""
    auth = rec.header("authorization")
    assert auth.startswith("AWS4-HMAC-SHA256 Credential="), auth
    return auth.split("Credential=")[1].split("/")[0]


def anthropic_sdk(gateway, headers: dict, api_key: str = "sk-ant-client", key: str | None = KEY,
                  **kw) -> anthropic.Anthropic:
    """The Anthropic SDK pointed at the gateway (its key in `x-api-key`), the gateway's headers
    sent as Claude Code sends them (`ANTHROPIC_CUSTOM_HEADERS`)."""
    default_headers = {**({"x-gateway-api-key": key} if key else {}), **headers}
    return anthropic.Anthropic(base_url=gateway.origin, api_key=api_key, max_retries=0, timeout=30.0,
                               default_headers=default_headers, **kw)


def native(anthropic_mock) -> dict:
    """Anthropic itself (a custom host of that type): the client's x-api-key is the credential."""
    return {"x-gateway-provider": "anthropic", "x-gateway-custom-host": anthropic_mock.base_url}


# --------------------------------------------------------------------------- hooks: webhooks and JWKS


class Hooks:
    """A webhook and JWKS server: records what it gets; answers as the test says."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict]] = []
        self.verdict = True
        self.status = 200
        self.hold: threading.Event | None = None
        self.jwks: dict = {"keys": []}
        self.hold_jwks: threading.Event | None = None  # a JWKS answer waits for it
        self.received = threading.Event()
        self.arrived = threading.Condition(self.lock)  # notified as each request is recorded
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: dict):
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the gateway gave up on a stalled call

            def do_GET(self):
                with hooks.lock:
                    hooks.requests.append(("GET", self.path, {}))
                    hooks.arrived.notify_all()
                    jwks, hold = hooks.jwks, hooks.hold_jwks
                if hold is not None:
                    hold.wait(15)
                self._answer(200, jwks)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                with hooks.lock:
                    hooks.requests.append(("POST", self.path, body))
                    hooks.arrived.notify_all()
                    hold, status, verdict = hooks.hold, hooks.status, hooks.verdict
                hooks.received.set()
                if hold is not None:
                    hold.wait(15)
                self._answer(status, {"verdict": verdict})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self):
        with self.lock:
            self.requests.clear()
            self.verdict, self.status, self.hold, self.hold_jwks = True, 200, None, None
            self.received.clear()

    def of(self, path: str) -> list:
        with self.lock:
            return [r for r in self.requests if r[1] == path]

    def wait_for(self, path: str, count: int = 1, timeout: float = 10) -> bool:
        """Whether ``count`` requests for ``path`` arrived within ``timeout`` seconds (a path of
        the test's own: the server is its module's, and earlier tests' requests stay)."""
        with self.lock:
            return self.arrived.wait_for(lambda: sum(r[1] == path for r in self.requests) >= count, timeout)


@pytest.fixture(scope="module")
def hooks():
    server = Hooks()
    yield server
    server.server.shutdown()


# --------------------------------------------------------------------------- an MCP server


class McpUpstream:
    """An MCP server written with the official SDK (``server``, its tools the caller's) served by
    uvicorn on a free loopback port, in a thread of the test process, at ``url``; it records the
    headers of every request it receives in ``seen_headers`` (its method as ``:method``):
    ``with McpUpstream(server) as up:``.

    ``era`` makes it a server of one protocol era, as a server built before (or only for) the
    stateless one is: ``"session"`` refuses a request of 2026-07-28 (by its ``MCP-Protocol-Version``)
    and ``"stateless"`` every other, each with a 400 carrying a JSON-RPC error, as the SDKs do a
    version they do not speak; the refused requests' headers are in ``refused_headers``."""

    STATELESS = "2026-07-28"

    def __init__(self, server: MCPServer, era: str = "both"):
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.seen_headers: list[dict[str, str]] = []
        self.refused_headers: list[dict[str, str]] = []
        self.seen_methods: list[str] = []  # the method of each JSON-RPC request or notification it read
        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

        async def recording(scope, receive, send):
            if scope["type"] == "http" and scope["method"] == "POST":
                receive = await self._read_method(receive)
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                headers[":method"] = scope["method"]
                stateless = headers.get("mcp-protocol-version") == self.STATELESS
                if era != "both" and stateless != (era == "stateless"):
                    self.refused_headers.append(headers)
                    message = f"Bad Request: Unsupported protocol version: {headers.get('mcp-protocol-version')}"
                    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}})
                    await send({"type": "http.response.start", "status": 400,
                                "headers": [(b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body.encode()})
                    return
                self.seen_headers.append(headers)
            await app(scope, receive, send)

        config = uvicorn.Config(recording, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _read_method(self, receive):
        """Reads the request's body for its method, and gives the app a ``receive`` that replays it."""
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            self.seen_methods.append(json.loads(body).get("method"))
        except (ValueError, AttributeError):
            pass
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return replay

    def __enter__(self):
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                break
            threading.Event().wait(0.05)
        raise RuntimeError("the MCP server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def guarded(openai_mock, **checks) -> dict:
    """A config whose one target is ``openai_mock`` with ``checks`` (guardrails, hooks)."""
    return config(provider_config(openai_mock, **checks))


def new_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key, kid: str) -> dict:
    return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid}


def token(key, kid: str, **claims) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "user", "iat": now, "exp": now + 600, **claims}, key, algorithm="RS256",
                      headers={"kid": kid})


def jwt_headers(openai_mock, hooks: Hooks, path: str, tok: str, **params) -> dict:
    check = {"id": "default.jwt", "parameters": {"jwksUri": hooks.url + path, "headerKey": "x-user-token",
                                                 "algorithms": ["RS256"], **params}}
    hook = {"id": "jwt", "type": "guardrail", "checks": [check], "on_fail": {"deny": True}}
    return {**guarded(openai_mock, before_request_hooks=[hook]), "x-user-token": f"Bearer {tok}"}


def join_a_held_jwks_fetch(gw, openai_mock, hooks: Hooks, name: str, first_headers: dict | None = None):
    """Two requests on one JWKS fetch that the hooks server holds (`/jwks-<name>.json`): the
    first starts it, the second joins it, then the first client leaves. The worker reads the
    joined request before a probe sent after it is answered, so it does join. Returns the joined
    request's connection (its answer still to come) and the check's headers that pass once the
    JWKS arrives."""
    key = new_key()
    hooks.jwks = {"keys": [jwk(key, name)]}
    hooks.hold_jwks = threading.Event()
    checked = jwt_headers(openai_mock, hooks, f"/jwks-{name}.json", token(key, name))
    headers = {"x-gateway-api-key": KEY, "content-type": "application/json", **checked}
    body = json.dumps(chat_body())

    def send(extra: dict) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=20)
        connection.request("POST", CHAT, body=body, headers={**headers, **extra})
        return connection

    first = send(first_headers or {})
    assert hooks.wait_for(f"/jwks-{name}.json"), "the first request started the JWKS fetch"
    joined = send({})
    assert gw.get("/health", key=None).status_code == 200
    first.close()
    return joined, checked


# --------------------------------------------------------------------------- the mesh-shaped Envoy

ENVOY = REPO / ".venv/bin/envoy"
WASM = REPO / "target/model_gateway.wasm"
CONTROL_PLANE = REPO / "target/control-plane/gateway-control-plane"
CONTROL_PLANE_TOKEN = "cp-mesh-token"
ROUTE_HEADER = "x-gateway-upstream-cluster"


def mesh_cluster(port: int) -> str:
    return f"outbound|{port}||127.0.0.1"


def host(mock, provider: str = "openai") -> dict:
    return {"provider": provider, "api_key": "sk-config-key", "custom_host": mock.base_url}


class Peer:
    """A host the mesh has a cluster for (the control plane, beside the mocks)."""

    def __init__(self, port: int):
        self.port = port


def mesh_config(port: int, admin_port: int, mocks, control_plane_port: int, wasm: Path = WASM,
                stop_iteration: bool = True) -> dict:
    """An Envoy config shaped like a mesh's: per-host clusters and header-matched routes
    (`stop_iteration`: the Wasm filter's `allow_on_headers_stop_iteration`, which neither
    Istio's `WasmPlugin` nor Envoy Gateway's `EnvoyExtensionPolicy` sets)."""
    plugin = {"api_keys": [KEY], "upstream": {"cluster": "outbound|{port}||{host}", "route_header": ROUTE_HEADER},
              # The control plane is a host of the mesh too, reached by its cluster's name.
              "control_plane": {"cluster": mesh_cluster(control_plane_port),
                                "authority": f"127.0.0.1:{control_plane_port}", "token": CONTROL_PLANE_TOKEN,
                                "fresh_ms": 1000, "grace_ms": 60000, "timeout_ms": 3000}}
    wasm = {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "model_gateway", "root_id": "model_gateway", "failure_policy": "FAIL_RELOAD",
                "allow_on_headers_stop_iteration": stop_iteration,
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                  "value": json.dumps(plugin)},
                "vm_config": {"vm_id": "model_gateway", "runtime": "envoy.wasm.runtime.v8",
                              "code": {"local": {"filename": str(wasm)}}},
            },
        },
    }
    disabled = {"envoy.filters.http.wasm": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                                            "disabled": True}}
    routes = [
        # Another team's route on the same listener: the filter is off there.
        {"match": {"prefix": "/other"}, "typed_per_filter_config": disabled,
         "direct_response": {"status": 200, "body": {"inline_string": "other team's answer"}}},
        # One route per provider host, matching the route header; it removes the header, as a
        # mesh's route can (Istio: the VirtualService's `headers.request.remove`).
        *({"match": {"prefix": "/", "headers": [{"name": ROUTE_HEADER, "string_match": {"exact": mesh_cluster(m.port)}}]},
           "request_headers_to_remove": [ROUTE_HEADER],
           "route": {"cluster": mesh_cluster(m.port), "timeout": "0s"}} for m in mocks),
        # No catch-all: what matches no route is Envoy's own 404 (`route_not_found`).
    ]
    clusters = [{
        "name": mesh_cluster(m.port), "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": mesh_cluster(m.port), "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": m.port}}}}]}]},
    } for m in mocks]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "mesh",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "mesh",
                        "route_config": {"name": "mesh", "virtual_hosts": [
                            {"name": "mesh", "domains": ["*"], "routes": routes}]},
                        "http_filters": [wasm, {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    },
                }]}],
            }],
            "clusters": clusters,
        },
    }


def wasm_filter_name(envoy_config: dict) -> str | None:
    """The `name` of the Wasm filter's config in ``envoy_config`` (Envoy's stats of its VM are
    under `wasm.<name>.`), or None when the filter is another (the native module)."""
    manager = envoy_config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["typed_config"]["config"]["name"] for f in manager["http_filters"]
             if f["name"] == "envoy.filters.http.wasm"]
    return names[0] if names else None


@contextmanager
def running_mesh(directory: Path, mocks, wasm: Path, stop_iteration: bool = True,
                 adapt: Callable[[dict], None] = lambda _: None,
                 control_plane_token: str = CONTROL_PLANE_TOKEN) -> Iterator[helpers.Gateway]:
    """Envoy with the mesh-shaped config running `wasm` (changed by `adapt` first), and a
    control plane of its own (its last cluster), taking `control_plane_token` from the filter;
    under the session gateway's guards (``under_guards``)."""
    port, admin_port, control_plane_port = free_ports(3)
    hosts = [*mocks, Peer(control_plane_port)]
    envoy_config = mesh_config(port, admin_port, hosts, control_plane_port, wasm, stop_iteration)
    adapt(envoy_config)
    path = directory / "envoy.json"
    path.write_text(json.dumps(envoy_config))
    log_path = directory / "envoy.log"
    control_plane_log = directory / "control-plane.log"
    control_plane_env = {"PATH": "/usr/bin:/bin", "GATEWAY_CONTROL_PLANE_ADDR": f"127.0.0.1:{control_plane_port}",
                         "GATEWAY_CONTROL_PLANE_TOKEN": control_plane_token, "GATEWAY_API_KEYS": KEY,
                         "GATEWAY_STATE_DIR": str(directory / "state")}
    with open(control_plane_log, "wb") as log:
        control_plane = subprocess.Popen([str(CONTROL_PLANE)], env=control_plane_env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(ENVOY), "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
                                 "--log-level", "warn", "--base-id-path", str(directory / "base-id")],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    gw = helpers.Gateway(port, admin_port, log_path, control_plane_port)
    wasm_name = wasm_filter_name(envoy_config)
    gw.native = wasm_name is None
    gw.vm_reload_stat = f"wasm.{wasm_name}.vm_reload"
    try:
        wait_until_ok(f"http://127.0.0.1:{admin_port}/ready", proc, lambda: f"Envoy: {gw.log_tail(40)}")
        wait_until_ok(f"http://127.0.0.1:{control_plane_port}/health", control_plane,
                      lambda: f"the control plane: {control_plane_log.read_text()[-4000:]}")
        with under_guards(gw, [control_plane_log]):
            yield gw
    finally:
        gw.close()
        stop_group(proc)
        stop_group(control_plane)


def wait_until_ok(url: str, proc: subprocess.Popen, output) -> None:
    """Until `url` answers 200; fails with `output()` when `proc` exits or 60 s pass first."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer 200 within 60 s; {output()}", pytrace=False)
