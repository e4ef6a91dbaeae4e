"""Every resource endpoint a user of the `openai` SDK calls, passed through to an
OpenAI-family provider (spec 4.5 to 4.12): files, batches, fine-tuning jobs, assistants,
threads, messages and runs. Each call is checked on both sides: what the SDK returns, and
that the provider received the method, path, query and body bytes the SDK sent, without the
gateway's headers, with `OpenAI-Beta` on the assistants family; provider errors come back
with the provider's status in the OpenAI shape."""

from __future__ import annotations

import gzip
import json
import threading

import openai
import pytest

from helpers import (KEY, OPENAI_SLUG_KEY, SentRequests, assert_clean_upstream, assert_error, config, provider_config,
                     recording_sdk, slug)
from mocks import OpenAIMock, Reply

OPENAI = slug("openai-mock")


def client_and_log(gateway, headers: dict | None = None, drop_sdk_beta: bool = False):
    return recording_sdk(gateway, {**OPENAI, **(headers or {})}, drop_sdk_beta=drop_sdk_beta)


def passed_unchanged(mock, sent: SentRequests, method: str, path: str):
    """The provider's last request is the SDK's last one, byte for byte where it matters:
    method, path, query and body; the provider's key in place of the client's; no gateway
    header. Returns the provider's record."""
    rec, req = mock.last, sent.last
    assert (rec.method, rec.path) == (method, path)
    assert (req.method, req.url.path) == (method, path), "the test called another endpoint"
    assert rec.raw_query == req.url.query.decode()
    assert rec.body == req.content
    assert rec.header("authorization") == f"Bearer {OPENAI_SLUG_KEY}"
    assert_clean_upstream(rec, KEY)
    return rec


# ---- files

def test_files_upload_list_retrieve_content_and_delete(gateway, openai_mock):
    client, sent = client_and_log(gateway)
    data = b'{"custom_id": "1"}\r\n\x00\xff binary tail\n'
    uploaded = client.files.create(file=("in.jsonl", data, "application/jsonl"), purpose="batch")
    assert (uploaded.object, uploaded.bytes, uploaded.filename, uploaded.purpose) == ("file", len(data), "in.jsonl",
                                                                                      "batch")
    rec = passed_unchanged(openai_mock, sent, "POST", "/v1/files")
    assert rec.headers["content-type"] == sent.last.headers["content-type"]  # the multipart boundary kept
    assert rec.form["file"]["data"] == data and rec.form["purpose"]["data"] == b"batch"

    page = client.files.list(purpose="batch", limit=2, order="asc")
    assert [f.id for f in page.data] == ["file-mock-1", "file-mock-2"]
    rec = passed_unchanged(openai_mock, sent, "GET", "/v1/files")
    assert rec.query == {"purpose": ["batch"], "limit": ["2"], "order": ["asc"]}

    got = client.files.retrieve(uploaded.id)
    assert (got.id, got.bytes) == (uploaded.id, len(data))
    passed_unchanged(openai_mock, sent, "GET", f"/v1/files/{uploaded.id}")

    content = client.files.content(uploaded.id)
    assert content.read() == data
    passed_unchanged(openai_mock, sent, "GET", f"/v1/files/{uploaded.id}/content")

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    passed_unchanged(openai_mock, sent, "DELETE", f"/v1/files/{uploaded.id}")


def test_unknown_file_is_the_providers_404_in_openai_shape(gateway, openai_mock):
    client, sent = client_and_log(gateway)
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as e:
            call("file-gone")
        assert e.value.status_code == 404
        assert e.value.body == {"message": "No such File object: file-gone", "type": "invalid_request_error",
                                "param": "id", "code": "not_found"}
    assert [(r.method, r.path) for r in openai_mock.requests] == [
        ("GET", "/v1/files/file-gone"), ("GET", "/v1/files/file-gone/content"), ("DELETE", "/v1/files/file-gone")]


# ---- batches

