// troth dashboard. Vanilla JavaScript, no build step, no third-party code.
// Reads GET /ops/*, GET /metrics and the protocol's POST / with the operator's token
// (kept in sessionStorage, sent as Authorization: Bearer); its two operator actions
// (cancel a workflow, retry failed deliveries) are POST /ops/* with the same token.
// Every value from the server enters the page through textContent (the h() helper),
// never as HTML.
"use strict";

const VERSION = "2026-04-01";
const TOKEN_KEY = "troth.token";
const PAGE = 50;
const $ = (sel) => document.querySelector(sel);

// ---- DOM ------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Append to ``parent``, leaving out null/undefined/false (DOM append would write "null"). */
function put(parent, ...children) {
  parent.append(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false));
}

const link = (href, text, attrs) => h("a", { href, ...attrs }, text);
const state = (s) => h("span", { class: `state state-${s}` }, s ?? "—");
const promiseLink = (id) => link(`#/promise/${encodeURIComponent(id)}`, id);
const workflowLink = (id) => link(`#/workflow/${encodeURIComponent(id)}`, id);

function table(headers, rows, empty = "Nothing here.") {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => h("td", i === 0 ? { class: "id" } : {}, c))))),
    ),
  );
}

function fields(pairs) {
  return h("dl", { class: "fields" }, pairs.filter((p) => p).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

// ---- time -----------------------------------------------------------------------

let serverSkew = 0; // server clock minus ours, from answers that carry "now"

function now() {
  return Date.now() + serverSkew;
}

function ago(ms) {
  const d = Math.abs(ms);
  // Both units rounded down, so that 23h59m59s reads 23h59m (never 23h60m).
  const unit = d < 1000 ? `${d}ms` : d < 60e3 ? `${Math.floor(d / 1e3)}s` : d < 3600e3
    ? `${Math.floor(d / 60e3)}m${Math.floor((d % 60e3) / 1e3)}s` : d < 86400e3
    ? `${Math.floor(d / 3600e3)}h${Math.floor((d % 3600e3) / 60e3)}m` : `${Math.floor(d / 86400e3)}d${Math.floor((d % 86400e3) / 3600e3)}h`;
  return ms >= 0 ? `${unit} ago` : `in ${unit}`;
}

function duration(ms) {
  return ago(ms).replace(" ago", "");
}

/** A time shown relative ("4m12s ago") and absolute (ISO, UTC). */
function when(ms) {
  if (ms === undefined || ms === null) return "—";
  const iso = new Date(ms).toISOString();
  return h("time", { datetime: iso, title: iso }, ago(now() - ms), " ", h("span", { class: "abs" }, iso.replace("T", " ").replace(".000Z", "Z")));
}

// ---- server ---------------------------------------------------------------------

class AuthNeeded extends Error {}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { authorization: `Bearer ${token}` } : {};
}

async function ops(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""));
  const r = await fetch(`/ops/${path}${q.size ? "?" + q : ""}`, { headers: authHeaders() });
  if (r.status === 401 || r.status === 403) throw new AuthNeeded(await r.text());
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  if (typeof body.now === "number") serverSkew = body.now - Date.now();
  return body;
}

let corr = 0;

/** One protocol request, as any client sends it (so it is authorised and logged alike). */
async function proto(kind, data) {
  const head = { corrId: `ui-${Date.now()}-${++corr}`, version: VERSION };
  const r = await fetch("/", {
    method: "POST",
    headers: { "content-type": "application/json", ...authHeaders() },
    body: JSON.stringify({ kind, head, data }),
  });
  const body = await r.json();
  if (r.status === 401 || r.status === 403) throw new AuthNeeded(JSON.stringify(body.data));
  return { status: body.head.status, data: body.data };
}

/** An operator action: POST /ops/{path} with a JSON body and the tab's token. Answers
 * { ok, status, body } or { ok: false, status, error }: a refusal (401, 403, 400, 404) is
 * returned, never thrown, so that the view says it where the button is, instead of
 * leaving for the sign-in page. */
