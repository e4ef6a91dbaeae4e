"""The console (issue 47) through the gateway's listener: its paths reach the control plane past
the filter, a gateway key signs in to a session kept in a cookie, and the overview counts what
went through the gateway. (The pages themselves, in a real browser, come with them.)"""

from __future__ import annotations

import uuid

import httpx2 as httpx
from helpers import CHAT, KEY, chat_body, custom_host
from support import eventually, logged


def test_a_key_signs_in_through_the_gateway_and_the_overview_counts_its_requests(gateway, openai_mock):
    model = f"m-console-{uuid.uuid4().hex[:8]}"
    trace_id = f"console-{uuid.uuid4().hex[:12]}"
    headers = {**custom_host(openai_mock), "x-gateway-trace-id": trace_id}
    r = gateway.request("POST", CHAT, headers=headers, json=chat_body("count me", model=model))
    assert r.status_code == 200, r.text
    logged(gateway, trace_id)

    # A cookie jar as a browser keeps one: the key signs in once, the cookie does the rest.
    with httpx.Client(base_url=gateway.origin, timeout=10.0) as browser:
        assert browser.get("/console/api/overview").status_code == 401
        r = browser.post("/console/session", json={"key": "gw-wrong"})
        assert r.status_code == 401 and r.json()["error"]["message"]
        r = browser.post("/console/session", json={"key": KEY})
        assert r.status_code == 200, r.text
        assert {"httponly", "samesite=strict", "path=/console"} <= \
            {part.strip().lower() for part in r.headers["set-cookie"].split(";")}
        assert r.headers["content-security-policy"].startswith("default-src 'self'")

        def counted():
            overview = browser.get("/console/api/overview", params={"range": "hour"})
            assert overview.status_code == 200, overview.text
            rows = [row for row in overview.json()["breakdown"]["model"] if row["value"] == model]
            assert [(row["requests"], row["errors"]) for row in rows] == [(1, 0)], rows
            return overview.json()
        overview = eventually(counted)
        assert any(row["value"] == "openai" for row in overview["breakdown"]["provider"])
