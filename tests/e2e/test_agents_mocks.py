"""The coding agents (tests/e2e/agents.py) against the mocks directly, no gateway: each finishes a
run that calls a tool, and what it sent is what the real services take. These pin the request
shapes the gateway must carry (README, "Scripting the mocks": what each agent sends)."""

from __future__ import annotations

import json

import pytest

import agents
from helpers import OPENAI_KEYS
from mocks import AnthropicMock, OpenAIMock, Reply, ToolCall

pytestmark = pytest.mark.agents

NOTE = {"note.txt": "the secret word is pineapple\n"}
ANSWER = "The secret word is pineapple."


@pytest.fixture(scope="module", autouse=True)
def _installed():
    agents.install()


def test_claude_code_runs_a_tool_against_the_messages_mock(anthropic_mock, tmp_path):
    anthropic_mock.script(Reply(tool_calls=[ToolCall("Bash", {"command": "cat note.txt", "description": "Show the note"},
                                                     id="toolu_agent_1")]))
    anthropic_mock.script(Reply(text=ANSWER))
    run = agents.run_claude(anthropic_mock.origin, "What is the secret word in note.txt?", api_key="sk-ant-agent",
                            headers={"x-test-header": "yes", "x-other": "a: b"}, files=NOTE, root=tmp_path,
                            timeout=90)
    assert run.returncode == 0, run
    result = run.json()
    assert (result["result"], result["is_error"], result["num_turns"]) == (ANSWER, False, 2)

    first, second = anthropic_mock.requests_to("/v1/messages")
    assert len(anthropic_mock.requests) == 2
    for req in (first, second):
        assert (req.method, req.raw_query) == ("POST", "beta=true")
        assert req.headers["x-api-key"] == "sk-ant-agent" and "authorization" not in req.headers
        assert req.headers["anthropic-version"] == "2023-06-01"
        assert AnthropicMock.per_turn_beta in req.headers["anthropic-beta"].split(",")
        assert (req.headers["x-test-header"], req.headers["x-other"]) == ("yes", "a: b")
        assert req.json["stream"] is True and req.json["thinking"]["type"] == "adaptive"
        assert {"Bash", "Read"} <= {t["name"] for t in req.json["tools"]}
    # The tool ran in the agent's directory and its result answers the mock's tool_use by id.
    use = second.json["messages"][-2]
    assert use == {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_agent_1", "name": "Bash",
                                                     "input": {"command": "cat note.txt",
                                                               "description": "Show the note"}}]}
    [tool_result] = second.json["messages"][-1]["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == "toolu_agent_1"
    assert "the secret word is pineapple" in json.dumps(tool_result["content"])


def test_claude_code_with_a_bearer_token(anthropic_mock, tmp_path):
    # ANTHROPIC_AUTH_TOKEN: the key goes as `Authorization: Bearer` (what a gateway's own key uses).
    run = agents.run_claude(anthropic_mock.origin, "Say hello.", auth_token="gw-token", root=tmp_path, timeout=90)
    assert run.returncode == 0, run
    assert run.json()["result"] == AnthropicMock.default_text
    req = anthropic_mock.last
    assert req.headers["authorization"] == "Bearer gw-token" and "x-api-key" not in req.headers


def test_codex_runs_a_tool_against_the_responses_mock(openai_mock, tmp_path):
    key = "sk-direct"
    assert key in OPENAI_KEYS
    thought = "The note is in the working directory: cat it."
    openai_mock.script(Reply(thinking=thought, tool_calls=[ToolCall("exec_command", {"cmd": "cat note.txt"},
                                                                    id="call_agent_1")]), path="/v1/responses")
    openai_mock.script(Reply(text=ANSWER), path="/v1/responses")
    run = agents.run_codex(openai_mock.base_url, "What is the secret word in note.txt? Use cat.", api_key=key,
                           headers={"x-test-header": "yes"}, files=NOTE, root=tmp_path, timeout=90)
    assert run.returncode == 0, run
    assert run.stdout.strip().endswith(ANSWER), run

    first, second = openai_mock.requests_to("/v1/responses")
    assert len(openai_mock.requests) == 2
    for req in (first, second):
        assert (req.method, req.raw_query) == ("POST", "")
        assert req.headers["authorization"] == f"Bearer {key}" and req.headers["x-test-header"] == "yes"
        assert req.headers["accept"] == "text/event-stream"
        body = req.json
        assert (body["model"], body["stream"], body["store"]) == (agents.CODEX_MODEL, True, False)
        assert body["include"] == ["reasoning.encrypted_content"]
        assert {"function", "custom", "web_search"} <= {t["type"] for t in body["tools"]}
        assert "exec_command" in {t.get("name") for t in body["tools"]}
    # Sent back: the reasoning as it was issued, the call and its output under the mock's call id.
    items = second.json["input"]
    [reasoning] = [i for i in items if i["type"] == "reasoning"]
    assert reasoning["encrypted_content"] == OpenAIMock.seal_reasoning(thought)
    [call] = [i for i in items if i["type"] == "function_call"]
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == (
        "call_agent_1", "exec_command", {"cmd": "cat note.txt"})
    [output] = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == "call_agent_1" and "the secret word is pineapple" in output["output"]
    assert items.index(reasoning) < items.index(call) < items.index(output)
