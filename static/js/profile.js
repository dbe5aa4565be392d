// The profile page's SSH keys, drawn from the REST API: list, add (the API
// checks the key and gives its fingerprint), delete.
// Test hook: window.keysReady.

import { api, el, fmtStamp } from "./common.js";
import { confirmDialog } from "./dialogs.js";

const $ = (id) => document.getElementById(id);

function fail(text) {
  $("key-error").textContent = text;
  $("key-error").hidden = !text;
}

function keyRow(key) {
  return el(
    "tr",
    { dataset: { id: key.id, name: key.name } },
    el("td", {}, el("b", {}, key.name)),
    el("td", {}, el("span.mono", { "data-role": "fingerprint" }, key.fingerprint)),
    el("td.nowrap", {}, el("time", { datetime: key.created_at }, fmtStamp(key.created_at))),
    el("td.actions", {}, el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "delete", onclick: () => remove(key) }, "Delete")),
  );
}

async function load() {
  const keys = await api("ssh-keys/");
  $("keys-body").replaceChildren(
    ...(keys.length ? keys.map(keyRow) : [el("tr", {}, el("td.empty", { colspan: 4 }, el("p", {}, "No SSH keys. Add one below to log in to SFTP sessions with your own key.")))]),
  );
  window.keysReady = true;
}

async function remove(key) {
  if (!(await confirmDialog({ title: `Delete SSH key ${key.name}?`, message: "SFTP sessions started from now on no longer accept it.", action: "Delete" }))) return;
  try {
    await api(`ssh-keys/${key.id}/`, { method: "DELETE" });
  } catch (err) {
    return fail(err.message);
  }
  fail("");
  await load();
}

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  fail("");
  try {
    await api("ssh-keys/", { method: "POST", body: { name: $("key-name").value.trim(), public_key: $("key-text").value.trim() } });
  } catch (err) {
    const fields = err.fields || {};
    const lines = Object.entries(fields).map(([k, v]) => `${k.replace("_", " ")}: ${[].concat(v).join(" ")}`);
    return fail(lines.length ? lines.join(" · ") : err.message);
  }
  $("key-name").value = "";
  $("key-text").value = "";
  await load();
});

load().catch((err) => fail(err.message));
