"""Mock model providers for the end-to-end tests.

Real HTTP/1.1 servers on 127.0.0.1 (ephemeral ports, keep-alive, Content-Length for
plain answers, chunked transfer encoding for streams), each running in daemon threads
inside the pytest process:

* ``OpenAIMock`` speaks OpenAI's wire format (chat completions, the Responses API with its
  stored responses, completions, embeddings, images, audio transcriptions, batches, assistants,
  threads, fine-tuning, models).
* ``AnthropicMock`` speaks Anthropic's Messages API (``POST /v1/messages``, and
  ``/v1/messages/count_tokens``), validates requests like the real API does and streams the
  real SSE event sequence.

Every request is recorded (``mock.requests``, ``mock.last``) with method, path, query,
lowercased headers, raw body bytes, parsed JSON and, for multipart bodies, the parts.

Scripting is explicit and per test: ``mock.script(Reply(...))`` queues a reply for the
next matching request (optionally only for a given ``model`` or ``path``). Requests with
no matching script get the mock's default answer. ``reset()`` (called by an autouse
fixture) drops scripts and recordings and releases any reply waiting on a hold, gate or step.

    gate = threading.Event()
    openai_mock.script(Reply(text="one two three", gate=gate))   # gated stream
    openai_mock.script(Reply(stall=3))                           # sleep 3 s before headers
    reply = openai_mock.script(Reply(hold=threading.Event()))    # no answer until the test sets it
    reply.received.wait(5)                                       # the request with this reply arrived
    openai_mock.script(OpenAIMock.error(429, "slow down", code="rate_limit_exceeded"))
    openai_mock.script(Reply(raw=b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{", reset=True))  # a broken peer
    anthropic_mock.script(Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})]))

Embedding vectors are a hash of the input unless a test pins them (``reset()`` forgets it):

    openai_mock.embed_as("capital of France", [1.0, 0.0, 0.0])  # inputs containing it get this vector
"""

from __future__ import annotations

import base64
import hashlib
import dataclasses
import json
import re
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "AnthropicMock",
    "MockProvider",
    "OpenAIMock",
    "RecordedRequest",
    "Reply",
    "ToolCall",
    "make_self_signed_cert",
]


# --------------------------------------------------------------------------- scripting


@dataclass
class ToolCall:
    """A tool call the scripted model makes. ``id`` is generated in the provider's style
    (``call_...`` / ``toolu_...``) when left empty. ``namespace``: the Responses API's
    namespace tool the function is in (Codex puts an MCP server's tools in one)."""

    name: str
    arguments: dict
    id: str = ""
    namespace: str | None = None


