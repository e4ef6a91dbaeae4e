"""The control plane beside Envoy (issue 13): stored providers, prompts, guardrails, saved
configs and gateway API keys, through the gateway's own listener, used by the filter; every
test runs against SQLite (the default) and PostgreSQL (the suite's own server)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from helpers import KEY, KEY2, assert_chat_completion, assert_error, chat_body, config, slug, virtual_key
from support import eventually, new_slug, new_workspace_key, ok, put


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cp(request, start_gateway):
    """A gateway with its control plane on ``request.param``'s database."""
    env = {}
    if request.param == "postgres":
        env["GATEWAY_DATABASE_URL"] = request.getfixturevalue("postgres").database(f"cp_{uuid.uuid4().hex[:8]}")
    with start_gateway(f"cp-{request.param}", None, env) as gw:
        yield gw


def stored_provider(gw, mock, api_key: str, key: str = KEY, name: str = "openai") -> str:
    s = new_slug(name)
    ok(put(gw, f"/v1/providers/{s}", {"provider": "openai", "api_key": api_key, "custom_host": mock.base_url},
           key=key))
    return s


# --------------------------------------------------------------------------- auth


def test_every_call_needs_a_gateway_key(cp):
    assert_error(cp.get("/v1/providers/x", key=None), 401, trace=False)
    assert_error(cp.get("/v1/providers/x", key="gw-nope"), 401, trace=False)
    assert_error(cp.get("/v1/configs/nope"), 404, trace=False)


# --------------------------------------------------------------------------- providers


def test_a_stored_provider_is_used_by_slug_virtual_key_and_config(cp, openai_mock):
    secret = f"sk-stored-{uuid.uuid4().hex}"
    openai_mock.keys.add(secret)
    s = stored_provider(cp, openai_mock, secret)
    shown = ok(cp.get(f"/v1/providers/{s}"))
    assert shown["slug"] == s and shown["provider"] == "openai" and shown["custom_host"] == openai_mock.base_url
    assert secret not in str(shown) and secret[-4:] in str(shown["api_key"])
    for headers in (slug(s), virtual_key(s), config({"provider": f"@{s}"}), config({"virtual_key": s})):
        r = cp.chat(headers)
        assert r.status_code == 200, (headers, r.text)
        assert openai_mock.last.header("authorization") == f"Bearer {secret}"
    # A new version (a rotated key) reaches the gateway within the freshness window.
    rotated = f"sk-rotated-{uuid.uuid4().hex}"
    openai_mock.keys.add(rotated)
    ok(put(cp, f"/v1/providers/{s}", {"provider": "openai", "api_key": rotated, "custom_host": openai_mock.base_url}))

    def rotated_key_used():
        assert cp.chat(slug(s)).status_code == 200
        assert openai_mock.last.header("authorization") == f"Bearer {rotated}"
    eventually(rotated_key_used)
    assert_error(cp.chat(slug("no-such-provider")), 404)


def test_a_bad_provider_is_refused_naming_the_field(cp):
    assert_error(put(cp, "/v1/providers/bad", {"provider": "no-such-vendor", "api_key": "k"}), 400,
                 param="provider", trace=False)
    assert_error(put(cp, "/v1/providers/bad%2Fslug", {"provider": "openai", "api_key": "k"}), 400, trace=False)


@pytest.mark.parametrize("field", ["api_key", "vendor_organization", "vendor_project"])
def test_a_stored_value_sent_as_a_header_refuses_control_characters(cp, openai_mock, field):
    """Once stored, then Envoy's plain-text 503 on every request using it: now refused when stored."""
    provider = {"provider": "openai", "api_key": "sk-stored", "custom_host": openai_mock.base_url,
                field: "sk-bad\r\nx-injected: 1"}
    r = put(cp, f"/v1/providers/{new_slug('crlf')}", provider)
    assert_error(r, 400, param=field, code="invalid_config", contains="control characters", trace=False)
    assert "sk-bad" not in r.text
    cfg = {"strategy": {"mode": "fallback"}, "targets": [{"provider": "openai", "api_key": "sk-a\x00b"}]}
    assert_error(put(cp, f"/v1/configs/{new_slug('nul')}", cfg), 400, param="targets[0].api_key",
                 code="invalid_config", trace=False)
    webhook = {"checks": [{"id": "default.webhook", "parameters": {"webhookURL": "http://127.0.0.1:9/h",
                                                                   "headers": {"x-team": "a\nb"}}}]}
    assert_error(put(cp, f"/v1/guardrails/{new_slug('hook')}", webhook), 400, param="checks[0].parameters",
                 contains="control characters", trace=False)


