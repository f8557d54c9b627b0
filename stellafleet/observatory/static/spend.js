// Spend: cumulative dollars over the run against its limit, the tasks that spent most, run sparklines.
"use strict";

import { fmtUsd, frame, svg, timeTicks } from "./dom.js";

const LEFT = 58;
const BOTTOM = 22;

export function renderSpendChart(spend, tl, opts) {
  const width = Math.max(360, opts.width);
  const height = 220;
  const end = opts.live ? Math.max(tl.end_ms, opts.now_ms) : tl.end_ms;
  const span = Math.max(1, end - tl.start_ms);
  const top = Math.max(spend.limit_usd || 0, spend.total_usd) * 1.12 || 1;
  const plotW = width - LEFT - 14;
  const plotH = height - BOTTOM - 14;
  const x = (ms) => LEFT + (Math.min(Math.max(ms, tl.start_ms), end) - tl.start_ms) / span * plotW;
  const y = (usd) => 14 + plotH - (usd / top) * plotH;
  const chart = frame("spend-chart", width, height, "cumulative spend over the run");

  const axis = svg("g", { className: "axis" });
  for (let i = 0; i <= 4; i++) {
    const usd = (top / 4) * i;
    axis.appendChild(svg("line", { x1: LEFT, x2: LEFT + plotW, y1: y(usd), y2: y(usd), className: "grid-line" }));
    axis.appendChild(svg("text", { x: LEFT - 6, y: y(usd) + 4, "text-anchor": "end", className: "tick", text: fmtUsd(usd) }));
  }
  for (const tick of timeTicks(tl.start_ms, end, plotW)) {
    axis.appendChild(svg("text", { x: x(tl.start_ms + tick.offset), y: height - 6, className: "tick", text: tick.label }));
  }
  chart.appendChild(axis);

  if (spend.limit_usd !== null && spend.limit_usd !== undefined) {
    chart.appendChild(svg("line", { x1: LEFT, x2: LEFT + plotW, y1: y(spend.limit_usd), y2: y(spend.limit_usd), className: "limit-line" }));
    chart.appendChild(svg("text", { x: LEFT + plotW - 4, y: y(spend.limit_usd) - 5, "text-anchor": "end", className: "limit-label", text: "limit " + fmtUsd(spend.limit_usd) }));
  }
  // a step line: spend stays flat between events and jumps when one is recorded; the server sends the
  // cumulative steps as two parallel arrays (t_ms[i], usd[i])
  const coords = [];
  let last = 0;
  const steps = spend.t_ms.length;
  for (let i = 0; i < steps; i++) {
    const px = x(spend.t_ms[i]);
    coords.push(px + "," + y(last), px + "," + y(spend.usd[i]));
    last = spend.usd[i];
  }
  if (opts.live) coords.push(x(end) + "," + y(last));
  chart.appendChild(svg("polyline", {
    points: coords.join(" "), className: "spend-line", "data-end-usd": last, "data-points": steps,
  }));
  const lastX = opts.live ? x(end) : x(spend.t_ms[steps - 1]);
  chart.appendChild(svg("circle", { cx: lastX, cy: y(last), r: 3.5, className: "spend-end" }));
  chart.appendChild(svg("text", {
    x: Math.min(lastX + 6, LEFT + plotW - 60), y: y(last) - 7, className: "spend-total", text: fmtUsd(last),
  }));
  return chart;
}

export function renderSpendTasks(spend, opts) {
  const rows = spend.per_task.length + (spend.others.tasks ? 1 : 0);
  const rowH = 18;
  const width = Math.max(260, opts.width);
  const height = Math.max(1, rows) * rowH + 6;
  const chart = frame("spend-tasks", width, height, "spend per task, highest first");
  const most = Math.max(...spend.per_task.map((t) => t.usd), 1e-9); // the summed rest is a line of text
  const label = 130;
  const barW = width - label - 70;
  const entries = spend.per_task.map((t) => [t.task, t.usd, t.task]);
  if (spend.others.tasks) entries.push([spend.others.tasks + " other tasks", spend.others.usd, null]);
  entries.forEach(([name, usd, task], i) => {
    const g = svg("g", { className: "spend-task", "data-task": task });
    const y = 3 + i * rowH;
    g.appendChild(svg("text", { x: label - 6, y: y + 12, "text-anchor": "end", className: "lane-label", text: name.length > 20 ? name.slice(0, 19) + "…" : name }));
    const w = task === null ? 0 : Math.max(1, (usd / most) * barW);
    if (w) g.appendChild(svg("rect", { x: label, y: y + 2, width: w, height: rowH - 5, rx: 2, className: "spend-bar" }));
    g.appendChild(svg("text", { x: label + w + 5, y: y + 12, className: "tick", text: fmtUsd(usd) + (task === null ? " in all" : "") }));
    g.appendChild(svg("title", { text: name + ": " + fmtUsd(usd) }));
    chart.appendChild(g);
  });
  return chart;
}

export function sparkline(values, limit) {
  const w = 90, h = 20;
  const chart = svg("svg", { className: "spark", width: w, height: h, viewBox: "0 0 " + w + " " + h, "aria-hidden": "true" });
  if (!values || !values.length) return chart;
  const top = Math.max(limit || 0, values[values.length - 1]) || 1;
  const step = values.length > 1 ? w / (values.length - 1) : w;
  const pts = values.map((v, i) => (i * step).toFixed(1) + "," + (h - 2 - (v / top) * (h - 4)).toFixed(1));
  if (limit) {
    const ly = (h - 2 - (limit / top) * (h - 4)).toFixed(1);
    chart.appendChild(svg("line", { x1: 0, x2: w, y1: ly, y2: ly, className: "spark-limit" }));
  }
  chart.appendChild(svg("polyline", { points: pts.join(" "), className: "spark-line" }));
  return chart;
}
