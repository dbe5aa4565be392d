// The app launcher: one button per app of a session's main1 (Jupyter, the
// user's own ports). A click opens a blank tab at once (a tab opened after an
// await is a popup the browser may block), asks the launcher API for a
// one-time link, then sends the tab there; on failure the tab closes and the
// page says why in a live region.

import { api, el } from "./common.js";

function statusRegion() {
  let node = document.getElementById("app-launch-status");
  if (!node) {
    node = el("div.alert.app-launch-status", { id: "app-launch-status", role: "status", "aria-live": "polite", hidden: true });
    (document.querySelector("main") || document.body).prepend(node);
  }
  return node;
}

function say(text, { error = false } = {}) {
  const node = statusRegion();
  node.hidden = !text;
  node.textContent = text;
  node.classList.toggle("alert-error", error);
  node.classList.toggle("alert-wait", !error);
}

async function launch(session, app, button) {
  const tab = window.open("", "_blank");
  const label = button.textContent;
  const progress = `Starting ${app.title}…`;
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  button.textContent = progress;
  say(`${progress} (${session.name})`);
  if (tab) {
    tab.opener = null; // the app's origin gets no handle on this page
    tab.document.title = progress;
    if (tab.document.body) tab.document.body.textContent = progress;
  }
  try {
    const opened = await api(`sessions/${session.id}/apps/${encodeURIComponent(app.name)}/open/`, { method: "POST" });
    if (tab) tab.location.href = opened.url;
    else window.location.assign(opened.url); // popups refused outright: open it here
    say("");
  } catch (err) {
    if (tab) tab.close();
    say(`Could not open ${app.title}: ${err.message}`, { error: true });
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
    button.textContent = label;
  }
}

/** The launcher buttons of a session (none unless it runs); `small` for table rows. */
export function appButtons(session, { small = false } = {}) {
  if (session.status !== "RUNNING") return [];
  return (session.apps || []).filter((app) => app.protocol === "http").map((app) => {
    const button = el(small ? "button.btn.btn-xs.btn-app" : "button.btn.btn-app", {
      type: "button",
      "data-app": app.name,
      title: `Open ${app.title} of main1 in a new tab`,
    }, app.title);
    button.addEventListener("click", () => launch(session, app, button));
    return button;
  });
}
