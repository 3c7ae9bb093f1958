// nfview: every recorded value reaches the page as text (textContent / text nodes), never as
// markup; links are built from fixed routes with encoded parameters. The page runs no other script.
"use strict";

const ATTRS = new Set(["id", "class", "title", "name", "type", "value", "placeholder", "for", "alt", "colspan"]);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "href") e.setAttribute("href", safeHref(v));
    else if (k === "src") e.setAttribute("src", safeSrc(v));
    else if (k === "checked") e.checked = true;
    else if (k.startsWith("data-") || ATTRS.has(k)) e.setAttribute(k, String(v));
    else throw new Error("attribute not allowed: " + k);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined) continue;
    e.append(kid instanceof Node ? kid : String(kid));  // a string becomes a text node
  }
  return e;
}

function safeHref(v) {
  const s = String(v);
  return s.startsWith("#/") ? s : "#/report";
}

function safeSrc(v) {
  const s = String(v);
  return s.startsWith("/plot/") ? s : "";
}

function route(name, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const qs = q.toString();
  return "#/" + name + (qs ? "?" + qs : "");
}

function link(text, name, params, attrs) {
  return el("a", Object.assign({href: route(name, params)}, attrs || {}), text);
}

async function api(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const resp = await fetch(path + (q.toString() ? "?" + q.toString() : ""), {credentials: "same-origin"});
  if (!resp.ok) throw new Error(path + ": " + resp.status + " " + (await resp.text()));
  return resp.json();
}

// A number as the command line prints it: Python's format rounds an exact tie to the even digit,
// where toFixed rounds it away from zero (0.40625 is 0.4062 in the terminal, so here too).
function num(x, digits) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x) || !Number.isFinite(x)) return String(x);
  const d = digits === undefined ? 4 : digits;
  const exact = x.toFixed(Math.min(100, d + 30));
  const dot = exact.indexOf(".");
  const kept = d === 0 ? exact.slice(0, dot) : exact.slice(0, dot + 1 + d);
  const tie = /^50*$/.test(exact.slice(dot + 1 + d));
  return tie && "02468".includes(kept[kept.length - 1]) ? kept : x.toFixed(d);
}

function ci(pair, digits) {
  if (!Array.isArray(pair)) return "";
  return "[" + num(pair[0], digits) + ", " + num(pair[1], digits) + "]";
}

function when(t) {
  if (typeof t !== "number") return "";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 23);
}

function table(id, head, rows) {
  const body = rows instanceof Node && rows.tagName === "TBODY" ? rows : el("tbody", {}, rows);
  return el("table", {id: id}, el("thead", {}, el("tr", {}, head.map(h => el("th", {}, h)))), body);
}

// A JSON value as nested lists and tables: for the sections with no page of their own.
function tree(v, depth) {
  depth = depth || 0;
  if (v === null || v === undefined) return el("span", {class: "null"}, "null");
  if (typeof v !== "object") return el("span", {class: "scalar"}, typeof v === "number" ? num(v, 6) : String(v));
  if (Array.isArray(v)) {
    if (v.length === 0) return el("span", {class: "null"}, "[]");
    const objs = v.every(x => x && typeof x === "object" && !Array.isArray(x));
    if (objs && depth < 4) {
      const keys = [...new Set(v.flatMap(x => Object.keys(x)))];
      return table(null, keys, v.slice(0, 500).map(x => el("tr", {}, keys.map(k => el("td", {}, tree(x[k], depth + 1))))));
    }
    return el("ol", {}, v.slice(0, 500).map(x => el("li", {}, tree(x, depth + 1))));
  }
  const keys = Object.keys(v);
  if (keys.length === 0) return el("span", {class: "null"}, "{}");
  return el("dl", {}, keys.map(k => [el("dt", {}, k), el("dd", {}, tree(v[k], depth + 1))]));
}

// -- pages --------------------------------------------------------------------------------------

let SUMMARY = null;

async function summary() {
  if (SUMMARY === null) SUMMARY = await api("/api/summary");
  return SUMMARY;
}

