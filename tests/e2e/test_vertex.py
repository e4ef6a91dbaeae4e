"""Cloud B: Vertex AI (Gemini and Anthropic models) with a service account or the client's own
access token, and the Gemini API, reached through a custom host on loopback; the mocks check
the RS256 assertion (PyJWT) and every token the way Google does."""

from __future__ import annotations

import json

import openai
import pytest

from helpers import (GEMINI_API_KEY, KEY, SDK_DUMMY_KEY, VERTEX_CLIENT_TOKEN, assert_clean_upstream,
                     assert_error, assert_no_secrets_in_log, chat_body, config, sdk_stream, served_by)
from mocks import Reply, ToolCall
from mocks_cloud import CloudReply, thought_signature
from support import GEMINI as MODEL, fresh_key_file, sa_config

TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def test_service_account_exchanged_once_for_many_requests(gateway, vertex_mock, google_token_mock):
    key_file = fresh_key_file(google_token_mock, "once")
    client = gateway.sdk(config(sa_config(vertex_mock, key_file)), api_key=SDK_DUMMY_KEY)
    vertex_mock.script(Reply(text="Bonjour", usage=(5, 2)), model=MODEL, times=None)
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        served_by(raw, "vertex-ai")
        answer = raw.parse()
        assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == ("Bonjour", "stop")
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (5, 2)
    assert google_token_mock.exchanges == 1, google_token_mock.rejections
    assert len(vertex_mock.requests) == 3
    rec = vertex_mock.last
    # The project comes from the key file; the token is one the endpoint issued.
    assert rec.path == f"/v1/projects/{key_file['project_id']}/locations/us-central1/publishers/google/models/" \
                       f"{MODEL}:generateContent"
    token = rec.header("authorization").removeprefix("Bearer ")
    assert google_token_mock.valid(token)
    assert rec.json["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY)
    assert_no_secrets_in_log(gateway, google_token_mock.private_key_pem, token)


def test_a_token_is_never_used_past_its_lifetime(gateway, vertex_mock, google_token_mock):
    # A token that lives no longer than the gateway's one-minute margin is never reused: each
    # request exchanges again and sends the new token.
    google_token_mock.expires_in = 30
    cfg = config(sa_config(vertex_mock, fresh_key_file(google_token_mock, "expiry")))
    tokens = []
    for _ in range(2):
        r = gateway.chat(cfg, chat_body("Hi", model=MODEL))
        assert r.status_code == 200, r.text
        tokens.append(vertex_mock.last.header("authorization"))
    assert google_token_mock.exchanges == 2
    assert tokens[0] != tokens[1]


def test_streaming_with_usage_and_tools(gateway, vertex_mock, google_token_mock):
    client = gateway.sdk(config(sa_config(vertex_mock, fresh_key_file(google_token_mock, "stream"))),
                         api_key=SDK_DUMMY_KEY)
    vertex_mock.script(Reply(text="Looking it up", tool_calls=[ToolCall("weather", {"city": "Paris"})],
                             usage=(7, 3)), model=MODEL)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                            tools=[TOOL], stream=True, stream_options={"include_usage": True})
    result = sdk_stream(stream)
    assert result.finish_reason == "tool_calls"
    call = result.tool_calls[0]
    assert (call["name"], json.loads(call["arguments"])) == ("weather", {"city": "Paris"})
    assert result.usage["prompt_tokens"] == 7
    rec = vertex_mock.last
    assert rec.path.endswith(f"{MODEL}:streamGenerateContent") and rec.qs("alt") == "sse"
    assert rec.json["tools"][0]["functionDeclarations"][0]["name"] == "weather"

    # The tool's result goes back as a functionResponse named through tool_call_id.
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call["id"], "type": "function",
                                 "function": {"name": "weather", "arguments": call["arguments"]}}]},
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL])
    turns = vertex_mock.last.json["contents"]
    assert turns[1] == {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Paris"}}}]}
    assert turns[2]["parts"][0]["functionResponse"] == {"name": "weather", "response": {"content": "sunny"}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_thinking_models_thought_signature_comes_back_with_its_call(gateway, vertex_mock, google_token_mock,
                                                                      stream):
    # Gemini 3 refuses a function call of the current turn sent back without the signature it
    # was given; the client returns the tool call as it got it (`extra_content` included).
    model = "gemini-3-pro-preview"
    client = gateway.sdk(config(sa_config(vertex_mock, fresh_key_file(google_token_mock, f"sig-{stream}"))),
                         api_key=SDK_DUMMY_KEY)
    vertex_mock.script(Reply(thinking="Use the tool.", tool_calls=[ToolCall("weather", {"city": "Paris"})], text=""),
                       model=model)
    ask = [{"role": "user", "content": "Weather?"}]
    if stream:
        calls = [tc for chunk in client.chat.completions.create(model=model, messages=ask, tools=[TOOL], stream=True)
                 if chunk.choices for tc in chunk.choices[0].delta.tool_calls or []]
        call = calls[0].model_dump(exclude_none=True)
        call.pop("index")
    else:
        message = client.chat.completions.create(model=model, messages=ask, tools=[TOOL]).choices[0].message
        call = message.tool_calls[0].model_dump(exclude_none=True)
    signature = call["extra_content"]["google"]["thought_signature"]
    assert signature == thought_signature({"name": "weather", "args": {"city": "Paris"}})
    messages = [*ask, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    vertex_mock.script(Reply(text="Sunny."), model=model)
    reply = client.chat.completions.create(model=model, messages=messages, tools=[TOOL])
    assert reply.choices[0].message.content == "Sunny."
    assert vertex_mock.last.json["contents"][1]["parts"] == [
        {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": signature}]

    # Without it, Gemini's 400 comes back as it is.
    del messages[1]["tool_calls"][0]["extra_content"]
    with pytest.raises(openai.BadRequestError, match="missing a thought_signature"):
        client.chat.completions.create(model=model, messages=messages, tools=[TOOL])


def test_the_clients_own_access_token_with_the_headers_of_spec_5_3(gateway, vertex_mock, google_token_mock):
    headers = {"x-gateway-provider": "vertex-ai", "x-gateway-custom-host": vertex_mock.base_url,
               "x-gateway-cloud-b-project-id": "proj-h", "x-gateway-cloud-b-region": "europe-west4",
               "Authorization": f"Bearer {VERTEX_CLIENT_TOKEN}", "X-Cloud-B-LLM-Request-Type": "shared"}
    r = gateway.chat(headers, chat_body("Hi", model=MODEL))
    assert r.status_code == 200, r.text
    rec = vertex_mock.last
    assert rec.path.startswith("/v1/projects/proj-h/locations/europe-west4/")
    assert rec.header("authorization") == f"Bearer {VERTEX_CLIENT_TOKEN}"
    assert rec.header("x-vertex-ai-llm-request-type") == "shared"
    assert google_token_mock.exchanges == 0


def test_anthropic_models_on_vertex(gateway, vertex_mock, google_token_mock):
    model = "claude-sonnet-4-5@20250929"
    vertex_mock.script(Reply(text="Hi from Claude", usage=(4, 2)), model=model)
    cfg = sa_config(vertex_mock, fresh_key_file(google_token_mock, "claude"))
    r = gateway.chat(config(cfg), chat_body("Hi", model=model, max_tokens=64))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hi from Claude"
    rec = vertex_mock.last
    assert rec.path.endswith(f"/publishers/anthropic/models/{model}:rawPredict")
    assert rec.json["anthropic_version"] == "vertex-2023-10-16" and "model" not in rec.json


def test_errors_keep_googles_status_and_message(gateway, vertex_mock, google_token_mock):
    cfg = config(sa_config(vertex_mock, fresh_key_file(google_token_mock, "errors")))
    vertex_mock.script(vertex_mock.error(429, "Quota exceeded for aiplatform.googleapis.com"))
    r = gateway.chat(cfg, chat_body("Hi", model=MODEL))
    assert_error(r, 429)
    assert "Quota exceeded" in r.json()["error"]["message"]


def test_a_refused_exchange_is_a_401_and_vertex_is_not_called(gateway, vertex_mock, google_token_mock):
    google_token_mock.fail_next(1, description="Invalid JWT Signature.")
    r = gateway.chat(config(sa_config(vertex_mock, fresh_key_file(google_token_mock, "refused"))),
                     chat_body("Hi", model=MODEL))
    assert_error(r, 401, code="token_exchange_failed")
    assert "Invalid JWT Signature." in r.json()["error"]["message"]
    assert vertex_mock.requests == []


def test_a_stream_error_from_google(gateway, vertex_mock):
    headers = {"x-gateway-provider": "vertex-ai", "x-gateway-custom-host": vertex_mock.base_url,
               "x-gateway-cloud-b-project-id": "p", "x-gateway-cloud-b-region": "us-central1",
               "Authorization": f"Bearer {VERTEX_CLIENT_TOKEN}"}
    vertex_mock.script(CloudReply(text="one two three", exception=("INTERNAL", "backend died")), model=MODEL)
    client = gateway.sdk(headers, api_key=VERTEX_CLIENT_TOKEN)
    with pytest.raises(openai.APIError) as raised:
        sdk_stream(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                  stream=True))
    assert "backend died" in str(raised.value)


def test_the_gemini_api_takes_its_key_as_x_goog_api_key(gateway, vertex_mock):
    headers = {"x-gateway-provider": "google", "x-gateway-custom-host": vertex_mock.base_url,
               "Authorization": f"Bearer {GEMINI_API_KEY}"}
    vertex_mock.script(Reply(text="Gemini here"), model=MODEL)
    r = gateway.chat(headers, chat_body("Hi", model=MODEL))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Gemini here"
    rec = vertex_mock.last
    assert rec.path == f"/v1beta/models/{MODEL}:generateContent"
    assert rec.header("x-goog-api-key") == GEMINI_API_KEY
    assert "authorization" not in rec.headers


def test_configs_that_cannot_work_are_400s(gateway, vertex_mock):
    r = gateway.chat(config({"provider": "vertex-ai", "cloud_b_project_id": "p", "api_key": "t",
                             "custom_host": vertex_mock.base_url}), chat_body("Hi", model=MODEL))
    assert_error(r, 400, param="cloud_b_region")
    assert vertex_mock.requests == []
