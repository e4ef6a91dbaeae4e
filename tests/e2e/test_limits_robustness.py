"""Request validation, size limits and hostile input. Hostile input gets the exact answer the
README promises (400 naming the parameter at fault, 401 for a bad gateway key, Envoy's own
400/431 for what its HTTP codec refuses; never a 5xx or a hang), nothing reaches the
provider, and a normal request still succeeds afterwards."""

from __future__ import annotations

import gzip
import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import (CHAT, assert_envoy_rejected, assert_error, chat_body, check_alive, config, custom_host, slug)

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


def assert_refused(gateway, openai_mock, r, param: str) -> None:
    """A hostile body got 400 naming ``param``, nothing reached the provider, and the
    gateway still serves."""
    assert_error(r, 400, param=param, type="invalid_request_error")
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


MSG = b'"messages": [{"role": "user", "content": "hi"}]'


def test_malformed_json_is_400(gateway, openai_mock):
    r = raw_chat(gateway, openai_mock, b'{"model": "gpt-mock", "messages": [')
    assert_refused(gateway, openai_mock, r, "body")


@pytest.mark.parametrize("body, param", [
    (b"[]", "body"),
    (b'"hi"', "body"),
    (b"null", "body"),
    (b"42", "body"),
    (b"", "body"),
    (b'{"model": "m", "messages": "hello"}', "messages"),
    (b'{"model": 123, ' + MSG + b"}", "model"),
    (b'{"model": "m", ' + MSG + b', "temperature": "hot"}', "temperature"),
    (b'{"model": "m", ' + MSG + b', "stream": "yes"}', "stream"),
    (b'{"model": "m", ' + MSG + b', "tools": "x"}', "tools"),
    (b'{"model": "m", "messages": [42]}', "messages[0]"),
    (b'{"model": "m", "messages": [{"content": "no role"}]}', "messages[0].role"),
    (b'{"model": "m", ' + MSG + b', "n": 1.5}', "n"),
], ids=["array", "string", "null", "number", "empty", "messages-string", "model-int", "temperature-string",
        "stream-string", "tools-string", "message-int", "message-no-role", "n-float"])
def test_wrong_types_are_400_naming_the_param(gateway, openai_mock, body, param):
    r = raw_chat(gateway, openai_mock, body)
    assert_refused(gateway, openai_mock, r, param)


@pytest.mark.parametrize("body, param", [
    (b'{"model": "m", ' + MSG + b', "temperature": 1e400}', "body"),  # not a finite JSON number
    (b'{"model": "m", ' + MSG + b', "temperature": -1e400}', "body"),
    (b'{"model": "m", ' + MSG + b', "seed": 1000000000000000000000000000000}', "seed"),
    (b'{"model": "m", ' + MSG + b', "n": 1000000000000000000000000000000}', "n"),
    (b'{"model": "m", ' + MSG + b', "max_tokens": 1e400}', "body"),
], ids=["temp-1e400", "temp-neg-1e400", "seed-1e30", "n-1e30", "max_tokens-1e400"])
def test_huge_numbers_are_400(gateway, openai_mock, body, param):
    r = raw_chat(gateway, openai_mock, body)
    assert_refused(gateway, openai_mock, r, param)


@pytest.mark.parametrize("body", [
    random.Random(7).randbytes(4096),
    b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe\x80"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}\x00\x00garbage',
    b"\xef\xbb\xbf\x00{" * 100,
], ids=["random", "invalid-utf8", "trailing-garbage", "bom-nul"])
def test_binary_garbage_body_is_400_body(gateway, openai_mock, body):
    r = raw_chat(gateway, openai_mock, body)
    assert_refused(gateway, openai_mock, r, "body")


@pytest.mark.parametrize("where", ["top-level", "in-field"])
def test_deep_nesting_is_400_body(gateway, openai_mock, where):
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    if where == "top-level":
        body = nested
    else:
        body = b'{"model": "m", ' + MSG + b', "user": ' + nested + b"}"
    r = raw_chat(gateway, openai_mock, body)
    assert_refused(gateway, openai_mock, r, "body")


def nested_targets(levels: int, leaf: dict) -> dict:
    """A config whose only leaf target sits ``levels`` levels of targets down."""
    cfg = leaf
    for _ in range(levels):
        cfg = {"strategy": {"mode": "fallback"}, "targets": [cfg]}
    return cfg


