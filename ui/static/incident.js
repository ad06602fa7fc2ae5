// The incident chart: the triggering series, the threshold it was judged against, the firing
// period shaded and every action marked. Data comes from /api/incidents/{id}/series; every
// string is drawn on the canvas or set as textContent, never parsed as HTML.
// A dashed vertical marker with its label, on a uPlot canvas (both charts use it).
function sloguardMarker(u, t, colour, label, y) {
  const ctx = u.ctx;
  const x = u.valToPos(t, "x", true);
  ctx.save();
  ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
  ctx.strokeStyle = colour;
  ctx.setLineDash([2, 3]);
  ctx.beginPath();
  ctx.moveTo(x, u.bbox.top);
  ctx.lineTo(x, u.bbox.top + u.bbox.height);
  ctx.stroke();
  ctx.fillStyle = colour;
  ctx.fillText(label, x + 4, y);
  ctx.restore();
}

(function () {
  "use strict";
  const box = document.getElementById("chart");
  const note = document.getElementById("chart-note");
  if (!box) return;

  function marks(data) {
    return {
      hooks: {
        drawClear: [(u) => {
          const ctx = u.ctx;
          const from = data.fired ?? data.started;
          const to = data.resolved ?? u.scales.x.max;
          const x0 = u.valToPos(from, "x", true);
          const x1 = u.valToPos(to, "x", true);
          ctx.save();
          ctx.fillStyle = data.resolved ? "rgba(26,127,55,0.08)" : "rgba(179,38,30,0.08)";
          ctx.fillRect(x0, u.bbox.top, Math.max(x1 - x0, 1), u.bbox.height);
          ctx.restore();
        }],
        draw: [(u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
          (data.changes || []).forEach((t) => {  // where a change-point detector saw the shift
            sloguardMarker(u, t, "#8250df", "change point",
                           u.bbox.top + u.bbox.height - 6 * devicePixelRatio);
          });
          data.actions.forEach((a, n) => {
            const x = u.valToPos(a.t, "x", true);
            ctx.strokeStyle = a.dry_run ? "#8c95a3" : "#1d2330";
            ctx.setLineDash(a.dry_run ? [4, 4] : []);
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillStyle = "#1d2330";
            ctx.fillText(a.label, x + 4, u.bbox.top + 14 * devicePixelRatio * (1 + (n % 4)));
          });
          ctx.restore();
        }],
      },
    };
  }

  fetch(box.dataset.seriesUrl)
    .then((r) => r.json())
    .then((data) => {
      window.sloguardChart = { data: data, drawn: false };
      if (data.error) note.textContent = data.error;
      if (!data.x.length) {
        note.textContent = (note.textContent ? note.textContent + " · " : "") +
          "no samples of this series are stored for this time range";
        return;
      }
      const opts = {
        width: Math.max(box.clientWidth, 400),
        height: 320,
        plugins: [marks(data)],
        scales: { x: { time: true } },
        series: [
          {},
          { label: data.field || "value", stroke: "#1f6feb", width: 1.5, spanGaps: true },
          { label: "threshold", stroke: "#b3261e", dash: [6, 4], width: 1, spanGaps: true,
            paths: uPlot.paths.stepped({ align: 1 }) },
        ],
      };
      const chart = new uPlot(opts, [data.x, data.value, data.threshold], box);
      window.sloguardChart.chart = chart;
      window.sloguardChart.drawn = true;
      box.dataset.points = String(data.x.length);
    })
    .catch((err) => { note.textContent = "cannot load the series: " + err; });
})();

// The suspects' chart: the LS signal (left axis) against the first suspects' own signals
// (right axis: CPU cores, block I/Os or memory pressure, as each one's evidence points), from
// /api/incidents/{id}/suspects/series; the onset marked. Text is drawn, never parsed as HTML.
(function () {
  "use strict";
  const box = document.getElementById("suspects-chart");
  const note = document.getElementById("suspects-chart-note");
  if (!box) return;
  const colours = ["#b3261e", "#bf8700", "#8250df"];

  fetch(box.dataset.seriesUrl)
    .then((r) => r.json())
    .then((data) => {
      window.sloguardSuspectsChart = { data: data, drawn: false };
      if (data.error) note.textContent = data.error;
      if (!data.x.length) return;
      const units = [...new Set(data.suspects.map((s) => s.unit))].join(", ");
      const series = [{}, { label: "LS " + (data.ls_label || "signal"), stroke: "#1f6feb",
                            width: 1.5, spanGaps: true, scale: "ls" }];
      data.suspects.forEach((s, n) => series.push({
        label: `#${s.rank} ${s.name} (${s.unit})`, stroke: colours[n % colours.length],
        width: 1.2, spanGaps: true, scale: "be" }));
      const opts = {
        width: Math.max(box.clientWidth, 400),
        height: 280,
        scales: { x: { time: true } },
        axes: [{}, { scale: "ls", label: data.ls_label || "LS" },
               { scale: "be", side: 1, label: units, grid: { show: false } }],
        series: series,
        plugins: [{ hooks: { draw: [(u) => sloguardMarker(
          u, data.onset, "#1d2330", "onset", u.bbox.top + 14 * devicePixelRatio)] } }],
      };
      const columns = [data.x, data.ls, ...data.suspects.map((s) => s.values)];
      window.sloguardSuspectsChart.chart = new uPlot(opts, columns, box);
      window.sloguardSuspectsChart.drawn = true;
      box.dataset.points = String(data.x.length);
    })
    .catch((err) => { note.textContent = "cannot load the suspects' signals: " + err; });
})();
