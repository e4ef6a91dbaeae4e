"""The control plane's ingest alone (issue 48): its CPU per stored record, without Envoy.

    .venv/bin/python bench/ingest_bench.py [--batches 400] [--database sqlite|postgres] [--control-plane PATH]

Starts the control plane (the release build by default) on a fresh database (its own SQLite file,
or a PostgreSQL server started as the tests start it) and sends it batches of 500 records shaped as
the benchmark's requests make them (`POST /internal/v1/records`, one sender, back to back; a random
trace id each, as Envoy's request id is, or with `--trace-ids time` ids that follow time, as the
record ids do), each batch's record ids new. Prints the control plane's
CPU (utime + stime) per record over the second half of the batches, when the tables hold the first
half: the figure the benchmark's "control plane CPU µs/req" column gives, in a loop short enough to
try a change with (about 20 s for 400 batches). Only the control plane's own CPU is counted, not a
PostgreSQL server's.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from pg_server import free_ports, running_postgres, stop_group  # noqa: E402

TOKEN = "ingest-bench-token"
BATCH = 500
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def trace_id(rng: random.Random, now_ms: int, following_time: bool) -> str:
    """A random UUID (Envoy's request id), or the time in ms then random bits."""
    if following_time:
        return f"{now_ms:012x}{rng.getrandbits(80):020x}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def batch(rng: random.Random, serial: int, following_time: bool) -> bytes:
    """A batch of the benchmark's records: one workspace, one model, a trace id each."""
    now = int(time.time() * 1000)
    records = [{"trace_id": trace_id(rng, now, following_time), "span_id": None,
                "parent_span_id": None, "span_name": None, "metadata": None, "method": "POST",
                "path": "/v1/chat/completions", "provider": "openai", "model": "bench-model", "target": None,
                "attempts": 1, "retries": 0, "fallbacks": 0, "cache_status": None, "status": 200, "stream": False,
                "prompt_tokens": 9, "completion_tokens": 5, "duration_ms": rng.randint(1, 5),
                "time_to_first_token_ms": None, "error_code": None, "workspace": "default", "timestamp_ms": now,
                "record_id": f"{now:012x}{serial:06x}{i:04x}{rng.getrandbits(32):08x}"} for i in range(BATCH)]
    return json.dumps({"records": records}).encode()


def measure(control_plane: Path, batches: int, environment: dict[str, str], following_time: bool) -> float:
    """The control plane's CPU µs per record over the second half of `batches`."""
    state = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    (port,) = free_ports(1)
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_CONTROL_PLANE_ADDR": f"127.0.0.1:{port}",
           "GATEWAY_CONTROL_PLANE_TOKEN": TOKEN, "GATEWAY_API_KEYS": "ingest-bench-key",
           "GATEWAY_STATE_DIR": str(state), **environment}
    with open(state / "control-plane.log", "wb") as log:
        proc = subprocess.Popen([str(control_plane)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"ingest_bench: the control plane did not start: {(state / 'control-plane.log').read_text()}")
            time.sleep(0.1)
        rng = random.Random(48)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        start = 0.0
        for serial in range(batches):
            if serial == batches // 2:
                start = cpu_seconds(proc.pid)
            connection.request("POST", "/internal/v1/records", batch(rng, serial, following_time),
                               {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"})
            answer = connection.getresponse()
            body = answer.read()
            if answer.status != 202:
                sys.exit(f"ingest_bench: a batch got {answer.status}: {body[:500]!r}")
        return (cpu_seconds(proc.pid) - start) * 1e6 / ((batches - batches // 2) * BATCH)
    finally:
        stop_group(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--trace-ids", choices=("random", "time"), default="random")
    parser.add_argument("--control-plane", type=Path, default=ROOT / "target/control-plane/gateway-control-plane")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        environment = {}
        if args.database == "postgres":
            postgres = stack.enter_context(running_postgres(Path(tempfile.mkdtemp()) / "postgres.log"))
            environment["GATEWAY_DATABASE_URL"] = postgres.database("ingest")
        spent = measure(args.control_plane, args.batches, environment, args.trace_ids == "time")
    print(f"{args.database}, {args.trace_ids} trace ids: {spent:.1f} µs of the control plane's CPU per record "
          f"({args.batches - args.batches // 2} batches of {BATCH} measured)")


if __name__ == "__main__":
    main()
