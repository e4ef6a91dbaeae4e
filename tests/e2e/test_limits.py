"""Rate limits, token limits and budgets that hold across replicas, and each request's cost
(issue 26): the control plane's API, what a client sees of a limit, and strictness under
concurrent load with two replicas (each an Envoy with its control plane) sharing one
PostgreSQL; the rest runs on SQLite."""

from __future__ import annotations

import base64
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import httpx2 as httpx
from helpers import chat_body, custom_host
from mocks import Reply
from support import eventually, new_workspace_key, ok, put_limit, put_price, unique_model


@pytest.fixture(scope="module")
def single(start_gateway):
    """A gateway with its control plane on SQLite."""
    with start_gateway("limits-sqlite", None) as gw:
        yield gw


@pytest.fixture(scope="module")
def replicas(start_gateway, postgres):
    """Two gateways, each an Envoy with its control plane, sharing one PostgreSQL database
    and master key."""
    env = {
        "GATEWAY_DATABASE_URL": postgres.database(f"limits_{uuid.uuid4().hex[:8]}"),
        "GATEWAY_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
    }
    with start_gateway("limits-replica-a", None, env) as a, start_gateway("limits-replica-b", None, env) as b:
        yield a, b


def chat(gw, key: str, mock, model: str, **extra) -> httpx.Response:
    return gw.chat(custom_host(mock), chat_body(model=model, **extra), key=key)


def received(mock, model: str) -> int:
    return sum(1 for r in list(mock.requests) if (r.json or {}).get("model") == model)


# --------------------------------------------------------------------------- the control plane's API


def test_a_limit_is_stored_read_listed_and_deleted(single):
    team = new_workspace_key(single)
    limit = put_limit(single, {"api_key_id": team["id"], "model": "gpt-4o", "requests_per_minute": 5,
                               "budget_usd": 12.5, "budget_period": "day"})
    assert limit["requests_per_minute"] == 5 and limit["budget_period"] == "day"
    read = ok(single.get(f"/v1/limits/{limit['id']}"))
    assert read["usage"]["requests"] == 0 and read["usage"]["spent_usd"] == 0
    assert read["usage"]["period_start"] % 86400 == 0
    # The team's key reads its own workspace's limits.
    listed = ok(single.get("/v1/limits", key=team["key"]))
    assert [item["id"] for item in listed["data"]] == [limit["id"]]
    assert single.request("DELETE", f"/v1/limits/{limit['id']}").status_code in (200, 204)
    assert single.get(f"/v1/limits/{limit['id']}").status_code == 404