@dataclass(eq=False)
class Reply:
    """What a mock answers to one request.

    ``body`` (dict/list → JSON, str/bytes → raw) replaces the generated answer entirely and
    is sent with ``status``. With ``body`` left ``None`` a non-200 ``status`` produces a
    provider-shaped error, and 200 produces a generated answer from the fields below.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # generated content
    text: str | None = None  # None: the mock's default text (or no text when tool_calls)
    chunks: list[str] | None = None  # stream pieces of ``text``; default: split by words
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: str | None = None  # Anthropic only: a thinking block before the text
    stop_reason: str | None = None  # native finish_reason / stop_reason; derived if None
    usage: tuple[int, int] = (11, 7)  # (prompt/input tokens, completion/output tokens)
    # timing (stall, chunk_delay: a slow provider) and events (hold, gate, step: the test decides)
    stall: float = 0.0  # seconds to sleep before sending the status line and headers
    chunk_delay: float = 0.0  # seconds between stream events
    hold: threading.Event | None = None  # before the status line and headers, wait until set
    hold_timeout: float = 15.0
    gate: threading.Event | None = None  # stream: after the first content chunk, wait
    gate_timeout: float = 15.0
    step: threading.Semaphore | None = None  # OpenAI chat stream: before each content chunk after the
    step_timeout: float = 15.0  # first, take a permit (the test releases one per chunk it has read)
    # a broken peer: these bytes (status line, headers, any body) are the whole answer, written
    # as they are; then the connection closes, with a TCP reset (RST) when ``reset``
    raw: bytes | None = None
    reset: bool = False
    # a stalled peer: after ``raw``, the connection stays open, silent, until this is set
    linger: threading.Event | None = None
    linger_timeout: float = 30.0
    # filled in by the mock
    hold_timed_out: bool | None = None  # True if the hold was never released in time
    gate_timed_out: bool | None = None  # True if the gate was never set in time
    step_timed_out: bool | None = None  # True if a step permit never came in time
    cut_off: bool = False  # True if the gateway closed the connection before the answer was written
    received: threading.Event = field(default_factory=threading.Event)  # a request took this reply
    served: threading.Event = field(default_factory=threading.Event)  # answer finished

    def resolved_text(self, default: str) -> str:
        if self.text is not None:
            return self.text
        return "" if self.tool_calls else default

    def pieces(self, default: str) -> list[str]:
        if self.chunks is not None:
            return list(self.chunks)
        text = self.resolved_text(default)
        return re.findall(r"\S+\s*|\s+", text) if text else []


@dataclass
class _Rule:
    reply: Reply
    model: str | None
    path: str | None
    times: int | None  # None: unlimited


@dataclass
class RecordedRequest:
    method: str
    path: str  # without the query string
    raw_query: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lowercased names; repeated headers joined with ", "
    header_list: list[tuple[str, str]]  # as received, in order
    body: bytes
    json: Any  # parsed JSON body, or None
    form: dict[str, dict] | None  # multipart parts: name -> {filename, content_type, data}
    client: tuple
    received_at: float

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def qs(self, name: str) -> str | None:
        vals = self.query.get(name)
        return vals[-1] if vals else None


def _sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _split(s: str, n: int) -> list[str]:
    """Split ``s`` into about ``n`` non-empty pieces."""
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def _parse_multipart(content_type: str, body: bytes) -> dict[str, dict] | None:
    m = re.search(r'boundary="?([^";]+)"?', content_type or "")
    if not m:
        return None
    delim = b"--" + m.group(1).encode()
    parts: dict[str, dict] = {}
    for chunk in body.split(delim)[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            continue
        if data.endswith(b"\r\n"):
            data = data[:-2]
        hdrs = {}
        for line in head.decode("latin-1").split("\r\n"):
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        disp = hdrs.get("content-disposition", "")
        name = re.search(r'\bname="([^"]*)"', disp)
        fname = re.search(r'\bfilename="([^"]*)"', disp)
        parts[name.group(1) if name else ""] = {
            "filename": fname.group(1) if fname else None,
            "content_type": hdrs.get("content-type"),
            "data": data,
        }
    return parts


# --------------------------------------------------------------------------- HTTP plumbing


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):  # keep the test output clean
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "MockProvider/1.0"
    timeout = 900  # idle keep-alive connections are dropped after this (longer than a test run,
    # so a proxy never reuses a pooled connection just as the mock closes it)
    mock: "MockProvider"  # set on the per-mock subclass

    def setup(self):
        self.mock._count("connections")
        ctx = self.mock.ssl_context
        if ctx is not None:
            self.request.settimeout(10)
            try:
                self.request = ctx.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError):
                self.mock._count("tls_failures")
                raise
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 - signature from the base class
        pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self._read_exactly(size)
                self.rfile.readline(65537)  # CRLF after the chunk
        return self._read_exactly(int(self.headers.get("Content-Length") or 0))

    def _read_exactly(self, length: int) -> bytes:
        """``length`` body bytes, counted as they arrive (``mock.body_bytes``), so a test can
        see a large body reach the provider while the client is still sending it."""
        out = bytearray()
        while len(out) < length:
            piece = self.rfile.read1(min(length - len(out), 1 << 20))
            if not piece:
                break
            out += piece
            self.mock._count("body_bytes", len(piece))
        return bytes(out)

    def _dispatch(self):
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        split = urlsplit(self.path)
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
        ctype = self.headers.get("Content-Type") or ""
        form = _parse_multipart(ctype, body) if "multipart/form-data" in ctype.lower() else None
        header_list = [(k, v) for k, v in self.headers.items()]
        headers: dict[str, str] = {}
        for k, v in header_list:
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        req = RecordedRequest(
            method=self.command,
            path=split.path,
            raw_query=split.query,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
            header_list=header_list,
            body=body,
            json=parsed,
            form=form,
            client=self.client_address,
            received_at=time.monotonic(),
        )
        self.mock._record(req)
        try:
            self.mock.handle(self, req)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError, OSError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # ---- response writers
    def send_bytes(self, status: int, body: bytes, content_type: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_raw(self, data: bytes, reset: bool = False):
        """Writes ``data`` as it is and closes the connection (``reset``: with an RST, no FIN)."""
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def send_json(self, status: int, obj: Any, headers: dict | None = None):
        self.send_bytes(status, json.dumps(obj).encode(), "application/json", headers)

    def start_stream(self, status: int = 200, headers: dict | None = None,
                     content_type: str = "text/event-stream; charset=utf-8"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def write_chunk(self, data: bytes):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class MockProvider:
    """Base of the mocks: server lifecycle, recording, scripting, streaming helper."""

    name = "mock"
    default_text = "Hello from the mock."

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self.ssl_context = ssl_context
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.requests: list[RecordedRequest] = []
        self._rules: list[_Rule] = []
        self._active: list[Reply] = []
        self.connections = 0
        self.tls_failures = 0
        self.body_bytes = 0  # request body bytes read so far, counted as they arrive
        handler = type(f"{type(self).__name__}Handler", (_Handler,), {"mock": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self.port: int = self._server.server_address[1]
        scheme = "https" if ssl_context else "http"
        self.origin = f"{scheme}://127.0.0.1:{self.port}"
        self.base_url = f"{self.origin}/v1"
        self._thread: threading.Thread | None = None

    # ---- lifecycle
    def start(self) -> "MockProvider":
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name=f"{self.name}-mock",
        )
        self._thread.start()
        return self

    def stop(self):
        self._release_gates()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def reset(self):
        """Forget recorded requests and scripts; let any held, gated or stepped reply finish."""
        self._release_gates()
        with self._lock:
            self.requests.clear()
            self._rules.clear()
            self._active.clear()
            self.connections = 0
            self.tls_failures = 0
            self.body_bytes = 0

    def _release_gates(self):
        with self._lock:
            replies = [r.reply for r in self._rules] + list(self._active)
        for r in replies:
            for event in (r.hold, r.gate):
                if event is not None:
                    event.set()
            if r.step is not None:
                r.step.release(1000)

    # ---- scripting
    def script(
        self,
        reply: Reply | None = None,
        *,
        model: str | None = None,
        path: str | None = None,
        times: int | None = 1,
        **fields: Any,
    ) -> Reply:
        """Queue ``reply`` (or ``Reply(**fields)``) for the next request matching ``model``
        (the JSON body's ``model``) and ``path`` (exact, e.g. ``/v1/chat/completions``);
        ``times=None`` keeps it for every matching request. Returns the reply object,
        whose ``served`` event and ``gate_timed_out`` flag tests may inspect."""
        if reply is None:
            reply = Reply(**fields)
        elif fields:
            raise TypeError("pass either a Reply or its fields, not both")
        with self._lock:
            self._rules.append(_Rule(reply, model, path, times))
        return reply

    def request_model(self, req: RecordedRequest) -> str | None:
        """The model a request asks for (what ``script(model=...)`` matches): the JSON body's
        ``model`` here; mocks of APIs that name it in the path override this."""
        return req.json.get("model") if isinstance(req.json, dict) else None

    def _take_reply(self, req: RecordedRequest) -> Reply | None:
        model = self.request_model(req)
        with self._lock:
            for rule in self._rules:
                if rule.model is not None and rule.model != model:
                    continue
                if rule.path is not None and rule.path != req.path:
                    continue
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                self._active.append(rule.reply)
                rule.reply.received.set()
                return rule.reply
        return None

    # ---- recording
    def _record(self, req: RecordedRequest):
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()

    def _count(self, attr: str, n: int = 1):
        with self._cond:
            setattr(self, attr, getattr(self, attr) + n)
            self._cond.notify_all()

    @property
    def last(self) -> RecordedRequest:
        with self._lock:
            assert self.requests, f"the {self.name} mock received no request"
            return self.requests[-1]

    def requests_to(self, path: str, method: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path and (method is None or r.method == method)]

    def wait_for_requests(self, n: int = 1, timeout: float = 5.0) -> list[RecordedRequest]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.requests) >= n, timeout)
            return list(self.requests)

    def wait_until(self, predicate: Callable[["MockProvider"], bool], timeout: float = 5.0) -> bool:
        """Wait until ``predicate(mock)`` holds (checked whenever a request is recorded, a
        connection or TLS failure counted, or a piece of a body read), at most ``timeout`` seconds; returns whether it does."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    # ---- answering
    def handle(self, h: _Handler, req: RecordedRequest):  # pragma: no cover - abstract
        raise NotImplementedError

    def _serve(self, h: _Handler, req: RecordedRequest, produce: Callable[[Reply], None]):
        """Pick the scripted reply (or a default one), apply stall and hold, send a scripted
        raw body or error, else call ``produce(reply)`` for the generated answer."""
        reply = self._take_reply(req) or Reply()
        try:
            if reply.stall:
                time.sleep(reply.stall)
            if reply.hold is not None:
                reply.hold_timed_out = not reply.hold.wait(reply.hold_timeout)
            if reply.raw is not None and reply.linger is not None:
                h.wfile.write(reply.raw)
                h.wfile.flush()
                reply.linger.wait(reply.linger_timeout)
                h.close_connection = True
            elif reply.raw is not None:
                h.send_raw(reply.raw, reset=reply.reset)
            elif reply.body is not None:
                body = reply.body
                if isinstance(body, (dict, list)):
                    h.send_json(reply.status, body, reply.headers)
                else:
                    raw = body.encode() if isinstance(body, str) else body
                    h.send_bytes(reply.status, raw, reply.headers.get("Content-Type", "application/json"),
                                 {k: v for k, v in reply.headers.items() if k.lower() != "content-type"})
            elif reply.status >= 400:
                h.send_json(reply.status, self.error_body(reply.status, None, None),
                            {**self.error_headers(reply.status), **reply.headers})
            else:
                produce(reply)
        except OSError:
            reply.cut_off = True
            raise
        finally:
            reply.served.set()
            with self._lock:
                if reply in self._active:
                    self._active.remove(reply)

    def _stream(self, h: _Handler, reply: Reply, events: list[bytes], first: int, content_end: int | None = None,
                content_type: str = "text/event-stream; charset=utf-8", headers: dict | None = None,
                write_size: int | None = None):
        """Send ``events[:first]`` at once, wait for the gate if any, then the rest one
        event at a time (``chunk_delay`` apart). ``events[first:content_end]`` are the later
        content chunks: with ``step``, each waits for a permit first. ``headers`` replace the
        reply's; ``write_size`` splits every write into chunks of that many bytes."""
        def write(data: bytes):
            size = write_size or max(len(data), 1)
            for k in range(0, len(data), size):
                h.write_chunk(data[k:k + size])

        h.start_stream(200, reply.headers if headers is None else headers, content_type)
        write(b"".join(events[:first]))
        if reply.gate is not None:
            reply.gate_timed_out = not reply.gate.wait(reply.gate_timeout)
        for i, ev in enumerate(events[first:], first):
            if reply.chunk_delay:
                time.sleep(reply.chunk_delay)
            if reply.step is not None and content_end is not None and i < content_end:
                if not reply.step.acquire(timeout=reply.step_timeout):
                    reply.step_timed_out = True
                elif reply.step_timed_out is None:
                    reply.step_timed_out = False
            write(ev)
        h.end_stream()

    def error_body(self, status: int, message: str | None, type_: str | None) -> dict:  # pragma: no cover
        raise NotImplementedError

    def error_headers(self, status: int) -> dict[str, str]:
        """Headers of a generated error answer (a scripted ``Reply(status=...)`` without a body)."""
        return {}


# --------------------------------------------------------------------------- OpenAI


def _now() -> int:
    return int(time.time())


def _hex(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


class OpenAIMock(MockProvider):
    """Speaks OpenAI's REST wire format under ``/v1``. As OpenAI, it answers 401 to a request
    whose Bearer key is missing or not one of ``keys`` (the keys of its account; ``keys.add``
    issues another), and serves the assistants API only with ``OpenAI-Beta: assistants=v2``."""

    name = "openai"
    default_text = "Hello from the OpenAI mock."
    _status_types = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
                     404: "invalid_request_error", 429: "rate_limit_exceeded", 500: "server_error",
                     503: "server_error"}

    @staticmethod
    def error(status: int, message: str, type: str = "invalid_request_error", code: str | None = None,  # noqa: A002
              param: str | None = None, **reply_fields: Any) -> Reply:
        """A scripted OpenAI-shaped error reply."""
        body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        return Reply(status=status, body=body, **reply_fields)

    def error_body(self, status, message=None, type_=None, code=None, param=None):
        return {"error": {
            "message": message or f"Mock error with status {status}",
            "type": type_ or self._status_types.get(status, "api_error"),
            "param": param,
            "code": code,
        }}

    def _err(self, h, status, message, type_="invalid_request_error", code=None, param=None):
        h.send_json(status, self.error_body(status, message, type_, code, param))

    # routes: (method, regex) -> handler name
    _routes = [
        ("POST", r"/v1/chat/completions", "_chat"),
        ("POST", r"/v1/completions", "_completions"),
        ("POST", r"/v1/embeddings", "_embeddings"),
        ("POST", r"/v1/images/generations", "_images"),
        ("POST", r"/v1/audio/transcriptions", "_transcriptions"),
        ("GET", r"/v1/batches", "_batches_list"),
        ("POST", r"/v1/batches", "_batches_create"),
        ("GET", r"/v1/batches/(?P<id>[^/]+)", "_batch_get"),
        ("POST", r"/v1/batches/(?P<id>[^/]+)/cancel", "_batch_cancel"),
        ("GET", r"/v1/files", "_files_list"),
        ("POST", r"/v1/files", "_files_create"),
        ("GET", r"/v1/files/(?P<id>[^/]+)", "_file_get"),
        ("DELETE", r"/v1/files/(?P<id>[^/]+)", "_file_delete"),
        ("GET", r"/v1/files/(?P<id>[^/]+)/content", "_file_content"),
        ("GET", r"/v1/fine_tuning/jobs", "_ft_list"),
        ("POST", r"/v1/fine_tuning/jobs", "_ft_create"),
        ("GET", r"/v1/fine_tuning/jobs/(?P<id>[^/]+)", "_ft_get"),
        ("GET", r"/v1/fine_tuning/jobs/(?P<id>[^/]+)/events", "_ft_events"),
        ("POST", r"/v1/fine_tuning/jobs/(?P<id>[^/]+)/cancel", "_ft_cancel"),
        ("GET", r"/v1/fine_tuning/jobs/(?P<id>[^/]+)/checkpoints", "_ft_checkpoints"),
        ("GET", r"/v1/assistants", "_assistants_list"),
        ("POST", r"/v1/assistants", "_assistant_create"),
        ("GET", r"/v1/assistants/(?P<id>[^/]+)", "_assistant_get"),
        ("POST", r"/v1/assistants/(?P<id>[^/]+)", "_assistant_modify"),
        ("DELETE", r"/v1/assistants/(?P<id>[^/]+)", "_assistant_delete"),
        ("POST", r"/v1/threads", "_thread_create"),
        ("POST", r"/v1/threads/runs", "_thread_and_run"),
        ("GET", r"/v1/threads/(?P<id>[^/]+)", "_thread_get"),
        ("POST", r"/v1/threads/(?P<id>[^/]+)", "_thread_modify"),
        ("DELETE", r"/v1/threads/(?P<id>[^/]+)", "_thread_delete"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/messages", "_messages_list"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/messages", "_message_create"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/messages/(?P<id>[^/]+)", "_message_get"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/messages/(?P<id>[^/]+)", "_message_modify"),
        ("DELETE", r"/v1/threads/(?P<thread>[^/]+)/messages/(?P<id>[^/]+)", "_message_delete"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/runs", "_runs_list"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/runs", "_run_create"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<id>[^/]+)", "_run_get"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<id>[^/]+)", "_run_modify"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<id>[^/]+)/cancel", "_run_cancel"),
        ("POST", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<id>[^/]+)/submit_tool_outputs", "_run_tool_outputs"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<run>[^/]+)/steps", "_steps_list"),
        ("GET", r"/v1/threads/(?P<thread>[^/]+)/runs/(?P<run>[^/]+)/steps/(?P<id>[^/]+)", "_step_get"),
        ("POST", r"/v1/uploads", "_upload_create"),
        ("POST", r"/v1/uploads/(?P<id>[^/]+)/parts", "_upload_part"),
        ("POST", r"/v1/uploads/(?P<id>[^/]+)/complete", "_upload_complete"),
        ("POST", r"/v1/uploads/(?P<id>[^/]+)/cancel", "_upload_cancel"),
        ("POST", r"/v1/responses", "_responses_create"),
        ("GET", r"/v1/responses/(?P<id>[^/]+)", "_response_get"),
        ("DELETE", r"/v1/responses/(?P<id>[^/]+)", "_response_delete"),
        ("POST", r"/v1/responses/(?P<id>[^/]+)/cancel", "_response_cancel"),
        ("GET", r"/v1/responses/(?P<id>[^/]+)/input_items", "_response_input_items"),
        ("GET", r"/v1/models", "_models"),
    ]
    # POSTs that carry no JSON body (an action on an id) or a multipart one.
    _not_json = ("_transcriptions", "_files_create", "_batch_cancel", "_ft_cancel", "_run_cancel", "_upload_part",
                 "_upload_cancel", "_response_cancel")

    def handle(self, h, req):
        for method, pattern, fn in self._routes:
            m = re.fullmatch(pattern, req.path)
            if m and method == req.method:
                break
        else:
            return self._err(h, 404, f"Invalid URL ({req.method} {req.path})")
        auth = req.header("authorization") or ""
        key = auth[7:].strip() if auth.startswith("Bearer ") else ""
        if not key:
            return self._err(h, 401, "You didn't provide an API key. You need to provide your API key in an "
                                     "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), "
                                     "or as the password field (with blank username) if you're accessing the API "
                                     "from your browser and are prompted for a username and password. You can "
                                     "obtain an API key from https://platform.openai.com/account/api-keys.")
        if key not in self.keys:
            # OpenAI shows the start and the end of the key it refused.
            shown = f"{key[:3]}{'*' * max(len(key) - 7, 0)}{key[-4:]}" if len(key) > 7 else key
            return self._err(h, 401, f"Incorrect API key provided: {shown}. You can find your API key at "
                                     "https://platform.openai.com/account/api-keys.", code="invalid_api_key")
        if req.method == "POST" and fn not in self._not_json:
            if not isinstance(req.json, dict):
                return self._err(h, 400, "We could not parse the JSON body of your request. (HINT: This likely "
                                         "means you aren't using your HTTP library correctly.)")
        if req.path.startswith(("/v1/assistants", "/v1/threads")):
            if "assistants=v2" not in (req.header("openai-beta") or ""):
                return self._err(h, 400, "You must provide the 'OpenAI-Beta' header to access the Assistants API.")
        getattr(self, fn)(h, req, **m.groupdict())

    # ---- chat
    # OpenAI's own checks of what it is sent. A request OpenAI refuses gets its 400 here too, so a
    # gateway translation that sends OpenAI something it would refuse fails a test. ``strict``
    # (reset to True around every test) is the one opt-out: False plays an OpenAI-compatible host
    # that takes parameters of its own (vLLM's `top_k`, ...), for a test that sends them on purpose;
    # the rest is still checked.
    chat_fields = frozenset({
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options"})
    completion_fields = frozenset({
        "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"})
    embedding_fields = frozenset({"input", "model", "dimensions", "encoding_format", "user"})
    _chat_roles = ("system", "assistant", "user", "function", "tool", "developer")
    # Content part types each role may send.
    _chat_part_types = {"user": ("text", "image_url", "input_audio", "file"), "assistant": ("text", "refusal"),
                        "system": ("text",), "developer": ("text",), "tool": ("text",)}
    _reasoning_efforts = ("none", "minimal", "low", "medium", "high", "xhigh")

    @staticmethod
    def _unrecognized(body: dict, known: frozenset[str]) -> tuple[str, None, None] | None:
        for key in body:
            if key not in known:
                return f"Unrecognized request argument supplied: {key}", None, None
        return None

    @staticmethod
    def _invalid_type(at: str, expected: str, value: Any) -> tuple[str, str, str]:
        got = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(value), f"a {type(value).__name__}")
        return f"Invalid type for '{at}': expected {expected}, but got {got} instead.", at, "invalid_type"

    @classmethod
    def _chat_message_problem(cls, i: int, m: Any) -> tuple[str, str | None, str | None] | None:
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            return cls._invalid_type(at, "an object", m)
        role = m.get("role")
        if role not in cls._chat_roles:
            return cls._supported(role, f"{at}.role", cls._chat_roles)
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            return f"Missing required parameter: '{at}.tool_call_id'.", f"{at}.tool_call_id", \
                "missing_required_parameter"
        content = m.get("content")
        if content is None and role != "assistant":
            return f"Missing required parameter: '{at}.content'.", f"{at}.content", "missing_required_parameter"
        if content is not None and not isinstance(content, (str, list)):
            return cls._invalid_type(f"{at}.content", "one of a string or array of objects", content)
        for j, part in enumerate(content if isinstance(content, list) else []):
            kinds = cls._chat_part_types.get(role, ("text",))
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in kinds:
                return cls._supported(kind, f"{at}.content[{j}].type", kinds)
            if kind == "text" and not isinstance(part.get("text"), str):
                return f"Missing required parameter: '{at}.content[{j}].text'.", f"{at}.content[{j}].text", \
                    "missing_required_parameter"
            if kind == "image_url" and not isinstance((part.get("image_url") or {}).get("url"), str):
                return (f"Missing required parameter: '{at}.content[{j}].image_url.url'.",
                        f"{at}.content[{j}].image_url.url", "missing_required_parameter")
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            return f"Additional properties are not allowed ('tool_calls' was unexpected) - 'messages.{i}'", None, None
        if calls is not None and not isinstance(calls, list):
            return cls._invalid_type(f"{at}.tool_calls", "an array", calls)
        for j, call in enumerate(calls or []):
            call_at = f"{at}.tool_calls[{j}]"
            if not isinstance(call, dict):
                return cls._invalid_type(call_at, "an object", call)
            if not isinstance(call.get("id"), str):
                return f"Missing required parameter: '{call_at}.id'.", f"{call_at}.id", "missing_required_parameter"
            if call.get("type") not in ("function", "custom"):
                return cls._supported(call.get("type"), f"{call_at}.type", ("function", "custom"))
            if call["type"] == "function":
                fn = call.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    return (f"Missing required parameter: '{call_at}.function.name'.", f"{call_at}.function.name",
                            "missing_required_parameter")
                if not isinstance(fn.get("arguments"), str):
                    return cls._invalid_type(f"{call_at}.function.arguments", "a string", fn.get("arguments"))
        return None

    @staticmethod
    def tool_calls_problem(msgs: list[dict]) -> tuple[str, str | None, None] | None:
        """OpenAI's pairing of tool calls and tool messages: a `tool` message answers one of the
        calls of the assistant message just before it (only other tool messages between), and an
        assistant message's calls are each answered before the next message of another role."""
        calls: list[str] | None = None  # the ids of the assistant message being answered
        unanswered: list[str] = []
        asked_at = 0
        for i, m in enumerate(msgs):
            if m["role"] == "tool":
                if calls is None:
                    return ("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                            "message with 'tool_calls'.", f"messages.[{i}].role", None)
                if m["tool_call_id"] not in calls:
                    return (f"Invalid parameter: 'tool_call_id' of '{m['tool_call_id']}' not found in 'tool_calls' "
                            "of previous message.", f"messages.[{i}].tool_call_id", None)
                if m["tool_call_id"] in unanswered:
                    unanswered.remove(m["tool_call_id"])
                continue
            if unanswered:
                break
            calls = None
            if m["role"] == "assistant" and m.get("tool_calls"):
                calls = [c["id"] for c in m["tool_calls"]]
                unanswered = list(calls)
                asked_at = i
        if unanswered:
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                    "'tool_call_id'. The following tool_call_ids did not have response messages: "
                    + ", ".join(unanswered), f"messages.[{asked_at}].role", None)
        return None

    @classmethod
    def _chat_tool_problem(cls, i: int, tool: Any) -> tuple[str, str | None, str | None] | None:
        at = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", "custom"):
            return cls._supported(kind, f"{at}.type", ("function", "custom"))
        spec = tool.get(kind)
        if not isinstance(spec, dict):
            # a Responses tool ({"type": "function", "name": ...}) is refused here
            return f"Missing required parameter: '{at}.{kind}'.", f"{at}.{kind}", "missing_required_parameter"
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            return f"Missing required parameter: '{at}.{kind}.name'.", f"{at}.{kind}.name", \
                "missing_required_parameter"
        return None

    @classmethod
    def _sampling_problem(cls, body: dict) -> tuple[str, str, str] | None:
        temp = body.get("temperature")
        if temp is not None and (not isinstance(temp, (int, float)) or not 0 <= temp <= 2):
            return (f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got {temp} "
                    "instead.", "temperature", "decimal_above_max_value")
        top_p = body.get("top_p")
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 <= top_p <= 1):
            return (f"Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got {top_p} "
                    "instead.", "top_p", "decimal_above_max_value")
        return None

    @classmethod
    def chat_problem(cls, body: dict, strict: bool = True) -> tuple[str, str | None, str | None] | None:
        """OpenAI's 400 for a chat completions request (message, param, code), else None;
        ``strict=False`` lets parameters OpenAI does not know through."""
        problem = cls._unrecognized(body, cls.chat_fields) if strict else None
        if problem:
            return problem
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "you must provide a model parameter", None, None
        msgs = body.get("messages")
        if msgs is None:
            return "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        if not isinstance(msgs, list):
            return cls._invalid_type("messages", "an array", msgs)
        if not msgs:
            return ("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
                    "array instead.", "messages", "empty_array")
        for i, m in enumerate(msgs):
            problem = cls._chat_message_problem(i, m)
            if problem:
                return problem
        problem = cls.tool_calls_problem(msgs)
        if problem:
            return problem
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return cls._invalid_type("tools", "an array", tools)
        for i, tool in enumerate(tools or []):
            problem = cls._chat_tool_problem(i, tool)
            if problem:
                return problem
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice not in ("none", "auto", "required"):
            return cls._supported(choice, "tool_choice", ("none", "auto", "required"))
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            kind = choice["type"]
            if not isinstance((choice.get(kind) or {}).get("name"), str):
                # a Responses tool_choice ({"type": "function", "name": ...}) is refused here
                return (f"Missing required parameter: 'tool_choice.{kind}'.", f"tool_choice.{kind}",
                        "missing_required_parameter")
        if body.get("stream_options") is not None and not body.get("stream"):
            return "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options", None
        fmt = body.get("response_format")
        if fmt is not None:
            kind = fmt.get("type") if isinstance(fmt, dict) else None
            if kind not in ("text", "json_object", "json_schema"):
                return cls._supported(kind, "response_format.type", ("text", "json_object", "json_schema"))
            if kind == "json_schema" and not isinstance((fmt.get("json_schema") or {}).get("name"), str):
                return ("Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema",
                        "missing_required_parameter")
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in cls._reasoning_efforts:
            return cls._supported(effort, "reasoning_effort", cls._reasoning_efforts)
        return cls._sampling_problem(body)

    def _chat(self, h, req):
        body = req.json
        problem = self.chat_problem(body, self.strict)
        if problem:
            return self._err(h, 400, problem[0], param=problem[1], code=problem[2])
        model = body["model"]
        n = body.get("n") or 1

        def produce(reply: Reply):
            cid = f"chatcmpl-mock{_hex()}"
            created = _now()
            text = reply.resolved_text(self.default_text)
            finish = reply.stop_reason or ("tool_calls" if reply.tool_calls else "stop")
            calls = [
                {"id": tc.id or f"call_mock{_hex(16)}", "type": "function",
                 "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)}}
                for tc in reply.tool_calls
            ]
            p, c = reply.usage
            if not body.get("stream"):
                message = {"role": "assistant", "content": text or None, "refusal": None,
                           "annotations": []}
                if calls:
                    message["tool_calls"] = calls
                return h.send_json(200, {
                    "id": cid, "object": "chat.completion", "created": created, "model": model,
                    "system_fingerprint": "fp_mock",
                    "choices": [{"index": i, "message": message, "logprobs": None, "finish_reason": finish}
                                for i in range(n)],
                    "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
                    "service_tier": "default",
                }, reply.headers)

            def chunk(delta, finish_reason=None, **extra):
                return _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                             "system_fingerprint": "fp_mock",
                             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": finish_reason}], **extra})

            events = [chunk({"role": "assistant", "content": "", "refusal": None})]
            events += [chunk({"content": piece}) for piece in reply.pieces(self.default_text)]
            content_end = len(events)
            for i, (tc, call) in enumerate(zip(reply.tool_calls, calls)):
                events.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                      "function": {"name": tc.name, "arguments": ""}}]}))
                for piece in _split(call["function"]["arguments"], 3):
                    events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
            events.append(chunk({}, finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append(_sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                                    "model": model, "system_fingerprint": "fp_mock", "choices": [],
                                    "usage": {"prompt_tokens": p, "completion_tokens": c,
                                              "total_tokens": p + c}}))
            events.append(b"data: [DONE]\n\n")
            self._stream(h, reply, events, first=2, content_end=content_end)

        self._serve(h, req, produce)

    def _completions(self, h, req):
        body = req.json
        problem = (self._unrecognized(body, self.completion_fields) if self.strict else None) or \
            self._sampling_problem(body)
        if problem:
            return self._err(h, 400, problem[0], param=problem[1], code=problem[2])
        if not isinstance(body.get("model"), str):
            return self._err(h, 400, "you must provide a model parameter", param="model")
        if "prompt" not in body:
            return self._err(h, 400, "you must provide a prompt parameter", param="prompt")
        model = body["model"]

        def produce(reply: Reply):
            cid = f"cmpl-mock{_hex()}"
            created = _now()
            p, c = reply.usage
            finish = reply.stop_reason or "stop"
            if not body.get("stream"):
                return h.send_json(200, {
                    "id": cid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": "fp_mock",
                    "choices": [{"text": reply.resolved_text(self.default_text), "index": 0, "logprobs": None,
                                 "finish_reason": finish}],
                    "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
                }, reply.headers)

            def chunk(text, fr=None):
                return _sse({"id": cid, "object": "text_completion", "created": created, "model": model,
                             "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": fr}]})

            events = [chunk(piece) for piece in reply.pieces(self.default_text)]
            events += [chunk("", finish), b"data: [DONE]\n\n"]
            self._stream(h, reply, events, first=1)

        self._serve(h, req, produce)

    # ---- embeddings, images, audio
    @staticmethod
    def _vector(text: str, dims: int = 8) -> list[float]:
        digest = hashlib.sha256(text.encode()).digest()
        return [round((b - 128) / 128.0, 4) for b in digest[:dims]]

    def __init__(self, keys: Iterable[str], ssl_context: ssl.SSLContext | None = None):
        super().__init__(ssl_context)
        self.keys = set(keys)
        self.strict = True
        self._embed_rules: list[tuple[str, list[float]]] = []
        self._files: dict[str, bytes] = {}
        self._file_objects: dict[str, dict] = {}
        # upload id -> (the upload object, part id -> bytes)
        self._uploads: dict[str, tuple[dict, dict[str, bytes]]] = {}
        # response id -> {"response", "input_items", "queued" (a background response not yet asked for)}
        self._responses: dict[str, dict] = {}

    def reset(self):
        super().reset()
        self.strict = True
        with self._lock:
            self._embed_rules.clear()
            self._files.clear()
            self._file_objects.clear()
            self._uploads.clear()
            self._responses.clear()

    def put_file(self, file_id: str, content: bytes | str) -> None:
        """Serve ``content`` at ``GET /v1/files/{file_id}/content`` (until the next reset);
        other ids answer 404 as OpenAI does."""
        with self._lock:
            self._files[file_id] = content.encode() if isinstance(content, str) else content

    def _file_content(self, h, req, id):  # noqa: A002
        with self._lock:
            content = self._files.get(id)
        if content is None:
            return self._err(h, 404, f"No such File object: {id}", param="id", code="not_found")
        self._serve(h, req, lambda reply: h.send_bytes(200, content, "application/octet-stream", reply.headers))

    def embed_as(self, substring: str, vector: list[float]) -> None:
        """Answer embeddings of any input whose text contains ``substring`` with ``vector``
        (the first registered rule that matches wins), so a test decides how similar two
        inputs are (the semantic cache compares them by cosine similarity)."""
        with self._lock:
            self._embed_rules.append((substring, [float(x) for x in vector]))

    def _embedding_of(self, item: Any, dims: int) -> list[float]:
        """The pinned vector of the first rule matching ``item``'s text, else a hash of it."""
        text = item if isinstance(item, str) else json.dumps(item)
        with self._lock:
            for substring, vector in self._embed_rules:
                if substring in text:
                    return list(vector)
        return self._vector(json.dumps(item), dims)

    def _embeddings(self, h, req):
        body = req.json
        problem = self._unrecognized(body, self.embedding_fields) if self.strict else None
        if problem:
            return self._err(h, 400, problem[0], param=problem[1], code=problem[2])
        inp = body.get("input")
        if inp is None or inp == "" or inp == []:
            return self._err(h, 400, "'input' is a required property", param="input")
        if not isinstance(body.get("model"), str):
            return self._err(h, 400, "you must provide a model parameter", param="model")
        items = inp if isinstance(inp, list) and not all(isinstance(x, int) for x in inp) else [inp]
        b64 = body.get("encoding_format") == "base64"
        dims = body.get("dimensions") or 8

        def produce(reply: Reply):
            data = []
            for i, item in enumerate(items):
                vec = self._embedding_of(item, dims)
                emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
                data.append({"object": "embedding", "index": i, "embedding": emb})
            tokens = sum(len(str(x).split()) for x in items)
            h.send_json(200, {"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, reply.headers)

        self._serve(h, req, produce)

    _PNG_1PX = base64.b64encode(bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()

    def _images(self, h, req):
        body = req.json
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            return self._err(h, 400, "'prompt' is a required property", param="prompt")

        def produce(reply: Reply):
            n = body.get("n") or 1
            if body.get("response_format") == "b64_json":
                item = {"b64_json": self._PNG_1PX, "revised_prompt": body["prompt"]}
            else:
                item = {"url": f"https://images.mock.invalid/{_hex()}.png", "revised_prompt": body["prompt"]}
            h.send_json(200, {"created": _now(), "data": [dict(item) for _ in range(n)]}, reply.headers)

        self._serve(h, req, produce)

    def _transcriptions(self, h, req):
        form = req.form
        if not form or "file" not in form:
            return self._err(h, 400, "Could not parse multipart form", param="file")
        if "model" not in form:
            return self._err(h, 400, "you must provide a model parameter", param="model")
        n = len(form["file"]["data"])

        def produce(reply: Reply):
            text = reply.text if reply.text is not None else f"received {n} bytes"
            h.send_json(200, {"text": text, "bytes_received": n, "filename": form["file"]["filename"],
                              "usage": {"type": "duration", "seconds": 1}}, reply.headers)

        self._serve(h, req, produce)

    # ---- batches
    @staticmethod
    def batch(batch_id: str, status: str = "in_progress", **overrides: Any) -> dict:
        now = _now()
        b = {
            "id": batch_id, "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
            "input_file_id": "file-mock-input", "completion_window": "24h", "status": status,
            "output_file_id": None, "error_file_id": None, "created_at": now - 100,
            "in_progress_at": now - 90, "expires_at": now + 86400, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 10, "completed": 3, "failed": 0},
            "metadata": {"team": "e2e"},
        }
        b.update(overrides)
        return b

    BATCH_IDS = ["batch_mock_1", "batch_mock_2", "batch_mock_3"]

    @staticmethod
    def _page(items: list[dict], req: RecordedRequest, default_limit: int = 20) -> dict:
        try:
            limit = int(req.qs("limit") or default_limit)
        except ValueError:
            limit = default_limit
        after = req.qs("after")
        if after:
            ids = [x["id"] for x in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

    def _batches_list(self, h, req):
        self._serve(h, req, lambda reply: h.send_json(
            200, self._page([self.batch(i) for i in self.BATCH_IDS], req), reply.headers))

    def _batches_create(self, h, req):
        body = req.json
        for f in ("input_file_id", "endpoint", "completion_window"):
            if f not in body:
                return self._err(h, 400, f"Missing required parameter: '{f}'.", param=f)
        self._serve(h, req, lambda reply: h.send_json(200, self.batch(
            f"batch_mock{_hex()}", "validating", input_file_id=body["input_file_id"], endpoint=body["endpoint"],
            completion_window=body["completion_window"], metadata=body.get("metadata"), in_progress_at=None),
            reply.headers))

    def _batch_get(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.batch(id), reply.headers))

    def _batch_cancel(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(
            200, self.batch(id, "cancelling", cancelling_at=_now()), reply.headers))

    # ---- files: a multipart upload (`file`, `purpose`) is kept (until the next reset), so it
    # can be listed by id, downloaded and deleted; unknown ids answer 404 as OpenAI does
    @staticmethod
    def file_object(file_id: str, size: int, filename: str, purpose: str) -> dict:
        return {"id": file_id, "object": "file", "bytes": size, "created_at": _now(), "filename": filename,
                "purpose": purpose, "status": "processed", "status_details": None}

    def _files_create(self, h, req):
        part = (req.form or {}).get("file")
        if part is None or "purpose" not in (req.form or {}):
            return self._err(h, 400, "Missing required parameter: 'file' or 'purpose'.")
        purpose = req.form["purpose"]["data"].decode()
        obj = self.file_object(f"file-mock{_hex()}", len(part["data"]), part["filename"] or "upload", purpose)
        with self._lock:
            self._files[obj["id"]] = part["data"]
            self._file_objects[obj["id"]] = obj
        self._serve(h, req, lambda reply: h.send_json(200, obj, reply.headers))

    def _files_list(self, h, req):
        items = [self.file_object(f"file-mock-{i}", 10 * i, f"f{i}.jsonl", "batch") for i in (1, 2)]
        items = [f for f in items if req.qs("purpose") in (None, f["purpose"])]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _known_file(self, h, id) -> dict | None:  # noqa: A002
        """The file object of an uploaded or ``put_file`` file, else a 404 sent (None)."""
        with self._lock:
            obj = self._file_objects.get(id)
            content = self._files.get(id)
        if obj is None and content is not None:
            obj = self.file_object(id, len(content), f"{id}.jsonl", "batch")
        if obj is None:
            self._err(h, 404, f"No such File object: {id}", param="id", code="not_found")
        return obj

    def _file_get(self, h, req, id):  # noqa: A002
        obj = self._known_file(h, id)
        if obj is not None:
            self._serve(h, req, lambda reply: h.send_json(200, obj, reply.headers))

    def _file_delete(self, h, req, id):  # noqa: A002
        if self._known_file(h, id) is not None:
            with self._lock:
                self._files.pop(id, None)
                self._file_objects.pop(id, None)
            self._serve(h, req, lambda reply: h.send_json(200, self.deleted(id, "file"), reply.headers))

    @staticmethod
    def deleted(object_id: str, object_type: str) -> dict:
        """OpenAI's answer to a delete: files say `file`, the others `<type>.deleted`."""
        return {"id": object_id, "object": object_type, "deleted": True}

    # ---- fine-tuning
    @staticmethod
    def ft_job(job_id: str, status: str = "queued", **overrides: Any) -> dict:
        job = {
            "id": job_id, "object": "fine_tuning.job", "created_at": 1_700_000_000, "error": None,
            "fine_tuned_model": None, "finished_at": None, "hyperparameters": {"n_epochs": "auto"},
            "model": "gpt-mock", "organization_id": "org-mock", "result_files": [], "status": status,
            "trained_tokens": None, "training_file": "file-mock-train", "validation_file": None, "seed": 42,
            "integrations": None, "estimated_finish": None,
        }
        job.update(overrides)
        return job

    def _ft_create(self, h, req):
        body = req.json
        job = self.ft_job(f"ftjob-mock{_hex()}", model=body.get("model"), training_file=body.get("training_file"),
                          integrations=body.get("integrations"))
        self._serve(h, req, lambda reply: h.send_json(200, job, reply.headers))

    def _ft_list(self, h, req):
        items = [self.ft_job(f"ftjob-mock-{i}") for i in (1, 2, 3)]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _ft_get(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.ft_job(id, "running"), reply.headers))

    def _ft_events(self, h, req, id):  # noqa: A002
        items = [{"id": f"ftevent-{i}", "object": "fine_tuning.job.event", "created_at": 1_700_000_000 + i,
                  "level": "info", "message": f"step {i}", "data": {}, "type": "message"} for i in (1, 2)]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _ft_cancel(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.ft_job(id, "cancelled"), reply.headers))

    def _ft_checkpoints(self, h, req, id):  # noqa: A002
        items = [{
            "id": f"ftckpt_mock_{s}", "object": "fine_tuning.job.checkpoint", "created_at": 1_700_000_000 + s,
            "fine_tuned_model_checkpoint": f"ft:gpt-mock:org-mock::ckpt-step-{s}", "step_number": s,
            "fine_tuning_job_id": id,
            "metrics": {"step": s, "train_loss": 0.5, "train_mean_token_accuracy": 0.8, "valid_loss": 0.6,
                        "valid_mean_token_accuracy": 0.75, "full_valid_loss": 0.6,
                        "full_valid_mean_token_accuracy": 0.75},
        } for s in (300, 200, 100)]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req, 10), reply.headers))

    # ---- assistants, threads, messages, runs: any id exists; a create or modify answers
    # with the fields it was given
    @staticmethod
    def assistant(asst_id: str, created_at: int) -> dict:
        return {
            "id": asst_id, "object": "assistant", "created_at": created_at, "name": f"Mock {asst_id}",
            "description": None, "model": "gpt-mock", "instructions": "You are a test double.",
            "tools": [{"type": "code_interpreter"}], "metadata": {},
            "tool_resources": {"code_interpreter": {"file_ids": []}}, "temperature": 1.0, "top_p": 1.0,
            "response_format": "auto",
        }

    _ASSISTANT_FIELDS = ("name", "description", "model", "instructions", "tools", "metadata")

    def _assistants_list(self, h, req):
        items = [self.assistant(f"asst_mock_{i}", 1_700_000_000 + i) for i in (1, 2)]
        if (req.qs("order") or "desc") == "desc":
            items.reverse()
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _assistant_create(self, h, req):
        asst = {**self.assistant(f"asst_mock{_hex()}", _now()), **{k: v for k, v in req.json.items()
                                                                     if k in ("name", "model", "metadata")}}
        self._serve(h, req, lambda reply: h.send_json(200, asst, reply.headers))

    def _assistant_get(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.assistant(id, 1_700_000_001), reply.headers))

    def _assistant_modify(self, h, req, id):  # noqa: A002
        asst = {**self.assistant(id, 1_700_000_001),
                **{k: v for k, v in req.json.items() if k in self._ASSISTANT_FIELDS}}
        self._serve(h, req, lambda reply: h.send_json(200, asst, reply.headers))

    def _assistant_delete(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.deleted(id, "assistant.deleted"), reply.headers))

    @staticmethod
    def thread(thread_id: str, metadata: dict | None = None) -> dict:
        return {"id": thread_id, "object": "thread", "created_at": 1_700_000_000, "metadata": metadata or {},
                "tool_resources": {"code_interpreter": {"file_ids": []}}}

    def _thread_create(self, h, req):
        thread = self.thread(f"thread_mock{_hex()}", req.json.get("metadata"))
        self._serve(h, req, lambda reply: h.send_json(200, thread, reply.headers))

    def _thread_get(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.thread(id), reply.headers))

    def _thread_modify(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.thread(id, req.json.get("metadata")), reply.headers))

    def _thread_delete(self, h, req, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.deleted(id, "thread.deleted"), reply.headers))

    @staticmethod
    def message(thread_id: str, msg_id: str, text: str = "Hello from the thread.", role: str = "assistant",
                metadata: dict | None = None) -> dict:
        return {
            "id": msg_id, "object": "thread.message", "created_at": 1_700_000_000, "thread_id": thread_id,
            "status": "completed", "incomplete_details": None, "completed_at": 1_700_000_001,
            "incomplete_at": None, "role": role,
            "content": [{"type": "text", "text": {"value": text, "annotations": []}}],
            "assistant_id": "asst_mock_1" if role == "assistant" else None,
            "run_id": "run_mock_1" if role == "assistant" else None, "attachments": [], "metadata": metadata or {},
        }

    def _messages_list(self, h, req, thread):
        items = [self.message(thread, f"msg_mock_{i}", f"message {i}") for i in (1, 2, 3)]
        if (req.qs("order") or "desc") == "desc":
            items.reverse()
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _message_create(self, h, req, thread):
        body = req.json
        if body.get("role") not in ("user", "assistant") or "content" not in body:
            return self._err(h, 400, "Missing required parameter: 'role' or 'content'.", param="role")
        content = body["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        msg = self.message(thread, f"msg_mock{_hex()}", text, body["role"], body.get("metadata"))
        self._serve(h, req, lambda reply: h.send_json(200, msg, reply.headers))

    def _message_get(self, h, req, thread, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.message(thread, id), reply.headers))

    def _message_modify(self, h, req, thread, id):  # noqa: A002
        msg = self.message(thread, id, metadata=req.json.get("metadata"))
        self._serve(h, req, lambda reply: h.send_json(200, msg, reply.headers))

    def _message_delete(self, h, req, thread, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.deleted(id, "thread.message.deleted"),
                                                      reply.headers))

    @staticmethod
    def run(thread_id: str, run_id: str, status: str = "queued", **overrides: Any) -> dict:
        r = {
            "id": run_id, "object": "thread.run", "created_at": 1_700_000_000, "thread_id": thread_id,
            "assistant_id": "asst_mock_1", "status": status, "required_action": None, "last_error": None,
            "expires_at": 1_700_000_600, "started_at": None, "cancelled_at": None, "failed_at": None,
            "completed_at": None, "incomplete_details": None, "model": "gpt-mock",
            "instructions": "You are a test double.", "tools": [], "metadata": {}, "usage": None,
            "temperature": 1.0, "top_p": 1.0, "max_prompt_tokens": None, "max_completion_tokens": None,
            "truncation_strategy": {"type": "auto", "last_messages": None}, "response_format": "auto",
            "tool_choice": "auto", "parallel_tool_calls": True,
        }
        r.update(overrides)
        return r

    def _runs_list(self, h, req, thread):
        items = [self.run(thread, f"run_mock_{i}", "completed") for i in (1, 2)]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _run_create(self, h, req, thread):
        body = req.json
        if not isinstance(body.get("assistant_id"), str):
            return self._err(h, 400, "Missing required parameter: 'assistant_id'.", param="assistant_id")
        given = {k: v for k, v in body.items() if k in ("assistant_id", "model", "instructions", "metadata")}
        run = self.run(thread, f"run_mock{_hex()}", **given)
        if body.get("stream"):
            return self._serve(h, req, lambda reply: self._run_events(h, reply, run))
        self._serve(h, req, lambda reply: h.send_json(200, run, reply.headers))

    def _run_events(self, h, reply: Reply, run: dict):
        """A streamed run as OpenAI sends it: named SSE events, the message's text in
        `thread.message.delta` pieces (the gate waits after `thread.run.created`), `done`."""
        text = reply.resolved_text(self.default_text)
        msg = self.message(run["thread_id"], f"msg_mock{_hex()}", text)
        events = [_sse(run, "thread.run.created"), _sse({**run, "status": "in_progress"}, "thread.run.in_progress")]
        events += [_sse({"id": msg["id"], "object": "thread.message.delta",
                         "delta": {"content": [{"index": 0, "type": "text", "text": {"value": piece}}]}},
                        "thread.message.delta") for piece in reply.pieces(self.default_text)]
        events += [_sse(msg, "thread.message.completed"), _sse({**run, "status": "completed"}, "thread.run.completed"),
                   _sse("[DONE]", "done")]
        self._stream(h, reply, events, first=1)

    def _run_get(self, h, req, thread, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.run(thread, id, "in_progress"), reply.headers))

    def _run_modify(self, h, req, thread, id):  # noqa: A002
        run = self.run(thread, id, "in_progress", metadata=req.json.get("metadata") or {})
        self._serve(h, req, lambda reply: h.send_json(200, run, reply.headers))

    def _run_cancel(self, h, req, thread, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.run(thread, id, "cancelling"), reply.headers))

    def _run_tool_outputs(self, h, req, thread, id):  # noqa: A002
        outputs = req.json.get("tool_outputs")
        if not isinstance(outputs, list) or not outputs:
            return self._err(h, 400, "Missing required parameter: 'tool_outputs'.", param="tool_outputs")
        self._serve(h, req, lambda reply: h.send_json(200, self.run(thread, id, "queued"), reply.headers))

    def _thread_and_run(self, h, req):
        if not isinstance(req.json.get("assistant_id"), str):
            return self._err(h, 400, "Missing required parameter: 'assistant_id'.", param="assistant_id")
        run = self.run(f"thread_mock{_hex()}", f"run_mock{_hex()}", assistant_id=req.json["assistant_id"])
        self._serve(h, req, lambda reply: h.send_json(200, run, reply.headers))

    @staticmethod
    def run_step(thread_id: str, run_id: str, step_id: str) -> dict:
        return {
            "id": step_id, "object": "thread.run.step", "created_at": 1_700_000_000, "assistant_id": "asst_mock_1",
            "thread_id": thread_id, "run_id": run_id, "type": "message_creation", "status": "completed",
            "step_details": {"type": "message_creation", "message_creation": {"message_id": "msg_mock_1"}},
            "last_error": None, "expired_at": None, "cancelled_at": None, "failed_at": None,
            "completed_at": 1_700_000_001, "metadata": {}, "usage": None,
        }

    def _steps_list(self, h, req, thread, run):
        items = [self.run_step(thread, run, f"step_mock_{i}") for i in (1, 2)]
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    def _step_get(self, h, req, thread, run, id):  # noqa: A002
        self._serve(h, req, lambda reply: h.send_json(200, self.run_step(thread, run, id), reply.headers))

    # ---- uploads (a file in parts): the parts' bytes are kept, and completing makes the file
    def _upload_create(self, h, req):
        body = req.json
        missing = [k for k in ("filename", "purpose", "bytes", "mime_type") if k not in body]
        if missing:
            return self._err(h, 400, f"Missing required parameter: '{missing[0]}'.", param=missing[0])
        upload = {"id": f"upload_mock{_hex()}", "object": "upload", "bytes": body["bytes"], "created_at": _now(),
                  "filename": body["filename"], "purpose": body["purpose"], "status": "pending",
                  "expires_at": _now() + 3600, "file": None}
        with self._lock:
            self._uploads[upload["id"]] = (upload, {})
        self._serve(h, req, lambda reply: h.send_json(200, upload, reply.headers))

    def _upload_part(self, h, req, id):  # noqa: A002
        data = (req.form or {}).get("data")
        with self._lock:
            known = self._uploads.get(id)
        if known is None or data is None:
            return self._err(h, 404 if known is None else 400, f"No upload {id} or no 'data' part.")
        part = {"id": f"part_mock{_hex()}", "object": "upload.part", "created_at": _now(), "upload_id": id}
        with self._lock:
            known[1][part["id"]] = data["data"]
        self._serve(h, req, lambda reply: h.send_json(200, part, reply.headers))

    def _upload_complete(self, h, req, id):  # noqa: A002
        with self._lock:
            known = self._uploads.get(id)
        part_ids = req.json.get("part_ids")
        if known is None or not isinstance(part_ids, list) or any(p not in known[1] for p in part_ids):
            return self._err(h, 400, "Unknown upload or part ids.", param="part_ids")
        upload, parts = known
        data = b"".join(parts[p] for p in part_ids)
        file = self.file_object(f"file-mock{_hex()}", len(data), upload["filename"], upload["purpose"])
        with self._lock:
            self._files[file["id"]] = data
            self._file_objects[file["id"]] = file
        done = {**upload, "status": "completed", "file": file}
        self._serve(h, req, lambda reply: h.send_json(200, done, reply.headers))

    def _upload_cancel(self, h, req, id):  # noqa: A002
        with self._lock:
            known = self._uploads.pop(id, None)
        if known is None:
            return self._err(h, 404, f"No upload {id}.")
        self._serve(h, req, lambda reply: h.send_json(200, {**known[0], "status": "cancelled"}, reply.headers))

    # ---- responses (the Responses API). A response is kept (unless `store: false`) with its
    # input until the next reset: `previous_response_id`, GET, DELETE, cancel and input_items
    # find it; each answer is generated from the scripted `Reply` like chat's
    _response_fields = frozenset({
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
        "max_tool_calls", "temperature", "top_p", "top_logprobs", "stream", "stream_options", "store",
        "previous_response_id", "conversation", "metadata", "text", "reasoning", "include", "truncation", "user",
        "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier", "background", "prompt",
        "client_metadata", "context_management"})
    # Item types of `input`: the ones checked field by field, then the hosted tools' and others' items
    _input_item_fields = {
        "message": ({"role", "content"}, {"type", "id", "status", "phase"}),
        "function_call": ({"call_id", "name", "arguments"}, {"type", "id", "status", "namespace"}),
        "function_call_output": ({"call_id", "output"}, {"type", "id", "status"}),
        "reasoning": ({"summary"}, {"type", "id", "content", "encrypted_content", "status"}),
        "custom_tool_call": ({"call_id", "name", "input"}, {"type", "id", "status", "namespace"}),
        "custom_tool_call_output": ({"call_id", "output"}, {"type", "id", "status"}),
    }
    _other_item_types = frozenset({
        "item_reference", "web_search_call", "file_search_call", "computer_call", "computer_call_output",
        "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
        "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
        "mcp_approval_request", "mcp_approval_response", "mcp_call", "compaction", "tool_search_call",
        "tool_search_output"})
    _input_part_types = ("input_text", "input_image", "input_file")
    _output_part_types = ("output_text", "refusal")
    _response_tool_types = (
        "function", "custom", "namespace", "web_search", "web_search_2025_08_26", "web_search_preview",
        "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation", "mcp",
        "local_shell", "shell", "apply_patch", "computer_use_preview", "tool_search")
    _response_includes = (
        "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
        "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
        "web_search_call.action.sources", "web_search_call.results")

    @staticmethod
    def _supported(value: Any, name: str, allowed: Iterable[str]) -> tuple[str, str, str]:
        listed = ", ".join(f"'{v}'" for v in allowed)
        return f"Invalid value: {json.dumps(value)}. Supported values are: {listed}.", name, "invalid_value"

    @staticmethod
    def seal_reasoning(summary: str) -> str:
        """A reasoning item's `encrypted_content`: OpenAI's is opaque and checked when sent back;
        the mock's carries the summary it was made for under a keyed hash."""
        payload = base64.urlsafe_b64encode(summary.encode()).decode()
        return f"gAAAAB{payload}.{hashlib.sha256(b'openai-mock-reasoning-key' + summary.encode()).hexdigest()[:32]}"

    @classmethod
    def reasoning_sealed(cls, sealed: str) -> bool:
        head, _, mac = sealed.partition(".")
        try:
            summary = base64.urlsafe_b64decode(head.removeprefix("gAAAAB").encode()).decode()
        except (ValueError, UnicodeDecodeError):
            return False
        return cls.seal_reasoning(summary) == sealed

    @classmethod
    def _item_problem(cls, i: int, item: Any) -> tuple[str, str, str | None] | None:
        at = f"input[{i}]"
        if not isinstance(item, dict):
            return f"Invalid type for '{at}': expected an input item, but got {type(item).__name__} instead.", at, \
                "invalid_type"
        kind = item.get("type", "message" if "role" in item else None)
        if kind in cls._other_item_types:
            return None
        if kind not in cls._input_item_fields:
            return cls._supported(kind, f"{at}.type", [*cls._input_item_fields, *sorted(cls._other_item_types)])
        required, optional = cls._input_item_fields[kind]
        for key in item:
            if key not in required | optional:
                return f"Unknown parameter: '{at}.{key}'.", f"{at}.{key}", "unknown_parameter"
        for key in sorted(required - set(item)):
            return f"Missing required parameter: '{at}.{key}'.", f"{at}.{key}", "missing_required_parameter"
        if kind == "message":
            roles = ("assistant", "system", "developer", "user")
            if item["role"] not in roles:
                return cls._supported(item["role"], f"{at}.role", roles)
            content = item["content"]
            if isinstance(content, str):
                return None
            if not isinstance(content, list):
                return (f"Invalid type for '{at}.content': expected one of a string or array of input items, but "
                        f"got {type(content).__name__} instead.", f"{at}.content", "invalid_type")
            parts = cls._output_part_types if item["role"] == "assistant" else cls._input_part_types
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in parts:
                    return cls._supported(kind, f"{at}.content[{j}].type", parts)
                if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
                    return (f"Missing required parameter: '{at}.content[{j}].text'.", f"{at}.content[{j}].text",
                            "missing_required_parameter")
        elif kind in ("function_call", "custom_tool_call"):
            field_ = "arguments" if kind == "function_call" else "input"
            for key in ("call_id", "name", field_):
                if not isinstance(item[key], str):
                    return (f"Invalid type for '{at}.{key}': expected a string, but got "
                            f"{type(item[key]).__name__} instead.", f"{at}.{key}", "invalid_type")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item["output"], (str, list)):
                return (f"Invalid type for '{at}.output': expected one of a string or array of input items, but "
                        f"got {type(item['output']).__name__} instead.", f"{at}.output", "invalid_type")
        elif kind == "reasoning":
            if not isinstance(item["summary"], list):
                return (f"Invalid type for '{at}.summary': expected an array of summary parts, but got "
                        f"{type(item['summary']).__name__} instead.", f"{at}.summary", "invalid_type")
            sealed = item.get("encrypted_content")
            if sealed is not None and not (isinstance(sealed, str) and cls.reasoning_sealed(sealed)):
                return (f"The encrypted content for item {item.get('id')} could not be verified.", None,
                        "invalid_encrypted_content")
        return None

    @classmethod
    def _tool_problem(cls, at: str, tool: Any) -> tuple[str, str, str | None] | None:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in cls._response_tool_types:
            return cls._supported(kind, f"{at}.type", cls._response_tool_types)
        if kind in ("function", "custom", "namespace") and not isinstance(tool.get("name"), str):
            # a chat completions tool ({"type": "function", "function": {...}}) is refused here
            return f"Missing required parameter: '{at}.name'.", f"{at}.name", "missing_required_parameter"
        if kind == "namespace":
            if not isinstance(tool.get("tools"), list):
                return f"Missing required parameter: '{at}.tools'.", f"{at}.tools", "missing_required_parameter"
            for k, inner in enumerate(tool["tools"]):
                problem = cls._tool_problem(f"{at}.tools[{k}]", inner)
                if problem:
                    return problem
        return None

    @classmethod
    def response_problem(cls, body: dict) -> tuple[str, str | None, str | None] | None:
        """OpenAI's 400 for a Responses request (message, param, code), else None."""
        for key in body:
            if key not in cls._response_fields:
                return f"Unknown parameter: '{key}'.", key, "unknown_parameter"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        inp = body.get("input")
        if inp is not None and not isinstance(inp, (str, list)):
            return ("Invalid type for 'input': expected one of a string or array of input items, but got "
                    f"{type(inp).__name__} instead.", "input", "invalid_type")
        for i, item in enumerate(inp if isinstance(inp, list) else []):
            problem = cls._item_problem(i, item)
            if problem:
                return problem
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return "Invalid type for 'tools': expected an array, but got an object instead.", "tools", "invalid_type"
        for i, tool in enumerate(tools or []):
            problem = cls._tool_problem(f"tools[{i}]", tool)
            if problem:
                return problem
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice not in ("none", "auto", "required"):
            return cls._supported(choice, "tool_choice", ("none", "auto", "required"))
        if isinstance(choice, dict) and choice.get("type") == "function" and not isinstance(choice.get("name"), str):
            return "Missing required parameter: 'tool_choice.name'.", "tool_choice.name", "missing_required_parameter"
        temp = body.get("temperature")
        if temp is not None and (not isinstance(temp, (int, float)) or not 0 <= temp <= 2):
            return (f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got {temp} "
                    "instead.", "temperature", "decimal_above_max_value")
        top_p = body.get("top_p")
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 <= top_p <= 1):
            return (f"Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got {top_p} "
                    "instead.", "top_p", "decimal_above_max_value")
        mot = body.get("max_output_tokens")
        if mot is not None and (not isinstance(mot, int) or isinstance(mot, bool) or mot < 16):
            return (f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got "
                    f"{mot} instead.", "max_output_tokens", "integer_below_min_value")
        for key, kind in (("text", dict), ("reasoning", dict), ("include", list), ("metadata", dict),
                          ("stream", bool), ("store", bool), ("background", bool), ("parallel_tool_calls", bool)):
            if body.get(key) is not None and not isinstance(body[key], kind):
                return (f"Invalid type for '{key}': expected {'an object' if kind is dict else f'a {kind.__name__}'}"
                        f", but got {type(body[key]).__name__} instead.", key, "invalid_type")
        for i, value in enumerate(body.get("include") or []):
            if value not in cls._response_includes:
                return cls._supported(value, f"include[{i}]", cls._response_includes)
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_schema", "json_object"):
            return cls._supported(fmt.get("type") if isinstance(fmt, dict) else fmt, "text.format.type",
                                  ("text", "json_schema", "json_object"))
        if fmt["type"] == "json_schema" and not (isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema"), dict)):
            return ("Missing required parameter: 'text.format.name'.", "text.format.name",
                    "missing_required_parameter")
        effort = (body.get("reasoning") or {}).get("effort")
        if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
            return cls._supported(effort, "reasoning.effort", ("none", "minimal", "low", "medium", "high", "xhigh"))
        return None

    def _stored(self, response_id: str) -> dict | None:
        with self._lock:
            return self._responses.get(response_id)

    def _history(self, response_id: str | None) -> list[dict]:
        """The items of a stored response's conversation: each earlier input and output, in order."""
        items: list[dict] = []
        while response_id:
            stored = self._stored(response_id)
            if stored is None:
                break
            items[:0] = stored["input_items"] + stored["response"]["output"]
            response_id = stored["response"]["previous_response_id"]
        return items

    @staticmethod
    def _input_items(inp: Any) -> list[dict]:
        """The request's input as the items OpenAI keeps (every one with an id)."""
        if inp is None:
            return []
        items = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp
        out = []
        for item in items:
            item = dict(item)
            kind = item.setdefault("type", "message")
            if kind == "message":
                if isinstance(item["content"], str):
                    part = "output_text" if item["role"] == "assistant" else "input_text"
                    item["content"] = [{"type": part, "text": item["content"]}]
                item.setdefault("status", "completed")
            prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
                      "custom_tool_call": "ctc", "custom_tool_call_output": "ctco"}.get(kind, "item")
            item.setdefault("id", f"{prefix}_mock{_hex(24)}")
            out.append(item)
        return out

    def _responses_create(self, h, req):
        body = req.json
        problem = self.response_problem(body)
        if problem:
            return self._err(h, 400, problem[0], param=problem[1], code=problem[2])
        previous = body.get("previous_response_id")
        if previous is not None and self._stored(previous) is None:
            return self._err(h, 400, f"Previous response with id '{previous}' not found.",
                             param="previous_response_id", code="previous_response_not_found")
        items = self._input_items(body.get("input"))
        called = {i["call_id"] for i in self._history(previous) + items
                  if i.get("type") in ("function_call", "custom_tool_call")}
        for item in items:
            if item["type"] in ("function_call_output", "custom_tool_call_output") and item["call_id"] not in called:
                return self._err(h, 400, f"No tool call found for function call output with call_id "
                                         f"{item['call_id']}.", param="input")
        self._serve(h, req, lambda reply: self._respond(h, reply, body, items))

    def response_object(self, body: dict, status: str, output: list[dict], usage: dict | None) -> dict:
        """A `response` object for ``body`` (its settings echoed as OpenAI does)."""
        return {
            "id": f"resp_mock{_hex(24)}", "object": "response", "created_at": _now(), "status": status,
            "background": bool(body.get("background")), "error": None, "incomplete_details": None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"), "model": body["model"], "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": None, "summary": None, **(body.get("reasoning") or {})},
            "safety_identifier": body.get("safety_identifier"), "service_tier": "default",
            "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium", **(body.get("text") or {})},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs", 0), "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"), "usage": usage, "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    def _respond(self, h, reply: Reply, body: dict, items: list[dict]):
        """The answer to a Responses request from ``reply``: reasoning (``thinking``), a message
        (the text) and function calls, as a `response` object or its event stream."""
        p, c = reply.usage
        usage = {"input_tokens": p, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": c,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": p + c}
        output: list[dict] = []
        if reply.thinking is not None:
            reasoning = {"id": f"rs_mock{_hex(24)}", "type": "reasoning",
                         "summary": [{"type": "summary_text", "text": reply.thinking}]}
            if "reasoning.encrypted_content" in (body.get("include") or []):
                reasoning["encrypted_content"] = self.seal_reasoning(reply.thinking)
            output.append(reasoning)
        text = reply.resolved_text(self.default_text)
        if text:
            output.append({"id": f"msg_mock{_hex(24)}", "type": "message", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
        for tc in reply.tool_calls:
            call = {"id": f"fc_mock{_hex(24)}", "type": "function_call", "status": "completed",
                    "arguments": json.dumps(tc.arguments), "call_id": tc.id or f"call_mock{_hex(16)}", "name": tc.name}
            if tc.namespace is not None:
                call["namespace"] = tc.namespace
            output.append(call)
        response = self.response_object(body, "completed", output, usage)
        if reply.stop_reason in ("max_output_tokens", "content_filter"):
            response.update(status="incomplete", incomplete_details={"reason": reply.stop_reason})
        background = bool(body.get("background")) and not body.get("stream")
        if body.get("store", True):
            with self._lock:
                self._responses[response["id"]] = {"response": response, "input_items": items,
                                                   "queued": background}
        if background:
            return h.send_json(200, {**response, "status": "queued", "output": [], "usage": None}, reply.headers)
        if not body.get("stream"):
            return h.send_json(200, response, reply.headers)

        events: list[bytes] = []
        obfuscate = (body.get("stream_options") or {}).get("include_obfuscation", True)

        def event(kind: str, **fields: Any) -> int:
            if obfuscate and kind.endswith(".delta"):
                fields["obfuscation"] = _hex(8)
            events.append(_sse({"type": kind, "sequence_number": len(events), **fields}, kind))
            return len(events)

        started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        event("response.created", response=started)
        event("response.in_progress", response=started)
        first = content_end = None
        for index, item in enumerate(output):
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "reasoning":
                event("response.output_item.added", output_index=index, item={**item, "summary": []})
                part = {"type": "summary_text", "text": reply.thinking}
                event("response.reasoning_summary_part.added", **at, summary_index=0, part={**part, "text": ""})
                for piece in _split(reply.thinking, 3):
                    event("response.reasoning_summary_text.delta", **at, summary_index=0, delta=piece)
                event("response.reasoning_summary_text.done", **at, summary_index=0, text=reply.thinking)
                event("response.reasoning_summary_part.done", **at, summary_index=0, part=part)
            elif item["type"] == "message":
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "content": []})
                part = item["content"][0]
                event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
                for piece in reply.pieces(self.default_text):
                    n = event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                    first = first or n
                content_end = len(events)
                event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
                event("response.content_part.done", **at, content_index=0, part=part)
            else:
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "arguments": ""})
                for piece in _split(item["arguments"], 3):
                    n = event("response.function_call_arguments.delta", **at, delta=piece)
                    first = first or n
                event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
            event("response.output_item.done", output_index=index, item=item)
        event("response.incomplete" if response["status"] == "incomplete" else "response.completed",
              response=response)
        self._stream(h, reply, events, first=first or len(events), content_end=content_end)

    def _response_get(self, h, req, id):  # noqa: A002
        stored = self._stored(id)
        if stored is None:
            return self._err(h, 404, f"Response with id '{id}' not found.")
        with self._lock:
            stored["queued"] = False  # a background response has finished by the time it is asked for
        self._serve(h, req, lambda reply: h.send_json(200, stored["response"], reply.headers))

    def _response_delete(self, h, req, id):  # noqa: A002
        with self._lock:
            stored = self._responses.pop(id, None)
        if stored is None:
            return self._err(h, 404, f"Response with id '{id}' not found.")
        self._serve(h, req, lambda reply: h.send_json(200, self.deleted(id, "response"), reply.headers))

    def _response_cancel(self, h, req, id):  # noqa: A002
        stored = self._stored(id)
        if stored is None:
            return self._err(h, 404, f"Response with id '{id}' not found.")
        if not stored["response"]["background"]:
            return self._err(h, 400, "Only responses created with background=true can be cancelled.")
        with self._lock:
            if stored["queued"]:
                stored["queued"] = False
                stored["response"] = {**stored["response"], "status": "cancelled", "output": [], "usage": None}
            cancelled = stored["response"]["status"] == "cancelled"
        if not cancelled:
            return self._err(h, 400, "Cannot cancel a completed response.")
        self._serve(h, req, lambda reply: h.send_json(200, stored["response"], reply.headers))

    def _response_input_items(self, h, req, id):  # noqa: A002
        stored = self._stored(id)
        if stored is None:
            return self._err(h, 404, f"Response with id '{id}' not found.")
        items = list(stored["input_items"])
        if (req.qs("order") or "desc") == "desc":
            items.reverse()
        self._serve(h, req, lambda reply: h.send_json(200, self._page(items, req), reply.headers))

    # ---- models
    def _models(self, h, req):
        data = [{"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "mock"}
                for m in ("gpt-mock", "text-embedding-mock")]
        self._serve(h, req, lambda reply: h.send_json(200, {"object": "list", "data": data}, reply.headers))


# --------------------------------------------------------------------------- Anthropic


class AzureOpenAIMock(OpenAIMock):
    """Azure OpenAI's wire format: OpenAI's bodies under ``/openai/deployments/{deployment}/...``
    (files, batches, fine-tuning, assistants and threads under ``/openai/...``), the key in
    ``api-key``, ``api-version`` required in the query and one of ``api_versions`` (a preview
    one for assistants and threads, which need no ``OpenAI-Beta``); errors as Azure words them.
    It answers as the OpenAI mock does for the same path under ``/v1``."""

    name = "azure-openai"
    deployments = ("gpt4o-prod", "gpt4o-mini")
    # Real data-plane versions of Azure OpenAI (the ones the suite sends); any other is a 400.
    api_versions = frozenset({"2024-06-01", "2024-10-21", "2024-05-01-preview", "2025-03-01-preview"})

    def __init__(self, key: str, **kw: Any):
        super().__init__(keys={key}, **kw)
        self.key = key
        self.base_url = f"{self.origin}/openai"

    def handle(self, h, req):
        m = re.fullmatch(r"/openai(?:/deployments/(?P<deployment>[^/]+))?(?P<rest>/.*)", req.path)
        if not m or (m["deployment"] is not None and m["deployment"] not in self.deployments):
            return h.send_json(404, {"error": {"code": "DeploymentNotFound", "message":
                                               "The API deployment for this resource does not exist."}})
        if req.header("api-key") != self.key:
            return h.send_json(401, {"error": {"code": "401", "message": "Access denied due to invalid "
                                               "subscription key or wrong API endpoint."}})
        if not req.qs("api-version"):
            return h.send_json(404, {"error": {"code": "404", "message": "Resource not found"}})
        if req.qs("api-version") not in self.api_versions:
            return h.send_json(400, {"error": {"code": "BadRequest", "message": "API version not supported"}})
        if req.header("authorization"):
            return h.send_json(400, {"error": {"code": "BadRequest", "message": "two credentials sent"}})
        assistants = m["rest"].startswith(("/assistants", "/threads"))
        responses = m["rest"].startswith("/responses")
        if (assistants or responses) and not req.qs("api-version").endswith("-preview"):
            # Assistants and responses exist only in Azure's preview API versions.
            return h.send_json(404, {"error": {"code": "404", "message": "Resource not found"}})
        if responses and m["deployment"] is not None:
            # Responses live under the resource; the deployment is the body's `model`.
            return h.send_json(404, {"error": {"code": "404", "message": "Resource not found"}})
        # Azure wants no `OpenAI-Beta` for assistants; the OpenAI mock behind does.
        headers = {**req.headers, "authorization": f"Bearer {self.key}"}
        if assistants:
            headers["openai-beta"] = "assistants=v2"
        super().handle(h, dataclasses.replace(req, path="/v1" + m["rest"], headers=headers))


class AnthropicMock(MockProvider):
    """Speaks Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) and
    validates like it."""

    name = "anthropic"
    default_text = "Hello from the Anthropic mock."
    _status_types = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                     404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                     500: "api_error", 529: "overloaded_error"}
    _fields = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
               "top_k", "tools", "tool_choice", "metadata", "thinking", "service_tier", "container",
               "mcp_servers", "context_management", "output_config"}
    # What `POST /v1/messages/count_tokens` takes: the conversation, never the generation's settings.
    _count_fields = {"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers",
                     "context_management", "output_config"}
    # The beta (`anthropic-beta`) under which Claude Code sends `system` turns among the messages,
    # each turn with its own `output_config`; without it both are refused.
    per_turn_beta = "per-turn-control-2026-07-01"
    max_cache_breakpoints = 4
    _block_types = {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking",
                    "search_result", "server_tool_use", "web_search_tool_result"}
    # The API versions Anthropic serves (`anthropic-version`); any other is a 400. Claude Code
    # sends 2023-06-01, the anthropic SDK 2.14 2026-10-21.
    versions = frozenset({"2023-06-01", "2023-01-01", "2026-10-21"})

    @staticmethod
    def error(status: int, type: str, message: str, **reply_fields: Any) -> Reply:  # noqa: A002
        """A scripted Anthropic-shaped error reply."""
        return Reply(status=status, body={"type": "error", "error": {"type": type, "message": message}},
                     **reply_fields)

    def error_body(self, status, message=None, type_=None):
        return {"type": "error", "error": {"type": type_ or self._status_types.get(status, "api_error"),
                                           "message": message or f"Mock error with status {status}"}}

    def _err(self, h, status, type_, message):
        h.send_json(status, self.error_body(status, message, type_), {"request-id": f"req_mock{_hex()}"})

    @staticmethod
    def sign_thinking(thinking: str) -> str:
        """The signature of a thinking block: Anthropic signs what the model thought and checks the
        signature of thinking sent back; the mock does the same with a keyed hash."""
        return "EqMB" + hashlib.sha256(b"anthropic-mock-thinking-key\0" + thinking.encode()).hexdigest()[:40]

    @staticmethod
    def _blocks(message: dict, block_type: str) -> list[tuple[int, dict]]:
        content = message["content"]
        return [(j, b) for j, b in enumerate(content if isinstance(content, list) else []) if b["type"] == block_type]

    @staticmethod
    def _turns(msgs: list[dict]) -> list[tuple[int, dict]]:
        """The user and assistant turns with their indices (`system` turns stand between them)."""
        return [(i, m) for i, m in enumerate(msgs) if m["role"] != "system"]

    @classmethod
    def thinking_problem(cls, body: dict) -> str | None:
        """Anthropic's rules for thinking sent back: a thinking block must carry the signature
        of its text; with thinking enabled, the assistant turn whose tool_use the conversation's
        last tool_result answers must start with a thinking block."""
        msgs = body["messages"]
        for i, m in enumerate(msgs):
            for j, block in cls._blocks(m, "thinking"):
                if block.get("signature") != cls.sign_thinking(str(block.get("thinking"))):
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        turns = cls._turns(msgs)
        if (body.get("thinking") or {}).get("type") != "enabled" or len(turns) < 2:
            return None
        (_, last), (index, turn) = turns[-1], turns[-2]
        if not cls._blocks(last, "tool_result") or turn["role"] != "assistant" or not isinstance(turn["content"], list):
            return None
        first = turn["content"][0]["type"] if turn["content"] else None
        if first not in ("thinking", "redacted_thinking"):
            return (f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                    f"`{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
                    "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
        return None

    @classmethod
    def tool_ids_problem(cls, msgs: list[dict]) -> str | None:
        """Anthropic's rule for tool ids: each tool_use of an assistant turn is answered by a
        tool_result with its id in the next turn, and each tool_result answers a tool_use of the
        turn before it (so a conversation whose ids were lost or renamed is refused)."""
        turns = cls._turns(msgs)
        for k, (i, m) in enumerate(turns):
            if m["role"] == "assistant" and k + 1 < len(turns):
                answered = {b.get("tool_use_id") for _, b in cls._blocks(turns[k + 1][1], "tool_result")}
                missing = [b["id"] for _, b in cls._blocks(m, "tool_use") if b["id"] not in answered]
                if missing:
                    return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                            f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                            "`tool_result` block in the next message.")
            if m["role"] == "user":
                before = turns[k - 1][1] if k > 0 and turns[k - 1][1]["role"] == "assistant" else None
                used = {b["id"] for _, b in cls._blocks(before, "tool_use")} if before else set()
                for j, b in cls._blocks(m, "tool_result"):
                    if b["tool_use_id"] not in used:
                        return (f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                                f"{b['tool_use_id']}. Each `tool_result` block must have a corresponding `tool_use` "
                                "block in the previous message.")
        return None

    @classmethod
    def cache_breakpoints(cls, body: dict) -> int:
        """The blocks marked with `cache_control` (system, messages and their tool results, tools)."""
        blocks = [b for b in body.get("system") or [] if isinstance(b, dict)] + list(body.get("tools") or [])
        for m in body["messages"]:
            for block in m["content"] if isinstance(m["content"], list) else []:
                blocks.append(block)
                if block["type"] == "tool_result" and isinstance(block.get("content"), list):
                    blocks += [b for b in block["content"] if isinstance(b, dict)]
        return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)

    @staticmethod
    def count_tokens(body: dict) -> int:
        """The mock's token count of a request (what `count_tokens` answers): a pure function of
        its system, messages and tools, so a test can compute the number it expects."""
        text = json.dumps([body.get("system"), body["messages"], body.get("tools")], ensure_ascii=False)
        return max(1, len(text) // 4)

    @classmethod
    def validate(cls, body: Any, betas: frozenset[str] = frozenset(), counting: bool = False) -> str | None:
        """Return the Anthropic-style error message for an invalid request, else None. ``betas``:
        the request's `anthropic-beta` features; ``counting``: a `count_tokens` request."""
        if not isinstance(body, dict):
            return "Request body must be a JSON object"
        for k in body:
            if k not in (cls._count_fields if counting else cls._fields):
                return f"{k}: Extra inputs are not permitted"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "model: Field required"
        mt = body.get("max_tokens")
        if mt is None and not counting:
            return "max_tokens: Field required"
        if not counting and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            return "max_tokens: Input should be a valid integer greater than or equal to 1"
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            return "messages: Field required"
        if not msgs:
            return "messages: at least one message is required"
        per_turn = cls.per_turn_beta in betas
        roles = ("user", "assistant", "system") if per_turn else ("user", "assistant")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                return f"messages.{i}: Input should be a valid dictionary"
            if m.get("role") not in roles:
                return (f"messages.{i}.role: Input should be 'user' or 'assistant' "
                        f"(got {m.get('role')!r}; use the top-level system parameter for system prompts)")
            extra = set(m) - {"role", "content"} - ({"output_config"} if per_turn else set())
            if extra:
                return f"messages.{i}.{sorted(extra)[0]}: Extra inputs are not permitted"
            content = m.get("content")
            if isinstance(content, str):
                continue
            if not isinstance(content, list):
                return f"messages.{i}.content: Input should be a valid string or list"
            for j, block in enumerate(content):
                if not isinstance(block, dict) or block.get("type") not in cls._block_types:
                    return f"messages.{i}.content.{j}: Input tag does not match any of the expected tags"
                t = block["type"]
                if m["role"] == "system" and t != "text":
                    return f"messages.{i}.content.{j}.type: a system message holds text blocks only"
                if t == "text" and not isinstance(block.get("text"), str):
                    return f"messages.{i}.content.{j}.text: Field required"
                if t == "image":
                    src = block.get("source") or {}
                    if src.get("type") not in ("base64", "url", "file"):
                        return f"messages.{i}.content.{j}.source: invalid image source"
                    if src.get("type") == "base64" and not (src.get("media_type") and src.get("data")):
                        return f"messages.{i}.content.{j}.source: media_type and data are required"
                if t == "tool_use" and not (block.get("id") and block.get("name")
                                            and isinstance(block.get("input"), dict)):
                    return f"messages.{i}.content.{j}: tool_use needs id, name and an object input"
                if t == "tool_result" and not block.get("tool_use_id"):
                    return f"messages.{i}.content.{j}.tool_use_id: Field required"
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            if not isinstance(system, list) or not all(
                    isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                    for b in system):
                return "system: Input should be a valid string or a list of text blocks"
        temp = body.get("temperature")
        if temp is not None and (not isinstance(temp, (int, float)) or not 0 <= temp <= 1):
            return "temperature: Input should be less than or equal to 1"
        stops = body.get("stop_sequences")
        if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
            return "stop_sequences: Input should be a valid list of strings"
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                return "tools: Input should be a valid list"
            for i, t in enumerate(tools):
                if not isinstance(t, dict) or not t.get("name"):
                    return f"tools.{i}.name: Field required"
                if "type" not in t and not isinstance(t.get("input_schema"), dict):
                    return f"tools.{i}.input_schema: Field required"
        tc = body.get("tool_choice")
        if tc is not None:
            if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
                return "tool_choice: Input should be an object with type auto, any, tool or none"
            if tc["type"] == "tool" and not tc.get("name"):
                return "tool_choice.name: Field required"
        th = body.get("thinking")
        if th is not None:
            if not isinstance(th, dict) or th.get("type") not in ("enabled", "disabled", "adaptive"):
                return "thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'"
            if th.get("display") not in (None, "summarized", "omitted") or (th["type"] == "disabled" and "display" in th):
                return f"thinking.{th['type']}.display: Input should be 'summarized' or 'omitted'"
            if th["type"] == "enabled":
                budget = th.get("budget_tokens")
                if not isinstance(budget, int) or budget < 1024:
                    return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
                if mt is not None and budget >= mt:
                    return "`max_tokens` must be greater than `thinking.budget_tokens`"
            elif "budget_tokens" in th:
                return f"thinking.{th['type']}.budget_tokens: Extra inputs are not permitted"
        md = body.get("metadata")
        if md is not None and (not isinstance(md, dict) or set(md) - {"user_id"}):
            return "metadata: only user_id is permitted"
        breakpoints = cls.cache_breakpoints(body)
        if breakpoints > cls.max_cache_breakpoints:
            return (f"A maximum of {cls.max_cache_breakpoints} blocks with cache_control may be provided. "
                    f"Found {breakpoints}.")
        return cls.tool_ids_problem(msgs) or cls.thinking_problem(body)

    def handle(self, h, req):
        if req.path not in ("/v1/messages", "/v1/messages/count_tokens") or req.method != "POST":
            return self._err(h, 404, "not_found_error", f"Not found: {req.method} {req.path}")
        # The key in `x-api-key` (Claude Code) or as a Bearer token (the anthropic SDK since 2.x).
        if not req.header("x-api-key") and not (req.header("authorization") or "").startswith("Bearer "):
            return self._err(h, 401, "authentication_error", "x-api-key header is required")
        version = req.header("anthropic-version")
        if not version:
            return self._err(h, 400, "invalid_request_error", "anthropic-version: header is required")
        if version not in self.versions:
            return self._err(h, 400, "invalid_request_error", f"anthropic-version: invalid version {version!r}")
        if req.json is None:
            return self._err(h, 400, "invalid_request_error", "There was an issue with your request body: "
                                                              "invalid JSON")
        betas = frozenset(b.strip() for b in (req.header("anthropic-beta") or "").split(",") if b.strip())
        counting = req.path == "/v1/messages/count_tokens"
        problem = self.validate(req.json, betas, counting)
        if problem:
            return self._err(h, 400, "invalid_request_error", problem)
        body = req.json
        if counting:
            return self._serve(h, req, lambda reply: h.send_json(
                200, {"input_tokens": self.count_tokens(body)}, {"request-id": f"req_mock{_hex()}", **reply.headers}))
        self._serve(h, req, lambda reply: self.answer(h, reply, body["model"], bool(body.get("stream"))))

    def answer(self, h: _Handler, reply: Reply, model: str, stream: bool):
        """Send the Messages API answer generated from ``reply``: a ``message`` object, or with
        ``stream`` the real SSE event sequence (gate after the first delta). It uses only what
        every ``MockProvider`` has, so other mocks serve the same answers with it
        (``AnthropicMock.answer(vertex_mock, ...)`` for Anthropic on Vertex)."""
        mid = f"msg_mock{_hex(20)}"
        text = reply.resolved_text(self.default_text)
        stop = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
        p, c = reply.usage
        tools = [(tc.id or f"toolu_mock{_hex(16)}", tc) for tc in reply.tool_calls]
        signature = AnthropicMock.sign_thinking(reply.thinking or "")
        usage = {"input_tokens": p, "output_tokens": c, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        if not stream:
            content: list[dict] = []
            if reply.thinking is not None:
                content.append({"type": "thinking", "thinking": reply.thinking, "signature": signature})
            if text:
                content.append({"type": "text", "text": text})
            for tid, tc in tools:
                content.append({"type": "tool_use", "id": tid, "name": tc.name, "input": tc.arguments})
            return h.send_json(200, {
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": stop, "stop_sequence": None, "usage": usage,
            }, {"request-id": f"req_mock{_hex()}", **reply.headers})

        events = [_sse({"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}},
            "message_start")]
        first = None  # index of the first delta event: the gate waits right after it
        index = 0

        def block(start: dict, deltas: list[dict]):
            nonlocal index, first
            events.append(_sse({"type": "content_block_start", "index": index, "content_block": start},
                               "content_block_start"))
            if index == 0:
                events.append(_sse({"type": "ping"}, "ping"))
            for d in deltas:
                events.append(_sse({"type": "content_block_delta", "index": index, "delta": d},
                                   "content_block_delta"))
                if first is None:
                    first = len(events)
            events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
            index += 1

        if reply.thinking is not None:
            block({"type": "thinking", "thinking": "", "signature": ""},
                  [{"type": "thinking_delta", "thinking": t} for t in _split(reply.thinking, 3)]
                  + [{"type": "signature_delta", "signature": signature}])
        pieces = reply.pieces(self.default_text)
        if pieces:
            block({"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in pieces])
        for tid, tc in tools:
            block({"type": "tool_use", "id": tid, "name": tc.name, "input": {}},
                  [{"type": "input_json_delta", "partial_json": ""}]
                  + [{"type": "input_json_delta", "partial_json": t}
                     for t in _split(json.dumps(tc.arguments), 3)])
        events.append(_sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                            "usage": {"output_tokens": c}}, "message_delta"))
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        self._stream(h, reply, events, first=first or len(events))


# --------------------------------------------------------------------------- TLS


def make_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """Create a self-signed certificate for 127.0.0.1 (valid names, untrusted issuer)."""
    directory = Path(directory)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-days", "1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def tls_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx
