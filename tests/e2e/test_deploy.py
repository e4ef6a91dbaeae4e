"""The deployment manifests (deploy/): valid YAML of the kinds and with the fields Kubernetes,
Istio and Envoy Gateway take (no Kubernetes runs here, so a structural check against each
kind's required fields), consistent with each other (every provider host has its cluster's
route, TLS and, in Istio, its ServiceEntry, each named as the filter's template renders it), and
the filter configuration in them accepted by the filter as it is: real Envoy runs it with clusters
named the way that host names them, and a chat request goes through the control plane and a
provider."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import httpx2 as httpx
import pytest
import yaml

from helpers import KEY, assert_error, config
from support import ROUTE_HEADER, WASM, host, running_mesh

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

# Each kind's apiVersion and the fields it cannot do without.
KINDS = {
    ("v1", "Namespace"): [],
    ("v1", "Secret"): ["stringData"],
    ("v1", "Service"): ["spec.selector", "spec.ports"],
    ("apps/v1", "Deployment"): ["spec.selector.matchLabels", "spec.template.metadata.labels",
                                "spec.template.spec.containers"],
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): ["spec.workloadSelector.labels", "spec.configPatches"],
    ("networking.istio.io/v1", "ServiceEntry"): ["spec.hosts", "spec.ports", "spec.resolution", "spec.location"],
    ("networking.istio.io/v1", "DestinationRule"): ["spec.host", "spec.trafficPolicy.tls.mode"],
    ("networking.istio.io/v1", "Gateway"): ["spec.selector", "spec.servers"],
    ("networking.istio.io/v1", "VirtualService"): ["spec.hosts", "spec.gateways", "spec.http"],
    ("gateway.networking.k8s.io/v1", "Gateway"): ["spec.gatewayClassName", "spec.listeners"],
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): ["spec.parentRefs", "spec.rules"],
    ("gateway.networking.k8s.io/v1", "BackendTLSPolicy"): ["spec.targetRefs", "spec.validation.hostname"],
    ("gateway.envoyproxy.io/v1alpha1", "Backend"): ["spec.endpoints"],
    ("gateway.envoyproxy.io/v1alpha1", "HTTPRouteFilter"): ["spec.directResponse.statusCode"],
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"): ["spec.targetRefs", "spec.wasm"],
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyPatchPolicy"): ["spec.targetRef", "spec.type", "spec.jsonPatches"],
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyProxy"): ["spec.bootstrap.jsonPatches"],
}
# Kubernetes object names: DNS subdomains.
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CONTROL_PLANE_PORT = 8790


def documents(*paths: str) -> list[dict]:
    return [doc for path in paths for doc in yaml.safe_load_all((DEPLOY / path).read_text()) if doc]


def of_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def field(doc: dict, path: str):
    value = doc
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{doc['kind']} {doc['metadata']['name']}: no {path}"
        value = value[part]
    return value


def render(template: str, host_name: str, port: int) -> str:
    return template.replace("{host}", host_name).replace("{port}", str(port))


ISTIO = documents("istio/filter.yaml", "istio/providers.yaml", "istio/metrics.yaml", "control-plane.yaml")
ENVOY_GATEWAY = documents("envoy-gateway/filter.yaml", "envoy-gateway/providers.yaml", "envoy-gateway/metrics.yaml",
                          "control-plane.yaml")


def istio_wasm() -> dict:
    """The Wasm filter config the EnvoyFilter adds."""
    (patch,) = [p for p in of_kind(ISTIO, "EnvoyFilter")["model-gateway"]["spec"]["configPatches"]
                if p["applyTo"] == "EXTENSION_CONFIG"]
    return patch["patch"]["value"]["typed_config"]


def envoy_gateway_wasm() -> dict:
    """The Wasm filter config Envoy Gateway makes of the EnvoyExtensionPolicy (its `config` as
    a JSON string, its `rootID`), with the EnvoyPatchPolicy's operation applied."""
    (wasm,) = of_kind(ENVOY_GATEWAY, "EnvoyExtensionPolicy")["model-gateway"]["spec"]["wasm"]
    filter_config = {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "config": {
        "name": wasm["name"], "root_id": wasm["rootID"],
        "vm_config": {"vm_id": wasm["name"], "runtime": "envoy.wasm.runtime.v8",
                      "code": {"remote": {"http_uri": {"uri": wasm["code"]["image"]["url"]}}}},
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                          "value": json.dumps(wasm["config"])}}}
    (patch,) = of_kind(ENVOY_GATEWAY, "EnvoyPatchPolicy")["model-gateway-stop-iteration"]["spec"]["jsonPatches"]
    operation = patch["operation"]
    # The JSONPath selects the Wasm filters whose config has this root_id.
    selected = re.fullmatch(r"\$\.\.http_filters\[\?\(@\.typed_config\.config\.root_id == '([^']+)'\)\]"
                            r"\.typed_config\.config", operation["jsonPath"])
    assert selected and selected.group(1) == wasm["rootID"], operation["jsonPath"]
    assert operation["op"] == "add" and operation["path"].startswith("/")
    filter_config["config"][operation["path"][1:]] = operation["value"]
    return filter_config


