#!/usr/bin/env python3
"""A local stand-in model server for trying the gateway with no provider account and no internet.

It is not a model: it echoes. Every answer is "You said: <the last user text>", with the usage a
real provider reports, counted in words (the same count for a prompt and for the usage of its
answer). It speaks, on http://127.0.0.1:${GATEWAY_LOCAL_MODEL_PORT:-8000}:

* OpenAI's API under /v1: POST /v1/chat/completions (JSON, or with "stream": true server-sent
  chunks ending `data: [DONE]`, a usage chunk last with stream_options.include_usage),
  POST /v1/responses (a response object, or its event stream), POST /v1/embeddings
  (deterministic vectors, floats or base64), GET /v1/models.
* Anthropic's Messages API: POST /v1/messages (JSON, or its event stream), and
  POST /v1/messages/count_tokens.

So the gateway reaches it with `x-gateway-custom-host: http://127.0.0.1:8000/v1` for the
providers `openai` (and other OpenAI-compatible names) and `anthropic` alike: the gateway adds
`/chat/completions`, `/responses`, `/embeddings` or `/messages` to that address. Query strings
(Claude Code's `?beta=true`) and keys are accepted and ignored. Bad JSON and missing messages get
a 400 in the API's own error shape; any other path a 404.

Python 3 standard library only. `./build.sh run` starts it beside the gateway (unless
GATEWAY_LOCAL_MODEL=off); `./build.sh local-model` or `python3 tools/local_model.py` runs it
alone. It listens on 127.0.0.1 only, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import signal
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

HOST = "127.0.0.1"
PORT_VARIABLE = "GATEWAY_LOCAL_MODEL_PORT"
DEFAULT_MODEL = "local-echo"
# What the answers carry where an API has room for it, so nobody mistakes them for a model's.
FINGERPRINT = "local-echo-stand-in"
EMBEDDING_DIMENSIONS = 16
SERVED = ("POST /v1/chat/completions, POST /v1/responses, POST /v1/embeddings, GET /v1/models, "
          "POST /v1/messages, POST /v1/messages/count_tokens")

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}{next(_ids):06d}"


# --------------------------------------------------------------------------- the echo


def text_of(value: Any) -> str:
    """All the text in a message's content (a string, or a list of parts or blocks, nested as a
    tool result's content is)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(filter(None, (text_of(part) for part in value)))
    if isinstance(value, dict):
        return value["text"] if isinstance(value.get("text"), str) else text_of(value.get("content"))
    return ""


def count_words(*values: Any) -> int:
    """The stand-in's token count: the words in the text of ``values``."""
    return sum(len(text_of(value).split()) for value in values)


