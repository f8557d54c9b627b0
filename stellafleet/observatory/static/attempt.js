// The selected attempt: its facts, summary, error, commits, branch and CI (fetched from /api/attempts/<id>
// when it is opened), and its log and transcript: a running attempt's tail follows new bytes by offset; a
// finished one's pages from the start.
"use strict";

import { badge, cachedText, el, extLink, fmtDuration, fmtTime, fmtUsd, shortSha } from "./dom.js";

const TAIL_BYTES = 64 * 1024;
const PAGE_BYTES = 64 * 1024;
const FOLLOW_MS = 1000;
const KEEP_CHARS = 2 * 1024 * 1024; // a long-running tail keeps its last 2 MB on the page

class LogView {
  constructor(getJSON, attemptId, kind, running) {
    this.getJSON = getJSON;
    this.attemptId = attemptId;
    this.kind = kind;
    this.running = running;
    this.next = null;
    this.size = 0;
    this.timer = null;
    this.closed = false;
    this.pre = el("pre", { className: "log-text", id: kind === "log" ? "log-text" : "transcript-text", "data-attempt": attemptId });
    this.status = el("p", { className: "muted log-status" });
    this.more = el("button", { type: "button", className: "log-more", hidden: true, text: "Load more" });
    this.more.addEventListener("click", () => this.fetch());
    this.node = el("div", { className: "log-view", "data-kind": kind }, this.status, this.pre, this.more);
    this.fetch();
  }

  url() {
    const base = "/api/attempts/" + this.attemptId + "/" + this.kind;
    if (this.next === null) return base + (this.running ? "?tail=" + TAIL_BYTES : "?offset=0&limit=" + PAGE_BYTES);
    return base + "?offset=" + this.next + "&limit=" + PAGE_BYTES;
  }

  async fetch() {
    clearTimeout(this.timer);
    if (this.closed) return;
    let chunk;
    try {
      chunk = await this.getJSON(this.url());
    } catch (error) {
      this.status.textContent = "Cannot read the " + this.kind + " (" + error.message + ").";
      this.timer = setTimeout(() => this.fetch(), 3000);
      return;
    }
    if (this.closed) return;
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    if (chunk.text) {
      if (this.next === null && chunk.offset > 0) this.pre.appendChild(document.createTextNode("… (" + chunk.offset + " earlier bytes not shown)\n"));
      this.pre.appendChild(document.createTextNode(chunk.text));
      if (this.pre.textContent.length > KEEP_CHARS) this.pre.textContent = this.pre.textContent.slice(-KEEP_CHARS);
    }
    this.next = chunk.next;
    this.size = chunk.size;
    const wasRunning = this.running;
    this.running = chunk.running;
    this.describe(chunk);
    if (atBottom && (this.running || wasRunning)) this.pre.scrollTop = this.pre.scrollHeight;
    if (this.running || wasRunning) this.timer = setTimeout(() => this.fetch(), FOLLOW_MS); // one more read after it ends
    this.more.hidden = this.running || this.next >= this.size;
  }

  describe(chunk) {
    if (!chunk.path) this.status.textContent = "No " + this.kind + " recorded for this attempt.";
    else if (!chunk.exists) this.status.textContent = chunk.path + " (not written yet)";
    else this.status.textContent = chunk.path + " · " + chunk.size + " bytes" + (this.running ? " · following" : "") +
      (!this.running && this.next < this.size ? " · showing the first " + this.next + " bytes" : "");
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
  }
}

export class AttemptPanel {
  constructor(getJSON) {
    this.getJSON = getJSON;
    this.attemptId = null;
    this.loads = 0;
    this.info = el("div", { className: "attempt-info" });
    this.tabs = el("div", { className: "log-tabs" });
    this.logs = el("div", { className: "logs" });
    this.views = [];
    this.node = el("section", { className: "card-inset", id: "attempt-panel", hidden: true }, this.info, this.tabs, this.logs);
    this.lastKey = "";
  }

  // Show the attempt (null: hide the panel). Its details (summary, error, commits, CI) are fetched when it
  // is opened and again on `refresh` (the run's document changed); its log views persist until another
  // attempt is chosen. `outcome` is the bar's: a running attempt's log is followed from its tail.
  show(attemptId, outcome, refresh) {
    if (attemptId === null || attemptId === undefined) return this.close();
    this.node.hidden = false;
    if (attemptId !== this.attemptId) {
      this.views.forEach((v) => v.close());
      this.attemptId = attemptId;
      const running = outcome === "running";
      this.views = ["log", "transcript"].map((kind) => new LogView(this.getJSON, attemptId, kind, running));
      this.tabs.replaceChildren(...this.views.map((view, i) => {
        const button = el("button", { type: "button", className: "tab", "data-kind": view.kind, text: view.kind === "log" ? "Worker log" : "Transcript" });
        button.addEventListener("click", () => this.pick(i));
        return button;
      }));
      this.logs.replaceChildren(...this.views.map((v) => v.node));
      this.pick(0);
      this.lastKey = "";
      this.info.replaceChildren(el("p", { className: "muted", text: "Loading the attempt…" }));
      this.load();
    } else if (refresh) {
      this.load();
    }
  }

