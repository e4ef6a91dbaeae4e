"""Self-check of the cloud mocks (mocks_cloud.py), talking to them directly (no gateway needed)."""

from __future__ import annotations

import json
import socket
import time
from datetime import datetime, timedelta, timezone
from unittest import mock as umock
from urllib.parse import quote

import httpx2 as httpx
import jwt
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer
from cryptography.hazmat.primitives.asymmetric import rsa

import helpers
from mocks import Reply, ToolCall
from mocks_cloud import CLOUD_PLATFORM_SCOPE, JWT_BEARER, CloudReply, thought_signature

HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
USER_HI = [{"role": "user", "parts": [{"text": "hi"}]}]


# --------------------------------------------------------------------------- Google token endpoint


def exchange(token_mock, assertion, grant=JWT_BEARER):
    return httpx.post(token_mock.token_uri, data={"grant_type": grant, "assertion": assertion}, timeout=5)


@pytest.fixture(scope="module")
def other_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_service_account_key_file(google_token_mock):
    sa = google_token_mock.service_account_json()
    assert sa["type"] == "service_account" and sa["token_uri"] == f"{google_token_mock.origin}/token"
    assert sa["private_key"].startswith("-----BEGIN PRIVATE KEY-----\n")  # PKCS#8
    assert sa["private_key_id"] == google_token_mock.key_id
    assert sa["client_email"].endswith(".iam.gserviceaccount.com")
    # a client signs with the key from the file alone
    now = int(time.time())
    assertion = jwt.encode({"iss": sa["client_email"], "scope": CLOUD_PLATFORM_SCOPE, "aud": sa["token_uri"],
                            "iat": now, "exp": now + 3600}, sa["private_key"], algorithm="RS256",
                           headers={"kid": sa["private_key_id"]})
    r = exchange(google_token_mock, assertion)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"access_token", "expires_in", "token_type"}
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3599
    assert google_token_mock.valid(body["access_token"])
    assert [t.token for t in google_token_mock.issued][-1] == body["access_token"]
    assert google_token_mock.exchanges == 1


@pytest.mark.parametrize("case, claims, error, fragment", [
    ("wrong aud", lambda now: {"aud": "https://oauth2.googleapis.com/token"}, "invalid_grant",
     "Failed audience check"),
    ("expired", lambda now: {"iat": now - 7200, "exp": now - 3600}, "invalid_grant", "short-lived"),
    ("too long", lambda now: {"exp": now + 7200}, "invalid_grant", "short-lived"),
    ("iat in the future", lambda now: {"iat": now + 600, "exp": now + 1200}, "invalid_grant", "short-lived"),
    ("other issuer", lambda now: {"iss": "someone@else.iam.gserviceaccount.com"}, "invalid_grant",
     "account not found"),
    ("no scope", lambda now: {"scope": None}, "invalid_scope", "Invalid OAuth scope"),
    ("other scope", lambda now: {"scope": "https://www.googleapis.com/auth/devstorage.read_only"}, "invalid_scope",
     "scope"),
])
def test_token_endpoint_refuses_bad_claims(google_token_mock, case, claims, error, fragment):
    issued = len(google_token_mock.issued)
    r = exchange(google_token_mock, google_token_mock.sign_assertion(**claims(int(time.time()))))
    assert r.status_code == 400, case
    assert r.json()["error"] == error and fragment in r.json()["error_description"]
    assert google_token_mock.rejections == [r.json()["error_description"]]
    assert len(google_token_mock.issued) == issued


