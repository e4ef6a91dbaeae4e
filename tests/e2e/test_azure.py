"""Azure (cloud A): Azure OpenAI deployments and Azure AI Foundry endpoints, reached through a
custom host on loopback (the mock speaks Azure's wire format), with the openai SDK as client."""

from __future__ import annotations

import pytest

from helpers import (KEY, SDK_DUMMY_KEY, assert_chat_completion, assert_clean_upstream, assert_error, chat_body,
                     config, sdk_stream, served_by, workspace_key)
from mocks import AzureOpenAIMock, OpenAIMock

AZURE_KEY = "az-key-123"


@pytest.fixture(scope="module")
def azure_mock():
    mock = AzureOpenAIMock(AZURE_KEY).start()
    yield mock
    mock.stop()


@pytest.fixture(autouse=True)
def _reset_azure(azure_mock):
    azure_mock.reset()
    yield
    azure_mock.reset()


def azure_config(mock, **extra):
    return {"provider": "azure-openai", "api_key": AZURE_KEY, "custom_host": mock.base_url,
            "deployments": [{"deployment_id": "gpt4o-prod", "alias": "gpt-4o", "api_version": "2024-10-21"},
                            {"deployment_id": "gpt4o-mini", "alias": "gpt-4o-mini", "api_version": "2024-06-01",
                             "is_default": True}],
            **extra}


def test_sdk_chat_reaches_the_deployment_chosen_by_alias(gateway, azure_mock):
    client = gateway.sdk(config(azure_config(azure_mock)), api_key=SDK_DUMMY_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    served_by(raw, "azure-openai")
    assert_chat_completion(raw.parse().model_dump(), content=OpenAIMock.default_text, finish_reason="stop")
    rec = azure_mock.last
    assert (rec.method, rec.path) == ("POST", "/openai/deployments/gpt4o-prod/chat/completions")
    assert rec.qs("api-version") == "2024-10-21"
    assert rec.header("api-key") == AZURE_KEY
    assert "authorization" not in rec.headers, "the SDK's dummy key must not reach Azure"
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY)


def test_unknown_alias_goes_to_the_default_deployment_streaming(gateway, azure_mock):
    client = gateway.sdk(config(azure_config(azure_mock)), api_key=SDK_DUMMY_KEY)
    stream = client.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "Hi"}],
                                            stream=True)
    result = sdk_stream(stream)
    assert (result.content, result.finish_reason) == (OpenAIMock.default_text, "stop")
    rec = azure_mock.last
    assert rec.path == "/openai/deployments/gpt4o-mini/chat/completions"
    assert rec.qs("api-version") == "2024-06-01"


def test_headers_of_spec_5_3_and_the_clients_bearer_as_the_key(gateway, azure_mock):
    headers = {"x-gateway-provider": "azure-openai", "x-gateway-custom-host": azure_mock.base_url,
               "x-gateway-cloud-a-deployment-id": "gpt4o-prod", "x-gateway-cloud-a-api-version": "2024-10-21",
               "Authorization": f"Bearer {AZURE_KEY}"}
    r = gateway.chat(headers, chat_body("Hi", model="gpt-4o"))
    assert r.status_code == 200, r.text
    rec = azure_mock.last
    assert rec.path == "/openai/deployments/gpt4o-prod/chat/completions"
    assert rec.header("api-key") == AZURE_KEY
    assert "authorization" not in rec.headers


def test_embeddings_and_files_use_azures_paths(gateway, azure_mock):
    # A workspace without managed batches: its batch list is Azure's page as asked.
    client = gateway.sdk(config(azure_config(azure_mock)), api_key=SDK_DUMMY_KEY, key=workspace_key(gateway))
    client.embeddings.create(model="gpt-4o", input="hello")
    assert azure_mock.last.path == "/openai/deployments/gpt4o-prod/embeddings"
    client.batches.list(limit=2)
    rec = azure_mock.last
    assert (rec.method, rec.path, rec.qs("limit"), rec.qs("api-version")) == ("GET", "/openai/batches", "2",
                                                                              "2024-06-01")


def test_azure_errors_keep_status_and_message(gateway, azure_mock):
    cfg = azure_config(azure_mock, api_key="wrong-key")
    r = gateway.chat(config(cfg), chat_body("Hi", model="gpt-4o"))
    assert_error(r, 401)
    assert "Access denied" in r.json()["error"]["message"]


def test_configs_that_cannot_work_are_400s_before_any_call(gateway, azure_mock):
    two_defaults = azure_config(azure_mock)
    for d in two_defaults["deployments"]:
        d["is_default"] = True
    r = gateway.chat(config(two_defaults), chat_body("Hi", model="gpt-4o"))
    assert_error(r, 400, param="deployments")
    no_default = azure_config(azure_mock)
    no_default["deployments"] = no_default["deployments"][:1]
    r = gateway.chat(config(no_default), chat_body("Hi", model="other"))
    assert_error(r, 400, param="deployments")
    r = gateway.chat(config({"provider": "azure-openai", "api_key": AZURE_KEY, "deployment_id": "d",
                             "api_version": "v"}), chat_body("Hi"))
    assert_error(r, 400, param="resource_name")
    assert azure_mock.requests == []


def test_azure_ai_foundry_managed_endpoint(gateway, azure_mock, openai_mock):
    # A Foundry endpoint speaks OpenAI's paths with `api-version` and the key in `api-key`;
    # a managed endpoint picks its deployment by header. The OpenAI mock stands in for the
    # endpoint (it records what arrives) and answers 401 without a Bearer, which the gateway
    # must not send: the key goes as `api-key`.
    cfg = {"provider": "azure-ai", "api_key": AZURE_KEY, "custom_host": openai_mock.base_url,
           "cloud_a_deployment_type": "managed", "cloud_a_endpoint_name": "ep",
           "cloud_a_deployment_name": "llama-blue", "cloud_a_api_version": "2024-05-01-preview"}
    r = gateway.chat(config(cfg), chat_body("Hi", model="llama"))
    assert_error(r, 401)
    rec = openai_mock.last
    assert (rec.path, rec.qs("api-version")) == ("/v1/chat/completions", "2024-05-01-preview")
    assert rec.header("api-key") == AZURE_KEY
    assert rec.header("azureml-model-deployment") == "llama-blue"
    assert "authorization" not in rec.headers
