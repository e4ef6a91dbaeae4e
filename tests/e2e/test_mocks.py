"""Self-check of the mock providers, talking to them directly (no gateway needed)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx2 as httpx
import openai
import pytest

from helpers import OPENAI_KEYS, read_stream, raw_http, sdk_stream
from mocks import AnthropicMock, AzureOpenAIMock, OpenAIMock, Reply, ToolCall, make_self_signed_cert, tls_server_context

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-direct", "anthropic-version": "2023-06-01"}
DIRECT_KEY = "sk-direct"  # one of OPENAI_KEYS
OPENAI_AUTH = {"Authorization": f"Bearer {DIRECT_KEY}"}


def direct_openai(mock, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=mock.base_url, api_key=DIRECT_KEY, max_retries=0, timeout=10, **kw)


def anthropic_post(mock, body, headers=ANTHROPIC_HEADERS, **kw):
    return httpx.post(f"{mock.base_url}/messages", json=body, headers=headers, timeout=10, **kw)


def msg_body(**extra):
    return {"model": "claude-test-1", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **extra}


# --------------------------------------------------------------------------- OpenAI mock


def test_openai_chat_non_stream_and_recording(openai_mock):
    client = direct_openai(openai_mock)
    out = client.chat.completions.create(model="gpt-mock", messages=[{"role": "user", "content": "hi"}],
                                         extra_headers={"x-custom-thing": "yes"})
    assert out.choices[0].message.content == OpenAIMock.default_text
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/chat/completions")
    assert rec.headers["authorization"] == "Bearer sk-direct"
    assert rec.headers["x-custom-thing"] == "yes"
    assert rec.json["messages"] == [{"role": "user", "content": "hi"}]
    assert json.loads(rec.body) == rec.json


def test_openai_chat_stream_with_tool_calls(openai_mock):
    openai_mock.script(Reply(text="It is", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="call_1")]))
    stream = direct_openai(openai_mock).chat.completions.create(
        model="gpt-mock", messages=[{"role": "user", "content": "weather?"}], stream=True,
        stream_options={"include_usage": True})
    res = sdk_stream(stream)
    assert res.content == "It is"
    assert res.tool_calls == {0: {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert res.finish_reason == "tool_calls"
    assert res.usage["total_tokens"] == 18


def test_openai_stream_wire_format_is_chunked_sse(openai_mock):
    with httpx.stream("POST", f"{openai_mock.base_url}/chat/completions", headers=OPENAI_AUTH,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["transfer-encoding"] == "chunked"
        res = read_stream(r)
    assert res.done and res.content == OpenAIMock.default_text
    assert all(c["object"] == "chat.completion.chunk" for c in res.chunks)


def test_openai_gated_stream_holds_rest_until_gate(openai_mock):
    gate = threading.Event()
    reply = openai_mock.script(Reply(text="first second third", gate=gate))
    with httpx.stream("POST", f"{openai_mock.base_url}/chat/completions", headers=OPENAI_AUTH,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
                      timeout=httpx.Timeout(5, read=2)) as r:
        lines = r.iter_lines()
        seen = ""
        for line in lines:
            if line.startswith("data: {"):
                seen += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                if seen:
                    break
        assert seen == "first "
        assert not reply.served.is_set()
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):  # nothing more until the gate opens
            for line in lines:
                assert not line.startswith("data:"), f"data before the gate opened: {line!r}"
        assert time.monotonic() - t0 >= 1.5
    gate.set()
    assert reply.served.wait(5)
    # and with the gate set promptly the whole stream arrives
    gate2 = threading.Event()
    openai_mock.script(Reply(text="first second third", gate=gate2))
    with httpx.stream("POST", f"{openai_mock.base_url}/chat/completions", headers=OPENAI_AUTH,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
                      timeout=httpx.Timeout(5, read=2)) as r:
        res = read_stream(r, lambda res: res.content and gate2.set())
    assert res.content == "first second third" and res.done


def test_openai_hold_answers_only_once_released(openai_mock):
    release = threading.Event()
    reply = openai_mock.script(Reply(text="held", hold=release))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(httpx.post, f"{openai_mock.base_url}/chat/completions", json=body,
                             headers=OPENAI_AUTH, timeout=10)
        assert reply.received.wait(5)  # the request arrived and took this reply ...
        assert not answer.done() and not reply.served.is_set()  # ... and nothing was answered yet
        release.set()
        r = answer.result(timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "held"
    assert reply.served.wait(5) and reply.hold_timed_out is False


def test_openai_step_sends_one_chunk_per_permit(openai_mock):
    url, auth = f"{openai_mock.base_url}/chat/completions", OPENAI_AUTH
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    openai_mock.script(Reply(chunks=["a ", "b ", "c"], step=threading.Semaphore(0), step_timeout=3))
    with httpx.stream("POST", url, headers=auth, json=body, timeout=httpx.Timeout(5, read=1)) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: {"))
        contents = (json.loads(line[6:])["choices"][0]["delta"].get("content") for line in lines)
        assert [next(contents), next(contents)] == ["", "a "]  # the role chunk and the first content
        with pytest.raises(httpx.ReadTimeout):  # no permit: "b " is not sent
            next(contents)
    # with a permit for each chunk read, the whole stream arrives
    step = threading.Semaphore(0)
    reply = openai_mock.script(Reply(chunks=["a ", "b ", "c"], step=step))
    with httpx.stream("POST", url, headers=auth, json=body, timeout=httpx.Timeout(5, read=2)) as r:
        res = read_stream(r, lambda res: res.content and step.release())
    assert res.content == "a b c" and res.done
    assert reply.served.wait(5) and reply.step_timed_out is False


def test_openai_scripted_error_stall_and_model_keying(openai_mock):
    client = direct_openai(openai_mock)
    openai_mock.script(OpenAIMock.error(429, "Rate limit reached", type="requests", code="rate_limit_exceeded"),
                       model="limited")
    openai_mock.script(Reply(stall=0.5, text="late"), model="slow")
    t0 = time.monotonic()
    out = client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "late" and time.monotonic() - t0 >= 0.5
    with pytest.raises(openai.RateLimitError) as ei:
        client.chat.completions.create(model="limited", messages=[{"role": "user", "content": "x"}])
    assert ei.value.response.json()["error"]["code"] == "rate_limit_exceeded"
    # scripts are used once: the next call gets the default answer
    out = client.chat.completions.create(model="limited", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == OpenAIMock.default_text


def test_a_raw_reply_is_written_as_it_is_then_closed_or_reset(openai_mock):
    url, headers = f"{openai_mock.base_url}/chat/completions", OPENAI_AUTH
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    openai_mock.script(Reply(raw=b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"id\"", reset=True))
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        httpx.post(url, json=body, headers=headers, timeout=10)
    openai_mock.script(Reply(raw=b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\n{}"))
    r = httpx.post(url, json=body, headers=headers, timeout=10)
    assert (r.status_code, r.content) == (999, b"{}")
    # The next request gets a proper answer on a new connection.
    assert httpx.post(url, json=body, headers=headers, timeout=10).status_code == 200


def test_openai_requires_bearer_and_404s_unknown_paths(openai_mock):
    r = httpx.post(f"{openai_mock.base_url}/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{openai_mock.base_url}/nope", json={}, headers=OPENAI_AUTH)
    assert r.status_code == 404 and "Invalid URL" in r.json()["error"]["message"]


def test_openai_answers_401_to_a_missing_or_unknown_key_as_openai_does(openai_mock):
    url, body = f"{openai_mock.base_url}/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    missing = httpx.post(url, json=body, headers={"Authorization": "Basic a2V5"})
    assert missing.status_code == 401
    assert missing.json()["error"]["message"].startswith("You didn't provide an API key.")
    assert (missing.json()["error"]["type"], missing.json()["error"]["code"]) == ("invalid_request_error", None)
    unknown = "sk-not-a-key-of-this-account"
    wrong = httpx.post(url, json=body, headers={"Authorization": f"Bearer {unknown}"})
    assert wrong.status_code == 401
    assert wrong.json() == {"error": {"message": "Incorrect API key provided: sk-*********************ount. You can "
                                                 "find your API key at https://platform.openai.com/account/api-keys.",
                                      "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    assert httpx.post(url, json=body, headers=OPENAI_AUTH).status_code == 200
    openai_mock.keys.add(unknown)  # issued now
    try:
        assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {unknown}"}).status_code == 200
    finally:
        openai_mock.keys.discard(unknown)


def test_openai_assistants_need_openai_beta_and_no_other_header(openai_mock):
    url = f"{openai_mock.base_url}/assistants"
    for other in ({}, {"Vendor-Beta": "assistants=v2"}, {"OpenAI-Beta": "assistants=v1"}):
        r = httpx.get(url, headers={**OPENAI_AUTH, **other})
        assert r.status_code == 400 and "'OpenAI-Beta' header" in r.json()["error"]["message"], other
    assert httpx.get(url, headers={**OPENAI_AUTH, "OpenAI-Beta": "assistants=v2"}).json()["object"] == "list"


def chat_post(mock, body):
    return httpx.post(f"{mock.base_url}/chat/completions", json=body, headers=OPENAI_AUTH, timeout=10)


USER = {"role": "user", "content": "weather in Paris?"}
ASKED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}


def answer(call_id):
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


@pytest.mark.parametrize("body, error", [
    ({"model": "m", "messages": [USER], "foo": 1},
     {"message": "Unrecognized request argument supplied: foo", "type": "invalid_request_error", "param": None,
      "code": None}),
    ({"model": "m", "messages": [USER, answer("call_a")]},
     {"message": "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                 "'tool_calls'.", "type": "invalid_request_error", "param": "messages.[1].role", "code": None}),
    ({"model": "m", "messages": [USER, ASKED, answer("call_a"), answer("call_z")]},
     {"message": "Invalid parameter: 'tool_call_id' of 'call_z' not found in 'tool_calls' of previous message.",
      "type": "invalid_request_error", "param": "messages.[3].tool_call_id", "code": None}),
    ({"model": "m", "messages": [USER, ASKED, answer("call_a"), {"role": "user", "content": "and?"}]},
     {"message": "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                 "'tool_call_id'. The following tool_call_ids did not have response messages: call_b",
      "type": "invalid_request_error", "param": "messages.[1].role", "code": None}),
    ({"model": "m", "messages": [USER, ASKED]},
     {"message": "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                 "'tool_call_id'. The following tool_call_ids did not have response messages: call_a, call_b",
      "type": "invalid_request_error", "param": "messages.[1].role", "code": None}),
    # a tool message after a user turn answers nothing, even with an id asked for earlier
    ({"model": "m", "messages": [USER, ASKED, answer("call_a"), answer("call_b"), USER, answer("call_a")]},
     {"message": "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                 "'tool_calls'.", "type": "invalid_request_error", "param": "messages.[5].role", "code": None}),
    ({"model": "m"},
     {"message": "Missing required parameter: 'messages'.", "type": "invalid_request_error", "param": "messages",
      "code": "missing_required_parameter"}),
    ({"model": "m", "messages": []},
     {"message": "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array "
                 "instead.", "type": "invalid_request_error", "param": "messages", "code": "empty_array"}),
    ({"messages": [USER]},
     {"message": "you must provide a model parameter", "type": "invalid_request_error", "param": None, "code": None}),
])
def test_openai_chat_refuses_what_openai_refuses(openai_mock, body, error):
    r = chat_post(openai_mock, body)
    assert (r.status_code, r.json()) == (400, {"error": error})


@pytest.mark.parametrize("extra, param, code", [
    ({"messages": [{"role": "human", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": [USER, {**ASKED, "tool_calls": [{"id": "call_a", "type": "function",
                                                    "function": {"name": "f", "arguments": {"city": "Paris"}}}]},
                   answer("call_a")]}, "messages[1].tool_calls[0].function.arguments", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type",
     "invalid_value"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}]},
     "messages[0].content[0].type", "invalid_value"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools[0].function",
     "missing_required_parameter"),
    ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice.function", "missing_required_parameter"),
    ({"stream_options": {"include_usage": True}}, "stream_options", None),
    ({"response_format": {"type": "json_schema", "schema": {}}}, "response_format.json_schema",
     "missing_required_parameter"),
    ({"reasoning_effort": "max"}, "reasoning_effort", "invalid_value"),
    ({"temperature": 3}, "temperature", "decimal_above_max_value"),
])
def test_openai_chat_validates_the_request_like_openai(openai_mock, extra, param, code):
    r = chat_post(openai_mock, {"model": "m", "messages": [USER], **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err


def test_openai_chat_takes_a_whole_tool_conversation_from_the_sdk(openai_mock):
    """What the SDK sends for a real tool round trip (two calls, both answered, then a user
    turn) passes, with every parameter of OpenAI's list."""
    body = {"model": "m", "messages": [{"role": "developer", "content": "be brief"}, USER, ASKED, answer("call_b"),
                                       answer("call_a"), {"role": "user", "content": [{"type": "text", "text": "ok"}]}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {}}},
            "reasoning_effort": "low", "verbosity": "low", "max_completion_tokens": 50, "seed": 1,
            "prompt_cache_key": "k", "safety_identifier": "u", "metadata": {"a": "b"}, "store": False}
    out = direct_openai(openai_mock).chat.completions.create(**body)
    assert out.choices[0].message.content == OpenAIMock.default_text
    assert openai_mock.last.json == body


