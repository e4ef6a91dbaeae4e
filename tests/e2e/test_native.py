"""The gateway as a native Envoy dynamic module (GATEWAY_HOST=native, issue 29): the same core
as the wasm filter behind a second host adapter (src/native/).

The tests of the suites in ``SUITES`` run here again, unchanged, against gateways whose filter
is the native module: this module's ``start_gateway`` and ``gateway`` fixtures take the place of
the session's for them, so every gateway they start for themselves is native too (with its
control plane, as `build.sh run` starts it), and its ``mesh`` and ``chain`` run the mesh-shaped
Envoys of test_host_clusters and test_filter_chain with the module in the wasm filter's place.
The tests the native build does not run are reported skipped with why (``NOT_YET``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import subprocess
from types import ModuleType

import jwt
import pytest
from _pytest.fixtures import FixtureFunctionDefinition

from conftest import REPO, session_cache
from support import WASM, join_a_held_jwks_fetch, running_mesh
# (test_filter_chain's own: its Envoy's filters in front, which its `chain` below runs natively.)
from test_filter_chain import AuthorizationService, filters_in_front

# The suites that run against both builds: their tests and fixtures are taken into this module.
SUITES = (
    "test_agents", "test_anthropic", "test_auth_headers", "test_azure", "test_bedrock", "test_broken_providers",
    "test_cache", "test_client_apis", "test_client_apis_clouds", "test_control_plane", "test_endpoints",
    "test_faults", "test_filter_chain", "test_guardrails", "test_hardening", "test_host_clusters", "test_limits",
    "test_limits_robustness", "test_managed_batches", "test_mcp", "test_mcp_conformance", "test_agents_mcp",
    "test_observability", "test_providers", "test_request_logs",
    "test_resource_passthrough", "test_resources", "test_routing", "test_streaming", "test_tls_timeouts",
    "test_vertex",
)
# The suites that stay with the wasm build, and why:
# - test_deploy: deploy/'s manifests (Istio's WasmPlugin, Envoy Gateway's EnvoyExtensionPolicy) ship
#   the filter as Wasm only, so there is no native configuration of theirs to run.
# - test_image: the OCI image holds the .wasm module; the native module is not shipped as an image.
# - test_envoy_config: it validates the rendered configs with `envoy --mode validate`; every native
#   gateway this module starts loads the rendered native config, which checks more.
# - test_mocks, test_mocks_cloud, test_agents_mocks: they check the mocks and agents without a gateway.

# Tests of those suites the native build does not run, and why: reported as skipped with the reason.
NOT_YET = {
    # An async hook's call outlives the request that made it; the ABI cancels a stream's calls
    # when it ends.
    "test_an_async_webhook_does_not_delay_the_answer": "an async hook's call outlives its request",
    # The JWKS fetch rides on the stream of the client that left, so it is sent again for the
    # request that joined it: test_a_shared_fetch_whose_request_ends_is_sent_again_for_the_request_that_joined_it.
    "test_a_fetch_outlives_the_client_that_started_it": "the native module sends such a fetch again",
    # `allow_on_headers_stop_iteration` is a setting of the wasm filter; the module always gets the body.
    "test_without_stop_iteration_a_request_with_a_body_is_told_what_to_set":
        "the wasm filter's allow_on_headers_stop_iteration has no native counterpart",
    # The module defines its metrics with their labels, so no host puts the labels in the names.
    "test_without_the_stats_tags_the_labels_are_in_the_metrics_names":
        "the native module's metrics carry their labels without the stats tags",
}


def _marked(test, marks: list) -> object:
    """A copy of ``test`` carrying ``marks`` too (the suite's own function keeps only its own)."""
    @functools.wraps(test)
    def copy(*args, **kwargs):
        return test(*args, **kwargs)
    copy.pytestmark = [*getattr(test, "pytestmark", []), *(getattr(mark, "mark", mark) for mark in marks)]
    return copy


def _on_request(fixture: FixtureFunctionDefinition) -> FixtureFunctionDefinition:
    """``fixture`` as one a test must ask for: autouse here would run it for every test of this
    module, not only for its suite's."""
    marker = fixture._fixture_function_marker
    return pytest.fixture(fixture._get_wrapped_function(), scope=marker.scope, params=marker.params,
                          ids=marker.ids, name=marker.name)


def _collected(suite: ModuleType) -> dict:
    """What pytest collects from ``suite``'s namespace: its tests, and its fixtures whatever their
    names (its autouse ones are often private: `import *` would leave them out)."""
    return {name: value for name, value in vars(suite).items() if isinstance(value, FixtureFunctionDefinition) or (
        name.startswith("test") and inspect.isfunction(value))}


def _take_suites() -> dict:
    """The tests and fixtures of ``SUITES``. Each test carries its suite's `pytestmark` and asks
    for its suite's autouse fixtures (taken as fixtures it must ask for); those in ``NOT_YET`` are
    skipped with their reason. A name two suites define fails collection: the later suite's would
    shadow the earlier's, which would then run on the wasm build only."""
    taken: dict = {}
    origin: dict[str, tuple[str, object]] = {}
    for suite_name in SUITES:
        suite = importlib.import_module(suite_name)
        collected = _collected(suite)
        autouse = {name: value.name for name, value in collected.items()
                   if isinstance(value, FixtureFunctionDefinition) and value._fixture_function_marker.autouse}
        own_marks = getattr(suite, "pytestmark", [])
        suite_marks = [*(own_marks if isinstance(own_marks, list) else [own_marks]),
                       *([pytest.mark.usefixtures(*autouse.values())] if autouse else [])]
        for name, value in collected.items():
            if name in origin:
                if value is origin[name][1]:
                    continue  # one suite's test or fixture (or one from support.py), imported by another
                pytest.fail(f"{suite_name} and {origin[name][0]} both define {name}: rename one (only one of them "
                            "would run here)", pytrace=False)
            origin[name] = (suite_name, value)
            if isinstance(value, FixtureFunctionDefinition):
                taken[name] = _on_request(value) if name in autouse else value
                continue
            marks = [*suite_marks]
            if name in NOT_YET:
                marks.append(pytest.mark.skip(reason=f"not on the native build: {NOT_YET[name]}"))
            taken[name] = _marked(value, marks) if marks else value
    missing = sorted(set(NOT_YET) - set(taken))
    if missing:
        pytest.fail(f"NOT_YET names tests no suite in SUITES defines: {missing}", pytrace=False)
    return taken


globals().update(_take_suites())


@pytest.fixture(scope="module")
def start_gateway(start_gateway):
    """Every gateway the imported suites start for themselves, native (the session's
    `start_gateway` with GATEWAY_HOST=native)."""
    def start(name: str, cache: dict | None, env: dict | None = None):
        return start_gateway(f"native-{name}", cache, {**(env or {}), "GATEWAY_HOST": "native"})
    return start


@pytest.fixture(scope="module")
def gateway(start_gateway, openai_mock):
    """The session gateway's settings, the filter native."""
    with start_gateway("session", session_cache(openai_mock)) as gw:
        yield gw


NATIVE_MODULE = REPO / "target/libmodel_gateway.so"
NATIVE_FILTER = "envoy.filters.http.dynamic_modules"


def as_native(adapt=lambda _: None):
    """test_host_clusters' mesh-shaped config (changed by ``adapt`` first) with the native module
    in the wasm filter's place: the same plugin configuration, routes that disable it by its name."""
    def native(envoy_config: dict) -> None:
        adapt(envoy_config)
        manager = envoy_config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        for i, http_filter in enumerate(manager["http_filters"]):
            if http_filter["name"] == "envoy.filters.http.wasm":
                plugin = http_filter["typed_config"]["config"]["configuration"]
                manager["http_filters"][i] = {"name": NATIVE_FILTER, "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
                    "dynamic_module_config": {"module": {"local": {"filename": str(NATIVE_MODULE)}}},
                    "filter_name": "model_gateway", "filter_config": plugin}}
        for virtual_host in manager["route_config"]["virtual_hosts"]:
            for scope in [virtual_host, *virtual_host["routes"]]:
                per_filter = scope.get("typed_per_filter_config", {})
                if "envoy.filters.http.wasm" in per_filter:
                    per_filter[NATIVE_FILTER] = per_filter.pop("envoy.filters.http.wasm")
    return native


