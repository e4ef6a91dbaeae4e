"""The filter behind the filters an API gateway already runs, in the mesh-shaped Envoy of
`test_host_clusters`: CORS, JWT authentication, ext_authz (an authorization service on
loopback), header mutation and Lua come first in the chain. Each one's work reaches the provider
and the client as it would without the gateway, what they answer themselves never reaches it,
and a route with the filter disabled passes byte for byte."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2 as httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from helpers import KEY, chat_body, config
from pg_server import free_ports
from support import WASM, host, mesh_cluster, running_mesh

ORIGIN = "https://app.example"
ISSUER = "https://idp.example"


class AuthorizationService:
    """An ext_authz HTTP service: allows the team `platform` and names its user to the upstream."""

    def __init__(self):
        self.checked: list[dict] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_any(self):
                service.checked.append({k.lower(): v for k, v in self.headers.items()})
                allowed = self.headers.get("x-team") == "platform"
                body = b"" if allowed else b"team not allowed"
                self.send_response(200 if allowed else 403)
                if allowed:
                    self.send_header("x-authz-user", "alice")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_OPTIONS = do_any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True, name="authz").start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def filters_in_front(authz_port: int, jwks: dict, openai_port: int):
    """Adds the API gateway's own filters before ours, the CORS policy, a catch-all route (the
    route CORS reads its policy from before the gateway picks a host), and a route of another
    team's service with our filter disabled."""

    def adapt(envoy_config: dict) -> None:
        resources = envoy_config["static_resources"]
        manager = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        front = [
            {"name": "envoy.filters.http.cors",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
            {"name": "envoy.filters.http.jwt_authn", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
                "providers": {"idp": {"issuer": ISSUER, "local_jwks": {"inline_string": json.dumps(jwks)},
                                      "from_headers": [{"name": "x-user-jwt"}],
                                      "forward_payload_header": "x-jwt-payload"}},
                "rules": [{"match": {"prefix": "/v1"}, "requires": {"provider_name": "idp"}}]}},
            {"name": "envoy.filters.http.ext_authz", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                "transport_api_version": "V3",
                "allowed_headers": {"patterns": [{"exact": "x-team"}]},
                "http_service": {
                    "server_uri": {"uri": f"http://127.0.0.1:{authz_port}", "cluster": "authz", "timeout": "2s"},
                    "authorization_response": {"allowed_upstream_headers": {"patterns": [{"exact": "x-authz-user"}]}},
                }}},
            {"name": "envoy.filters.http.header_mutation", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": "x-mutated", "value": "yes"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}},
            {"name": "envoy.filters.http.lua", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                "default_source_code": {"inline_string": (
                    'function envoy_on_request(handle) handle:headers():add("x-lua-request", "seen") end\n'
                    'function envoy_on_response(handle) handle:headers():add("x-lua-response", "seen") end\n')}}},
        ]
        manager["http_filters"][:0] = front
        virtual_host = manager["route_config"]["virtual_hosts"][0]
        virtual_host["typed_per_filter_config"] = {"envoy.filters.http.cors": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
            "allow_origin_string_match": [{"exact": ORIGIN}], "allow_methods": "GET, POST",
            "allow_headers": "content-type, x-gateway-api-key, x-gateway-config, x-user-jwt, x-team",
            "expose_headers": "x-gateway-trace-id"}}
        disabled = {"envoy.filters.http.wasm": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                                                "disabled": True}}
        virtual_host["routes"].insert(0, {"match": {"prefix": "/service"}, "typed_per_filter_config": disabled,
                                          "route": {"cluster": mesh_cluster(openai_port)}})
        # CORS reads its policy from a route that forwards (not a direct response).
        virtual_host["routes"].append({"match": {"prefix": "/"}, "route": {"cluster": "unrouted"}})
        (nowhere,) = free_ports(1)
        resources["clusters"] += [static_cluster("authz", authz_port), static_cluster("unrouted", nowhere)]

    return adapt


def static_cluster(name: str, port: int) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "2s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}


