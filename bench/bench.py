#!/usr/bin/env python3
"""Benchmark: bare Envoy against Envoy with the gateway filter, in one run, same machine.

Both proxy a non-streaming chat completion to the same fast mock provider (a third Envoy
answering with a fixed chat.completion), driven by wrk at each concurrency, and so does the
gateway's config with a minimal filter (bench/minimal-filter) in place of ours. The gateway is
measured with provider headers, with a one-target config (uncached), with a fallback
config, and with the one-target config plus `cache` where the same request repeats, so
every measured request is a cache hit (no provider call), and with a saved config naming a
stored provider (`@slug`), both read from the control plane once and then from the filter's
cache. Prints markdown tables of
requests per second and p50/p99 latency, and of the proxy's CPU time per request for bare
Envoy, the minimal filter and the gateway filter; copy them into bench/README.md.
Run it with `./build.sh bench [--duration S] [--connections 16,64]`.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENVOY = ROOT / ".venv/bin/envoy"
MINIMAL_WASM = ROOT / "target/minimal_filter.wasm"  # built by `./build.sh bench`
CONTROL_PLANE = ROOT / "target/control-plane/gateway-control-plane"  # built by `./build.sh`
NATIVE_MODULE = ROOT / "target/libmodel_gateway.so"  # built by `./build.sh bench`
NATIVE_FLOOR = ROOT / "target/libnative_floor.so"  # built by `./build.sh bench` (bench/native-floor)
CONTROL_PLANE_TOKEN = "cp-bench-token"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
API_KEY = "gw-bench-key"

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the mock."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
})
REQUEST = json.dumps({"model": "bench-model", "messages": [
    {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]})
CHAT = ("/v1/chat/completions", REQUEST)
# An MCP tools/call (2026-07-28: one stateless POST) and its server's answer.
TOOL_CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "lookup", "arguments": {"key": "bench"}}})
TOOL_RESULT = json.dumps({"jsonrpc": "2.0", "id": 1,
                          "result": {"content": [{"type": "text", "text": "the value"}], "isError": False}})
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "lookup"}

MOCK = """
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %(port)d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: mock
          route_config:
            virtual_hosts:
            - name: mock
              domains: ["*"]
              routes:
              # An MCP server's answer to a tools/call (the MCP variants' server).
              - match: {prefix: "/mcp"}
                direct_response: {status: 200, body: {inline_string: %(mcp_body)s}}
                response_headers_to_add: [{header: {key: content-type, value: application/json}}]
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: %(body)s}}
                response_headers_to_add: [{header: {key: content-type, value: application/json}}]
          # Reading the whole request before the direct response keeps connections alive.
          http_filters:
          - name: envoy.filters.http.buffer
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 1048576
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
"""

# The same listener as the gateway's, without the filter, routing straight to the mock.
BARE = """
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %(port)d}}
    per_connection_buffer_limit_bytes: 20971520
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bare
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: bare
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: mock, timeout: 0s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
  clusters:
  - name: mock
    connect_timeout: 10s
    load_assignment:
      cluster_name: mock
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %(mock_port)d}}}
"""

# A mesh's shape (the host's own clusters, as Istio writes them: `outbound|{port}||{host}`, routes
# matching the route header; no dynamic forward proxy, no internal listener): the mock and the
# control plane are its hosts. `%(filters)s` is the filter before the router (none for
# `mesh_bare`, whose request matches the catch-all route `%(catch_all)s` adds).
MESH = """
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %(port)d}}
    per_connection_buffer_limit_bytes: 20971520
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: mesh
          route_config:
            virtual_hosts:
            - name: mesh
              domains: ["*"]
              routes:
              - match:
                  prefix: "/"
                  headers: [{name: x-gateway-upstream-cluster, string_match: {exact: "outbound|%(mock_port)d||127.0.0.1"}}]
                request_headers_to_remove: [x-gateway-upstream-cluster]
                route: {cluster: "outbound|%(mock_port)d||127.0.0.1", timeout: 0s}
%(catch_all)s
          http_filters:
%(filters)s
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
  clusters:
  - name: "outbound|%(mock_port)d||127.0.0.1"
    connect_timeout: 10s
    load_assignment:
      cluster_name: "outbound|%(mock_port)d||127.0.0.1"
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %(mock_port)d}}}
  - name: "outbound|%(control_plane_port)d||127.0.0.1"
    connect_timeout: 10s
    load_assignment:
      cluster_name: "outbound|%(control_plane_port)d||127.0.0.1"
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %(control_plane_port)d}}}
"""
MESH_CATCH_ALL = """\
              - match: {prefix: "/"}
                route: {cluster: "outbound|%(mock_port)d||127.0.0.1", timeout: 0s}"""
# The gateway's filter in the mesh, as docs/deployment.md configures it in an Envoy another
# control plane writes (`%(configuration)s`: its plugin configuration, a JSON string).
MESH_WASM = """\
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: model_gateway
                root_id: model_gateway
                failure_policy: FAIL_RELOAD
                allow_on_headers_stop_iteration: true
                configuration: {"@type": type.googleapis.com/google.protobuf.StringValue, value: %(configuration)s}
                vm_config:
                  vm_id: model_gateway
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: %(module)s}}"""
MESH_NATIVE = """\
          - name: envoy.filters.http.dynamic_modules
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {module: {local: {filename: %(module)s}}}
              filter_name: model_gateway
              filter_config: {"@type": type.googleapis.com/google.protobuf.StringValue, value: %(configuration)s}"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = %(body)s
wrk.headers["content-type"] = "application/json"
%(headers)s
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_cpus(command, cpus):
    """`command`, run on the cores `cpus` only (None: on any)."""
    return ["taskset", "--cpu-list", cpus, *command] if cpus else command


