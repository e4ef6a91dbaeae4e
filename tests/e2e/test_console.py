"""The console (issue 47) through the gateway's listener: its paths reach the control plane past
the filter, a gateway key signs in to a session kept in a cookie, and the pages show what went
through the gateway, in a real headless Chromium (Debian's, driven by Playwright), and in Firefox
(Debian's ESR, driven by puppeteer-core over WebDriver BiDi). Each browser
test saves a screenshot under the run's output (``<pytest's base temp>/console-screenshots``).

The browser tests share a gateway that records bodies (``console_gw``), so a request's page shows
them, and one Chromium."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest
from helpers import CHAT, KEY, chat_body, custom_host, workspace_key
from mocks import Reply
from support import McpUpstream, eventually, logged, new_workspace_key, put_price

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer

try:
    from playwright.sync_api import expect
except ImportError:  # the page tests need it; the others do not
    expect = None

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# What a page waits for what it shows, at most (ms).
SHOWN_WITHIN_MS = 15_000


def test_a_key_signs_in_through_the_gateway_and_the_overview_counts_its_requests(gateway, openai_mock):
    model = f"m-console-{uuid.uuid4().hex[:8]}"
    trace_id = f"console-{uuid.uuid4().hex[:12]}"
    headers = {**custom_host(openai_mock), "x-gateway-trace-id": trace_id}
    r = gateway.request("POST", CHAT, headers=headers, json=chat_body("count me", model=model))
    assert r.status_code == 200, r.text
    logged(gateway, trace_id)

    # A cookie jar as a browser keeps one: the key signs in once, the cookie does the rest.
    with httpx.Client(base_url=gateway.origin, timeout=10.0) as browser:
        assert browser.get("/console/api/overview").status_code == 401
        r = browser.post("/console/session", json={"key": "gw-wrong"})
        assert r.status_code == 401 and r.json()["error"]["message"]
        r = browser.post("/console/session", json={"key": KEY})
        assert r.status_code == 200, r.text
        assert {"httponly", "samesite=strict", "path=/console"} <= \
            {part.strip().lower() for part in r.headers["set-cookie"].split(";")}
        assert r.headers["content-security-policy"].startswith("default-src 'self'")

        def counted():
            overview = browser.get("/console/api/overview", params={"range": "hour"})
            assert overview.status_code == 200, overview.text
            rows = [row for row in overview.json()["breakdown"]["model"] if row["value"] == model]
            assert [(row["requests"], row["errors"]) for row in rows] == [(1, 0)], rows
            return overview.json()
        overview = eventually(counted)
        assert any(row["value"] == "openai" for row in overview["breakdown"]["provider"])


# --------------------------------------------------------------------------- in a real browser

@pytest.fixture(scope="module")
def mcp_upstream():
    """An MCP server (the official SDK's) with one tool, behind the console's gateway as `tools`."""
    server = MCPServer("console-e2e")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    with McpUpstream(server) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def console_gw(start_gateway, mcp_upstream):
    env = {"GATEWAY_RECORDS": json.dumps({"bodies": True, "max_body_bytes": 4096}),
           "GATEWAY_MCP_SERVERS": json.dumps({"tools": {"url": mcp_upstream.url}})}
    with start_gateway("console", None, env) as gw:
        yield gw


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright
    expect.set_options(timeout=SHOWN_WITHIN_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory):
    """Where the browser tests' screenshots go."""
    shots = tmp_path_factory.getbasetemp() / "console-screenshots"
    shots.mkdir(exist_ok=True)
    return shots


@pytest.fixture
def page(chromium, screenshots, request):
    """A new browser page (its own cookies) that fails the test on any script error or dialog,
    and saves a screenshot of where it ended."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    # (A 401 is how the page learns it is signed out, a 400 how it learns a field is wrong: Chromium
    # logs each as a failed load.)
    answered = ("status of 400", "status of 401")
    page.on("console", lambda message: message.type == "error" and not any(a in message.text for a in answered)
            and problems.append(f"console: {message.text}"))
    page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    page.set_default_timeout(SHOWN_WITHIN_MS)
    yield page
    page.screenshot(path=str(screenshots / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not problems, problems


def sign_in(page, gw, key: str) -> None:
    page.goto(f"{gw.origin}/console")
    page.get_by_label("Gateway key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def open_page(page, link: str, heading: str) -> None:
    """Follow a link of the console's navigation and wait for the page it opens: until its
    heading shows, the page before (whose labels may match the next step's) is still there."""
    page.get_by_role("link", name=link).click()
    page.get_by_role("heading", name=heading, exact=True, level=1).wait_for()


def send_chat(gw, mock, model: str, prompt: str) -> str:
    trace_id = f"console-{uuid.uuid4().hex[:12]}"
    headers = {**custom_host(mock), "x-gateway-trace-id": trace_id}
    r = gw.request("POST", CHAT, headers=headers, json=chat_body(prompt, model=model))
    assert r.status_code == 200, r.text
    logged(gw, trace_id)
    return trace_id


def test_the_overview_and_the_request_table_show_traffic_and_a_request_opens_by_its_trace_id(
        console_gw, openai_mock, page, screenshots):
    """Sign in (a wrong key cannot), see the traffic on the overview and in the table, each
    updating while it flows, open one request: its fields and bodies are shown as text, so a
    prompt holding `<script>` never runs."""
    model = f"m-page-{uuid.uuid4().hex[:8]}"
    hostile = "<script>window.__injected = 1</script><img src=x onerror=window.__injected=2>"
    trace_id = send_chat(console_gw, openai_mock, model, f"Summarise this page: {hostile}")
    send_chat(console_gw, openai_mock, model, "A second one.")

    sign_in(page, console_gw, "gw-not-a-key")
    expect(page.get_by_role("alert")).to_contain_text("unknown API key")
    page.get_by_label("Gateway key").fill(KEY)
    page.get_by_role("button", name="Sign in").click()

    # The overview: its tiles, and the model's row in the breakdown.
    page.get_by_role("heading", name="Overview").wait_for()
    model_row = page.locator("[data-breakdown=model] tr", has_text=model)
    expect(model_row.locator("td").nth(1)).to_have_text("2")
    expect(page.locator("[data-tile=Requests] .value")).not_to_have_text("0")
    expect(page.locator(".chart canvas")).to_have_count(4)
    page.screenshot(path=str(screenshots / "overview.png"), full_page=True)
    # Live: a request sent now shows without a reload.
    send_chat(console_gw, openai_mock, model, "A third one, while the page is open.")
    expect(model_row.locator("td").nth(1)).to_have_text("3")

    # The table, filtered by the model, and one request's page.
    open_page(page, "Requests", "Requests")
    page.get_by_label("Model", exact=True).fill(model)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#requests tbody tr.row-link")).to_have_count(3)
    send_chat(console_gw, openai_mock, model, "A fourth one, while the table is open.")
    expect(page.locator("#requests tbody tr.row-link")).to_have_count(4)
    page.locator("#requests tbody tr.row-link", has_text=trace_id).click()
    page.get_by_role("heading", name=f"Request {trace_id}").wait_for()
    expect(page.locator("pre[data-body=request_body]")).to_contain_text(hostile)
    assert page.evaluate("window.__injected") is None, "nothing of the prompt ran"
    expect(page.locator("main script, main img")).to_have_count(0)
    expect(page.locator("dl.record")).to_contain_text(model)
    expect(page.locator("dl.record")).to_contain_text("openai")


def test_messages_responses_and_mcp_traffic_show_by_api_on_the_overview_and_in_the_table(
        console_gw, openai_mock, page):
    """A Messages request (translated to chat), a Responses request and an MCP tool call through
    the gateway: each is counted under its API on the overview, and the table filters by it."""
    model = f"m-apis-{uuid.uuid4().hex[:8]}"
    traces = {api: f"console-{api}-{uuid.uuid4().hex[:8]}" for api in ("messages", "responses", "mcp")}
    upstream = custom_host(openai_mock)
    r = console_gw.request("POST", "/v1/messages", headers={**upstream, "x-gateway-trace-id": traces["messages"]},
                           json={"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    openai_mock.script(text="Hello from Responses.", path="/v1/responses")
    r = console_gw.request("POST", "/v1/responses", headers={**upstream, "x-gateway-trace-id": traces["responses"]},
                           json={"model": model, "input": "Hi"})
    assert r.status_code == 200 and r.json()["object"] == "response", r.text


    async def call_a_tool():  # with the MCP SDK's client, on the aggregate endpoint
        http = httpx.AsyncClient(headers={"authorization": f"Bearer {KEY}", "x-gateway-trace-id": traces["mcp"]},
                                 timeout=httpx.Timeout(30.0))
        async with Client(streamable_http_client(f"{console_gw.origin}/mcp", http_client=http)) as client:
            result = await client.call_tool("tools__add", {"a": 2, "b": 3})
            assert not result.is_error and "5" in str(result.content)

    # In a thread of its own: Playwright's page runs an event loop in this one.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, call_a_tool()).result()
    logged(console_gw, traces["messages"])
    logged(console_gw, traces["responses"])

    def tool_call_logged():  # the MCP session's records: discovery, the list, the call
        records = console_gw.get("/v1/logs", params={"trace_id": traces["mcp"]}).json()["data"]
        assert [r for r in records if r.get("mcp_method") == "tools/call"], records
    eventually(tool_call_logged)

    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    for api in traces:
        expect(page.locator("[data-breakdown=api] tr", has_text=api).locator("td").nth(1)).not_to_have_text("0")
    open_page(page, "Requests", "Requests")
    for api, trace_id in traces.items():
        page.get_by_label("API").select_option(api)
        page.get_by_role("button", name="Apply").click()
        # (The MCP client's session is several requests under its trace id.)
        expect(page.locator("#requests tbody tr.row-link", has_text=trace_id).first).to_be_visible()
        expect(page.locator("#requests tbody tr.row-link").first).to_contain_text(api)


def test_a_managed_batch_shows_its_progress_to_its_workspace_only(console_gw, openai_mock, page):
    """A managed batch of three lines (one failing) run through the gateway: the batches page
    shows it finished with every line done; another workspace's session lists no such batch."""
    file_id = f"file-console-{uuid.uuid4().hex[:8]}"
    lines = [{"custom_id": c, "method": "POST", "url": CHAT, "body": chat_body("Say hello.", model=model)}
             for c, model in [("a", "gpt-mock"), ("b", "gpt-console-fail"), ("c", "gpt-mock")]]
    openai_mock.put_file(file_id, "".join(json.dumps(line) + "\n" for line in lines))
    openai_mock.script(model="gpt-console-fail", status=400, times=None)
    r = console_gw.post("/v1/batches", {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "immediate"},
                        headers=custom_host(openai_mock))
    assert r.status_code == 200, r.text
    batch_id = r.json()["id"]

    def finished():
        batch = console_gw.get(f"/v1/batches/{batch_id}", headers=custom_host(openai_mock)).json()
        assert batch["status"] == "completed", batch
    eventually(finished, 20)

    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    open_page(page, "Batches", "Batches")
    card = page.locator(f"[data-batch={batch_id}]")
    expect(card.locator("h2")).to_have_text(f"{batch_id} · completed")
    expect(card).to_contain_text("2 completed, 1 failed")
    expect(card.locator("meter")).to_have_attribute("data-full", "true")
    expect(card.locator(".meter-text")).to_have_text("3 / 3")

    # Another workspace's session lists its own batches: not this one.
    other = httpx.Client(base_url=console_gw.origin)
    assert other.post("/console/session", json={"key": workspace_key(console_gw)}).status_code == 200
    listed = other.get("/console/api/batches")
    assert listed.status_code == 200 and listed.json()["data"] == [], listed.text
    assert other.get("/console/api/batches", params={"workspace": "default"}).status_code == 403


FIREFOX_SCRIPT = Path(__file__).resolve().parents[2] / "console" / "test" / "firefox.mjs"


def test_the_console_works_in_firefox_at_a_laptops_and_a_phones_width(console_gw, openai_mock, screenshots):
    """Debian's Firefox ESR, driven over WebDriver BiDi (console/test/firefox.mjs): signing in,
    the overview drawn with a model's requests counted, the table filtered by it, and one
    request's page with a prompt's markup shown as text, never run; each page fits the width."""
    model = f"m-firefox-{uuid.uuid4().hex[:8]}"
    hostile = "<script>window.__injected = 1</script><img src=x onerror=window.__injected=2>"
    trace_id = send_chat(console_gw, openai_mock, model, f"Summarise this page: {hostile}")
    send_chat(console_gw, openai_mock, model, "A second one.")
    run = subprocess.run(["node", str(FIREFOX_SCRIPT), console_gw.origin, KEY, trace_id, model, hostile,
                          str(screenshots)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"{run.stderr}\n{run.stdout}"
    assert (screenshots / "firefox-request-390.png").exists()


def test_a_workspace_key_sees_only_its_workspace_and_signs_out(console_gw, openai_mock, page):
    model = f"m-other-{uuid.uuid4().hex[:8]}"
    send_chat(console_gw, openai_mock, model, "Someone else's request.")
    key = workspace_key(console_gw)

    sign_in(page, console_gw, key)
    page.get_by_role("heading", name="Overview").wait_for()
    expect(page.locator("[data-tile=Requests] .value")).to_have_text("0")
    expect(page.locator("[data-breakdown=model]")).to_contain_text("Nothing yet.")
    expect(page.locator("[data-breakdown=model]")).not_to_contain_text(model)
    open_page(page, "Requests", "Requests")
    # The table's own empty row, once its records are read.
    expect(page.locator("#requests tbody")).to_have_text("Nothing yet.")

    expect(page.get_by_label("Workspace")).to_have_count(0)  # an admin's filter only

    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign in").wait_for()
    # The session ended at the control plane too: reloading shows the sign-in form.
    page.reload()
    page.get_by_role("heading", name="Sign in").wait_for()


def test_a_key_made_on_the_keys_page_fills_its_limit_and_once_revoked_is_refused(console_gw, openai_mock, page, screenshots):
    """Create a key (shown once), give it a limit (a bad value's error shows next to its field),
    spend it (the 429s), see its bar full, revoke it, see its requests refused."""
    workspace = f"team-{uuid.uuid4().hex[:8]}"
    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    open_page(page, "Keys", "Keys")
    page.get_by_label("Workspace").fill(workspace)
    page.get_by_label("Name (optional)").fill("<b>ci</b> pipeline")
    page.get_by_role("button", name="Create key").click()
    key = page.locator("#new-key").inner_text()
    assert key.startswith("gw-"), key
    key_id = page.locator("#created-key p").inner_text().split()[1]
    expect(page.locator("#keys tbody tr", has_text=key_id)).to_contain_text(workspace)
    # Its name, as text.
    expect(page.locator("#keys tbody tr", has_text=key_id).locator("td").first).to_have_text("<b>ci</b> pipeline")
    expect(page.locator("#keys")).not_to_contain_text(key)

    limit_id = f"console-{uuid.uuid4().hex[:8]}"
    open_page(page, "Limits", "Limits and budgets")
    page.get_by_label("Limit id").fill(limit_id)
    page.get_by_label("Key id").fill(key_id)
    page.get_by_label("Requests per minute").fill("0")
    page.get_by_role("button", name="Save limit").click()
    expect(page.locator(".field-error[data-param=requests_per_minute]")).not_to_be_empty()
    page.get_by_label("Requests per minute").fill("2")
    page.get_by_role("button", name="Save limit").click()
    limit = page.locator(f"[data-limit={limit_id}]")
    expect(limit.locator("meter")).to_have_attribute("data-full", "false")

    model = f"m-limit-{uuid.uuid4().hex[:8]}"
    statuses = [console_gw.request("POST", CHAT, key=key, headers=custom_host(openai_mock),
                                   json=chat_body("spend it", model=model)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    expect(limit.locator("meter")).to_have_attribute("data-full", "true")
    expect(limit.locator(".meter-text")).to_have_text("2 / 2")
    page.screenshot(path=str(screenshots / "limits.png"), full_page=True)

    # The admin reads that workspace's log by naming it: its two requests and the refused one.
    open_page(page, "Requests", "Requests")
    page.get_by_label("Workspace").fill(workspace)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#requests tbody tr.row-link")).to_have_count(3)
    expect(page.locator("#requests tbody tr.row-link").first).to_contain_text("429")

    open_page(page, "Keys", "Keys")
    page.get_by_role("button", name=f"Revoke key {key_id}").click()
    expect(page.locator("#keys tbody tr", has_text=key_id)).to_have_count(0)

    def refused():
        r = console_gw.request("POST", CHAT, key=key, headers=custom_host(openai_mock), json=chat_body("again", model=model))
        assert r.status_code == 401, r.text
    eventually(refused)


def test_a_workspaces_price_is_set_on_the_limits_page_over_the_catalogs(console_gw, page):
    """The limits page's prices: a model of the shipped catalog shows the catalog's price; a bad
    price's error shows next to its field; a saved one is the workspace's, as the API reads it;
    a budget of cents is taken as given."""
    model = f"m-price-{uuid.uuid4().hex[:8]}"
    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    open_page(page, "Limits", "Limits and budgets")
    page.get_by_label("Model", exact=True).fill("gpt-4o")
    page.get_by_role("button", name="Look up").click()
    expect(page.locator("#price-in-force")).to_contain_text("gpt-4o: $")
    expect(page.locator("#price-in-force")).to_contain_text("(the catalog of ")

    page.get_by_label("Model", exact=True).fill(model)
    page.get_by_label("Input USD / 1M tokens").fill("-1")
    page.get_by_label("Output USD / 1M tokens").fill("8")
    page.get_by_role("button", name="Save price").click()
    expect(page.locator(".field-error[data-param=input_per_million]")).not_to_be_empty()
    page.get_by_label("Input USD / 1M tokens").fill("2.5")
    page.get_by_role("button", name="Save price").click()
    expect(page.locator("#price-in-force")).to_have_text(f"{model}: $2.5000 in, $8.0000 out per 1M tokens (this workspace)")
    price = console_gw.get(f"/v1/prices/{model}").json()
    assert (price["input_per_million"], price["output_per_million"], price["source"]) == (2.5, 8, "workspace"), price

    # A budget has cents too.
    limit_id = f"console-budget-{uuid.uuid4().hex[:8]}"
    page.get_by_label("Limit id").fill(limit_id)
    page.get_by_label("Workspace").fill(f"team-{uuid.uuid4().hex[:8]}")
    page.get_by_label("Budget (USD)").fill("0.25")
    page.get_by_role("button", name="Save limit").click()
    expect(page.locator(f"[data-limit={limit_id}] .meter-text")).to_have_text("0 / 0.25")
    assert console_gw.get(f"/v1/limits/{limit_id}").json()["budget_usd"] == 0.25
    assert console_gw.request("DELETE", f"/v1/limits/{limit_id}").status_code in (200, 204)


def test_a_budget_set_on_the_limits_page_is_spent_refused_and_shown_full(console_gw, openai_mock, page):
    """A USD budget set in the console for a key: its requests spend it (each one exactly
    its worst case: output alone is priced and the mock answers max_tokens), the one past it is
    a 429, and its bar is full."""
    team = new_workspace_key(console_gw)
    model = f"m-budget-{uuid.uuid4().hex[:8]}"
    put_price(console_gw, team["key"], model, input_per_million=0, output_per_million=1000)
    openai_mock.script(Reply(usage=(11, 50)), model=model, times=None)

    limit_id = f"console-budget-{uuid.uuid4().hex[:8]}"
    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    open_page(page, "Limits", "Limits and budgets")
    page.get_by_label("Limit id").fill(limit_id)
    page.get_by_label("Key id").fill(team["id"])
    page.get_by_label("Budget (USD)").fill("0.1")
    page.get_by_label("Budget period").select_option("total")
    page.get_by_role("button", name="Save limit").click()
    limit = page.locator(f"[data-limit={limit_id}]")
    expect(limit.locator(".meter-text")).to_have_text("0 / 0.1")

    statuses = [console_gw.request("POST", CHAT, key=team["key"], headers=custom_host(openai_mock),
                                   json=chat_body("spend it", model=model, max_tokens=50)).status_code
                for _ in range(3)]
    assert statuses == [200, 200, 429]
    expect(limit.locator(".meter-label")).to_have_text("USD / total")
    expect(limit.locator("meter")).to_have_attribute("data-full", "true")
    expect(limit.locator(".meter-text")).to_have_text("0.1 / 0.1")
    assert console_gw.request("DELETE", f"/v1/limits/{limit_id}").status_code in (200, 204)


AXE = Path(__file__).resolve().parents[2] / "console" / "node_modules" / "axe-core" / "axe.min.js"


def accessibility_violations(page) -> list[str]:
    """What axe-core (the console's pinned test package) finds against WCAG 2 A and AA on the
    page as it is: unlabelled controls, too little contrast, and the rest of its rules."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}})")
    return [f"{v['id']}: {v['help']} ({len(v['nodes'])}: {v['nodes'][0]['target']})" for v in result["violations"]]


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["laptop", "phone"])
def test_every_page_is_reachable_by_keyboard_labelled_readable_and_fits_the_width(
        chromium, console_gw, openai_mock, screenshots, width, height):
    """At a laptop's and a phone's width: signing in by keyboard alone, then each page with no
    WCAG A/AA violation axe-core finds (labels, contrast, ...) and nothing wider than the screen."""
    trace_id = send_chat(console_gw, openai_mock, f"m-a11y-{uuid.uuid4().hex[:8]}", "Check me.")
    # axe is added to the page as a script: the console's own CSP would refuse it.
    context = chromium.new_context(viewport={"width": width, "height": height}, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(SHOWN_WITHIN_MS)
    try:
        page.goto(f"{console_gw.origin}/console")
        page.get_by_role("heading", name="Sign in").wait_for()
        assert accessibility_violations(page) == []
        page.keyboard.press("Tab") if page.evaluate("document.activeElement.id") != "key" else None
        assert page.evaluate("document.activeElement.id") == "key", "the key's field has the focus"
        page.keyboard.type(KEY)
        page.keyboard.press("Enter")
        page.get_by_role("heading", name="Overview").wait_for()
        pages = [("overview", "Overview"), ("requests", "Requests"), (f"trace/{trace_id}", f"Request {trace_id}"),
                 ("limits", "Limits and budgets"), ("keys", "Keys"), ("batches", "Batches"), ("stored/prompts", "Prompts")]
        for hash_, heading in pages:
            page.goto(f"{console_gw.origin}/console#/{hash_}")
            page.get_by_role("heading", name=heading, exact=True, level=1).wait_for()
            page.wait_for_load_state("load")
            if hash_ == "overview":
                expect(page.locator(".chart canvas")).to_have_count(4)
            if hash_ == "requests":
                page.locator("#requests tbody tr").first.wait_for()
            assert accessibility_violations(page) == [], hash_
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{hash_} is {overflow} px wider than the screen"
            page.screenshot(path=str(screenshots / f"{hash_.split('/')[0]}-{width}.png"), full_page=True)
        # Tab alone reaches the header's links and its sign-out button (focus starts in the page's
        # form and wraps round, past as many rows as the keys table has by then).
        page.goto(f"{console_gw.origin}/console#/keys")
        page.get_by_role("heading", name="Keys", exact=True).wait_for()
        header = {"Overview", "Requests", "Limits", "Keys", "Batches", "Stored", "Sign out"}
        focusable = set()
        for _ in range(200):
            page.keyboard.press("Tab")
            focusable.add(page.evaluate("document.activeElement.textContent.trim()"))
            if header <= focusable:
                break
        assert header <= focusable, focusable
    finally:
        context.close()


def test_stored_objects_are_made_changed_rendered_and_deleted_and_a_secret_is_never_shown(console_gw, page):
    """Providers, MCP servers and prompts on the stored-objects page: the API's validation (its
    `param` shown by the field), a provider's key and a server's headers never shown once saved, a prompt rendered with sample
    variables, and a delete."""
    run = uuid.uuid4().hex[:8]
    secret = f"sk-console-secret-{uuid.uuid4().hex}"
    sign_in(page, console_gw, KEY)
    page.get_by_role("heading", name="Overview").wait_for()
    open_page(page, "Stored", "Providers")

    page.get_by_label("Slug").fill(f"openai-{run}")
    value = page.get_by_label("Value (JSON)")
    value.fill(json.dumps({"provider": "openai", "api_key": secret, "colour": "blue"}))
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#stored-value-error")).to_contain_text("(at colour)")
    value.fill(json.dumps({"provider": "openai", "api_key": secret}))
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#stored-saved")).to_have_text(f"Saved openai-{run}.")
    page.locator("#stored tbody tr", has_text=f"openai-{run}").click()
    expect(page.locator("#stored-saved")).to_contain_text(f"of openai-{run}")
    assert json.loads(value.input_value()) == {"provider": "openai"}, "the key is not in the editor"
    assert secret[-12:] not in page.content(), "nor anywhere on the page"
    # An MCP server's headers are its secrets too.
    open_page(page, "MCP servers", "MCP servers")
    page.get_by_label("Slug").fill(f"files-{run}")
    server = {"url": "http://127.0.0.1:9/mcp", "headers": {"authorization": f"Bearer {secret}"}}
    page.get_by_label("Value (JSON)").fill(json.dumps(server))
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#stored-saved")).to_have_text(f"Saved files-{run}.")
    page.locator("#stored tbody tr", has_text=f"files-{run}").click()
    expect(page.locator("#stored-saved")).to_contain_text(f"of files-{run}")
    assert json.loads(value.input_value()) == {"url": server["url"]}, "the headers are not in the editor"
    assert secret[-12:] not in page.content()

    open_page(page, "Prompts", "Prompts")
    page.get_by_label("Slug").fill(f"greet-{run}")
    page.get_by_label("Value (JSON)").fill(json.dumps({"string": "Hello {{name}}!", "model": "gpt-4o"}))
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#stored tbody tr", has_text=f"greet-{run}")).to_have_count(1)
    page.get_by_label("Variables (JSON)").fill(json.dumps({"name": "Ada <b>Lovelace</b>"}))
    page.get_by_role("button", name="Render").click()
    expect(page.locator("#rendered")).to_contain_text("Hello Ada <b>Lovelace</b>!")
    page.get_by_role("button", name="Delete").click()
    expect(page.locator("#stored-saved")).to_have_text(f"Deleted greet-{run}.")
    expect(page.locator("#stored tbody tr", has_text=f"greet-{run}")).to_have_count(0)
