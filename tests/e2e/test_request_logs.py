"""Request logs (issue 15) in real Envoy with its control plane: with the control plane down,
requests are served as before and the records past the queue's bound are dropped and counted.

Each test runs a gateway of its own with one Envoy worker (`GATEWAY_CONCURRENCY=1`: one
record queue, so the counts are exact) and `GATEWAY_RECORDS` for its settings.
"""

from __future__ import annotations

import json
import os
import signal

from helpers import chat_body, custom_host
from test_observability import eventually, value

DROPPED = "gen_ai_gateway_records_dropped_total"


def test_with_the_control_plane_down_requests_are_served_and_records_past_the_bound_are_dropped(
        start_gateway, openai_mock):
    """With the control plane gone, every record is dropped but the `max_queued` newest ones
    a worker keeps for when it is back: a record that finds the queue full is dropped at once,
    and a batch whose call fails (connection refused) goes back to the front only as far as
    the bound allows. Whenever the timer takes a batch, records queued and the batch in flight
    together are back to `max_queued` once its call failed, so after N requests and the last
    failed call exactly N - `max_queued` were dropped, however the timer fell among them."""
    bound, sent = 3, 8
    env = {"GATEWAY_CONCURRENCY": "1", "GATEWAY_RECORDS": json.dumps({"max_queued": bound})}
    with start_gateway("records-down", None, env) as gw:
        os.kill(gw.control_plane_pid(), signal.SIGKILL)
        for i in range(sent):
            r = gw.chat(custom_host(openai_mock), chat_body(f"request {i}", model="m-down"))
            assert r.status_code == 200, r.text
            assert r.json()["object"] == "chat.completion"
        assert eventually(lambda: value(gw, DROPPED), sent - bound) == sent - bound
