// The web terminal: xterm.js (window.Terminal, from npm) over
// /ws/sessions/<id>/terminal/?term=<uuid>. The uuid lives in sessionStorage, so
// a reload or a reconnect in this tab re-attaches to the same shell (the agent
// keeps it 120 s after a disconnect). Resize follows the window (addon-fit).
// Selecting text copies it to the clipboard; A−/A+ change the text size, which
// this browser remembers.
//
// Test hooks: window.termReady (attached), window.termState {status, message},
// window.term (the xterm instance), window.termOutput (all text received),
// window.termCopied (the text last copied on select).

import { liveSocket, readJSON } from "./common.js";
import { confirmDialog } from "./dialogs.js";

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

const FONT_SIZES = [10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24];
const FONT_KEY = "bai.term.fontSize";
const storedSize = Number(localStorage.getItem(FONT_KEY));

const term = new window.Terminal({
  cursorBlink: true,
  fontFamily: 'ui-monospace, "SFMono-Regular", "JetBrains Mono", Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace',
  fontSize: FONT_SIZES.includes(storedSize) ? storedSize : 14,
  // With a cell exactly as tall as the font (lineHeight 1), the row's box cuts
  // off what a font draws below its descent: at 1x pixel density and some sizes
  // underscores vanish (BACKENDAI_CLUSTER_HOST reads "BACKENDAI CLUSTER HOST").
  // A fifth more height leaves room for them at every size offered here.
  lineHeight: 1.2,
  // Programs choose their colours; xterm lightens any that would be hard to read here.
  minimumContrastRatio: 4.5,
  scrollback: 10000,
  allowProposedApi: false,
  theme: {
    background: "#0b1020", foreground: "#e2e8f0", cursor: "#a5b4fc", selectionBackground: "#334155",
    // The 16 ANSI colours, each readable on the background (>= 4.5:1); "black" is a grey.
    black: "#8893a5", red: "#f87171", green: "#4ade80", yellow: "#facc15",
    blue: "#60a5fa", magenta: "#e879f9", cyan: "#22d3ee", white: "#e2e8f0",
    brightBlack: "#a0abbd", brightRed: "#fca5a5", brightGreen: "#86efac", brightYellow: "#fde68a",
    brightBlue: "#93c5fd", brightMagenta: "#f0abfc", brightCyan: "#67e8f9", brightWhite: "#f8fafc",
  },
});
const fit = new window.FitAddon.FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
term.focus();
window.term = term;
window.termReady = false;
window.termOutput = "";
window.termCopied = null;

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
        term.write(`\r\n\x1b[90m[the shell ended: ${msg.reason}]\x1b[0m\r\n`);
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
          setState("", `${error.message} Retrying in ${Math.max(1, Math.round(retryIn / 1000))} s…`);
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

// --- copy on select ----------------------------------------------------------

const note = document.getElementById("term-note");
let noteTimer = null;
function say(text) {
  note.textContent = text;
  clearTimeout(noteTimer);
  noteTimer = setTimeout(() => { note.textContent = ""; }, 2500);
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Plain http on another host has no Clipboard API: the older copy command.
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "visually-hidden";
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  term.focus();
  if (!ok) throw new Error("the browser refused");
}

// The selection changes with every mouse move of a drag: copy once it settles.
let copyTimer = null;
term.onSelectionChange(() => {
  clearTimeout(copyTimer);
  copyTimer = setTimeout(async () => {
    const text = term.getSelection();
    if (!text) return;
    try {
      await copyText(text);
      window.termCopied = text;
      say(`Copied ${text.length} character${text.length === 1 ? "" : "s"}`);
    } catch (err) {
      say(`Could not copy: ${err.message}`);
    }
  }, 120);
});

// --- text size ------------------------------------------------------------------

const sizeOut = document.getElementById("term-size");
const smaller = document.getElementById("term-smaller");
const larger = document.getElementById("term-larger");
function showSize() {
  const size = term.options.fontSize;
  sizeOut.textContent = `${size} px`;
  smaller.disabled = size <= FONT_SIZES[0];
  larger.disabled = size >= FONT_SIZES[FONT_SIZES.length - 1];
}
function stepSize(direction) {
  const at = FONT_SIZES.indexOf(term.options.fontSize);
  const next = FONT_SIZES[Math.min(FONT_SIZES.length - 1, Math.max(0, (at < 0 ? 4 : at) + direction))];
  term.options.fontSize = next;
  localStorage.setItem(FONT_KEY, String(next));
  showSize();
  fit.fit(); // new cell size: new cols and rows, which onResize sends to the shell
}
smaller.addEventListener("click", () => stepSize(-1));
larger.addEventListener("click", () => stepSize(+1));
showSize();

reconnectBtn.addEventListener("click", () => {
  ended = false;
  socket.reconnectNow();
  term.focus();
});
document.getElementById("term-end").addEventListener("click", async () => {
  if (await confirmDialog({ title: "End this shell?", message: "The shell ends on the server; anything running in it stops.", action: "End shell" })) socket.send({ type: "close" });
});