def start_envoy(config_text, workdir, name, concurrency, cpus=None):
    path = workdir / f"{name}.yaml"
    path.write_text(config_text)
    log = open(workdir / f"{name}.log", "w")
    return subprocess.Popen(
        on_cpus([str(ENVOY), "-c", str(path), "--concurrency", str(concurrency), "--disable-hot-restart",
                 "--log-level", "error"], cpus),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port, headers, body, path="/v1/chat/completions"):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body.encode(),
                                         headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"bench: port {port} never answered 200")


def store(port, path, body, timeout=60, method="PUT", key=API_KEY):
    """PUTs (or ``method``s) ``body`` to the control plane through the gateway's listener (waiting for it
    to start); its JSON answer."""
    deadline = time.time() + timeout
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                         method=method, headers={"x-gateway-api-key": key,
                                                                 "content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return json.loads(resp.read() or b"null")
        except OSError as e:  # HTTPError included: the control plane may still be starting
            if time.time() > deadline:
                sys.exit(f"bench: {method} {path} failed: {e}")
            time.sleep(0.2)


def cache_status(port, headers, body):
    """The x-gateway-cache-status of one request (to check the cache variant really hits)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                 headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.headers.get("x-gateway-cache-status")


def cpu_seconds(pid):
    """User plus system CPU time of process `pid` (all its threads) so far, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the parenthesised command name (which may hold spaces): utime, stime are 14, 15.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rendered(env):
    """The gateway's Envoy config as `envoy/render.py` makes it for the GATEWAY_* settings in `env`."""
    return subprocess.run([sys.executable, str(ROOT / "envoy/render.py")], env=env, check=True, capture_output=True,
                          text=True).stdout


def with_plugin_configuration(config, value, gate_value=None):
    """The rendered gateway config with the filter's plugin configuration set to `value`, and the
    lookup gate's (which only upload routes create; it comes first in the chain) to `gate_value`,
    by default `value` too."""
    pattern = r'^(\s+value: )".*"$'
    count = len(re.findall(pattern, config, flags=re.M))
    if count not in (1, 2):
        sys.exit(f"bench: expected one or two plugin configurations in the rendered config, found {count}")
    values = iter([value] if count == 1 else [gate_value or value, value])
    return re.sub(pattern, lambda m: m.group(1) + json.dumps(next(values)), config, flags=re.M)


def to_micros(text):
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1, "ms": 1000, "s": 1_000_000}[unit]


def resident_mb(pid):
    """Resident memory of process `pid` now, in MB (VmRSS of /proc/<pid>/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def run_wrk(port, headers, connections, duration, workdir, pid=None, control_plane_pid=None, cpus=None,
            request=CHAT):
    """One wrk run of `request` (path, body); with `pid`, also the CPU time that process spent per
    request served and its resident memory after the run; with `control_plane_pid`, the control
    plane's CPU per request too (on a shared machine it competes with the proxy for the same
    cores)."""
    path, body = request
    script = workdir / "request.lua"
    script.write_text(WRK_SCRIPT % {
        "body": json.dumps(body),
        "headers": "\n".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()),
    })
    cpu_before = cpu_seconds(pid) if pid else None
    control_plane_before = cpu_seconds(control_plane_pid) if control_plane_pid else None
    out = subprocess.run(
        on_cpus(["wrk", "-t", str(min(2, connections)), "-c", str(connections), "-d", f"{duration}s", "--latency",
                 "-s", str(script), f"http://127.0.0.1:{port}{path}"], cpus),
        check=True, capture_output=True, text=True).stdout
    cpu_after = cpu_seconds(pid) if pid else None
    control_plane_after = cpu_seconds(control_plane_pid) if control_plane_pid else None
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non_2xx:
        sys.exit(f"bench: {non_2xx.group(1)} failed responses on port {port}:\n{out}")
    requests = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
    return {
        "requests": requests,
        "cpu_us": (cpu_after - cpu_before) * 1e6 / requests if pid and requests else None,
        "control_plane_us": (control_plane_after - control_plane_before) * 1e6 / requests
        if control_plane_pid and requests else None,
        "rss_mb": resident_mb(pid) if pid else None,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": to_micros(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),
        "p99": to_micros(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),
    }


def median_run(runs):
    """Each figure's median over `runs` (one run: itself)."""
    return {key: None if runs[0][key] is None else statistics.median(run[key] for run in runs) for key in runs[0]}


def paired_difference(runs, base, other):
    """`other`'s proxy CPU per request less `base`'s, turn by turn, and its estimate with the run's
    place in the turn taken out. Each turn's two runs ran back to back, so their difference is
    freer of the machine's drift than two medians' is; but the run later in a turn measures
    differently (a follower pays for its predecessor's leftovers, e.g. the control plane still
    taking the records of the run before). Every other turn runs the variants in reverse, so the
    mean of the two orders' median differences cancels that place's effect (a crossover design).
    Returns that estimate, the place's effect, and each turn's difference as text, in turn order."""
    differences = [o["cpu_us"] - b["cpu_us"] for b, o in zip(runs[base], runs[other])]
    # Even turns ran the variants in their listed order (`runs` keeps it), odd ones in reverse.
    in_order, reversed_ = differences[0::2], differences[1::2]
    if not reversed_:
        return differences[0], 0.0, f"{differences[0]:+.0f}"
    estimate = (statistics.median(in_order) + statistics.median(reversed_)) / 2
    other_later = list(runs).index(other) > list(runs).index(base)
    place = (statistics.median(in_order) - statistics.median(reversed_)) / 2 * (1 if other_later else -1)
    return estimate, place, ", ".join(f"{d:+.0f}" for d in differences)