  async load() {
    const attemptId = this.attemptId;
    const load = ++this.loads;
    let found;
    try {
      found = await this.getJSON("/api/attempts/" + attemptId);
    } catch (error) {
      if (load === this.loads) this.info.replaceChildren(el("p", { className: "muted", text: "Cannot load the attempt (" + error.message + ")." }));
      return;
    }
    if (load !== this.loads || attemptId !== this.attemptId) return; // another attempt, or a newer answer
    const key = JSON.stringify(Object.assign({}, found, { now_ms: 0 }));
    if (key === this.lastKey) return;
    this.lastKey = key;
    this.info.replaceChildren(...attemptFacts(found));
  }

  pick(index) {
    this.views.forEach((view, i) => (view.node.hidden = i !== index));
    [...this.tabs.children].forEach((tab, i) => tab.classList.toggle("active", i === index));
  }

  close() {
    this.views.forEach((v) => v.close());
    this.views = [];
    this.attemptId = null;
    this.loads++; // an answer still on its way is for a closed panel
    this.node.hidden = true;
  }
}

function attemptFacts(found) {
  const { attempt: a, task, ci, commits } = found;
  const facts = [
    ["Task", task.id + (task.title ? " — " + task.title : "")],
    ["Started", fmtTime(a.started_at_ms)],
    ["Duration", fmtDuration(a.duration_ms)],
    ["Spend", fmtUsd(a.spend_usd) + " · " + (a.input_tokens || 0) + " in / " + (a.output_tokens || 0) + " out tokens" + cachedText(a) + " · " + (a.steps || 0) + " steps"],
    ["Guard", a.guard_usd === null || a.guard_usd === undefined ? null : fmtUsd(a.guard_usd)],
    ["Node", a.node],
    ["Branch", a.branch || task.branch],
    ["Worktree", a.worktree],
    ["Exit code", a.exit_code],
    ["Setup", a.setup_ms === undefined ? null : (a.setup_ms / 1000).toFixed(1) + " s"],
  ];
  const out = [
    el("h3", { className: "attempt-title" }, "Attempt " + a.number + " of " + (task.id || a.task_id) + " ", badge(a.outcome)),
    el("dl", { className: "kv" }, facts.filter((f) => f[1] !== null && f[1] !== undefined && f[1] !== "").map(
      ([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })])),
  ];
  if (ci) {
    out.push(el("p", { className: "attempt-ci" }, "CI: ", badge(ci.state), ci.conclusion ? " " + ci.conclusion : "",
      ci.pr_url ? [" ", extLink(ci.pr_url, ci.pr_number ? "PR #" + ci.pr_number : "pull request")] : null));
  }
  if (a.summary) out.push(el("p", { className: "summary", id: "attempt-summary", text: a.summary }));
  if (a.error) out.push(el("pre", { className: "error", id: "attempt-error", text: a.error }));
  if (a.salvage_sha) {
    // its uncommitted work, kept as a commit when it ended without success, and how to get it back
    out.push(el("p", { className: "salvage", id: "attempt-salvage" }, "Salvaged: ",
      el("span", { className: "mono", text: a.salvage_ref + " (" + shortSha(a.salvage_sha) + ")" }),
      " · restore with ", el("code", { text: a.salvage_restore })));
  }
  if (commits.length) {
    out.push(el("ul", { className: "commits" }, commits.map((c) => el("li", null,
      el("span", { className: "mono", text: shortSha(c.sha) }), " ", el("span", { text: c.message || "" })))));
  }
  // each run of the task's check, stella's own: on which commit, how it ended, the end of its output
  (found.checks || []).forEach((c) => {
    const how = c.passed ? "passed" : c.exit_code === null ? "did not finish" : "exit " + c.exit_code;
    out.push(el("div", { className: "attempt-check" },
      el("p", null, "Check (" + c.phase + "): ", badge(c.passed ? "succeeded" : "failed"), " " + how,
        c.commit ? " on " + shortSha(c.commit) : "", " · ", el("code", { text: c.command })),
      c.output_tail ? el("pre", { className: c.passed ? "check-output" : "error", text: c.output_tail }) : null));
  });
  return out;
}