@pytest.fixture(scope="module")
def mesh(gateway, openai_mock, anthropic_mock, vertex_mock, google_token_mock, tmp_path_factory):
    """test_host_clusters' `mesh`, native (`gateway`: the module is built)."""
    with running_mesh(tmp_path_factory.mktemp("native-mesh"),
                      [openai_mock, anthropic_mock, vertex_mock, google_token_mock], WASM, adapt=as_native()) as gw:
        yield gw


@pytest.fixture(scope="module")
def chain(gateway, openai_mock, signing_key, tmp_path_factory):
    """test_filter_chain's `chain`, native (`gateway`: the module is built)."""
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    authz = AuthorizationService()
    adapt = filters_in_front(authz.port, {"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]},
                             openai_mock.port)
    try:
        with running_mesh(tmp_path_factory.mktemp("native-chain"), [openai_mock], WASM,
                          adapt=as_native(adapt)) as gw:
            gw.authz = authz
            yield gw
    finally:
        authz.stop()


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


def test_a_shared_fetch_whose_request_ends_is_sent_again_for_the_request_that_joined_it(one_worker, openai_mock,
                                                                                       hooks):
    """A JWKS fetch rides on the stream of the request that started it (the ABI cancels a
    stream's calls when it ends). When that client goes away while the JWKS server stalls, the
    fetch is sent again for the request that joined it (as the wasm filter's root context goes
    on with it: test_faults.py), not answered after the 70 s bound on lost fetches; the joined
    request then passes, and the next one uses the JWKS fetched."""
    joined, checked = join_a_held_jwks_fetch(one_worker, openai_mock, hooks, "carried")
    assert hooks.wait_for("/jwks-carried.json", 2), "the fetch was not sent again for the joined request"
    hooks.hold_jwks.set()
    answer = joined.getresponse()
    text = answer.read().decode()
    joined.close()
    assert answer.status == 200, text
    r = one_worker.chat(checked)
    assert r.status_code == 200, r.text
    assert len(hooks.of("/jwks-carried.json")) == 2, "the JWKS sent again served both"
