// The launch dialog: a form over the launch spec, prefilled from templates,
// POSTed to /api/v1/sessions/; the API's field errors appear beside their
// fields. After launch it shows the start step by step, driven by the
// sessions websocket (the list page passes every push to onSessionChange),
// and its title follows the state.
//
// While the user edits, the spec goes (debounced) to /api/v1/sessions/preview/:
// the "Will it fit?" panel shows what is left of the user's quota, what the
// resource group has free now, and whether the session would start now, wait
// or never start (then Launch is disabled, with the reason). The preview's
// field errors appear beside a field once the user has changed it (or tried
// to launch), never before.
//
// Resource presets (/api/v1/presets/ for the chosen group) fill CPU, memory and
// GPUs; "Custom" is lit when the values match no preset.
//
// With a template whose roles give main1 or the sub kernels their own image or
// resources, the dialog lists the roles, and its total adds up the kernels as
// the launch will create them (main1 + sub × replicas). "Save as template"
// stores the dialog's current spec through /api/v1/templates/.
//
// Test hooks: window.launchReady (catalogue loaded), window.launchFit
// {pending, verdict, reason} of the latest preview, window.launchState
// {id, status, reason, result, exitCode, outcome, title, titles (each title it
// had, in order)} of the session just launched, window.savedTemplate.

import {
  addSlots, api, durationText, el, fmtMem, fmtSlots, fmtStamp, isEnded, parseDuration,
  parseSize, sizeText, wireDialog,
} from "./common.js";

const STEPS = ["PENDING", "SCHEDULED", "PREPARING", "PULLING", "RUNNING", "FINISHED"];
const GIB = 2 ** 30;
const PREVIEW_DELAY_MS = 300;
const FORM_TITLE = "Launch a session";
const FORM_SUB = "Resources are per container; a cluster gets the same on every container.";
// The dialog's inputs of each slot; other slots' errors go under the whole row.
const SLOT_FIELDS = { cpu: "resources.cpu", mem: "resources.mem", "cuda.device": "resources.gpu" };
const SLOT_LABELS = { cpu: "CPU", mem: "Memory", "cuda.device": "GPUs" };

let dialog, form, opts;
let loaded = false;
let templates = [];
let presets = [];
let launched = null; // {id, name, type, status, reasons, finished}
const seen = new Map(); // session id -> pushes that arrived before the POST answered

// Errors: the latest answer of the API (preview or launch), the dialog's own
// checks, and the field a "never" verdict is about; shown per field.
const touched = new Set();
let submitted = false;
let apiErrors = {};
let localErrors = {};
let verdictErrors = [];
let submitting = false;

// The fit preview.
let fitTimer = null;
let fitSeq = 0;
let fitAbort = null;
let fit = null; // the latest preview's answer, or {failed: ApiError}

// The dependency picker.
let depCandidates = [];
let chosen = []; // [{id, name}]
let activeOption = -1;

const $ = (id) => document.getElementById(id);

function radioValue(name) {
  const checked = form.querySelector(`input[name="${name}"]:checked`);
  return checked ? checked.value : null;
}

function setRadio(name, value) {
  const input = form.querySelector(`input[name="${name}"][value="${value}"]`);
  if (input) input.checked = true;
}

function envRow(key = "", value = "") {
  const row = el("div.env-row", {},
    el("input", { placeholder: "NAME", value: key, "aria-label": "Variable name", "data-env": "key", autocomplete: "off" }),
    el("input", { placeholder: "value", value, "aria-label": "Variable value", "data-env": "value", autocomplete: "off" }),
    el("button.icon-btn", { type: "button", "aria-label": "Remove variable", onclick: () => { row.remove(); touched.add("env"); schedulePreview(); } }, "✕"),
  );
  $("f-env").append(row);
  return row;
}

function selectedTemplate() {
  return templates.find((t) => String(t.id) === $("f-template").value) || null;
}

// --- amounts and times --------------------------------------------------------------

function amount(slot, value) {
  if (value === null || value === undefined) return "no limit";
  return slot === "mem" ? fmtMem(value) : String(+value);
}

/** "2026-11-22T14:05" (datetime-local, the user's wall time) → ISO 8601 with the user's offset then. */
export function localToIso(value) {
  if (!value) return null;
  const when = new Date(value);
  if (Number.isNaN(when.getTime())) return null;
  const offset = -when.getTimezoneOffset();
  const pad = (n) => String(n).padStart(2, "0");
  const sign = offset >= 0 ? "+" : "-";
  const base = value.length === 16 ? `${value}:00` : value;
  return `${base}${sign}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
}

/** An ISO date-time → the datetime-local value of the same instant in the user's zone. */
function isoToLocal(iso) {
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return "";
  const local = new Date(when.getTime() - when.getTimezoneOffset() * 60000);
  return local.toISOString().slice(0, 16);
}

/** 5400 → "1 h 30 min" (as the server writes durations). */
function spanText(seconds) {
  let rest = Math.round(seconds);
  const parts = [];
  for (const [label, size] of [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]]) {
    if (rest >= size) { parts.push(`${Math.floor(rest / size)} ${label}`); rest %= size; }
  }
  return parts.join(" ") || `${seconds} s`;
}

function zoneText(date = new Date()) {
  const offset = -date.getTimezoneOffset();
  const pad = (n) => String(n).padStart(2, "0");
  return `UTC${offset >= 0 ? "+" : "−"}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
}

const ISO_TIME = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})?/g;

/** The scheduler's words, with its ISO times shown in the user's zone. */
function humanReason(text) {
  return String(text || "").replace(ISO_TIME, (iso) => (Number.isNaN(Date.parse(iso)) ? iso : fmtStamp(iso)));
}

// --- roles and total ---------------------------------------------------------------

/**
 * The kernels as the launch will create them: the dialog's resources are the
 * common ones (over the template's), and a template role's resources override
 * them slot by slot, for main1 and for each of the size − 1 sub kernels.
 */
