#!/usr/bin/env python3
"""Soak: a long mixed load against the gateway with its control plane, every answer's shape
checked, Envoy's and the control plane's memory read at each tenth of the run.

`./build.sh soak [REQUESTS]` (default 1,000,000). A fast mock (a second Envoy answering each
provider's wire format from fixed bodies: OpenAI JSON and SSE, Anthropic JSON and SSE, Bedrock
Converse JSON, Gemini JSON and SSE, Azure's deployments, embeddings, Responses, a failing host) stands behind the gateway; wrk sends a weighted mix of
kinds of request (chat and streams, the OpenAI, Anthropic, Bedrock, Gemini and Azure wire formats, fallback past a failing host, cache hits
and misses, a guardrail that denies and one that passes, the Messages and Responses APIs, a
saved config read from the control plane, control-plane reads and writes through the gateway,
a workspace under limits, bad JSON, an unknown key), and its Lua checks each answer against what
its kind must look like (status and a piece of the body). Each request carries its kind in
`x-gateway-trace-id`, which every answer of the gateway's echoes. The run is ten segments of about
a tenth of the requests each; after each, the resident memory of both processes is read (the
median of seven readings a second apart, the load stopped). At the
end the table (requests, duration, memory at each tenth, answers by kind, wrong answers by kind)
is printed for bench/README.md, and the Envoy log is searched for a panic or a VM reload. The exit
status is 1 when any answer was wrong or memory grew (the last tenth more than 5% over the
second).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (its helpers: Envoy, the control plane, wrk, /proc readings)

ROOT = bench.ROOT
KEY = bench.API_KEY

def compact(value):
    return json.dumps(value, separators=(",", ":"))


OPENAI = compact(json.loads(bench.COMPLETION))
RESPONSE = compact({"id": "resp_soak", "object": "response", "created_at": 1700000000, "status": "completed",
                    "model": "soak-model", "output": [{"type": "message", "id": "msg_soak", "status": "completed",
                                                       "role": "assistant", "content": [
                                                           {"type": "output_text", "text": "Hello", "annotations": []}]}],
                    "usage": {"input_tokens": 9, "output_tokens": 1, "total_tokens": 10}})
OPENAI_STREAM = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in [
    {"id": "c1", "object": "chat.completion.chunk", "created": 1700000000, "model": "soak-model",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk", "created": 1700000000, "model": "soak-model",
     "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    {"id": "c1", "object": "chat.completion.chunk", "created": 1700000000, "model": "soak-model", "choices": [],
     "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}},
]) + "data: [DONE]\n\n"
ANTHROPIC = compact({"id": "msg_soak", "type": "message", "role": "assistant", "model": "claude-soak",
                        "content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn",
                        "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1}})
ANTHROPIC_STREAM = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in [
    {"type": "message_start", "message": {"id": "msg_soak", "type": "message", "role": "assistant",
                                          "model": "claude-soak", "content": [], "stop_reason": None,
                                          "usage": {"input_tokens": 9, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
])
BEDROCK = compact({"output": {"message": {"role": "assistant", "content": [{"text": "Hello"}]}},
                      "stopReason": "end_turn", "usage": {"inputTokens": 9, "outputTokens": 1, "totalTokens": 10}})
GEMINI_PARTS = [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, "index": 0},
                {"content": {"role": "model", "parts": [{"text": "lo"}]}, "finishReason": "STOP", "index": 0}]
GEMINI_USAGE = {"promptTokenCount": 9, "candidatesTokenCount": 1, "totalTokenCount": 10}
GEMINI = compact({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}, "finishReason": "STOP",
                                  "index": 0}], "usageMetadata": GEMINI_USAGE, "modelVersion": "gemini-soak"})
GEMINI_STREAM = "".join(f"data: {compact(chunk)}\r\n\r\n" for chunk in [
    {"candidates": [GEMINI_PARTS[0]], "modelVersion": "gemini-soak"},
    {"candidates": [GEMINI_PARTS[1]], "usageMetadata": GEMINI_USAGE, "modelVersion": "gemini-soak"},
])
EMBEDDING = compact({"object": "list", "model": "soak-embed", "data": [
    {"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}], "usage": {"prompt_tokens": 2, "total_tokens": 2}})
FAILURE = compact({"error": {"message": "overloaded", "type": "server_error"}})


def mock_route(prefix, status, body, content_type):
    return {"match": {"prefix": prefix}, "direct_response": {"status": status, "body": {"inline_string": body}},
            "response_headers_to_add": [{"header": {"key": "content-type", "value": content_type}}]}


def mock_config(port):
    """The providers' fast mock: fixed answers by path prefix (each kind's target names its prefix
    in its base URL)."""
    gemini_stream = mock_route("/", 200, GEMINI_STREAM, "text/event-stream")
    gemini_stream["match"] = {"safe_regex": {"regex": "^/google/.*:streamGenerateContent"}}
    routes = [
        mock_route("/fail/", 500, FAILURE, "application/json"),
        gemini_stream,
        mock_route("/google/", 200, GEMINI, "application/json"),
        mock_route("/stream/", 200, OPENAI_STREAM, "text/event-stream"),
        mock_route("/anthropic-stream/", 200, ANTHROPIC_STREAM, "text/event-stream"),
        mock_route("/anthropic/", 200, ANTHROPIC, "application/json"),
        mock_route("/bedrock/", 200, BEDROCK, "application/json"),
        mock_route("/azure/", 200, OPENAI, "application/json"),
        mock_route("/v1/embeddings", 200, EMBEDDING, "application/json"),
        mock_route("/v1/responses", 200, RESPONSE, "application/json"),
        mock_route("/", 200, OPENAI, "application/json"),
    ]
    return json.dumps({"static_resources": {"listeners": [{
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "mock",
                "route_config": {"virtual_hosts": [{"name": "mock", "domains": ["*"], "routes": routes}]},
                "http_filters": [
                    {"name": "envoy.filters.http.buffer", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                        "max_request_bytes": 1048576}},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]}})


def kinds(mock, limited_key):
    """Each kind of request: weight, method, path, headers, body, the status its answer must have
    and a piece its body must hold."""
    def target(prefix="", provider="openai"):
        return {"provider": provider, "api_key": "sk-soak", "custom_host": f"http://127.0.0.1:{mock}{prefix}/v1"}

    def config(value):
        return {"x-gateway-config": json.dumps(value)}

    chat = {"model": "soak-model", "messages": [{"role": "user", "content": "Say hello."}]}
    stream = {**chat, "stream": True}
    bedrock = {"provider": "bedrock", "custom_host": f"http://127.0.0.1:{mock}/bedrock", "cloud_c_region": "us-east-1",
               "cloud_c_access_key_id": "AKIDSOAK", "cloud_c_secret_access_key": "soak-secret"}
    gemini = {"provider": "google", "api_key": "g-soak", "custom_host": f"http://127.0.0.1:{mock}/google"}
    azure = {"provider": "azure-openai", "api_key": "az-soak", "custom_host": f"http://127.0.0.1:{mock}/azure/openai",
             "deployments": [{"deployment_id": "soak", "alias": "soak-model", "api_version": "2024-10-21",
                              "is_default": True}]}
    guard = [{"id": "no-secrets", "deny": True, "default.contains": {"words": ["forbidden"], "operator": "none"}}]
    completion, chunk_end = '"object":"chat.completion"', "data: [DONE]"
    return [
        # name, weight, method, path, headers, body, status, must hold
        ("chat", 10, "POST", "/v1/chat/completions",
         {"x-gateway-provider": "openai", "authorization": "Bearer sk-soak",
          "x-gateway-custom-host": f"http://127.0.0.1:{mock}/v1"}, chat, 200, completion),
        ("stream", 6, "POST", "/v1/chat/completions", config(target("/stream")), stream, 200, chunk_end),
        ("anthropic", 5, "POST", "/v1/chat/completions", config(target("/anthropic", "anthropic")),
         {**chat, "max_tokens": 32}, 200, completion),
        ("anthropic_stream", 4, "POST", "/v1/chat/completions", config(target("/anthropic-stream", "anthropic")),
         {**stream, "max_tokens": 32}, 200, chunk_end),
        ("bedrock", 4, "POST", "/v1/chat/completions", config(bedrock), chat, 200, completion),
        ("gemini", 3, "POST", "/v1/chat/completions", config(gemini), chat, 200, completion),
        ("gemini_stream", 3, "POST", "/v1/chat/completions", config(gemini), stream, 200, chunk_end),
        ("azure", 3, "POST", "/v1/chat/completions", config(azure), chat, 200, completion),
        ("fallback", 4, "POST", "/v1/chat/completions",
         config({"strategy": {"mode": "fallback"}, "targets": [target("/fail"), target()]}), chat, 200, completion),
        ("cache_hit", 6, "POST", "/v1/chat/completions", config({**target(), "cache": {"mode": "simple"}}),
         chat, 200, completion),
        # The Lua numbers each of these, so almost every one misses the cache and is stored.
        ("cache_miss", 3, "POST", "/v1/chat/completions", config({**target(), "cache": {"mode": "simple"}}),
         {**chat, "messages": [{"role": "user", "content": "Say hello #N."}]}, 200, completion),
        ("guardrail_deny", 3, "POST", "/v1/chat/completions", config({**target(), "input_guardrails": guard}),
         {**chat, "messages": [{"role": "user", "content": "a forbidden word"}]}, 446, '"hook_results"'),
        ("guardrail_pass", 3, "POST", "/v1/chat/completions", config({**target(), "input_guardrails": guard}),
         chat, 200, completion),
        ("messages", 4, "POST", "/v1/messages", config(target()), {**chat, "max_tokens": 32}, 200, '"type":"message"'),
        ("responses", 3, "POST", "/v1/responses", config(target()), {"model": "soak-model", "input": "Say hello."},
         200, '"object":"response"'),
        ("saved_config", 4, "POST", "/v1/chat/completions", {"x-gateway-config": "soak-config"}, chat, 200, completion),
        # A budget needs the request's output bound.
        ("limited", 4, "POST", "/v1/chat/completions",
         {"x-gateway-api-key": limited_key, "x-gateway-provider": "openai", "authorization": "Bearer sk-soak",
          "x-gateway-custom-host": f"http://127.0.0.1:{mock}/v1"}, {**chat, "max_tokens": 32}, 200, completion),
        ("embeddings", 2, "POST", "/v1/embeddings", config(target()), {"model": "soak-embed", "input": "hi"},
         200, '"embedding"'),
        # The control plane's own answers (relayed, without the gateway's trace id): told apart by body.
        ("cp_read", 2, "GET", "/v1/configs/soak-config", {}, None, 200, '"soak-config"'),
        # Writes replace one of fifty saved configs (the database stays the same size).
        ("cp_write", 1, "PUT", "/v1/configs/soak-write-#M", {}, target(), 200, '"soak-write-'),
        ("bad_json", 1, "POST", "/v1/chat/completions", config(target()), "{not json", 400, '"error"'),
        ("unknown_key", 1, "POST", "/v1/chat/completions", {**config(target()), "x-gateway-api-key": "gw-unknown"},
         chat, 401, '"error"'),
    ]


LUA = r"""
-- The soak's requests, in a weighted cycle, and each answer checked against its kind.
local kinds = %(kinds)s
local cycle = {}
for index, kind in ipairs(kinds) do
  for _ = 1, kind.weight do cycle[#cycle + 1] = index end
end
local counter = 0
local threads = {}

-- thread_id: a global each thread gets from setup.
function setup(thread)
  thread:set("thread_id", #threads)
  threads[#threads + 1] = thread
end

function init(args)
  for index = 1, #kinds do
    _G["ok_" .. index] = 0
    _G["bad_" .. index] = 0
    _G["example_" .. index] = ""
  end
  _G["unattributed"] = 0
end

function request()
  counter = counter + 1
  local index = cycle[(counter %% #cycle) + 1]
  local kind = kinds[index]
  local headers = {}
  for name, value in pairs(kind.headers) do headers[name] = value end
  headers["x-gateway-trace-id"] = "soak-" .. index .. "-" .. thread_id .. "-" .. counter
  local body = kind.body
  local path = kind.path
  if body then
    body = body:gsub("#N", thread_id .. "-" .. counter)
    headers["content-type"] = "application/json"
  end
  path = path:gsub("#M", tostring(counter %% 50))
  return wrk.format(kind.method, path, headers, body)
end

function response(status, headers, body)
  local trace = headers["x-gateway-trace-id"]
  local index = trace and tonumber(trace:match("^soak%%-(%%d+)%%-"))
  if not index then
    -- A relayed answer of the control plane's: the untraced kind whose piece its body holds.
    for candidate, kind in ipairs(kinds) do
      if kind.untraced and body:find(kind.holds, 1, true) then index = candidate end
    end
  end
  if not index then
    _G["unattributed"] = _G["unattributed"] + 1
    if _G["example_unattributed"] == nil then _G["example_unattributed"] = status .. " " .. body:sub(1, 300) end
    return
  end
  local kind = kinds[index]
  if status == kind.status and body:find(kind.holds, 1, true) then
    _G["ok_" .. index] = _G["ok_" .. index] + 1
  else
    _G["bad_" .. index] = _G["bad_" .. index] + 1
    if _G["example_" .. index] == "" then
      _G["example_" .. index] = status .. " " .. body:sub(1, 300)
    end
  end
end

function done(summary, latency, requests)
  local out = {}
  for _, thread in ipairs(threads) do
    for index = 1, #kinds do
      out["ok_" .. index] = (out["ok_" .. index] or 0) + thread:get("ok_" .. index)
      out["bad_" .. index] = (out["bad_" .. index] or 0) + thread:get("bad_" .. index)
      local example = thread:get("example_" .. index)
      if example ~= "" then out["example_" .. index] = example end
    end
    out["unattributed"] = (out["unattributed"] or 0) + thread:get("unattributed")
    local example = thread:get("example_unattributed")
    if example then out["example_unattributed"] = example end
  end
  local parts = {}
  for name, value in pairs(out) do
    parts[#parts + 1] = string.format("%%q:%%q", name, tostring(value))
  end
  io.write("SOAK-RESULT {" .. table.concat(parts, ",") .. "}\n")
end
"""


def lua_string(value):
    return json.dumps(value)  # a JSON string literal is a valid Lua string literal here (no \u escapes)


def lua_kinds(kind_list, key):
    entries = []
    for name, weight, method, path, headers, body, status, holds in kind_list:
        all_headers = {"x-gateway-api-key": key, **headers}
        lua_headers = ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in all_headers.items())
        body_text = "nil" if body is None else lua_string(body if isinstance(body, str) else json.dumps(body))
        untraced = "true" if name.startswith("cp_") else "false"
        entries.append(f"{{name = {lua_string(name)}, weight = {weight}, method = {lua_string(method)}, "
                       f"path = {lua_string(path)}, headers = {{{lua_headers}}}, body = {body_text}, "
                       f"status = {status}, holds = {lua_string(holds)}, untraced = {untraced}}}")
    return "{\n  " + ",\n  ".join(entries) + "\n}"


def settled_mb(*pids, readings=7):
    """Resident memory of each of `pids` once the load has stopped: the median of `readings`
    readings a second apart. One reading can fall anywhere between two of the control plane's
    heap trims (every 5 s); the median of seven spans one and reads what is held after it."""
    samples = []
    for reading in range(readings):
        if reading:
            time.sleep(1)
        samples.append([bench.resident_mb(pid) for pid in pids])
    return [sorted(column)[readings // 2] for column in zip(*samples)]


def run_segment(port, script, seconds, connections):
    out = subprocess.run(["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "-s", str(script),
                          f"http://127.0.0.1:{port}"], check=True, capture_output=True, text=True).stdout
    requests = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
    if not requests:
        sys.exit(f"soak: wrk sent no request in {seconds} s:\n{out}")
    errors = re.search(r"Socket errors: (.*)", out)
    result = json.loads(re.search(r"^SOAK-RESULT (.*)$", out, re.M).group(1))
    return requests, result, errors.group(1) if errors else ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, stdout=subprocess.DEVNULL)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-soak-"))
    mock_port, gateway_port, admin_port = bench.free_port(), bench.free_port(), bench.free_port()
    procs = [bench.start_envoy(mock_config(mock_port), workdir, "mock", 1)]
    control_plane_addr = f"127.0.0.1:{bench.free_port()}"
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_PORT": str(gateway_port), "GATEWAY_ADMIN_PORT": str(admin_port),
           "GATEWAY_API_KEYS": KEY, "GATEWAY_WASM": str(ROOT / "target/model_gateway.wasm"),
           "GATEWAY_CONTROL_PLANE_ADDR": control_plane_addr, "GATEWAY_CONTROL_PLANE_TOKEN": bench.CONTROL_PLANE_TOKEN,
           "GATEWAY_ACCESS_LOG": "off"}
    control_plane = subprocess.Popen(
        [str(bench.CONTROL_PLANE)], stdout=open(workdir / "control-plane.log", "wb"), stderr=subprocess.STDOUT,
        env={**env, "GATEWAY_STATE_DIR": str(workdir / "state")}, start_new_session=True)
    gateway = bench.start_envoy(bench.rendered(env), workdir, "gateway", 1)
    procs += [gateway, control_plane]
    try:
        target = {"provider": "openai", "api_key": "sk-soak", "custom_host": f"http://127.0.0.1:{mock_port}/v1"}
        bench.store(gateway_port, "/v1/configs/soak-config", target)
        limited_key = bench.store(gateway_port, "/v1/api-keys", {"workspace": "soak-limited"}, method="POST")["key"]
        bench.store(gateway_port, "/v1/prices/soak-model", {"input_per_million": 1, "output_per_million": 2},
                    key=limited_key)
        bench.store(gateway_port, "/v1/limits/soak-limits", {"workspace": "soak-limited", "requests_per_minute": 10**9,
                                                             "tokens_per_minute": 10**9, "budget_usd": 10**9,
                                                             "budget_period": "total"})
        kind_list = kinds(mock_port, limited_key)
        script = workdir / "soak.lua"
        script.write_text(LUA % {"kinds": lua_kinds(kind_list, KEY)})
        # A short first segment measures the rate; each tenth then runs for as long as the rate
        # measured in the tenth before needs for its share of the requests still to send (the
        # rate falls as the control plane's database grows).
        calibration, _, _ = run_segment(gateway_port, script, 5, args.connections)
        rate = max(calibration / 5, 1)
        started = time.time()
        total, wrong, unattributed, socket_errors, unattributed_example = 0, {}, 0, [], ""

        answered = {name: 0 for name, *_ in kind_list}
        memory = []
        for tenth in range(10):
            seconds = max(int((args.requests - total) / (10 - tenth) / rate), 1)
            segment_started = time.time()
            requests, result, errors = run_segment(gateway_port, script, seconds, args.connections)
            rate = max(requests / max(time.time() - segment_started, 1), 1)
            total += requests
            for index, (name, *_rest) in enumerate(kind_list, start=1):
                answered[name] += int(result.get(f"ok_{index}", 0))
                bad = int(result.get(f"bad_{index}", 0))
                if bad:
                    example = result.get(f"example_{index}", "")
                    entry = wrong.setdefault(name, [0, example])
                    entry[0] += bad
                    # Said as it happens: a run stopped early still tells what went wrong.
                    print(f"soak: tenth {tenth + 1}: {bad} wrong {name}, e.g.: {example}", file=sys.stderr, flush=True)
            unattributed += int(result.get("unattributed", 0))
            unattributed_example = unattributed_example or result.get("example_unattributed", "")
            if errors:
                socket_errors.append(f"tenth {tenth + 1}: {errors}")
            memory.append((total, *settled_mb(gateway.pid, control_plane.pid)))
            print(f"soak: tenth {tenth + 1}: {total:,} requests, Envoy {memory[-1][1]:.1f} MB, "
                  f"control plane {memory[-1][2]:.1f} MB, wrong so far {sum(w[0] for w in wrong.values())}",
                  file=sys.stderr, flush=True)
        duration = time.time() - started
        log = (workdir / "gateway.log").read_text(errors="replace")
        panics = len(re.findall(r"panicked|Plugin .* failed|VM failed|wasm trap", log))
        print(f"\n{total:,} requests in {duration:.0f} s ({total / duration:,.0f}/s), wrk {args.connections} "
              f"connections, Envoy --concurrency 1, {len(kind_list)} kinds of request\n")
        print("| tenth | requests so far | Envoy RSS (MB) | control plane RSS (MB) |\n|---|---|---|---|")
        for tenth, (count, envoy_mb, cp_mb) in enumerate(memory, start=1):
            print(f"| {tenth} | {count:,} | {envoy_mb:.1f} | {cp_mb:.1f} |")
        print("\n| kind | answered as expected | wrong |\n|---|---|---|")
        for name, *_ in kind_list:
            print(f"| {name} | {answered[name]:,} | {wrong.get(name, [0])[0]:,} |")
        print(f"\nanswers without the kind's trace id: {unattributed}; socket errors: {socket_errors or 'none'}; "
              f"panics or VM reloads in Envoy's log: {panics}")
        if unattributed:
            print(f"an answer without a kind, e.g.: {unattributed_example}")
        for name, (count, example) in wrong.items():
            print(f"wrong {name} ({count}), e.g.: {example}")
        grew = {who: memory[-1][i] / memory[1][i] - 1 for who, i in (("Envoy", 1), ("control plane", 2))}
        print("memory, last tenth against the second: " + ", ".join(f"{w} {g:+.1%}" for w, g in grew.items()))
        failed = wrong or unattributed or panics or any(g > 0.05 for g in grew.values())
        sys.exit(1 if failed else 0)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
