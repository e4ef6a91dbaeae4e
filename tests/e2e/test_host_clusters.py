"""The filter in an Envoy whose config it did not write, as a service mesh generates it (Istio's
conventions): one statically defined cluster per provider host, named `outbound|{port}||{host}`,
routes that match the route header (never `cluster_header`), no bootstrap extension, no internal
listener, no dynamic forward proxy. The plugin configuration's `upstream` names the clusters.
Retries, fallback across two hosts and a stream work there; a host without a cluster is a 502
naming it; a route with the filter disabled passes untouched."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest

from helpers import KEY, assert_error, chat_body, config
from mocks import Reply
from pg_server import free_ports
from support import GEMINI, ROUTE_HEADER, WASM, fresh_key_file, host, running_mesh, sa_config


@pytest.fixture(scope="module")
def mesh(openai_mock, anthropic_mock, vertex_mock, google_token_mock, tmp_path_factory):
    """Envoy with the mesh-shaped config (the suite's mocks as its provider hosts)."""
    with running_mesh(tmp_path_factory.mktemp("mesh"), [openai_mock, anthropic_mock, vertex_mock, google_token_mock],
                      WASM) as gw:
        yield gw


def test_a_request_reaches_its_hosts_cluster_through_the_hosts_route(mesh, openai_mock):
    client = mesh.sdk(config(host(openai_mock)))
    completion = client.chat.completions.with_raw_response.create(**chat_body())
    assert completion.parse().choices[0].message.content
    assert completion.headers["x-gateway-provider"] == "openai"
    sent = openai_mock.last
    assert sent.headers["authorization"] == "Bearer sk-config-key"
    assert ROUTE_HEADER not in sent.headers, "the route header stays in the mesh"


def test_retries_and_fallback_across_two_hosts_go_to_each_hosts_cluster(mesh, openai_mock, anthropic_mock):
    openai_mock.script(status=503, times=2)
    r = mesh.chat(config({**host(openai_mock), "retry": {"attempts": 2}}))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-retries"] == "2" and len(openai_mock.requests) == 3
    openai_mock.reset()
    openai_mock.script(status=500, times=None)
    anthropic_mock.script(text="from the second host")
    cfg = {"strategy": {"mode": "fallback"},
           "targets": [host(openai_mock), {**host(anthropic_mock, "anthropic"), "override_params": {"model": "claude-mock"}}]}
    r = mesh.chat(config(cfg))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "from the second host"
    assert r.headers["x-gateway-provider"] == "anthropic"
    assert len(openai_mock.requests) == 1 and len(anthropic_mock.requests) == 1
    assert ROUTE_HEADER not in anthropic_mock.last.headers


def test_a_stream_flows_through_the_hosts_cluster(mesh, openai_mock):
    openai_mock.script(text="one two three")
    client = mesh.sdk(config(host(openai_mock)))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in
                   client.chat.completions.create(**chat_body(), stream=True) if chunk.choices)
    assert text == "one two three"


def test_a_host_without_a_cluster_is_a_502_naming_it(mesh, openai_mock):
    (unused,) = free_ports(1)
    missing = {"provider": "openai", "api_key": "sk-config-key", "custom_host": f"http://127.0.0.1:{unused}/v1"}
    r = mesh.chat(config(missing))
    assert_error(r, 502, type="api_error", code="upstream_unreachable",
                 contains=["127.0.0.1", f"outbound|{unused}||127.0.0.1"])
    # With a fallback, the next host answers (the first one's dispatch finds no cluster either).
    r = mesh.chat(config({"strategy": {"mode": "fallback"}, "targets": [missing, host(openai_mock)]}))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-target"] == "targets[1]"
    # Reached as a later attempt (the first host's 500 falls back to it), the missing cluster is
    # the answer: the same 502 naming the host, not the first host's 500.
    openai_mock.script(status=500)
    r = mesh.chat(config({"strategy": {"mode": "fallback"}, "targets": [host(openai_mock), missing]}))
    assert_error(r, 502, type="api_error", code="upstream_unreachable",
                 contains=["127.0.0.1", f"outbound|{unused}||127.0.0.1"])
    assert len(openai_mock.requests) >= 1


def test_other_routes_pass_untouched(mesh):
    r = httpx.post(f"{mesh.origin}/other/path", content=b"not json at all", headers={"x-gateway-api-key": "wrong"})
    assert (r.status_code, r.text) == (200, "other team's answer")


def test_a_cloud_token_exchange_goes_to_the_token_hosts_cluster(mesh, vertex_mock, google_token_mock):
    key_file = fresh_key_file(google_token_mock, "mesh")
    vertex_mock.script(Reply(text="Bonjour"), model=GEMINI)
    r = mesh.chat(config(sa_config(vertex_mock, key_file)), chat_body(model=GEMINI))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Bonjour"
    assert google_token_mock.exchanges == 1
    assert google_token_mock.valid(vertex_mock.last.header("authorization").removeprefix("Bearer "))


def test_a_saved_config_is_read_from_the_control_plane_through_its_cluster(mesh, openai_mock):
    """The control plane is a host of the mesh: the filter's read of a saved config (a
    dispatched call) goes to its cluster."""
    control_plane = httpx.Client(base_url=f"http://127.0.0.1:{mesh.control_plane_port}",
                                 headers={"x-gateway-api-key": KEY})
    saved = control_plane.put("/v1/configs/mesh-config",
                              json={**host(openai_mock), "override_params": {"model": "from-the-control-plane"}})
    assert saved.status_code == 200, saved.text
    r = mesh.chat(config("mesh-config"))
    assert r.status_code == 200, r.text
    assert openai_mock.last.json["model"] == "from-the-control-plane"


def test_without_stop_iteration_a_request_with_a_body_is_told_what_to_set(openai_mock, tmp_path):
    """Without `allow_on_headers_stop_iteration` Envoy never passes the body to the filter that
    holds the headers: the request is answered within seconds, saying what to set, not left
    hanging; a request without a body is served."""
    openai_mock.reset()
    with running_mesh(tmp_path, [openai_mock], WASM, stop_iteration=False) as gw:
        started = time.monotonic()
        r = gw.chat(config(host(openai_mock)), timeout=15)
        assert_error(r, 500, type="api_error", code="request_body_withheld",
                     contains=['"allow_on_headers_stop_iteration": true', "deploy/"])
        assert time.monotonic() - started < 10
        health = httpx.get(f"{gw.origin}/health", timeout=5)
        assert health.status_code == 200, health.text
        assert openai_mock.requests == [], "nothing reached the provider"


def test_without_the_stats_tags_the_labels_are_in_the_metrics_names(mesh, openai_mock):
    """A host without the shipped stats tags (this one): every label combination is a metric of
    its own, its labels in its name, as README.md says."""
    assert mesh.chat(config(host(openai_mock))).status_code == 200
    prometheus = httpx.get(f"http://127.0.0.1:{mesh.admin_port}/stats/prometheus", timeout=5).text
    assert "gen_ai_gateway_requests_total_provider_openai_status_class_2xx_cache_status_disabled_model_" in prometheus
    assert "gen_ai_gateway_requests_total{" not in prometheus
