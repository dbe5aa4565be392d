// The template form (/templates/new/, /templates/<id>/edit/): a form over a
// template's launch spec, per-role image and resources included, saved
// through /api/v1/templates/. The API's field errors (``spec.roles.sub.resources``)
// appear beside their fields.
// Test hooks: window.formReady, window.savedTemplate (the API's answer).

import { addSlots, api, el, fmtSlots, parseSize, readJSON, sizeText } from "./common.js";

const data = readJSON("form-data");
const original = (data.template && data.template.spec) || {};
const form = document.getElementById("tpl-form");
const $ = (id) => document.getElementById(id);
// The slots the form has inputs for; any other slot of the template is kept as it is.
const FORM_SLOTS = ["cpu", "mem", "cuda.device"];

function radioValue(name) {
  return form.querySelector(`input[name="${name}"]:checked`).value;
}

function setRadio(name, value) {
  const input = form.querySelector(`input[name="${name}"][value="${value}"]`);
  if (input) input.checked = true;
}

function option(value, text, selected = false) {
  return el("option", { value, selected }, text);
}

function imageOptions(select, first, current) {
  const known = data.images.some((i) => i.reference === current);
  select.replaceChildren(
    option("", first),
    ...data.images.map((i) => option(i.reference, i.name ? `${i.name} — ${i.reference}` : i.reference, i.reference === current)),
    current && !known ? option(current, `${current} (not available here)`, true) : null,
  );
}

function envRow(key = "", value = "") {
  const row = el("div.env-row", {},
    el("input", { placeholder: "NAME", value: key, "aria-label": "Variable name", "data-env": "key", autocomplete: "off" }),
    el("input", { placeholder: "value", value, "aria-label": "Variable value", "data-env": "value", autocomplete: "off" }),
    el("button.icon-btn", { type: "button", "aria-label": "Remove variable", onclick: () => row.remove() }, "✕"),
  );
  $("t-env").append(row);
  return row;
}

function memText(value) {
  return typeof value === "number" ? sizeText(value) : value === undefined ? "" : String(value);
}

function fillResources(prefix, resources) {
  const r = resources || {};
  $(`${prefix}-cpu`).value = r.cpu !== undefined ? Number(r.cpu) : "";
  $(`${prefix}-mem`).value = memText(r.mem);
  $(`${prefix}-gpu`).value = r["cuda.device"] !== undefined ? Number(r["cuda.device"]) : "";
}

function fill() {
  const t = data.template || {};
  const spec = original;
  const roles = spec.roles || {};
  $("t-name").value = t.name || "";
  $("t-description").value = t.description || "";
  $("t-shared-field").hidden = !data.canShare;
  $("t-shared").checked = Boolean(t.is_shared) && data.canShare;
  setRadio("type", spec.type || "interactive");
  imageOptions($("t-image"), "— chosen at launch —", spec.image);
  imageOptions($("t-main-image"), "Same as the session's image", (roles.main || {}).image);
  imageOptions($("t-sub-image"), "Same as the session's image", (roles.sub || {}).image);
  const groups = data.groups.includes(spec.resource_group) || !spec.resource_group ? data.groups : [...data.groups, spec.resource_group];
  $("t-group").replaceChildren(option("", "— chosen at launch —"), ...groups.map((g) => option(g, g, g === spec.resource_group)));
  $("t-startup").value = spec.startup_command || "";
  $("t-timeout").value = spec.batch_timeout || "";
  setRadio("cluster_mode", spec.cluster_mode || "single-node");
  const replicas = (roles.sub || {}).replicas;
  $("t-size").value = spec.cluster_size || (replicas !== undefined ? replicas + 1 : 1);
  $("t-replicas").value = Number($("t-size").value) - 1;
  fillResources("t", spec.resources);
  fillResources("t-main", (roles.main || {}).resources);
  fillResources("t-sub", (roles.sub || {}).resources);
  const mounts = spec.mounts || [];
  const folders = [...data.folders, ...mounts.filter((m) => !data.folders.includes(m))];
  $("t-mounts").replaceChildren(
    ...(folders.length
      ? folders.map((f) => el("label.check", {}, el("input", { type: "checkbox", value: f, name: "mounts", checked: mounts.includes(f) }), f))
      : [el("span.muted", {}, "You have no data folders yet.")]),
  );
  for (const [k, v] of Object.entries(spec.env || {})) envRow(k, v);
}

// --- reading the form --------------------------------------------------------

