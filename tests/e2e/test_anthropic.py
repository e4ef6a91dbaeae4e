"""OpenAI ⇄ Anthropic Messages translation: request, response, streaming, errors."""

from __future__ import annotations

import json

import openai
import pytest

from helpers import (KEY, SDK_DUMMY_KEY, assert_chat_completion, assert_clean_upstream, assert_error, chat_body,
                     config, provider_config, sdk_stream, served_by, slug, stream_chat)
from mocks import AnthropicMock, Reply, ToolCall

MODEL = "claude-test-1"
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAIAAAUAAeIhvDMAAAAASUVORK5CYII="
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ANTHROPIC = slug("anthropic-mock")


def text_of(content) -> str:
    """Anthropic content (string or blocks) as plain text."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def blocks_of(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def subset(d: dict, keys) -> dict:
    """The given keys of ``d`` (a translation may add harmless extra fields)."""
    return {k: d.get(k) for k in keys}


def test_request_translation(gateway, anthropic_mock):
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            ]},
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "stop": ["END", "STOP"],
        "temperature": 0.5,
    }
    r = gateway.chat(ANTHROPIC, body)
    assert r.status_code == 200, r.text
    served_by(r, "anthropic")
    sent = anthropic_mock.last.json
    assert sent["model"] == MODEL
    system = text_of(sent["system"])
    assert "You are terse." in system and "Answer in French." in system
    assert [m["role"] for m in sent["messages"]] == ["user"]
    blocks = blocks_of(sent["messages"][0]["content"])
    assert [b["text"] for b in blocks if b["type"] == "text"] == ["What is in this image?"]
    images = [b for b in blocks if b["type"] == "image"]
    assert len(images) == 1
    assert images[0]["source"] == {"type": "base64", "media_type": "image/png", "data": PNG_B64}
    assert [subset(t, ("name", "description", "input_schema")) for t in sent["tools"]] == [
        {"name": "get_weather", "description": "Current weather for a city",
         "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    assert sent["tool_choice"] == {"type": "any"}
    assert sent["stop_sequences"] == ["END", "STOP"]
    assert sent["max_tokens"] == 4096
    assert sent["temperature"] == 0.5
    assert "stop" not in sent
    assert_clean_upstream(anthropic_mock.last, KEY)


@pytest.mark.parametrize("choice, expected", [
    ("auto", {"type": "auto"}),
    ("required", {"type": "any"}),
    ({"type": "function", "function": {"name": "get_weather"}}, {"type": "tool", "name": "get_weather"}),
])
def test_tool_choice_mapping(gateway, anthropic_mock, choice, expected):
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, tools=[WEATHER_TOOL], tool_choice=choice))
    assert r.status_code == 200, r.text
    assert subset(anthropic_mock.last.json["tool_choice"], expected) == expected


def test_explicit_max_tokens_and_string_stop(gateway, anthropic_mock):
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, max_tokens=77, stop="DONE"))
    assert r.status_code == 200, r.text
    sent = anthropic_mock.last.json
    assert sent["max_tokens"] == 77
    assert sent["stop_sequences"] == ["DONE"]


def test_tool_history_translation(gateway, anthropic_mock):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_prev_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "toolu_prev_1", "content": "18C and sunny"},
    ]
    r = gateway.chat(ANTHROPIC, {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    sent = anthropic_mock.last.json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert text_of(sent[0]["content"]) == "Weather in Paris?"
    tool_uses = [b for b in blocks_of(sent[1]["content"]) if b["type"] == "tool_use"]
    assert [subset(b, ("id", "name", "input")) for b in tool_uses] == [
        {"id": "toolu_prev_1", "name": "get_weather", "input": {"city": "Paris"}}]
    results = [b for b in blocks_of(sent[2]["content"]) if b["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["tool_use_id"] == "toolu_prev_1"
    assert text_of(results[0]["content"]) == "18C and sunny"


def test_consecutive_tool_results_merge_into_one_user_turn(gateway, anthropic_mock):
    calls = [("toolu_a", "get_weather", {"city": "Paris"}), ("toolu_b", "get_weather", {"city": "Oslo"}),
             ("toolu_c", "get_time", {"tz": "CET"})]
    messages = [
        {"role": "user", "content": "Weather in Paris and Oslo, and the time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, n, a in calls]},
        {"role": "tool", "tool_call_id": "toolu_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": "4C"},
        {"role": "tool", "tool_call_id": "toolu_c", "content": "12:00"},
    ]
    r = gateway.chat(ANTHROPIC, {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    sent = anthropic_mock.last.json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [subset(b, ("id", "name", "input")) for b in blocks_of(sent[1]["content"]) if b["type"] == "tool_use"] == [
        {"id": i, "name": n, "input": a} for i, n, a in calls]
    results = blocks_of(sent[2]["content"])
    assert [b["type"] for b in results] == ["tool_result"] * 3
    assert [(b["tool_use_id"], text_of(b["content"])) for b in results] == [
        ("toolu_a", "18C"), ("toolu_b", "4C"), ("toolu_c", "12:00")]


def test_user_becomes_metadata_user_id(gateway, anthropic_mock):
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, user="user-42"))
    assert r.status_code == 200, r.text
    sent = anthropic_mock.last.json
    assert sent["metadata"] == {"user_id": "user-42"}
    assert "user" not in sent


@pytest.mark.parametrize("choice, expected_type", [(None, "auto"), ("required", "any")])
def test_parallel_tool_calls_false_disables_parallel_tool_use(gateway, anthropic_mock, choice, expected_type):
    extra = {} if choice is None else {"tool_choice": choice}
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, tools=[WEATHER_TOOL], parallel_tool_calls=False, **extra))
    assert r.status_code == 200, r.text
    sent = anthropic_mock.last.json
    assert sent["tool_choice"] == {"type": expected_type, "disable_parallel_tool_use": True}
    assert "parallel_tool_calls" not in sent


@pytest.mark.parametrize("extra, param", [
    ({"n": 2}, "n"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
], ids=["n-2", "json_object", "json_schema", "logprobs", "functions"])
def test_what_anthropic_cannot_do_is_400(gateway, anthropic_mock, extra, param):
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, **extra))
    assert_error(r, 400, type="invalid_request_error", param=param)
    assert anthropic_mock.requests == []


def test_response_text_usage_and_stop(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="Bonjour !", usage=(25, 4)))
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL))
    assert r.status_code == 200, r.text
    body = r.json()
    msg = assert_chat_completion(body, content="Bonjour !", finish_reason="stop", model=MODEL)
    assert not msg.get("tool_calls")
    assert body["usage"]["prompt_tokens"] == 25
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["total_tokens"] == 29
    assert "content_blocks" not in msg or msg["content_blocks"] is None


def test_response_max_tokens_is_length(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="Cut sho", stop_reason="max_tokens"))
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL, max_tokens=3))
    assert r.status_code == 200, r.text
    assert_chat_completion(r.json(), content="Cut sho", finish_reason="length")


def test_response_tool_use_is_tool_calls(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="Let me check.", tool_calls=[
        ToolCall("get_weather", {"city": "Paris", "unit": "celsius"}, id="toolu_abc")]))
    r = gateway.chat(ANTHROPIC, chat_body("Weather?", model=MODEL, tools=[WEATHER_TOOL]))
    assert r.status_code == 200, r.text
    msg = assert_chat_completion(r.json(), finish_reason="tool_calls")
    calls = msg["tool_calls"]
    assert [(c["id"], c["type"], c["function"]["name"]) for c in calls] == [("toolu_abc", "function", "get_weather")]
    args = calls[0]["function"]["arguments"]
    assert isinstance(args, str), "arguments must be a JSON string"
    assert json.loads(args) == {"city": "Paris", "unit": "celsius"}
    assert msg.get("content") == "Let me check."


def test_thinking_hidden_by_default(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="42.", thinking="Six times seven."))
    r = gateway.chat(ANTHROPIC, chat_body("6*7?", model=MODEL))
    assert r.status_code == 200, r.text
    msg = assert_chat_completion(r.json(), content="42.")
    assert "content_blocks" not in msg or msg["content_blocks"] is None
    assert "Six times seven." not in r.text


def test_thinking_returned_when_not_strict(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="42.", thinking="Six times seven."))
    cfg = provider_config(anthropic_mock, provider="anthropic", api_key="sk-ant-x", strict_vendor_compliance=False)
    body = chat_body("6*7?", model=MODEL, thinking={"type": "enabled", "budget_tokens": 1024})
    r = gateway.chat(config(cfg), body)
    assert r.status_code == 200, r.text
    msg = assert_chat_completion(r.json(), content="42.")
    blocks = msg.get("content_blocks")
    assert isinstance(blocks, list), msg
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["thinking"] == "Six times seven."
    assert blocks[1]["text"] == "42."
    sent = anthropic_mock.last.json
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert sent["max_tokens"] > 1024


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_sent_back_continues_a_tool_use_turn(gateway, anthropic_mock, stream):
    # Anthropic refuses a tool result whose tool_use turn lost its (signed) thinking while
    # thinking is on; the SDK user sends the assistant message back as they got it.
    cfg = provider_config(anthropic_mock, provider="anthropic", api_key="sk-ant-x", strict_vendor_compliance=False)
    client = gateway.sdk(config(cfg))
    thinking = {"type": "enabled", "budget_tokens": 1024}
    ask = dict(model=MODEL, max_tokens=2048, tools=[WEATHER_TOOL], extra_body={"thinking": thinking})
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    anthropic_mock.script(Reply(text="Let me check.", thinking="Call the weather tool.",
                                tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="toolu_t1")]))
    if stream:
        # The streamed thinking and its signature arrive as content_blocks deltas.
        chunks = list(client.chat.completions.create(messages=messages, stream=True, **ask))
        deltas = [b["delta"] for c in chunks if c.choices for b in (c.choices[0].delta.model_extra or {}).get(
            "content_blocks") or []]
        blocks = [{"type": "thinking", "thinking": "".join(d.get("thinking", "") for d in deltas),
                   "signature": "".join(d.get("signature", "") for d in deltas)}]
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assistant = {"role": "assistant", "content": "Let me check.", "content_blocks": blocks, "tool_calls": [
            {"id": calls[0].id, "type": "function",
             "function": {"name": "get_weather", "arguments": "".join(tc.function.arguments for tc in calls)}}]}
    else:
        assistant = client.chat.completions.create(messages=messages, **ask).choices[0].message.model_dump(
            exclude_none=True)
    tool_result = {"role": "tool", "tool_call_id": "toolu_t1", "content": "18°C and sunny"}

    anthropic_mock.script(Reply(text="It is sunny."))
    reply = client.chat.completions.create(messages=[*messages, assistant, tool_result], **ask)
    assert reply.choices[0].message.content == "It is sunny."
    turn = anthropic_mock.last.json["messages"][1]
    assert [b["type"] for b in turn["content"]] == ["thinking", "text", "tool_use"]
    assert turn["content"][0]["thinking"] == "Call the weather tool."

    # Without its thinking the same turn is Anthropic's 400, passed on as it is.
    assistant.pop("content_blocks")
    with pytest.raises(openai.BadRequestError, match="must start with a thinking block"):
        client.chat.completions.create(messages=[*messages, assistant, tool_result], **ask)


def test_stream_translation_http(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="Un deux trois quatre.", usage=(9, 5)))
    res = stream_chat(gateway, ANTHROPIC, chat_body(model=MODEL))
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.headers.get("x-gateway-provider") == "anthropic"
    assert res.done, "stream did not end with data: [DONE]"
    assert all(ev is None for ev, _ in res.events), "Anthropic `event:` lines leaked into the OpenAI stream"
    assert res.chunks and all(c["object"] == "chat.completion.chunk" for c in res.chunks)
    assert res.content == "Un deux trois quatre."
    assert res.finish_reason == "stop"
    assert anthropic_mock.last.json["stream"] is True


@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_usage_chunk_with_include_usage(gateway, anthropic_mock, include_usage):
    anthropic_mock.script(Reply(text="Un deux.", usage=(9, 5)))
    res = stream_chat(gateway, ANTHROPIC, chat_body(model=MODEL, stream_options={"include_usage": include_usage}))
    assert res.done and res.content == "Un deux." and res.finish_reason == "stop"
    assert "stream_options" not in anthropic_mock.last.json
    with_usage = [c for c in res.chunks if c.get("usage")]
    if include_usage:
        # OpenAI's shape: one last chunk before [DONE], no choices, the whole usage.
        assert with_usage == [res.chunks[-1]], f"usage must come once, in the last chunk: {res.chunks}"
        assert res.chunks[-1]["choices"] == []
        assert res.usage == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
    else:
        assert with_usage == [], f"usage chunk without stream_options.include_usage: {with_usage}"


def test_stream_tool_calls_via_sdk(gateway, anthropic_mock):
    anthropic_mock.script(Reply(text="Checking.", tool_calls=[
        ToolCall("get_weather", {"city": "Paris", "days": 3}, id="toolu_s1"),
        ToolCall("get_time", {"tz": "Europe/Paris"}, id="toolu_s2")]))
    client = gateway.sdk(ANTHROPIC)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                            tools=[WEATHER_TOOL], stream=True)
    res = sdk_stream(stream)
    assert res.content == "Checking."
    assert res.finish_reason == "tool_calls"
    assert sorted(res.tool_calls) == [0, 1]
    assert [(c["id"], c["name"]) for _, c in sorted(res.tool_calls.items())] == [
        ("toolu_s1", "get_weather"), ("toolu_s2", "get_time")]
    assert json.loads(res.tool_calls[0]["arguments"]) == {"city": "Paris", "days": 3}
    assert json.loads(res.tool_calls[1]["arguments"]) == {"tz": "Europe/Paris"}


def test_sdk_non_stream_and_stream(gateway, anthropic_mock):
    client = gateway.sdk(ANTHROPIC)
    anthropic_mock.script(Reply(text="Hello, SDK.", usage=(8, 3)))
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be nice."},
                                                                 {"role": "user", "content": "Hi"}])
    assert out.choices[0].message.content == "Hello, SDK."
    assert out.choices[0].finish_reason == "stop"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (8, 3, 11)
    rec = anthropic_mock.last
    assert text_of(rec.json["system"]) == "Be nice."
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY)

    anthropic_mock.script(Reply(text="Hello again, streamed SDK."))
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True)
    res = sdk_stream(stream)
    assert res.content == "Hello again, streamed SDK."
    assert res.finish_reason == "stop"


@pytest.mark.parametrize("status, err_type, exc", [
    (400, "invalid_request_error", openai.BadRequestError),
    (429, "rate_limit_error", openai.RateLimitError),
    (500, "api_error", openai.InternalServerError),
])
def test_provider_errors_reshaped(gateway, anthropic_mock, status, err_type, exc):
    message = f"mock {err_type} happened"
    anthropic_mock.script(AnthropicMock.error(status, err_type, message))
    r = gateway.chat(ANTHROPIC, chat_body(model=MODEL))
    err = assert_error(r, status, type=err_type, contains=message)
    assert r.json().keys() == {"error"}, r.json()

    anthropic_mock.script(AnthropicMock.error(status, err_type, message))
    with pytest.raises(exc) as ei:
        gateway.sdk(ANTHROPIC).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert ei.value.status_code == status
    assert message in ei.value.message
    assert err["message"]
    assert len(anthropic_mock.requests) == 2

