// The console: one page whose address's `#` part says what it shows (#/overview, #/requests,
// #/trace/<trace id>, #/limits, #/keys, #/stored/<kind>). It reads the control plane's /console/api paths with
// the session's cookie (the gateway API's own under /console/api/v1, its writes with the
// session's CSRF token); the key signs in once and is kept nowhere. Whatever a user or a record gave is put in
// the page as text (textContent), never as markup.
"use strict";

(() => {
  const LIVE_MS = 5000;
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  const signOutButton = document.getElementById("sign-out");
  const state = { session: null, timer: null, charts: [], secretFields: null };

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
      const error = new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
      error.param = body && body.error ? body.error.param : null;
      throw error;
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
    if (hash.startsWith("#/limits")) return showLimits();
    if (hash.startsWith("#/keys")) return showKeys();
    if (hash.startsWith("#/batches")) return showBatches();
    if (hash.startsWith("#/stored/")) return showStored(hash.slice("#/stored/".length));
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
    // A table wider than the screen scrolls: its region takes the focus, so keys scroll it too.
    return el(
      "div",
      { class: "scroll", tabindex: 0, role: "region", "aria-label": caption },
      el("table", {}, el("caption", { class: "muted", text: caption }), el("thead", {}, head), el("tbody", {}, ...body, empty)),
    );
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
    // An admin reads any workspace's log: its own (default) unless it names another.
    const filters = state.session.admin ? [["workspace", "Workspace"], ...FILTERS] : FILTERS;
    const fields = filters.map(([name, label, options]) => {
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

  // ----------------------------------------------------------------------------- the gateway API's objects

  /** A call of the gateway API (`/v1/<path>`) as the session's caller; a write carries the CSRF token. */
  function gatewayApi(path, method = "GET", body) {
    const options = { method, headers: {} };
    if (method !== "GET") options.headers["x-console-csrf"] = state.session.csrf_token;
    if (body !== undefined) {
      options.headers["content-type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    return api(`/console/api/v1/${path}`, options);
  }

  /** A form's fields, each a labelled input whose error shows next to it (by the API's `param`). */
  function formFields(specs) {
    return specs.map(([name, label, type, hint]) => {
      const id = `field-${name}`;
      // A number's step is `any`: a budget or a price has cents (the default step of 1 refused 2.5).
      const input =
        type === "select"
          ? el("select", { id, name }, ...hint.map(([value, text]) => el("option", { value, text })))
          : el("input", { id, name, type: type || "text", autocomplete: "off", placeholder: hint || null, step: type === "number" ? "any" : null });
      const error = el("span", { class: "error field-error", id: `${id}-error`, "data-param": name });
      input.setAttribute("aria-describedby", `${id}-error`);
      return { name, input, node: el("label", { for: id }, label, input, error) };
    });
  }

  /** Shows an API error next to the field its `param` names, else in the form's alert. */
  function showFieldError(form, alert, error) {
    for (const node of form.querySelectorAll(".field-error")) node.textContent = "";
    const field = error.param ? form.querySelector(`.field-error[data-param="${CSS.escape(error.param.split(/[.[]/)[0])}"]`) : null;
    (field || alert).textContent = error.message;
  }

  /** The API's error, with its `param`. */
  async function apiError(call) {
    try {
      return { value: await call(), error: null };
    } catch (e) {
      if (e instanceof SignedOut) throw e;
      return { value: null, error: { message: e.message, param: e.param || null } };
    }
  }

  /** A bar of `used` against `size`: a limit's (full is bad: it turns amber past 80%) or, with
   * `fullIsDone`, progress (full is good). */
  function meter(label, used, size, fullIsDone = false) {
    const share = size > 0 ? Math.min(1, used / size) : 0;
    const colours = fullIsDone ? { optimum: size } : { high: size * 0.8, optimum: 0 };
    return el(
      "div",
      { class: "meter-row" },
      el("span", { class: "meter-label", text: label }),
      el("meter", { min: 0, max: size, value: Math.min(used, size), ...colours, "aria-label": label, "data-full": share >= 1 ? "true" : "false" }),
      el("span", { class: "meter-text", text: `${Number(used).toLocaleString("en-US")} / ${Number(size).toLocaleString("en-US")}` }),
    );
  }

  /** The prices section of the limits page: a model's price in force (the workspace's own, or
   * the shipped catalog's), and setting the workspace's. */
  function prices() {
    const fields = formFields([
      ["price_model", "Model"],
      ["input_per_million", "Input USD / 1M tokens", "number"],
      ["output_per_million", "Output USD / 1M tokens", "number"],
      ["cached_input_per_million", "Cached input USD / 1M (optional)", "number"],
    ]);
    const [model] = fields;
    const inForce = el("p", { id: "price-in-force", role: "status" });
    const alert = el("p", { class: "error", role: "alert" });
    const lookUp = el("button", { type: "button", class: "secondary", text: "Look up" });
    const form = el("form", { class: "filters", "aria-label": "Prices" }, ...fields.map((f) => f.node), lookUp, el("button", { type: "submit", text: "Save price" }), alert);
    const path = () => `prices/${encodeURIComponent(model.input.value.trim())}`;

    async function show() {
      const { value, error } = await apiError(() => gatewayApi(path()));
      if (error) return showFieldError(form, alert, { ...error, param: error.param === "model" ? "price_model" : error.param });
      showFieldError(form, alert, { message: "" });
      const source = value.source === "catalog" ? `the catalog of ${value.date}` : `this workspace`;
      inForce.textContent = `${value.model}: ${usd(value.input_per_million)} in, ${usd(value.output_per_million)} out per 1M tokens (${source})`;
    }
    lookUp.addEventListener("click", () => show().catch(shown));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {};
      for (const { name, input } of fields.slice(1)) if (input.value.trim()) body[name] = Number(input.value);
      const { error } = await apiError(() => gatewayApi(path(), "PUT", body));
      if (error) return showFieldError(form, alert, error);
      show().catch(shown);
    });
    return [el("h2", { text: "Prices" }), form, inForce];
  }

  // ----------------------------------------------------------------------------- batches

  function showBatches() {
    // An admin reads any workspace's batches: its own (default) unless it names another.
    const workspace = el("input", { id: "filter-workspace", name: "workspace", type: "text", autocomplete: "off" });
    const form = el("form", { class: "filters", "aria-label": "Filters" }, el("label", { for: "filter-workspace" }, "Workspace", workspace), el("button", { type: "submit", text: "Apply" }));
    const list = el("div", { id: "batches" });
    const newest = el("button", { type: "button", class: "secondary", text: "Newest" });
    const older = el("button", { type: "button", class: "secondary", text: "Older" });
    main.replaceChildren(
      el("h1", { text: "Batches" }),
      ...(state.session.admin ? [form] : []),
      el("p", { id: "load-error", class: "error", role: "alert" }),
      list,
      el("div", { class: "pager" }, newest, older),
    );
    let after = null;
    let lastId = null;

    async function load() {
      const params = new URLSearchParams();
      if (workspace.value.trim()) params.set("workspace", workspace.value.trim());
      if (after) params.set("after", after);
      const page = await api(`/console/api/batches?${params}`);
      lastId = page.has_more && page.data.length ? page.data[page.data.length - 1].id : null;
      const rows = page.data.map((batch) => {
        const counts = batch.request_counts || {};
        const done = (counts.completed || 0) + (counts.failed || 0);
        return el(
          "section",
          { class: "card", "data-batch": batch.id },
          el("h2", { text: `${batch.id} · ${batch.status}` }),
          el("p", { class: "muted", text: `${batch.endpoint} · created ${time(batch.created_at)} UTC · ${integer(counts.completed)} completed, ${integer(counts.failed)} failed` }),
          meter("Lines done", done, counts.total || 0, true),
        );
      });
      list.replaceChildren(...(rows.length ? rows : [el("p", { class: "muted", text: "No managed batches." })]));
      newest.disabled = after === null;
      older.disabled = lastId === null;
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      after = null;
      load().catch(shown);
    });
    older.addEventListener("click", () => {
      after = lastId;
      load().catch(shown);
    });
    newest.addEventListener("click", () => {
      after = null;
      load().catch(shown);
    });
    load().catch(shown);
    // Live while the newest page is shown: a running batch's bar moves.
    state.timer = setInterval(() => {
      if (after === null) load().catch(shown);
    }, LIVE_MS);
  }

  async function showLimits() {
    const list = el("div", { id: "limits" });
    const alert = el("p", { id: "load-error", class: "error", role: "alert" });
    const fields = formFields([
      ["id", "Limit id"],
      ["workspace", "Workspace", "text", "or a key below"],
      ["api_key_id", "Key id", "text", "or a workspace above"],
      ["model", "Model (optional)"],
      ["requests_per_minute", "Requests per minute", "number"],
      ["tokens_per_minute", "Tokens per minute", "number"],
      ["budget_usd", "Budget (USD)", "number"],
      ["budget_period", "Budget period", "select", [["", "(month)"], ["day", "Day"], ["month", "Month"], ["total", "Total"]]],
    ]);
    const formAlert = el("p", { class: "error", role: "alert" });
    const form = el("form", { class: "filters", "aria-label": "Set a limit" }, ...fields.map((f) => f.node), el("button", { type: "submit", text: "Save limit" }), formAlert);
    main.replaceChildren(el("h1", { text: "Limits and budgets" }), alert, list, el("h2", { text: "Set a limit or budget" }), form, ...prices());

    async function load() {
      const limits = (await gatewayApi("limits")).data;
      const detailed = await Promise.all(limits.map((limit) => gatewayApi(`limits/${encodeURIComponent(limit.id)}`)));
      const rows = detailed.map((limit) => {
        // What is used now: what the gateways reported, and what their leases still hold.
        const usage = limit.usage || {};
        const held = usage.reserved || {};
        const used = (name, reserved) => (usage[name] || 0) + (held[reserved] || 0);
        const bars = [];
        if (limit.requests_per_minute !== undefined) bars.push(meter("Requests / min", used("requests", "requests"), limit.requests_per_minute));
        if (limit.tokens_per_minute !== undefined) bars.push(meter("Tokens / min", used("tokens", "tokens"), limit.tokens_per_minute));
        if (limit.budget_usd !== undefined) bars.push(meter(`USD / ${limit.budget_period || "month"}`, used("spent_usd", "usd"), limit.budget_usd));
        const scope = limit.workspace ? `workspace ${limit.workspace}` : `key ${limit.api_key_id}`;
        const remove = el("button", { type: "button", class: "secondary", text: "Delete" });
        remove.addEventListener("click", async () => {
          const { error } = await apiError(() => gatewayApi(`limits/${encodeURIComponent(limit.id)}`, "DELETE"));
          if (error) alert.textContent = error.message;
          load().catch(shown);
        });
        return el(
          "section",
          { class: "card", "data-limit": limit.id },
          el("h2", { text: `${limit.id} · ${scope}${limit.model ? ` · ${limit.model}` : ""}${limit.mcp_server ? ` · MCP ${limit.mcp_server}` : ""}` }),
          ...bars,
          remove,
        );
      });
      list.replaceChildren(...(rows.length ? rows : [el("p", { class: "muted", text: "No limits yet." })]));
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {};
      let id = "";
      for (const { name, input } of fields) {
        const value = input.value.trim();
        if (!value) continue;
        if (name === "id") id = value;
        else body[name] = input.type === "number" ? Number(value) : value;
      }
      const { error } = await apiError(() => gatewayApi(`limits/${encodeURIComponent(id)}`, "PUT", body));
      if (error) return showFieldError(form, formAlert, error);
      showFieldError(form, formAlert, { message: "" });
      form.reset();
      load().catch(shown);
    });
    load().catch(shown);
    live(load);
  }

  async function showKeys() {
    const alert = el("p", { id: "load-error", class: "error", role: "alert" });
    const list = el("div", { id: "keys" });
    const created = el("div", { id: "created-key", "aria-live": "polite" });
    const fields = formFields([
      ["workspace", "Workspace"],
      ["name", "Name (optional)", "text", "ci pipeline"],
      ["mcp_tools", "MCP tools (optional, comma-separated patterns)", "text", "files__*, search__web_search"],
    ]);
    const [workspaceField, nameField, toolsField] = fields;
    const formAlert = el("p", { class: "error", role: "alert" });
    const form = el("form", { class: "filters", "aria-label": "Create a key" }, ...fields.map((f) => f.node), el("button", { type: "submit", text: "Create key" }), formAlert);
    main.replaceChildren(el("h1", { text: "Keys" }), alert, el("h2", { text: "Create a key" }), form, created, el("h2", { text: "Every key" }), list);

    async function load() {
      const { value, error } = await apiError(() => gatewayApi("api-keys"));
      if (error) {
        list.replaceChildren(el("p", { class: "muted", text: error.message }));
        return;
      }
      list.replaceChildren(
        table(
          "Keys: the key itself is shown once, when it is made",
          [
            ["Name", (k) => shownValue(k.name)],
            ["Key id", (k) => k.id],
            ["Workspace", (k) => k.workspace],
            ["Ends with", (k) => `…${k.last_four}`],
            ["Admin", (k) => (k.admin ? "yes" : "no")],
            ["MCP tools", (k) => (k.mcp_tools ? k.mcp_tools.join(", ") : "all")],
            ["Created (UTC)", (k) => time(k.created_at)],
          ],
          value.data,
        ),
      );
      // A revoke button per row, in its own cell.
      const rows = list.querySelectorAll("tbody tr");
      value.data.forEach((key, i) => {
        const revoke = el("button", { type: "button", class: "secondary", text: "Revoke", "aria-label": `Revoke key ${key.id}` });
        revoke.addEventListener("click", async () => {
          const result = await apiError(() => gatewayApi(`api-keys/${encodeURIComponent(key.id)}`, "DELETE"));
          if (result.error) alert.textContent = result.error.message;
          load().catch(shown);
        });
        if (rows[i]) rows[i].append(el("td", {}, revoke));
      });
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = { workspace: workspaceField.input.value.trim() };
      if (nameField.input.value.trim()) body.name = nameField.input.value.trim();
      const tools = toolsField.input.value.split(",").map((t) => t.trim()).filter(Boolean);
      if (tools.length) body.mcp_tools = tools;
      const { value, error } = await apiError(() => gatewayApi("api-keys", "POST", body));
      if (error) return showFieldError(form, formAlert, error);
      showFieldError(form, formAlert, { message: "" });
      form.reset();
      created.replaceChildren(
        el("p", { text: `Key ${value.id}${value.name ? ` (${value.name})` : ""} for ${value.workspace}: copy it now, it is not shown again.` }),
        el("pre", { class: "body", id: "new-key", text: value.key }),
      );
      load().catch(shown);
    });
    load().catch(shown);
  }

  // ----------------------------------------------------------------------------- stored objects

  const KINDS = [
    ["providers", "Providers"],
    ["configs", "Configs"],
    ["prompts", "Prompts"],
    ["guardrails", "Guardrails"],
    ["mcp-servers", "MCP servers"],
  ];
  /** The fields that hold secrets, as the control plane names them: the API shows their last
   * four characters only, so an editor never holds them (read once). */
  async function secretFields() {
    state.secretFields ??= (await api("/console/api/secret-fields")).data;
    return state.secretFields;
  }
  /** What a read adds beside the value. */
  const READ_FIELDS = ["id", "slug", "version_id", "prompt_version_id", "created_at", "updated_at"];
  /** An item's name in its path: its slug (an MCP server's id is its name). */
  const slugOf = (item) => item.slug ?? item.id;

  function withoutSecrets(value, secrets) {
    if (Array.isArray(value)) return value.map((item) => withoutSecrets(item, secrets));
    if (value === null || typeof value !== "object") return value;
    return Object.fromEntries(Object.entries(value).filter(([name]) => !secrets.includes(name)).map(([name, v]) => [name, withoutSecrets(v, secrets)]));
  }

  function showStored(kind) {
    const known = KINDS.find(([name]) => name === kind);
    if (!known) {
      location.hash = "#/stored/providers";
      return;
    }
    const tabs = el("nav", { class: "tabs", "aria-label": "Stored objects" }, ...KINDS.map(([name, label]) => el("a", { href: `#/stored/${name}`, "aria-current": name === kind ? "page" : null, text: label })));
    const alert = el("p", { id: "load-error", class: "error", role: "alert" });
    const list = el("div", { id: "stored" });
    const slug = el("input", { id: "stored-slug", name: "slug", type: "text", autocomplete: "off", required: true });
    const value = el("textarea", { id: "stored-value", name: "value", rows: 12, spellcheck: "false", "aria-describedby": "stored-value-error" });
    const valueError = el("span", { class: "error field-error", id: "stored-value-error", "data-param": "value" });
    const formAlert = el("p", { class: "error", role: "alert" });
    const saved = el("p", { class: "muted", id: "stored-saved", "aria-live": "polite" });
    const secretNote = ["providers", "mcp-servers"].includes(kind)
      ? el("p", { class: "muted", text: "Secrets (keys, credentials, headers) are never shown once saved: a save replaces the whole value, so give them again." })
      : null;
    const remove = el("button", { type: "button", class: "secondary", text: "Delete" });
    const form = el(
      "form",
      { class: "editor", "aria-label": `Create or change one of the ${known[1].toLowerCase()}` },
      el("label", { for: "stored-slug" }, "Slug", slug),
      el("label", { for: "stored-value" }, "Value (JSON)", value, valueError),
      secretNote,
      el("div", { class: "pager" }, el("button", { type: "submit", text: "Save" }), remove),
      formAlert,
      saved,
    );
    const rendered = el("pre", { class: "body", id: "rendered", "aria-live": "polite" });
    const variables = el("textarea", { id: "prompt-variables", rows: 3, spellcheck: "false" });
    const renderButton = el("button", { type: "button", text: "Render" });
    const renderPanel =
      kind === "prompts"
        ? el("section", { "aria-label": "Render the prompt" }, el("h2", { text: "Render with sample variables" }), el("label", { for: "prompt-variables" }, "Variables (JSON)", variables), renderButton, rendered)
        : null;
    main.replaceChildren(el("h1", { text: known[1] }), tabs, alert, list, el("h2", { text: "Create or change" }), form, renderPanel);
    variables.value = "{}";

    async function load() {
      const items = (await gatewayApi(kind)).data;
      list.replaceChildren(
        table(
          known[1],
          [
            ["Slug", slugOf],
            ["Id", (i) => i.id],
            ["Saved (UTC)", (i) => time(i.created_at ?? i.updated_at)],
          ],
          items,
          (item) => open(slugOf(item)).catch(shown),
        ),
      );
    }

    async function open(name) {
      const read = await gatewayApi(`${kind}/${encodeURIComponent(name)}`);
      const fields = Object.fromEntries(Object.entries(read).filter(([field]) => !READ_FIELDS.includes(field)));
      const shownFields = kind === "configs" && fields.config ? fields.config : fields;
      slug.value = slugOf(read);
      value.value = JSON.stringify(withoutSecrets(shownFields, await secretFields()), null, 2);
      saved.textContent = `Version ${read.version_id || read.prompt_version_id} of ${slugOf(read)}.`;
      value.focus();
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      valueError.textContent = "";
      formAlert.textContent = "";
      let body;
      try {
        body = JSON.parse(value.value);
      } catch (e) {
        valueError.textContent = `Not JSON: ${e.message}`;
        return;
      }
      const result = await apiError(() => gatewayApi(`${kind}/${encodeURIComponent(slug.value.trim())}`, "PUT", body));
      if (result.error) {
        const where = result.error.param && result.error.param !== "body" ? ` (at ${result.error.param})` : "";
        valueError.textContent = `${result.error.message}${where}`;
        return;
      }
      saved.textContent = `Saved ${slugOf(result.value)}.`;
      load().catch(shown);
    });
    remove.addEventListener("click", async () => {
      const result = await apiError(() => gatewayApi(`${kind}/${encodeURIComponent(slug.value.trim())}`, "DELETE"));
      if (result.error) formAlert.textContent = result.error.message;
      else {
        saved.textContent = `Deleted ${slug.value.trim()}.`;
        form.reset();
      }
      load().catch(shown);
    });
    renderButton.addEventListener("click", async () => {
      let given;
      try {
        given = JSON.parse(variables.value || "{}");
      } catch (e) {
        rendered.textContent = `Not JSON: ${e.message}`;
        return;
      }
      const result = await apiError(() => gatewayApi(`prompts/${encodeURIComponent(slug.value.trim())}/render`, "POST", { variables: given }));
      rendered.textContent = result.error ? result.error.message : JSON.stringify(result.value.data, null, 2);
    });
    load().catch(shown);
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
