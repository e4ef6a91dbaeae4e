"""Mocks of the cloud providers' wire formats, checking requests the way the real services do.

Built on ``mocks.MockProvider`` (real HTTP servers in the pytest process, recording, scripting
with ``Reply`` / ``ToolCall``, holds, gates and steps):

* ``GoogleTokenMock``: Google's OAuth token endpoint (``POST /token``, the JWT-bearer grant of a
  service account). It makes its own service-account key pair and verifies each assertion's
  signature and claims (PyJWT) as Google does; it issues random access tokens.
* ``VertexMock``: Vertex AI's ``generateContent`` / ``streamGenerateContent`` (Gemini) and
  ``rawPredict`` / ``streamRawPredict`` (Anthropic's Messages API on Vertex, produced by
  ``AnthropicMock.answer``), authorised by a token the ``GoogleTokenMock`` issued or one the test
  registered; and the Gemini API (``/v1beta/models/{model}:generateContent``, key in
  ``x-goog-api-key``). Bodies are validated like Google does (errors as ``INVALID_ARGUMENT``).
* ``BedrockMock``: Bedrock's ``converse`` / ``converse-stream``, and for Anthropic's models
  ``invoke`` / ``invoke-with-response-stream`` (Anthropic's Messages body as Bedrock takes it)
  and ``count-tokens``. Each request's SigV4 signature is recomputed with botocore from the
  request as received (raw path, query, signed headers, body) and compared, as AWS does; bodies
  are validated like Converse or like Claude on Bedrock; streams are
  ``application/vnd.amazon.eventstream`` binary frames.

``CloudReply`` adds what only these mocks do: an error in the middle of a stream
(``exception=``) and a stream written in tiny pieces (``write_size=``, e.g. 1 byte per write).

    token_mock = GoogleTokenMock().start()
    vertex = VertexMock(token_mock, tokens={"ya29.client-own"}, api_keys={"gm-key"}).start()
    sa = token_mock.service_account_json()              # the key file the gateway is given
    vertex.script(Reply(text="Hi", usage=(3, 1)), model="gemini-2.0-flash")
    bedrock = BedrockMock({"AKIDMOCK": "secret"}, region="us-east-1").start()
    bedrock.script(CloudReply(text="a b c", exception=("throttlingException", "slow down")))
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import string
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote

import jwt
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from mocks import AnthropicMock, MockProvider, RecordedRequest, Reply, _Handler, _split

__all__ = [
    "BedrockMock",
    "CloudReply",
    "GoogleTokenMock",
    "IssuedToken",
    "VertexMock",
    "event_frame",
]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


def _hex(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


@dataclass(eq=False)
class CloudReply(Reply):
    """A ``Reply`` with the stream faults of the cloud mocks.

    ``exception``: ``(type, message)`` sent instead of the rest of a stream once
    ``exception_after`` events went out (default: right after the first content event). Bedrock:
    an exception frame (``:exception-type`` = type, e.g. ``throttlingException``); Vertex Gemini:
    a last SSE event ``{"error": {...}}`` with type as the Google status (e.g. ``INTERNAL``).
    ``write_size``: write the stream in pieces of this many bytes (each its own chunk, flushed),
    so frames and events arrive split across reads."""

    exception: tuple[str, str] | None = None
    exception_after: int | None = None
    write_size: int | None = None


def _stream_events(mock: MockProvider, h: _Handler, reply: Reply, events: list[bytes], first: int,
                   content_end: int | None, content_type: str, fault: bytes | None = None,
                   headers: dict | None = None):
    """``MockProvider._stream`` with the ``CloudReply`` faults: the stream cut after
    ``exception_after`` events (default ``first``) with ``fault`` in place of the rest, and
    every write split into ``write_size`` pieces."""
    if fault is not None and getattr(reply, "exception", None):
        cut = getattr(reply, "exception_after", None)
        cut = first if cut is None else min(cut, len(events))
        events = events[:cut] + [fault]
        first = min(first, cut)
        content_end = min(content_end, cut) if content_end is not None else None
    mock._stream(h, reply, events, first=first, content_end=content_end, content_type=content_type,
                 headers=headers, write_size=getattr(reply, "write_size", None))


# --------------------------------------------------------------------------- Google OAuth


@dataclass
class IssuedToken:
    token: str
    expires_in: int
    expires_at: float  # time.time() after which the token is no longer valid
    revoked: bool = False


class GoogleTokenMock(MockProvider):
    """Google's OAuth 2.0 token endpoint for service accounts (``POST /token``, form body
    ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>``).

    At start it makes an RSA-2048 service-account key; ``service_account_json()`` is the key
    file. An assertion must be RS256 with ``kid`` = the key id, signed by that key, with
    ``iss`` = client_email, ``aud`` = ``token_uri``, ``scope`` containing cloud-platform,
    ``iat`` within ``max_iat_skew`` seconds of now, ``exp`` > now and ``exp - iat`` <= 3600;
    else 400 ``invalid_grant`` (or ``invalid_scope``) worded like Google. A valid one gets a
    fresh token for ``expires_in`` seconds, unless a scripted reply says otherwise
    (``fail_next``, ``script(GoogleTokenMock.error(...))``, holds, stalls).

    Issued tokens stay valid across ``reset()`` (a gateway keeps them between tests) until
    they expire or ``revoke()``; ``reset()`` restores ``expires_in`` and clears the counts."""

    name = "google-token"

    def __init__(self, *, expires_in: int = 3599, project_id: str = "mock-project",
                 client_email: str | None = None, max_iat_skew: int = 60, **kw: Any):
        super().__init__(**kw)
        self.default_expires_in = expires_in
        self.expires_in = expires_in
        self.max_iat_skew = max_iat_skew
        self.project_id = project_id
        self.client_email = client_email or f"gateway-e2e@{project_id}.iam.gserviceaccount.com"
        self.client_id = str(random.randrange(10**20, 10**21))
        self.key_id = _hex(40)
        self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.public_key = self.private_key.public_key()
        self.private_key_pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode()
        self.token_uri = f"{self.origin}/token"
        self.issued: list[IssuedToken] = []
        self._by_token: dict[str, IssuedToken] = {}
        self.rejections: list[str] = []  # error_description of each refused assertion, in order

    def service_account_json(self) -> dict:
        """A service-account key file, as the console downloads it."""
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": self.key_id,
            "private_key": self.private_key_pem,
            "client_email": self.client_email,
            "client_id": self.client_id,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/"
                                    + self.client_email.replace("@", "%40"),
            "universe_domain": "googleapis.com",
        }

    def sign_assertion(self, key=None, headers: dict | None = None, **claims: Any) -> str:
        """A JWT-bearer assertion as a client makes it (valid unless overridden): claims
        replace the defaults (``iat=...``, ``aud=...``; ``None`` drops one), ``key`` another
        private key, ``headers`` replace the JWT header fields."""
        now = int(time.time())
        body = {"iss": self.client_email, "scope": CLOUD_PLATFORM_SCOPE, "aud": self.token_uri,
                "iat": now, "exp": now + 3600}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        head = {"kid": self.key_id, **(headers or {})}
        return jwt.encode(body, key or self.private_key, algorithm=head.pop("alg", "RS256"), headers=head)

    @staticmethod
    def error(status: int = 400, error: str = "invalid_grant", description: str = "Bad Request",
              **reply_fields: Any) -> Reply:
        """A scripted OAuth error answer."""
        return Reply(status=status, body={"error": error, "error_description": description}, **reply_fields)

    def fail_next(self, times: int = 1, status: int = 400, error: str = "invalid_grant",
                  description: str = "Bad Request") -> Reply:
        """The next ``times`` valid exchanges are refused with this error."""
        return self.script(self.error(status, error, description), times=times)

    def error_body(self, status, message=None, type_=None):
        return {"error": type_ or ("invalid_request" if status < 500 else "internal_failure"),
                "error_description": message or f"Mock error with status {status}"}

    # ---- tokens
    @property
    def exchanges(self) -> int:
        """Requests to ``POST /token`` since the last reset (valid or not)."""
        with self._lock:
            return sum(1 for r in self.requests if r.method == "POST" and r.path == "/token")

    def valid(self, token: str | None) -> bool:
        """Whether ``token`` was issued here, is not revoked and has not expired."""
        with self._lock:
            t = self._by_token.get(token or "")
            return t is not None and not t.revoked and time.time() < t.expires_at

    def revoke(self, token: str | None = None):
        """Invalidate one issued token, or all of them."""
        with self._lock:
            for t in self.issued:
                if token is None or t.token == token:
                    t.revoked = True

    def reset(self):
        super().reset()
        with self._lock:
            self.expires_in = self.default_expires_in
            self.rejections.clear()

    # ---- the endpoint
    def check_assertion(self, assertion: str) -> tuple[str, str] | None:
        """``(error, error_description)`` as Google would answer for this assertion, or None."""
        bad_sig = ("invalid_grant", "Invalid JWT Signature.")
        try:
            header = jwt.get_unverified_header(assertion)
        except jwt.PyJWTError:
            return ("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                                     "reasonable timeframe. Check your iat and exp values in the JWT claim.")
        if header.get("alg") != "RS256" or header.get("kid") != self.key_id:
            return bad_sig
        try:
            claims = jwt.decode(assertion, self.public_key, algorithms=["RS256"],
                                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                                         "verify_aud": False, "verify_iss": False})
        except jwt.InvalidSignatureError:
            return bad_sig
        except jwt.PyJWTError as e:
            return ("invalid_grant", f"Invalid JWT: {e}")
        if claims.get("iss") != self.client_email:
            return ("invalid_grant", "Invalid grant: account not found")
        if claims.get("aud") != self.token_uri:
            return ("invalid_grant", f"Invalid JWT: Failed audience check. The right audience is {self.token_uri}")
        now = time.time()
        iat, exp = claims.get("iat"), claims.get("exp")
        if (not isinstance(iat, int) or not isinstance(exp, int) or abs(iat - now) > self.max_iat_skew
                or exp <= now or exp - iat > 3600 or exp <= iat):
            return ("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                                     "reasonable timeframe. Check your iat and exp values in the JWT claim.")
        scopes = claims.get("scope")
        if not isinstance(scopes, str) or CLOUD_PLATFORM_SCOPE not in scopes.split():
            return ("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
        return None

    def handle(self, h, req):
        if req.path != "/token" or req.method != "POST":
            return h.send_json(404, {"error": "not_found", "error_description": f"{req.method} {req.path}"})
        ctype = (req.header("content-type") or "").split(";")[0].strip().lower()
        form = parse_qs(req.body.decode("utf-8", "replace")) if ctype == "application/x-www-form-urlencoded" else {}
        grant = (form.get("grant_type") or [None])[0]
        assertion = (form.get("assertion") or [None])[0]
        if grant != JWT_BEARER:
            problem = ("unsupported_grant_type", f"Invalid grant_type: {grant or ''}")
        elif not assertion:
            problem = ("invalid_request", "Missing required parameter: assertion")
        else:
            problem = self.check_assertion(assertion)
        if problem:
            with self._lock:
                self.rejections.append(problem[1])
            return h.send_json(400, {"error": problem[0], "error_description": problem[1]})

        def produce(reply: Reply):
            with self._lock:
                expires_in = self.expires_in
                t = IssuedToken(f"ya29.mock-{_hex(32)}", expires_in, time.time() + expires_in)
                self.issued.append(t)
                self._by_token[t.token] = t
            h.send_json(200, {"access_token": t.token, "expires_in": expires_in, "token_type": "Bearer"},
                        {"Cache-Control": "no-cache, no-store, max-age=0, must-revalidate", **reply.headers})

        self._serve(h, req, produce)


# --------------------------------------------------------------------------- Google APIs (Vertex, Gemini)

_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                  409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                  501: "NOT_IMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_GOOGLE_CODE = {v: k for k, v in _GOOGLE_STATUS.items()}


def _google_error(code: int, message: str, status: str | None = None) -> dict:
    return {"error": {"code": code, "message": message, "status": status or _GOOGLE_STATUS.get(code, "UNKNOWN")}}


# Field shapes of the request messages (proto3 JSON: names in lowerCamelCase or snake_case).
# A type is "str", "num", "int", "bool", "any" (any JSON), "struct" (any object), a dict (a
# message: field -> type) or a one-element list (repeated).
_PART = {"text": "str", "inlineData": {"mimeType": "str", "data": "str", "displayName": "str"},
         "fileData": {"mimeType": "str", "fileUri": "str", "displayName": "str"},
         "functionCall": {"id": "str", "name": "str", "args": "struct", "partialArgs": "any",
                          "willContinue": "bool"},
         "functionResponse": {"id": "str", "name": "str", "response": "struct", "parts": "any",
                              "willContinue": "bool", "scheduling": "str"},
         "executableCode": "struct", "codeExecutionResult": "struct", "thought": "bool",
         "thoughtSignature": "str", "videoMetadata": "struct", "partMetadata": "struct",
         "mediaResolution": "any"}
_PART_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
              "codeExecutionResult")
_CONTENT = {"role": "str", "parts": [_PART]}
_GEN_CONFIG = {"temperature": "num", "topP": "num", "topK": "num", "candidateCount": "int",
               "maxOutputTokens": "int", "stopSequences": ["str"], "presencePenalty": "num",
               "frequencyPenalty": "num", "seed": "int", "responseMimeType": "str", "responseSchema": "struct",
               "responseJsonSchema": "any", "responseLogprobs": "bool", "logprobs": "int",
               "responseModalities": ["str"], "thinkingConfig": {"includeThoughts": "bool", "thinkingBudget": "int",
                                                                  "thinkingLevel": "str"},
               "mediaResolution": "str", "speechConfig": "struct", "audioTimestamp": "bool",
               "routingConfig": "struct", "enableAffectiveDialog": "bool", "imageConfig": "struct",
               "enableEnhancedCivicAnswers": "bool", "modelConfig": "struct"}
_FUNCTION_DECL = {"name": "str", "description": "str", "parameters": "struct", "parametersJsonSchema": "any",
                  "response": "struct", "responseJsonSchema": "any", "behavior": "str"}
_TOOL = {"functionDeclarations": [_FUNCTION_DECL], "googleSearch": "struct", "googleSearchRetrieval": "struct",
         "codeExecution": "struct", "retrieval": "struct", "urlContext": "struct", "enterpriseWebSearch": "struct",
         "googleMaps": "struct", "computerUse": "struct", "fileSearch": "struct"}
_TOOL_CONFIG = {"functionCallingConfig": {"mode": "str", "allowedFunctionNames": ["str"]},
                "retrievalConfig": "struct"}
_GENERATE_REQUEST = {"model": "str", "contents": [_CONTENT], "systemInstruction": _CONTENT, "tools": [_TOOL],
                     "toolConfig": _TOOL_CONFIG, "generationConfig": _GEN_CONFIG,
                     "safetySettings": [{"category": "str", "threshold": "str", "method": "str"}],
                     "cachedContent": "str", "labels": "struct", "modelArmorConfig": "struct"}
_PROTO_TYPE = {"str": "TYPE_STRING", "num": "TYPE_FLOAT", "int": "TYPE_INT32", "bool": "TYPE_BOOL"}
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
_CALLING_MODES = {"MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _shape_error(value: Any, spec: Any, path: str) -> str | None:
    """Google's message for a value that does not fit the proto field shape ``spec``."""
    where = f" at '{path}'" if path else ""
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"Invalid value{where} ({_PROTO_TYPE.get(spec[0], 'TYPE_MESSAGE')}), {json.dumps(value)}" \
                if not isinstance(value, dict) else \
                f"Invalid JSON payload received. Expected a list{where}, got an object."
        for i, v in enumerate(value):
            err = _shape_error(v, spec[0], f"{path}[{i}]")
            if err:
                return err
        return None
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"Invalid value{where} (TYPE_MESSAGE), {json.dumps(value)}"
        for key, v in value.items():
            sub = spec.get(_camel(key))
            if sub is None:
                return f"Invalid JSON payload received. Unknown name {json.dumps(key)}{where}: Cannot find field."
            err = _shape_error(v, sub, f"{path}.{_snake(_camel(key))}" if path else _snake(_camel(key)))
            if err:
                return err
        return None
    ok = {"str": lambda v: isinstance(v, str),
          "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "int": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and v.isdigit()),
          "bool": lambda v: isinstance(v, bool),
          "struct": lambda v: isinstance(v, dict),
          "any": lambda v: True}[spec](value)
    return None if ok else f"Invalid value{where} ({_PROTO_TYPE.get(spec, 'TYPE_MESSAGE')}), {json.dumps(value)}"


