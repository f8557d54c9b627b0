// The run page's pictures: the needs-attention strip, timeline, plan graph and spend, and the selected
// attempt's panel (which keeps its log stream across the page's polls).
"use strict";

import { badge, el, extLink, fmtDuration, fmtUsd } from "./dom.js";
import { AttemptPanel } from "./attempt.js";
import { renderGraph } from "./graph.js";
import { renderSpendChart, renderSpendTasks } from "./spend.js";
import { renderTimeline } from "./timeline.js";

// The server sends the bars as parallel arrays (one per field); the drawing wants one object per bar.
function barRows(columns) {
  const fields = Object.keys(columns);
  const count = fields.length ? columns[fields[0]].length : 0;
  const rows = new Array(count);
  for (let i = 0; i < count; i++) {
    const row = {};
    for (const field of fields) row[field] = columns[field][i];
    rows[i] = row;
  }
  return rows;
}

const KIND_LABEL = { quiet: "no progress", failed: "failed", no_commits: "no commits", red_ci: "CI red", abandoned: "fleet ended", parked: "needs you" };

function attentionItem(item, data, onSelect) {
  let text = item.text || "";
  if (item.kind === "quiet") text = "nothing new for " + fmtDuration(data.now_ms - item.since_ms);
  const node = el("li", { className: "attention-item k-" + item.kind, "data-kind": item.kind, "data-task": item.task, "data-attempt": item.attempt },
    item.kind === "quiet" ? el("span", { className: "badge st-stalled attention-kind", text: "quiet" })
      : badge(["failed", "no_commits", "abandoned", "parked"].includes(item.kind) ? item.status : "red", "attention-kind"),
    // a failed task's badge already says how it ended ("failed", "interrupted"): no label repeats it
    item.kind === "failed" ? null : el("span", { className: "attention-label", text: KIND_LABEL[item.kind] }),
    el("span", { className: "mono attention-task", text: item.count > 1 ? item.count + " tasks" : item.task || item.branch || "" }),
    item.branch && item.task ? el("span", { className: "mono muted", text: item.branch }) : null,
    el("span", { className: "attention-text", text: text }),
    item.pr_url ? extLink(item.pr_url, "pull request") : null);
  if (item.attempt !== null && item.attempt !== undefined) {
    node.setAttribute("tabindex", "0");
    node.addEventListener("click", (event) => { if (!event.target.closest("a")) onSelect(item.attempt, true); });
    node.addEventListener("keydown", (event) => { if (event.key === "Enter") onSelect(item.attempt, true); });
  }
  return node;
}

function legend(statuses) {
  return el("p", { className: "legend" }, statuses.map((s) => el("span", { className: "legend-item" }, el("span", { className: "swatch st-" + s }), s)));
}

export class RunVisuals {
  constructor(getJSON) {
    this.panel = new AttemptPanel(getJSON);
    this.selected = null;
    this.runId = null;
    this.data = null;
    this.attention = el("section", { id: "attention", className: "attention", "aria-label": "needs attention" });
    this.timeline = el("div", { className: "chart-box", id: "timeline-box" });
    this.graph = el("div", { className: "chart-box scroll", id: "graph-box" });
    this.spend = el("div", { className: "spend-row", id: "spend-box" });
    this.onSelect = (attemptId, scroll) => this.select(attemptId, scroll);
  }

  // The sections in page order; the same nodes on every poll, so the attempt panel keeps its log.
  sections() {
    return {
      attention: this.attention,
      charts: [
        el("h3", { text: "Timeline" }),
        legend(["succeeded", "failed", "running", "stalled", "interrupted", "abandoned"]),
        this.timeline,
        this.panel.node,
        el("h3", { text: "Plan graph" }),
        this.graph,
        el("h3", { text: "Spend" }),
        this.spend,
      ],
    };
  }

  // attempt: the one the address names (#/runs/R?attempt=N), opened as if clicked
  render(data, width, attempt) {
    if (data.run.id !== this.runId) {
      this.runId = data.run.id;
      this.selected = null;
      this.panel.close();
    }
    const linked = Boolean(attempt) && attempt !== this.selected;
    if (linked) this.selected = attempt;
    this.data = data;
    this.timelineData = Object.assign({}, data.timeline, { bars: barRows(data.timeline.bars) });
    this.outcomes = new Map(this.timelineData.bars.map((bar) => [bar.attempt, bar.outcome]));
    this.width = width;
    const items = data.attention || [];
    this.attention.hidden = !items.length;
    this.attention.replaceChildren(
      el("h3", { text: "Needs attention (" + items.length + ")" }),
      el("ul", { className: "attention-list" }, items.map((item) => attentionItem(item, data, this.onSelect))));
    this.drawSelectable();
    const live = data.run.live;
    this.spend.replaceChildren(
      el("div", { className: "spend-chart" }, renderSpendChart(data.spend, this.timelineData, { width: Math.floor(width * 0.58), live: live, now_ms: data.now_ms })),
      el("div", { className: "spend-tasks" }, el("h4", { text: "Spend per task" }),
        data.spend.per_task.length ? renderSpendTasks(data.spend, { width: Math.floor(width * 0.38) })
          : el("p", { className: "muted no-spend", text: live ? "No spend recorded yet." : fmtUsd(data.run.spend_usd || 0) + " spent." })));
    this.panel.show(this.selected, this.outcomes.get(this.selected), true); // the run changed: so may the attempt
    if (linked) this.panel.node.scrollIntoView({ block: "nearest" });
  }

  drawSelectable() {
    const data = this.data;
    const opts = { width: this.width, live: data.run.live, now_ms: data.now_ms, selected: this.selected, onSelect: this.onSelect };
    const tl = this.timelineData;
    this.timeline.replaceChildren(tl.bars.length ? renderTimeline(tl, opts) : el("p", { className: "muted", text: "No attempt started yet." }));
    this.graph.replaceChildren(data.graph.nodes.length ? renderGraph(data.graph, opts) : el("p", { className: "muted", text: "No tasks recorded yet." }));
  }

  // The page shows something else: stop following logs; the selection is kept for the way back.
  leave() {
    this.panel.close();
  }

  select(attemptId, scroll) {
    this.selected = attemptId;
    // the address names the open attempt, so it can be shared or reloaded (no hashchange: no redraw)
    history.replaceState(null, "", "#/runs/" + encodeURIComponent(this.runId) + "?attempt=" + attemptId);
    this.drawSelectable();
    this.panel.show(attemptId, this.outcomes.get(attemptId), false);
    if (scroll) this.panel.node.scrollIntoView({ block: "nearest" });
  }
}