@pytest.mark.parametrize("levels", [9, 63, 64, 100])
def test_targets_nested_too_deep_are_400_naming_the_ninth_level(gateway, openai_mock, levels):
    """64 levels and more nest deeper than the JSON parser reads: the same 400 as 9 to 63."""
    leaf = {"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url}
    r = gateway.chat(config(nested_targets(levels, leaf)))
    assert_error(r, 400, param=".".join(["targets[0]"] * 9), code="invalid_config",
                 contains="targets nest more than 8 levels deep")
    assert openai_mock.requests == []


def test_eight_levels_of_targets_are_served(gateway, openai_mock):
    leaf = {"provider": "openai", "api_key": "sk-config-key", "custom_host": openai_mock.base_url}
    r = gateway.chat(config(nested_targets(8, leaf)))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-target"] == ".".join(["targets[0]"] * 8)


def test_a_body_nested_deeper_than_the_parser_reads_is_named_as_such(gateway, openai_mock):
    depth = 128
    body = b'{"model": "m", ' + MSG + b', "user": ' + b"[" * depth + b"]" * depth + b"}"
    r = raw_chat(gateway, openai_mock, body)
    assert_error(r, 400, param="body", contains="more than 127 levels deep")
    assert "not valid JSON" not in r.json()["error"]["message"]
    assert openai_mock.requests == []


def test_deep_nesting_in_config_header_is_400(gateway, openai_mock):
    depth = 10_000
    cfg = '{"provider": "openai", "api_key": "k", "override_params": {"x": ' + "[" * depth + "]" * depth + "}}"
    r = gateway.chat({"x-gateway-config": cfg})
    assert_error(r, 400, param="x-gateway-config", code="invalid_config")
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


# --------------------------------------------------------------------------- config values sent as headers


def openai_leaf(mock, **fields) -> dict:
    return {"provider": "openai", "api_key": "sk-config-key", "custom_host": mock.base_url, **fields}


@pytest.mark.parametrize("bad", ["sk-a\r\nx-injected: 1", "sk-a\nb", "sk-a\x00b"], ids=["crlf", "lf", "nul"])
@pytest.mark.parametrize("where", ["api_key", "vendor_organization", "vendor_project", "target", "bedrock"])
def test_a_config_value_sent_as_a_header_refuses_control_characters(gateway, openai_mock, where, bad):
    """Once Envoy's plain-text 503 `invalid header value for: authorization`: now a 400 naming the field."""
    cfg, param = {
        "api_key": (openai_leaf(openai_mock, api_key=bad), "api_key"),
        "vendor_organization": (openai_leaf(openai_mock, vendor_organization=bad), "vendor_organization"),
        "vendor_project": (openai_leaf(openai_mock, vendor_project=bad), "vendor_project"),
        "target": ({"strategy": {"mode": "fallback"},
                    "targets": [openai_leaf(openai_mock), openai_leaf(openai_mock, api_key=bad)]}, "targets[1].api_key"),
        "bedrock": ({"provider": "bedrock", "cloud_c_access_key_id": "AKID", "cloud_c_secret_access_key": "s",
                     "cloud_c_session_token": bad, "cloud_c_region": "us-east-1"}, "cloud_c_session_token"),
    }[where]
    r = gateway.chat(config(cfg))
    err = assert_error(r, 400, type="invalid_request_error", param=param, code="invalid_config",
                       contains=["control characters", param])
    assert "sk-a" not in r.text, "the value is never echoed"
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)
    assert err["message"].startswith(f"invalid config at `{param}`")


# --------------------------------------------------------------------------- encoded bodies


CHAT_BYTES = json.dumps(chat_body()).encode()


@pytest.mark.parametrize("encoding, body", [
    ("gzip", gzip.compress(CHAT_BYTES)),
    ("br", CHAT_BYTES),  # parses as JSON, but the header says otherwise
    ("gzip, identity", gzip.compress(CHAT_BYTES)),
    ("x-unknown", CHAT_BYTES),
], ids=["gzip", "br-plain-bytes", "list", "unknown"])
def test_a_body_the_gateway_reads_with_a_content_encoding_is_415(gateway, openai_mock, encoding, body):
    r = raw_chat(gateway, openai_mock, body, [(b"content-encoding", encoding.encode())])
    assert_error(r, 415, type="invalid_request_error", param="content-encoding",
                 code="unsupported_content_encoding", contains=encoding.split(",")[0])
    assert openai_mock.requests == []


def test_embeddings_with_a_content_encoding_are_415(gateway, openai_mock):
    body = gzip.compress(json.dumps({"model": "text-embedding-3-small", "input": "hi"}).encode())
    headers = [*custom_host(openai_mock).items(), (b"content-encoding", b"gzip")]
    r = gateway.raw("POST", "/v1/embeddings", headers, body)
    assert_error(r, 415, param="content-encoding", code="unsupported_content_encoding", contains="gzip")
    assert openai_mock.requests == []