function intervalBar(lo, hi, mid, max) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 160, H = 14;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("class", "bar");
  const scale = x => (typeof x === "number" && isFinite(x) && max > 0) ? Math.max(0, Math.min(W, W * x / max)) : W;
  const line = document.createElementNS(NS, "rect");
  line.setAttribute("x", scale(lo));
  line.setAttribute("y", 5);
  line.setAttribute("height", 4);
  line.setAttribute("width", Math.max(1, scale(hi) - scale(lo)));
  line.setAttribute("class", "ci");
  const dot = document.createElementNS(NS, "circle");
  dot.setAttribute("cx", scale(mid));
  dot.setAttribute("cy", 7);
  dot.setAttribute("r", 3.5);
  dot.setAttribute("class", "point");
  svg.append(line, dot);
  return svg;
}

function conditionsTable(conds) {
  const names = Object.keys(conds);
  const max = Math.max(1e-9, ...names.map(n => {
    const hi = (conds[n].w_ci || [])[1];
    return typeof hi === "number" && isFinite(hi) ? hi : conds[n].w || 0;
  }));
  const rows = names.map(n => {
    const c = conds[n];
    return el("tr", {"data-condition": n},
      el("td", {class: "name"}, n),
      el("td", {}, num(c.tasks) + "×" + num(c.replicates)),
      el("td", {}, num(c.score), " ", el("small", {}, ci(c.score_ci, 3))),
      el("td", {}, num(c.w, 5), " ", el("small", {}, ci(c.w_ci, 5))),
      el("td", {}, intervalBar((c.w_ci || [])[0], (c.w_ci || [])[1], c.w, max)),
      el("td", {}, num(c.variable_tasks), "/", num(c.tasks), " ", el("small", {}, ci(c.variable_tasks_ci, 3))),
      el("td", {}, num(c.budget), " ", el("small", {}, ci(c.budget_ci, 0))),
      el("td", {}, num(c.mde)),
      el("td", {class: "links"},
        link("sessions", "sessions", {condition: n}, {class: "to-sessions"}), " · ",
        link("exchanges", "exchanges", {condition: n}, {class: "to-exchanges"}), " · ",
        link("outcomes", "outcomes", {condition: n})));
  });
  return table("conditions", ["condition", "N×R", "score [95%]", "w [95%]", "interval", "variable tasks [CP 95%]",
    "budget R* [CI]", "MDE", "behind it"], rows);
}

function carriers(conds) {
  const items = [];
  for (const [n, c] of Object.entries(conds)) {
    for (const t of (c.top_tasks || []).slice(0, 5)) {
      items.push(el("tr", {},
        el("td", {}, n),
        el("td", {}, link(String(t.task), "exchanges", {condition: n, task: t.task}, {class: "task-link"})),
        el("td", {}, num(t.share, 3)),
        el("td", {}, num(t.w_without, 5)),
        el("td", {}, link("sessions", "sessions", {condition: n, task: t.task}))));
    }
  }
  return items.length ? [el("h3", {}, "Tasks carrying most of w"),
    table("carriers", ["condition", "task", "share of w", "w without it", ""], items)] : [];
}

function gateSection(gate) {
  const verdicts = gate.verdicts || [];
  const rows = verdicts.map(v => el("tr", {class: "verdict-" + String(v.verdict).replace(/[^a-z_]/g, "")},
    el("td", {}, String(v.case_id)),
    el("td", {class: "verdict"}, String(v.verdict)),
    el("td", {}, v.base_a ? num(v.base_a.passes) + "/" + num(v.base_a.n) : ""),
    el("td", {}, v.base_b ? num(v.base_b.passes) + "/" + num(v.base_b.n) : ""),
    el("td", {}, v.candidate ? num(v.candidate.passes) + "/" + num(v.candidate.n) : ""),
    el("td", {}, num(v.floor, 3)),
    el("td", {}, link("exchanges", "exchanges", {task: v.case_id}))));
  const out = [el("h2", {}, "Gate verdicts")];
  if (gate.counts) out.push(el("p", {id: "gate-counts"},
    Object.entries(gate.counts).map(([k, n]) => num(n) + " " + k).join(", ")));
  out.push(table("gate", ["case", "verdict", "baseline A", "baseline B", "candidate", "floor", ""], rows));
  if (gate.operating_characteristics) {
    out.push(el("details", {}, el("summary", {}, "Operating characteristics"), tree(gate.operating_characteristics)));
  }
  return out;
}

