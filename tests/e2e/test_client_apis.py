"""The client APIs besides chat: Anthropic's Messages (`/v1/messages`) and OpenAI's Responses
(`/v1/responses`), through the gateway with the official SDKs, to a target that speaks the
client's API (native: the request goes as sent) and to one that does not (translated)."""

from __future__ import annotations

import json
import uuid

import anthropic
import openai
import pytest

from helpers import (ANTHROPIC_SLUG_KEY, CLIENT_TOKEN, KEY, assert_clean_upstream, config, provider_config, served_by,
                     slug, workspace_key)
from mocks import AnthropicMock, Reply, ToolCall
from support import CLAUDE, READ_TOOL, anthropic_sdk, native

GPT = "gpt-mock"


def sdk_version(client: anthropic.Anthropic) -> str:
    return client.default_headers["anthropic-version"]


def translating(openai_mock) -> dict:
    """OpenAI's chat API: Messages requests are translated."""
    return {"x-gateway-provider": "openai", "x-gateway-custom-host": openai_mock.base_url}


# --------------------------------------------------------------------------- Messages, native


def test_messages_native_goes_upstream_as_sent(gateway, anthropic_mock):
    client = anthropic_sdk(gateway, native(anthropic_mock))
    thinking = "The user wants the file."
    signature = AnthropicMock.sign_thinking(thinking)
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": thinking, "signature": signature},
            {"type": "tool_use", "id": "toolu_01abc", "name": "read_file", "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01abc", "content": "hello"}]},
    ]
    anthropic_mock.script(text="The file says hello.")
    message = client.messages.create(
        model=CLAUDE, max_tokens=2048, messages=messages, tools=[READ_TOOL], extra_body={"top_k": 5},
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
        extra_query={"beta": "true"})
    assert message.content[0].text == "The file says hello."
    assert (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens) == ("end_turn", 11, 7)
    rec = anthropic_mock.last
    # Nothing lost: thinking and its signature, cache_control, tool ids, top_k, the beta header.
    sent = rec.json
    assert sent["messages"] == messages and sent["top_k"] == 5 and sent["thinking"]["budget_tokens"] == 1024
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert rec.header("anthropic-beta") == "interleaved-thinking-2025-05-14"
    # The client's API version goes as it sent it.
    assert rec.header("anthropic-version") == sdk_version(client)
    assert rec.header("x-api-key") == "sk-ant-client"
    assert rec.path == "/v1/messages" and rec.qs("beta") == "true"
    assert_clean_upstream(rec, KEY)