async function opsAction(path, body) {
  let r;
  try {
    r = await fetch(`/ops/${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
    });
  } catch (e) {
    return { ok: false, status: 0, error: `the server could not be reached (${e.message || e})` };
  }
  const text = await r.text();
  let answer = null;
  try {
    answer = JSON.parse(text);
  } catch {
    // not JSON: said as it came
  }
  if (r.ok && answer) return { ok: true, status: r.status, body: answer };
  return { ok: false, status: r.status, error: answer?.error || text || `HTTP ${r.status}` };
}

/** What a refused (or unsent) action tells the operator: the server's reason and what
 * to do. */
function refusal(r) {
  const hint = r.status === 403
    ? " Operator actions need an admin token (troth token --role admin): sign out and sign in with one."
    : r.status === 401
      ? " The token is missing, expired or not valid: sign out and sign in again."
      : "";
  const said = String(r.error).replace(/\.$/, "");
  return r.status ? `Refused (HTTP ${r.status}): ${said}.${hint}` : `Not done: ${said}.`;
}

// ---- values ---------------------------------------------------------------------

function b64decode(data) {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
}

function b64encode(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** A param or value: its headers and its data, decoded from base64 JSON when it is. */
function showValue(v) {
  if (!v || (v.data === undefined && !Object.keys(v.headers || {}).length)) return h("span", { class: "muted" }, "(empty)");
  const parts = [];
  if (v.headers && Object.keys(v.headers).length) parts.push(h("div", {}, "headers"), h("pre", {}, JSON.stringify(v.headers, null, 2)));
  if (v.data !== undefined && v.data !== null) {
    let shown;
    try {
      const text = b64decode(v.data);
      try {
        shown = JSON.stringify(JSON.parse(text), null, 2);
      } catch {
        shown = text;
      }
      parts.push(h("pre", { class: "decoded" }, shown));
    } catch {
      parts.push(h("pre", {}, v.data), h("span", { class: "muted" }, "(not base64 text: shown as sent)"));
    }
  }
  return parts;
}

function functionOf(p) {
  try {
    const d = JSON.parse(b64decode(p.param?.data ?? ""));
    return typeof d?.func === "string" ? d.func : null;
  } catch {
    return null;
  }
}

function kindOf(p) {
  const t = p.tags || {};
  if (t["resonate:timer"] === "true") return "sleep";
  if (t["resonate:scope"] === "local") return "run";
  if (t["resonate:target"]) return p.id === t["resonate:origin"] ? "workflow" : "rpc";
  return "promise";
}

// ---- confirm dialog ----------------------------------------------------------------

/** Ask before acting; resolves to the value text (with ``value``), the reason typed (with
 * ``reason``) or "", and to null if dismissed (its button, Escape). */
function confirmAction(text, { value = false, reason = false, okLabel = "Confirm", noLabel = "Cancel" } = {}) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-value-label").hidden = !value;
  $("#confirm-value").value = value ? "null" : "";
  $("#confirm-reason-label").hidden = !reason;
  $("#confirm-reason").value = "";
  $("#confirm-error").textContent = "";
  $("#confirm-ok").textContent = okLabel;
  $("#confirm-no").textContent = noLabel;
  // Escape may close the dialog without setting returnValue (the older rule of the
  // standard): the answer of an earlier dialog ("ok") must not stand for this one.
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") resolve(null);
      else resolve(value ? $("#confirm-value").value : reason ? $("#confirm-reason").value : "");
    }, { once: true });
  });
}

// Enter in the reason's field confirms, as in any form (the form's first button,
// which implicit submission would press, is the one that dismisses).
$("#confirm-reason").addEventListener("keydown", (e) => {
  if (e.key === "Enter") {
    e.preventDefault();
    $("#confirm form").requestSubmit($("#confirm-ok"));
  }
});

// ---- views ------------------------------------------------------------------------

/** What the last action answered, shown once by the view drawn after it. */
let flash = "";

function takeFlash() {
  const text = flash;
  flash = "";
  return text;
}

/** Where a view says what its last action did (filled from ``flash`` when drawn). */
function actionResult() {
  return h("p", { id: "action-result", role: "status" }, takeFlash());
}

/** Say something in the view's action line without redrawing it (a refusal: a redraw
 * would read with the same refused token and leave for the sign-in page). */
function say(text, error = false) {
  const box = $("#action-result");
  if (!box) return;
  box.textContent = text;
  box.classList.toggle("error", error);
}

const plural = (n, one, many) => `${n.toLocaleString("en")} ${n === 1 ? one : many}`;

/** Run ``act`` with ``button`` disabled, so that a second click cannot act twice. */
async function busy(button, act) {
  button.disabled = true;
  try {
    await act();
  } finally {
    button.disabled = false;
  }
}

const views = {};
let timers = [];

function every(ms, fn) {
  fn();
  timers.push(setInterval(fn, ms));
}

function section(title, ...body) {
  return h("section", {}, h("h2", {}, title), ...body);
}

/** A block filled in later, so that a slow read (counts on a big store) never holds the page. */
function later(title, load) {
  const box = h("div", { "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  load()
    .then((content) => box.replaceChildren(...[content].flat().filter((c) => c !== null && c !== undefined)))
    .catch((e) => (e instanceof AuthNeeded ? login() : box.replaceChildren(h("p", { class: "error" }, String(e.message || e)))));
  return title ? section(title, box) : box;
}

// Overview ----------------------------------------------------------------------------

/** Samples of /metrics kept in the page (the server keeps no history): ~10 minutes. */
const samples = [];
const SAMPLE_EVERY = 2000;
const KEEP = 300;

function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const lm of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sumBy(metrics, name, label) {
  const out = {};
  for (const m of metrics) if (m.name === name) out[label ? m.labels[label] : ""] = (out[label ? m.labels[label] : ""] || 0) + m.value;
  return out;
}

async function sampleMetrics() {
  const r = await fetch("/metrics", { headers: authHeaders() });
  if (r.status === 401 || r.status === 403) throw new AuthNeeded();
  const m = parseMetrics(await r.text());
  samples.push({
    t: Date.now(),
    requests: sumBy(m, "troth_requests_total", "kind"),
    latSum: sumBy(m, "troth_request_seconds_sum", "kind"),
    latCount: sumBy(m, "troth_request_seconds_count", "kind"),
    dispatch: sumBy(m, "troth_dispatch_total", "outcome"),
    sse: sumBy(m, "troth_sse_connections")[""] ?? 0,
    batches: sumBy(m, "troth_commit_batches_total")[""] ?? 0,
    jobs: sumBy(m, "troth_commit_jobs_total")[""] ?? 0,
    timers: sumBy(m, "troth_timer_passes_total")[""] ?? 0,
    lag: sumBy(m, "troth_timer_lag_seconds")[""] ?? 0,
  });
  if (samples.length > KEEP) samples.shift();
}

/** Per-interval series from consecutive samples: fn(prev, cur, seconds) → {name: value}. */
function series(fn) {
  const out = {};
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const values = fn(a, b, (b.t - a.t) / 1000);
    for (const [k, v] of Object.entries(values)) (out[k] ||= []).push([b.t, v]);
  }
  return out;
}

const COLOURS = ["#0b57d0", "#1b7f3b", "#b3261e", "#8a5a00", "#6b4fa0", "#00838f", "#c2185b", "#5d4037"];

function chart(title, data, unit, top = 6) {
  const names = Object.keys(data)
    .sort((x, y) => data[y].reduce((s, p) => s + p[1], 0) - data[x].reduce((s, p) => s + p[1], 0))
    .slice(0, top);
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", "0 0 300 90");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const t1 = samples.length ? samples[samples.length - 1].t : Date.now();
  const t0 = Math.min(samples.length ? samples[0].t : t1, t1 - 60e3);
  let max = 0;
  for (const n of names) for (const [, v] of data[n]) max = Math.max(max, v);
  max = max || 1;
  names.forEach((n, i) => {
    const line = document.createElementNS(svgNS, "polyline");
    line.setAttribute("stroke", COLOURS[i % COLOURS.length]);
    line.setAttribute("points", data[n].map(([t, v]) => `${(((t - t0) / (t1 - t0 || 1)) * 300).toFixed(1)},${(88 - (v / max) * 84).toFixed(1)}`).join(" "));
    svg.append(line);
  });
  const last = (n) => data[n][data[n].length - 1]?.[1] ?? 0;
  const fmt = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  svg.setAttribute("aria-label", `${title}: ${names.map((n) => `${n} ${fmt(last(n))} ${unit}`).join(", ") || "no data yet"}`);
  return h(
    "div",
    { class: "card chart" },
    h("h3", {}, title, " ", h("span", { class: "muted" }, `(max ${fmt(max)} ${unit}, last ${Math.round((t1 - t0) / 60e3)} min)`)),
    svg,
    h("div", { class: "legend" }, names.length ? names.map((n, i) => h("span", { class: `c${i % COLOURS.length}` }, `${n} ${fmt(last(n))}`)) : h("span", { class: "muted" }, "no data yet")),
  );
}

function charts() {
  const rate = (key) => (a, b, s) => Object.fromEntries(Object.keys(b[key]).map((k) => [k, Math.max(0, (b[key][k] - (a[key][k] || 0)) / s)]));
  const latency = (a, b) => {
    const out = {};
    for (const k of Object.keys(b.latCount)) {
      const n = b.latCount[k] - (a.latCount[k] || 0);
      if (n > 0) out[k] = ((b.latSum[k] - (a.latSum[k] || 0)) / n) * 1000;
    }
    return out;
  };
  return [
    chart("Requests/s by kind", series(rate("requests")), "/s"),
    chart("Mean latency by kind", series(latency), "ms"),
    chart("Dispatch outcomes", series(rate("dispatch")), "/s"),
    chart("Open SSE connections", series((a, b) => ({ connections: b.sse })), ""),
    chart("Commit batch size", series((a, b) => ({ "jobs/batch": b.batches > a.batches ? (b.jobs - a.jobs) / (b.batches - a.batches) : 0 })), "jobs"),
    chart("Timer passes", series((a, b, s) => ({ passes: Math.max(0, (b.timers - a.timers) / s) })), "/s"),
    chart("Timer lag (last firing pass)", series((a, b) => ({ lag: b.lag * 1000 })), "ms"),
  ];
}

function countsCard(title, counts) {
  const entries = Object.entries(counts || {});
  return h("div", { class: "card" }, h("h3", {}, title), entries.length ? fields(entries.map(([k, v]) => [state(k), h("span", { class: "big" }, v.toLocaleString("en"))])) : h("p", { class: "muted" }, "none"));
}

views.overview = async (main) => {
  const chartBox = h("div", { class: "grid", id: "charts" });
  put(main, 
    h("h1", {}, "Overview"),
    later("Counts", async () => {
      const c = await ops("counts");
      return [
        h("div", { class: "grid" }, countsCard("Promises", c.promises), countsCard("Tasks", c.tasks), countsCard("Outbox", c.outbox), countsCard("Schedules", c.schedules)),
        h("p", { class: "muted" }, `counted in ${c.seconds ?? "?"} s${c.cached ? " (reused: counting this store is slow)" : ""}`),
      ];
    }),
    section("Live (sampled every 2 s while this page is open)", chartBox),
    later("Workers and nodes", async () => workersBody(await ops("workers"))),
    later("Failed and unknown deliveries", async () => {
      const [f, u] = await Promise.all([ops("outbox", { state: "failed", limit: 10 }), ops("outbox", { state: "outcome_unknown", limit: 10 })]);
      return [outboxTable([...f.rows, ...u.rows]), link("#/delivery?state=failed", "All failed deliveries →")];
    }),
  );
  const draw = () => chartBox.replaceChildren(...charts());
  draw();
  every(SAMPLE_EVERY, () => sampleMetrics().then(draw).catch((e) => (e instanceof AuthNeeded ? login() : null)));
};

// Workflows ---------------------------------------------------------------------------

const PROMISE_STATES = ["pending", "resolved", "rejected", "rejected_canceled", "rejected_timedout"];

function parseTags(text) {
  const tags = {};
  for (const part of (text || "").split(",")) {
    const i = part.indexOf("=");
    if (i > 0) tags[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return tags;
}

function promiseRows(promises) {
  return promises.map((p) => [
    workflowLink(p.id),
    state(p.state),
    kindOf(p),
    functionOf(p) ?? "",
    when(p.createdAt),
    p.settledAt ? duration(p.settledAt - p.createdAt) : `running ${duration(now() - p.createdAt)}`,
    link(`#/promise/${encodeURIComponent(p.id)}`, "details"),
  ]);
}