// -- the outcome grid: tasks x replicates per condition, flipping tasks first ---------------------

const GRID_SHOWN = 100;  // tasks drawn per condition before "show all" (a study of thousands stays quick)
const CELL_WORD = {P: "pass", F: "fail", E: "run failed", ".": "no outcome"};

function gridRow(cond, t, rep0) {
  const cells = [...String(t.cells)].map((code, r) => {
    const session = t.sessions ? t.sessions[r] : null;
    const to = session ? route("exchanges", {session: session}) : route("exchanges", {condition: cond, task: t.task});
    const word = CELL_WORD[code] || "no outcome";
    return el("a", {href: to, class: "cell cell-" + (code === "." ? "none" : code),
      title: t.task + " · replicate " + (r + rep0) + " · " + word, "data-replicate": r}, "");
  });
  return el("div", {class: "grid-row" + (t.flips ? " flips" : ""), "data-task": t.task},
    el("span", {class: "cells"}, cells),
    el("span", {class: "task", title: t.task}, t.flips ? el("span", {class: "flip-mark", title: "outcome flips across replicates"}, "◆ ") : null,
      String(t.task)));
}

function plural(n, word) {
  return num(n) + " " + word + (n === 1 ? "" : "s");
}

function gridTable(c, i) {
  const body = el("div", {id: "grid-" + i, class: "grid", "data-condition": c.name});
  body.style.columnWidth = (11 * c.replicates + 130) + "px";  // the cells and room for a task id, whatever R is
  const show = n => body.replaceChildren(...c.tasks.slice(0, n).map(t => gridRow(c.name, t, 0)));
  show(GRID_SHOWN);
  const kids = [el("h3", {}, String(c.name)),
    el("p", {class: "note grid-count"}, num(c.flipping) + " of " + plural(c.tasks.length, "task") + " flip across " +
      plural(c.replicates, "replicate") + " (" + plural(c.runs, "run") + ")"), body];
  if (c.tasks.length > GRID_SHOWN) {
    const all = el("button", {type: "button", class: "grid-all"}, "show all " + c.tasks.length + " tasks");
    all.addEventListener("click", () => { show(c.tasks.length); all.remove(); });
    kids.push(all);
  }
  return el("div", {class: "grid-block"}, kids);
}

async function gridSection(order) {
  const g = await api("/api/grid");
  if (!g.conditions.length) return [];
  const rank = name => { const i = order.indexOf(name); return i < 0 ? order.length : i; };
  g.conditions.sort((a, b) => rank(a.name) - rank(b.name));  // the report's order (live, t0, replay), else as found
  const key = el("p", {class: "note grid-key"}, el("span", {class: "cell cell-P"}), " pass ",
    el("span", {class: "cell cell-F"}), " fail ", el("span", {class: "cell cell-E"}), " run failed ",
    el("span", {class: "cell cell-none"}), " no outcome · ◆ the task's outcome flips across replicates (listed first) · " +
    "a cell opens that run's exchanges");
  return [el("h2", {}, "Outcomes: tasks × replicates"), key,
    el("div", {id: "grid", class: "grids"}, g.conditions.map(gridTable))];
}

const DESIGN_TITLES = {judge: "Judge study", audit: "Tool-calling audit", gate: "Regression gate",
  compare: "Compare on one recording"};

