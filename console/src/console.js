// The console: one page whose address's `#` part says what it shows (#/overview, #/requests,
// #/trace/<trace id>). It reads the control plane's /console/api paths with the session's
// cookie; the key signs in once and is kept nowhere. Whatever a user or a record gave is put in
// the page as text (textContent), never as markup.
"use strict";

(() => {
  const LIVE_MS = 5000;
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  const signOutButton = document.getElementById("sign-out");
  const state = { session: null, timer: null, charts: [] };

  class SignedOut extends Error {}

  /** An element with its attributes (`text`: its text; `on<event>`: a listener) and children. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = String(value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  /** A console API call: its JSON; a 401 shows the sign-in form. */
  async function api(path, options = {}) {
    const response = await fetch(path, { credentials: "same-origin", ...options });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (response.status === 401 && path !== "/console/session") {
      state.session = null;
      showSignIn(body && body.error ? body.error.message : "Sign in again.");
      throw new SignedOut();
    }
    if (!response.ok) {
      throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
    }
    return body;
  }

  function stopLive() {
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
    for (const chart of state.charts) chart.destroy();
    state.charts = [];
  }

  function live(load) {
    state.timer = setInterval(() => load().catch(shown), LIVE_MS);
  }

  /** An error of a load, shown on the page (a sign-out has shown the form already). */
  function shown(error) {
    if (error instanceof SignedOut) return;
    const alert = document.getElementById("load-error");
    if (alert) alert.textContent = error.message;
  }

  function showSignIn(message) {
    stopLive();
    nav.hidden = true;
    signOutButton.hidden = true;
    who.textContent = "";
    const key = el("input", { id: "key", name: "key", type: "password", autocomplete: "off", required: true });
    const error = el("p", { id: "sign-in-error", class: "error", role: "alert", text: message || "" });
    const form = el(
      "form",
      { class: "sign-in", "aria-labelledby": "sign-in-title" },
      el("h1", { id: "sign-in-title", text: "Sign in" }),
      el("label", { for: "key" }, "Gateway key", key),
      el("button", { type: "submit", text: "Sign in" }),
      error,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.textContent = "";
      try {
        const session = await api("/console/session", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ key: key.value }),
        });
        key.value = "";
        state.session = session;
        if (location.hash && location.hash !== "#/") route();
        else location.hash = "#/overview";
      } catch (e) {
        error.textContent = e.message;
      }
    });
    main.replaceChildren(form);
    key.focus();
  }

  async function signOut() {
    try {
      await api("/console/session", { method: "DELETE", headers: { "x-console-csrf": state.session.csrf_token } });
    } catch (e) {
      if (!(e instanceof SignedOut)) throw e;
    }
    state.session = null;
    showSignIn("Signed out.");
  }

  function route() {
    stopLive();
    if (!state.session) return showSignIn();
    nav.hidden = false;
    signOutButton.hidden = false;
    who.textContent = state.session.admin ? `${state.session.workspace} (admin)` : state.session.workspace;
    const hash = location.hash || "#/overview";
    for (const link of nav.querySelectorAll("a")) {
      if (hash.startsWith(link.getAttribute("href"))) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    if (hash.startsWith("#/requests")) return showRequests();
    if (hash.startsWith("#/trace/")) return showTrace(decodeURIComponent(hash.slice("#/trace/".length)));
    return showOverview();
  }

  // ----------------------------------------------------------------------------- formats

  const integer = (n) => Number(n || 0).toLocaleString("en-US");
  const usd = (n) => `$${Number(n || 0).toFixed(4)}`;
  const ms = (n) => (n === null || n === undefined ? "–" : `${Math.round(n)} ms`);
  const percent = (n) => `${(100 * Number(n || 0)).toFixed(1)}%`;
  const time = (seconds) => new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);
  const shownValue = (value) => (value === null || value === undefined ? "(none)" : String(value));

  function table(caption, columns, rows, onOpen) {
    const head = el("tr", {}, ...columns.map(([name, , numeric]) => el("th", { scope: "col", class: numeric ? "number" : null, text: name })));
    const body = rows.map((row) => {
      const cells = columns.map(([, value, numeric, className]) =>
        el("td", { class: [numeric ? "number" : "", className ? className(row) : ""].join(" ").trim() || null, text: value(row) }),
      );
      if (!onOpen) return el("tr", {}, ...cells);
      return el(
        "tr",
        { class: "row-link", tabindex: 0, onclick: () => onOpen(row), onkeydown: (e) => e.key === "Enter" && onOpen(row) },
        ...cells,
      );
    });
    const empty = rows.length ? null : el("tr", {}, el("td", { colspan: columns.length, class: "muted", text: "Nothing yet." }));
    return el("div", { class: "scroll" }, el("table", {}, el("caption", { class: "muted", text: caption }), el("thead", {}, head), el("tbody", {}, ...body, empty)));
  }

  // ----------------------------------------------------------------------------- overview

  function showOverview() {
    const range = el(
      "select",
      { id: "range", name: "range" },
      ...["hour", "day", "week", "month"].map((r) => el("option", { value: r, selected: r === "day", text: `Last ${r}` })),
    );
    const tiles = el("div", { class: "tiles", id: "tiles" });
    const charts = el("div", { class: "charts" });
    const tables = el("div", { class: "tables", id: "breakdowns" });
    main.replaceChildren(
      el("h1", { text: "Overview" }),
      el("div", { class: "controls" }, el("label", { for: "range" }, "Period", range)),
      el("p", { id: "load-error", class: "error", role: "alert" }),
      tiles,
      charts,
      tables,
    );
    const chartSpecs = [
      ["Requests and errors", [["requests", "#0b5cad"], ["errors", "#a4161a"]], (p) => [p.requests, p.errors]],
      ["Latency (ms)", [["p50", "#1a6b2f"], ["p95", "#8a4b00"]], (p) => [p.p50_ms, p.p95_ms]],
      ["Cost (USD)", [["cost", "#5b2a86"]], (p) => [p.cost_usd]],
      ["Tokens", [["input", "#0b5cad"], ["output", "#1a6b2f"]], (p) => [p.input_tokens, p.output_tokens]],
    ];
    const boxes = chartSpecs.map(([title]) => el("figure", { class: "chart", "aria-label": title }, el("h2", { text: title })));
    charts.replaceChildren(...boxes);

    async function load() {
      const overview = await api(`/console/api/overview?range=${encodeURIComponent(range.value)}`);
      const t = overview.totals;
      tiles.replaceChildren(
        ...[
          ["Requests", integer(t.requests)],
          ["Errors", integer(t.errors)],
          ["Error rate", percent(t.requests ? t.errors / t.requests : 0)],
          ["Input tokens", integer(t.input_tokens)],
          ["Output tokens", integer(t.output_tokens)],
          ["Cost", usd(t.cost_usd)],
          ["Latency p50", ms(t.p50_ms)],
          ["Latency p95", ms(t.p95_ms)],
        ].map(([name, value]) => el("div", { class: "tile", "data-tile": name }, el("div", { class: "value", text: value }), el("div", { class: "name", text: name }))),
      );
      const xs = overview.series.map((p) => p.t);
      chartSpecs.forEach(([, series, values], i) => {
        const data = [xs, ...series.map((_, j) => overview.series.map((p) => values(p)[j]))];
        const existing = state.charts[i];
        if (existing) return existing.setData(data);
        const width = Math.max(280, boxes[i].clientWidth - 16);
        const options = {
          width,
          height: 220,
          series: [{}, ...series.map(([label, stroke]) => ({ label, stroke, width: 2, spanGaps: true, points: { show: true, size: 4 } }))],
          axes: [{}, { size: 60 }],
        };
        state.charts[i] = new uPlot(options, data, boxes[i]);
      });
      const byRows = (name) => overview.breakdown[name] || [];
      const sums = [
        ["Requests", (r) => integer(r.requests), true],
        ["Errors", (r) => integer(r.errors), true],
        ["Tokens in / out", (r) => `${integer(r.input_tokens)} / ${integer(r.output_tokens)}`, true],
        ["Cost", (r) => usd(r.cost_usd), true],
      ];
      const breakdowns = [
        ["By model", "Model", "model"],
        ["By provider", "Provider", "provider"],
        ["By API", "API", "api"],
        ["By key", "Key id", "api_key"],
        ["By workspace", "Workspace", "workspace"],
      ];
      tables.replaceChildren(
        el("section", {}, el("h2", { text: "Top models by cost" }), table("Top models by cost", [["Model", (r) => shownValue(r.value)], ["Cost", (r) => usd(r.cost_usd), true], ["Requests", (r) => integer(r.requests), true]], overview.top_models_by_cost)),
        el("section", {}, el("h2", { text: "Error rate by provider" }), table("Error rate by provider", [["Provider", (r) => shownValue(r.value)], ["Error rate", (r) => percent(r.error_rate), true], ["Errors", (r) => integer(r.errors), true], ["Requests", (r) => integer(r.requests), true]], overview.error_rate_by_provider)),
        ...breakdowns.map(([title, column, name]) =>
          el("section", { "data-breakdown": name }, el("h2", { text: title }), table(title, [[column, (r) => shownValue(r.value)], ...sums], byRows(name))),
        ),
      );
    }

    range.addEventListener("change", () => {
      for (const chart of state.charts) chart.destroy();
      state.charts = [];
      load().catch(shown);
    });
    load().catch(shown);
    live(load);
  }

  // ----------------------------------------------------------------------------- requests

  const FILTERS = [
    ["period", "Period", [["", "Any time"], ["3600", "Last hour"], ["86400", "Last day"], ["604800", "Last week"], ["2592000", "Last month"]]],
    ["status_class", "Status", [["", "Any"], ["2xx", "2xx"], ["4xx", "4xx"], ["5xx", "5xx"]]],
    ["model", "Model"],
    ["provider", "Provider"],
    ["api", "API", [["", "Any"], ["chat", "Chat"], ["messages", "Messages"], ["responses", "Responses"], ["mcp", "MCP"], ["embeddings", "Embeddings"]]],
    ["trace_id", "Trace id"],
    ["api_key", "Key id"],
    ["cache_status", "Cache", [["", "Any"], ["HIT", "Hit"], ["SEMANTIC_HIT", "Semantic hit"], ["MISS", "Miss"], ["DISABLED", "Off"]]],
    ["guardrail", "Guardrails", [["", "Any"], ["pass", "Passed"], ["fail", "Failed"]]],
  ];

  function showRequests() {
    const fields = FILTERS.map(([name, label, options]) => {
      const id = `filter-${name}`;
      const input = options
        ? el("select", { id, name }, ...options.map(([value, text]) => el("option", { value, text })))
        : el("input", { id, name, type: "text", autocomplete: "off" });
      return [name, input, el("label", { for: id }, label, input)];
    });
    const form = el("form", { class: "filters", "aria-label": "Filters" }, ...fields.map(([, , label]) => label), el("button", { type: "submit", text: "Apply" }));
    const results = el("div", { id: "requests" });
    const newer = el("button", { type: "button", class: "secondary", text: "Newer" });
    const older = el("button", { type: "button", class: "secondary", text: "Older" });
    main.replaceChildren(
      el("h1", { text: "Requests" }),
      form,
      el("p", { id: "load-error", class: "error", role: "alert" }),
      results,
      el("div", { class: "pager" }, newer, older),
    );
    // The cursors of the pages before this one (keyset paging, newest first).
    const pages = [];
    let after = null;
    let lastId = null;

    function query() {
      const params = new URLSearchParams({ limit: "50" });
      for (const [name, input] of fields) {
        if (!input.value) continue;
        if (name === "period") params.set("from", String(Math.floor(Date.now() / 1000) - Number(input.value)));
        else params.set(name, input.value.trim());
      }
      if (after) params.set("after", after);
      return params;
    }

    async function load() {
      const page = await api(`/console/api/logs?${query()}`);
      const rows = page.data;
      lastId = page.has_more && rows.length ? rows[rows.length - 1].id : null;
      results.replaceChildren(
        table(
          "Request log, newest first",
          [
            ["Time (UTC)", (r) => time(r.created_at)],
            ["Status", (r) => shownValue(r.status), true, (r) => (r.status >= 400 ? "status-error" : "")],
            ["API", (r) => shownValue(r.client_api || "chat")],
            ["Model", (r) => shownValue(r.model)],
            ["Provider", (r) => shownValue(r.provider)],
            ["Tokens in / out", (r) => `${integer(r.prompt_tokens)} / ${integer(r.completion_tokens)}`, true],
            ["Cost", (r) => (r.cost_usd === undefined || r.cost_usd === null ? "–" : usd(r.cost_usd)), true],
            ["Duration", (r) => ms(r.duration_ms), true],
            ["Cache", (r) => shownValue(r.cache_status)],
            ["Trace id", (r) => shownValue(r.trace_id)],
          ],
          rows,
          (r) => {
            location.hash = `#/trace/${encodeURIComponent(r.trace_id)}`;
          },
        ),
      );
      newer.disabled = pages.length === 0;
      older.disabled = lastId === null;
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      pages.length = 0;
      after = null;
      load().catch(shown);
    });
    older.addEventListener("click", () => {
      pages.push(after);
      after = lastId;
      load().catch(shown);
    });
    newer.addEventListener("click", () => {
      after = pages.pop() || null;
      load().catch(shown);
    });
    load().catch(shown);
    // Live while the newest page is shown.
    state.timer = setInterval(() => {
      if (after === null) load().catch(shown);
    }, LIVE_MS);
  }

  // ----------------------------------------------------------------------------- one request

  const BODY_FIELDS = ["request_body", "response_body"];

  async function showTrace(traceId) {
    main.replaceChildren(el("h1", { text: `Request ${traceId}` }), el("p", { id: "load-error", class: "error", role: "alert" }));
    let page;
    try {
      page = await api(`/console/api/logs?${new URLSearchParams({ trace_id: traceId, limit: "100" })}`);
    } catch (e) {
      return shown(e);
    }
    if (!page.data.length) {
      main.append(el("p", { class: "muted", text: "No request of this workspace has this trace id." }));
      return;
    }
    for (const record of page.data) {
      const entries = Object.entries(record).filter(([name]) => !BODY_FIELDS.includes(name));
      const list = el("dl", { class: "record" });
      for (const [name, value] of entries) {
        list.append(el("dt", { text: name }), el("dd", { text: typeof value === "string" ? value : JSON.stringify(value) }));
      }
      const section = el("section", { class: "request", "data-record": record.id }, el("h2", { text: `${time(record.created_at)} · ${shownValue(record.status)}` }), list);
      for (const name of BODY_FIELDS) {
        if (typeof record[name] === "string") {
          section.append(el("h2", { text: name === "request_body" ? "Request body" : "Response body" }), el("pre", { class: "body", "data-body": name, text: record[name] }));
        }
      }
      main.append(section);
    }
  }

  // ----------------------------------------------------------------------------- start

  signOutButton.addEventListener("click", () => signOut().catch(shown));
  window.addEventListener("hashchange", route);
  api("/console/session")
    .then((session) => {
      state.session = session;
      route();
    })
    .catch(() => showSignIn());
})();