def test_a_stored_guardrail_whose_check_cannot_run_is_refused_as_the_filter_refuses_it(cp):
    """Every check's parameters are read when the guardrail is stored, patterns compiled: a
    `regexMatch` rule that does not compile is a 400 naming the check's parameters."""
    name = new_slug("bad-rule")
    bad_rule = {"checks": [{"id": "default.regexMatch", "parameters": {"rule": "(unclosed"}}]}
    assert_error(put(cp, f"/v1/guardrails/{name}", bad_rule), 400, param="checks[0].parameters",
                 code="invalid_config", contains="parameter `rule` is not a valid pattern", trace=False)
    no_operator = {"checks": [{"id": "default.regexMatch", "parameters": {"rule": "ok"}},
                              {"id": "default.contains", "parameters": {"words": ["a"]}}]}
    assert_error(put(cp, f"/v1/guardrails/{name}", no_operator), 400, param="checks[1].parameters",
                 contains="operator", trace=False)
    assert_error(cp.get(f"/v1/guardrails/{name}"), 404, trace=False)


def test_a_config_nested_deeper_than_the_parser_reads_is_named_as_the_filter_names_it(cp):
    cfg = {"provider": "openai", "api_key": "sk-deep"}
    for _ in range(64):
        cfg = {"strategy": {"mode": "fallback"}, "targets": [cfg]}
    r = put(cp, f"/v1/configs/{new_slug('deep')}", cfg)
    assert_error(r, 400, param=".".join(["targets[0]"] * 9), contains="targets nest more than 8 levels deep",
                 trace=False)
    deep = b"[" * 200 + b"]" * 200
    r = cp.request("PUT", f"/v1/configs/{new_slug('deep')}", content=deep, headers={"content-type": "application/json"})
    assert_error(r, 400, param="body", contains="more than 127 levels deep", trace=False)


# --------------------------------------------------------------------------- saved configs


def test_a_saved_config_is_checked_then_used_by_slug_and_id(cp, openai_mock):
    s = stored_provider(cp, openai_mock, "sk-for-config")
    name = new_slug("cfg")
    bad = put(cp, f"/v1/configs/{name}", {"strategy": {"mode": "sideways"}, "targets": [{"provider": f"@{s}"}]})
    err = assert_error(bad, 400, trace=False)
    assert "strategy.mode" in (err["param"] or "") + err["message"]
    saved = ok(put(cp, f"/v1/configs/{name}", {"provider": f"@{s}", "override_params": {"model": "from-config"}}))
    assert saved["slug"] == name and saved["id"] and saved["version_id"]
    for ref in (name, saved["id"]):
        r = cp.chat(config(ref))
        assert r.status_code == 200, r.text
        assert openai_mock.last.json["model"] == "from-config"
    ok(put(cp, f"/v1/configs/{name}", {"provider": f"@{s}", "override_params": {"model": "second-version"}}))

    def second_version_used():
        assert cp.chat(config(name)).status_code == 200
        assert openai_mock.last.json["model"] == "second-version"
    eventually(second_version_used)
    assert_error(cp.chat(config("no-such-config")), 404)


# --------------------------------------------------------------------------- prompts


