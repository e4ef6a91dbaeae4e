"""Gateway-managed batches (issue 16, spec 4.7 `completion_window: "immediate"`): the filter
relays them to the control plane, which reads the input file through the gateway (the
provider's files API, here the OpenAI mock's file store), checks every line and runs each
line's body through the gateway as the caller; the batch and its output and error files
answer at the gateway's own `/v1/batches/{id}` and `/v1/files/{id}[/content]`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import uuid
from urllib.parse import unquote

import pytest

from helpers import CHAT, assert_error, chat_body, config, custom_host, workspace_key
from mocks import AnthropicMock, OpenAIMock

TERMINAL = {"completed", "failed", "cancelled"}


def jsonl(lines: list[dict]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def chat_line(custom_id: str, model: str = "gpt-mock", content: str = "Say hello.") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": chat_body(content, model=model)}


def new_file(mock, lines: list[dict]) -> str:
    file_id = f"file-in-{uuid.uuid4().hex[:8]}"
    mock.put_file(file_id, jsonl(lines))
    return file_id


def create(gateway, headers: dict, file_id: str, **extra) -> dict:
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "immediate", **extra}
    resp = gateway.post("/v1/batches", body, headers=headers)
    assert resp.status_code == 200, f"{resp.status_code}: {resp.text[:500]}"
    return resp.json()


def wait(gateway, headers: dict, batch_id: str, done=lambda b: b["status"] in TERMINAL, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        resp = gateway.get(f"/v1/batches/{batch_id}", headers=headers)
        assert resp.status_code == 200, f"{resp.status_code}: {resp.text[:500]}"
        batch = resp.json()
        if done(batch):
            return batch
        if time.monotonic() > deadline:
            pytest.fail(f"batch {batch_id} stayed {batch['status']}: {batch}")
        time.sleep(0.1)


def content(gateway, headers: dict, file_id: str) -> list[dict]:
    resp = gateway.get(f"/v1/files/{file_id}/content", headers=headers)
    assert resp.status_code == 200, f"{resp.status_code}: {resp.text[:500]}"
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


def test_a_managed_batch_runs_through_the_gateway_to_completed(gateway, openai_mock):
    headers = custom_host(openai_mock)
    openai_mock.script(model="gpt-fail", status=400, times=None)
    lines = [chat_line("a"), chat_line("b", model="gpt-fail"), chat_line("c", content="Say bye.")]
    file_id = new_file(openai_mock, lines)

    batch = create(gateway, headers, file_id, metadata={"team": "e2e"})
    assert batch["id"].startswith("batch_gw_")
    assert (batch["object"], batch["status"], batch["completion_window"]) == ("batch", "validating", "immediate")
    assert batch["metadata"] == {"team": "e2e"} and batch["input_file_id"] == file_id

    done = wait(gateway, headers, batch["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert all(isinstance(done[at], int) for at in ("created_at", "in_progress_at", "finalizing_at", "completed_at"))

    # The input file was read, and each line sent, through the gateway as the caller.
    reads = openai_mock.requests_to(f"/v1/files/{file_id}/content", "GET")
    assert len(reads) == 1 and reads[0].header("authorization") == headers["Authorization"]
    chats = openai_mock.requests_to(CHAT, "POST")
    assert len(chats) == 3
    assert all(r.header("authorization") == headers["Authorization"] for r in chats)
    assert not any(r.header("x-gateway-workspace") or r.header("x-gateway-api-key") for r in chats)

    output = content(gateway, headers, done["output_file_id"])
    assert [line["custom_id"] for line in output] == ["a", "c"]
    assert output[0]["response"]["status_code"] == 200
    assert output[0]["response"]["body"]["object"] == "chat.completion"
    assert output[0]["id"].startswith("batch_req_") and output[0]["error"] is None
    errors = content(gateway, headers, done["error_file_id"])
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("b", 400)]

    meta = gateway.get(f"/v1/files/{done['output_file_id']}", headers=headers)
    assert meta.status_code == 200
    assert (meta.json()["object"], meta.json()["purpose"]) == ("file", "batch_output")

    # The official SDK reads the same batch and file.
    client = gateway.sdk(headers)
    assert client.batches.retrieve(batch["id"]).status == "completed"
    assert client.files.content(done["output_file_id"]).text.count("\n") == 2


def test_bad_lines_fail_the_batch_with_their_line_numbers(gateway, openai_mock):
    headers = custom_host(openai_mock)
    bad_url = {**chat_line("x"), "url": "/v1/embeddings"}
    file_id = new_file(openai_mock, [chat_line("a"), bad_url, chat_line("a")])
    batch = create(gateway, headers, file_id)
    failed = wait(gateway, headers, batch["id"])
    assert failed["status"] == "failed" and isinstance(failed["failed_at"], int)
    data = failed["errors"]["data"]
    assert [(e["code"], e["line"], e["param"]) for e in data] == [
        ("invalid_url", 2, "url"), ("duplicate_custom_id", 3, "custom_id")]
    assert openai_mock.requests_to(CHAT, "POST") == [], "no line ran"


def test_cancel_is_cancelling_at_once_then_cancelled(gateway, openai_mock):
    headers = custom_host(openai_mock)
    openai_mock.script(model="gpt-slow", stall=0.5, times=None)
    file_id = new_file(openai_mock, [chat_line(f"l{i}", model="gpt-slow") for i in range(16)])
    batch = create(gateway, headers, file_id)
    wait(gateway, headers, batch["id"], done=lambda b: b["status"] == "in_progress")
    resp = gateway.post(f"/v1/batches/{batch['id']}/cancel", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "cancelling" and isinstance(resp.json()["cancelling_at"], int)
    cancelled = wait(gateway, headers, batch["id"])
    assert cancelled["status"] == "cancelled" and isinstance(cancelled["cancelled_at"], int)
    assert cancelled["request_counts"]["total"] == 16
    assert cancelled["request_counts"]["completed"] < 16
    assert len(openai_mock.requests_to(CHAT, "POST")) < 16


def test_a_thousand_lines_with_failures_and_rate_limits_retried(gateway, openai_mock):
    # The caller's config asks for retries on 429: a managed batch's lines go through the
    # gateway as the caller, so its routing and retries apply to every line.
    headers = {**custom_host(openai_mock), **config({"retry": {"attempts": 2, "on_status_codes": [429]}})}
    tag = uuid.uuid4().hex[:6]
    failing, busy = set(range(7, 1000, 37)), set(range(3, 1000, 19)) - set(range(7, 1000, 37))
    openai_mock.script(model=f"gpt-fail-{tag}", status=400, times=None)
    lines = []
    for i in range(1000):
        model = f"gpt-fail-{tag}" if i in failing else f"gpt-busy-{tag}-{i}" if i in busy else "gpt-mock"
        if i in busy:
            openai_mock.script(model=model, status=429, times=1)  # once: the retry gets an answer
        lines.append(chat_line(f"k{i}", model=model, content=f"{tag} line {i}"))
    batch = create(gateway, headers, new_file(openai_mock, lines))

    done = wait(gateway, headers, batch["id"], timeout=120.0)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 1000, "completed": 1000 - len(failing), "failed": len(failing)}
    output = content(gateway, headers, done["output_file_id"])
    assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(1000) if i not in failing)
    assert all(line["response"]["status_code"] == 200 for line in output)
    errors = content(gateway, headers, done["error_file_id"])
    assert sorted((line["custom_id"], line["response"]["status_code"]) for line in errors) == sorted(
        (f"k{i}", 400) for i in failing)

    sent = [r.json["messages"][0]["content"] for r in openai_mock.requests_to(CHAT, "POST")]
    calls = {i: sent.count(f"{tag} line {i}") for i in range(1000)}
    assert {i for i, n in calls.items() if n == 2} == busy, "each rate-limited line was retried once"
    assert all(n == 1 for i, n in calls.items() if i not in busy), "every other line was sent once"


def test_a_thousand_line_batch_cancelled_half_way(gateway, openai_mock):
    headers = custom_host(openai_mock)
    tag = uuid.uuid4().hex[:6]
    openai_mock.script(model=f"gpt-slow-{tag}", stall=0.01, times=None)
    lines = [chat_line(f"h{i}", model=f"gpt-slow-{tag}", content=f"{tag} line {i}") for i in range(1000)]
    batch = create(gateway, headers, new_file(openai_mock, lines))
    wait(gateway, headers, batch["id"], done=lambda b: b["request_counts"]["completed"] >= 300, timeout=120.0)
    resp = gateway.post(f"/v1/batches/{batch['id']}/cancel", headers=headers)
    assert resp.status_code == 200 and resp.json()["status"] == "cancelling", resp.text

    cancelled = wait(gateway, headers, batch["id"], timeout=60.0)
    assert cancelled["status"] == "cancelled", cancelled
    counts = cancelled["request_counts"]
    assert counts["total"] == 1000 and counts["failed"] == 0 and 300 <= counts["completed"] < 1000
    output = content(gateway, headers, cancelled["output_file_id"])
    assert len(output) == counts["completed"] == len({line["custom_id"] for line in output})
    # No line started after the cancel was seen; each line sent reached the output once.
    sent = [r.json["messages"][0]["content"] for r in openai_mock.requests_to(CHAT, "POST")
            if r.json["messages"][0]["content"].startswith(tag)]
    assert len(sent) == len(set(sent)) == counts["completed"]


def test_another_workspace_gets_404(gateway, openai_mock):
    headers = custom_host(openai_mock)
    file_id = new_file(openai_mock, [chat_line("a")])
    batch = create(gateway, headers, file_id)
    done = wait(gateway, headers, batch["id"])
    team = gateway.post("/v1/api-keys", {"workspace": f"team-{uuid.uuid4().hex[:8]}"}).json()["key"]
    for path in (f"/v1/batches/{batch['id']}", f"/v1/files/{done['output_file_id']}/content"):
        assert_error(gateway.get(path, key=team, headers=headers), 404)
    assert openai_mock.requests_to(f"/v1/batches/{batch['id']}") == [], "never sent to the provider"


def test_immediate_is_checked_like_any_batch(gateway, openai_mock):
    headers = custom_host(openai_mock)
    body = {"input_file_id": "", "endpoint": CHAT, "completion_window": "immediate"}
    assert_error(gateway.post("/v1/batches", body, headers=headers), 400, param="input_file_id")
    assert openai_mock.requests == []


def test_an_immediate_batch_needs_a_selected_provider(gateway, openai_mock):
    body = {"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "immediate"}
    resp = gateway.post("/v1/batches", body)
    assert resp.status_code in (400, 401), resp.text
    assert openai_mock.requests == []


def _control_plane_pid(gw) -> int:
    """The pid of ``gw``'s control plane process (found by the address it was given)."""
    wanted = f"GATEWAY_CONTROL_PLANE_ADDR=127.0.0.1:{gw.control_plane_port}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"gateway-control-plane" in cmdline and wanted in environ.split(b"\0"):
            return int(entry.name)
    pytest.fail(f"no control plane process for port {gw.control_plane_port}")


