// deskpod dashboard: what every page shares. Pages work without it; this adds confirmations and helpers.
"use strict";

const deskpod = (() => {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  // POST JSON-less requests with the session's CSRF token; resolves to the parsed JSON answer.
  async function post(url, body) {
    const opts = { method: "POST", headers: { "X-CSRF-Token": csrf(), Accept: "application/json" }, credentials: "same-origin" };
    if (body instanceof FormData) opts.body = body;
    else if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
    const r = await fetch(url, opts);
    const doc = await r.json().catch(() => ({ error: r.statusText }));
    if (!r.ok) throw new Error(doc.error || r.statusText);
    return doc;
  }

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    const doc = await r.json().catch(() => ({ error: r.statusText }));
    if (r.status === 401) { location.href = "/ui/login?next=" + encodeURIComponent(location.pathname + location.search); }
    if (!r.ok) throw new Error(doc.error || r.statusText);
    return doc;
  }

  // An element holding ``text`` as text (never as markup), with class ``cls``.
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  // <form data-confirm="Cancel job 3?">: ask in a dialog first (the server asks again without JavaScript).
  // data-confirm-for="cancel": ask only when the button pressed has that value (a form with several actions).
  function confirmForms() {
    for (const form of document.querySelectorAll("form[data-confirm]")) {
      form.addEventListener("submit", (ev) => {
        if (form.dataset.confirmed === "1") return;
        const submitter = ev.submitter || null;
        if (form.dataset.confirmFor && (!submitter || submitter.value !== form.dataset.confirmFor)) return;
        ev.preventDefault();
        const dlg = document.createElement("dialog");
        dlg.setAttribute("aria-labelledby", "confirm-text");
        const p = el("p", form.dataset.confirm);
        p.id = "confirm-text";
        const yes = el("button", form.dataset.confirmYes || "Yes", "danger");
        const no = el("button", "No, keep it", "secondary");
        const row = el("p");
        row.append(yes, " ", no);
        dlg.append(p, row);
        document.body.append(dlg);
        no.addEventListener("click", () => { dlg.close(); dlg.remove(); });
        yes.addEventListener("click", () => {
          form.dataset.confirmed = "1";
          form.append(Object.assign(document.createElement("input"), { type: "hidden", name: "confirmed", value: "1" }));
          dlg.close(); dlg.remove();
          form.requestSubmit(submitter);  // the same button: its name and value go with the form
        });
        dlg.showModal();
        no.focus();
      });
    }
  }

  // Numbers as the server prints them: 3 significant digits, thousands separated.
  function fmt(x) {
    if (x === null || x === undefined || !isFinite(x)) return "-";
    if (Number.isInteger(x) && Math.abs(x) >= 1) return x.toLocaleString("en-US");
    const a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
    return Number(x.toPrecision(3)).toLocaleString("en-US", { maximumSignificantDigits: 3 });
  }

  document.addEventListener("DOMContentLoaded", confirmForms);
  return { csrf, post, getJSON, fmt, el };
})();
