// The Serving page: the user's endpoints (status, healthy/desired replicas, URL),
// refreshed every few seconds, and the "New endpoint" dialog, which sends one
// POST (with an autoscaling rule when a metric is chosen) and shows the API's
// field errors. Test hooks: window.servingReady, window.endpointCreated (its id).

import { api, badge, el, fmtStamp, parseSize, wireDialog } from "./common.js";
import { ruleFromForm } from "./rules.js";

const $ = (id) => document.getElementById(id);
const modal = $("endpoint-modal");
const form = $("endpoint-form");
wireDialog(modal);

function healthy(ep) {
  return (ep.routes || []).filter((r) => r.status === "HEALTHY").length;
}

function row(ep) {
  return el(
    "tr",
    { dataset: { id: ep.id, name: ep.name, status: ep.status } },
    el("td.name-cell", {}, el("a", { href: `/serving/${ep.id}/` }, ep.name), ep.open_to_public ? el("span.tag", {}, "public") : null),
    el("td", {}, badge(ep.status), ep.status_reason ? el("span.reason", {}, ep.status_reason) : null),
    el("td.num", { "data-role": "replicas" }, `${healthy(ep)} / ${ep.replicas}`),
    el("td", {}, el("span.mono", {}, ep.image)),
    el("td", {}, el("span.ep-url", {}, ep.url)),
    el("td.nowrap", {}, fmtStamp(ep.created_at)),
  );
}

function quota(q) {
  const limit = (n, what) => (n === null ? `no limit on ${what}` : `at most ${n} ${what}`);
  $("quota-endpoints").textContent = q.max_endpoints === null ? `${q.endpoint_count}` : `${q.endpoint_count} of ${q.max_endpoints}`;
  $("quota-replicas").textContent = `Each replica is one of your sessions and counts against your limits: ${limit(q.max_concurrent_sessions, "running")}, ${limit(q.max_pending_sessions, "pending")}.`;
}

async function load() {
  try {
    const [list, q] = await Promise.all([api("endpoints/"), api("endpoints/quota/")]);
    quota(q);
    $("endpoints-body").replaceChildren(...list.map(row));
    $("endpoints-empty").hidden = list.length > 0;
    $("error").hidden = true;
  } catch (err) {
    $("error").textContent = err.message;
    $("error").hidden = false;
  }
  window.servingReady = true;
}

let images = [];

// The start command's hint: the chosen image's serving command, or that one must be given.
function commandHint() {
  const image = images.find((i) => i.reference === $("ep-image").value);
  const serves = image && image.serve_command;
  $("ep-command").placeholder = serves ? image.serve_command : "required: this image has no serving command of its own";
  $("ep-command-hint").textContent = serves
    ? "Empty: the image's own model server, on the port below."
    : "This image has no model server of its own: give the command that starts yours, listening on the port below ($BAI_SERVE_PORT).";
}

async function openDialog() {
  let folders, groups;
  [images, folders, groups] = await Promise.all([api("images/"), api("folders/"), api("resource-groups/")]);
  $("ep-image").replaceChildren(...images.map((i) => el("option", { value: i.reference }, i.display_name ? `${i.display_name} (${i.reference})` : i.reference)));
  const serve = images.find((i) => i.serve_command) || images.find((i) => /serve/.test(i.reference));
  if (serve) $("ep-image").value = serve.reference;
  commandHint();
  $("ep-folder").replaceChildren(el("option", { value: "" }, "none"), ...folders.map((f) => el("option", { value: f.id }, f.permission === "owner" ? f.name : `${f.owner}/${f.name}`)));
  $("ep-group").replaceChildren(...groups.map((g) => el("option", { value: g.name }, g.name)));
  $("endpoint-error").hidden = true;
  modal.showModal();
  form.elements.name.focus();
}

function body() {
  const f = form.elements;
  const num = (name) => (f[name].value === "" ? undefined : Number(f[name].value));
  const out = {
    name: f.name.value.trim(),
    image: f.image.value,
    model_folder: f.model_folder.value ? Number(f.model_folder.value) : null,
    resource_group: f.resource_group.value,
    port: num("port"),
    health_path: f.health_path.value.trim(),
    resources: { cpu: f.cpu.value.trim(), mem: parseSize(f.mem.value) ?? f.mem.value.trim() },
    replicas: num("replicas"),
    min_replicas: num("min_replicas"),
    max_replicas: num("max_replicas"),
    open_to_public: f.open_to_public.checked,
  };
  if (f.start_command.value.trim()) out.start_command = f.start_command.value.trim();
  const rule = ruleFromForm(f, { min_replicas: out.min_replicas, max_replicas: out.max_replicas });
  if (rule) out.rules = [rule];
  return out;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  $("endpoint-submit").disabled = true;
  try {
    const ep = await api("endpoints/", { method: "POST", body: body() });
    window.endpointCreated = ep.id;
    location.assign(`/serving/${ep.id}/`);
  } catch (err) {
    $("endpoint-message").textContent = Object.keys(err.fields).length ? "The endpoint was not made:" : err.message;
    $("endpoint-errors").replaceChildren(...Object.entries(err.fields).flatMap(([k, v]) => [].concat(v).map((m) => el("li", { "data-field": k }, el("code", {}, k), " ", typeof m === "string" ? m : JSON.stringify(m)))));
    $("endpoint-error").hidden = false;
  } finally {
    $("endpoint-submit").disabled = false;
  }
});

$("ep-image").addEventListener("change", commandHint);
$("endpoint-new").addEventListener("click", () => openDialog().catch((err) => { $("error").textContent = err.message; $("error").hidden = false; }));
if (new URLSearchParams(location.search).has("new")) openDialog();
load();
setInterval(load, 5000);
