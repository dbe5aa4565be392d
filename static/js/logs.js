// The logs modal: one tab per container, each streamed live over
// /ws/sessions/<id>/kernels/<hostname>/logs/. Pause keeps receiving (and shows
// it on resume); Download saves what was received. A tab says "no output yet"
// until its first chunk arrives ("no output" once its container has ended).
//
// Test hooks: window.logsReady (the stream of the shown tab is open and has said
// what it is), window.logsState {kernel, live, ended, chars}.

import { api, badge, el, liveSocket, wireDialog } from "./common.js";

const MAX_SHOWN = 2_000_000; // characters kept in the view; the download has everything

let dialog;
let current = null; // {session, hostname, socket, received: [], pending: [], paused}

function setState(kind, text) {
  const node = document.getElementById("logs-state");
  node.className = `stream-state ${kind}`;
  node.querySelector("span").textContent = text;
}

function publish(extra = {}) {
  const chars = current ? current.chars : 0;
  window.logsState = { ...(window.logsState || {}), kernel: current && current.hostname, chars, ...extra };
}

function flush() {
  if (!current || current.paused || !current.pending.length) return;
  const view = document.getElementById("logs-view");
  const stick = view.scrollTop + view.clientHeight >= view.scrollHeight - 24;
  const text = current.pending.join("");
  current.pending = [];
  const placeholder = view.querySelector(".placeholder");
  if (placeholder) placeholder.remove();
  view.append(text);
  current.shown += text.length;
  if (current.shown > MAX_SHOWN) {
    view.textContent = view.textContent.slice(-MAX_SHOWN / 2);
    current.shown = view.textContent.length;
  }
  if (stick) view.scrollTop = view.scrollHeight;
}

function scheduleFlush() {
  if (current && !current.flushQueued) {
    current.flushQueued = true;
    requestAnimationFrame(() => { if (current) { current.flushQueued = false; flush(); } });
  }
}

function noOutputYet(view) {
  view.append(el("span.placeholder", { "data-role": "no-output" }, "no output yet\n"));
}

/** The stream will bring nothing more: an empty tab says so for good. */
function noMoreOutput() {
  const placeholder = document.querySelector("#logs-view .placeholder");
  if (placeholder) placeholder.textContent = "no output\n";
}

function note(text) {
  const view = document.getElementById("logs-view");
  view.append(el("span.sys", {}, `— ${text} —\n`));
}

function stopCurrent() {
  if (current && current.socket) current.socket.stop();
  window.logsReady = false;
}

function showTab(hostname) {
  stopCurrent();
  const session = current.session;
  document.querySelectorAll("#logs-tabs button").forEach((b) => {
    const on = b.dataset.host === hostname;
    b.classList.toggle("on", on);
    b.setAttribute("aria-selected", on ? "true" : "false");
    b.tabIndex = on ? 0 : -1; // one tab stop for the tab list; arrows move within it
  });
  const view = document.getElementById("logs-view");
  view.setAttribute("aria-labelledby", `logs-tab-${hostname}`);
  view.textContent = "";
  noOutputYet(view);
  Object.assign(current, { hostname, received: [], pending: [], chars: 0, shown: 0, paused: false, ended: false });
  document.getElementById("logs-pause").textContent = "Pause";
  setState("", "connecting…");
  publish({ live: false, ended: false });
  const mine = current;
  current.socket = liveSocket(`/ws/sessions/${session.id}/kernels/${encodeURIComponent(hostname)}/logs/`, {
    onMessage: (msg) => {
      if (current !== mine || mine.hostname !== hostname) return;
      if (msg.type === "state") {
        mine.live = msg.live;
        setState(msg.live ? "live" : "ended", msg.live ? `following ${hostname} live` : msg.message);
        if (!msg.live) { noMoreOutput(); note(msg.message); }
        window.logsReady = true;
        publish({ live: msg.live, status: msg.status, message: msg.message });
      } else if (msg.type === "chunk") {
        mine.received.push(msg.data);
        mine.pending.push(msg.data);
        mine.chars += msg.data.length;
        publish();
        scheduleFlush();
      } else if (msg.type === "ended") {
        mine.ended = true;
        flush();
        noMoreOutput();
        note(`${hostname} ended (${msg.status}${msg.reason ? ": " + msg.reason : ""})`);
        setState("ended", `${hostname} ended`);
        publish({ ended: true, status: msg.status });
      } else if (msg.type === "error") {
        setState("error", msg.message);
        publish({ error: msg.message });
      }
    },
    onClose: ({ final, error, retryIn }) => {
      if (current !== mine) return;
      if (error) { window.logsReady = false; setState("error", error.message); note(error.message); return; }
      // A kept tail (or an ended kernel) closes normally: what is shown stays valid.
      if (mine.ended || final || mine.live === false) return;
      window.logsReady = false;
      setState("", `disconnected; retrying in ${Math.round(retryIn / 1000)} s`);
    },
    // A kept tail closes normally: do not reconnect for it.
    finalCodes: [1000, 4400, 4401, 4403, 4404, 4410],
  });
}

