// deskpod dashboard, Models and Try pages: follow deployments that are starting; preview the chosen image.
"use strict";

(() => {
  const el = document.getElementById("models-data");
  if (!el) return;
  const cfg = JSON.parse(el.textContent);
  const WAITING = new Set(["queued", "starting", "stopping"]);
  // Status -> the stylesheet's state colour (the same table as the templates').
  const TONES = { ready: "running", starting: "queued", queued: "queued", stopping: "preempted", error: "failed", failed: "failed", stopped: "stopped" };
  const live = document.getElementById("models-live"); // the Try page's status line is a live region itself

  // The chosen file, shown before it is sent (a blob: URL; nothing leaves the browser until Predict).
  const input = document.getElementById("t-image");
  const preview = document.getElementById("t-preview");
  let blobUrl = null;
  if (input && preview) {
    input.addEventListener("change", () => {
      if (blobUrl) URL.revokeObjectURL(blobUrl);
      const f = input.files && input.files[0];
      if (!f) { preview.hidden = true; blobUrl = null; return; }
      blobUrl = URL.createObjectURL(f);
      preview.src = blobUrl;
      preview.hidden = false;
    });
  }

  // A form the user has started filling is not thrown away by a reload: rows are updated in place instead.
  let dirty = false;
  for (const f of document.querySelectorAll("form")) f.addEventListener("input", () => { dirty = true; });

  const rows = (doc) => doc.deployments || (doc.deployment ? [doc.deployment] : []);
  const key = (list) => list.map((d) => `${d.id}:${d.status}`).join(",");
  let known = key(cfg.ids.map((id, i) => ({ id, status: cfg.statuses[i] })));

  function apply(list) {
    for (const d of list) {
      const row = document.querySelector(`[data-deployment="${CSS.escape(d.id)}"]`) || document;
      for (const field of ["state", "status", "detail"]) {
        const node = row.querySelector(`[data-field="${field}"]`);
        if (node) {
          node.textContent = d[field] || "";
          if (field === "status") node.className = `state state-${TONES[d.status] || "queued"}`;
        }
      }
      const t = row.querySelector("[data-try]");
      if (t) t.hidden = !d.ready;
    }
  }

  async function poll() {
    let doc;
    try { doc = await deskpod.getJSON(cfg.poll); } catch (e) { setTimeout(poll, 5000); return; }
    const list = rows(doc);
    const now = key(list);
    if (now !== known) {
      if (!dirty) { location.assign(cfg.page); return; } // the whole page again (metadata, buttons), by GET
      apply(list);
      const ready = list.filter((d) => d.ready).map((d) => `deployment ${d.id} is ready`);
      if (live) live.textContent = ready.join("; ");
      known = now;
    }
    if (list.some((d) => WAITING.has(d.status))) setTimeout(poll, 2000);
  }

  if (cfg.statuses.some((s) => WAITING.has(s))) setTimeout(poll, 2000);
})();
