"""Anthropic's Messages API to Claude on the clouds, natively, with the anthropic SDK: Bedrock's
`InvokeModel` (signed with SigV4, which the mock checks with botocore), its response stream
(AWS event-stream frames the gateway turns into Anthropic's server-sent events) and
`CountTokens`; Claude on Vertex and Anthropic itself counting tokens. The mocks refuse a request
whose thinking signatures, tool ids or Bedrock's body rules were not kept."""

from __future__ import annotations

import base64
import json

import anthropic
import pytest

from helpers import (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, BEDROCK_API_KEY, KEY, SDK_DUMMY_KEY,
                     VERTEX_CLIENT_TOKEN, assert_clean_upstream, assert_no_secrets_in_log, config, served_by)
from mocks import AnthropicMock, Reply, ToolCall
from mocks_cloud import BedrockMock, CloudReply
from support import BEDROCK_MODEL as MODEL, BEDROCK_MODEL_PATH as ENCODED, CLAUDE, READ_TOOL, anthropic_sdk
from support import bedrock_config, native, signed_by

THOUGHT = "The user wants the file."


def bedrock(gateway, bedrock_mock) -> anthropic.Anthropic:
    """The SDK pointed at the gateway, whose config targets Bedrock (the SDK's key stays unused)."""
    return anthropic_sdk(gateway, config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)