def test_openai_mock_takes_a_compatible_hosts_own_parameters_only_when_told(openai_mock):
    body = {"model": "m", "messages": [USER], "top_k": 5}
    assert chat_post(openai_mock, body).status_code == 400
    openai_mock.strict = False  # an OpenAI-compatible host (vLLM) that takes `top_k`
    assert chat_post(openai_mock, body).status_code == 200
    assert chat_post(openai_mock, {**body, "messages": [answer("call_a")]}).status_code == 400  # still checked
    openai_mock.reset()
    assert openai_mock.strict and chat_post(openai_mock, body).status_code == 400


def test_openai_embeddings_and_completions_refuse_unknown_parameters(openai_mock):
    url = openai_mock.base_url
    r = httpx.post(f"{url}/embeddings", json={"model": "e", "input": "x", "top_k": 1}, headers=OPENAI_AUTH)
    assert (r.status_code, r.json()["error"]["message"]) == (400, "Unrecognized request argument supplied: top_k")
    r = httpx.post(f"{url}/completions", json={"model": "c", "prompt": "x", "messages": []}, headers=OPENAI_AUTH)
    assert (r.status_code, r.json()["error"]["message"]) == (400, "Unrecognized request argument supplied: messages")
    r = httpx.post(f"{url}/completions", json={"model": "c", "prompt": "x", "suffix": "!", "echo": True},
                   headers=OPENAI_AUTH)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("version, message", [
    (None, "anthropic-version: header is required"),
    ("2024-01-01", "anthropic-version: invalid version '2024-01-01'"),
])
def test_anthropic_answers_400_without_a_version_it_serves(anthropic_mock, version, message):
    headers = {"x-api-key": "sk-ant-direct", **({"anthropic-version": version} if version else {})}
    r = anthropic_post(anthropic_mock, msg_body(), headers=headers)
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    assert anthropic_post(anthropic_mock, msg_body()).status_code == 200  # 2023-06-01


