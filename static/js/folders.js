// The data folders page, drawn from the REST API: the user's folders and those
// shared with them, with size, file count and the live sessions that mount
// them; create, delete, share (read-only or read-write) and revoke; and SFTP
// system sessions on a set of ticked folders, with how to connect.
// Test hooks: window.foldersReady, window.sftpState[sessionId] = the last info.

import { api, badge, el, fmtMem, isEnded, pageNotices, wireDialog } from "./common.js";
import { confirmDialog } from "./dialogs.js";

const $ = (id) => document.getElementById(id);
const PERMISSION = { owner: "own", rw: "read-write", ro: "read-only" };
let folders = [];
let sharing = null; // the folder whose share dialog is open
const polls = new Map(); // SFTP session id → timer
const starting = new Set(); // SFTP sessions this page started that do not serve yet
window.sftpState = {};

const { say, fail } = pageNotices();

// --- the list --------------------------------------------------------------------

function quota(q) {
  $("quota-folders").textContent = q.max_folders === null ? `${q.folder_count}` : `${q.folder_count} of ${q.max_folders}`;
  $("quota-bytes").textContent = q.max_bytes === null ? `${fmtMem(q.used_bytes)} · no limit` : `${fmtMem(q.used_bytes)} of ${fmtMem(q.max_bytes)}`;
  const meter = $("quota-meter");
  meter.parentElement.hidden = q.max_bytes === null;
  if (q.max_bytes) {
    const share = Math.min(100, (100 * q.used_bytes) / q.max_bytes);
    meter.style.width = `${share}%`;
    meter.classList.toggle("meter-full", share >= 90);
  }
}

function ownerTag(f) {
  if (f.permission === "owner") {
    return f.shares.length
      ? el("span.tag.tag-shared", { title: f.shares.map((s) => `${s.user} (${PERMISSION[s.permission]})`).join(", ") }, `shared with ${f.shares.length}`)
      : el("span.tag", { title: "Only you see it" }, "own");
  }
  return el("span.tag.tag-shared", { "data-role": "shared-by" }, `${f.owner}’s · ${PERMISSION[f.permission]}`);
}

// Sessions wrote past the owner's byte quota (measured after the fact): uploads are refused.
function overQuotaTag(f) {
  const who = f.permission === "owner" ? "Your" : `${f.owner}’s`;
  const title = `${who} folders hold more than the byte quota: uploads are refused until files are deleted.`;
  return el("span.tag.tag-over", { "data-role": "over-quota", title }, "over quota");
}

function row(f) {
  const mine = f.permission === "owner" || f.can_manage;
  const tick = el("input", { type: "checkbox", value: f.id, "aria-label": `Select ${f.name} for SFTP`, onchange: selection });
  return el(
    "tr",
    { dataset: { id: f.id, name: f.name } },
    el("td.check-col", {}, tick),
    el("td.name-cell", {}, el("a", { href: `/folders/${f.id}/` }, f.name), " ", ownerTag(f)),
    el("td.num", { "data-role": "size" }, fmtMem(f.size_bytes), f.over_quota ? [" ", overQuotaTag(f)] : null),
    el("td.num", { "data-role": "files" }, String(f.file_count)),
    el(
      "td",
      { "data-role": "mounted-by" },
      f.mounted_by.length ? f.mounted_by.map((s, i) => [i ? ", " : "", el("a", { href: `/sessions/${s.id}/` }, s.name)]) : el("span.muted", {}, "—"),
    ),
    el(
      "td.actions",
      {},
      el("a.btn.btn-xs", { href: `/folders/${f.id}/`, "data-action": "browse" }, "Browse"),
      mine ? el("button.btn.btn-xs", { type: "button", "data-action": "share", onclick: () => openShare(f) }, "Share") : null,
      mine ? el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "delete", onclick: () => remove(f) }, "Delete") : null,
    ),
  );
}

function render() {
  const ticked = new Set(ticks().filter((t) => t.checked).map((t) => t.value));
  $("folders-body").replaceChildren(...folders.map(row));
  for (const t of ticks()) t.checked = ticked.has(t.value);
  $("folders-empty").hidden = folders.length > 0;
  selection();
}

async function load() {
  const [list, q] = await Promise.all([api("folders/"), api("folders/quota/")]);
  folders = list;
  quota(q);
  render();
}

// --- create and delete ----------------------------------------------------------

