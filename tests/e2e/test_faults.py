"""Faults around the gateway, each bounded in time: a client that leaves a stream, the control
plane killed under load, PostgreSQL restarted under load, Envoy replaced by a new one. Every
client gets an answer, and nothing acknowledged is lost or stored half."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest
from conftest import session_cache
from helpers import CHAT, KEY, chat_body, config, custom_host, process_start, slug
from mocks import Reply
from pg_server import stop_group
from support import (eventually, hooks, join_a_held_jwks_fetch, logged, new_slug, new_workspace_key,  # noqa: F401
                     ok, put, put_limit, put_price, unique_model)  # (hooks: a fixture)

# --------------------------------------------------------------------------- a client leaves


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_client_that_leaves_a_stream_cancels_the_provider_call_and_its_record_keeps_what_it_got(
        gateway, openai_mock, anthropic_mock, provider):
    """The provider's connection is closed under it, and the request's record has the usage
    the provider had reported (Anthropic's `message_start` has the input tokens; an OpenAI
    stream reports none until its end). Limits and budgets settle it by their bound:
    test_limits.py."""
    mock = anthropic_mock if provider == "anthropic" else openai_mock
    reply = Reply(chunk_delay=0.05, text="word " * 400, usage=(11, 400))  # 20 s if nobody stops it
    mock.script(reply)
    trace = f"leaves-{uuid.uuid4().hex[:12]}"
    headers = {**custom_host(mock, provider=provider), "x-gateway-trace-id": trace}
    model = "claude-mock" if provider == "anthropic" else "gpt-mock"
    with gateway.stream("POST", CHAT, headers=headers, json=chat_body(model=model, stream=True)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(8)]  # a few events in
    assert any("word" in line for line in got), got
    # Its next writes fail, long before its end.
    assert reply.served.wait(10), "the provider call went on after the client left"
    assert reply.cut_off
    record = logged(gateway, trace)
    assert (record["stream"], record["provider"], record["status"]) == (True, provider, 200)
    if provider == "anthropic":
        assert (record["prompt_tokens"], record["completion_tokens"]) == (11, 1), record
    else:
        assert (record["prompt_tokens"], record["completion_tokens"]) == (None, None), record


@pytest.fixture(scope="module")
def one_worker(start_gateway, openai_mock):
    """A gateway with one worker thread: its requests share that worker's fetches."""
    with start_gateway("one-worker", session_cache(openai_mock), {"GATEWAY_CONCURRENCY": "1"}) as gw:
        yield gw


def test_a_fetch_outlives_the_client_that_started_it(one_worker, openai_mock, hooks):
    """A fetch that several requests wait for (here a JWKS; a control-plane read alike) is the
    root context's call. When the client whose request started it leaves before the answer, the
    answer still serves the request that joined the fetch, and the next one (fetched once). The
    proxy-wasm SDK handed that answer to the ended request instead, so the joined request
    waited for the 70 s bound on lost fetches."""
    trace = f"starter-{uuid.uuid4().hex[:12]}"
    try:
        joined, checked = join_a_held_jwks_fetch(one_worker, openai_mock, hooks, "outlives",
                                                 {"x-gateway-trace-id": trace})
        one_worker.wait_for_log_line(f'trace_id="{trace}"', timeout=10)  # the first request ended
    finally:
        hooks.hold_jwks.set()
    answer = joined.getresponse()
    text = answer.read().decode()
    joined.close()
    assert answer.status == 200, text
    r = one_worker.chat(checked)
    assert r.status_code == 200, r.text
    assert len(hooks.of("/jwks-outlives.json")) == 1, "one fetch served all three requests"



# --------------------------------------------------------------------------- load with faults