def test_a_killed_control_plane_resumes_its_batch_without_resending_finished_lines(
        start_gateway, tmp_path, openai_mock):
    env = {"GATEWAY_STATE_DIR": str(tmp_path / "state")}
    headers = custom_host(openai_mock)
    openai_mock.script(model="gpt-slow", stall=0.7, times=None)
    lines = [chat_line(f"r{i}", model="gpt-slow", content=f"line {i}") for i in range(8)]
    file_id = new_file(openai_mock, lines)
    with start_gateway("batches-killed", None, env) as gw:
        batch = create(gw, headers, file_id)
        seen = wait(gw, headers, batch["id"], done=lambda b: b["request_counts"]["completed"] >= 4)
        os.kill(_control_plane_pid(gw), signal.SIGKILL)
    done_before = seen["request_counts"]["completed"]
    # Started again on the same state: the batch resumes at once.
    with start_gateway("batches-again", None, env) as gw:
        done = wait(gw, headers, batch["id"])
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
        output = content(gw, headers, done["output_file_id"])
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{i}" for i in range(8))
    sent = [r.json["messages"][0]["content"] for r in openai_mock.requests_to(CHAT, "POST")]
    twice = {c for c in sent if sent.count(c) > 1}
    assert all(sent.count(c) <= 2 for c in sent), sent
    # Only lines in flight when the control plane died were sent again.
    assert len(twice) <= 8 - done_before, (done_before, sorted(sent))


