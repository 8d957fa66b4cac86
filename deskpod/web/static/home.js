// The Pod page: poll /ui/pod/usage.json every 2 s and update the bars, numbers and holders in place.
// Everything shown is set with textContent / createElement (never innerHTML): names come from users.
"use strict";

(() => {
  const config = JSON.parse(document.getElementById("pod-config").textContent);
  const root = "/ui";
  const live = document.getElementById("pod-live");
  const updated = document.getElementById("pod-updated");
  const pause = document.getElementById("pod-pause");
  let paused = false;
  let timer = null;
  let holders = null; // device index -> "job id" or null, to announce changes only

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  }

  // Bytes in binary units, as the server's `size` filter prints them.
  function size(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${units[i]}`;
  }

  // A utilization bar and its percentage; "-" when there is no figure.
  function bar(value, label) {
    if (value === null || value === undefined) return [el("span", { class: "muted" }, "-")];
    const pct = Math.max(0, Math.min(100, value));
    const inner = el("span");
    inner.style.width = pct.toFixed(1) + "%";
    const b = el("span", {
      class: "bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100",
      "aria-valuenow": String(Math.round(pct)), "aria-label": label,
    }, inner);
    return [b, " ", el("span", { class: "pct" }, Math.round(pct) + "%")];
  }

  function fill(node, parts) {
    if (node) node.replaceChildren(...parts);
  }

  function holderCell(d) {
    if (d.job === null) return [el("span", { class: "ok" }, "free")];
    const parts = [];
    if (d.can_open) {
      parts.push(el("a", { href: `${root}/jobs/${encodeURIComponent(d.job)}` }, `job ${d.job}`));
      if (d.job_name) parts.push(" ", el("span", {}, d.job_name));
    } else {
      parts.push(`job ${d.job}`);
    }
    parts.push(" ", el("span", { class: "muted" }, `· ${d.user}`));
    return parts;
  }

  function updateDevices(devices) {
    const changes = [];
    const now = {};
    for (const d of devices) {
      now[d.index] = d.job;
      const row = document.querySelector(`tr[data-device="${d.index}"]`);
      if (row) {
        fill(row.querySelector('[data-field="holder"]'), holderCell(d));
        fill(row.querySelector('[data-field="utilization"]'), bar(d.utilization, `utilization of ${d.label}`));
        const mem = row.querySelector('[data-field="memory"]');
        if (d.memory_total) {
          const pct = d.memory_used === null ? null : (100 * d.memory_used) / d.memory_total;
          fill(mem, [...bar(pct, `memory of ${d.label}`), " ",
            el("span", { class: "muted" }, `${size(d.memory_used)} of ${size(d.memory_total)}`)]);
        } else {
          fill(mem, [el("span", { class: "muted" }, "-")]);
        }
      }
      // The topology picture marks held devices too.
      const node = document.querySelector(`svg g.tp-node[data-device="${d.index}"]`);
      if (node) {
        node.classList.toggle("held", d.job !== null);
        const state = node.querySelector(".tp-state");
        if (state) state.textContent = d.job === null ? "free" : `job ${d.job}`;
        const title = node.querySelector("title");
        if (title) title.textContent = title.textContent.replace(/ · (held by job \S+|free)$/, d.job === null ? " · free" : ` · held by job ${d.job}`);
      }
      if (holders && holders[d.index] !== d.job) {
        changes.push(d.job === null ? `${d.label} is free` : `${d.label} now held by job ${d.job} (${d.user})`);
      }
    }
    holders = now;
    return changes;
  }

  function updateHost(usage) {
    const host = document.getElementById("pod-host");
    if (!host) return;
    fill(host.querySelector('[data-field="cpu"]'), bar(usage.cpu.total, "CPU utilization, all cores"));
    const m = usage.memory;
    if (m.total) {
      fill(host.querySelector('[data-field="mem"]'), bar((100 * m.used) / m.total, "host memory used"));
      fill(host.querySelector('[data-field="mem-text"]'), [`${size(m.used)} of ${size(m.total)}`]);
    }
    fill(host.querySelector('[data-field="load"]'), [usage.load ? usage.load.map((x) => x.toFixed(2)).join(" · ") : "-"]);
    const list = host.querySelector('[data-field="cores"]');
    if (list) {
      const items = usage.cpu.cores.map((c, i) => el("li", {}, el("span", { class: "name" }, `cpu${i}`), ...bar(c, `utilization of cpu${i}`)));
      list.replaceChildren(...items);
    }
    const interval = usage.cpu.interval_s;
    fill(host.querySelector('[data-field="interval"]'), [
      (interval ? `Busy share of the last ${interval.toFixed(1)} s` : "Average since boot") +
      " (from /proc/stat); memory used excludes reclaimable cache (/proc/meminfo).",
    ]);
  }

  function updateCounts(counts) {
    const changes = [];
    for (const key of ["free", "running", "queued"]) {
      const node = document.querySelector(`#pod-counts [data-count="${key}"]`);
      if (node && node.textContent !== String(counts[key])) {
        if (key !== "free") changes.push(`${counts[key]} ${key}`);
        node.textContent = String(counts[key]);
      }
    }
    return changes;
  }

  async function poll() {
    timer = null;
    if (paused || document.hidden) return; // resumed by the button or by the tab becoming visible
    try {
      const doc = await deskpod.getJSON(config.usage_url);
      const changes = [...updateDevices(doc.devices), ...updateCounts(doc.counts)];
      updateHost(doc.usage);
      updated.textContent = `Live: updated ${new Date().toLocaleTimeString()}, every ${config.interval_ms / 1000} s.`;
      if (changes.length) live.textContent = changes.join("; ") + ".";
    } catch (err) {
      live.textContent = `Live figures paused: ${err.message}. Retrying.`;
    }
    schedule();
  }

  function schedule() {
    if (timer === null && !paused) timer = setTimeout(poll, config.interval_ms);
  }

  pause.hidden = false;
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    if (paused) {
      if (timer !== null) { clearTimeout(timer); timer = null; }
      updated.textContent = "Live figures paused.";
    } else {
      poll();
    }
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) schedule(); });
  holders = null;
  poll();
})();