views.workflows = async (main, _arg, q) => {
  const prefix = q.get("prefix") || "";
  const st = q.get("state") || "";
  const tags = q.get("tags") || "";
  const form = h(
    "form",
    {
      class: "search",
      role: "search",
      onsubmit: (e) => {
        e.preventDefault();
        const f = new FormData(e.target);
        const p = new URLSearchParams([...f].filter(([, v]) => v));
        location.hash = `#/workflows${p.size ? "?" + p : ""}`;
      },
    },
    h("label", {}, "Id prefix", h("input", { name: "prefix", value: prefix, placeholder: "order-", autocomplete: "off" })),
    h("label", {}, "State", h("select", { name: "state" }, h("option", { value: "" }, "any"), PROMISE_STATES.map((s) => h("option", { value: s, selected: s === st }, s)))),
    h("label", {}, "Tags (key=value, …)", h("input", { name: "tags", value: tags, placeholder: "resonate:origin=order-42", size: 30 })),
    h("button", { type: "submit" }, "Search"),
  );
  put(main, h("h1", {}, "Workflows and promises"), form);
  const headers = ["id", "state", "kind", "function", "created", "took", ""];
  const results = later(null, async () => {
    const param = "after";
    const tagMap = parseTags(tags);
    const tagged = Object.keys(tagMap).length > 0;
    // With tags, the server looks at a bounded window of ids per page (the origin tag
    // through its index) rather than scanning the store: a page may hold fewer
    // matches than it could, and says how far it looked.
    const r = await ops("promises", { prefix, state: st, tags: tagged ? JSON.stringify(tagMap) : undefined, after: q.get(param), limit: PAGE });
    const nextQ = new URLSearchParams(q);
    nextQ.set(param, r.next || "");
    const partial = tagged && r.next && r.promises.length < PAGE;
    return [
      table(headers, promiseRows(r.promises), partial ? "None of these matched." : "No promise matches."),
      tagged && r.looked !== undefined ? h("p", { class: "muted", id: "looked" }, `${r.looked.toLocaleString("en")} promises looked at${r.next ? `, up to ${r.next}` : " (all there are)"}.`) : null,
      h("div", { class: "pager" }, q.get(param) ? link(`#/workflows?${new URLSearchParams([...q].filter(([k]) => k !== param))}`, "← First page") : null, r.next ? link(`#/workflows?${nextQ}`, partial ? "Keep looking →" : "Next page →", { rel: "next" }) : null),
    ];
  });
  put(main, results);
};

