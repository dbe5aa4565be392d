// Shared helpers of the pages: the REST API with CSRF, reconnecting websockets,
// formatting and small DOM builders. No framework.

export const ACTIVE = ["PENDING", "SCHEDULED", "PREPARING", "PULLING", "RUNNING", "TERMINATING"];
export const ENDED = ["TERMINATED", "ERROR", "CANCELLED"];
export const isEnded = (status) => ENDED.includes(status);

export function readJSON(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

/**
 * The CSRF token that writes to the API send (X-CSRFToken), as the page was given it
 * (base.html): the cookie's name differs under production settings ("__Host-csrftoken").
 */
export const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
    this.fields = (this.body.extra && this.body.extra.fields) || {};
  }
}

/** Call the REST API as the logged-in user; throws ApiError with the API's message. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  const response = await fetch(`/api/v1/${path}`, {
    method,
    headers,
    credentials: "same-origin",
    signal,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text.slice(0, 300) };
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export function wsURL(path) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

/**
 * A websocket that reconnects with exponential backoff (0.5 s … 15 s, jittered).
 * A close code in `finalCodes` (e.g. 4404, 4410) stops it; the server's JSON
 * error message that precedes such a close is passed to onClose.
 */
export function liveSocket(path, { onOpen, onMessage, onClose, finalCodes = [4400, 4401, 4403, 4404, 4410] } = {}) {
  let ws = null;
  let attempt = 0;
  let stopped = false;
  let lastError = null;
  let timer = null;
  const handle = {
    get socket() { return ws; },
    send(obj) {
      if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(obj)); return true; }
      return false;
    },
    stop() { stopped = true; clearTimeout(timer); if (ws) ws.close(1000); },
    reconnectNow() { stopped = false; attempt = 0; clearTimeout(timer); if (ws) ws.close(1000); connect(); },
  };
  const connect = () => {
    const url = typeof path === "function" ? path() : path;
    ws = new WebSocket(wsURL(url));
    const mine = ws;
    ws.onopen = () => { attempt = 0; lastError = null; onOpen && onOpen(handle); };
    ws.onmessage = (event) => {
      let msg;
      try { msg = JSON.parse(event.data); } catch { return; }
      if (msg.type === "error" && msg.code) lastError = msg;
      onMessage && onMessage(msg, handle);
    };
    ws.onclose = (event) => {
      if (mine !== ws) return;
      const final = stopped || finalCodes.includes(event.code);
      const retryIn = final ? null : Math.min(15000, 500 * 2 ** attempt) * (0.5 + Math.random() / 2);
      onClose && onClose({ code: event.code, error: lastError, final, retryIn }, handle);
      if (!final) {
        attempt += 1;
        timer = setTimeout(connect, retryIn);
      }
    };
  };
  connect();
  return handle;
}

// --- formatting -----------------------------------------------------------

const SIZE_LABELS = [["PiB", 2 ** 50], ["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

/**
 * A size as bai_common.units.format_size_shown writes it: in the largest binary unit it reaches,
 * exact when two decimal places say it exactly (2 GiB, 1.25 GiB), else to one place, half up
 * (23.5 GiB, 195.3 KiB).
 */
export function fmtMem(bytes) {
  const n = Number(bytes);
  if (!isFinite(n)) return String(bytes);
  if (n < 0) return `-${fmtMem(-n)}`;
  for (const [unit, size] of SIZE_LABELS) {
    if (n < size) continue;
    if (Number.isInteger(((n % size) * 100) / size)) return `${+(n / size).toFixed(2)} ${unit}`;
    const tenths = Math.floor((n * 10 + size / 2) / size);
    return `${Math.floor(tenths / 10)}.${tenths % 10} ${unit}`;
  }
  return `${n} B`;
}

const SIZE_UNITS = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40, p: 2 ** 50 };

/** Bytes from a size as the server reads it (bai_common.units.parse_size): 1024, "512m", "1.5GiB"; else null. */
export function parseSize(value) {
  if (value === undefined || value === null || value === "") return null;
  if (typeof value === "number") return Number.isFinite(value) && value >= 0 ? Math.round(value) : null;
  const m = String(value).trim().match(/^(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:i?b)?|b)?$/i);
  if (!m) return null;
  return Math.round(Number(m[1]) * SIZE_UNITS[(m[2] || "").toLowerCase()]);
}

