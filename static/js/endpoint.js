// One endpoint: its facts and status, desired replicas (− / +), routes with
// their health and live traffic, requests/s and p95 charts (uPlot, from npm),
// the history of every scale, failure and health change with its reason, a
// "try it" box that calls the router URL with a token, tokens and rules.
// Refreshed every 2 s. Test hooks: window.endpointReady, window.tryResult.

import { api, badge, el, fmtMem, fmtStamp, pageNotices } from "./common.js";
import { describeRule, ruleFromForm } from "./rules.js";
import { confirmDialog } from "./dialogs.js";

const $ = (id) => document.getElementById(id);
const id = JSON.parse($("endpoint-id").textContent);
let ep = null;
let scalingTo = null; // the replica count asked with − / +, until the routes reach it
const charts = {};

const { say, fail } = pageNotices();

function facts(e) {
  const rows = [
    ["URL", el("code.ep-url", { "data-role": "url" }, e.url)],
    ["Callers", e.open_to_public ? "anyone (no token)" : "with a token of this endpoint"],
    ["Image", el("span.mono", {}, e.image)],
    ["Model folder", e.model_folder ? `${e.model_folder} (read-only)` : "none"],
    ["Start command", startCommand(e)],
    ["Replicas", `${e.replicas} wanted · min ${e.min_replicas} · max ${e.max_replicas}`],
    ["Per replica", `${e.resources.cpu ?? "?"} CPU · ${e.resources.mem === undefined ? "?" : fmtMem(e.resources.mem)} memory · port ${e.port} · health ${e.health_path}`],
    ["Resource group", e.resource_group],
  ];
  $("ep-facts").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function startCommand(e) {
  if (e.start_command) return el("code", {}, e.start_command);
  if (!e.effective_start_command) return "none: the image has no serving command of its own";
  return el("span", {}, el("code", {}, e.effective_start_command), el("span.muted", {}, " (the image's default)"));
}

// A figure, or "—" alone when there is none (never "— ms").
function figure(v, { digits = 1, unit = "" } = {}) {
  if (v === undefined || v === null || Number.isNaN(+v)) return "—";
  return `${(+v).toFixed(digits)}${unit}`;
}

function routes(e, snapshot) {
  const per = (snapshot && snapshot.routes) || {};
  $("routes-body").replaceChildren(
    ...e.routes.map((r) => {
      const m = per[r.id] || per[String(r.id)] || {};
      return el(
        "tr",
        { dataset: { id: r.id, status: r.status } },
        el("td", {}, `#${r.id}`),
        el("td", {}, r.session_id ? el("a.mono", { href: `/sessions/${r.session_id}/` }, r.session_id.slice(0, 8)) : "—"),
        el("td", {}, badge(r.status), r.health_reason ? el("span.reason", { "data-role": "health-reason" }, r.health_reason) : null),
        el("td.num", {}, (+r.traffic_ratio).toFixed(2)),
        el("td.num", {}, figure(m.rps)),
        el("td.num", { "data-role": "p95" }, figure(m.p95_ms, { unit: " ms" })),
        el("td.num", {}, figure(m.inflight, { digits: 0 })),
      );
    }),
  );
  const healthy = e.routes.filter((r) => r.status === "HEALTHY").length;
  $("routes-note").textContent = `${healthy} of ${e.routes.length} healthy`;
}

function chart(node, label, stroke, data) {
  const width = Math.max(240, node.clientWidth || node.parentElement.clientWidth - 10);
  if (!charts[node.id]) {
    charts[node.id] = new window.uPlot(
      { width, height: 160, legend: { show: false }, series: [{}, { label, stroke, width: 2, fill: `${stroke}22` }], axes: [{}, { size: 44 }] },
      data,
      node,
    );
  } else {
    charts[node.id].setData(data);
  }
}

function drawCharts(series) {
  const t = series.map((p) => p.t);
  chart($("chart-rps"), "req/s", "#4f46e5", [t, series.map((p) => p.rps ?? null)]);
  chart($("chart-p95"), "p95 ms", "#b45309", [t, series.map((p) => p.p95_ms ?? null)]);
}

function history(events) {
  $("history").replaceChildren(
    ...events.slice(0, 100).map((h) =>
      el("li", { dataset: { kind: h.kind } }, el("time", { datetime: h.created_at }, fmtStamp(h.created_at)), el("span.tag", {}, h.kind), el("span", {}, h.message)),
    ),
  );
}

function tokens(list) {
  $("tokens").replaceChildren(
    ...(list.length
      ? list.map((t) =>
          el(
            "li",
            { dataset: { id: t.id } },
            el("span.mono", {}, `${t.prefix}…`),
            el("span.muted", {}, ` made ${fmtStamp(t.created_at)}${t.expires_at ? `, expires ${fmtStamp(t.expires_at)}` : ""}`),
            el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "revoke", onclick: () => revokeToken(t) }, "Revoke"),
          ),
        )
      : [el("li.muted", {}, ep && ep.open_to_public ? "Callers need no token; you may still make some." : "No tokens: make one to call the endpoint.")]),
  );
}

function rules(list) {
  $("rules").replaceChildren(
    ...(list.length
      ? list.map((r) =>
          el(
            "li",
            { dataset: { id: r.id } },
            el("span", {}, describeRule(r)),
            el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "delete-rule", onclick: () => deleteRule(r) }, "Delete"),
          ),
        )
      : [el("li.muted", {}, "No rules: the replica count changes only when you change it.")]),
  );
}

