// The Compare page: one chart per metric, a line per run (colours as in the legend above).
"use strict";

(() => {
  const holder = document.getElementById("compare-data");
  if (!holder) return;
  const data = JSON.parse(holder.textContent);
  const onDraw = deskpodCharts.markFirstDraw;
  for (const c of data.charts || []) {
    const fig = document.getElementById("chart-" + c.id);
    if (fig) new deskpodCharts.Chart(fig, { title: c.title, unit: c.unit, series: c.series, onDraw });
  }
})();
