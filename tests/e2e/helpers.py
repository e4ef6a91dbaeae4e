"""Shared request helpers and assertions for the gateway end-to-end tests.

The HTTP client is ``httpx2`` (the fork the ``openai`` SDK in this venv is built on); it
is imported as ``httpx`` here and in the tests.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import httpx2 as httpx
import openai
import pytest

KEY = "gw-test-key-1"
KEY2 = "gw-test-key-2"
CHAT = "/v1/chat/completions"
CLIENT_TOKEN = "sk-client-token"  # what a client sends as `Authorization: Bearer` in custom-host mode
SDK_DUMMY_KEY = "sk-sdk-dummy"  # the SDK's api_key where the gateway must NOT use it upstream

# Managed credentials given to the gateway in GATEWAY_CREDENTIALS (see conftest.py).
OPENAI_SLUG_KEY = "sk-mock-openai"
ANTHROPIC_SLUG_KEY = "sk-ant-mock"
OPENAI_VK_KEY = "sk-vk-openai"
ANTHROPIC_VK_KEY = "sk-ant-vk"
# The semantic cache's embeddings provider (the OpenAI mock) in the session gateway's GATEWAY_CACHE.
EMBED_KEY = "sk-embed-key"
EMBED_MODEL = "text-embedding-mock"
# What the cloud mocks (mocks_cloud.py, conftest's session fixtures) accept besides what they issue.
VERTEX_CLIENT_TOKEN = "ya29.client-own-access-token"  # a client's own Google access token
GEMINI_API_KEY = "gm-mock-api-key"
AWS_ACCESS_KEY_ID = "AKIAMOCKGATEWAYE2E01"
AWS_SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYMOCKSECRET"
AWS_TEMP_ACCESS_KEY_ID = "ASIAMOCKGATEWAYE2E02"  # temporary credentials: need the session token
AWS_TEMP_SECRET_ACCESS_KEY = "tEmPsEcReT/mock+KEY/0123456789abcdefghij"
AWS_SESSION_TOKEN = "IQoJb3JpZ2luX2VjEMOCK//////////session+token=="
BEDROCK_API_KEY = "ABSKbW9jay1iZWRyb2NrLWFwaS1rZXk="

# Every key of the OpenAI mocks' account: OpenAI answers 401 to any other (a test whose key is
# made at run time issues it with `mock.keys.add`).
OPENAI_KEYS = frozenset({
    CLIENT_TOKEN, OPENAI_SLUG_KEY, OPENAI_VK_KEY, EMBED_KEY,
    "sk-config-key", "sk-config-key-2", "sk-weight-1", "sk-direct",  # configs' keys, the mock tests'
    # test_control_plane.py's stored providers
    "sk-for-config", "sk-for-prompt", "sk-for-guardrail", "sk-default-ws", "sk-team-ws", "sk-cache-default",
    "sk-cache-team", "sk-survives", "sk-logged",
})

_ANY = object()

VM_RELOAD_STAT = "wasm.model_gateway.vm_reload"  # also _success, _failure, _backoff
NATIVE_PANIC_LINE = "the gateway's native filter panicked"  # src/native/mod.rs, `guarded`

# Every gateway header name that is not `x-gateway-*`, as the provider's recorder sees it
# (lowercased): the snake_case and camelCase aliases and the Cloud B/C names (README,
# "Gateway headers"). None of them may reach a provider unless explicitly forwarded.
GATEWAY_HEADER_ALIASES = (
    "api_key", "apikey", "provider", "virtual_key", "virtualkey", "config", "custom_host", "customhost",
    "trace_id", "traceid", "metadata", "cache_force_refresh", "cacheforcerefresh", "cache_namespace",
    "cachenamespace", "request_timeout", "requesttimeout", "forward_headers", "forwardheaders",
    "cloud_c_access_key_id", "cloudcaccesskeyid", "x-cloud-b-llm-request-type",
)

# Every secret the suite hands the gateway (gateway keys, provider keys, stored credentials).
SECRETS = (KEY, KEY2, CLIENT_TOKEN, OPENAI_SLUG_KEY, ANTHROPIC_SLUG_KEY, OPENAI_VK_KEY, ANTHROPIC_VK_KEY,
           EMBED_KEY, "sk-config-key", VERTEX_CLIENT_TOKEN, GEMINI_API_KEY, AWS_SECRET_ACCESS_KEY,
           AWS_TEMP_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, BEDROCK_API_KEY)


# --------------------------------------------------------------------------- the gateway


class Gateway:
    """A running gateway (started by conftest.py: once per session, or by a module's fixture)."""

    def __init__(self, port: int, admin_port: int, log_path: Path, control_plane_port: int = 0):
        self.process_group: int | None = None  # of `build.sh run`, once started
        self.native = False  # the filter is the native module (GATEWAY_HOST=native), not the wasm VM
        self.vm_reload_stat = VM_RELOAD_STAT  # `wasm.<the filter config's name>.vm_reload`
        self.port = port
        self.admin_port = admin_port
        self.control_plane_port = control_plane_port
        self.log_path = Path(log_path)
        self.origin = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.origin}/v1"
        self.http = httpx.Client(base_url=self.origin, timeout=httpx.Timeout(20.0, connect=5.0))

    def close(self):
        self.http.close()

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 256 * 1024))
                tail = deque(f.read().decode("utf-8", "replace").splitlines(), maxlen=lines)
            return "\n".join(tail)
        except OSError as e:
            return f"(no gateway log: {e})"

    def log_text(self) -> str:
        """The whole gateway log so far (stdout and stderr of the gateway process)."""
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_for_log_line(self, fragment: str, timeout: float = 5.0) -> str:
        """The first log line containing ``fragment``, waiting for Envoy to write it."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log_text().splitlines() if fragment in line]
            if lines:
                return lines[0]
            if time.monotonic() > deadline:
                pytest.fail(f"no gateway log line contains {fragment!r} within {timeout}s; tail:\n{self.log_tail(20)}")
            time.sleep(0.05)

    def control_plane_pid(self) -> int:
        """The pid of this gateway's control plane process (found by the address it was given)."""
        wanted = f"GATEWAY_CONTROL_PLANE_ADDR=127.0.0.1:{self.control_plane_port}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if b"gateway-control-plane" in (entry / "cmdline").read_bytes() and \
                        wanted in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
        pytest.fail(f"no control plane process for port {self.control_plane_port}")

    def stats(self) -> dict[str, str]:
        """Envoy's admin `/stats` as {name: value} (counters and gauges; histograms as text)."""
        r = httpx.get(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5)
        r.raise_for_status()
        out = {}
        for line in r.text.splitlines():
            name, sep, value = line.partition(": ")
            if sep:
                out[name.strip()] = value.strip()
        return out

    def memory_allocated(self) -> int:
        """Bytes Envoy's allocator holds now (admin `/memory`, field `allocated`): what the
        process's data in memory (shared data included) costs, without the VM's own heap."""
        r = httpx.get(f"http://127.0.0.1:{self.admin_port}/memory", timeout=5)
        r.raise_for_status()
        return int(r.json()["allocated"])

    def envoy_rss(self) -> int:
        """Envoy's resident memory in bytes (`VmRSS`). Unlike `/memory` it counts the filter
        VM's linear memory, which grows when the VM holds more and never shrinks."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                process_group = int(stat.read_text().rsplit(")", 1)[1].split()[2])
                if process_group != self.process_group or Path(stat.parent, "exe").resolve().name != "envoy":
                    continue
                status = Path(stat.parent, "status").read_text()
            except (OSError, IndexError, ValueError):
                continue  # gone, or not ours to read
            kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
            return int(kib) * 1024
        pytest.fail(f"no Envoy process in the gateway's process group {self.process_group}")

    def vm_reload_counters(self) -> dict[str, int]:
        """The filter VM's reload counters (`wasm.model_gateway.vm_reload*`, or under the name
        of the filter's config in ``vm_reload_stat``). A VM that traps under `failure_policy:
        FAIL_RELOAD` is replaced silently: these are the only trace. Fails if Envoy reports none
        of them (the check would be vacuous)."""
        if self.native:
            # No VM: a panic is caught in the hook that raised it and logged once (src/native).
            return {NATIVE_PANIC_LINE: self.log_text().count(NATIVE_PANIC_LINE)}
        counters = {k: int(v) for k, v in self.stats().items() if k.startswith(self.vm_reload_stat)}
        if self.vm_reload_stat not in counters:
            pytest.fail(f"Envoy's /stats has no {self.vm_reload_stat!r} counter (found {sorted(counters)}): "
                        "cannot tell whether the filter VM trapped and was reloaded")
        return counters

    # ---- plain HTTP
    @staticmethod
    def _headers(key: str | None, headers: dict | None) -> dict:
        h = {"x-gateway-api-key": key} if key else {}
        h.update(headers or {})
        return h

    def request(self, method: str, path: str, *, key: str | None = KEY, headers: dict | None = None,
                **kw: Any) -> httpx.Response:
        return self.http.request(method, path, headers=self._headers(key, headers), **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        if body is not None:
            kw["json"] = body
        return self.request("POST", path, **kw)

    def chat(self, headers: dict | None, body: Any = None, **kw: Any) -> httpx.Response:
        return self.post(CHAT, chat_body() if body is None else body, headers=headers, **kw)

    def stream(self, method: str, path: str, *, key: str | None = KEY, headers: dict | None = None, **kw: Any):
        return self.http.stream(method, path, headers=self._headers(key, headers), **kw)

    # ---- the official SDK
    def sdk(self, headers: dict | None = None, api_key: str = SDK_DUMMY_KEY, key: str | None = KEY,
            timeout: float | httpx.Timeout = 30.0, http_client: httpx.Client | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=timeout,
                             default_headers=self._headers(key, headers), http_client=http_client)

    # ---- raw sockets (garbage, oversized input)
    def raw(self, method: str, path: str, headers: Iterable[tuple[Any, Any]] = (), body: bytes = b"", *,
            key: str | None = KEY, content_type: str | None = "application/json",
            timeout: float = 30.0) -> "RawResponse":
        lines = [f"{method} {path} HTTP/1.1".encode(), f"Host: 127.0.0.1:{self.port}".encode()]
        if key:
            lines.append(b"x-gateway-api-key: " + key.encode())
        if content_type:
            lines.append(b"Content-Type: " + content_type.encode())
        for k, v in headers:
            k = k.encode() if isinstance(k, str) else k
            v = v.encode() if isinstance(v, str) else v
            lines.append(k + b": " + v)
        lines += [f"Content-Length: {len(body)}".encode(), b"Connection: close"]
        return raw_http("127.0.0.1", self.port, b"\r\n".join(lines) + b"\r\n\r\n" + body, timeout)


class SentRequests:
    """The requests an SDK client sent to the gateway, as sent (an httpx request hook; bodies
    read, so only for bodies that fit in memory). With ``drop_sdk_beta`` the SDK's own
    `OpenAI-Beta` is removed before sending, so only the client's `Vendor-Beta` asks for the
    assistants API."""

    def __init__(self, drop_sdk_beta: bool = False):
        self.requests: list[httpx.Request] = []
        self.drop_sdk_beta = drop_sdk_beta

    def hook(self, request: httpx.Request) -> None:
        if self.drop_sdk_beta:
            request.headers.pop("OpenAI-Beta", None)
        request.read()
        self.requests.append(request)

    @property
    def last(self) -> httpx.Request:
        assert self.requests, "the SDK sent nothing"
        return self.requests[-1]


def recording_sdk(gateway: Gateway, headers: dict, api_key: str = SDK_DUMMY_KEY,
                  drop_sdk_beta: bool = False) -> tuple[openai.OpenAI, SentRequests]:
    """An SDK client of ``gateway`` with ``headers``, and the log of what it sends."""
    sent = SentRequests(drop_sdk_beta)
    http_client = httpx.Client(event_hooks={"request": [sent.hook]}, timeout=30.0)
    return gateway.sdk(headers, api_key=api_key, http_client=http_client), sent


# --------------------------------------------------------------------------- raw HTTP


@dataclass
class RawResponse:
    status_code: int
    reason: str
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def _parse_head(buf: bytes):
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), (parts[2] if len(parts) > 2 else ""), headers, rest


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return bytes(out)
        size = int(data[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2: eol + 2 + size]
        pos = eol + 2 + size + 2


def raw_http(host: str, port: int, request: bytes, timeout: float = 30.0) -> RawResponse:
    """Send ``request`` bytes as-is (from a background thread, so a server that answers
    before reading everything is still heard) and read one response. Fails the test if
    nothing complete arrives within ``timeout`` (a hang) or the connection closes with
    no response at all."""
    sock = socket.create_connection((host, port), timeout=5)

    def send():
        try:
            sock.sendall(request)
        except OSError:
            pass  # the server may answer early and close; its answer is still read below

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    buf = bytearray()
    deadline = time.monotonic() + timeout
    parsed = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no complete response within {timeout}s (the gateway hung); got {bytes(buf[:300])!r}")
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not data:
                break
            buf += data
            parsed = _parse_head(bytes(buf))
            if parsed:
                status, _, headers, rest = parsed
                if 100 <= status < 200:  # interim response: drop it and keep reading
                    buf = bytearray(rest)
                    parsed = None
                    continue
                if "content-length" in headers and len(rest) >= int(headers["content-length"]):
                    break
                if "chunked" in headers.get("transfer-encoding", "") and rest.endswith(b"0\r\n\r\n"):
                    break
    finally:
        sock.close()
    parsed = _parse_head(bytes(buf))
    if not parsed:
        pytest.fail(f"the connection closed without an HTTP response; got {bytes(buf[:300])!r}")
    status, reason, headers, rest = parsed
    if "chunked" in headers.get("transfer-encoding", ""):
        rest = _dechunk(rest)
    elif "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return RawResponse(status, reason, headers, rest)


# --------------------------------------------------------------------------- request building


def chat_body(content: str = "Say hello.", model: str = "gpt-mock", **extra: Any) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def custom_host(mock, provider: str = "openai", token: str = CLIENT_TOKEN) -> dict:
    """Way 1/4 of spec 5.2: provider name + bearer token + custom host."""
    return {"x-gateway-provider": provider, "Authorization": f"Bearer {token}",
            "x-gateway-custom-host": mock.base_url}


def workspace_key(gateway: "Gateway") -> str:
    """A key of a new workspace (made with the session's admin key): its managed batches and
    gateway files are its own, and a batch list in it is the provider's alone."""
    resp = gateway.post("/v1/api-keys", {"workspace": f"team-{uuid.uuid4().hex[:8]}"})
    assert resp.status_code == 201, resp.text
    return resp.json()["key"]


def slug(name: str) -> dict:
    """Way 2: a managed provider `@slug`."""
    return {"x-gateway-provider": f"@{name}"}


def virtual_key(vk: str) -> dict:
    """Way 2 (legacy): a virtual key."""
    return {"x-gateway-virtual-key": vk}


def config(cfg: Any) -> dict:
    """Way 3: a config in `x-gateway-config` (dicts are JSON-encoded, strings sent as-is)."""
    return {"x-gateway-config": cfg if isinstance(cfg, str) else json.dumps(cfg)}


def provider_config(mock, provider: str = "openai", api_key: str = "sk-config-key", **extra: Any) -> dict:
    """A single-provider config pointing at ``mock``."""
    return {"provider": provider, "api_key": api_key, "custom_host": mock.base_url, **extra}


# --------------------------------------------------------------------------- assertions


def error_of(resp) -> dict:
    """The `error` object of a gateway error response, checked for the OpenAI shape."""
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"expected a JSON error body, got {resp.status_code} "
                    f"{resp.headers.get('content-type')!r}: {resp.text[:300]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"not an error object: {body!r}"
    err = body["error"]
    missing = {"message", "type", "param", "code"} - set(err)
    assert not missing, f"error object lacks {sorted(missing)}: {err!r}"
    assert isinstance(err["message"], str) and err["message"], f"empty error message: {err!r}"
    assert isinstance(err["type"], str) and err["type"], f"empty error type: {err!r}"
    return err


def assert_error(resp, status: int, *, type: str | None = None, param: Any = _ANY, code: Any = _ANY,  # noqa: A002
                 contains: str | Iterable[str] = (), trace: bool = True) -> dict:
    """Assert an error response: status, OpenAI error shape, fields, message fragments
    (case-insensitive) and the trace-id header. Returns the error object."""
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text[:500]}"
    err = error_of(resp)
    if type is not None:
        assert err["type"] == type, f"error type {err['type']!r} != {type!r}: {err!r}"
    if param is not _ANY:
        assert err["param"] == param, f"error param {err['param']!r} != {param!r}: {err!r}"
    if code is not _ANY:
        assert err["code"] == code, f"error code {err['code']!r} != {code!r}: {err!r}"
    for frag in [contains] if isinstance(contains, str) else contains:
        assert frag.lower() in err["message"].lower(), f"{frag!r} not in error message {err['message']!r}"
    if trace:
        assert resp.headers.get("x-gateway-trace-id"), f"no x-gateway-trace-id on {resp.status_code} response"
    return err


def assert_chat_completion(body: dict, *, content: Any = _ANY, finish_reason: Any = _ANY,
                           model: Any = _ANY) -> dict:
    """Check the `chat.completion` shape (spec 2.9); returns choices[0].message."""
    assert body.get("object") == "chat.completion", body
    assert isinstance(body.get("id"), str) and body["id"], body
    assert isinstance(body.get("created"), int), body
    assert isinstance(body.get("model"), str), body
    assert isinstance(body.get("choices"), list) and body["choices"], body
    choice = body["choices"][0]
    assert choice.get("index") == 0, choice
    msg = choice["message"]
    assert msg.get("role") == "assistant", msg
    if content is not _ANY:
        assert msg.get("content") == content, f"content {msg.get('content')!r} != {content!r}"
    if finish_reason is not _ANY:
        assert choice.get("finish_reason") == finish_reason, choice
    if model is not _ANY:
        assert body["model"] == model, body
    usage = body.get("usage")
    assert isinstance(usage, dict), body
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(usage.get(k), int), usage
    return msg


def assert_clean_upstream(rec, *secrets: str, forwarded: Iterable[str] = ()) -> None:
    """What the provider received carries no gateway header (`x-gateway-*` or any alias),
    no `Accept-Encoding` (responses must come back uncompressed), and none of ``secrets``
    in any header value. ``forwarded`` lists the gateway headers the request asked to
    forward (`forward_headers`): those alone may arrive."""
    allowed = {h.lower() for h in forwarded}
    leaked = sorted(k for k in rec.headers
                    if (k.startswith("x-gateway-") or k in GATEWAY_HEADER_ALIASES) and k not in allowed)
    assert not leaked, f"gateway headers reached the provider: {leaked}"
    assert "accept-encoding" not in rec.headers, (
        f"Accept-Encoding reached the provider: {rec.headers['accept-encoding']!r}")
    for s in secrets:
        bad = [k for k, v in rec.headers.items() if s in v]
        assert not bad, f"{s!r} reached the provider in header(s) {bad}"


def assert_envoy_rejected(resp, provider_mock) -> None:
    """Envoy's own HTTP codec refused the request (an invalid header name or a control
    character): 400 before the filter runs, and nothing reached the provider."""
    assert resp.status_code == 400, f"expected Envoy's 400, got {resp.status_code}: {resp.text[:300]!r}"
    assert "x-gateway-provider" not in resp.headers, f"a provider answered: {resp.headers}"
    assert provider_mock.requests == [], "the request reached the provider"


def assert_no_secrets_in_log(gateway: "Gateway", *extra: str) -> None:
    """No gateway key or provider key (``SECRETS`` plus ``extra``) in the gateway's log."""
    text = gateway.log_text()
    found = [s for s in (*SECRETS, *extra) if s in text]
    assert not found, f"secrets in the gateway log: {found}"


def served_by(resp, provider: str) -> None:
    assert resp.headers.get("x-gateway-provider") == provider, (
        f"x-gateway-provider {resp.headers.get('x-gateway-provider')!r} != {provider!r}")
    assert resp.headers.get("x-gateway-trace-id"), "no x-gateway-trace-id"


def check_alive(gateway: Gateway, openai_mock) -> None:
    """A normal request still succeeds (the filter VM did not crash or wedge)."""
    before = len(openai_mock.requests)
    r = gateway.chat(custom_host(openai_mock), chat_body("still alive?"))
    assert r.status_code == 200, f"a normal request failed afterwards: {r.status_code} {r.text[:300]}"
    assert r.json()["choices"][0]["message"]["content"] == openai_mock.default_text
    assert len(openai_mock.requests) == before + 1


# --------------------------------------------------------------------------- streams


@dataclass
class StreamResult:
    status: int = 0
    headers: dict = field(default_factory=dict)
    events: list[tuple[str | None, str]] = field(default_factory=list)  # (event name, data)
    chunks: list[dict] = field(default_factory=list)  # parsed JSON data lines
    done: bool = False  # saw `data: [DONE]`
    content: str = ""
    finish_reason: str | None = None
    tool_calls: dict[int, dict] = field(default_factory=dict)  # index -> {id, name, arguments}
    usage: dict | None = None
    first_content_at: float | None = None

    def feed_chunk(self, chunk: dict) -> None:
        self.chunks.append(chunk)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content += delta["content"]
                if self.first_content_at is None:
                    self.first_content_at = time.monotonic()
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(tc.get("index", 0), {"id": None, "name": None, "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] = fn["name"]
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]


def read_stream(resp, on_chunk=None) -> StreamResult:
    """Read an SSE response line by line into a StreamResult; ``on_chunk(result)`` runs
    after each parsed JSON chunk."""
    res = StreamResult(status=resp.status_code, headers=dict(resp.headers))
    event = None
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            res.events.append((event, data))
            event = None
            if data == "[DONE]":
                res.done = True
                continue
            assert not res.done, f"data after [DONE]: {data!r}"
            chunk = json.loads(data)
            res.feed_chunk(chunk)
            if on_chunk:
                on_chunk(res)
    return res


def stream_chat(gateway: Gateway, headers: dict, body: dict, *, gate: threading.Event | None = None,
                read_timeout: float = 10.0) -> StreamResult:
    """POST a streaming chat completion and read it all. With ``gate``, set the gate as
    soon as the first content arrives: the provider holds the rest of the stream until
    then, so a gateway that buffers makes the read time out and the test fail."""
    body = {**body, "stream": True}

    def open_gate(res: StreamResult):
        if gate is not None and not gate.is_set() and (res.content or res.tool_calls):
            gate.set()

    try:
        with gateway.stream("POST", CHAT, headers=headers, json=body,
                            timeout=httpx.Timeout(30.0, read=read_timeout)) as resp:
            if resp.status_code != 200:
                resp.read()
                pytest.fail(f"stream request failed: {resp.status_code} {resp.text[:500]}")
            return read_stream(resp, open_gate)
    except httpx.ReadTimeout:
        if gate is not None and not gate.is_set():
            pytest.fail(f"no streamed content arrived within {read_timeout}s while the provider held back the "
                        "rest of its stream: the gateway buffers the response instead of streaming it")
        raise


def sdk_stream(stream) -> StreamResult:
    """Consume an `openai` SDK chat stream into a StreamResult."""
    res = StreamResult(status=200)
    for chunk in stream:
        res.feed_chunk(chunk.model_dump(exclude_none=True))
    return res


def process_start(pid: int) -> tuple[list[bytes], dict[bytes, bytes], str]:
    """How process `pid` was started: its command line, environment and working directory."""
    proc = Path(f"/proc/{pid}")
    command = proc.joinpath("cmdline").read_bytes().split(b"\0")[:-1]
    environment = dict(item.split(b"=", 1) for item in proc.joinpath("environ").read_bytes().split(b"\0")
                       if b"=" in item)
    return command, environment, os.readlink(proc / "cwd")
