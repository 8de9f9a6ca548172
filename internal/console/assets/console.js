// Retina's console: polls /api/status every second and renders it. No
// libraries, nothing fetched from elsewhere.
"use strict";

const state = { points: [], last: 0, sortKey: "name", sortDir: 1, status: null };

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === undefined || n === null) ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: 2 });
const secs = (s) => {
  if (s === undefined || s === null) return "–";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
};
const bytes = (b) => {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
};
const text = (id, v) => { const el = $(id); if (el && el.textContent !== String(v)) el.textContent = v; };
const cell = (tr, v, cls) => { const td = tr.insertCell(); td.textContent = v; if (cls) td.className = cls; return td; };

function render(st) {
  state.status = st;
  const h = $("health");
  h.textContent = st.health === "ok" ? "healthy" : "ingestion stopped";
  h.className = "badge " + (st.health === "ok" ? "ok" : "bad");
  h.title = st.health;
  text("version", st.version);
  text("uptime", secs(st.uptime_seconds));
  text("rows-per-sec", fmt(Math.round(st.rates.rows_per_sec)));
  text("txn-per-sec", fmt(Math.round(st.rates.transactions_per_sec)));
  text("fresh-p50", fmt(st.freshness.p50_ms));
  text("fresh-p99", fmt(st.freshness.p99_ms));
  text("hwm", st.watermarks.hwm);
  text("hwm-lag", st.watermarks.hwm_lag);

  const sb = $("sources").tBodies[0];
  sb.replaceChildren();
  for (const s of st.sources) {
    const tr = sb.insertRow();
    tr.dataset.source = s.name;
    cell(tr, s.name);
    const stc = cell(tr, s.state + (s.reason ? ": " + s.reason : ""), "state-" + s.state);
    stc.dataset.state = s.state;
    cell(tr, s.position, "stmt");
    cell(tr, secs(s.lag_seconds), "num");
    cell(tr, bytes(s.lag_bytes), "num");
    cell(tr, fmt(s.lag_events), "num");
    cell(tr, fmt(s.events_per_sec), "num");
  }
  text("dead-count", st.dead_letters.count);
  text("dead-file", st.dead_letters.file ? "(" + st.dead_letters.file + ")" : "");
  const dl = $("dead-last");
  dl.hidden = !st.dead_letters.last;
  if (st.dead_letters.last) text("dead-last", st.dead_letters.last);

  renderTables(st.tables);
  text("tables-at", st.tables_at && !st.tables_at.startsWith("0001") ? "measured " + new Date(st.tables_at).toLocaleTimeString() : "");

  const w = st.watermarks;
  text("lwm", w.lwm);
  text("lwm-age", secs(w.lwm_age_seconds));
  text("lwm-holder", w.oldest_reader ? "pid " + w.oldest_reader.pid + " (" + w.oldest_reader.user + "): " + w.oldest_reader.query : "no client reader");
  const c = st.checkpoint;
  text("ckpt", c.count ? "at " + c.ts + " (" + c.count + " taken, " + c.errors + " failed)" : "none yet");
  text("ckpt-age", c.count ? secs(c.age_seconds) : "–");
  text("ckpt-took", c.count ? secs(c.duration_seconds) : "–");
  const r = st.recovery;
  text("recovery", (r.checkpoint_ts ? "restored checkpoint " + r.checkpoint_ts + (r.clean ? " (clean stop)" : " (after a crash)") : "new data directory") +
    " in " + secs(r.seconds) + ", " + r.files_dropped + " files dropped; " +
    (r.redoing ? "redoing (" + r.redone_transactions + " transactions so far)" : r.redone_transactions ? "redid " + r.redone_transactions + " transactions in " + secs(r.redo_seconds) : "nothing to redo"));
  const g = st.storage_gc;
  text("gc", g.rewrites + " rewrites of " + g.files_rewritten + " files, " + g.files_dropped + " dropped, " + g.errors + " errors");
  text("iceberg", st.iceberg ? st.iceberg.publications + " publications, snapshot at " + st.iceberg.snapshot_ts + ", lag " + secs(st.iceberg.lag_seconds) + ", " + st.iceberg.failures + " failures" : "off");

  const qb = $("query-list").tBodies[0];
  qb.replaceChildren();
  for (const q of st.queries) {
    const tr = qb.insertRow();
    cell(tr, q.pid); cell(tr, q.user); cell(tr, q.client); cell(tr, q.state);
    cell(tr, secs(q.duration_seconds), "num"); cell(tr, secs(q.snapshot_age_seconds), "num");
    cell(tr, q.query, "stmt").title = q.query;
    const td = tr.insertCell();
    if (st.authenticated && q.state === "active") {
      const b = document.createElement("button");
      b.textContent = "Cancel";
      b.onclick = () => fetch("/api/queries/" + q.pid + "/cancel", { method: "POST" });
      td.appendChild(b);
    }
  }

  const o = st.oltp;
  $("oltp").hidden = !o;
  $("oltp-link").hidden = !o;
  if (o) {
    text("oltp-cps", fmt(o.commits_per_sec)); text("oltp-commits", fmt(o.commits)); text("oltp-aborts", fmt(o.aborts));
    text("oltp-tables", o.memory_tables + " / " + o.storage_tables); text("oltp-lag", fmt(o.stream_lag_commits));
    text("oltp-memory", fmt(o.memory_records) + " records"); text("oltp-storage", bytes(o.storage_bytes) + " on disk");
  }

  for (const p of st.history.points) state.points.push(p);
  const cutoff = (state.points.length ? state.points[state.points.length - 1].t : 0) - 15 * 60;
  while (state.points.length && state.points[0].t <= cutoff) state.points.shift();
  if (state.points.length) state.last = state.points[state.points.length - 1].t;
  chart("chart-rows", [["rows", (p) => p.rows_per_sec]]);
  chart("chart-fresh", [["p50", (p) => p.fresh_p50_ms], ["p99", (p) => p.fresh_p99_ms]]);
  chart("chart-lag", [["lag", (p) => p.hwm_lag]]);
}

