// The sessions list: rendered from json_script data, kept live by /ws/sessions/.
// Test hooks: window.wsReady (socket open), window.sessionsById (the table's state).

import { api, badge, el, fmtAge, fmtDuration, fmtSlots, fmtTime, followSessions, isEnded, MODE_LABEL, readJSON, sessionAge } from "./common.js";
import { initLaunch, openLaunch, onSessionChange as launchProgress } from "./launch.js";
import { openLogs } from "./logs.js";
import { appButtons } from "./apps.js";
import { confirmDialog, noticeDialog } from "./dialogs.js";

const page = readJSON("page-data");
const sessions = new Map(readJSON("sessions-data").map((s) => [s.id, s]));
window.sessionsById = sessions;
let filter = "active";
let query = "";

function matches(s) {
  if (filter === "active" && isEnded(s.status)) return false;
  if (filter === "ended" && !isEnded(s.status)) return false;
  if (!query) return true;
  const hay = `${s.name} ${s.image} ${s.resource_group} ${s.type} ${s.owner}`.toLowerCase();
  return hay.includes(query);
}

function actions(s) {
  const ended = isEnded(s.status);
  return el("td.actions", {},
    el("a.btn.btn-xs", { href: `/sessions/${s.id}/`, "data-action": "open" }, "Open"),
    el("button.btn.btn-xs", { type: "button", "data-action": "logs", onclick: () => openLogs(s) }, "Logs"),
    s.status === "RUNNING"
      ? el("a.btn.btn-xs", { href: `/sessions/${s.id}/terminal/`, target: "_blank", rel: "noopener", "data-action": "terminal" }, "Terminal")
      : el("button.btn.btn-xs", { type: "button", disabled: true, title: "Available while running" }, "Terminal"),
    appButtons(s, { small: true }),
    el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "terminate", disabled: ended, onclick: () => terminate(s) }, "Terminate"),
  );
}

function ageCell(s) {
  const age = sessionAge(s);
  if (!age.ended) return el("td.age", { title: `Created ${fmtTime(s.created_at)}`, "data-age": s.created_at }, fmtAge(s.created_at));
  // Ended: the age stops at the end, with how long it ran.
  return el("td.age", { title: `Created ${fmtTime(s.created_at)}, ended ${fmtTime(new Date(age.end).toISOString())}`, "data-ended": "" },
    fmtDuration(age.seconds),
    el("span.sub", {}, age.ran === null ? "never ran" : `ran ${fmtDuration(age.ran)}`));
}

function row(s) {
  const kernels = s.kernels && s.kernels.length > 1
    ? el("div.kchips", {}, s.kernels.map((k) => el(`span.kchip.s-${k.status}`, { title: `${k.hostname}: ${k.status}` }, el("i"), k.hostname)))
    : null;
  return el("tr", { "data-id": s.id, "data-status": s.status },
    el("td.name-cell", {},
      el("a", { href: `/sessions/${s.id}/` }, s.name),
      el("span.sub", {}, el("span.type-tag", {}, s.type), " ", el("span.id", {}, s.id.slice(0, 8)), page.showAll ? ` · ${s.owner}` : ""),
    ),
    el("td", {},
      badge(s.status),
      s.result && s.result !== "UNDEFINED" ? el(`span.result.result-${s.result}`, {}, s.result) : null,
      s.status_reason && s.status_reason.toUpperCase() !== s.status ? el("span.reason", { "data-role": "reason" }, s.status_reason) : null,
    ),
    el("td", {}, MODE_LABEL[s.cluster_mode] || s.cluster_mode, el("span.sub", {}, `${s.cluster_size} container${s.cluster_size === 1 ? "" : "s"}`), kernels),
    el("td", {}, fmtSlots(s.resources)),
    el("td", {}, el("span.mono", {}, s.image)),
    el("td", {}, s.resource_group),
    ageCell(s),
    actions(s),
  );
}

