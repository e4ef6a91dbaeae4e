"""The console's benchmark (issue 47): a workspace with a million recorded requests, in SQLite and
in PostgreSQL, and how fast the console answers over it.

    ./build.sh console-bench [--records 1000000] [--database sqlite,postgres]

For each database: the control plane (the release build) on a fresh database, the records shipped
to it as the filter ships them (`POST /internal/v1/records`, batches of 500, two senders), in the
order of their times, spread evenly over the last 30 days (`--days`), plus a twentieth as many in a second workspace; then, signed in with a key of
the first workspace, the wall time of the overview's API for each range and of the request table's
first page under each filter (the median and the slowest of 7), an admin's overview of every
workspace, and in a real Chromium the time from opening the console to the overview drawn and to
the request table's first rows; and the query plans the database chose for both. It prints the
control plane's CPU per stored record while filling, too.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from pg_server import free_ports, running_postgres, stop_group  # noqa: E402

CONTROL_PLANE = ROOT / "target/control-plane/gateway-control-plane"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "console-bench-token"
ADMIN = "console-bench-admin"
WORKSPACE, OTHER = "bench", "bench-other"
BATCH = 500
DAY_MS = 86_400_000

# (model, provider, USD per 1M tokens, weight)
MODELS = [("gpt-4o", "openai", 5.0, 20), ("gpt-4o-mini", "openai", 0.3, 25), ("claude-sonnet-4", "anthropic", 6.0, 15),
          ("claude-haiku-4", "anthropic", 1.5, 10), ("gemini-2.5-pro", "google", 4.0, 8), ("gemini-2.5-flash", "google",
          0.4, 10), ("llama-3.3-70b", "groq", 0.7, 4), ("mistral-large", "mistral", 3.0, 3), ("command-r", "cohere",
          0.5, 3), ("titan-text", "bedrock", 0.3, 2)]
APIS = [("chat", 70), ("messages", 15), ("responses", 10), ("mcp", 5)]
STATUSES = [(200, 960), (429, 20), (400, 8), (500, 6), (502, 6)]
CACHE = [("MISS", 80), ("HIT", 10), (None, 10)]
KEYS = [f"key-{i:02d}" for i in range(50)]


def pick(rng, weighted):
    return rng.choices([item for item, *_ in weighted], weights=[w[-1] for w in weighted])[0]


def record(rng, i, count, workspace, now_ms, span_ms):
    model, provider, price, _ = rng.choices(MODELS, weights=[m[3] for m in MODELS])[0]
    status = pick(rng, STATUSES)
    prompt, completion = (rng.randint(50, 4000), rng.randint(10, 800)) if status == 200 else (0, 0)
    r = {"record_id": f"{workspace}-{i}", "workspace": workspace, "trace_id": f"trace-{workspace}-{i:08d}",
         "span_id": f"{i:016x}", "timestamp_ms": now_ms - span_ms + span_ms * i // count, "method": "POST",
         "path": "/v1/chat/completions", "provider": provider, "model": model, "status": status,
         "api_key_id": rng.choice(KEYS), "client_api": pick(rng, APIS), "duration_ms": int(rng.lognormvariate(6.3, 0.8)),
         "prompt_tokens": prompt, "completion_tokens": completion,
         "cost_usd": round((prompt + completion) * price / 1e6, 6), "cache_status": pick(rng, CACHE),
         "attempts": [{"provider": provider, "status": status}], "metadata": {"_user": f"user-{i % 997}"}}
    if rng.random() < 0.2:
        r["guardrails"] = [{"stage": "before", "id": "pii", "verdict": rng.random() < 0.95}]
    return r


class ControlPlane:
    def __init__(self, binary: Path, workdir: Path, database_url: str | None):
        self.port = free_ports(1)[0]
        env = {"PATH": "/usr/bin:/bin", "GATEWAY_CONTROL_PLANE_ADDR": f"127.0.0.1:{self.port}",
               "GATEWAY_STATE_DIR": str(workdir), "GATEWAY_API_KEYS": ADMIN, "GATEWAY_CONTROL_PLANE_TOKEN": TOKEN}
        if database_url:
            env["GATEWAY_DATABASE_URL"] = database_url
        self.proc = subprocess.Popen([str(binary)], env=env, stdout=open(workdir / "control-plane.log", "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.call("GET", "/console")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"console-bench: the control plane did not start: {(workdir / 'control-plane.log').read_text()}")
            time.sleep(0.1)

    def call(self, method, path, body=None, headers=None, conn=None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, data, {"content-type": "application/json", **(headers or {})})
            response = conn.getresponse()
            payload = response.read()
            return response.status, dict(response.getheaders()), payload
        finally:
            if own:
                conn.close()

    def cpu_seconds(self):
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        stop_group(self.proc)


def fill(cp: ControlPlane, workspace: str, count: int, seed: int, now_ms: int, span_ms: int) -> None:
    """Ships `count` records of `workspace` in batches, from two senders, spread over `span_ms` before
    `now_ms`."""
    batches = list(range(0, count, BATCH))

    def sender(part):
        rng = random.Random(seed + part)
        conn = http.client.HTTPConnection("127.0.0.1", cp.port, timeout=300)
        for start in batches[part::2]:
            body = {"records": [record(rng, i, count, workspace, now_ms, span_ms) for i in range(start, min(start + BATCH, count))]}
            status, _, payload = cp.call("POST", "/internal/v1/records", body,
                                         {"authorization": f"Bearer {TOKEN}"}, conn)
            if status != 202:
                raise SystemExit(f"console-bench: a batch was refused: {status} {payload[:300]!r}")
        conn.close()

    threads = [threading.Thread(target=sender, args=(part,)) for part in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def timed(cp, path, cookie, times=7):
    """The median and the slowest wall time (ms) of `times` GETs of `path`, and the last answer."""
    conn = http.client.HTTPConnection("127.0.0.1", cp.port, timeout=300)
    spent, answer = [], None
    for _ in range(times):
        started = time.perf_counter()
        status, _, payload = cp.call("GET", path, headers={"cookie": cookie}, conn=conn)
        spent.append((time.perf_counter() - started) * 1000)
        if status != 200:
            raise SystemExit(f"console-bench: {path}: {status} {payload[:300]!r}")
        answer = json.loads(payload)
    conn.close()
    return statistics.median(spent), max(spent), answer


def sign_in(cp, key):
    status, headers, payload = cp.call("POST", "/console/session", {"key": key})
    if status != 200:
        raise SystemExit(f"console-bench: sign-in failed: {status} {payload!r}")
    return headers["set-cookie"].split(";")[0]


def in_chromium(cp, cookie):
    """Wall times (ms) in Chromium: opening the console to the overview drawn (a day, the default),
    switching it to a month, and opening the request table to its first rows."""
    from playwright.sync_api import expect, sync_playwright
    origin = f"http://127.0.0.1:{cp.port}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        name, value = cookie.split("=", 1)
        context.add_cookies([{"name": name, "value": value, "url": f"{origin}/console"}])
        page = context.new_page()
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)
        page.goto(f"{origin}/console/#/limits")  # the page and its scripts cached, as on a second visit
        page.get_by_role("heading", name="Limits and budgets").wait_for()
        started = time.perf_counter()
        page.goto(f"{origin}/console/#/overview")
        expect(page.locator(".chart canvas")).to_have_count(4)
        expect(page.locator("[data-breakdown=model] tbody tr")).not_to_have_count(0)
        overview = (time.perf_counter() - started) * 1000
        first = page.locator("[data-tile=Requests] .value").inner_text()
        started = time.perf_counter()
        page.locator("#range").select_option("month")
        expect(page.locator("[data-tile=Requests] .value")).not_to_have_text(first)
        month = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        page.goto(f"{origin}/console/#/requests")
        expect(page.locator("#requests tbody tr.row-link")).to_have_count(50)
        table = (time.perf_counter() - started) * 1000
        browser.close()
    return overview, month, table


QUERY_SHAPES = {
    "overview, slots (a month)": "SELECT (bucket_ms - 0) / 86400000 AS slot, value, SUM(requests) FROM log_rollups "
    "WHERE bucket_len = 3600000 AND dimension = 'duration' AND bucket_ms >= 0 AND bucket_ms < 9000000000000000 "
    "AND workspace = 'bench' GROUP BY 1, 2",
    "overview, by model (a month)": "SELECT value, SUM(requests) FROM log_rollups WHERE bucket_len = 3600000 "
    "AND dimension = 'model' AND bucket_ms >= 0 AND bucket_ms < 9000000000000000 AND workspace = 'bench' GROUP BY value",
    "overview, every workspace (admin)": "SELECT workspace, SUM(requests) FROM log_rollups WHERE bucket_len = 3600000 "
    "AND dimension = 'duration' AND bucket_ms >= 0 AND bucket_ms < 9000000000000000 GROUP BY workspace",
    "table, first page": "SELECT id, trace_id, timestamp_ms, record FROM log_records WHERE workspace = 'bench' "
    "ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
    "table, a model": "SELECT id FROM log_records WHERE workspace = 'bench' AND model = 'titan-text' "
    "ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
    "table, 5xx": "SELECT id FROM log_records WHERE workspace = 'bench' AND status / 100 = 5 "
    "ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
    "table, a model, none in range": "SELECT id FROM log_records WHERE workspace = 'bench' AND model = 'no-such-model' "
    "ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
    "table, guardrail fail, the last day": "SELECT id FROM log_records WHERE workspace = 'bench' "
    "AND guardrail_verdict = 'fail' AND timestamp_ms >= 1 ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
    "table, a trace id": "SELECT id FROM log_records WHERE workspace = 'bench' AND trace_id = 'trace-bench-00000001' "
    "ORDER BY timestamp_ms DESC, id DESC LIMIT 51",
}


def plans(database_url, workdir):
    """The plan each console query shape gets, as the database prints it."""
    out = {}
    for name, sql in QUERY_SHAPES.items():
        if database_url is None:
            db = sqlite3.connect(workdir / "gateway.db")
            out[name] = "; ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
            db.close()
        else:
            psql = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))[-1]
            text = subprocess.run([str(psql), database_url, "-At", "-c", f"EXPLAIN (ANALYZE, COSTS OFF) {sql}"],
                                  capture_output=True, text=True, check=True).stdout
            out[name] = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    return out


FILTERS = {
    "none": {}, "a model (2% of rows)": {"model": "titan-text"}, "a provider": {"provider": "anthropic"},
    "5xx": {"status_class": "5xx"}, "4xx": {"status_class": "4xx"}, "an API": {"api": "mcp"},
    "a key": {"api_key": "key-07"}, "cache HIT": {"cache_status": "HIT"}, "guardrail fail": {"guardrail": "fail"},
    "a trace id": {"trace_id": "trace-bench-00000001"}, "the last day": {"from": "NOW-86400"},
    "a model, none in range": {"model": "no-such-model"},
}


def run(database, args, pg):
    workdir = Path(tempfile.mkdtemp(prefix=f"console-bench-{database}-"))
    url = pg.database(f"console_bench_{os.getpid()}") if database == "postgres" else None
    cp = ControlPlane(args.control_plane, workdir, url)
    try:
        now_ms = int(time.time() * 1000)
        started, cpu = time.perf_counter(), cp.cpu_seconds()
        span_ms = int(args.days * DAY_MS)
        fill(cp, WORKSPACE, args.records, 1, now_ms, span_ms)
        fill(cp, OTHER, args.records // 20, 2, now_ms, span_ms)
        stored = args.records + args.records // 20
        fill_s, cpu_s = time.perf_counter() - started, cp.cpu_seconds() - cpu
        print(f"\n## {database}: {stored:,} records stored in {fill_s:.0f} s; the control plane's CPU "
              f"{cpu_s * 1e6 / stored:.1f} µs per record", flush=True)
        if args.fill_only:
            return
        status, _, created = cp.call("POST", "/v1/api-keys", {"workspace": WORKSPACE},
                                     {"x-gateway-api-key": ADMIN})
        if status != 201:
            raise SystemExit(f"console-bench: no key made: {status} {created!r}")
        cookie = sign_in(cp, json.loads(created)["key"])
        admin = sign_in(cp, ADMIN)
        print("\n| overview | median ms | slowest ms | requests |\n|---|---|---|---|")
        for who, range_, c in [("workspace", r, cookie) for r in ("hour", "day", "week", "month")] + [
                ("every workspace (admin)", "month", admin)]:
            median, worst, answer = timed(cp, f"/console/api/overview?range={range_}", c)
            print(f"| {who}, {range_} | {median:.1f} | {worst:.1f} | {answer['totals']['requests']:,} |")
        print("\n| request table, first page | median ms | slowest ms | rows |\n|---|---|---|---|")
        for name, query in FILTERS.items():
            query = {k: (str(now_ms // 1000 - 86400) if v == "NOW-86400" else v) for k, v in query.items()}
            median, worst, answer = timed(cp, f"/console/api/logs?{urlencode({'limit': 50, **query})}", cookie)
            print(f"| {name} | {median:.1f} | {worst:.1f} | {len(answer['data'])} |")
        overview, month, table = in_chromium(cp, cookie)
        print(f"\nIn Chromium: the overview drawn {overview:.0f} ms after opening it (a day), a month "
              f"{month:.0f} ms after choosing it, the request table's first 50 rows {table:.0f} ms after opening it")
        print("\nQuery plans:")
        for name, plan in plans(url, workdir).items():
            print(f"- {name}: {plan}")
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--database", default="sqlite,postgres")
    parser.add_argument("--days", type=float, default=30, help="the days the records are spread over, up to now")
    parser.add_argument("--fill-only", action="store_true", help="only store the records (the ingest's cost)")
    parser.add_argument("--control-plane", type=Path, default=CONTROL_PLANE,
                        help="the control plane's binary (another build's, to compare its ingest)")
    args = parser.parse_args()
    if not args.control_plane.exists():
        sys.exit(f"console-bench: {args.control_plane} is missing: run it as ./build.sh console-bench, which builds it")
    databases = [d for d in args.database.split(",") if d]
    log = Path(tempfile.mkdtemp(prefix="console-bench-pg-")) / "postgres.log"
    if "postgres" in databases:
        with running_postgres(log) as pg:
            for database in databases:
                run(database, args, pg)
    else:
        for database in databases:
            run(database, args, None)


if __name__ == "__main__":
    main()