// Workflow: tree, timeline, explain -------------------------------------------------------

const CHILDREN_SHOWN = 50;

function treeNode(node, tasks, at) {
  const p = node.p;
  const t = tasks[p.id];
  const took = p.settledAt ? duration(p.settledAt - p.createdAt) : `pending ${duration(at - p.createdAt)}`;
  const line = h(
    "div",
    { class: "node" },
    promiseLink(p.id),
    state(p.state),
    h("span", { class: "muted" }, kindOf(p)),
    functionOf(p) ? h("span", { class: "fn" }, functionOf(p)) : null,
    h("span", {}, took),
    p.tags?.["resonate:timer"] === "true" ? h("span", {}, "until ", when(p.timeoutAt)) : null,
    t ? h("span", {}, "task ", state(t.state), ` v${t.version}`, t.pid ? ` pid ${t.pid}` : "") : null,
  );
  const li = h("li", {}, line);
  if (node.children.length) {
    const ul = h("ul", {});
    const show = (from) => {
      node.children.slice(from, from + CHILDREN_SHOWN).forEach((c) => ul.append(treeNode(c, tasks, at)));
      const rest = node.children.length - from - CHILDREN_SHOWN;
      if (rest > 0) {
        const more = h("li", {}, h("button", { type: "button", onclick: () => { more.remove(); show(from + CHILDREN_SHOWN); } }, `Show ${Math.min(rest, CHILDREN_SHOWN)} more of ${rest}`));
        ul.append(more);
      }
    };
    show(0);
    li.append(ul);
  }
  return li;
}

function buildTree(answer) {
  const nodes = new Map(answer.promises.map((p) => [p.id, { p, children: [] }]));
  const root = nodes.get(answer.id);
  if (!root) return null;
  for (const [id, n] of nodes) {
    if (id === answer.id) continue;
    const parent = nodes.get(n.p.tags?.["resonate:parent"]);
    (parent && parent !== n ? parent : root).children.push(n);
  }
  for (const n of nodes.values()) n.children.sort((a, b) => a.p.createdAt - b.p.createdAt || (a.p.id < b.p.id ? -1 : 1));
  return root;
}

function groupOf(address) {
  const m = /^poll:\/\/[^@]*@(.+)$/.exec(address || "");
  return m ? m[1] : null;
}

/** Evidence as links: promises, tasks' deliveries, worker groups. */
function evidence(ev) {
  const out = [];
  if (ev.group) out.push(h("span", {}, "group ", link(`#/workers?group=${encodeURIComponent(ev.group)}`, ev.group)));
  if (ev.task?.id) out.push(h("span", {}, "task ", link(`#/task/${encodeURIComponent(ev.task.id)}`, `${ev.task.id}`), ev.task.state ? [" ", state(ev.task.state)] : null));
  if (Array.isArray(ev.executes) && ev.executes.length) {
    const r = ev.executes[0];
    out.push(h("span", {}, `${ev.executes.length} execute(s) to ${r.address}, last `, state(r.state), r.lastCode ? ` (code ${r.lastCode})` : "", " — ", link(`#/delivery?task=${encodeURIComponent(r.taskId)}`, "delivery history")));
  }
  if (ev.parent) out.push(h("span", {}, "parent ", promiseLink(ev.parent)));
  if (ev.timeoutAt && ev.timeoutAt < 8e15) out.push(h("span", {}, "times out ", when(ev.timeoutAt)));
  return out.length ? h("div", { class: "muted" }, out.map((e, i) => [i ? " · " : "", e])) : null;
}

function finding(f) {
  return h(
    "li",
    { class: "finding", "data-reason": f.reason },
    h("div", { class: "node" }, promiseLink(f.id), state(f.state), h("span", { class: "reason" }, f.reason), f.function ? h("span", { class: "fn" }, f.function) : null),
    h("span", { class: "text" }, f.text),
    evidence(f.evidence || {}),
    f.awaiting?.length ? h("ul", {}, f.awaiting.map(finding)) : null,
  );
}

