"""The gateway as a native Envoy dynamic module (GATEWAY_HOST=native, issue 29): the same core
as the wasm filter behind a second host adapter (src/native/).

The tests of the modules imported below run here again, unchanged, against a gateway whose
filter is the native module: this module's ``gateway`` fixture takes the place of the session's
for them. The native module runs without a control plane for now, and has no root timer of
its own yet (retries after a delay, limits, the control plane's entries and record shipping are
the wasm filter's alone): the tests that need those stay with the wasm build (``NOT_YET``).
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import REPO, session_cache

# The suites that run against both builds.
from test_anthropic import *  # noqa: F401,F403
from test_auth_headers import *  # noqa: F401,F403
from test_azure import *  # noqa: F401,F403
from test_azure import _reset_azure  # noqa: F401 (autouse; `import *` skips it)
from test_bedrock import *  # noqa: F401,F403
from test_broken_providers import *  # noqa: F401,F403
from test_broken_providers import IDLE_TIMEOUT
from test_cache import *  # noqa: F401,F403
from test_cache import BYTE_BUDGET, MAX_ENTRY_BYTES
from test_client_apis import *  # noqa: F401,F403
from test_endpoints import *  # noqa: F401,F403
from test_guardrails import *  # noqa: F401,F403
from test_guardrails import _reset_hooks  # noqa: F401 (autouse; `import *` skips it)
from test_guardrails import join_a_held_jwks_fetch
from test_hardening import *  # noqa: F401,F403
from test_observability import *  # noqa: F401,F403
from test_observability import observed
from test_providers import *  # noqa: F401,F403
from test_resource_passthrough import *  # noqa: F401,F403
from test_resources import *  # noqa: F401,F403
from test_routing import *  # noqa: F401,F403
from test_streaming import *  # noqa: F401,F403
from test_tls_timeouts import *  # noqa: F401,F403
from test_vertex import *  # noqa: F401,F403

NATIVE_ENV = {"GATEWAY_HOST": "native", "GATEWAY_CONTROL_PLANE": "off"}

# Tests of the imported suites that need what the native module does not do yet, and why: they
# run against the wasm build only.
NOT_YET = {
    "test_unknown_saved_config_id_is_404": "saved configs are the control plane's",
    "test_unknown_managed_provider_is_404": "stored providers are the control plane's",
    "test_unknown_stored_prompt_or_guardrail_is_404": "stored prompts and guardrails are the control plane's",
    "test_each_request_writes_one_json_access_log_line_with_every_field":
        "a record's workspace is its control-plane key's",
    # A workspace's key, kept responses: the control plane's.
    "test_each_workspace_is_its_own_tenant": "workspace keys are the control plane's",
    "test_a_kept_response_continues_reads_lists_and_deletes": "kept responses are the control plane's",
    "test_a_streamed_response_is_kept_and_store_false_is_not": "kept responses are the control plane's",
    "test_batches_list_and_cancel_via_sdk": "uses a workspace key of the control plane's",
    "test_passing_list_queries_arrive_as_given": "uses a workspace key of the control plane's",
    "test_sdk_lists_pass": "uses a workspace key of the control plane's",
    "test_any_way_of_selecting_a_provider_is_enough": "uses a workspace key of the control plane's",
    "test_embeddings_and_files_use_azures_paths": "uses a workspace key of the control plane's",
    # An async hook's call outlives the request that made it; the ABI cancels a stream's calls
    # when it ends.
    "test_an_async_webhook_does_not_delay_the_answer": "an async hook's call outlives its request",
}
for _name in NOT_YET:
    globals().pop(_name, None)


@pytest.fixture(scope="module")
def gateway(start_gateway, openai_mock):
    """The session gateway's settings, the filter native."""
    with start_gateway("native", session_cache(openai_mock), NATIVE_ENV) as gw:
        yield gw


