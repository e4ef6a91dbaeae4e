"""Provider selection (spec 5.2), config handling and the OpenAI SDK against the gateway."""

from __future__ import annotations

import json

import openai
import pytest

from helpers import (ANTHROPIC_SLUG_KEY, ANTHROPIC_VK_KEY, CLIENT_TOKEN, KEY, OPENAI_SLUG_KEY, OPENAI_VK_KEY,
                     SDK_DUMMY_KEY, assert_chat_completion, assert_clean_upstream, assert_error,
                     chat_body, config, custom_host, provider_config, sdk_stream, served_by, slug, virtual_key)
from mocks import OpenAIMock, Reply

# name -> (headers for the openai mock, the bearer token the mock must receive)
OPENAI_SELECTIONS = {
    "custom_host": (lambda m: custom_host(m), CLIENT_TOKEN),
    "slug": (lambda m: slug("openai-mock"), OPENAI_SLUG_KEY),
    "virtual_key": (lambda m: virtual_key("vk-openai"), OPENAI_VK_KEY),
    "config": (lambda m: config(provider_config(m)), "sk-config-key"),
    "config_virtual_key": (lambda m: config({"virtual_key": "vk-openai"}), OPENAI_VK_KEY),
    "config_slug": (lambda m: config({"provider": "@openai-mock"}), OPENAI_SLUG_KEY),
}


@pytest.fixture(params=sorted(OPENAI_SELECTIONS))
def selection(request, openai_mock):
    make, token = OPENAI_SELECTIONS[request.param]
    return request.param, make(openai_mock), token


def test_openai_selection_http(gateway, openai_mock, selection):
    name, headers, token = selection
    body = chat_body("Which provider?", model="gpt-mock-1", temperature=0.2, max_tokens=50)
    r = gateway.chat(headers, body)
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    assert_chat_completion(r.json(), content=OpenAIMock.default_text, finish_reason="stop", model="gpt-mock-1")
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/chat/completions")
    assert rec.headers["authorization"] == f"Bearer {token}"
    assert rec.json == body
    assert_clean_upstream(rec, KEY)


def _sdk_for(gateway, openai_mock, name, headers):
    """The SDK as a user would set it up: in custom-host mode the SDK's api_key is the
    provider token; otherwise it is a dummy the gateway must not pass on."""
    if name == "custom_host":
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        return gateway.sdk(headers, api_key=CLIENT_TOKEN)
    return gateway.sdk(headers, api_key=SDK_DUMMY_KEY)


def test_openai_selection_sdk_non_stream(gateway, openai_mock, selection):
    name, headers, token = selection
    client = _sdk_for(gateway, openai_mock, name, headers)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-mock-1", messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}])
    served_by(raw, "openai")
    out = raw.parse()
    assert out.object == "chat.completion"
    assert out.choices[0].message.content == OpenAIMock.default_text
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    rec = openai_mock.last
    assert rec.headers["authorization"] == f"Bearer {token}"
    assert rec.json["messages"][0] == {"role": "system", "content": "Be brief."}
    assert_clean_upstream(rec, KEY, *([] if name == "custom_host" else [SDK_DUMMY_KEY]))


def test_openai_selection_sdk_stream(gateway, openai_mock, selection):
    name, headers, token = selection
    openai_mock.script(Reply(text="Streaming through the gateway works."))
    client = _sdk_for(gateway, openai_mock, name, headers)
    stream = client.chat.completions.create(model="gpt-mock-1", messages=[{"role": "user", "content": "Hi"}],
                                            stream=True)
    res = sdk_stream(stream)
    assert res.content == "Streaming through the gateway works."
    assert res.finish_reason == "stop"
    assert len(res.chunks) > 3
    assert all(c["object"] == "chat.completion.chunk" for c in res.chunks)
    rec = openai_mock.last
    assert rec.json["stream"] is True
    assert rec.headers["authorization"] == f"Bearer {token}"


@pytest.mark.parametrize("headers, token", [
    (lambda m: slug("anthropic-mock"), ANTHROPIC_SLUG_KEY),
    (lambda m: virtual_key("vk-anthropic"), ANTHROPIC_VK_KEY),
    (lambda m: custom_host(m, provider="anthropic", token="sk-ant-client"), "sk-ant-client"),
    (lambda m: config(provider_config(m, provider="anthropic", api_key="sk-ant-config")), "sk-ant-config"),
], ids=["slug", "virtual_key", "custom_host", "config"])
def test_anthropic_selection_auth(gateway, anthropic_mock, headers, token):
    r = gateway.chat(headers(anthropic_mock), chat_body(model="claude-test-1"))
    assert r.status_code == 200, r.text
    served_by(r, "anthropic")
    assert_chat_completion(r.json(), content=anthropic_mock.default_text)
    rec = anthropic_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/messages")
    assert rec.headers["x-api-key"] == token
    assert rec.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in rec.headers
    assert_clean_upstream(rec, KEY)


