#!/usr/bin/env python3
"""Renders envoy/gateway.yaml.tmpl into an Envoy config, from the environment.

The config `./build.sh run` uses and the deployable envoy/envoy.yaml (`--docker`) both come
from here, so they cannot drift. Settings (environment variables):
  GATEWAY_PORT (8787), GATEWAY_ADMIN_PORT (9901), GATEWAY_LISTEN_ADDRESS (127.0.0.1),
  GATEWAY_WASM (path of the filter), GATEWAY_API_KEYS (comma-separated, required),
  GATEWAY_HOST (wasm, the default; native: the filter as a dynamic module, GATEWAY_NATIVE_MODULE
  its path, no control plane yet),
  GATEWAY_ALLOWED_CUSTOM_HOSTS (comma-separated; default "loopback"),
  GATEWAY_CREDENTIALS (JSON object: slug or virtual key -> {provider, api_key, custom_host, ...}),
  GATEWAY_CACHE (JSON object: the response cache's byte_budget, max_entry_bytes and semantic
  embeddings provider; see the README),
  GATEWAY_METRICS (JSON object: the metrics' model label bound, `models` and `max_models`),
  GATEWAY_RECORDS (JSON object: the request records' `max_queued`, `bodies` and `max_body_bytes`),
  GATEWAY_MCP_SERVERS (JSON object: MCP server id -> {url, headers, timeout_ms}; docs/mcp.md),
  GATEWAY_MCP_ALLOWED_ORIGINS (comma-separated browser origins that may call /mcp; docs/mcp.md),
  GATEWAY_MCP_OAUTH (JSON object: the OAuth issuer whose access tokens the MCP endpoints take,
  {issuer, jwks_uri, resource, workspace_claim}; docs/mcp.md),
  GATEWAY_MCP_SESSION_KEY (32 bytes in base64, the same on every replica: seals the MCP servers'
  sessions in the aggregate's session ids; docs/mcp.md),
  GATEWAY_ACCESS_LOG (absolute path of the JSON access log; default /dev/stdout; "off": none),
  GATEWAY_STREAM_IDLE_TIMEOUT (seconds without a byte from the provider or the client before
  Envoy ends a request; default 300, Envoy's own; 0: never),
  GATEWAY_CA_BUNDLE (/etc/ssl/certs/ca-certificates.crt),
  GATEWAY_CONTROL_PLANE_ADDR (host:port of the control plane; unset: none) with
  GATEWAY_CONTROL_PLANE_TOKEN (the filter's bearer token for the control plane's lookups).
"""
import json
import os
import re
import string
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The deployable config for the official Envoy image (docker-compose.yml mounts the filter
# there). The committed envoy/envoy.yaml is this with no GATEWAY_* variables set.
DOCKER = {
    "GATEWAY_LISTEN_ADDRESS": "0.0.0.0",
    "GATEWAY_WASM": "/etc/envoy/model_gateway.wasm",
}
DOCKER_PLACEHOLDER_KEY = "change-me-gateway-key"


def split_list(value):
    return [item.strip() for item in value.split(",") if item.strip()]


def json_object(env, name):
    """The JSON object in variable `name` (empty when unset); exits with a clear message otherwise."""
    try:
        value = json.loads(env.get(name) or "{}")
    except json.JSONDecodeError as err:
        sys.exit(f"render.py: {name} is not valid JSON: {err}")
    if not isinstance(value, dict):
        sys.exit(f"render.py: {name} must be a JSON object")
    return value


def strip_section(text, name):
    """The template without its `# <name>: begin` ... `# <name>: end` sections."""
    return re.sub(rf"(?ms)^ *# {name}: begin\n.*?^ *# {name}: end\n", "", text)


def render(env):
    keys = split_list(env.get("GATEWAY_API_KEYS", ""))
    if not keys:
        sys.exit("render.py: GATEWAY_API_KEYS is empty")
    credentials = json_object(env, "GATEWAY_CREDENTIALS")
    cache = json_object(env, "GATEWAY_CACHE")
    metrics = json_object(env, "GATEWAY_METRICS")
    records = json_object(env, "GATEWAY_RECORDS")
    mcp_servers = json_object(env, "GATEWAY_MCP_SERVERS")
    plugin = {
        "api_keys": keys,
        "allowed_custom_hosts": split_list(env.get("GATEWAY_ALLOWED_CUSTOM_HOSTS") or "loopback"),
        "credentials": credentials,
    }
    if cache:
        plugin["cache"] = cache
    if metrics:
        plugin["metrics"] = metrics
    if records:
        plugin["records"] = records
    if mcp_servers:
        plugin["mcp_servers"] = mcp_servers
    mcp_origins = split_list(env.get("GATEWAY_MCP_ALLOWED_ORIGINS", ""))
    if mcp_origins:
        plugin["mcp_allowed_origins"] = mcp_origins
    mcp_oauth = json_object(env, "GATEWAY_MCP_OAUTH")
    if mcp_oauth:
        plugin["mcp_oauth"] = mcp_oauth
    if env.get("GATEWAY_MCP_SESSION_KEY"):
        plugin["mcp_session_key"] = env["GATEWAY_MCP_SESSION_KEY"]
    text = (HERE / "gateway.yaml.tmpl").read_text()
    host = env.get("GATEWAY_HOST") or "wasm"
    if host not in ("wasm", "native"):
        sys.exit(f"render.py: GATEWAY_HOST must be wasm or native, not {host!r}")
    text = strip_section(text, "native" if host == "wasm" else "wasm")
    control_plane = env.get("GATEWAY_CONTROL_PLANE_ADDR") or ""
    cp_host, _, cp_port = control_plane.rpartition(":")
    if control_plane:
        token = env.get("GATEWAY_CONTROL_PLANE_TOKEN") or ""
        if not token:
            sys.exit("render.py: GATEWAY_CONTROL_PLANE_ADDR needs GATEWAY_CONTROL_PLANE_TOKEN")
        if not cp_host or not cp_port.isdigit():
            sys.exit(f"render.py: GATEWAY_CONTROL_PLANE_ADDR must be host:port, not {control_plane!r}")
        plugin["control_plane"] = {"cluster": "gateway_control_plane", "authority": control_plane, "token": token}
    else:
        text = strip_section(text, "control-plane")
    access_log = env.get("GATEWAY_ACCESS_LOG") or "/dev/stdout"
    if access_log == "off":
        text = strip_section(text, "access-log")
    elif not access_log.startswith("/"):
        # A relative path would land wherever Envoy runs (`on` wrote a file named `on`).
        sys.exit(f'render.py: GATEWAY_ACCESS_LOG must be an absolute path or "off", not {access_log!r}')
    idle = env.get("GATEWAY_STREAM_IDLE_TIMEOUT") or "300"
    if not idle.isdigit():
        sys.exit(f"render.py: GATEWAY_STREAM_IDLE_TIMEOUT must be a whole number of seconds, not {idle!r}")
    template = string.Template(text)
    return template.substitute(
        PORT=int(env.get("GATEWAY_PORT") or 8787),
        ADMIN_PORT=int(env.get("GATEWAY_ADMIN_PORT") or 9901),
        LISTEN_ADDRESS=env.get("GATEWAY_LISTEN_ADDRESS") or "127.0.0.1",
        WASM_PATH=json.dumps(env.get("GATEWAY_WASM") or str(HERE.parent / "target/model_gateway.wasm")),
        NATIVE_MODULE_PATH=json.dumps(env.get("GATEWAY_NATIVE_MODULE") or str(HERE.parent / "target/libmodel_gateway.so")),
        CA_BUNDLE=json.dumps(env.get("GATEWAY_CA_BUNDLE") or "/etc/ssl/certs/ca-certificates.crt"),
        ACCESS_LOG_PATH=json.dumps(access_log),
        STREAM_IDLE_TIMEOUT=int(idle),
        CONTROL_PLANE_HOST=json.dumps(cp_host),
        CONTROL_PLANE_PORT=int(cp_port or 0),
        # A JSON string literal is a valid YAML double-quoted scalar.
        PLUGIN_CONFIGURATION=json.dumps(json.dumps(plugin, separators=(",", ":"))),
        LOOKUP_GATE_CONFIGURATION=json.dumps(json.dumps({**plugin, "lookup_gate": True}, separators=(",", ":"))),
    )


if __name__ == "__main__":
    env = dict(os.environ)
    if "--docker" in sys.argv[1:]:
        env = {**env, **DOCKER}
        env.setdefault("GATEWAY_API_KEYS", DOCKER_PLACEHOLDER_KEY)
    sys.stdout.write(render(env))