class Load:
    """Chats through a saved config and writes of stored providers (each with its own key),
    from threads, until stopped: every answer is kept (status, and for writes what was sent)."""

    def __init__(self, gw, mock, saved_config: str):
        self.gw, self.mock, self.saved_config = gw, mock, saved_config
        self.stop = threading.Event()
        self.chats: list[int] = []
        self.writes: list[tuple[str, str, int]] = []  # (slug, api key, status)
        self.write_errors: list[str] = []
        self._pool = ThreadPoolExecutor(3)
        self._runs = []

    def __enter__(self):
        self._runs = [self._pool.submit(self._chat), self._pool.submit(self._write), self._pool.submit(self._write)]
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for run in self._runs:
            run.result(timeout=60)
        self._pool.shutdown()

    def _chat(self):
        client = httpx.Client(base_url=self.gw.origin, timeout=10)
        while not self.stop.is_set():
            r = client.post(CHAT, json=chat_body(), headers={"x-gateway-api-key": KEY, **config(self.saved_config)})
            self.chats.append(r.status_code)

    def _write(self):
        client = httpx.Client(base_url=self.gw.origin, timeout=10)
        while not self.stop.is_set():
            name, key = new_slug("under-load"), f"sk-{uuid.uuid4().hex}"
            self.mock.keys.add(key)  # issued by OpenAI: the stored provider's calls are accepted
            body = {"provider": "openai", "api_key": key, "custom_host": self.mock.base_url}
            try:
                r = client.put(f"/v1/providers/{name}", json=body, headers={"x-gateway-api-key": KEY})
                status = r.status_code
            except httpx.HTTPError as e:  # an answer that never came is a failure of the test below
                self.write_errors.append(repr(e))
                status = 0
            self.writes.append((name, key, status))
            time.sleep(0.02)  # the load's pace

    def wait_for(self, writes: int, timeout: float = 20):
        deadline = time.monotonic() + timeout
        while sum(1 for *_, s in self.writes if s in (200, 201)) < writes:
            assert time.monotonic() < deadline, f"fewer than {writes} writes landed: {self.writes[-5:]}"
            time.sleep(0.05)


def check_writes(gw, mock, load: Load):
    """Every write was answered; each acknowledged one is there whole, and each refused one is
    either absent or there whole: a stored provider reached by its slug calls the provider with
    exactly the key it was written with."""
    assert not load.write_errors, load.write_errors[:3]
    # Refused: by Envoy while the control plane is gone (502/503), or by the control plane while
    # its database is (503, `database_unavailable`: a retry may land).
    statuses = {status for *_, status in load.writes}
    assert statuses <= {200, 201, 502, 503}, statuses
    for name, key, status in load.writes:
        r = gw.get(f"/v1/providers/{name}")
        if status in (200, 201):
            assert r.status_code == 200, f"acknowledged write of {name} lost: {r.status_code} {r.text}"
        else:
            assert r.status_code in (200, 404), r.text
        if r.status_code == 200:
            answer = gw.chat(slug(name))
            assert answer.status_code == 200, answer.text
            assert mock.last.header("authorization") == f"Bearer {key}", name


def stored_config(gw, mock) -> str:
    s = new_slug("read")
    mock.keys.add("sk-read")
    ok(put(gw, f"/v1/providers/{s}", {"provider": "openai", "api_key": "sk-read", "custom_host": mock.base_url}))
    name = new_slug("cfg")
    ok(put(gw, f"/v1/configs/{name}", {"provider": f"@{s}"}))
    r = gw.chat(config(name))
    assert r.status_code == 200, r.text  # read once: the filter keeps it
    return name


