"""Azure (cloud A): Azure OpenAI deployments and Azure AI Foundry endpoints, reached through a
custom host on loopback (the mock speaks Azure's wire format), with the openai SDK as client."""

from __future__ import annotations

import json

import openai
import pytest

from helpers import (KEY, SDK_DUMMY_KEY, assert_chat_completion, assert_clean_upstream, assert_error, chat_body,
                     config, provider_config, recording_sdk, sdk_stream, served_by, workspace_key)
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


CLIENT_API_VERSION = "2025-03-01-preview"


def test_the_targets_api_version_replaces_the_clients(gateway, azure_mock):
    # Azure gets one `api-version`, the one the target's config gives: the client's (the
    # AzureOpenAI SDK always sends one) is dropped, its other parameters pass as written.
    body = json.dumps(chat_body("Hi", model="gpt-4o")).encode()
    r = gateway.raw("POST", f"/v1/chat/completions?api-version={CLIENT_API_VERSION}&tag=a%20b",
                    headers=config(azure_config(azure_mock)).items(), body=body)
    assert r.status_code == 200, r.text
    rec = azure_mock.last
    assert (rec.path, rec.raw_query) == ("/openai/deployments/gpt4o-prod/chat/completions",
                                         "api-version=2024-10-21&tag=a%20b")
    headers = {"x-gateway-api-key": KEY, **config(azure_config(azure_mock))}
    client = openai.AzureOpenAI(base_url=gateway.base_url, api_key=SDK_DUMMY_KEY, api_version=CLIENT_API_VERSION,
                                default_headers=headers, max_retries=0)
    uploaded = client.files.create(file=("in.jsonl", b'{"a": 1}\n', "application/jsonl"), purpose="batch")
    rec = azure_mock.last
    assert (rec.method, rec.path, rec.raw_query) == ("POST", "/openai/files", "api-version=2024-06-01")
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    rec = azure_mock.last
    assert (rec.path, rec.raw_query) == (f"/openai/files/{uploaded.id}", "api-version=2024-06-01")
    assert rec.header("api-key") == AZURE_KEY
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY)


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


# ---- resources: files, batches and fine-tuning under `/openai/...` with the default
# deployment's `api-version` (a resource names no deployment); assistants and threads with a
# preview `api-version`, the only ones Azure serves them under

@pytest.fixture
def azure_client(gateway, azure_mock):
    return recording_sdk(gateway, config(azure_config(azure_mock)))


def reached_azure(mock, sent, method, path, api_version="2024-06-01"):
    """Azure's last request is the SDK's last one at Azure's place: `/openai` for `/v1`,
    `api-version` before the client's query, the body's bytes unchanged, the key as
    `api-key` and never the SDK's dummy Bearer. Returns the record."""
    rec, req = mock.last, sent.last
    assert (rec.method, rec.path) == (method, path)
    assert (req.method, "/openai" + req.url.path.removeprefix("/v1")) == (method, path), "another endpoint"
    client_query = req.url.query.decode()
    assert rec.raw_query == f"api-version={api_version}" + (f"&{client_query}" if client_query else "")
    assert rec.body == req.content
    assert rec.header("api-key") == AZURE_KEY and "authorization" not in rec.headers
    assert_clean_upstream(rec, KEY, SDK_DUMMY_KEY)
    return rec


def test_files_on_azure(azure_client, azure_mock):
    client, sent = azure_client
    data = b'{"custom_id": "a"}\n' * 1000
    uploaded = client.files.create(file=("in.jsonl", data, "application/jsonl"), purpose="batch")
    assert (uploaded.object, uploaded.bytes, uploaded.purpose) == ("file", len(data), "batch")
    assert reached_azure(azure_mock, sent, "POST", "/openai/files").form["file"]["data"] == data
    assert [f.id for f in client.files.list(purpose="batch").data] == ["file-mock-1", "file-mock-2"]
    reached_azure(azure_mock, sent, "GET", "/openai/files")
    assert client.files.retrieve(uploaded.id).bytes == len(data)
    reached_azure(azure_mock, sent, "GET", f"/openai/files/{uploaded.id}")
    assert client.files.content(uploaded.id).read() == data
    reached_azure(azure_mock, sent, "GET", f"/openai/files/{uploaded.id}/content")
    assert client.files.delete(uploaded.id).deleted is True
    reached_azure(azure_mock, sent, "DELETE", f"/openai/files/{uploaded.id}")
    with pytest.raises(openai.NotFoundError) as e:
        client.files.retrieve(uploaded.id)
    assert e.value.body["message"] == f"No such File object: {uploaded.id}"


