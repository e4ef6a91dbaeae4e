"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned in build.sh and
installed by `build.sh conformance` into .tools/conformance) against a conformance server written
with the Python SDK (mcp_conformance_server.py): once against the server directly, once through
the gateway's `/mcp/{server}` in front of it. Every scenario the server passes directly must pass
through the gateway; one it fails directly is reported skipped with the suite's own words (issue 46,
docs/mcp.md "Conformance"). Two suites: 0.1.16's server scenarios of the 2025 protocol era, and the
pre-release's `--requirements 2026-07-28` (the stateless era, and the extensions and pending
scenarios it runs beside them, unscored there).

The suite has no option for a header: the gateway key reaches the gateway through a preloaded
module (conformance_auth.mjs) that adds `Authorization: Bearer <key>` to its requests there."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import helpers
from mcp_conformance_server import ConformanceServer

pytestmark = pytest.mark.conformance

REPO = Path(__file__).resolve().parents[2]
PACKAGES = REPO / ".tools" / "conformance" / "node_modules"
NODE = PACKAGES / ".bin" / "node"
AUTH_PRELOAD = Path(__file__).resolve().parent / "conformance_auth.mjs"
SERVER_ID = "conformance"
# A whole run of a suite takes seconds; this bounds a hung one.
RUN_TIMEOUT_S = 180

# Each suite: its package (an npm alias in .tools/conformance), its arguments, and the scenarios it
# runs, by name (a pinned version runs a fixed set: a changed set fails the test that compares them).
SUITES = {
    "2025": ("conformance-2025", [], [
        "server-initialize", "logging-set-level", "ping", "completion-complete", "tools-list",
        "tools-call-simple-text", "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
        "tools-call-mixed-content", "tools-call-with-logging", "tools-call-error", "tools-call-with-progress",
        "tools-call-sampling", "tools-call-elicitation", "elicitation-sep1034-defaults",
        "server-sse-multiple-streams", "elicitation-sep1330-enums", "resources-list", "resources-read-text",
        "resources-read-binary", "resources-templates-read", "resources-subscribe", "resources-unsubscribe",
        "prompts-list", "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
        "prompts-get-with-image", "dns-rebinding-protection",
    ]),
    "2026-07-28": ("conformance-2026", ["--requirements", "2026-07-28"], [
        "server-stateless", "completion-complete", "tools-list", "tools-call-simple-text", "tools-call-image",
        "tools-call-audio", "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-error",
        "tools-call-with-progress", "server-sse-multiple-streams", "resources-list", "resources-read-text",
        "resources-read-binary", "resources-templates-read", "sep-2164-resource-not-found", "prompts-list",
        "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image",
        "dns-rebinding-protection", "caching", "input-required-result-basic-elicitation",
        "input-required-result-basic-sampling", "input-required-result-basic-list-roots",
        "input-required-result-request-state", "input-required-result-multiple-input-requests",
        "input-required-result-multi-round", "input-required-result-missing-input-response",
        "input-required-result-non-tool-request", "input-required-result-result-type",
        "input-required-result-unsupported-methods", "input-required-result-tampered-state",
        "input-required-result-capability-check", "input-required-result-ignore-extra-params",
        "input-required-result-validate-input",
        # Run beside the requirements, unscored by the suite: the tasks extension, and pending ones.
        "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
        "tasks-mrtr-input", "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-status-notifications",
        "tasks-required-task-error", "tasks-mrtr-composition", "json-schema-2020-12", "http-header-validation",
        "http-custom-header-server-validation",
    ]),
}
# Gateway defects the suite finds (scenarios that pass directly and fail through the gateway), each
# an expected failure until fixed: strict, so the fix shows as an unexpected pass.
GATEWAY_DEFECTS: dict[str, str] = {}
# A check with another status (FAILURE) fails its scenario; a WARNING is a SHOULD the suite scores as passed.
PASSING = {"SUCCESS", "WARNING", "INFO", "SKIPPED"}
# How much of a failed check's details (statuses, bodies) a report quotes.
DETAILS_CHARS = 600
# The suite's result folders: server-<scenario>-<ISO timestamp>.
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T")