function explainBody(x) {
  return [
    x.done ? h("p", {}, "Done: ", state(x.root.state)) : h("div", {}, h("h3", {}, "Held back by"), h("ul", { class: "blockers" }, x.blockers.map((b) => h("li", { "data-reason": b.reason }, promiseLink(b.id), " ", h("span", { class: "reason muted" }, b.reason), ": ", h("span", { class: "text" }, b.text))))),
    h("details", { open: !x.done }, h("summary", {}, "Every finding"), h("ul", { class: "tree explain" }, finding(x.root))),
    x.cut ? h("p", { class: "muted" }, "(the walk was cut: the workflow is larger than explain reads)") : null,
  ];
}

const EVENTS_SHOWN = 200;

/** One timeline row's time: recorded, or said not to be (placed after what preceded it). */
function eventTime(e) {
  return e.at !== null && e.at !== undefined ? when(e.at) : h("span", { class: "muted" }, "not recorded");
}

function eventSubject(e) {
  if (e.kind === "promise") return promiseLink(e.id);
  return link(`#/task/${encodeURIComponent(e.id)}`, `task ${e.id}`);
}

/** Promise and task events of a workflow, oldest first (GET /ops/timeline). */
function timeline(id, t, limit) {
  const more = new URLSearchParams({ events: String(Math.min(limit * 5, 20000)) });
  return [
    t.total > t.events.length
      ? h("p", { class: "muted" }, `the last ${t.events.length} of ${t.total} events — `, link(`#/workflow/${encodeURIComponent(id)}?${more}`, "show more"))
      : null,
    h("p", { class: "muted" }, "Times the store does not record (when a task was acquired, suspended or released) are marked so; such an event sits after the last one that must have come before it."),
    table(
      ["at", "what", "event", "version", "pid", "details"],
      t.events.map((e) => [
        eventTime(e),
        eventSubject(e),
        e.kind === "promise" && e.event !== "created" ? state(e.event) : h("span", { class: `event event-${e.kind}` }, e.event),
        e.version !== undefined ? `v${e.version}` : "",
        e.pid ?? "",
        [e.text, e.state ? [" ", state(e.state)] : null, e.row !== undefined ? [" · ", link(`#/delivery?task=${encodeURIComponent(e.id)}`, `row ${e.row}`)] : null],
      ]),
      "No events.",
    ),
    t.cut ? h("p", { class: "muted" }, "(the workflow is larger than a timeline reads: its first promises only)") : null,
  ];
}

/** What a cancel did, in a line. */
function cancelSummary(a) {
  if (!a.canceled && !a.settledMeanwhile) return `Nothing to cancel: no promise of workflow ${a.id} was pending.`;
  let text = `Canceled ${plural(a.canceled, "promise", "promises")} of workflow ${a.id}`;
  if (a.settledMeanwhile) text += `; ${plural(a.settledMeanwhile, "was", "were")} settled meanwhile by someone else`;
  if (a.pendingLeft) text += `; ${plural(a.pendingLeft, "promise is", "promises are")} still pending (the workflow kept growing): cancel again`;
  return `${text}.`;
}

/** POST /ops/cancel for the workflow rooted at ``id``, after a confirmation that takes
 * an optional reason; the view is drawn again with the outcome, or says the refusal. */
async function cancelWorkflow(id) {
  const reason = await confirmAction(
    `Cancel workflow ${id}? Every promise of it still pending — the root and each promise tagged resonate:origin = ${id} — is settled rejected_canceled, the root first. Their tasks end: a worker holding one is refused at its next step. This cannot be undone.`,
    { reason: true, okLabel: "Cancel workflow", noLabel: "Back" },
  );
  if (reason === null) return;
  say("Canceling…");
  const r = await opsAction("cancel", { id, reason: reason.trim() || undefined });
  if (!r.ok) {
    say(refusal(r), true);
    return;
  }
  flash = cancelSummary(r.body);
  route();
}

/** The button that cancels the workflow rooted at ``id`` (any root: the cancel is
 * idempotent, so a finished tree answers that nothing was pending). */
function cancelWorkflowButton(id) {
  const button = h("button", { type: "button", class: "danger", "data-action": "cancel-workflow", onclick: () => busy(button, () => cancelWorkflow(id)) }, "Cancel workflow…");
  return button;
}

views.workflow = async (main, id, q) => {
  const actions = h("div", { class: "actions" });
  put(main, 
    h("h1", {}, "Workflow ", h("span", { class: "fn" }, id)),
    h("p", {}, link(`#/promise/${encodeURIComponent(id)}`, "Promise and task details"), " · ", link(`#/workflows?tags=${encodeURIComponent(`resonate:origin=${id}`)}`, "its promises as a list")),
    actions,
    actionResult(),
    later("Why is it not done?", async () => explainBody(await ops("explain", { id }))),
  );
  const tree = await ops("tree", { id, limit: 1000 });
  const root = buildTree(tree);
  const origin = root?.p.tags?.["resonate:origin"];
  if (root && (!origin || origin === id)) put(actions, cancelWorkflowButton(id));
  put(main, 
    section("Call graph", root ? h("ul", { class: "tree call-graph" }, treeNode(root, tree.tasks, tree.now)) : h("p", { class: "muted" }, "No such promise."), tree.cut ? h("p", { class: "muted" }, "(cut at 1000 promises)") : null),
  );
  const limit = Number(q.get("events")) || EVENTS_SHOWN;
  put(main, h("section", { id: "timeline" }, h("h2", {}, "Timeline"), timeline(id, await ops("timeline", { id, limit }), limit)));
};

