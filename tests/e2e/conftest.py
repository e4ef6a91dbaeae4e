"""Fixtures of the gateway end-to-end tests.

* ``openai_mock`` / ``anthropic_mock`` (session): the mock providers, reset before and
  after every test by an autouse fixture.
* ``google_token_mock`` / ``vertex_mock`` / ``bedrock_mock`` (session, mocks_cloud.py):
  started by the first test that uses one, and reset around each test that uses it.
* ``gateway`` (session): `build.sh run` started once, in its own process group, with
  GATEWAY_PORT, GATEWAY_ADMIN_PORT, GATEWAY_API_KEYS, GATEWAY_CREDENTIALS,
  GATEWAY_LOG_LEVEL=debug and GATEWAY_CACHE (semantic matching through the OpenAI mock's
  embeddings) (and no other GATEWAY_* variable from the caller's environment);
  ready when `GET /health` answers 200. Its output goes to a log file whose tail is
  attached to every failing test that used it. At the end of the session (before Envoy
  stops) it fails if the filter VM was ever reloaded (`wasm.model_gateway.vm_reload*` in
  Envoy's /stats) or a secret appears in the log.
* ``start_gateway`` (session): starts another gateway with its own GATEWAY_CACHE, for a
  module-scoped fixture (same startup wait and end checks; stopped when the module ends).
* ``postgres`` (session): a PostgreSQL server of the suite's own (pg_server.py; Debian's
  binaries, which build.sh installs), started by the first test that uses it;
  ``postgres.database(name)`` creates an empty database and returns its URL.
* ``_no_vm_reload`` (autouse): fails the test during which the filter VM of a running
  gateway was reloaded. The gateways watched, and the end checks, are ``support.under_guards``'s,
  which every other Envoy a test starts runs under too (``support.running_mesh``).

Environment knobs:
* GATEWAY_START_TIMEOUT: seconds to wait for /health (default 120).
* E2E_GATEWAY_CMD: a command line to run instead of `bash build.sh run` (same environment
  contract), e.g. to try the suite against another build of the gateway.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # make the helper modules importable under any import mode
    sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("helpers", "support")

import helpers  # noqa: E402
import httpx2 as httpx  # noqa: E402
import support  # noqa: E402
from mocks import AnthropicMock, OpenAIMock  # noqa: E402
from mocks_cloud import BedrockMock, GoogleTokenMock, VertexMock  # noqa: E402
from pg_server import StartFailed, free_ports, running_postgres, stop_group  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "build.sh"
START_TIMEOUT = float(os.environ.get("GATEWAY_START_TIMEOUT", "120"))


@pytest.fixture(scope="session")
def openai_mock():
    mock = OpenAIMock(helpers.OPENAI_KEYS).start()
    yield mock
    mock.stop()


@pytest.fixture(scope="session")
def anthropic_mock():
    mock = AnthropicMock().start()
    yield mock
    mock.stop()


@pytest.fixture(autouse=True)
def _reset_mocks(openai_mock, anthropic_mock):
    openai_mock.reset()
    anthropic_mock.reset()
    yield
    openai_mock.reset()  # also releases streams still waiting on a gate
    anthropic_mock.reset()


@pytest.fixture(scope="session")
def google_token_mock():
    """Google's OAuth token endpoint with a service account of its own (``service_account_json()``)."""
    mock = GoogleTokenMock().start()
    yield mock
    mock.stop()


@pytest.fixture(scope="session")
def vertex_mock(google_token_mock):
    """Vertex AI and the Gemini API: tokens issued by ``google_token_mock`` or
    ``helpers.VERTEX_CLIENT_TOKEN``; Gemini key ``helpers.GEMINI_API_KEY``."""
    mock = VertexMock(google_token_mock, tokens={helpers.VERTEX_CLIENT_TOKEN},
                      api_keys={helpers.GEMINI_API_KEY}).start()
    yield mock
    mock.stop()