def test_prompts_version_patch_render_and_chat(cp, openai_mock):
    name = new_slug("greet")
    first = ok(put(cp, f"/v1/prompts/{name}", {"string": "Hello {{name}}, say {{word}}.", "model": "gpt-mock",
                                                "parameters": {"temperature": 0.2}}))
    assert first["slug"] == name and uuid.UUID(first["id"]) and uuid.UUID(first["prompt_version_id"])
    patched = ok(put(cp, f"/v1/prompts/{first['id']}", {"patch": True, "parameters": {"temperature": 0.7}}))
    assert patched["id"] == first["id"] and patched["prompt_version_id"] != first["prompt_version_id"]
    latest = ok(cp.get(f"/v1/prompts/{name}"))
    assert latest["string"] == "Hello {{name}}, say {{word}}." and latest["parameters"] == {"temperature": 0.7}
    older = ok(cp.get(f"/v1/prompts/{name}", params={"version": first["prompt_version_id"]}))
    assert older["parameters"] == {"temperature": 0.2}
    # Without patch every field is checked strictly.
    assert_error(put(cp, f"/v1/prompts/{name}", {"string": 5}), 400, param="string", trace=False)

    rendered = ok(cp.post(f"/v1/prompts/{name}/render",
                          {"variables": {"name": "Ada <&>", "word": "hi"}, "max_tokens": 9}))
    assert rendered["success"] is True
    data = rendered["data"]
    assert data["messages"] == [{"role": "user", "content": "Hello Ada <&>, say hi."}], "no HTML escaping"
    assert (data["model"], data["temperature"], data["max_tokens"]) == ("gpt-mock", 0.7, 9)
    assert_error(cp.post(f"/v1/prompts/{name}/render", {"variables": {"name": "x"}}), 400,
                 contains="word", trace=False)
    assert_error(cp.post(f"/v1/prompts/{name}/render", {"variables": {"name": "x", "word": "y"},
                                                         "hyperparameters": {"temperature": 1}}), 400,
                 trace=False)
    assert_error(cp.post(f"/v1/prompts/no-such-prompt/render", {"variables": {}}), 404, trace=False)

    # The rendered request is a chat request as it is.
    s = stored_provider(cp, openai_mock, "sk-for-prompt")
    r = cp.chat(slug(s), data)
    assert r.status_code == 200, r.text
    assert openai_mock.last.json["messages"] == data["messages"]

    # prompt_id in a config: the body's variables fill it, its messages follow, `variables` stays here.
    body = {"variables": {"name": "Bo", "word": "yes"}, "max_tokens": 5,
            "messages": [{"role": "user", "content": "And more."}]}
    r = cp.chat(config({"provider": f"@{s}", "prompt_id": name}), body)
    assert r.status_code == 200, r.text
    sent = openai_mock.last.json
    assert sent["messages"] == [{"role": "user", "content": "Hello Bo, say yes."},
                                {"role": "user", "content": "And more."}]
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("gpt-mock", 0.7, 5)
    assert "variables" not in sent
    # The prompt's own completions endpoint.
    r = cp.post(f"/v1/prompts/{name}/completions", {"variables": {"name": "Cy", "word": "ok"}}, headers=slug(s))
    assert r.status_code == 200, r.text
    assert_chat_completion(r.json())
    assert openai_mock.last.json["messages"] == [{"role": "user", "content": "Hello Cy, say ok."}]
    assert_error(cp.chat(config({"provider": f"@{s}", "prompt_id": "no-such-prompt"}), {"variables": {}}), 404)


def test_a_message_list_template_keeps_roles(cp):
    name = new_slug("chat")
    template = '[{"role": "system", "content": "You are {{persona}}."}, {"role": "user", "content": "{{q}}"}]'
    ok(put(cp, f"/v1/prompts/{name}", {"string": template, "model": "m"}))
    data = ok(cp.post(f"/v1/prompts/{name}/render", {"variables": {"persona": "terse", "q": "why?"}}))["data"]
    assert data["messages"] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "why?"}]


# --------------------------------------------------------------------------- guardrails


def test_stored_guardrails_are_checked_and_enforced(cp, openai_mock):
    name = new_slug("no-bananas")
    check = {"id": "default.contains", "parameters": {"words": ["banana"], "operator": "none"}}
    assert_error(put(cp, f"/v1/guardrails/{name}", {"checks": []}), 400, trace=False)
    assert_error(put(cp, f"/v1/guardrails/{name}", {"checks": [{"id": "default.nope", "parameters": {}}]}), 400,
                 param="checks[0].id", trace=False)
    hs256 = {"id": "default.jwt", "parameters": {"jwksUri": "http://127.0.0.1:1/jwks", "headerKey": "x-jwt",
                                                 "algorithms": ["HS256"]}}
    assert_error(put(cp, f"/v1/guardrails/{name}", {"checks": [hs256]}), 400, trace=False)
    saved = ok(put(cp, f"/v1/guardrails/{name}", {"name": "No bananas", "checks": [check], "actions": {"deny": True}}))
    assert saved["slug"] == name and saved["id"] and saved["version_id"]
    s = stored_provider(cp, openai_mock, "sk-for-guardrail")
    guarded = config({"provider": f"@{s}", "input_guardrails": [name]})
    before = len(openai_mock.requests)
    r = cp.chat(guarded, chat_body("I like banana bread."))
    assert_error(r, 446)
    assert r.json()["hook_results"]["before_request_hooks"][0]["verdict"] is False
    assert len(openai_mock.requests) == before, "a denied request never reaches the provider"
    r = cp.chat(guarded, chat_body("I like bread."))
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- keys and workspaces


