"use strict";
// The threadweaver viewer: renders the JSON payload in #data. No network, no libraries.

const DATA = JSON.parse(document.getElementById("data").textContent);
const PAGE = 200; // table rows rendered per step as the table scrolls
const WIDTH = 760, LANE = 22, LABEL = 90;
const COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f"];
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const laneName = (path) => (path.length ? "thread " + path.map((step) => step[1]).join(".") : "main");
// Lanes in reading order: main, then each thread followed by the threads nested in it.
const byPath = (a, b) => {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i][0] !== b[i][0] || a[i][1] !== b[i][1]) return a[i][0] - b[i][0] || a[i][1] - b[i][1];
  }
  return a.length - b.length;
};

// Timelines ------------------------------------------------------------------------------

function timelineSVG(t, scale) {
  const paths = t.requests.map((r) => JSON.stringify(r.thread_path));
  const lanes = [...new Set(paths)].sort((a, b) => byPath(JSON.parse(a), JSON.parse(b)));
  const critical = new Set(t.critical);
  const unit = t.measured ? 1000 : 1; // seconds shown as ms; a token schedule in tokens
  const suffix = t.measured ? " ms" : " tok";
  const x = (v) => LABEL + (v / scale) * WIDTH;
  const height = LANE * lanes.length + 28;
  const width = LABEL + WIDTH + 10;
  const parts = [`<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}">`];
  lanes.forEach((lane, i) => {
    parts.push(`<text class="lane" x="${LABEL - 6}" y="${i * LANE + 18}" text-anchor="end">${laneName(JSON.parse(lane))}</text>`);
  });
  t.requests.forEach((r, i) => {
    const lane = lanes.indexOf(paths[i]);
    const [x0, x1] = [x(r.started), x(r.ended)];
    const path = r.thread_path;
    const colour = path.length ? COLOURS[path[path.length - 1][1] % COLOURS.length] : "#777";
    const tip = `${laneName(path)}: ${r.completion_tokens} tokens, ${Math.round(r.started * unit)}-${Math.round(r.ended * unit)}${suffix}` +
      (critical.has(i) ? ", on the critical path" : "");
    parts.push(`<rect class="request${critical.has(i) ? " critical" : ""}" x="${x0.toFixed(1)}" y="${lane * LANE + 4}" ` +
      `width="${Math.max(x1 - x0, 1.5).toFixed(1)}" height="${LANE - 6}" fill="${colour}" rx="3"><title>${esc(tip)}</title></rect>`);
    if (x1 - x0 > 30) {
      parts.push(`<text class="tokens" x="${((x0 + x1) / 2).toFixed(1)}" y="${lane * LANE + 17}" text-anchor="middle">${r.completion_tokens}</text>`);
    }
  });
  const axis = LANE * lanes.length + 8;
  parts.push(`<line x1="${LABEL}" y1="${axis}" x2="${LABEL + WIDTH}" y2="${axis}" stroke="#999"/>`);
  const step = tickStep(scale * unit);
  for (let tick = 0; tick <= scale * unit + 1e-9; tick += step) {
    parts.push(`<text class="tick" x="${x(tick / unit).toFixed(1)}" y="${axis + 14}" text-anchor="middle">${Math.round(tick)}${suffix}</text>`);
  }
  return parts.join("") + "</svg>";
}

function tickStep(span) {
  for (const step of [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 30000, 60000, 120000, 300000]) {
    if (span / step <= 8) return step;
  }
  return span / 8;
}

const scaleOf = (timelines) => Math.max(1e-9, ...timelines.flatMap((t) => t.requests.map((r) => r.ended)));

function treeHTML(nodes) {
  return nodes.map((node) => {
    if ("text" in node) return `<span class="text">${esc(node.text)}</span>`;
    const threads = node.threads.map((t) => `<div class="thread"><b>thread ${t.number}:</b> ${treeHTML(t.body)}</div>`).join("");
    return `<div class="block"><div class="outlines">outlines: ${node.outlines.map(esc).join(", ")}</div><div class="threads">${threads}</div></div>`;
  }).join("");
}

