// The incident chart: the triggering series, the threshold it was judged against, the firing
// period shaded and every action marked. Data comes from /api/incidents/{id}/series; every
// string is drawn on the canvas or set as textContent, never parsed as HTML.
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
            const x = u.valToPos(t, "x", true);
            ctx.strokeStyle = "#8250df";
            ctx.setLineDash([2, 3]);
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillStyle = "#8250df";
            ctx.fillText("change point", x + 4, u.bbox.top + u.bbox.height - 6 * devicePixelRatio);
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