function render() {
  const body = document.getElementById("sessions-body");
  const list = [...sessions.values()].sort((a, b) => b.created_at.localeCompare(a.created_at));
  const shown = list.filter(matches);
  body.replaceChildren(...shown.map(row));
  document.getElementById("sessions-empty").hidden = shown.length > 0;
  const count = (pred) => list.filter(pred).length;
  const stats = {
    running: count((s) => s.status === "RUNNING"),
    starting: count((s) => ["SCHEDULED", "PREPARING", "PULLING"].includes(s.status)),
    pending: count((s) => s.status === "PENDING"),
    ended: count((s) => isEnded(s.status)),
  };
  for (const [k, v] of Object.entries(stats)) document.querySelector(`[data-stat="${k}"]`).textContent = v;
}

function flash(id) {
  const tr = document.querySelector(`tr[data-id="${id}"]`);
  if (tr) tr.classList.add("row-flash");
}

async function terminate(s) {
  if (!(await confirmDialog({ title: `Terminate ${s.name}?`, message: "Its containers are destroyed and anything running in them stops. Its logs and history stay.", action: "Terminate" }))) return;
  try {
    const data = await api(`sessions/${s.id}/terminate/`, { method: "POST", body: {} });
    upsert(toRow(data));
  } catch (err) {
    await noticeDialog("Could not terminate", err.message);
  }
}

function toRow(d) {
  return {
    id: d.id, name: d.name, owner: d.owner, type: d.type, status: d.status, status_reason: d.status_reason,
    result: d.result, cluster_mode: d.cluster_mode, cluster_size: d.cluster_size, resources: d.resources,
    image: d.image, resource_group: d.resource_group, created_at: d.created_at,
    started_at: d.started_at, terminated_at: d.terminated_at, apps: d.apps || [],
    kernels: (d.kernels || []).map((k) => ({ hostname: k.cluster_hostname, status: k.status, role: k.cluster_role })),
  };
}

function upsert(s) {
  sessions.set(s.id, s);
  render();
  flash(s.id);
}

const fetching = new Set();
const refetch = new Set(); // a push came while its fetch was in flight: that answer may be older
async function fetchOne(id) {
  if (fetching.has(id)) { refetch.add(id); return; }
  fetching.add(id);
  try {
    upsert(toRow(await api(`sessions/${id}/`)));
  } catch {
    /* not ours (admin view of all) or gone: ignore */
  } finally {
    fetching.delete(id);
    if (refetch.delete(id)) fetchOne(id);
  }
}

function onChange(items) {
  let changed = false;
  for (const item of items) {
    launchProgress(item);
    const s = sessions.get(item.id);
    if (!s) { fetchOne(item.id); continue; }
    if (item.kernel) {
      const k = (s.kernels || []).find((k) => k.hostname === item.kernel);
      if (k) k.status = item.status;
    } else {
      s.status = item.status;
      s.status_reason = item.reason;
      if (isEnded(item.status)) {
        if (!s.terminated_at && !s.endedSeenAt) s.endedSeenAt = new Date().toISOString();
        fetchOne(item.id); // result, exit code and end time
      }
    }
    changed = true;
  }
  if (changed) {
    render();
    for (const item of items) if (!item.kernel) flash(item.id);
  }
}

document.getElementById("filter").addEventListener("click", (e) => {
  const btn = e.target.closest("button[data-filter]");
  if (!btn) return;
  filter = btn.dataset.filter;
  document.querySelectorAll("#filter button").forEach((b) => {
    b.classList.toggle("on", b === btn);
    b.setAttribute("aria-pressed", b === btn ? "true" : "false");
  });
  render();
});
document.getElementById("search").addEventListener("input", (e) => { query = e.target.value.trim().toLowerCase(); render(); });
document.getElementById("launch-open").addEventListener("click", () => openLaunch());
setInterval(() => document.querySelectorAll("[data-age]").forEach((td) => { td.textContent = fmtAge(td.dataset.age); }), 5000);

initLaunch({
  sessions: () => [...sessions.values()],
  // The creation response is the oldest state there is: a push about this session
  // may have arrived first and fetched a newer one, which it must not overwrite.
  onCreated: (detail) => (sessions.has(detail.id) ? flash(detail.id) : upsert(toRow(detail))),
});
render();
followSessions(onChange);
if (page.openLaunch) openLaunch({ template: page.template });