function rolePlan(size) {
  const spec = (selectedTemplate() || {}).spec || {};
  const common = {};
  for (const [k, v] of Object.entries(spec.resources || {})) common[k] = k === "mem" ? parseSize(v) : Number(v);
  common.cpu = Number($("f-cpu").value) || 0;
  common.mem = Math.round((Number($("f-mem").value) || 0) * GIB);
  common["cuda.device"] = Number($("f-gpu").value) || 0;
  const roles = spec.roles || {};
  const role = (r) => {
    const slots = { ...common };
    for (const [k, v] of Object.entries((r && r.resources) || {})) slots[k] = k === "mem" ? parseSize(v) : Number(v);
    return { image: (r && r.image) || $("f-image").value, slots };
  };
  return { main: role(roles.main), sub: role(roles.sub), subs: size - 1, roles: Boolean(roles.main || roles.sub) };
}

function renderRoles(plan) {
  const box = $("launch-roles");
  box.hidden = !plan.roles;
  if (!plan.roles) return;
  const subs = plan.subs === 1 ? "sub1" : `sub1–sub${plan.subs}`;
  const rows = [["main1", plan.main, ""]];
  if (plan.subs > 0) rows.push([subs, plan.sub, plan.subs > 1 ? " each" : ""]);
  $("launch-roles-body").replaceChildren(...rows.map(([host, r, each]) =>
    el("tr", { "data-role": host === "main1" ? "main" : "sub" },
      el("td", {}, el("b.mono", {}, host)),
      el("td", {}, el("span.mono", {}, r.image || "—")),
      el("td", {}, fmtSlots(r.slots), each))));
}

function updateTotal() {
  const size = Math.max(1, parseInt($("f-size").value, 10) || 1);
  const plan = rolePlan(size);
  const total = el("b", { id: "launch-total-value" }, fmtSlots(addSlots(plan.main.slots, plan.sub.slots, plan.subs)));
  const node = $("launch-total");
  if (plan.roles && fmtSlots(plan.main.slots) !== fmtSlots(plan.sub.slots) && plan.subs > 0) {
    node.replaceChildren("Total: ", el("b", {}, "main1"), " ", fmtSlots(plan.main.slots), " + ", el("b", {}, `${plan.subs} sub${plan.subs === 1 ? "" : "s"}`), " × ", fmtSlots(plan.sub.slots), " = ", total);
  } else {
    node.replaceChildren("Total: ", el("b", {}, `${size} container${size === 1 ? "" : "s"}`), " × ", fmtSlots(plan.main.slots), " = ", total);
  }
  renderRoles(plan);
  $("batch-fields").hidden = radioValue("type") !== "batch";
  $("inference-note").hidden = radioValue("type") !== "inference";
  renderPresets();
  updateTimeoutHint();
  updateStartsHint();
}

function updateStartsHint() {
  const value = $("f-starts-at").value;
  const when = value ? new Date(value) : new Date();
  const zone = zoneText(Number.isNaN(when.getTime()) ? new Date() : when);
  $("f-starts-at-hint").textContent = value
    ? `Your local time (${zone}); it waits until then.`
    : `Your local time (${zone}). Empty: as soon as it fits.`;
}

function updateTimeoutHint() {
  const raw = $("f-batch-timeout").value.trim();
  const hint = $("f-batch-timeout-hint");
  if (!raw) {
    hint.textContent = "Ends it FAILED if it runs longer. Empty: no limit.";
    return;
  }
  try {
    hint.textContent = `= ${spanText(parseDuration(raw))}; ends it FAILED if it runs longer.`;
  } catch {
    hint.textContent = "Write it as 90s, 30m, 2h, 1h30m or 1d.";
  }
}

// --- presets -----------------------------------------------------------------------

function presetSlots(preset) {
  const r = preset.resources || {};
  return { cpu: Number(r.cpu || 0), mem: parseSize(r.mem) || 0, gpu: Number(r["cuda.device"] || 0) };
}

function currentSlots() {
  return {
    cpu: Number($("f-cpu").value) || 0,
    mem: Math.round((Number($("f-mem").value) || 0) * GIB),
    gpu: Number($("f-gpu").value) || 0,
  };
}

function renderPresets() {
  const box = $("presets");
  box.hidden = presets.length === 0;
  if (!presets.length) return;
  const now = currentSlots();
  const same = (a) => a.cpu === now.cpu && a.mem === now.mem && a.gpu === now.gpu;
  const match = presets.find((p) => same(presetSlots(p)));
  const buttons = presets.map((p) => el("button.preset", {
    type: "button", "data-preset": p.name, "aria-pressed": String(p === match),
    title: p.description || null, onclick: () => applyPreset(p),
  }, el("b", {}, p.name), el("small", {}, fmtSlots(p.resources))));
  buttons.push(el("button.preset.preset-custom", {
    type: "button", "data-preset": "", "aria-pressed": String(!match),
    onclick: () => $("f-cpu").focus(),
  }, el("b", {}, "Custom"), el("small", {}, "your own values")));
  $("preset-list").replaceChildren(...buttons);
}

function applyPreset(preset) {
  const slots = presetSlots(preset);
  $("f-cpu").value = slots.cpu;
  $("f-mem").value = +(slots.mem / GIB).toFixed(3);
  $("f-gpu").value = slots.gpu;
  for (const f of Object.values(SLOT_FIELDS)) touched.add(f);
  updateTotal();
  schedulePreview();
  const pressed = $("preset-list").querySelector(`[data-preset="${CSS.escape(preset.name)}"]`);
  if (pressed) pressed.focus();
}

async function loadPresets() {
  const group = $("f-group").value;
  try {
    presets = group ? await api(`presets/?resource_group=${encodeURIComponent(group)}`) : [];
  } catch {
    presets = [];
  }
  renderPresets();
}

// --- templates and catalogue ----------------------------------------------------------

function applyTemplate(template) {
  const spec = template.spec || {};
  if (spec.image) $("f-image").value = spec.image;
  const groupChanged = spec.resource_group && spec.resource_group !== $("f-group").value;
  if (spec.resource_group) $("f-group").value = spec.resource_group;
  if (spec.type) setRadio("type", spec.type);
  if (spec.cluster_mode) setRadio("cluster_mode", spec.cluster_mode);
  const size = spec.cluster_size || (spec.roles && spec.roles.sub && spec.roles.sub.replicas !== undefined ? 1 + spec.roles.sub.replicas : null);
  if (size) $("f-size").value = size;
  const res = spec.resources || {};
  if (res.cpu !== undefined) $("f-cpu").value = Number(res.cpu);
  const bytes = parseSize(res.mem);
  if (bytes !== null) $("f-mem").value = +(bytes / GIB).toFixed(3);
  if (res["cuda.device"] !== undefined) $("f-gpu").value = Number(res["cuda.device"]);
  if (spec.startup_command !== undefined) $("f-startup").value = spec.startup_command;
  if (spec.batch_timeout) $("f-batch-timeout").value = durationText(spec.batch_timeout);
  if (spec.starts_at) $("f-starts-at").value = isoToLocal(spec.starts_at);
  if (spec.mounts) {
    form.querySelectorAll("#f-mounts input").forEach((box) => { box.checked = spec.mounts.includes(box.value); });
  }
  if (spec.env) {
    $("f-env").replaceChildren();
    for (const [k, v] of Object.entries(spec.env)) envRow(k, v);
  }
  updateTotal();
  if (groupChanged) loadPresets();
  schedulePreview();
}

