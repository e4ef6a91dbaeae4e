"""Metrics and the access log in real Envoy: the filter's stats at the admin `/stats/prometheus`
with the labels the shipped config's `stats_tags` extract (exact counts and token sums per
label after known traffic: non-streamed, streamed, cache hit, retry, fallback, a translated
provider, a model outside the configured list), and the JSON access-log line of each request
with every field. No secret, and no prompt, in either.

The module runs its own gateway (its counts are exact: no other test's traffic reaches it),
with GATEWAY_ACCESS_LOG in a file of its own and GATEWAY_METRICS listing the models that get
a label and asking for the usage of streams whose client did not (`stream_usage`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import httpx2 as httpx
import pytest
from helpers import CLIENT_TOKEN, SECRETS, chat_body, config, custom_host, read_stream
from support import FLUSHED_WITHIN, access_lines, eventually, prometheus, reaches, value

MODELS = ["m-chat", "m-stream", "m-stream-asked", "m-cache", "m-retry", "m-fall-a", "m-fall-b", "m-err", "m-denied", "claude-obs",
          "gpt-4.1"]
PROMPT = "the secret prompt text 7f3a"


@pytest.fixture(scope="module")
def obs(start_gateway, tmp_path_factory):
    """A gateway of this module's own: its access log in a file of its own, the metrics' models
    listed."""
    access_log = tmp_path_factory.mktemp("obs-access") / "access.log"
    env = {"GATEWAY_ACCESS_LOG": str(access_log),
           "GATEWAY_METRICS": json.dumps({"models": MODELS, "stream_usage": True})}
    with start_gateway("observability", None, env) as gw:
        gw.access_log = access_log
        yield gw


def trace() -> str:
    return f"obs-{uuid.uuid4().hex[:12]}"


def openai_target(mock, model: str) -> dict:
    return {"provider": "openai", "api_key": "sk-config-key", "custom_host": mock.base_url,
            "override_params": {"model": model}}


def failing_fallback(mock) -> dict:
    """A fallback whose first target (model m-fall-a) answers 500 once; m-fall-b answers."""
    mock.script(status=500, model="m-fall-a")
    return {"strategy": {"mode": "fallback"}, "targets": [openai_target(mock, "m-fall-a"),
                                                          openai_target(mock, "m-fall-b")]}


# --------------------------------------------------------------------------- metrics


def test_non_streamed_requests_count_per_label_with_exact_token_sums(obs, openai_mock):
    for _ in range(2):
        r = obs.chat(custom_host(openai_mock), chat_body(PROMPT, model="m-chat"))
        assert r.status_code == 200, r.text
    openai_mock.script(status=400)
    assert obs.chat(custom_host(openai_mock), chat_body(model="m-err")).status_code == 400
    labels = dict(provider="openai", model="m-chat")
    assert value(obs, "gen_ai_gateway_requests_total", status_class="2xx", cache_status="disabled", **labels) == 2
    assert value(obs, "gen_ai_gateway_requests_total", model="m-err", status_class="4xx") == 1
    # The mock's default usage is 11 prompt and 7 completion tokens per answer.
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="input", **labels) == 22
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="output", **labels) == 14
    eventually(reaches(lambda: value(obs, "gen_ai_server_request_duration_count", **labels), 2), FLUSHED_WITHIN)
    # Milliseconds: two fast local answers, every bucket from 1000 ms up holds both.
    assert value(obs, "gen_ai_server_request_duration_bucket", le="1000", **labels) == 2
    assert value(obs, "gen_ai_server_time_to_first_token_count", **labels) == 0, "not a stream"


def test_a_stream_counts_time_to_first_token_and_the_usage_it_asked_for(obs, openai_mock):
    body = chat_body(model="m-stream", stream=True, stream_options={"include_usage": True})
    with obs.stream("POST", "/v1/chat/completions", headers=custom_host(openai_mock), json=body) as r:
        assert r.status_code == 200
        result = read_stream(r)
    assert result.done
    labels = dict(provider="openai", model="m-stream")
    assert value(obs, "gen_ai_gateway_requests_total", status_class="2xx", **labels) == 1
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="input", **labels) == 11
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="output", **labels) == 7
    eventually(reaches(lambda: value(obs, "gen_ai_server_time_to_first_token_count", **labels), 1), FLUSHED_WITHIN)
    assert value(obs, "gen_ai_server_request_duration_count", **labels) == 1


def test_a_stream_without_usage_is_counted_and_reaches_the_client_as_it_asked(obs, openai_mock):
    body = chat_body(model="m-stream-asked", stream=True)
    with obs.stream("POST", "/v1/chat/completions", headers=custom_host(openai_mock), json=body) as r:
        assert r.status_code == 200
        result = read_stream(r)
    assert result.done and result.content and result.usage is None
    assert all("usage" not in chunk for chunk in result.chunks), result.chunks
    assert openai_mock.last.json["stream_options"] == {"include_usage": True}, "asked upstream"
    labels = dict(provider="openai", model="m-stream-asked")
    # A stream's record (and its counters) is written when Envoy ends the request, which may
    # come just after the client read the last chunk.
    tokens = lambda kind: value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type=kind, **labels)  # noqa: E731
    eventually(reaches(lambda: tokens("input"), 11), FLUSHED_WITHIN)
    eventually(reaches(lambda: tokens("output"), 7), FLUSHED_WITHIN)
    # The SDK's stream, without usage, is what it always was.
    stream = obs.sdk(custom_host(openai_mock)).chat.completions.create(
        model="m-stream-asked", stream=True, messages=[{"role": "user", "content": "Count"}])
    chunks = list(stream)
    assert chunks and all(c.usage is None for c in chunks)
    eventually(reaches(lambda: tokens("input"), 22), FLUSHED_WITHIN)


def test_a_translated_provider_counts_its_tokens(obs, anthropic_mock):
    r = obs.chat(custom_host(anthropic_mock, "anthropic"), chat_body(model="claude-obs"))
    assert r.status_code == 200, r.text
    labels = dict(provider="anthropic", model="claude-obs")
    assert value(obs, "gen_ai_gateway_requests_total", status_class="2xx", **labels) == 1
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="input", **labels) == 11
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="output", **labels) == 7


def test_a_cache_hit_counts_as_a_hit_with_no_tokens_and_one_store(obs, openai_mock):
    stores = value(obs, "gen_ai_gateway_cache_stores_total")
    cfg = config({"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url,
                  "cache": {"mode": "simple"}})
    body = chat_body(f"cache me {uuid.uuid4()}", model="m-cache")
    assert obs.chat(cfg, body).headers["x-gateway-cache-status"] == "MISS"
    assert obs.chat(cfg, body).headers["x-gateway-cache-status"] == "HIT"
    labels = dict(provider="openai", model="m-cache")
    assert value(obs, "gen_ai_gateway_requests_total", cache_status="miss", **labels) == 1
    assert value(obs, "gen_ai_gateway_requests_total", cache_status="hit", **labels) == 1
    assert value(obs, "gen_ai_client_token_usage_total", gen_ai_token_type="input", **labels) == 11, "the hit spent none"
    assert value(obs, "gen_ai_gateway_cache_stores_total") == stores + 1
    assert value(obs, "gen_ai_gateway_cache_stored_bytes_total") > 0


def test_a_retry_and_a_fallback_count_by_provider(obs, openai_mock):
    retries = value(obs, "gen_ai_gateway_retries_total", provider="openai")
    fallbacks = value(obs, "gen_ai_gateway_fallbacks_total", provider="openai")
    openai_mock.script(status=503, model="m-retry")
    r = obs.chat(config({**openai_target(openai_mock, "m-retry"), "retry": {"attempts": 1}}))
    assert (r.status_code, r.headers["x-gateway-retries"]) == (200, "1")
    assert value(obs, "gen_ai_gateway_retries_total", provider="openai") == retries + 1

    r = obs.chat(config(failing_fallback(openai_mock)))
    assert (r.status_code, r.headers["x-gateway-target"]) == (200, "targets[1]")
    assert value(obs, "gen_ai_gateway_fallbacks_total", provider="openai") == fallbacks + 1
    assert value(obs, "gen_ai_gateway_retries_total", provider="openai") == retries + 1
    # The request counts once, under the model of the attempt that answered.
    assert value(obs, "gen_ai_gateway_requests_total", model="m-fall-b", status_class="2xx") == 1
    assert value(obs, "gen_ai_gateway_requests_total", model="m-fall-a") == 0


def test_models_outside_the_list_share_the_label_other_and_dots_stay(obs, openai_mock):
    before = value(obs, "gen_ai_gateway_requests_total", model="other")
    for model in ("unlisted-a", "unlisted-b{x}"):
        assert obs.chat(custom_host(openai_mock), chat_body(model=model)).status_code == 200
    assert obs.chat(custom_host(openai_mock), chat_body(model="gpt-4.1")).status_code == 200
    assert value(obs, "gen_ai_gateway_requests_total", model="other") == before + 2
    assert value(obs, "gen_ai_gateway_requests_total", model="gpt-4.1", provider="openai") == 1
    names = {n for n, ls, _ in prometheus(obs) if n.startswith("gen_ai_")}
    assert all("." not in n and "unlisted" not in n for n in names), names
    models = {ls.get("model") for n, ls, _ in prometheus(obs) if n.startswith("gen_ai_")}
    assert not any(m and "unlisted" in m for m in models), models


def test_a_request_an_input_guardrail_denies_counts_once_for_its_provider_and_model(obs, openai_mock):
    guarded = config({"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url,
                      "input_guardrails": [{"default.contains": {"words": ["banana"], "operator": "none"},
                                            "deny": True}]})
    assert obs.chat(guarded, chat_body("a banana", model="m-denied")).status_code == 446
    assert openai_mock.requests == []
    assert value(obs, "gen_ai_gateway_requests_total", provider="openai", model="m-denied", status_class="4xx",
                 cache_status="disabled") == 1
    assert value(obs, "gen_ai_gateway_requests_total", model="m-denied") == 1, "counted exactly once"


def test_requests_refused_before_provider_selection_are_not_counted(obs):
    before = sum(v for n, _, v in prometheus(obs) if n == "gen_ai_gateway_requests_total")
    assert obs.chat({"x-gateway-provider": "openai"}, key="gw-wrong-key").status_code == 401
    assert obs.get("/health", key=None).status_code == 200
    assert sum(v for n, _, v in prometheus(obs) if n == "gen_ai_gateway_requests_total") == before


# --------------------------------------------------------------------------- access log


def test_each_request_writes_one_json_access_log_line_with_every_field(obs, openai_mock):
    trace_id = trace()
    headers = {**custom_host(openai_mock), "x-gateway-trace-id": trace_id, "x-gateway-span-id": "span-1",
               "x-gateway-parent-span-id": "span-0", "x-gateway-span-name": "summarise",
               "x-gateway-metadata": json.dumps({"_user": "u-7", "_environment": "prod"})}
    body = chat_body(PROMPT, model="m-chat", stream=True, stream_options={"include_usage": True})
    with obs.stream("POST", "/v1/chat/completions?x=1", headers=headers, json=body) as r:
        assert r.status_code == 200
        read_stream(r)
    [line] = access_lines(obs, trace_id)
    assert set(line) == {"trace_id", "span_id", "parent_span_id", "span_name", "metadata", "method", "path",
                         "provider", "model", "target", "attempts", "retries", "fallbacks", "cache_status", "status",
                         "stream", "prompt_tokens", "completion_tokens", "duration_ms", "time_to_first_token_ms",
                         "error_code", "workspace"}
    assert line["trace_id"] == trace_id
    assert line["workspace"] == "default", "the keys of GATEWAY_API_KEYS are the default workspace's"
    assert (line["span_id"], line["parent_span_id"], line["span_name"]) == ("span-1", "span-0", "summarise")
    assert line["metadata"] == {"_user": "u-7", "_environment": "prod"}
    assert (line["method"], line["path"]) == ("POST", "/v1/chat/completions")
    assert (line["provider"], line["model"], line["target"]) == ("openai", "m-chat", "")
    assert (line["attempts"], line["retries"], line["fallbacks"]) == (1, 0, 0)
    assert (line["status"], line["stream"], line["cache_status"], line["error_code"]) == (200, True, "DISABLED", None)
    assert (line["prompt_tokens"], line["completion_tokens"]) == (11, 7)
    assert isinstance(line["duration_ms"], int) and 0 <= line["time_to_first_token_ms"] <= line["duration_ms"]


def test_errors_and_recoveries_are_in_the_access_log(obs, openai_mock):
    refused = trace()
    r = obs.chat({"x-gateway-provider": "openai", "x-gateway-trace-id": refused}, key="gw-wrong-key")
    assert r.status_code == 401
    [line] = access_lines(obs, refused)
    assert (line["status"], line["error_code"], line["provider"], line["attempts"]) == (401, "invalid_api_key", None, 0)

    fell_back = trace()
    assert obs.chat({**config(failing_fallback(openai_mock)), "x-gateway-trace-id": fell_back}).status_code == 200
    [line] = access_lines(obs, fell_back)
    assert (line["model"], line["target"], line["attempts"], line["fallbacks"]) == ("m-fall-b", "targets[1]", 2, 1)
    assert line["stream"] is False and line["time_to_first_token_ms"] is None


def test_no_secret_or_prompt_in_metrics_or_the_access_log(obs, openai_mock):
    by_client_token, by_config = trace(), trace()
    sent = [obs.chat({**custom_host(openai_mock), "x-gateway-trace-id": by_client_token},
                     chat_body(PROMPT, model="m-chat")),
            obs.chat({**config({"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url}),
                      "x-gateway-trace-id": by_config}, chat_body(PROMPT, model="m-chat"))]
    assert [r.status_code for r in sent] == [200, 200], [r.text for r in sent]
    stats = httpx.get(f"http://127.0.0.1:{obs.admin_port}/stats/prometheus", timeout=5).text
    assert "gen_ai_gateway_requests_total{" in stats
    # The lines of both requests are written (Envoy writes the file in batches).
    for trace_id in (by_client_token, by_config):
        assert len(access_lines(obs, trace_id)) == 1, f"no access-log line of {trace_id}"
    log = obs.access_log.read_text()
    for secret in (*SECRETS, CLIENT_TOKEN, PROMPT):
        assert secret not in stats, secret
        assert secret not in log, secret
    for line in log.splitlines():
        json.loads(line)  # every line is one JSON object


def test_each_check_run_counts_its_verdict(obs, openai_mock):
    guarded = config({"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url,
                      "input_guardrails": [{"id": "fruit", "default.contains": {"words": ["banana"], "operator": "none"},
                                            "deny": True, "on_fail": {"feedback": {"value": -1, "weight": 1}}}]})
    fail = {"check": "default.contains", "verdict": "fail"}
    passed = {"check": "default.contains", "verdict": "pass"}
    before = (value(obs, "gen_ai_gateway_guardrail_verdicts_total", **fail),
              value(obs, "gen_ai_gateway_guardrail_verdicts_total", **passed))
    denied = trace()
    assert obs.chat({**guarded, "x-gateway-trace-id": denied}, chat_body("a banana")).status_code == 446
    assert obs.chat(guarded, chat_body("an apple", model="m-chat")).status_code == 200
    assert obs.chat(guarded, chat_body("a pear", model="m-chat")).status_code == 200
    read = lambda: (value(obs, "gen_ai_gateway_guardrail_verdicts_total", **fail) - before[0],  # noqa: E731
                    value(obs, "gen_ai_gateway_guardrail_verdicts_total", **passed) - before[1])
    eventually(reaches(read, (1, 2)), FLUSHED_WITHIN)
    # The access log line says which item decided, and its feedback.
    [line] = access_lines(obs, denied)
    assert line["guardrails"] == [{"stage": "before", "id": "fruit", "verdict": False,
                                   "feedback": {"value": -1.0, "weight": 1.0}}]


# --------------------------------------------------------------------------- metrics, tags and docs


def documented_metric_labels() -> dict[str, set[str]]:
    """The metrics table of docs/observability.md: each metric's labels (the backquoted words of its labels
    column outside parentheses, which hold their values)."""
    table = {}
    doc = (Path(__file__).resolve().parents[2] / "docs/observability.md").read_text()
    for row in doc.splitlines():
        if not row.startswith("| `gen_ai_"):
            continue
        cells = [c.strip() for c in row.split("|")]
        labels = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^()]*\)", "", cells[3])))
        for name in re.findall(r"`([a-z_]+)`", cells[1]):
            table[name] = labels
    return table


def test_every_metric_envoy_shows_has_exactly_the_labels_the_docs_list(obs, openai_mock):
    """Real Envoy's tag extraction of the rendered config (src/envoy_stats_tags.rs checks every
    metric the same way without Envoy): after traffic that makes each per-request metric, each
    `gen_ai_` sample is a metric of the documented table with exactly its labels."""
    guarded = config({**openai_target(openai_mock, "m-chat"), "cache": {"mode": "simple"},
                      "input_guardrails": [{"default.regexMatch": {"rule": "\\bkiwi\\b", "not": True}, "deny": True}]})
    assert obs.chat(guarded, chat_body(f"tags {uuid.uuid4()}")).status_code == 200
    body = chat_body(model="m-stream", stream=True, stream_options={"include_usage": True})
    with obs.stream("POST", "/v1/chat/completions", headers=custom_host(openai_mock), json=body) as r:
        assert r.status_code == 200 and read_stream(r).done
    openai_mock.script(status=503, model="m-retry")
    assert obs.chat(config({**openai_target(openai_mock, "m-retry"), "retry": {"attempts": 1}})).status_code == 200
    assert obs.chat(config(failing_fallback(openai_mock))).status_code == 200
    made = {"gen_ai_gateway_requests_total", "gen_ai_client_token_usage_total", "gen_ai_server_request_duration",
            "gen_ai_server_time_to_first_token", "gen_ai_gateway_retries_total", "gen_ai_gateway_fallbacks_total",
            "gen_ai_gateway_cache_stores_total", "gen_ai_gateway_cache_stored_bytes_total",
            "gen_ai_gateway_guardrail_verdicts_total"}
    table = documented_metric_labels()
    assert made <= set(table), made - set(table)

    def shown() -> dict[str, list[set[str]]]:
        metrics: dict[str, list[set[str]]] = {}
        for name, labels, _ in prometheus(obs):
            if not name.startswith("gen_ai_"):
                continue
            base = name
            for suffix in ("_bucket", "_sum", "_count"):  # a histogram's series
                if name.endswith(suffix) and name[:-len(suffix)] in table:
                    base = name[:-len(suffix)]
            metrics.setdefault(base, []).append(set(labels) - ({"le"} if base != name else set()))
        return metrics

    # Histograms show at Envoy's next stats flush.
    metrics = shown()
    deadline = time.monotonic() + 20
    while not made <= set(metrics) and time.monotonic() < deadline:
        time.sleep(0.25)
        metrics = shown()
    assert made <= set(metrics), f"not shown: {made - set(metrics)}"
    for name, label_sets in metrics.items():
        assert name in table, f"{name}: not a metric of the documented table (a label left in the name?)"
        for labels in label_sets:
            assert labels == table[name], f"{name}: labels {sorted(labels)}, the docs list {sorted(table[name])}"