def last_user_text(messages: Any) -> str:
    """The last text part of the last user message (agents put their reminders in earlier parts
    of the same message, and the prompt last)."""
    if isinstance(messages, str):
        return messages
    users = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content")
    if isinstance(content, list):
        texts = [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
        return texts[-1] if texts else ""
    return text_of(content)


def echo(messages: Any) -> str:
    return f"You said: {last_user_text(messages).strip()}"


def pieces(text: str) -> list[str]:
    """``text`` as a stream sends it: word by word, the spaces kept."""
    return re.findall(r"\S+\s*", text) or [text]


def embedding(text: str, dimensions: int) -> list[float]:
    """A unit vector from the text's hash: the same text always gets the same vector."""
    digest = hashlib.sha256(text.encode()).digest()
    while len(digest) < 2 * dimensions:
        digest += hashlib.sha256(digest).digest()
    raw = [int.from_bytes(digest[2 * i:2 * i + 2], "big") / 32768 - 1 for i in range(dimensions)]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    return [x / norm for x in raw]


# --------------------------------------------------------------------------- the APIs


class BadRequest(Exception):
    """A request the API refuses with a 400."""


def json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def required_list(body: dict, field: str) -> list:
    value = body.get(field)
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{field}' is required: a non-empty array")
    return value


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's Envoy pools its connections
    server_version = "GatewayLocalStandIn/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: the gateway logs every request already

    # ---- plumbing

    def read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline(65537).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(65537)  # the CRLF after the chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_stream(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    # The errors (400 or 404) in each API's own shape.
    def openai_error(self, status: int, message: str) -> None:
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error", "param": None,
                                          "code": None}})

    def anthropic_error(self, status: int, message: str) -> None:
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        self.send_json(status, {"type": "error", "error": {"type": kind, "message": message}})

    def dispatch(self) -> None:
        try:
            raw = self.read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        path = urlsplit(self.path).path.rstrip("/")
        anthropic = path.startswith("/v1/messages") or "anthropic-version" in self.headers
        refuse = self.anthropic_error if anthropic else self.openai_error
        route = ROUTES.get((self.command, path))
        if route is None:
            return refuse(404, f"{self.command} {path} is not served by this local stand-in model server; "
                               f"it serves {SERVED} (as x-gateway-custom-host: http://{HOST}:"
                               f"{self.server.server_address[1]}/v1)")
        try:
            route(self, json_body(raw) if self.command == "POST" else {})
        except BadRequest as e:
            refuse(400, str(e))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = dispatch

    # ---- OpenAI

    def models(self, _body: dict) -> None:
        self.send_json(200, {"object": "list", "data": [
            {"id": DEFAULT_MODEL, "object": "model", "created": 0, "owned_by": FINGERPRINT}]})

    def chat_completions(self, body: dict) -> None:
        messages = required_list(body, "messages")
        model = body.get("model") or DEFAULT_MODEL
        answer = echo(messages)
        prompt, completion = count_words(messages), count_words(answer)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        common = {"id": new_id("chatcmpl-local"), "created": int(time.time()), "model": model,
                  "system_fingerprint": FINGERPRINT}
        if not body.get("stream"):
            return self.send_json(200, {**common, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": answer, "refusal": None},
                "logprobs": None, "finish_reason": "stop"}], "usage": usage})
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # With include_usage, OpenAI's chunks carry "usage": null until the last one, which has it.
        extra = {"usage": None} if include_usage else {}

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            return sse({**common, "object": "chat.completion.chunk", **extra, "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in pieces(answer)]
        events.append(chunk({}, "stop"))
        if include_usage:
            events.append(sse({**common, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        self.send_stream(events)

    def create_response(self, body: dict) -> None:
        given = body.get("input")
        if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
            raise BadRequest("'input' is required: a string or a non-empty array of input items")
        answer = echo(given)
        prompt, completion = count_words(body.get("instructions"), given), count_words(answer)
        message = {"id": new_id("msg_local"), "type": "message", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": answer, "annotations": [], "logprobs": []}]}
        response = {
            "id": new_id("resp_local"), "object": "response", "created_at": int(time.time()), "status": "completed",
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": body.get("model") or DEFAULT_MODEL,
            "output": [message], "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None}, "store": False,
            "temperature": body.get("temperature", 1.0), "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0), "truncation": "disabled", "user": None,
            "metadata": {"stand_in": FINGERPRINT},
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + completion},
        }
        if not body.get("stream"):
            return self.send_json(200, response)
        events: list[bytes] = []

        def event(kind: str, **fields: Any) -> None:
            events.append(sse({"type": kind, "sequence_number": len(events), **fields}, kind))

        started = {**response, "status": "in_progress", "output": [], "usage": None}
        at = {"item_id": message["id"], "output_index": 0}
        part = message["content"][0]
        event("response.created", response=started)
        event("response.in_progress", response=started)
        event("response.output_item.added", output_index=0, item={**message, "status": "in_progress", "content": []})
        event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
        for piece in pieces(answer):
            event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
        event("response.output_text.done", **at, content_index=0, text=answer, logprobs=[])
        event("response.content_part.done", **at, content_index=0, part=part)
        event("response.output_item.done", output_index=0, item=message)
        event("response.completed", response=response)
        self.send_stream(events)

    def embeddings(self, body: dict) -> None:
        given = body.get("input")
        inputs = [given] if isinstance(given, str) else given
        if not isinstance(inputs, list) or not inputs or not all(isinstance(item, str) for item in inputs):
            raise BadRequest("'input' is required: a string or a non-empty array of strings (this stand-in "
                             "takes no token arrays)")
        dimensions = body.get("dimensions", EMBEDDING_DIMENSIONS)
        if not isinstance(dimensions, int) or not 1 <= dimensions <= 4096:
            raise BadRequest("'dimensions' must be an integer from 1 to 4096")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, item in enumerate(inputs):
            vector = embedding(item, dimensions)
            if as_base64:  # little-endian float32, as OpenAI sends it (the openai SDK asks for this)
                vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = count_words(*inputs)
        self.send_json(200, {"object": "list", "data": data, "model": body.get("model") or DEFAULT_MODEL,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # ---- Anthropic

    def message_tokens(self, body: dict) -> int:
        return count_words(body.get("system"), required_list(body, "messages"))

    def count_tokens(self, body: dict) -> None:
        self.send_json(200, {"input_tokens": self.message_tokens(body)})

    def messages(self, body: dict) -> None:
        prompt = self.message_tokens(body)
        answer = echo(body["messages"])
        completion = count_words(answer)
        usage = {"input_tokens": prompt, "output_tokens": completion, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        message = {"id": new_id("msg_local"), "type": "message", "role": "assistant",
                   "model": body.get("model") or DEFAULT_MODEL, "content": [{"type": "text", "text": answer}],
                   "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return self.send_json(200, message)
        events = [
            sse({"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                      "usage": {**usage, "output_tokens": 1}}}, "message_start"),
            sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start"),
            sse({"type": "ping"}, "ping"),
        ]
        events += [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                       "content_block_delta") for piece in pieces(answer)]
        events += [
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": {"output_tokens": completion}}, "message_delta"),
            sse({"type": "message_stop"}, "message_stop"),
        ]
        self.send_stream(events)


ROUTES: dict[tuple[str, str], Callable[[Handler, dict], None]] = {
    ("GET", "/v1/models"): Handler.models,
    ("POST", "/v1/chat/completions"): Handler.chat_completions,
    ("POST", "/v1/responses"): Handler.create_response,
    ("POST", "/v1/embeddings"): Handler.embeddings,
    ("POST", "/v1/messages"): Handler.messages,
    ("POST", "/v1/messages/count_tokens"): Handler.count_tokens,
}


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a stream in flight does not hold up the shutdown
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client gone mid-answer is no error
            super().handle_error(request, client_address)


def stop(signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def main() -> int:
    raw_port = os.environ.get(PORT_VARIABLE, "8000")
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        print(f"[local-model] error: {PORT_VARIABLE}={raw_port!r} is not a port number", file=sys.stderr)
        return 2
    try:
        server = Server((HOST, int(raw_port)), Handler)
    except OSError as e:
        print(f"[local-model] error: cannot listen on {HOST}:{raw_port} ({e.strerror}): stop the program using it, "
              f"or choose another port with {PORT_VARIABLE}=...", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"[local-model] stand-in model server (an echo, not a model) on http://{HOST}:{raw_port}/v1: "
          f"OpenAI and Anthropic APIs", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
