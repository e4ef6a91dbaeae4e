// The console in Firefox (Debian's firefox-esr), driven over WebDriver BiDi by puppeteer-core (the
// console's pinned test package; Playwright's Firefox is its own patched build, which cannot be
// downloaded here). tests/e2e/test_console.py runs it:
//
//   node console/test/firefox.mjs ORIGIN KEY TRACE_ID MODEL HOSTILE_TEXT SCREENSHOT_DIR
//
// It signs in with KEY, and at a laptop's and a phone's width: sees the overview drawn with MODEL's
// requests counted, the request table filtered by MODEL, and the page of TRACE_ID with
// HOSTILE_TEXT (a prompt holding markup) shown as text and never run; every page fits the width.
// Any script error, or anything not shown within 15 s, fails it (exit status 1, the reason on
// stderr). A screenshot of each page goes to SCREENSHOT_DIR.

import puppeteer from "puppeteer-core";
import { join } from "node:path";

const [origin, key, traceId, model, hostile, shots] = process.argv.slice(2);
const FIREFOX = process.env.FIREFOX || "/usr/bin/firefox-esr";
const SHOWN_WITHIN_MS = 15_000;

const browser = await puppeteer.launch({ browser: "firefox", executablePath: FIREFOX, headless: true });
const problems = [];
try {
  for (const [width, height] of [[1280, 900], [390, 844]]) {
    const context = await browser.createBrowserContext();
    const page = await context.newPage();
    page.setDefaultTimeout(SHOWN_WITHIN_MS);
    page.on("pageerror", (error) => problems.push(`script error at ${width} px: ${error.message}`));
    await page.setViewport({ width, height });

    const shown = async (name, hash) => {
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      if (overflow > 0) problems.push(`${hash} is ${overflow} px wider than the screen at ${width} px`);
      await page.screenshot({ path: join(shots, `firefox-${name}-${width}.png`), fullPage: true });
    };
    const heading = (text) => page.waitForFunction((t) => [...document.querySelectorAll("h1")].some((h) => h.textContent === t), {}, text);

    await page.goto(`${origin}/console`);
    await page.waitForSelector("#key");
    await page.type("#key", key);
    await page.keyboard.press("Enter");
    await heading("Overview");
    // The model's row counts its two requests; the four charts are drawn.
    await page.waitForFunction(
      (m) => [...document.querySelectorAll("[data-breakdown=model] tr")].some((row) => row.cells[0]?.textContent === m && row.cells[1]?.textContent === "2"),
      {},
      model,
    );
    await page.waitForFunction(() => document.querySelectorAll(".chart canvas").length === 4);
    await shown("overview", "#/overview");

    await page.goto(`${origin}/console#/requests`);
    await heading("Requests");
    await page.type("#filter-model", model);
    await page.click("form.filters button[type=submit]");
    await page.waitForFunction(() => document.querySelectorAll("#requests tbody tr.row-link").length === 2);
    await shown("requests", "#/requests");

    await page.goto(`${origin}/console#/trace/${encodeURIComponent(traceId)}`);
    await heading(`Request ${traceId}`);
    await page.waitForFunction((text) => document.querySelector("pre[data-body=request_body]")?.textContent.includes(text), {}, hostile);
    const ran = await page.evaluate(() => [window.__injected, document.querySelectorAll("main script, main img").length]);
    if (ran[0] !== undefined || ran[1] !== 0) problems.push(`the prompt's markup ran or was inserted: ${JSON.stringify(ran)}`);
    await shown("request", "#/trace");
    await context.close();
  }
} catch (error) {
  problems.push(String(error));
} finally {
  await browser.close();
}
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
