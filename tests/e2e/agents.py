"""The coding agents the end-to-end tests drive: Claude Code (`claude -p`) and Codex (`codex exec`),
at the versions build.sh pins, installed by `build.sh agents` into .tools/agents (`./build.sh test`
installs them too). Each run gets a fresh HOME and working directory, the agent's own way of
naming a base URL, a key and extra headers, and a hard time limit: its whole process group is
killed then, and the run says so.

    install()                                                     # build.sh agents (quick when installed)
    run = run_claude(gateway_origin, "Read note.txt", api_key=..., headers={"x-portkey-provider": "anthropic"},
                     files={"note.txt": "..."})
    run = run_codex(f"{gateway_origin}/v1", "Run cat note.txt", api_key=..., headers={...})
    # an MCP server over HTTP, in each agent's own terms (Claude Code's --mcp-config, Codex's config.toml)
    run_claude(..., mcp_servers={"gw": {"type": "http", "url": ..., "headers": {"Authorization": "Bearer ..."}}})
    run_codex(..., mcp_servers={"gw": {"url": ..., "bearer_token_env_var": "GW_KEY"}}, env={"GW_KEY": ...})
    run.returncode, run.stdout, run.stderr, run.cwd, run.timed_out

Claude Code posts to `{base_url}/v1/messages?beta=true`; Codex to `{base_url}/responses`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".tools" / "agents" / "node_modules" / ".bin"
CLAUDE = BIN / "claude"
CODEX = BIN / "codex"
# The model Codex is told to use: one in its own catalogue, so it sends the tools it sends to
# OpenAI's models (a custom `apply_patch`, `tool_search`, `web_search` beside its functions).
CODEX_MODEL = "gpt-5.5"


@dataclass
class AgentRun:
    returncode: int
    stdout: str
    stderr: str
    cwd: Path  # the agent's working directory (the files it was given, what it wrote)
    home: Path
    timed_out: bool

    def json(self) -> Any:
        """Claude Code's `--output-format json` result."""
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (f"exit {self.returncode}{' (timed out)' if self.timed_out else ''}\n"
                f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


def install() -> None:
    """Installs the pinned agents unless they are there (build.sh's own install step)."""
    done = subprocess.run(["bash", str(REPO / "build.sh"), "agents"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"./build.sh agents failed:\n{done.stderr[-3000:]}")


def _workspace(root: Path | None, files: dict[str, str]) -> tuple[Path, Path]:
    base = Path(tempfile.mkdtemp(prefix="agent-", dir=root))
    home, cwd = base / "home", base / "work"
    home.mkdir()
    cwd.mkdir()
    for name, text in files.items():
        (cwd / name).write_text(text)
    return home, cwd


def _run(args: list[str], env: dict[str, str], home: Path, cwd: Path, timeout: float) -> AgentRun:
    """Runs an agent in a process group of its own (its tools' processes too), with no input and
    only ``env`` (so no proxy or key of the caller's reaches it); the group is killed when the
    time is up and once the agent has exited (nothing it started outlives the run)."""
    proc = subprocess.Popen(args, cwd=cwd, env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(home),
                                                **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return AgentRun(proc.returncode, out, err, cwd, home, timed_out)


def run_claude(base_url: str, prompt: str, *, api_key: str | None = None, auth_token: str | None = None,
               headers: dict[str, str] | None = None, model: str | None = None, files: dict[str, str] | None = None,
               allowed_tools: tuple[str, ...] = ("Bash", "Read"), timeout: float = 120, root: Path | None = None,
               env: dict[str, str] | None = None, mcp_servers: dict[str, dict] | None = None) -> AgentRun:
    """`claude -p prompt --output-format json` against ``base_url`` (an origin: Claude Code adds
    `/v1/messages`), with the key as `x-api-key` (``api_key``) or `Authorization: Bearer`
    (``auth_token``), ``headers`` in ANTHROPIC_CUSTOM_HEADERS, ``files`` written in its working
    directory and ``allowed_tools`` usable without asking; ``mcp_servers`` (name to Claude Code's
    server entry) as its only MCP servers (`--mcp-config`, `--strict-mcp-config`)."""
    home, cwd = _workspace(root, files or {})
    agent_env = {"ANTHROPIC_BASE_URL": base_url, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    if api_key is not None:
        agent_env["ANTHROPIC_API_KEY"] = api_key
    if auth_token is not None:
        agent_env["ANTHROPIC_AUTH_TOKEN"] = auth_token
    if headers:
        agent_env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
    args = [str(CLAUDE), "-p", prompt, "--output-format", "json", "--no-session-persistence",
            "--allowedTools", ",".join(allowed_tools)]
    if model is not None:
        args += ["--model", model]
    if mcp_servers is not None:
        args += ["--mcp-config", json.dumps({"mcpServers": mcp_servers}), "--strict-mcp-config"]
    return _run(args, {**agent_env, **(env or {})}, home, cwd, timeout)


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


def _toml_table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in values.items()) + " }"


def codex_config(base_url: str, headers: dict[str, str] | None = None, model: str = CODEX_MODEL,
                 mcp_servers: dict[str, dict[str, str | dict[str, str]]] | None = None) -> str:
    """A CODEX_HOME/config.toml naming ``base_url`` as a provider of the Responses API, its key in
    the environment variable CODEX_GATEWAY_KEY, ``headers`` sent with every request; no retries
    (each request a test scripts is sent once), no plugin sync or analytics (they would reach out to
    the network); ``mcp_servers`` (name to the keys of its `[mcp_servers.<name>]` table: strings,
    or a table of strings such as `http_headers`)."""
    servers = [line for name, keys in (mcp_servers or {}).items()
               for line in ["", f"[mcp_servers.{_toml(name)}]",
                            *(f"{key} = {_toml_table(value) if isinstance(value, dict) else _toml(value)}"
                              for key, value in keys.items())]]
    return "\n".join([
        f"model = {_toml(model)}",
        'model_provider = "gateway"',
        "",
        "[model_providers.gateway]",
        'name = "gateway"',
        f"base_url = {_toml(base_url)}",
        'wire_api = "responses"',
        'env_key = "CODEX_GATEWAY_KEY"',
        f"http_headers = {_toml_table(headers or {})}",
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "",
        "[features]",
        "plugins = false",
        "",
        "[analytics]",
        "enabled = false",
        *servers,
        "",
    ])


def run_codex(base_url: str, prompt: str, *, api_key: str, headers: dict[str, str] | None = None,
              model: str = CODEX_MODEL, files: dict[str, str] | None = None, timeout: float = 120,
              root: Path | None = None, env: dict[str, str] | None = None,
              mcp_servers: dict[str, dict[str, str | dict[str, str]]] | None = None,
              features: tuple[str, ...] = ()) -> AgentRun:
    """`codex exec prompt` against ``base_url`` (with `/v1`: Codex adds `/responses`), the key sent
    as `Authorization: Bearer`, ``headers`` as the provider's `http_headers`, ``files`` written in
    its working directory, ``mcp_servers`` in its config (``codex_config``), ``features`` enabled
    (`--enable`); commands and MCP tools run without asking and without Codex's sandbox."""
    home, cwd = _workspace(root, files or {})
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(codex_config(base_url, headers, model, mcp_servers))
    args = [str(CODEX), "exec", "--skip-git-repo-check", "--color", "never",
            "--dangerously-bypass-approvals-and-sandbox", "-C", str(cwd),
            *(arg for feature in features for arg in ("--enable", feature)), prompt]
    return _run(args, {"CODEX_HOME": str(codex_home), "CODEX_GATEWAY_KEY": api_key, **(env or {})}, home, cwd,
                timeout)