/** The shortest exact text for a size in bytes: 2147483648 → "2g", 805306368 → "768m". */
export function sizeText(bytes) {
  for (const unit of ["p", "t", "g", "m", "k"]) {
    if (bytes >= SIZE_UNITS[unit] && bytes % SIZE_UNITS[unit] === 0) return `${bytes / SIZE_UNITS[unit]}${unit}`;
  }
  return String(bytes);
}

/** Slots added up: a + b × n (missing slots count as 0). */
export function addSlots(a, b, n = 1) {
  const out = { ...a };
  for (const [k, v] of Object.entries(b || {})) out[k] = +((Number(out[k]) || 0) + Number(v) * n).toFixed(6);
  return out;
}

export function fmtSlots(slots) {
  if (!slots) return "";
  const parts = [];
  if (slots.cpu !== undefined) parts.push(`${+slots.cpu} CPU`);
  if (slots.mem !== undefined) parts.push(fmtMem(slots.mem));
  for (const [k, v] of Object.entries(slots)) {
    if (k === "cpu" || k === "mem" || !Number(v)) continue;
    parts.push(`${+v} ${k === "cuda.device" ? "GPU" : k}`);
  }
  return parts.join(" · ");
}

const DURATION_UNITS = { d: 86400, day: 86400, days: 86400, h: 3600, hr: 3600, hrs: 3600, hour: 3600, hours: 3600, m: 60, min: 60, mins: 60, minute: 60, minutes: 60, s: 1, sec: 1, secs: 1, second: 1, seconds: 1 };

/**
 * Seconds from a duration as the server reads it (bai_common.units.parse_duration):
 * "90" (a bare number is seconds), "30m", "2h", "1h30m", "1 d 2 h"; units largest
 * first, each once. Throws an Error saying how to write one.
 */
export function parseDuration(text) {
  const value = String(text).trim().toLowerCase();
  const junk = new Error(`“${String(text).trim()}” is not a duration: use e.g. 90s, 30m, 2h, 1h30m, 1d`);
  if (!value) throw junk;
  if (value.startsWith("-")) throw new Error("must not be negative");
  if (/^\d+(\.\d+)?$/.test(value)) return Number(value);
  const part = /(\d+(?:\.\d+)?)\s*([a-z]+)\s*/y;
  let total = 0;
  let lastSize = Infinity;
  while (part.lastIndex < value.length) {
    const m = part.exec(value);
    const size = m && DURATION_UNITS[m[2]];
    if (!size || size >= lastSize) throw junk;
    total += Number(m[1]) * size;
    lastSize = size;
  }
  return total;
}

/** The shortest text parseDuration reads back: 5400 → "1h30m", 90 → "1m30s". */
export function durationText(seconds) {
  let rest = Math.round(Number(seconds));
  if (!(rest > 0)) return String(seconds);
  let out = "";
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (rest >= size) { out += `${Math.floor(rest / size)}${unit}`; rest %= size; }
  }
  return out;
}