async function reportPage(main) {
  const s = await summary();
  const r = s.report;
  const parts = [el("h1", {}, r && DESIGN_TITLES[r.design] ? DESIGN_TITLES[r.design] : "Report")];
  if (!r) parts.push(el("p", {class: "note"}, s.source.store ? "No report.json here: this is a store. Its sessions and " +
    "exchanges are under the tabs above." : "No report.json here: the outcome rows alone."));
  parts.push(...await gridSection(r && r.conditions ? Object.keys(r.conditions) : []));
  // a design's own result before the ladder of its conditions
  if (r && r.judge && Object.keys(r.judge).length) parts.push(el("h2", {}, "Judge"), el("div", {id: "judge"}, tree(r.judge)));
  if (r && r.floors) parts.push(el("h2", {}, "Floors"), el("div", {id: "floors"}, tree(r.floors)));
  const gate = s.gate || (r && r.gate);
  if (gate && typeof gate === "object") parts.push(...gateSection(gate));
  if (r && r.compare) parts.push(el("h2", {}, "Compare"), el("div", {id: "compare"}, tree(r.compare)));
  if (s.trajectories) parts.push(el("h2", {}, "Trajectories"), el("div", {id: "trajectories"}, tree(s.trajectories)));
  if (s.trajectories_note) parts.push(el("h2", {}, "Trajectories"), el("p", {class: "note"}, s.trajectories_note));
  if (r && r.conditions) {
    parts.push(el("h2", {}, DESIGN_TITLES[r.design] ? "Determinism ladder of the study's conditions" : "Determinism ladder"),
      conditionsTable(r.conditions), ...carriers(r.conditions));
  }
  if (r && Array.isArray(r.contrasts) && r.contrasts.length) {
    parts.push(el("h3", {}, "Contrasts of w (A − B)"), table("contrasts", ["A", "B", "estimate", "95% interval"],
      r.contrasts.map(c => el("tr", {}, el("td", {}, String(c.a)), el("td", {}, String(c.b)),
        el("td", {}, num(c.estimate, 5)), el("td", {}, ci(c.ci, 5))))));
  }
  for (const name of s.source.plots || []) {
    parts.push(el("figure", {}, el("img", {src: "/plot/" + encodeURIComponent(name), alt: name, class: "plot"}),
      el("figcaption", {}, name)));
  }
  if (r && r.warnings && r.warnings.length) {
    parts.push(el("h2", {}, "Warnings"), el("ul", {id: "warnings"}, r.warnings.map(w => el("li", {}, String(w)))));
  }
  if (r) {
    const prov = {};
    for (const k of ["provenance", "settings", "log", "dropped_tasks", "batches", "version"]) if (r[k] !== undefined && r[k] !== null) prov[k] = r[k];
    for (const k of Object.keys(r)) if (!["conditions", "contrasts", "judge", "floors", "gate", "compare", "warnings"].includes(k) && !(k in prov)) prov[k] = r[k];
    parts.push(el("h2", {}, "Provenance and settings"), el("div", {id: "provenance"}, tree(prov)));
  }
  if (s.store) {
    parts.push(el("h2", {}, "Store"), el("p", {id: "store-info"},
      num(s.store.exchanges) + " exchanges; rules " + String(s.store.rules_id) + "; " + String(s.store.format)));
  }
  main.replaceChildren(...parts);
}

const STATUS = ["", "2xx", "4xx", "5xx", "200", "404", "error"];
const RESULTS = ["", "recorded", "hit", "miss", "order_violation", "error"];

function filterForm(params, fields, target) {
  const input = (name, label) => el("label", {}, label, " ",
    el("input", {name: name, type: name === "q" ? "search" : "text", value: params.get(name) || "",
      placeholder: name === "q" ? "text in labels, URL, bodies" : ""}));
  const select = (name, label, options) => {
    const s = el("select", {name: name}, options.map(o => el("option", {value: o}, o || "any")));
    s.value = params.get(name) || "";
    return el("label", {}, label, " ", s);
  };
  const kids = [];
  for (const f of fields) {
    if (f === "status") kids.push(select("status", "status", STATUS));
    else if (f === "result") kids.push(select("result", "replay", RESULTS));
    else if (f === "order") kids.push(el("label", {}, el("input", {name: "order", type: "checkbox", checked: params.get("order") === "1"}), " order note"));
    else if (f === "q") kids.push(input("q", "search"));
    else kids.push(input(f, f));
  }
  const form = el("form", {id: "filters"}, kids, el("button", {type: "submit"}, "Filter"),
    el("a", {href: route(target, {}), class: "clear"}, "clear"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const out = {};
    for (const f of fields) {
      const field = form.elements[f];
      if (!field) continue;
      if (field.type === "checkbox") { if (field.checked) out[f] = "1"; } else if (field.value) out[f] = field.value;
    }
    location.hash = route(target, out);
  });
  return form;
}