function togglePause() {
  if (!current) return;
  current.paused = !current.paused;
  document.getElementById("logs-pause").textContent = current.paused ? "Resume" : "Pause";
  if (current.paused) setState("paused", `paused — still receiving`);
  else {
    setState(current.ended ? "ended" : current.live ? "live" : "ended", current.live && !current.ended ? `following ${current.hostname} live` : `${current.hostname} ended`);
    flush();
  }
  publish({ paused: current.paused });
}

async function download() {
  if (!current) return;
  let text = current.received.join("");
  if (!text) {
    // Nothing streamed (e.g. an ended kernel before any output): fetch the kept tail.
    try {
      const data = await api(`sessions/${current.session.id}/kernels/${current.hostname}/logs/`);
      text = data.log || "";
    } catch (err) {
      setState("error", err.message);
      return;
    }
  }
  const blob = new Blob([text], { type: "text/plain;charset=utf-8" });
  const link = el("a", { href: URL.createObjectURL(blob), download: `${current.session.name}-${current.hostname}.log` });
  document.body.append(link);
  link.click();
  setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
}

function init() {
  if (dialog) return;
  dialog = document.getElementById("logs-modal");
  wireDialog(dialog, () => { stopCurrent(); current = null; });
  document.getElementById("logs-pause").addEventListener("click", togglePause);
  document.getElementById("logs-download").addEventListener("click", download);
  document.getElementById("logs-tabs").addEventListener("keydown", onTabKey);
  document.getElementById("logs-wrap").addEventListener("change", (e) => {
    document.getElementById("logs-view").classList.toggle("wrap", e.target.checked);
  });
}

/** Arrow keys, Home and End move between the tabs and show the one reached. */
function onTabKey(event) {
  const tabs = [...document.querySelectorAll("#logs-tabs button")];
  const at = tabs.indexOf(document.activeElement);
  if (at < 0) return;
  const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const tab = tabs[(to + tabs.length) % tabs.length];
  tab.focus();
  if (tab.dataset.host !== current.hostname) showTab(tab.dataset.host);
}

/** Open the modal for `session` ({id, name, kernels: [{hostname, status}]}). */
export function openLogs(session, hostname) {
  init();
  const kernels = session.kernels && session.kernels.length ? session.kernels : [{ hostname: "main1", status: session.status }];
  document.getElementById("logs-title").textContent = `Logs · ${session.name}`;
  const sub = document.getElementById("logs-subtitle");
  sub.textContent = "";
  sub.append(badge(session.status), ` ${kernels.length} container${kernels.length === 1 ? "" : "s"}`);
  const tabs = document.getElementById("logs-tabs");
  tabs.textContent = "";
  for (const k of kernels) {
    tabs.append(
      el("button", {
        type: "button", role: "tab", id: `logs-tab-${k.hostname}`, "aria-controls": "logs-view",
        dataset: { host: k.hostname }, onclick: () => showTab(k.hostname),
      }, el(`i.s-${k.status}`, { "aria-hidden": "true" }), k.hostname),
    );
  }
  current = { session };
  if (!dialog.open) dialog.showModal();
  showTab(hostname || kernels[0].hostname);
}
