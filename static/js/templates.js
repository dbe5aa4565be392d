// The templates list: the table is rendered by the server; this module deletes
// (after a confirmation) and imports YAML/JSON documents through the API,
// showing the API's errors with their field and line.
// Test hooks: window.templatesReady, window.importState {ok, fields}.

import { api, el, wireDialog } from "./common.js";
import { confirmDialog, noticeDialog } from "./dialogs.js";

const $ = (id) => document.getElementById(id);
const dialog = $("import-modal");
const form = $("import-form");

function say(text) {
  const status = $("status");
  status.textContent = text;
  status.hidden = false;
  const done = $("done");
  if (done) done.hidden = true;
}

async function remove(row) {
  const name = row.dataset.name;
  if (!(await confirmDialog({ title: `Delete template ${name}?`, message: "Sessions launched from it are not affected.", action: "Delete" }))) return;
  try {
    await api(`templates/${row.dataset.id}/`, { method: "DELETE" });
  } catch (err) {
    await noticeDialog("Could not delete", err.message);
    return;
  }
  row.remove();
  $("templates-empty").hidden = $("templates-body").rows.length > 0;
  say(`Deleted template “${name}”.`);
}

// --- import --------------------------------------------------------------------

function format() {
  return form.querySelector('input[name="format"]:checked').value;
}

function clearImportErrors() {
  $("import-error").hidden = true;
  $("import-errors").replaceChildren();
}

/** Select the line an error names, so it shows in the document. */
function markLine(number) {
  const area = $("import-document");
  const lines = area.value.split("\n");
  if (!(number >= 1 && number <= lines.length)) return;
  const start = lines.slice(0, number - 1).reduce((n, line) => n + line.length + 1, 0);
  area.focus();
  area.setSelectionRange(start, start + lines[number - 1].length);
  const lineHeight = parseFloat(getComputedStyle(area).lineHeight) || 18;
  area.scrollTop = Math.max(0, (number - 3) * lineHeight);
}

function showImportErrors(err) {
  $("import-message").textContent = err.fields && Object.keys(err.fields).length ? "The document was not imported:" : err.message;
  const items = [];
  let firstLine = null;
  for (const [field, messages] of Object.entries(err.fields || {})) {
    for (const message of messages) {
      items.push(el("li", { "data-field": field }, el("code", {}, field), " ", message));
      const m = /^line (\d+)/.exec(message);
      if (m && firstLine === null) firstLine = Number(m[1]);
    }
  }
  $("import-errors").replaceChildren(...items);
  $("import-error").hidden = false;
  window.importState = { ok: false, message: err.message, fields: err.fields || {} };
  if (firstLine !== null) markLine(firstLine);
}

async function submitImport(event) {
  event.preventDefault();
  clearImportErrors();
  const document_ = $("import-document").value;
  if (!document_.trim()) {
    showImportErrors({ message: "Pick a file or paste a document first.", fields: {} });
    return;
  }
  const button = $("import-submit");
  button.disabled = true;
  try {
    const template = await api("templates/import/", { method: "POST", body: { format: format(), document: document_ } });
    window.importState = { ok: true, id: template.id };
    location.assign(`/templates/?imported=${template.id}`);
  } catch (err) {
    showImportErrors(err);
  } finally {
    button.disabled = false;
  }
}

async function readFile() {
  const file = $("import-file").files[0];
  if (!file) return;
  const area = $("import-document");
  area.value = await file.text();
  const json = /\.json$/i.test(file.name) || file.type === "application/json" || /^\s*[{[]/.test(area.value);
  form.querySelector(`input[name="format"][value="${json ? "json" : "yaml"}"]`).checked = true;
  clearImportErrors();
  window.importFileRead = file.name;
}

$("templates-body").addEventListener("click", (event) => {
  const button = event.target.closest('[data-action="delete"]');
  if (button) remove(button.closest("tr"));
});
wireDialog(dialog);
$("import-open").addEventListener("click", () => {
  clearImportErrors();
  window.importState = null;
  dialog.showModal();
  $("import-document").focus();
});
$("import-file").addEventListener("change", readFile);
form.addEventListener("submit", submitImport);
window.templatesReady = true;