def test_api_keys_and_workspace_isolation(cp, openai_mock):
    team = new_workspace_key(cp)
    other = team["key"]
    # Only admin keys manage keys.
    assert_error(cp.post("/v1/api-keys", {"workspace": "x"}, key=other), 403, trace=False)
    listed = ok(cp.get("/v1/api-keys"))["data"]
    assert team["id"] in [k["id"] for k in listed] and other not in str(listed)

    # The default workspace's items are invisible and unusable from another workspace.
    s = stored_provider(cp, openai_mock, "sk-default-ws")
    name = new_slug("cfg")
    ok(put(cp, f"/v1/configs/{name}", {"provider": f"@{s}"}))
    assert_error(cp.get(f"/v1/providers/{s}", key=other), 404, trace=False)
    assert_error(cp.get(f"/v1/configs/{name}", key=other), 404, trace=False)
    assert_error(cp.chat(slug(s), key=other), 404)
    assert_error(cp.chat(config(name), key=other), 404)
    # The same slug may exist in both workspaces, each with its own secret.
    ok(put(cp, f"/v1/providers/{s}", {"provider": "openai", "api_key": "sk-team-ws",
                                      "custom_host": openai_mock.base_url}, key=other))

    def own_secret_used():  # the team's earlier 404 is remembered for the freshness window
        assert cp.chat(slug(s), key=other).status_code == 200
        assert openai_mock.last.header("authorization") == "Bearer sk-team-ws"
    eventually(own_secret_used)
    assert cp.chat(slug(s), key=KEY2).status_code == 200
    assert openai_mock.last.header("authorization") == "Bearer sk-default-ws"

    # A deleted key stops working at the gateway and at the control plane.
    assert cp.request("DELETE", f"/v1/api-keys/{team['id']}").status_code in (200, 204)

    def revoked():
        assert_error(cp.chat(slug(s), key=other), 401)
    eventually(revoked)
    assert_error(cp.get(f"/v1/providers/{s}", key=other), 401, trace=False)


def test_the_response_cache_is_per_workspace(cp, openai_mock):
    team = new_workspace_key(cp)["key"]
    s = stored_provider(cp, openai_mock, "sk-cache-default")
    ok(put(cp, f"/v1/providers/{s}", {"provider": "openai", "api_key": "sk-cache-team",
                                      "custom_host": openai_mock.base_url}, key=team))
    cached = config({"provider": f"@{s}", "cache": {"mode": "simple"}})
    body = chat_body(f"cache me {uuid.uuid4().hex}")
    assert cp.chat(cached, body).headers.get("x-gateway-cache-status") == "MISS"
    assert cp.chat(cached, body).headers.get("x-gateway-cache-status") == "HIT"
    assert cp.chat(cached, body, key=team).headers.get("x-gateway-cache-status") == "MISS"


