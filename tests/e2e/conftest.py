"""Fixtures of the gateway end-to-end tests.

* ``openai_mock`` / ``anthropic_mock`` (session): the mock providers, reset before and
  after every test by an autouse fixture.
* ``gateway`` (session): `build.sh run` started once, in its own process group, with
  GATEWAY_PORT, GATEWAY_ADMIN_PORT, GATEWAY_API_KEYS, GATEWAY_CREDENTIALS and
  GATEWAY_LOG_LEVEL=info (and no other GATEWAY_* variable from the caller's environment);
  ready when `GET /health` answers 200. Its output goes to a log file whose tail is
  attached to every failing test that used it. At the end of the session (before Envoy
  stops) it fails if the filter VM was ever reloaded (`wasm.model_gateway.vm_reload*` in
  Envoy's /stats) or a secret appears in the log.
* ``_no_vm_reload`` (autouse, tests using ``gateway``): fails the test during which the
  filter VM was reloaded.

Environment knobs:
* GATEWAY_START_TIMEOUT: seconds to wait for /health (default 120).
* E2E_GATEWAY_CMD: a command line to run instead of `bash build.sh run` (same environment
  contract), e.g. to try the suite against another build of the gateway.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # make the helper modules importable under any import mode
    sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("helpers")

import helpers  # noqa: E402
import httpx2 as httpx  # noqa: E402
from mocks import AnthropicMock, OpenAIMock  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "build.sh"
START_TIMEOUT = float(os.environ.get("GATEWAY_START_TIMEOUT", "120"))


@pytest.fixture(scope="session")
def openai_mock():
    mock = OpenAIMock().start()
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


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    else:  # the shell is gone; children it left in the group get the signal too
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="session")
def gateway(openai_mock, anthropic_mock, tmp_path_factory):
    override = os.environ.get("E2E_GATEWAY_CMD")
    if override:
        cmd = shlex.split(override)
    elif BUILD_SH.exists():
        cmd = ["bash", str(BUILD_SH), "run"]
    else:
        pytest.fail(f"{BUILD_SH} does not exist: cannot start the gateway", pytrace=False)
    port, admin_port = _free_ports(2)
    log_dir = tmp_path_factory.mktemp("gateway")
    log_path = log_dir / "gateway.log"
    # The developer's own GATEWAY_* settings (allow-list, credentials, log level, concurrency, ...)
    # must not change what the suite tests: start from none of them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({
        "GATEWAY_PORT": str(port),
        "GATEWAY_ADMIN_PORT": str(admin_port),
        "GATEWAY_API_KEYS": f"{helpers.KEY},{helpers.KEY2}",
        "GATEWAY_CREDENTIALS": json.dumps(gateway_credentials(openai_mock, anthropic_mock)),
        "GATEWAY_LOG_LEVEL": "info",  # one log line per request (test_auth_headers reads it)
    })
    gw = helpers.Gateway(port, admin_port, log_path)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        yield gw
        problems = _session_end_problems(gw)
    finally:
        gw.close()
        _stop_group(proc)
    if problems:
        pytest.fail("at the end of the session:\n" + "\n".join(problems), pytrace=False)


def _session_end_problems(gw: helpers.Gateway) -> list[str]:
    """Checks over the whole session, run while Envoy still serves: the filter VM was never
    reloaded (under FAIL_RELOAD a trap is otherwise invisible to the tests) and no secret
    ever reached the gateway's log."""
    problems = []
    try:
        counters = gw.vm_reload_counters()
    except httpx.HTTPError as e:
        problems.append(f"cannot read Envoy's /stats: {e!r}")
    except pytest.fail.Exception as e:
        problems.append(str(e))
    else:
        if any(counters.values()):
            problems.append(f"the filter VM trapped and was reloaded during the session: {counters}")
    try:
        helpers.assert_no_secrets_in_log(gw)
    except AssertionError as e:
        problems.append(str(e))
    return problems


@pytest.fixture(autouse=True)
def _no_vm_reload(request):
    """A test after which the filter VM's reload counters moved made the VM trap: fail it
    (FAIL_RELOAD would otherwise hide the crash behind a fresh VM)."""
    if "gateway" not in request.fixturenames:
        yield
        return
    gw = request.getfixturevalue("gateway")
    before = gw.vm_reload_counters()
    yield
    after = gw.vm_reload_counters()
    if after != before:
        pytest.fail(f"the filter VM was reloaded during this test (it trapped): {before} -> {after}",
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "teardown"):
        gw = item.funcargs.get("gateway") if hasattr(item, "funcargs") else None
        if isinstance(gw, helpers.Gateway):
            rep.sections.append(("gateway log (tail)", gw.log_tail(40)))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: waits for a real-time interval (e.g. the 30 s circuit-breaker "
                                       "cooldown); runs in the default suite, deselect with -m 'not slow'")
