// The run's timeline: one lane per worker slot, one bar per attempt, wave starts marked.
// Lanes and bar order come from the server (state/dashboard.py); this only maps times to pixels.
"use strict";

import { fmtDuration, frame, statusClass, svg, timeTicks } from "./dom.js";

const GUTTER = 110;
const TOP = 26;

const CHAR_PX = 6.6; // a bar label's character at 11 px

// The task's name as it fits in a bar `px` wide: whole, cut with an ellipsis, or nothing when not even two
// characters fit.
export function barLabel(task, px) {
  const fits = Math.floor((px - 8) / CHAR_PX);
  if (!task || fits < 2) return "";
  return task.length <= fits ? task : task.slice(0, fits - 1) + "…";
}

// A wave's label in `px` before the next wave's line: "wave 23", else "23", else nothing.
export function waveLabel(wave, px) {
  for (const text of ["wave " + wave, String(wave)]) if (text.length * CHAR_PX <= px) return text;
  return "";
}

function nextStart(waves, wave, x, width) {
  const later = waves.filter((w) => w.start_ms > wave.start_ms).map((w) => x(w.start_ms));
  return later.length ? Math.min(...later) : width;
}

export function renderTimeline(tl, opts) {
  const width = Math.max(480, opts.width);
  const lanes = tl.lanes.length;
  const laneH = lanes <= 16 ? 24 : Math.max(8, Math.floor(400 / lanes));
  const height = TOP + Math.max(1, lanes) * laneH + 8;
  const end = opts.live ? Math.max(tl.end_ms, opts.now_ms) : tl.end_ms;
  const span = Math.max(1, end - tl.start_ms);
  const plot = width - GUTTER - 10;
  const x = (ms) => GUTTER + ((ms - tl.start_ms) / span) * plot;
  const chart = frame("timeline-chart", width, height, "timeline of the run's attempts, one lane per worker slot");

  const axis = svg("g", { className: "axis" });
  for (const tick of timeTicks(tl.start_ms, end, plot)) {
    const tx = x(tl.start_ms + tick.offset);
    axis.appendChild(svg("line", { x1: tx, x2: tx, y1: TOP - 4, y2: height - 6, className: "grid-line" }));
    axis.appendChild(svg("text", { x: tx + 2, y: 11, className: "tick", text: tick.label }));
  }
  chart.appendChild(axis);

  const laneGroup = svg("g", { className: "lanes" });
  tl.lanes.forEach((lane, i) => {
    const y = TOP + i * laneH;
    if (i % 2 === 0) laneGroup.appendChild(svg("rect", { x: GUTTER, y: y, width: plot, height: laneH, className: "lane-band" }));
    if (laneH >= 12) {
      laneGroup.appendChild(svg("text", { x: GUTTER - 8, y: y + laneH / 2 + 4, className: "lane-label", "text-anchor": "end", text: lane.label }));
    }
  });
  chart.appendChild(laneGroup);

  const waves = svg("g", { className: "waves" });
  let free = -Infinity; // where the last label ended: a short wave's label must not run into the next
  for (const wave of tl.waves) {
    const wx = x(wave.start_ms);
    const line = svg("line", { x1: wx, x2: wx, y1: 14, y2: height - 4, className: "wave-line", "data-wave": wave.wave });
    waves.appendChild(line);
    const label = waveLabel(wave.wave, wx + 3 >= free ? nextStart(tl.waves, wave, x, width) - wx - 6 : 0);
    if (label) {
      waves.appendChild(svg("text", { x: wx + 3, y: 23, className: "wave-label", "data-wave": wave.wave, text: label }));
      free = wx + 3 + label.length * CHAR_PX + 4;
    } else {
      line.appendChild(svg("title", { text: "wave " + wave.wave })); // no room for its label: its line says it
    }
  }

  const bars = svg("g", { className: "bars" });
  const labels = svg("g", { className: "bar-labels" });
  const pad = laneH >= 12 ? 3 : 1;
  for (const bar of tl.bars) {
    const stop = bar.end_ms === null ? end : bar.end_ms;
    const x0 = x(bar.start_ms);
    const running = bar.end_ms === null;
    const rect = svg("rect", {
      x: x0, y: TOP + bar.lane * laneH + pad, width: Math.max(2, x(stop) - x0 - 1), height: laneH - 2 * pad,
      className: "bar " + statusClass(bar.outcome) + (running ? " growing" : "") +
        (bar.attempt === opts.selected ? " selected" : ""),
      "data-attempt": bar.attempt, "data-task": bar.task, "data-lane": bar.lane, "data-outcome": bar.outcome,
      tabindex: 0,
    });
    bars.appendChild(rect);
    const label = barLabel(bar.task, Math.max(2, x(stop) - x0 - 1));
    if (label && laneH >= 14) {  // the task's name on its bar, cut to fit; the whole name is the bar's tooltip
      labels.appendChild(svg("text", { x: x0 + 4, y: TOP + bar.lane * laneH + laneH / 2 + 4, className: "bar-label", "data-attempt": bar.attempt, text: label }));
    }
  }
  chart.appendChild(bars);
  chart.appendChild(labels);
  chart.appendChild(waves);
  if (opts.live) {
    const nx = x(opts.now_ms);
    chart.appendChild(svg("line", { x1: nx, x2: nx, y1: TOP - 4, y2: height - 4, className: "now-line" }));
  }
  const pick = (event) => {
    const target = event.target.closest && event.target.closest("rect.bar");
    if (target) opts.onSelect(Number(target.getAttribute("data-attempt")));
  };
  chart.addEventListener("click", pick);
  // tooltips are made on first hover: 2,000 bars need no 2,000 title elements up front
  chart.addEventListener("mouseover", (event) => {
    const rect = event.target.closest && event.target.closest("rect.bar");
    if (!rect || rect.firstChild) return;
    const bar = tl.bars.find((b) => b.attempt === Number(rect.getAttribute("data-attempt")));
    const stop = bar.end_ms === null ? end : bar.end_ms;
    rect.appendChild(svg("title", {
      text: bar.task + " · attempt " + bar.number + " · " + bar.outcome + " · " + fmtDuration(stop - bar.start_ms),
    }));
  });
  chart.addEventListener("keydown", (event) => { if (event.key === "Enter") pick(event); });
  return chart;
}
