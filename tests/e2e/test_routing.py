"""Routing and resilience in real Envoy: fallback, loadbalance, conditional, nesting and
inheritance, retries with backoff and Retry-After, per-attempt timeouts, the circuit breaker
(shared by every worker, updated with compare-and-swap), and streaming under recovery.

Targets of one mock are told apart by the model each one forces (`override_params`), which
the mock's scripts match on; recovery attempts run as calls dispatched by the filter.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import (KEY, OPENAI_KEYS, assert_chat_completion, assert_error, chat_body, config, error_of, read_stream,
                     served_by)
from mocks import OpenAIMock, Reply


def target(mock, model: str, **extra) -> dict:
    """A target of `mock` that forces `model`, so scripts can address it."""
    return {"provider": "openai" if isinstance(mock, OpenAIMock) else "anthropic", "api_key": "sk-config-key",
            "custom_host": mock.base_url, "override_params": {"model": model, **extra.pop("params", {})}, **extra}


def fallback(*targets, **strategy) -> dict:
    return {"strategy": {"mode": "fallback", **strategy}, "targets": list(targets)}


def models(mock) -> list[str]:
    return [r.json["model"] for r in mock.requests]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def fresh_mock():
    """A provider whose host Envoy has never routed to (not in the forward proxy's DNS cache)."""
    mock = OpenAIMock(OPENAI_KEYS).start()
    yield mock
    mock.stop()


# --------------------------------------------------------------------------- fallback


def test_fallback_moves_on_after_a_failure(gateway, openai_mock):
    openai_mock.script(model="m-a", status=500)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"))))
    assert r.status_code == 200, r.text
    assert_chat_completion(r.json())
    assert r.json()["model"] == "m-b"
    assert models(openai_mock) == ["m-a", "m-b"]
    assert r.headers["x-gateway-target"] == "targets[1]"
    assert r.headers["x-gateway-retries"] == "0"
    served_by(r, "openai")
    assert r.headers["x-gateway-trace-id"]


def test_fallback_happy_path_calls_only_the_first_target(gateway, openai_mock):
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"))))
    assert r.status_code == 200, r.text
    assert models(openai_mock) == ["m-a"]
    assert r.headers["x-gateway-target"] == "targets[0]"
    assert r.headers["x-gateway-retries"] == "0"


def test_fallback_reaches_a_host_the_proxy_never_resolved(gateway, openai_mock, fresh_mock):
    openai_mock.script(model="m-a", status=502)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(fresh_mock, "m-fresh"))))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m-fresh"
    rec = fresh_mock.last
    assert rec.header("authorization") == "Bearer sk-config-key"
    assert rec.json["messages"][0]["content"] == "Say hello."
    assert rec.header("x-gateway-api-key") is None


def test_fallback_from_an_unreachable_provider(gateway, openai_mock):
    dead = {"provider": "openai", "api_key": "sk-config-key", "custom_host": f"http://127.0.0.1:{closed_port()}/v1"}
    r = gateway.chat(config(fallback(dead, target(openai_mock, "m-b"))))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-target"] == "targets[1]"


def test_on_status_codes_limit_what_falls_back(gateway, openai_mock):
    openai_mock.script(model="m-a", status=500)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"), on_status_codes=[429])))
    assert_error(r, 500)
    assert models(openai_mock) == ["m-a"]
    openai_mock.script(model="m-a", status=429)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"), on_status_codes=[429])))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m-b"