$("folder-create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("folder-name");
  const error = $("folder-name-error");
  error.hidden = true;
  input.removeAttribute("aria-invalid");
  const name = input.value.trim();
  try {
    if (!name) throw new Error("Name the folder first: up to 64 letters, digits, “_” or “-”.");
    await api("folders/", { method: "POST", body: { name } });
  } catch (err) {
    const fields = err.fields || {};
    error.textContent = fields.name ? `${name}: ${fields.name.join(" ")}` : err.message;
    error.hidden = false;
    input.setAttribute("aria-invalid", "true");
    input.focus();
    return;
  }
  input.value = "";
  await load();
  say(`Created folder “${name}”.`);
});

async function remove(f) {
  if (!(await confirmDialog({ title: `Delete folder ${f.name}?`, message: "The folder and every file in it are deleted. This cannot be undone.", action: "Delete folder" }))) return;
  try {
    await api(`folders/${f.id}/`, { method: "DELETE" });
  } catch (err) {
    fail(err.message);
    return;
  }
  await load();
  say(`Deleted folder “${f.name}”.`);
}

// --- sharing -----------------------------------------------------------------------

const shareModal = $("share-modal");
wireDialog(shareModal, () => { sharing = null; });

function shareItems(shares) {
  $("share-list").replaceChildren(
    ...(shares.length
      ? shares.map((s) =>
          el(
            "li",
            { dataset: { user: s.user } },
            el("b", {}, s.user), ` · ${PERMISSION[s.permission]} `,
            el("button.btn.btn-xs.btn-danger", { type: "button", "data-action": "revoke", onclick: () => revoke(s.user) }, "Revoke"),
          ),
        )
      : [el("li.muted", {}, "Nobody yet.")]),
  );
}

function openShare(f) {
  sharing = f;
  $("share-folder").textContent = f.name;
  $("share-error").hidden = true;
  $("share-user").value = "";
  shareItems(f.shares);
  shareModal.showModal();
  $("share-user").focus();
}

async function refreshShares() {
  const { shares } = await api(`folders/${sharing.id}/shares/`);
  sharing.shares = shares;
  shareItems(shares);
  await load();
}

$("share-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const user = $("share-user").value.trim();
  const permission = new FormData($("share-form")).get("permission");
  $("share-error").hidden = true;
  try {
    if (!user) throw new Error("Name the user to share with.");
    await api(`folders/${sharing.id}/shares/`, { method: "POST", body: { user, permission } });
  } catch (err) {
    const fields = err.fields || {};
    $("share-error").textContent = Object.values(fields).flat().join(" ") || err.message;
    $("share-error").hidden = false;
    return;
  }
  $("share-user").value = "";
  await refreshShares();
  say(`Shared “${sharing.name}” with ${user}, ${PERMISSION[permission]}.`);
});

async function revoke(user) {
  try {
    await api(`folders/${sharing.id}/shares/${encodeURIComponent(user)}/`, { method: "DELETE" });
  } catch (err) {
    $("share-error").textContent = err.message;
    $("share-error").hidden = false;
    return;
  }
  await refreshShares();
  say(`Revoked ${user}’s access to “${sharing.name}”. Sessions started from now on no longer mount it; running ones keep their mount.`);
}

// --- SFTP ----------------------------------------------------------------------------

function ticks() {
  return [...$("folders-body").querySelectorAll('input[type="checkbox"]')];
}

function selection() {
  const n = ticks().filter((t) => t.checked).length;
  $("sftp-count").textContent = String(n);
  $("sftp-open").disabled = n === 0;
}

$("sftp-open").addEventListener("click", async () => {
  const ids = ticks().filter((t) => t.checked).map((t) => Number(t.value));
  $("sftp-open").disabled = true;
  let session;
  try {
    session = await api("folders/sftp/", { method: "POST", body: { folders: ids } });
  } catch (err) {
    fail(err.message);
    selection();
    return;
  }
  for (const t of ticks()) t.checked = false;
  selection();
  say(`Starting an SFTP session on ${ids.length} folder(s)…`);
  starting.add(session.id);
  watchSftp(session.id);
  // The new session mounts the folders: their "Mounted by" names it from now on.
  load().catch((err) => fail(err.message));
});

function fact(label, value, key = label.toLowerCase()) {
  return [el("dt", {}, label), el("dd", { "data-fact": key }, value)];
}

function copyButton(text) {
  return el("button.btn.btn-xs", {
    type: "button",
    "data-action": "copy",
    onclick: async (event) => {
      await navigator.clipboard.writeText(text).catch(() => {});
      event.target.textContent = "Copied";
    },
  }, "Copy");
}

