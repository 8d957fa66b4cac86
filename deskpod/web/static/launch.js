// New training, step 3: the preview (placement, prediction, CLI line, API call) follows the fields as they change.
// The page works without this: "Update preview" posts the form and comes back with the values in the URL.
"use strict";

(() => {
  const form = document.getElementById("train-form");
  if (!form) return;
  const FIELDS = ["devices", "epochs", "steps", "batch_size", "precision", "optimizer", "lr", "name"];
  const SKIP = new Set(["csrf", "action"]);
  const byId = (id) => document.getElementById(id);
  let timer = null;
  let asked = 0;

  function query() {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) {
      if (!SKIP.has(k) && typeof v === "string" && v.trim() !== "") q.append(k, v.trim());
    }
    return q.toString();
  }

  function text(id, value) {
    const el = byId(id);
    if (el) el.textContent = value || "";
  }

  function showErrors(errors) {
    for (const name of FIELDS) {
      const input = form.elements[name];
      const message = errors[name] || "";
      text(name + "-error", message);
      if (!input) continue;
      if (message) {
        input.setAttribute("aria-invalid", "true");
        input.setAttribute("aria-describedby", name + "-hint " + name + "-error");
      } else {
        input.removeAttribute("aria-invalid");
        input.setAttribute("aria-describedby", name + "-hint");
      }
    }
  }

  function showRows(rows) {
    const cells = (rows || []).map(([k, v]) => {
      const cell = deskpod.el("div");
      cell.append(deskpod.el("span", k, "k"), deskpod.el("span", v, "v"));
      return cell;
    });
    byId("pv-rows").replaceChildren(...cells);
  }

  function show(doc) {
    showErrors(doc.errors || {});
    text("form-error", doc.error);
    const pl = doc.placement;
    text("pv-placement", pl ? pl.text : "Fix the devices above to see where it would run.");
    text("pv-ring", pl ? pl.ring_text : "");
    text("pv-placement-note", pl ? pl.note : "");
    const pr = doc.prediction;
    showRows(pr ? pr.rows : []);
    text("pv-prediction", pr ? pr.message : "Fix the values above to see the plan.");
    text("pv-layout", pr && pr.layout ? pr.layout.text + " (the trainer's layout, which the prediction assumes)." : "");
    const cal = byId("calibrate-form");
    if (cal) {
      cal.hidden = !(pr && pr.can_calibrate);
      cal.elements.next.value = location.pathname + location.search; // back to this form after queueing it
    }
    text("pv-cli", doc.cli || "Fix the values marked above to see the command.");
    text("pv-curl", doc.curl || "Fix the values marked above to see the request.");
  }

  async function refresh() {
    const q = query();
    const mine = ++asked;
    // The URL holds the form: a reload, a shared link or a sign-in after an expired session keeps every value.
    history.replaceState(null, "", form.dataset.page + "?" + q);
    try {
      const doc = await deskpod.getJSON(form.dataset.preview + "?" + q);
      if (mine === asked) {
        show(doc);
        if (doc.query !== undefined) history.replaceState(null, "", form.dataset.page + "?" + doc.query);
      }
    } catch (e) {
      if (mine === asked) text("form-error", "The preview failed: " + e.message);
    }
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }

  form.addEventListener("input", later);
  form.addEventListener("change", later);
  const button = byId("preview-button");
  if (button) button.remove(); // the preview follows the fields by itself
  history.replaceState(null, "", form.dataset.page + "?" + query());
})();