/** The resources one set of inputs gives, on top of the slots the form has no inputs for. */
function readResources(prefix, kept) {
  const out = {};
  for (const [k, v] of Object.entries(kept || {})) if (!FORM_SLOTS.includes(k)) out[k] = v;
  const cpu = $(`${prefix}-cpu`).value.trim();
  const mem = $(`${prefix}-mem`).value.trim();
  const gpu = $(`${prefix}-gpu`).value.trim();
  if (cpu) out.cpu = cpu;
  if (mem) out.mem = mem;
  if (gpu && Number(gpu) !== 0) out["cuda.device"] = gpu;
  return Object.keys(out).length ? out : null;
}

function readRole(name) {
  const before = (original.roles || {})[name] || {};
  const role = {};
  const image = $(`t-${name}-image`).value;
  if (image) role.image = image;
  const resources = readResources(`t-${name}`, before.resources);
  if (resources) role.resources = resources;
  return role;
}

function size() {
  const n = parseInt($("t-size").value, 10);
  return Number.isNaN(n) ? $("t-size").value : n;
}

/** The spec the form describes; fields it has no input for (name, depends_on, starts_at) stay. */
function spec() {
  const s = {};
  for (const key of ["name", "depends_on", "starts_at"]) if (original[key] !== undefined) s[key] = original[key];
  const image = $("t-image").value;
  if (image) s.image = image;
  s.type = radioValue("type");
  if ($("t-group").value) s.resource_group = $("t-group").value;
  s.cluster_mode = radioValue("cluster_mode");
  s.cluster_size = size();
  const resources = readResources("t", original.resources);
  if (resources) s.resources = resources;
  const mounts = [...form.querySelectorAll('#t-mounts input:checked')].map((b) => b.value);
  if (mounts.length) s.mounts = mounts;
  const env = {};
  for (const row of $("t-env").querySelectorAll(".env-row")) {
    const key = row.querySelector('[data-env="key"]').value.trim();
    if (key) env[key] = row.querySelector('[data-env="value"]').value;
  }
  if (Object.keys(env).length) s.env = env;
  if (s.type === "batch") {
    if ($("t-startup").value.trim()) s.startup_command = $("t-startup").value;
    if ($("t-timeout").value) s.batch_timeout = Number($("t-timeout").value);
  }
  const main = readRole("main");
  const sub = readRole("sub");
  const hadReplicas = ((original.roles || {}).sub || {}).replicas !== undefined;
  if (Object.keys(sub).length || hadReplicas) sub.replicas = Number.isInteger(s.cluster_size) ? s.cluster_size - 1 : 0;
  const roles = {};
  if (Object.keys(main).length) roles.main = main;
  if (Object.keys(sub).length) roles.sub = sub;
  if (Object.keys(roles).length) s.roles = roles;
  return s;
}

// --- live hints ------------------------------------------------------------------

/** Numbers for the summary: a role's slots as the launch would merge them (role over common). */
function slotsOf(resources) {
  const out = {};
  for (const [k, v] of Object.entries(resources || {})) {
    const n = k === "mem" ? parseSize(v) : Number(v);
    if (n !== null && Number.isFinite(n)) out[k] = n;
  }
  return out;
}

function hosts(subs) {
  return subs === 1 ? "sub1" : `sub1–sub${subs}`;
}

/** The image ``ref`` as the page knows it, or null (one not offered here). */
function imageOf(ref) {
  return data.images.find((i) => i.reference === ref) || null;
}

/** As the API's ``warnings`` (launch.ssh_warning): a cluster whose sub kernels' image has no
 * SSH server, or main1's no client, cannot run `ssh sub1`. Saved all the same. */
function sshWarning(s, subs) {
  const roles = s.roles || {};
  const sub = subs ? imageOf((roles.sub || {}).image || s.image) : null;
  const main = imageOf((roles.main || {}).image || s.image);
  let text = "";
  if (sub && !sub.ssh) {
    text = `\`ssh sub1\` will not work: the sub kernels' image ${sub.reference} has no SSH server; choose an image with SSH for them if main1 must reach them`;
  } else if (sub && main && !main.ssh) {
    text = `\`ssh sub1\` will not work: main1's image ${main.reference} has no SSH client; choose an image with SSH for main1 if it must reach the sub kernels`;
  }
  const box = $("t-ssh-warning");
  box.textContent = text;
  box.hidden = !text;
}