def tool_turns() -> list[dict]:
    """A conversation that called a tool after thinking: its signature and ids must come back."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": AnthropicMock.sign_thinking(THOUGHT)},
            {"type": "tool_use", "id": "toolu_01abc", "name": "read_file", "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01abc", "content": "hello"}]},
    ]


# --------------------------------------------------------------------------- Bedrock


def test_claude_on_bedrock_gets_the_messages_request_as_sent(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    bedrock_mock.script(Reply(text="The file says hello.", usage=(21, 4)), model=MODEL)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=2048, messages=tool_turns(), tools=[READ_TOOL], system=system,
        thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"top_k": 5},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"})
    served_by(raw.http_response, "bedrock")
    message = raw.parse()
    assert (message.content[0].text, message.stop_reason) == ("The file says hello.", "end_turn")
    assert (message.usage.input_tokens, message.usage.output_tokens) == (21, 4)
    assert bedrock_mock.signatures == ["ok"]
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/invoke"
    # Nothing lost; only Bedrock's differences: no model, the version and the betas in the body.
    assert rec.json == {
        "max_tokens": 2048, "messages": tool_turns(), "tools": [READ_TOOL], "system": system,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "top_k": 5,
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
    }
    assert signed_by(rec) == AWS_ACCESS_KEY_ID
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY, AWS_SECRET_ACCESS_KEY)
    assert_no_secrets_in_log(gateway)


def test_a_bedrock_stream_is_anthropics_event_sequence_and_its_turn_goes_back_whole(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    # Written 3 bytes at a time: frames arrive cut anywhere.
    bedrock_mock.script(CloudReply(text="Hello there friend", thinking="Let me think.", usage=(9, 5), write_size=3,
                                   tool_calls=[ToolCall("read_file", {"path": "b.txt"}, id="toolu_02")]), model=MODEL)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    question = {"role": "user", "content": "What is in b.txt?"}
    with client.messages.stream(model=MODEL, max_tokens=2048, messages=[question], thinking=thinking,
                                tools=[READ_TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        assert stream.response.headers["content-type"].startswith("text/event-stream")
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].signature == AnthropicMock.sign_thinking("Let me think.")
    assert final.content[1].text == "Hello there friend"
    assert (final.content[2].id, final.content[2].input) == ("toolu_02", {"path": "b.txt"})
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("tool_use", 9, 5)
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/invoke-with-response-stream"
    assert "stream" not in rec.json and "model" not in rec.json
    assert bedrock_mock.signatures == ["ok"]

    # The turn goes back as the stream gave it: the mock checks the thinking's signature, and
    # that the tool's result answers a thinking turn.
    bedrock_mock.script(Reply(text="It says hi."), model=MODEL)
    turn = {"role": "assistant", "content": [block.to_dict() for block in final.content]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_02", "content": "hi"}]}
    message = client.messages.create(model=MODEL, max_tokens=2048, thinking=thinking, tools=[READ_TOOL],
                                     messages=[question, turn, result])
    assert message.content[0].text == "It says hi."
    assert bedrock_mock.last.json["messages"][1] == turn


def test_a_bedrock_stream_exception_is_an_anthropic_error_event(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    bedrock_mock.script(CloudReply(text="one two three", exception=("throttlingException", "slow down")),
                        model=MODEL)
    with pytest.raises(anthropic.APIStatusError) as raised:
        with client.messages.stream(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Count"}]) as s:
            s.until_done()
    assert raised.value.body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}


def test_bedrock_errors_take_anthropics_shape(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    bedrock_mock.script(BedrockMock.error(429, "ThrottlingException", "Too many requests, please wait."), model=MODEL)
    with pytest.raises(anthropic.RateLimitError) as raised:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body == {"type": "error",
                                 "error": {"type": "rate_limit_error", "message": "Too many requests, please wait."}}
    served_by(raised.value.response, "bedrock")

    # Bedrock's own check of the body: a thinking block whose signature is not its text's.
    turns = tool_turns()
    turns[1]["content"][0]["signature"] = "EqMBforged"
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=MODEL, max_tokens=2048, messages=turns, tools=[READ_TOOL],
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert "Invalid `signature`" in raised.value.body["error"]["message"]
    assert raised.value.body["error"]["type"] == "invalid_request_error"


def test_bedrock_counts_the_invoke_body(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    bedrock_mock.script(Reply(usage=(57, 0)), model=MODEL)
    thinking = {"type": "enabled", "budget_tokens": 2048}
    count = client.messages.count_tokens(model=MODEL, system="Be brief.", tools=[READ_TOOL], messages=tool_turns(),
                                         thinking=thinking, extra_headers={"anthropic-beta": "context-1m-2025-08-07"})
    assert count.input_tokens == 57
    assert bedrock_mock.signatures == ["ok"]
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/count-tokens"
    counted = json.loads(base64.b64decode(rec.json["input"]["invokeModel"]["body"]))
    # InvokeModel wants max_tokens: the least it takes above the thinking budget stands in.
    assert counted == {"system": "Be brief.", "tools": [READ_TOOL], "messages": tool_turns(), "thinking": thinking,
                       "anthropic_version": "bedrock-2023-05-31", "anthropic_beta": ["context-1m-2025-08-07"],
                       "max_tokens": 2049}


def test_override_params_apply_to_the_invoke_request(gateway, bedrock_mock):
    cfg = bedrock_config(bedrock_mock, override_params={"model": MODEL, "temperature": 0.5})
    client = anthropic_sdk(gateway, config(cfg), api_key=SDK_DUMMY_KEY)
    bedrock_mock.script(Reply(text="Overridden"), model=MODEL)
    message = client.messages.create(model="claude-by-another-name", max_tokens=20,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text == "Overridden"
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/invoke"
    assert rec.json["temperature"] == 0.5 and "model" not in rec.json


def test_other_bedrock_models_are_translated_through_converse(gateway, bedrock_mock):
    client = bedrock(gateway, bedrock_mock)
    nova = "amazon.nova-lite-v1:0"
    bedrock_mock.script(Reply(text="Nova here", usage=(5, 2)), model=nova)
    message = client.messages.create(model=nova, max_tokens=20, messages=[{"role": "user", "content": "Hi"}])
    assert (message.type, message.content[0].text) == ("message", "Nova here")
    assert bedrock_mock.last.path == "/model/amazon.nova-lite-v1%3A0/converse"
    before = len(bedrock_mock.requests)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.count_tokens(model=nova, messages=[{"role": "user", "content": "Hi"}])
    assert "cannot count tokens" in raised.value.body["error"]["message"]
    assert len(bedrock_mock.requests) == before


def test_the_bedrock_mock_serves_anthropics_own_bedrock_client(bedrock_mock):
    """The mock's InvokeModel is the one Anthropic's Bedrock client speaks: its body passes the
    mock's rules, and the client's own event-stream decoder (botocore's) reads the mock's frames.
    (The pinned client puts its own API version in the body; AWS documents Bedrock's.)"""
    client = anthropic.AnthropicBedrock(api_key=BEDROCK_API_KEY, aws_region="us-east-1", base_url=bedrock_mock.base_url,
                                        max_retries=0)
    version = {"anthropic_version": "bedrock-2023-05-31"}
    bedrock_mock.script(Reply(text="Direct answer", usage=(4, 2)), model=MODEL)
    message = client.messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Hi"}],
                                     extra_headers={"anthropic-beta": "context-1m-2025-08-07"}, extra_body=version)
    assert (message.content[0].text, message.usage.output_tokens) == ("Direct answer", 2)
    assert bedrock_mock.last.json["anthropic_beta"] == ["context-1m-2025-08-07"]
    bedrock_mock.script(Reply(text="a b c", tool_calls=[ToolCall("read_file", {"path": "c"}, id="toolu_3")]),
                        model=MODEL)
    with client.messages.stream(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Hi"}],
                                tools=[READ_TOOL], extra_body=version) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text", "tool_use"] and final.content[1].id == "toolu_3"
    assert bedrock_mock.last.path == f"/model/{MODEL}/invoke-with-response-stream"


# --------------------------------------------------------------------------- Vertex, Anthropic


def test_claude_on_vertex_counts_tokens(gateway, vertex_mock):
    cfg = {"provider": "vertex-ai", "custom_host": vertex_mock.base_url, "cloud_b_project_id": "proj-c",
           "cloud_b_region": "us-east5", "api_key": VERTEX_CLIENT_TOKEN}
    client = anthropic_sdk(gateway, config(cfg), api_key=SDK_DUMMY_KEY)
    vertex_mock.script(Reply(usage=(33, 0)))
    model = "claude-sonnet-4-5@20250929"
    count = client.messages.count_tokens(model=model, system="Be brief.", messages=tool_turns(), tools=[READ_TOOL])
    assert count.input_tokens == 33
    rec = vertex_mock.last
    assert rec.path == "/v1/projects/proj-c/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
    assert rec.json == {"model": model, "system": "Be brief.", "messages": tool_turns(), "tools": [READ_TOOL],
                        "anthropic_version": "vertex-2023-10-16"}
    assert rec.header("authorization") == f"Bearer {VERTEX_CLIENT_TOKEN}"


def test_anthropic_counts_the_request_as_sent(gateway, anthropic_mock):
    client = anthropic_sdk(gateway, native(anthropic_mock))
    count = client.messages.count_tokens(model=CLAUDE, messages=tool_turns(), tools=[READ_TOOL],
                                         extra_headers={"anthropic-beta": "token-counting-2024-11-01"})
    rec = anthropic_mock.last
    assert count.input_tokens == AnthropicMock.count_tokens(rec.json)
    assert rec.path == "/v1/messages/count_tokens"
    assert rec.json == {"model": CLAUDE, "messages": tool_turns(), "tools": [READ_TOOL]}
    assert rec.header("anthropic-beta") == "token-counting-2024-11-01"
    assert rec.header("x-api-key") == "sk-ant-client"



def test_gemini_counts_a_messages_request(gateway, vertex_mock):
    # The Gemini API counts with `countTokens`: the Messages request goes as the generateContent
    # request it would make (system and tools included), the count comes back in Anthropic's shape.
    from helpers import GEMINI_API_KEY, VERTEX_CLIENT_TOKEN
    gemini = {"x-gateway-provider": "google", "x-gateway-custom-host": vertex_mock.base_url}
    client = anthropic_sdk(gateway, gemini, api_key=GEMINI_API_KEY)
    vertex_mock.script(Reply(usage=(42, 0)), model="gemini-2.5-flash")
    count = client.messages.count_tokens(model="gemini-2.5-flash", system="Be brief.", tools=[READ_TOOL],
                                         messages=[{"role": "user", "content": "Count me"}])
    assert count.input_tokens == 42
    rec = vertex_mock.last
    assert rec.path == "/v1beta/models/gemini-2.5-flash:countTokens"
    counted = rec.json["generateContentRequest"]
    assert counted["model"] == "models/gemini-2.5-flash"
    assert counted["systemInstruction"]["parts"][0]["text"] == "Be brief."
    assert counted["tools"][0]["functionDeclarations"][0]["name"] == "read_file"
    assert rec.header("x-goog-api-key") == GEMINI_API_KEY
    # Gemini on Vertex counts the same way, its fields at the top level.
    vertex = {"x-gateway-provider": "vertex-ai", "x-gateway-custom-host": vertex_mock.base_url,
              "x-gateway-cloud-b-project-id": "proj-c", "x-gateway-cloud-b-region": "us-central1"}
    client = anthropic_sdk(gateway, vertex, api_key=VERTEX_CLIENT_TOKEN)
    vertex_mock.script(Reply(usage=(7, 0)), model="gemini-2.5-flash")
    assert client.messages.count_tokens(model="gemini-2.5-flash",
                                        messages=[{"role": "user", "content": "Hi"}]).input_tokens == 7
    assert vertex_mock.last.path.endswith("/publishers/google/models/gemini-2.5-flash:countTokens")
    assert vertex_mock.last.json["contents"][0]["parts"][0]["text"] == "Hi"
