"""Request logs (issue 15) in real Envoy with its control plane: with the control plane down,
requests are served as before and the records past the queue's bound are dropped and counted;
request and response bodies reach `GET /v1/logs` only when the plugin config asks for them,
cut to their cap, and never the access log.

The bodies tests share a gateway with `GATEWAY_RECORDS` bodies on and a small cap; the
control-plane-down test runs a gateway of its own with one Envoy worker
(`GATEWAY_CONCURRENCY=1`: one record queue, so the count is exact).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import httpx2 as httpx
import pytest
from helpers import CHAT, KEY, chat_body, custom_host, process_start, provider_config
from support import FLUSHED_WITHIN, access_lines, eventually, logged, reaches, value

DROPPED = "gen_ai_gateway_records_dropped_total"
CAP = 300
BODY_FIELDS = ("request_body", "request_body_truncated", "response_body", "response_body_truncated")


@pytest.fixture(scope="module")
def bodies(start_gateway):
    env = {"GATEWAY_RECORDS": json.dumps({"bodies": True, "max_body_bytes": CAP})}
    with start_gateway("records-bodies", None, env) as gw:
        gw.access_log = gw.log_path  # by default the access log goes to Envoy's stdout
        yield gw


def send(gw, mock, body: dict) -> tuple[str, bytes, object]:
    """Posts ``body`` as exactly these bytes under a new trace id: (trace id, bytes sent, answer)."""
    trace_id = f"logs-{uuid.uuid4().hex[:12]}"
    sent = json.dumps(body).encode()
    headers = {**custom_host(mock), "x-gateway-trace-id": trace_id, "content-type": "application/json"}
    r = gw.request("POST", CHAT, headers=headers, content=sent)
    assert r.status_code == 200, r.text
    return trace_id, sent, r


def capped(sent: bytes) -> tuple[str, bool]:
    """What the record keeps of an ASCII body: its first CAP bytes, and whether it was cut."""
    return sent[:CAP].decode(), len(sent) > CAP


def test_bodies_are_stored_with_the_record_capped_and_never_in_the_access_log(bodies, openai_mock):
    trace_id, sent, r = send(bodies, openai_mock, chat_body("the bodies prompt 51c2", model="m-bodies"))
    record = logged(bodies, trace_id)
    assert (record["request_body"], record.get("request_body_truncated", False)) == capped(sent) == \
        (sent.decode(), False)
    assert (record["response_body"], record.get("response_body_truncated", False)) == capped(r.content)

    # A long prompt and a stream: both cut at the cap; the stream's is the SSE text as sent.
    trace_id, sent, r = send(bodies, openai_mock, chat_body("x" * 1000, model="m-bodies", stream=True))
    assert r.headers["content-type"].startswith("text/event-stream") and len(r.content) > CAP
    record = logged(bodies, trace_id)
    assert (record["request_body"], record["request_body_truncated"]) == capped(sent) == (sent[:CAP].decode(), True)
    assert (record["response_body"], record["response_body_truncated"]) == (r.content[:CAP].decode(), True)
    assert record["response_body"].startswith("data: ")

    # The access log never carries a body.
    [line] = access_lines(bodies, trace_id)
    assert not set(BODY_FIELDS) & set(line), line
    assert "the bodies prompt 51c2" not in bodies.log_text()


def test_without_the_setting_no_body_is_stored(gateway, openai_mock):
    trace_id, _, _ = send(gateway, openai_mock, chat_body("no bodies here", model="m-bodies"))
    record = logged(gateway, trace_id)
    assert not set(BODY_FIELDS) & set(record), record


def test_a_steady_stream_of_short_requests_ships_every_record_without_another_request(
        start_gateway, openai_mock):
    """Cache hits one after another for 3 s on one worker (each ends in its body hook, so the
    worker rarely holds a request when its timer fires): every record reaches the control plane
    and none is dropped, with no request after them (the count is read from the control plane
    itself: one through the gateway would wake the worker). The native module's timer rides on
    its streams: a tick whose stream had ended was lost, the records waited, and an idle worker
    sent one batch of them (500) and kept the rest until its next request."""
    model = f"m-steady-{uuid.uuid4().hex[:8]}"
    headers = {"x-gateway-config": json.dumps(provider_config(openai_mock, cache={"mode": "simple"}))}
    with start_gateway("records-steady", None, {"GATEWAY_CONCURRENCY": "1"}) as gw:
        sent, statuses = 0, set()
        started = time.monotonic()
        while time.monotonic() - started < 3:
            r = gw.chat(headers, chat_body("steady", model=model))
            assert r.status_code == 200, r.text
            statuses.add(r.headers["x-gateway-cache-status"])
            sent += 1
        assert statuses == {"MISS", "HIT"}, statuses
        assert sent > 500, f"{sent} requests: too few to need more than one batch"
        control_plane = f"http://127.0.0.1:{gw.control_plane_port}"

        def stored():
            r = httpx.get(f"{control_plane}/v1/usage?group_by=model", headers={"x-gateway-api-key": KEY})
            assert r.status_code == 200, r.text
            return sum(row["requests"] for row in r.json()["data"] if row["model"] == model)
        eventually(reaches(stored, sent), FLUSHED_WITHIN)
        assert value(gw, DROPPED) == 0


def test_with_the_control_plane_down_requests_are_served_and_only_records_past_the_bound_are_lost(
        start_gateway, openai_mock):
    """With the control plane gone, every record is dropped but the `max_queued` oldest ones
    a worker keeps for when it is back: a record that finds the queue full is dropped at once,
    and a batch whose call fails (connection refused) goes back to the front only as far as
    the bound allows. Whenever the timer takes a batch, records queued and the batch in flight
    together are back to `max_queued` once its call failed, so after N requests and the last
    failed call exactly N - `max_queued` were dropped, however the timer fell among them. The
    control plane started again (same command, environment and database), the kept records
    reach it: the first `max_queued` of the outage, each once."""
    bound, sent = 3, 8
    env = {"GATEWAY_CONCURRENCY": "1", "GATEWAY_RECORDS": json.dumps({"max_queued": bound})}
    with start_gateway("records-down", None, env) as gw:
        # The workspace's limits are read while the control plane answers (a worker that never
        # read them refuses rather than let a request past a limit it cannot know).
        before = gw.chat(custom_host(openai_mock), chat_body("before", model="m-down"))
        assert before.status_code == 200, before.text
        trace = before.headers["x-gateway-trace-id"]
        # Its record reached the control plane: the queue is empty again.
        eventually(reaches(lambda: len(gw.get(f"/v1/logs?trace_id={trace}").json()["data"]), 1))
        pid = gw.control_plane_pid()
        command, environment, directory = process_start(pid)
        os.kill(pid, signal.SIGKILL)
        traces = []
        for i in range(sent):
            r = gw.chat(custom_host(openai_mock), chat_body(f"request {i}", model="m-down"))
            assert r.status_code == 200, r.text
            assert r.json()["object"] == "chat.completion"
            traces.append(r.headers["x-gateway-trace-id"])
        eventually(reaches(lambda: value(gw, DROPPED), sent - bound), FLUSHED_WITHIN)
        again = subprocess.Popen(command, env=environment, cwd=directory, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            def found():
                return [len(gw.get(f"/v1/logs?trace_id={trace}").json().get("data", [])) for trace in traces]
            kept = [1] * bound + [0] * (sent - bound)
            eventually(reaches(found, kept), 30)
            assert value(gw, DROPPED) == sent - bound, "nothing more was dropped"
        finally:
            again.kill()
            again.wait()
