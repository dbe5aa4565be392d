// The code console of a session's detail page: code runs in main1's interpreter
// (a Jupyter kernel) over /ws/sessions/<id>/execute/, its records stream in as they
// come, an input() prompt gets a line to answer, Interrupt stops a run, and the
// session's run history (who, when, mode, how it ended) is listed below.
//
// Output is never put into the page as markup: text goes in as text, images as
// data: URLs of an <img>, and text/html in a sandboxed frame (no scripts, an origin
// of its own), so nothing a kernel prints can act as the manager's page.
// Test hooks: window.consoleReady (socket open), window.consoleState.

import { api, el, fmtStamp, fmtTime, liveSocket } from "./common.js";

const $ = (id) => document.getElementById(id);
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;
const MAX_NODES = 2000; // records kept on screen; older ones scroll away

// running: a run is going (its id once the first answer names it, else "…").
const state = { running: null, waiting: false, socket: null, sessionId: null, onActivity: () => {} };
window.consoleState = state;

function setBusy(runId) {
  state.running = runId;
  $("c-run").disabled = !!runId || !state.socket;
  $("c-interrupt").disabled = !runId;
  $("c-status").textContent = runId ? `running ${runId}…` : "";
}

function output(node) {
  const out = $("c-output");
  out.append(node);
  while (out.childElementCount > MAX_NODES) out.firstElementChild.remove();
  out.scrollTop = out.scrollHeight;
}

function textRecord(kind, text) {
  const last = $("c-output").lastElementChild;
  if (last && last.dataset.kind === kind && last.tagName === "PRE") {
    last.textContent += text;
    return;
  }
  output(el(`pre.rec.rec-${kind}`, { "data-kind": kind }, text));
}