@pytest.mark.parametrize("body, field", [
    ({"workspace": "a", "api_key_id": "b", "requests_per_minute": 1}, "api_key_id"),
    ({"requests_per_minute": 1}, "workspace"),
    ({"workspace": "a", "requests_per_minute": 0}, "requests_per_minute"),
    ({"workspace": "a", "budget_usd": -1}, "budget_usd"),
    ({"workspace": "a", "budget_usd": 1, "budget_period": "week"}, "budget_period"),
    ({"workspace": "a", "tokens_per_minute": 1, "per": "hour"}, "per"),
])
def test_a_bad_limit_is_a_400_naming_its_field(single, body, field):
    resp = single.request("PUT", "/v1/limits/bad", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field


def test_prices_come_from_the_catalog_until_the_workspace_sets_its_own(single):
    team = new_workspace_key(single)
    catalog = ok(single.get("/v1/prices/gpt-4o-mini-2024-07-18", key=team["key"]))
    assert (catalog["input_per_million"], catalog["output_per_million"], catalog["source"]) == (0.15, 0.6, "catalog")
    assert catalog["date"]
    # Over the catalog's price: an admin's to set, for the workspace.
    by_team = single.request("PUT", "/v1/prices/gpt-4o-mini-2024-07-18", key=team["key"],
                             json={"input_per_million": 0, "output_per_million": 0})
    assert by_team.status_code == 403, by_team.text
    path = f"/v1/prices/gpt-4o-mini-2024-07-18?workspace={team['workspace']}"
    ok(single.request("PUT", path, json={"input_per_million": 1, "output_per_million": 2}))
    own = ok(single.get("/v1/prices/gpt-4o-mini-2024-07-18", key=team["key"]))
    assert (own["input_per_million"], own["source"]) == (1, "workspace")
    # Another workspace still sees the catalog's.
    assert ok(single.get("/v1/prices/gpt-4o-mini-2024-07-18"))["source"] == "catalog"
    assert single.get("/v1/prices/no-such-model", key=team["key"]).status_code == 404
    bad = single.request("PUT", "/v1/prices/m", key=team["key"], json={"input_per_million": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "output_per_million"


def test_anthropic_cache_reads_and_writes_are_priced_apart(single, anthropic_mock):
    """Input read from the prompt cache at `cached_input_per_million`, input written to it at
    `cache_write_per_million`, the rest at the input price."""
    team = new_workspace_key(single)
    model = unique_model()
    put_price(single, team["key"], model, input_per_million=1, output_per_million=10,
              cached_input_per_million=0.1, cache_write_per_million=1.25)
    usage = {"input_tokens": 100, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 400,
             "output_tokens": 10}
    answer = {"id": "msg_cache", "type": "message", "role": "assistant", "model": model, "stop_reason": "end_turn",
              "content": [{"type": "text", "text": "Cached."}], "usage": usage}
    anthropic_mock.script(Reply(body=answer), model=model)
    resp = single.chat(custom_host(anthropic_mock, provider="anthropic"), chat_body(model=model), key=team["key"])
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == 1500
    trace = resp.headers["x-gateway-trace-id"]

    def logged():  # 100 × 1 + 1000 × 0.1 + 400 × 1.25 + 10 × 10 micro-USD
        records = ok(single.get(f"/v1/logs?trace_id={trace}", key=team["key"]))["data"]
        assert records and records[0]["cost_usd"] == pytest.approx(800e-6), records
    eventually(logged)


# --------------------------------------------------------------------------- what a client sees


def test_every_answer_under_a_limit_says_how_it_stands_and_its_cost_is_logged(single, openai_mock):
    team = new_workspace_key(single)
    model = unique_model()
    put_price(single, team["key"], model, input_per_million=2, output_per_million=10)
    put_limit(single, {"api_key_id": team["id"], "requests_per_minute": 100})
    openai_mock.script(Reply(usage=(11, 7)), model=model, times=None)
    resp = chat(single, team["key"], openai_mock, model, max_tokens=20)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-ratelimit-limit-requests"] == "100"
    assert 0 <= int(resp.headers["x-ratelimit-remaining-requests"]) <= 99
    assert resp.headers["x-ratelimit-reset-requests"].endswith("s")
    trace = resp.headers["x-gateway-trace-id"]
    # 11 × 2 + 7 × 10 micro-USD.
    def logged():
        records = ok(single.get(f"/v1/logs?trace_id={trace}", key=team["key"]))["data"]
        assert records and records[0]["cost_usd"] == pytest.approx(92e-6), records
        assert records[0]["api_key_id"] == team["id"]
    eventually(logged)
    def usage():
        rows = ok(single.get("/v1/usage?group_by=model&group_by=api_key", key=team["key"]))["data"]
        assert rows == [{"model": model, "api_key": team["id"], "requests": 1, "input_tokens": 11,
                         "output_tokens": 7, "cost_usd": pytest.approx(92e-6)}], rows
    eventually(usage)
    stats = single.stats()
    cost = [v for k, v in stats.items() if "gen_ai_gateway_cost_micro_usd_total" in k and k.endswith(model)]
    assert cost == ["92"], cost


def test_a_budget_on_a_model_without_a_price_is_a_400_that_says_which_price_to_set(single, openai_mock):
    team = new_workspace_key(single)
    put_limit(single, {"workspace": team["workspace"], "budget_usd": 5})
    model = unique_model()
    resp = chat(single, team["key"], openai_mock, model, max_tokens=5)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "price_not_set" and f"PUT /v1/prices/{model}" in error["message"]
    assert received(openai_mock, model) == 0


def test_settled_usage_below_the_reservation_frees_the_difference(single, openai_mock):
    team = new_workspace_key(single)
    model = unique_model()
    # Output alone is priced: a worst case is max_tokens × $1000 per million = 50,000 micro-USD.
    put_price(single, team["key"], model, input_per_million=0, output_per_million=1000)
    limit = put_limit(single, {"workspace": team["workspace"], "budget_usd": 0.1})  # two worst cases
    openai_mock.script(Reply(usage=(11, 5)), model=model, times=None)
    for _ in range(10):
        resp = chat(single, team["key"], openai_mock, model, max_tokens=50)
        assert resp.status_code == 200, resp.text
    def spent():
        assert ok(single.get(f"/v1/limits/{limit['id']}"))["usage"]["spent_usd"] == pytest.approx(0.05)
    eventually(spent)


def test_a_stream_is_charged_its_reported_usage_and_a_cancelled_one_what_it_got(single, openai_mock):
    team = new_workspace_key(single)
    model = unique_model()
    put_price(single, team["key"], model, input_per_million=0, output_per_million=1000)
    limit = put_limit(single, {"workspace": team["workspace"], "budget_usd": 10})
    openai_mock.script(Reply(usage=(11, 7)), model=model)
    with single.stream("POST", "/v1/chat/completions", key=team["key"], headers=custom_host(openai_mock),
                       json=chat_body(model=model, stream=True, max_tokens=1000,
                                      stream_options={"include_usage": True})) as resp:
        assert resp.status_code == 200
        body = resp.read()
    assert b"[DONE]" in body
    def spent(expected):
        assert ok(single.get(f"/v1/limits/{limit['id']}"))["usage"]["spent_usd"] == pytest.approx(expected)
    eventually(lambda: spent(7 * 1000 / 1e6))

    # A stream the client leaves after its first event: charged for what was streamed, far
    # below its worst case (1000 tokens at $1000 per million: 1 USD).
    openai_mock.script(Reply(chunk_delay=0.2, text="word " * 50), model=model)
    with single.stream("POST", "/v1/chat/completions", key=team["key"], headers=custom_host(openai_mock),
                       json=chat_body(model=model, stream=True, max_tokens=1000)) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())
    def charged():
        usage = ok(single.get(f"/v1/limits/{limit['id']}"))["usage"]["spent_usd"]
        assert 0.007 < usage < 0.007 + 1.0, usage
    eventually(charged, within=20)


def test_every_endpoint_that_counts_tokens_is_limited_and_costed(single, openai_mock, anthropic_mock):
    """Chat, completions, embeddings, Messages (native on Anthropic) and Responses (native on
    OpenAI): each answer under the key's token limit says how the limit stands, and its usage,
    read from its own answer shape, is in the usage report at the workspace's prices."""
    team = new_workspace_key(single)
    model = unique_model()
    put_price(single, team["key"], model, input_per_million=1, output_per_million=1, max_output_tokens=100)
    put_limit(single, {"api_key_id": team["id"], "tokens_per_minute": 1_000_000, "budget_usd": 1})
    openai = custom_host(openai_mock)
    anthropic = {"x-gateway-provider": "anthropic", "x-gateway-custom-host": anthropic_mock.base_url,
                 "x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
    calls = [
        ("/v1/chat/completions", openai, chat_body(model=model, max_tokens=10)),
        ("/v1/completions", openai, {"model": model, "prompt": "Say hello.", "max_tokens": 10}),
        ("/v1/embeddings", openai, {"model": model, "input": "hello"}),
        ("/v1/messages", anthropic, {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", openai, {"model": model, "input": "hi", "max_output_tokens": 16}),
    ]
    for path, headers, body in calls:
        resp = single.post(path, body, key=team["key"], headers=headers)
        assert resp.status_code == 200, f"{path}: {resp.text}"
        assert resp.headers["x-ratelimit-limit-tokens"] == "1000000", path
    def report():
        rows = ok(single.get("/v1/usage?group_by=model", key=team["key"]))["data"]
        assert len(rows) == 1 and rows[0]["requests"] == len(calls), rows
        # Each mock reports (11, 7) tokens (embeddings: its input only); $1 per million tokens.
        assert rows[0]["cost_usd"] == pytest.approx((rows[0]["input_tokens"] + rows[0]["output_tokens"]) / 1e6)
        assert rows[0]["input_tokens"] >= 4 * 11 and rows[0]["output_tokens"] == 4 * 7, rows
    eventually(report)


# --------------------------------------------------------------------------- the sliding window


def reset_s(resp: httpx.Response) -> int:
    reset = resp.headers["x-ratelimit-reset-requests"]
    assert reset.endswith("s"), reset
    return int(reset[:-1])


@pytest.mark.slow
def test_a_request_counts_in_the_window_for_a_minute_from_its_admission(single, openai_mock):
    """3 a minute: one request at 0 s, two at 50.5 s; at 61.5 s the first has left the window
    (each came from a lease of its own, reported seconds after it), so exactly one more is
    admitted; no answer says the window resets later than a window from now."""
    team = new_workspace_key(single)
    model = unique_model()
    put_limit(single, {"api_key_id": team["id"], "requests_per_minute": 3})

    def at(offset: float) -> None:
        time.sleep(max(0.0, start + offset - time.monotonic()))  # the window's clock is the subject

    start = time.monotonic()
    first = chat(single, team["key"], openai_mock, model)
    assert first.status_code == 200, first.text
    assert reset_s(first) <= 60
    at(50.5)
    for _ in range(2):
        resp = chat(single, team["key"], openai_mock, model)
        assert resp.status_code == 200, resp.text
        assert reset_s(resp) <= 60
    full = chat(single, team["key"], openai_mock, model)
    assert full.status_code == 429, full.text
    assert 1 <= reset_s(full) <= 10, "the first request leaves the window at 60 s"
    at(61.5)
    assert [chat(single, team["key"], openai_mock, model).status_code for _ in range(2)] == [200, 429]
    assert received(openai_mock, model) == 4


# --------------------------------------------------------------------------- strict across replicas


def test_a_burst_of_three_times_a_limit_over_both_replicas_admits_exactly_the_limit(replicas, openai_mock):
    a, b = replicas
    team = new_workspace_key(a)
    model = unique_model()
    put_limit(a, {"api_key_id": team["id"], "requests_per_minute": 10})

    def one(i: int) -> httpx.Response:
        return chat((a, b)[i % 2], team["key"], openai_mock, model)

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(one, range(30)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 10 + [429] * 20, statuses
    for refused in (r for r in answers if r.status_code == 429):
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded", error
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-limit-requests"] == "10"
    assert received(openai_mock, model) == 10, "refused requests never reach the provider"


def test_a_budget_of_five_worst_cases_admits_five_of_twenty_concurrent_requests(replicas, openai_mock):
    a, b = replicas
    team = new_workspace_key(a)
    model = unique_model()
    put_price(a, team["key"], model, input_per_million=0, output_per_million=1000)
    # A worst case: 50 output tokens at $1000 per million = 0.05 USD; each answer uses all 50.
    limit = put_limit(a, {"workspace": team["workspace"], "budget_usd": 0.25, "budget_period": "total"})
    openai_mock.script(Reply(usage=(11, 50)), model=model, times=None)

    def one(i: int) -> httpx.Response:
        return chat((a, b)[i % 2], team["key"], openai_mock, model, max_tokens=50)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(one, range(20)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 5 + [429] * 15, statuses
    refused = next(r for r in answers if r.status_code == 429).json()["error"]
    assert (refused["type"], refused["code"]) == ("insufficient_quota", "budget_exceeded")
    assert received(openai_mock, model) == 5
    def spent():
        assert ok(b.get(f"/v1/limits/{limit['id']}"))["usage"]["spent_usd"] == pytest.approx(0.25)
    eventually(spent)


def test_a_replica_whose_control_plane_is_stopped_refuses_rather_than_overspends(start_gateway, openai_mock):
    with start_gateway("limits-cp-down", None) as gw:
        team = new_workspace_key(gw)
        model = unique_model()
        put_limit(gw, {"api_key_id": team["id"], "requests_per_minute": 1000})
        assert chat(gw, team["key"], openai_mock, model).status_code == 200
        os.kill(gw.control_plane_pid(), signal.SIGKILL)
        killed = time.monotonic()
        # What the worker's lease still holds may be spent until it ends (5 s); then every
        # request is refused at once, none hangs.
        while time.monotonic() - killed < 8:
            started = time.monotonic()
            resp = chat(gw, team["key"], openai_mock, model)
            assert time.monotonic() - started < 5, "no hang"
            if time.monotonic() - killed > 6.5:
                assert resp.status_code == 503, resp.text
                assert resp.json()["error"]["code"] == "limits_unavailable"
            time.sleep(0.2)  # the pace of asking: the lease's clock decides, both bounds asserted above