def test_unknown_saved_config_id_is_404(gateway, openai_mock):
    r = gateway.chat(config("pc-abc123"))
    assert_error(r, 404, code="config_not_found", contains="pc-abc123")
    assert openai_mock.requests == []


@pytest.mark.parametrize("where", ["header", "config"])
def test_non_loopback_custom_host_is_403(gateway, openai_mock, where):
    if where == "header":
        headers = {**custom_host(openai_mock), "x-gateway-custom-host": "http://10.1.2.3/v1"}
    else:
        headers = config({"provider": "openai", "api_key": "sk-x", "custom_host": "http://10.1.2.3/v1"})
    r = gateway.chat(headers)
    assert_error(r, 403, type="permission_error")
    assert openai_mock.requests == []


def test_localhost_custom_host_is_allowed(gateway, openai_mock):
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-custom-host": f"http://localhost:{openai_mock.port}/v1"})
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    assert len(openai_mock.requests) == 1
    assert openai_mock.last.path == "/v1/chat/completions"


@pytest.mark.parametrize("where", ["header", "config"])
def test_names_under_localhost_are_not_loopback(gateway, openai_mock, where):
    host = f"http://foo.localhost:{openai_mock.port}/v1"
    if where == "header":
        headers = {**custom_host(openai_mock), "x-gateway-custom-host": host}
    else:
        headers = config(provider_config(openai_mock, custom_host=host))
    r = gateway.chat(headers)
    assert_error(r, 403, type="permission_error")
    assert openai_mock.requests == []


@pytest.mark.parametrize("headers", [slug("does-not-exist"), virtual_key("vk-does-not-exist"),
                                     config({"provider": "@does-not-exist"}), config({"virtual_key": "vk-nope"})],
                         ids=["slug", "virtual_key", "config_slug", "config_virtual_key"])
def test_unknown_managed_provider_is_404(gateway, openai_mock, anthropic_mock, headers):
    # Neither the plugin's credentials nor the control plane know it.
    r = gateway.chat(headers)
    assert_error(r, 404, code="provider_not_found")
    assert openai_mock.requests == [] and anthropic_mock.requests == []