@pytest.fixture(scope="module")
def small_cache_gateway(start_gateway):
    """test_cache's gateway with a small cache, native."""
    cache = {"byte_budget": BYTE_BUDGET, "max_entry_bytes": MAX_ENTRY_BYTES}
    with start_gateway("native-small-cache", cache, NATIVE_ENV) as gw:
        yield gw


@pytest.fixture(scope="module")
def obs(start_gateway, tmp_path_factory):
    """test_observability's gateway, native."""
    yield from observed(start_gateway, tmp_path_factory, "native-observability", NATIVE_ENV)


@pytest.fixture(scope="module")
def idle(start_gateway):
    """test_broken_providers' gateway with a short stream idle timeout, native."""
    with start_gateway("native-idle", None, {**NATIVE_ENV, "GATEWAY_STREAM_IDLE_TIMEOUT": str(IDLE_TIMEOUT)}) as gw:
        yield gw


# --------------------------------------------------------------------------- the module's own


def test_the_module_refuses_a_host_without_its_abi(gateway, tmp_path):
    """Loaded by a process that lacks Envoy 1.40's callbacks (an Envoy of another ABI), the
    module's init says so in one line and returns no ABI version, so Envoy refuses to load it
    instead of crashing at its first call. (`gateway`: the module is built.)"""
    host = tmp_path / "host.c"
    host.write_text(r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *module = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!module) { printf("dlopen failed: %s\n", dlerror()); return 2; }
  const char *(*init)(void) = (const char *(*)(void))dlsym(module, "envoy_dynamic_module_on_program_init");
  if (!init) { printf("no init\n"); return 3; }
  const char *version = init();
  printf("init returned %s\n", version ? version : "NULL");
  return 0;
}
""")
    binary = tmp_path / "host"
    subprocess.run(["cc", "-o", str(binary), str(host), "-ldl"], check=True)
    module = REPO / "target" / "libmodel_gateway.so"
    done = subprocess.run([str(binary), str(module)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "init returned NULL", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "this Envoy lacks the callback envoy_dynamic_module_callback_" in lines[0], lines[0]
    assert "Envoy 1.40's dynamic-module ABI v0.2.0" in lines[0], lines[0]


def test_build_sh_refuses_the_native_module_with_a_control_plane():
    """Until the native module runs the root's duties, `build.sh run` says how to start it
    rather than starting an Envoy that would refuse its config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_HOST"] = "native"
    done = subprocess.run(["bash", str(REPO / "build.sh"), "run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert "set GATEWAY_CONTROL_PLANE=off" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def one_worker(start_gateway, openai_mock):
    """The native gateway with one worker thread: its requests share that worker's fetches."""
    with start_gateway("native-one-worker", session_cache(openai_mock),
                       {**NATIVE_ENV, "GATEWAY_CONCURRENCY": "1"}) as gw:
        yield gw


def test_a_shared_fetch_whose_request_ends_is_sent_again_for_the_request_that_joined_it(one_worker, openai_mock,
                                                                                       hooks):
    """A JWKS fetch rides on the stream of the request that started it (the ABI cancels a
    stream's calls when it ends). When that client goes away while the JWKS server stalls, the
    fetch is sent again for the request that joined it (as the wasm filter's root context goes
    on with it: test_faults.py), not answered after the 70 s bound on lost fetches; the joined
    request then passes, and the next one uses the JWKS fetched."""
    joined, checked = join_a_held_jwks_fetch(one_worker, openai_mock, hooks, "carried")
    deadline = time.monotonic() + 10
    while len(hooks.of("/jwks-carried.json")) < 2:
        assert time.monotonic() < deadline, "the fetch was not sent again for the joined request"
        time.sleep(0.05)
    hooks.hold_jwks.set()
    answer = joined.getresponse()
    text = answer.read().decode()
    joined.close()
    assert answer.status == 200, text
    r = one_worker.chat(checked)
    assert r.status_code == 200, r.text
    assert len(hooks.of("/jwks-carried.json")) == 2, "the JWKS sent again served both"