def test_on_status_codes_beside_the_strategy_or_on_a_target_limit_what_falls_back(gateway, openai_mock):
    """Spec 2.1: `on_status_codes` of a config or target, "status codes that trigger fallback"."""
    openai_mock.script(model="m-a", status=500)
    beside = {**fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b")), "on_status_codes": [429]}
    assert_error(gateway.chat(config(beside)), 500)
    assert models(openai_mock) == ["m-a"]
    # On the target: its own list, in place of the fallback's.
    openai_mock.reset()
    openai_mock.script(model="m-a", status=500)
    own = fallback(target(openai_mock, "m-a", on_status_codes=[500]), target(openai_mock, "m-b"), on_status_codes=[429])
    r = gateway.chat(config(own))
    assert (r.status_code, r.headers["x-gateway-target"]) == (200, "targets[1]"), r.text
    assert models(openai_mock) == ["m-a", "m-b"]


def test_when_every_target_fails_the_last_failure_is_the_answer(gateway, openai_mock):
    openai_mock.script(model="m-a", status=500)
    openai_mock.script(OpenAIMock.error(503, "b is overloaded", "server_error"), model="m-b")
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"))))
    err = assert_error(r, 503, type="server_error")
    assert "b is overloaded" in err["message"]
    assert r.headers["x-gateway-target"] == "targets[1]"
    assert models(openai_mock) == ["m-a", "m-b"]


def test_fallback_to_another_provider_translates(gateway, openai_mock, anthropic_mock):
    openai_mock.script(model="m-a", status=500)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(anthropic_mock, "claude-b"))))
    assert r.status_code == 200, r.text
    assert_chat_completion(r.json())
    assert r.json()["object"] == "chat.completion"
    served_by(r, "anthropic")
    assert anthropic_mock.last.header("x-api-key") == "sk-config-key"


def test_streaming_under_fallback_is_delivered_after_recovery(gateway, openai_mock, anthropic_mock):
    openai_mock.script(model="m-a", status=503)
    cfg = config(fallback(target(openai_mock, "m-a"), target(anthropic_mock, "claude-b")))
    with gateway.stream("POST", "/v1/chat/completions", headers=cfg, json=chat_body(stream=True)) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-gateway-target"] == "targets[1]"
        result = read_stream(resp)
    assert result.done
    assert result.content
    assert anthropic_mock.last.json["stream"] is True