def test_the_batch_list_shows_managed_batches_beside_the_providers(gateway, openai_mock):
    headers = custom_host(openai_mock)
    team, other = workspace_key(gateway), workspace_key(gateway)
    file_id = new_file(openai_mock, [chat_line("a")])
    client = gateway.sdk(headers, key=team)
    made = [client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="immediate").id
            for _ in range(2)]
    # Another workspace's batch never shows.
    gateway.sdk(headers, key=other).batches.create(input_file_id=file_id, endpoint=CHAT,
                                                   completion_window="immediate")
    provider = list(OpenAIMock.BATCH_IDS)
    managed = sorted(made, reverse=True)  # created within a second: newest first by id
    listed = [b.id for b in client.batches.list()]
    assert sorted(listed[:2]) == sorted(made) and listed[2:] == provider, listed

    # limit=1 pages through all of them (the SDK follows `after` = the last id).
    pages = client.batches.list(limit=1)
    assert len(pages.data) == 1 and pages.has_more
    walked = [b.id for b in pages]
    assert walked == listed and len(walked) == 5, walked
    assert set(walked[:2]) == set(managed)
    # The provider's part is the provider's own list, asked as the caller.
    reads = openai_mock.requests_to("/v1/batches", "GET")
    assert reads and all(r.header("authorization") == headers["Authorization"] for r in reads)
    assert not any(r.header("x-gateway-control-plane-fetch") for r in reads), "the mark stays in the gateway"
    after = client.batches.list(limit=2, after=provider[0])
    assert [b.id for b in after.data] == provider[1:]
    # Names percent-encoded are the same names: the page is the same, and the provider is
    # asked one `limit` and never the gateway's own cursor.
    reads_before = len(openai_mock.requests_to("/v1/batches", "GET"))
    encoded = gateway.get(f"/v1/batches?l%69mit=2&%61fter={listed[0]}", headers=headers, key=team)
    assert encoded.status_code == 200, encoded.text
    assert [b["id"] for b in encoded.json()["data"]] == listed[1:3]
    for read in openai_mock.requests_to("/v1/batches", "GET")[reads_before:]:
        names = [unquote(pair.split("=")[0]) for pair in read.raw_query.split("&")]
        assert names.count("limit") == 1 and "after" not in names, read.raw_query
    # The query is still checked by the gateway.
    assert_error(gateway.get("/v1/batches?limit=101", headers=headers, key=team), 400, param="limit")