async function loadCatalogue() {
  const [images, groups, tpls, folders] = await Promise.all([
    api("images/"), api("resource-groups/"), api("templates/"), api("folders/"),
  ]);
  templates = tpls;
  $("f-image").replaceChildren(...images.map((i) => el("option", { value: i.reference }, i.display_name ? `${i.display_name} — ${i.reference}` : i.reference)));
  $("f-group").replaceChildren(...groups.map((g) => el("option", { value: g.name }, g.description ? `${g.name} — ${g.description}` : g.name)));
  $("f-template").replaceChildren(el("option", { value: "" }, "— none —"), ...templates.map((t) => el("option", { value: t.id }, t.owner ? t.name : `${t.name} (shared)`)));
  $("f-mounts").replaceChildren(
    ...(folders.length
      ? folders.map((f) => {
          // A shared folder whose name one of yours has too is named owner/name.
          const clash = f.permission !== "owner" && folders.some((o) => o !== f && o.name === f.name);
          const value = clash ? `${f.owner}/${f.name}` : f.name;
          const note = f.permission === "owner" ? null : el("small.muted", {}, ` ${f.owner}’s, ${f.permission === "ro" ? "read-only" : "read-write"}`);
          return el("label.check", {}, el("input", { type: "checkbox", value, name: "mounts" }), value, note);
        })
      : [el("span.muted", {}, "You have no data folders yet. ", el("a", { href: "/folders/" }, "Make one on the Data page."))]),
  );
  await loadPresets();
  loaded = true;
  window.launchReady = true;
}

// --- the spec ----------------------------------------------------------------------

/** The launch spec of the form; the dialog's own checks (a duration it cannot read) go to localErrors. */
function spec() {
  localErrors = {};
  const s = {
    image: $("f-image").value,
    resource_group: $("f-group").value,
    type: radioValue("type"),
    cluster_mode: radioValue("cluster_mode"),
    cluster_size: parseInt($("f-size").value, 10),
    resources: {
      cpu: $("f-cpu").value,
      mem: String(Math.round((Number($("f-mem").value) || 0) * GIB)),
    },
    mounts: [...form.querySelectorAll("#f-mounts input:checked")].map((b) => b.value),
    env: {},
    depends_on: chosen.map((c) => c.id),
  };
  if (Number.isNaN(s.cluster_size)) s.cluster_size = $("f-size").value;
  const gpu = Number($("f-gpu").value) || 0;
  const tplGpu = ((selectedTemplate() || {}).spec || {}).resources;
  if (gpu || (tplGpu && tplGpu["cuda.device"] !== undefined)) s.resources["cuda.device"] = String(gpu);
  const name = $("f-name").value.trim();
  if (name) s.name = name;
  if ($("f-template").value) s.template = Number($("f-template").value);
  if (s.type === "batch") {
    s.startup_command = $("f-startup").value;
    // The server's own words; the dialog neither previews nor launches without one.
    if (!s.startup_command.trim()) localErrors.startup_command = ["a batch session needs a start command"];
    const startsAt = $("f-starts-at").value;
    if (startsAt) s.starts_at = localToIso(startsAt);
    const timeout = $("f-batch-timeout").value.trim();
    if (timeout) {
      try {
        const seconds = parseDuration(timeout);
        if (seconds > 0) s.batch_timeout = seconds;
        else localErrors.batch_timeout = ["must be longer than 0 seconds"];
      } catch (err) {
        // The hint under the field already shows how to write one.
        localErrors.batch_timeout = [/negative/.test(err.message) ? err.message : `“${timeout}” is not a duration`];
      }
    }
  }
  for (const row of $("f-env").querySelectorAll(".env-row")) {
    const key = row.querySelector('[data-env="key"]').value.trim();
    if (key) s.env[key] = row.querySelector('[data-env="value"]').value;
  }
  const typed = $("f-deps-input").value.trim();
  if (typed) localErrors.depends_on = [unresolvedDependency(typed)];
  return s;
}

// --- field errors -------------------------------------------------------------------

/** The slot a resources message is about: "mem: …", "quota: total mem would be …", "needs 16 cpu per container; …". */
export function slotOf(message) {
  const text = String(message);
  let m = text.match(/^([a-z][a-z0-9_.]*): /);
  if (m && m[1] in SLOT_FIELDS) return m[1];
  m = text.match(/^quota: total ([a-z][a-z0-9_.]*) /);
  if (m) return m[1];
  m = text.match(/\bneeds [^;]*?\b(cpu|mem|cuda\.[a-z]+)\b[^;]* per container/);
  if (m) return m[1];
  return null;
}

/** The dialog's field (its data-field) for one message of an API field. */
function fieldFor(key, message) {
  const parts = key.split(".");
  let root = parts[0];
  if (root === "roles") {
    if (parts[2] === "image") return "image";
    if (parts[2] !== "resources") return "cluster_size";
    root = "resources";
  }
  if (root === "resources") return SLOT_FIELDS[slotOf(message)] || "resources.all";
  root = root.split("[")[0];
  return form.querySelector(`.field[data-field="${root}"]`) ? root : "non_field_errors";
}

/** The field a "never" verdict is about, when its words name one. */
function verdictField(reason) {
  if (/^quota: at most \d+ containers/.test(reason)) return "cluster_size";
  if (/^dependency /.test(reason)) return "depends_on";
  const slot = slotOf(reason);
  if (slot) return SLOT_FIELDS[slot] || "resources.all";
  if (/cluster of \d+/.test(reason)) return "cluster_size";
  return null;
}

function isTouched(field) {
  if (submitted || touched.has(field)) return true;
  if (field === "resources.all") return [...touched].some((f) => f.startsWith("resources."));
  return false;
}