function refresh() {
  const n = Math.max(1, parseInt($("t-size").value, 10) || 1);
  const subs = n - 1;
  $("t-batch").hidden = radioValue("type") !== "batch";
  $("t-sub-hosts").textContent = subs ? hosts(subs) : "no sub kernels at cluster size 1";
  form.querySelector('[data-role="sub"]').classList.toggle("idle", subs === 0);
  // What a role left blank inherits, shown as the placeholder.
  const common = { cpu: $("t-cpu").value, mem: $("t-mem").value, gpu: $("t-gpu").value };
  for (const role of ["main", "sub"]) {
    $(`t-${role}-cpu`).placeholder = common.cpu || "as above";
    $(`t-${role}-mem`).placeholder = common.mem || "as above";
    $(`t-${role}-gpu`).placeholder = common.gpu || "as above";
  }
  const s = spec();
  const roles = s.roles || {};
  sshWarning(s, subs);
  const main = slotsOf({ ...(s.resources || {}), ...((roles.main || {}).resources || {}) });
  const sub = slotsOf({ ...(s.resources || {}), ...((roles.sub || {}).resources || {}) });
  const summary = $("t-summary");
  if (!Object.keys(main).length && !Object.keys(sub).length) {
    summary.textContent = "Resources left blank come from the launch dialog.";
    return;
  }
  const parts = [el("span", {}, el("b", {}, "main1"), " ", fmtSlots(main) || "dialog default")];
  if (subs) parts.push(" · ", el("span", {}, el("b", {}, hosts(subs)), " ", fmtSlots(sub) || "dialog default", subs > 1 ? " each" : ""));
  const missing = ["cpu", "mem"].some((k) => main[k] === undefined || (subs && sub[k] === undefined));
  parts.push(" · total ", el("b", { id: "t-total" }, fmtSlots(addSlots(main, sub, subs))));
  if (missing) parts.push(" plus what the launch dialog sets");
  summary.replaceChildren(...parts);
}

// --- errors and saving -------------------------------------------------------------

function clearErrors() {
  form.querySelectorAll(".field-error").forEach((n) => n.remove());
  form.querySelectorAll(".has-error").forEach((n) => n.classList.remove("has-error"));
  $("tpl-error").hidden = true;
}

/** The element for an API field name: ``spec.roles.sub.resources.mem`` → the closest one the form has. */
function holderFor(key) {
  const parts = key.replace(/^spec\./, "").split(".");
  for (let n = parts.length; n > 0; n -= 1) {
    const holder = form.querySelector(`[data-field="${parts.slice(0, n).join(".")}"]`);
    if (holder) return holder;
  }
  return form.querySelector('[data-field="non_field_errors"]');
}

function showErrors(err) {
  clearErrors();
  const alertBox = $("tpl-error");
  alertBox.textContent = err.message;
  alertBox.hidden = false;
  for (const [key, messages] of Object.entries(err.fields || {})) {
    const holder = holderFor(key);
    holder.classList.add("has-error");
    const nodes = messages.map((m) => el("div.field-error", { "data-error-for": key }, m));
    if (holder.matches(".field, .field-errors")) holder.append(...nodes);
    else if (holder.matches(".card")) holder.querySelector(".card-title").after(...nodes);
    else holder.after(...nodes); // a row of inputs, a checkbox
  }
  const first = form.querySelector(".field-error") || alertBox;
  first.scrollIntoView({ block: "center" });
}

async function save(event) {
  event.preventDefault();
  clearErrors();
  const button = $("tpl-save");
  button.disabled = true;
  const body = {
    name: $("t-name").value.trim(),
    description: $("t-description").value.trim(),
    spec: spec(),
    is_shared: data.canShare && $("t-shared").checked,
  };
  const id = data.template && data.template.id;
  try {
    const saved = await api(id ? `templates/${id}/` : "templates/", { method: id ? "PUT" : "POST", body });
    window.savedTemplate = saved;
    location.assign(`/templates/?saved=${saved.id}`);
  } catch (err) {
    showErrors(err);
    button.disabled = false;
  }
}

fill();
$("t-size").addEventListener("input", () => {
  const n = parseInt($("t-size").value, 10);
  if (n >= 1) $("t-replicas").value = n - 1;
});
$("t-replicas").addEventListener("input", () => {
  const n = parseInt($("t-replicas").value, 10);
  if (n >= 0) $("t-size").value = n + 1;
});
form.addEventListener("input", refresh);
form.addEventListener("change", refresh);
form.addEventListener("submit", save);
$("t-env-add").addEventListener("click", () => { envRow().querySelector("input").focus(); });
refresh();
window.formReady = true;
