"""Claude Code and Codex using an MCP server through the gateway (issue 46): each agent is given the
gateway's aggregate MCP endpoint `/mcp` as an HTTP MCP server with the gateway key as a bearer
token, lists the servers' tools through it (named `{server}__{tool}`), and calls the one the
scripted model asks for; the tool's answer, which
no model could know, reaches the model's next turn. The server (the Python SDK's, in the test
process) hears only the gateway: its own stored credential, never the gateway key.

The pinned agents cross the gateway in both protocol eras: Claude Code speaks 2026-07-28 (stateless
POSTs), Codex 2025-06-18 (a session: initialize, a GET stream, DELETE) and, with its feature
`mcp_2026_07_28`, 2026-07-28."""

from __future__ import annotations

import json

import pytest
from mcp.server.mcpserver import MCPServer

import agents
from helpers import CLIENT_TOKEN, KEY, assert_clean_upstream
from mocks import Reply, ToolCall
from support import McpUpstream

pytestmark = pytest.mark.agents

SERVER_ID = "words"  # the MCP server's id in the gateway's configuration
SERVER_TOKEN = "words-server-own-token"  # its stored credential: only the gateway sends it
# The gateway's MCP endpoint the agents are given, the aggregate (every server as one), and the
# name the tool has there.
MCP_PATH = "/mcp"
TOOL = f"{SERVER_ID}__lookup_word"
AGENT_SERVER = "gw"  # the name each agent's own configuration gives the gateway's MCP endpoint
# Claude Code calls an MCP tool `mcp__<server>__<tool>`; Codex puts a server's tools in a namespace
# tool `mcp__<server>` and the model calls one as `lookup_word` in that namespace.
CLAUDE_TOOL = f"mcp__{AGENT_SERVER}__{TOOL}"
CODEX_NAMESPACE = f"mcp__{AGENT_SERVER}"

WORD_KEY = "pantry-shelf-3"
SECRET = "zephyr-quokka-1187"  # what the tool answers: the model's second turn can only have it from the tool
QUESTION = f"Which word is stored under {WORD_KEY}? Use the lookup_word tool."
ANSWER = f"The word stored under {WORD_KEY} is {SECRET}."
# A model outside Codex's catalogue: Codex defers MCP tools behind its `tool_search` for the models
# it knows, and sends them as tools up front to any other, so the first request shows the listing.
CODEX_MCP_MODEL = "gpt-mcp-e2e"


class WordServer(McpUpstream):
    """The MCP server the agents use: one tool, `lookup_word`, recording the arguments of each call."""

    def __init__(self):
        self.calls: list[dict] = []
        server = MCPServer("words")

        @server.tool()
        def lookup_word(key: str) -> str:
            """Looks up the word stored under a key."""
            self.calls.append({"key": key})
            return SECRET

        super().__init__(server)

    def reset(self):
        self.calls.clear()
        self.seen_headers.clear()


@pytest.fixture(scope="module", autouse=True)
def _agents_installed_for_mcp():
    agents.install()


@pytest.fixture(scope="module")
def words():
    with WordServer() as server:
        yield server


@pytest.fixture(scope="module")
def words_gw(words, start_gateway):
    servers = {SERVER_ID: {"url": words.url, "headers": {"authorization": f"Bearer {SERVER_TOKEN}"}}}
    with start_gateway("mcp-agents", None, {"GATEWAY_MCP_SERVERS": json.dumps(servers)}) as gateway:
        yield gateway


@pytest.fixture
def word_server(words):
    words.reset()
    return words


def model_headers(provider: str, mock) -> dict[str, str]:
    return {"x-gateway-api-key": KEY, "x-gateway-provider": provider, "x-gateway-custom-host": mock.base_url}


def assert_only_the_gateway_reached(server: WordServer) -> None:
    """Every request the MCP server heard came through the gateway (its stored credential, which the
    agent never had) and carried nothing of the caller's gateway key or headers."""
    assert server.seen_headers
    for headers in server.seen_headers:
        assert headers.get("authorization") == f"Bearer {SERVER_TOKEN}", headers
        assert KEY not in json.dumps(headers)
        # Of the gateway's headers, only the request's trace id.
        assert [name for name in headers if name.startswith("x-gateway-")] == ["x-gateway-trace-id"], headers