function labelOf(field) {
  if (field === "resources.all") return "Resources";
  const label = form.querySelector(`.field[data-field="${field}"] > label, .field[data-field="${field}"] > span`);
  return label ? label.firstChild.textContent.trim() : field;
}

function clearErrors() {
  form.querySelectorAll(".field-error").forEach((n) => n.remove());
  form.querySelectorAll(".has-error").forEach((n) => n.classList.remove("has-error"));
  form.querySelectorAll("[aria-invalid]").forEach((n) => {
    n.removeAttribute("aria-invalid");
    if (n.dataset.describedBy) n.setAttribute("aria-describedby", n.dataset.describedBy);
    else n.removeAttribute("aria-describedby");
  });
}

/** Show each error under its own field: only fields the user changed, unless they tried to launch. */
function renderErrors() {
  clearErrors();
  const items = [];
  const add = (key, messages, always = false) => {
    for (const message of messages) items.push({ key, message, field: fieldFor(key, message), always });
  };
  for (const [key, messages] of Object.entries(apiErrors)) add(key, messages);
  for (const [key, messages] of Object.entries(localErrors)) add(key, messages);
  for (const item of verdictErrors) items.push({ ...item, always: true });
  const shown = new Set();
  let n = 0;
  for (const { key, message, field, always } of items) {
    if (!always && !isTouched(field)) continue;
    if (shown.has(`${field}\n${message}`)) continue;
    shown.add(`${field}\n${message}`);
    const holder = form.querySelector(`[data-field="${field}"]`) || form.querySelector('[data-field="non_field_errors"]');
    holder.classList.add("has-error");
    const id = `launch-err-${++n}`;
    holder.append(el("div.field-error", { id, "data-error-for": key, "data-field-error": field }, message));
    const control = holder.matches(".field") ? holder.querySelector("input:not([type=radio]):not([type=checkbox]), select, textarea") : null;
    if (control) {
      if (!control.hasAttribute("aria-invalid")) {
        const base = control.getAttribute("aria-describedby");
        if (base) control.dataset.describedBy = base;
      }
      control.setAttribute("aria-invalid", "true");
      control.setAttribute("aria-describedby", [control.getAttribute("aria-describedby"), id].filter(Boolean).join(" "));
    }
  }
}

function showLaunchError(err) {
  const alertBox = $("launch-error");
  alertBox.textContent = err.message;
  alertBox.hidden = false;
  apiErrors = err.fields || {};
  renderErrors();
  const first = form.querySelector(".field-error");
  if (first) first.scrollIntoView({ block: "center", behavior: "smooth" });
  else alertBox.scrollIntoView({ block: "center" });
}

// --- will it fit --------------------------------------------------------------------

function schedulePreview() {
  if (!loaded || form.hidden) return;
  clearTimeout(fitTimer);
  window.launchFit = { ...(window.launchFit || {}), pending: true };
  $("launch-fit").classList.add("is-checking");
  fitTimer = setTimeout(runPreview, PREVIEW_DELAY_MS);
}

async function runPreview() {
  if (!loaded || form.hidden) return;
  const body = spec();
  const seq = ++fitSeq;
  if (fitAbort) fitAbort.abort();
  if (localErrors.startup_command) {
    // A batch session with no command yet: the server could only refuse it (400).
    fit = { local: { field: "startup_command", message: localErrors.startup_command[0] } };
    applyFit();
    return;
  }
  fitAbort = new AbortController();
  let answer;
  try {
    answer = await api("sessions/preview/", { method: "POST", body, signal: fitAbort.signal });
  } catch (err) {
    if (err.name === "AbortError" || seq !== fitSeq) return;
    answer = { failed: err };
  }
  if (seq !== fitSeq || form.hidden) return;
  fit = answer;
  applyFit();
}

const ICONS = {
  start_now: "M5 10.5l3.2 3.2L15 7",
  wait: "M10 5.5V10l3 2",
  never: "M5.8 14.2l8.4-8.4",
  refused: "M5.8 14.2l8.4-8.4",
  invalid: "M10 5.5v5.5M10 14v.5",
  checking: "M6 10h.01M10 10h.01M14 10h.01",
};

function icon(kind) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 20 20");
  svg.setAttribute("width", "20");
  svg.setAttribute("height", "20");
  svg.setAttribute("aria-hidden", "true");
  const circle = document.createElementNS(ns, "circle");
  for (const [k, v] of Object.entries({ cx: 10, cy: 10, r: 8.25, fill: "none", stroke: "currentColor", "stroke-width": 1.5 })) circle.setAttribute(k, v);
  const path = document.createElementNS(ns, "path");
  for (const [k, v] of Object.entries({ d: ICONS[kind] || ICONS.invalid, fill: "none", stroke: "currentColor", "stroke-width": 2, "stroke-linecap": "round", "stroke-linejoin": "round" })) path.setAttribute(k, v);
  svg.append(circle, path);
  return svg;
}

const VERDICT_WORDS = {
  start_now: "Starts now", wait: "Will wait", never: "Can never start",
  refused: "Cannot launch now", invalid: "Cannot check yet", failed: "Cannot check now",
};

/** The verdict in words: {kind, word, reason, more}. */
function verdictOf(answer) {
  if (answer.local) return { kind: "invalid", reason: `${labelOf(answer.local.field)}: ${answer.local.message}`, more: [] };
  if (answer.failed) {
    const err = answer.failed;
    const fields = Object.entries(err.fields || {});
    if ((err.status === 400 || err.status === 409) && fields.length) {
      const [key, messages] = fields[0];
      const field = fieldFor(key, messages[0]);
      // A slot's message names its slot already ("cpu: must be more than 0").
      const what = field === "non_field_errors" || (field.startsWith("resources.") && field !== "resources.all") ? "" : `${labelOf(field)}: `;
      return { kind: "invalid", reason: `${what}${messages[0]}`, more: [] };
    }
    // The pending-session limit: a launch now is refused, one later may not be.
    if (err.status === 403) return { kind: "refused", reason: err.message, more: [] };
    return { kind: "failed", reason: err.message, more: [] };
  }
  const reason = humanReason(answer.reason).replace(/^fits now: /, "");
  return { kind: answer.verdict, reason, more: (answer.reasons || []).slice(1).map(humanReason) };
}