# --------------------------------------------------------------------------- down and restarted


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_down_then_restarted(db, request, start_gateway, tmp_path, openai_mock):
    env = {"GATEWAY_STATE_DIR": str(tmp_path / "state")}
    if db == "postgres":
        env["GATEWAY_DATABASE_URL"] = request.getfixturevalue("postgres").database(f"cp_{uuid.uuid4().hex[:8]}")
    with start_gateway(f"cp-down-{db}", None, env) as gw:
        s = stored_provider(gw, openai_mock, "sk-survives")
        name = new_slug("cfg")
        ok(put(gw, f"/v1/configs/{name}", {"provider": f"@{s}"}))
        prompt = ok(put(gw, f"/v1/prompts/{new_slug('p')}", {"string": "Hi {{who}}", "model": "m"}))
        team = new_workspace_key(gw)["key"]
        assert gw.chat(config(name)).status_code == 200  # read once: now cached by the filter
        assert gw.chat(slug(s), key=team).status_code == 404

        os.kill(gw.control_plane_pid(), signal.SIGKILL)
        # What was read keeps serving; what never was is a quick 503; health says so.
        r = gw.chat(config(name))
        assert r.status_code == 200, r.text
        started = time.monotonic()
        assert_error(gw.chat(config(new_slug("never-read"))), 503)
        assert time.monotonic() - started < 5, "no hang on a stopped control plane"
        assert gw.get("/health", key=None).status_code == 503
        assert_error(gw.get(f"/v1/providers/{s}"), 503, trace=False)

    # Started again on the same data: everything is still there.
    with start_gateway(f"cp-again-{db}", None, env) as gw:
        assert ok(gw.get(f"/v1/providers/{s}"))["slug"] == s
        assert ok(gw.get(f"/v1/prompts/{prompt['id']}"))["string"] == "Hi {{who}}"
        r = gw.chat(config(name))
        assert r.status_code == 200, r.text
        assert openai_mock.last.header("authorization") == "Bearer sk-survives"
        assert gw.chat(slug(s), key=team).status_code == 404, "the other workspace's key still works, sees nothing"


def test_without_a_control_plane_static_settings_work_as_before(start_gateway, openai_mock):
    with start_gateway("no-control-plane", None, {"GATEWAY_CONTROL_PLANE": "off"}) as gw:
        assert gw.get("/health", key=None).status_code == 200
        assert gw.chat(slug("openai-mock")).status_code == 200  # GATEWAY_CREDENTIALS
        assert_error(gw.chat(config("pc-abc123")), 400, code="saved_config_unavailable")
        assert_error(gw.chat(slug("no-such-provider")), 401, code="unknown_credential")
        assert_error(gw.get("/v1/providers/openai-mock"), 404, code="unknown_endpoint")
        # The gateway's own batching needs the control plane.
        batch = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "immediate"}
        assert_error(gw.post("/v1/batches", batch, headers=slug("openai-mock")), 501, code="not_implemented",
                     contains="control plane")
        assert not openai_mock.requests_to("/v1/batches")


# --------------------------------------------------------------------------- request logs


def test_request_logs_are_found_by_trace_and_metadata_and_take_feedback(cp, openai_mock):
    s = stored_provider(cp, openai_mock, "sk-logged")
    trace_id, user = f"trace-{uuid.uuid4().hex}", f"u-{uuid.uuid4().hex[:6]}"
    headers = {**slug(s), "x-gateway-trace-id": trace_id, "x-gateway-span-id": "span-1",
               "x-gateway-metadata": f'{{"_user": "{user}", "_environment": "e2e"}}'}
    assert cp.chat(headers, chat_body(model="m-logged")).status_code == 200
    # Feedback may come before the record does.
    fed = cp.post("/v1/feedback", {"trace_id": trace_id, "value": 1, "weight": 0.5, "metadata": {"by": "test"}})
    assert fed.status_code in (200, 201, 202), fed.text

    def found(**query) -> dict:
        r = cp.get("/v1/logs", params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["object"] == "list" and len(page["data"]) == 1, page
        return page["data"][0]
    record = eventually(lambda: found(trace_id=trace_id))
    assert (record["trace_id"], record["span_id"], record["provider"], record["model"], record["status"]) == \
        (trace_id, "span-1", "openai", "m-logged", 200)
    assert record["metadata"] == {"_user": user, "_environment": "e2e"} and record["workspace"] == "default"
    assert [(f["value"], f["weight"]) for f in record["feedback"]] == [(1, 0.5)]
    assert found(**{"metadata._user": user})["trace_id"] == trace_id
    assert "sk-logged" not in str(record), "no secret in a record"
    # Only the caller's workspace; a key is needed; bad filters name the parameter.
    other = new_workspace_key(cp)["key"]
    r = cp.get("/v1/logs", params={"trace_id": trace_id}, key=other)
    assert r.status_code == 200 and r.json()["data"] == []
    assert_error(cp.get("/v1/logs", key=None), 401, trace=False)
    assert_error(cp.get("/v1/logs", params={"limit": 0}), 400, param="limit", trace=False)
    assert_error(cp.post("/v1/feedback", {"trace_id": trace_id}), 400, param="value", trace=False)