def test_a_batch_list_for_a_provider_without_batches_is_the_managed_part(gateway, anthropic_mock):
    headers = custom_host(anthropic_mock, provider="anthropic", token=ANTHROPIC_TOKEN)
    team = workspace_key(gateway)
    resp = gateway.get("/v1/batches", headers=headers, key=team)
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"] == [] and resp.json()["has_more"] is False
    assert anthropic_mock.requests == []


def test_a_failing_provider_list_is_the_providers_error(gateway, openai_mock):
    headers = custom_host(openai_mock)
    openai_mock.script(OpenAIMock.error(503, "overloaded"), path="/v1/batches")
    resp = gateway.get("/v1/batches", headers=headers, key=workspace_key(gateway))
    assert_error(resp, 503)


ANTHROPIC_TOKEN = "sk-ant-batch-test"


def test_an_anthropic_batch_from_a_file_uploaded_to_the_gateway(gateway, anthropic_mock):
    headers = custom_host(anthropic_mock, provider="anthropic", token=ANTHROPIC_TOKEN)
    team, other = workspace_key(gateway), workspace_key(gateway)
    client = gateway.sdk(headers, key=team)
    lines = [chat_line("q1", model="claude-mock", content="One?"), chat_line("q2", model="claude-mock")]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines).encode(), "application/jsonl"), purpose="batch")
    assert uploaded.id.startswith("file-gw-")
    assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(jsonl(lines)), "in.jsonl", "batch")
    assert anthropic_mock.requests == [], "Anthropic has no files API: the gateway keeps the file"
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes
    assert client.files.content(uploaded.id).text == jsonl(lines)
    assert_error(gateway.get(f"/v1/files/{uploaded.id}", headers=headers, key=other), 404)

    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="immediate")
    done = wait(gateway, {**headers, "x-gateway-api-key": team}, batch.id)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    output = [json.loads(line) for line in client.files.content(done["output_file_id"]).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["q1", "q2"]
    for line in output:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == AnthropicMock.default_text
    sent = anthropic_mock.requests_to("/v1/messages", "POST")
    assert [r.json["messages"][0]["content"] for r in sent] in (["One?", "Say hello."], ["Say hello.", "One?"])
    assert all(r.header("x-api-key") == ANTHROPIC_TOKEN for r in sent)

    # Deleted: gone for good; another workspace cannot delete it.
    assert_error(gateway.request("DELETE", f"/v1/files/{uploaded.id}", headers=headers, key=other), 404)
    assert client.files.delete(uploaded.id).deleted is True
    assert_error(gateway.get(f"/v1/files/{uploaded.id}", headers=headers, key=team), 404)


def listed(page) -> list[str]:
    return [f.id for f in page]


def test_the_file_list_of_a_provider_without_files_is_the_gateways(gateway, anthropic_mock):
    headers = custom_host(anthropic_mock, provider="anthropic", token=ANTHROPIC_TOKEN)
    team, other = workspace_key(gateway), workspace_key(gateway)
    client = gateway.sdk(headers, key=team)
    made = [client.files.create(file=(f"f{i}.jsonl", b"{}\n", "application/jsonl"), purpose=purpose)
            for i, purpose in enumerate(["batch", "assistants", "batch"])]
    gateway.sdk(headers, key=other).files.create(file=("x.jsonl", b"{}\n", "application/jsonl"), purpose="batch")
    newest_first = [f.id for f in sorted(made, key=lambda f: (f.created_at, f.id), reverse=True)]

    page = client.files.list()
    assert (listed(page.data), page.has_more) == (newest_first, False)
    assert page.data[0].model_dump() == client.files.retrieve(newest_first[0]).model_dump()
    assert listed(client.files.list(order="asc")) == newest_first[::-1]
    assert listed(client.files.list(purpose="batch")) == [i for i in newest_first if i != made[1].id]
    # limit=1 pages through them (the SDK follows `after` = the last id), either way round.
    first = client.files.list(limit=1)
    assert len(first.data) == 1 and first.has_more
    assert listed(first) == newest_first
    assert listed(client.files.list(limit=2, order="asc")) == newest_first[::-1]
    last = client.files.list(limit=2, after=newest_first[0])
    assert (listed(last.data), last.has_more) == (newest_first[1:], False)
    assert anthropic_mock.requests == [], "Anthropic has no files API: nothing is asked of it"
    assert_error(gateway.get("/v1/files?after=file-gw-nope", headers=headers, key=team), 400, param="after")
    assert_error(gateway.get("/v1/files?limit=10001", headers=headers, key=team), 400, param="limit")


def test_the_file_list_shows_a_managed_batchs_files_beside_the_providers(gateway, openai_mock):
    headers = custom_host(openai_mock)
    team = workspace_key(gateway)
    client = gateway.sdk(headers, key=team)
    openai_mock.script(model="gpt-fail", status=400, times=None)
    file_id = new_file(openai_mock, [chat_line("a"), chat_line("b", model="gpt-fail")])
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="immediate")
    done = wait(gateway, {**headers, "x-gateway-api-key": team}, batch.id)
    ours = [done["output_file_id"], done["error_file_id"]]
    assert all(i.startswith("file-gw-") for i in ours), done
    provider = ["file-mock-1", "file-mock-2"]

    page = client.files.list()
    assert sorted(listed(page.data)[:2]) == sorted(ours) and listed(page.data)[2:] == provider
    assert not page.has_more
    assert {f.purpose for f in page.data[:2]} == {"batch_output"}
    assert listed(client.files.list(limit=1)) == listed(page.data)
    assert listed(client.files.list(limit=2, order="asc")) == provider + listed(page.data)[:2][::-1]
    assert listed(client.files.list(purpose="batch_output")) == listed(page.data)[:2]
    assert listed(client.files.list(purpose="batch")) == provider
    # The provider's part is its own list, asked as the caller, with the room left on the page.
    reads = openai_mock.requests_to("/v1/files", "GET")
    assert reads and all(r.header("authorization") == headers["Authorization"] for r in reads)
    assert not any(r.header("x-gateway-control-plane-fetch") for r in reads), "the mark stays in the gateway"
    client.files.list(limit=3, purpose="batch")
    assert openai_mock.last.query == {"purpose": ["batch"], "limit": ["3"]}
    client.files.list(limit=3)
    assert openai_mock.last.query == {"limit": ["1"]}

    # The provider's error is the list's.
    openai_mock.script(OpenAIMock.error(503, "overloaded"), path="/v1/files")
    assert_error(gateway.get("/v1/files", headers=headers, key=team), 503)