function applyFit() {
  const v = verdictOf(fit);
  const panel = $("launch-fit");
  panel.classList.remove("is-checking");
  panel.dataset.verdict = v.kind;
  const box = $("fit-verdict");
  box.querySelector(".fit-icon").replaceChildren(icon(v.kind));
  box.querySelector(".fit-word").textContent = `${VERDICT_WORDS[v.kind]}${v.reason ? ":" : ""}`;
  box.querySelector(".fit-reason").textContent = v.reason;
  const more = box.querySelector(".fit-more");
  more.replaceChildren(...v.more.map((r) => el("li", {}, `and ${r}`)));
  more.hidden = v.more.length === 0;
  const chip = $("fit-chip");
  chip.dataset.verdict = v.kind;
  chip.replaceChildren(icon(v.kind), VERDICT_WORDS[v.kind]);
  const answered = !fit.failed && !fit.local;
  renderFitNumbers(answered ? fit : null);
  // Valid, but not what the user may count on (`ssh sub1` with a sub image without SSH).
  const warnings = (answered && fit.warnings) || [];
  $("fit-warnings").replaceChildren(...warnings.map((w) => el("li", {}, w)));
  $("fit-warnings").hidden = warnings.length === 0;

  apiErrors = fit.failed ? fit.failed.fields || {} : {};
  verdictErrors = [];
  if (v.kind === "never") {
    const field = verdictField(fit.reason);
    if (field) verdictErrors.push({ key: "verdict", message: fit.reason, field });
  }
  if (!fit.failed) $("launch-error").hidden = true;
  renderErrors();
  updateLaunchButton();
  window.launchFit = { pending: false, verdict: v.kind, reason: answered ? fit.reason : v.reason, answer: answered ? fit : null, warnings };
}

function shownSlots(answer) {
  const requested = answer.resources.total || {};
  const group = answer.resource_group.slots || {};
  const quota = answer.quota.slots || {};
  return Object.keys({ ...group, ...quota }).filter((slot) => slot === "cpu" || slot === "mem"
    || Number(requested[slot] || 0) > 0 || Number((group[slot] || {}).capacity || 0) > 0
    || (quota[slot] && quota[slot].limit !== null));
}

function meter(value, max, low) {
  return el("meter", { min: 0, max: max || 1, value: Math.min(Number(value) || 0, Number(max) || 1), low, "aria-hidden": "true" });
}

function renderFitNumbers(answer) {
  $("fit-grid").hidden = !answer;
  if (!answer) return;
  const slots = shownSlots(answer);
  const quota = answer.quota;
  $("fit-policy").textContent = quota.policy ? `· policy ${quota.policy}` : "";
  const qRows = [];
  for (const slot of slots) {
    const q = quota.slots[slot];
    if (!q) continue;
    const label = SLOT_LABELS[slot] || slot;
    if (q.limit === null) {
      qRows.push(el("div.fit-row", { "data-slot": slot }, el("dt", {}, label), el("dd", {}, el("span.fit-value", {}, "no limit"), el("span.fit-detail", {}, Number(q.used) ? `${amount(slot, q.used)} in use` : "none in use"))));
    } else {
      qRows.push(el("div.fit-row", { "data-slot": slot }, el("dt", {}, label),
        el("dd", {}, el("span.fit-value", {}, `${amount(slot, q.left)} left`), el("span.fit-detail", {}, `of ${amount(slot, q.limit)}`), meter(q.left, q.limit))));
    }
  }
  const sessions = quota.sessions;
  qRows.push(el("div.fit-row", { "data-slot": "sessions" }, el("dt", {}, "Sessions"),
    sessions.limit === null
      ? el("dd", {}, el("span.fit-value", {}, "no limit"), el("span.fit-detail", {}, `${sessions.active} active`))
      : el("dd", {}, el("span.fit-value", {}, `${sessions.left} left`), el("span.fit-detail", {}, `of ${sessions.limit}`), meter(sessions.left, sessions.limit))));
  $("fit-quota").replaceChildren(...qRows);

  const group = answer.resource_group;
  $("fit-group-name").textContent = group.name;
  const waiting = group.pending_sessions;
  $("fit-group-sub").textContent = `· ${group.agents} agent${group.agents === 1 ? "" : "s"}${waiting ? ` · ${waiting} waiting` : ""}`;
  const gRows = slots.filter((slot) => group.slots[slot]).map((slot) => {
    const g = group.slots[slot];
    return el("div.fit-row", { "data-slot": slot }, el("dt", {}, SLOT_LABELS[slot] || slot),
      el("dd", {},
        el("span.fit-value", {}, `${amount(slot, g.free)} free`),
        el("span.fit-detail", {}, `of ${amount(slot, g.capacity)} · at most ${amount(slot, g.largest_free)} on one agent`),
        meter(g.free, g.capacity)));
  });
  if (!gRows.length || group.agents === 0) gRows.unshift(el("div.fit-row", {}, el("dt", {}, "Agents"), el("dd", {}, el("span.fit-value", {}, "none alive now"))));
  $("fit-group").replaceChildren(...gRows);
}

function updateLaunchButton() {
  const button = $("launch-submit");
  const never = fit && !fit.failed && fit.verdict === "never";
  button.disabled = submitting || never;
  button.textContent = submitting ? "Launching…" : "Launch";
  button.title = never ? `Can never start: ${fit.reason}` : "";
}

// --- dependencies -------------------------------------------------------------------

async function loadDepCandidates() {
  let list;
  try {
    list = await api("sessions/");
  } catch {
    list = opts.sessions ? opts.sessions() : [];
  }
  // Every session of the user: those that may still succeed first, then those that
  // ended (a success satisfies the dependency; anything else cancels the new session).
  const mapped = list.map((s) => ({ id: s.id, name: s.name, status: s.status, type: s.type, result: s.result }));
  depCandidates = [...mapped.filter((s) => !isEnded(s.status)), ...mapped.filter((s) => isEnded(s.status))];
  if (!$("deps-options").hidden) renderOptions();
}

/** How a chosen session ended, for a session that waits for it: {text, ok}, or null while it may still succeed. */
function endedAs(s) {
  if (!isEnded(s.status)) return null;
  const ok = s.result === "SUCCESS";
  return { ok, text: `ended: ${s.result && s.result !== "UNDEFINED" ? s.result : s.status}` };
}