def test_token_endpoint_refuses_other_key_kid_alg_and_grant(google_token_mock, other_key):
    for assertion in (google_token_mock.sign_assertion(key=other_key),
                      google_token_mock.sign_assertion(headers={"kid": "0" * 40}),
                      google_token_mock.sign_assertion(key="a-shared-secret-of-at-least-32-bytes", headers={"alg": "HS256"})):
        r = exchange(google_token_mock, assertion)
        assert (r.status_code, r.json()) == (400, {"error": "invalid_grant",
                                                   "error_description": "Invalid JWT Signature."})
    r = exchange(google_token_mock, google_token_mock.sign_assertion(), grant="client_credentials")
    assert (r.status_code, r.json()["error"]) == (400, "unsupported_grant_type")
    assert google_token_mock.exchanges == 4 and len(google_token_mock.rejections) == 4


def test_token_scripting_expiry_failure_and_revocation(google_token_mock):
    google_token_mock.expires_in = 0
    t0 = exchange(google_token_mock, google_token_mock.sign_assertion()).json()
    assert t0["expires_in"] == 0 and not google_token_mock.valid(t0["access_token"])
    google_token_mock.reset()
    assert google_token_mock.expires_in == 3599
    google_token_mock.fail_next(description="Backend says no")
    r = exchange(google_token_mock, google_token_mock.sign_assertion())
    assert (r.status_code, r.json()["error_description"]) == (400, "Backend says no")
    t1 = exchange(google_token_mock, google_token_mock.sign_assertion()).json()["access_token"]
    t2 = exchange(google_token_mock, google_token_mock.sign_assertion()).json()["access_token"]
    assert t1 != t2 and google_token_mock.valid(t1) and google_token_mock.valid(t2)
    google_token_mock.revoke(t1)
    assert not google_token_mock.valid(t1) and google_token_mock.valid(t2)
    assert google_token_mock.exchanges == 3


# --------------------------------------------------------------------------- Vertex / Gemini


def vertex_post(vertex_mock, model, method, body, token=helpers.VERTEX_CLIENT_TOKEN, publisher="google",
                query="", **kw):
    url = vertex_mock.vertex_url(model, method, publisher=publisher) + query
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url, json=body, headers=headers, timeout=5, **kw)


def sse_events(raw: bytes) -> list[dict]:
    assert raw.endswith(b"\r\n\r\n")
    out = []
    for ev in raw.split(b"\r\n\r\n")[:-1]:
        assert ev.startswith(b"data: ")
        out.append(json.loads(ev[6:]))
    return out


def test_vertex_generate_content_with_an_issued_token(vertex_mock, google_token_mock):
    token = exchange(google_token_mock, google_token_mock.sign_assertion()).json()["access_token"]
    vertex_mock.script(Reply(text="Sunny.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})], usage=(5, 3)),
                       model="gemini-2.0-flash")
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {
        "contents": USER_HI, "systemInstruction": {"parts": [{"text": "be brief"}]},
        "generationConfig": {"temperature": 0.2, "maxOutputTokens": 50, "stopSequences": ["\n\n"]},
        "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": {"type": "OBJECT"}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}},
    }, token=token)
    assert r.status_code == 200, r.text
    body = r.json()
    cand = body["candidates"][0]
    assert cand["content"] == {"role": "model", "parts": [
        {"text": "Sunny."}, {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]}
    assert cand["finishReason"] == "STOP"
    assert body["usageMetadata"]["promptTokenCount"] == 5
    assert body["usageMetadata"]["candidatesTokenCount"] == 3
    assert body["usageMetadata"]["totalTokenCount"] == 8
    assert body["modelVersion"] == "gemini-2.0-flash" and "createTime" in body
    assert vertex_mock.last.path.endswith("/models/gemini-2.0-flash:generateContent")


def test_vertex_auth(vertex_mock, google_token_mock):
    ok = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {"contents": USER_HI})
    assert ok.status_code == 200  # a registered static token
    for token in ("ya29.never-issued", None):
        r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {"contents": USER_HI}, token=token)
        assert r.status_code == 401
        err = r.json()["error"]
        assert (err["code"], err["status"]) == (401, "UNAUTHENTICATED")
        assert "authentication credential" in err["message"]
    token = exchange(google_token_mock, google_token_mock.sign_assertion()).json()["access_token"]
    google_token_mock.revoke(token)
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {"contents": USER_HI}, token=token)
    assert r.status_code == 401 and r.json()["error"]["message"].startswith("Request had invalid authentication")