def run_suite(suite: str, url: str, out: Path, gateway_origin: str | None = None) -> dict[str, list[str]]:
    """Runs one suite against ``url``; returns each scenario's failed checks (empty: it passed)."""
    package, arguments, _ = SUITES[suite]
    env = {"PATH": os.environ["PATH"], "HOME": str(out), "LANG": "C.UTF-8"}
    preload: list[str] = []
    if gateway_origin:
        preload = ["--import", str(AUTH_PRELOAD)]
        env |= {"CONFORMANCE_GATEWAY_ORIGIN": gateway_origin,
                "CONFORMANCE_GATEWAY_AUTHORIZATION": f"Bearer {helpers.KEY}"}
    command = [str(NODE), *preload, str(PACKAGES / package / "dist" / "index.js"), "server", "--url", url,
               "-o", str(out), *arguments]
    # Its exit status says whether every scenario passed; the checks say which did not.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    results: dict[str, list[str]] = {}
    for checks in sorted(out.glob("server-*/checks.json")):
        match = RESULT_DIR.match(checks.parent.name)
        assert match, f"unexpected result folder {checks.parent}"
        results[match["scenario"]] = [
            f"{check.get('id')}: {check.get('status')}: {check.get('errorMessage') or check.get('description')}"
            f" (details: {json.dumps(check.get('details'))[:DETAILS_CHARS]})"
            for check in json.loads(checks.read_text()) if check.get("status") not in PASSING]
    assert results, f"the suite ran no scenario (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return results


@pytest.fixture(scope="module")
def conformance_server():
    installed = subprocess.run(["bash", str(REPO / "build.sh"), "conformance"], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, f"./build.sh conformance failed:\n{installed.stderr[-3000:]}"
    with ConformanceServer() as running:
        yield running


@pytest.fixture(scope="module")
def conformance_gw(conformance_server, start_gateway):
    servers = {SERVER_ID: {"url": conformance_server.url}}
    with start_gateway("mcp-conformance", None, {"GATEWAY_MCP_SERVERS": json.dumps(servers)}) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def results(conformance_server, conformance_gw, tmp_path_factory):
    """Each suite's results, directly and through the gateway: {suite: {"direct"|"gateway": {scenario: failures}}}."""
    runs = {}
    for suite in SUITES:
        runs[suite] = {
            "direct": run_suite(suite, conformance_server.url, tmp_path_factory.mktemp(f"direct-{suite}")),
            "gateway": run_suite(suite, f"{conformance_gw.origin}/mcp/{SERVER_ID}",
                                 tmp_path_factory.mktemp(f"gateway-{suite}"), gateway_origin=conformance_gw.origin),
        }
    return runs


@pytest.mark.parametrize("suite", SUITES)
def test_the_suite_runs_the_scenarios_named_here(results, suite):
    named = set(SUITES[suite][2])
    assert set(results[suite]["direct"]) == named
    assert set(results[suite]["gateway"]) == named


@pytest.mark.parametrize(("suite", "scenario"), [
    pytest.param(suite, scenario, marks=[pytest.mark.xfail(strict=True, reason=GATEWAY_DEFECTS[scenario])]
                 if scenario in GATEWAY_DEFECTS else [])
    for suite, (_, _, names) in SUITES.items() for scenario in names])
def test_a_scenario_passing_directly_passes_through_the_gateway(results, conformance_gw, suite, scenario):
    direct = results[suite]["direct"].get(scenario)
    through = results[suite]["gateway"].get(scenario)
    assert direct is not None and through is not None, f"the {suite} suite did not run {scenario}"
    if direct:
        pytest.skip(f"fails against the conformance server directly: {'; '.join(direct)}")
    assert not through, (f"{scenario} passes directly but not through the gateway:\n" + "\n".join(through)
                         + f"\n--- gateway log\n{conformance_gw.log_tail(60)}")
