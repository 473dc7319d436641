// The live run page: polls the orchestrator's status port (/api/records?since=N for new records,
// /api/status for the header, workers and ledger, /api/samples for the newest samples' table) and
// redraws the charts of charts.js. window.arlo exposes what the page shows, for tests: {charts: {id:
// data}, drawn: {id: points uPlot holds}, records (how many taken), state ("connecting", "running",
// "finished", "disconnected"), status, samples (the rows of the samples table)}.
"use strict";

(() => {
  const {Dataset, Chart, SyncChart, SPECS, syncTimeline, fmt} = ArloCharts;
  const RECORDS_EVERY_MS = 1000;
  const STATUS_EVERY_MS = 2000;
  const RETRY_MS = 3000;
  const ENDING_EVERY_MS = 200;  // records and status, in the last 10 steps
  const SYNC_VERSIONS = 40;  // versions shown per worker in the weight-sync charts

  const $ = (id) => document.getElementById(id);
  const ds = new Dataset();
  const charts = {};
  const syncCharts = new Map();  // worker URL -> SyncChart
  const page = {charts: {}, drawn: {}, records: 0, state: "connecting", status: null, samples: [], polls: 0};
  window.arlo = page;
  let next = 0;
  let status = null;
  let lastStatusAt = 0;

  function card(parent, title, subtitle) {
    const c = document.createElement("div");
    c.className = "card";
    const h = document.createElement("h3");
    h.textContent = title;
    const s = document.createElement("div");
    s.className = "sub";
    s.textContent = subtitle;
    const plot = document.createElement("div");
    plot.className = "plot";
    c.append(h, s, plot);
    parent.appendChild(c);
    return plot;
  }

  for (const spec of SPECS) charts[spec.id] = new Chart(card($("charts"), spec.title, spec.subtitle), spec);

  const TILES = [
    {id: "reward", label: "train reward (last RL step)", get: () => lastOf("train/reward/mean")},
    {id: "eval", label: "eval pass@1 (latest)", get: () => lastEval()},
    {id: "tokens", label: "throughput", unit: "tokens/s", get: () => lastOf("throughput/tokens_per_s")},
    {id: "loss", label: "trainer loss", get: () => lastOf("trainer/loss")},
    {id: "kl", label: "mismatch KL", get: () => lastOf("trainer/mismatch_kl")},
    {id: "offpolicy", label: "off-policy (mean, last step)", unit: "versions", get: () => lastOf("off_policy/mean")},
    {id: "sync", label: "weight sync (last)", unit: "ms", get: () => { const s = ds.syncs[ds.syncs.length - 1]; return s && s.seconds !== null ? s.seconds * 1000 : null; }},
  ];
  for (const t of TILES) {
    const el = document.createElement("div");
    el.className = "tile";
    el.innerHTML = `<div class="label"></div><div><span class="value" id="tile-${t.id}">-</span><span class="unit"></span></div>`;
    el.querySelector(".label").textContent = t.label;
    el.querySelector(".unit").textContent = t.unit || "";
    $("tiles").appendChild(el);
  }

  function lastOf(key) {
    const col = ds.steps.column(key);
    for (let i = col.length - 1; i >= 0; i--) if (col[i] !== null) return col[i];
    return null;
  }
  function lastEval() {
    const key = ds.evals.labels().find((k) => /\/pass@1$/.test(k));
    if (!key) return null;
    const col = ds.evals.column(key);
    return col.length ? col[col.length - 1] : null;
  }

  function setState(state, detail) {
    page.state = state;
    const b = $("state");
    b.className = `badge ${state}`;
    b.textContent = state;
    $("state-detail").textContent = detail || "";
  }

  function duration(s) {
    if (!Number.isFinite(s) || s < 0) return "-";
    const m = Math.floor(s / 60), sec = Math.floor(s % 60);
    return m > 0 ? `${m} min ${String(sec).padStart(2, "0")} s` : `${sec} s`;
  }

  function renderHeader() {
    const st = status || {};
    const step = Math.max(st.step || 0, ds.lastStep);
    const max = st.max_steps || 0;
    $("run-name").textContent = st.run || "run";
    document.title = `arlo: ${st.run || "run"} step ${step}${max ? "/" + max : ""}`;
    $("step").textContent = step;
    $("max-steps").textContent = max || "?";
    const synced = ds.syncs.reduce((v, x) => Math.max(v, x.version ?? 0), 0);
    $("version").textContent = Math.max(st.version ?? 0, synced);
    const warm = st.sft_warmup_steps || 0;
    $("phase").textContent = max ? (step < warm ? `supervised warm-up (${warm} steps)` : `RL (after ${warm} warm-up steps)`) : "";
    $("progress-bar").style.width = max ? `${Math.min(100, 100 * step / max)}%` : "0";
    $("progress-warmup").style.width = max ? `${Math.min(100, 100 * warm / max)}%` : "0";
    const end = page.state === "running" || page.state === "connecting" ? Date.now() / 1000 : lastTime();
    if (st.started_at) $("elapsed").textContent = duration(end - st.started_at);
  }
  function lastTime() {
    const col = ds.steps.column("time");
    return col.length ? col[col.length - 1] : Date.now() / 1000;
  }

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
  }

  function renderWorkers() {
    const body = $("workers").querySelector("tbody");
    body.replaceChildren();
    const workers = (status && status.workers) || [];
    workers.forEach((w, i) => {
      const tr = document.createElement("tr");
      cell(tr, `worker ${i}  ${w.worker}`);
      cell(tr, w.version ?? "-", "num");
      cell(tr, w.healthy ? "healthy" : "unhealthy", w.healthy ? "ok" : "bad");
      cell(tr, w.syncs ?? "-", "num");
      cell(tr, w.failures ?? "-", "num");
      cell(tr, w.last_error || "");
      body.appendChild(tr);
    });
    if (!workers.length) {
      const tr = document.createElement("tr");
      cell(tr, "no workers reported yet");
      body.appendChild(tr);
    }
  }

  function renderLedger() {
    const body = $("ledger").querySelector("tbody");
    body.replaceChildren();
    const l = (status && status.ledger) || {};
    const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
    const detail = (m) => Object.entries(m || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    const rows = [
      ["dispatched", l.dispatched, ""], ["completed", l.completed, ""], ["in flight", l.in_flight, ""],
      ["failed", sum(l.failed), detail(l.failed)], ["cancelled", sum(l.cancelled), detail(l.cancelled)],
      ["dispositions", sum(l.dispositions), detail(l.dispositions)],
    ];
    for (const [name, n, d] of rows) {
      const tr = document.createElement("tr");
      cell(tr, name);
      cell(tr, n ?? "-", "num");
      cell(tr, d);
      body.appendChild(tr);
    }
  }

  // The newest samples: a multi-turn trajectory's cell lists its turns, "role: text" each.
  function renderSamples() {
    const body = $("samples").querySelector("tbody");
    body.replaceChildren();
    for (const r of page.samples) {
      const tr = document.createElement("tr");
      cell(tr, r.step ?? "-", "num");
      cell(tr, r.version ?? "-", "num");
      cell(tr, String(r.worker || "").replace(/^https?:\/\//, ""));
      cell(tr, r.prompt || "", "text");
      const out = document.createElement("td");
      out.className = "text";
      if (Array.isArray(r.turns) && r.turns.length) {
        r.turns.forEach((t, i) => {
          const role = document.createElement("span");
          role.className = "role";
          role.textContent = `${i ? "\n" : ""}${t.role}: `;
          out.append(role, document.createTextNode(t.content));
        });
      } else {
        out.textContent = r.completion || "";
      }
      tr.appendChild(out);
      cell(tr, typeof r.reward === "number" ? fmt(r.reward) : "-", "num");
      body.appendChild(tr);
    }
    if (!page.samples.length) {
      const tr = document.createElement("tr");
      cell(tr, "no scored samples yet");
      body.appendChild(tr);
    }
  }

  function renderCharts() {
    for (const spec of SPECS) {
      charts[spec.id].set(spec.build(ds));
      page.charts[spec.id] = charts[spec.id].data;
      page.drawn[spec.id] = charts[spec.id].points();
    }
    const workers = ds.workers();
    workers.forEach((w, i) => {
      if (!syncCharts.has(w)) {
        $("sync-empty").style.display = "none";
        const spec = {id: `sync-${i}`, kind: "bars", title: `worker ${i}`, x: "version", y: "ms"};
        const plot = card($("sync-charts"), `Weight sync timeline: worker ${i}  (${w})`,
                          `pause, transfer and resume of the last ${SYNC_VERSIONS} versions, stacked`);
        syncCharts.set(w, new SyncChart(plot, spec));
      }
      const c = syncCharts.get(w);
      c.set(syncTimeline(ds, w, SYNC_VERSIONS));
      page.charts[`sync-${i}`] = c.data;
      page.drawn[`sync-${i}`] = c.points();
    });
  }

  function render() {
    renderHeader();
    renderCharts();
    for (const t of TILES) $(`tile-${t.id}`).textContent = fmt(t.get());
    renderWorkers();
    renderLedger();
    renderSamples();
    page.records = ds.count;
  }

  async function getJson(path) {
    const r = await fetch(path, {cache: "no-store"});
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  // Takes every record the server has past `next` (several requests when it returns them in pages).
  async function pollRecords() {
    for (let i = 0; i < 50; i++) {
      const j = await getJson(`/api/records?since=${next}`);
      const records = Array.isArray(j.records) ? j.records : [];
      for (const r of records) ds.add(r);
      if (typeof j.next === "number") next = j.next;
      if (!records.length) return;
    }
  }

  async function pollStatus() {
    status = await getJson("/api/status");
    page.status = status;
    lastStatusAt = Date.now();
    const j = await getJson("/api/samples");
    if (Array.isArray(j.samples)) page.samples = j.samples;
  }

  function finished(detail) {
    setState("finished", detail);
    render();
  }

  async function tick() {
    page.polls += 1;
    try {
      await pollRecords();
      const ending = status && status.max_steps && ds.lastStep >= status.max_steps - 10;
      if (!status || ending || Date.now() - lastStatusAt >= STATUS_EVERY_MS) await pollStatus();
      if (status.finished) {
        await pollRecords();  // the records written before the run finished
        finished("the run is over");
        return;
      }
      setState("running");
      render();
      // Near the last step, poll faster: the port closes soon after the run's final records.
      const max = status.max_steps || 0;
      const last = max > 0 && Math.max(status.step || 0, ds.lastStep) >= max - 10;
      setTimeout(tick, last ? ENDING_EVERY_MS : RECORDS_EVERY_MS);
    } catch (e) {
      // The status port closes when the run ends: a run that reached its last step has finished.
      const max = status && status.max_steps;
      if (max && ds.lastStep >= max) {
        finished("the run has exited");
        return;
      }
      setState("disconnected", `${e.message}; retrying every ${RETRY_MS / 1000} s`);
      render();
      setTimeout(tick, RETRY_MS);
    }
  }

  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.resize();
    for (const c of syncCharts.values()) c.resize();
  });
  render();
  tick();
})();