/** Words for text left in the picker that names no chosen session. */
function unresolvedDependency(typed) {
  return depMatches().length
    ? `“${typed}” is not added yet: pick it in the list (Enter adds it) or clear the text`
    : `no session of yours matches “${typed}”: clear the text or type part of another name`;
}

function depMatches() {
  const q = $("f-deps-input").value.trim().toLowerCase();
  return depCandidates
    .filter((s) => !chosen.some((c) => c.id === s.id))
    .filter((s) => !q || s.name.toLowerCase().includes(q) || s.id.startsWith(q))
    .slice(0, 50);
}

function highlighted(name, q) {
  const at = q ? name.toLowerCase().indexOf(q) : -1;
  if (at < 0) return [name];
  return [name.slice(0, at), el("mark", {}, name.slice(at, at + q.length)), name.slice(at + q.length)];
}

function renderOptions() {
  const input = $("f-deps-input");
  const list = $("deps-options");
  const q = input.value.trim().toLowerCase();
  const matches = depMatches();
  if (activeOption >= matches.length) activeOption = matches.length - 1;
  if (!matches.length) {
    list.replaceChildren(el("li.picker-empty", { role: "option", "aria-disabled": "true", "aria-selected": "false" },
      !depCandidates.length ? "You have no sessions to wait for"
        : q ? `No session of yours matches “${input.value.trim()}”`
          : "Every session you could wait for is chosen"));
  } else {
    list.replaceChildren(...matches.map((s, i) => el("li", {
      role: "option", id: `dep-opt-${s.id}`, "data-id": s.id, "aria-selected": String(i === activeOption),
      class: i === activeOption ? "active" : null,
      onmousedown: (e) => e.preventDefault(), // keep the focus in the input
      onclick: () => addDependency(s),
    }, el("span.opt-name", {}, ...highlighted(s.name, q)), optionMeta(s))));
  }
  const opening = list.hidden;
  list.hidden = false;
  input.setAttribute("aria-expanded", "true");
  if (opening) list.scrollIntoView({ block: "nearest" });
  const active = matches[activeOption];
  if (active) {
    input.setAttribute("aria-activedescendant", `dep-opt-${active.id}`);
    const node = $(`dep-opt-${active.id}`);
    if (node) node.scrollIntoView({ block: "nearest" });
  } else {
    input.removeAttribute("aria-activedescendant");
  }
}

function optionMeta(s) {
  const ended = endedAs(s);
  if (!ended) return el("span.opt-meta", {}, `${s.status.toLowerCase()} · ${s.type} · ${s.id.slice(0, 8)}`);
  return el(`span.opt-meta.${ended.ok ? "opt-ok" : "opt-bad"}`, {},
    `${ended.text} · ${ended.ok ? "satisfied" : "the new session would be cancelled"}`);
}

function closeOptions() {
  const input = $("f-deps-input");
  $("deps-options").hidden = true;
  input.setAttribute("aria-expanded", "false");
  input.removeAttribute("aria-activedescendant");
  activeOption = -1;
}

function renderChips() {
  $("deps-chips").replaceChildren(...chosen.map((c) => el(`li.chip${endedAs(c) ? (endedAs(c).ok ? ".chip-ok" : ".chip-bad") : ""}`, { "data-id": c.id },
    el("span", {}, c.name), endedAs(c) ? el("span.chip-note", {}, ` — ${endedAs(c).text}`) : null,
    el("button.chip-x", { type: "button", "aria-label": `Remove ${c.name}`, onclick: () => removeDependency(c, true) }, "✕"))));
  $("f-deps-input").placeholder = chosen.length ? "Add another…" : "Type part of a session name…";
}

/** The picker's text was added or cleared: the refusal of a launch with text left in it goes. */
function dropDepsRefusal() {
  if (!localErrors.depends_on || $("f-deps-input").value.trim()) return;
  delete localErrors.depends_on;
  renderErrors();
}

function depsChanged(message) {
  dropDepsRefusal();
  renderChips();
  if (!$("deps-options").hidden) renderOptions();
  $("deps-status").textContent = `${message} ${chosen.length} session${chosen.length === 1 ? "" : "s"} chosen.`;
  touched.add("depends_on");
  schedulePreview();
}

function addDependency(s) {
  if (!chosen.some((c) => c.id === s.id)) chosen.push({ id: s.id, name: s.name, status: s.status, result: s.result });
  const input = $("f-deps-input");
  input.value = "";
  closeOptions();
  input.focus();
  const ended = endedAs(s);
  depsChanged(!ended ? `Added ${s.name}.`
    : ended.ok ? `Added ${s.name}, which ${ended.text}: satisfied.`
      : `Added ${s.name}, which ${ended.text}: a session that depends on it is cancelled.`);
}

function removeDependency(c, refocus) {
  chosen = chosen.filter((x) => x.id !== c.id);
  if (refocus) $("f-deps-input").focus();
  depsChanged(`Removed ${c.name}.`);
}

function onDepsKey(event) {
  const input = event.target;
  const open = !$("deps-options").hidden;
  const matches = depMatches();
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    const step = event.key === "ArrowDown" ? 1 : -1;
    if (!open) activeOption = step > 0 ? 0 : matches.length - 1;
    else if (matches.length) activeOption = (activeOption + step + matches.length) % matches.length;
    renderOptions();
  } else if (event.key === "Enter") {
    event.preventDefault(); // never submits the form from here
    if (open && matches[activeOption]) addDependency(matches[activeOption]);
    else if (open && matches.length === 1) addDependency(matches[0]);
  } else if (event.key === "Escape") {
    if (open) {
      event.preventDefault(); // a prevented Escape is no close request: the dialog stays
      closeOptions();
    }
  } else if (event.key === "Backspace" && input.value === "" && chosen.length) {
    event.preventDefault();
    removeDependency(chosen[chosen.length - 1], false);
  } else if (event.key === "Tab") {
    closeOptions();
  }
}

function wireDependencies() {
  const input = $("f-deps-input");
  input.addEventListener("keydown", onDepsKey);
  input.addEventListener("input", () => {
    activeOption = input.value.trim() ? 0 : -1;
    renderOptions();
    dropDepsRefusal();
  });
  input.addEventListener("click", () => { if ($("deps-options").hidden) renderOptions(); });
  input.addEventListener("blur", closeOptions);
  $("deps-picker").addEventListener("click", (e) => { if (e.target === e.currentTarget || e.target.id === "deps-chips") input.focus(); });
}

