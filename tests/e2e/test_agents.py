"""Claude Code and Codex through the gateway, each finishing a run that calls a tool: to a provider
that speaks the agent's API (native: nothing lost on the way) and to one that does not
(translated: the tool's name and call id survive both ways)."""

from __future__ import annotations

import json

import pytest

import agents
from helpers import CLIENT_TOKEN, KEY, assert_clean_upstream
from mocks import AnthropicMock, OpenAIMock, Reply, ToolCall

pytestmark = pytest.mark.agents

NOTE = {"note.txt": "the secret word is pineapple\n"}
QUESTION = "What is the secret word in note.txt? Use cat."
ANSWER = "The secret word is pineapple."
CLAUDE_MODEL = "claude-opus-5-5"


@pytest.fixture(scope="module", autouse=True)
def _installed():
    agents.install()


def gateway_headers(provider: str, mock) -> dict[str, str]:
    return {"x-gateway-api-key": KEY, "x-gateway-provider": provider, "x-gateway-custom-host": mock.base_url}


def test_claude_code_to_anthropic_loses_nothing(gateway, anthropic_mock, tmp_path):
    anthropic_mock.script(Reply(thinking="I should read the note.",
                                tool_calls=[ToolCall("Bash", {"command": "cat note.txt"}, id="toolu_gw_1")]))
    anthropic_mock.script(Reply(text=ANSWER))
    run = agents.run_claude(gateway.origin, QUESTION, api_key="sk-ant-agent",
                            headers=gateway_headers("anthropic", anthropic_mock), files=NOTE, root=tmp_path)
    assert run.returncode == 0, run
    assert run.json()["result"] == ANSWER
    first, second = anthropic_mock.requests_to("/v1/messages")
    for req in (first, second):
        # The agent's own key, version, betas and query went as it sent them; the gateway's stayed.
        assert req.headers["x-api-key"] == "sk-ant-agent" and req.raw_query == "beta=true"
        assert AnthropicMock.per_turn_beta in req.headers["anthropic-beta"].split(",")
        assert req.json["thinking"]["type"] == "adaptive" and "context_management" in req.json
        assert_clean_upstream(req, KEY)
    # The mock checked the signed thinking and the tool id on the second turn; here, what it got.
    turn = second.json["messages"]
    tool_use = next(m for m in turn if m["role"] == "assistant")
    assert tool_use["content"][0] == {"type": "thinking", "thinking": "I should read the note.",
                                      "signature": AnthropicMock.sign_thinking("I should read the note.")}
    assert tool_use["content"][1]["id"] == "toolu_gw_1"
    [result] = turn[-1]["content"]
    assert result["tool_use_id"] == "toolu_gw_1" and "pineapple" in json.dumps(result["content"])


def test_claude_code_to_openai_is_translated(gateway, openai_mock, tmp_path):
    openai_mock.script(Reply(tool_calls=[ToolCall("Bash", {"command": "cat note.txt"}, id="call_gw_2")]))
    openai_mock.script(Reply(text=ANSWER))
    run = agents.run_claude(gateway.origin, QUESTION, api_key=CLIENT_TOKEN,
                            headers=gateway_headers("openai", openai_mock), files=NOTE, root=tmp_path)
    assert run.returncode == 0, run.stdout
    assert run.json()["result"] == ANSWER
    first, second = openai_mock.requests_to("/v1/chat/completions")
    assert first.headers["authorization"] == f"Bearer {CLIENT_TOKEN}" and "x-api-key" not in first.headers
    assert first.json["stream"] is True and "Bash" in {t["function"]["name"] for t in first.json["tools"]}
    messages = second.json["messages"]
    call = next(m for m in messages if m.get("tool_calls"))
    assert call["tool_calls"][0]["id"] == "call_gw_2"
    result = next(m for m in messages if m["role"] == "tool")
    assert result["tool_call_id"] == "call_gw_2" and "pineapple" in json.dumps(result["content"])


def test_codex_to_openai_loses_nothing(gateway, openai_mock, tmp_path):
    thought = "The note is in the working directory."
    openai_mock.script(Reply(thinking=thought, tool_calls=[ToolCall("exec_command", {"cmd": "cat note.txt"},
                                                                    id="call_gw_3")]), path="/v1/responses")
    openai_mock.script(Reply(text=ANSWER), path="/v1/responses")
    headers = {"x-gateway-api-key": KEY, "x-gateway-provider": "openai", "x-gateway-custom-host": openai_mock.base_url}
    run = agents.run_codex(gateway.base_url, QUESTION, api_key=CLIENT_TOKEN, headers=headers, files=NOTE,
                           root=tmp_path)
    assert run.returncode == 0, run
    assert run.stdout.strip().endswith(ANSWER), run
    first, second = openai_mock.requests_to("/v1/responses")
    assert first.json["store"] is False and first.json["include"] == ["reasoning.encrypted_content"]
    assert {"function", "custom", "web_search"} <= {t["type"] for t in first.json["tools"]}
    items = second.json["input"]
    [reasoning] = [i for i in items if i["type"] == "reasoning"]
    assert reasoning["encrypted_content"] == OpenAIMock.seal_reasoning(thought)
    [output] = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == "call_gw_3" and "pineapple" in output["output"]
    assert_clean_upstream(second, KEY)


def test_codex_to_anthropic_is_translated(gateway, anthropic_mock, tmp_path):
    thought = "Read the note first."
    anthropic_mock.script(Reply(thinking=thought, tool_calls=[ToolCall("exec_command", {"cmd": "cat note.txt"},
                                                                       id="toolu_gw_4")]))
    anthropic_mock.script(Reply(text=ANSWER))
    headers = {"x-gateway-api-key": KEY, "x-gateway-provider": "anthropic",
               "x-gateway-custom-host": anthropic_mock.base_url}
    run = agents.run_codex(gateway.base_url, QUESTION, api_key="sk-ant-codex", headers=headers, files=NOTE,
                           root=tmp_path, model="claude-sonnet-4-5")
    assert run.returncode == 0, run
    assert run.stdout.strip().endswith(ANSWER), run
    first, second = anthropic_mock.requests_to("/v1/messages")
    assert first.headers["x-api-key"] == "sk-ant-codex"
    # Only the function tools Anthropic can call here went; hosted and custom tools were dropped.
    assert "exec_command" in {t["name"] for t in first.json["tools"]}
    turn = second.json["messages"]
    assistant = next(m for m in turn if m["role"] == "assistant")
    # The thinking came back signed (the mock checks the signature), before the tool call.
    assert assistant["content"][0] == {"type": "thinking", "thinking": thought,
                                       "signature": AnthropicMock.sign_thinking(thought)}
    assert any(b.get("id") == "toolu_gw_4" for b in assistant["content"])
    result = [b for b in turn[-1]["content"] if b["type"] == "tool_result"]
    assert result[0]["tool_use_id"] == "toolu_gw_4" and "pineapple" in json.dumps(result[0]["content"])
