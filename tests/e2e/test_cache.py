"""The response cache as a client sees it (contract: status header, key, replay, semantic
matching, budget): what comes back, and what the providers received.

Every test asks questions of its own (a uuid in the content) so no test finds another's
entries; semantic tests also take a namespace of their own, so entries with the mock's hash
vectors are never candidates. Provider calls are counted from the mocks' recordings; the
semantic cache's embeddings calls reach the OpenAI mock with their own key (`EMBED_KEY`)
and are told apart by it.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import (CHAT, EMBED_KEY, EMBED_MODEL, KEY, KEY2, OPENAI_KEYS, assert_chat_completion, assert_error, chat_body,
                     config, custom_host, provider_config, read_stream, sdk_stream, served_by, stream_chat)
from mocks import OpenAIMock, Reply

STATUS = "x-gateway-cache-status"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
UNAVAILABLE = "MISS; semantic=unavailable"


# --------------------------------------------------------------------------- helpers


def unique(text: str = "What is the answer?") -> str:
    return f"{text} [{uuid.uuid4().hex}]"


def cache_settings(mode: str = "simple", max_age: int | None = None) -> dict:
    return {"mode": mode} if max_age is None else {"mode": mode, "max_age": max_age}


def cached(mock, provider: str = "openai", *, mode: str = "simple", max_age: int | None = None, **extra) -> dict:
    """Headers of a one-provider config (``mock``) with the cache on."""
    return config(provider_config(mock, provider, cache=cache_settings(mode, max_age), **extra))


def ask(gw, headers: dict, body: dict, expect: str, *, path: str = CHAT, key: str = KEY):
    """POST ``body``; it must succeed with cache status ``expect``."""
    r = gw.post(path, body, headers=headers, key=key)
    assert r.status_code == 200, r.text
    assert r.headers.get(STATUS) == expect, f"{STATUS} {r.headers.get(STATUS)!r} != {expect!r}"
    return r


def stream_status(result) -> str | None:
    return result.headers.get(STATUS)


def content_of(resp) -> str:
    return resp.json()["choices"][0]["message"]["content"]


def provider_calls(mock, path: str = CHAT) -> int:
    """Requests ``mock`` got on ``path`` as a provider (not as the semantic cache's embedder)."""
    return sum(1 for r in mock.requests_to(path) if r.header("authorization") != f"Bearer {EMBED_KEY}")


def embedding_calls(mock) -> list:
    """The embeddings requests the semantic cache made (they carry the embeddings key)."""
    return [r for r in mock.requests_to(EMBEDDINGS) if r.header("authorization") == f"Bearer {EMBED_KEY}"]


def assert_replayed_stream(result, content: str) -> None:
    """An SSE replay in OpenAI's chunk shape, `data: [DONE]` last."""
    assert result.headers["content-type"].startswith("text/event-stream"), result.headers
    assert result.content == content
    assert result.done and result.events[-1][1] == "[DONE]", result.events[-3:]
    assert all(c.get("object") == "chat.completion.chunk" for c in result.chunks), result.chunks
    assert result.finish_reason == "stop"


@pytest.fixture(scope="module")
def other_mock():
    """A second OpenAI-shaped provider: another base URL."""
    mock = OpenAIMock(OPENAI_KEYS).start()
    yield mock
    mock.stop()


# --------------------------------------------------------------------------- simple mode: the key


def test_miss_then_hit_answers_from_the_cache(gateway, openai_mock):
    headers = cached(openai_mock)
    body = chat_body(unique(), temperature=0.3, max_tokens=50)
    first = ask(gateway, headers, body, "MISS")
    assert provider_calls(openai_mock) == 1
    hit = ask(gateway, headers, body, "HIT")
    assert provider_calls(openai_mock) == 1
    assert hit.json() == first.json()
    assert hit.headers["content-type"].startswith("application/json")
    served_by(hit, "openai")
    assert embedding_calls(openai_mock) == []  # simple mode never embeds


def test_key_order_stream_flag_metadata_and_trace_are_not_part_of_the_key(gateway, openai_mock):
    headers = cached(openai_mock)
    text = unique()
    body = {"model": "gpt-mock", "temperature": 0.3, "messages": [{"role": "user", "content": text}]}
    first = ask(gateway, headers, body, "MISS")
    reordered = {"messages": [{"content": text, "role": "user"}], "temperature": 0.3, "model": "gpt-mock"}
    ask(gateway, headers, reordered, "HIT")
    ask(gateway, headers, {**body, "stream": False}, "HIT")
    trace = f"trace-{uuid.uuid4().hex}"
    hit = ask(gateway, {**headers, "x-gateway-metadata": json.dumps({"team": "other"}), "x-gateway-trace-id": trace,
                        "x-something-else": "1"}, body, "HIT")
    assert hit.headers["x-gateway-trace-id"] == trace
    assert hit.json() == first.json()
    assert provider_calls(openai_mock) == 1


def test_model_temperature_and_base_url_are_part_of_the_key(gateway, openai_mock, other_mock):
    headers = cached(openai_mock)
    body = chat_body(unique(), temperature=0.3)
    ask(gateway, headers, body, "MISS")
    ask(gateway, headers, {**body, "model": "gpt-mock-2"}, "MISS")
    ask(gateway, headers, {**body, "temperature": 0.9}, "MISS")
    assert provider_calls(openai_mock) == 3
    calls_before = provider_calls(other_mock)
    ask(gateway, cached(other_mock), body, "MISS")
    ask(gateway, cached(other_mock), body, "HIT")
    assert provider_calls(other_mock) == calls_before + 1
    ask(gateway, headers, body, "HIT")
    assert provider_calls(openai_mock) == 3


def test_without_cache_config_the_status_is_disabled(gateway, openai_mock):
    body = chat_body(unique())
    for headers in (custom_host(openai_mock), config(provider_config(openai_mock))):
        ask(gateway, headers, body, "DISABLED")
        ask(gateway, headers, body, "DISABLED")
    assert provider_calls(openai_mock) == 4
    res = stream_chat(gateway, custom_host(openai_mock), body)
    assert stream_status(res) == "DISABLED"
    ask(gateway, custom_host(openai_mock), {"model": "text-embedding-mock", "input": unique()}, "DISABLED",
        path=EMBEDDINGS)


def test_no_status_header_on_endpoints_that_are_not_cached(gateway, openai_mock):
    headers = cached(openai_mock)
    for r in (gateway.get("/v1/models", headers=headers),
              gateway.get("/v1/batches", headers=headers),
              gateway.post("/v1/images/generations", {"prompt": unique("a red square")}, headers=headers)):
        assert r.status_code == 200, r.text
        assert STATUS not in r.headers, f"{r.request.url}: {STATUS}: {r.headers[STATUS]!r}"


@pytest.mark.parametrize("max_age", [0, 1.5, "60"])
def test_invalid_max_age_is_an_invalid_config(gateway, openai_mock, max_age):
    cfg = provider_config(openai_mock, cache={"mode": "simple", "max_age": max_age})
    assert_error(gateway.chat(config(cfg), chat_body(unique())), 400, code="invalid_config",
                 contains="cache.max_age")
    assert openai_mock.requests == []


def test_cache_config_is_inherited_by_the_targets(gateway, openai_mock):
    cfg = {"strategy": {"mode": "fallback"}, "cache": {"mode": "simple"},
           "targets": [provider_config(openai_mock), provider_config(openai_mock, api_key="sk-config-key-2")]}
    body = chat_body(unique())
    first = ask(gateway, config(cfg), body, "MISS")
    assert ask(gateway, config(cfg), body, "HIT").json() == first.json()
    assert provider_calls(openai_mock) == 1


# --------------------------------------------------------------------------- namespaces, tenants, refresh, expiry


def test_namespaces_partition_the_cache(gateway, openai_mock):
    headers = cached(openai_mock)
    body = chat_body(unique())

    def in_namespace(name: str) -> dict:
        return {**headers, "x-gateway-cache-namespace": name}

    ask(gateway, in_namespace("team-a"), body, "MISS")
    ask(gateway, in_namespace("team-b"), body, "MISS")
    ask(gateway, headers, body, "MISS")
    ask(gateway, in_namespace("team-a"), body, "HIT")
    ask(gateway, in_namespace("team-b"), body, "HIT")
    ask(gateway, headers, body, "HIT")
    ask(gateway, {**headers, "cache_namespace": "team-a"}, body, "HIT")  # the header's alias
    assert provider_calls(openai_mock) == 3


def test_each_workspace_is_its_own_tenant(gateway, openai_mock):
    # KEY and KEY2 are keys of one workspace (default); a key the control plane made for
    # another workspace is another tenant.
    created = gateway.post("/v1/api-keys", {"workspace": f"tenant-{uuid.uuid4().hex[:8]}"})
    assert created.status_code in (200, 201), created.text
    other = created.json()["key"]
    headers = {**cached(openai_mock), "x-gateway-cache-namespace": "shared"}
    body = chat_body(unique())
    openai_mock.script(Reply(text="for the default workspace"))
    ask(gateway, headers, body, "MISS", key=KEY)
    openai_mock.script(Reply(text="for the other workspace"))
    ask(gateway, headers, body, "MISS", key=other)
    assert provider_calls(openai_mock) == 2
    assert content_of(ask(gateway, headers, body, "HIT", key=KEY2)) == "for the default workspace"
    assert content_of(ask(gateway, headers, body, "HIT", key=other)) == "for the other workspace"
    assert provider_calls(openai_mock) == 2


def test_force_refresh_calls_the_provider_and_replaces_the_entry(gateway, openai_mock):
    headers = cached(openai_mock)
    refresh = {**headers, "x-gateway-cache-force-refresh": "true"}
    body = chat_body(unique())
    openai_mock.script(Reply(text="first answer"))
    assert content_of(ask(gateway, headers, body, "MISS")) == "first answer"
    openai_mock.script(Reply(text="second answer"))
    assert content_of(ask(gateway, refresh, body, "REFRESH")) == "second answer"
    assert provider_calls(openai_mock) == 2
    assert content_of(ask(gateway, headers, body, "HIT")) == "second answer"
    assert content_of(ask(gateway, {**headers, "x-gateway-cache-force-refresh": "false"}, body, "HIT")) == \
        "second answer"
    assert provider_calls(openai_mock) == 2
    # With nothing stored yet, a refresh is still a refresh, and it stores.
    fresh = chat_body(unique())
    ask(gateway, refresh, fresh, "REFRESH")
    ask(gateway, headers, fresh, "HIT")
    assert provider_calls(openai_mock) == 3


def test_entries_expire_after_max_age(gateway, openai_mock):
    max_age = 2  # seconds; also the margin for the HITs right after each store
    headers = cached(openai_mock, max_age=max_age)
    body = chat_body(unique())
    before_store = time.monotonic()
    ask(gateway, headers, body, "MISS")
    after_store = time.monotonic()  # the entry was stored (on Envoy's clock) between these two
    ask(gateway, headers, body, "HIT")
    # Expiry runs on Envoy's real clock, which a test cannot move: ask again until the answer
    # is a MISS. A HIT stores nothing (the entry keeps its expiry) and calls no provider, so the
    # asking changes nothing that is checked; the MISS stores the answer afresh, as before.
    while True:
        asked = time.monotonic()
        r = gateway.post(CHAT, body, headers=headers, key=KEY)
        assert r.status_code == 200, r.text
        if r.headers.get(STATUS) == "MISS":
            break
        assert r.headers.get(STATUS) == "HIT", r.headers.get(STATUS)
        assert asked < after_store + max_age + 0.05, "the entry outlived its max_age"
        time.sleep(0.1)  # the pace of asking, not a synchronisation
    assert time.monotonic() >= before_store + max_age - 0.01, "the entry expired before its max_age"
    ask(gateway, headers, body, "HIT")
    assert provider_calls(openai_mock) == 2


# --------------------------------------------------------------------------- what is stored


@pytest.mark.parametrize("error", [OpenAIMock.error(500, "the provider broke", "server_error"),
                                   OpenAIMock.error(400, "bad messages", param="messages")],
                         ids=["500", "400"])
def test_errors_are_never_cached(gateway, openai_mock, error):
    headers = cached(openai_mock)
    body = chat_body(unique())
    openai_mock.script(error)
    r = gateway.chat(headers, body)
    assert_error(r, error.status, contains=error.body["error"]["message"])
    assert r.headers.get(STATUS) == "MISS"
    ask(gateway, headers, body, "MISS")  # the error was not stored: the provider is asked again
    ask(gateway, headers, body, "HIT")
    assert provider_calls(openai_mock) == 2


def test_an_unfinished_stream_is_not_stored(gateway, openai_mock):
    """A stream that ends without `data: [DONE]` did not complete normally."""
    chunk = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "gpt-mock",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "partial"}, "finish_reason": None}]}
    cut = Reply(body=f"data: {json.dumps(chunk)}\n\n", headers={"Content-Type": "text/event-stream"})
    headers = cached(openai_mock)
    body = chat_body(unique())
    openai_mock.script(cut)
    res = stream_chat(gateway, headers, body)
    assert stream_status(res) == "MISS"
    assert res.content == "partial" and not res.done
    res = stream_chat(gateway, headers, body)
    assert stream_status(res) == "MISS"
    assert res.done
    assert provider_calls(openai_mock) == 2