// --- launch -------------------------------------------------------------------------

async function submit(event) {
  event.preventDefault();
  submitted = true;
  const body = spec();
  if (Object.keys(localErrors).length) {
    // The launch does not go out: text left in the picker would be dropped, a batch with
    // no command refused. Each is said under its field.
    renderErrors();
    form.querySelector(".field-error").scrollIntoView({ block: "center", behavior: "smooth" });
    if (localErrors.depends_on) $("f-deps-input").focus();
    return;
  }
  if (fit && !fit.failed && fit.verdict === "never") return;
  clearTimeout(fitTimer);
  if (fitAbort) fitAbort.abort();
  fitSeq += 1;
  $("launch-error").hidden = true;
  submitting = true;
  updateLaunchButton();
  try {
    const detail = await api("sessions/", { method: "POST", body });
    opts.onCreated && opts.onCreated(detail);
    showProgress(detail);
  } catch (err) {
    showLaunchError(err);
    schedulePreview();
  } finally {
    submitting = false;
    updateLaunchButton();
  }
}

// --- save as template ------------------------------------------------------------

/** The dialog's spec as a template: what the launch would use (the selected template's
 * fields under the dialog's), without the session's own name, dependencies and start time. */
function templateSpec() {
  const base = structuredClone((selectedTemplate() || {}).spec || {});
  const s = { ...base, ...spec() };
  s.resources = { ...(base.resources || {}), ...s.resources, mem: sizeText(Number(s.resources.mem)) };
  for (const key of ["name", "template", "depends_on", "starts_at"]) delete s[key];
  if (!Object.keys(s.env).length) delete s.env;
  if (!s.mounts.length) delete s.mounts;
  return s;
}

function toggleSaveTemplate(open) {
  $("save-tpl").hidden = !open;
  $("save-tpl-status").replaceChildren();
  $("save-tpl-status").className = "";
  if (open) $("save-tpl-name").focus();
}

async function saveAsTemplate() {
  const status = $("save-tpl-status");
  const button = $("save-tpl-submit");
  button.disabled = true;
  try {
    const saved = await api("templates/", { method: "POST", body: { name: $("save-tpl-name").value.trim(), spec: templateSpec() } });
    templates.push(saved);
    $("f-template").append(el("option", { value: saved.id }, saved.name));
    window.savedTemplate = saved;
    status.className = "save-ok";
    status.replaceChildren(`Saved as template “${saved.name}”. `, el("a", { href: "/templates/" }, "Manage templates"));
  } catch (err) {
    const own = Object.entries(err.fields || {}).filter(([k]) => !k.startsWith("spec."));
    const specFields = Object.fromEntries(Object.entries(err.fields || {}).filter(([k]) => k.startsWith("spec.")).map(([k, v]) => [k.slice(5), v]));
    status.className = "save-error";
    status.textContent = own.length ? own.map(([, v]) => v.join(" ")).join(" ") : err.message;
    if (Object.keys(specFields).length) {
      submitted = true;
      apiErrors = specFields;
      renderErrors();
    }
  } finally {
    button.disabled = false;
  }
}

// --- progress ----------------------------------------------------------------

function setTitle(title, sub) {
  $("launch-title").textContent = title;
  if (sub !== undefined) $("launch-sub").textContent = sub;
  if (!launched) return;
  const state = window.launchState || {};
  const titles = state.titles || [];
  if (titles[titles.length - 1] !== title) titles.push(title);
  window.launchState = { ...state, title, titles };
}

function showProgress(detail) {
  launched = { id: detail.id, name: detail.name, type: detail.type, status: "PENDING", stepIdx: 0, reasons: {}, ending: false, finished: false, fetches: 0 };
  closeOptions();
  form.hidden = true;
  $("launch-progress").hidden = false;
  // The focused Launch button just vanished with the form: keyboard and screen
  // reader users continue from the dialog's title, which now follows the session.
  const size = `${detail.cluster_size} container${detail.cluster_size === 1 ? "" : "s"}`;
  setTitle(`Starting ${detail.name}…`, `${detail.name} · ${size} · ${detail.image} · ${detail.resource_group}`);
  $("launch-title").focus();
  $("progress-open").href = `/sessions/${detail.id}/`;
  $("progress-final").hidden = true;
  $("progress-steps").querySelector('[data-step="FINISHED"]').hidden = detail.type !== "batch";
  for (const event of detail.events || []) {
    if (!event.kernel) advance(event.to_status, event.reason);
  }
  advance(detail.status, detail.status_reason);
  for (const item of seen.get(detail.id) || []) advance(item.status, item.reason);
}

function paintSteps(idx, ended) {
  const batch = launched.type === "batch";
  const steps = $("progress-steps").querySelectorAll("li");
  steps.forEach((li, i) => {
    const step = STEPS[i];
    const reason = launched.reasons[step] || "";
    let state = "";
    if (i < idx) state = reason || step !== "PULLING" ? "done" : "skipped";
    else if (i === idx) state = ended ? "failed" : step === "RUNNING" && !batch ? "done" : "current";
    li.className = state;
    li.querySelector(".step-reason").textContent = step === "PULLING" && state === "skipped" ? "not needed: the image is on the agent" : humanReason(reason);
  });
}

function advance(status, reason) {
  if (!launched || !status || launched.finished) return;
  const idx = STEPS.indexOf(status);
  // A late push of an earlier step, or of any step once it ends.
  if (idx >= 0 && (idx < launched.stepIdx || launched.ending)) return;
  launched.status = status;
  window.launchState = { ...(window.launchState || {}), id: launched.id, status, reason };
  if (idx >= 0) {
    launched.stepIdx = idx;
    if (reason) launched.reasons[status] = reason;
    paintSteps(idx, false);
  }
  const final = $("progress-final");
  if (status === "PENDING" && reason && reason !== "created") {
    const words = humanReason(reason);
    setTitle(/^waiting /.test(words) ? words[0].toUpperCase() + words.slice(1) : `Waiting: ${words}`);
  } else if (["PENDING", "SCHEDULED", "PREPARING", "PULLING"].includes(status)) {
    setTitle(`Starting ${launched.name}…`);
  } else if (status === "RUNNING") {
    setTitle(launched.type === "batch" ? "Running the start command" : "Running");
    final.className = launched.type === "batch" ? "alert alert-info" : "alert alert-ok";
    final.textContent = launched.type === "batch"
      ? "The start command runs in main1; this dialog says how it ends."
      : "Your session is running. Open it for a terminal, logs and details.";
    final.hidden = false;
  } else if (status === "TERMINATING" || isEnded(status)) {
    launched.ending = true;
    if (launched.type === "batch" && status === "TERMINATING") setTitle("Finishing…");
    fetchOutcome(status, reason);
  }
}

