// The launch dialog: a form over the launch spec, prefilled from templates,
// POSTed to /api/v1/sessions/; the API's field errors appear beside their
// fields. After launch it shows the start step by step, driven by the
// sessions websocket (the list page passes every push to onSessionChange).
//
// With a template whose roles give main1 or the sub kernels their own image or
// resources, the dialog lists the roles, and its total adds up the kernels as
// the launch will create them (main1 + sub × replicas). "Save as template"
// stores the dialog's current spec through /api/v1/templates/.
//
// Test hooks: window.launchReady (catalogue loaded), window.launchState
// {id, status, reason} of the session just launched, window.savedTemplate.

import { addSlots, api, el, fmtSlots, isEnded, parseSize, sizeText, wireDialog } from "./common.js";

const STEPS = ["PENDING", "SCHEDULED", "PREPARING", "PULLING", "RUNNING"];
let dialog, form, opts;
let loaded = false;
let templates = [];
let launched = null; // {id, name, status}
const seen = new Map(); // session id -> pushes that arrived before the POST answered

const $ = (id) => document.getElementById(id);

function parseMemGiB(value) {
  const bytes = parseSize(value);
  return bytes === null ? null : bytes / 2 ** 30;
}

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
    el("button.icon-btn", { type: "button", "aria-label": "Remove variable", onclick: () => row.remove() }, "✕"),
  );
  $("f-env").append(row);
  return row;
}

function selectedTemplate() {
  return templates.find((t) => String(t.id) === $("f-template").value) || null;
}

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
  common.mem = Math.round((Number($("f-mem").value) || 0) * 2 ** 30);
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
  $("startup-field").hidden = radioValue("type") !== "batch";
}

function applyTemplate(template) {
  const spec = template.spec || {};
  if (spec.image) $("f-image").value = spec.image;
  if (spec.resource_group) $("f-group").value = spec.resource_group;
  if (spec.type) setRadio("type", spec.type);
  if (spec.cluster_mode) setRadio("cluster_mode", spec.cluster_mode);
  const size = spec.cluster_size || (spec.roles && spec.roles.sub && spec.roles.sub.replicas !== undefined ? 1 + spec.roles.sub.replicas : null);
  if (size) $("f-size").value = size;
  const res = spec.resources || {};
  if (res.cpu !== undefined) $("f-cpu").value = Number(res.cpu);
  const gib = parseMemGiB(res.mem);
  if (gib !== null) $("f-mem").value = +gib.toFixed(3);
  if (res["cuda.device"] !== undefined) $("f-gpu").value = Number(res["cuda.device"]);
  if (spec.startup_command !== undefined) $("f-startup").value = spec.startup_command;
  if (spec.mounts) {
    form.querySelectorAll("#f-mounts input").forEach((box) => { box.checked = spec.mounts.includes(box.value); });
  }
  if (spec.env) {
    $("f-env").replaceChildren();
    for (const [k, v] of Object.entries(spec.env)) envRow(k, v);
  }
  updateTotal();
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
      ? folders.map((f) => el("label.check", {}, el("input", { type: "checkbox", value: f.name, name: "mounts" }), f.name))
      : [el("span.muted", {}, "You have no data folders yet.")]),
  );
  loaded = true;
  window.launchReady = true;
}

function fillDependencies() {
  const select = $("f-deps");
  const keep = new Set([...select.selectedOptions].map((o) => o.value));
  const candidates = opts.sessions().filter((s) => !isEnded(s.status) || s.result === "SUCCESS");
  select.replaceChildren(...candidates.map((s) => el("option", { value: s.id, selected: keep.has(s.id) }, `${s.name} (${s.status.toLowerCase()}, ${s.type})`)));
  select.disabled = candidates.length === 0;
}

function clearErrors() {
  form.querySelectorAll(".field-error").forEach((n) => n.remove());
  form.querySelectorAll(".has-error").forEach((n) => n.classList.remove("has-error"));
  $("launch-error").hidden = true;
}