// Promise and task -------------------------------------------------------------------------

function outboxTable(rows) {
  return table(
    ["id", "kind", "state", "attempts", "last code", "address", "for", "created", "next attempt / updated"],
    rows.map((r) => [
      String(r.id),
      r.kind,
      state(r.state),
      String(r.attempts),
      r.lastCode ?? "—",
      r.address,
      r.taskId ? link(`#/task/${encodeURIComponent(r.taskId)}`, `task ${r.taskId} v${r.version}`) : r.promiseId ? promiseLink(r.promiseId) : "—",
      when(r.createdAt),
      r.state === "pending" ? when(r.availableAt) : when(r.updatedAt),
    ]),
    "No deliveries.",
  );
}

async function settle(p, how) {
  const names = { resolved: "Resolve", rejected: "Reject", rejected_canceled: "Cancel" };
  const value = await confirmAction(`${names[how]} promise ${p.id}? This settles it for good, through POST / like any client.`, { value: how !== "rejected_canceled", okLabel: names[how] });
  if (value === null) return false;
  let data;
  if (value.trim()) {
    try {
      JSON.parse(value);
    } catch (e) {
      alert(`Not JSON: ${e.message}`);
      return false;
    }
    data = b64encode(value);
  }
  const r = await proto("promise.settle", { id: p.id, state: how, value: { headers: {}, data } });
  flash = r.status === 200 ? `${names[how]}d: now ${r.data.promise.state}` : `Refused: ${r.status} ${JSON.stringify(r.data)}`;
  return true;
}

views.promise = async (main, id) => {
  const { promise: p, task: t } = await ops("promise", { id });
  put(main, h("h1", {}, "Promise ", h("span", { class: "fn" }, id)));
  if (!p) {
    put(main, h("p", {}, "No such promise."));
    return;
  }
  const origin = p.tags?.["resonate:origin"];
  const settles = p.state === "pending"
    ? [["resolved", "Resolve…"], ["rejected", "Reject…"], ["rejected_canceled", "Cancel…"]].map(([how, label]) =>
        h("button", { type: "button", class: how === "resolved" ? "" : "danger", "data-action": how, onclick: async () => { if (await settle(p, how)) route(); } }, label))
    : [];
  // A workflow's root (its origin tag names itself) can be cancelled whole from here too.
  const whole = origin === id ? [cancelWorkflowButton(id)] : [];
  put(main, 
    h("p", {}, state(p.state), " ", link(`#/workflow/${encodeURIComponent(origin || id)}`, origin && origin !== id ? `workflow ${origin}` : "workflow view and explain")),
    settles.length || whole.length ? h("div", { class: "actions" }, settles, whole) : null,
    actionResult(),
    fields([
      ["id", p.id],
      ["state", state(p.state)],
      ["created", when(p.createdAt)],
      ["settled", p.settledAt ? when(p.settledAt) : "—"],
      ["times out", p.timeoutAt > 8e15 ? "never" : when(p.timeoutAt)],
      ["kind", kindOf(p)],
      ["function", functionOf(p) ?? "—"],
    ]),
    section("Tags", table(["key", "value"], Object.entries(p.tags || {}).map(([k, v]) => [k, k === "resonate:origin" || k === "resonate:parent" ? promiseLink(v) : v]), "No tags.")),
    section("Param", h("div", { class: "param" }, showValue(p.param))),
    section("Value", h("div", { class: "value" }, showValue(p.value))),
    section("Who waits for it", fields([
      ["callbacks (awaiting promises)", (p.callbacks || []).length ? (p.callbacks || []).map((c, i) => [i ? ", " : "", promiseLink(c)]) : "none"],
      ["listeners (addresses)", (p.listeners || []).length ? p.listeners.join(", ") : "none"],
    ])),
  );
  const taskBox = h("section", { id: "task" }, h("h2", {}, "Task"));
  if (!t) put(taskBox, h("p", { class: "muted" }, "No task: nothing runs this promise on a worker."));
  else {
    put(taskBox, 
      fields([
        ["state", state(t.state)],
        ["version", String(t.version)],
        ["holder pid", t.pid ?? "—"],
        ["lease ttl", t.ttl !== undefined ? `${t.ttl} ms` : "—"],
        ["lease expires", t.expiresAt ? when(t.expiresAt) : "—"],
        ["next execute", t.retryAt ? when(t.retryAt) : "—"],
        ["resumes", (t.resumes || []).length ? t.resumes.map((r, i) => [i ? ", " : "", promiseLink(r)]) : "none"],
      ]),
      h("h3", {}, "Delivery history"),
      later(null, async () => outboxTable((await ops("outbox", { task: id, limit: 50 })).rows)),
    );
  }
  put(main, taskBox);
};

views.task = async (main, id) => {
  await views.promise(main, id);
  $("#task")?.scrollIntoView();
};

// Delivery, workers, schedules -----------------------------------------------------------------

const ROW_STATES = ["pending", "dispatching", "completed", "failed", "outcome_unknown"];

/** What a retry did, in a line. */
function retrySummary(a) {
  let text = a.retried
    ? `Retried ${plural(a.retried, "delivery", "deliveries")}: pending again, due now, attempts starting over`
    : "No delivery was retried";
  if (a.newer) text += `; ${plural(a.newer, "was", "were")} no longer failed or had a newer message (skipped)`;
  if (a.taskNotPending) text += `; ${plural(a.taskNotPending, "was", "were")} for a task no longer pending (skipped)`;
  return `${text}.`;
}

/** POST /ops/outbox/retry: a dry run first, whose count the confirmation shows, then the
 * retry itself; the view is drawn again with the outcome, or says the refusal. */