def test_vertex_stream_sse_and_json_array(vertex_mock):
    vertex_mock.script(Reply(text="one two three", usage=(4, 3)), times=2)
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "streamGenerateContent", {"contents": USER_HI},
                    query="?alt=sse")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert len(events) == 3
    assert "".join(e["candidates"][0]["content"]["parts"][0]["text"] for e in events) == "one two three"
    assert all("finishReason" not in e["candidates"][0] for e in events[:-1])
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    assert events[-1]["usageMetadata"]["totalTokenCount"] == 7
    assert "candidatesTokenCount" not in events[0]["usageMetadata"]
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "streamGenerateContent", {"contents": USER_HI})
    arr = r.json()  # no alt=sse: one JSON array
    assert isinstance(arr, list) and len(arr) == 3 and arr[-1]["candidates"][0]["finishReason"] == "STOP"


def test_vertex_stream_tool_call_thinking_and_midstream_error(vertex_mock):
    vertex_mock.script(Reply(thinking="hmm", text="", tool_calls=[ToolCall("f", {"a": 1}, id="c1")],
                             stop_reason="MAX_TOKENS"))
    events = sse_events(vertex_post(vertex_mock, "gemini-2.5-pro", "streamGenerateContent", {"contents": USER_HI},
                                    query="?alt=sse").content)
    assert events[0]["candidates"][0]["content"]["parts"] == [{"text": "hmm", "thought": True}]
    # A thinking model signs the step's first function call.
    call = {"name": "f", "args": {"a": 1}, "id": "c1"}
    assert events[-1]["candidates"][0]["content"]["parts"] == [
        {"functionCall": call, "thoughtSignature": thought_signature(call)}]
    assert events[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    vertex_mock.script(CloudReply(text="a b c d", exception=("INTERNAL", "boom"), write_size=7))
    events = sse_events(vertex_post(vertex_mock, "gemini-2.5-pro", "streamGenerateContent", {"contents": USER_HI},
                                    query="?alt=sse").content)
    assert events[0]["candidates"][0]["content"]["parts"] == [{"text": "a "}]
    assert events[1] == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
    assert len(events) == 2


@pytest.mark.parametrize("body, fragment", [
    ({}, "contents is not specified"),
    ({"contents": []}, "contents is not specified"),
    ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "valid role: user, model"),
    ({"contents": [{"role": "system", "parts": [{"text": "x"}]}, *USER_HI]}, "valid role"),
    ({"contents": [{"role": "user", "parts": []}]}, "contents.parts must not be empty"),
    ({"contents": [{"role": "user", "parts": [{"functionResponse": {"response": {}}}]}]},
     "contents[0].parts[0].function_response.name: Name cannot be empty"),
    ({"contents": [{"role": "user", "parts": [{"text": "a", "inlineData": {"mimeType": "x", "data": ""}}]}]},
     "Oneof field 'data' is already set"),
    ({"contents": USER_HI, "generationConfig": {"max_tokens": 5}},
     'Unknown name "max_tokens" at \'generation_config\': Cannot find field.'),
    ({"contents": USER_HI, "generationConfig": {"temperature": "hot"}}, "generation_config.temperature"),
    ({"contents": USER_HI, "messages": []}, 'Unknown name "messages": Cannot find field.'),
    ({"contents": USER_HI, "systemInstruction": "be brief"}, "system_instruction"),
    ({"contents": USER_HI, "tools": [{"functionDeclarations": [{"name": "bad name!"}]}]}, "Invalid function name"),
    ({"contents": USER_HI, "toolConfig": {"functionCallingConfig": {"mode": "REQUIRED"}}}, "mode"),
])
def test_vertex_validates_like_google(vertex_mock, body, fragment):
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["status"]) == (400, "INVALID_ARGUMENT") and fragment in err["message"], err