function paramsObject(params, names) {
  const out = {};
  for (const n of names) if (params.get(n)) out[n] = params.get(n);
  return out;
}

const EX_FILTERS = ["condition", "task", "session", "model", "status", "result", "order", "q"];

async function exchangesPage(main, params) {
  const filters = paramsObject(params, EX_FILTERS);
  const body = el("tbody", {});
  const more = el("button", {id: "more", type: "button"}, "Load more");
  const info = el("p", {id: "scan-info", class: "note"});
  let cursor = 0, shown = 0;
  const unsearched = [];
  const load = async () => {
    more.disabled = true;
    const page = await api("/api/exchanges", Object.assign({after: cursor, limit: 100}, filters));
    for (const x of page.items) {
      shown++;
      body.append(el("tr", {class: "result-" + String(x.result).replace(/[^a-z_]/g, ""), "data-id": x.id},
        el("td", {}, link(String(x.id), "exchange/" + x.id, {}, {class: "ex-link"})),
        el("td", {}, when(x.time)),
        el("td", {}, String(x.mode)),
        el("td", {class: "session"}, link(String(x.session), "exchanges", {session: x.session})),
        el("td", {class: "task"}, x.task === null ? "" : String(x.task)),
        el("td", {class: "condition"}, x.condition === null ? "" : String(x.condition)),
        el("td", {}, x.replicate === null ? "" : String(x.replicate)),
        el("td", {class: "url"}, String(x.method) + " " + String(x.url)),
        el("td", {class: "status"}, x.status === null ? "ERR" : String(x.status)),
        el("td", {class: "result"}, String(x.result)),
        el("td", {class: "order"}, x.order_note === null ? "" : String(x.order_note)),
        el("td", {class: "model"}, x.model === null ? "" : String(x.model)),
        el("td", {}, x.latency_ms === null ? "" : num(x.latency_ms, 1))));
    }
    cursor = page.next === null ? cursor : page.next;
    info.textContent = shown + " shown of " + page.total + " exchanges in the store" +
      (page.next === null ? " (end of the store)" : "; read up to exchange " + page.next);
    unsearched.push(...(page.unsearched || []));
    if (unsearched.length) info.textContent += "; the text of exchanges " + unsearched.join(", ") + " was not searched: " +
      "a body over --max-body-mb " + page.max_body_mb + " (start nfview with a higher one to search it)";
    more.hidden = page.next === null;
    more.disabled = false;
  };
  more.addEventListener("click", () => { load().catch(fail); });
  main.replaceChildren(el("h1", {}, "Exchanges"), filterForm(params, EX_FILTERS, "exchanges"), info,
    table("exchange-list", ["id", "time", "mode", "session", "task", "condition", "rep", "request", "status", "replay",
      "order note", "model", "ms"], body), more);
  await load();
}

const SESSION_FILTERS = ["condition", "task", "model", "status", "result", "q"];

async function sessionsPage(main, params) {
  const filters = paramsObject(params, SESSION_FILTERS);
  const body = el("tbody", {});
  const more = el("button", {id: "more", type: "button"}, "Load more");
  const info = el("p", {id: "scan-info", class: "note"});
  const seen = new Map();
  let cursor = 0;
  const cells = s => [
    el("td", {class: "session"}, link(String(s.session), "exchanges", {session: s.session}, {class: "session-link"})),
    el("td", {class: "condition"}, s.condition === null ? "" : String(s.condition)),
    el("td", {class: "task"}, s.task === null ? "" : String(s.task)),
    el("td", {}, s.replicate === null ? "" : String(s.replicate)),
    el("td", {}, num(s.exchanges)), el("td", {}, num(s.hits)), el("td", {}, num(s.misses)),
    el("td", {}, num(s.order)), el("td", {}, num(s.errors)), el("td", {}, s.models.join(", ")),
    el("td", {class: "trajectory"}, trajectory(s)), el("td", {}, when(s.first_time))];
  const load = async () => {
    more.disabled = true;
    const page = await api("/api/sessions", Object.assign({after: cursor}, filters));
    for (const s of page.items) {
      const have = seen.get(s.session);
      if (have) {  // a session spanning two pages: add its counts up
        for (const k of ["exchanges", "hits", "misses", "order", "errors"]) have.data[k] += s[k];
        for (const m of s.models) if (!have.data.models.includes(m)) have.data.models.push(m);
        for (const [k, n] of Object.entries(s.followed || {})) have.data.followed[k] = (have.data.followed[k] || 0) + n;
        if (!have.data.diverged && s.diverged) have.data.diverged = s.diverged;
        have.row.replaceChildren(...cells(have.data));
      } else {
        const row = el("tr", {"data-session": s.session}, cells(s));
        seen.set(s.session, {data: s, row: row});
        body.append(row);
      }
    }
    cursor = page.next === null ? cursor : page.next;
    info.textContent = seen.size + " sessions in " + (page.next === null ? "the whole store" : "exchanges up to " + page.next) +
      " (" + page.total + " exchanges)";
    more.hidden = page.next === null;
    more.disabled = false;
  };
  more.addEventListener("click", () => { load().catch(fail); });
  main.replaceChildren(el("h1", {}, "Sessions"), filterForm(params, SESSION_FILTERS, "sessions"), info,
    table("session-list", ["session", "condition", "task", "rep", "exchanges", "hits", "misses", "order notes",
      "errors", "models", "followed / diverged", "first"], body), more);
  await load();
}

