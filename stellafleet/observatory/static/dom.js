// DOM and SVG builders (text only: nothing from the ledger is ever parsed as HTML) and formatting.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
export const STATUSES = new Set([
  "running", "succeeded", "failed", "skipped", "pending", "interrupted", "spend_limited", "usage_limited",
  "green", "red", "stalled", "abandoned", "no_ci", "error", "removed", "kept", "rate", "usage", "concurrency",
  "parked",
]);

function fill(node, props, children, asAttribute) {
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "className") asAttribute ? node.setAttribute("class", value) : (node.className = value);
      else if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function el(tag, props, ...children) {
  return fill(document.createElement(tag), props, children, false);
}

export function svg(tag, props, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), props, children, true);
}

export function statusClass(status) {
  return "st-" + (STATUSES.has(status) ? status : "other");
}

export function badge(status, extra) {
  return el("span", { className: "badge " + statusClass(status) + (extra ? " " + extra : ""), text: status || "unknown" });
}

export function safeHref(url) {
  try {
    const parsed = new URL(String(url));
    return parsed.protocol === "https:" || parsed.protocol === "http:" ? parsed.href : null;
  } catch (_) {
    return null;
  }
}

export function extLink(url, label) {
  const href = safeHref(url);
  if (!href) return el("span", { text: url || "" });
  return el("a", { href: href, rel: "noopener noreferrer", target: "_blank", text: label || url });
}

export function pad(n) {
  return String(n).padStart(2, "0");
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "—";
  const s = ms / 1000;
  if (s < 10) return s.toFixed(1) + "s";
  const total = Math.round(s);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const sec = total % 60;
  if (h) return h + "h " + pad(m) + "m";
  if (m) return m + "m " + pad(sec) + "s";
  return sec + "s";
}

// Dollars as the terminal writes them (core/spend.py money): at least two decimals, up to four,
// two significant digits below a hundredth of a cent ($1.50, $0.003, $0.0035, $0.000042).
// " (cache: 1200 read, 300 written)" for an attempt with cached input tokens, else "" (as `stella runs`).
export function cachedText(a) {
  const read = a.cache_read_tokens || 0, written = a.cache_write_tokens || 0;
  return read || written ? " (cache: " + read + " read, " + written + " written)" : "";
}

export function fmtUsd(x) {
  let v = Number(x || 0);
  if (!isFinite(v)) return "$?";
  let sign = v < 0 ? "-" : "";
  v = Math.abs(v);
  let decimals = 4;
  if (v > 0 && v < 0.00005) decimals = Math.min(12, 1 - Math.floor(Math.log10(v)));
  const parts = v.toFixed(decimals).split(".");
  let fraction = (parts[1] || "").replace(/0+$/, "");
  while (fraction.length < 2) fraction += "0";
  if (parts[0] === "0" && /^0*$/.test(fraction)) sign = "";
  return sign + "$" + parts[0] + "." + fraction;
}

export function shortSha(sha) {
  return sha ? String(sha).slice(0, 10) : "";
}

// A time axis for [start, end] over `width` pixels: a few round ticks (seconds, minutes or hours).
export function timeTicks(startMs, endMs, width) {
  const span = Math.max(1, endMs - startMs);
  const steps = [1e3, 5e3, 10e3, 30e3, 60e3, 300e3, 600e3, 1800e3, 3600e3, 7200e3, 21600e3, 86400e3];
  const want = Math.max(2, Math.floor(width / 110));
  const step = steps.find((s) => span / s <= want) || steps[steps.length - 1];
  const ticks = [];
  for (let t = 0; t <= span; t += step) ticks.push({ offset: t, label: fmtDuration(t).replace(/\.0s$/, "s") });
  return ticks;
}

// The chart's frame: an <svg> sized to its box, with a view box in pixels.
export function frame(id, width, height, label) {
  return svg("svg", {
    id: id, className: "chart", width: width, height: height, viewBox: "0 0 " + width + " " + height,
    role: "img", "aria-label": label,
  });
}