def test_vertex_accepts_snake_case_fields(vertex_mock):
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {
        "contents": USER_HI, "generation_config": {"max_output_tokens": 5},
        "system_instruction": {"parts": [{"text": "s"}]}})
    assert r.status_code == 200, r.text


def test_gemini_api_key(vertex_mock):
    vertex_mock.script(Reply(text="from gemini"), model="gemini-2.0-flash")
    url = vertex_mock.gemini_url("gemini-2.0-flash")
    r = httpx.post(url, json={"contents": USER_HI}, headers={"x-goog-api-key": helpers.GEMINI_API_KEY}, timeout=5)
    assert r.status_code == 200 and r.json()["candidates"][0]["content"]["parts"] == [{"text": "from gemini"}]
    assert "createTime" not in r.json()
    r = httpx.post(url, json={"contents": USER_HI}, headers={"x-goog-api-key": "wrong"}, timeout=5)
    assert (r.status_code, r.json()["error"]["message"]) == (400, "API key not valid. Please pass a valid API key.")
    r = httpx.post(url, json={"contents": USER_HI}, timeout=5)
    assert (r.status_code, r.json()["error"]["status"]) == (403, "PERMISSION_DENIED")
    r = httpx.post(vertex_mock.gemini_url("gemini-2.0-flash", "streamGenerateContent") + "?alt=sse",
                   json={"contents": USER_HI}, headers={"x-goog-api-key": helpers.GEMINI_API_KEY}, timeout=5)
    assert sse_events(r.content)[-1]["candidates"][0]["finishReason"] == "STOP"


def test_vertex_anthropic_raw_predict(vertex_mock):
    model = "claude-3-5-sonnet-v2@20241022"
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}]}
    vertex_mock.script(Reply(text="Bonjour", usage=(3, 2)), model=model)
    r = vertex_post(vertex_mock, model, "rawPredict", body, publisher="anthropic")
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["type"] == "message" and msg["content"] == [{"type": "text", "text": "Bonjour"}]
    assert msg["stop_reason"] == "end_turn" and msg["usage"]["input_tokens"] == 3
    r = vertex_post(vertex_mock, model, "streamRawPredict", {**body, "stream": True}, publisher="anthropic")
    kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    for bad, fragment in (({**body, "model": model}, "model: Extra inputs are not permitted"),
                          ({k: v for k, v in body.items() if k != "anthropic_version"}, "anthropic_version"),
                          ({**body, "anthropic_version": "2023-06-01"}, "vertex-2023-10-16"),
                          ({**body, "messages": []}, "at least one message")):
        r = vertex_post(vertex_mock, model, "rawPredict", bad, publisher="anthropic")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert fragment in r.json()["error"]["message"]


def test_vertex_scripted_error_and_unknown_method(vertex_mock):
    vertex_mock.script(Reply(status=429))
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "generateContent", {"contents": USER_HI})
    assert r.status_code == 429 and r.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    r = vertex_post(vertex_mock, "gemini-2.0-flash", "rawPredict", {"contents": USER_HI})
    assert r.status_code == 404


# --------------------------------------------------------------------------- Bedrock


def signed(url: str, body: bytes, *, access=helpers.AWS_ACCESS_KEY_ID, secret=helpers.AWS_SECRET_ACCESS_KEY,
           token=None, region="us-east-1", service="bedrock") -> tuple[str, dict, bytes]:
    """What botocore sends: (url, headers, body) signed with SigV4."""
    req = AWSRequest(method="POST", url=url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(access, secret, token), service, region).add_auth(req)
    prepared = req.prepare()
    return prepared.url, dict(prepared.headers), prepared.body


def converse_url(bedrock_mock, model=HAIKU, op="converse", encode=True):
    return f"{bedrock_mock.origin}/model/{quote(model, safe='') if encode else model}/{op}"