def test_messages_native_stream_comes_back_as_sent(gateway, anthropic_mock):
    client = anthropic_sdk(gateway, slug("anthropic-mock"), api_key="unused")
    anthropic_mock.script(text="Hello there friend", thinking="Let me think.",
                          tool_calls=[ToolCall("read_file", {"path": "b.txt"}, id="toolu_02")])
    with client.messages.stream(model=CLAUDE, max_tokens=2048, messages=[{"role": "user", "content": "Hi"}],
                                thinking={"type": "enabled", "budget_tokens": 1024}, tools=[READ_TOOL]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there friend"
    kinds = [block.type for block in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[0].signature == AnthropicMock.sign_thinking("Let me think.")
    assert (final.content[2].id, final.content[2].input) == ("toolu_02", {"path": "b.txt"})
    assert final.stop_reason == "tool_use"
    # The managed credential went upstream, not the SDK's key.
    assert anthropic_mock.last.header("x-api-key") == ANTHROPIC_SLUG_KEY


def test_messages_native_errors_are_anthropics(gateway, anthropic_mock):
    client = anthropic_sdk(gateway, native(anthropic_mock))
    anthropic_mock.script(AnthropicMock.error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.status_code == 529
    assert raised.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    served_by(raised.value.response, "anthropic")


# --------------------------------------------------------------------------- Messages, translated


def test_messages_translated_to_chat_and_back(gateway, openai_mock):
    client = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN)
    openai_mock.script(tool_calls=[ToolCall("read_file", {"path": "a.txt"}, id="call_77")])
    message = client.messages.create(
        model=GPT, max_tokens=300, system="Be brief.", tools=[READ_TOOL],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Read a.txt",
                                                "cache_control": {"type": "ephemeral"}}]}],
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"})
    assert message.type == "message" and message.stop_reason == "tool_use"
    tool = [b for b in message.content if b.type == "tool_use"][0]
    assert (tool.id, tool.name, tool.input) == ("call_77", "read_file", {"path": "a.txt"})
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 7)
    rec = openai_mock.last
    assert rec.path == "/v1/chat/completions"
    assert rec.header("authorization") == f"Bearer {CLIENT_TOKEN}"
    assert rec.json["messages"][0] == {"role": "system", "content": "Be brief."}
    assert rec.json["tools"][0]["function"]["name"] == "read_file"
    # Anthropic's own headers and the client's x-api-key stay at the gateway.
    assert rec.header("anthropic-beta") is None and rec.header("anthropic-version") is None
    assert rec.header("x-api-key") is None
    served_by(client.messages.with_raw_response.create(
        model=GPT, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]).http_response, "openai")

    # The tool's result goes back with the same id.
    openai_mock.script(text="It says hello.")
    message = client.messages.create(model=GPT, max_tokens=300, tools=[READ_TOOL], messages=[
        {"role": "user", "content": "Read a.txt"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_77", "name": "read_file",
                                           "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_77", "content": "hello"}]},
    ])
    assert message.content[0].text == "It says hello."
    sent = openai_mock.last.json["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_77" and sent[2] == {
        "role": "tool", "tool_call_id": "call_77", "content": "hello"}


def test_messages_translated_stream_is_anthropics_event_sequence(gateway, openai_mock):
    client = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN)
    openai_mock.script(text="one two three")
    with client.messages.stream(model=GPT, max_tokens=50, messages=[{"role": "user", "content": "Count"}]) as s:
        events = [event.type for event in s]
        final = s.get_final_message()
    assert final.content[0].text == "one two three"
    # The chat stream tells its usage only at its end: `message_start` says 0 input tokens, and
    # `message_delta` the provider's count, which the SDK's final message takes.
    assert final.stop_reason == "end_turn" and (final.usage.input_tokens, final.usage.output_tokens) == (11, 7)
    raw = [e for e in events if e not in ("text",)]
    assert raw[0] == "message_start" and raw[-1] == "message_stop"
    assert raw[1] == "content_block_start" and "content_block_delta" in raw and "message_delta" in raw
    # The gateway asked the provider for usage so the stream can report it.
    assert openai_mock.last.json["stream_options"] == {"include_usage": True}


