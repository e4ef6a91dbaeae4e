"""A first run as a new user makes it, with no provider account and no internet: `./build.sh run`
starts the local stand-in model server (tools/local_model.py, an echo) beside the gateway, and the
README's curl, the openai and anthropic SDKs and the coding agents get their answer through the
gateway from it. Then the stand-in alone: its APIs' shapes, counts, errors and shutdown."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx2 as httpx
import openai
import pytest

import agents
from helpers import KEY, sdk_stream
from pg_server import free_ports, stop_group

REPO = Path(__file__).resolve().parents[2]
LOCAL_MODEL = REPO / "tools" / "local_model.py"
LOCAL_KEY = "sk-local"  # any key: the stand-in takes and ignores it
PROMPT = "Hello there, gateway!"
ECHO = f"You said: {PROMPT}"
# The stand-in counts tokens in words: the prompt's, and its answer's.
PROMPT_TOKENS, ECHO_TOKENS = 3, 5


def stand_in_url(port: int) -> str:
    """What `x-gateway-custom-host` names for the stand-in, for the openai and anthropic providers alike."""
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def stand_in_port() -> int:
    return free_ports(1)[0]


@pytest.fixture(scope="module")
def first_run(start_gateway, stand_in_port):
    """`build.sh run` with the stand-in on (the suite's other gateways run without it)."""
    with start_gateway("first-run", None, {"GATEWAY_LOCAL_MODEL": "on",
                                           "GATEWAY_LOCAL_MODEL_PORT": str(stand_in_port)}) as gw:
        yield gw


def stand_in_headers(provider: str, port: int) -> dict[str, str]:
    return {"x-gateway-api-key": KEY, "x-gateway-provider": provider, "x-gateway-custom-host": stand_in_url(port)}


def readme_curl(origin: str, key: str, port: int, body: dict) -> tuple[int, str]:
    """The README's first request with the real curl: (status, body)."""
    done = subprocess.run(
        ["curl", "-sS", "-N", "-w", "\n%{http_code}", f"{origin}/v1/chat/completions",
         "-H", f"x-gateway-api-key: {key}", "-H", "x-gateway-provider: openai",
         "-H", f"x-gateway-custom-host: {stand_in_url(port)}", "-H", f"Authorization: Bearer {LOCAL_KEY}",
         "-H", "content-type: application/json", "-d", json.dumps(body)],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    text, _, status = done.stdout.rpartition("\n")
    return int(status), text


def sse_data(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


# --------------------------------------------------------------------------- through the gateway


def test_readme_curl_gets_the_echo(first_run, stand_in_port):
    status, text = readme_curl(first_run.origin, KEY, stand_in_port,
                               {"model": "my-model", "messages": [{"role": "user", "content": PROMPT}]})
    assert status == 200, text
    answer = json.loads(text)
    assert answer["choices"][0]["message"]["content"] == ECHO
    assert answer["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": ECHO_TOKENS,
                               "total_tokens": PROMPT_TOKENS + ECHO_TOKENS}
    # What `./build.sh run` told the user about it.
    assert (f"local stand-in model server on {stand_in_url(stand_in_port)} "
            "(echo; GATEWAY_LOCAL_MODEL=off to not start it)") in first_run.log_text()


def test_readme_curl_streamed(first_run, stand_in_port):
    status, text = readme_curl(first_run.origin, KEY, stand_in_port,
                               {"model": "my-model", "stream": True,
                                "messages": [{"role": "user", "content": PROMPT}]})
    assert status == 200, text
    data = sse_data(text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) > 3, "the answer comes in pieces"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ECHO
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_openai_sdk_chat_and_its_stream(first_run, stand_in_port):
    client = openai.OpenAI(base_url=first_run.base_url, api_key=LOCAL_KEY, max_retries=0, timeout=30,
                           default_headers=stand_in_headers("openai", stand_in_port))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    answer = client.chat.completions.create(model="my-model", messages=messages)
    assert answer.choices[0].message.content == ECHO
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (PROMPT_TOKENS + 2, ECHO_TOKENS)

    streamed = sdk_stream(client.chat.completions.create(model="my-model", messages=messages, stream=True,
                                                         stream_options={"include_usage": True}))
    assert streamed.content == ECHO and streamed.finish_reason == "stop"
    assert streamed.chunks[-1]["choices"] == [], "the usage comes in a last chunk of its own"
    assert streamed.usage == {"prompt_tokens": PROMPT_TOKENS + 2, "completion_tokens": ECHO_TOKENS,
                              "total_tokens": PROMPT_TOKENS + 2 + ECHO_TOKENS}


def test_openai_sdk_responses_and_their_stream(first_run, stand_in_port):
    client = openai.OpenAI(base_url=first_run.base_url, api_key=LOCAL_KEY, max_retries=0, timeout=30,
                           default_headers=stand_in_headers("openai", stand_in_port))
    response = client.responses.create(model="my-model", input=PROMPT)
    assert response.output_text == ECHO and response.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (PROMPT_TOKENS, ECHO_TOKENS)

    kinds, text, completed = [], "", None
    with client.responses.stream(model="my-model", instructions="Be brief.",
                                 input=[{"role": "user", "content": PROMPT}]) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        completed = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert text == ECHO and completed.output_text == ECHO
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (PROMPT_TOKENS + 2, ECHO_TOKENS)


def anthropic_client(gw, port: int) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.origin, api_key=LOCAL_KEY, max_retries=0, timeout=30,
                               default_headers=stand_in_headers("anthropic", port))


def test_anthropic_sdk_message_and_its_stream(first_run, stand_in_port):
    client = anthropic_client(first_run, stand_in_port)
    ask = {"model": "claude-opus-5-5", "max_tokens": 100, "system": "Be brief.",
           "messages": [{"role": "user", "content": PROMPT}]}
    message = client.messages.create(**ask)
    assert [block.text for block in message.content] == [ECHO] and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT_TOKENS + 2, ECHO_TOKENS)

    with client.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ECHO and final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (PROMPT_TOKENS + 2, ECHO_TOKENS)

    counted = client.messages.count_tokens(model=ask["model"], system=ask["system"], messages=ask["messages"])
    assert counted.input_tokens == message.usage.input_tokens


@pytest.fixture(scope="module")
def agents_ready():
    """The agents at build.sh's pins, installed as test_agents requires them (not skipped)."""
    agents.install()


@pytest.mark.agents
def test_claude_code_answers_through_the_gateway(first_run, stand_in_port, agents_ready, tmp_path):
    run = agents.run_claude(first_run.origin, PROMPT, api_key=LOCAL_KEY,
                            headers=stand_in_headers("anthropic", stand_in_port), root=tmp_path)
    assert run.returncode == 0, run
    assert run.json()["result"] == ECHO, run


@pytest.mark.agents
def test_codex_answers_through_the_gateway(first_run, stand_in_port, agents_ready, tmp_path):
    run = agents.run_codex(first_run.base_url, PROMPT, api_key=LOCAL_KEY,
                           headers=stand_in_headers("openai", stand_in_port), root=tmp_path)
    assert run.returncode == 0, run
    assert run.stdout.strip().endswith(ECHO), run


# --------------------------------------------------------------------------- build.sh run, bare


def bare_env(**settings: str) -> dict[str, str]:
    """The caller's environment less every GATEWAY_* setting, plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, **settings}


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def group_members(group: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    members.append(int(entry.name))
            except OSError:
                pass
    return members


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_bare_run_answers_with_its_own_key_and_stops_whole_on_sigterm(tmp_path):
    """Nothing set but ports, and no control plane (Envoy is then not `exec`ed any more): the key
    build.sh prints answers the README's curl, and one SIGTERM to build.sh stops Envoy and the
    stand-in with it."""
    port, admin_port, stand_in = free_ports(3)
    out = tmp_path / "stdout"
    with open(out, "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(["bash", str(REPO / "build.sh"), "run"], cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, start_new_session=True,
                                env=bare_env(GATEWAY_PORT=str(port), GATEWAY_ADMIN_PORT=str(admin_port),
                                             GATEWAY_CONTROL_PLANE="off", GATEWAY_LOCAL_MODEL_PORT=str(stand_in),
                                             GATEWAY_STATE_DIR=str(tmp_path / "state")))
    try:
        deadline = time.monotonic() + float(os.environ.get("GATEWAY_START_TIMEOUT", "120"))
        while not healthy(port):
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "no /health 200 in time:\n" + (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.25)
        key = out.read_text().splitlines()[0]
        status, text = readme_curl(f"http://127.0.0.1:{port}", key, stand_in,
                                   {"model": "my-model", "messages": [{"role": "user", "content": PROMPT}]})
        assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == ECHO, text

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert group_members(proc.pid) == [], "build.sh left processes running"
        assert not accepts(stand_in) and not accepts(port)
    finally:
        stop_group(proc)


def test_run_with_the_stand_in_port_taken_fails_fast_naming_the_switches():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port, admin_port, control_plane_port = free_ports(3)
        started = time.monotonic()
        done = subprocess.run(["bash", str(REPO / "build.sh"), "run"], cwd=REPO, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60,
                              env=bare_env(GATEWAY_PORT=str(port), GATEWAY_ADMIN_PORT=str(admin_port),
                                           GATEWAY_CONTROL_PLANE_PORT=str(control_plane_port),
                                           GATEWAY_LOCAL_MODEL_PORT=str(taken)))
    assert done.returncode == 1, done
    assert time.monotonic() - started < 10, "the ports are checked before building"
    assert f"127.0.0.1:{taken} (GATEWAY_LOCAL_MODEL_PORT) is already in use" in done.stderr
    assert "GATEWAY_LOCAL_MODEL=off" in done.stderr


# --------------------------------------------------------------------------- the stand-in alone


def start_stand_in(port: int) -> subprocess.Popen:
    """tools/local_model.py under the machine's python3 (standard library only), once it listens
    (it says so on stderr)."""
    proc = subprocess.Popen(["python3", str(LOCAL_MODEL)], env=bare_env(GATEWAY_LOCAL_MODEL_PORT=str(port)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    line = proc.stderr.readline()
    assert f"on http://127.0.0.1:{port}/v1" in line, line + proc.stderr.read()
    return proc


@pytest.fixture(scope="module")
def stand_in():
    port = free_ports(1)[0]
    proc = start_stand_in(port)
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_stand_in_serves_both_apis_with_one_count(stand_in):
    client = openai.OpenAI(base_url=f"{stand_in}/v1", api_key=LOCAL_KEY, max_retries=0, timeout=10)
    assert [m.id for m in client.models.list()] == ["local-echo"]
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
    assert answer.choices[0].message.content == ECHO and answer.system_fingerprint == "local-echo-stand-in"

    claude = anthropic.Anthropic(base_url=stand_in, api_key=LOCAL_KEY, max_retries=0, timeout=10)
    ask = {"model": "c", "system": [{"type": "text", "text": "Be brief."}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "<reminder>read the notes</reminder>"},
                                                      {"type": "text", "text": PROMPT}]}]}
    message = claude.messages.create(max_tokens=10, **ask)
    # The last text part is the prompt (agents put their reminders before it); all of it counts.
    assert message.content[0].text == ECHO
    assert message.usage.input_tokens == claude.messages.count_tokens(**ask).input_tokens == PROMPT_TOKENS + 5


def test_stand_in_embeddings_are_deterministic_unit_vectors(stand_in):
    client = openai.OpenAI(base_url=f"{stand_in}/v1", api_key=LOCAL_KEY, max_retries=0, timeout=10)
    # The SDK asks for base64 and decodes it.
    first = client.embeddings.create(model="e", input=["one text", "another"]).data
    again = client.embeddings.create(model="e", input="one text", encoding_format="float").data
    assert first[0].embedding == pytest.approx(again[0].embedding, abs=1e-6)
    assert first[0].embedding != pytest.approx(first[1].embedding, abs=1e-3)
    assert sum(x * x for x in first[1].embedding) == pytest.approx(1.0, abs=1e-5)
    # Asked for explicitly, base64 is the client's to decode: little-endian float32s.
    wide = client.embeddings.create(model="e", input="x", dimensions=64, encoding_format="base64")
    assert len(base64.b64decode(wide.data[0].embedding)) == 64 * 4


@pytest.mark.parametrize("path, body, headers, shape", [
    ("/v1/chat/completions", b"{not json", {}, "openai"),
    ("/v1/chat/completions", b'{"model": "m"}', {}, "openai"),
    ("/v1/responses", b'{"model": "m"}', {}, "openai"),
    ("/v1/embeddings", b'{"input": [1, 2]}', {}, "openai"),
    ("/v1/messages?beta=true", b"[1]", {"anthropic-version": "2023-06-01"}, "anthropic"),
    ("/v1/messages", b'{"model": "c", "messages": []}', {}, "anthropic"),
    ("/v1/messages/count_tokens", b"{", {}, "anthropic"),
])
def test_stand_in_refuses_bad_requests_in_the_apis_shape(stand_in, path, body, headers, shape):
    resp = httpx.post(f"{stand_in}{path}", content=body, headers={"content-type": "application/json", **headers})
    assert resp.status_code == 400
    error = resp.json()
    if shape == "openai":
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    else:
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


def test_stand_in_names_what_it_serves_on_an_unknown_path(stand_in):
    resp = httpx.post(f"{stand_in}/chat/completions", json={"messages": []})
    assert resp.status_code == 404
    assert "x-gateway-custom-host: http://127.0.0.1:" in resp.json()["error"]["message"]
    resp = httpx.get(f"{stand_in}/v1/models/x", headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error"


def test_stand_in_stops_on_sigint_with_a_connection_open():
    port = free_ports(1)[0]
    proc = start_stand_in(port)
    try:
        with socket.create_connection(("127.0.0.1", port)) as idle:
            idle.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert idle.recv(12) == b"HTTP/1.1 200"  # kept alive, idle now
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        assert not accepts(port)
    finally:
        stop_group(proc)


def test_stand_in_on_a_taken_port_says_which_variable_moves_it():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        done = subprocess.run([sys.executable, str(LOCAL_MODEL)], capture_output=True, text=True, timeout=30,
                              env=bare_env(GATEWAY_LOCAL_MODEL_PORT=str(held.getsockname()[1])))
    assert done.returncode == 1
    assert "GATEWAY_LOCAL_MODEL_PORT=" in done.stderr


def test_stand_in_binds_loopback_only(stand_in):
    port = int(stand_in.rsplit(":", 1)[1])
    listening = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    ours = [fields[1] for fields in listening if fields[3] == "0A" and fields[1].endswith(f":{port:04X}")]
    loopback = "%08X" % struct.unpack("<I", socket.inet_aton("127.0.0.1"))[0]
    assert ours == [f"{loopback}:{port:04X}"]
