"""Request timeouts and TLS verification of custom hosts."""

from __future__ import annotations

import time

import pytest

from helpers import (KEY, OPENAI_KEYS, assert_error, chat_body, check_alive, config, custom_host, provider_config, slug,
                     stream_chat)
from mocks import OpenAIMock, Reply, make_self_signed_cert, tls_server_context

STALL = 3.0  # the mock's delay before headers; timeouts below fire long before it


@pytest.fixture(scope="module")
def tls_mock(tmp_path_factory):
    cert, key = make_self_signed_cert(tmp_path_factory.mktemp("tls"))
    mock = OpenAIMock(OPENAI_KEYS, ssl_context=tls_server_context(cert, key)).start()
    yield mock
    mock.stop()


# --------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_timeout_runs_until_headers_so_a_started_stream_is_not_cut(gateway, openai_mock, anthropic_mock, provider):
    mock = openai_mock if provider == "openai" else anthropic_mock
    mock.script(Reply(text="one two three four five six", chunk_delay=0.15))
    headers = {**custom_host(mock, provider=provider), "x-gateway-request-timeout": "300"}
    t0 = time.monotonic()
    result = stream_chat(gateway, headers, chat_body(model="m"))
    assert time.monotonic() - t0 > 0.6, "the stream should have outlived the 300 ms timeout"
    assert result.done and result.content == "one two three four five six"


@pytest.mark.parametrize("how", ["header", "config"])
def test_request_timeout_is_408(gateway, openai_mock, how):
    openai_mock.script(Reply(stall=STALL))
    if how == "header":
        headers = {**custom_host(openai_mock), "x-gateway-request-timeout": "300"}
    else:
        headers = config(provider_config(openai_mock, request_timeout=300))
    t0 = time.monotonic()
    r = gateway.chat(headers)
    elapsed = time.monotonic() - t0
    assert_error(r, 408, type="timeout_error")
    assert elapsed < STALL - 0.5, f"the gateway waited {elapsed:.1f}s for a 300 ms timeout"
    assert len(openai_mock.requests) == 1  # it did reach the provider


def test_request_timeout_anthropic_and_stream(gateway, anthropic_mock, openai_mock):
    anthropic_mock.script(Reply(stall=STALL))
    r = gateway.chat({**slug("anthropic-mock"), "x-gateway-request-timeout": "300"}, chat_body(model="claude-t"))
    assert_error(r, 408, type="timeout_error")

    openai_mock.script(Reply(stall=STALL))
    t0 = time.monotonic()
    with gateway.stream("POST", "/v1/chat/completions", key=KEY,
                        headers={**custom_host(openai_mock), "x-gateway-request-timeout": "300"},
                        json=chat_body(stream=True)) as resp:
        resp.read()
    assert time.monotonic() - t0 < STALL - 0.5
    assert_error(resp, 408, type="timeout_error")
    check_alive(gateway, openai_mock)


def test_request_timeout_not_reached(gateway, openai_mock):
    openai_mock.script(Reply(stall=0.5, text="in time"))
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-request-timeout": "5000"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "in time"


# --------------------------------------------------------------------------- TLS


@pytest.mark.parametrize("how", ["header", "config"])
def test_self_signed_custom_host_is_refused(gateway, tls_mock, how):
    tls_mock.reset()
    assert tls_mock.base_url.startswith("https://127.0.0.1:")
    if how == "header":
        headers = custom_host(tls_mock)
    else:
        headers = config(provider_config(tls_mock))
    r = gateway.chat(headers)
    assert_error(r, 502)
    # counted as the mock accepts the connection, before its side of the TLS handshake
    assert tls_mock.wait_until(lambda m: m.connections >= 1, timeout=2), \
        "the gateway never connected to the HTTPS custom host"
    assert tls_mock.requests == [], "the gateway trusted a self-signed certificate and sent the request"
