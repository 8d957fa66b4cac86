// A video job's page: while the job is active, fetch the page's JSON twin every few seconds and redraw its
// streams, alerts and events in place (the search form and its results stay as they are). The page works
// without this script: it shows the figures as they were when it was loaded.
"use strict";

(() => {
  const holder = document.getElementById("video-data");
  if (!holder) return;
  const data = JSON.parse(holder.textContent);
  const $ = (id) => document.getElementById(id);
  const { el, getJSON } = deskpod;
  const STATE = { indexing: "running", done: "completed", failed: "failed" };

  const row = (cells, attrs) => {
    const tr = document.createElement("tr");
    for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
    for (const c of cells) tr.append(c);
    return tr;
  };
  const td = (content, cls) => {
    const cell = el("td", undefined, cls);
    if (content instanceof Node) cell.append(content);
    else if (content !== undefined && content !== null) cell.textContent = String(content);
    return cell;
  };

  function streams(stats) {
    const table = $("streams");
    $("no-stats").hidden = !!stats;
    table.hidden = $("track-line").hidden = !stats;
    if (!stats) return;
    $("track-count").textContent = stats.tracks;
    table.tBodies[0].replaceChildren(...stats.streams.map((st) => {
      const state = el("span", st.state, "state state-" + (STATE[st.state] || "stopped"));
      const fps = td(st.fps, "num");
      fps.title = "mean " + st.mean_fps;
      const lag = td(st.lag, "num");
      lag.title = "max " + st.max_lag;
      return row([td(el("code", st.name)), td(state), fps, lag, td(st.frames, "num"), td(st.tracks, "num"),
        td(st.error ? el("span", st.error, "error") : null)], { "data-stream": st.name });
    }));
  }

  function alerts(page) {
    const table = $("alerts");
    if (!table) return;
    const error = $("alerts-error");
    error.hidden = !page.alerts_error;
    error.textContent = page.alerts_error || "";
    if (page.alerts_error) return;  // keep the last ones shown
    const rows = page.alerts.map((a) => {
      const track = td(null);
      if (a.thumbnail_url) {
        const img = Object.assign(document.createElement("img"), { src: a.thumbnail_url, alt: "track " + a.track });
        img.style.height = "48px";
        track.append(img, " ");
      }
      track.append(`#${a.track} ${a.label}`);
      const rule = td(el("code", a.rule));
      rule.append(` (${a.kind})`);
      const delivery = td(a.state);
      if (a.error) delivery.append(" ", el("span", `(${a.error})`, "error"));
      return row([td("#" + a.id), td(a.raised), rule, td(el("code", a.stream)), track, td(a.t.toFixed(2), "num"),
        td(a.detail), delivery], { "data-alert": String(a.id) });
    });
    if (!rows.length) {
      const empty = td("No alerts yet.", "muted");
      empty.colSpan = 8;
      rows.push(row([empty], { class: "empty" }));
    }
    table.tBodies[0].replaceChildren(...rows);
  }

  function events(list) {
    const items = list.map((e) => {
      const li = el("li");
      li.append(el("time", e.at), " " + e.text);
      return li;
    });
    if (items.length) $("events").replaceChildren(...items);
  }

  async function refresh() {
    let page;
    try {
      page = await getJSON(data.url);
    } catch (e) {
      $("refresh-note").textContent = "not updated: " + e.message;
      return setTimeout(refresh, data.every_s * 1000);
    }
    const state = document.querySelector("h1 .state");
    if (state) {
      state.textContent = page.job.state;
      state.className = "state state-" + page.job.state;
    }
    streams(page.stats);
    alerts(page);
    events(page.events);
    $("updated").textContent = page.updated_s === null ? "" : ` · figures written ${page.updated_s} s ago`;
    if (page.refresh_s) {
      $("refresh-note").textContent = `updates every ${page.refresh_s} s`;
      setTimeout(refresh, page.refresh_s * 1000);
    } else {
      $("refresh-note").textContent = `job ${page.job.state}: final figures`;
    }
    document.body.dataset.videoRefreshed = String(Date.now());
  }

  setTimeout(refresh, data.every_s * 1000);
})();
