"""Gateway authentication, trace ids, gateway-header validation and header forwarding."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from helpers import (CHAT, CLIENT_TOKEN, KEY, KEY2, OPENAI_SLUG_KEY, assert_clean_upstream, assert_error,
                     assert_no_secrets_in_log, chat_body, config, custom_host, provider_config, served_by, slug)
from mocks import Reply

# Gateway headers the provider never sees unless they are forwarded (README, forward_headers).
METADATA = '{"_user": "u-7", "note": "Kept AS-is; b=1, c=\\"two\\""}'
SPAN_NAME = "Summarise Step (v2)"


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
    for key, status in ((KEY, 200), ("gw-wrong-key", 401)):  # a served response and a local error
        for _ in range(2):
            r = gateway.chat(custom_host(openai_mock), key=key)
            assert r.status_code == status, r.text
            tid = r.headers.get("x-gateway-trace-id")
            assert tid and tid.strip(), f"no generated trace id on {r.status_code}"
            # A UUID version 7 (RFC 9562): its first 48 bits are the time in ms.
            generated = uuid.UUID(tid)
            assert (str(generated), generated.version, generated.variant) == (tid, 7, uuid.RFC_4122), tid
            assert abs(int(tid.replace("-", "")[:12], 16) / 1000 - time.time()) < 60, tid
            ids.append(tid)
    assert len(set(ids)) == len(ids), f"generated trace ids repeat: {ids}"
    times = [tid[:13] for tid in ids]  # the time's digits: never behind the request before
    assert times[:2] == sorted(times[:2]) and times[2:] == sorted(times[2:]), f"not in the order sent: {ids}"
    # Not Envoy's request id, which the provider receives.
    assert openai_mock.last.headers["x-request-id"] != ids[1]


def test_trace_id_on_local_errors(gateway, openai_mock):
    cases = [
        (gateway.chat(custom_host(openai_mock), key=None), 401),
        (gateway.chat({**custom_host(openai_mock), "x-gateway-metadata": "not-json"}), 400),  # header
        (gateway.chat(custom_host(openai_mock), chat_body(temperature=3)), 400),  # body
        (gateway.post("/v1/nope", {}), 404),
        (gateway.get(CHAT, headers=custom_host(openai_mock)), 405),
        (gateway.chat({**custom_host(openai_mock), "x-gateway-custom-host": "http://10.1.2.3/v1"}), 403),
    ]
    for r, status in cases:
        assert_error(r, status)  # includes the x-gateway-trace-id check
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
    assert_error(r, 400, param=header, contains=header)
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


def forwardable(selection: dict, **extra) -> dict:
    """The provider ``selection`` headers plus two gateway headers that are dropped unless
    forwarded, one more that is never asked for, and an ordinary header (forwarded by default)."""
    return {**selection, "x-gateway-metadata": METADATA, "x-gateway-span-name": SPAN_NAME,
            "x-gateway-span-id": "span-not-listed", "x-team": "Blue (kept AS-is)", **extra}


def test_gateway_headers_are_dropped_without_forward_headers(gateway, openai_mock):
    r = gateway.chat(forwardable(custom_host(openai_mock)))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers["x-team"] == "Blue (kept AS-is)"
    for name in ("x-gateway-metadata", "x-gateway-span-name", "x-gateway-span-id"):
        assert name not in rec.headers, f"{name} reached the provider without forward_headers"
    assert_clean_upstream(rec, KEY)


@pytest.mark.parametrize("value", ['["x-gateway-metadata","x-gateway-span-name"]',
                                   "x-gateway-metadata, x-gateway-span-name",
                                   "X-Gateway-Metadata,X-GATEWAY-SPAN-NAME"], ids=["json", "comma", "upper"])
def test_forward_headers_header(gateway, openai_mock, value):
    r = gateway.chat(forwardable(custom_host(openai_mock), **{"x-gateway-forward-headers": value}))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers.get("x-gateway-metadata") == METADATA
    assert rec.headers.get("x-gateway-span-name") == SPAN_NAME
    assert rec.headers["x-team"] == "Blue (kept AS-is)"
    assert_clean_upstream(rec, KEY, forwarded=["x-gateway-metadata", "x-gateway-span-name"])


def test_forward_headers_in_config(gateway, openai_mock):
    cfg = provider_config(openai_mock, forward_headers=["x-gateway-metadata"])
    r = gateway.chat(forwardable(config(cfg)))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers.get("x-gateway-metadata") == METADATA
    assert "x-gateway-span-name" not in rec.headers
    assert rec.headers["x-team"] == "Blue (kept AS-is)"
    assert rec.headers["authorization"] == "Bearer sk-config-key"
    assert_clean_upstream(rec, KEY, forwarded=["x-gateway-metadata"])


def test_forward_headers_of_config_and_header_are_combined(gateway, openai_mock):
    cfg = provider_config(openai_mock, forward_headers=["x-gateway-metadata"])
    r = gateway.chat(forwardable(config(cfg), **{"x-gateway-forward-headers": "x-gateway-span-name"}))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers.get("x-gateway-metadata") == METADATA
    assert rec.headers.get("x-gateway-span-name") == SPAN_NAME
    assert_clean_upstream(rec, KEY, forwarded=["x-gateway-metadata", "x-gateway-span-name"])


# --------------------------------------------------------------------------- aliases


def _without(headers: dict, name: str) -> dict:
    return {k: v for k, v in headers.items() if k != name}


# alias -> (headers for the openai mock, the gateway key to send in x-gateway-api-key). Each
# request succeeds only if the gateway understood the alias (a key, a provider, a stored
# credential, a custom host) or accepted its value (the others).
ALIAS_CASES = {
    "api_key": (lambda m: {**custom_host(m), "api_key": KEY2}, None),
    "apiKey": (lambda m: {**custom_host(m), "apiKey": KEY2}, None),
    "provider": (lambda m: {**_without(custom_host(m), "x-gateway-provider"), "provider": "openai"}, KEY),
    "virtual_key": (lambda m: {"virtual_key": "vk-openai"}, KEY),
    "virtualKey": (lambda m: {"virtualKey": "vk-openai"}, KEY),
    "config": (lambda m: {"config": json.dumps(provider_config(m))}, KEY),
    "custom_host": (lambda m: {**_without(custom_host(m), "x-gateway-custom-host"), "custom_host": m.base_url}, KEY),
    "customHost": (lambda m: {**_without(custom_host(m), "x-gateway-custom-host"), "customHost": m.base_url}, KEY),
    "trace_id": (lambda m: {**custom_host(m), "trace_id": "alias-trace"}, KEY),
    "traceId": (lambda m: {**custom_host(m), "traceId": "alias-trace"}, KEY),
    "metadata": (lambda m: {**custom_host(m), "metadata": '{"_user": "u1"}'}, KEY),
    "cache_force_refresh": (lambda m: {**custom_host(m), "cache_force_refresh": "true"}, KEY),
    "cacheForceRefresh": (lambda m: {**custom_host(m), "cacheForceRefresh": "false"}, KEY),
    "cache_namespace": (lambda m: {**custom_host(m), "cache_namespace": "ns"}, KEY),
    "cacheNamespace": (lambda m: {**custom_host(m), "cacheNamespace": "ns"}, KEY),
    "request_timeout": (lambda m: {**custom_host(m), "request_timeout": "30000"}, KEY),
    "requestTimeout": (lambda m: {**custom_host(m), "requestTimeout": "30000"}, KEY),
    "forward_headers": (lambda m: {**custom_host(m), "forward_headers": "x-team", "x-team": "t"}, KEY),
    "forwardHeaders": (lambda m: {**custom_host(m), "forwardHeaders": "x-team", "x-team": "t"}, KEY),
    "cloud_c_access_key_id": (lambda m: {**custom_host(m), "cloud_c_access_key_id": "AKIDALIAS"}, KEY),
    "cloudCAccessKeyId": (lambda m: {**custom_host(m), "cloudCAccessKeyId": "AKIDALIAS"}, KEY),
    "X-Cloud-B-LLM-Request-Type": (lambda m: {**custom_host(m), "X-Cloud-B-LLM-Request-Type": "shared"}, KEY),
}


@pytest.mark.parametrize("alias", sorted(ALIAS_CASES))
def test_gateway_header_alias_works_and_never_reaches_the_provider(gateway, openai_mock, alias):
    make, key = ALIAS_CASES[alias]
    # Accept-Encoding too: responses must come back uncompressed, so it never goes upstream.
    r = gateway.chat({**make(openai_mock), "Accept-Encoding": "gzip, br"}, key=key)
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    if alias in ("trace_id", "traceId"):
        assert r.headers["x-gateway-trace-id"] == "alias-trace"
    assert_clean_upstream(openai_mock.last, KEY, KEY2, "AKIDALIAS")


def test_request_timeout_alias_applies(gateway, openai_mock):
    openai_mock.script(Reply(stall=3))
    r = gateway.chat({**custom_host(openai_mock), "requesttimeout": "300"})
    assert_error(r, 408, type="timeout_error")


def test_bad_metadata_under_its_alias_names_the_header(gateway, openai_mock):
    r = gateway.chat({**custom_host(openai_mock), "metadata": "not-json"})
    assert_error(r, 400, param="x-gateway-metadata", contains="x-gateway-metadata")
    assert openai_mock.requests == []


# --------------------------------------------------------------------------- the log line


def test_log_line_has_trace_and_span_and_no_secret(gateway, openai_mock):
    run = uuid.uuid4().hex
    token, wrong_key, cfg_key = f"sk-log-{run}", f"gw-wrong-{run}", f"sk-cfg-{run}"
    openai_mock.keys.update({token, cfg_key})  # provider keys of this run: OpenAI knows them
    span = {"x-gateway-span-id": "span-log-1", "x-gateway-parent-span-id": "span-log-0",
            "x-gateway-span-name": "log check"}
    # (headers, gateway key, expected status): success and error paths, secrets of every kind
    requests = [
        ({**custom_host(openai_mock, token=token), **span, "apikey": KEY2}, None, 200),
        (custom_host(openai_mock, token=token), wrong_key, 401),
        (config(provider_config(openai_mock, api_key=cfg_key)), KEY, 200),
        (config({**provider_config(openai_mock, api_key=cfg_key), "bogus": 1}), KEY, 400),
        (slug("openai-mock"), KEY, 200),
    ]
    for i, (headers, key, status) in enumerate(requests):
        r = gateway.chat({**headers, "x-gateway-trace-id": f"log-{run}-{i}"}, key=key)
        assert r.status_code == status, r.text
    line = gateway.wait_for_log_line(f'trace_id="log-{run}-0"')
    for fragment in ('span_id="span-log-1"', 'parent_span_id="span-log-0"', 'span_name="log check"',
                     "provider=openai", "status=200"):
        assert fragment in line, f"{fragment!r} not in the log line {line!r}"
    for i, (_, _, status) in enumerate(requests):
        assert f"status={status}" in gateway.wait_for_log_line(f'trace_id="log-{run}-{i}"')
    assert openai_mock.last.headers["authorization"] == f"Bearer {OPENAI_SLUG_KEY}"
    assert_no_secrets_in_log(gateway, token, wrong_key, cfg_key)
