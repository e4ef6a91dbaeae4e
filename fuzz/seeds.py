"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) from the providers' golden
fixtures (src/providers/fixtures/requests: client requests, provider answers, SSE chunks,
AWS event-stream frames) and a few hand-written cases, in each target's input format
(src/fuzz.rs). `./build.sh fuzz` runs it before the targets; the corpus directories also keep
what the fuzzer finds (they are not committed)."""

import glob
import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted(glob.glob(str(ROOT / "src/providers/fixtures/requests/*.json")))
# The exchange's choices, in src/fuzz.rs's order.
PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions", "/v1/embeddings",
         "/v1/models", "/health", "/v1/files", "/v1/images/generations", "/v1/chat/completions?x=1", "/v2/nothing"]
CONFIGS = {"openai": 0, "openai-compatible": 0, "anthropic": 1, "bedrock": 2, "azure-openai": 3, "google": 4}
CONTENT_TYPES = ["application/json", "text/event-stream", "application/vnd.amazon.eventstream", "text/plain", ""]
STATUSES = [200, 200, 200, 400, 401, 408, 429, 500, 502, 503, 999, 204]
# The translations target's client requests (path, streamed), in src/fuzz.rs's order.
ASKED = [("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/v1/messages", False),
         ("/v1/messages", True), ("/v1/responses", False), ("/v1/responses", True), ("/v1/embeddings", False)]


# control_plane_bodies: (endpoint, path id, query, body), in control-plane/src/fuzz.rs's order.
CONTROL_PLANE_REQUESTS = [
    (0, "greeting", "", b'{"string": "Hi {{name}}", "model": "gpt-4o", "parameters": {"temperature": 0.1}, '
                        b'"tools": [{"type": "function"}], "tool_choice": "auto", "is_raw_template": 0}'),
    (0, "9f1c2b3a-0000-4000-8000-000000000000", "", b'{"patch": true, "model": "gpt-4.1"}'),
    (1, "greeting", "", b'{"variables": {"name": "Ada", "items": ["a", "b"]}, "max_tokens": 5}'),
    (2, "g", "", b'{"checks": [{"id": "default.regexMatch", "parameters": {"rule": "a+b"}}], "on_fail": {"deny": true}}'),
    (3, "c", "", b'{"strategy": {"mode": "fallback"}, "targets": [{"provider": "openai", "api_key": "k"}, '
                 b'{"provider": "anthropic", "api_key": "a", "retry": {"attempts": 2}}], "cache": {"mode": "simple"}}'),
    (4, "p", "", b'{"provider": "azure-openai", "api_key": "k", "resource_name": "r", "deployment_id": "d", '
                 b'"api_version": "v"}'),
    (5, "", "", b'{"workspace": "team-a", "admin": false}'),
    (6, "rpm", "", b'{"workspace": "w", "model": "m", "requests_per_minute": 5, "budget_usd": 1.5, "budget_period": "day"}'),
    (7, "org/model_1", "workspace=w", b'{"input_per_million": 1, "output_per_million": 2.5}'),
    (8, "", "", b'{"grants": [{"limit": "l", "kind": "tokens", "need": 5, "want": 50}], "reports": [{"lease": "x", "used": 0}]}'),
    (9, "", "", b'{"records": [{"workspace": "w", "trace_id": "t", "timestamp_ms": 1700000000123, "record_id": "r-1", '
                b'"status": 200, "provider": "openai", "prompt_tokens": 3, "cost_usd": 0.5, "metadata": {"_user": "u"}}]}'),
    (10, "", "", b'{"trace_id": "t", "value": 1, "weight": 0.5, "metadata": {"k": "v"}}'),
    (11, "", "trace_id=t&metadata.user=u&from=1&to=2&limit=5&status=200", b""),
    (12, "", "start=0&end=100&group_by=model&group_by=provider&workspace=w", b""),
    (13, "", "", b'{"input_file_id": "file-gw-1", "endpoint": "/v1/chat/completions", "completion_window": "immediate", '
                 b'"metadata": {"k": "v"}}'),
    (14, "", "", b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n\n'
                 b'{"custom_id": "a", "method": "GET", "url": "/v1/embeddings", "body": []}\nnot json'),
    (15, "resp_1", "", b'{"response": {"id": "resp_1", "object": "response"}, "input": [{"role": "user", "content": "hi"}]}'),
    (16, "", "wait_ms=100", b""),
    (17, "", "limit=5&order=asc&after=msg_1&include[]=x", b""),
    (18, "abc", "limit=5&after=batch_gw_1&before=b&purpose=batch", b"\x01"),
    (19, "files-2", "", b'{"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer t"}, '
                      b'"tools": {"allow": ["read_*"]}, "timeout_ms": 5000, "failure": "closed"}'),
    (20, "greeting", "version=v1&version=v2", b""),
]


def piece(data: bytes) -> bytes:
    """A length-prefixed piece (two bytes, little-endian)."""
    data = data[:0xFFFF]
    return struct.pack("<H", len(data)) + data


def frame(headers: list, payload: bytes) -> bytes:
    """One AWS event-stream frame (string headers)."""
    encoded = b"".join(bytes([len(n)]) + n.encode() + b"\x07" + struct.pack(">H", len(v)) + v.encode()
                       for n, v in headers)
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return head + struct.pack(">I", zlib.crc32(head))


def answer_bytes(answer: dict) -> tuple[bytes, int]:
    """A fixture's answer body and its content type's index."""
    if "sse_chunks" in answer:
        return "".join(answer["sse_chunks"]).encode(), 1
    if "event_stream" in answer:
        return b"".join(frame(f["headers"], json.dumps(f["payload"]).encode()) for f in answer["event_stream"]), 2
    return json.dumps(answer.get("body", {})).encode(), 0


def exchange_seed(request: dict, provider: str, answer: dict) -> bytes:
    path = PATHS.index(request["path"]) if request["path"] in PATHS else 0
    out = bytes([0, 0, path, CONFIGS[provider], 0]) + piece(b"")  # settings 0, POST
    out += bytes([0]) + piece(json.dumps(request.get("body", {})).encode()) + bytes([0])  # body, ended
    body, content_type = answer_bytes(answer)
    status = STATUSES.index(answer.get("status", 200)) if answer.get("status", 200) in STATUSES else 0
    out += bytes([1, status, content_type, 0, 1])  # response head, via_upstream, a body follows
    half = len(body) // 2
    out += bytes([2]) + piece(body[:half]) + bytes([1]) + bytes([2]) + piece(body[half:]) + bytes([0])
    return out


def seeds() -> dict[str, list[bytes]]:
    corpus: dict[str, list[bytes]] = {name: [] for name in ["plugin_settings", "sse", "mcp", "event_stream", "query",
                                                            "prompt", "jwt", "exchange", "stored_items",
                                                            "translations", "request", "control_plane_bodies",
                                                            "native_abi"]}
    for path in FIXTURES:
        fixture = json.loads(Path(path).read_text())
        request = fixture["client_request"]
        for provider, answer in fixture.get("answers", {}).items():
            if provider in CONFIGS:
                seed = exchange_seed(request, provider, answer)
                corpus["exchange"].append(seed)
                # The same with the control plane (settings 2): its reads come first.
                corpus["exchange"].append(bytes([2]) + seed[1:])
            body, kind = answer_bytes(answer)
            asked = (request["path"].split("?")[0], kind != 0)
            if provider in CONFIGS and asked in ASKED:
                status = STATUSES.index(answer.get("status", 200)) if answer.get("status", 200) in STATUSES else 0
                corpus["translations"].append(bytes([ASKED.index(asked), CONFIGS[provider], status, 5]) + body)
            if kind == 1:
                corpus["sse"].append(bytes([7]) + body)
            if kind == 2:
                corpus["event_stream"].append(bytes([5]) + body)
    corpus["plugin_settings"] += [
        b'{"api_keys": ["k"]}',
        b'{"api_keys": ["k"], "upstream": {"cluster": "outbound|{port}||{host}", "route_header": "x-r"}}',
        b'{"control_plane": {"cluster": "cp", "authority": "cp:1", "token": "t"}, "cache": {"byte_budget": 1048576}}',
        b'{"api_keys": ["k"], "allowed_custom_hosts": ["loopback", "*.example.com"], "metrics": {"models": ["m"]}}',
    ]
    corpus["query"] += [
        piece(b'{"$and": [{"metadata.user": {"$eq": "a"}}, {"params.model": {"$in": ["x", "y"]}}]}')
        + b'{"metadata": {"user": "a"}, "params": {"model": "x"}}',
        piece(b'{"metadata.tier": {"$regex": "^pro"}}') + b'{"metadata": {"tier": "pro-1"}}',
        piece(b'{"$or": [{"params.max_tokens": {"$gt": 10}}, {"url.pathname": {"$ne": "/v1"}}]}') + b'{"params": {"max_tokens": 5}}',
    ]
    corpus["prompt"] += [
        piece(b'{"template": {"messages": [{"role": "user", "content": "Hi {{name}}{{#items}} {{.}}{{/items}}"}]}}')
        + b'{"variables": {"name": "Ada", "items": ["a", "b"]}}',
        piece(b'{"template": {"messages": [{"role": "system", "content": "{{^x}}none{{/x}} {{{raw}}}"}]}}')
        + b'{"variables": {"raw": "<b>"}}',
    ]
    corpus["jwt"] += [
        piece(b'{"keys": [{"kty": "EC", "crv": "P-256", "kid": "k", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", '
              b'"y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}')
        + b"eyJhbGciOiJFUzI1NiIsImtpZCI6ImsifQ.eyJzdWIiOiJ1IiwiaWF0IjoxNzAwMDAwMDAwfQ.c2ln",
    ]
    corpus["stored_items"] += [
        b'\x00{"strategy": {"mode": "fallback"}, "targets": [{"provider": "openai", "api_key": "k"}, '
        b'{"provider": "anthropic", "api_key": "a", "retry": {"attempts": 2}}], "cache": {"mode": "simple"}}',
        b'\x01{"provider": "azure-openai", "api_key": "k", "resource_name": "r", "deployment_id": "d", "api_version": "v"}',
        b'\x02{"checks": [{"id": "default.regexMatch", "parameters": {"rule": "a+b"}}], "on_fail": {"deny": true}}',
        b'\x03{"workspace": "w", "model": "m", "requests_per_minute": 5, "budget_usd": 1.5, "budget_period": "day"}',
        b'\x04{"input_per_million": 1, "output_per_million": 2.5, "cached_input_per_million": 0.1}',
    ]
    # request: gateway headers (name index, piece), a chat body, a resource (path index, query, body).
    corpus["request"] += [
        b"\x00" + b"\x00" + piece(b"gw-key") + b"\x02" + piece(b'{"provider": "openai", "api_key": "k"}')
        + b"\x06" + piece(b'{"user": "a"}') + b"\x0a" + piece(b"2024-10-21"),
        b"\x01" + b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "tools": []}',
        b"\x02\x00" + piece(b"limit=2") + b'{"input_file_id": "f", "endpoint": "/v1/chat/completions", '
        b'"completion_window": "24h"}',
    ]
    corpus["control_plane_bodies"] += [bytes([endpoint]) + piece(path_id.encode()) + piece(query.encode()) + body
                                       for endpoint, path_id, query, body in CONTROL_PLANE_REQUESTS]
    for path in FIXTURES:
        body = json.loads(Path(path).read_text())["client_request"].get("body")
        if isinstance(body, dict) and "messages" in body:
            corpus["request"].append(b"\x01" + json.dumps(body).encode())
    # native_abi: result, nulls, headers (nulls, name, value: one-byte lengths), chunks (null, piece), config.
    def header(name: bytes, value: bytes, nulls: int = 0) -> bytes:
        return bytes([nulls, len(name)]) + name + bytes([len(value)]) + value
    answer = header(b":status", b"200") + header(b"content-type", b"application/json") + header(b"x-empty", b"", 2)
    corpus["native_abi"] += [
        b"\x00\x00\x03" + answer + b"\x02" + b"\x01" + piece(b'{"data": ') + b"\x01" + piece(b"[]}")
        + b'{"api_keys": ["gw-key"]}',
        b"\x00\x00\x01" + header(b":status", b"+503") + b"\x00",
        b"\xff\x03\x01" + header(b":status", b"200") + b"\x00" + b"{}",
    ]
    corpus["sse"] += [b"\x03data: {\"a\":1}\r\n\r\nevent: x\ndata: y\n\n: comment\ndata: [DONE]\n\n"]
    # mcp: (cut seed, content type index, the request's id as a piece, the body).
    tools_list = (b'{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"read"},{"name":"write"}],'
                  b'"nextCursor":"c"}}')
    corpus["mcp"] += [
        bytes([5, 0]) + piece(b"7") + tools_list,
        bytes([9, 1]) + piece(b"7") + b"id: 1\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":"
        b"\"notifications/progress\"}\r\n\r\n: ping\n\nevent: message\ndata: " + tools_list + b"\n\n",
        bytes([3, 0]) + piece(b'"call-1"') + b'{"jsonrpc":"2.0","id":"call-1","result":{"content":[],"isError":true}}',
        bytes([1, 2]) + piece(b"1") + b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}',
    ]
    return corpus


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "fuzz/corpus"
    for target, items in seeds().items():
        directory = root / target
        directory.mkdir(parents=True, exist_ok=True)
        for item in items:
            (directory / f"seed-{hashlib.sha1(item).hexdigest()[:16]}").write_bytes(item)


if __name__ == "__main__":
    main()
