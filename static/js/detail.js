// Session detail: kernels, event history, why it waits, time left (or, while
// it waits, the limits that will apply); live over /ws/sessions/ (a push about
// this session re-reads it from the API).
// Test hooks: window.wsReady, window.detailState (the session as last read).

import { api, badge, el, fmtAge, fmtDuration, fmtLimit, fmtSlots, fmtStamp, fmtTime, followSessions, isEnded, MODE_LABEL, readJSON, sessionAge } from "./common.js";
import { openLogs } from "./logs.js";
import { appButtons } from "./apps.js";
import { consoleFollows, startConsole } from "./console.js";
import { confirmDialog, noticeDialog } from "./dialogs.js";

let session = readJSON("session-data");
const $ = (id) => document.getElementById(id);

function kernelsForLogs() {
  return { ...session, kernels: session.kernels.map((k) => ({ hostname: k.cluster_hostname, status: k.status })) };
}

/** Per container as the kernels hold it: one line when all are alike, else
 * main1's and the subs' (a template's roles may give them their own). */
function perContainer(s) {
  const subs = s.kernels.filter((k) => k.cluster_role === "sub");
  const main = s.kernels.find((k) => k.cluster_role === "main");
  const mainText = fmtSlots(main ? main.requested_slots : s.resources);
  const subTexts = [...new Set(subs.map((k) => fmtSlots(k.requested_slots)))];
  if (!subs.length || (subTexts.length === 1 && subTexts[0] === mainText)) {
    return [el("span", { "data-role": "per-container" }, `${mainText} per container`)];
  }
  const hosts = subs.length === 1 ? "sub1" : `sub1–sub${subs.length}`;
  return [
    el("span.role-line", { "data-role": "main" }, el("span.role", {}, "main1"), " ", mainText),
    el("span.role-line", { "data-role": "sub" }, el("span.role", {}, hosts), " ", subTexts.join(" / "), subs.length > 1 ? " each" : ""),
  ];
}

function countdown(iso, label) {
  if (!iso) return null;
  return el("span.countdown", { "data-deadline": iso, "data-label": label }, "");
}

// Deadlines already re-read once they came due (activity elsewhere, a terminal or an
// app, may have moved them; the page asks the server rather than guess).
const dueAsked = new Set();

function tickCountdowns() {
  document.querySelectorAll("[data-age]").forEach((node) => { node.textContent = fmtAge(node.dataset.age); });
  document.querySelectorAll("[data-deadline]").forEach((node) => {
    const left = (Date.parse(node.dataset.deadline) - Date.now()) / 1000;
    if (left <= 0 && !dueAsked.has(node.dataset.deadline)) {
      dueAsked.add(node.dataset.deadline);
      refetch();
    }
    node.textContent = left > 0 ? `${fmtDuration(left)} left` : "due now";
    node.title = `${node.dataset.label} at ${fmtTime(node.dataset.deadline)}`;
    node.classList.toggle("soon", left < 300);
  });
}

function fact(dl, name, ...value) {
  dl.append(el("dt", {}, name), el("dd", {}, ...value));
}

function ageFact(dl, s) {
  const age = sessionAge(s);
  if (!age.ended) {
    fact(dl, "Age", el("span", { "data-age": s.created_at, id: "d-age" }, fmtAge(s.created_at)));
    return;
  }
  fact(dl, "Age", el("span", { id: "d-age", "data-ended": "" }, fmtDuration(age.seconds)),
    el("span.sub", {}, age.ran === null ? "ended before it ran" : `ran for ${fmtDuration(age.ran)}`));
}

/**
 * One time limit: the countdown once it runs; before that, what will apply
 * (limits come from the API's `limits`, in seconds; null: none).
 */
function limitFact(dl, name, deadline, limit, { none, when }) {
  let value;
  if (deadline) value = countdown(deadline, name);
  else if (limit !== null && limit !== undefined) value = el("span", { "data-limit": name }, fmtLimit(limit), el("span.sub", {}, when));
  else value = el("span.muted", {}, none);
  fact(dl, name, value);
}

function dependencyLinks(s) {
  const deps = s.dependencies || s.depends_on.map((id) => ({ id, name: id.slice(0, 8) }));
  return deps.map((d, i) => [
    i ? ", " : "",
    el("a", { href: `/sessions/${d.id}/`, title: d.id }, d.name),
    d.status ? el("span.muted", {}, ` (${d.result && d.result !== "UNDEFINED" ? d.result : d.status.toLowerCase()})`) : null,
  ]);
}

