// stella observatory: renders the fleet ledger's JSON API.
// Every value from the ledger (prompts, summaries, errors, branch names) comes from models or plans, so
// the DOM is built with createElement + textContent only; nothing is ever parsed as HTML.
"use strict";

import { badge, cachedText, el, extLink, fmtDuration, fmtTime, fmtUsd, shortSha } from "./dom.js";
import { RunVisuals } from "./runviews.js";
import { sparkline } from "./spend.js";

{
  const PAGE_SIZE = 25;
  const MAX_PAGE = Math.floor(Number.MAX_SAFE_INTEGER / PAGE_SIZE);
  const IDLE_POLL_MS = 10000;

  let timer = null;
  let generation = 0;
  let lastRendered = "";
  const openDetails = new Set();
  let visuals = null;
  let layout = null;
  let lastWaves = { runId: null, waves: null }; // a big run's task list, fetched when its section is opened

  function fmtSpend(run) {
    const spent = fmtUsd(run.spend_usd);
    if (run.spend_limit_usd === null || run.spend_limit_usd === undefined) return spent + " (no limit)";
    return spent + " / " + fmtUsd(run.spend_limit_usd);
  }

  // what a run was: its plan file's name, else its command line (prompts cut short; the full line on hover)
  function fmtWhat(run) {
    if (run.plan_path) return run.plan_path.split("/").pop();
    const line = run.command || "—";
    return line.length > 48 ? line.slice(0, 47) + "…" : line;
  }

  function fmtBase(run) {
    const parts = [];
    if (run.base_ref) parts.push(run.base_ref);
    if (run.base_commit) parts.push("@ " + shortSha(run.base_commit));
    return parts.join(" ") || "—";
  }

  function taskCounts(tasks) {
    const wrap = el("span", { className: "counts" });
    const shown = [["succeeded", "ok"], ["failed", "failed"], ["skipped", "skipped"]];
    for (const [key, label] of shown) {
      wrap.appendChild(el("span", { className: "count c-" + key, title: key, text: (tasks[key] || 0) + " " + label }));
    }
    for (const key of ["parked", "running", "pending", "interrupted"]) {  // parked: waits on you
      if (tasks[key]) wrap.appendChild(el("span", { className: "count c-" + key, text: tasks[key] + " " + key }));
    }
    return wrap;
  }

  // the run's watched branches by CI state ("2 green · 1 red"); a run never watched says so
  function ciCounts(ci) {
    const states = Object.keys(ci || {});
    if (!states.length) return el("span", { className: "muted", text: "not watched" });
    return el("span", { className: "ci-counts" }, states.sort().map((state, i) => [i ? " · " : "", badge(state), " " + ci[state]]));
  }

  function runStatus(run) {
    const wrap = el("span", { className: "status" }, badge(run.status));
    if (run.live) wrap.appendChild(el("span", { className: "tag live-tag", text: "live" }));
    if (run.stale) wrap.appendChild(el("span", { className: "tag stale-tag", title: "its fleet process is gone", text: "fleet gone" }));
    return wrap;
  }

  // --- data ---

  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const error = new Error((body && body.error) || "HTTP " + response.status);
      error.status = response.status;
      throw error;
    }
    return body;
  }

  function decodeHashPart(text) {
    try {
      return decodeURIComponent(text);
    } catch (error) {
      return text; // a broken %-escape typed by hand: ask for it as written, the server says it is unknown
    }
  }

  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const match = hash.match(/^\/runs\/([^?]+)/);
    const attempt = Number((hash.match(/[?&]attempt=(\d+)/) || [])[1] || 0) || null;
    if (match) return { view: "run", id: decodeHashPart(match[1]), attempt: attempt };
    const page = Number((hash.match(/[?&]page=(\d+)/) || [])[1] || 1);
    // a hand-typed huge page would ask for an offset the server refuses; showList moves it to the last page
    return { view: "list", page: Math.min(Math.max(1, page), MAX_PAGE) };
  }

  function setBanner(text) {
    const banner = document.getElementById("banner");
    banner.textContent = text || "";
    banner.hidden = !text;
  }

  function setLive(on) {
    document.getElementById("live-indicator").hidden = !on;
  }

  function schedule(ms) {
    clearTimeout(timer);
    timer = setTimeout(refresh, ms);
  }

  async function refresh() {
    const gen = ++generation;
    const where = route();
    let next = IDLE_POLL_MS;
    try {
      if (where.view === "run") {
        // the first view only (timeline, graph, spend, attention); an attempt's details come when it is opened
        const data = await getJSON("/api/runs/" + encodeURIComponent(where.id) + "/page");
        if (gen !== generation) return;
        performance.mark("run-data");
        showRun(data, where.attempt);
        next = data.run.live ? data.poll_ms : IDLE_POLL_MS;
      } else {
        const offset = (where.page - 1) * PAGE_SIZE;
        const data = await getJSON("/api/runs?limit=" + PAGE_SIZE + "&offset=" + offset);
        if (gen !== generation) return;
        showList(data, where.page);
        next = data.runs.some((r) => r.live) ? data.poll_ms : IDLE_POLL_MS;
      }
      setBanner("");
    } catch (error) {
      if (gen !== generation) return;
      if (error.status === 404 && where.view === "run") {
        showMissingRun(where.id, error.message);
        setBanner("");
      } else {
        setBanner("Cannot load from the observatory server (" + error.message + "); retrying.");
        next = 3000;
      }
    }
    if (gen === generation) schedule(next);
  }

  function unchanged(view, data) {
    const copy = Object.assign({}, data, { now_ms: 0 });
    const key = view + JSON.stringify(copy);
    if (key === lastRendered) return true;
    lastRendered = key;
    return false;
  }

  // --- runs list ---

  function showList(data, page) {
    if (visuals) visuals.leave(); // no log keeps following behind the runs list
    document.getElementById("runs-card").hidden = false;
    document.getElementById("run-view").hidden = true;
    document.getElementById("ledger-path").textContent = "ledger: " + data.ledger;
    setLive(data.runs.some((r) => r.live));
    const pages = Math.max(1, Math.ceil(data.total / data.limit));
    if (page > pages) {
      // a stale or hand-typed page past the end (runs were cleaned up): show the last page instead
      location.replace("#/?page=" + pages);
      return;
    }
    if (unchanged("list", data)) return;
    const body = document.getElementById("runs-body");
    const pager = document.getElementById("pager");
    if (!data.total) {
      body.replaceChildren(emptyState(data));
      pager.replaceChildren();
      return;
    }
    const head = el("tr", null, ["Run", "Started", "Duration", "Status", "Tasks", "Spend", "Pipeline", "Plan or command", "CI", "Base"].map(
      (h) => el("th", { scope: "col", text: h })));
    const rows = data.runs.map((run) => el("tr", { className: "run-row", "data-run-id": run.id },
      el("td", null, el("a", { className: "run-link", href: "#/runs/" + encodeURIComponent(run.id), text: run.id })),
      el("td", { title: run.created_at_ms ? new Date(run.created_at_ms).toISOString() : "" , text: fmtTime(run.created_at_ms) }),
      el("td", { text: fmtDuration(run.duration_ms) }),
      el("td", null, runStatus(run)),
      el("td", null, taskCounts(run.tasks)),
      el("td", { className: "nowrap spend-cell" }, sparkline(run.spend_spark, run.spend_limit_usd), " ", fmtSpend(run)),
      el("td", { text: run.pipeline || "—" }),
      el("td", { className: "mono what-cell" + (run.plan_path ? " plan-name" : ""), title: run.command || run.plan_path || "", text: fmtWhat(run) }),
      el("td", { className: "nowrap ci-cell" }, ciCounts(run.ci)),
      el("td", { className: "mono", text: fmtBase(run) })));
    body.replaceChildren(el("table", { id: "runs-table", className: "grid" }, el("thead", null, head), el("tbody", null, rows)));
    const first = data.offset + 1;
    const last = data.offset + data.runs.length;
    pager.replaceChildren(
      page > 1 ? el("a", { className: "page-prev", href: "#/?page=" + (page - 1), text: "← Newer" }) : el("span", { className: "muted", text: "← Newer" }),
      el("span", { className: "page-info", text: first + "–" + last + " of " + data.total + " runs (page " + page + " of " + pages + ")" }),
      page < pages ? el("a", { className: "page-next", href: "#/?page=" + (page + 1), text: "Older →" }) : el("span", { className: "muted", text: "Older →" }));
  }

  function emptyState(data) {
    return el("div", { className: "empty", id: "empty-state" },
      el("p", { text: data.ledger_exists ? "The ledger has no fleet runs yet." : "No fleet runs recorded yet: there is no ledger at " + data.ledger + "." }),
      el("p", { text: "Start a fleet in this repository, and it shows up here while it runs:" }),
      el("pre", { className: "command", text: data.start_hint }));
  }

  // --- one run ---

  function showMissingRun(id, message) {
    if (visuals) visuals.leave();
    document.getElementById("runs-card").hidden = true;
    document.getElementById("run-view").hidden = false;
    lastRendered = "";
    setLive(false);
    document.getElementById("run-body").replaceChildren(el("p", { className: "empty", text: message || "No run " + id }));
  }

  function runLink(id) {
    return el("a", { className: "run-link mono", href: "#/runs/" + encodeURIComponent(id), text: id });
  }

  function kv(pairs) {
    return el("dl", { className: "kv" }, pairs.filter((p) => p[1] !== null && p[1] !== undefined && p[1] !== "").map(
      ([k, v]) => [el("dt", { text: k }), el("dd", null, v instanceof Node ? v : String(v))]));
  }

  function rememberOpen(node, key) {
    node.setAttribute("data-key", key);
    if (openDetails.has(key)) node.open = true;
    node.addEventListener("toggle", () => (node.open ? openDetails.add(key) : openDetails.delete(key)));
    return node;
  }

  function showRun(data, attempt) {
    document.getElementById("runs-card").hidden = true;
    document.getElementById("run-view").hidden = false;
    setLive(data.run.live);
    if (unchanged("run", data)) return;
    const run = data.run;
    const body = document.getElementById("run-body");
    visuals = visuals || new RunVisuals(getJSON);
    if (!layout || layout.head.parentNode !== body) {
      // the pictures' nodes stay in place across polls: a followed log keeps its scroll position
      const sections = visuals.sections();
      layout = { head: el("div", { className: "run-head" }), facts: el("div"), rest: el("div") };
      body.replaceChildren(layout.head, sections.attention, layout.facts, ...sections.charts, layout.rest);
    }
    layout.head.replaceChildren(el("h2", { className: "run-title" }, "Fleet run ", el("span", { className: "mono", id: "run-id", text: run.id }), " ", runStatus(run)));
    layout.facts.replaceChildren(kv([
      ["Started", fmtTime(run.created_at_ms)],
      ["Finished", run.finished_at_ms ? fmtTime(run.finished_at_ms) : (run.live ? "still running" : "—")],
      ["Duration", fmtDuration(run.duration_ms)],
      ["Tasks", taskCounts(run.tasks)],
      ["Attempts", run.attempts_total],
      ["Spend", fmtSpend(run)],
      ["Pipeline", run.pipeline],
      ["Base", fmtBase(run)],
      ["Plan", run.plan_path],
      ["Max concurrency", run.max_concurrency],
      ["Schedule", run.schedule],
      ["Resumes", run.resumed_from ? runLink(run.resumed_from) : null],
      ["Resumed by", run.resumed_by && run.resumed_by.length ? el("span", null, run.resumed_by.map((id, i) => [i ? ", " : "", runLink(id)])) : null],
      ["Command", run.command],
      ["Exit code", run.exit_code],
      ["Reason", run.reason],
    ]));
    const rest = [wavesSection(run, data), branchesSection(data.branches), commitsSection(data.commits)];
    if (data.cleanups.length) rest.push(cleanupsSection(data.cleanups));
    if (data.limits && data.limits.length) rest.push(limitsSection(data.limits));
    if (data.merge_batches && data.merge_batches.length) rest.push(trainSection(data.merge_batches));
    layout.rest.replaceChildren(...rest);
    visuals.render(data, Math.max(600, body.clientWidth - 8), attempt);
    performance.mark("run-rendered");
  }

  // A small run's task cards come with the first view; a big run's (data.waves null) are folded, and
  // opening them fetches the whole run document once for that.
  function wavesSection(run, data) {
    const fill = (into, waves) => {
      if (!waves.length) into.appendChild(el("p", { className: "muted", text: "No tasks recorded yet." }));
      for (const wave of waves) {
        into.appendChild(el("section", { className: "wave", "data-wave": wave.wave === null ? "" : wave.wave },
          el("h4", { text: wave.wave === null ? "Not scheduled" : "Wave " + wave.wave }),
          wave.tasks.map((task) => taskCard(run, task))));
      }
      return into;
    };
    if (data.waves) return fill(el("div", { className: "waves" }, el("h3", { text: "Waves" })), data.waves);
    const folded = rememberOpen(el("details", { className: "waves" }, el("summary", { className: "waves-summary", text: "Waves: " + data.tasks_total + " tasks (open to list them all)" })), "waves:" + run.id);
    const load = async () => {
      // a live run redraws this section on every poll: show the last list at once, then the fresh one
      const kept = lastWaves.runId === run.id ? lastWaves.waves : null;
      const note = el("p", { className: "muted waves-loading", text: "Loading the task list…", hidden: Boolean(kept) });
      folded.appendChild(note);
      if (kept) fill(folded, kept);
      try {
        const whole = await getJSON("/api/runs/" + encodeURIComponent(run.id));
        lastWaves = { runId: run.id, waves: whole.waves };
        note.remove();
        folded.querySelectorAll("section.wave").forEach((section) => section.remove());
        fill(folded, whole.waves);
      } catch (error) {
        note.className = "muted waves-failed";
        note.hidden = false;
        note.textContent = "Cannot load the task list (" + error.message + "); close and open it to try again.";
      }
    };
    if (folded.open) load();
    folded.addEventListener("toggle", () => {
      if (!folded.open) folded.querySelectorAll(".waves-failed").forEach((note) => note.remove());
      else if (!folded.querySelector("section.wave, .waves-loading")) load();
    });
    return folded;
  }

  function taskCard(run, task) {
    const head = el("header", { className: "task-head" },
      el("span", { className: "task-id mono", text: task.id }),
      el("span", { className: "task-title", text: task.title || "" }),
      badge(task.status),
      el("span", { className: "tag", text: task.isolation || "shared" }));
    if (task.stale) head.appendChild(el("span", { className: "tag stale", title: task.stale, text: "stale" }));
    const card = el("article", { className: "task", "data-task-id": task.id }, head);
    if (task.reason) {
      card.appendChild(el("p", { className: "reason" }, el("strong", { text: task.status === "skipped" ? "Skipped: " : "Reason: " }), el("span", { className: "reason-text", text: task.reason })));
    }
    card.appendChild(kv([
      ["Branch", task.branch],
      ["Worktree", task.worktree],
      ["Depends on", task.depends_on && task.depends_on.length ? task.depends_on.join(", ") : null],
      ["Claims", task.claims && task.claims.length ? task.claims.join(", ") : null],
      ["Pipeline", task.pipeline],
      ["Model", task.model],
      ["Spend", task.attempts.length ? fmtUsd(task.spend_usd) : null],
      ["CI", task.ci ? ciSummary(task.ci) : null],
    ]));
    if (task.prompt) {
      card.appendChild(rememberOpen(el("details", { className: "prompt" }, el("summary", { text: "Prompt" }), el("pre", { text: task.prompt })), "prompt:" + run.id + ":" + task.id));
    }
    if (!task.attempts.length) {
      card.appendChild(el("p", { className: "muted", text: "No attempt yet." }));
    }
    for (const attempt of task.attempts) card.appendChild(attemptBlock(attempt));
    if (task.commits.length) {
      card.appendChild(el("ul", { className: "commits" }, task.commits.map((c) => el("li", null,
        el("span", { className: "mono", text: shortSha(c.sha) }), " ", el("span", { text: c.message || "" })))));
    }
    return card;
  }

  function attemptBlock(a) {
    const facts = [
      "attempt " + a.number,
      fmtDuration(a.duration_ms),
      fmtUsd(a.spend_usd),
      (a.input_tokens || 0) + " in / " + (a.output_tokens || 0) + " out tokens" + cachedText(a),
      (a.steps || 0) + " steps",
    ];
    if (a.exit_code !== null && a.exit_code !== undefined) facts.push("exit " + a.exit_code);
    if (a.pid) facts.push("pid " + a.pid);
    if (a.node) facts.push("node " + a.node);
    const block = el("div", { className: "attempt", "data-attempt-id": a.id },
      el("div", { className: "attempt-head" }, badge(a.outcome), el("span", { className: "muted", text: facts.join(" · ") })));
    if (a.phase === "setup") {  // its worker starts once the setup is done
      const said = ["in setup", fmtDuration(a.setup_elapsed_ms), a.setup_last_line].filter(Boolean).join(" · ");
      block.appendChild(el("p", { className: "phase mono", text: said }));
    }
    if (a.start_commit) {
      const parents = (a.start_parents || []).map((p) => p.task + " " + shortSha(p.commit)).join(", ");
      block.appendChild(el("p", { className: "start mono", text: "start " + shortSha(a.start_commit) + " · parents: " + (parents || "—") }));
    }
    if (a.summary) block.appendChild(el("p", { className: "summary", text: a.summary }));
    if (a.error) block.appendChild(el("pre", { className: "error", text: a.error }));
    if (a.salvage_sha) {
      block.appendChild(el("p", { className: "salvage mono" }, "salvaged: " + a.salvage_ref + " (" + shortSha(a.salvage_sha) + "); restore: ",
        el("code", { className: "salvage-restore", text: a.salvage_restore })));
    }
    const files = [a.log_path ? "log: " + a.log_path : null, a.transcript_path ? "transcript: " + a.transcript_path : null].filter(Boolean);
    if (files.length) block.appendChild(el("p", { className: "files mono", text: files.join("   ") }));
    return block;
  }

  function ciSummary(ci) {
    const wrap = el("span", { className: "ci" }, badge(ci.state));
    if (ci.conclusion) wrap.appendChild(el("span", { text: " " + ci.conclusion }));
    if (ci.pr_url) wrap.appendChild(el("span", null, " ", extLink(ci.pr_url, ci.pr_number ? "PR #" + ci.pr_number : "pull request")));
    if (ci.reason) wrap.appendChild(el("span", { className: "muted", text: " " + ci.reason }));
    return wrap;
  }

  function table(id, headers, rows) {
    return el("table", { id: id, className: "grid" },
      el("thead", null, el("tr", null, headers.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", null, rows));
  }

  function branchesSection(branches) {
    const section = el("section", { className: "branches" }, el("h3", { text: "Branches and worktrees" }));
    if (!branches.length) {
      section.appendChild(el("p", { className: "muted", text: "No branch recorded: shared-tree tasks that commit land on the current branch." }));
      return section;
    }
    section.appendChild(table("branches-table", ["Branch", "Worktree", "Tasks", "Commits", "CI"], branches.map((b) => el("tr", null,
      el("td", { className: "mono", text: b.branch }),
      el("td", { className: "mono", text: b.worktree || "—" }),
      el("td", { text: b.tasks.join(", ") }),
      el("td", { text: b.commits }),
      el("td", null, b.ci ? ciSummary(b.ci) : el("span", { className: "muted", text: "not watched" }))))));
    return section;
  }

  function commitsSection(commits) {
    const section = el("section", { className: "all-commits" }, el("h3", { text: "Commits" }));
    if (!commits.length) {
      section.appendChild(el("p", { className: "muted", text: "No commits recorded." }));
      return section;
    }
    section.appendChild(table("commits-table", ["Commit", "Task", "Branch", "Message", "When"], commits.map((c) => el("tr", null,
      el("td", { className: "mono", title: c.sha, text: shortSha(c.sha) }),
      el("td", { text: c.task_id || "" }),
      el("td", { className: "mono", text: c.branch || "" }),
      el("td", { text: c.message || "" }),
      el("td", { text: fmtTime(c.committed_at_ms) })))));
    return section;
  }

  // The provider limits the run's workers met, and the fleet's width as it narrowed and grew back.
  function limitsSection(limits) {
    return el("section", { className: "limits" }, el("h3", { text: "Provider limits" }),
      table("limits-table", ["When", "Kind", "Task", "Source", "Resets", "Width", "What"], limits.map((l) => el("tr", null,
        el("td", { text: fmtTime(l.at_ms) }),
        el("td", null, badge(l.kind)),
        el("td", { className: "mono", text: l.task_id || "" }),
        el("td", { text: l.source }),
        el("td", { text: l.reset_at_ms ? fmtTime(l.reset_at_ms) : "" }),
        el("td", { text: l.concurrency === null || l.concurrency === undefined ? "" : String(l.concurrency) }),
        el("td", { text: l.message || "" })))));
  }

  // The merge train as a picture: a bar per batch, a cell per branch (landed, evicted, back in the queue),
  // a bisection's split points as gaps in the bar.
  function trainSection(batches) {
    const rows = batches.map((b) => {
      const steps = b.steps || [];
      const landed = new Set(steps.filter((s) => s.step === "land").flatMap((s) => s.branches || []));
      const evicted = new Set(steps.filter((s) => s.step === "evict").map((s) => s.branch));
      const splits = new Set(steps.filter((s) => s.step === "bisect").flatMap((s) => s.points || []));
      const cells = (b.members || []).map((branch, i) => {
        const kind = landed.has(branch) ? "landed" : evicted.has(branch) ? "evicted" : "waiting";
        const split = splits.has(i) ? " train-split" : "";
        return el("span", { className: "train-cell train-" + kind + split, title: branch + ": " + kind,
          text: kind === "evicted" ? "✕" : "" });
      });
      const checks = steps.filter((s) => s.step === "check").length;
      return el("div", { className: "train-row" },
        el("span", { className: "train-label", text: "batch " + b.number + " · window " + b.window }),
        el("span", { className: "train-bar" }, cells),
        el("span", { className: "muted", text: (b.outcome || "running") + " · " + checks + " check" + (checks === 1 ? "" : "s") }));
    });
    const legend = el("p", { className: "legend" },
      [["train-landed", "landed"], ["train-evicted", "evicted"], ["train-waiting", "back in the queue"]].map(([cls, label]) =>
        el("span", { className: "legend-item" }, el("span", { className: "swatch " + cls }), label)),
      el("span", { className: "legend-item", text: "a gap: where a red batch was split" }));
    return el("section", { className: "train" }, el("h3", { text: "Merge train" }), legend, rows);
  }

  function cleanupsSection(cleanups) {
    return el("section", { className: "cleanups" }, el("h3", { text: "Clean-up" }),
      table("cleanups-table", ["When", "Kind", "Target", "Action", "Reason"], cleanups.map((c) => el("tr", null,
        el("td", { text: fmtTime(c.at_ms) }),
        el("td", { text: c.kind }),
        el("td", { className: "mono", text: c.target }),
        el("td", null, badge(c.action)),
        el("td", { text: c.reason || "" })))));
  }

  window.addEventListener("hashchange", () => {
    lastRendered = "";
    window.scrollTo(0, 0);
    refresh();
  });
  refresh(); // a module runs after the document is parsed
}