def test_the_control_plane_killed_under_load(start_gateway, openai_mock):
    """Killed (SIGKILL) while chats and writes go on, then started again on the same database:
    what was read keeps serving, writes in flight land whole or are refused, and writes land
    again once it is back."""
    with start_gateway("cp-killed", None) as gw:
        saved = stored_config(gw, openai_mock)
        with Load(gw, openai_mock, saved) as load:
            load.wait_for(10)
            pid = gw.control_plane_pid()
            command, environment, directory = process_start(pid)
            os.kill(pid, signal.SIGKILL)
            refused = len(load.writes)

            def a_write_met_the_outage():
                assert any(s not in (200, 201) for *_, s in load.writes[refused:]), "no write met the outage yet"
            eventually(a_write_met_the_outage)
            again = subprocess.Popen(command, env=environment, cwd=directory, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                landed = sum(1 for *_, s in load.writes if s in (200, 201))
                load.wait_for(landed + 10)
            except BaseException:
                again.kill()
                raise
        try:
            assert load.chats and set(load.chats) == {200}, sorted(set(load.chats))
            check_writes(gw, openai_mock, load)
        finally:
            again.kill()
            again.wait()


@pytest.fixture(scope="module")
def own_postgres(start_postgres):
    """A PostgreSQL server of this module's own, since it is restarted."""
    with start_postgres("own-postgres") as server:
        yield server


def test_postgresql_restarted_under_load(start_gateway, own_postgres, openai_mock):
    """PostgreSQL shut down at once (as after a crash) and started again while chats and writes
    go on: the control plane reconnects by itself, and nothing it acknowledged is lost."""
    env = {"GATEWAY_DATABASE_URL": own_postgres.database(f"restarted_{uuid.uuid4().hex[:8]}")}
    with start_gateway("pg-restarted", None, env) as gw:
        saved = stored_config(gw, openai_mock)
        with Load(gw, openai_mock, saved) as load:
            load.wait_for(10)
            own_postgres.restart()
            landed = sum(1 for *_, s in load.writes if s in (200, 201))
            load.wait_for(landed + 10, timeout=30)
        assert load.chats and set(load.chats) == {200}, sorted(set(load.chats))
        check_writes(gw, openai_mock, load)


# --------------------------------------------------------------------------- a new Envoy


def envoy_pid(gw) -> int:
    """The pid of the gateway's Envoy (in the process group `build.sh run` leads)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != gw.process_group:
                continue
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command and command[0].endswith(b"/envoy"):
            return int(entry.name)
    pytest.fail("no Envoy process in the gateway's process group")


def test_a_new_envoy_serves_with_the_same_state_from_the_control_plane(start_gateway, openai_mock):
    """Envoy killed and a new one started with the same config (hot restart is off; the control
    plane stays up, as a separate service would): stored providers, saved configs and a
    budget's spending are the control plane's, so the new Envoy serves them as the old did, and
    its requests' records reach the control plane."""
    replacements: list[subprocess.Popen] = []
    try:
        with start_gateway("envoy-replaced", None) as gw:
            saved = stored_config(gw, openai_mock)
            # A workspace of its own: its limits are read by the first request that needs them.
            team = new_workspace_key(gw)
            model = unique_model()
            put_price(gw, team["key"], model, input_per_million=0, output_per_million=100_000)  # 0.1 USD a token
            limit = put_limit(gw, {"workspace": team["workspace"], "model": model, "budget_usd": 1})

            def chat(max_tokens: int, used: int) -> httpx.Response:
                openai_mock.script(Reply(usage=(1, used)), model=model)
                return gw.chat(custom_host(openai_mock), chat_body(model=model, max_tokens=max_tokens),
                               key=team["key"])

            assert chat(5, used=7).status_code == 200
            spent = eventually(lambda: _spent(gw, limit, 0.7))

            # `build.sh run` stops the control plane when its Envoy exits: it goes first, so that
            # the control plane stays, as it would as a service of its own.
            pid = envoy_pid(gw)
            command, environment, directory = process_start(pid)
            os.kill(gw.process_group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            with open(gw.log_path, "ab") as log:
                replacements.append(subprocess.Popen(command, env=environment, cwd=directory,
                                                     stdin=subprocess.DEVNULL, stdout=log,
                                                     stderr=subprocess.STDOUT, start_new_session=True))

            def serving():
                try:
                    assert gw.get("/health", key=None).status_code == 200
                except httpx.HTTPError as e:
                    raise AssertionError(repr(e)) from e
            eventually(serving, within=30)

            assert gw.chat(config(saved)).status_code == 200
            assert openai_mock.last.header("authorization") == "Bearer sk-read"
            assert _spent(gw, limit, spent) == spent, "the budget's spending is the control plane's"
            # The old Envoy's wasm worker held a lease of the budget when it died: counted whole
            # for the period (README, Limits). The native module's worker gave its lease back
            # when its last request ended (nothing would have renewed or reported it). The new
            # Envoy admits what fits beside it, strictly.
            usage = ok(gw.get(f"/v1/limits/{limit['id']}"))["usage"]
            if gw.native:
                assert usage["reserved"]["usd"] == 0, usage
            else:
                assert 0 < usage["reserved"]["usd"] <= 0.3, usage
            served = chat(1, used=1)  # 0.1 USD at most: fits
            assert served.status_code == 200, served.text
            eventually(lambda: _spent(gw, limit, 0.8))
            refused = chat(3, used=3)  # 0.3 USD at most: 0.8 spent (and a dead lease) leave less
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "budget_exceeded"
            # The new Envoy's records reach the control plane.
            r = eventually(lambda: _one_log(gw, served.headers["x-gateway-trace-id"], team["key"]))
            assert r["status"] == 200 and r["workspace"] == team["workspace"], r
    finally:
        for replacement in replacements:
            stop_group(replacement)


def _spent(gw, limit: dict, expected: float) -> float:
    usage = ok(gw.get(f"/v1/limits/{limit['id']}"))["usage"]["spent_usd"]
    assert usage == pytest.approx(expected), usage
    return usage


def _one_log(gw, trace_id: str, key: str) -> dict:
    r = gw.get("/v1/logs", params={"trace_id": trace_id}, key=key)
    assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text
    return r.json()["data"][0]
