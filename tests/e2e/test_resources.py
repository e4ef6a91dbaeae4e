"""Resource endpoints (spec 4.5 to 4.12, 8): list queries, path parameters and the bodies the
spec limits are checked before any provider call (400 naming the parameter, the provider sees
nothing); requests that pass reach the provider byte for byte; the assistants beta header;
file uploads stream through."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading

import openai
import pytest

from helpers import KEY, assert_clean_upstream, assert_error, custom_host, slug, workspace_key

OPENAI = slug("openai-mock")
BETA = {"Vendor-Beta": "assistants=v2", **OPENAI}


def refused(resp, mock, param, *, status=400, code="invalid_value"):
    assert_error(resp, status, type="invalid_request_error", param=param, code=code)
    assert mock.requests == [], "the provider was called"


# ---- list queries

LIST_CASES = [
    ("/v1/batches", "limit=0", "limit"),
    ("/v1/batches", "limit=101", "limit"),
    ("/v1/batches", "limit=-1", "limit"),
    ("/v1/batches", "limit=ten", "limit"),
    ("/v1/batches", "limit=%31%30%31", "limit"),  # 101, percent-encoded
    ("/v1/batches", "l%69mit=0", "limit"),  # the name percent-encoded
    ("/v1/batches", "limit=5&limit=6", "limit"),  # repeated: refused
    ("/v1/batches", "after=", "after"),
    ("/v1/assistants", "order=sideways", "order"),
    ("/v1/assistants", "limit=101", "limit"),
    ("/v1/assistants", "before=", "before"),
    ("/v1/fine_tuning/jobs/ftjob_1/checkpoints", "limit=0", "limit"),
    ("/v1/fine_tuning/jobs/ftjob_1/events", "limit=x", "limit"),
    ("/v1/fine_tuning/jobs", "after=", "after"),
    ("/v1/threads/thread_1/messages", "order=up", "order"),
    ("/v1/files", "limit=10001", "limit"),
]


@pytest.mark.parametrize("path,query,param", LIST_CASES)
def test_list_query_is_checked(gateway, openai_mock, path, query, param):
    refused(gateway.get(f"{path}?{query}", headers=BETA), openai_mock, param)


def test_broken_percent_encoding_in_a_list_query(gateway, openai_mock):
    refused(gateway.raw("GET", "/v1/batches?limit=%zz", headers=OPENAI.items()), openai_mock, "query")


def test_sdk_list_limits(gateway, openai_mock):
    client = gateway.sdk(OPENAI)
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.list(limit=101)
    assert e.value.param == "limit"
    with pytest.raises(openai.BadRequestError) as e:
        client.beta.assistants.list(order="sideways")  # type: ignore[arg-type]
    assert e.value.param == "order"
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.list_events("ftjob_1", limit=0)
    assert e.value.param == "limit"
    assert openai_mock.requests == []


@pytest.mark.parametrize("path,query", [
    ("/v1/batches", "limit=100&after=batch_mock_1&x=%20y+z"),
    ("/v1/batches", "limit=1"),
    ("/v1/assistants", "order=asc&limit=2&before=asst_mock_2"),
    ("/v1/fine_tuning/jobs/ftjob_1/checkpoints", "limit=1000"),
    ("/v1/fine_tuning/jobs", "limit=2&after=ftjob-mock-1"),
    ("/v1/files", "limit=10000&order=desc&purpose=batch"),
])
def test_passing_list_queries_arrive_as_given(gateway, openai_mock, path, query):
    # A workspace without managed batches: its batch list is the provider's page as asked.
    r = gateway.raw("GET", f"{path}?{query}", headers=BETA.items(), key=workspace_key(gateway))
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert (rec.path, rec.raw_query) == (path, query)
    assert_clean_upstream(rec, KEY)


def test_sdk_lists_pass(gateway, openai_mock):
    client = gateway.sdk(OPENAI, key=workspace_key(gateway))  # no managed batches
    assert [b.id for b in client.batches.list(limit=100).data] == ["batch_mock_1", "batch_mock_2", "batch_mock_3"]
    assert [j.id for j in client.fine_tuning.jobs.list(limit=2).data] == ["ftjob-mock-1", "ftjob-mock-2"]
    assert [e.id for e in client.fine_tuning.jobs.list_events("ftjob_1", limit=1).data] == ["ftevent-1"]
    assert len(client.files.list(purpose="batch").data) == 2
    assert openai_mock.last.query == {"purpose": ["batch"]}


# ---- path parameters

INJECTIONS = [
    ("GET", "/v1/batches/a%2Fb", "batch_id"),
    ("GET", "/v1/batches/..%2F..%2Ffiles", "batch_id"),
    ("POST", "/v1/batches/%2e%2e/cancel", "batch_id"),
    ("POST", "/v1/batches/../cancel", "batch_id"),
    ("GET", "/v1/batches/.", "batch_id"),
    ("GET", "/v1/batches/b%00", "batch_id"),
    ("GET", "/v1/batches/b%0d%0aX-Injected:%201", "batch_id"),
    ("POST", "/v1/batches//cancel", "batch_id"),
    ("POST", "/v1/fine_tuning/jobs/x%2F..%2Fy/cancel", "fine_tuning_job_id"),
    ("GET", "/v1/fine_tuning/jobs/%2E%2E/checkpoints", "fine_tuning_job_id"),
    ("GET", "/v1/assistants/..", "assistant_id"),
    ("GET", "/v1/assistants/a%5Cb", "assistant_id"),
    ("GET", "/v1/threads/t%2F1/messages/m1", "thread_id"),
    ("GET", "/v1/threads/t1/messages/%2e%2e", "message_id"),
    ("GET", "/v1/files/file%2F1/content", "file_id"),
    ("GET", "/v1/fine_tuning/../batches", "path"),
    ("GET", "/v1/models/..%2Fbatches", "model"),
]


@pytest.mark.parametrize("method,path,param", INJECTIONS)
def test_path_injection_is_refused(gateway, openai_mock, method, path, param):
    # Raw sockets: an HTTP client would normalise the path first.
    r = gateway.raw(method, path, headers=BETA.items(), content_type=None)
    refused(r, openai_mock, param)


def test_sdk_path_parameters(gateway, openai_mock):
    client = gateway.sdk(OPENAI)
    # The SDK percent-encodes ids (and itself refuses `..`): an encoded `/` or NUL is ours to refuse.
    for bad in ["a/b", "b\x00"]:
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.cancel(bad)
        assert e.value.param == "batch_id"
    assert openai_mock.requests == []


def test_passing_path_parameters_arrive_as_given(gateway, openai_mock):
    paths = ["/v1/batches/batch_%41bc", "/v1/batches/a.b", "/v1/assistants/asst%3Fx", "/v1/models/org%2Fm-1.5"]
    for path in paths:
        r = gateway.raw("GET", path, headers=BETA.items(), content_type=None)
        assert r.status_code == (404 if "models" in path else 200), (path, r.text)  # the mock has no model route
    # Not decoded, not normalised: the bytes the client sent.
    assert [r.path for r in openai_mock.requests] == paths


# ---- POST /batches

GOOD_BATCH = {"input_file_id": "file-in-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


@pytest.mark.parametrize("change,param,code", [
    ({"completion_window": "48h"}, "completion_window", "invalid_value"),
    ({"endpoint": "/v1/images/generations"}, "endpoint", "invalid_value"),
    ({"endpoint": "/v1/responses"}, "endpoint", "invalid_value"),
    ({"input_file_id": None}, "input_file_id", "missing_required_parameter"),
    ({"endpoint": None}, "endpoint", "missing_required_parameter"),
    ({"completion_window": None}, "completion_window", "missing_required_parameter"),
    ({"input_file_id": 42}, "input_file_id", "invalid_type"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "invalid_value"),
    ({"metadata": {"k" * 65: "v"}}, "metadata", "invalid_value"),
    ({"metadata": {"k": "v" * 513}}, "metadata", "invalid_value"),
    ({"metadata": {"k": 1}}, "metadata", "invalid_value"),
])
def test_batch_create_is_checked(gateway, openai_mock, change, param, code):
    body = {k: v for k, v in {**GOOD_BATCH, **change}.items() if v is not None}
    refused(gateway.post("/v1/batches", body, headers=OPENAI), openai_mock, param, code=code)


def test_batch_create_via_sdk_refused_and_passed(gateway, openai_mock):
    client = gateway.sdk(OPENAI)
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id="f", endpoint="/v1/chat/completions",
                              completion_window="48h")  # type: ignore[arg-type]
    assert e.value.param == "completion_window"
    assert openai_mock.requests == []
    metadata = {f"k{i:0>62}": "é" * 512 for i in range(16)}  # the limits exactly, in characters
    batch = client.batches.create(input_file_id="file-in-1", endpoint="/v1/embeddings", completion_window="24h",
                                  metadata=metadata)
    assert batch.endpoint == "/v1/embeddings" and openai_mock.last.json["metadata"] == metadata


def test_batch_body_arrives_byte_identical(gateway, openai_mock):
    # Odd spacing, key order, escapes and a query: nothing is re-serialised.
    body = b'{ "metadata" : {"k":"\\u00e9"},\n "completion_window":"24h","endpoint":"/v1/completions",' \
           b'"input_file_id":"file-x"   }'
    cfg = {"x-gateway-config": json.dumps({"provider": "openai", "api_key": "sk-config-key",
                                           "custom_host": openai_mock.base_url,
                                           "override_params": {"model": "forced"}})}
    r = gateway.raw("POST", "/v1/batches?trace=%20a", headers=cfg.items(), body=body)
    assert r.status_code == 200, r.text
    rec = openai_mock.last
    assert (rec.body, rec.raw_query) == (body, "trace=%20a")
    assert rec.headers["content-length"] == str(len(body))


def test_bad_json_on_a_read_body(gateway, openai_mock):
    refused(gateway.raw("POST", "/v1/batches", headers=OPENAI.items(), body=b"{nope"), openai_mock, "body",
            code=None)


# ---- assistants, messages, fine-tuning bodies

@pytest.mark.parametrize("path,body,param", [
    ("/v1/assistants", {"model": "m", "name": "n" * 257}, "name"),
    ("/v1/assistants", {"model": "m", "description": "d" * 513}, "description"),
    ("/v1/assistants", {"model": "m", "instructions": "i" * 256_001}, "instructions"),
    ("/v1/assistants", {"model": "m", "tools": [{"type": "code_interpreter"}] * 129}, "tools"),
    ("/v1/assistants", {"model": "m", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("/v1/assistants/asst_1", {"name": "n" * 257}, "name"),
    ("/v1/threads/thread_1/messages", {"role": "user", "content": "hi", "metadata": {"k": "v" * 513}}, "metadata"),
    ("/v1/threads/thread_1/messages/msg_1", {"metadata": {"k" * 65: "v"}}, "metadata"),
    # Messages made inside a thread's or a run's body.
    ("/v1/threads", {"messages": [{"role": "user", "content": "hi", "metadata": {"k": 1}}]}, "messages[0].metadata"),
    ("/v1/threads/runs", {"assistant_id": "a", "thread": {"messages": [
        {"role": "user", "content": "hi"}, {"role": "user", "content": "hi", "metadata": {"k" * 65: "v"}}]}},
     "thread.messages[1].metadata"),
    ("/v1/threads/thread_1/runs", {"assistant_id": "a", "additional_messages": [
        {"role": "user", "content": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}]}, "additional_messages[0].metadata"),
    ("/v1/fine_tuning/jobs", {"model": "m", "training_file": "f", "integrations": [{"type": "wandb"}] * 6},
     "integrations"),
])
def test_resource_bodies_are_checked(gateway, openai_mock, path, body, param):
    r = gateway.post(path, body, headers=BETA)
    assert_error(r, 400, param=param)
    assert openai_mock.requests == []


def test_a_thread_made_with_its_messages_is_checked_then_sent_as_it_came(gateway, openai_mock):
    body = {"messages": [{"role": "user", "content": "hi", "metadata": {f"k{i}": "v" for i in range(16)}}]}
    assert gateway.post("/v1/threads", body, headers=BETA).status_code == 200
    assert openai_mock.last.json == body


def test_assistant_and_fine_tuning_create_via_sdk(gateway, openai_mock):
    client = gateway.sdk(OPENAI)
    with pytest.raises(openai.BadRequestError) as e:
        client.beta.assistants.create(model="gpt-mock", name="n" * 257)
    assert e.value.param == "name"
    assert openai_mock.requests == []
    asst = client.beta.assistants.create(model="gpt-mock", name="n" * 256, instructions="i" * 256_000,
                                         tools=[{"type": "code_interpreter"}] * 128, metadata={"k": "v"})
    assert asst.name == "n" * 256
    rec = openai_mock.last
    assert rec.headers["openai-beta"] == "assistants=v2"  # the SDK's own header, passed as given
    assert rec.json["instructions"] == "i" * 256_000
    job = client.fine_tuning.jobs.create(model="gpt-mock", training_file="file-t",
                                         integrations=[{"type": "wandb", "wandb": {"project": "p"}}] * 5)
    assert job.object == "fine_tuning.job" and len(openai_mock.last.json["integrations"]) == 5


# ---- the beta header

def test_vendor_beta_reaches_openai_as_openai_beta(gateway, openai_mock):
    r = gateway.get("/v1/assistants", headers=BETA)
    assert r.status_code == 200, r.text
    assert openai_mock.last.headers["openai-beta"] == "assistants=v2"


@pytest.mark.parametrize("value", ["assistants=v1", "assistants=v3,other=1"])
def test_other_beta_values_pass_as_given(gateway, openai_mock, value):
    r = gateway.get("/v1/assistants/asst_1", headers={"Vendor-Beta": value, **OPENAI})
    # The provider decides: the mock wants assistants=v2.
    assert r.status_code == 400, r.text
    assert openai_mock.last.headers["openai-beta"] == value


def test_missing_beta_header_is_the_providers_call(gateway, openai_mock):
    r = gateway.get("/v1/assistants", headers=OPENAI)
    assert r.status_code == 400 and "OpenAI-Beta" in r.json()["error"]["message"]
    assert len(openai_mock.requests) == 1 and "openai-beta" not in openai_mock.last.headers


# ---- provider selection (spec 4)

def test_resources_need_a_selected_provider(gateway, openai_mock):
    r = gateway.get("/v1/batches")
    assert_error(r, 400, code="missing_provider", contains=["x-gateway-provider", "x-gateway-virtual-key"])
    assert openai_mock.requests == []


def test_any_way_of_selecting_a_provider_is_enough(gateway, openai_mock):
    r = gateway.get("/v1/batches?limit=1", headers=custom_host(openai_mock), key=workspace_key(gateway))
    assert r.status_code == 200, r.text
    assert openai_mock.last.raw_query == "limit=1"


# ---- file uploads stream

class PacedUpload(io.RawIOBase):
    """A file of ``size`` bytes the SDK reads in pieces; the read at ``pause_at`` waits until
    the test sets ``resume`` (``paused`` tells it the first part has been handed to the
    socket). The bytes repeat a random 64 KiB block; ``digest`` is their SHA-256."""

    def __init__(self, size: int, pause_at: int):
        self.size, self.pause_at, self.pos = size, pause_at, 0
        self.paused, self.resume = threading.Event(), threading.Event()
        self.block = os.urandom(1 << 16) * 2
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True  # lets httpx learn the size, so the upload has a Content-Length

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if self.pos == self.pause_at and not self.resume.is_set():
            self.paused.set()
            if not self.resume.wait(60):
                raise TimeoutError("the test never resumed the upload")
        end = self.pause_at if self.pos < self.pause_at else self.size
        half = len(self.block) // 2
        n = min(end - self.pos, half if n < 0 else min(n, half))
        piece = self.block[self.pos % half:self.pos % half + n]
        self.pos += n
        self.digest.update(piece)
        return piece


def test_50_mb_upload_streams_without_the_gateway_holding_it(gateway, openai_mock):
    """A 50 MB multipart upload (above Envoy's 20 MiB buffer limit: a buffered body would be
    refused with 413) reaches the provider while the client is still sending it, and neither
    Envoy's heap (admin `/memory`) nor its resident memory (which counts the filter VM's
    linear memory, never given back) grows by anything near the 40 MB in flight at the pause."""
    size, pause_at, bound = 50_000_000, 40_000_000, 16 << 20
    upload = PacedUpload(size, pause_at)
    client = gateway.sdk(OPENAI, timeout=120.0)
    heap_before, rss_before = gateway.memory_allocated(), gateway.envoy_rss()
    outcome: dict = {}

    def send():
        try:
            outcome["file"] = client.files.create(file=("big.jsonl", upload, "application/jsonl"), purpose="batch")
        except Exception as e:  # noqa: BLE001 - reported by the test below
            outcome["error"] = e

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        assert upload.paused.wait(60), f"the SDK did not send the first {pause_at} bytes: {outcome}"
        assert openai_mock.wait_until(lambda m: m.body_bytes >= pause_at, 30), (
            f"the provider got {openai_mock.body_bytes} of the {pause_at} bytes sent: the upload was held back")
        heap_grown, rss_grown = gateway.memory_allocated() - heap_before, gateway.envoy_rss() - rss_before
    finally:
        upload.resume.set()
        sender.join(120)
    assert "file" in outcome, outcome
    assert outcome["file"].bytes == size and outcome["file"].purpose == "batch"
    part = openai_mock.last.form["file"]
    assert hashlib.sha256(part["data"]).digest() == upload.digest.digest()
    rss_after = gateway.envoy_rss() - rss_before
    mib = 1 << 20
    assert heap_grown < bound, f"Envoy's heap grew by {heap_grown / mib:.1f} MiB with 40 MB in flight"
    assert max(rss_grown, rss_after) < bound, (
        f"Envoy's resident memory grew by {rss_grown / mib:.1f} MiB at the pause, {rss_after / mib:.1f} MiB after")
