"""The MCP server the official conformance suite (npm `@modelcontextprotocol/conformance`) tests:
the tools, prompts and resources its server scenarios name, written with the official Python SDK
(MCPServer, both protocol eras on one path) and run under uvicorn on a free loopback port in a
thread of the test process (tests/e2e/test_mcp_conformance.py).

    with ConformanceServer() as server:
        server.url   # http://127.0.0.1:<port>/mcp
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Annotated

from mcp import MCPError, types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from pydantic import BaseModel, Field

from support import McpUpstream

# A 1x1 PNG and a tiny WAV: the scenarios check the type and MIME type of the content, not its pixels.
IMAGE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO_WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
# Between a tool's log messages and progress notifications: each reaches the client on its own.
STEP_S = 0.05


class UserAnswer(BaseModel):
    response: str = Field(description="The user's answer")


class DefaultsForm(BaseModel):
    """SEP-1034: every primitive type with a default."""

    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: str = Field(default="active", description="User status",
                        json_schema_extra={"enum": ["active", "inactive", "pending"]})
    verified: bool = Field(default=True, description="Verification status")


class EnumsForm(BaseModel):
    """SEP-1330: the enum shapes (plain, titled, multi-select plain and titled, legacy enumNames)."""

    untitledSingle: str = Field(description="Simple enum", json_schema_extra={"enum": ["active", "inactive", "pending"]})
    titledSingle: str = Field(description="Titled enum", json_schema_extra={"oneOf": [
        {"const": "low", "title": "Low Priority"}, {"const": "medium", "title": "Medium Priority"},
        {"const": "high", "title": "High Priority"}]})
    untitledMulti: list[str] = Field(description="Multi-select",
                                     json_schema_extra={"items": {"type": "string", "enum": ["read", "write", "execute"]}})
    titledMulti: list[str] = Field(description="Titled multi-select", json_schema_extra={"items": {"anyOf": [
        {"const": "feature", "title": "New Feature"}, {"const": "bug", "title": "Bug Fix"},
        {"const": "docs", "title": "Documentation"}]}})
    legacyEnum: str = Field(description="Legacy enum", json_schema_extra={
        "enum": ["small", "medium", "large"], "enumNames": ["Small Size", "Medium Size", "Large Size"]})


def answers(ctx: Context) -> dict:
    return dict(ctx.input_responses or {})


def ask_user(message: str, field: str, kind: str = "string") -> types.ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def ask_model(text: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
    return types.CreateMessageRequest(params=types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens))


def build_server() -> MCPServer:
    server = MCPServer("mcp-conformance-test-server")

    @server.tool()
    def test_simple_text() -> str:
        """Answers a simple text."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> list[types.ImageContent]:
        """Answers an image."""
        return [types.ImageContent(type="image", data=IMAGE_PNG, mime_type="image/png")]

    @server.tool()
    def test_audio_content() -> list[types.AudioContent]:
        """Answers audio."""
        return [types.AudioContent(type="audio", data=AUDIO_WAV, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        """Answers an embedded resource."""
        return [types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."))]

    @server.tool()
    def test_multiple_content_types() -> list[types.TextContent | types.ImageContent | types.EmbeddedResource]:
        """Answers text, an image and an embedded resource."""
        return [
            types.TextContent(type="text", text="Multiple content types test:"),
            types.ImageContent(type="image", data=IMAGE_PNG, mime_type="image/png"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json", text='{"test": "data", "value": 123}')),
        ]

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Sends three log messages while it runs."""
        for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.info(message)
            await asyncio.sleep(STEP_S)
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress 0, 50 and 100 of 100."""
        for step in (0, 50, 100):
            await ctx.report_progress(progress=step, total=100, message=f"Completed step {step} of 100")
            await asyncio.sleep(STEP_S)
        meta = ctx.request_context.meta
        return str(meta.progress_token if meta and meta.progress_token is not None else 0)

    @server.tool()
    def test_error_handling() -> str:
        """Always fails (a result with isError)."""
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client's model (sampling)."""
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=100, related_request_id=ctx.request_id)  # on the call's own stream, not the GET stream
        text = result.content.text if result.content.type == "text" else "No response"
        return f"LLM response: {text}"

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user (elicitation)."""
        result = await ctx.elicit(message=message, schema=UserAnswer)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"User response: action={result.action}, content={content}"

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Asks the user with a default for every primitive type (SEP-1034)."""
        result = await ctx.elicit(message="Please provide user information", schema=DefaultsForm)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation result: action={result.action}, content={content}"

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Asks the user with each enum shape (SEP-1330)."""
        result = await ctx.elicit(message="Please select values using different enum schema types", schema=EnumsForm)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    # 2026-07-28's input-required results (SEP-2322): the tool answers what it still needs, the
    # client retries with the answers (and the state, which the SDK seals and checks).
    @server.tool()
    def test_input_required_result_elicitation(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the user's name, then greets them."""
        answer = answers(ctx).get("user_name")
        if not isinstance(answer, types.ElicitResult):
            return types.InputRequiredResult(input_requests={"user_name": ask_user("What is your name?", "name")})
        return f"Hello, {(answer.content or {}).get('name', '')}!"

    @server.tool()
    def test_input_required_result_sampling(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the client's model a question, then answers with its reply."""
        answer = answers(ctx).get("capital_question")
        if not isinstance(answer, types.CreateMessageResult):
            return types.InputRequiredResult(
                input_requests={"capital_question": ask_model("What is the capital of France?", 100)})
        return f"The model said: {answer.content.text if answer.content.type == 'text' else ''}"

    @server.tool()
    def test_input_required_result_list_roots(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the client's roots, then names them."""
        answer = answers(ctx).get("client_roots")
        if not isinstance(answer, types.ListRootsResult):
            return types.InputRequiredResult(input_requests={"client_roots": types.ListRootsRequest()})
        return "Roots: " + ", ".join(str(root.uri) for root in answer.roots)

    @server.tool()
    def test_input_required_result_request_state(ctx: Context) -> str | types.InputRequiredResult:
        """Asks a confirmation with a state, then checks the state came back."""
        if ctx.request_state != "confirm-asked" or "confirm" not in answers(ctx):
            return types.InputRequiredResult(input_requests={"confirm": ask_user("Please confirm", "ok", "boolean")},
                                             request_state="confirm-asked")
        return "state-ok: confirmed"

    @server.tool()
    def test_input_required_result_multiple_inputs(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the user, the model and the roots at once."""
        wanted = {"user_name": ask_user("What is your name?", "name"), "greeting": ask_model("Generate a greeting", 50),
                  "client_roots": types.ListRootsRequest()}
        if ctx.request_state != "all-asked" or not wanted.keys() <= answers(ctx).keys():
            return types.InputRequiredResult(input_requests=wanted, request_state="all-asked")
        return "All inputs received"

    @server.tool()
    def test_input_required_result_multi_round(ctx: Context) -> str | types.InputRequiredResult:
        """Asks a name, then a colour, each round with its own state."""
        got = answers(ctx)
        if ctx.request_state == "round-2" and "step2" in got:
            return "Both steps complete"
        if ctx.request_state == "round-1" and "step1" in got:
            return types.InputRequiredResult(
                input_requests={"step2": ask_user("Step 2: What is your favorite color?", "color")}, request_state="round-2")
        return types.InputRequiredResult(input_requests={"step1": ask_user("Step 1: What is your name?", "name")},
                                         request_state="round-1")

    @server.tool()
    def test_input_required_result_tampered_state(ctx: Context) -> str | types.InputRequiredResult:
        """Asks with a state the SDK seals: a state changed on the way is refused."""
        if ctx.request_state != "tamper-proof" or "confirm" not in answers(ctx):
            return types.InputRequiredResult(input_requests={"confirm": ask_user("Please confirm", "ok", "boolean")},
                                             request_state="tamper-proof")
        return "state intact"

    @server.tool()
    def test_input_required_result_capabilities(ctx: Context) -> str | types.InputRequiredResult:
        """Asks only what the client declared it can answer."""
        capabilities = ctx.client_capabilities or types.ClientCapabilities()
        wanted: dict = {}
        if capabilities.elicitation is not None:
            wanted["user_name"] = ask_user("What is your name?", "name")
        if capabilities.sampling is not None:
            wanted["greeting"] = ask_model("Generate a greeting", 50)
        if not wanted or wanted.keys() <= answers(ctx).keys():
            return "Nothing more to ask"
        return types.InputRequiredResult(input_requests=wanted)

    @server.tool()
    def test_missing_capability(ctx: Context) -> str:
        """Needs sampling: refused (-32021) when the client did not declare it."""
        capabilities = ctx.client_capabilities or types.ClientCapabilities()
        if capabilities.sampling is None:
            raise MCPError(code=types.MISSING_REQUIRED_CLIENT_CAPABILITY, message="this tool needs sampling",
                           data={"requiredCapabilities": {"sampling": {}}})
        return "sampling declared"

    @server.prompt()
    def test_input_required_result_prompt(ctx: Context) -> list[UserMessage] | types.InputRequiredResult:
        """A prompt that asks the user for its context first."""
        answer = answers(ctx).get("user_context")
        if not isinstance(answer, types.ElicitResult):
            return types.InputRequiredResult(
                input_requests={"user_context": ask_user("What context should the prompt use?", "context")})
        context = (answer.content or {}).get("context", "")
        return [UserMessage(role="user", content=types.TextContent(type="text", text=f"Context: {context}"))]

    @server.tool()
    def test_custom_headers(
        region: Annotated[str, Field(description="Mirrored in the Mcp-Param-Region header",
                                     json_schema_extra={"x-mcp-header": "Region"})],
    ) -> str:
        """An argument the client also sends as a header (SEP-2243), which the SDK checks against the body."""
        return f"region {region}"

    @server.resource("test://static-text")
    def static_text() -> str:
        """A fixed text."""
        return "This is the content of the static text resource."

    @server.resource("test://static-binary")
    def static_binary() -> bytes:
        """A fixed image."""
        return base64.b64decode(IMAGE_PNG)

    @server.resource("test://template/{id}/data")
    def template_data(id: str) -> str:  # noqa: A002 (the template's own parameter name)
        """Data for an id."""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource("test://watched-resource")
    def watched() -> str:
        """A resource a client may subscribe to."""
        return "Watched resource content"

    @server.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments."""
        return [UserMessage(role="user", content=types.TextContent(type="text", text="This is a simple prompt for testing."))]

    @server.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with two arguments."""
        return [UserMessage(role="user", content=types.TextContent(
            type="text", text=f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]

    @server.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:  # noqa: N803 (the scenario's name)
        """A prompt holding an embedded resource."""
        return [
            UserMessage(role="user", content=types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."))),
            UserMessage(role="user", content=types.TextContent(type="text", text="Please process the embedded resource above.")),
        ]

    @server.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt holding an image."""
        return [
            UserMessage(role="user", content=types.ImageContent(type="image", data=IMAGE_PNG, mime_type="image/png")),
            UserMessage(role="user", content=types.TextContent(type="text", text="Please analyze the image above.")),
        ]

    @server.completion()
    async def complete(ref, argument, context) -> types.Completion:
        return types.Completion(values=[], total=0, has_more=False)

    async def acknowledge(ctx, params) -> types.EmptyResult:
        return types.EmptyResult()

    lowlevel = server._lowlevel_server  # noqa: SLF001 (MCPServer has no decorator for these three)
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, acknowledge)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, acknowledge)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, acknowledge)
    return server


class ConformanceServer(McpUpstream):
    """The conformance server under uvicorn on a free loopback port, in a thread."""

    def __init__(self):
        super().__init__(build_server())


if __name__ == "__main__":
    with ConformanceServer() as running:
        print(running.url, flush=True)
        running.thread.join()