def plugin_config(wasm: dict) -> dict:
    return json.loads(wasm["config"]["configuration"]["value"])


@pytest.mark.parametrize("docs", [ISTIO, ENVOY_GATEWAY], ids=["istio", "envoy-gateway"])
def test_every_manifest_is_a_known_kind_with_its_fields(docs):
    for doc in docs:
        assert (doc.get("apiVersion"), doc.get("kind")) in KINDS, f"unknown kind: {doc.get('apiVersion')} {doc.get('kind')}"
        name = field(doc, "metadata.name")
        assert NAME.match(name) and len(name) <= 253, f"invalid name {name!r}"
        for path in KINDS[(doc["apiVersion"], doc["kind"])]:
            assert field(doc, path) not in (None, [], {}, ""), f"{doc['kind']} {name}: empty {path}"


@pytest.mark.parametrize("wasm", [istio_wasm(), envoy_gateway_wasm()], ids=["istio", "envoy-gateway"])
def test_the_filter_holds_headers_and_names_clusters(wasm):
    config = wasm["config"]
    assert config["root_id"] == "model_gateway"
    assert config["allow_on_headers_stop_iteration"] is True
    plugin = plugin_config(wasm)
    assert plugin["upstream"]["route_header"] == ROUTE_HEADER
    assert plugin["control_plane"]["token"] == of_kind(ISTIO, "Secret")["model-gateway-control-plane"][
        "stringData"]["control-plane-token"]


