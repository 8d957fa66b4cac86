// The Job page: live charts, header and log over one EventSource; log search and stacks in place.
// The page works without this script (forms post and reload); with it nothing reloads.
"use strict";

(() => {
  const holder = document.getElementById("job-data");
  if (!holder) return;
  const data = JSON.parse(holder.textContent);
  const $ = (id) => document.getElementById(id);
  const pad = (n) => String(n).padStart(2, "0");
  const clock = (t) => {
    if (t === null || t === undefined) return "-";
    const d = new Date(t * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  };
  const { el } = deskpod;

  // --- charts (drawn at once from the page's own data; the benchmark reads the mark)
  const lines = new Map(); // series id ("train/loss") -> [[chart, index], ...]
  const onDraw = deskpodCharts.markFirstDraw;
  for (const c of data.charts || []) {
    const fig = $("chart-" + c.id);
    if (!fig) continue;
    const chart = new deskpodCharts.Chart(fig, { title: c.title, unit: c.unit, series: c.series, onDraw });
    c.series.forEach((s, i) => {
      if (!lines.has(s.id)) lines.set(s.id, []);
      lines.get(s.id).push([chart, i]);
    });
  }

  // --- the log: follows the end, keeps the last MAX_LINES lines in the page
  const MAX_LINES = 2000;
  const log = $("log");
  const follow = $("log-follow");
  const newlines = (s) => {
    let n = 0;
    for (let i = s.indexOf("\n"); i >= 0; i = s.indexOf("\n", i + 1)) n++;
    return n;
  };
  let logLines = newlines(log.textContent);
  const toEnd = () => {
    if (follow && follow.checked) log.scrollTop = log.scrollHeight;
  };
  function trimLog() {
    while (logLines > MAX_LINES && log.firstChild) {
      const node = log.firstChild;
      const text = node.textContent;
      const inNode = newlines(text);
      const excess = logLines - MAX_LINES;
      if (inNode <= excess) {
        node.remove();
        logLines -= inNode;
        if (!inNode) continue;
      } else {
        let cut = 0;
        for (let k = 0; k < excess; k++) cut = text.indexOf("\n", cut) + 1;
        node.textContent = text.slice(cut);
        logLines -= excess;
      }
    }
  }
  function appendLog(text, reset) {
    if (reset) {
      log.textContent = "";
      logLines = 0;
    }
    if (text) {
      log.append(document.createTextNode(text));
      logLines += newlines(text);
      trimLog();
      if (log.childNodes.length > 200) log.normalize();
    }
    toEnd();
  }
  toEnd();

  // --- the header: state, times, buttons, history
  function setState(s) {
    const st = $("st-state");
    st.textContent = s.state;
    st.className = "state state-" + s.state;
    $("st-reason").hidden = !s.reason;
    $("st-reason-text").textContent = s.reason || "";
    $("st-devices").textContent = String(s.devices);
    $("st-assigned").textContent = s.assigned && s.assigned.length ? " on " + s.assigned.join(",") : "";
    $("st-submitted").textContent = clock(s.submitted_at);
    $("st-started").textContent = clock(s.started_at);
    $("st-finished").textContent = clock(s.finished_at);
    $("st-attempt").textContent = String(s.attempt);
    $("st-exit").textContent = s.exit_code === null ? "-" : String(s.exit_code);
    $("act-cancel").hidden = !s.can_cancel;
    $("act-requeue").hidden = !s.can_requeue;
    $("act-stacks").hidden = !s.active;
    const rows = $("history-rows");
    rows.textContent = "";
    for (const e of s.events || []) {
      const tr = el("tr");
      const to = el("td");
      to.append(el("span", e.to, "state state-" + e.to));
      tr.append(el("td", clock(e.at)), el("td", e.from || ""), to, el("td", e.note));
      rows.append(tr);
    }
  }

  // --- the stream: one EventSource per tab; deltas only
  const status = $("live-status");
  function connect() {
    if (data.final || !window.EventSource) return;
    const es = new EventSource(data.events + "?cursor=" + encodeURIComponent(data.cursor));
    es.addEventListener("open", () => { status.textContent = "live"; });
    es.addEventListener("error", () => {
      status.textContent = es.readyState === EventSource.CLOSED ? "live updates stopped; reload the page" : "reconnecting…";
    });
    es.addEventListener("state", (ev) => setState(JSON.parse(ev.data)));
    // When each train step arrived (ms since the epoch): tests and the live-update benchmark read it.
    const arrived = (window.deskpodLive = window.deskpodLive || {});
    es.addEventListener("metrics", (ev) => {
      const d = JSON.parse(ev.data);
      const now = Date.now();
      for (const [step] of d.series["train/loss"] || []) arrived[step] = now;
      for (const [id, pts] of Object.entries(d.series)) for (const [chart, i] of lines.get(id) || []) chart.append(i, pts);
    });
    es.addEventListener("reset", (ev) => {
      const d = JSON.parse(ev.data);
      for (const [id, targets] of lines) for (const [chart, i] of targets) chart.setPoints(i, d.series[id] || []);
    });
    es.addEventListener("run", (ev) => {
      // The run's summary, checkpoints and config, rendered (and escaped) by the server's templates.
      for (const [id, html] of Object.entries(JSON.parse(ev.data).html)) {
        const box = $(id);
        if (box) box.innerHTML = html;
      }
    });
    es.addEventListener("log", (ev) => {
      const d = JSON.parse(ev.data);
      appendLog(d.text, d.reset);
    });
    es.addEventListener("end", () => {
      es.close();
      status.textContent = "finished; everything is shown";
    });
  }
  connect();

  // --- log search in place (the form works without this too)
  const form = $("search-form");
  const out = $("search-out");
  function renderHits(r) {
    out.textContent = "";
    const summary = el("p", `${r.hits.toLocaleString("en-US")} matching line${r.hits === 1 ? "" : "s"} for `);
    summary.id = "search-summary";
    summary.append(el("code", r.query));
    if (r.capped) summary.append(` — showing the first ${r.max_hits}; there are more (narrow the search)`);
    if (r.partial && r.partial.length) summary.append(`; not read to the end: ${r.partial.join(", ")}`);
    summary.append(".");
    out.append(summary);
    const list = el("ol", null, "hits");
    for (const b of r.blocks) {
      const li = el("li");
      li.append(el("span", b.file, "mono"));
      const pre = el("pre");
      for (const ln of b.lines) {
        pre.append(el("span", String(ln.line).padStart(6, " ") + (ln.match ? ": " : "- "), "muted"));
        let at = 0;
        for (const [a, z] of ln.spans) {
          pre.append(ln.text.slice(at, a));
          pre.append(el("mark", ln.text.slice(a, z)));
          at = z;
        }
        pre.append(ln.text.slice(at) + "\n");
      }
      li.append(pre);
      list.append(li);
    }
    out.append(list);
  }
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const params = new URLSearchParams(new FormData(form));
      const q = $("q");
      out.textContent = "Searching…";
      try {
        const r = await deskpod.getJSON(data.search + ".json?" + params.toString());
        q.removeAttribute("aria-invalid");
        renderHits(r);
        history.replaceState(null, "", data.search + "?" + params.toString() + "#search");
      } catch (e) {
        out.textContent = "";
        const p = el("p", e.message, "error");
        p.id = "q-error";
        p.setAttribute("role", "alert");
        out.append(p);
        q.setAttribute("aria-invalid", "true");
        q.setAttribute("aria-describedby", "q-error");
      }
    });
  }

  // --- "where is it now?": every rank's stack, in place
  const sf = $("stacks-form");
  function renderStacks(r) {
    const box = $("stacks-out");
    box.textContent = "";
    box.append(el("p", `py-spy dump at ${clock(r.at)}${r.targets.length ? "" : ": no processes found"}`, "muted"));
    for (const n of r.notes || []) box.append(el("p", n, "muted"));
    for (const t of r.targets) {
      const h = el("h3", `${t.rank === null ? "Process" : "Rank " + t.rank} · pid ${t.pid} `);
      const cmd = el("span", t.command, "muted mono");
      cmd.style.fontWeight = "normal";
      cmd.style.fontSize = "0.8em";
      h.append(cmd);
      box.append(h, t.ok ? el("pre", t.text) : el("p", t.error, "error"));
    }
  }
  if (sf) {
    sf.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const button = sf.querySelector("button");
      const section = $("stacks");
      section.hidden = false;
      button.disabled = true;
      $("stacks-out").textContent = "Running py-spy on every process of the job…";
      try {
        renderStacks(await deskpod.post(data.stacks));
      } catch (e) {
        $("stacks-out").textContent = "";
        $("stacks-out").append(el("p", e.message, "error"));
      } finally {
        button.disabled = false;
      }
      section.scrollIntoView({ block: "start" });
    });
  }
})();