def test_identity_is_no_encoding(gateway, openai_mock):
    r = raw_chat(gateway, openai_mock, CHAT_BYTES, [(b"content-encoding", b"identity")])
    assert r.status_code == 200, r.text[:300]


# --------------------------------------------------------------------------- hostile headers


ENVOY = "envoy"  # expected answer: Envoy's own 400, the request never reaches the filter


@pytest.mark.parametrize("name, value, expect", [
    (b"x-gateway-api-key", b"\xff\xfe\x80garbage", 401),
    (b"x-gateway-config", b'{"provider": "openai", "custom_host": "@HOST@", "api_key": "\xff\xc3\x28"}',
     "x-gateway-config"),
    (b"x-gateway-metadata", b'{"k": "\x80\x81\xfe"}', "x-gateway-metadata"),
    (b"x-gateway-provider", b"\xc3\x28\xa0\xa1", "x-gateway-provider"),
    (b"x-gateway-custom-host", b"http://\xff\xfe/v1", "x-gateway-custom-host"),
    (b"x-gateway-request-timeout", b"\xff", "x-gateway-request-timeout"),
    (b"x-gateway-forward-headers", b'["\xff"]', "x-gateway-forward-headers"),
    (b"x-gateway-trace-id", b"\xff\xfe", "x-gateway-trace-id"),
    (b"x-gateway-api-key", b"gw-test\x01key\x7f", ENVOY),  # control characters
    (b"x-gateway-config", b"{\x00}", ENVOY),
], ids=["key-highbytes", "config-highbytes", "metadata-highbytes", "provider-highbytes", "custom-host-highbytes",
        "timeout-highbyte", "forward-headers-highbyte", "trace-id-highbytes", "key-control-chars", "config-nul"])
def test_garbage_in_gateway_headers(gateway, openai_mock, name, value, expect):
    """Gateway headers must be valid UTF-8: 400 naming the header, or 401 for the gateway
    key (checked before anything else). Control bytes never get past Envoy's codec."""
    value = value.replace(b"@HOST@", openai_mock.base_url.encode())
    if name == b"x-gateway-api-key":
        r = gateway.raw("POST", CHAT, [(name, value), *custom_host(openai_mock).items()],
                        json.dumps(chat_body()).encode(), key=None)
    elif name in (b"x-gateway-config", b"x-gateway-provider"):
        r = gateway.raw("POST", CHAT, [(name, value)], json.dumps(chat_body()).encode())
    else:
        headers = [(k, v) for k, v in custom_host(openai_mock).items() if k.encode() != name]
        r = gateway.raw("POST", CHAT, [*headers, (name, value)], json.dumps(chat_body()).encode())
    if expect == ENVOY:
        assert_envoy_rejected(r, openai_mock)
    elif expect == 401:
        assert_error(r, 401, type="authentication_error", param=None)
    else:
        assert_error(r, 400, type="invalid_request_error", param=expect, contains=expect)
    assert openai_mock.requests == []
    check_alive(gateway, openai_mock)


def test_ordinary_header_with_high_bytes_reaches_the_provider_byte_for_byte(gateway, openai_mock):
    r = raw_chat(gateway, openai_mock, json.dumps(chat_body()).encode(), [(b"x-custom-thing", b"\xff\xfe\x80\x81")])
    assert r.status_code == 200, r.text[:300]
    assert r.headers.get("x-gateway-provider") == "openai"
    # http.server decodes header bytes as Latin-1: each byte arrives as one character.
    assert openai_mock.last.headers["x-custom-thing"] == "\xff\xfe\x80\x81"


@pytest.mark.parametrize("name, value", [
    (b"x-custom-thing", b"a\x01b\x7fc"),
    (b"x-\xffname", b"v"),
], ids=["control-chars-in-value", "high-byte-in-name"])
def test_invalid_header_is_envoys_400(gateway, openai_mock, name, value):
    r = raw_chat(gateway, openai_mock, json.dumps(chat_body()).encode(), [(name, value)])
    assert_envoy_rejected(r, openai_mock)
    check_alive(gateway, openai_mock)


@pytest.mark.parametrize("name", [b"x-custom-thing", b"x-gateway-config", b"x-gateway-api-key"])
def test_one_megabyte_header_is_431(gateway, openai_mock, name):
    r = raw_chat(gateway, openai_mock, json.dumps(chat_body()).encode(), [(name, b"a" * MiB)])
    assert r.status_code == 431, f"expected Envoy's 431, got {r.status_code}: {r.text[:300]!r}"
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