def test_azure_mock_wants_an_api_version_azure_serves():
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    with AzureOpenAIMock("az-key") as mock:
        url, key = f"{mock.base_url}/deployments/gpt4o-prod/chat/completions", {"api-key": "az-key"}
        missing = httpx.post(url, json=body, headers=key)
        assert missing.status_code == 404
        assert missing.json() == {"error": {"code": "404", "message": "Resource not found"}}
        unknown = httpx.post(f"{url}?api-version=2024-13-01", json=body, headers=key)
        assert unknown.status_code == 400
        assert unknown.json() == {"error": {"code": "BadRequest", "message": "API version not supported"}}
        assert httpx.post(f"{url}?api-version=2024-10-21", json=body, headers=key).status_code == 200
        wrong_key = httpx.post(f"{url}?api-version=2024-10-21", json=body, headers={"api-key": "other"})
        assert wrong_key.status_code == 401


def test_openai_embeddings_can_be_pinned(openai_mock):
    openai_mock.embed_as("France", [1.0, 0.0, 0.5])
    openai_mock.embed_as("capital", [0.0, 1.0, 0.0])  # also matches the first input: the first rule wins
    client = direct_openai(openai_mock)
    emb = client.embeddings.create(model="text-embedding-mock", encoding_format="float",
                                   input=["user: the capital of France?", "the capital of Spain", "other"])
    assert [d.embedding for d in emb.data] == [[1.0, 0.0, 0.5], [0.0, 1.0, 0.0], OpenAIMock._vector('"other"')]
    emb = client.embeddings.create(model="text-embedding-mock", input="France")  # base64 carries it too
    assert emb.data[0].embedding == [1.0, 0.0, 0.5]
    openai_mock.reset()
    emb = client.embeddings.create(model="text-embedding-mock", input="France", encoding_format="float")
    assert emb.data[0].embedding == OpenAIMock._vector('"France"')