function trajectory(s) {  // a replay session: the recorded session it followed, where it diverged
  const followed = Object.entries(s.followed || {}).sort((a, b) => b[1] - a[1]);
  const parts = followed.length ? ["followed " + followed[0][0] + " (" + followed[0][1] + ")"] : [];
  const d = s.diverged;
  if (d) parts.push("diverged at step " + d.step + " (" + d.result + (d.path ? " at " + d.path : "") + "); " +
    d.cut_off + " later recorded steps cut off");
  return parts.join("; ");
}

function headersTable(id, headers) {
  return table(id, ["header", "value"], (headers || []).map(h => el("tr", {}, el("td", {}, String(h[0])), el("td", {}, String(h[1])))));
}

function bodyBlock(id, b) {
  if (!b) return el("p", {class: "note", id: id}, "(no body)");
  const note = b.cut ? " (first 2 MB of " + b.size + " bytes)" : " (" + num(b.size) + " bytes, " + b.kind + ")";
  return el("div", {}, el("p", {class: "note"}, "body" + note), el("pre", {id: id, class: "body"}, String(b.text)));
}

function diffTable(miss) {
  if (!miss.nearest) return el("p", {id: "diff", class: "note"}, String(miss.why || "no nearest request"));
  const n = miss.nearest;
  const head = ["recorded: exchange " + n.exchange_id + " (" + n.session + ", similarity " + num(n.similarity, 3) + ")",
    "this request"];
  const rows = miss.rows.map(r => el("tr", {class: "op-" + r.op},
    el("td", {class: "left"}, r.left === null ? "" : r.left), el("td", {class: "right"}, r.right === null ? "" : r.right)));
  return el("div", {}, el("p", {}, link("open the recorded request", "exchange/" + n.exchange_id, {}, {id: "nearest-link"})),
    table("diff", head, rows));
}