def _get(d: dict, name: str, default: Any = None) -> Any:
    """A field of a proto3 JSON object, by its lowerCamelCase or snake_case name."""
    if name in d:
        return d[name]
    return d.get(_snake(name), default)


def thought_signature(call: dict) -> str:
    """The signature Gemini gives the first function call of a thinking step (the mock's is a keyed
    hash of the call, so a signature sent back is checked, as Gemini checks its own)."""
    text = json.dumps([call.get("name"), call.get("args")], sort_keys=True)
    return base64.b64encode(hashlib.sha256(b"gemini-mock-thought\0" + text.encode()).digest()[:24]).decode()


def thought_signature_problem(body: dict, model: str) -> str | None:
    """Gemini 3's rule for function calling: in the current turn (the model turns after the last
    user text), each model turn's first function call carries the signature it was given; any
    signature sent must be one the mock gave."""
    contents = _get(body, "contents") or []
    last_text = max((i for i, c in enumerate(contents) if c.get("role") == "user"
                     and any("text" in p for p in c.get("parts") or [])), default=-1)
    for i, c in enumerate(contents):
        calls = [p for p in c.get("parts") or [] if _get(p, "functionCall") is not None]
        for p in calls:
            sig = _get(p, "thoughtSignature")
            if sig is not None and sig != thought_signature(_get(p, "functionCall")):
                return f"Corrupted thought signature at contents[{i}]."
        if model.startswith("gemini-3") and i > last_text and calls and _get(calls[0], "thoughtSignature") is None:
            return (f"Function call is missing a thought_signature in functionCall parts. This is required for tools "
                    f"to work correctly, and missing thought_signature may lead to degraded model performance. "
                    f"Additional data, function call `default_api:{_get(calls[0], 'functionCall').get('name')}` , "
                    f"position {i + 1}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
                    f"for more details.")
    return None


