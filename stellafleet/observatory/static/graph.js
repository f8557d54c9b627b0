// The plan graph: waves as columns, tasks as nodes coloured by status, one edge per dependency.
// A skipped task links back to the failure that caused it (its chain of edges is drawn as the cause).
// A plan that grew (tasks emitted at run time) is laid out by steps instead, each emitted task after its
// parent, and a dotted edge joins an expanding task to each task it emitted.
"use strict";

import { frame, statusClass, svg } from "./dom.js";

const COL_W = 200;
const NODE_W = 164;
const TOP = 24;

function clip(text, chars) {
  return text.length > chars ? text.slice(0, chars - 1) + "…" : text;
}

// An edge from (x1, y1) to (x2, y2). One that skips a column runs through the gap between two rows of
// every column it passes (never behind a box there, where it would read as the middle task's edge): into
// the gap nearest both ends in the first gap between columns, along it, out in the last.
export function edgePath(x1, y1, x2, y2, rowH, nodeH, rows) {
  const gapW = COL_W - NODE_W;
  if (x2 - x1 <= gapW + 1) {
    const mid = (x1 + x2) / 2;
    return "M" + x1 + "," + y1 + " C" + mid + "," + y1 + " " + mid + "," + y2 + " " + x2 + "," + y2;
  }
  let gy = TOP - (rowH - nodeH) / 2;
  for (let k = 1; k <= rows; k++) {
    const y = TOP + k * rowH - (rowH - nodeH) / 2;
    if (Math.abs(y - y1) + Math.abs(y - y2) < Math.abs(gy - y1) + Math.abs(gy - y2)) gy = y;
  }
  const h = gapW / 2;
  return "M" + x1 + "," + y1 + " C" + (x1 + h) + "," + y1 + " " + (x1 + h) + "," + gy + " " + (x1 + gapW) + "," + gy +
    " L" + (x2 - gapW) + "," + gy + " C" + (x2 - h) + "," + gy + " " + (x2 - h) + "," + y2 + " " + x2 + "," + y2;
}

export function renderGraph(graph, opts) {
  const rowH = graph.rows > 40 ? 14 : 30;
  const nodeH = rowH - (rowH > 20 ? 8 : 3);
  const width = Math.max(COL_W, graph.columns * COL_W);
  const height = TOP + Math.max(1, graph.rows) * rowH + 6;
  const chart = frame("graph-chart", width, height, "the plan's tasks by wave, with their dependencies");
  const at = new Map();
  for (const node of graph.nodes) at.set(node.id, { x: 12 + node.col * COL_W, y: TOP + node.row * rowH });

  const heads = svg("g", { className: "axis" });
  for (let col = 0; col < graph.columns; col++) {
    const first = graph.nodes.find((n) => n.col === col);
    const grown = graph.nodes.some((n) => n.parent);
    const label = grown ? "step " + (col + 1) : first && first.wave !== null ? "wave " + first.wave : "not scheduled";
    heads.appendChild(svg("text", { x: 12 + col * COL_W, y: 14, className: "tick", text: label }));
  }
  chart.appendChild(heads);

  const edges = svg("g", { className: "edges" });
  for (const edge of graph.edges) {
    const a = at.get(edge.from);
    const b = at.get(edge.to);
    edges.appendChild(svg("path", {
      d: edgePath(a.x + NODE_W, a.y + nodeH / 2, b.x, b.y + nodeH / 2, rowH, nodeH, graph.rows),
      className: "edge" + (edge.cause ? " cause" : "") + (edge.emitted ? " emitted" : ""),
      "data-from": edge.from, "data-to": edge.to,
    }));
  }
  chart.appendChild(edges);

  const nodes = svg("g", { className: "nodes" });
  for (const node of graph.nodes) {
    const p = at.get(node.id);
    const g = svg("g", {
      className: "node " + statusClass(node.status) + (node.attempt !== null && node.attempt === opts.selected ? " selected" : ""),
      "data-task": node.id, "data-status": node.status, "data-caused-by": node.caused_by, tabindex: 0,
    });
    g.appendChild(svg("rect", { x: p.x, y: p.y, width: NODE_W, height: nodeH, rx: 4 }));
    if (rowH > 20) g.appendChild(svg("text", { x: p.x + 7, y: p.y + nodeH / 2 + 4, text: clip(node.id, 22) }));
    nodes.appendChild(g);
  }
  chart.appendChild(nodes);

  const byId = new Map(graph.nodes.map((n) => [n.id, n]));
  const pick = (event) => {
    const target = event.target.closest && event.target.closest("g.node");
    if (!target) return;
    let node = byId.get(target.getAttribute("data-task"));
    if (node.caused_by) node = byId.get(node.caused_by) || node; // a skip opens the failure behind it
    if (node.attempt !== null) opts.onSelect(node.attempt);
  };
  chart.addEventListener("click", pick);
  chart.addEventListener("mouseover", (event) => { // tooltips made on first hover, not 500 up front
    const g = event.target.closest && event.target.closest("g.node");
    if (!g || g.querySelector("title")) return;
    const node = byId.get(g.getAttribute("data-task"));
    let tip = node.id + (node.title ? " — " + node.title : "") + " · " + node.status;
    if (node.parent) tip += " · emitted by " + node.parent;
    if (node.expands) tip += " · expands at run time";
    if (node.caused_by) tip += " · skipped because " + node.caused_by + " failed (click to open it)";
    g.appendChild(svg("title", { text: tip }));
  });
  chart.addEventListener("keydown", (event) => { if (event.key === "Enter") pick(event); });
  return chart;
}
