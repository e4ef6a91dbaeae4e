"""Providers that break the protocol after (or instead of) a proper answer: a reset or a bad
chunk after the headers, a status that is no HTTP status, a stream cut short, an event stream
for a request that asked for JSON, an empty success, a provider that goes silent. Whatever
they send, the client gets the OpenAI error shape with the gateway's headers, or a stream that
ends with an error event, or fails, and never with `[DONE]`; and never waits past the stream
idle timeout."""

from __future__ import annotations

import json
import threading
import time

import httpx2 as httpx
import pytest

from helpers import (CHAT, KEY, VERTEX_CLIENT_TOKEN, assert_error, chat_body, config, custom_host, provider_config,
                     raw_http, read_stream)
from mocks import Reply
from mocks_cloud import event_frame
from support import BEDROCK_MODEL, bedrock_config

ANTHROPIC_MODEL = "claude-mock"


def head(status: str, *headers: str) -> bytes:
    """An HTTP/1.1 status line and headers, as a broken provider writes them."""
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode()


def chunked(*pieces: bytes) -> bytes:
    """Pieces in chunked framing (without the last, empty chunk)."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


def anthropic_events(*events: dict) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


MESSAGE_START = {"type": "message_start", "message": {
    "id": "msg_cut", "type": "message", "role": "assistant", "model": ANTHROPIC_MODEL, "content": [],
    "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 1}}}
TEXT_DELTA = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Half an"}}
MESSAGE_DELTA = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}
SSE_HEAD = head("200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked")
JSON_HEAD = head("200 OK", "Content-Type: application/json", "Content-Length: 400")


def anthropic(mock) -> dict:
    return custom_host(mock, provider="anthropic")


# --------------------------------------------------------------------------- broken after the headers


@pytest.mark.parametrize("raw, reset", [
    (JSON_HEAD + b'{"id": "msg_1", "type": "mess', True),  # a reset mid-body
    (JSON_HEAD + b'{"id": "msg_1"', False),  # the connection closes before the announced length
    (head("200 OK", "Content-Type: application/json", "Transfer-Encoding: chunked") + b"zz\r\n{}\r\n", False),
], ids=["reset", "short-body", "bad-chunk-size"])
def test_a_held_answer_broken_after_its_headers_is_a_json_502(gateway, anthropic_mock, raw, reset):
    anthropic_mock.script(Reply(raw=raw, reset=reset))
    r = gateway.chat(anthropic(anthropic_mock), chat_body(model=ANTHROPIC_MODEL))
    assert_error(r, 502, type="api_error", code="upstream_incomplete", contains="provider")
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-gateway-provider"] == "anthropic"
    assert "upstream connect error" not in r.text
    # The request's record (the log line) says what the client got.
    line = gateway.wait_for_log_line(f'trace_id="{r.headers["x-gateway-trace-id"]}"')
    assert "status=502" in line, line


def test_a_held_provider_error_broken_mid_body_is_a_json_502(gateway, openai_mock):
    openai_mock.script(Reply(raw=head("429 Too Many Requests", "Content-Type: application/json",
                                      "Content-Length: 300") + b'{"error": {"mess', reset=True))
    r = gateway.chat(custom_host(openai_mock), chat_body())
    assert_error(r, 502, type="api_error", code="upstream_incomplete")


def test_a_stream_held_for_a_denying_guardrail_and_broken_off_is_a_json_502(gateway, openai_mock):
    # A denying output check holds the whole stream, its headers too: Envoy's reply is the gateway's.
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-mock",
             "choices": [{"index": 0, "delta": {"content": "Half an"}, "finish_reason": None}]}
    openai_mock.script(Reply(raw=SSE_HEAD + chunked(f"data: {json.dumps(chunk)}\n\n".encode()), reset=True))
    guard = {"default.contains": {"words": ["forbidden"], "operator": "none"}, "deny": True}
    headers = config(provider_config(openai_mock, output_guardrails=[guard]))
    r = gateway.chat(headers, chat_body(stream=True))
    assert_error(r, 502, type="api_error", code="upstream_incomplete")
    assert r.headers["x-gateway-provider"] == "openai"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_broken_after_its_headers_never_looks_complete(gateway, openai_mock, anthropic_mock, provider):
    """A stream's headers went on to the client as they came: when its provider breaks off,
    Envoy can only cut the client's stream too (no event can follow a reset), so the client
    sees the transfer fail, never a `[DONE]`."""
    mock = anthropic_mock if provider == "anthropic" else openai_mock
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-mock",
             "choices": [{"index": 0, "delta": {"content": "Half an"}, "finish_reason": None}]}
    events = (anthropic_events(MESSAGE_START, TEXT_DELTA) if provider == "anthropic"
              else f"data: {json.dumps(chunk)}\n\n".encode())
    mock.script(Reply(raw=SSE_HEAD + chunked(events), reset=True))
    model = ANTHROPIC_MODEL if provider == "anthropic" else "gpt-mock"
    lines = []
    with gateway.stream("POST", CHAT, headers=custom_host(mock, provider=provider),
                        json=chat_body(model=model, stream=True), timeout=httpx.Timeout(30.0)) as resp:
        assert resp.status_code == 200 and resp.headers["x-gateway-trace-id"]
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete"):
            lines.extend(resp.iter_lines())
    assert "data: [DONE]" not in lines


# --------------------------------------------------------------------------- no HTTP status


@pytest.mark.parametrize("status", ["999 Weird", "600 Beyond"])
def test_a_status_outside_http_is_a_502_naming_it(gateway, openai_mock, status):
    openai_mock.script(Reply(raw=head(status, "Content-Type: application/json", "Content-Length: 2") + b"{}"))
    r = gateway.chat(custom_host(openai_mock), chat_body())
    assert_error(r, 502, type="api_error", code="invalid_provider_response",
                 contains=f"provider 'openai' answered with an invalid HTTP status {status.split()[0]}")
    assert r.headers["x-gateway-provider"] == "openai"


def test_a_status_envoy_refuses_is_a_json_502_too(gateway, openai_mock):
    # Envoy's codec refuses a status below 100 itself, before the filter sees an answer.
    openai_mock.script(Reply(raw=head("099 Early", "Content-Length: 2") + b"{}"))
    r = gateway.chat(custom_host(openai_mock), chat_body())
    assert_error(r, 502, type="api_error", contains="protocol_error")


# --------------------------------------------------------------------------- translated streams cut short


@pytest.mark.parametrize("events, content", [
    (anthropic_events(MESSAGE_START, TEXT_DELTA), "Half an"),  # no message_stop
    (anthropic_events(MESSAGE_START, TEXT_DELTA, MESSAGE_DELTA), "Half an"),  # a finish reason, no message_stop
    (anthropic_events(MESSAGE_START, TEXT_DELTA)[:-30], ""),  # in the middle of an event
], ids=["no-stop", "finish-reason-no-stop", "mid-event"])
def test_a_translated_stream_cut_short_ends_with_an_error_event_and_no_done(gateway, anthropic_mock, events,
                                                                            content):
    anthropic_mock.script(Reply(raw=SSE_HEAD + chunked(events) + b"0\r\n\r\n"))
    body = chat_body(model=ANTHROPIC_MODEL, stream=True)
    with gateway.stream("POST", CHAT, headers=anthropic(anthropic_mock), json=body,
                        timeout=httpx.Timeout(30.0)) as resp:
        assert resp.status_code == 200
        assert resp.headers["x-gateway-trace-id"]
        result = read_stream(resp)
    assert not result.done, "a stream cut short must not end with [DONE]"
    assert result.content == content
    error = json.loads(result.events[-1][1])["error"]
    assert (error["type"], error["message"]) == (
        "api_error", "provider 'anthropic' ended the stream before it was complete")


def test_gemini_and_bedrock_streams_cut_short_end_with_an_error_event(gateway, vertex_mock, bedrock_mock):
    # Gemini on Vertex: a response without its finish reason, then the end.
    gemini = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Half an"}]}, "index": 0}]}
    vertex_mock.script(Reply(raw=SSE_HEAD + chunked(f"data: {json.dumps(gemini)}\n\n".encode()) + b"0\r\n\r\n"))
    headers = {"x-gateway-provider": "vertex-ai", "x-gateway-custom-host": vertex_mock.base_url,
               "x-gateway-cloud-b-project-id": "p", "x-gateway-cloud-b-region": "us-central1",
               "Authorization": f"Bearer {VERTEX_CLIENT_TOKEN}"}
    # Bedrock: the text, then the end without `messageStop`.
    frames = [event_frame({":event-type": name, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps(payload).encode())
              for name, payload in [("messageStart", {"role": "assistant"}),
                                    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Half an"}})]]
    bedrock_mock.script(Reply(raw=head("200 OK", "Content-Type: application/vnd.amazon.eventstream",
                                       "Transfer-Encoding: chunked") + chunked(*frames) + b"0\r\n\r\n"))
    for name, headers, model in [("vertex-ai", headers, "gemini-2.0-flash"),
                                 ("bedrock", config(bedrock_config(bedrock_mock)), BEDROCK_MODEL)]:
        with gateway.stream("POST", CHAT, headers=headers, json=chat_body(model=model, stream=True),
                            timeout=httpx.Timeout(30.0)) as resp:
            assert resp.status_code == 200, resp.read()
            result = read_stream(resp)
        assert result.content == "Half an" and not result.done, (name, result.events)
        error = json.loads(result.events[-1][1])["error"]
        assert error["message"] == f"provider '{name}' ended the stream before it was complete"


def test_a_complete_translated_stream_still_ends_with_done(gateway, anthropic_mock):
    events = anthropic_events(MESSAGE_START, TEXT_DELTA, MESSAGE_DELTA, {"type": "message_stop"})
    anthropic_mock.script(Reply(raw=SSE_HEAD + chunked(events) + b"0\r\n\r\n"))
    body = chat_body(model=ANTHROPIC_MODEL, stream=True)
    with gateway.stream("POST", CHAT, headers=anthropic(anthropic_mock), json=body,
                        timeout=httpx.Timeout(30.0)) as resp:
        result = read_stream(resp)
    assert result.done and result.content == "Half an" and result.finish_reason == "stop"


# --------------------------------------------------------------------------- a stream nobody asked for


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("sse", [b'data: {"choices": []}\n\ndata: [DONE]\n\n', b""], ids=["events", "empty"])
def test_an_event_stream_for_a_json_request_is_a_502(gateway, openai_mock, anthropic_mock, provider, sse):
    mock = openai_mock if provider == "openai" else anthropic_mock
    mock.script(Reply(body=sse, headers={"Content-Type": "text/event-stream"}))
    model = ANTHROPIC_MODEL if provider == "anthropic" else "gpt-mock"
    r = gateway.chat(custom_host(mock, provider=provider), chat_body(model=model))
    assert_error(r, 502, type="api_error", code="invalid_provider_response",
                 contains=["event stream", "could not be read"])
    assert r.headers["content-type"] == "application/json"


# --------------------------------------------------------------------------- empty or silent

@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("framing", ["Content-Length: 0", "Connection: close"], ids=["length-0", "closed"])
def test_a_success_without_a_body_is_a_502(gateway, openai_mock, anthropic_mock, provider, framing):
    """A 200 with nothing in it, announced (`content-length: 0`) or not (closed at once), is
    no answer to a JSON request; an OpenAI-compatible answer otherwise flows as it comes."""
    mock = openai_mock if provider == "openai" else anthropic_mock
    mock.script(Reply(raw=head("200 OK", "Content-Type: application/json", framing)))
    model = ANTHROPIC_MODEL if provider == "anthropic" else "gpt-mock"
    r = gateway.chat(custom_host(mock, provider=provider), chat_body(model=model))
    assert_error(r, 502, type="api_error", code="invalid_provider_response",
                 contains=f"provider '{provider}' answered 200 with an empty body")
    assert r.headers["x-gateway-provider"] == provider
    line = gateway.wait_for_log_line(f'trace_id="{r.headers["x-gateway-trace-id"]}"')
    assert "status=502" in line, line


def test_an_answer_of_unannounced_length_still_flows_whole(gateway, openai_mock):
    completion = {"id": "c-close", "object": "chat.completion", "created": 1, "model": "gpt-mock",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "closed"},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    body = json.dumps(completion).encode()
    openai_mock.script(Reply(raw=head("200 OK", "Content-Type: application/json", "Connection: close") + body))
    r = gateway.chat(custom_host(openai_mock), chat_body())
    assert r.status_code == 200 and r.content == body


IDLE_TIMEOUT = 2


@pytest.fixture(scope="module")
def idle(start_gateway):
    """A gateway whose stream idle timeout is short enough to wait for."""
    with start_gateway("idle", None, {"GATEWAY_STREAM_IDLE_TIMEOUT": str(IDLE_TIMEOUT)}) as gw:
        yield gw


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@pytest.mark.parametrize("when", ["before-headers", "after-headers"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_provider_gone_silent_is_a_504_after_the_idle_timeout(idle, openai_mock, anthropic_mock, when, provider):
    """Silent before its headers, or after the headers of an answer the filter holds (every
    translated one): Envoy's 504 at the stream idle timeout, in the gateway's error shape with
    its headers, and the request's record says so."""
    mock = openai_mock if provider == "openai" else anthropic_mock
    linger = threading.Event()
    raw = b"" if when == "before-headers" else JSON_HEAD + b'{"id": "msg_1"'
    if provider == "openai" and when == "after-headers":
        # An OpenAI-compatible answer of unannounced length waits for its first byte.
        raw = head("200 OK", "Content-Type: application/json", "Connection: close")
    mock.script(Reply(raw=raw, linger=linger))
    model = ANTHROPIC_MODEL if provider == "anthropic" else "gpt-mock"
    try:
        r, took = timed(lambda: idle.chat(custom_host(mock, provider=provider), chat_body(model=model)))
    finally:
        linger.set()
    assert IDLE_TIMEOUT - 0.5 < took < IDLE_TIMEOUT + 5, took
    assert_error(r, 504, type="timeout_error", code="upstream_stalled",
                 contains=f"sent nothing for the stream idle timeout (GATEWAY_STREAM_IDLE_TIMEOUT, {IDLE_TIMEOUT}s)")
    assert r.headers["x-gateway-provider"] == provider
    line = idle.wait_for_log_line(f'trace_id="{r.headers["x-gateway-trace-id"]}"')
    assert "status=504" in line and "error=upstream_stalled" in line, line