function showErrors(err) {
  clearErrors();
  const alertBox = $("launch-error");
  alertBox.textContent = err.message;
  alertBox.hidden = false;
  let placedAny = false;
  for (const [key, messages] of Object.entries(err.fields || {})) {
    const root = key.split(/[.[]/)[0];
    const name = root === "roles" ? "resources" : root;
    const holder = form.querySelector(`[data-field="${name}"]`) || form.querySelector('[data-field="non_field_errors"]');
    holder.classList.add("has-error");
    const target = holder.closest(".field") || holder;
    for (const m of messages) target.append(el("div.field-error", { "data-error-for": key }, m));
    placedAny = true;
  }
  const first = form.querySelector(".field-error");
  if (first) first.scrollIntoView({ block: "center", behavior: "smooth" });
  else if (!placedAny) alertBox.scrollIntoView({ block: "center" });
}

function spec() {
  const s = {
    image: $("f-image").value,
    resource_group: $("f-group").value,
    type: radioValue("type"),
    cluster_mode: radioValue("cluster_mode"),
    cluster_size: parseInt($("f-size").value, 10),
    resources: {
      cpu: $("f-cpu").value,
      mem: String(Math.round((Number($("f-mem").value) || 0) * 2 ** 30)),
    },
    mounts: [...form.querySelectorAll("#f-mounts input:checked")].map((b) => b.value),
    env: {},
    depends_on: [...$("f-deps").selectedOptions].map((o) => o.value),
  };
  if (Number.isNaN(s.cluster_size)) s.cluster_size = $("f-size").value;
  const gpu = Number($("f-gpu").value) || 0;
  const tplGpu = ((selectedTemplate() || {}).spec || {}).resources;
  if (gpu || (tplGpu && tplGpu["cuda.device"] !== undefined)) s.resources["cuda.device"] = String(gpu);
  const name = $("f-name").value.trim();
  if (name) s.name = name;
  if ($("f-template").value) s.template = Number($("f-template").value);
  if (s.type === "batch") s.startup_command = $("f-startup").value;
  for (const row of $("f-env").querySelectorAll(".env-row")) {
    const key = row.querySelector('[data-env="key"]').value.trim();
    if (key) s.env[key] = row.querySelector('[data-env="value"]').value;
  }
  return s;
}

async function submit(event) {
  event.preventDefault();
  clearErrors();
  const button = $("launch-submit");
  button.disabled = true;
  button.textContent = "Launching…";
  try {
    const detail = await api("sessions/", { method: "POST", body: spec() });
    opts.onCreated && opts.onCreated(detail);
    showProgress(detail);
  } catch (err) {
    if (err.fields) showErrors(err);
  } finally {
    button.disabled = false;
    button.textContent = "Launch";
  }
}

// --- save as template ------------------------------------------------------------

/** The dialog's spec as a template: what the launch would use (the selected template's
 * fields under the dialog's), without the session's own name and dependencies. */
function templateSpec() {
  const base = structuredClone((selectedTemplate() || {}).spec || {});
  const s = { ...base, ...spec() };
  s.resources = { ...(base.resources || {}), ...s.resources, mem: sizeText(Number(s.resources.mem)) };
  for (const key of ["name", "template", "depends_on"]) delete s[key];
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
  clearErrors();
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
    if (Object.keys(specFields).length) showErrors({ message: err.message, fields: specFields });
  } finally {
    button.disabled = false;
  }
}

// --- progress ----------------------------------------------------------------

function showProgress(detail) {
  launched = { id: detail.id, name: detail.name, status: "PENDING", reasons: {} };
  form.hidden = true;
  $("launch-progress").hidden = false;
  // The focused Launch button just vanished with the form: keyboard and screen
  // reader users continue from the progress heading.
  $("progress-title").focus();
  $("progress-name").textContent = detail.name;
  $("progress-sub").textContent = `${detail.cluster_size} container${detail.cluster_size === 1 ? "" : "s"} · ${detail.image} · ${detail.resource_group}`;
  $("progress-open").href = `/sessions/${detail.id}/`;
  $("progress-final").hidden = true;
  for (const event of detail.events || []) {
    if (!event.kernel) advance(event.to_status, event.reason);
  }
  advance(detail.status, detail.status_reason);
  for (const item of seen.get(detail.id) || []) advance(item.status, item.reason);
}

function advance(status, reason) {
  if (!launched || !status) return;
  const steps = $("progress-steps").querySelectorAll("li");
  const idx = STEPS.indexOf(status);
  const currentIdx = STEPS.indexOf(launched.status);
  if (idx >= 0 && idx < currentIdx) return; // a late push of an earlier step
  launched.status = status;
  if (reason) launched.reasons[status] = reason;
  window.launchState = { id: launched.id, status, reason };
  if (idx >= 0) {
    steps.forEach((li, i) => {
      li.className = i < idx ? (launched.reasons[STEPS[i]] || STEPS[i] !== "PULLING" ? "done" : "skipped") : i === idx ? (status === "RUNNING" ? "done" : "current") : "";
      li.querySelector(".step-reason").textContent = launched.reasons[STEPS[i]] || (i === 3 && i < idx && !launched.reasons.PULLING ? "not needed: the image is on the agent" : "");
    });
  }
  const final = $("progress-final");
  if (status === "RUNNING") {
    final.className = "alert alert-ok";
    final.textContent = "Your session is running. Open it for a terminal, logs and details.";
    final.hidden = false;
  } else if (isEnded(status) || status === "TERMINATING") {
    const cur = [...steps].find((li) => li.classList.contains("current"));
    if (cur) cur.className = "failed";
    final.className = "alert alert-error";
    final.textContent = `${status}: ${reason || "the session ended"}`;
    final.hidden = false;
  }
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

export function initLaunch(options) {
  opts = options;
  dialog = $("launch-modal");
  form = $("launch-form");
  wireDialog(dialog, () => { launched = null; });
  form.addEventListener("submit", submit);
  form.addEventListener("input", updateTotal);
  form.addEventListener("change", updateTotal);
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
}

/** Open the dialog; ``{template: id}`` fills it from that template (``/sessions/new/?template=<id>``). */
export async function openLaunch({ template } = {}) {
  form.hidden = false;
  toggleSaveTemplate(false);
  $("launch-progress").hidden = true;
  clearErrors();
  launched = null;
  window.launchState = null;
  if (!dialog.open) dialog.showModal();
  fillDependencies();
  updateTotal();
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
}