def test_batches_create_retrieve_and_cancel(gateway, openai_mock):
    client, sent = client_and_log(gateway)
    batch = client.batches.create(input_file_id="file-in-1", endpoint="/v1/embeddings", completion_window="24h",
                                  metadata={"run": "e2e"})
    assert (batch.object, batch.status, batch.endpoint, batch.metadata) == ("batch", "validating", "/v1/embeddings",
                                                                            {"run": "e2e"})
    passed_unchanged(openai_mock, sent, "POST", "/v1/batches")

    got = client.batches.retrieve("batch_abc")
    assert (got.id, got.status, got.request_counts.completed) == ("batch_abc", "in_progress", 3)
    passed_unchanged(openai_mock, sent, "GET", "/v1/batches/batch_abc")

    # Lists go through the control plane (managed batches first): test_managed_batches.py.

    cancelled = client.batches.cancel("batch_abc")
    assert (cancelled.id, cancelled.status) == ("batch_abc", "cancelling") and cancelled.cancelling_at
    passed_unchanged(openai_mock, sent, "POST", "/v1/batches/batch_abc/cancel")


# ---- fine-tuning

def test_fine_tuning_jobs_create_list_retrieve_events_checkpoints_and_cancel(gateway, openai_mock):
    client, sent = client_and_log(gateway)
    job = client.fine_tuning.jobs.create(model="gpt-mock", training_file="file-train", suffix="e2e",
                                         hyperparameters={"n_epochs": 2})
    assert (job.object, job.status, job.training_file) == ("fine_tuning.job", "queued", "file-train")
    passed_unchanged(openai_mock, sent, "POST", "/v1/fine_tuning/jobs")

    page = client.fine_tuning.jobs.list(limit=2, after="ftjob-mock-1")
    assert [j.id for j in page.data] == ["ftjob-mock-2", "ftjob-mock-3"]
    rec = passed_unchanged(openai_mock, sent, "GET", "/v1/fine_tuning/jobs")
    assert rec.query == {"limit": ["2"], "after": ["ftjob-mock-1"]}

    got = client.fine_tuning.jobs.retrieve("ftjob-42")
    assert (got.id, got.status) == ("ftjob-42", "running")
    passed_unchanged(openai_mock, sent, "GET", "/v1/fine_tuning/jobs/ftjob-42")

    events = client.fine_tuning.jobs.list_events("ftjob-42", limit=5)
    assert [(e.id, e.object) for e in events.data] == [("ftevent-1", "fine_tuning.job.event"),
                                                       ("ftevent-2", "fine_tuning.job.event")]
    rec = passed_unchanged(openai_mock, sent, "GET", "/v1/fine_tuning/jobs/ftjob-42/events")
    assert rec.query == {"limit": ["5"]}

    checkpoints = client.fine_tuning.jobs.checkpoints.list("ftjob-42", limit=2)
    assert [c.step_number for c in checkpoints.data] == [300, 200]
    assert checkpoints.data[0].fine_tuning_job_id == "ftjob-42"
    rec = passed_unchanged(openai_mock, sent, "GET", "/v1/fine_tuning/jobs/ftjob-42/checkpoints")
    assert rec.query == {"limit": ["2"]}

    cancelled = client.fine_tuning.jobs.cancel("ftjob-42")
    assert (cancelled.id, cancelled.status) == ("ftjob-42", "cancelled")
    passed_unchanged(openai_mock, sent, "POST", "/v1/fine_tuning/jobs/ftjob-42/cancel")


# ---- assistants, threads, messages, runs: with the SDK's own `OpenAI-Beta`, or only the
# client's `Vendor-Beta` (the SDK's header removed before sending)

BETA_WAYS = ["sdk-openai-beta", "vendor-beta"]


@pytest.fixture(params=BETA_WAYS)
def beta_client(request, gateway):
    """A client asking for the assistants API one way, and how the provider must see it."""
    if request.param == "vendor-beta":
        client, sent = client_and_log(gateway, {"Vendor-Beta": "assistants=v2"}, drop_sdk_beta=True)
    else:
        client, sent = client_and_log(gateway)
    return client, sent, request.param


def passed_with_beta(mock, sent, way: str, method: str, path: str):
    rec = passed_unchanged(mock, sent, method, path)
    assert [v for k, v in rec.header_list if k.lower() == "openai-beta"] == ["assistants=v2"]
    if way == "vendor-beta":
        assert "openai-beta" not in {k.lower() for k in sent.last.headers}, "the SDK's header was not removed"
        assert rec.headers["vendor-beta"] == "assistants=v2"  # passed on as given as well
    return rec


