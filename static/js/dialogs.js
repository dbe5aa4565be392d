// The product's own confirmation and notice dialogs (never the browser's confirm()
// or alert()): a modal <dialog> in the style of the others, wired by common.js's
// wireDialog (Escape, backdrop click, ✕ and Cancel close it; Tab stays inside).
// Test hook: the open one is [data-role="confirm"]; its buttons are
// [data-action="confirm"] and [data-action="cancel"].

import { el, wireDialog } from "./common.js";

let made = 0;

/**
 * Ask before an action: resolves true when the user confirms, false on Cancel,
 * ✕, Escape or a click beside it. The focus starts on Cancel (the safe choice)
 * and goes back where it was when the dialog closes.
 * {title, message, action: the confirm button's words, danger: a red button;
 * withCancel: false for a notice with one button}
 */
export function confirmDialog({ title, message, action = "OK", danger = true, withCancel = true }) {
  const n = ++made;
  const cancel = withCancel ? el("button.btn.btn-ghost", { type: "button", "data-close": true, "data-action": "cancel" }, "Cancel") : null;
  const ok = el(`button.btn.${danger ? "btn-danger" : "btn-primary"}`, { type: "submit", value: "confirm", "data-action": "confirm" }, action);
  const dialog = el(
    "dialog.modal.modal-confirm",
    { role: "alertdialog", "aria-labelledby": `confirm-title-${n}`, "aria-describedby": `confirm-text-${n}`, "data-role": "confirm" },
    el(
      "form.modal-form",
      { method: "dialog" },
      el("div.modal-head", {},
        el("h2", { id: `confirm-title-${n}` }, title),
        el("button.icon-btn", { type: "button", "data-close": true, "aria-label": "Close" }, "✕")),
      el("div.modal-body", {}, el("p", { id: `confirm-text-${n}` }, message)),
      el("div.modal-foot", {},
        cancel, ok),
    ),
  );
  return new Promise((resolve) => {
    wireDialog(dialog, () => {
      resolve(dialog.returnValue === "confirm");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
    (cancel || ok).focus();
  });
}

/** A notice the user acknowledges (what the browser's alert() did): resolves once closed. */
export async function noticeDialog(title, message) {
  await confirmDialog({ title, message, action: "OK", danger: false, withCancel: false });
}