async function retryFailed() {
  say("Counting failed deliveries…");
  const dry = await opsAction("outbox/retry", { dryRun: true });
  if (!dry.ok) {
    say(refusal(dry), true);
    return;
  }
  const d = dry.body;
  const wanted = d.matched - d.taskNotPending;
  const skipped = d.taskNotPending ? ` (${plural(d.taskNotPending, "more is", "more are")} skipped: the task is no longer pending)` : "";
  if (wanted <= 0) {
    say(`No failed delivery to retry${skipped}.`);
    return;
  }
  say("");
  const ok = await confirmAction(
    `Retry ${wanted === 1 ? "the 1 delivery" : `all ${plural(wanted, "delivery", "deliveries")}`} that failed for good${skipped}? Each is made pending again, due at once, with its attempts starting over. To retry only some, by target or by time, use troth outbox retry with --target or --since.`,
    { okLabel: "Retry", noLabel: "Back" },
  );
  if (ok === null) return;
  say("Retrying…");
  const r = await opsAction("outbox/retry", {});
  if (!r.ok) {
    say(refusal(r), true);
    return;
  }
  flash = retrySummary(r.body);
  route();
}

views.delivery = async (main, _arg, q) => {
  const st = q.get("state") || "";
  const task = q.get("task") || "";
  const retry = h("button", { type: "button", "data-action": "retry-failed", onclick: () => busy(retry, retryFailed) }, "Retry failed deliveries…");
  put(main, 
    h("h1", {}, "Delivery"),
    h("div", { class: "actions" }, retry),
    actionResult(),
    h("form", { class: "search", onsubmit: (e) => { e.preventDefault(); const p = new URLSearchParams([...new FormData(e.target)].filter(([, v]) => v)); location.hash = `#/delivery${p.size ? "?" + p : ""}`; } },
      h("label", {}, "State", h("select", { name: "state" }, h("option", { value: "" }, "any"), ROW_STATES.map((s) => h("option", { value: s, selected: s === st }, s)))),
      h("label", {}, "Task", h("input", { name: "task", value: task, autocomplete: "off" })),
      h("button", { type: "submit" }, "Show")),
  );
  const r = await ops("outbox", { state: st, task, before: q.get("before"), limit: PAGE });
  const nextQ = new URLSearchParams(q);
  nextQ.set("before", r.next ?? "");
  put(main, outboxTable(r.rows), h("div", { class: "pager" }, q.get("before") ? link(`#/delivery?${new URLSearchParams([...q].filter(([k]) => k !== "before"))}`, "← Newest") : null, r.next ? link(`#/delivery?${nextQ}`, "Older →", { rel: "next" }) : null));
};

function workersBody(w, only) {
  return [groupsTable(w, only), ...nodesBody(w)];
}

function groupsTable(w, only) {
  const groups = only ? w.groups.filter((g) => g.group === only) : w.groups;
  return table(
    ["group", "connected workers (pid · node · since)", "last seen"],
    groups.map((g) => [
      g.group,
      g.connections.length ? h("ul", {}, g.connections.map((c) => h("li", {}, `${c.pid} · ${c.node} · `, when(c.since)))) : h("span", { class: "error" }, "none connected"),
      g.connections.length ? "now" : when(g.lastSeen),
    ]),
    only ? `No worker of group ${only} has been seen (since this node started, on SQLite).` : "No worker group seen yet.",
  );
}

function nodesBody(w) {
  return [
    h("h3", {}, "Nodes"),
    table(["node", "url", "release", "schema", "started", "heartbeat", "alive"], w.nodes.map((n) => [n.node, n.url, n.release || "older", String(n.schema ?? "—"), when(n.startedAt), when(n.seenAt), n.alive ? "yes" : h("span", { class: "error" }, "no")]), "—"),
  ];
}

/** Concurrency, rate and per-key limits (GET /ops/limits): each group's slots in use
 * of its limit, its rate, its cap per troth:key, and the tasks held. Held while every slot is in use is shown as
 * an error. A cap a limit does not have shows as a dash. */
function limitsBody(limits, only) {
  const shown = only ? limits.filter((l) => l.group === only) : limits;
  return table(
    ["group", "concurrency", "rate", "per key", "in use", "held"],
    shown.map((l) => {
      const capped = l.concurrency != null;
      const full = capped && l.inUse >= l.concurrency;
      const use = [h("span", { "data-col": "inUse" }, l.inUse.toLocaleString("en"))];
      if (capped) {
        use.push(h("meter", { min: 0, max: l.concurrency, value: Math.min(l.inUse, l.concurrency), "aria-label": `${l.inUse} of ${l.concurrency} slots in use` }));
      }
      return [
        link(`#/workers?group=${encodeURIComponent(l.group)}`, l.group),
        h("span", { "data-col": "concurrency" }, capped ? l.concurrency.toLocaleString("en") : "—"),
        h("span", { "data-col": "rate", title: l.rate != null ? `a bucket of ${l.burst}` : null }, l.rate != null ? `${l.rate.toLocaleString("en")}/s` : "—"),
        h("span", { "data-col": "perKey", title: l.perKey != null ? "tasks of one troth:key at once" : null }, l.perKey != null ? l.perKey.toLocaleString("en") : "—"),
        h("span", { class: "use" }, ...use),
        h("span", { "data-col": "held", class: l.held > 0 && full ? "error" : null, title: l.held > 0 && full ? "every slot is in use: these tasks wait" : null }, l.held.toLocaleString("en")),
      ];
    }),
    only ? `Group ${only} has no limit.` : "No limits: every group runs as many tasks as its workers take (troth limits set GROUP --concurrency N or --rate R/s).",
  );
}

const LIMITS_EVERY = 5000;