def test_an_answer_after_a_retry_is_cached(gateway, openai_mock):
    headers = cached(openai_mock, retry={"attempts": 1})
    body = chat_body(unique())
    openai_mock.script(status=503)
    first = ask(gateway, headers, body, "MISS")
    assert first.headers["x-gateway-retries"] == "1"
    assert ask(gateway, headers, body, "HIT").json() == first.json()
    assert provider_calls(openai_mock) == 2


def test_a_fallback_answer_is_cached_under_the_first_target(gateway, openai_mock, anthropic_mock):
    """The first attempt's target decides the key; the entry names the provider that answered."""
    cfg = {"strategy": {"mode": "fallback"}, "cache": {"mode": "simple"},
           "targets": [provider_config(openai_mock, override_params={"model": "m-a"}),
                       provider_config(anthropic_mock, "anthropic")]}
    body = chat_body(unique(), model="claude-test-1")
    openai_mock.script(model="m-a", status=500)
    first = ask(gateway, config(cfg), body, "MISS")
    served_by(first, "anthropic")
    hit = ask(gateway, config(cfg), body, "HIT")
    served_by(hit, "anthropic")
    assert hit.json() == first.json()
    assert provider_calls(openai_mock) == 1
    assert provider_calls(anthropic_mock, "/v1/messages") == 1


