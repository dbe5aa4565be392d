// The top bar's menu on narrow screens: the Menu button opens and closes the main
// navigation (app.css shows the links inline on wider screens and hides the button).

const toggle = document.getElementById("nav-menu-toggle");
const nav = document.getElementById("main-nav");

function setOpen(open) {
  toggle.setAttribute("aria-expanded", String(open));
  nav.classList.toggle("open", open);
}

if (toggle && nav) {
  toggle.addEventListener("click", () => setOpen(toggle.getAttribute("aria-expanded") !== "true"));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && nav.classList.contains("open")) {
      setOpen(false);
      toggle.focus();
    }
  });
}