def validate_generate_content(body: Any) -> str | None:
    """Google's message for an invalid ``GenerateContentRequest``, else None."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received. Expected an object."
    err = _shape_error(body, _GENERATE_REQUEST, "")
    if err:
        return err
    contents = _get(body, "contents")
    if not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    for i, c in enumerate(contents):
        role = c.get("role")
        if role not in ("user", "model") and not (role in (None, "") and len(contents) == 1):
            return "Please use a valid role: user, model."
        parts = c.get("parts")
        if not parts:
            return f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.\n"
        for j, p in enumerate(parts):
            where = f"GenerateContentRequest.contents[{i}].parts[{j}]"
            data = [k for k in p if _camel(k) in _PART_DATA]
            if len(data) > 1:
                return f"Invalid JSON payload received. Oneof field 'data' is already set. Cannot set '{data[1]}'"
            if not data:
                return f"* {where}.data: required oneof field 'data' must have one initialized field\n"
            for kind in ("functionCall", "functionResponse"):
                fn = _get(p, kind)
                if fn is not None and not fn.get("name"):
                    return f"* {where}.{_snake(kind)}.name: Name cannot be empty.\n"
    system = _get(body, "systemInstruction")
    if system is not None:
        if not system.get("parts"):
            return "* GenerateContentRequest.system_instruction.parts: contents.parts must not be empty.\n"
        if any(not p.get("text") and _get(p, "inlineData") is None and _get(p, "fileData") is None
               for p in system["parts"]):
            return "* GenerateContentRequest.system_instruction.parts: only text parts are supported.\n"
    names = []
    for i, tool in enumerate(_get(body, "tools") or []):
        for j, fd in enumerate(_get(tool, "functionDeclarations") or []):
            name = fd.get("name") or ""
            if not _FUNCTION_NAME.fullmatch(name):
                return (f"* GenerateContentRequest.tools[{i}].function_declarations[{j}].name: Invalid function "
                        "name. Must start with a letter or an underscore. Must be alphameric (a-z, A-Z, 0-9), "
                        "underscores (_), dots (.), colons (:), or dashes (-), with a maximum length of 64.\n")
            if _get(fd, "parameters") is not None and _get(fd, "parametersJsonSchema") is not None:
                return (f"* GenerateContentRequest.tools[{i}].function_declarations[{j}]: parameters and "
                        "parameters_json_schema are mutually exclusive.\n")
            names.append(name)
    fcc = _get(_get(body, "toolConfig") or {}, "functionCallingConfig")
    if fcc is not None:
        mode = fcc.get("mode", "MODE_UNSPECIFIED")
        if mode not in _CALLING_MODES:
            return (f"Invalid value at 'tool_config.function_calling_config.mode' (type.googleapis.com/"
                    f"google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), {json.dumps(mode)}")
        allowed = _get(fcc, "allowedFunctionNames")
        if allowed:
            if mode != "ANY":
                return ("* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names: "
                        "allowed_function_names may only be set when mode is ANY.\n")
            unknown = [n for n in allowed if n not in names]
            if unknown:
                return ("* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names: "
                        f"function {unknown[0]} is not declared.\n")
    gc = _get(body, "generationConfig") or {}
    temp = gc.get("temperature")
    if temp is not None and not 0 <= temp <= 2:
        return ("* GenerateContentRequest.generation_config.temperature: temperature must be in the range "
                "[0.0, 2.0].\n")
    top_p = _get(gc, "topP")
    if top_p is not None and not 0 <= top_p <= 1:
        return "* GenerateContentRequest.generation_config.top_p: top_p must be in the range [0.0, 1.0].\n"
    mot = _get(gc, "maxOutputTokens")
    if mot is not None and int(mot) < 1:
        return ("* GenerateContentRequest.generation_config.max_output_tokens: max_output_tokens must be "
                "positive.\n")
    stops = _get(gc, "stopSequences")
    if stops is not None and len(stops) > 5:
        return ("* GenerateContentRequest.generation_config.stop_sequences: stop_sequences must not have more "
                "than 5 elements.\n")
    cc = _get(gc, "candidateCount")
    if cc is not None and not 1 <= int(cc) <= 8:
        return "* GenerateContentRequest.generation_config.candidate_count: must be in the range [1, 8].\n"
    return None


class VertexMock(MockProvider):
    """Vertex AI (Gemini and Anthropic models) and the Gemini API on one server.

    Vertex (``Authorization: Bearer`` = a token ``token_mock`` issued and still valid, or one of
    ``tokens``; else 401 UNAUTHENTICATED):

    * ``POST /v1/projects/{p}/locations/{r}/publishers/google/models/{m}:generateContent`` and
      ``:streamGenerateContent`` (``?alt=sse``: SSE ``data: {...}\\r\\n\\r\\n`` events; without it
      a streamed JSON array, as Google does);
    * ``.../publishers/anthropic/models/{m}:rawPredict`` and ``:streamRawPredict``: Anthropic's
      Messages body with ``anthropic_version: "vertex-2023-10-16"`` and no ``model`` (else 400
      ``invalid_request_error``), answered by ``AnthropicMock.answer`` (a stream when the body
      says ``"stream": true``); ``.../models/count-tokens:rawPredict``: Anthropic's count_tokens
      body with its ``model`` and ``anthropic_version``, answered ``{"input_tokens": <the
      scripted reply's input tokens>}``.

    Gemini API (key in ``x-goog-api-key`` or ``?key=``, one of ``api_keys``):
    ``POST /v1beta/models/{m}:generateContent`` / ``:streamGenerateContent?alt=sse`` (also ``/v1``).

    ``project``: if set, a Vertex path naming another project gets 403 PERMISSION_DENIED.
    ``script(model=...)`` matches the model of the path. Errors are Google's
    ``{"error": {"code", "message", "status"}}``; ``VertexMock.error(429, "...")`` scripts one.
    Credentials (``tokens``, ``api_keys``) stay across ``reset()``."""

    name = "vertex"
    default_text = "Hello from the Vertex mock."
    _vertex_path = re.compile(r"/(?P<version>v1|v1beta1)/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)"
                              r"/publishers/(?P<publisher>[^/]+)/models/(?P<model>[^/:]+):(?P<method>\w+)")
    _gemini_path = re.compile(r"/(?P<version>v1|v1beta)/models/(?P<model>[^/:]+):(?P<method>\w+)")
    _methods = {"google": ("generateContent", "streamGenerateContent", "countTokens"),
                "anthropic": ("rawPredict", "streamRawPredict")}

    def __init__(self, token_mock: GoogleTokenMock | None = None, *, tokens=(), api_keys=(),
                 project: str | None = None, **kw: Any):
        super().__init__(**kw)
        self.token_mock = token_mock
        self.tokens: set[str] = set(tokens)
        self.api_keys: set[str] = set(api_keys)
        self.project = project
        self.base_url = self.origin

    @staticmethod
    def error(status: int, message: str, status_text: str | None = None, **reply_fields: Any) -> Reply:
        """A scripted Google-shaped error answer."""
        return Reply(status=status, body=_google_error(status, message, status_text), **reply_fields)

    def error_body(self, status, message=None, type_=None):
        return _google_error(status, message or f"Mock error with status {status}", type_)

    def allow_token(self, token: str):
        """Accept ``token`` as a Vertex bearer token (a client's own access token)."""
        self.tokens.add(token)

    def allow_key(self, key: str):
        """Accept ``key`` as a Gemini API key."""
        self.api_keys.add(key)

    def vertex_url(self, model: str, method: str = "generateContent", *, project: str = "mock-project",
                   region: str = "us-central1", publisher: str = "google") -> str:
        return (f"{self.origin}/v1/projects/{project}/locations/{region}/publishers/{publisher}"
                f"/models/{model}:{method}")

    def gemini_url(self, model: str, method: str = "generateContent") -> str:
        return f"{self.origin}/v1beta/models/{model}:{method}"

    def _route(self, req: RecordedRequest):
        path = unquote(req.path)
        m = self._vertex_path.fullmatch(path)
        if m:
            return "vertex", m
        m = self._gemini_path.fullmatch(path)
        return ("gemini", m) if m else (None, None)

    def request_model(self, req):
        _, m = self._route(req)
        return m["model"] if m else None

    def _err(self, h, code: int, message: str, status: str | None = None, headers: dict | None = None):
        h.send_json(code, _google_error(code, message, status), headers)

    def handle(self, h, req):
        api, m = self._route(req)
        if api is None or req.method != "POST":
            return self._err(h, 404, f"The requested URL {req.path} was not found on this server.")
        if api == "vertex":
            auth = req.header("authorization") or ""
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not token:
                return self._err(h, 401, "Request is missing required authentication credential. Expected OAuth 2 "
                                         "access token, login cookie or other valid authentication credential. See "
                                         "https://developers.google.com/identity/sign-in/web/devconsole-project.",
                                 headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'})
            if token not in self.tokens and not (self.token_mock is not None and self.token_mock.valid(token)):
                return self._err(h, 401, "Request had invalid authentication credentials. Expected OAuth 2 access "
                                         "token, login cookie or other valid authentication credential. See "
                                         "https://developers.google.com/identity/sign-in/web/devconsole-project.",
                                 headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", '
                                                              'error="invalid_token"'})
            if self.project is not None and m["project"] != self.project:
                return self._err(h, 403, f"Permission 'aiplatform.endpoints.predict' denied on resource "
                                         f"'//aiplatform.googleapis.com/projects/{m['project']}/locations/"
                                         f"{m['region']}/publishers/{m['publisher']}/models/{m['model']}' "
                                         "(or it may not exist).")
            publisher = m["publisher"]
        else:
            key = req.header("x-goog-api-key") or req.qs("key")
            if not key:
                return self._err(h, 403, "Method doesn't allow unregistered callers (callers without established "
                                         "identity). Please use API Key or other form of API consumer identity to "
                                         "call this API.")
            if key not in self.api_keys:
                return self._err(h, 400, "API key not valid. Please pass a valid API key.")
            publisher = "google"
        if m["method"] not in self._methods.get(publisher, ()):
            return self._err(h, 404, f"Publisher Model `projects/{m.groupdict().get('project', '-')}/locations/"
                                     f"{m.groupdict().get('region', '-')}/publishers/{publisher}/models/"
                                     f"{m['model']}` not found or method {m['method']} is not supported.")
        if req.json is None:
            return self._err(h, 400, "Invalid JSON payload received. Unexpected token.")
        if publisher == "anthropic":
            return self._raw_predict(h, req, m)
        if m["method"] == "countTokens":
            return self._count_tokens(h, req, m, api)
        problem = validate_generate_content(req.json) or thought_signature_problem(req.json, m["model"])
        if problem:
            return self._err(h, 400, problem)
        stream = m["method"] == "streamGenerateContent"
        sse = stream and req.qs("alt") == "sse"
        self._serve(h, req, lambda reply: self._generate(h, reply, m["model"], api, stream, sse))

    # ---- countTokens
    def _count_tokens(self, h, req, m, api: str):
        """``countTokens``: the Gemini API takes the request to count as ``generateContentRequest``
        (with its ``models/...`` name) or bare ``contents``; Vertex takes the request's fields at
        the top level. The count is the scripted reply's input tokens."""
        body = req.json
        if api == "gemini":
            if not isinstance(body, dict) or set(body) - {"contents", "generateContentRequest"}:
                return self._err(h, 400, "Invalid JSON payload received. Unknown name in CountTokensRequest.")
            inner = body.get("generateContentRequest")
            if inner is not None:
                if not isinstance(inner, dict) or inner.get("model") != f"models/{m['model']}":
                    return self._err(h, 400, "generateContentRequest.model must name the model counted, "
                                             f"models/{m['model']}")
                body = {k: v for k, v in inner.items() if k != "model"}
        problem = validate_generate_content(body)
        if problem:
            return self._err(h, 400, problem)
        self._serve(h, req, lambda reply: h.send_json(200, {"totalTokens": reply.usage[0]}))

    # ---- Anthropic on Vertex
    def _raw_predict(self, h, req, m):
        body = req.json
        # Token counts go to the model `count-tokens`, with the counted model in the body.
        counting = m["model"] == "count-tokens"
        problem = None
        if not isinstance(body, dict):
            problem = "Request body must be a JSON object"
        elif "model" in body and not counting:
            problem = "model: Extra inputs are not permitted"
        elif body.get("anthropic_version") != "vertex-2023-10-16":
            problem = ("anthropic_version: Field required" if "anthropic_version" not in body
                       else "anthropic_version: Input should be 'vertex-2023-10-16'")
        else:
            inner = {k: v for k, v in body.items() if k != "anthropic_version"}
            problem = (AnthropicMock.validate(inner, counting=True) if counting
                       else AnthropicMock.validate({**inner, "model": m["model"]}))
        if problem:
            return h.send_json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": problem}})
        if counting:  # the count is the scripted reply's input tokens
            return self._serve(h, req, lambda reply: h.send_json(200, {"input_tokens": reply.usage[0]}))
        # Anthropic's answers, produced by the Anthropic mock's code on this server
        self._serve(h, req, lambda reply: AnthropicMock.answer(self, h, reply, m["model"], bool(body.get("stream"))))

    # ---- Gemini answers
    def _generate(self, h, reply: Reply, model: str, api: str, stream: bool, sse: bool):
        finish = reply.stop_reason or "STOP"
        p, c = reply.usage
        meta = {"modelVersion": model, "responseId": _hex(22)}
        if api == "vertex":
            meta["createTime"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        usage = {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c,
                 "promptTokensDetails": [{"modality": "TEXT", "tokenCount": p}]}
        calls = []
        for tc in reply.tool_calls:
            fc = {"name": tc.name, "args": tc.arguments}
            if tc.id:
                fc["id"] = tc.id
            calls.append({"functionCall": fc})
        if calls and reply.thinking is not None:
            # A thinking model signs the step's first function call.
            calls[0]["thoughtSignature"] = thought_signature(calls[0]["functionCall"])
        thought = [{"text": reply.thinking, "thought": True}] if reply.thinking is not None else []

        def chunk(parts: list[dict], last: bool) -> dict:
            cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if last:
                cand["finishReason"] = finish
            return {"candidates": [cand],
                    "usageMetadata": usage if last else {"promptTokenCount": p, "totalTokenCount": p}, **meta}

        if not stream:
            text = reply.resolved_text(self.default_text)
            parts = thought + ([{"text": text}] if text else []) + calls
            body = chunk(parts or [{"text": ""}], True)
            return h.send_json(200, body, reply.headers)
        pieces = [[{"text": t}] for t in reply.pieces(self.default_text)]
        if thought:
            pieces.insert(0, thought)
        if calls:
            pieces.append(calls)
        if not pieces:
            pieces = [[{"text": ""}]]
        objs = [chunk(parts, i == len(pieces) - 1) for i, parts in enumerate(pieces)]
        exc = getattr(reply, "exception", None)
        if sse:
            events = [b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\r\n\r\n" for o in objs]
            fault = None
            if exc:
                code = _GOOGLE_CODE.get(exc[0], 500)
                fault = b"data: " + json.dumps(_google_error(code, exc[1], exc[0])).encode() + b"\r\n\r\n"
            ctype = "text/event-stream"
        else:  # a JSON array, sent element by element
            events = [(b"[" if i == 0 else b",\r\n") + json.dumps(o).encode() for i, o in enumerate(objs)]
            events[-1] += b"]"
            fault = None
            if exc:
                code = _GOOGLE_CODE.get(exc[0], 500)
                fault = b",\r\n" + json.dumps(_google_error(code, exc[1], exc[0])).encode() + b"]"
            ctype = "application/json; charset=UTF-8"
        _stream_events(self, h, reply, events, first=1, content_end=len(events), content_type=ctype, fault=fault)


# --------------------------------------------------------------------------- Bedrock

_CORAL = "http://internal.amazon.com/coral/com.amazon.bedrock/"
_AUTH_CORAL = "http://internal.amazon.com/coral/com.amazon.coral.service/"
_BEDROCK_ERRORS = {400: "ValidationException", 403: "AccessDeniedException", 404: "ResourceNotFoundException",
                   408: "ModelTimeoutException", 424: "ModelErrorException", 429: "ThrottlingException",
                   500: "InternalServerException", 503: "ServiceUnavailableException"}
SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature you provided. Check your "
                      "AWS Secret Access Key and signing method. Consult the service documentation for details.")


def event_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One ``application/vnd.amazon.eventstream`` message: prelude (total length, headers
    length, CRC32 of both), headers (all type 7, strings), payload, CRC32 of all before."""
    hb = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        hb += struct.pack(">B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v
    prelude = struct.pack(">II", 12 + len(hb) + len(payload) + 4, len(hb))
    msg = prelude + struct.pack(">I", zlib.crc32(prelude)) + hb + payload
    return msg + struct.pack(">I", zlib.crc32(msg))


def _padding() -> str:
    """The ``p`` field AWS pads event payloads with (random length, so sizes leak nothing)."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=random.randint(1, 30)))


def _event(event_type: str, payload: dict) -> bytes:
    return event_frame({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                       json.dumps({**payload, "p": _padding()}, separators=(",", ":")).encode())


def _exception_frame(exception_type: str, message: str) -> bytes:
    return event_frame({":exception-type": exception_type, ":content-type": "application/json",
                        ":message-type": "exception"}, json.dumps({"message": message}).encode())


class _Verifier(SigV4Auth):
    """botocore's SigV4 computation over the headers a request names in ``SignedHeaders``
    (all of them, as AWS takes them, not botocore's client-side selection)."""

    def __init__(self, credentials, service, region, signed: HTTPHeaders):
        super().__init__(credentials, service, region)
        self._signed = signed

    def headers_to_sign(self, request):
        return self._signed


class _Problem(Exception):
    def __init__(self, status: int, error_type: str, message: str, coral: str = _CORAL):
        super().__init__(message)
        self.status, self.error_type, self.message, self.coral = status, error_type, message, coral


_CONVERSE_FIELDS = {"messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
                    "additionalModelRequestFields", "promptVariables", "additionalModelResponseFieldPaths",
                    "requestMetadata", "performanceConfig", "serviceTier"}
_CONTENT_BLOCKS = {"text", "image", "document", "video", "toolUse", "toolResult", "guardContent", "cachePoint",
                   "reasoningContent", "citationsContent", "searchResult", "audio"}
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _null(path: str) -> _Problem:
    return _Problem(400, "ValidationException",
                    f"1 validation error detected: Value null at '{path}' failed to satisfy constraint: "
                    "Member must not be null")


def validate_converse(body: Any) -> None:
    """Raise ``_Problem`` (a ValidationException) for a Converse body Bedrock would refuse."""
    v = lambda msg: _Problem(400, "ValidationException", msg)  # noqa: E731
    if not isinstance(body, dict):
        raise _Problem(400, "SerializationException", "Start of structure or map found where not expected.")
    for k in body:
        if k not in _CONVERSE_FIELDS:
            raise v(f"1 validation error detected: Value at '{k}' failed to satisfy constraint: unknown field")
    msgs = body.get("messages")
    if msgs is None:
        raise _null("messages")
    if not isinstance(msgs, list):
        raise _Problem(400, "SerializationException", "Unexpected value type in payload")
    if not msgs:
        raise v("A conversation must start with a user message. Try again with a conversation that starts with a "
                "user message.")
    uses_tools = False
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _Problem(400, "SerializationException", "Unexpected value type in payload")
        role = m.get("role")
        if role is None:
            raise _null(f"messages.{i + 1}.member.role")
        if role not in ("user", "assistant"):
            raise v(f"1 validation error detected: Value '{role}' at 'messages.{i + 1}.member.role' failed to "
                    "satisfy constraint: Member must satisfy enum value set: [user, assistant]")
        if i == 0 and role != "user":
            raise v("A conversation must start with a user message. Try again with a conversation that starts "
                    "with a user message.")
        if i and msgs[i - 1].get("role") == role:
            raise v("A conversation must alternate between user and assistant roles. Make sure the conversation "
                    "alternates between user and assistant roles and try again.")
        content = m.get("content")
        if content is None:
            raise _null(f"messages.{i + 1}.member.content")
        if not isinstance(content, list) or not content:
            raise v(f"The content field in the Message object at messages.{i} is empty. Add a ContentBlock object "
                    "to the content field and try again.")
        for j, block in enumerate(content):
            where = f"messages.{i}.content.{j}"
            keys = list(block) if isinstance(block, dict) else []
            if len(keys) != 1 or keys[0] not in _CONTENT_BLOCKS:
                raise v(f"The ContentBlock object at {where} must set exactly one of the members "
                        f"{sorted(_CONTENT_BLOCKS)}.")
            kind, val = keys[0], block[keys[0]]
            if kind == "text" and (not isinstance(val, str) or not val.strip()):
                raise v(f"The text field in the ContentBlock object at {where} is blank. Add text to the text "
                        "field, and try again.")
            if kind == "image":
                if not isinstance(val, dict) or val.get("format") not in ("png", "jpeg", "gif", "webp"):
                    raise v(f"1 validation error detected: Value at '{where}.member.image.format' failed to "
                            "satisfy constraint: Member must satisfy enum value set: [png, jpeg, gif, webp]")
                src = val.get("source")
                if not isinstance(src, dict) or len(src) != 1 or not (src.get("bytes") or src.get("s3Location")):
                    raise v(f"The image source at {where} must set exactly one of bytes or s3Location.")
                if "bytes" in src:
                    try:
                        base64.b64decode(src["bytes"], validate=True)
                    except (ValueError, TypeError):
                        raise _Problem(400, "SerializationException", "Invalid Base64 in image bytes") from None
            if kind == "toolUse":
                uses_tools = True
                if role != "assistant":
                    raise v(f"The toolUse block at {where} is only allowed in an assistant message.")
                if not (isinstance(val, dict) and val.get("toolUseId") and val.get("name")
                        and "input" in val):
                    raise v(f"The toolUse block at {where} needs toolUseId, name and input.")
            if kind == "toolResult":
                uses_tools = True
                if role != "user":
                    raise v(f"The toolResult block at {where} is only allowed in a user message.")
                if not isinstance(val, dict) or not val.get("toolUseId"):
                    raise _null(f"{where}.member.toolResult.toolUseId")
                rc = val.get("content")
                if not isinstance(rc, list) or not all(
                        isinstance(b, dict) and len(b) == 1
                        and next(iter(b)) in ("text", "json", "image", "document", "video", "searchResult")
                        for b in rc):
                    raise v(f"The toolResult content at {where} must be a list of text, json, image, document or "
                            "video blocks.")
                if val.get("status") not in (None, "success", "error"):
                    raise v(f"1 validation error detected: Value '{val.get('status')}' at '{where}.member."
                            "toolResult.status' failed to satisfy constraint: Member must satisfy enum value set: "
                            "[success, error]")
        if role == "assistant" and i + 1 < len(msgs):
            ids = [b["toolUse"]["toolUseId"] for b in content if "toolUse" in b]
            answered = {b["toolResult"].get("toolUseId") for b in msgs[i + 1].get("content") or []
                        if isinstance(b, dict) and isinstance(b.get("toolResult"), dict)}
            missing = [x for x in ids if x not in answered]
            if missing:
                raise v(f"Expected toolResult blocks at messages.{i + 1}.content for the following Ids: "
                        + ", ".join(missing))
    system = body.get("system")
    if system is not None:
        if not isinstance(system, list) or not all(
                isinstance(b, dict) and len(b) == 1 and next(iter(b)) in ("text", "guardContent", "cachePoint")
                for b in system):
            raise v("The system field must be a list of SystemContentBlock objects (text, guardContent or "
                    "cachePoint).")
        for k, b in enumerate(system):
            if "text" in b and (not isinstance(b["text"], str) or not b["text"].strip()):
                raise v(f"The text field in the SystemContentBlock object at system.{k} is blank. Add text to the "
                        "text field, and try again.")
    ic = body.get("inferenceConfig")
    if ic is not None:
        if not isinstance(ic, dict) or set(ic) - {"maxTokens", "temperature", "topP", "stopSequences"}:
            raise v("inferenceConfig accepts only maxTokens, temperature, topP and stopSequences.")
        mt = ic.get("maxTokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise v(f"1 validation error detected: Value '{mt}' at 'inferenceConfig.maxTokens' failed to satisfy "
                    "constraint: Member must have value greater than or equal to 1")
        for name in ("temperature", "topP"):
            x = ic.get(name)
            if x is not None and (not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 <= x <= 1):
                bound = "less than or equal to 1" if isinstance(x, (int, float)) and x > 1 else \
                    "greater than or equal to 0"
                raise v(f"1 validation error detected: Value '{x}' at 'inferenceConfig.{name}' failed to satisfy "
                        f"constraint: Member must have value {bound}")
        stops = ic.get("stopSequences")
        if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)):
            raise v("1 validation error detected: Value at 'inferenceConfig.stopSequences' failed to satisfy "
                    "constraint: Member must be a list of non-empty strings")
    tc = body.get("toolConfig")
    if tc is not None:
        tools = tc.get("tools") if isinstance(tc, dict) else None
        if tools is None:
            raise _null("toolConfig.tools")
        if not isinstance(tools, list) or not tools:
            raise v("1 validation error detected: Value '[]' at 'toolConfig.tools' failed to satisfy constraint: "
                    "Member must have length greater than or equal to 1")
        names = []
        for k, t in enumerate(tools):
            if not isinstance(t, dict) or len(t) != 1 or next(iter(t)) not in ("toolSpec", "cachePoint",
                                                                                "systemTool"):
                raise v(f"The Tool object at toolConfig.tools.{k} must set exactly one of toolSpec or cachePoint.")
            spec = t.get("toolSpec")
            if spec is None:
                continue
            name = spec.get("name") if isinstance(spec, dict) else None
            if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
                raise v(f"1 validation error detected: Value '{name}' at 'toolConfig.tools.{k + 1}.member.toolSpec."
                        "name' failed to satisfy constraint: Member must satisfy regular expression pattern: "
                        "[a-zA-Z0-9_-]+")
            schema = spec.get("inputSchema")
            if not isinstance(schema, dict) or set(schema) != {"json"} or not isinstance(schema["json"], dict):
                raise _null(f"toolConfig.tools.{k + 1}.member.toolSpec.inputSchema")
            names.append(name)
        choice = tc.get("toolChoice")
        if choice is not None:
            if not isinstance(choice, dict) or len(choice) != 1 or next(iter(choice)) not in ("auto", "any", "tool"):
                raise v("The toolChoice must set exactly one of auto, any or tool.")
            if "tool" in choice and choice["tool"].get("name") not in names:
                raise v("The tool named in toolChoice.tool.name is not in toolConfig.tools.")
    elif uses_tools:
        raise v("The toolConfig field must be defined when using toolUse and toolResult content blocks.")


BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"


def validate_invoke(body: Any, model: str) -> None:
    """Raise ``_Problem`` (a ValidationException) for an ``InvokeModel`` body Claude on Bedrock
    refuses (``CountTokens`` checks its body the same way): Bedrock's own fields first
    (``anthropic_version`` required, ``anthropic_beta`` a list, no ``model`` or ``stream``), then
    Anthropic's rules for the rest."""
    malformed = lambda what: _Problem(400, "ValidationException",  # noqa: E731
                                      f"Malformed input request: #: {what}, please reformat your input and try "
                                      "again.")
    if not isinstance(body, dict):
        raise malformed(f"expected type: JSONObject, found: {type(body).__name__}")
    for key in ("model", "stream"):
        if key in body:
            raise malformed(f"extraneous key [{key}] is not permitted")
    if "anthropic_version" not in body:
        raise malformed("required key [anthropic_version] not found")
    if body["anthropic_version"] != BEDROCK_ANTHROPIC_VERSION:
        raise _Problem(400, "ValidationException", "Invalid API version")
    betas = body.get("anthropic_beta", [])
    if not isinstance(betas, list) or not all(isinstance(b, str) and b for b in betas):
        raise malformed("anthropic_beta: expected type: JSONArray of strings")
    rest = {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}
    problem = AnthropicMock.validate({**rest, "model": model})
    if problem:
        raise _Problem(400, "ValidationException", problem)


def _invoke_chunk(sse_event: bytes) -> bytes:
    """One Anthropic SSE event (as ``AnthropicMock.answer`` writes them) as the ``chunk`` frame
    Bedrock sends: ``{"bytes": <base64 of the event's JSON>}``; ``message_stop`` carries Bedrock's
    invocation metrics as Bedrock adds them."""
    data = next(line[6:] for line in sse_event.decode().split("\n") if line.startswith("data: "))
    event = json.loads(data)
    if event.get("type") == "message_stop":
        event["amazon-bedrock-invocationMetrics"] = {"inputTokenCount": 0, "outputTokenCount": 0,
                                                     "invocationLatency": random.randint(100, 900),
                                                     "firstByteLatency": random.randint(50, 99)}
    encoded = base64.b64encode(json.dumps(event, separators=(",", ":")).encode()).decode()
    return _event("chunk", {"bytes": encoded})


class _InvokeAnswers:
    """The Bedrock mock as ``AnthropicMock.answer`` sees it: the same answers (JSON as it is), a
    stream's events re-framed as ``InvokeModelWithResponseStream`` chunks, with the
    ``CloudReply`` faults (an ``exception`` frame, ``write_size``)."""

    def __init__(self, mock: "BedrockMock"):
        self.mock = mock
        self.default_text = mock.default_text

    def _stream(self, h, reply: Reply, events: list[bytes], first: int, **_: Any):
        exc = getattr(reply, "exception", None)
        _stream_events(self.mock, h, reply, [_invoke_chunk(e) for e in events], first=first, content_end=None,
                       content_type="application/vnd.amazon.eventstream",
                       fault=_exception_frame(*exc) if exc else None,
                       headers={"x-amzn-RequestId": str(uuid.uuid4()),
                                "X-Amzn-Bedrock-Content-Type": "application/json", **reply.headers})


class BedrockMock(MockProvider):
    """Bedrock Runtime's Converse API: ``POST /model/{modelId}/converse`` and
    ``/model/{modelId}/converse-stream``; for Anthropic's models, ``/invoke`` and
    ``/invoke-with-response-stream`` (Anthropic's Messages body with ``anthropic_version:
    "bedrock-2023-05-31"``, the betas in ``anthropic_beta``, no ``model`` or ``stream``: see
    ``validate_invoke``), answered by ``AnthropicMock.answer`` (a stream as ``chunk`` frames whose
    ``bytes`` are Anthropic's events, base64), and ``/count-tokens`` (``{"input": {"invokeModel":
    {"body": <base64 of an InvokeModel body>}}}``, answered ``{"inputTokens": <the scripted reply's
    input tokens>}``).

    ``credentials``: ``{access_key: secret}`` or ``{access_key: (secret, session_token)}``.
    A request signed with SigV4 (``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=
    ..., Signature=...``) is verified as AWS does: the canonical request is rebuilt by botocore
    from the request as received (method, raw path, which botocore encodes once more, the
    query, the headers named in SignedHeaders with their received values, the body's SHA-256)
    and the signature recomputed for the key pair with the scope's date, region and service
    ``bedrock``. Refusals: 403 ``MissingAuthenticationTokenException``,
    ``IncompleteSignatureException``, ``UnrecognizedClientException`` (unknown key, wrong or
    missing session token), ``InvalidSignatureException`` (mismatch, ``x-amz-date`` more than 5
    minutes off, wrong region/service), with ``x-amzn-ErrorType``. ``region``: the region the
    scope must name (None: any). ``api_keys``: Bedrock API keys accepted as ``Authorization:
    Bearer``.

    Bodies are validated like Converse (400 ``ValidationException``). Answers: the Converse
    response; streams of event-stream frames (``messageStart``, ``contentBlockStart`` for tool
    use, ``contentBlockDelta``, ``contentBlockStop``, ``messageStop``, ``metadata``), payloads
    padded with a random ``p`` like AWS. ``CloudReply(exception=("throttlingException", "..."))``
    ends a stream with an exception frame; ``write_size=1`` writes it a byte at a time.
    ``script(model=...)`` matches the decoded model id of the path. ``signatures`` records the
    outcome of each verification (``"ok"``, or the error type)."""

    name = "bedrock"
    default_text = "Hello from the Bedrock mock."
    _path = re.compile(r"/model/(?P<model>[^/]+)/(?P<op>converse|converse-stream|invoke|invoke-with-response-stream"
                       r"|count-tokens)")
    max_clock_skew = 300

    def __init__(self, credentials: dict | None = None, *, region: str | None = "us-east-1", api_keys=(),
                 **kw: Any):
        super().__init__(**kw)
        self.credentials: dict[str, tuple[str, str | None]] = {}
        for access, secret in (credentials or {}).items():
            self.add_key(access, *(secret if isinstance(secret, tuple) else (secret,)))
        self.region = region
        self.api_keys: set[str] = set(api_keys)
        self.base_url = self.origin
        self.signatures: list[str] = []

    def add_key(self, access_key: str, secret_key: str, session_token: str | None = None):
        """Register an access key pair (and the session token requests must carry with it)."""
        self.credentials[access_key] = (secret_key, session_token)

    @staticmethod
    def error(status: int, error_type: str, message: str, **reply_fields: Any) -> Reply:
        """A scripted Bedrock error answer (``{"message"}`` and ``x-amzn-ErrorType``)."""
        headers = {"x-amzn-ErrorType": f"{error_type}:{_CORAL}", **reply_fields.pop("headers", {})}
        return Reply(status=status, body={"message": message}, headers=headers, **reply_fields)

    def error_body(self, status, message=None, type_=None):
        return {"message": message or f"Mock error with status {status}"}

    def error_headers(self, status):
        return {"x-amzn-ErrorType": f"{_BEDROCK_ERRORS.get(status, 'InternalServerException')}:{_CORAL}",
                "x-amzn-RequestId": str(uuid.uuid4())}

    def request_model(self, req):
        m = self._path.fullmatch(req.path)
        return unquote(m["model"]) if m else None

    def reset(self):
        super().reset()
        with self._lock:
            self.signatures.clear()

    def _send_problem(self, h, p: _Problem):
        h.send_json(p.status, {"message": p.message},
                    {"x-amzn-ErrorType": f"{p.error_type}:{p.coral}", "x-amzn-RequestId": str(uuid.uuid4())})

    # ---- SigV4
    def verify(self, req: RecordedRequest) -> None:
        """Raise ``_Problem`` unless ``req`` carries a valid signature (or API key)."""
        auth = req.header("authorization")
        if not auth:
            raise _Problem(403, "MissingAuthenticationTokenException", "Missing Authentication Token", _AUTH_CORAL)
        if auth.startswith("Bearer "):
            if auth[7:].strip() in self.api_keys:
                return
            raise _Problem(403, "UnrecognizedClientException", "Invalid API Key format: Must start with pre-"
                                                               "defined prefix", _AUTH_CORAL)
        incomplete = lambda msg: _Problem(403, "IncompleteSignatureException", msg, _AUTH_CORAL)  # noqa: E731
        algo, _, rest = auth.partition(" ")
        if algo != "AWS4-HMAC-SHA256":
            raise incomplete(f"Authorization header requires 'Credential' parameter. Authorization header requires "
                             f"'Signature' parameter. Authorization={auth}")
        fields = {}
        for item in rest.split(","):
            k, _, val = item.strip().partition("=")
            fields[k] = val
        missing = [k for k in ("Credential", "SignedHeaders", "Signature") if not fields.get(k)]
        if missing:
            raise incomplete(" ".join(f"Authorization header requires '{k}' parameter." for k in missing)
                             + f" Authorization={auth}")
        scope = fields["Credential"].split("/")
        if len(scope) != 5 or scope[4] != "aws4_request":
            raise incomplete(f"Credential should be scoped to a valid region. {fields['Credential']}")
        access, date, region, service, _ = scope
        signed_names = fields["SignedHeaders"].split(";")
        if "host" not in signed_names:
            raise incomplete("'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.")
        amz_date = req.header("x-amz-date")
        if not amz_date:
            raise incomplete("Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header. "
                             f"Authorization={auth}")
        if access not in self.credentials:
            raise _Problem(403, "UnrecognizedClientException", "The security token included in the request is "
                                                                "invalid.", _AUTH_CORAL)
        secret, token = self.credentials[access]
        if req.header("x-amz-security-token") != token:
            raise _Problem(403, "UnrecognizedClientException", "The security token included in the request is "
                                                                "invalid.", _AUTH_CORAL)
        if token is not None and "x-amz-security-token" not in signed_names:
            raise _Problem(403, "InvalidSignatureException", SIGNATURE_MISMATCH, _AUTH_CORAL)
        if service != "bedrock":
            raise _Problem(403, "InvalidSignatureException", "Credential should be scoped to correct service: "
                                                             "'bedrock'. ", _AUTH_CORAL)
        if self.region is not None and region != self.region:
            raise _Problem(403, "InvalidSignatureException", "Credential should be scoped to a valid region. ",
                           _AUTH_CORAL)
        try:
            when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            raise incomplete(f"Date must be in ISO-8601 'basic format'. Got '{amz_date}'.") from None
        if date != amz_date[:8]:
            raise _Problem(403, "InvalidSignatureException", f"Date in Credential scope does not match YYYYMMDD "
                                                             f"from ISO-8601 version of date from HTTP: '{date}' != "
                                                             f"'{amz_date[:8]}', from '{amz_date}'.", _AUTH_CORAL)
        now = time.time()
        if abs(now - when) > self.max_clock_skew:
            fmt = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y%m%dT%H%M%SZ")  # noqa: E731
            msg = (f"Signature expired: {amz_date} is now earlier than {fmt(now - self.max_clock_skew)} "
                   f"({fmt(now)} - 5 min.)" if when < now else
                   f"Signature not yet current: {amz_date} is still later than {fmt(now + self.max_clock_skew)} "
                   f"({fmt(now)} + 5 min.)")
            raise _Problem(403, "InvalidSignatureException", msg, _AUTH_CORAL)
        expected, creq, sts = self.signature_for(req, signed_names, secret, access, token, region, amz_date)
        if expected != fields["Signature"]:
            raise _Problem(403, "InvalidSignatureException",
                           f"{SIGNATURE_MISMATCH}\n\nThe Canonical String for this request should have been\n'{creq}'"
                           f"\n\nThe String-to-Sign should have been\n'{sts}'\n", _AUTH_CORAL)

    @staticmethod
    def signature_for(req: RecordedRequest, signed_names: list[str], secret: str, access: str = "",
                      token: str | None = None, region: str = "us-east-1",
                      amz_date: str | None = None) -> tuple[str, str, str]:
        """(signature, canonical request, string to sign) botocore computes for the request as
        received, signing the headers ``signed_names`` with their received values."""
        signed = HTTPHeaders()
        received = [(k.lower(), v) for k, v in req.header_list]
        for name in signed_names:
            for k, v in received:
                if k == name:
                    signed[name] = v
        # the raw path as received; botocore's canonical_request quotes it once more, as AWS does
        areq = AWSRequest(method=req.method, url=f"http://{req.header('host')}{req.path}", data=req.body,
                          params=parse_qsl(req.raw_query, keep_blank_values=True))
        areq.context["timestamp"] = amz_date or req.header("x-amz-date")
        signer = _Verifier(Credentials(access, secret, token), "bedrock", region, signed)
        creq = signer.canonical_request(areq)
        sts = signer.string_to_sign(areq, creq)
        return signer.signature(sts, areq), creq, sts

    # ---- the API
    def handle(self, h, req):
        m = self._path.fullmatch(req.path)
        if not m or req.method != "POST":
            return self._send_problem(h, _Problem(404, "UnknownOperationException", "Unknown operation",
                                                  _AUTH_CORAL))
        try:
            self.verify(req)
        except _Problem as p:
            with self._lock:
                self.signatures.append(p.error_type)
            return self._send_problem(h, p)
        with self._lock:
            self.signatures.append("ok")
        op, model = m["op"], unquote(m["model"])
        try:
            if req.json is None:
                raise _Problem(400, "SerializationException", "Unexpected end of JSON input")
            if op.startswith("converse"):
                validate_converse(req.json)
            elif op == "count-tokens":
                validate_invoke(self._counted_body(req.json), model)
            else:
                validate_invoke(req.json, model)
        except _Problem as p:
            return self._send_problem(h, p)
        if op == "count-tokens":
            return self._serve(h, req, lambda reply: h.send_json(200, {"inputTokens": reply.usage[0]}))
        if op.startswith("invoke"):
            stream = op == "invoke-with-response-stream"
            return self._serve(h, req, lambda reply: AnthropicMock.answer(_InvokeAnswers(self), h, reply, model, stream))
        stream = op == "converse-stream"
        self._serve(h, req, lambda reply: self._converse(h, reply, stream))

    @staticmethod
    def _counted_body(body: Any) -> Any:
        """The ``InvokeModel`` body of a ``CountTokens`` request: a blob, base64 in AWS's JSON."""
        given = body.get("input") if isinstance(body, dict) else None
        invoke = given.get("invokeModel") if isinstance(given, dict) else None
        if not isinstance(invoke, dict) or not isinstance(invoke.get("body"), str):
            raise _null("input.invokeModel.body")
        try:
            return json.loads(base64.b64decode(invoke["body"], validate=True))
        except (ValueError, TypeError):
            raise _Problem(400, "SerializationException", "Invalid Base64 in input.invokeModel.body") from None

    def _converse(self, h, reply: Reply, stream: bool):
        text = reply.resolved_text(self.default_text)
        stop = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
        p, c = reply.usage
        usage = {"inputTokens": p, "outputTokens": c, "totalTokens": p + c}
        metrics = {"latencyMs": random.randint(100, 900)}
        tools = [(tc.id or f"tooluse_{_hex(22)}", tc) for tc in reply.tool_calls]
        signature = "EqMBCkgIARABGAIiQL" + _hex(16)
        headers = {"x-amzn-RequestId": str(uuid.uuid4()), **reply.headers}
        if not stream:
            content: list[dict] = []
            if reply.thinking is not None:
                content.append({"reasoningContent": {"reasoningText": {"text": reply.thinking,
                                                                       "signature": signature}}})
            if text:
                content.append({"text": text})
            for tid, tc in tools:
                content.append({"toolUse": {"toolUseId": tid, "name": tc.name, "input": tc.arguments}})
            return h.send_json(200, {"output": {"message": {"role": "assistant", "content": content}},
                                     "stopReason": stop, "usage": usage, "metrics": metrics}, headers)
        events = [_event("messageStart", {"role": "assistant"})]
        first = None
        index = 0

        def block(start: dict | None, deltas: list[dict]):
            nonlocal index, first
            if start is not None:
                events.append(_event("contentBlockStart", {"contentBlockIndex": index, "start": start}))
            for d in deltas:
                events.append(_event("contentBlockDelta", {"contentBlockIndex": index, "delta": d}))
                if first is None:
                    first = len(events)
            events.append(_event("contentBlockStop", {"contentBlockIndex": index}))
            index += 1

        if reply.thinking is not None:
            block(None, [{"reasoningContent": {"text": t}} for t in _split(reply.thinking, 3)]
                  + [{"reasoningContent": {"signature": signature}}])
        pieces = reply.pieces(self.default_text)
        if pieces:
            block(None, [{"text": t} for t in pieces])
        for tid, tc in tools:
            block({"toolUse": {"toolUseId": tid, "name": tc.name}},
                  [{"toolUse": {"input": t}} for t in _split(json.dumps(tc.arguments), 3)])
        content_end = len(events)
        events.append(_event("messageStop", {"stopReason": stop}))
        events.append(_event("metadata", {"usage": usage, "metrics": metrics}))
        exc = getattr(reply, "exception", None)
        fault = _exception_frame(*exc) if exc else None
        _stream_events(self, h, reply, events, first=first or len(events), content_end=content_end,
                       content_type="application/vnd.amazon.eventstream", fault=fault, headers=headers)