views.workers = async (main, _arg, q) => {
  const group = q.get("group");
  const [w, l] = await Promise.all([ops("workers"), ops("limits")]);
  const limitsBox = h("div", { id: "limits", class: "limits" }, limitsBody(l.limits, group));
  put(main,
    h("h1", {}, group ? `Workers of group ${group}` : "Workers"),
    group ? h("p", {}, link("#/workers", "All groups")) : null,
    groupsTable(w, group),
    h("h3", {}, "Concurrency limits"),
    limitsBox,
    ...nodesBody(w),
  );
  // The limits move as tasks start and end: read again while the page is open.
  timers.push(setInterval(() => {
    ops("limits")
      .then((r) => limitsBox.replaceChildren(limitsBody(r.limits, group)))
      .catch((e) => (e instanceof AuthNeeded ? login() : null));
  }, LIMITS_EVERY));
};

views.schedules = async (main, _arg, q) => {
  put(main, h("h1", {}, "Schedules"), actionResult());
  const r = await proto("schedule.search", { limit: PAGE, cursor: q.get("cursor") || undefined });
  if (r.status !== 200) throw new Error(`schedule.search answered ${r.status}`);
  // A run's promise id is ~{schedule id}/{the template, expanded}: the latest runs are
  // the last ids under that prefix (their timestamps sort as their ids do).
  const runsPrefix = (s) => `~${s.id}/`;
  const latest = await Promise.all(r.data.schedules.map((s) => ops("promises", { prefix: runsPrefix(s), order: "desc", limit: 3 })));
  put(main, 
    table(
      ["id", "cron", "promise id", "next run", "last run", "latest runs", ""],
      r.data.schedules.map((s, i) => [
        s.id,
        h("code", {}, s.cron),
        s.promiseId,
        when(s.nextRunAt),
        s.lastRunAt ? when(s.lastRunAt) : "never",
        h("div", {},
          latest[i].promises.length
            ? h("ul", { class: "runs" }, latest[i].promises.map((p) => h("li", {}, link(`#/workflow/${encodeURIComponent(p.id)}`, p.id), " ", state(p.state))))
            : h("span", { class: "muted" }, "none yet"),
          link(`#/workflows?prefix=${encodeURIComponent(runsPrefix(s))}`, "all runs")),
        h("button", { type: "button", class: "danger", "data-action": "delete", onclick: async () => {
          if ((await confirmAction(`Delete schedule ${s.id}? No more runs will be created (existing promises stay).`, { okLabel: "Delete" })) === null) return;
          const d = await proto("schedule.delete", { id: s.id });
          flash = d.status === 200 ? `Deleted ${s.id}` : `Refused: ${d.status} ${JSON.stringify(d.data)}`;
          route();
        } }, "Delete…"),
      ]),
      "No schedules.",
    ),
    r.data.cursor ? link(`#/schedules?cursor=${encodeURIComponent(r.data.cursor)}`, "Next page →", { rel: "next" }) : null,
  );
};

// Login -----------------------------------------------------------------------------------------

function login(message) {
  const main = $("#view");
  timers.forEach(clearInterval);
  timers = [];
  main.replaceChildren(
    h("section", { class: "login" },
      h("h1", {}, "Sign in"),
      h("p", {}, "This troth has auth on: its dashboard needs an admin token (", h("code", {}, "troth token --role admin"), "). It is kept in this tab's sessionStorage and sent with each request; closing the tab forgets it."),
      message ? h("p", { class: "error" }, message) : null,
      h("form", { class: "search", onsubmit: (e) => { e.preventDefault(); sessionStorage.setItem(TOKEN_KEY, new FormData(e.target).get("token").trim()); route(); } },
        h("label", {}, "Admin token", h("input", { name: "token", type: "password", autocomplete: "off", required: true, size: 40 })),
        h("button", { type: "submit" }, "Sign in"))),
  );
  main.querySelector("input").focus();
}

// Router ----------------------------------------------------------------------------------------

const ROUTES = { "": "overview", workflows: "workflows", workflow: "workflow", promise: "promise", task: "task", delivery: "delivery", workers: "workers", schedules: "schedules" };

/** Render the view the hash names. After a navigation (not the first load) focus
 * moves to the new view's heading, so keyboard and screen-reader users land on it. */
async function route(moveFocus = false) {
  timers.forEach(clearInterval);
  timers = [];
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?", 2);
  const [first, ...rest] = path.split("/");
  const name = ROUTES[first] ?? null;
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  const main = $("#view");
  main.replaceChildren();
  $("#signout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  for (const a of document.querySelectorAll("nav a")) {
    const target = a.getAttribute("href").replace(/^#\/?/, "");
    a.toggleAttribute("aria-current", target === (first === "workflow" ? "workflows" : first));
    if (a.hasAttribute("aria-current")) a.setAttribute("aria-current", "page");
  }
  if (!name) {
    put(main, h("h1", {}, "Not found"), h("p", {}, link("#/", "Overview")));
    return;
  }
  document.title = `${arg ? arg + " · " : ""}${name} · troth`;
  try {
    await views[name](main, arg, new URLSearchParams(query));
    main.dataset.ready = name;
  } catch (e) {
    if (e instanceof AuthNeeded) login(sessionStorage.getItem(TOKEN_KEY) ? "That token was refused (it must be a valid admin token)." : null);
    else put(main, h("p", { class: "error", role: "alert" }, String(e.message || e)));
  }
  const heading = main.querySelector("h1");
  if (heading && moveFocus === true) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}

$("#signout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
});
window.addEventListener("hashchange", () => route(true));
route();

/** The footer names the build this server runs (release, schema, protocol), read from
 * GET /health, which needs no token. */
fetch("/health")
  .then((r) => r.json())
  .then((b) => { $("#about").textContent = `troth ${b.version} · schema ${b.schema} · protocol ${b.protocol}`; })
  .catch(() => {});