@pytest.fixture(scope="session")
def bedrock_mock():
    """Bedrock's Converse API for region us-east-1: the key pair ``helpers.AWS_ACCESS_KEY_ID``, the
    temporary one ``helpers.AWS_TEMP_ACCESS_KEY_ID`` (with ``helpers.AWS_SESSION_TOKEN``) and the
    API key ``helpers.BEDROCK_API_KEY``."""
    mock = BedrockMock({helpers.AWS_ACCESS_KEY_ID: helpers.AWS_SECRET_ACCESS_KEY,
                        helpers.AWS_TEMP_ACCESS_KEY_ID: (helpers.AWS_TEMP_SECRET_ACCESS_KEY,
                                                         helpers.AWS_SESSION_TOKEN)},
                       region="us-east-1", api_keys={helpers.BEDROCK_API_KEY}).start()
    yield mock
    mock.stop()


_CLOUD_MOCKS = ("google_token_mock", "vertex_mock", "bedrock_mock")


@pytest.fixture(autouse=True)
def _reset_cloud_mocks(request):
    """Resets, before and after the test, the cloud mocks it uses (directly or through other
    fixtures); a test that uses none neither starts nor resets them."""
    used = [request.getfixturevalue(name) for name in _CLOUD_MOCKS if name in request.fixturenames]
    for mock in used:
        mock.reset()
    yield
    for mock in used:
        mock.reset()


def gateway_credentials(openai_mock, anthropic_mock) -> dict:
    """Managed providers (`@slug`) and virtual keys known to the gateway."""
    return {
        "openai-mock": {"provider": "openai", "api_key": helpers.OPENAI_SLUG_KEY,
                        "custom_host": openai_mock.base_url},
        "anthropic-mock": {"provider": "anthropic", "api_key": helpers.ANTHROPIC_SLUG_KEY,
                           "custom_host": anthropic_mock.base_url},
        "vk-openai": {"provider": "openai", "api_key": helpers.OPENAI_VK_KEY,
                      "custom_host": openai_mock.base_url},
        "vk-anthropic": {"provider": "anthropic", "api_key": helpers.ANTHROPIC_VK_KEY,
                         "custom_host": anthropic_mock.base_url},
    }


def session_cache(openai_mock) -> dict:
    """The plugin's `cache` settings of the session gateway: default budgets, semantic
    matching through the OpenAI mock's embeddings endpoint."""
    return {"semantic": {"base_url": openai_mock.base_url, "api_key": helpers.EMBED_KEY,
                         "model": helpers.EMBED_MODEL}}


@contextmanager
def running_gateway(log_dir: Path, openai_mock, anthropic_mock, cache: dict | None,
                    extra_env: dict | None = None) -> Iterator[helpers.Gateway]:
    """`build.sh run` (or E2E_GATEWAY_CMD) on free ports with the suite's settings,
    GATEWAY_CACHE = ``cache`` and ``extra_env`` (other GATEWAY_* settings), ready once /health
    answers 200, under the guards (``support.under_guards``: on exit, while Envoy still serves,
    VM never reloaded and no secret in the log; a failed check fails the fixture that started
    it); then stopped."""
    override = os.environ.get("E2E_GATEWAY_CMD")
    if override:
        cmd = shlex.split(override)
    elif BUILD_SH.exists():
        cmd = ["bash", str(BUILD_SH), "run"]
    else:
        pytest.fail(f"{BUILD_SH} does not exist: cannot start the gateway", pytrace=False)
    port, admin_port, control_plane_port = free_ports(3)
    log_path = log_dir / "gateway.log"
    # The developer's own GATEWAY_* settings (allow-list, credentials, log level, concurrency, ...)
    # must not change what the suite tests: start from none of them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({
        "GATEWAY_PORT": str(port),
        "GATEWAY_ADMIN_PORT": str(admin_port),
        "GATEWAY_API_KEYS": f"{helpers.KEY},{helpers.KEY2}",
        "GATEWAY_CREDENTIALS": json.dumps(gateway_credentials(openai_mock, anthropic_mock)),
        "GATEWAY_LOG_LEVEL": "debug",  # the filter's line per request (test_auth_headers reads it)
        # The control plane beside it: its own port, its SQLite database in the log directory.
        "GATEWAY_CONTROL_PLANE_PORT": str(control_plane_port),
        "GATEWAY_STATE_DIR": str(log_dir / "state"),
        "GATEWAY_LOCAL_MODEL": "off",  # its port would clash between gateways (test_first_run starts one)
    })
    if cache is not None:
        env["GATEWAY_CACHE"] = json.dumps(cache)
    env.update(extra_env or {})
    gw = helpers.Gateway(port, admin_port, log_path, control_plane_port)
    gw.native = env.get("GATEWAY_HOST") == "native"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    gw.process_group = proc.pid
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            rc = proc.poll()
            if rc is not None:
                pytest.fail(f"`{' '.join(cmd)}` exited early with code {rc}; output ({log_path}):\n{gw.log_tail(80)}",
                            pytrace=False)
            try:
                if httpx.get(f"{gw.origin}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway did not answer 200 on /health within {START_TIMEOUT:.0f}s; "
                            f"output ({log_path}):\n{gw.log_tail(80)}", pytrace=False)
            time.sleep(0.25)
        with support.under_guards(gw):
            yield gw
    finally:
        gw.close()
        stop_group(proc)