def test_assistants_create_retrieve_modify_list_and_delete(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    asst = client.beta.assistants.create(model="gpt-mock", name="Helper", instructions="Be brief.",
                                         metadata={"team": "e2e"})
    assert (asst.object, asst.name, asst.metadata) == ("assistant", "Helper", {"team": "e2e"})
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/assistants")

    got = client.beta.assistants.retrieve("asst_42")
    assert (got.id, got.object) == ("asst_42", "assistant")
    passed_with_beta(openai_mock, sent, way, "GET", "/v1/assistants/asst_42")

    modified = client.beta.assistants.update("asst_42", name="Renamed", tools=[{"type": "file_search"}])
    assert (modified.id, modified.name, modified.tools[0].type) == ("asst_42", "Renamed", "file_search")
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/assistants/asst_42")

    page = client.beta.assistants.list(limit=1, order="asc")
    assert [a.id for a in page.data] == ["asst_mock_1"] and page.has_more
    rec = passed_with_beta(openai_mock, sent, way, "GET", "/v1/assistants")
    assert rec.query == {"limit": ["1"], "order": ["asc"]}

    deleted = client.beta.assistants.delete("asst_42")
    assert (deleted.id, deleted.object, deleted.deleted) == ("asst_42", "assistant.deleted", True)
    passed_with_beta(openai_mock, sent, way, "DELETE", "/v1/assistants/asst_42")


def test_threads_create_retrieve_modify_and_delete(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    thread = client.beta.threads.create(messages=[{"role": "user", "content": "Hi"}], metadata={"k": "v"})
    assert (thread.object, thread.metadata) == ("thread", {"k": "v"})
    rec = passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads")
    assert rec.json["messages"] == [{"role": "user", "content": "Hi"}]

    got = client.beta.threads.retrieve("thread_1")
    assert (got.id, got.object) == ("thread_1", "thread")
    passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1")

    modified = client.beta.threads.update("thread_1", metadata={"k": "w"})
    assert (modified.id, modified.metadata) == ("thread_1", {"k": "w"})
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1")

    deleted = client.beta.threads.delete("thread_1")
    assert (deleted.id, deleted.object, deleted.deleted) == ("thread_1", "thread.deleted", True)
    passed_with_beta(openai_mock, sent, way, "DELETE", "/v1/threads/thread_1")


def test_messages_create_list_retrieve_modify_and_delete(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    messages = client.beta.threads.messages
    msg = messages.create("thread_1", role="user", content="What is 2+2?", metadata={"n": "1"})
    assert (msg.object, msg.thread_id, msg.role, msg.content[0].text.value) == ("thread.message", "thread_1", "user",
                                                                                 "What is 2+2?")
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/messages")

    page = messages.list("thread_1", limit=2, order="asc", after="msg_mock_1")
    assert [m.id for m in page.data] == ["msg_mock_2", "msg_mock_3"]
    rec = passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/messages")
    assert rec.query == {"limit": ["2"], "order": ["asc"], "after": ["msg_mock_1"]}

    got = messages.retrieve("msg_9", thread_id="thread_1")
    assert (got.id, got.thread_id) == ("msg_9", "thread_1")
    passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/messages/msg_9")

    modified = messages.update("msg_9", thread_id="thread_1", metadata={"seen": "yes"})
    assert modified.metadata == {"seen": "yes"}
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/messages/msg_9")

    deleted = messages.delete("msg_9", thread_id="thread_1")
    assert (deleted.id, deleted.object, deleted.deleted) == ("msg_9", "thread.message.deleted", True)
    passed_with_beta(openai_mock, sent, way, "DELETE", "/v1/threads/thread_1/messages/msg_9")


def test_runs_create_list_retrieve_modify_and_cancel(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    runs = client.beta.threads.runs
    run = runs.create("thread_1", assistant_id="asst_1", instructions="Answer in one word.", metadata={"r": "1"})
    assert (run.object, run.thread_id, run.assistant_id, run.status) == ("thread.run", "thread_1", "asst_1",
                                                                         "queued")
    assert run.instructions == "Answer in one word."
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/runs")

    page = runs.list("thread_1", limit=1)
    assert [r.id for r in page.data] == ["run_mock_1"] and page.has_more
    rec = passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/runs")
    assert rec.query == {"limit": ["1"]}

    got = runs.retrieve("run_7", thread_id="thread_1")
    assert (got.id, got.status) == ("run_7", "in_progress")
    passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/runs/run_7")

    modified = runs.update("run_7", thread_id="thread_1", metadata={"r": "2"})
    assert modified.metadata == {"r": "2"}
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/runs/run_7")

    cancelled = runs.cancel("run_7", thread_id="thread_1")
    assert (cancelled.id, cancelled.status) == ("run_7", "cancelling")
    passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/runs/run_7/cancel")


def test_a_streamed_run_passes_event_by_event(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    # The provider sends `thread.run.created`, then waits until the client has it: a gateway
    # that held the stream back would never deliver it.
    reply = openai_mock.script(Reply(text="Four, of course.", gate=threading.Event()),
                               path="/v1/threads/thread_1/runs")
    with client.beta.threads.runs.create("thread_1", assistant_id="asst_1", stream=True) as stream:
        events = iter(stream)
        first = next(events)
        assert (first.event, first.data.status) == ("thread.run.created", "queued")
        reply.gate.set()
        rest = list(events)
    assert reply.gate_timed_out is False
    assert [e.event for e in rest] == ["thread.run.in_progress"] + ["thread.message.delta"] * 3 + [
        "thread.message.completed", "thread.run.completed"]
    assert "".join(e.data.delta.content[0].text.value for e in rest if e.event == "thread.message.delta") == \
        "Four, of course."
    rec = passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/runs")
    assert rec.json["stream"] is True


def test_run_steps_tool_outputs_and_create_and_run(gateway, openai_mock, beta_client):
    client, sent, way = beta_client
    runs = client.beta.threads.runs
    page = runs.steps.list("run_7", thread_id="thread_1", limit=1, order="asc",
                           include=["step_details.tool_calls[*].file_search.results[*].content"])
    assert [s.id for s in page.data] == ["step_mock_1"] and page.has_more
    rec = passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/runs/run_7/steps")
    assert rec.query == {"limit": ["1"], "order": ["asc"],
                         "include[]": ["step_details.tool_calls[*].file_search.results[*].content"]}

    step = runs.steps.retrieve("step_3", thread_id="thread_1", run_id="run_7")
    assert (step.id, step.object, step.run_id, step.step_details.type) == ("step_3", "thread.run.step", "run_7",
                                                                            "message_creation")
    passed_with_beta(openai_mock, sent, way, "GET", "/v1/threads/thread_1/runs/run_7/steps/step_3")

    run = runs.submit_tool_outputs("run_7", thread_id="thread_1",
                                   tool_outputs=[{"tool_call_id": "call_1", "output": "42"}])
    assert (run.id, run.status) == ("run_7", "queued")
    rec = passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/thread_1/runs/run_7/submit_tool_outputs")
    assert rec.json == {"tool_outputs": [{"tool_call_id": "call_1", "output": "42"}]}

    run = client.beta.threads.create_and_run(assistant_id="asst_1",
                                             thread={"messages": [{"role": "user", "content": "Hi"}]})
    assert (run.object, run.assistant_id, run.status) == ("thread.run", "asst_1", "queued")
    rec = passed_with_beta(openai_mock, sent, way, "POST", "/v1/threads/runs")
    assert rec.json["thread"] == {"messages": [{"role": "user", "content": "Hi"}]}


def test_a_file_uploaded_in_parts(gateway, openai_mock):
    client, sent = client_and_log(gateway)
    chunks = [b"\x00" + bytes(range(256)) * 40, b'{"custom_id": "2"}\r\n\xff tail']
    total = sum(len(c) for c in chunks)
    upload = client.uploads.create(bytes=total, filename="big.jsonl", mime_type="application/jsonl",
                                   purpose="batch")
    assert (upload.object, upload.status, upload.bytes) == ("upload", "pending", total)
    passed_unchanged(openai_mock, sent, "POST", "/v1/uploads")

    part_ids = []
    for chunk in chunks:
        part = client.uploads.parts.create(upload.id, data=chunk)
        assert (part.object, part.upload_id) == ("upload.part", upload.id)
        rec = passed_unchanged(openai_mock, sent, "POST", f"/v1/uploads/{upload.id}/parts")
        assert rec.form["data"]["data"] == chunk
        part_ids.append(part.id)

    done = client.uploads.complete(upload.id, part_ids=part_ids)
    assert (done.status, done.file.bytes, done.file.filename) == ("completed", total, "big.jsonl")
    passed_unchanged(openai_mock, sent, "POST", f"/v1/uploads/{upload.id}/complete")
    assert client.files.content(done.file.id).content == b"".join(chunks)

    other = client.uploads.create(bytes=1, filename="x.jsonl", mime_type="application/jsonl", purpose="batch")
    cancelled = client.uploads.cancel(other.id)
    assert (cancelled.id, cancelled.status) == (other.id, "cancelled")
    passed_unchanged(openai_mock, sent, "POST", f"/v1/uploads/{other.id}/cancel")


def test_vendor_beta_beside_the_sdks_header_is_sent_once(gateway, openai_mock):
    # The client sends both: the provider gets one `OpenAI-Beta`, not the value twice.
    client, sent = client_and_log(gateway, {"Vendor-Beta": "assistants=v2"})
    client.beta.assistants.retrieve("asst_1")
    passed_with_beta(openai_mock, sent, "both", "GET", "/v1/assistants/asst_1")


# ---- provider errors

@pytest.mark.parametrize("status,error_type,sdk_error", [
    (404, "invalid_request_error", openai.NotFoundError),
    (409, "invalid_request_error", openai.ConflictError),
    (429, "rate_limit_exceeded", openai.RateLimitError),
    (500, "server_error", openai.InternalServerError),
])
def test_provider_errors_keep_status_and_openai_shape(gateway, openai_mock, status, error_type, sdk_error):
    message = f"No run found with id 'run_x' ({status})"
    openai_mock.script(OpenAIMock.error(status, message, error_type, code="run_error", param="run_id"),
                       path="/v1/threads/thread_1/runs/run_x")
    client, _ = client_and_log(gateway)
    with pytest.raises(sdk_error) as e:
        client.beta.threads.runs.retrieve("run_x", thread_id="thread_1")
    assert e.value.status_code == status
    assert e.value.body == {"message": message, "type": error_type, "param": "run_id", "code": "run_error"}


def test_provider_error_over_http_is_the_openai_error_object(gateway, openai_mock):
    openai_mock.script(OpenAIMock.error(404, "No assistant found with id 'asst_x'."), path="/v1/assistants/asst_x")
    r = gateway.request("DELETE", "/v1/assistants/asst_x", headers={"Vendor-Beta": "assistants=v2", **OPENAI})
    assert_error(r, 404, type="invalid_request_error", contains="asst_x")
    assert json.loads(r.content).keys() == {"error"}
    assert r.headers["x-gateway-provider"] == "openai"


# ---- retries: a body the gateway read is sent again unchanged; an upload it streamed is not

def test_a_retried_resource_request_is_sent_again_unchanged(gateway, openai_mock):
    openai_mock.script(OpenAIMock.error(500, "try again", "server_error"), path="/v1/batches")
    retry = {"retry": {"attempts": 2, "on_status_codes": [500]}}
    client, sent = recording_sdk(gateway, config(provider_config(openai_mock, **retry)))
    batch = client.batches.create(input_file_id="file-in-1", endpoint="/v1/completions", completion_window="24h",
                                  extra_query={"trace": "a b"})
    assert batch.status == "validating"
    first, second = openai_mock.requests
    assert (first.raw_query, first.body) == (second.raw_query, second.body) == (sent.last.url.query.decode(),
                                                                                sent.last.content)


def test_a_failed_upload_is_answered_as_it_is_without_retry(gateway, openai_mock):
    openai_mock.script(OpenAIMock.error(500, "storage down", "server_error"), path="/v1/files")
    client = gateway.sdk(config(provider_config(openai_mock, retry={"attempts": 2, "on_status_codes": [500]})))
    with pytest.raises(openai.InternalServerError) as e:
        client.files.create(file=("in.jsonl", b'{"a": 1}\n', "application/jsonl"), purpose="batch")
    assert e.value.body["message"] == "storage down"
    assert len(openai_mock.requests_to("/v1/files", "POST")) == 1


def test_an_upload_with_a_content_encoding_passes_as_sent(gateway, openai_mock):
    """The gateway reads no upload: its body and Content-Encoding reach the provider together,
    which decodes or refuses them as if called directly (a body the gateway reads is a 415)."""
    boundary = "gw-boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n{{}}\n\r\n--{boundary}--\r\n").encode()
    body = gzip.compress(form)
    r = gateway.raw("POST", "/v1/files", [*OPENAI.items(), ("content-encoding", "gzip")], body,
                    content_type=f"multipart/form-data; boundary={boundary}")
    assert r.status_code != 415, r.text[:300]
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/files")
    assert rec.header("content-encoding") == "gzip"
    assert rec.body == body
    assert gzip.decompress(rec.body) == form