/** The session's result and exit code (pushes carry only status and reason). */
async function fetchOutcome(status, reason) {
  const mine = launched;
  const n = ++mine.fetches;
  let detail = null;
  try {
    detail = await api(`sessions/${mine.id}/`);
  } catch {
    /* shown from the push alone */
  }
  if (launched !== mine || mine.finished || n !== mine.fetches) return;
  finish(detail || { status, status_reason: reason, result: "UNDEFINED", exit_code: null }, status, reason);
}

function finish(detail, status, reason) {
  const batch = launched.type === "batch";
  const result = detail.result;
  const code = detail.exit_code;
  const why = humanReason(detail.status_reason || reason || "");
  const final = $("progress-final");
  const finishedStep = $("progress-steps").querySelector('[data-step="FINISHED"] .step-reason');
  if (batch && result === "SUCCESS") {
    launched.finished = true;
    paintSteps(STEPS.indexOf("FINISHED") + 1, false);
    finishedStep.textContent = "exit code 0";
    setTitle("Batch finished: SUCCESS");
    final.className = "alert alert-ok";
    final.replaceChildren(el("b", {}, "✓ Success. "), "The start command exited with code 0. Its output stays in the session's logs.");
    final.hidden = false;
    window.launchState = { ...window.launchState, result, exitCode: code, outcome: "success" };
    return;
  }
  if (batch && result === "FAILED") {
    launched.finished = true;
    const running = STEPS.indexOf("RUNNING");
    paintSteps(launched.stepIdx >= running ? running + 1 : launched.stepIdx, true);
    finishedStep.textContent = code !== null && code !== undefined ? `exit code ${code}` : why;
    setTitle(code !== null && code !== undefined ? `Batch failed (exit code ${code})` : "Batch failed");
    final.className = "alert alert-error";
    const exited = code !== null && code !== undefined;
    // The reason often says the exit code again ("main1: exited with code 3").
    const extra = why && !(exited && why.includes(`code ${code}`)) ? ` ${why}` : "";
    final.replaceChildren(el("b", {}, "✕ Failed. "), exited ? `The start command exited with code ${code}.` : "", extra);
    final.hidden = false;
    window.launchState = { ...window.launchState, result, exitCode: code, outcome: "failed" };
    return;
  }
  if (status === "TERMINATING" && batch) return; // the result follows with the end
  launched.finished = isEnded(status) || status === "TERMINATING";
  const cur = $("progress-steps").querySelector("li.current");
  if (cur) cur.className = "failed";
  const titles = { ERROR: "Could not start", CANCELLED: "Cancelled", TERMINATED: "Ended", TERMINATING: "Ending" };
  setTitle(`${titles[status] || status}${why ? `: ${why}` : ""}`);
  final.className = "alert alert-error";
  final.replaceChildren(el("b", {}, `✕ ${status}. `), why || "The session ended.");
  final.hidden = false;
  window.launchState = { ...window.launchState, result, exitCode: code, outcome: "ended" };
}

/** Every sessions.changed item passes through here (from the list page). */
export function onSessionChange(item) {
  if (item.kernel) return;
  if (launched && launched.id === item.id) {
    advance(item.status, item.reason);
  } else {
    const list = seen.get(item.id) || [];
    list.push(item);
    seen.set(item.id, list.slice(-10));
    if (seen.size > 50) seen.delete(seen.keys().next().value);
  }
}

function onFormEdit(event) {
  const target = event.target;
  if (target.id === "f-deps-input" || target.id === "save-tpl-name") return;
  if (event.type === "change") {
    const field = target.closest("[data-field]");
    if (field) touched.add(field.dataset.field);
    if (target.id === "f-group") loadPresets();
  }
  updateTotal();
  if (event.type === "change") renderErrors();
  schedulePreview();
}

export function initLaunch(options) {
  opts = options;
  dialog = $("launch-modal");
  form = $("launch-form");
  wireDialog(dialog, () => {
    launched = null;
    clearTimeout(fitTimer);
  });
  form.addEventListener("submit", submit);
  form.addEventListener("input", onFormEdit);
  form.addEventListener("change", onFormEdit);
  $("env-add").addEventListener("click", () => envRow().querySelector("input").focus());
  $("f-template").addEventListener("change", (e) => {
    const t = templates.find((x) => String(x.id) === e.target.value);
    if (t) applyTemplate(t);
  });
  $("save-tpl-open").addEventListener("click", () => toggleSaveTemplate($("save-tpl").hidden));
  $("save-tpl-cancel").addEventListener("click", () => toggleSaveTemplate(false));
  $("save-tpl-submit").addEventListener("click", saveAsTemplate);
  $("save-tpl-name").addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); saveAsTemplate(); }
  });
  wireDependencies();
}

/** Open the dialog; ``{template: id}`` fills it from that template (``/sessions/new/?template=<id>``). */
export async function openLaunch({ template } = {}) {
  form.hidden = false;
  toggleSaveTemplate(false);
  $("launch-progress").hidden = true;
  launched = null;
  window.launchState = null;
  setTitle(FORM_TITLE, FORM_SUB);
  submitted = false;
  touched.clear();
  apiErrors = {};
  verdictErrors = [];
  clearErrors();
  $("launch-error").hidden = true;
  if (!dialog.open) dialog.showModal();
  updateTotal();
  loadDepCandidates();
  if (!loaded) {
    try {
      await loadCatalogue();
    } catch (err) {
      $("launch-error").textContent = `Could not load images and groups: ${err.message}`;
      $("launch-error").hidden = false;
    }
  }
  if (template) {
    const t = templates.find((x) => x.id === template);
    if (t) {
      $("f-template").value = String(t.id);
      applyTemplate(t);
    } else if (loaded) {
      $("launch-error").textContent = `No template with id ${template}: it may have been deleted.`;
      $("launch-error").hidden = false;
    }
  }
  updateTotal();
  schedulePreview();
}