export function fmtDuration(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  const d = Math.floor(seconds / 86400);
  const h = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

export function fmtAge(iso) {
  return fmtDuration((Date.now() - Date.parse(iso)) / 1000);
}

/** A configured limit in words: 120 → "2 min", 5400 → "1 h 30 min", 86400 → "1 day". */
export function fmtLimit(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  const units = [[86400, (n) => `${n} day${n === 1 ? "" : "s"}`], [3600, (n) => `${n} h`], [60, (n) => `${n} min`], [1, (n) => `${n} s`]];
  const parts = [];
  for (const [size, word] of units) {
    if (seconds >= size && parts.length < 2) {
      parts.push(word(Math.floor(seconds / size)));
      seconds %= size;
    }
  }
  return parts.length ? parts.join(" ") : "0 s";
}

/**
 * How old a session is: counting while it lives, fixed at its end once it has
 * ended. {ended, seconds, ran} — `ran`: seconds from its start to its end
 * (null if it never started). An ended session whose end time has not been
 * read yet (a live push) is taken to have ended when the push arrived.
 */
export function sessionAge(s, now = Date.now()) {
  const ended = isEnded(s.status);
  const end = ended ? Date.parse(s.terminated_at || s.endedSeenAt || new Date(now).toISOString()) : now;
  const seconds = Math.max(0, (end - Date.parse(s.created_at)) / 1000);
  const ran = ended && s.started_at ? Math.max(0, (end - Date.parse(s.started_at)) / 1000) : null;
  return { ended, seconds, ran, end };
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

/** Compact: "Nov 22, 06:17:21" (the year only when it is not this year). */
export function fmtStamp(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  const opts = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false };
  if (d.getFullYear() !== new Date().getFullYear()) opts.year = "numeric";
  return d.toLocaleString(undefined, opts);
}

export const MODE_LABEL = { "single-node": "Single Node", "multi-node": "Multi Node" };

// --- DOM ------------------------------------------------------------------

/** el("a.btn.btn-sm", {href: "/x"}, "text", child…) */
export function el(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const node = document.createElement(tag || "div");
  if (classes.length) node.className = classes.join(" ");
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** The page's #status and #error lines: `say` shows the one, `fail` the other. */
export function pageNotices(statusId = "status", errorId = "error") {
  const status = document.getElementById(statusId);
  const error = document.getElementById(errorId);
  return {
    say(text) {
      error.hidden = true;
      status.textContent = text;
      status.hidden = false;
    },
    fail(text) {
      status.hidden = true;
      error.textContent = text;
      error.hidden = false;
    },
  };
}

export function badge(status) {
  return el(`span.badge.s-${status}`, { "data-status": status }, status);
}

export function setConnIndicator(on) {
  const node = document.getElementById("conn-indicator");
  if (!node) return;
  node.hidden = false;
  node.classList.toggle("on", on);
  node.querySelector("span").textContent = on ? "live" : "reconnecting…";
}

const FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]:not([tabindex='-1'])";

function focusableIn(root) {
  return [...root.querySelectorAll(FOCUSABLE)].filter(
    (node) => !node.disabled && !node.closest("[hidden]") && node.getClientRects().length > 0,
  );
}

/**
 * Wire a modal <dialog>: [data-close] buttons and backdrop clicks close it,
 * Escape closes it (the browser's own), and Tab and Shift+Tab cycle within it
 * instead of leaving for the browser's toolbar. The browser gives focus back
 * to what had it before the dialog opened.
 */
export function wireDialog(dialog, onClose) {
  dialog.addEventListener("click", (event) => {
    if (event.target.closest("[data-close]") || event.target === dialog) dialog.close();
  });
  dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Tab") return;
    const nodes = focusableIn(dialog);
    if (!nodes.length) return;
    const first = nodes[0];
    const last = nodes[nodes.length - 1];
    const radio = (node) => node.type === "radio" && document.activeElement.type === "radio" && node.name === document.activeElement.name;
    if (event.shiftKey && (document.activeElement === first || radio(first) || !dialog.contains(document.activeElement))) {
      event.preventDefault();
      last.focus();
    } else if (!event.shiftKey && (document.activeElement === last || radio(last))) {
      event.preventDefault();
      first.focus();
    }
  });
  dialog.addEventListener("close", () => onClose && onClose());
}

/** The user's sessions socket: one per page, calling `onChange(items)` for each push. */
export function followSessions(onChange) {
  window.wsReady = false;
  return liveSocket("/ws/sessions/", {
    onOpen: () => { window.wsReady = true; setConnIndicator(true); },
    onMessage: (msg) => { if (msg.type === "sessions.changed") onChange(msg.sessions); },
    onClose: () => { window.wsReady = false; setConnIndicator(false); },
  });
}
