"""Every shipped Envoy config is valid for real Envoy, and the committed deployable config
is exactly what the template renders (the `run` config and envoy/envoy.yaml cannot drift)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENVOY = REPO / ".venv/bin/envoy"
RENDER = REPO / "envoy/render.py"


def render(*args: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run([sys.executable, str(RENDER), *args], env={**clean, **env}, check=True,
                          capture_output=True, text=True).stdout


def validate(config: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "envoy.yaml"
    path.write_text(config)
    return subprocess.run([str(ENVOY), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=120)


def test_committed_deployable_config_matches_the_template():
    assert (REPO / "envoy/envoy.yaml").read_text() == render("--docker"), (
        "envoy/envoy.yaml is stale: regenerate it with `python3 envoy/render.py --docker > envoy/envoy.yaml`")


@pytest.mark.parametrize("name, config", [
    # The container's filter path is swapped for the local build; nothing else changes.
    ("deployable", lambda: (REPO / "envoy/envoy.yaml").read_text().replace(
        "/etc/envoy/model_gateway.wasm", str(REPO / "target/model_gateway.wasm"))),
    ("run", lambda: render(GATEWAY_API_KEYS="gw-a,gw-b", GATEWAY_ALLOWED_CUSTOM_HOSTS="loopback,*.corp.example",
                           GATEWAY_CREDENTIALS='{"openai-prod": {"provider": "openai", "api_key": "sk-x"}}',
                           GATEWAY_WASM=str(REPO / "target/model_gateway.wasm"))),
])
def test_shipped_configs_pass_envoy_validation(name, config, tmp_path):
    result = validate(config(), tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK" in result.stdout + result.stderr


def test_render_refuses_bad_settings():
    for env in ({}, {"GATEWAY_API_KEYS": "k", "GATEWAY_CREDENTIALS": "[1]"},
                {"GATEWAY_API_KEYS": "k", "GATEWAY_CREDENTIALS": "{bad"},
                {"GATEWAY_API_KEYS": "k", "GATEWAY_ACCESS_LOG": "on"}):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        result = subprocess.run([sys.executable, str(RENDER)], env={**clean, **env}, capture_output=True, text=True)
        assert result.returncode != 0
        assert "render.py:" in result.stderr