@pytest.fixture(scope="session")
def gateway(openai_mock, anthropic_mock, tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("gateway"), openai_mock, anthropic_mock,
                         session_cache(openai_mock)) as gw:
        yield gw


@pytest.fixture(scope="session")
def start_gateway(openai_mock, anthropic_mock, tmp_path_factory):
    """Starts another gateway, for settings the session's cannot have (e.g. a small cache
    budget), from a module-scoped fixture: ``with start_gateway("name", cache) as gw: yield gw``
    (``env``: more GATEWAY_* settings, e.g. GATEWAY_ACCESS_LOG). It gets its own ports and log,
    and the same startup wait and end checks."""
    def start(name: str, cache: dict | None, env: dict | None = None):
        return running_gateway(tmp_path_factory.mktemp(name), openai_mock, anthropic_mock, cache, env)
    return start


@pytest.fixture(scope="session")
def start_postgres(tmp_path_factory):
    """Starts a throwaway PostgreSQL server (its log in a directory named ``name``); one that
    cannot start fails the fixture: ``with start_postgres("name") as server: yield server``."""
    @contextmanager
    def start(name: str):
        try:
            with running_postgres(tmp_path_factory.mktemp(name) / "postgres.log") as server:
                yield server
        except StartFailed as e:
            pytest.fail(str(e), pytrace=False)
    return start


@pytest.fixture(scope="session")
def postgres(start_postgres):
    with start_postgres("postgres") as server:
        yield server


@pytest.fixture(autouse=True)
def _no_vm_reload(request):
    """A test after which a filter VM's reload counters moved made the VM trap: fail it
    (FAIL_RELOAD would otherwise hide the crash behind a fresh VM). Watches every running
    gateway: the session's (started first if the test uses it) and any a module started."""
    if "gateway" in request.fixturenames:
        request.getfixturevalue("gateway")
    watched = list(support.LIVE_GATEWAYS)
    if not watched:
        yield
        return
    before = [gw.vm_reload_counters() for gw in watched]
    yield
    after = [gw.vm_reload_counters() for gw in watched]
    for gw, b, a in zip(watched, before, after):
        if a != b:
            pytest.fail(f"the filter VM of the gateway on port {gw.port} was reloaded during this test "
                        f"(it trapped): {b} -> {a}", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "teardown"):
        for name, value in (getattr(item, "funcargs", None) or {}).items():
            if isinstance(value, helpers.Gateway):
                rep.sections.append((f"{name} log (tail)", value.log_tail(40)))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes over about 10 s (a real-time wait such as the 30 s "
                                       "circuit-breaker cooldown, or a load); runs in the default suite, "
                                       "deselect with -m 'not slow'")
    config.addinivalue_line("markers", "agents: runs a coding agent (Claude Code or Codex, which build.sh agents "
                                       "installs); runs in the default suite, deselect with -m 'not agents'")
    config.addinivalue_line("markers", "conformance: runs the official MCP conformance suite (Node.js, which build.sh "
                                       "conformance installs); runs in the default suite, deselect with -m 'not conformance'")
