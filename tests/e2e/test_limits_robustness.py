"""Request validation, size limits and hostile input. Hostile input must get a 4xx
(never a 5xx or a hang), and a normal request must still succeed afterwards."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import (CHAT, assert_4xx, assert_error, chat_body, check_alive, custom_host, error_of, slug)

MiB = 1024 * 1024


def tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {}}}}


def raw_chat(gateway, openai_mock, body: bytes, extra_headers=(), **kw):
    headers = list(custom_host(openai_mock).items()) + list(extra_headers)
    return gateway.raw("POST", CHAT, headers, body, **kw)


# --------------------------------------------------------------------------- chat validation


@pytest.mark.parametrize("override, param", [
    ({"temperature": 3}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"messages": []}, "messages"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"top_logprobs": 5}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [tool(i) for i in range(129)]}, "tools"),
    ({"messages": [{"role": "robot", "content": "beep"}]}, "messages[0].role"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
], ids=["temperature-3", "temperature-neg", "messages-empty", "n-0", "n-129", "stop-5", "top_logprobs-no-logprobs",
        "top_logprobs-21", "tools-129", "role-robot", "top_p", "presence_penalty", "frequency_penalty"])
def test_chat_validation_names_param(gateway, openai_mock, override, param):
    r = gateway.chat(custom_host(openai_mock), chat_body(**override))
    assert_error(r, 400, param=param, type="invalid_request_error")
    assert openai_mock.requests == []


def test_boundary_values_pass_unchanged(gateway, openai_mock):
    body = {
        "model": "gpt-mock",
        "messages": [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
                     {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                     {"role": "user", "content": [{"type": "text", "text": "again"}]}],
        "temperature": 2, "top_p": 0, "n": 128, "stop": ["a", "b", "c", "d"], "logprobs": True,
        "top_logprobs": 20, "presence_penalty": -2, "frequency_penalty": 2,
        "tools": [tool(i) for i in range(128)], "seed": -(2 ** 63), "logit_bias": {"50256": -100, "42": 100},
        "user": "user-1", "max_tokens": 16,
    }
    r = gateway.chat(custom_host(openai_mock), body)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 128
    assert openai_mock.last.json == body


def test_malformed_json_is_400(gateway, openai_mock):
    r = raw_chat(gateway, openai_mock, b'{"model": "gpt-mock", "messages": [')
    assert_error(r, 400)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("body", [
    b"[]", b'"hi"', b"null", b"42", b"",
    b'{"model": "m", "messages": "hello"}',
    b'{"model": 123, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": "x"}',
    b'{"model": "m", "messages": [42]}',
    b'{"model": "m", "messages": [{"content": "no role"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1.5}',
], ids=["array", "string", "null", "number", "empty", "messages-string", "model-int", "temperature-string",
        "stream-string", "tools-string", "message-int", "message-no-role", "n-float"])
def test_wrong_types_are_4xx(gateway, openai_mock, body):
    r = raw_chat(gateway, openai_mock, body)
    assert_4xx(r)
    error_of(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": -1e400}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1000000000000000000000000000000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1000000000000000000000000000000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
], ids=["temp-1e400", "temp-neg-1e400", "seed-1e30", "n-1e30", "max_tokens-1e400"])
def test_huge_numbers_are_4xx(gateway, openai_mock, body):
    r = raw_chat(gateway, openai_mock, body)
    assert_4xx(r)
    error_of(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("body", [
    random.Random(7).randbytes(4096),
    b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe\x80"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}\x00\x00garbage',
    b"\xef\xbb\xbf\x00{" * 100,
], ids=["random", "invalid-utf8", "trailing-garbage", "bom-nul"])
def test_binary_garbage_body_is_4xx(gateway, openai_mock, body):
    r = raw_chat(gateway, openai_mock, body)
    assert_4xx(r)
    error_of(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("where", ["top-level", "in-field"])
def test_deep_nesting_is_4xx(gateway, openai_mock, where):
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    if where == "top-level":
        body = nested
    else:
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": ' + nested + b"}"
    r = raw_chat(gateway, openai_mock, body)
    assert_4xx(r)
    error_of(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


def test_deep_nesting_in_config_header_is_4xx(gateway, openai_mock):
    depth = 10_000
    cfg = '{"provider": "openai", "api_key": "k", "override_params": {"x": ' + "[" * depth + "]" * depth + "}}"
    r = gateway.chat({"x-gateway-config": cfg})
    assert_4xx(r)
    error_of(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


# --------------------------------------------------------------------------- hostile headers


@pytest.mark.parametrize("name, value", [
    (b"x-gateway-api-key", b"\xff\xfe\x80garbage"),
    (b"x-gateway-config", b'{"provider": "openai", "custom_host": "@HOST@", "api_key": "\xff\xc3\x28"}'),
    (b"x-gateway-metadata", b'{"k": "\x80\x81\xfe"}'),
    (b"x-gateway-provider", b"\xc3\x28\xa0\xa1"),
    (b"x-gateway-custom-host", b"http://\xff\xfe/v1"),
    (b"x-gateway-request-timeout", b"\xff"),
    (b"x-gateway-forward-headers", b'["\xff"]'),
    (b"x-gateway-api-key", b"gw-test\x01key\x7f"),
    (b"x-gateway-config", b"{\x00}"),
], ids=["key-highbytes", "config-highbytes", "metadata-highbytes", "provider-highbytes", "custom-host-highbytes",
        "timeout-highbyte", "forward-headers-highbyte", "key-control-chars", "config-nul"])
def test_garbage_in_gateway_headers_is_4xx(gateway, openai_mock, name, value):
    """Invalid UTF-8 / control bytes in a gateway header: a 4xx (JSON text must be UTF-8;
    the gateway must neither crash nor pass mangled bytes on)."""
    value = value.replace(b"@HOST@", openai_mock.base_url.encode())
    if name == b"x-gateway-api-key":
        r = gateway.raw("POST", CHAT, [(name, value), *custom_host(openai_mock).items()],
                        json.dumps(chat_body()).encode(), key=None)
    elif name in (b"x-gateway-config", b"x-gateway-provider"):
        r = gateway.raw("POST", CHAT, [(name, value)], json.dumps(chat_body()).encode())
    else:
        headers = [(k, v) for k, v in custom_host(openai_mock).items() if k.encode() != name]
        r = gateway.raw("POST", CHAT, [*headers, (name, value)], json.dumps(chat_body()).encode())
    assert_4xx(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("name, value", [
    (b"x-custom-thing", b"\xff\xfe\x80\x81"),
    (b"x-custom-thing", b"a\x01b\x7fc"),
    (b"x-\xffname", b"v"),
    (b"x-gateway-trace-id", b"\xff\xfe"),
])
def test_garbage_in_other_headers_is_never_5xx(gateway, openai_mock, name, value):
    r = raw_chat(gateway, openai_mock, json.dumps(chat_body()).encode(), [(name, value)])
    assert r.status_code < 500, f"{r.status_code}: {r.text[:300]}"
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("name", [b"x-custom-thing", b"x-gateway-config", b"x-gateway-api-key"])
def test_one_megabyte_header_is_4xx(gateway, openai_mock, name):
    r = raw_chat(gateway, openai_mock, json.dumps(chat_body()).encode(), [(name, b"a" * MiB)])
    assert_4xx(r)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


# --------------------------------------------------------------------------- body size


def test_body_over_20_mib_is_413(gateway, openai_mock):
    content = "x" * (21 * MiB)
    body = json.dumps(chat_body(content)).encode()
    r = raw_chat(gateway, openai_mock, body, timeout=60)
    assert_error(r, 413)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


def test_body_of_19_mib_passes_intact(gateway, openai_mock):
    pattern = "0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
    size = 19 * MiB
    content = (pattern * (size // len(pattern) + 1))[:size]
    r = gateway.chat(custom_host(openai_mock), chat_body(content), timeout=120)
    assert r.status_code == 200, r.text[:500]
    rec = openai_mock.last
    received = rec.json["messages"][0]["content"]
    assert len(received) == len(content)
    assert received == content
    check_alive(gateway, openai_mock)


# --------------------------------------------------------------------------- concurrency


def test_concurrent_requests_keep_their_own_state(gateway, openai_mock, anthropic_mock):
    def one(i: int):
        trace = f"conc-{i}"
        if i % 3 == 0:
            r = gateway.chat({**slug("anthropic-mock"), "x-gateway-trace-id": trace},
                             chat_body(f"q{i}", model="claude-conc"))
            return trace, r, "anthropic"
        if i % 3 == 1:
            r = gateway.chat({**custom_host(openai_mock), "x-gateway-trace-id": trace}, chat_body(f"q{i}"))
            return trace, r, "openai"
        r = gateway.chat({**custom_host(openai_mock), "x-gateway-trace-id": trace}, chat_body(temperature=9))
        return trace, r, None

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(24)))
    for trace, r, provider in results:
        assert r.headers.get("x-gateway-trace-id") == trace
        if provider is None:
            assert_error(r, 400, param="temperature")
        else:
            assert r.status_code == 200, r.text
            assert r.headers.get("x-gateway-provider") == provider
    assert len(anthropic_mock.requests) == 8 and len(openai_mock.requests) == 8
    assert sorted(r.json["messages"][0]["content"] for r in openai_mock.requests) == sorted(
        f"q{i}" for i in range(24) if i % 3 == 1)