const LEGEND = '<p class="legend"><span><span class="swatch" style="background:#777"></span>main sequence</span>' +
  '<span><span class="swatch" style="background:#4e79a7"></span>threads</span>' +
  '<span><span class="swatch" style="border:2.5px solid #c0392b"></span>critical path</span></p>';

function renderGroups() {
  const groups = DATA.groups || [];
  $("groups").innerHTML = groups.length ? LEGEND + groups.map((group) => {
    const scale = scaleOf(group.timelines);
    const body = group.timelines.map((t) => `<h3>${esc(t.label)}</h3><p class="caption">${Math.round((t.wall_s || 0) * 1000)} ms; ` +
      `${t.stats.total_tokens} generated tokens, ${t.stats.critical_path_tokens} on the critical path; ${t.requests.length} ` +
      `request${t.requests.length > 1 ? "s" : ""}</p>${timelineSVG(t, scale)}`).join("");
    const first = group.timelines[0];
    return `<section class="example"><h2>${esc(group.title)}</h2>${body}<details><summary>the trajectory</summary>` +
      `<div class="tree">${treeHTML(first.tree)}</div></details></section>`;
  }).join("") : "";
}

// The table ------------------------------------------------------------------------------

const state = { sortKey: null, descending: false, shown: 0, rows: [] };
const KIND_VALUES = [...new Set(DATA.rows.flatMap((r) => r.kinds))].sort();
const DROP_VALUES = [...new Set(DATA.rows.map((r) => r.drop).filter(Boolean))].sort();
const FILE_LABELS = DATA.files.map((_, i) => String.fromCharCode(65 + i));
/** Files are A and B in the tables (paths are long); the legend above them says which is which. */

const FILTERS = ["filter-file", "filter-correct", "filter-format", "filter-kind", "filter-blocks", "filter-drop"];

function cell(row, key) {
  const v = row[key];
  if (key === "file") return `<span title="${esc(DATA.files[v] || "")}">${FILE_LABELS[v]}</span>`;
  if (key === "correct") return v === null ? "–" : v ? '<span class="yes">yes</span>' : '<span class="no">no</span>';
  if (key === "well_formed") return v ? '<span class="yes">yes</span>' : '<span class="no">no</span>';
  if (key === "kinds" || key === "threads") return esc(v.join(", ") || "–");
  if (key === "speedup") return v.toFixed(2) + "x";
  return v === null || v === undefined ? "–" : esc(v);
}

function sortValue(row, key) {
  const v = row[key];
  if (Array.isArray(v)) return key === "threads" ? v.reduce((a, b) => a + b, 0) : v.join(",");
  if (v === null || v === undefined) return -Infinity;
  return typeof v === "boolean" ? Number(v) : v;
}