async function refresh() {
  try {
    const [e, events, metrics, toks] = await Promise.all([
      api(`endpoints/${id}/`),
      api(`endpoints/${id}/history/`),
      api(`endpoints/${id}/metrics/`),
      api(`endpoints/${id}/tokens/`),
    ]);
    ep = e;
    document.title = `${e.name} · Serving · Backend.AI Web`;
    $("ep-name").textContent = e.name;
    $("crumb-name").textContent = e.name;
    $("ep-badge").replaceChildren(badge(e.status));
    $("ep-reason").textContent = e.status_reason || "";
    $("ep-replicas").textContent = String(e.replicas);
    $("scale-down").disabled = e.replicas <= e.min_replicas;
    $("scale-up").disabled = e.replicas >= e.max_replicas;
    facts(e);
    routes(e, metrics.snapshot);
    scalingProgress(e);
    drawCharts(metrics.series || []);
    history(events);
    tokens(toks);
    rules(e.rules || []);
  } catch (err) {
    fail(err.status === 404 ? "No such endpoint: it was deleted, or it is not yours." : err.message);
  }
  window.endpointReady = true;
}

// The "Scaling to N" note stays while the routes move, and goes once N replicas serve and no
// other is starting or ending (or once the count is changed again, by anyone).
function scalingProgress(e) {
  if (scalingTo === null) return;
  const healthy = e.routes.filter((r) => r.status === "HEALTHY").length;
  const moving = e.routes.filter((r) => ["PROVISIONING", "UNHEALTHY", "TERMINATING"].includes(r.status)).length;
  if (e.replicas !== scalingTo || (healthy === scalingTo && moving === 0)) {
    scalingTo = null;
    $("status").hidden = true;
    return;
  }
  say(`Scaling to ${scalingTo} replica(s): ${healthy} serving.`);
}

async function scale(delta) {
  const target = ep.replicas + delta;
  try {
    await api(`endpoints/${id}/scale/`, { method: "POST", body: { replicas: target } });
  } catch (err) {
    return fail(err.message);
  }
  scalingTo = target;
  say(`Scaling to ${target} replica(s).`);
  refresh();
}

async function revokeToken(t) {
  if (!(await confirmDialog({ title: `Revoke token ${t.prefix}…?`, message: "Callers using it are refused from now on.", action: "Revoke" }))) return;
  try {
    await api(`endpoints/${id}/tokens/${t.id}/`, { method: "DELETE" });
  } catch (err) {
    return fail(err.message);
  }
  $("token-new").hidden = true;
  refresh();
}

async function deleteRule(r) {
  try {
    await api(`endpoints/${id}/rules/${r.id}/`, { method: "DELETE" });
  } catch (err) {
    return fail(err.message);
  }
  refresh();
}

$("rule-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const rule = ruleFromForm(event.target.elements);
  $("rule-add").disabled = true;
  try {
    await api(`endpoints/${id}/rules/`, { method: "POST", body: rule });
  } catch (err) {
    return fail(err.message);
  } finally {
    $("rule-add").disabled = false;
  }
  refresh();
});

$("scale-down").addEventListener("click", () => scale(-1));
$("scale-up").addEventListener("click", () => scale(1));
$("ep-delete").addEventListener("click", async () => {
  if (!(await confirmDialog({ title: `Delete endpoint ${ep.name}?`, message: "Its replicas are terminated and its URL stops answering.", action: "Delete" }))) return;
  try {
    await api(`endpoints/${id}/`, { method: "DELETE" });
  } catch (err) {
    return fail(err.message);
  }
  location.assign("/serving/");
});

$("token-create").addEventListener("click", async () => {
  let answer;
  try {
    answer = await api(`endpoints/${id}/tokens/`, { method: "POST", body: {} });
  } catch (err) {
    return fail(err.message);
  }
  $("token-plain").textContent = answer.token;
  $("token-new").hidden = false;
  $("try-token").value = answer.token;
  refresh();
});

$("try-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const method = $("try-method").value;
  const path = $("try-path").value.trim().replace(/^\/*/, "/");
  const headers = { Accept: "application/json" };
  const token = $("try-token").value.trim();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (method !== "GET") headers["Content-Type"] = "application/json";
  const started = performance.now();
  $("try-send").disabled = true;
  try {
    // Never the manager's cookies: the router takes the bearer token only.
    const response = await fetch(ep.url.replace(/\/$/, "") + path, { method, headers, body: method === "GET" ? undefined : $("try-body").value, credentials: "omit" });
    const text = await response.text();
    const ms = performance.now() - started;
    let shown = text;
    try { shown = JSON.stringify(JSON.parse(text), null, 2); } catch { /* not JSON: as it came */ }
    $("try-meta").textContent = `HTTP ${response.status} in ${ms.toFixed(0)} ms`;
    $("try-output").textContent = shown;
    window.tryResult = { status: response.status, text };
  } catch (err) {
    $("try-meta").textContent = "";
    $("try-output").textContent = `The request failed: ${err.message}`;
    window.tryResult = { status: 0, text: err.message };
  } finally {
    $("try-send").disabled = false;
  }
});

refresh();
setInterval(refresh, 2000);