def paused_reading(gateway) -> int:
    """How often Envoy stopped reading a client's request for flow control (all listeners)."""
    return sum(int(v) for k, v in gateway.stats().items()
               if k.endswith("downstream_flow_control_paused_reading_total"))


def test_an_upload_above_the_buffer_limit_waits_for_a_key_no_worker_has_read(gateway, openai_mock):
    # The filter holds the request while it reads a new key from the control plane (stopped
    # here, so the read waits). Envoy holds the body with flow control meanwhile: no 413 at
    # its 20 MiB buffer limit, the client simply waits, and nothing reaches the provider.
    client = gateway.sdk(custom_host(openai_mock), key=workspace_key(gateway), timeout=120.0)
    data = bytes(range(256)) * (80 * 1024 * 4)  # 80 MiB
    outcome: dict = {}

    def upload():
        try:
            outcome["file"] = client.files.create(file=("big.bin", data, "application/octet-stream"),
                                                  purpose="assistants")
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    control_plane = _control_plane_pid(gateway)
    paused_before, heap_before = paused_reading(gateway), gateway.memory_allocated()
    os.kill(control_plane, signal.SIGSTOP)
    sender = threading.Thread(target=upload, daemon=True)
    try:
        sender.start()
        deadline = time.monotonic() + 2.0  # within the filter's 3 s control-plane timeout
        while paused_reading(gateway) == paused_before and time.monotonic() < deadline and sender.is_alive():
            time.sleep(0.02)
        assert paused_reading(gateway) > paused_before, f"Envoy did not hold the client back: {outcome}"
        grown = gateway.memory_allocated() - heap_before
        assert outcome == {} and openai_mock.body_bytes == 0
    finally:
        os.kill(control_plane, signal.SIGCONT)
    sender.join(120)
    assert "file" in outcome, outcome
    assert outcome["file"].bytes == len(data)
    assert openai_mock.last.form["file"]["data"] == data
    # Held back at Envoy's limits (the request's buffer and the connection's, 20 MiB each), not whole.
    assert grown < 44 * 1024 * 1024, f"Envoy's memory grew by {grown} bytes while the upload waited"


def test_a_30_mb_upload_to_the_gateway_streams(gateway, anthropic_mock):
    # Above Envoy's 20 MiB buffer limit: a body buffered on the way would be refused (413).
    # (A key no worker has read yet: test_an_upload_above_the_buffer_limit_waits_for_a_key_no_worker_has_read.)
    headers = custom_host(anthropic_mock, provider="anthropic", token=ANTHROPIC_TOKEN)
    data = bytes(range(256)) * (30 * 1024 * 4)  # 30 MiB
    before = gateway.memory_allocated()
    client = gateway.sdk(headers, timeout=120.0)
    uploaded = client.files.create(file=("big.bin", data, "application/octet-stream"), purpose="assistants")
    grown = gateway.memory_allocated() - before
    assert uploaded.bytes == len(data)
    assert grown < 8 * 1024 * 1024, f"Envoy's memory grew by {grown} bytes"
    back = gateway.get(f"/v1/files/{uploaded.id}/content", headers=headers, timeout=120.0)
    assert back.status_code == 200 and hashlib.sha256(back.content).digest() == hashlib.sha256(data).digest()
    client.files.delete(uploaded.id)