def test_override_params_are_part_of_the_key(gateway, openai_mock):
    def forcing(temperature: float) -> dict:
        return cached(openai_mock, override_params={"temperature": temperature})

    body = chat_body(unique())
    openai_mock.script(Reply(text="cool"))
    ask(gateway, forcing(0.1), body, "MISS")
    openai_mock.script(Reply(text="warm"))
    ask(gateway, forcing(0.9), body, "MISS")
    assert [r.json["temperature"] for r in openai_mock.requests] == [0.1, 0.9]
    assert content_of(ask(gateway, forcing(0.1), body, "HIT")) == "cool"
    assert content_of(ask(gateway, forcing(0.9), body, "HIT")) == "warm"
    # The key is the body as the provider gets it: asking for the same temperature directly finds it.
    assert content_of(ask(gateway, cached(openai_mock), {**body, "temperature": 0.9}, "HIT")) == "warm"
    assert provider_calls(openai_mock) == 2


def test_completions_and_embeddings_are_cached(gateway, openai_mock):
    headers = cached(openai_mock)
    prompt = {"model": "gpt-mock-instruct", "prompt": unique("Once upon a time"), "max_tokens": 20}
    first = ask(gateway, headers, prompt, "MISS", path=COMPLETIONS)
    assert ask(gateway, headers, prompt, "HIT", path=COMPLETIONS).json() == first.json()
    with gateway.stream("POST", COMPLETIONS, headers=headers, json={**prompt, "stream": True}) as resp:
        assert resp.status_code == 200
        replay = read_stream(resp)
    assert replay.headers.get(STATUS) == "HIT"
    assert replay.headers["content-type"].startswith("text/event-stream")
    assert replay.done and replay.events[-1][1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in replay.chunks if c.get("choices")) == OpenAIMock.default_text
    assert provider_calls(openai_mock, COMPLETIONS) == 1

    vectors = {"model": "text-embedding-mock", "input": [unique("embed me"), "and me"]}
    first = ask(gateway, headers, vectors, "MISS", path=EMBEDDINGS)
    assert ask(gateway, headers, vectors, "HIT", path=EMBEDDINGS).json() == first.json()
    assert provider_calls(openai_mock, EMBEDDINGS) == 1


