"""Guardrails and hooks (spec 2.6, 2.7, 4.3): input checks deny with 446 before the provider is called,
failing checks flag the answer with 246, output checks see the answer (JSON and streams), webhooks and
JWKS fetches are dispatched calls, async hooks never delay the answer, and `default.jwt` verifies tokens
against a JWKS served by the test (keys made at test time)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import CHAT, assert_error, chat_body, config
from mocks import OpenAIMock, Reply
# hooks: a fixture; join_a_held_jwks_fetch: test_native.py imports it from here
from support import Hooks, guarded, hooks, join_a_held_jwks_fetch, jwk, jwt_headers, new_key, token  # noqa: F401


@pytest.fixture(autouse=True)
def _reset_hooks(hooks):
    hooks.reset()
    yield
    for hold in (hooks.hold, hooks.hold_jwks):
        if hold is not None:
            hold.set()


def blocks(word: str, deny: bool) -> dict:
    return {"default.contains": {"words": [word], "operator": "none"}, "deny": deny}


def webhook(hooks: Hooks, path: str, *, deny: bool = False, is_async: bool = False, timeout: int = 3000) -> dict:
    hook = {"id": f"wh{path.replace('/', '-')}", "type": "guardrail",
            "checks": [{"id": "default.webhook", "parameters": {"webhookURL": hooks.url + path, "timeout": timeout}}]}
    if deny:
        hook["on_fail"] = {"deny": True}
    if is_async:
        hook["async"] = True
    return hook


def assert_denied(r, stage: str = "before_request_hooks") -> dict:
    assert r.status_code == 446, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["error"]["type"] == "hooks_failed"
    assert any(not item["verdict"] for item in body["hook_results"][stage]), body
    return body


# --------------------------------------------------------------------------- input checks


def test_a_denying_input_guardrail_answers_446_and_the_provider_is_never_called(gateway, openai_mock):
    r = gateway.chat(guarded(openai_mock, input_guardrails=[blocks("forbidden", True)]),
                     chat_body("say the forbidden word"))
    body = assert_denied(r)
    item = body["hook_results"]["before_request_hooks"][0]
    assert item["deny"] is True and item["checks"][0]["id"] == "default.contains"
    assert openai_mock.requests == []
    line = gateway.wait_for_log_line('hooks="in:input_guardrails[0]=false"')
    assert "status=446" in line


def test_a_check_parameter_that_cannot_run_is_a_400_naming_it_and_the_provider_is_never_called(gateway,
                                                                                           openai_mock):
    """Read with the config: a `regexMatch` rule that does not compile refuses the config, named by
    its JSON path, instead of failing as a check on every request."""
    bad_rule = {"default.regexMatch": {"rule": "(unclosed"}, "deny": True}
    r = gateway.chat(guarded(openai_mock, input_guardrails=[bad_rule]), chat_body("hi"))
    assert_error(r, 400, type="invalid_request_error", param="input_guardrails[0].default.regexMatch",
                 code="invalid_config", contains="parameter `rule` is not a valid pattern")
    hook = {"id": "count", "checks": [{"id": "default.wordCount", "parameters": {"maxWords": "ten"}}]}
    r = gateway.chat(guarded(openai_mock, before_request_hooks=[hook]), chat_body("hi"))
    assert_error(r, 400, param="before_request_hooks[0].checks[0].parameters", code="invalid_config",
                 contains="maxWords")
    assert openai_mock.requests == []


def test_a_failing_check_without_deny_answers_246_with_hook_results(gateway, openai_mock):
    headers = guarded(openai_mock, input_guardrails=[blocks("forbidden", False)])
    client = gateway.sdk(headers)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-mock", messages=[{"role": "user", "content": "say the forbidden word"}])
    assert raw.status_code == 246
    assert raw.parse().choices[0].message.content == OpenAIMock.default_text
    results = json.loads(raw.http_response.text)["hook_results"]
    assert results["before_request_hooks"][0]["verdict"] is False
    assert results["after_request_hooks"] == []
    assert len(openai_mock.requests) == 1


def test_passing_checks_answer_200_with_hook_results(gateway, openai_mock):
    r = gateway.chat(guarded(openai_mock, input_guardrails=[blocks("forbidden", True)]), chat_body("hello"))
    assert r.status_code == 200, r.text
    assert r.json()["hook_results"]["before_request_hooks"][0]["verdict"] is True
    assert int(r.headers["content-length"]) == len(r.content)


class Pieces:
    """An OpenAI-compatible upstream that writes its JSON answer one to three bytes at a time
    (each write flushed on its own), framed by content-length or chunked."""

    answer = {"id": "chatcmpl-pieces", "object": "chat.completion", "created": 1, "model": "gpt-mock",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "In pieces."},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}

    def __init__(self):
        self.chunked = False
        pieces = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                data = b" " + json.dumps(pieces.answer).encode()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                if pieces.chunked:
                    self.send_header("transfer-encoding", "chunked")
                else:
                    self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.flush()
                at = 0
                while at < len(data):
                    piece = data[at:at + 1 + at % 3]
                    at += len(piece)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if pieces.chunked else piece)
                    self.wfile.flush()
                if pieces.chunked:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def pieces():
    server = Pieces()
    yield server
    server.server.shutdown()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_hook_results_reach_an_answer_written_in_tiny_pieces(gateway, pieces, chunked):
    pieces.chunked = chunked
    cfg = {"provider": "openai", "api_key": "sk-config-key", "custom_host": pieces.url,
           "input_guardrails": [blocks("forbidden", False)]}
    r = gateway.chat(config(cfg), chat_body("the forbidden word"))
    assert r.status_code == 246, r.text
    body = r.json()
    assert body["hook_results"]["before_request_hooks"][0]["verdict"] is False
    assert {key: value for key, value in body.items() if key != "hook_results"} == Pieces.answer
    if chunked:
        assert "content-length" not in r.headers
    else:
        assert int(r.headers["content-length"]) == len(r.content)


# --------------------------------------------------------------------------- output checks


def test_a_denying_output_guardrail_replaces_a_json_answer(gateway, openai_mock):
    r = gateway.chat(guarded(openai_mock, output_guardrails=[blocks("mock", True)]))
    body = assert_denied(r, "after_request_hooks")
    assert "choices" not in body
    assert len(openai_mock.requests) == 1


def test_an_output_json_schema_check_flags_an_answer_that_is_not_json(gateway, openai_mock):
    schema = {"default.jsonSchema": {"schema": {"type": "object", "required": ["answer"]}}}
    r = gateway.chat(guarded(openai_mock, output_guardrails=[schema]))
    assert r.status_code == 246, r.text
    assert r.json()["hook_results"]["after_request_hooks"][0]["verdict"] is False
    openai_mock.script(Reply(text='{"answer": 42}'))
    r = gateway.chat(guarded(openai_mock, output_guardrails=[schema]))
    assert r.status_code == 200, r.text


def test_a_denying_output_guardrail_holds_a_stream_and_answers_446_json(gateway, openai_mock):
    headers = guarded(openai_mock, output_guardrails=[blocks("mock", True)])
    with gateway.stream("POST", CHAT, headers=headers, json=chat_body(stream=True)) as resp:
        body = resp.read()
    assert resp.status_code == 446
    assert resp.headers["content-type"] == "application/json"
    assert b"data:" not in body
    assert json.loads(body)["error"]["type"] == "hooks_failed"


def test_a_held_stream_over_4_mib_is_checked_whole(gateway, openai_mock):
    """A stream held for a denying check is read whole, however long (the flowing assembler's
    4 MiB bound once handed the checks nothing, and the stream passed)."""
    headers = guarded(openai_mock, output_guardrails=[blocks("forbidden", True)])
    openai_mock.script(Reply(chunks=["forbidden "] + ["x" * 65536] * 72))  # ~4.7 MB of text
    with gateway.stream("POST", CHAT, headers=headers, json=chat_body(stream=True), timeout=60) as resp:
        body = resp.read()
    assert resp.status_code == 446 and b"data:" not in body, body[:200]
    assert json.loads(body)["error"]["type"] == "hooks_failed"


def test_a_stream_that_passes_a_denying_guardrail_is_released_unchanged(gateway, openai_mock):
    headers = guarded(openai_mock, output_guardrails=[blocks("forbidden", True)])
    client = gateway.sdk(headers)
    stream = client.chat.completions.create(model="gpt-mock", messages=[{"role": "user", "content": "hi"}],
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == OpenAIMock.default_text


def test_without_deny_a_stream_flows_and_the_verdict_goes_to_the_log(gateway, openai_mock):
    headers = {**guarded(openai_mock, output_guardrails=[blocks("mock", False)]), "x-gateway-trace-id": "gr-flow"}
    with gateway.stream("POST", CHAT, headers=headers, json=chat_body(stream=True)) as resp:
        body = resp.read()
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert body.rstrip().endswith(b"data: [DONE]")
    line = gateway.wait_for_log_line('trace_id="gr-flow"')
    assert 'hooks="out:output_guardrails[0]=false"' in line


def test_a_flagged_stream_flows_with_status_246(gateway, openai_mock):
    headers = guarded(openai_mock, input_guardrails=[blocks("forbidden", False)])
    client = gateway.sdk(headers)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-mock", messages=[{"role": "user", "content": "the forbidden word"}], stream=True)
    assert raw.status_code == 246
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == OpenAIMock.default_text


def test_a_stream_with_include_usage_gets_the_verdicts_in_a_last_event_before_done(gateway, openai_mock):
    headers = guarded(openai_mock, input_guardrails=[blocks("forbidden", False)],
                      output_guardrails=[blocks("mock", False)])
    client = gateway.sdk(headers)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-mock", messages=[{"role": "user", "content": "the forbidden word"}], stream=True,
        stream_options={"include_usage": True})
    assert raw.status_code == 246
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == OpenAIMock.default_text
    last = chunks[-1].model_dump()
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert last["id"] == chunks[0].id
    results = last["hook_results"]
    assert [item["verdict"] for item in results["before_request_hooks"]] == [False]
    assert [item["verdict"] for item in results["after_request_hooks"]] == [False]
    # The usage chunk came before it, untouched.
    assert chunks[-2].usage is not None and "hook_results" not in chunks[-2].model_dump()


def test_the_verdicts_event_is_the_last_before_done_in_raw_sse_and_only_with_include_usage(gateway, openai_mock):
    headers = guarded(openai_mock, input_guardrails=[blocks("forbidden", True)])
    for include_usage in (True, False):
        body = chat_body("hello", stream=True, stream_options={"include_usage": include_usage})
        with gateway.stream("POST", CHAT, headers=headers, json=body) as resp:
            raw = resp.read()
        assert resp.status_code == 200
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        with_results = [p for p in payloads if "hook_results" in p]
        if include_usage:
            assert with_results == [payloads[-1]]
            assert payloads[-1]["hook_results"]["before_request_hooks"][0]["verdict"] is True
            assert payloads[-1]["hook_results"]["after_request_hooks"] == []
        else:
            assert with_results == []


# --------------------------------------------------------------------------- webhooks


def test_a_webhook_verdict_decides(gateway, openai_mock, hooks):
    headers = guarded(openai_mock, before_request_hooks=[webhook(hooks, "/check", deny=True)])
    r = gateway.chat(headers, chat_body("hi there"))
    assert r.status_code == 200, r.text
    (_, _, sent), = hooks.of("/check")
    assert sent["request"]["messages"][0]["content"] == "hi there"
    hooks.verdict = False
    assert_denied(gateway.chat(headers))
    assert len(openai_mock.requests) == 1


def test_a_failing_webhook_fails_its_check(gateway, openai_mock, hooks):
    hooks.status = 500
    body = assert_denied(gateway.chat(guarded(openai_mock, before_request_hooks=[webhook(hooks, "/f", deny=True)])))
    assert "500" in body["hook_results"]["before_request_hooks"][0]["checks"][0]["error"]["message"]
    assert openai_mock.requests == []


def test_a_webhook_that_times_out_fails_its_check_without_a_hang(gateway, openai_mock, hooks):
    hooks.hold = threading.Event()
    headers = guarded(openai_mock, before_request_hooks=[webhook(hooks, "/slow", deny=True, timeout=300)])
    started = time.monotonic()
    body = assert_denied(gateway.chat(headers))
    assert time.monotonic() - started < 5
    # Envoy's router gives up first (504) or the call's own timeout ends it (no answer).
    message = body["hook_results"]["before_request_hooks"][0]["checks"][0]["error"]["message"]
    assert "504" in message or "timed out" in message, message


def test_an_output_webhook_sees_the_answer(gateway, openai_mock, hooks):
    hooks.verdict = False
    r = gateway.chat(guarded(openai_mock, after_request_hooks=[webhook(hooks, "/out")]))
    assert r.status_code == 246, r.text
    assert r.json()["choices"][0]["message"]["content"] == OpenAIMock.default_text
    (_, _, sent), = hooks.of("/out")
    assert sent["response"]["choices"][0]["message"]["content"] == OpenAIMock.default_text


def test_an_async_webhook_does_not_delay_the_answer(gateway, openai_mock, hooks):
    hooks.hold = threading.Event()
    started = time.monotonic()
    r = gateway.chat(guarded(openai_mock, after_request_hooks=[webhook(hooks, "/async", is_async=True)]))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == OpenAIMock.default_text
    assert hooks.received.wait(5), "the async webhook was called"
    assert time.monotonic() - started < 5
    assert not hooks.hold.is_set(), "the answer came while the webhook still stalled"
    hooks.hold.set()


# --------------------------------------------------------------------------- default.jwt


def test_jwt_valid_expired_and_wrong_key(gateway, openai_mock, hooks):
    key = new_key()
    hooks.jwks = {"keys": [jwk(key, "k1")]}
    r = gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-a.json", token(key, "k1")))
    assert r.status_code == 200, r.text
    now = int(time.time())
    # Expired beyond the tolerance; inside the tolerance it still passes.
    assert_denied(gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-a.json", token(key, "k1", exp=now - 60))))
    r = gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-a.json", token(key, "k1", exp=now - 1),
                                 clockTolerance=30))
    assert r.status_code == 200, r.text
    # Signed by another key with the same kid.
    assert_denied(gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-a.json", token(new_key(), "k1"))))
    # A token older than maxTokenAge.
    old = token(key, "k1", iat=now - 7200)
    assert_denied(gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-a.json", old, maxTokenAge="1h")))
    # No token at all.
    headers = jwt_headers(openai_mock, hooks, "/jwks-a.json", "x")
    del headers["x-user-token"]
    assert_denied(gateway.chat(headers))
    assert len(hooks.of("/jwks-a.json")) == 1, "one fetch served every request"


def test_a_jwks_is_fetched_once_for_many_requests(gateway, openai_mock, hooks):
    key = new_key()
    hooks.jwks = {"keys": [jwk(key, "many")]}
    for _ in range(5):
        r = gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-many.json", token(key, "many")))
        assert r.status_code == 200, r.text
    assert len(hooks.of("/jwks-many.json")) == 1


@pytest.mark.slow
def test_a_rotated_jwks_is_refetched_for_an_unknown_kid(gateway, openai_mock, hooks):
    old, new = new_key(), new_key()
    hooks.jwks = {"keys": [jwk(old, "old")]}
    started = time.monotonic()
    assert gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-rot.json", token(old, "old"))).status_code == 200
    fetched = time.monotonic()  # the JWKS was fetched between `started` and now
    hooks.jwks = {"keys": [jwk(new, "new")]}
    # Within 30 s of the fetch an unknown kid does not refetch (a flood of bad tokens cannot).
    assert_denied(gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-rot.json", token(new, "new"))))
    assert len(hooks.of("/jwks-rot.json")) == 1
    # From 30 s on it does: the gateway's clock decides, so ask until it passes, with both bounds.
    while True:
        asked = time.monotonic()
        r = gateway.chat(jwt_headers(openai_mock, hooks, "/jwks-rot.json", token(new, "new")))
        if r.status_code == 200:
            break
        assert_denied(r)
        assert len(hooks.of("/jwks-rot.json")) == 1, "refetched, yet the new key was refused"
        # The gateway counts whole seconds: it refetches in the 31st or 32nd second after.
        assert asked < fetched + 30 + 2, "the unknown kid was still refused after 32 s"
        time.sleep(0.5)  # the pace of asking, not a synchronisation
    assert time.monotonic() >= started + 30, "refetched within 30 s of the fetch"
    assert len(hooks.of("/jwks-rot.json")) == 2