function richRecord(record) {
  const { mime, data } = record;
  if (mime === "image/png") {
    output(el("img.rec.rec-image", { src: `data:image/png;base64,${data}`, alt: "image output", "data-kind": record.kind }));
  } else if (mime === "image/svg+xml") {
    output(el("img.rec.rec-image", { src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(data)}`, alt: "image output", "data-kind": record.kind }));
  } else if (mime === "text/html") {
    const frame = el("iframe.rec.rec-html", { sandbox: "", title: "HTML output", "data-kind": record.kind });
    frame.srcdoc = data;
    output(frame);
  } else {
    textRecord("result", data.endsWith("\n") ? data : `${data}\n`);
  }
}

function showRecords(records) {
  for (const r of records || []) {
    if (r.kind === "result" || r.kind === "display") richRecord(r);
    else textRecord(r.kind, (r.data || "").replace(ANSI, ""));
  }
}

function askInput() {
  state.waiting = true;
  const box = $("c-input");
  box.hidden = false;
  box.querySelector("input").value = "";
  box.querySelector("input").focus();
}

function onResult(msg) {
  if (msg.status === "waiting-input") {
    askInput();
    return;
  }
  if (msg.status === "continued") { // another page (this one reloaded, say) follows the run now
    if (state.running) output(el("p.rec.rec-end", { "data-kind": "moved" }, `${msg.run_id}: followed in another page`));
    $("c-input").hidden = true;
    state.waiting = false;
    setBusy(null);
    return;
  }
  if (!state.running) return; // the run's end is shown already (an interrupt's answer repeats it)
  const code = msg.exit_code === null || msg.exit_code === undefined ? "" : ` (exit code ${msg.exit_code})`;
  const ended = !msg.error ? msg.status : msg.error === "KeyboardInterrupt" ? "interrupted" : `error: ${msg.error}`;
  output(el(`p.rec.rec-end.end-${msg.status}`, { "data-kind": "end" }, `${msg.run_id}: ${ended}${code}`));
  $("c-input").hidden = true;
  state.waiting = false;
  setBusy(null);
}

/** The run's id as the server named it ("" until then). */
const runId = () => (state.running && state.running !== "…" ? state.running : undefined);

/** A run that was going when the page opened (reloaded while it waited in input(), say). */
function onPending(msg) {
  output(el("p.rec.rec-end", { "data-kind": "pending" }, `${msg.run_id}: still going (started before this page opened)`));
  setBusy(msg.run_id);
}

function onMessage(msg) {
  if (msg.type === "pending") onPending(msg);
  if (state.running && msg.run_id) setBusy(msg.run_id);
  if (msg.type === "records") showRecords(msg.records);
  else if (msg.type === "result") onResult(msg);
  else if (msg.type === "history") loadHistory(); // the runs' rows are written
  else if (msg.type === "activity") state.onActivity(); // the session's last activity moved
  else if (msg.type === "error") {
    output(el("p.rec.rec-refused", { role: "alert", "data-kind": "refused" }, msg.message));
    if (state.running && !state.waiting) setBusy(null);
  }
}

function run() {
  const code = $("c-code").value;
  if (!code.trim() || state.running) return;
  if (!state.socket.send({ type: "run", mode: "query", code })) return;
  output(el("pre.rec.rec-code", { "data-kind": "code" }, code));
  setBusy("…");
}

function runKeys(event) {
  if (event.key === "Enter" && event.shiftKey) {
    event.preventDefault();
    run();
  }
}

async function loadHistory() {
  try {
    const page = await api(`sessions/${state.sessionId}/runs/`);
    const runs = page.results || page;
    $("c-history").replaceChildren(...runs.map((r) => el("tr", { "data-run": r.run_id },
      el("td", {}, el("time", { datetime: r.started_at, title: fmtTime(r.started_at) }, fmtStamp(r.started_at))),
      el("td", {}, r.user),
      el("td", {}, r.mode),
      el("td.mono", {}, r.run_id),
      el(r.error || r.exit_code || r.status === "exec-timeout" ? "td.outcome.failed" : "td.outcome", {}, r.outcome || r.status),
      el("td", {}, r.exit_code === null || r.exit_code === undefined ? "—" : String(r.exit_code)),
    )));
    $("c-history-empty").hidden = runs.length > 0;
  } catch (err) {
    $("c-history-empty").hidden = false;
    $("c-history-empty").textContent = err.message;
  }
}

/** Wire the console of session `s` (its panel is in detail.html); `onActivity`:
 * the server wrote this console's activity (the page re-reads the session's times). */
export function startConsole(s, { onActivity } = {}) {
  state.sessionId = s.id;
  if (onActivity) state.onActivity = onActivity;
  const panel = $("console");
  if (!panel) return;
  loadHistory();
  if (s.type !== "interactive") {
    $("c-note").textContent = "Code runs in interactive sessions only; this is a batch session.";
    $("c-form").hidden = true;
    return;
  }
  $("c-code").addEventListener("keydown", runKeys);
  $("c-run").addEventListener("click", run);
  $("c-interrupt").addEventListener("click", () => state.socket.send({ type: "interrupt", run_id: runId() }));
  $("c-clear").addEventListener("click", () => $("c-output").replaceChildren());
  $("c-input").addEventListener("submit", (event) => {
    event.preventDefault();
    const line = $("c-input").querySelector("input").value;
    state.socket.send({ type: "input", run_id: runId(), code: line });
    textRecord("stdout", `${line}\n`);
    $("c-input").hidden = true;
    state.waiting = false;
  });
  connect(s);
}

function connect(s) {
  if (s.status !== "RUNNING" || state.socket) return;
  state.socket = liveSocket(`/ws/sessions/${s.id}/execute/`, {
    onOpen: (socket) => {
      // What goes on is the server's to say: the run going, if one is, comes back as "pending".
      $("c-input").hidden = true;
      state.waiting = false;
      setBusy(null);
      socket.send({ type: "attach" });
      window.consoleReady = true;
      $("c-note").textContent = "";
    },
    onMessage,
    onClose: ({ error, final }) => {
      window.consoleReady = false;
      if (final) {
        $("c-note").textContent = (error && error.message) || "The console is closed: the session is not running.";
        state.socket = null;
      }
      setBusy(null);
    },
  });
}

/** The session changed (status push): open the console once it runs, close it when it ends. */
export function consoleFollows(s) {
  if (!$("console") || s.type !== "interactive") return;
  if (s.status === "RUNNING") {
    connect(s);
    return;
  }
  if (state.socket) {
    state.socket.stop();
    state.socket = null;
    $("c-note").textContent = `The session is ${s.status.toLowerCase()}: code runs while it is running.`;
    setBusy(null);
    return;
  }
  $("c-note").textContent = `Code runs while the session is running (it is ${s.status.toLowerCase()}).`;
}
