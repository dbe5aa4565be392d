// The web terminal: xterm.js (window.Terminal, from npm) over
// /ws/sessions/<id>/terminal/?term=<uuid>. The uuid lives in sessionStorage, so
// a reload or a reconnect in this tab re-attaches to the same shell (the agent
// keeps it 120 s after a disconnect). Resize follows the window (addon-fit).
//
// Test hooks: window.termReady (attached), window.termState {status, message},
// window.term (the xterm instance), window.termOutput (all text received).

import { liveSocket, readJSON } from "./common.js";

const session = readJSON("session-data");
const storageKey = `bai.term.${session.id}`;
let termId = sessionStorage.getItem(storageKey);
if (!termId) {
  termId = crypto.randomUUID ? crypto.randomUUID() : fallbackUUID();
  sessionStorage.setItem(storageKey, termId);
}

function fallbackUUID() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

const term = new window.Terminal({
  cursorBlink: true,
  fontFamily: 'ui-monospace, "SFMono-Regular", "JetBrains Mono", Menlo, Consolas, "Liberation Mono", monospace',
  fontSize: 14,
  scrollback: 10000,
  allowProposedApi: false,
  theme: { background: "#0b1020", foreground: "#e2e8f0", cursor: "#a5b4fc", selectionBackground: "#334155" },
});
const fit = new window.FitAddon.FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
term.focus();
window.term = term;
window.termReady = false;
window.termOutput = "";

const stateNode = document.getElementById("term-state");
const reconnectBtn = document.getElementById("term-reconnect");
function setState(kind, text) {
  stateNode.className = `stream-state ${kind}`;
  stateNode.querySelector("span").textContent = text;
  window.termState = { status: kind, message: text };
}

let ended = false;
const socket = liveSocket(
  () => `/ws/sessions/${session.id}/terminal/?term=${termId}&cols=${term.cols}&rows=${term.rows}`,
  {
    onOpen: () => setState("", "attaching…"),
    onMessage: (msg) => {
      if (msg.type === "output") {
        term.write(msg.data);
        if (window.termOutput.length < 1_000_000) window.termOutput += msg.data;
      } else if (msg.type === "ready") {
        window.termReady = true;
        reconnectBtn.hidden = true;
        setState("live", "connected to main1");
      } else if (msg.type === "closed") {
        ended = true;
        window.termReady = false;
        term.write(`\r\n\x1b[2m[the shell ended: ${msg.reason}]\x1b[0m\r\n`);
        setState("ended", "shell ended");
        reconnectBtn.hidden = false;
        reconnectBtn.textContent = "Start a new shell";
      } else if (msg.type === "error") {
        if (msg.code) return; // the close that follows says it
        term.write(`\r\n\x1b[31m[${msg.message}]\x1b[0m\r\n`);
      }
    },
    onClose: ({ code, error, final, retryIn }) => {
      window.termReady = false;
      if (error) {
        setState("error", error.message);
        term.write(`\r\n\x1b[31m[${error.message}]\x1b[0m\r\n`);
        if (code === 4409) {
          setState("", `${error.message} Retrying in ${Math.round(retryIn / 1000)} s…`);
          return;
        }
        reconnectBtn.hidden = code === 4410 || code === 4404;
        return;
      }
      if (ended || final) return;
      setState("", `disconnected; reconnecting in ${Math.max(1, Math.round(retryIn / 1000))} s…`);
      reconnectBtn.hidden = false;
      reconnectBtn.textContent = "Reconnect now";
    },
    // 4409 (not running yet) retries with backoff; the rest are final.
    finalCodes: [1000, 4400, 4401, 4403, 4404, 4410],
  },
);

term.onData((data) => {
  // Paste arrives here as one string; the server bounds one message's size.
  socket.send({ type: "input", data });
});

let resizeTimer = null;
function refit() {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    fit.fit();
  }, 60);
}
term.onResize(({ cols, rows }) => socket.send({ type: "resize", cols, rows }));
window.addEventListener("resize", refit);
new ResizeObserver(refit).observe(document.querySelector(".term-host"));

reconnectBtn.addEventListener("click", () => {
  ended = false;
  socket.reconnectNow();
  term.focus();
});
document.getElementById("term-end").addEventListener("click", () => {
  if (confirm("End this shell on the server? Anything running in it stops.")) socket.send({ type: "close" });
});