def test_openai_other_endpoints_via_sdk(openai_mock):
    client = direct_openai(openai_mock)
    emb = client.embeddings.create(model="text-embedding-mock", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
    assert openai_mock.last.json["encoding_format"] == "base64"  # the SDK's default
    emb = client.embeddings.create(model="text-embedding-mock", input="a", encoding_format="float")
    assert emb.data[0].embedding == OpenAIMock._vector('"a"')
    comp = client.completions.create(model="gpt-mock-instruct", prompt="Once")
    assert comp.choices[0].text == OpenAIMock.default_text
    img = client.images.generate(prompt="a red square", n=2)
    assert len(img.data) == 2 and img.data[0].url.startswith("https://")
    audio = bytes(range(256)) * 40
    tr = client.audio.transcriptions.create(model="whisper-mock", file=("clip.wav", audio, "audio/wav"))
    assert tr.text == f"received {len(audio)} bytes"
    assert openai_mock.last.form["file"]["data"] == audio
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ["batch_mock_1", "batch_mock_2"] and page.has_more
    assert openai_mock.last.query == {"limit": ["2"]}
    b = client.batches.cancel("batch_xyz")
    assert b.status == "cancelling" and b.cancelling_at
    asst = client.beta.assistants.list(limit=5, order="asc")
    assert [a.id for a in asst.data] == ["asst_mock_1", "asst_mock_2"]
    assert openai_mock.last.headers["openai-beta"] == "assistants=v2"


def test_openai_resource_shapes_files_kept_and_deletes(openai_mock):
    client = direct_openai(openai_mock)
    f = client.files.create(file=("a.jsonl", b"abc", "application/jsonl"), purpose="batch")
    assert (client.files.retrieve(f.id).bytes, client.files.content(f.id).read()) == (3, b"abc")
    assert client.files.delete(f.id).model_dump() == {"id": f.id, "object": "file", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert openai_mock.body_bytes > 3  # the multipart body, counted as it arrived
    beta = client.beta
    assert beta.assistants.delete("asst_1").object == "assistant.deleted"
    assert beta.threads.delete("thread_1").object == "thread.deleted"
    assert beta.threads.messages.delete("msg_1", thread_id="thread_1").object == "thread.message.deleted"
    assert beta.threads.runs.cancel("run_1", thread_id="thread_1").status == "cancelling"
    with pytest.raises(openai.BadRequestError):
        beta.threads.runs.create("thread_1", assistant_id=None)  # type: ignore[arg-type]
    without_beta = httpx.get(f"{openai_mock.base_url}/threads/thread_1/runs", headers=OPENAI_AUTH)
    assert without_beta.status_code == 400 and "OpenAI-Beta" in without_beta.text


def test_azure_mock_serves_assistants_only_under_a_preview_version():
    with AzureOpenAIMock("az-key") as mock:
        url, key = f"{mock.base_url}/assistants", {"api-key": "az-key"}
        assert httpx.get(f"{url}?api-version=2024-10-21", headers=key).status_code == 404
        assert httpx.get(f"{url}?api-version=2024-05-01-preview", headers=key).json()["object"] == "list"


def test_openai_mock_keep_alive_and_chunked_request_body(openai_mock):
    with httpx.Client(headers=OPENAI_AUTH) as c:
        for _ in range(3):
            assert c.get(f"{openai_mock.base_url}/models").status_code == 200
    assert openai_mock.connections == 1
    assert len({r.client for r in openai_mock.requests}) == 1

    payload = json.dumps({"model": "m", "messages": [{"role": "user", "content": "chunked"}]}).encode()
    half = len(payload) // 2
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:half], payload[half:])) + b"0\r\n\r\n"
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-direct\r\n"
           b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
    r = raw_http("127.0.0.1", openai_mock.port, req, timeout=5)
    assert r.status_code == 200 and openai_mock.last.json["messages"][0]["content"] == "chunked"


