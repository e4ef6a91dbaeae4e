"""The control plane's ingest alone (issue 48): its CPU per stored record, without Envoy.

    .venv/bin/python bench/ingest_bench.py [--batches 400] [--database sqlite|postgres] [--control-plane PATH]

Starts the control plane (the release build by default) on a fresh database (its own SQLite file,
or a PostgreSQL server started as the tests start it) and sends it batches of 500 records shaped as
the benchmark's requests make them (`POST /internal/v1/records`, one sender, back to back; a random
trace id each, as a client sending its own random ids gives, and as Envoy's request id gave before
the gateway made its own; or with `--trace-ids time` the UUIDs version 7 the gateway makes, which
follow time), each batch's record ids new. Prints the control plane's
CPU (utime + stime) per record over the second half of the batches, when the tables hold the first
half: the figure the benchmark's "control plane CPU µs/req" column gives, in a loop short enough to
try a change with (about 20 s for 400 batches). Only the control plane's own CPU is counted, not a
PostgreSQL server's.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

from console_bench import BATCH, ROOT, TOKEN, ControlPlane
from pg_server import running_postgres


def trace_id(rng: random.Random, now_ms: int, following_time: bool) -> str:
    """A random UUID (version 4), or a UUID version 7 as the gateway makes: the time in ms, the
    version, 12 random bits, the variant, 62 random bits (Python 3.11's `uuid` knows no version 7)."""
    if following_time:
        bits = (now_ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64) | (0b10 << 62) | rng.getrandbits(62)
        return str(uuid.UUID(int=bits))
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def batch(rng: random.Random, serial: int, following_time: bool) -> dict:
    """A batch of the benchmark's records: one workspace, one model, a trace id each."""
    now = int(time.time() * 1000)
    records = [{"trace_id": trace_id(rng, now, following_time), "span_id": None,
                "parent_span_id": None, "span_name": None, "metadata": None, "method": "POST",
                "path": "/v1/chat/completions", "provider": "openai", "model": "bench-model", "target": None,
                "attempts": 1, "retries": 0, "fallbacks": 0, "cache_status": None, "status": 200, "stream": False,
                "prompt_tokens": 9, "completion_tokens": 5, "duration_ms": rng.randint(1, 5),
                "time_to_first_token_ms": None, "error_code": None, "workspace": "default", "timestamp_ms": now,
                "record_id": f"{now:012x}{serial:06x}{i:04x}{rng.getrandbits(32):08x}"} for i in range(BATCH)]
    return {"records": records}


def measure(control_plane: Path, batches: int, database_url: str | None, following_time: bool) -> float:
    """The control plane's CPU µs per record over the second half of `batches`."""
    cp = ControlPlane(control_plane, Path(tempfile.mkdtemp(prefix="ingest-bench-")), database_url)
    try:
        rng = random.Random(48)
        # One connection for every batch, as the filter's calls reuse Envoy's connections.
        connection = http.client.HTTPConnection("127.0.0.1", cp.port, timeout=300)
        start = 0.0
        for serial in range(batches):
            if serial == batches // 2:
                start = cp.cpu_seconds()
            status, _, payload = cp.call("POST", "/internal/v1/records", batch(rng, serial, following_time),
                                         {"authorization": f"Bearer {TOKEN}"}, connection)
            if status != 202:
                sys.exit(f"ingest_bench: a batch got {status}: {payload[:500]!r}")
        return (cp.cpu_seconds() - start) * 1e6 / ((batches - batches // 2) * BATCH)
    finally:
        cp.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--trace-ids", choices=("random", "time"), default="random")
    parser.add_argument("--control-plane", type=Path, default=ROOT / "target/control-plane/gateway-control-plane")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        database_url = None
        if args.database == "postgres":
            postgres = stack.enter_context(running_postgres(Path(tempfile.mkdtemp()) / "postgres.log"))
            database_url = postgres.database("ingest")
        spent = measure(args.control_plane, args.batches, database_url, args.trace_ids == "time")
    print(f"{args.database}, {args.trace_ids} trace ids: {spent:.1f} µs of the control plane's CPU per record "
          f"({args.batches - args.batches // 2} batches of {BATCH} measured)")


if __name__ == "__main__":
    main()