function sftpPanel(id, info, session) {
  const status = info.status || (session && session.status) || "PENDING";
  const ended = isEnded(status);
  // TERMINATING has no port either, but it is ending, not starting.
  const ending = status === "TERMINATING";
  const body = [];
  if (info.port) {
    body.push(
      el(
        "dl.facts",
        {},
        fact("Host", info.host),
        fact("Port", String(info.port)),
        fact("User", info.user),
        fact("Folders", info.folders.join(", ")),
        info.host_key_fingerprint ? fact("Host key", el("span.mono", {}, info.host_key_fingerprint), "fingerprint") : null,
      ),
      el("p.sftp-command", {}, el("code", { "data-role": "command" }, info.command), " ", copyButton(info.command)),
      el(
        "p.muted",
        {},
        "Save the key, make it private (",
        el("code", {}, "chmod 600"),
        ") and pass it with ",
        el("code", {}, "-i"),
        (info.authorized_keys || []).filter((k) => k !== "session key").length ? `; your registered keys work too: ${info.authorized_keys.filter((k) => k !== "session key").join(", ")}.` : ".",
        info.host_key_fingerprint ? " The first time you connect, your client shows the server's host key: go on only if it is the one above." : "",
      ),
    );
  } else if (ending) {
    body.push(el("p.muted", { "data-role": "ending" }, "Ending the SFTP session…"));
  } else if (!ended) {
    body.push(el("p.muted", { "data-role": "starting" }, "Starting the SFTP server…"));
  }
  if (ended && session && session.status_reason) body.push(el("p.reason", { "data-role": "reason" }, session.status_reason));
  return el(
    "article.sftp-session",
    { dataset: { id, status } },
    el(
      "div.sftp-head",
      {},
      el("h3", {}, el("a", { href: `/sessions/${id}/` }, (session && session.name) || id.slice(0, 8)), " ", badge(status)),
      el(
        "div.page-actions",
        {},
        info.port ? el("a.btn.btn-sm", { href: `/api/v1/sessions/${id}/sftp/key/`, download: `sftp-${id.slice(0, 8)}.key`, "data-action": "key" }, "Download key") : null,
        ended || ending ? null : el("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "terminate", onclick: () => terminate(id) }, "Terminate"),
      ),
    ),
    ...body,
  );
}

function showPanel(id, node) {
  const list = $("sftp-list");
  const old = list.querySelector(`[data-id="${id}"]`);
  if (old) old.replaceWith(node);
  else list.prepend(node);
  $("sftp-card").hidden = false;
}

async function watchSftp(id) {
  clearTimeout(polls.get(id));
  let session = null;
  let info = {};
  try {
    [session, info] = await Promise.all([api(`sessions/${id}/`), api(`sessions/${id}/sftp/`)]);
  } catch (err) {
    if (err.status === 404) return;
  }
  window.sftpState[id] = { ...info, status: (session && session.status) || info.status, reason: session && session.status_reason };
  showPanel(id, sftpPanel(id, info, session));
  const status = session ? session.status : info.status;
  const name = (session && session.name) || id.slice(0, 8);
  if (isEnded(status)) {
    starting.delete(id);
    const why = session && session.status_reason ? `: ${session.status_reason}` : "";
    // Ended as asked (Terminate, the idle timeout) is news, not an error; one that
    // could not start or broke is.
    if (status === "TERMINATED") say(`SFTP session ${name} ended${why}.`);
    else fail(`SFTP session ${name} ${status === "CANCELLED" ? "could not start" : "failed"}${why}`);
    await load();
    return;
  }
  if (info.port && starting.delete(id)) say(`SFTP session ${name} is ready: connect as shown under “SFTP sessions”.`);
  // Until it serves, quickly; then now and then, to see it end.
  polls.set(id, setTimeout(() => watchSftp(id), info.port ? 10000 : 1000));
}

async function terminate(id) {
  try {
    await api(`sessions/${id}/terminate/`, { method: "POST", body: {} });
  } catch (err) {
    fail(err.message);
    return;
  }
  say("Terminating the SFTP session.");
  watchSftp(id);
}

async function start() {
  try {
    await load();
    const sessions = await api("sessions/");
    for (const s of sessions.filter((s) => s.type === "system" && !isEnded(s.status))) watchSftp(s.id);
  } catch (err) {
    fail(err.message);
  }
  window.foldersReady = true;
}

start();