def converse_body(**extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": [{"text": "hi"}]}], **extra}).encode()


def send(url, headers, body, **kw):
    return httpx.post(url, headers=headers, content=body, timeout=5, **kw)


@pytest.mark.parametrize("encode", [True, False], ids=["path-percent-encoded", "path-raw-colon"])
def test_bedrock_accepts_botocore_signed_requests(bedrock_mock, encode):
    bedrock_mock.script(Reply(text="Hi there", usage=(9, 2)), model=HAIKU)
    url, headers, body = signed(converse_url(bedrock_mock, encode=encode), converse_body(
        system=[{"text": "be brief"}], inferenceConfig={"maxTokens": 100, "temperature": 0.5}))
    r = send(url, headers, body)
    assert r.status_code == 200, r.text
    assert bedrock_mock.last.path == ("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse" if encode
                                      else f"/model/{HAIKU}/converse")
    out = r.json()
    assert out["output"]["message"] == {"role": "assistant", "content": [{"text": "Hi there"}]}
    assert out["stopReason"] == "end_turn"
    assert out["usage"] == {"inputTokens": 9, "outputTokens": 2, "totalTokens": 11}
    assert isinstance(out["metrics"]["latencyMs"], int)
    assert bedrock_mock.signatures == ["ok"]


def test_bedrock_canonical_path_is_encoded_twice(bedrock_mock):
    url, headers, body = signed(converse_url(bedrock_mock), converse_body())
    r = send(url, {**headers, "Authorization": headers["Authorization"][:-4] + "0000"}, body)
    assert r.status_code == 403
    assert "/model/anthropic.claude-3-haiku-20240307-v1%253A0/converse\n" in r.json()["message"]


def test_bedrock_session_token_and_api_key(bedrock_mock):
    url, headers, body = signed(converse_url(bedrock_mock), converse_body(), access=helpers.AWS_TEMP_ACCESS_KEY_ID,
                                secret=helpers.AWS_TEMP_SECRET_ACCESS_KEY, token=helpers.AWS_SESSION_TOKEN)
    assert send(url, headers, body).status_code == 200
    # the same key pair without its session token, or with another one
    url, headers, body = signed(converse_url(bedrock_mock), converse_body(), access=helpers.AWS_TEMP_ACCESS_KEY_ID,
                                secret=helpers.AWS_TEMP_SECRET_ACCESS_KEY)
    r = send(url, headers, body)
    assert r.status_code == 403 and r.headers["x-amzn-errortype"].startswith("UnrecognizedClientException:")
    r = send(converse_url(bedrock_mock), {"Authorization": f"Bearer {helpers.BEDROCK_API_KEY}",
                                          "Content-Type": "application/json"}, converse_body())
    assert r.status_code == 200


def _tamper_body(url, headers, body):
    return url, headers, body.replace(b'"hi"', b'"hI"')


@pytest.mark.parametrize("case, tamper, error_type", [
    ("body byte", _tamper_body, "InvalidSignatureException"),
    ("signature", lambda u, h, b: (u, {**h, "Authorization": h["Authorization"][:-1]
                                       + ("0" if h["Authorization"][-1] != "0" else "1")}, b),
     "InvalidSignatureException"),
    ("host", lambda u, h, b: (u, {**h, "Host": "bedrock-runtime.us-east-1.amazonaws.com"}, b),
     "InvalidSignatureException"),
    ("path", lambda u, h, b: (u.replace("%3A0", "%3A1"), h, b), "InvalidSignatureException"),
    ("query", lambda u, h, b: (u + "?x=1", h, b), "InvalidSignatureException"),
    ("no auth", lambda u, h, b: (u, {k: v for k, v in h.items() if k != "Authorization"}, b),
     "MissingAuthenticationTokenException"),
])
def test_bedrock_refuses_tampered_requests(bedrock_mock, case, tamper, error_type):
    url, headers, body = tamper(*signed(converse_url(bedrock_mock), converse_body()))
    r = send(url, headers, body)
    assert r.status_code == 403, case
    assert r.headers["x-amzn-errortype"] == \
        f"{error_type}:http://internal.amazon.com/coral/com.amazon.coral.service/"
    if error_type == "InvalidSignatureException":
        assert r.json()["message"].startswith("The request signature we calculated does not match the signature "
                                              "you provided.")
    assert bedrock_mock.signatures == [error_type]


@pytest.mark.parametrize("kw, error_type, fragment", [
    ({"access": "AKIAUNKNOWNKEY000000"}, "UnrecognizedClientException", "security token included"),
    ({"secret": "not-the-secret"}, "InvalidSignatureException", "signature we calculated"),
    ({"region": "eu-west-1"}, "InvalidSignatureException", "valid region"),
    ({"service": "s3"}, "InvalidSignatureException", "correct service"),
])
def test_bedrock_refuses_wrong_credentials(bedrock_mock, kw, error_type, fragment):
    r = send(*signed(converse_url(bedrock_mock), converse_body(), **kw))
    assert r.status_code == 403 and r.headers["x-amzn-errortype"].startswith(f"{error_type}:")
    assert fragment in r.json()["message"]


def test_bedrock_refuses_an_old_signature(bedrock_mock):
    old = datetime.now(timezone.utc) - timedelta(minutes=10)
    with umock.patch("botocore.auth.get_current_datetime", return_value=old.replace(tzinfo=None)):
        url, headers, body = signed(converse_url(bedrock_mock), converse_body())
    r = send(url, headers, body)
    assert r.status_code == 403 and r.json()["message"].startswith("Signature expired:")


@pytest.mark.parametrize("body, fragment", [
    ({"messages": []}, "must start with a user message"),
    ({}, "Value null at 'messages'"),
    ({"messages": [{"role": "assistant", "content": [{"text": "x"}]}]}, "must start with a user message"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "user", "content": [{"text": "b"}]}]},
     "must alternate between user and assistant"),
    ({"messages": [{"role": "system", "content": [{"text": "a"}]}]}, "enum value set: [user, assistant]"),
    ({"messages": [{"role": "user", "content": []}]}, "content field in the Message object at messages.0 is empty"),
    ({"messages": [{"role": "user", "content": [{"text": " "}]}]}, "is blank"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, "exactly one of the members"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]},
                   {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]},
                   {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "r"}]}}]}]},
     "toolConfig field must be defined"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]},
                   {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]},
                   {"role": "user", "content": [{"text": "no result"}]}],
      "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}}}]}},
     "Expected toolResult blocks at messages.2.content for the following Ids: t1"),
    ({"messages": [{"role": "user", "content": [{"image": {"format": "bmp", "source": {"bytes": "AA=="}}}]}]},
     "png, jpeg, gif, webp"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}], "inferenceConfig": {"temperature": 2}},
     "less than or equal to 1"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}], "inferenceConfig": {"max_tokens": 2}},
     "inferenceConfig accepts only"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}], "system": "be brief"}, "SystemContentBlock"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}], "toolConfig": {"tools": []}},
     "length greater than or equal to 1"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}],
      "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}],
                     "toolChoice": {"tool": {"name": "g"}}}}, "toolChoice"),
])
def test_bedrock_validates_like_converse(bedrock_mock, body, fragment):
    r = send(*signed(converse_url(bedrock_mock), json.dumps(body).encode()))
    assert r.status_code == 400, r.text
    assert r.headers["x-amzn-errortype"].startswith("ValidationException:")
    assert fragment in r.json()["message"], r.json()