# --------------------------------------------------------------------------- Anthropic mock


def test_anthropic_non_stream_blocks(anthropic_mock):
    anthropic_mock.script(Reply(text="Let me check.", thinking="The user wants weather.", usage=(20, 9),
                                tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="toolu_1")]))
    r = anthropic_post(anthropic_mock, msg_body())
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["type"] == "message" and m["model"] == "claude-test-1" and m["stop_reason"] == "tool_use"
    assert [b["type"] for b in m["content"]] == ["thinking", "text", "tool_use"]
    assert m["content"][2] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    assert m["usage"]["input_tokens"] == 20 and m["usage"]["output_tokens"] == 9


def test_anthropic_stream_event_sequence(anthropic_mock):
    anthropic_mock.script(Reply(text="Hi there", thinking="hmm", tool_calls=[ToolCall("f", {"a": 1})]))
    with httpx.stream("POST", f"{anthropic_mock.base_url}/messages", json=msg_body(stream=True),
                      headers=ANTHROPIC_HEADERS) as r:
        assert r.status_code == 200
        events, name = [], None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    types = [e["type"] for e in events]
    assert types[:3] == ["message_start", "content_block_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} == set(deltas)
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    args = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert text == "Hi there" and json.loads(args) == {"a": 1}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("headers, status, err_type", [
    ({"anthropic-version": "2023-06-01"}, 401, "authentication_error"),
    ({"x-api-key": "k"}, 400, "invalid_request_error"),
])
def test_anthropic_rejects_missing_auth_headers(anthropic_mock, headers, status, err_type):
    r = anthropic_post(anthropic_mock, msg_body(), headers=headers)
    assert r.status_code == status
    assert r.json() == {"type": "error", "error": {"type": err_type, "message": r.json()["error"]["message"]}}


@pytest.mark.parametrize("body, fragment", [
    ({"model": "c", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (msg_body(messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]), "messages.0.role"),
    (msg_body(stop=["x"]), "stop"),
    (msg_body(tool_choice="required"), "tool_choice"),
    (msg_body(temperature=1.5), "temperature"),
    (msg_body(tools=[{"name": "f", "parameters": {}}]), "input_schema"),
])
def test_anthropic_validates_like_the_real_api(anthropic_mock, body, fragment):
    r = anthropic_post(anthropic_mock, body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and fragment in err["message"]


def test_anthropic_scripted_error(anthropic_mock):
    anthropic_mock.script(AnthropicMock.error(429, "rate_limit_error", "Too many tokens"))
    r = anthropic_post(anthropic_mock, msg_body())
    assert r.status_code == 429
    assert r.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": "Too many tokens"}}
    anthropic_mock.script(Reply(status=529))
    r = anthropic_post(anthropic_mock, msg_body())
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"


# --------------------------------------------------------------------------- HTTPS mock


def test_https_mock_self_signed(tmp_path):
    cert, key = make_self_signed_cert(tmp_path)
    with OpenAIMock(OPENAI_KEYS, ssl_context=tls_server_context(cert, key)) as mock:
        assert mock.base_url.startswith("https://127.0.0.1:")
        with pytest.raises(httpx.ConnectError):  # untrusted by default
            httpx.get(f"{mock.base_url}/models", headers=OPENAI_AUTH, timeout=5)
        assert mock.requests == []
        assert mock.wait_until(lambda m: m.tls_failures >= 1, timeout=2)  # counted by the handshake's thread
        ctx = ssl.create_default_context(cafile=str(cert))
        r = httpx.get(f"{mock.base_url}/models", headers=OPENAI_AUTH, timeout=5, verify=ctx)
        assert r.status_code == 200 and len(mock.requests) == 1


# --------------------------------------------------------------------------- OpenAI mock: the Responses API


def responses_post(mock, body, **kw):
    return httpx.post(f"{mock.base_url}/responses", json=body, headers=OPENAI_AUTH, timeout=10, **kw)


def stream_responses(mock, body) -> list[dict]:
    """The events of a streamed response, each checked: its `event:` line names its `type`."""
    with httpx.stream("POST", f"{mock.base_url}/responses", json={**body, "stream": True}, headers=OPENAI_AUTH,
                      timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        res = read_stream(r)
    assert not res.done  # the Responses API sends no [DONE]
    assert [name for name, _ in res.events] == [c["type"] for c in res.chunks]
    return res.chunks


def test_responses_create_answers_a_response_object(openai_mock):
    client = direct_openai(openai_mock)
    out = client.responses.create(model="gpt-mock", input="hi", instructions="Be brief.", metadata={"k": "v"})
    assert out.output_text == OpenAIMock.default_text
    assert (out.object, out.status, out.model, out.instructions, out.metadata) == (
        "response", "completed", "gpt-mock", "Be brief.", {"k": "v"})
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (11, 7, 18)
    [message] = out.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert openai_mock.last.json["input"] == "hi"


def test_responses_stream_is_openais_event_sequence(openai_mock):
    openai_mock.script(Reply(thinking="Use f.", text="It is", tool_calls=[ToolCall("f", {"a": 1}, id="call_1")],
                             usage=(5, 3)))
    events = stream_responses(openai_mock, {"model": "gpt-mock", "input": "hi",
                                            "include": ["reasoning.encrypted_content"]})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        *["response.reasoning_summary_text.delta"] * 3, "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 2, "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "It is"
    assert all(e["obfuscation"] for e in events if e["type"].endswith(".delta"))
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"a": 1}
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 8
    reasoning, message, call = final["output"]
    assert reasoning["encrypted_content"] == OpenAIMock.seal_reasoning("Use f.")
    assert message["content"][0]["text"] == "It is"
    assert (call["type"], call["call_id"], call["name"]) == ("function_call", "call_1", "f")
    # each output_item.done carries the item as the final response has it
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == final["output"]


def test_responses_sdk_stream_and_an_incomplete_answer(openai_mock):
    openai_mock.script(Reply(text="all of it"))
    with direct_openai(openai_mock).responses.stream(model="gpt-mock", input="hi") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["all ", "of ", "it"] and final.output_text == "all of it"
    openai_mock.script(Reply(text="cut short", stop_reason="max_output_tokens"))
    events = stream_responses(openai_mock, {"model": "gpt-mock", "input": "hi", "max_output_tokens": 16})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_gated_stream_holds_the_rest_until_the_gate(openai_mock):
    gate = threading.Event()
    reply = openai_mock.script(Reply(text="first second", gate=gate))
    body = {"model": "gpt-mock", "input": "x", "stream": True}
    with httpx.stream("POST", f"{openai_mock.base_url}/responses", json=body, headers=OPENAI_AUTH,
                      timeout=httpx.Timeout(5, read=1)) as r:
        data = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: "))
        types = []
        while not types or types[-1] != "response.output_text.delta":
            types.append(next(data)["type"])
        with pytest.raises(httpx.ReadTimeout):  # nothing more until the gate opens
            next(data)
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta"]
    assert not reply.served.is_set()
    gate.set()
    assert reply.served.wait(5)


@pytest.mark.parametrize("extra, param, code", [
    ({"foo": 1}, "foo", "unknown_parameter"),
    ({"text": {"format": "json"}}, "text.format.type", "invalid_value"),
    ({"model": None}, "model", "missing_required_parameter"),
    ({"input": {"role": "user"}}, "input", "invalid_type"),
    ({"input": [{"type": "shout", "text": "x"}]}, "input[0].type", "invalid_value"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input[0].content[0].type",
     "invalid_value"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments",
     "missing_required_parameter"),
    ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, "input[0].name", "unknown_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools[0].name",
     "missing_required_parameter"),
    ({"tools": [{"type": "browser"}]}, "tools[0].type", "invalid_value"),
    ({"max_output_tokens": 5}, "max_output_tokens", "integer_below_min_value"),
    ({"temperature": 3}, "temperature", "decimal_above_max_value"),
    ({"include": ["everything"]}, "include[0]", "invalid_value"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value"),
])
def test_responses_validates_like_openai(openai_mock, extra, param, code):
    r = responses_post(openai_mock, {"model": "gpt-mock", "input": "hi", **extra})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)
    assert openai_mock.requests_to("/v1/responses")  # recorded all the same


def test_responses_accept_what_codex_sends(openai_mock):
    # The request shape of Codex 0.171 (tools of every type it sends, store off, encrypted reasoning).
    body = {
        "model": "gpt-5.5", "stream": False, "store": False, "include": ["reasoning.encrypted_content"],
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"effort": "medium"},
        "text": {"verbosity": "low"}, "prompt_cache_key": "session-1", "client_metadata": {"turn": "1"},
        "input": [{"type": "message", "id": "msg_1", "role": "developer",
                   "content": [{"type": "input_text", "text": "You are Codex."}]},
                  {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "tools": [{"type": "function", "name": "exec_command", "strict": False, "description": "run",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                  {"type": "custom", "name": "apply_patch", "description": "patch",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"x\""}},
                  {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
                   "tools": [{"type": "function", "name": "close_agent", "strict": False, "parameters": {}}]},
                  {"type": "tool_search", "execution": "client"},
                  {"type": "web_search", "external_web_access": False, "search_content_types": ["text", "image"]}],
    }
    r = responses_post(openai_mock, body)
    assert r.status_code == 200, r.text
    assert r.json()["store"] is False and r.json()["tools"] == body["tools"]


def test_responses_tool_outputs_must_answer_a_call(openai_mock):
    call = {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_9", "output": "42"}
    r = responses_post(openai_mock, {"model": "gpt-mock", "input": [output]})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "No tool call found for function call output with call_id call_9.",
                                 "type": "invalid_request_error", "param": "input", "code": None}
    r = responses_post(openai_mock, {"model": "gpt-mock", "input": [{"role": "user", "content": "x"}, call, output]})
    assert r.status_code == 200, r.text
    # the call may be in the previous response instead
    openai_mock.script(Reply(tool_calls=[ToolCall("f", {}, id="call_10")]))
    first = responses_post(openai_mock, {"model": "gpt-mock", "input": "x"}).json()
    r = responses_post(openai_mock, {"model": "gpt-mock", "previous_response_id": first["id"],
                                     "input": [{**output, "call_id": "call_10"}]})
    assert r.status_code == 200 and r.json()["previous_response_id"] == first["id"]


def test_responses_reasoning_sent_back_must_be_as_issued(openai_mock):
    openai_mock.script(Reply(thinking="Think first.", text="ok"))
    first = responses_post(openai_mock, {"model": "gpt-mock", "input": "x", "store": False,
                                         "include": ["reasoning.encrypted_content"]}).json()
    reasoning = first["output"][0]
    history = [{"role": "user", "content": "x"}, reasoning, {"role": "user", "content": "again"}]
    assert responses_post(openai_mock, {"model": "gpt-mock", "input": history, "store": False}).status_code == 200
    tampered = {**reasoning, "encrypted_content": OpenAIMock.seal_reasoning("Think first.")[:-2] + "00"}
    r = responses_post(openai_mock, {"model": "gpt-mock", "input": [history[0], tampered, history[2]]})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_encrypted_content" and reasoning["id"] in r.json()["error"]["message"]


def test_responses_are_stored_for_retrieve_input_items_delete(openai_mock):
    client = direct_openai(openai_mock)
    created = client.responses.create(model="gpt-mock", input=[{"role": "user", "content": "one"},
                                                              {"role": "user", "content": "two"}])
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    items = client.responses.input_items.list(created.id)
    assert [i.content[0].text for i in items.data] == ["two", "one"]  # newest first, as OpenAI lists them
    assert all(i.id.startswith("msg_") and i.type == "message" for i in items.data)
    items = client.responses.input_items.list(created.id, order="asc", limit=1)
    assert [i.content[0].text for i in items.data] == ["one"] and items.has_more
    follow = client.responses.create(model="gpt-mock", input="three", previous_response_id=created.id)
    assert follow.previous_response_id == created.id
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError, match=f"Response with id '{created.id}' not found"):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-mock", input="four", previous_response_id=created.id)
    assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"


def test_responses_not_stored_are_not_found(openai_mock):
    client = direct_openai(openai_mock)
    unstored = client.responses.create(model="gpt-mock", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="Previous response with id"):
        client.responses.create(model="gpt-mock", input="y", previous_response_id=unstored.id)


def test_responses_cancel_only_a_background_response(openai_mock):
    client = direct_openai(openai_mock)
    background = client.responses.create(model="gpt-mock", input="x", background=True)
    assert background.status == "queued" and background.output == []
    assert client.responses.cancel(background.id).status == "cancelled"
    assert client.responses.retrieve(background.id).status == "cancelled"
    finished = client.responses.create(model="gpt-mock", input="x", background=True)
    assert client.responses.retrieve(finished.id).status == "completed"  # done by the time it is asked for
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a completed response"):
        client.responses.cancel(finished.id)
    foreground = client.responses.create(model="gpt-mock", input="x")
    with pytest.raises(openai.BadRequestError, match="background=true"):
        client.responses.cancel(foreground.id)


def test_responses_scripted_error_and_model_keying(openai_mock):
    client = direct_openai(openai_mock)
    openai_mock.script(OpenAIMock.error(429, "Rate limit reached", type="requests", code="rate_limit_exceeded"),
                       path="/v1/responses", model="limited")
    openai_mock.script(Reply(text="from the script"), path="/v1/responses")
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="limited", input="x")
    assert client.responses.create(model="other", input="x").output_text == "from the script"


# --------------------------------------------------------------------------- Anthropic mock: agents' conversations


def test_anthropic_tool_results_must_answer_the_turn_before(anthropic_mock):
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}
    ask = {"role": "user", "content": "weather?"}
    assert anthropic_post(anthropic_mock, msg_body(messages=[ask, use, result])).status_code == 200
    # the id lost or renamed on the way: Anthropic's 400 either way
    renamed = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "42"}]}
    r = anthropic_post(anthropic_mock, msg_body(messages=[ask, use, renamed]))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("messages.1: `tool_use` ids were found without `tool_result`")
    r = anthropic_post(anthropic_mock, msg_body(messages=[ask, renamed]))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: call_1.")