function compare(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

function filtered() {
  const search = $("search").value.toLowerCase();
  const [file, correct, format, kind, blocks, drop] = FILTERS.map((id) => $(id).value);
  let rows = DATA.rows.map((row, index) => ({ row, index })).filter(({ row }) =>
    (!search || row.text.toLowerCase().includes(search) || String(row.id).toLowerCase().includes(search)) &&
    (file === "" || String(row.file) === file) &&
    (!correct || (correct === "ungraded" ? row.correct === null : row.correct === (correct === "correct"))) &&
    (!format || row.well_formed === (format === "well-formed")) &&
    (!kind || row.kinds.includes(kind)) &&
    (!blocks || (row.blocks > 0) === (blocks === "parallel")) &&
    (!drop || (drop === "kept" ? !row.drop : row.drop === drop)));
  if (state.sortKey) {
    const key = state.sortKey;
    rows.sort((a, b) => compare(sortValue(a.row, key), sortValue(b.row, key)) * (state.descending ? -1 : 1) || a.index - b.index);
  }
  return rows;
}

const COLUMNS = [...document.querySelectorAll("#rows th")].map((th) => th.dataset.key);
const NUMERIC = new Set([...document.querySelectorAll("#rows th.num")].map((th) => th.dataset.key));

function renderTable() {
  state.rows = filtered();
  state.shown = 0;
  document.querySelector("#rows tbody").innerHTML = "";
  $("count").textContent = `${state.rows.length} of ${DATA.rows.length} rows`;
  more();
}

function more() {
  const body = document.querySelector("#rows tbody");
  const html = state.rows.slice(state.shown, state.shown + PAGE).map(({ row, index }) =>
    `<tr data-index="${index}">` + COLUMNS.map((key) => `<td class="${NUMERIC.has(key) ? "num" : ""}" data-key="${key}">${cell(row, key)}</td>`).join("") + "</tr>").join("");
  body.insertAdjacentHTML("beforeend", html);
  state.shown = Math.min(state.rows.length, state.shown + PAGE);
}

function setUpTable() {
  if (!DATA.rows.length) return;
  $("table-view").hidden = false;
  DATA.files.forEach((name, i) => $("filter-file").insertAdjacentHTML("beforeend", `<option value="${i}">${FILE_LABELS[i]}: ${esc(name)}</option>`));
  $("files").innerHTML = DATA.files.map((name, i) => `<b>${FILE_LABELS[i]}</b>: ${esc(name)}`).join("; ");
  KIND_VALUES.forEach((kind) => $("filter-kind").insertAdjacentHTML("beforeend", `<option value="${esc(kind)}">${esc(kind)}</option>`));
  DROP_VALUES.forEach((reason) => $("filter-drop").insertAdjacentHTML("beforeend", `<option value="${esc(reason)}">${esc(reason)}</option>`));
  $("filter-drop").parentElement.hidden = !DROP_VALUES.length;
  $("search").addEventListener("input", renderTable);
  FILTERS.forEach((id) => $(id).addEventListener("change", renderTable));
  document.querySelectorAll("#rows th").forEach((th) => th.addEventListener("click", () => {
    state.descending = state.sortKey === th.dataset.key ? !state.descending : false;
    state.sortKey = th.dataset.key;
    document.querySelectorAll("#rows th").forEach((other) => other.classList.remove("sorted-asc", "sorted-desc"));
    th.classList.add(state.descending ? "sorted-desc" : "sorted-asc");
    renderTable();
  }));
  document.querySelector("#rows tbody").addEventListener("click", (event) => {
    const tr = event.target.closest("tr");
    if (tr) openRows([Number(tr.dataset.index)]);
  });
  new IntersectionObserver((entries) => entries.some((e) => e.isIntersecting) && state.shown < state.rows.length && more())
    .observe($("more"));
  renderTable();
}

// One row -------------------------------------------------------------------------------

async function details(index) {
  const bytes = Uint8Array.from(atob(DATA.details[index]), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

const piece = (id) => DATA.vocab[id] ?? `[${id}]`;

function tokensHTML(d) {
  const injected = new Set(d.injected);
  const faults = {};
  d.faults.forEach((f) => (faults[f.position] = faults[f.position] || []).push(f));
  const mark = (p) => (faults[p] || []).map((f) => `<span class="fault" data-position="${p}" data-kind="${esc(f.kind)}" title="${esc(f.text)}">!</span>`).join("");
  const out = d.ids.map((id, p) => {
    const tag = DATA.tags[id];
    const classes = ["tok", tag ? "tag tag-" + tag.replace(/[<>]/g, "") : "", injected.has(p) ? "injected" : ""].filter(Boolean).join(" ");
    return mark(p) + `<span class="${classes}" data-position="${p}" title="position ${p}${injected.has(p) ? ", injected" : ""}">${esc(piece(id))}</span>`;
  });
  return out.join("") + mark(d.ids.length);
}

function inspectorHTML(trie) {
  // A token that does not follow the one before it starts a branch: a line of its own.
  return trie.ids.map((id, i) => (i > 0 && trie.parent[i] !== i - 1 ? `<br><span class="branch">⤷ after ${trie.parent[i]}</span>` : "") +
    `<span class="node${i < trie.prompt ? " prompt" : ""}${trie.trained[i] ? " trained" : ""}" data-index="${i}" ` +
    `tabindex="0">${esc(piece(id).replace(/\n/g, "↵"))}<sub>${trie.position[i]}</sub></span>`).join("");
}

function inspect(container, trie, q) {
  container.querySelectorAll(".visible, .focus").forEach((n) => n.classList.remove("visible", "focus"));
  const nodes = container.querySelectorAll(".node");
  for (let kv = 0; kv <= q; kv++) {
    if (q < trie.end[kv]) nodes[kv].classList.add("visible"); // the attention hook's rule: kv <= q < end[kv]
  }
  nodes[q].classList.add("focus");
  container.dataset.focus = q;
}

async function openRows(indices) {
  document.querySelectorAll("#rows tr.open").forEach((tr) => tr.classList.remove("open"));
  indices.forEach((index) => document.querySelector(`#rows tr[data-index="${index}"]`)?.classList.add("open"));
  const section = $("detail");
  const panes = await Promise.all(indices.map(async (index) => {
    const pane = document.createElement("div");
    pane.className = "pane";
    pane.dataset.index = index;
    renderRow(pane, index, await details(index));
    return pane;
  }));
  section.replaceChildren(...panes);
  section.classList.toggle("side-by-side", panes.length > 1);
  section.hidden = false;
  section.scrollIntoView({ block: "start" });
}

function renderRow(pane, index, d) {
  const row = DATA.rows[index];
  const t = d.timeline;
  const faults = d.faults.map((f) => `<li><b>${esc(f.kind)}</b> at token ${f.position}: ${esc(f.text)}</li>`).join("");
  pane.innerHTML = `<h2>${esc(DATA.files[row.file] || "")} ${esc(row.id)} (sample ${row.sample}), line ${row.line}</h2>` +
    `<p class="caption">${row.total} generated tokens, ${row.critical} on the critical path (${row.speedup.toFixed(2)}x); ` +
    `${row.blocks} block(s)${row.drop ? "; dropped: " + esc(row.drop) : ""}</p>` +
    `<h3>Timeline (${t.measured ? "request timings as recorded" : "a schedule in generated tokens: no timings recorded"})</h3>` +
    LEGEND + timelineSVG(t, scaleOf([t])) +
    `<h3>Faults</h3>${faults ? `<ul class="faults">${faults}</ul>` : "<p>none</p>"}` +
    `<h3>Tokens</h3><div class="tokens">${tokensHTML(d)}</div>` +
    `<h3>Tree</h3><div class="tree">${treeHTML(d.tree)}</div>` +
    `<h3>Mask inspector</h3><p class="caption">The row's token trie in training order (position = trie depth below each ` +
    `token; trained tokens underlined; the prompt grey; a branch starts a line, after the token it continues). Point at a ` +
    `token: the highlighted ones are exactly those it attends to.</p>` +
    `<div class="inspector">${inspectorHTML(d.trie)}</div>`;
  const inspector = pane.querySelector(".inspector");
  const pick = (event) => {
    const node = event.target.closest(".node");
    if (node) inspect(inspector, d.trie, Number(node.dataset.index));
  };
  inspector.addEventListener("mouseover", pick);
  inspector.addEventListener("focusin", pick);
}

// Two files side by side ---------------------------------------------------------------

/** The pairs' order: a column, highest first or not, and for a difference (B − A) by its size or its sign. At first:
 * the biggest change in speedup first, whichever way it went. */
const pairState = { key: "dspeedup", descending: true, size: true };
const DIFFERENCES = new Set(["dspeedup", "dcorrect"]);

function pairValue(pair) {
  const v = pair[pairState.key];
  return v === null || v === undefined ? -Infinity : pairState.size ? Math.abs(v) : v;
}

function pairOrderText() {
  const th = document.querySelector(`#pairs th[data-key="${pairState.key}"]`);
  const name = DIFFERENCES.has(pairState.key) ? `the change in ${pairState.key === "dspeedup" ? "speedup" : "correct"} (B − A)` : th.textContent;
  if (pairState.size) return `Sorted by the size of ${name}, ${pairState.descending ? "biggest" : "smallest"} first; click a header to sort by it.`;
  return `Sorted by ${name}, ${pairState.descending ? "highest" : "lowest"} first; click a header to sort by it.`;
}

function renderPairs() {
  if (DATA.files.length !== 2) return;
  const byKey = [{}, {}];
  DATA.rows.forEach((row, index) => (byKey[row.file][`${row.id}#${row.sample}`] = { row, index }));
  const pairs = Object.keys(byKey[0]).filter((k) => k in byKey[1]).map((k) => {
    const [a, b] = [byKey[0][k], byKey[1][k]];
    const correct = (r) => (r.correct === null ? null : Number(r.correct));
    return { a, b, id: a.row.id, sample: a.row.sample, speedup0: a.row.speedup, speedup1: b.row.speedup,
      dspeedup: b.row.speedup - a.row.speedup, correct0: correct(a.row), correct1: correct(b.row),
      dcorrect: correct(a.row) === null || correct(b.row) === null ? null : correct(b.row) - correct(a.row) };
  });
  pairs.sort((x, y) => compare(pairValue(x), pairValue(y)) * (pairState.descending ? -1 : 1));
  document.querySelectorAll("#pairs th").forEach((th) => {
    th.classList.toggle("sorted-desc", th.dataset.key === pairState.key && pairState.descending);
    th.classList.toggle("sorted-asc", th.dataset.key === pairState.key && !pairState.descending);
    th.classList.toggle("sorted-size", th.dataset.key === pairState.key && pairState.size);
  });
  $("pairs-order").textContent = pairOrderText();
  $("pairs-view").hidden = false;
  const fmt = (v, digits) => (v === null ? "–" : v.toFixed(digits));
  document.querySelector("#pairs tbody").innerHTML = pairs.map((p) => `<tr data-index="${p.a.index}" data-other="${p.b.index}">` +
    `<td>${esc(p.id)}</td><td class="num">${p.sample}</td><td class="num">${fmt(p.speedup0, 2)}x</td><td class="num">${fmt(p.speedup1, 2)}x</td>` +
    `<td class="num" data-key="dspeedup">${fmt(p.dspeedup, 2)}</td><td class="num">${fmt(p.correct0, 0)}</td><td class="num">${fmt(p.correct1, 0)}</td>` +
    `<td class="num" data-key="dcorrect">${fmt(p.dcorrect, 0)}</td></tr>`).join("");
}

function setUpPairs() {
  if (DATA.files.length !== 2) return;
  // A click sorts by the column, highest first; again, lowest first. A difference goes round three orders: by
  // size (biggest change first), then by sign (B − A highest first, then lowest first).
  document.querySelectorAll("#pairs th").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.key;
    if (key !== pairState.key) Object.assign(pairState, { key, descending: true, size: DIFFERENCES.has(key) });
    else if (pairState.size) Object.assign(pairState, { descending: true, size: false });
    else if (pairState.descending) pairState.descending = false;
    else Object.assign(pairState, { descending: true, size: DIFFERENCES.has(key) });
    renderPairs();
  }));
  document.querySelector("#pairs tbody").addEventListener("click", (event) => {
    const tr = event.target.closest("tr");
    if (tr) openRows([Number(tr.dataset.index), Number(tr.dataset.other)]);
  });
  renderPairs();
}

$("title").textContent = DATA.title || "threadweaver";
$("intro").textContent = DATA.intro || (DATA.rows.length ? "Click a row to read it." : "");
renderGroups();
setUpTable();
setUpPairs();
document.body.dataset.ready = "true";