def test_openai_sdk_sees_the_fallback_answer(gateway, openai_mock):
    openai_mock.script(model="m-a", status=429)
    client = gateway.sdk(headers=config(fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"))))
    completion = client.chat.completions.create(model="gpt-mock", messages=[{"role": "user", "content": "hi"}])
    assert completion.model == "m-b"
    stream = client.chat.completions.create(model="gpt-mock", messages=[{"role": "user", "content": "hi"}],
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# --------------------------------------------------------------------------- nesting, loadbalance


def test_nested_strategies_report_the_path_of_the_target(gateway, openai_mock):
    inner = {"strategy": {"mode": "loadbalance"},
             "targets": [target(openai_mock, "m-never", weight=0), target(openai_mock, "m-inner")]}
    cfg = fallback(target(openai_mock, "m-a"), inner)
    openai_mock.script(model="m-a", status=500)
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-target"] == "targets[1].targets[1]"
    assert models(openai_mock) == ["m-a", "m-inner"]


def test_inner_fallback_codes_do_not_stop_the_outer_one(gateway, openai_mock):
    inner = fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b"), on_status_codes=[429])
    cfg = fallback(inner, target(openai_mock, "m-c"))
    openai_mock.script(model="m-a", status=500)  # the inner fallback does not take 500 ...
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    assert models(openai_mock) == ["m-a", "m-c"]  # ... so the whole inner target failed
    assert r.headers["x-gateway-target"] == "targets[1]"


def test_children_inherit_options(gateway, openai_mock):
    cfg = {"strategy": {"mode": "fallback"}, "override_params": {"temperature": 0.2, "max_tokens": 5},
           "retry": {"attempts": 1}, "forward_headers": ["x-team"],
           "targets": [target(openai_mock, "m-a", params={"max_tokens": 9}), target(openai_mock, "m-b")]}
    openai_mock.script(model="m-a", status=500, times=2)
    r = gateway.chat({**config(cfg), "x-team": "blue"})
    assert r.status_code == 200, r.text
    recs = openai_mock.requests
    assert models(openai_mock) == ["m-a", "m-a", "m-b"]  # the inherited retry, then the fallback
    assert [rec.json["max_tokens"] for rec in recs] == [9, 9, 5]  # the child's value wins
    assert all(rec.json["temperature"] == 0.2 for rec in recs)
    assert all(rec.header("x-team") == "blue" for rec in recs)
    assert r.headers["x-gateway-retries"] == "1"


def test_loadbalance_spreads_by_weight(gateway, openai_mock):
    cfg = {"strategy": {"mode": "loadbalance"},
           "targets": [target(openai_mock, "m-a", weight=1), target(openai_mock, "m-b", weight=1)]}
    for _ in range(40):
        assert gateway.chat(config(cfg)).status_code == 200
    seen = models(openai_mock)
    assert 5 < seen.count("m-a") < 35, seen


# --------------------------------------------------------------------------- conditional


def conditional(*conditions, default="fallback-target"):
    return {"strategy": {"mode": "conditional", "default": default,
                         "conditions": [{"query": q, "then": t} for q, t in conditions]}}


def test_conditional_routes_on_metadata_params_and_path(gateway, openai_mock):
    cfg = {**conditional(({"metadata.tier": "pro"}, "pro"),
                         ({"params.temperature": {"$gte": 1.5}, "url.pathname": {"$regex": "chat"}}, "hot"),
                         ({"$or": [{"params.user": {"$in": ["ann", "bob"]}}, {"metadata.team.name": "x"}]}, "known")),
           "targets": [target(openai_mock, "m-pro", name="pro"), target(openai_mock, "m-hot", name="hot"),
                       target(openai_mock, "m-known", name="known"), target(openai_mock, "m-default", name="fallback-target")]}

    def route(body=None, metadata=None):
        headers = config(cfg)
        if metadata is not None:
            headers["x-gateway-metadata"] = json.dumps(metadata)
        r = gateway.chat(headers, body or chat_body())
        assert r.status_code == 200, r.text
        return r.json()["model"], r.headers.get("x-gateway-target")

    assert route(metadata={"tier": "pro"}) == ("m-pro", "targets[0]")
    assert route(chat_body(temperature=1.8)) == ("m-hot", "targets[1]")
    assert route(chat_body(user="bob")) == ("m-known", "targets[2]")
    assert route(metadata={"team": {"name": "x"}}) == ("m-known", "targets[2]")
    assert route(chat_body(temperature=0.1), metadata={"tier": "free"}) == ("m-default", "targets[3]")


def test_conditional_config_errors_are_found_at_validation(gateway, openai_mock):
    cfg = {**conditional(({"params.model": {"$bogus": 1}}, "a"), default="a"), "targets": [target(openai_mock, "m", name="a")]}
    err = assert_error(gateway.chat(config(cfg)), 400, code="invalid_config")
    assert "$bogus" in err["message"]
    cfg = {**conditional(({"metadata.x": 1}, "missing"), default="a"), "targets": [target(openai_mock, "m", name="a")]}
    err = assert_error(gateway.chat(config(cfg)), 400, code="invalid_config")
    assert "missing" in err["message"]
    assert openai_mock.requests == []


# --------------------------------------------------------------------------- retries


def test_retries_until_success(gateway, openai_mock):
    openai_mock.script(status=503, times=2)
    cfg = {**target(openai_mock, "m-a"), "retry": {"attempts": 3}}
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-retries"] == "2"
    assert len(openai_mock.requests) == 3
    gaps = [b.received_at - a.received_at for a, b in zip(openai_mock.requests, openai_mock.requests[1:])]
    assert all(gap < 2.0 for gap in gaps), gaps  # full jitter below the 200/400 ms ceilings, plus overhead


def test_retries_stop_after_the_attempts(gateway, openai_mock):
    openai_mock.script(status=500, times=None)
    r = gateway.chat(config({**target(openai_mock, "m-a"), "retry": {"attempts": 2}}))
    assert_error(r, 500)
    assert r.headers["x-gateway-retries"] == "2"
    assert len(openai_mock.requests) == 3


def test_statuses_outside_the_retry_list_are_not_retried(gateway, openai_mock):
    openai_mock.script(status=400)
    r = gateway.chat(config({**target(openai_mock, "m-a"), "retry": {"attempts": 3}}))
    assert_error(r, 400)
    assert len(openai_mock.requests) == 1
    openai_mock.reset()
    openai_mock.script(status=418, times=None)
    r = gateway.chat(config({**target(openai_mock, "m-a"), "retry": {"attempts": 1, "on_status_codes": [418]}}))
    assert_error(r, 418)
    assert len(openai_mock.requests) == 2


def test_retry_after_is_honoured(gateway, openai_mock):
    openai_mock.script(status=429, headers={"retry-after-ms": "700"})
    cfg = {**target(openai_mock, "m-a"), "retry": {"attempts": 1, "use_retry_after_headers": True}}
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    first, second = openai_mock.requests
    assert second.received_at - first.received_at >= 0.65


def test_retry_after_beyond_the_cap_returns_the_response(gateway, openai_mock):
    openai_mock.script(status=429, headers={"retry-after": "3600"})
    cfg = {**target(openai_mock, "m-a"), "retry": {"attempts": 3, "use_retry_after_headers": True}}
    started = time.monotonic()
    r = gateway.chat(config(cfg))
    assert_error(r, 429)
    assert time.monotonic() - started < 5
    assert len(openai_mock.requests) == 1


def test_retries_of_a_stream(gateway, openai_mock):
    openai_mock.script(status=500)
    cfg = config({**target(openai_mock, "m-a"), "retry": {"attempts": 1}})
    with gateway.stream("POST", "/v1/chat/completions", headers=cfg, json=chat_body(stream=True)) as resp:
        assert resp.status_code == 200
        assert resp.headers["x-gateway-retries"] == "1"
        result = read_stream(resp)
    assert result.done and result.content


# --------------------------------------------------------------------------- timeouts


def test_timeout_in_single_mode_is_a_408(gateway, openai_mock):
    openai_mock.script(stall=2.0)
    r = gateway.chat(config({**target(openai_mock, "m-a"), "request_timeout": 300}))
    assert_error(r, 408, type="timeout_error")


def test_timeout_falls_back(gateway, openai_mock):
    openai_mock.script(model="m-a", stall=2.0)
    cfg = {**fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b")), "request_timeout": 400}
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m-b"


def test_timeout_of_the_last_dispatched_attempt_is_a_408(gateway, openai_mock):
    openai_mock.script(model="m-a", status=500)
    openai_mock.script(model="m-b", stall=2.0)
    cfg = {**fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b")), "request_timeout": 400}
    r = gateway.chat(config(cfg))
    assert_error(r, 408, type="timeout_error")


def test_a_started_stream_is_not_cut_by_the_timeout(gateway, openai_mock):
    openai_mock.script(chunk_delay=0.2, chunks=["a ", "b ", "c ", "d"])
    cfg = config({**fallback(target(openai_mock, "m-a"), target(openai_mock, "m-b")), "request_timeout": 300})
    with gateway.stream("POST", "/v1/chat/completions", headers=cfg, json=chat_body(stream=True)) as resp:
        result = read_stream(resp)
    assert result.done
    assert result.content == "a b c d"
    assert models(openai_mock) == ["m-a"]


# --------------------------------------------------------------------------- circuit breaker


def breaker(threshold: int, **extra) -> dict:
    return {"failure_threshold": threshold, "cooldown_interval": 30000, **extra}


def unique_key(mock) -> str:
    """A credential of its own (issued by ``mock``), so each test has its own circuit."""
    key = f"sk-cb-{uuid.uuid4().hex[:12]}"
    mock.keys.add(key)
    return key


def circuits_opened(gateway) -> int:
    stats = gateway.stats()
    return sum(int(v) for k, v in stats.items() if k.endswith("gen_ai_gateway_circuits_opened_total"))


def circuits_open(gateway) -> int:
    """The gauge of circuits open now (0 before any circuit opened: the stat is not defined yet)."""
    stats = gateway.stats()
    # `wasmcustom.` in the wasm build, `dynamicmodulescustom.` in the native one.
    return sum(int(v) for k, v in stats.items() if k.endswith("custom.gen_ai_gateway_circuits_open"))


def test_open_circuit_is_skipped_by_fallback(gateway, openai_mock):
    key = unique_key(openai_mock)
    cfg = {**fallback({**target(openai_mock, "m-a"), "api_key": key}, target(openai_mock, "m-b")),
           "cb_config": breaker(2)}
    openai_mock.script(model="m-a", status=500, times=None)
    for _ in range(2):
        assert gateway.chat(config(cfg)).status_code == 200
    assert models(openai_mock) == ["m-a", "m-b", "m-a", "m-b"]
    for _ in range(3):
        r = gateway.chat(config(cfg))
        assert r.status_code == 200
        assert r.headers["x-gateway-target"] == "targets[1]"
    assert models(openai_mock).count("m-a") == 2  # open: never called again


def test_every_circuit_open_is_a_503(gateway, openai_mock):
    cfg = {**target(openai_mock, "m-a"), "api_key": unique_key(openai_mock), "cb_config": breaker(1)}
    openai_mock.script(status=502, times=None)
    assert_error(gateway.chat(config(cfg)), 502)
    err = assert_error(gateway.chat(config(cfg)), 503, code="circuit_open")
    assert "circuit" in err["message"]
    assert len(openai_mock.requests) == 1


def test_statuses_not_counted_do_not_open_the_circuit(gateway, openai_mock):
    cfg = {**target(openai_mock, "m-a"), "api_key": unique_key(openai_mock), "cb_config": breaker(1, failure_status_codes=[503])}
    openai_mock.script(status=500, times=3)
    for _ in range(3):
        assert_error(gateway.chat(config(cfg)), 500)
    assert gateway.chat(config(cfg)).status_code == 200


def test_open_circuits_are_left_out_of_loadbalance(gateway, openai_mock):
    bad = {**target(openai_mock, "m-bad"), "api_key": unique_key(openai_mock)}
    cfg = {"strategy": {"mode": "loadbalance"}, "cb_config": breaker(1),
           "targets": [bad, target(openai_mock, "m-good")]}
    openai_mock.script(model="m-bad", status=500, times=None)
    for _ in range(30):
        gateway.chat(config(cfg))
    assert models(openai_mock).count("m-bad") == 1


def test_concurrent_failures_are_counted_exactly(gateway, openai_mock):
    """Both Envoy workers update one circuit at once: no count is lost and it opens once."""
    threshold = 40
    cfg = config({**target(openai_mock, "m-a"), "api_key": unique_key(openai_mock), "cb_config": breaker(threshold)})
    openai_mock.script(status=500, times=None)
    before, open_before = circuits_opened(gateway), circuits_open(gateway)
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda _: gateway.chat(cfg).status_code, range(threshold - 1)))
    assert statuses == [500] * (threshold - 1)
    assert len(openai_mock.requests) == threshold - 1
    assert circuits_opened(gateway) == before  # one failure short: still closed
    assert circuits_open(gateway) == open_before
    assert gateway.chat(cfg).status_code == 500  # the threshold-th failure opens it
    assert circuits_opened(gateway) == before + 1
    assert circuits_open(gateway) == open_before + 1
    assert_error(gateway.chat(cfg), 503, code="circuit_open")
    assert len(openai_mock.requests) == threshold


def test_a_burst_opens_the_circuit_once(gateway, openai_mock):
    cfg = config({**target(openai_mock, "m-a"), "api_key": unique_key(openai_mock), "cb_config": breaker(5)})
    openai_mock.script(status=500, times=None)
    before = circuits_opened(gateway)
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda _: gateway.chat(cfg).status_code, range(60)))
    assert set(statuses) <= {500, 503} and statuses.count(503) > 0
    assert circuits_opened(gateway) == before + 1


@pytest.mark.slow
def test_circuit_closes_after_the_cooldown_with_one_trial(gateway, openai_mock):
    cooldown = 30.0  # breaker()'s cooldown_interval, the shortest the config accepts
    cfg = config({**target(openai_mock, "m-a"), "api_key": unique_key(openai_mock), "cb_config": breaker(1)})
    openai_mock.script(status=500)
    open_before = circuits_open(gateway)
    before_open = time.monotonic()
    assert_error(gateway.chat(cfg), 500)
    after_open = time.monotonic()  # the circuit opened (on Envoy's clock) between these two
    assert_error(gateway.chat(cfg), 503, code="circuit_open")
    release = threading.Event()
    held = openai_mock.script(Reply(hold=release, hold_timeout=30))  # the trial's answer waits for the test
    # The cooldown runs on Envoy's real clock, which a test cannot move: ask again (a refusal
    # changes nothing in the circuit) until one request is admitted as the trial, seen as its
    # arrival at the mock. Until then every answer is the open circuit's 503, and once the
    # cooldown has surely passed the very next request must be the trial.
    with ThreadPoolExecutor(max_workers=2) as pool:
        while True:
            asked = time.monotonic()
            attempt = pool.submit(gateway.chat, cfg)
            while not held.received.wait(0.05):  # the trial arrived, or ...
                if attempt.done():  # ... the gateway refused this one
                    break
            if held.received.is_set():
                break
            assert_error(attempt.result(), 503, code="circuit_open")
            assert asked < after_open + cooldown + 0.05, "still open after the cooldown"
            time.sleep(0.2)  # the pace of asking, not a synchronisation
        trial = attempt
        assert openai_mock.requests[-1].received_at >= before_open + cooldown - 0.01, "a trial before the cooldown"
        # While the trial is in flight (its answer held by the mock), others are still held back.
        assert_error(gateway.chat(cfg), 503, code="circuit_open")
        assert not trial.done()
        release.set()
        assert trial.result(timeout=10).status_code == 200
    assert held.hold_timed_out is False
    assert gateway.chat(cfg).status_code == 200
    assert len(openai_mock.requests) == 3
    assert circuits_open(gateway) == open_before  # open, on trial, then closed again


# --------------------------------------------------------------------------- edges


def test_a_body_the_gateway_does_not_read_is_never_resent_empty(gateway, openai_mock, fresh_mock):
    """Uploads pass through unread, so a failure cannot be retried or fall back: the client
    gets the provider's answer, and no target receives a truncated request."""
    openai_mock.script(status=500, path="/v1/audio/transcriptions")
    cfg = {**fallback({**target(openai_mock, "m-a"), "retry": {"attempts": 2}}, target(fresh_mock, "m-b"))}
    client = gateway.sdk(headers=config(cfg))
    with pytest.raises(Exception) as raised:
        client.audio.transcriptions.create(model="whisper-mock", file=("clip.wav", b"RIFF" + b"\0" * 64, "audio/wav"))
    assert getattr(raised.value, "status_code", None) == 500
    assert len(openai_mock.requests_to("/v1/audio/transcriptions")) == 1
    assert fresh_mock.requests_to("/v1/audio/transcriptions") == []


def test_a_target_that_cannot_take_the_request_is_skipped(gateway, openai_mock, anthropic_mock):
    openai_mock.script(model="m-a", status=500)
    cfg = fallback(target(openai_mock, "m-a"), target(anthropic_mock, "claude-b"), target(openai_mock, "m-c"))
    r = gateway.chat(config(cfg), chat_body(n=2))  # Anthropic has no `n`
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-target"] == "targets[2]"
    assert anthropic_mock.requests == []


def test_a_first_target_that_cannot_take_the_request_is_skipped(gateway, openai_mock, anthropic_mock):
    cfg = fallback(target(anthropic_mock, "claude-a"), target(openai_mock, "m-b"))
    r = gateway.chat(config(cfg), chat_body(n=2))  # Anthropic has no `n`
    assert (r.status_code, r.headers["x-gateway-target"]) == (200, "targets[1]"), r.text
    assert r.json()["model"] == "m-b" and anthropic_mock.requests == []
    # No target can: the refusal of the last one is the answer.
    cfg = fallback(target(anthropic_mock, "claude-a"), target(anthropic_mock, "claude-b"))
    assert_error(gateway.chat(config(cfg), chat_body(n=2)), 400, param="n")
    assert anthropic_mock.requests == []


def test_the_target_header_names_the_target_whose_answer_is_returned(gateway, openai_mock, anthropic_mock):
    """The first target's 500 is the answer when the next cannot take the request."""
    openai_mock.script(model="m-a", status=500)
    r = gateway.chat(config(fallback(target(openai_mock, "m-a"), target(anthropic_mock, "claude-b"))), chat_body(n=2))
    assert_error(r, 500)
    assert r.headers["x-gateway-target"] == "targets[0]"
    assert anthropic_mock.requests == []


def test_a_stream_forced_by_override_params_is_served_as_a_stream(gateway, openai_mock):
    """`override_params` force any payload parameter (spec 2.1), `stream` too: the answer is
    the stream the provider was asked for."""
    r = gateway.chat(config(target(openai_mock, "m-a", params={"stream": True})))
    assert r.status_code == 200, r.text
    assert openai_mock.last.json["stream"] is True
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "data: [DONE]" in r.text


def test_client_envoy_headers_do_not_steer_the_router(gateway, openai_mock):
    headers = {**config({**target(openai_mock, "m-a"), "cb_config": breaker(1)}),
               "x-envoy-upstream-rq-per-try-timeout-ms": "1", "x-envoy-max-retries": "5"}
    openai_mock.script(stall=0.2)
    r = gateway.chat(headers)
    assert r.status_code == 200, r.text
    assert openai_mock.last.header("x-envoy-max-retries") is None