def test_messages_translated_errors_take_anthropics_shape(gateway, openai_mock):
    client = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN)
    openai_mock.script(status=429)
    with pytest.raises(anthropic.RateLimitError) as raised:
        client.messages.create(model=GPT, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "rate_limit_error"
    assert raised.value.response.headers.get("x-gateway-trace-id")
    # The gateway's own errors too: a missing field, a missing gateway key.
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=GPT, max_tokens=0, messages=[{"role": "user", "content": "Hi"}])
    assert "max_tokens" in raised.value.body["error"]["message"]
    no_key = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN, key=None)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        no_key.messages.create(model=GPT, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["error"]["type"] == "authentication_error"
    assert "x-gateway-api-key" in raised.value.body["error"]["message"]


def test_count_tokens_needs_a_provider_that_counts(gateway, openai_mock):
    client = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.count_tokens(model=GPT, messages=[{"role": "user", "content": "Hi"}])
    assert "cannot count tokens" in raised.value.body["error"]["message"]
    assert len(openai_mock.requests) == 0


def test_one_fallback_list_mixes_native_and_translated_targets(gateway, anthropic_mock, openai_mock):
    cfg = {"strategy": {"mode": "fallback"}, "targets": [
        provider_config(anthropic_mock, provider="anthropic"),
        provider_config(openai_mock, provider="openai", override_params={"model": GPT}),
    ]}
    anthropic_mock.script(AnthropicMock.error(529, "overloaded_error", "Overloaded"))
    openai_mock.script(text="From the fallback.")
    client = anthropic_sdk(gateway, config(cfg), api_key="unused")
    raw = client.messages.with_raw_response.create(model=CLAUDE, max_tokens=20,
                                                   messages=[{"role": "user", "content": "Hi"}])
    message = raw.parse()
    assert message.content[0].text == "From the fallback."
    served_by(raw.http_response, "openai")
    assert raw.http_response.headers["x-gateway-target"] == "targets[1]"
    assert anthropic_mock.last.json["model"] == CLAUDE and openai_mock.last.json["model"] == GPT


# --------------------------------------------------------------------------- Responses, translated


def test_responses_translated_to_chat_and_back(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    anthropic_mock.script(tool_calls=[ToolCall("read_file", {"path": "a.txt"}, id="toolu_9")])
    tools = [{"type": "function", "name": "read_file", "parameters": READ_TOOL["input_schema"]},
             {"type": "web_search"}]
    response = client.responses.create(model=CLAUDE, instructions="Be brief.", input="Read a.txt", tools=tools,
                                       max_output_tokens=200)
    assert response.object == "response" and response.status == "completed"
    call = [item for item in response.output if item.type == "function_call"][0]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("toolu_9", "read_file", {"path": "a.txt"})
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)
    sent = anthropic_mock.last.json
    assert sent["system"] == "Be brief." and sent["max_tokens"] == 200
    # The hosted tool Anthropic cannot run here was dropped; the function tool kept its name.
    assert [t["name"] for t in sent["tools"]] == ["read_file"]

    anthropic_mock.script(text="It says hello.")
    response = client.responses.create(model=CLAUDE, tools=tools[:1], input=[
        {"role": "user", "content": "Read a.txt"},
        {"type": "function_call", "call_id": "toolu_9", "name": "read_file", "arguments": "{\"path\": \"a.txt\"}"},
        {"type": "function_call_output", "call_id": "toolu_9", "output": "hello"},
    ])
    assert response.output_text == "It says hello."
    turns = anthropic_mock.last.json["messages"]
    assert turns[1]["content"][0]["id"] == "toolu_9" and turns[2]["content"][0]["tool_use_id"] == "toolu_9"


def test_responses_translated_stream_is_the_numbered_event_sequence(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    anthropic_mock.script(text="alpha beta gamma")
    events = list(client.responses.create(model=CLAUDE, input="Say it", stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types and "response.output_item.done" in types
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == "alpha beta gamma"
    assert events[-1].response.usage.output_tokens == 7


def test_stored_responses_need_a_provider_that_keeps_them(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.retrieve("resp_abc")
    assert "does not keep responses" in raised.value.message
    assert len(anthropic_mock.requests) == 0


def test_previous_response_id_needs_a_provider_that_keeps_responses(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=CLAUDE, input="And then?", previous_response_id="resp_earlier")
    assert raised.value.body["param"] == "previous_response_id"
    assert "resp_earlier" in raised.value.message and "input" in raised.value.message
    assert len(anthropic_mock.requests) == 0


# --------------------------------------------------------------------------- both: gateway features


def blocks(word: str) -> dict:
    return {"default.contains": {"words": [word], "operator": "none"}, "deny": True}


def test_input_guardrails_read_a_messages_request(gateway, anthropic_mock):
    cfg = provider_config(anthropic_mock, provider="anthropic", input_guardrails=[blocks("forbidden")])
    client = anthropic_sdk(gateway, config(cfg), api_key="unused")
    with pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(model=CLAUDE, max_tokens=10,
                               messages=[{"role": "user", "content": [{"type": "text", "text": "a forbidden word"}]}])
    assert raised.value.status_code == 446
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["message"]
    assert len(anthropic_mock.requests) == 0
    anthropic_mock.script(text="fine")
    ok = client.messages.create(model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "allowed"}])
    assert ok.content[0].text == "fine"


def test_output_guardrails_hold_a_translated_responses_stream(gateway, anthropic_mock):
    cfg = provider_config(anthropic_mock, provider="anthropic", output_guardrails=[blocks("secret")])
    client = gateway.sdk(config(cfg))
    anthropic_mock.script(text="the secret plan")
    with pytest.raises(openai.APIStatusError) as raised:
        list(client.responses.create(model=CLAUDE, input="Tell me", stream=True))
    assert raised.value.status_code == 446
    anthropic_mock.script(text="a harmless plan")
    events = list(client.responses.create(model=CLAUDE, input="Tell me", stream=True))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "a harmless plan"


def test_the_access_log_names_the_client_api(gateway, openai_mock):
    client = anthropic_sdk(gateway, {**translating(openai_mock), "x-gateway-trace-id": "client-api-log-1"},
                           api_key=CLIENT_TOKEN)
    openai_mock.script(text="logged")
    client.messages.create(model=GPT, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    line = gateway.wait_for_log_line('"trace_id":"client-api-log-1"', timeout=20)  # Envoy flushes its access log
    record = json.loads(line[line.index("{"):])
    assert (record["client_api"], record["path"], record["provider"]) == ("messages", "/v1/messages", "openai")
    assert (record["prompt_tokens"], record["completion_tokens"]) == (11, 7)


# --------------------------------------------------------------------------- Responses kept by the gateway


def test_a_kept_response_continues_reads_lists_and_deletes(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    anthropic_mock.script(text="Paris.")
    first = client.responses.create(model=CLAUDE, input="Capital of France?", instructions="Be brief.")
    assert first.id.startswith("resp_gw_")
    anthropic_mock.script(text="About two million.")
    second = client.responses.create(model=CLAUDE, input="And its population?", previous_response_id=first.id)
    assert second.output_text == "About two million."
    # The provider got the whole conversation (the earlier instructions are not carried, as OpenAI does).
    sent = anthropic_mock.last.json
    assert [(m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
            for m in sent["messages"]] == [
        ("user", "Capital of France?"), ("assistant", "Paris."), ("user", "And its population?")]
    assert "system" not in sent

    assert client.responses.retrieve(second.id).output_text == "About two million."
    items = client.responses.input_items.list(second.id, order="asc")
    texts = [item.content[0].text if not isinstance(item.content, str) else item.content for item in items.data]
    assert texts == ["Capital of France?", "Paris.", "And its population?"]
    # Another workspace sees none of it.
    other = gateway.sdk(slug("anthropic-mock"), key=workspace_key(gateway))
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(second.id)
    with pytest.raises(openai.BadRequestError) as raised:
        other.responses.create(model=CLAUDE, input="more", previous_response_id=second.id)
    assert raised.value.body["param"] == "previous_response_id"
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_a_streamed_response_is_kept_and_store_false_is_not(gateway, anthropic_mock):
    client = gateway.sdk(slug("anthropic-mock"))
    anthropic_mock.script(text="streamed answer")
    events = list(client.responses.create(model=CLAUDE, input="Stream it", stream=True))
    kept_id = events[-1].response.id
    anthropic_mock.script(text="next")
    client.responses.create(model=CLAUDE, input="Go on", previous_response_id=kept_id)
    assert [m["role"] for m in anthropic_mock.last.json["messages"]] == ["user", "assistant", "user"]
    anthropic_mock.script(text="not kept")
    unkept = client.responses.create(model=CLAUDE, input="Forget it", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_the_cache_serves_each_client_api_its_own_answers(gateway, anthropic_mock):
    cfg = provider_config(anthropic_mock, provider="anthropic", cache={"mode": "simple"})
    headers = {**config(cfg), "x-gateway-cache-namespace": f"client-apis-{uuid.uuid4().hex}"}
    client = anthropic_sdk(gateway, headers, api_key="unused")
    body = {"model": CLAUDE, "max_tokens": 20, "messages": [{"role": "user", "content": "Cache me"}]}
    anthropic_mock.script(text="cached words")
    first = client.messages.with_raw_response.create(**body)
    again = client.messages.with_raw_response.create(**body)
    assert first.http_response.headers["x-gateway-cache-status"] == "MISS"
    assert again.http_response.headers["x-gateway-cache-status"] == "HIT"
    assert again.parse().content[0].text == "cached words" and len(anthropic_mock.requests) == 1
    # The same conversation through the Responses API is another entry.
    anthropic_mock.script(text="a response")
    response = gateway.sdk(headers).responses.with_raw_response.create(model=CLAUDE, input="Cache me",
                                                                      max_output_tokens=20)
    assert response.headers["x-gateway-cache-status"] == "MISS"
    assert response.parse().output_text == "a response" and len(anthropic_mock.requests) == 2


def test_a_client_api_stream_is_cached_and_replayed_as_either_shape(gateway, anthropic_mock, openai_mock):
    """A Messages stream (native) is stored as the message it streamed: the same request as JSON
    and as a stream are hits, the stream replayed as Anthropic's events (tool use and thinking
    whole); a Responses stream (translated) likewise, replayed with its sequence numbers."""
    cfg = provider_config(anthropic_mock, provider="anthropic", cache={"mode": "simple"})
    headers = {**config(cfg), "x-gateway-cache-namespace": f"client-streams-{uuid.uuid4().hex}"}
    client = anthropic_sdk(gateway, headers, api_key="unused")
    body = {"model": CLAUDE, "max_tokens": 50, "tools": [READ_TOOL],
            "messages": [{"role": "user", "content": "Read a.txt"}]}
    anthropic_mock.script(text="I'll read it.", tool_calls=[ToolCall("read_file", {"path": "a.txt"})])
    with client.messages.stream(**body) as live:
        assert live.response.headers["x-gateway-cache-status"] == "MISS"
        live.get_final_message()
    with client.messages.stream(**body) as replayed:
        assert replayed.response.headers["x-gateway-cache-status"] == "HIT"
        streamed = replayed.get_final_message()
    assert len(anthropic_mock.requests) == 1, "the second stream was a hit"
    as_json = client.messages.with_raw_response.create(**body)
    assert as_json.http_response.headers["x-gateway-cache-status"] == "HIT"
    message = as_json.parse()
    assert len(anthropic_mock.requests) == 1
    assert [b.type for b in message.content] == [b.type for b in streamed.content] == ["text", "tool_use"]
    assert message.content[1].input == streamed.content[1].input == {"path": "a.txt"}
    assert message.content[1].id == streamed.content[1].id
    assert (message.stop_reason, message.usage.output_tokens) == ("tool_use", streamed.usage.output_tokens)

    # Responses, translated from OpenAI's chat stream.
    cfg = provider_config(openai_mock, cache={"mode": "simple"})
    responses_headers = {**config(cfg), "x-gateway-cache-namespace": f"client-streams-{uuid.uuid4().hex}"}
    sdk = gateway.sdk(responses_headers)
    openai_mock.script(text="one two three")
    calls = len(openai_mock.requests)
    live = list(sdk.responses.create(model=GPT, input="Count", stream=True, store=False))
    replayed = list(sdk.responses.create(model=GPT, input="Count", stream=True, store=False))
    assert len(openai_mock.requests) == calls + 1, "the second stream was a hit"
    assert [e.sequence_number for e in replayed] == list(range(len(replayed)))
    # The same events, a part's text in one delta instead of one per chunk.
    def collapsed(events):
        types = [e.type for e in events]
        return [t for i, t in enumerate(types) if i == 0 or not (t.endswith(".delta") and types[i - 1] == t)]
    assert collapsed(replayed) == collapsed(live)
    assert replayed[-1].response.output_text == live[-1].response.output_text == "one two three"


def test_envoys_own_answers_on_messages_paths_take_anthropics_shape(gateway, anthropic_mock, openai_mock):
    # A body over the gateway's limit is answered by Envoy itself, past the filter.
    body = {"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "user", "content": "x" * (21 * 1024 * 1024)}]}
    r = gateway.post("/v1/messages", body, headers=native(anthropic_mock), timeout=60)
    assert r.status_code == 413
    assert r.json() == {"type": "error", "error": {
        "type": "request_too_large", "message": "request body is larger than the gateway's 20 MiB limit"}}
    assert len(anthropic_mock.requests) == 0
    # A provider that breaks off while the filter holds its answer (to translate it): Envoy
    # answers, and the SDK raises its typed error with the message.
    openai_mock.script(Reply(raw=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
                                 b'{"id": "chatcmpl-1", "object": "chat.com', reset=True))
    client = anthropic_sdk(gateway, translating(openai_mock), api_key=CLIENT_TOKEN)
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 502
    body = raised.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert body["error"]["message"].startswith("the provider's answer broke off before it was complete"), body
    assert raised.value.response.headers["x-gateway-provider"] == "openai"
