"""Streaming is real: chunks reach the client while the provider is still sending."""

from __future__ import annotations

import json
import threading

import httpx2 as httpx
import openai
import pytest

from helpers import CHAT, KEY, assert_error, chat_body, custom_host, read_stream, slug, stream_chat
from mocks import AnthropicMock, OpenAIMock, Reply, ToolCall

TEXT = "alpha beta gamma delta epsilon zeta"


def test_openai_stream_passthrough(gateway, openai_mock):
    openai_mock.script(Reply(text=TEXT))
    res = stream_chat(gateway, custom_host(openai_mock), chat_body())
    assert res.status == 200
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.headers.get("x-gateway-provider") == "openai"
    assert res.headers.get("x-gateway-trace-id")
    assert res.done
    assert res.content == TEXT
    assert res.finish_reason == "stop"
    assert all(c["object"] == "chat.completion.chunk" for c in res.chunks)
    assert openai_mock.last.json["stream"] is True


def test_openai_stream_tool_call_deltas(gateway, openai_mock):
    openai_mock.script(Reply(tool_calls=[ToolCall("lookup", {"q": "envoy wasm", "limit": 5}, id="call_t1"),
                                         ToolCall("lookup", {"q": "proxy", "limit": 1}, id="call_t2")]))
    res = stream_chat(gateway, slug("openai-mock"), chat_body())
    assert res.finish_reason == "tool_calls"
    assert sorted(res.tool_calls) == [0, 1]
    assert [(c["id"], c["name"]) for _, c in sorted(res.tool_calls.items())] == [("call_t1", "lookup"),
                                                                               ("call_t2", "lookup")]
    assert json.loads(res.tool_calls[0]["arguments"]) == {"q": "envoy wasm", "limit": 5}
    assert json.loads(res.tool_calls[1]["arguments"]) == {"q": "proxy", "limit": 1}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_gated_stream_is_not_buffered(gateway, openai_mock, anthropic_mock, provider):
    """The provider sends its first chunk, then waits until the test has received that
    chunk through the gateway. A buffering gateway never delivers it: read timeout."""
    mock = openai_mock if provider == "openai" else anthropic_mock
    gate = threading.Event()
    reply = mock.script(Reply(text=TEXT, gate=gate, gate_timeout=20))
    headers = slug("openai-mock") if provider == "openai" else slug("anthropic-mock")
    res = stream_chat(gateway, headers, chat_body(model=f"{provider}-gated"), gate=gate, read_timeout=5)
    assert gate.is_set()
    assert reply.served.wait(5)
    assert reply.gate_timed_out is False
    assert res.content == TEXT
    assert res.done and res.finish_reason == "stop"
    assert res.headers.get("x-gateway-provider") == provider


def test_gated_stream_with_sdk_through_anthropic(gateway, anthropic_mock):
    gate = threading.Event()
    reply = anthropic_mock.script(Reply(text=TEXT, gate=gate, gate_timeout=20))
    client = gateway.sdk(slug("anthropic-mock"), timeout=httpx.Timeout(30.0, read=5.0))
    stream = client.chat.completions.create(model="claude-gated", messages=[{"role": "user", "content": "go"}],
                                            stream=True)
    content = ""
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                content += chunk.choices[0].delta.content
                gate.set()
    except openai.APITimeoutError:
        pytest.fail("the SDK stream timed out while the provider held back the rest: the gateway buffers")
    assert content == TEXT
    assert reply.gate_timed_out is False


def test_stream_arrives_chunk_by_chunk(gateway, openai_mock):
    """Lock-step: the provider sends each content chunk only once the test has read the one
    before it through the gateway. A gateway that holds back any chunk (not only the first,
    which the gated tests cover) never delivers it, so the read times out and the test fails."""
    words = [f"w{i} " for i in range(12)]
    step = threading.Semaphore(0)
    reply = openai_mock.script(Reply(chunks=words, step=step, step_timeout=20))
    seen = []

    def next_chunk(res):
        if res.content and res.content != (seen[-1] if seen else ""):
            seen.append(res.content)
            step.release()  # this chunk arrived: the provider may send the next one

    try:
        with gateway.stream("POST", CHAT, headers=custom_host(openai_mock), json=chat_body(stream=True),
                            timeout=httpx.Timeout(30.0, read=5.0)) as r:
            assert r.status_code == 200
            res = read_stream(r, next_chunk)
    except httpx.ReadTimeout:
        pytest.fail(f"chunk {len(seen) + 1} of {len(words)} never arrived while the provider waited for the test to "
                    f"read chunk {len(seen)}: the gateway holds back the stream")
    assert seen == ["".join(words[:i + 1]) for i in range(len(words))]
    assert res.content == "".join(words) and res.done
    assert reply.served.wait(5)
    assert reply.step_timed_out is False


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_stream_request_provider_error(gateway, openai_mock, anthropic_mock, provider):
    if provider == "openai":
        openai_mock.script(OpenAIMock.error(429, "Too many streams", type="requests", code="rate_limit_exceeded"))
        headers = custom_host(openai_mock)
        err_type = None
    else:
        anthropic_mock.script(AnthropicMock.error(429, "rate_limit_error", "Too many streams"))
        headers = slug("anthropic-mock")
        err_type = "rate_limit_error"
    with gateway.stream("POST", CHAT, key=KEY, headers=headers, json=chat_body(stream=True)) as r:
        r.read()
    assert_error(r, 429, type=err_type, contains="Too many streams")