def test_batches_on_azure(azure_client, azure_mock):
    client, sent = azure_client
    batch = client.batches.create(input_file_id="file-in-1", endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert (batch.status, batch.input_file_id) == ("validating", "file-in-1")
    reached_azure(azure_mock, sent, "POST", "/openai/batches")
    assert client.batches.retrieve("batch_1").id == "batch_1"
    reached_azure(azure_mock, sent, "GET", "/openai/batches/batch_1")
    assert [b.id for b in client.batches.list(limit=1, after="batch_mock_2").data] == ["batch_mock_3"]
    reached_azure(azure_mock, sent, "GET", "/openai/batches")
    assert client.batches.cancel("batch_1").status == "cancelling"
    reached_azure(azure_mock, sent, "POST", "/openai/batches/batch_1/cancel")


def test_fine_tuning_on_azure(azure_client, azure_mock):
    client, sent = azure_client
    # A resource body's `model` names no deployment (here a deployment's alias): the
    # default deployment's api-version is used.
    job = client.fine_tuning.jobs.create(model="gpt-4o", training_file="file-train")
    assert (job.object, job.model) == ("fine_tuning.job", "gpt-4o")
    reached_azure(azure_mock, sent, "POST", "/openai/fine_tuning/jobs")
    assert len(client.fine_tuning.jobs.list(limit=2).data) == 2
    reached_azure(azure_mock, sent, "GET", "/openai/fine_tuning/jobs")
    assert client.fine_tuning.jobs.retrieve("ftjob-1").status == "running"
    reached_azure(azure_mock, sent, "GET", "/openai/fine_tuning/jobs/ftjob-1")
    assert len(client.fine_tuning.jobs.list_events("ftjob-1", limit=2).data) == 2
    reached_azure(azure_mock, sent, "GET", "/openai/fine_tuning/jobs/ftjob-1/events")
    assert client.fine_tuning.jobs.checkpoints.list("ftjob-1").data[0].fine_tuning_job_id == "ftjob-1"
    reached_azure(azure_mock, sent, "GET", "/openai/fine_tuning/jobs/ftjob-1/checkpoints")
    assert client.fine_tuning.jobs.cancel("ftjob-1").status == "cancelled"
    reached_azure(azure_mock, sent, "POST", "/openai/fine_tuning/jobs/ftjob-1/cancel")


PREVIEW = "2024-05-01-preview"


def test_assistants_threads_messages_and_runs_on_azure(gateway, azure_mock):
    cfg = {"provider": "azure-openai", "api_key": AZURE_KEY, "custom_host": azure_mock.base_url,
           "deployment_id": "gpt4o-prod", "api_version": PREVIEW}
    client, sent = recording_sdk(gateway, config(cfg))
    beta = client.beta
    asst = beta.assistants.create(model="gpt4o-prod", name="Helper")
    assert (asst.object, asst.name) == ("assistant", "Helper")
    reached_azure(azure_mock, sent, "POST", "/openai/assistants", PREVIEW)
    assert beta.assistants.update("asst_1", name="New").name == "New"
    reached_azure(azure_mock, sent, "POST", "/openai/assistants/asst_1", PREVIEW)
    assert [a.id for a in beta.assistants.list(limit=2, order="asc").data] == ["asst_mock_1", "asst_mock_2"]
    reached_azure(azure_mock, sent, "GET", "/openai/assistants", PREVIEW)
    assert beta.assistants.delete("asst_1").object == "assistant.deleted"
    reached_azure(azure_mock, sent, "DELETE", "/openai/assistants/asst_1", PREVIEW)

    assert beta.threads.create(metadata={"k": "v"}).metadata == {"k": "v"}
    reached_azure(azure_mock, sent, "POST", "/openai/threads", PREVIEW)
    assert beta.threads.retrieve("thread_1").id == "thread_1"
    reached_azure(azure_mock, sent, "GET", "/openai/threads/thread_1", PREVIEW)
    assert beta.threads.delete("thread_1").deleted is True
    reached_azure(azure_mock, sent, "DELETE", "/openai/threads/thread_1", PREVIEW)

    msg = beta.threads.messages.create("thread_1", role="user", content="Hi")
    assert (msg.thread_id, msg.content[0].text.value) == ("thread_1", "Hi")
    reached_azure(azure_mock, sent, "POST", "/openai/threads/thread_1/messages", PREVIEW)
    assert len(beta.threads.messages.list("thread_1", limit=3).data) == 3
    reached_azure(azure_mock, sent, "GET", "/openai/threads/thread_1/messages", PREVIEW)

    run = beta.threads.runs.create("thread_1", assistant_id="asst_1")
    assert (run.object, run.status) == ("thread.run", "queued")
    reached_azure(azure_mock, sent, "POST", "/openai/threads/thread_1/runs", PREVIEW)
    assert beta.threads.runs.retrieve("run_1", thread_id="thread_1").status == "in_progress"
    reached_azure(azure_mock, sent, "GET", "/openai/threads/thread_1/runs/run_1", PREVIEW)
    assert beta.threads.runs.cancel("run_1", thread_id="thread_1").status == "cancelling"
    reached_azure(azure_mock, sent, "POST", "/openai/threads/thread_1/runs/run_1/cancel", PREVIEW)


def test_assistants_under_a_ga_api_version_get_azures_404(azure_client, azure_mock):
    client, _ = azure_client
    with pytest.raises(openai.NotFoundError) as e:
        client.beta.assistants.list()
    # Azure's error, completed into the OpenAI error object.
    assert e.value.status_code == 404
    assert e.value.body == {"message": "Resource not found", "type": "invalid_request_error", "param": None,
                            "code": "404"}
    assert azure_mock.last.path == "/openai/assistants"


def test_path_injection_is_refused_before_azure(gateway, azure_mock):
    for path, param in [("/v1/files/..%2Fdeployments", "file_id"), ("/v1/threads/%2e%2e/runs", "thread_id")]:
        r = gateway.raw("GET", path, headers=config(azure_config(azure_mock)).items(), content_type=None)
        assert_error(r, 400, param=param)
    assert azure_mock.requests == []


def test_a_resource_request_falls_back_from_openai_to_azures_place(gateway, openai_mock, azure_mock):
    openai_mock.script(OpenAIMock.error(503, "overloaded", "server_error"), path="/v1/batches")
    cfg = {"strategy": {"mode": "fallback"}, "targets": [provider_config(openai_mock), azure_config(azure_mock)]}
    body = b'{"input_file_id": "file-in-1", "endpoint": "/v1/embeddings", "completion_window": "24h"}'
    r = gateway.raw("POST", "/v1/batches?tag=a%20b", headers=config(cfg).items(), body=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-provider"] == "azure-openai"
    assert (openai_mock.last.raw_query, openai_mock.last.body) == ("tag=a%20b", body)
    rec = azure_mock.last
    assert (rec.path, rec.raw_query, rec.body) == ("/openai/batches", "api-version=2024-06-01&tag=a%20b", body)
    assert rec.header("api-key") == AZURE_KEY and "authorization" not in rec.headers


def test_responses_are_native_on_azure_openai(gateway, azure_mock):
    # Azure serves the Responses API under the resource (the deployment is the `model`), in a
    # preview API version: the request goes as the client sent it.
    cfg = {"provider": "azure-openai", "api_key": AZURE_KEY, "custom_host": azure_mock.base_url,
           "deployment_id": "gpt4o-prod", "api_version": "2025-03-01-preview"}
    client = gateway.sdk(config(cfg), api_key=SDK_DUMMY_KEY)
    azure_mock.script(text="From Azure.", path="/v1/responses")
    response = client.responses.create(model="gpt4o-prod", input="Hi", store=True, top_logprobs=2)
    assert response.output_text == "From Azure." and not response.id.startswith("resp_gw_")
    rec = azure_mock.last
    assert (rec.path, rec.qs("api-version")) == ("/openai/responses", "2025-03-01-preview")
    assert rec.json == {"model": "gpt4o-prod", "input": "Hi", "store": True, "top_logprobs": 2}
    assert rec.header("api-key") == AZURE_KEY and "authorization" not in rec.headers
    # The stored response is Azure's: reading it goes there too.
    assert client.responses.retrieve(response.id).id == response.id
    assert azure_mock.last.path == f"/openai/responses/{response.id}"