def test_anthropic_takes_claude_codes_conversations_under_their_betas(anthropic_mock):
    # Claude Code 2.1's shape: `system` turns with their own output_config among the messages,
    # adaptive thinking, cache_control on up to four blocks, tool results after a system turn.
    system_turn = {"role": "system", "content": [{"type": "text", "text": "env", "cache_control": {"type": "ephemeral"}}],
                   "output_config": {"effort": "medium"}}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x",
                                           "cache_control": {"type": "ephemeral"}}]}
    body = msg_body(messages=[{"role": "user", "content": "hi"}, system_turn, use, result],
                    system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                            {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}],
                    thinking={"type": "adaptive", "display": "omitted"}, output_config={"effort": "medium"},
                    context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    beta = {**ANTHROPIC_HEADERS, "anthropic-beta": f"claude-code-20250219,{AnthropicMock.per_turn_beta}"}
    r = anthropic_post(anthropic_mock, body, headers=beta)
    assert r.status_code == 200, r.text
    r = anthropic_post(anthropic_mock, body)  # the beta header lost
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.1.role")
    body["tools"] = [{"name": "Read", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}]
    r = anthropic_post(anthropic_mock, body, headers=beta)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "A maximum of 4 blocks with cache_control may be provided. Found 5."


def test_anthropic_count_tokens(anthropic_mock):
    body = {"model": "claude-test-1", "system": "Be brief.", "messages": [{"role": "user", "content": "hi there"}]}
    r = httpx.post(f"{anthropic_mock.base_url}/messages/count_tokens", json=body, headers=ANTHROPIC_HEADERS,
                   timeout=10)
    assert r.status_code == 200 and r.json() == {"input_tokens": AnthropicMock.count_tokens(body)}
    assert AnthropicMock.count_tokens(body) != AnthropicMock.count_tokens({**body, "system": "Be long."  * 20})
    r = httpx.post(f"{anthropic_mock.base_url}/messages/count_tokens", json={**body, "max_tokens": 10},
                   headers=ANTHROPIC_HEADERS, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Extra inputs are not permitted"
    anthropic_mock.script(AnthropicMock.error(429, "rate_limit_error", "slow down"), path="/v1/messages/count_tokens")
    r = httpx.post(f"{anthropic_mock.base_url}/messages/count_tokens", json=body, headers=ANTHROPIC_HEADERS,
                   timeout=10)
    assert r.status_code == 429


def test_anthropic_sdk_against_the_mock(anthropic_mock):
    client = anthropic.Anthropic(base_url=anthropic_mock.origin, api_key="sk-ant-direct", max_retries=0)
    anthropic_mock.script(Reply(text="Hi there", thinking="greet", tool_calls=[ToolCall("f", {"a": 1}, id="toolu_9")]))
    with client.messages.stream(model="claude-test-1", max_tokens=2048, messages=[{"role": "user", "content": "hi"}],
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Hi there" and [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature == AnthropicMock.sign_thinking("greet")
    count = client.messages.count_tokens(model="claude-test-1", messages=[{"role": "user", "content": "hi"}])
    assert count.input_tokens == AnthropicMock.count_tokens({"messages": [{"role": "user", "content": "hi"}]})
    anthropic_mock.script(AnthropicMock.error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(anthropic.InternalServerError) as err:
        client.messages.create(model="claude-test-1", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 529