async function exchangePage(main, id) {
  const v = await api("/api/exchange/" + encodeURIComponent(id));
  const x = v.row, rec = v.record;
  const facts = [["session", link(String(x.session), "exchanges", {session: x.session})], ["task", x.task], ["condition", x.condition],
    ["replicate", x.replicate], ["mode", x.mode], ["time", when(x.time)], ["key", x.key], ["occurrence", x.occurrence],
    ["replay", x.result], ["order note", x.order_note], ["model", x.model], ["fingerprint", rec.fingerprint],
    ["finish reason", rec.finish_reason], ["latency ms", x.latency_ms === null ? null : num(x.latency_ms, 1)],
    ["error", x.error], ["notes", (rec.notes || []).join("; ")],
    ["overrides", rec.overrides ? JSON.stringify(rec.overrides) : null], ["perturbation", rec.perturbation]];
  const parts = [el("h1", {}, "Exchange " + x.id),
    el("dl", {id: "facts", class: "facts"}, facts.filter(f => f[1] !== null && f[1] !== undefined && f[1] !== "")
      .map(f => [el("dt", {}, f[0]), el("dd", {}, f[1])]))];
  if (v.miss) parts.push(el("h2", {}, "Replay miss: nearest recorded request"), diffTable(v.miss));
  parts.push(el("h2", {}, "Request"), el("p", {class: "request-line"}, String(rec.request.method) + " " + String(rec.request.url)),
    headersTable("request-headers", rec.request.headers), bodyBlock("request-body", v.request_body));
  parts.push(el("h2", {}, "Response"));
  if (rec.response) {
    parts.push(el("p", {id: "response-status"}, "status " + String(rec.response.status)),
      headersTable("response-headers", rec.response.headers));
    if (v.chunks) {
      parts.push(el("h3", {}, "Stream: " + v.chunks.length + " chunks"), table("chunks", ["#", "ms after first", "bytes", "data"],
        v.chunks.map((c, i) => el("tr", {}, el("td", {}, String(i)), el("td", {}, num(c.offset_ms, 1)),
          el("td", {}, num(c.size)), el("td", {}, el("pre", {}, String(c.text)))))));
    }
    parts.push(bodyBlock("response-body", v.response_body));
  } else {
    parts.push(el("p", {class: "note"}, "no response: " + String(rec.error || "")));
  }
  parts.push(el("details", {}, el("summary", {}, "The stored record"), el("pre", {id: "record"}, JSON.stringify(rec, null, 2))));
  main.replaceChildren(...parts);
}

async function outcomesPage(main, params) {
  const filters = paramsObject(params, ["condition", "task"]);
  const body = el("tbody", {});
  const more = el("button", {id: "more", type: "button"}, "Load more");
  let offset = 0;
  const load = async () => {
    const page = await api("/api/outcomes", Object.assign({offset: offset, limit: 200}, filters));
    for (const r of page.items) {
      const sessionCell = r.session ? link(String(r.session), "exchanges", {session: r.session}, {class: "session-link"})
        : link("exchanges", "exchanges", {condition: r.condition, task: r.task_id});
      body.append(el("tr", {}, el("td", {}, String(r.task_id)), el("td", {}, String(r.condition)), el("td", {}, String(r.replicate)),
        el("td", {class: "outcome"}, String(r.outcome)), el("td", {}, r.failure ? String(r.failure) : ""),
        el("td", {}, r.detail ? String(r.detail) : ""), el("td", {}, r.model ? String(r.model) : ""), el("td", {}, sessionCell)));
    }
    offset = page.next === null ? offset : page.next;
    more.hidden = page.next === null;
  };
  more.addEventListener("click", () => { load().catch(fail); });
  main.replaceChildren(el("h1", {}, "Outcome rows"), filterForm(params, ["condition", "task"], "outcomes"),
    table("outcome-list", ["task", "condition", "rep", "outcome", "failure", "detail", "model", "session"], body), more);
  await load();
}

// -- routing ------------------------------------------------------------------------------------

function fail(err) {
  document.getElementById("main").replaceChildren(el("p", {class: "error", id: "error"}, String(err && err.message || err)));
  document.body.setAttribute("data-state", "error");
}

async function render() {
  document.body.setAttribute("data-state", "loading");
  const main = document.getElementById("main");
  const hash = location.hash || "#/report";
  const [path, query] = hash.slice(2).split("?");
  const params = new URLSearchParams(query || "");
  const tab = path.startsWith("exchange/") ? "exchanges" : (path.split("/")[0] || "report");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.getAttribute("href") === "#/" + tab);
  try {
    const s = await summary();
    document.getElementById("source").textContent = s.source.path;
    if (path.startsWith("exchange/")) await exchangePage(main, path.slice("exchange/".length));
    else if (path === "exchanges") await exchangesPage(main, params);
    else if (path === "sessions") await sessionsPage(main, params);
    else if (path === "outcomes") await outcomesPage(main, params);
    else await reportPage(main);
    document.body.setAttribute("data-rendered", hash);  // which route is on screen: a test waits for its own
    document.body.setAttribute("data-state", "ready");
  } catch (err) {
    fail(err);
  }
}

window.addEventListener("hashchange", render);
document.addEventListener("DOMContentLoaded", render);