def assert_era_reached(server: WordServer, era: str) -> None:
    """What the server (of both eras) heard of an agent of `era` through the aggregate: the gateway
    spoke the agent's era to it. A 2025 agent's list and call went in a session of the gateway's own
    with the server (the newest version of that era); a 2026-07-28 agent's in none, each request
    stateless, the call naming the tool as the server names it."""
    if era == "2026-07-28":
        assert not any("mcp-session-id" in h for h in server.seen_headers), "no session was opened"
        assert {h.get("mcp-protocol-version") for h in server.seen_headers} == {era}
        calls = [h for h in server.seen_headers if h.get("mcp-method") == "tools/call"]
        assert [(h.get("mcp-protocol-version"), h.get("mcp-name")) for h in calls] == [(era, "lookup_word")], calls
    else:
        assert any("mcp-session-id" in h for h in server.seen_headers), "the list was gathered in a session"
        # (The first request of a session, `initialize`, names no version yet.)
        assert {h.get("mcp-protocol-version") for h in server.seen_headers} - {None} == {"2025-11-25"}
        assert not any("mcp-method" in h for h in server.seen_headers)


def test_claude_code_calls_an_mcp_tool_through_the_gateway(words_gw, word_server, anthropic_mock, tmp_path):
    anthropic_mock.script(Reply(tool_calls=[ToolCall(CLAUDE_TOOL, {"key": WORD_KEY}, id="toolu_mcp_1")]))
    anthropic_mock.script(Reply(text=ANSWER))
    mcp = {"type": "http", "url": f"{words_gw.origin}{MCP_PATH}", "headers": {"Authorization": f"Bearer {KEY}"}}
    # ENABLE_TOOL_SEARCH=false: Claude Code sends the MCP tools up front rather than behind its
    # ToolSearch, so the first request shows what it listed through the gateway.
    run = agents.run_claude(words_gw.origin, QUESTION, api_key="sk-ant-agent",
                            headers=model_headers("anthropic", anthropic_mock), allowed_tools=(CLAUDE_TOOL,),
                            mcp_servers={AGENT_SERVER: mcp}, env={"ENABLE_TOOL_SEARCH": "false"}, root=tmp_path,
                            timeout=60)
    assert run.returncode == 0, run
    assert run.json()["result"] == ANSWER
    assert word_server.calls == [{"key": WORD_KEY}]
    first, second = anthropic_mock.requests_to("/v1/messages")
    assert CLAUDE_TOOL in {tool["name"] for tool in first.json["tools"]}
    [result] = [block for block in second.json["messages"][-1]["content"] if block["type"] == "tool_result"]
    assert result["tool_use_id"] == "toolu_mcp_1" and SECRET in json.dumps(result["content"])
    for req in (first, second):
        assert_clean_upstream(req, KEY)
    assert_only_the_gateway_reached(word_server)
    assert_era_reached(word_server, "2026-07-28")


# Codex's MCP protocol version, and the features that make it speak it.
CODEX_ERAS = {"2025-06-18": (), "2026-07-28": ("mcp_2026_07_28",)}


@pytest.mark.parametrize("era", CODEX_ERAS)
def test_codex_calls_an_mcp_tool_through_the_gateway(words_gw, word_server, openai_mock, tmp_path, era):
    call = ToolCall(TOOL, {"key": WORD_KEY}, id="call_mcp_2", namespace=CODEX_NAMESPACE)
    openai_mock.script(Reply(tool_calls=[call]), path="/v1/responses")
    openai_mock.script(Reply(text=ANSWER), path="/v1/responses")
    # The gateway key from the environment variable Codex is told to read it from.
    mcp = {"url": f"{words_gw.origin}{MCP_PATH}", "bearer_token_env_var": "GATEWAY_MCP_KEY"}
    run = agents.run_codex(words_gw.base_url, QUESTION, api_key=CLIENT_TOKEN, headers=model_headers("openai", openai_mock),
                           model=CODEX_MCP_MODEL, mcp_servers={AGENT_SERVER: mcp}, env={"GATEWAY_MCP_KEY": KEY},
                           features=CODEX_ERAS[era], root=tmp_path, timeout=60)
    assert run.returncode == 0, run
    assert run.stdout.strip().endswith(ANSWER), run
    assert word_server.calls == [{"key": WORD_KEY}]
    first, second = openai_mock.requests_to("/v1/responses")
    [namespace] = [tool for tool in first.json["tools"] if tool.get("name") == CODEX_NAMESPACE]
    assert namespace["type"] == "namespace" and TOOL in {tool["name"] for tool in namespace["tools"]}
    [output] = [item for item in second.json["input"] if item["type"] == "function_call_output"]
    assert output["call_id"] == "call_mcp_2" and SECRET in output["output"]
    for req in (first, second):
        assert_clean_upstream(req, KEY)
    assert_only_the_gateway_reached(word_server)
    assert_era_reached(word_server, era)
