// kubetrain dashboard: live refresh of each [data-live] block, filters that apply
// on change, and confirmation of destructive forms. No inline script anywhere (CSP).
"use strict";

function refresh(block) {
  const seconds = Number(block.dataset.liveSeconds || "5");
  const tick = async () => {
    if (document.visibilityState === "visible") {
      try {
        const response = await fetch(block.dataset.live, {
          credentials: "same-origin",
          headers: { Accept: "text/html" },
        });
        if (response.redirected || response.status === 401) {
          window.location.reload(); // the session ended: show the sign-in page
          return;
        }
        if (response.ok) {
          // A disclosure the reader opened ("Show all N checkpoints") stays open.
          const opened = [...block.querySelectorAll("details[id][open]")].map((d) => d.id);
          // The server escaped every value in this fragment; nothing in it is script.
          block.innerHTML = await response.text();
          opened.forEach((id) => document.getElementById(id)?.setAttribute("open", ""));
          block.dataset.refreshed = String(Date.now());
        }
      } catch (error) {
        // Offline for a moment: keep what is shown and try again at the next tick.
      }
    }
    window.setTimeout(tick, seconds * 1000);
  };
  window.setTimeout(tick, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(refresh);
  document.querySelectorAll("form[data-autosubmit] select").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });
});

// Delegated: a live refresh replaces the forms inside a [data-live] block.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
});
