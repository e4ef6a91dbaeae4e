"""Endpoints other than chat: embeddings, completions, images, audio, batches, assistants,
threads, fine-tuning; unsupported endpoints per provider; unknown endpoints."""

from __future__ import annotations

import os

import pytest

from helpers import (CHAT, CLIENT_TOKEN, KEY, OPENAI_SLUG_KEY, OPENAI_VK_KEY, assert_clean_upstream, assert_error,
                     custom_host, served_by, slug, virtual_key, workspace_key)
from mocks import OpenAIMock


def test_embeddings_via_sdk(gateway, openai_mock):
    client = gateway.sdk(slug("openai-mock"))
    raw = client.embeddings.with_raw_response.create(model="text-embedding-mock", input=["hello", "world"])
    served_by(raw, "openai")
    out = raw.parse()
    assert [d.index for d in out.data] == [0, 1]
    assert out.data[0].embedding == pytest.approx(OpenAIMock._vector('"hello"'), abs=1e-6)
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/embeddings")
    assert rec.json["input"] == ["hello", "world"] and rec.json["model"] == "text-embedding-mock"
    assert rec.headers["authorization"] == f"Bearer {OPENAI_SLUG_KEY}"
    assert_clean_upstream(rec, KEY)


def test_embeddings_float_via_http(gateway, openai_mock):
    r = gateway.post("/v1/embeddings", {"model": "text-embedding-mock", "input": "hi", "encoding_format": "float"},
                     headers=custom_host(openai_mock))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["data"][0]["embedding"] == OpenAIMock._vector('"hi"')
    assert body["usage"]["prompt_tokens"] >= 1


def test_completions_via_sdk(gateway, openai_mock):
    client = gateway.sdk({"x-gateway-provider": "openai", "x-gateway-custom-host": openai_mock.base_url},
                         api_key=CLIENT_TOKEN)
    out = client.completions.create(model="gpt-mock-instruct", prompt="Once upon a time", max_tokens=20)
    assert out.object == "text_completion"
    assert out.choices[0].text == OpenAIMock.default_text
    rec = openai_mock.last
    assert rec.path == "/v1/completions"
    assert rec.json == {"model": "gpt-mock-instruct", "prompt": "Once upon a time", "max_tokens": 20}
    assert rec.headers["authorization"] == f"Bearer {CLIENT_TOKEN}"


