"""What a hostile or broken peer must never get past the gateway: requests that resume
without the gateway's checks, secrets forwarded on request, successes the gateway cannot
read, and header bytes mangled on the way."""

from __future__ import annotations

import json
import socket

import h2.config
import h2.connection
import h2.events
import pytest

from helpers import (CHAT, CLIENT_TOKEN, KEY, KEY2, OPENAI_VK_KEY, assert_clean_upstream, assert_error, chat_body,
                     config, custom_host, error_of, provider_config, served_by)
from mocks import Reply


def h2c_chat_with_trailers(port: int, headers: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
    """A chat request over cleartext HTTP/2 whose body ends with trailers, not END_STREAM."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [(":method", "POST"), (":path", CHAT), (":scheme", "http"),
                                   (":authority", f"127.0.0.1:{port}"), *headers])
        conn.send_data(stream, body)
        conn.send_headers(stream, [("x-checksum", "abc")], end_stream=True)
        sock.sendall(conn.data_to_send())
        status, data = 0, b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded):
                    return status, data
            sock.sendall(conn.data_to_send())
        return status, data


def test_request_trailers_never_bypass_the_gateway(gateway, openai_mock):
    # A client that names the upstream itself and hides the body's end behind trailers.
    headers = [("x-gateway-api-key", KEY), ("x-gateway-provider", "openai"), ("authorization", "Bearer sk"),
               ("x-gateway-custom-host", openai_mock.base_url), ("content-type", "application/json"),
               ("x-gateway-upstream-cluster", "gateway_upstream_plain")]
    # A valid chat body: only the trailers make it a request the gateway must refuse.
    status, body = h2c_chat_with_trailers(gateway.port, headers, json.dumps(chat_body()).encode())
    assert status == 400, body
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error", err
    assert "trailers" in err["message"].lower(), err
    assert openai_mock.requests == []


SECRET_HEADERS = {  # gateway secrets a client may name in forward_headers: never forwarded
    "x-gateway-api-key": KEY, "apikey": KEY2, "api_key": KEY2,
    "x-gateway-cloud-c-secret-access-key": "cloud-c-secret-value", "x-gateway-cloud-c-session-token": "cloud-c-token",
}


@pytest.mark.parametrize("selection", ["custom_host", "config", "virtual_key"])
def test_gateway_secrets_are_not_forwarded_even_when_asked(gateway, openai_mock, selection):
    headers, token = {
        "custom_host": (custom_host(openai_mock), CLIENT_TOKEN),
        "config": (config(provider_config(openai_mock)), "sk-config-key"),
        "virtual_key": ({"x-gateway-virtual-key": "vk-openai"}, OPENAI_VK_KEY),
    }[selection]
    asked = [*SECRET_HEADERS, "x-gateway-config", "config", "x-gateway-virtual-key", "virtual_key",
             "x-gateway-metadata", "x-team"]
    headers = {**headers, **{k: v for k, v in SECRET_HEADERS.items() if k != "x-gateway-api-key"},
               "x-gateway-forward-headers": ", ".join(asked), "x-gateway-metadata": '{"_user": "u1"}',
               "x-team": "blue"}
    r = gateway.chat(headers, chat_body())
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    # forwarding is honoured for what is not a secret, including a gateway header ...
    assert rec.headers.get("x-team") == "blue"
    assert rec.headers.get("x-gateway-metadata") == '{"_user": "u1"}'
    # ... and refused for the secrets, under any name
    assert_clean_upstream(rec, *SECRET_HEADERS.values(), forwarded=["x-gateway-metadata"])
    assert "vk-openai" not in rec.headers.values()
    assert rec.headers["authorization"] == f"Bearer {token}"


def test_unreadable_success_is_a_502_not_a_200(gateway, anthropic_mock):
    anthropic_mock.script(Reply(status=200, body="<html>maintenance</html>", headers={"content-type": "text/html"}))
    r = gateway.chat(custom_host(anthropic_mock, provider="anthropic"), chat_body(model="claude-mock"))
    assert_error(r, 502, type="api_error")
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.headers["x-gateway-provider"] == "anthropic"


def test_provider_error_without_body_is_still_a_json_error(gateway, openai_mock):
    openai_mock.script(Reply(status=401, body=b""))
    r = gateway.chat(custom_host(openai_mock), chat_body())
    assert r.status_code == 401
    err = error_of(r)
    assert err["type"] == "authentication_error"
    assert err["message"]


def test_without_a_key_nothing_else_is_judged(gateway, openai_mock):
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-metadata": "[1]"}, chat_body(), key=None)
    assert_error(r, 401)
    assert openai_mock.requests == []


def test_other_header_bytes_reach_the_provider_unchanged(gateway, openai_mock):
    r = gateway.raw("POST", CHAT, [*custom_host(openai_mock).items(), (b"x-latin1", b"caf\xe9")],
                    json.dumps(chat_body()).encode())
    assert r.status_code == 200, r.content[:300]
    # http.server decodes header bytes as Latin-1: the one byte \xe9 arrives as "é", not as U+FFFD.
    assert openai_mock.last.headers["x-latin1"] == "caf\xe9"


def test_anthropic_version_goes_even_without_a_key(gateway, anthropic_mock):
    # A custom host may need no key; Anthropic's version header is still required there.
    headers = {"x-gateway-provider": "anthropic", "x-gateway-custom-host": anthropic_mock.base_url}
    r = gateway.chat(headers, chat_body(model="claude-mock"))
    assert len(anthropic_mock.requests) == 1
    assert anthropic_mock.last.headers.get("anthropic-version") == "2023-06-01"
    assert "x-api-key" not in anthropic_mock.last.headers
    # The client sees the provider's 401 in OpenAI's error shape, from Anthropic.
    assert_error(r, 401, type="authentication_error", contains="x-api-key header is required")
    assert r.json().keys() == {"error"}, r.json()
    served_by(r, "anthropic")


def test_vendor_beta_with_a_query_reaches_a_custom_host_as_openai_beta(gateway, openai_mock):
    r = gateway.request("GET", "/v1/assistants?limit=2", headers={**custom_host(openai_mock), "vendor-beta": "assistants=v2"})
    assert r.status_code == 200, r.text
    assert openai_mock.last.headers.get("openai-beta") == "assistants=v2"


def test_config_custom_host_that_climbs_out_of_its_path_is_rejected(gateway, openai_mock):
    r = gateway.chat(config(provider_config(openai_mock, custom_host=openai_mock.base_url + "/../admin")), chat_body())
    assert_error(r, 400, code="invalid_config")
    assert openai_mock.requests == []