def decode_frames(raw: bytes) -> list:
    buf = EventStreamBuffer()
    buf.add_data(raw)
    return list(buf)  # botocore checks both CRCs and the lengths


def test_bedrock_stream_frames_decode(bedrock_mock):
    bedrock_mock.script(Reply(text="one two", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="tu1")],
                              usage=(6, 4)))
    url, headers, body = signed(converse_url(bedrock_mock, op="converse-stream"), converse_body(
        toolConfig={"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": {"type": "object"}}}}]}))
    r = send(url, headers, body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.amazon.eventstream"
    msgs = decode_frames(r.content)
    assert all(m.headers[":message-type"] == "event" and m.headers[":content-type"] == "application/json"
               for m in msgs)
    kinds = [m.headers[":event-type"] for m in msgs]
    assert kinds == ["messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockStop",
                     "contentBlockStart", "contentBlockDelta", "contentBlockDelta", "contentBlockDelta",
                     "contentBlockStop", "messageStop", "metadata"]
    payloads = [json.loads(m.payload) for m in msgs]
    assert all("p" in p for p in payloads)  # AWS's padding
    assert payloads[0]["role"] == "assistant"
    assert "".join(p["delta"]["text"] for p in payloads[1:3]) == "one two"
    assert payloads[4]["start"] == {"toolUse": {"toolUseId": "tu1", "name": "get_weather"}}
    assert payloads[4]["contentBlockIndex"] == 1
    assert json.loads("".join(p["delta"]["toolUse"]["input"] for p in payloads[5:8])) == {"city": "Paris"}
    assert payloads[9]["stopReason"] == "tool_use"
    assert payloads[10]["usage"] == {"inputTokens": 6, "outputTokens": 4, "totalTokens": 10}


def test_bedrock_stream_exception_mid_stream(bedrock_mock):
    bedrock_mock.script(CloudReply(text="a b c", exception=("throttlingException", "Too many tokens, please wait.")))
    r = send(*signed(converse_url(bedrock_mock, op="converse-stream"), converse_body()))
    msgs = decode_frames(r.content)
    assert [m.headers.get(":event-type") for m in msgs] == ["messageStart", "contentBlockDelta", None]
    last = msgs[-1]
    assert last.headers[":message-type"] == "exception"
    assert last.headers[":exception-type"] == "throttlingException"
    assert json.loads(last.payload) == {"message": "Too many tokens, please wait."}


def test_bedrock_stream_in_one_byte_writes(bedrock_mock):
    bedrock_mock.script(CloudReply(text="split me", write_size=1))
    url, headers, body = signed(converse_url(bedrock_mock, op="converse-stream"), converse_body())
    path = url[len(bedrock_mock.origin):]
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{bedrock_mock.port}\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", bedrock_mock.port), timeout=5) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    sizes, payload, pos = [], b"", 0
    while True:
        eol = rest.index(b"\r\n", pos)
        size = int(rest[pos:eol], 16)
        if size == 0:
            break
        sizes.append(size)
        payload += rest[eol + 2:eol + 2 + size]
        pos = eol + 2 + size + 2
    assert set(sizes) == {1} and len(sizes) == len(payload)
    msgs = decode_frames(payload)
    text = "".join(json.loads(m.payload)["delta"]["text"] for m in msgs if m.headers[":event-type"]
                   == "contentBlockDelta")
    assert text == "split me"


def test_bedrock_scripted_error_and_model_keying(bedrock_mock):
    bedrock_mock.script(Reply(status=429), model=HAIKU)
    r = send(*signed(converse_url(bedrock_mock), converse_body()))
    assert r.status_code == 429 and r.headers["x-amzn-errortype"].startswith("ThrottlingException:")
    assert r.json() == {"message": "Mock error with status 429"}
    bedrock_mock.script(bedrock_mock.error(400, "ValidationException", "The model is not ready"))
    r = send(*signed(converse_url(bedrock_mock), converse_body()))
    assert (r.status_code, r.json()["message"]) == (400, "The model is not ready")
    assert r.headers["x-amzn-errortype"].startswith("ValidationException:")
    assert bedrock_mock.request_model(bedrock_mock.last) == HAIKU