def test_completions_stream_via_sdk(gateway, openai_mock):
    client = gateway.sdk(slug("openai-mock"))
    stream = client.completions.create(model="gpt-mock-instruct", prompt="Once", stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == OpenAIMock.default_text


def test_images_via_sdk(gateway, openai_mock):
    client = gateway.sdk(virtual_key("vk-openai"))
    out = client.images.generate(prompt="a red square", n=2, size="256x256")
    assert len(out.data) == 2 and all(d.url.startswith("https://") for d in out.data)
    assert out.data[0].revised_prompt == "a red square"
    rec = openai_mock.last
    assert rec.path == "/v1/images/generations"
    assert rec.json["prompt"] == "a red square" and rec.json["n"] == 2
    assert rec.headers["authorization"] == f"Bearer {OPENAI_VK_KEY}"


def test_audio_transcription_multipart_via_sdk(gateway, openai_mock):
    audio = b"RIFF" + os.urandom(300 * 1024)
    client = gateway.sdk(slug("openai-mock"))
    out = client.audio.transcriptions.create(model="whisper-mock", file=("clip.wav", audio, "audio/wav"),
                                             language="en")
    assert out.text == f"received {len(audio)} bytes"
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/audio/transcriptions")
    assert rec.headers["content-type"].startswith("multipart/form-data")
    assert rec.form["file"]["data"] == audio
    assert rec.form["file"]["filename"] == "clip.wav"
    assert rec.form["model"]["data"] == b"whisper-mock"
    assert rec.form["language"]["data"] == b"en"
    assert rec.headers["authorization"] == f"Bearer {OPENAI_SLUG_KEY}"
    assert_clean_upstream(rec, KEY)


def test_batches_list_and_cancel_via_sdk(gateway, openai_mock):
    client = gateway.sdk(slug("openai-mock"), key=workspace_key(gateway))  # no managed batches
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ["batch_mock_1", "batch_mock_2"]
    assert page.has_more is True
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("GET", "/v1/batches")
    assert rec.query == {"limit": ["2"]}
    assert rec.headers["authorization"] == f"Bearer {OPENAI_SLUG_KEY}"

    batch = client.batches.cancel("batch_abc123")
    assert batch.id == "batch_abc123"
    assert batch.object == "batch"
    assert batch.status == "cancelling"
    assert isinstance(batch.cancelling_at, int)
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("POST", "/v1/batches/batch_abc123/cancel")
    assert_clean_upstream(rec, KEY)


def test_batches_list_query_forwarded_via_http(gateway, openai_mock):
    r = gateway.get("/v1/batches", params={"limit": "1", "after": "batch_mock_1"}, headers=virtual_key("vk-openai"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and [b["id"] for b in body["data"]] == ["batch_mock_2"]
    assert body["first_id"] == "batch_mock_2" and body["has_more"] is True
    assert openai_mock.last.query == {"limit": ["1"], "after": ["batch_mock_1"]}


def test_batches_create_via_sdk(gateway, openai_mock):
    client = gateway.sdk(slug("openai-mock"))
    batch = client.batches.create(input_file_id="file-in-1", endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "e2e"})
    assert batch.status == "validating" and batch.input_file_id == "file-in-1"
    assert openai_mock.last.json["metadata"] == {"run": "e2e"}


def test_assistants_list_via_sdk(gateway, openai_mock):
    client = gateway.sdk(slug("openai-mock"))
    page = client.beta.assistants.list(limit=10, order="asc")
    assert [a.id for a in page.data] == ["asst_mock_1", "asst_mock_2"]
    assert page.data[0].object == "assistant"
    rec = openai_mock.last
    assert (rec.method, rec.path) == ("GET", "/v1/assistants")
    assert rec.query == {"limit": ["10"], "order": ["asc"]}
    assert rec.headers["openai-beta"] == "assistants=v2"


def test_assistant_thread_and_fine_tuning_via_http(gateway, openai_mock):
    beta = {"Vendor-Beta": "assistants=v2", **slug("openai-mock")}
    r = gateway.get("/v1/assistants/asst_42", headers=beta)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "asst_42" and r.json()["object"] == "assistant"
    assert openai_mock.last.headers["openai-beta"] == "assistants=v2"  # what OpenAI reads

    r = gateway.get("/v1/threads/thread_1/messages/msg_1", headers=beta)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "thread.message" and r.json()["thread_id"] == "thread_1"

    r = gateway.post("/v1/fine_tuning/jobs/ftjob_1/cancel", headers=slug("openai-mock"))
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "fine_tuning.job" and r.json()["status"] == "cancelled"
    assert (openai_mock.last.method, openai_mock.last.path) == ("POST", "/v1/fine_tuning/jobs/ftjob_1/cancel")

    r = gateway.get("/v1/fine_tuning/jobs/ftjob_1/checkpoints", params={"limit": "2"}, headers=slug("openai-mock"))
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 2 and r.json()["data"][0]["fine_tuning_job_id"] == "ftjob_1"
    assert_clean_upstream(openai_mock.last, KEY)


# Endpoint requests as (method, path, httpx kwargs).
OTHER_ENDPOINTS = {
    "embeddings": ("POST", "/v1/embeddings", {"json": {"model": "m", "input": "hi"}}),
    "completions": ("POST", "/v1/completions", {"json": {"model": "m", "prompt": "hi"}}),
    "images": ("POST", "/v1/images/generations", {"json": {"prompt": "a cat"}}),
    "audio": ("POST", "/v1/audio/transcriptions",
              {"files": {"file": ("a.wav", b"RIFF0000", "audio/wav")}, "data": {"model": "whisper-mock"}}),
    "batches_cancel": ("POST", "/v1/batches/batch_1/cancel", {}),
}


@pytest.mark.parametrize("endpoint", sorted(OTHER_ENDPOINTS))
def test_endpoint_unsupported_by_anthropic_is_400(gateway, anthropic_mock, endpoint):
    method, path, kw = OTHER_ENDPOINTS[endpoint]
    r = gateway.request(method, path, headers=slug("anthropic-mock"), **kw)
    err = assert_error(r, 400, contains=["anthropic", "support"])
    assert err["type"] == "invalid_request_error"
    assert anthropic_mock.requests == []


@pytest.mark.parametrize("endpoint", sorted(OTHER_ENDPOINTS))
def test_endpoint_requires_gateway_key(gateway, openai_mock, endpoint):
    method, path, kw = OTHER_ENDPOINTS[endpoint]
    r = gateway.request(method, path, key=None, headers=slug("openai-mock"), **kw)
    assert_error(r, 401, contains="x-gateway-api-key")
    assert openai_mock.requests == []


@pytest.mark.parametrize("method, path", [("POST", "/v1/nope"), ("GET", "/v1/nope/deeper")])
def test_unknown_endpoint_is_404(gateway, openai_mock, method, path):
    r = gateway.request(method, path, headers=custom_host(openai_mock), json={})
    assert_error(r, 404)
    assert openai_mock.requests == []


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", CHAT, "POST"), ("PUT", CHAT, "POST"), ("DELETE", CHAT, "POST"),
    ("PUT", "/v1/embeddings", "POST"), ("GET", "/v1/prompts/p1/completions", "POST"),
    ("POST", "/v1/responses/resp_1", "GET, DELETE"), ("GET", "/v1/responses/resp_1/cancel", "POST"),
])
def test_a_wrong_method_is_405_with_the_methods_allowed(gateway, openai_mock, method, path, allowed):
    """RFC 9110: a 405 lists in `Allow` the methods the resource takes."""
    r = gateway.request(method, path, headers=custom_host(openai_mock))
    assert_error(r, 405)
    assert r.headers["allow"] == allowed
    assert openai_mock.requests == []
