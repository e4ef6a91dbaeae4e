"""Cloud C: Bedrock's Converse API through real Envoy, reached through a custom host on loopback;
the mock checks every SigV4 signature with botocore as AWS does (the request as received: host
with its port, the path encoded once more, the body's hash, the session token), then speaks
Converse and its binary event streams."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest

from helpers import (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_TEMP_ACCESS_KEY_ID,
                     AWS_TEMP_SECRET_ACCESS_KEY, CHAT, KEY, SDK_DUMMY_KEY, assert_chat_completion,
                     assert_clean_upstream, assert_error, assert_no_secrets_in_log, chat_body, config, read_stream,
                     sdk_stream, served_by)
from mocks import Reply, ToolCall
from mocks_cloud import CloudReply
from support import BEDROCK_MODEL as MODEL, BEDROCK_MODEL_PATH as ENCODED, bedrock_config, signed_by

TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def test_sdk_chat_is_signed_and_translated(gateway, bedrock_mock):
    bedrock_mock.script(Reply(text="Bonjour", usage=(9, 2)), model=MODEL)
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=50, temperature=0.2)
    served_by(raw, "bedrock")
    answer = raw.parse().model_dump()
    assert_chat_completion(answer, content="Bonjour", finish_reason="stop", model=MODEL)
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (9, 2)
    assert bedrock_mock.signatures == ["ok"]
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/converse"
    assert rec.json["system"] == [{"text": "Be brief."}]
    assert rec.json["inferenceConfig"] == {"maxTokens": 50, "temperature": 0.2}
    assert "model" not in rec.json
    # The SDK's Authorization (the dummy key) is replaced by the signature, never forwarded.
    assert signed_by(rec) == AWS_ACCESS_KEY_ID
    assert rec.header("host") == f"127.0.0.1:{bedrock_mock.port}"
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY, AWS_SECRET_ACCESS_KEY)
    assert_no_secrets_in_log(gateway)


def test_streaming_with_tools_and_usage(gateway, bedrock_mock):
    bedrock_mock.script(Reply(text="Looking it up", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="tu_1")],
                              usage=(7, 3)), model=MODEL)
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                            tools=[TOOL], stream=True, stream_options={"include_usage": True})
    result = sdk_stream(stream)
    assert (result.content, result.finish_reason) == ("Looking it up", "tool_calls")
    call = result.tool_calls[0]
    assert (call["id"], call["name"], json.loads(call["arguments"])) == ("tu_1", "weather", {"city": "Paris"})
    assert (result.usage["prompt_tokens"], result.usage["completion_tokens"]) == (7, 3)
    rec = bedrock_mock.last
    assert rec.path == f"{ENCODED}/converse-stream"
    assert rec.json["toolConfig"]["tools"][0]["toolSpec"]["name"] == "weather"
    assert bedrock_mock.signatures == ["ok"]

    # The tool's result goes back as a toolResult after the assistant's toolUse.
    bedrock_mock.script(Reply(text="Sunny in Paris."), model=MODEL)
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "tu_1", "type": "function",
                                 "function": {"name": "weather", "arguments": call["arguments"]}}]},
                {"role": "tool", "tool_call_id": "tu_1", "content": "sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL], tool_choice="required")
    assert answer.choices[0].message.content == "Sunny in Paris."
    turns = bedrock_mock.last.json["messages"]
    assert turns[1] == {"role": "assistant",
                        "content": [{"toolUse": {"toolUseId": "tu_1", "name": "weather", "input": {"city": "Paris"}}}]}
    assert turns[2] == {"role": "user",
                        "content": [{"toolResult": {"toolUseId": "tu_1", "content": [{"text": "sunny"}]}}]}
    assert bedrock_mock.last.json["toolConfig"]["toolChoice"] == {"any": {}}


def test_a_non_streamed_tool_call(gateway, bedrock_mock):
    bedrock_mock.script(Reply(tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="tu_9")], usage=(5, 4)))
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Lyon?"}],
                                            tools=[TOOL])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("tu_9", "weather", {"city": "Lyon"})


def test_a_bedrock_error_keeps_its_status_and_type(gateway, bedrock_mock):
    bedrock_mock.script(bedrock_mock.error(400, "ValidationException", "The provided model identifier is invalid."))
    r = gateway.chat(config(bedrock_config(bedrock_mock)), chat_body("Hi", model="no-such-model"))
    assert_error(r, 400, type="ValidationException", contains="model identifier is invalid")
    served_by(r, "bedrock")
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    bedrock_mock.script(bedrock_mock.error(429, "ThrottlingException", "Too many requests, please wait."))
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["type"] == "ThrottlingException"


def test_a_signature_for_another_region_is_refused_by_aws(gateway, bedrock_mock):
    # The mock serves us-east-1 only: AWS's own refusal comes back with its status and type.
    r = gateway.chat(config(bedrock_config(bedrock_mock, cloud_c_region="eu-west-3")), chat_body("Hi", model=MODEL))
    assert_error(r, 403, type="InvalidSignatureException", contains="region")
    assert bedrock_mock.signatures == ["InvalidSignatureException"]


def test_an_exception_frame_mid_stream_ends_it_without_done(gateway, bedrock_mock):
    bedrock_mock.script(CloudReply(text="one two three", exception=("throttlingException", "Too many tokens.")))
    body = {**chat_body("Hi", model=MODEL), "stream": True}
    with gateway.stream("POST", CHAT, headers=config(bedrock_config(bedrock_mock)), json=body,
                        timeout=httpx.Timeout(30.0)) as resp:
        assert resp.status_code == 200
        result = read_stream(resp)
    assert not result.done, "a stream that failed must not end with [DONE]"
    error = json.loads(result.events[-1][1])["error"]
    assert (error["type"], error["message"]) == ("throttlingException", "Too many tokens.")
    # The SDK raises on the error event.
    bedrock_mock.script(CloudReply(text="one two three", exception=("throttlingException", "Too many tokens.")))
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    with pytest.raises(openai.APIError, match="Too many tokens"):
        sdk_stream(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                  stream=True))


def test_frames_split_into_one_byte_writes(gateway, bedrock_mock):
    bedrock_mock.script(CloudReply(text="split into many tiny writes",
                                   tool_calls=[ToolCall("weather", {"city": "Nice"}, id="tu_2")], write_size=1))
    client = gateway.sdk(config(bedrock_config(bedrock_mock)), api_key=SDK_DUMMY_KEY)
    result = sdk_stream(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                       tools=[TOOL], stream=True))
    assert result.content == "split into many tiny writes"
    assert json.loads(result.tool_calls[0]["arguments"]) == {"city": "Nice"}
    assert result.finish_reason == "tool_calls"


def test_temporary_keys_in_the_headers_of_spec_5_3(gateway, bedrock_mock):
    headers = {"x-gateway-provider": "bedrock", "x-gateway-custom-host": bedrock_mock.base_url,
               "x-gateway-cloud-c-region": "us-east-1",
               "x-gateway-cloud-c-access-key-id": AWS_TEMP_ACCESS_KEY_ID,
               "x-gateway-cloud-c-secret-access-key": AWS_TEMP_SECRET_ACCESS_KEY,
               "x-gateway-cloud-c-session-token": AWS_SESSION_TOKEN,
               "Authorization": f"Bearer {SDK_DUMMY_KEY}"}
    r = gateway.chat(headers, chat_body("Hi", model=MODEL))
    assert r.status_code == 200, r.text
    rec = bedrock_mock.last
    assert signed_by(rec) == AWS_TEMP_ACCESS_KEY_ID
    assert rec.header("x-amz-security-token") == AWS_SESSION_TOKEN
    assert bedrock_mock.signatures == ["ok"]
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY, AWS_TEMP_SECRET_ACCESS_KEY)
    assert_no_secrets_in_log(gateway)


def test_the_configs_keys_win_over_the_headers(gateway, bedrock_mock):
    headers = {**config(bedrock_config(bedrock_mock)),
               "x-gateway-cloud-c-access-key-id": "AKIAWRONGWRONGWRONG0",
               "x-gateway-cloud-c-secret-access-key": "not-the-secret"}
    r = gateway.chat(headers, chat_body("Hi", model=MODEL))
    assert r.status_code == 200, r.text
    assert signed_by(bedrock_mock.last) == AWS_ACCESS_KEY_ID


def test_missing_keys_or_region_are_refused_before_any_call(gateway, bedrock_mock):
    cfg = bedrock_config(bedrock_mock)
    del cfg["cloud_c_secret_access_key"]
    r = gateway.chat(config(cfg), chat_body("Hi", model=MODEL))
    err = assert_error(r, 401, code="missing_provider_key", contains="cloud_c_secret_access_key")
    assert AWS_ACCESS_KEY_ID not in err["message"]
    cfg = bedrock_config(bedrock_mock)
    del cfg["custom_host"], cfg["cloud_c_region"]
    assert_error(gateway.chat(config(cfg), chat_body("Hi", model=MODEL)), 400, param="cloud_c_region")
    r = gateway.post("/v1/embeddings", {"model": MODEL, "input": "x"}, headers=config(bedrock_config(bedrock_mock)))
    assert_error(r, 400, code="unsupported_endpoint")
    assert bedrock_mock.requests == []


def test_a_custom_host_without_a_region_signs_for_us_east_1(gateway, bedrock_mock):
    cfg = bedrock_config(bedrock_mock)
    del cfg["cloud_c_region"]
    r = gateway.chat(config(cfg), chat_body("Hi", model=MODEL))
    assert r.status_code == 200, r.text
    assert "/us-east-1/bedrock/aws4_request" in bedrock_mock.last.header("authorization")