def test_istio_hosts_have_a_service_entry_tls_and_a_route_to_their_cluster():
    plugin = plugin_config(istio_wasm())
    template = plugin["upstream"]["cluster"]
    (entry,) = of_kind(ISTIO, "ServiceEntry").values()
    (port,) = [p["number"] for p in entry["spec"]["ports"]]
    rules = of_kind(ISTIO, "DestinationRule")
    (virtual_service,) = of_kind(ISTIO, "VirtualService").values()
    routes = {route["match"][0]["headers"][ROUTE_HEADER]["exact"]: route
              for route in virtual_service["spec"]["http"] if "headers" in route.get("match", [{}])[0]}
    for host_name in entry["spec"]["hosts"]:
        assert rules[host_name]["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "sni": host_name}
        if host_name == "oauth2.googleapis.com":
            continue  # only dispatched calls reach it: a cluster, no route
        route = routes[render(template, host_name, port)]
        assert route["headers"]["request"]["remove"] == [ROUTE_HEADER]
        assert route["route"][0]["destination"] == {"host": host_name, "port": {"number": port}}
    control_plane = routes[plugin["control_plane"]["cluster"]]
    service = of_kind(ISTIO, "Service")["model-gateway-control-plane"]
    assert control_plane["route"][0]["destination"]["port"]["number"] == service["spec"]["ports"][0]["port"]
    assert virtual_service["spec"]["http"][-1].get("directResponse"), "the last route answers what was not routed"


def test_envoy_gateway_hosts_have_a_backend_tls_and_a_route_named_as_the_template_renders():
    plugin = plugin_config(envoy_gateway_wasm())
    template = plugin["upstream"]["cluster"]
    routes = of_kind(ENVOY_GATEWAY, "HTTPRoute")
    policies = of_kind(ENVOY_GATEWAY, "BackendTLSPolicy")
    (gateway,) = of_kind(ENVOY_GATEWAY, "Gateway").values()
    namespace = gateway["metadata"]["namespace"]
    for name, backend in of_kind(ENVOY_GATEWAY, "Backend").items():
        (endpoint,) = backend["spec"]["endpoints"]
        host_name, port = endpoint["fqdn"]["hostname"], endpoint["fqdn"]["port"]
        assert policies[name]["spec"]["validation"]["hostname"] == host_name
        assert policies[name]["spec"]["targetRefs"][0]["name"] == name
        # Envoy Gateway names rule 0's cluster of HTTPRoute <name> httproute/<ns>/<name>/rule/0.
        cluster = render(template, host_name, port)
        assert cluster == f"httproute/{namespace}/{routes[host_name]['metadata']['name']}/rule/0"
        (rule,) = routes[host_name]["spec"]["rules"]
        assert rule["matches"][0]["headers"] == [{"name": ROUTE_HEADER, "value": cluster}]
        assert rule["backendRefs"][0]["name"] == name
    control_plane = plugin["control_plane"]["cluster"]
    assert control_plane == f"httproute/{namespace}/model-gateway-control-plane/rule/0"
    (listener,) = gateway["spec"]["listeners"]
    (patch,) = of_kind(ENVOY_GATEWAY, "EnvoyPatchPolicy")["model-gateway-stop-iteration"]["spec"]["jsonPatches"]
    assert patch["name"] == f"{namespace}/{gateway['metadata']['name']}/{listener['name']}"
    (policy,) = of_kind(ENVOY_GATEWAY, "EnvoyExtensionPolicy").values()
    assert policy["spec"]["targetRefs"][0]["name"] in routes


def test_the_console_reaches_the_control_plane_without_the_filter():
    """`/console` goes to the control plane's Service with the filter off: in Istio, a route of
    the VirtualService and a patch that disables the filter (by the name its chain gives it) on
    that route; in Envoy Gateway, an HTTPRoute the filter's policy does not target."""
    service = of_kind(ISTIO, "Service")["model-gateway-control-plane"]
    port = service["spec"]["ports"][0]["port"]
    (virtual_service,) = of_kind(ISTIO, "VirtualService").values()
    (console,) = [route for route in virtual_service["spec"]["http"] if route.get("name") == "console"]
    assert console["match"] == [{"uri": {"prefix": "/console"}}]
    destination = console["route"][0]["destination"]
    assert destination == {"host": "model-gateway-control-plane.ai-gateway.svc.cluster.local", "port": {"number": port}}
    assert virtual_service["spec"]["http"].index(console) < len(virtual_service["spec"]["http"]) - 1
    patches = of_kind(ISTIO, "EnvoyFilter")["model-gateway"]["spec"]["configPatches"]
    (chain,) = [p for p in patches if p["applyTo"] == "HTTP_FILTER"]
    (route_patch,) = [p for p in patches if p["applyTo"] == "HTTP_ROUTE"]
    assert route_patch["match"]["routeConfiguration"]["vhost"]["route"]["name"] == "console"
    per_filter = route_patch["patch"]["value"]["typed_per_filter_config"]
    assert per_filter == {chain["patch"]["value"]["name"]: {
        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}}

    routes = of_kind(ENVOY_GATEWAY, "HTTPRoute")
    (console,) = [r for r in routes.values() if {"type": "PathPrefix", "value": "/console"} in
                  [m.get("path") for rule in r["spec"]["rules"] for m in rule["matches"]]]
    assert console["spec"]["rules"][0]["backendRefs"] == [{"name": "model-gateway-control-plane", "port": port}]
    (policy,) = of_kind(ENVOY_GATEWAY, "EnvoyExtensionPolicy").values()
    assert console["metadata"]["name"] not in [ref["name"] for ref in policy["spec"]["targetRefs"]]


def as_that_host_names_it(wasm: dict, provider_cluster: str, control_plane_cluster: str):
    """An `adapt` for `running_mesh`: the shipped Wasm config (its module from the local build)
    and the mock provider's and the control plane's clusters and routes under the names the
    shipped plugin configuration gives them."""

    def adapt(envoy_config: dict) -> None:
        resources = envoy_config["static_resources"]
        manager = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        shipped = copy.deepcopy(wasm)
        shipped["config"]["vm_config"]["code"] = {"local": {"filename": str(WASM)}}
        manager["http_filters"][0]["typed_config"] = shipped
        provider, control_plane = resources["clusters"]
        renamed = {provider["name"]: provider_cluster, control_plane["name"]: control_plane_cluster}
        for cluster in resources["clusters"]:
            cluster["name"] = cluster["load_assignment"]["cluster_name"] = renamed[cluster["name"]]
        for route in manager["route_config"]["virtual_hosts"][0]["routes"]:
            for match in route["match"].get("headers", []):
                match["string_match"]["exact"] = renamed[match["string_match"]["exact"]]
                route["route"]["cluster"] = renamed[route["route"]["cluster"]]

    return adapt


@pytest.mark.parametrize("wasm", [istio_wasm(), envoy_gateway_wasm()], ids=["istio", "envoy-gateway"])
def test_the_shipped_configuration_serves_in_envoy(wasm, openai_mock, tmp_path):
    plugin = plugin_config(wasm)
    provider_cluster = render(plugin["upstream"]["cluster"], "127.0.0.1", openai_mock.port)
    adapt = as_that_host_names_it(wasm, provider_cluster, plugin["control_plane"]["cluster"])
    with running_mesh(tmp_path, [openai_mock], WASM, adapt=adapt,
                      control_plane_token=plugin["control_plane"]["token"]) as gw:
        # The provider is reached through its cluster.
        r = gw.chat(config(host(openai_mock)))
        assert r.status_code == 200, r.text
        assert openai_mock.last.header("authorization") == "Bearer sk-config-key"
        # The gateway keys are the control plane's (read through its cluster): one it made
        # just now passes, one it never made is refused.
        made = httpx.post(f"http://127.0.0.1:{gw.control_plane_port}/v1/api-keys", json={"workspace": "deploy-team"},
                          headers={"x-gateway-api-key": KEY}, timeout=10)
        assert made.status_code == 201, made.text
        assert gw.chat(config(host(openai_mock)), key=made.json()["key"]).status_code == 200
        assert_error(gw.chat(config(host(openai_mock)), key="not-a-key"), 401, code="invalid_api_key")


def test_the_metrics_manifests_carry_the_shipped_configs_stats_tags():
    shipped = yaml.safe_load((DEPLOY.parent / "envoy/envoy.yaml").read_text())["stats_config"]["stats_tags"]
    istio = of_kind(ISTIO, "EnvoyFilter")["model-gateway-stats-tags"]
    (patch,) = istio["spec"]["configPatches"]
    assert (patch["applyTo"], patch["patch"]["operation"]) == ("BOOTSTRAP", "MERGE")
    assert patch["patch"]["value"]["stats_config"]["stats_tags"] == shipped
    (proxy,) = of_kind(ENVOY_GATEWAY, "EnvoyProxy").values()
    assert (proxy["apiVersion"], proxy["kind"]) == ("gateway.envoyproxy.io/v1alpha1", "EnvoyProxy")
    operations = proxy["spec"]["bootstrap"]["jsonPatches"]
    assert {(op["op"], op["path"]) for op in operations} == {("add", "/stats_config/stats_tags/-")}
    assert [op["value"] for op in operations] == shipped
