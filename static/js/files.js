// One data folder's files, drawn from the REST API: walk the tree (the path is
// in the address, ?path=a/b, so back and forward work), upload many files or
// whole directories by drag and drop or the file input (each streamed by the
// browser in one PUT, with progress), download a file or a directory as a zip,
// make directories, rename and delete. A read-only share shows no writes.
// Test hooks: window.filesReady (the listing drawn), window.uploadsDone (count).

import { api, ApiError, csrfToken, el, fmtMem, fmtStamp, pageNotices, readJSON } from "./common.js";
import { confirmDialog } from "./dialogs.js";

const $ = (id) => document.getElementById(id);
const folderId = readJSON("folder-id");
let folder = null;
let path = new URLSearchParams(location.search).get("path") || "";
let writable = false;
window.uploadsDone = 0;

const join = (...parts) => parts.filter(Boolean).join("/");
const q = (p) => `?path=${encodeURIComponent(p)}`;

const { say, fail } = pageNotices();

// --- the listing --------------------------------------------------------------------

function crumbs() {
  const nav = $("crumbs");
  const parts = path ? path.split("/") : [];
  const items = [el("a", { href: "/folders/" }, "Data folders"), el("a", { href: `/folders/${folderId}/`, "data-path": "" }, folder.name)];
  parts.forEach((part, i) => items.push(el("a", { href: `/folders/${folderId}/${q(parts.slice(0, i + 1).join("/"))}`, "data-path": parts.slice(0, i + 1).join("/") }, part)));
  items[items.length - 1].setAttribute("aria-current", "page");
  nav.replaceChildren(...items.flatMap((a, i) => (i ? [el("span", { "aria-hidden": "true" }, "/"), a] : [a])));
  for (const a of nav.querySelectorAll("a[data-path]")) a.addEventListener("click", (e) => { e.preventDefault(); go(a.dataset.path); });
  $("path-title").textContent = `/${path}`;
  $("drop-target").textContent = `/${path}`;
  const zip = $("zip-link");
  zip.href = `/api/v1/folders/${folderId}/archive/${path ? q(path) : ""}`;
  zip.setAttribute("download", `${path ? parts[parts.length - 1] : folder.name}.zip`);
}

function nameCell(entry) {
  if (entry.type === "dir") {
    return el("a.file-name.is-dir", { href: `/folders/${folderId}/${q(entry.path)}`, onclick: (e) => { e.preventDefault(); go(entry.path); } }, `${entry.name}/`);
  }
  if (entry.type === "symlink") {
    return [el("span.file-name", {}, entry.name), " ", el("span.tag", { title: "Symbolic links are listed but never followed" }, "link, not followed")];
  }
  return el("span.file-name", {}, entry.name);
}

function fileRow(entry) {
  const download = entry.type === "file"
    ? el("a.btn.btn-xs", { href: `/api/v1/folders/${folderId}/files/content/${q(entry.path)}`, download: entry.name, "data-action": "download" }, "Download")
    : entry.type === "dir"
      ? el("a.btn.btn-xs", { href: `/api/v1/folders/${folderId}/archive/${q(entry.path)}`, download: `${entry.name}.zip`, "data-action": "download" }, "Zip")
      : null;
  return el(
    "tr",
    { dataset: { name: entry.name, type: entry.type } },
    el("td.name-cell", { "data-role": "name" }, nameCell(entry)),
    el("td.num", {}, entry.type === "file" ? fmtMem(entry.size) : ""),
    el("td.nowrap", {}, entry.modified ? el("time", { datetime: entry.modified }, fmtStamp(entry.modified)) : ""),
    el(
      "td.actions",
      {},
      download,
      writable ? el("button.btn.btn-xs", { type: "button", "data-action": "rename", onclick: (e) => rename(entry, e.target.closest("tr")) }, "Rename") : null,
      writable ? el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "delete", onclick: () => remove(entry) }, "Delete") : null,
    ),
  );
}

async function list() {
  let answer;
  try {
    answer = await api(`folders/${folderId}/files/${q(path)}`);
  } catch (err) {
    fail(err.message);
    $("files-body").replaceChildren();
    window.filesReady = true;
    return;
  }
  crumbs();
  $("files-body").replaceChildren(...answer.entries.map(fileRow));
  $("files-empty").hidden = answer.entries.length > 0;
  window.filesReady = true;
}

function go(next) {
  path = next;
  history.pushState({ path }, "", `/folders/${folderId}/${path ? q(path) : ""}`);
  window.filesReady = false;
  list();
}

window.addEventListener("popstate", () => {
  path = new URLSearchParams(location.search).get("path") || "";
  list();
});

// --- writes ------------------------------------------------------------------------

$("mkdir-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = $("mkdir-name").value.trim();
  if (!name) return fail("Name the new directory first.");
  try {
    await api(`folders/${folderId}/files/mkdir/`, { method: "POST", body: { path: join(path, name) } });
  } catch (err) {
    return fail(err.message);
  }
  $("mkdir-name").value = "";
  say(`Made directory “${name}”.`);
  await list();
});

function rename(entry, row) {
  const cell = row.querySelector('[data-role="name"]');
  const input = el("input.input-sm", { value: entry.name, "aria-label": `New name for ${entry.name}`, maxlength: 255 });
  const form = el(
    "form.inline-form",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        const name = input.value.trim();
        if (!name || name === entry.name) return list();
        try {
          await api(`folders/${folderId}/files/rename/`, { method: "POST", body: { path: entry.path, new_path: join(path, name) } });
        } catch (err) {
          fail(err.message);
          input.focus();
          return;
        }
        say(`Renamed “${entry.name}” to “${name}”.`);
        await list();
      },
    },
    input,
    el("button.btn.btn-xs.btn-primary", { type: "submit", "data-action": "rename-save" }, "Save"),
    el("button.btn.btn-xs.btn-ghost", { type: "button", onclick: () => list() }, "Cancel"),
  );
  cell.replaceChildren(form);
  input.focus();
  input.select();
}

