"""Gateway authentication, trace ids, gateway-header validation and header forwarding."""

from __future__ import annotations

import pytest

from helpers import (CLIENT_TOKEN, KEY, KEY2, assert_clean_upstream, assert_error, chat_body, config,
                     custom_host, provider_config, served_by)


def test_health_needs_no_key(gateway):
    r = gateway.get("/health", key=None)
    assert r.status_code == 200


@pytest.mark.parametrize("key", [None, "gw-wrong-key", ""], ids=["missing", "unknown", "empty"])
def test_missing_or_unknown_key_is_401(gateway, openai_mock, key):
    headers = custom_host(openai_mock)
    if key is not None:
        headers["x-gateway-api-key"] = key
    r = gateway.chat(headers, key=None)
    assert_error(r, 401, contains="x-gateway-api-key")
    assert openai_mock.requests == []


@pytest.mark.parametrize("header", ["x-gateway-api-key", "api_key", "apikey"])
@pytest.mark.parametrize("key", [KEY, KEY2])
def test_key_header_and_aliases_accepted(gateway, openai_mock, header, key):
    r = gateway.chat({header: key, **custom_host(openai_mock)}, key=None)
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    rec = openai_mock.last
    # the gateway key never reaches the provider, under any header name
    assert_clean_upstream(rec, key)
    assert "api_key" not in rec.headers and "apikey" not in rec.headers


def test_trace_id_echoed_on_success_and_errors(gateway, openai_mock):
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-trace-id": "abc"})
    assert r.status_code == 200
    assert r.headers["x-gateway-trace-id"] == "abc"
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-trace-id": "abc"}, key="gw-wrong-key")
    assert r.status_code == 401
    assert r.headers["x-gateway-trace-id"] == "abc"
    r = gateway.post("/v1/nope", {}, headers={"x-gateway-trace-id": "trace-404"})
    assert r.status_code == 404
    assert r.headers["x-gateway-trace-id"] == "trace-404"


def test_trace_id_generated_when_absent(gateway, openai_mock):
    ids = []
    for key in (KEY, "gw-wrong-key"):  # a served response and a local error
        for _ in range(2):
            r = gateway.chat(custom_host(openai_mock), key=key)
            assert r.status_code in (200, 401)
            tid = r.headers.get("x-gateway-trace-id")
            assert tid and tid.strip(), f"no generated trace id on {r.status_code}"
            ids.append(tid)
    assert len(set(ids)) == len(ids), f"generated trace ids repeat: {ids}"


def test_trace_id_on_local_errors(gateway, openai_mock):
    cases = [
        gateway.chat(custom_host(openai_mock), key=None),  # 401
        gateway.chat({**custom_host(openai_mock), "x-gateway-metadata": "not-json"}),  # 400 header
        gateway.chat(custom_host(openai_mock), chat_body(temperature=3)),  # 400 body
        gateway.post("/v1/nope", {}),  # 404
        gateway.chat({**custom_host(openai_mock), "x-gateway-custom-host": "http://10.1.2.3/v1"}),  # 403
    ]
    for r in cases:
        assert r.status_code >= 400
        assert r.headers.get("x-gateway-trace-id"), f"{r.status_code} without x-gateway-trace-id"
    assert openai_mock.requests == []


def test_no_gateway_header_reaches_provider_and_others_are_forwarded(gateway, openai_mock):
    headers = {
        **custom_host(openai_mock),
        "x-gateway-trace-id": "trace-fwd",
        "x-gateway-span-id": "span-1",
        "x-gateway-parent-span-id": "span-0",
        "x-gateway-span-name": "e2e",
        "x-gateway-metadata": '{"_user": "u1", "team": "e2e"}',
        "x-gateway-cache-namespace": "ns1",
        "x-gateway-request-timeout": "20000",
        "x-custom-thing": "hello there",
        "x-another-one": "42",
    }
    r = gateway.chat(headers, chat_body("forward please"))
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    assert r.headers["x-gateway-trace-id"] == "trace-fwd"
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/chat/completions")
    assert rec.headers["authorization"] == f"Bearer {CLIENT_TOKEN}"
    assert rec.headers["x-custom-thing"] == "hello there"
    assert rec.headers["x-another-one"] == "42"
    assert_clean_upstream(rec, KEY)
    assert rec.json["messages"] == [{"role": "user", "content": "forward please"}]


@pytest.mark.parametrize("header, value", [
    ("x-gateway-metadata", "not-json"),
    ("x-gateway-metadata", "[1]"),
    ("x-gateway-metadata", '"a string"'),
    ("x-gateway-request-timeout", "abc"),
    ("x-gateway-cache-force-refresh", "maybe"),
    ("x-gateway-forward-headers", '{"a":1}'),
], ids=lambda v: v if len(v) < 30 else v[:30])
def test_bad_gateway_header_is_400_naming_it(gateway, openai_mock, header, value):
    r = gateway.chat({**custom_host(openai_mock), header: value})
    assert_error(r, 400, contains=header)
    assert openai_mock.requests == []


@pytest.mark.parametrize("header, value", [
    ("x-gateway-metadata", '{"_user": "u1", "_environment": "test", "free": "form"}'),
    ("x-gateway-request-timeout", "30000"),
    ("x-gateway-cache-force-refresh", "true"),
    ("x-gateway-cache-force-refresh", "false"),
    ("x-gateway-forward-headers", "[]"),
])
def test_valid_gateway_header_values_pass(gateway, openai_mock, header, value):
    r = gateway.chat({**custom_host(openai_mock), header: value})
    assert r.status_code == 200, r.text
    assert_clean_upstream(openai_mock.last, KEY)


@pytest.mark.parametrize("value", ['["x-a","x-b"]', "x-a, x-b", "X-A,X-B"], ids=["json", "comma", "upper"])
def test_forward_headers_header(gateway, openai_mock, value):
    headers = {**custom_host(openai_mock), "x-gateway-forward-headers": value,
               "x-a": "Value-A (kept AS-is)", "x-b": "b=1; c=\"two\""}
    r = gateway.chat(headers)
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers["x-a"] == "Value-A (kept AS-is)"
    assert rec.headers["x-b"] == "b=1; c=\"two\""
    assert_clean_upstream(rec, KEY)


def test_forward_headers_in_config(gateway, openai_mock):
    cfg = provider_config(openai_mock, forward_headers=["x-a", "x-b"])
    r = gateway.chat({**config(cfg), "x-a": "from-config", "x-b": "B"})
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers["x-a"] == "from-config" and rec.headers["x-b"] == "B"
    assert rec.headers["authorization"] == "Bearer sk-config-key"
    assert_clean_upstream(rec, KEY)

