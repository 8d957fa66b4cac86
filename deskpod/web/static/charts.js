// deskpod charts: line charts on a <canvas>, small code of our own (no third-party library).
//
//   const chart = new deskpodCharts.Chart(figure, { title, unit, series: [{ label, color, points }], onDraw });
//   chart.append(i, [[step, value], ...]);   // live points (re-decimated past 2x the budget)
//   chart.setPoints(i, points);              // a series afresh
//
// `figure` holds a <canvas>, and optionally an <output class="readout">, a .legend and a
// .chart-summary element (the text a screen reader gets). Colours are CSS variables (--fg, --muted,
// --line, a series' own --s1..--s6), read at each draw, so light and dark follow the page. A long
// series is drawn one pixel column at a time (first, lowest, highest, last value of the column), so
// 100,000 points cost what the canvas's width does. Hover, or focus the canvas and use the arrow keys
// (Shift: bigger jumps, Home/End, Escape), to read values; the readout says them in words.
"use strict";

const deskpodCharts = (() => {
  const BUDGET = 2000;
  const M = { left: 60, right: 14, top: 10, bottom: 30 };
  const FONT = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";

  function css(name, fallback) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  }

  // About `count` round tick values over [lo, hi]; with `widen` the range grows to whole steps;
  // `minStep` keeps ticks apart (steps are whole numbers: never a tick at 119.5).
  function ticks(lo, hi, count, widen, minStep = 0) {
    if (!(hi > lo)) {
      const d = Math.abs(lo) * 0.1 || 1;
      lo -= d;
      hi += d;
    }
    const step = Math.max(minStep, niceStep(hi - lo, count));
    if (widen) {
      lo = Math.floor(lo / step + 1e-9) * step;
      hi = Math.ceil(hi / step - 1e-9) * step;
    }
    const values = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-6; v += step) {
      values.push(Math.abs(v) < step * 1e-6 ? 0 : v);
    }
    return { lo, hi, step, values };
  }

  // A tick label with as many decimals as the step needs (no 0.30000000000000004).
  function tickLabel(v, step, unit) {
    if (unit === "percent") {
      const d = Math.max(0, -Math.floor(Math.log10(step * 100) + 1e-9));
      return (v * 100).toFixed(Math.min(d, 6)) + "%";
    }
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || step < 1e-4)) return v.toExponential(1);
    const d = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }

  function valueText(v, unit) {
    if (unit === "percent") return fmt(v * 100) + "%";
    return fmt(v);
  }

  const { el, fmt } = deskpod; // dashboard.js, which every page loads first

  // At most `budget` points: the first, the last, and each bucket's lowest and highest, in order
  // (what the server's downsample does, so a spike stays visible).
  function decimate(points, budget) {
    const n = points.length;
    if (n <= budget || budget < 4) return points;
    const buckets = Math.floor((budget - 2) / 2);
    const inner = n - 2;
    const out = [points[0]];
    for (let b = 0; b < buckets; b++) {
      const a = 1 + Math.floor((b * inner) / buckets);
      const z = 1 + Math.floor(((b + 1) * inner) / buckets);
      if (z <= a) continue;
      let lo = a, hi = a;
      for (let i = a + 1; i < z; i++) {
        if (points[i][1] < points[lo][1]) lo = i;
        if (points[i][1] > points[hi][1]) hi = i;
      }
      if (lo === hi) out.push(points[lo]);
      else if (lo < hi) out.push(points[lo], points[hi]);
      else out.push(points[hi], points[lo]);
    }
    out.push(points[n - 1]);
    return out;
  }

  // Index of the point whose step is nearest `x` (points sorted by step).
  function nearest(points, x) {
    let lo = 0, hi = points.length - 1;
    if (hi < 0) return -1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (points[mid][0] < x) lo = mid;
      else hi = mid;
    }
    return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? lo : hi;
  }

  class Chart {
    constructor(figure, opts) {
      this.figure = figure;
      this.canvas = figure.querySelector("canvas");
      this.readout = figure.querySelector(".readout");
      this.summary = figure.querySelector(".chart-summary");
      this.legend = figure.querySelector(".legend");
      this.title = opts.title || "";
      this.unit = opts.unit || "";
      this.budget = opts.budget || BUDGET;
      this.onDraw = opts.onDraw || null;
      this.series = (opts.series || []).map((s) => ({
        label: String(s.label),
        color: s.color || "--s1",
        points: decimate((s.points || []).slice(), this.budget * 2),
      }));
      this.cursor = null; // step of the point being read (hover or keyboard)
      this.scheduled = false;
      this.ctx = this.canvas.getContext("2d");
      if (!this.canvas.hasAttribute("tabindex")) this.canvas.tabIndex = 0;
      this.buildLegend();
      this.listen();
      this.drawNow();
    }

    append(i, points) {
      const s = this.series[i];
      if (!s || !points.length) return;
      for (const p of points) s.points.push(p);
      if (s.points.length > 2 * this.budget) s.points = decimate(s.points, this.budget);
      this.schedule();
    }

    setPoints(i, points) {
      const s = this.series[i];
      if (!s) return;
      s.points = decimate(points.slice(), this.budget * 2);
      this.schedule();
    }

    total() {
      return this.series.reduce((n, s) => n + s.points.length, 0);
    }

    buildLegend() {
      if (!this.legend) return;
      this.legend.textContent = "";
      for (const s of this.series) {
        const sw = el("span", null, "swatch");
        sw.style.background = `var(${s.color})`;
        sw.setAttribute("aria-hidden", "true");
        const item = el("span");
        item.append(sw, s.label);
        this.legend.append(item);
      }
    }

    listen() {
      const c = this.canvas;
      c.addEventListener("mousemove", (ev) => {
        const r = c.getBoundingClientRect();
        const x = this.fromPixel(ev.clientX - r.left);
        if (x === null) return;
        const p = this.primary();
        if (!p) return;
        this.cursor = p.points[nearest(p.points, x)][0];
        this.schedule();
      });
      c.addEventListener("mouseleave", () => {
        if (document.activeElement !== c) {
          this.cursor = null;
          this.schedule();
        }
      });
      c.addEventListener("focus", () => {
        const p = this.primary();
        if (p && this.cursor === null) this.cursor = p.points[p.points.length - 1][0];
        this.schedule();
      });
      c.addEventListener("blur", () => {
        this.cursor = null;
        this.schedule();
      });
      c.addEventListener("keydown", (ev) => {
        const p = this.primary();
        if (!p) return;
        const n = p.points.length;
        let i = this.cursor === null ? n - 1 : nearest(p.points, this.cursor);
        const jump = ev.shiftKey ? Math.max(1, Math.round(n / 10)) : 1;
        if (ev.key === "ArrowLeft" || ev.key === "ArrowDown") i -= jump;
        else if (ev.key === "ArrowRight" || ev.key === "ArrowUp") i += jump;
        else if (ev.key === "Home") i = 0;
        else if (ev.key === "End") i = n - 1;
        else if (ev.key === "Escape") {
          this.cursor = null;
          this.schedule();
          return;
        } else return;
        ev.preventDefault();
        i = Math.max(0, Math.min(n - 1, i));
        this.cursor = p.points[i][0];
        this.schedule();
      });
      if (window.ResizeObserver) new ResizeObserver(() => this.schedule()).observe(c);
      else window.addEventListener("resize", () => this.schedule());
      const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)");
      if (dark && dark.addEventListener) dark.addEventListener("change", () => this.schedule());
    }

    primary() {
      let best = null;
      for (const s of this.series) if (s.points.length && (!best || s.points.length > best.points.length)) best = s;
      return best;
    }

    fromPixel(px) {
      if (!this.frame) return null;
      const f = this.frame;
      const t = Math.max(0, Math.min(1, (px - M.left) / f.pw));
      return f.xlo + t * (f.xhi - f.xlo);
    }

    schedule() {
      if (this.scheduled) return;
      this.scheduled = true;
      requestAnimationFrame(() => {
        this.scheduled = false;
        this.drawNow();
      });
    }

    drawNow() {
      const c = this.canvas, ctx = this.ctx;
      const dpr = window.devicePixelRatio || 1;
      const w = c.clientWidth || 400, h = c.clientHeight || 220;
      if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
        c.width = Math.round(w * dpr);
        c.height = Math.round(h * dpr);
      }
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      const fg = css("--fg", "#1b1f24"), muted = css("--muted", "#5b636e"), line = css("--line", "#d5dae1");
      ctx.font = FONT;
      let xlo = Infinity, xhi = -Infinity, ylo = Infinity, yhi = -Infinity;
      for (const s of this.series) {
        for (const p of s.points) {
          if (p[0] < xlo) xlo = p[0];
          if (p[0] > xhi) xhi = p[0];
          if (p[1] < ylo) ylo = p[1];
          if (p[1] > yhi) yhi = p[1];
        }
      }
      const pw = Math.max(10, w - M.left - M.right), ph = Math.max(10, h - M.top - M.bottom);
      this.describe();
      if (!(xhi >= xlo)) {
        this.frame = null;
        ctx.fillStyle = muted;
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText("no data yet", w / 2, h / 2);
        this.finish();
        return;
      }
      if (xhi === xlo) {
        xlo -= 1;
        xhi += 1;
      }
      const yt = ticks(ylo, yhi, Math.max(2, Math.floor(ph / 42)), true);
      const xt = ticks(xlo, xhi, Math.max(2, Math.floor(pw / 90)), false, 1);
      const X = (x) => M.left + ((x - xlo) / (xhi - xlo)) * pw;
      const Y = (y) => M.top + ph - ((y - yt.lo) / (yt.hi - yt.lo)) * ph;
      this.frame = { xlo, xhi, pw };

      // grid and axes
      ctx.lineWidth = 1;
      ctx.strokeStyle = line;
      ctx.fillStyle = muted;
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      ctx.beginPath();
      for (const v of yt.values) {
        const y = Math.round(Y(v)) + 0.5;
        ctx.moveTo(M.left, y);
        ctx.lineTo(M.left + pw, y);
        ctx.fillText(tickLabel(v, yt.step, this.unit), M.left - 6, y);
      }
      ctx.stroke();
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      ctx.beginPath();
      for (const v of xt.values) {
        if (v < xlo || v > xhi) continue;
        const x = Math.round(X(v)) + 0.5;
        ctx.moveTo(x, M.top + ph);
        ctx.lineTo(x, M.top + ph + 4);
        const text = tickLabel(v, xt.step, "");
        const half = ctx.measureText(text).width / 2;
        ctx.fillText(text, Math.min(Math.max(x, half + 2), w - half - 2), M.top + ph + 7);
      }
      ctx.stroke();
      ctx.strokeStyle = muted;
      ctx.beginPath();
      ctx.moveTo(M.left + 0.5, M.top);
      ctx.lineTo(M.left + 0.5, M.top + ph + 0.5);
      ctx.lineTo(M.left + pw, M.top + ph + 0.5);
      ctx.stroke();
      ctx.textAlign = "right";
      ctx.fillText("step", M.left + pw, M.top + ph + 18);

      // series, one pixel column at a time
      ctx.save();
      ctx.beginPath();
      ctx.rect(M.left, M.top - 2, pw + 2, ph + 4);
      ctx.clip();
      for (const s of this.series) {
        if (!s.points.length) continue;
        const colour = css(s.color, fg);
        ctx.strokeStyle = colour;
        ctx.fillStyle = colour;
        ctx.lineWidth = 1.6;
        ctx.lineJoin = "round";
        ctx.beginPath();
        let col = null, first = 0, last = 0, lo = 0, hi = 0, started = false;
        const flush = () => {
          if (col === null) return;
          if (started) ctx.lineTo(col, first);
          else ctx.moveTo(col, first);
          started = true;
          if (lo !== hi) {
            ctx.lineTo(col, lo);
            ctx.lineTo(col, hi);
          }
          ctx.lineTo(col, last);
        };
        for (const p of s.points) {
          const px = Math.round(X(p[0])), py = Y(p[1]);
          if (px !== col) {
            flush();
            col = px;
            first = last = lo = hi = py;
          } else {
            last = py;
            if (py < lo) lo = py;
            if (py > hi) hi = py;
          }
        }
        flush();
        ctx.stroke();
        if (s.points.length <= 60) {
          for (const p of s.points) {
            ctx.beginPath();
            ctx.arc(X(p[0]), Y(p[1]), 2.5, 0, 2 * Math.PI);
            ctx.fill();
          }
        }
      }
      ctx.restore();

      // the point being read
      if (this.cursor !== null) {
        const x = X(this.cursor);
        ctx.strokeStyle = fg;
        ctx.lineWidth = 1;
        ctx.setLineDash([3, 3]);
        ctx.beginPath();
        ctx.moveTo(Math.round(x) + 0.5, M.top);
        ctx.lineTo(Math.round(x) + 0.5, M.top + ph);
        ctx.stroke();
        ctx.setLineDash([]);
        const parts = [];
        for (const s of this.series) {
          const i = nearest(s.points, this.cursor);
          if (i < 0) continue;
          const p = s.points[i];
          ctx.fillStyle = css(s.color, fg);
          ctx.beginPath();
          ctx.arc(X(p[0]), Y(p[1]), 4, 0, 2 * Math.PI);
          ctx.fill();
          const at = p[0] === this.cursor ? "" : ` (step ${fmt(p[0])})`;
          parts.push(`${s.label} ${valueText(p[1], this.unit)}${at}`);
        }
        if (this.readout) this.readout.textContent = `step ${fmt(this.cursor)}: ${parts.join(", ")}`;
      } else if (this.readout) {
        this.readout.textContent = "";
      }
      this.finish();
    }

    finish() {
      this.figure.dataset.points = String(this.total());
      if (this.onDraw) this.onDraw(this);
    }

    // The chart in words, for screen readers (and the canvas's description).
    describe() {
      if (!this.summary) return;
      const parts = [];
      for (const s of this.series) {
        const n = s.points.length;
        if (!n) {
          parts.push(`${s.label}: no points yet`);
          continue;
        }
        let lo = s.points[0], hi = s.points[0];
        for (const p of s.points) {
          if (p[1] < lo[1]) lo = p;
          if (p[1] > hi[1]) hi = p;
        }
        const a = s.points[0], z = s.points[n - 1];
        parts.push(
          `${s.label}: ${n.toLocaleString("en-US")} points from step ${fmt(a[0])} to ${fmt(z[0])}; latest ${valueText(z[1], this.unit)}, ` +
            `lowest ${valueText(lo[1], this.unit)} at step ${fmt(lo[0])}, highest ${valueText(hi[1], this.unit)} at step ${fmt(hi[0])}`
        );
      }
      this.summary.textContent = `${this.title}. ${parts.join(". ")}. Focus the chart and use the arrow keys to read values.`;
    }
  }

  // The moment a page's first chart is drawn, for the benchmark (performance.mark "deskpod:first-chart").
  let marked = false;
  function markFirstDraw() {
    if (!marked) {
      marked = true;
      performance.mark("deskpod:first-chart");
    }
  }

  return { Chart, decimate, ticks, markFirstDraw, BUDGET };
})();