def test_no_provider_is_400_missing_provider(gateway, openai_mock):
    r = gateway.chat({"Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert_error(r, 400, code="missing_provider", contains="x-gateway-provider")
    assert openai_mock.requests == []


def test_unknown_provider_name_is_400(gateway, openai_mock):
    r = gateway.chat({**custom_host(openai_mock), "x-gateway-provider": "no-such-provider"})
    assert_error(r, 400, code="unknown_provider", contains="no-such-provider")
    assert openai_mock.requests == []


@pytest.mark.parametrize("provider", ["openai-compatible", "ollama", "vllm"])
def test_provider_without_public_endpoint_needs_a_custom_host(gateway, openai_mock, provider):
    r = gateway.chat({"x-gateway-provider": provider, "Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert_error(r, 400, param="custom_host")
    assert openai_mock.requests == []


def test_built_in_provider_without_a_key_is_401(gateway):
    # No Bearer token, no config api_key, no custom host: nothing to authenticate with.
    r = gateway.chat({"x-gateway-provider": "openai"})
    assert_error(r, 401, type="authentication_error")


def test_config_with_options_only_takes_the_provider_from_headers(gateway, openai_mock):
    cfg = {"request_timeout": 30000, "override_params": {"model": "forced"}}
    r = gateway.chat({**custom_host(openai_mock), **config(cfg)}, chat_body(model="client-model"))
    assert r.status_code == 200, r.text
    served_by(r, "openai")
    rec = openai_mock.last
    assert rec.json["model"] == "forced"
    assert rec.headers["authorization"] == f"Bearer {CLIENT_TOKEN}"
    assert_clean_upstream(rec, KEY)


def test_config_api_key_beats_the_bearer_token(gateway, openai_mock):
    r = gateway.chat({**config(provider_config(openai_mock)), "Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers["authorization"] == "Bearer sk-config-key"
    assert_clean_upstream(rec, KEY, CLIENT_TOKEN)


def test_loadbalance_never_picks_a_weight_0_target(gateway, openai_mock, anthropic_mock):
    cfg = {"strategy": {"mode": "loadbalance"}, "targets": [
        {**provider_config(anthropic_mock, provider="anthropic", api_key="sk-ant-weight-0"), "weight": 0},
        {**provider_config(openai_mock, api_key="sk-weight-1"), "weight": 1},
    ]}
    for i in range(10):
        r = gateway.chat(config(cfg), chat_body(f"lb {i}"))
        assert r.status_code == 200, r.text
        served_by(r, "openai")
    assert anthropic_mock.requests == []
    assert [rec.json["messages"][0]["content"] for rec in openai_mock.requests] == [f"lb {i}" for i in range(10)]
    assert {rec.headers["authorization"] for rec in openai_mock.requests} == {"Bearer sk-weight-1"}


@pytest.mark.parametrize("make, code", [
    (lambda m: provider_config(m, prompt_id="pp-welcome"), "prompt_not_found"),
    (lambda m: provider_config(m, input_guardrails=["pg-pii-1"]), "guardrail_not_found"),
], ids=["prompt_id", "input_guardrails"])
def test_unknown_stored_prompt_or_guardrail_is_404(gateway, openai_mock, make, code):
    r = gateway.chat(config(make(openai_mock)))
    assert_error(r, 404, code=code)
    assert openai_mock.requests == []


def test_override_params(gateway, openai_mock):
    cfg = provider_config(openai_mock, override_params={"model": "forced-model", "temperature": 0.1})
    r = gateway.chat(config(cfg), chat_body(model="client-model", temperature=0.9, max_tokens=33))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.json["model"] == "forced-model"
    assert rec.json["temperature"] == 0.1
    assert rec.json["max_tokens"] == 33  # untouched
    assert r.json()["model"] == "forced-model"


def test_vendor_organization_and_project_headers(gateway, openai_mock):
    cfg = provider_config(openai_mock, vendor_organization="org-e2e", vendor_project="proj-e2e")
    r = gateway.chat(config(cfg))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert rec.headers["openai-organization"] == "org-e2e"
    assert rec.headers["openai-project"] == "proj-e2e"
    assert rec.headers["authorization"] == "Bearer sk-config-key"


_T = {"provider": "openai", "api_key": "k"}


@pytest.mark.parametrize("cfg, fragments", [
    ({"strategy": {"mode": "fallback"},
      "targets": [_T, {**_T, "cb_config": {"failure_threshold": 1, "cooldown_interval": 5}}]},
     ["targets[1].cb_config.cooldown_interval"]),
    ({**_T, "cb_config": {"failure_threshold": 0, "cooldown_interval": 30000}}, ["cb_config.failure_threshold"]),
    ({**_T, "bogus_field": 1}, ["bogus_field"]),
    ({"strategy": {"mode": "fallback"}, "targets": [{**_T, "bogus": True}]}, ["targets[0]", "bogus"]),
    ({"strategy": {"mode": "roundrobin"}, "targets": [_T]}, ["strategy.mode"]),
    ({**_T, "cache": {"mode": "exact"}}, ["cache.mode"]),
    ({**_T, "retry": {"attempts": "three"}}, ["retry.attempts"]),
    ({"name": "only-a-name"}, []),
    ([_T], []),
], ids=["cb-cooldown-nested", "cb-threshold", "unknown-prop", "unknown-nested", "strategy-mode", "cache-mode",
        "retry-attempts", "no-required-set", "not-an-object"])
def test_invalid_config_is_400_invalid_config(gateway, openai_mock, cfg, fragments):
    r = gateway.chat(config(cfg))
    assert_error(r, 400, code="invalid_config", contains=fragments)
    assert openai_mock.requests == []


def test_openai_provider_error_passes_through(gateway, openai_mock):
    openai_mock.script(OpenAIMock.error(429, "Rate limit reached for gpt-mock", type="requests",
                                        code="rate_limit_exceeded"))
    r = gateway.chat(custom_host(openai_mock))
    err = assert_error(r, 429, contains="Rate limit reached for gpt-mock")
    assert err["code"] == "rate_limit_exceeded"
    served_by(r, "openai")

    openai_mock.script(OpenAIMock.error(400, "Invalid value for 'model'", param="model"))
    with pytest.raises(openai.BadRequestError) as ei:
        gateway.sdk(slug("openai-mock")).chat.completions.create(
            model="gpt-mock", messages=[{"role": "user", "content": "x"}])
    assert "Invalid value for 'model'" in ei.value.message
    assert ei.value.response.json()["error"]["param"] == "model"

    openai_mock.script(OpenAIMock.error(429, "Slow down"))
    with pytest.raises(openai.RateLimitError):
        gateway.sdk(virtual_key("vk-openai")).chat.completions.create(
            model="gpt-mock", messages=[{"role": "user", "content": "x"}])
    assert len(openai_mock.requests) == 3


def test_config_header_accepts_whitespace_and_unicode(gateway, openai_mock):
    cfg = provider_config(openai_mock, name="münchen ✓")
    r = gateway.chat({"x-gateway-config": json.dumps(cfg, indent=1).replace("\n", " ")})
    assert r.status_code == 200, r.text
    assert openai_mock.last.headers["authorization"] == "Bearer sk-config-key"