def test_a_provider_gone_silent_on_the_messages_api_is_anthropics_504(idle, anthropic_mock):
    # Native Messages passes as it comes; an answer of unannounced length waits for its first byte.
    linger = threading.Event()
    anthropic_mock.script(Reply(raw=head("200 OK", "Content-Type: application/json", "Connection: close"),
                                linger=linger))
    headers = {"x-gateway-provider": "anthropic", "x-gateway-custom-host": anthropic_mock.base_url,
               "x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
    try:
        r = idle.post("/v1/messages", {"model": ANTHROPIC_MODEL, "max_tokens": 10,
                                       "messages": [{"role": "user", "content": "hi"}]}, headers=headers)
    finally:
        linger.set()
    assert r.status_code == 504, r.text
    assert r.json() == {"type": "error", "error": {"type": "timeout_error", "message": (
        f"the provider sent nothing for the stream idle timeout (GATEWAY_STREAM_IDLE_TIMEOUT, {IDLE_TIMEOUT}s)")}}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_gone_silent_is_cut_at_the_idle_timeout_and_never_looks_complete(idle, openai_mock,
                                                                                  anthropic_mock, provider):
    mock = anthropic_mock if provider == "anthropic" else openai_mock
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-mock",
             "choices": [{"index": 0, "delta": {"content": "Half an"}, "finish_reason": None}]}
    events = (anthropic_events(MESSAGE_START, TEXT_DELTA) if provider == "anthropic"
              else f"data: {json.dumps(chunk)}\n\n".encode())
    linger = threading.Event()
    mock.script(Reply(raw=SSE_HEAD + chunked(events), linger=linger))
    model = ANTHROPIC_MODEL if provider == "anthropic" else "gpt-mock"
    lines = []
    started = time.monotonic()
    try:
        with idle.stream("POST", CHAT, headers=custom_host(mock, provider=provider),
                         json=chat_body(model=model, stream=True), timeout=httpx.Timeout(30.0)) as resp:
            assert resp.status_code == 200 and resp.headers["x-gateway-trace-id"]
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete"):
                lines.extend(resp.iter_lines())
    finally:
        linger.set()
    assert time.monotonic() - started < IDLE_TIMEOUT + 5
    assert any("Half an" in line for line in lines), lines
    assert "data: [DONE]" not in lines


def test_a_client_that_stops_sending_its_body_gets_a_json_408(idle, openai_mock):
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
               b"x-gateway-api-key: " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"model\"")
    r, took = timed(lambda: raw_http("127.0.0.1", idle.port, request, timeout=IDLE_TIMEOUT + 5))
    assert r.status_code == 408, r.text
    assert r.json()["error"]["code"] == "request_body_stalled"
    assert took > IDLE_TIMEOUT - 0.5
    assert not openai_mock.requests_to("/v1/chat/completions")