async function remove(entry) {
  const what = entry.type === "dir" ? `directory “${entry.name}” and everything in it` : `“${entry.name}”`;
  if (!(await confirmDialog({ title: `Delete ${what}?`, message: "It is removed from the folder for every session and user that sees it. This cannot be undone.", action: "Delete" }))) return;
  try {
    await api(`folders/${folderId}/files/${q(entry.path)}`, { method: "DELETE" });
  } catch (err) {
    return fail(err.message);
  }
  say(`Deleted ${what}.`);
  await list();
}

// --- uploads -----------------------------------------------------------------------

/** PUT one file, its body streamed by the browser; resolves with the API's answer. */
function put(file, target, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", `/api/v1/folders/${folderId}/files/content/${q(target)}`);
    xhr.setRequestHeader("X-CSRFToken", csrfToken());
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = (e) => e.lengthComputable && onProgress(e.loaded, e.total);
    xhr.onload = () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { body = { message: xhr.responseText.slice(0, 300) }; }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new ApiError(xhr.status, body));
    };
    xhr.onerror = () => reject(new Error("the connection broke off"));
    xhr.send(file);
  });
}

async function upload(items) {
  if (!items.length) return;
  $("uploads").hidden = false;
  const base = path;
  const rows = items.map(({ file, rel }) => {
    const bar = el("progress", { max: 100, value: 0, "aria-label": `Upload of ${rel}` });
    const note = el("span.upload-note", {}, `0 of ${fmtMem(file.size)}`);
    const li = el("li", { dataset: { name: rel, state: "waiting" } }, el("span.file-name", {}, rel), bar, note);
    $("upload-list").prepend(li);
    return { file, rel, bar, note, li };
  });
  let failed = 0;
  // One at a time: each PUT already fills the link, and a refusal (quota) stops the rest early.
  for (const r of rows) {
    r.li.dataset.state = "sending";
    try {
      await put(r.file, join(base, r.rel), (loaded, total) => {
        r.bar.value = total ? (100 * loaded) / total : 100;
        r.note.textContent = `${fmtMem(loaded)} of ${fmtMem(total)}`;
      });
      r.bar.value = 100;
      r.note.textContent = `${fmtMem(r.file.size)} · done`;
      r.li.dataset.state = "done";
    } catch (err) {
      failed += 1;
      r.li.dataset.state = "failed";
      r.note.textContent = err.message;
      r.note.classList.add("field-error");
    }
    if (r === rows[rows.length - 1] && base === path) window.filesReady = false; // the listing below is redrawn
    window.uploadsDone += 1;
  }
  if (failed) fail(`${failed} of ${rows.length} upload(s) failed: ${rows.find((r) => r.li.dataset.state === "failed").note.textContent}`);
  else say(`Uploaded ${rows.length} file(s) into /${base}.`);
  if (base === path) await list();
}

$("upload-input").addEventListener("change", async (event) => {
  const files = [...event.target.files].map((file) => ({ file, rel: file.name }));
  event.target.value = "";
  await upload(files);
});

/** Every file under a dropped entry, with its path relative to the drop. */
async function walk(entry, prefix = "") {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
    return [{ file, rel: prefix + entry.name }];
  }
  if (!entry.isDirectory) return [];
  const reader = entry.createReader();
  const children = [];
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) break;
    children.push(...batch);
  }
  const out = [];
  for (const child of children) out.push(...(await walk(child, `${prefix}${entry.name}/`)));
  return out;
}

const zone = $("drop-zone");
zone.addEventListener("dragover", (event) => {
  if (!writable || !event.dataTransfer.types.includes("Files")) return;
  event.preventDefault();
  zone.classList.add("dragging");
});
zone.addEventListener("dragleave", (event) => {
  if (!zone.contains(event.relatedTarget)) zone.classList.remove("dragging");
});
zone.addEventListener("drop", async (event) => {
  if (!writable) return;
  event.preventDefault();
  zone.classList.remove("dragging");
  const entries = [...event.dataTransfer.items].map((item) => item.webkitGetAsEntry && item.webkitGetAsEntry()).filter(Boolean);
  const items = entries.length
    ? (await Promise.all(entries.map((e) => walk(e)))).flat()
    : [...event.dataTransfer.files].map((file) => ({ file, rel: file.name }));
  await upload(items);
});

// --- start ------------------------------------------------------------------------

async function start() {
  try {
    folder = (await api("folders/")).find((f) => f.id === folderId);
  } catch (err) {
    fail(err.message);
  }
  if (!folder) {
    fail("No such folder: it was deleted, or it is not yours or shared with you.");
    $("write-actions").hidden = true;
    $("drop-zone").hidden = true;
    window.filesReady = true;
    return;
  }
  writable = folder.permission !== "ro";
  document.title = `${folder.name} · Backend.AI Web`;
  $("folder-title").textContent = folder.name;
  $("folder-tag").replaceChildren(
    folder.permission === "owner" ? el("span.tag", {}, "own") : el("span.tag.tag-shared", {}, `${folder.owner}’s · ${folder.permission === "ro" ? "read-only" : "read-write"}`),
  );
  $("write-actions").hidden = !writable;
  if (!writable) {
    $("folder-note").textContent = `${folder.owner} shared this folder with you read-only: you can browse and download, not change it.`;
    $("files-empty-hint").textContent = "Nothing here yet.";
  }
  await list();
}

start();