function renderTables(tables) {
  const key = state.sortKey, dir = state.sortDir;
  const rows = tables.slice().sort((a, b) => {
    const x = a[key] ?? "", y = b[key] ?? "";
    return (x < y ? -1 : x > y ? 1 : 0) * dir;
  });
  const tb = $("table-list").tBodies[0];
  tb.replaceChildren();
  for (const t of rows) {
    const tr = tb.insertRow();
    tr.dataset.table = t.name;
    cell(tr, t.name);
    cell(tr, fmt(t.live_rows), "num"); cell(tr, fmt(t.versions), "num");
    cell(tr, (t.stale_share * 100).toFixed(1) + " %", "num");
    cell(tr, t.regular_files, "num"); cell(tr, t.virtual_files, "num");
    cell(tr, bytes(t.lake_bytes), "num"); cell(tr, bytes(t.visibility_bytes), "num");
    cell(tr, t.last_gc_rewrite ? new Date(t.last_gc_rewrite).toLocaleTimeString() : "–");
  }
}

function chart(id, series) {
  const svg = $(id), pts = state.points;
  const W = 600, H = 160, pad = 14;
  let max = 0;
  for (const p of pts) for (const [, f] of series) max = Math.max(max, f(p) || 0);
  max = max > 0 ? max * 1.1 : 1;
  // The last 15 minutes, or since the first point, at least a minute.
  const t1 = pts.length ? pts[pts.length - 1].t : 0;
  const t0 = Math.min(t1 - 60, Math.max(t1 - 15 * 60, pts.length ? pts[0].t : t1));
  const x = (t) => ((t - t0) / (t1 - t0 || 1)) * W;
  const y = (v) => H - pad - (v / max) * (H - 2 * pad);
  const parts = [];
  for (const [cls, f] of series) {
    const coords = pts.map((p) => x(p.t).toFixed(1) + "," + y(f(p) || 0).toFixed(1)).join(" ");
    parts.push('<polyline class="' + cls + '" points="' + coords + '"/>');
  }
  parts.push('<text x="4" y="11">' + fmt(max / 1.1) + "</text>");
  svg.innerHTML = parts.join("");
  svg.dataset.points = pts.length;
  svg.dataset.last = t1;
}

for (const th of document.querySelectorAll(".sortable th")) {
  th.onclick = () => {
    const k = th.dataset.key;
    state.sortDir = state.sortKey === k ? -state.sortDir : 1;
    state.sortKey = k;
    for (const o of th.parentNode.children) o.className = "";
    th.className = state.sortDir > 0 ? "asc" : "desc";
    if (state.status) renderTables(state.status.tables);
  };
}

async function poll() {
  try {
    const r = await fetch("/api/status?since=" + state.last, { cache: "no-store" });
    if (r.ok) render(await r.json());
  } catch (e) {
    const h = $("health");
    h.textContent = "unreachable";
    h.className = "badge bad";
  }
  setTimeout(poll, 1000);
}
poll();