@pytest.fixture(scope="module")
def signing_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def chain(openai_mock, signing_key, tmp_path_factory):
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    authz = AuthorizationService()
    adapt = filters_in_front(authz.port, {"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]},
                             openai_mock.port)
    try:
        with running_mesh(tmp_path_factory.mktemp("chain"), [openai_mock], WASM, adapt=adapt) as gw:
            gw.authz = authz
            yield gw
    finally:
        authz.stop()


def user_token(signing_key) -> str:
    claims = {"iss": ISSUER, "sub": "alice@example.com", "exp": int(time.time()) + 600}
    return jwt.encode(claims, signing_key, algorithm="RS256", headers={"kid": "k1"})


def test_every_filters_work_reaches_the_provider_and_the_client(chain, openai_mock, signing_key):
    openai_mock.reset()
    headers = {**config(host(openai_mock)), "x-user-jwt": user_token(signing_key), "x-team": "platform",
               "origin": ORIGIN}
    r = chain.chat(headers)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    # What the filters in front added reaches the provider beside the gateway's own headers;
    # the user's token stays behind (jwt_authn's `forward: false`), its claims go on.
    upstream = openai_mock.last
    assert upstream.header("authorization") == "Bearer sk-config-key"
    assert upstream.header("x-authz-user") == "alice"
    assert upstream.header("x-mutated") == "yes"
    assert upstream.header("x-lua-request") == "seen"
    assert upstream.header("x-user-jwt") is None
    payload = upstream.header("x-jwt-payload")
    assert json.loads(jwt.utils.base64url_decode(payload))["sub"] == "alice@example.com"
    assert upstream.header("x-gateway-upstream-cluster") is None
    # ... and what they add to the answer reaches the client beside the gateway's headers.
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-expose-headers"] == "x-gateway-trace-id"
    assert r.headers["x-lua-response"] == "seen"
    assert r.headers["x-gateway-trace-id"]


def test_a_stream_flows_behind_the_filters(chain, openai_mock, signing_key):
    headers = {**config(host(openai_mock)), "x-user-jwt": user_token(signing_key), "x-team": "platform"}
    with chain.stream("POST", "/v1/chat/completions", headers=headers, json=chat_body(stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["x-lua-response"] == "seen"
        text = r.read().decode()
    assert text.rstrip().endswith("data: [DONE]"), text[-300:]


def test_what_the_filters_in_front_answer_never_reaches_the_gateway(chain, openai_mock, signing_key):
    openai_mock.reset()
    gateway_headers = config(host(openai_mock))
    # No user token: jwt_authn answers.
    r = chain.chat({**gateway_headers, "x-team": "platform"})
    assert r.status_code == 401, r.text
    assert "x-gateway-trace-id" not in r.headers
    # A team the authorization service refuses: ext_authz answers with its body.
    r = chain.chat({**gateway_headers, "x-user-jwt": user_token(signing_key), "x-team": "other"})
    assert (r.status_code, r.text) == (403, "team not allowed")
    # A CORS preflight: the CORS filter answers.
    r = httpx.options(f"{chain.origin}/v1/chat/completions", headers={
        "origin": ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "x-gateway-api-key"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "x-gateway-api-key" in r.headers["access-control-allow-headers"]
    assert openai_mock.requests == [], "nothing reached the provider"


def test_a_route_with_the_filter_disabled_passes_byte_for_byte(chain, openai_mock):
    """Another team's service on the same listener: neither the request nor the answer is
    touched (the same request sent straight to the service answers the same)."""
    openai_mock.reset()
    body = b"\x00not json {\xff and not the gateway's business"
    headers = {"x-gateway-api-key": "not-a-key", "x-gateway-config": "{broken", "content-type": "application/x-odd",
               "x-team": "platform", "x-odd-header": "odd  value, \"quoted\"; kept"}
    through = httpx.post(f"{chain.origin}/service/some/path?q=1", content=body, headers=headers)
    direct = httpx.post(f"{openai_mock.origin}/service/some/path?q=1", content=body, headers=headers)
    assert (through.status_code, through.content) == (direct.status_code, direct.content)
    assert "x-gateway-trace-id" not in through.headers
    received, sent_direct = openai_mock.requests
    assert (received.method, received.path, received.raw_query, received.body) == ("POST", "/service/some/path", "q=1", body)
    for name in ("x-gateway-api-key", "x-gateway-config", "content-type", "x-odd-header"):
        assert received.header(name) == sent_direct.header(name), name
    assert received.header("x-mutated") == "yes", "the filters in front still ran"
    assert chain.authz.checked, "the authorization service was asked"
    assert KEY not in json.dumps(received.headers)