def targets(runs):
    """Issue 48's targets in one run at one connection count (`runs`: each variant's medians), as
    (what, the measured figure, its limit, whether it is met, the figure as text): each build's
    CPU per request over its hold floor as a ratio to bare Envoy's CPU per request (B), the
    control plane's CPU per recorded request over B, a cache hit's throughput against bare Envoy's
    and the pass floor's, and the proxy's memory over bare Envoy's. Only the targets whose
    variants were measured."""
    found = []
    if "bare" not in runs:
        return found
    bare = runs["bare"]["cpu_us"]
    for name, floor, limit in (("native", "native_floor_hold", 0.4), ("native_limited", "native_floor_hold", 0.5),
                               ("gateway", "floor_hold", 0.75), ("limited", "floor_hold", 0.75)):
        if name in runs and floor in runs:
            over = runs[name]["cpu_us"] - runs[floor]["cpu_us"]
            found.append((f"{name}: CPU over {floor} / B", over / bare, f"≤ {limit}", over / bare <= limit,
                          f"{over:.1f} µs / {bare:.1f} µs"))
    for name in ("gateway", "native", "limited", "native_limited"):
        if name in runs and runs[name]["control_plane_us"] is not None:
            spent = runs[name]["control_plane_us"]
            found.append((f"{name}: control plane CPU per record / B", spent / bare, "≤ 0.3", spent / bare <= 0.3,
                          f"{spent:.1f} µs"))
    for name, other, limit in (("native_cache_hit", "bare", 1.0), ("cache_hit", "floor_pass", 1.0)):
        if name in runs and other in runs:
            kept = runs[name]["rps"] / runs[other]["rps"]
            found.append((f"{name}: req/s of {other}'s", kept, f"≥ {limit}", kept >= limit,
                          f"{runs[name]['rps']:.0f} / {runs[other]['rps']:.0f}"))
    for name, limit in (("gateway", 40), ("native", 15)):
        if name in runs:
            more = runs[name]["rss_mb"] - runs["bare"]["rss_mb"]
            found.append((f"{name}: resident MB over bare Envoy's", more, f"≤ {limit}", more <= limit,
                          f"{runs[name]['rss_mb']:.0f} MB / {runs['bare']['rss_mb']:.0f} MB"))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=15)
    parser.add_argument("--connections", default="16,64")
    parser.add_argument("--concurrency", type=int, default=1, help="Envoy worker threads of each proxy")
    parser.add_argument("--repeat", type=int, default=1, help="measured runs per variant, taken in turn (variant "
                        "after variant, N times); the tables give each figure's median, which a machine shared with "
                        "other work needs")
    parser.add_argument("--compare-wasm", type=Path, help="another build of the filter (e.g. an earlier commit's), "
                        "measured in the same run under the same config, for before/after figures")
    parser.add_argument("--compare-native", type=Path, help="another build of the native module, measured in the same "
                        "run as `compare_native` (provider headers)")
    parser.add_argument("--compare-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a GATEWAY_* setting of the config of the --compare-wasm and --compare-native "
                        "proxies only (repeatable), e.g. GATEWAY_ACCESS_LOG=off for a build from before the access "
                        "log, or GATEWAY_CONTROL_PLANE_ADDR= for what shipping the records costs")
    parser.add_argument("--variants", help="measure only these variants (comma-separated, e.g. uncached,guardrail; "
                        "names: bare, floor_pass, floor_hold, native_floor_pass, native_floor_hold, native_floor_edit, mesh_bare, mesh_gateway, "
                        "mesh_native, gateway, uncached, saved, fallback, cache_hit, guardrail, compare, "
                        "compare_uncached, compare_guardrail: the last three through --compare-wasm; native, native_uncached, "
                        "native_cache_hit, native_guardrail, native_keyed, native_limited, bare_mcp, mcp, native_mcp, "
                        "compare_native (through "
                        "--compare-native)); "
                        "tables whose variants were not measured are left out")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="the control plane's database: its own SQLite file (the default), or a PostgreSQL server "
                        "(Debian's, started for the run on loopback, as the tests start it); only the control plane's "
                        "own CPU is counted, not the server's")
    parser.add_argument("--targets-json", type=Path, help="also write issue 48's targets (the table 'Targets') to "
                        "this file as JSON: a list of {connections, target, value, limit, met}")
    parser.add_argument("--pin", action="store_true", help="the proxies on the last core, the load (wrk, the mock "
                        "provider, the control plane) on the others: a proxy's CPU per request then does not depend on "
                        "which work the scheduler put next to it, run by run (throughput and latency are then the "
                        "load's; needs 2 cores or more)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.pin and cores < 2:
        sys.exit("bench: --pin needs 2 cores or more")
    proxy_cpus, load_cpus = (str(cores - 1), f"0-{cores - 2}") if args.pin else (None, None)
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, stdout=subprocess.DEVNULL)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    if not MINIMAL_WASM.exists():
        sys.exit(f"bench: {MINIMAL_WASM} is missing: run the benchmark with ./build.sh bench, which builds it")
    mock_port, bare_port, gateway_port = free_port(), free_port(), free_port()
    procs = [start_envoy(MOCK % {"port": mock_port, "body": json.dumps(COMPLETION), "mcp_body": json.dumps(TOOL_RESULT)},
                         workdir, "mock", 1, load_cpus)]
    procs.append(start_envoy(BARE % {"port": bare_port, "mock_port": mock_port}, workdir, "bare", args.concurrency,
                             proxy_cpus))
    env = {**os.environ, "GATEWAY_PORT": str(gateway_port), "GATEWAY_ADMIN_PORT": str(free_port()),
           "GATEWAY_API_KEYS": API_KEY, "GATEWAY_WASM": str(ROOT / "target/model_gateway.wasm"),
           "GATEWAY_MCP_SERVERS": json.dumps({"bench": {"url": f"http://127.0.0.1:{mock_port}/mcp"}})}
    # The gateway's control plane, for the saved-config variant (its CPU is not the proxy's).
    control_plane_addr = f"127.0.0.1:{free_port()}"
    database = contextlib.ExitStack()
    database_env = {}
    if args.database == "postgres":
        sys.path.insert(0, str(ROOT / "tests/e2e"))
        from pg_server import running_postgres
        postgres = database.enter_context(running_postgres(workdir / "postgres.log"))
        database_env["GATEWAY_DATABASE_URL"] = postgres.database("bench")
        if load_cpus:  # the server's processes (and the backends they fork) with the load
            for pid in subprocess.run(["pgrep", "-g", str(os.getpgid(postgres.proc.pid))], capture_output=True,
                                      text=True).stdout.split():
                subprocess.run(["taskset", "-a", "-p", "-c", load_cpus, pid], capture_output=True)
    control_plane = subprocess.Popen(
        on_cpus([str(CONTROL_PLANE)], load_cpus), stdout=open(workdir / "control-plane.log", "wb"),
        stderr=subprocess.STDOUT,
        env={**env, "GATEWAY_CONTROL_PLANE_ADDR": control_plane_addr, "GATEWAY_STATE_DIR": str(workdir / "state"),
             "GATEWAY_CONTROL_PLANE_TOKEN": CONTROL_PLANE_TOKEN, **database_env}, start_new_session=True)
    env = {**env, "GATEWAY_CONTROL_PLANE_ADDR": control_plane_addr, "GATEWAY_CONTROL_PLANE_TOKEN": CONTROL_PLANE_TOKEN}
    config = rendered(env)
    procs.append(start_envoy(config, workdir, "gateway", args.concurrency, proxy_cpus))
    procs.append(control_plane)
    pids = {bare_port: procs[1].pid, gateway_port: procs[2].pid}

    def measured_proxy(port, config, name):
        """Starts a proxy under test on `port` (its CPU is counted per run); its port."""
        procs.append(start_envoy(config, workdir, name, args.concurrency, proxy_cpus))
        pids[port] = procs[-1].pid
        return port

    def floor(name, mode, host_env, gate_mode=None):
        """An Envoy with the same template, listener and clusters as the gateway's, running a floor
        module (bench/README.md, The floors) in `mode` (pass, hold, edit) on the host `host_env` names,
        and in `gate_mode` (by default `mode`) where the gateway's lookup gate is; its port. Its
        configuration is the mode and the mock's authority, which it sets on every request with
        the cluster."""
        port = free_port()
        floor_env = {**env, "GATEWAY_PORT": str(port), "GATEWAY_ADMIN_PORT": str(free_port()),
                     "GATEWAY_ACCESS_LOG": "off", **host_env}
        mock = f"127.0.0.1:{mock_port}"
        configured = with_plugin_configuration(rendered(floor_env), f"{mode} {mock}", f"{gate_mode or mode} {mock}")
        return measured_proxy(port, configured, name)

    control_plane_port = int(control_plane_addr.split(":")[1])
    native_floor = {"GATEWAY_HOST": "native", "GATEWAY_NATIVE_MODULE": str(NATIVE_FLOOR)}
    floor_ports = {"floor_pass": floor("floor_pass", "pass", {"GATEWAY_WASM": str(MINIMAL_WASM)}),
                   "floor_hold": floor("floor_hold", "hold", {"GATEWAY_WASM": str(MINIMAL_WASM)}),
                   "native_floor_pass": floor("native_floor_pass", "pass", native_floor),
                   "native_floor_hold": floor("native_floor_hold", "hold", native_floor),
                   # The gateway's calls into Envoy without its logic, made once (the lookup gate's
                   # place holds, as in the hold floor), with the access log the native variant
                   # writes (the record it leaves is what the log writes).
                   "native_floor_edit": floor("native_floor_edit", "edit",
                                              {**native_floor, "GATEWAY_ACCESS_LOG": env.get("GATEWAY_ACCESS_LOG", "")},
                                              gate_mode="hold")}

    def mesh(name, filters="", configuration=None, module=None):
        """An Envoy in a mesh's shape (`MESH`) with `filters` (a template of MESH_WASM or MESH_NATIVE,
        given the plugin `configuration` and the `module`), none for bare; its port."""
        port = free_port()
        filter_text = filters % {"configuration": json.dumps(json.dumps(configuration)), "module": json.dumps(str(module))}
        config = MESH % {"port": port, "mock_port": mock_port, "control_plane_port": control_plane_port,
                         "filters": filter_text, "catch_all": "" if filters else MESH_CATCH_ALL % {"mock_port": mock_port}}
        return measured_proxy(port, config, name)

    # The gateway in the mesh, as docs/deployment.md sets it up there: `upstream` names the host's
    # clusters, the control plane is a host too.
    mesh_plugin = {"api_keys": [API_KEY], "upstream": {"cluster": "outbound|{port}||{host}"},
                   "control_plane": {"cluster": f"outbound|{control_plane_port}||127.0.0.1",
                                     "authority": control_plane_addr, "token": CONTROL_PLANE_TOKEN}}
    mesh_ports = {"mesh_bare": mesh("mesh_bare"),
                  "mesh_gateway": mesh("mesh_gateway", MESH_WASM, mesh_plugin, ROOT / "target/model_gateway.wasm"),
                  "mesh_native": mesh("mesh_native", MESH_NATIVE, mesh_plugin, NATIVE_MODULE)}
    # The same gateway as the native module (GATEWAY_HOST=native), with the same control plane,
    # as `GATEWAY_HOST=native ./build.sh run` starts it.
    native_port = free_port()
    native_env = {**env, "GATEWAY_PORT": str(native_port), "GATEWAY_ADMIN_PORT": str(free_port()),
                  "GATEWAY_HOST": "native", "GATEWAY_NATIVE_MODULE": str(NATIVE_MODULE)}
    measured_proxy(native_port, rendered(native_env), "native")
    compare_settings = dict(setting.split("=", 1) for setting in args.compare_env)
    compare_native_port = None
    if args.compare_native:
        compare_native_port = free_port()
        compare_native_env = {**native_env, "GATEWAY_PORT": str(compare_native_port),
                              "GATEWAY_ADMIN_PORT": str(free_port()),
                              "GATEWAY_NATIVE_MODULE": str(args.compare_native.resolve()), **compare_settings}
        measured_proxy(compare_native_port, rendered(compare_native_env), "compare-native")
    compare_port = None
    if args.compare_wasm:
        compare_port = free_port()
        compare_env = {**env, "GATEWAY_PORT": str(compare_port), "GATEWAY_ADMIN_PORT": str(free_port()),
                       "GATEWAY_WASM": str(args.compare_wasm.resolve()), **compare_settings}
        measured_proxy(compare_port, rendered(compare_env), "compare")
    gateway_headers = {
        "x-gateway-api-key": API_KEY, "x-gateway-provider": "openai", "authorization": "Bearer sk-bench",
        "x-gateway-custom-host": f"http://127.0.0.1:{mock_port}/v1", "content-type": "application/json",
    }
    # The same provider as a one-target config and as a fallback whose first target is
    # healthy: the difference is what planning a fallback costs on the happy path.
    target = {"provider": "openai", "api_key": "sk-bench", "custom_host": f"http://127.0.0.1:{mock_port}/v1"}
    uncached_headers = {"x-gateway-api-key": API_KEY, "content-type": "application/json",
                        "x-gateway-config": json.dumps(target)}
    fallback_headers = {**uncached_headers, "x-gateway-config": json.dumps(
        {"strategy": {"mode": "fallback"}, "targets": [target, {**target, "api_key": "sk-bench-2"}]})}
    # The same one-target config with the cache on: wrk repeats one request, so after the
    # first (a miss, stored) every request is answered from the cache.
    cache_hit_headers = {**uncached_headers, "x-gateway-config": json.dumps({**target, "cache": {"mode": "simple"}})}
    # The same one-target config with one inline input guardrail that passes (the prompt
    # names no password; its verdict is added to the answer as `hook_results`).
    guardrail = {"default.regexMatch": {"rule": "\\b(password|ssn)\\b", "not": True}, "deny": True}
    guardrail_headers = {**uncached_headers,
                         "x-gateway-config": json.dumps({**target, "input_guardrails": [guardrail]})}
    # The same target stored in the control plane, named by a saved config.
    saved_headers = {"x-gateway-api-key": API_KEY, "content-type": "application/json",
                     "x-gateway-config": "bench-config"}
    # The provider-header request with a key of the control plane's, in a workspace without limits
    # and in one with a rate limit and a budget in force (too large to refuse anything): the
    # difference is what the limits cost a request.
    try:
        wait_ready(bare_port, {"content-type": "application/json"}, REQUEST)
        store(gateway_port, "/v1/providers/bench-provider", target)
        store(gateway_port, "/v1/configs/bench-config", {"provider": "@bench-provider"})
        wait_ready(gateway_port, saved_headers, REQUEST)
        keyed_key = store(gateway_port, "/v1/api-keys", {"workspace": "bench-keyed"}, method="POST")["key"]
        limited_key = store(gateway_port, "/v1/api-keys", {"workspace": "bench-limited"}, method="POST")["key"]
        # Both workspaces price the model (every priced request counts its cost): the variants
        # differ only in the limits.
        for key in (keyed_key, limited_key):
            store(gateway_port, "/v1/prices/bench-model", {"input_per_million": 1, "output_per_million": 2,
                                                           "max_output_tokens": 4096}, key=key)
        store(gateway_port, "/v1/limits/bench-limits", {"workspace": "bench-limited", "requests_per_minute": 10**9,
                                                        "budget_usd": 10**9, "budget_period": "total"})
        keyed_headers = {**gateway_headers, "x-gateway-api-key": keyed_key}
        mcp_headers = {**MCP_HEADERS, "authorization": f"Bearer {API_KEY}"}
        limited_headers = {**gateway_headers, "x-gateway-api-key": limited_key}
        wait_ready(gateway_port, keyed_headers, REQUEST)
        wait_ready(gateway_port, limited_headers, REQUEST)
        wait_ready(gateway_port, gateway_headers, REQUEST)
        for port in (*floor_ports.values(), *mesh_ports.values()):
            wait_ready(port, gateway_headers, REQUEST)
        if compare_port:
            wait_ready(compare_port, gateway_headers, REQUEST)
        if compare_native_port:
            wait_ready(compare_native_port, gateway_headers, REQUEST)
        wait_ready(gateway_port, fallback_headers, REQUEST)
        wait_ready(gateway_port, cache_hit_headers, REQUEST)
        wait_ready(gateway_port, guardrail_headers, REQUEST)
        wait_ready(native_port, gateway_headers, REQUEST)
        wait_ready(native_port, keyed_headers, REQUEST)
        wait_ready(native_port, limited_headers, REQUEST)
        wait_ready(native_port, cache_hit_headers, REQUEST)
        wait_ready(native_port, guardrail_headers, REQUEST)
        for port, headers in ((bare_port, MCP_HEADERS), (gateway_port, mcp_headers), (native_port, mcp_headers)):
            wait_ready(port, headers, TOOL_CALL, "/mcp/bench" if port != bare_port else "/mcp")
        if cache_status(floor_ports["native_floor_edit"], gateway_headers, REQUEST) != "DISABLED":
            sys.exit("bench: the native edit floor does not add the gateway's answer headers")
        for port in (gateway_port, native_port):
            status = cache_status(port, cache_hit_headers, REQUEST)
            if status != "HIT":
                sys.exit(f"bench: the cache variant is not answered from the cache (x-gateway-cache-status: {status})")
        rows = []
        turns = {}  # connections -> variant -> its runs, one per turn
        for connections in [int(c) for c in args.connections.split(",")]:
            # Warm each, then measure them back to back.
            # The floors get the gateway's request (same bytes for Envoy to parse), and so does
            # bare Envoy in the mesh.
            variants = (("bare", bare_port, {}),
                        *((name, port, gateway_headers) for name, port in floor_ports.items()),
                        *((name, port, gateway_headers) for name, port in mesh_ports.items()),
                        ("gateway", gateway_port, gateway_headers),
                        ("uncached", gateway_port, uncached_headers), ("saved", gateway_port, saved_headers),
                        ("fallback", gateway_port, fallback_headers), ("cache_hit", gateway_port, cache_hit_headers),
                        ("guardrail", gateway_port, guardrail_headers), ("keyed", gateway_port, keyed_headers),
                        ("limited", gateway_port, limited_headers), ("native", native_port, gateway_headers),
                        ("native_uncached", native_port, uncached_headers),
                        ("native_cache_hit", native_port, cache_hit_headers),
                        ("native_guardrail", native_port, guardrail_headers),
                        ("native_keyed", native_port, keyed_headers), ("native_limited", native_port, limited_headers),
                        ("bare_mcp", bare_port, MCP_HEADERS, ("/mcp", TOOL_CALL)),
                        ("mcp", gateway_port, mcp_headers, ("/mcp/bench", TOOL_CALL)),
                        ("native_mcp", native_port, mcp_headers, ("/mcp/bench", TOOL_CALL)))
            if compare_native_port:
                variants += (("compare_native", compare_native_port, gateway_headers),)
            if compare_port:
                variants += (("compare", compare_port, gateway_headers),
                             ("compare_uncached", compare_port, uncached_headers),
                             ("compare_guardrail", compare_port, guardrail_headers))
            if args.variants:
                wanted = args.variants.split(",")
                variants = tuple(v for v in variants if v[0] in wanted)
            for _, port, headers, *request in variants:
                run_wrk(port, headers, connections, 2, workdir, cpus=load_cpus, request=(request or [CHAT])[0])
            runs = {name: [] for name, *_ in variants}
            for turn in range(args.repeat):
                # The variant run later in a turn measures differently from the first (see
                # paired_difference): every other turn runs them in reverse order.
                for name, port, headers, *request in variants if turn % 2 == 0 else variants[::-1]:
                    runs[name].append(run_wrk(port, headers, connections, args.duration, workdir, pids[port],
                                                 control_plane.pid, load_cpus, (request or [CHAT])[0]))
            rows.append((connections, {name: median_run(measured) for name, measured in runs.items()}))
            turns[connections] = runs
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        database.close()
        # Each run's logs and control-plane database take up to gigabytes: a machine that runs
        # benchmarks often would fill its disk.
        shutil.rmtree(workdir, ignore_errors=True)
    repeated = (f", median of {args.repeat} runs taken in turn (every other turn in reverse order)"
                if args.repeat > 1 else "")
    print(f"wrk (2 threads), {args.duration}s per run{repeated}, Envoy --concurrency {args.concurrency}, "
          f"{os.cpu_count()} cores, non-streaming chat completion, the control plane on {args.database}\n")
    names = {"bare": "bare Envoy", "floor_pass": "Envoy + wasm floor, pass (minimal filter)",
             "floor_hold": "Envoy + wasm floor, hold", "native_floor_pass": "Envoy + native floor, pass",
             "native_floor_hold": "Envoy + native floor, hold",
             "native_floor_edit": "Envoy + native floor, the gateway's calls into Envoy",
             "mesh_bare": "mesh config: bare Envoy",
             "mesh_gateway": "mesh config: Envoy + filter (provider headers)",
             "mesh_native": "mesh config: Envoy + native module (provider headers)",
             "gateway": "Envoy + filter (provider headers)",
             "uncached": "Envoy + filter, one-target config (uncached)", "fallback": "Envoy + filter, fallback config",
             "cache_hit": "Envoy + filter, one-target config, cache hit",
             "guardrail": "Envoy + filter, one-target config, input regexMatch guardrail",
             "saved": "Envoy + filter, saved config naming an @slug",
             "keyed": "Envoy + filter, a control-plane key (provider headers)",
             "limited": "Envoy + filter, a control-plane key under a rate limit and a budget",
             "native": "Envoy + native module (provider headers)",
             "native_uncached": "Envoy + native module, one-target config (uncached)",
             "native_cache_hit": "Envoy + native module, one-target config, cache hit",
             "native_guardrail": "Envoy + native module, one-target config, input regexMatch guardrail",
             "native_keyed": "Envoy + native module, a control-plane key (provider headers)",
             "native_limited": "Envoy + native module, a control-plane key under a rate limit and a budget",
             "bare_mcp": "bare Envoy, an MCP tools/call", "mcp": "Envoy + filter, an MCP tools/call (/mcp/{server})",
             "native_mcp": "Envoy + native module, an MCP tools/call (/mcp/{server})",
             "compare_native": f"Envoy + {args.compare_native} (provider headers)",
             "compare": f"Envoy + {args.compare_wasm} (provider headers)",
             "compare_uncached": f"Envoy + {args.compare_wasm}, one-target config (uncached)",
             "compare_guardrail": f"Envoy + {args.compare_wasm}, one-target config, input regexMatch guardrail"}
    measured = set(rows[0][1]) if rows else set()
    print("| connections | proxy | req/s | p50 µs | p99 µs | proxy CPU µs/req | control plane CPU µs/req "
          "| proxy resident MB |")
    print("|---|---|---|---|---|---|---|---|")
    for connections, runs in rows:
        for key, r in runs.items():
            print(f"| {connections} | {names[key]} | {r['rps']:.0f} | {r['p50']:.0f} | {r['p99']:.0f} "
                  f"| {r['cpu_us']:.0f} | {r['control_plane_us']:.1f} | {r['rss_mb']:.0f} |")
    checked = [(connections, *target) for connections, runs in rows for target in targets(runs)]
    if checked:
        print("\nTargets (issue 48): B is bare Envoy's CPU per request in this run; a build's own work is its CPU"
              " per request over its host's hold floor:\n")
        print("| connections | target | value | limit | met | figures |")
        print("|---|---|---|---|---|---|")
        for connections, what, value, limit, met, figures in checked:
            print(f"| {connections} | {what} | {value:.2f} | {limit} | {'yes' if met else 'no'} | {figures} |")
    if measured.issuperset(("bare", "native_floor_hold", "native_floor_edit", "native")):
        print("\nThe native module's CPU per request over its hold floor, split at the edit floor (the gateway's"
              " calls into Envoy, with fixed values and none of its logic), over B:\n")
        print("| connections | the calls into Envoy (edit over hold floor) | the module's own work (native over edit"
              " floor) |")
        print("|---|---|---|")
        for connections, runs in rows:
            bare, hold, edit, native = (runs[key]["cpu_us"] for key in
                                        ("bare", "native_floor_hold", "native_floor_edit", "native"))
            print(f"| {connections} | {(edit - hold) / bare:.2f} B ({edit - hold:.1f} µs) "
                  f"| {(native - edit) / bare:.2f} B ({native - edit:.1f} µs) |")
    if args.targets_json:
        args.targets_json.write_text(json.dumps([
            {"connections": connections, "target": what, "value": value, "limit": limit, "met": met}
            for connections, what, value, limit, met, _ in checked], indent=1))
    if measured.issuperset(("bare", "gateway", "fallback", "uncached")):
        print("\n| connections | throughput kept | added p50 µs | added p99 µs | fallback over one target: p50 µs |")
        print("|---|---|---|---|---|")
        for connections, runs in rows:
            bare, gateway = runs["bare"], runs["gateway"]
            print(f"| {connections} | {gateway['rps'] / bare['rps']:.1%} | {gateway['p50'] - bare['p50']:.0f} "
                  f"| {gateway['p99'] - bare['p99']:.0f} | {runs['fallback']['p50'] - runs['uncached']['p50']:+.0f} |")
    if measured.issuperset(("cache_hit", "uncached", "bare")):
        print("\n| connections | cache hit req/s vs uncached | vs bare Envoy | cache hit p50 µs vs uncached | vs bare Envoy |")
        print("|---|---|---|---|---|")
        for connections, runs in rows:
            hit, uncached, bare = runs["cache_hit"], runs["uncached"], runs["bare"]
            print(f"| {connections} | {hit['rps'] / uncached['rps']:.1%} | {hit['rps'] / bare['rps']:.1%} "
                  f"| {hit['p50'] - uncached['p50']:+.0f} | {hit['p50'] - bare['p50']:+.0f} |")
    if measured.issuperset(("bare", "floor_pass", "gateway")):
        print("\nProxy CPU time per request served (utime+stime of the proxy process, all threads, over each"
              " measured run):\n")
        print("| connections | bare Envoy µs | minimal filter µs | gateway filter µs | minimal over bare µs "
              "| our share (gateway − minimal) µs |")
        print("|---|---|---|---|---|---|")
        for connections, runs in rows:
            bare, minimal, ours = (runs[key]["cpu_us"] for key in ("bare", "floor_pass", "gateway"))
            print(f"| {connections} | {bare:.0f} | {minimal:.0f} | {ours:.0f} | {minimal - bare:+.0f} "
                  f"| {ours - minimal:+.0f} |")

    if measured.issuperset(("bare", "gateway", "native")):
        print("\nThe native module against bare Envoy and the wasm filter, provider headers (issue 29's"
              " targets: CPU within 15 µs of bare Envoy's, throughput at least 85% of it):\n")
        print("| connections | bare Envoy µs | native module µs | wasm filter µs | native over bare µs "
              "| native throughput of bare's |")
        print("|---|---|---|---|---|---|")
        for connections, runs in rows:
            bare, native, wasm = (runs[key] for key in ("bare", "native", "gateway"))
            print(f"| {connections} | {bare['cpu_us']:.0f} | {native['cpu_us']:.0f} | {wasm['cpu_us']:.0f} "
                  f"| {native['cpu_us'] - bare['cpu_us']:+.0f} | {native['rps'] / bare['rps']:.1%} |")

    if measured.issuperset(("native_uncached", "native_guardrail", "native_cache_hit", "bare")):
        print("\nThe native module: an inline input guardrail's cost, and a cache hit against bare Envoy"
              " proxying to the mock, CPU per request:\n")
        print("| connections | one-target config µs | with the guardrail µs | guardrail's cost µs "
              "| cache hit µs | bare Envoy µs |")
        print("|---|---|---|---|---|---|")
        for connections, runs in rows:
            plain, guarded, hit, bare = (runs[key]["cpu_us"] for key in
                                         ("native_uncached", "native_guardrail", "native_cache_hit", "bare"))
            print(f"| {connections} | {plain:.0f} | {guarded:.0f} | {guarded - plain:+.0f} | {hit:.0f} | {bare:.0f} |")

    if measured.issuperset(("bare_mcp", "mcp", "native_mcp")):
        print("\nAn MCP tools/call (2026-07-28, one POST) through `/mcp/{server}` against the same call through bare"
              " Envoy, CPU per request:\n")
        print("| connections | bare Envoy µs | wasm filter µs | native module µs | wasm over bare µs "
              "| native over bare µs | wasm throughput of bare's |")
        print("|---|---|---|---|---|---|---|")
        for connections, runs in rows:
            bare, wasm, native = (runs[key] for key in ("bare_mcp", "mcp", "native_mcp"))
            print(f"| {connections} | {bare['cpu_us']:.0f} | {wasm['cpu_us']:.0f} | {native['cpu_us']:.0f} "
                  f"| {wasm['cpu_us'] - bare['cpu_us']:+.0f} | {native['cpu_us'] - bare['cpu_us']:+.0f} "
                  f"| {wasm['rps'] / bare['rps']:.1%} |")

    if measured.issuperset(("uncached", "guardrail")):
        print("\nAn inline input guardrail (`default.regexMatch`, passing), CPU per request:\n")
        print("| connections | one-target config µs | with the guardrail µs | guardrail's cost µs |")
        print("|---|---|---|---|")
        for connections, runs in rows:
            plain, guarded = (runs[key]["cpu_us"] for key in ("uncached", "guardrail"))
            print(f"| {connections} | {plain:.0f} | {guarded:.0f} | {guarded - plain:+.0f} |")

    if measured.issuperset(("uncached", "guardrail", "compare_uncached", "compare_guardrail")):
        print(f"\nThe same guardrail through {args.compare_wasm} and through this build, CPU per request:\n")
        print("| connections | compared: one-target µs | compared: with the guardrail µs | compared: cost µs "
              "| this build: one-target µs | this build: with the guardrail µs | this build: cost µs |")
        print("|---|---|---|---|---|---|---|")
        for connections, runs in rows:
            other_plain, other_guarded, plain, guarded = (
                runs[key]["cpu_us"] for key in ("compare_uncached", "compare_guardrail", "uncached", "guardrail"))
            print(f"| {connections} | {other_plain:.0f} | {other_guarded:.0f} | {other_guarded - other_plain:+.0f} "
                  f"| {plain:.0f} | {guarded:.0f} | {guarded - plain:+.0f} |")

    if measured.issuperset(("uncached", "saved")):
        print("\nA saved config (`x-gateway-config: <slug>`) naming a stored provider (`@slug`), warm, against the"
              " same target as a config in the header, CPU per request:\n")
        print("| connections | config in the header µs | saved config + @slug µs | difference µs |")
        print("|---|---|---|---|")
        for connections, runs in rows:
            plain, saved = (runs[key]["cpu_us"] for key in ("uncached", "saved"))
            print(f"| {connections} | {plain:.0f} | {saved:.0f} | {saved - plain:+.0f} |")

    for build, keyed, limited in (("the wasm filter", "keyed", "limited"),
                                  ("the native module", "native_keyed", "native_limited")):
        if measured.issuperset((keyed, limited)):
            print(f"\nA rate limit and a budget in force, {build} (the same request with a control-plane key of a"
                  " workspace without limits, and of one with both), CPU per request:\n")
            print("| connections | without limits µs | with a rate limit and a budget µs | the limits' cost µs "
                  "(turn by turn, place taken out) | the later run's place µs | each turn's difference µs |")
            print("|---|---|---|---|---|---|")
            for connections, runs in rows:
                plain, under = (runs[key]["cpu_us"] for key in (keyed, limited))
                cost, place, each = paired_difference(turns[connections], keyed, limited)
                print(f"| {connections} | {plain:.0f} | {under:.0f} | {cost:+.1f} | {place:+.1f} | {each} |")

    if measured.issuperset(("floor_pass", "gateway", "compare")):
        print(f"\nThe same request through {args.compare_wasm}, CPU per request side by side:\n")
        print("| connections | compared filter µs | gateway filter µs | its share over minimal µs | our share µs |")
        print("|---|---|---|---|---|")
        for connections, runs in rows:
            minimal, ours, other = (runs[key]["cpu_us"] for key in ("floor_pass", "gateway", "compare"))
            print(f"| {connections} | {other:.0f} | {ours:.0f} | {other - minimal:+.0f} | {ours - minimal:+.0f} |")

    if measured.issuperset(("gateway", "compare")):
        print(f"\nThis build against {args.compare_wasm}, provider headers, turn by turn:\n")
        print("| connections | req/s: this build / compared | proxy CPU µs: this build / compared "
              "| this build − compared µs (turn by turn, place taken out) | the later run's place µs "
              "| each turn's difference µs |")
        print("|---|---|---|---|---|---|")
        for connections, runs in rows:
            ours, other = runs["gateway"], runs["compare"]
            difference, place, each = paired_difference(turns[connections], "compare", "gateway")
            print(f"| {connections} | {ours['rps']:.0f} / {other['rps']:.0f} | {ours['cpu_us']:.0f} / "
                  f"{other['cpu_us']:.0f} | {difference:+.1f} | {place:+.1f} | {each} |")


if __name__ == "__main__":
    main()