# --------------------------------------------------------------------------- stream replay


def test_a_streamed_answer_is_replayed_as_a_stream_or_as_json(gateway, openai_mock):
    headers = cached(openai_mock)
    body = chat_body(unique())
    openai_mock.script(Reply(text="one two three four"))
    miss = stream_chat(gateway, headers, body)
    assert stream_status(miss) == "MISS"
    assert miss.done and miss.content == "one two three four"
    assert openai_mock.last.json["stream"] is True
    hit = stream_chat(gateway, headers, body)
    assert stream_status(hit) == "HIT"
    assert_replayed_stream(hit, "one two three four")
    assert hit.headers["x-gateway-provider"] == "openai"
    as_json = ask(gateway, headers, body, "HIT")
    assert as_json.headers["content-type"].startswith("application/json")
    assert as_json.json()["object"] == "chat.completion"
    choice = as_json.json()["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "one two three four"
    assert choice["finish_reason"] == "stop"
    assert provider_calls(openai_mock) == 1


def test_a_json_answer_is_replayed_as_a_stream_with_usage_when_asked(gateway, openai_mock):
    headers = cached(openai_mock)
    body = chat_body(unique())
    openai_mock.script(Reply(text="alpha beta", usage=(5, 3)))
    ask(gateway, headers, body, "MISS")
    plain = stream_chat(gateway, headers, body)
    assert stream_status(plain) == "HIT"
    assert_replayed_stream(plain, "alpha beta")
    assert plain.usage is None, "usage was streamed without stream_options.include_usage"
    with_usage = stream_chat(gateway, headers, {**body, "stream_options": {"include_usage": True}})
    assert stream_status(with_usage) == "HIT"
    assert with_usage.content == "alpha beta" and with_usage.done
    last = with_usage.chunks[-1]
    assert last["choices"] == [], last  # OpenAI's usage chunk, the last before [DONE]
    assert {k: last["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert provider_calls(openai_mock) == 1


def test_the_openai_sdk_reads_a_replayed_stream(gateway, openai_mock):
    client = gateway.sdk(headers=cached(openai_mock))
    messages = [{"role": "user", "content": unique()}]
    openai_mock.script(Reply(text="from the cache, via the SDK", usage=(4, 6)))
    first = sdk_stream(client.chat.completions.create(model="gpt-mock", messages=messages, stream=True,
                                                      stream_options={"include_usage": True}))
    assert first.content == "from the cache, via the SDK"
    raw = client.chat.completions.with_raw_response.create(model="gpt-mock", messages=messages, stream=True,
                                                            stream_options={"include_usage": True})
    assert raw.headers.get(STATUS) == "HIT"
    replay = sdk_stream(raw.parse())
    assert replay.content == first.content
    assert replay.finish_reason == "stop"
    assert replay.usage["total_tokens"] == 10
    completion = client.chat.completions.create(model="gpt-mock", messages=messages)
    assert completion.choices[0].message.content == first.content
    assert provider_calls(openai_mock) == 1


def test_anthropic_answers_are_cached_in_openai_shape(gateway, anthropic_mock):
    headers = cached(anthropic_mock, "anthropic")
    body = chat_body(unique(), model="claude-test-1")
    anthropic_mock.script(Reply(text="Bonjour tout le monde"))
    first = ask(gateway, headers, body, "MISS")
    assert_chat_completion(first.json(), content="Bonjour tout le monde")
    hit = ask(gateway, headers, body, "HIT")
    served_by(hit, "anthropic")
    assert hit.json() == first.json()
    replay = stream_chat(gateway, headers, body)
    assert stream_status(replay) == "HIT"
    assert_replayed_stream(replay, "Bonjour tout le monde")
    assert provider_calls(anthropic_mock, "/v1/messages") == 1
    # A translated stream is stored assembled, in OpenAI's shape.
    streamed = chat_body(unique(), model="claude-test-1")
    anthropic_mock.script(Reply(text="Guten Tag"))
    assert stream_status(stream_chat(gateway, headers, streamed)) == "MISS"
    as_json = ask(gateway, headers, streamed, "HIT")
    assert as_json.json()["object"] == "chat.completion"
    assert content_of(as_json) == "Guten Tag"
    assert provider_calls(anthropic_mock, "/v1/messages") == 2


# --------------------------------------------------------------------------- semantic mode


def semantic_headers(mock) -> dict:
    """Semantic mode in a namespace of its own (the only candidates are this test's entries)."""
    return {**cached(mock, mode="semantic"), "x-gateway-cache-namespace": f"semantic-{uuid.uuid4().hex}"}


def unit_pair(cosine: float) -> tuple[list[float], list[float]]:
    """Two unit vectors whose cosine similarity is ``cosine``."""
    return [1.0, 0.0, 0.0, 0.0], [cosine, math.sqrt(1.0 - cosine * cosine), 0.0, 0.0]


def test_semantic_exact_hit_needs_no_embeddings(gateway, openai_mock):
    headers = semantic_headers(openai_mock)
    question = unique("What is the capital of France?")
    body = chat_body(question)
    ask(gateway, headers, body, "MISS")
    [embedded] = embedding_calls(openai_mock)
    assert embedded.method == "POST"
    assert embedded.json == {"model": EMBED_MODEL, "input": f"user: {question}"}
    hit = ask(gateway, headers, body, "HIT")
    served_by(hit, "openai")
    assert len(embedding_calls(openai_mock)) == 1
    assert provider_calls(openai_mock) == 1


def test_semantic_hit_for_a_close_question(gateway, openai_mock):
    headers = semantic_headers(openai_mock)
    tag = uuid.uuid4().hex
    near_a, near_b = unit_pair(0.99)
    openai_mock.embed_as(f"{tag}-a", near_a)
    openai_mock.embed_as(f"{tag}-b", near_b)
    openai_mock.embed_as(f"{tag}-c", near_b)
    openai_mock.script(Reply(text="Paris."), path=CHAT)
    first = ask(gateway, headers, chat_body(f"What is the capital of France? {tag}-a"), "MISS")
    hit = ask(gateway, headers, chat_body(f"Which city is France's capital? {tag}-b"), "SEMANTIC_HIT")
    assert hit.json() == first.json()
    served_by(hit, "openai")
    assert hit.headers["content-type"].startswith("application/json")
    replay = stream_chat(gateway, headers, chat_body(f"France's capital, please. {tag}-c"))
    assert stream_status(replay) == "SEMANTIC_HIT"
    assert_replayed_stream(replay, "Paris.")
    assert provider_calls(openai_mock) == 1
    assert len(embedding_calls(openai_mock)) == 3


def test_semantic_far_question_misses(gateway, openai_mock):
    headers = semantic_headers(openai_mock)
    tag = uuid.uuid4().hex
    far_a, far_b = unit_pair(0.5)
    openai_mock.embed_as(f"{tag}-a", far_a)
    openai_mock.embed_as(f"{tag}-b", far_b)
    ask(gateway, headers, chat_body(f"What is the capital of France? {tag}-a"), "MISS")
    ask(gateway, headers, chat_body(f"How tall is the Eiffel tower? {tag}-b"), "MISS")
    assert provider_calls(openai_mock) == 2


def test_semantic_embeds_the_whole_conversation(gateway, openai_mock):
    """One `<role>: <text>` line per message, text parts only: a different system prompt or
    earlier turn is a different conversation (here: vectors far apart)."""
    headers = semantic_headers(openai_mock)
    tag = uuid.uuid4().hex
    pirate, lawyer = f"You are a pirate. {tag}-pirate", f"You are a lawyer. {tag}-lawyer"
    first, second = unit_pair(0.5)
    openai_mock.embed_as(f"{tag}-earlier", [0.0, 0.0, 1.0, 0.0])  # first rule: wins over the system prompt's
    openai_mock.embed_as(f"{tag}-pirate", first)
    openai_mock.embed_as(f"{tag}-lawyer", second)
    question = "What should I do today?"
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

    def conversation(system: str, *earlier: dict) -> dict:
        return {"model": "gpt-mock", "messages": [
            {"role": "system", "content": system}, *earlier,
            {"role": "user", "content": [{"type": "text", "text": question}, picture]}]}

    ask(gateway, headers, conversation(pirate), "MISS")
    assert embedding_calls(openai_mock)[-1].json["input"] == f"system: {pirate}\nuser: {question}"
    ask(gateway, headers, conversation(lawyer), "MISS")
    assert embedding_calls(openai_mock)[-1].json["input"] == f"system: {lawyer}\nuser: {question}"
    earlier = ({"role": "user", "content": f"Hi {tag}-earlier"}, {"role": "assistant", "content": "Objection!"})
    ask(gateway, headers, conversation(lawyer, *earlier), "MISS")
    assert embedding_calls(openai_mock)[-1].json["input"] == \
        f"system: {lawyer}\nuser: Hi {tag}-earlier\nassistant: Objection!\nuser: {question}"
    assert provider_calls(openai_mock) == 3


def test_semantic_matches_only_the_same_model_and_parameters(gateway, openai_mock):
    headers = semantic_headers(openai_mock)
    tag = uuid.uuid4().hex
    openai_mock.embed_as(tag, [1.0, 0.0, 0.0, 0.0])  # every question below gets the same vector
    openai_mock.script(Reply(text="cool answer"), path=CHAT)  # not the embeddings call before it
    ask(gateway, headers, chat_body(f"Tell me a joke {tag} (1)", temperature=0.2), "MISS")
    ask(gateway, headers, chat_body(f"Tell me a joke {tag} (2)", temperature=0.8), "MISS")
    ask(gateway, headers, chat_body(f"Tell me a joke {tag} (3)", temperature=0.2, model="gpt-mock-2"), "MISS")
    hit = ask(gateway, headers, chat_body(f"Tell me a joke {tag} (4)", temperature=0.2), "SEMANTIC_HIT")
    assert content_of(hit) == "cool answer"
    assert provider_calls(openai_mock) == 3


@pytest.mark.parametrize("failure", [
    Reply(status=500),
    Reply(body={"object": "list", "data": []}),
    Reply(body={"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "not numbers"}]}),
    Reply(body="<html>gateway timeout</html>", headers={"Content-Type": "text/html"}),
], ids=["500", "no-data", "not-floats", "not-json"])
def test_semantic_without_a_usable_embedding_still_answers(gateway, openai_mock, failure):
    headers = semantic_headers(openai_mock)
    body = chat_body(unique())
    openai_mock.script(failure, path=EMBEDDINGS, times=None)
    r = ask(gateway, headers, body, UNAVAILABLE)
    served_by(r, "openai")
    assert content_of(r) == OpenAIMock.default_text
    assert provider_calls(openai_mock) == 1
    embeds = len(embedding_calls(openai_mock))
    assert embeds >= 1
    ask(gateway, headers, body, "HIT")  # stored anyway: the exact lookup needs no embedding
    assert len(embedding_calls(openai_mock)) == embeds
    assert provider_calls(openai_mock) == 1


# --------------------------------------------------------------------------- a gateway with a small cache

BYTE_BUDGET = 1 << 20
MAX_ENTRY_BYTES = 64 << 10


@pytest.fixture(scope="module")
def small_cache_gateway(start_gateway):
    """A gateway whose cache holds 1 MiB, entries up to 64 KiB, and has no embeddings provider."""
    with start_gateway("small-cache", {"byte_budget": BYTE_BUDGET, "max_entry_bytes": MAX_ENTRY_BYTES}) as gw:
        yield gw


def test_semantic_mode_without_an_embeddings_provider_is_exact_only(small_cache_gateway, openai_mock):
    headers = cached(openai_mock, mode="semantic")
    body = chat_body(unique())
    ask(small_cache_gateway, headers, body, UNAVAILABLE)
    ask(small_cache_gateway, headers, body, "HIT")
    assert provider_calls(openai_mock) == 1
    assert openai_mock.requests_to(EMBEDDINGS) == []


def test_an_answer_over_max_entry_bytes_is_not_stored(small_cache_gateway, openai_mock):
    headers = cached(openai_mock)
    body = chat_body(unique())
    openai_mock.script(Reply(text="x" * (MAX_ENTRY_BYTES + 1024)), times=None)
    first = ask(small_cache_gateway, headers, body, "MISS")
    assert len(content_of(first)) == MAX_ENTRY_BYTES + 1024
    ask(small_cache_gateway, headers, body, "MISS")
    assert provider_calls(openai_mock) == 2


@pytest.mark.slow
def test_the_cache_stays_within_its_byte_budget(small_cache_gateway, openai_mock):
    """About 24 MB of answers through a 1 MiB cache: Envoy's memory grows by far less, the
    oldest entries make way for the newest, and the filter VM never runs out of memory."""
    gw = small_cache_gateway
    count, answer = 3000, "lorem ipsum " * 680  # about 8 KB of content per answer
    headers = cached(openai_mock)
    run = uuid.uuid4().hex
    bodies = [chat_body(f"question {i} of {run}") for i in range(count)]
    openai_mock.script(Reply(text=answer), path=CHAT, times=None)

    def send(body: dict) -> tuple[int, str | None]:
        r = gw.chat(headers, body)
        return r.status_code, r.headers.get(STATUS)

    with ThreadPoolExecutor(max_workers=16) as pool:
        # Warm the connections on both sides first, so only the cache's growth is measured.
        list(pool.map(send, [chat_body(f"warm-up {i} of {run}") for i in range(64)]))
        reloads, before = gw.vm_reload_counters(), gw.memory_allocated()
        started = time.monotonic()
        outcomes = Counter(pool.map(send, bodies[:-5]))
    outcomes.update(send(body) for body in bodies[-5:])  # one at a time: surely the newest entries
    elapsed = time.monotonic() - started
    grown = gw.memory_allocated() - before
    assert outcomes == Counter({(200, "MISS"): count}), outcomes
    stored_size = count * len(answer)
    assert grown < 4 << 20, (f"Envoy's allocated memory grew by {grown / 2**20:.1f} MiB for {stored_size / 2**20:.0f} "
                             f"MiB of answers through a {BYTE_BUDGET >> 20} MiB cache ({elapsed:.1f}s)")
    assert gw.vm_reload_counters() == reloads
    for body in bodies[-5:]:
        ask(gw, headers, body, "HIT")
    for body in bodies[:5]:
        ask(gw, headers, body, "MISS")
    assert provider_calls(openai_mock) == 64 + count + 5