function render() {
  const s = session;
  window.detailState = s;
  document.title = `${s.name} · Backend.AI Web`;
  $("d-badge").replaceChildren(badge(s.status), s.result && s.result !== "UNDEFINED" ? el(`span.result.result-${s.result}`, {}, s.result) : "");
  const waiting = s.status === "PENDING";
  $("d-reason").textContent = waiting ? "" : s.status_reason || "";
  $("d-waiting").hidden = !waiting;
  $("d-waiting-reason").textContent = s.status_reason || "waiting for the scheduler";
  $("d-terminate").disabled = isEnded(s.status);
  const term = $("d-terminal");
  term.classList.toggle("disabled", s.status !== "RUNNING");
  term.setAttribute("aria-disabled", s.status !== "RUNNING" ? "true" : "false");
  term.title = s.status === "RUNNING" ? "Open a shell in main1" : "Available while the session runs";
  const launcher = $("d-apps");
  const appsKey = s.status === "RUNNING" ? (s.apps || []).map((a) => a.name).join(",") : "";
  // Rebuilt only when the apps change, so a button busy launching keeps its progress.
  if (launcher.dataset.apps !== appsKey) {
    launcher.dataset.apps = appsKey;
    launcher.replaceChildren(...appButtons(s));
  }

  consoleFollows(s);

  const facts = $("d-facts");
  facts.replaceChildren();
  fact(facts, "Session ID", el("span.mono", {}, s.id));
  fact(facts, "Owner", s.owner);
  fact(facts, "Type", s.type);
  fact(facts, "Image", el("span.mono", {}, s.image));
  fact(facts, "Resource group", s.resource_group);
  fact(facts, "Cluster", `${MODE_LABEL[s.cluster_mode] || s.cluster_mode} · ${s.cluster_size} container${s.cluster_size === 1 ? "" : "s"}`);
  fact(facts, "Resources", ...perContainer(s), s.kernels.length > 1 ? el("span.sub", { id: "d-total" }, `${fmtSlots(s.total_resources)} in total`) : null);
  fact(facts, "Data folders", s.mounts && s.mounts.length ? s.mounts.map((m) => `/home/work/${m}`).join(", ") : el("span.muted", {}, "none"));
  const envKeys = Object.keys(s.env || {});
  fact(facts, "Environment", envKeys.length ? el("span.mono", {}, envKeys.join(", ")) : el("span.muted", {}, "none"));
  if (s.startup_command) fact(facts, "Start command", el("code", {}, s.startup_command));
  if (s.depends_on && s.depends_on.length) fact(facts, "Depends on", ...dependencyLinks(s).flat());
  if (s.exit_code !== null && s.exit_code !== undefined) fact(facts, "Exit code", String(s.exit_code));

  const times = $("d-time");
  times.replaceChildren();
  fact(times, "Created", fmtTime(s.created_at));
  ageFact(times, s);
  fact(times, "Scheduled", fmtTime(s.scheduled_at));
  fact(times, "Started", fmtTime(s.started_at));
  if (s.terminated_at) fact(times, "Ended", fmtTime(s.terminated_at));
  fact(times, "Last activity", fmtTime(s.last_activity_at));
  if (!isEnded(s.status)) {
    const limits = s.limits || {};
    if (s.type === "interactive") {
      limitFact(times, "Idle timeout", s.idle_deadline, limits.idle_timeout, { none: "none", when: "without activity, once it runs" });
    }
    limitFact(times, "Lifetime limit", s.lifetime_deadline, limits.max_session_lifetime, { none: "unlimited", when: "from its start" });
    if (s.type === "batch") {
      limitFact(times, "Batch timeout", s.batch_deadline, limits.batch_timeout, { none: "none", when: "from its start command" });
    }
  }
  tickCountdowns();

  $("d-kernels").replaceChildren(...s.kernels.map((k) =>
    el("tr", { "data-host": k.cluster_hostname },
      el("td", {}, el("b.mono", {}, k.cluster_hostname)),
      el("td", {}, k.cluster_role),
      el("td", {}, badge(k.status), k.status_reason && k.status_reason.toUpperCase() !== k.status ? el("span.reason", {}, k.status_reason) : null),
      el("td", {}, k.agent ? el("span.mono", {}, k.agent) : el("span.muted", {}, "not placed")),
      el("td", {}, k.container_id ? el("span.mono", { title: k.container_id }, k.container_id.slice(0, 12)) : el("span.muted", {}, "—")),
      el("td", {}, fmtSlots(k.requested_slots)),
      el("td.actions", {}, el("button.btn.btn-xs", { type: "button", onclick: () => openLogs(kernelsForLogs(), k.cluster_hostname) }, "Logs")),
    )));

  const events = s.events || [];
  $("d-events-count").textContent = `${events.length} event${events.length === 1 ? "" : "s"}`;
  $("d-events").replaceChildren(...events.slice().reverse().map((e) =>
    el("li", {},
      el("time", { datetime: e.time, title: fmtTime(e.time) }, fmtStamp(e.time)),
      el("span.who", {}, e.kernel || "session"),
      el("span.what", {}, e.from_status && e.from_status !== e.to_status ? el("span", {}, badge(e.from_status), el("span.arrow", {}, " → ")) : null, badge(e.to_status), el("span.why", {}, e.reason)),
    )));
}

let refetchTimer = null;
function refetch() {
  clearTimeout(refetchTimer);
  refetchTimer = setTimeout(async () => {
    try {
      session = await api(`sessions/${session.id}/`);
      render();
    } catch (err) {
      $("d-reason").textContent = err.message;
    }
  }, 120);
}

$("d-logs").addEventListener("click", () => openLogs(kernelsForLogs()));
$("d-terminal").addEventListener("click", (e) => {
  if (session.status !== "RUNNING") e.preventDefault();
});
$("d-terminate").addEventListener("click", async () => {
  if (!(await confirmDialog({ title: `Terminate ${session.name}?`, message: "Its containers are destroyed and anything running in them stops. Its logs and history stay.", action: "Terminate" }))) return;
  try {
    session = await api(`sessions/${session.id}/terminate/`, { method: "POST", body: {} });
    render();
  } catch (err) {
    await noticeDialog("Could not terminate", err.message);
  }
});

startConsole(session, { onActivity: refetch });
render();
setInterval(tickCountdowns, 1000);
followSessions((items) => {
  const mine = items.filter((i) => i.id === session.id);
  if (!mine.length) return;
  for (const item of mine) {
    if (item.kernel) {
      const k = session.kernels.find((k) => k.cluster_hostname === item.kernel);
      if (k) { k.status = item.status; k.status_reason = item.reason; }
    } else {
      session.status = item.status;
      session.status_reason = item.reason;
    }
  }
  render();
  refetch(); // events, timestamps, containers
});
