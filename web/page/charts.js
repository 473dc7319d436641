// The charts of a run, shared by the live run page (live.js) and `arlo report` (report.js).
//
// A Dataset takes the run's records (the objects of metrics.jsonl, or of /api/records: each has
// "kind", "step" and "time"; docs/architecture.md names the keys) one at a time and keeps what the
// charts need. Each entry of SPECS turns a Dataset into the data of one chart: {x, series: [{label,
// values, scale}]}, x sorted ascending and every series as long as x (null where a value is missing).
// A Chart draws such data with uPlot and keeps the last data it was given (tests read it). The data
// of a chart never shares an array with the Dataset: the Dataset grows in place as records arrive, and
// a chart's data (and what uPlot holds) must stay what was drawn until the next set().
"use strict";

const ArloCharts = (() => {
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#7f7f7f", "#bcbd22"];
  const DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];
  const SYNC_PARTS = [  // the three calls of a weight sync, in the order a worker makes them
    {key: "pause_s", label: "pause", color: "#f2a541"},
    {key: "update_s", label: "transfer", color: "#3a7bd5"},
    {key: "resume_s", label: "resume", color: "#4caf50"},
  ];

  // Records written before "kind" existed are told apart by their keys.
  function kindOf(r) {
    if (typeof r.kind === "string") return r.kind;
    return Object.keys(r).some((k) => k.startsWith("eval/")) ? "eval" : "step";
  }

  function num(v) { return typeof v === "number" && Number.isFinite(v) ? v : null; }

  // Rows keyed by x, columns created on first sight (earlier rows read null).
  class Table {
    constructor() { this.x = []; this.cols = new Map(); }
    add(x, values) {
      const row = this.x.length;
      this.x.push(x);
      for (const [label, v] of Object.entries(values)) {
        if (!this.cols.has(label)) this.cols.set(label, new Array(row).fill(null));
      }
      for (const [label, col] of this.cols) col.push(label in values ? values[label] : null);
    }
    column(label) { return this.cols.get(label) || new Array(this.x.length).fill(null); }
    labels() { return [...this.cols.keys()]; }
  }

  class Dataset {
    constructor() {
      this.count = 0;          // records taken
      this.steps = new Table();  // one row per "step" record: every numeric key
      this.evals = new Table();  // one row per "eval" record
      this.syncs = [];         // "weight_sync" records: {version, seconds, workers: [...]}
      this.histogram = [];     // off_policy/histogram summed over the steps: samples by distance
      this.firstTime = null;
      this.lastStep = 0;
    }
    add(r) {
      this.count += 1;
      if (typeof r !== "object" || r === null) return;
      const t = num(r.time);
      if (t !== null && (this.firstTime === null || t < this.firstTime)) this.firstTime = t;
      const kind = kindOf(r);
      const step = num(r.step);
      if (kind === "step" && step !== null) {
        this.lastStep = Math.max(this.lastStep, step);
        const values = {};
        for (const [k, v] of Object.entries(r)) if (num(v) !== null && k !== "step") values[k] = v;
        if (r["train/supervised"] === true) values["train/supervised"] = 1;
        this.steps.add(step, values);
        const h = r["off_policy/histogram"];
        if (Array.isArray(h)) {
          h.forEach((n, d) => {
            while (this.histogram.length <= d) this.histogram.push(0);
            this.histogram[d] += num(n) || 0;
          });
        }
      } else if (kind === "eval" && step !== null) {
        const values = {};
        for (const [k, v] of Object.entries(r)) if (k.startsWith("eval/") && num(v) !== null) values[k] = v;
        this.evals.add(step, values);
      } else if (kind === "weight_sync") {
        this.syncs.push({version: num(r.version) ?? step, seconds: num(r["weight_sync/seconds"]),
                         workers: Array.isArray(r.workers) ? r.workers : []});
      }
    }
    // The worker URLs of the weight syncs, in order of first appearance.
    workers() {
      const seen = [];
      for (const s of this.syncs) for (const w of s.workers) if (w && !seen.includes(w.worker)) seen.push(w.worker);
      return seen;
    }
  }

  // Series of the step table whose key matches `re`; label from the first capture group (or `name`).
  // With rlOnly, supervised warm-up steps read null.
  function stepSeries(ds, picks, rlOnly = false) {
    const series = [];
    const supervised = ds.steps.column("train/supervised");
    for (const {re, name, scale, dash, color, width, faint} of picks) {
      for (const key of ds.steps.labels()) {
        const m = key.match(re);
        if (!m) continue;
        const values = ds.steps.column(key).map((v, i) => (rlOnly && supervised[i] === 1 ? null : v));
        if (values.every((v) => v === null)) continue;
        series.push({label: name || m[1], values, scale: scale || "y", dash, color, width, faint});
      }
    }
    return {x: ds.steps.x.slice(), series};
  }

  // Drops the rows where every series is null (supervised steps on a reward chart).
  function compact(data) {
    const keep = data.x.map((_, i) => data.series.some((s) => s.values[i] !== null));
    if (keep.every(Boolean)) return data;
    return {x: data.x.filter((_, i) => keep[i]),
            series: data.series.map((s) => ({...s, values: s.values.filter((_, i) => keep[i])}))};
  }

  // The mean of each value and the up to n-1 non-null values before it (null where `values` is).
  function rolling(values, n) {
    const window = [];
    let sum = 0;
    return values.map((v) => {
      if (v === null) return null;
      window.push(v);
      sum += v;
      if (window.length > n) sum -= window.shift();
      return sum / window.length;
    });
  }

  function ms(v) { return v === null || v === undefined ? null : v * 1000; }

  // One chart per entry. kind: "line" (the default) or "bars"; overlay: the series `arlo report` draws
  // for each run (all when unset). A series may set color, width, dash, and faint (drawn see-through
  // in the report, where a run's series share its color).
  const SPECS = [
    {id: "reward", title: "Train reward", subtitle: "mean reward of each RL step's batch, its 20-step average, and each reward module's mean where it differs",
     x: "trainer step", y: "mean reward",
     build: (ds) => {
       const d = compact(stepSeries(ds, [
         {re: /^train\/reward\/mean$/, name: "train mean", color: "#8fb9dd", width: 1, faint: true},
         {re: /^train\/reward\/(?!mean$|std$)([^/]+)\/mean$/, dash: [6, 4], width: 1},
       ]));
       const mean = d.series.find((s) => s.label === "train mean");
       if (!mean) return d;
       // A module whose mean is the overall mean (one module of weight 1) would only hide it.
       d.series = d.series.filter((s) => s === mean || s.values.some((v, i) => v !== mean.values[i]));
       d.series.forEach((s, i) => { if (s !== mean && !s.color) s.color = PALETTE[(i + 2) % PALETTE.length]; });
       d.series.push({label: "20-step average", color: "#1f4e79", width: 2.5, scale: "y", values: rolling(mean.values, 20)});
       return d;
     }},
    {id: "eval", title: "Eval", subtitle: "pass@k and avg@n on the eval set at each evaluated version",
     x: "version (trainer step)", y: "fraction correct", range: [0, 1],
     build: (ds) => {
       const keys = ds.evals.labels().filter((key) => /^eval\/[^/]+\/(pass|avg)@\d+$/.test(key))
         .sort((a, b) => (a.includes("/avg@") - b.includes("/avg@")) || a.localeCompare(b));
       const series = [];
       for (const key of keys) {
         const label = key.replace(/^eval\//, "").replace("/", " ");
         const values = ds.evals.column(key).slice();
         // avg@1 and pass@1 are one figure: one line, both names.
         const same = series.find((s) => s.values.every((v, i) => v === values[i]));
         if (same) same.label += ` = ${label.split(" ").pop()}`;
         else series.push({label, values, scale: "y"});
       }
       return {x: ds.evals.x.slice(), series};
     }},
    {id: "loss", title: "Trainer loss", subtitle: "latest figures the trainer reported at each step",
     x: "trainer step", y: "loss", overlay: ["loss"],
     build: (ds) => compact(stepSeries(ds, [
       {re: /^trainer\/pg_loss$/, name: "policy-gradient loss", color: PALETTE[3], width: 1, dash: [5, 3]},
       {re: /^trainer\/ce_loss$/, name: "cross-entropy loss", color: PALETTE[2], width: 1, dash: [2, 3]},
       {re: /^trainer\/loss$/, name: "loss", color: PALETTE[0], width: 2},
     ]))},
    {id: "kl", title: "Mismatch KL and grad norm", subtitle: "RL steps: KL(inference || trainer) of the sampled tokens; gradient L2 norm before clipping",
     x: "trainer step", y: "mismatch KL (nats)", y2: "grad norm",
     build: (ds) => compact(stepSeries(ds, [
       {re: /^trainer\/grad_norm$/, name: "grad norm", scale: "y2", color: "#e8a0a0", width: 1},
       {re: /^trainer\/mismatch_kl$/, name: "mismatch KL", color: PALETTE[0], width: 2},
     ], true))},
    {id: "throughput", title: "Throughput", subtitle: "tokens generated per second of wall time",
     x: "trainer step", y: "tokens / s",
     build: (ds) => compact(stepSeries(ds, [{re: /^throughput\/tokens_per_s$/, name: "tokens/s"}]))},
    {id: "staleness", kind: "bars", title: "Staleness", subtitle: "share of trained samples by how many versions behind the trainer they were generated",
     x: "off-policy distance (versions)", y: "% of samples", range: [0, 100],
     build: (ds) => {
       const total = ds.histogram.reduce((a, b) => a + b, 0);
       return {x: ds.histogram.map((_, d) => d),
               series: total > 0 ? [{label: "samples", values: ds.histogram.map((n) => 100 * n / total), scale: "y"}] : []};
     }},
    {id: "sync", title: "Weight sync", subtitle: "milliseconds from the trainer's announcement to every worker serving the version",
     x: "version", y: "ms", overlay: ["all workers"],
     build: (ds) => {
       const workers = ds.workers();
       const series = workers.map((w, i) => ({label: `worker ${i}`, scale: "y", width: 1, color: PALETTE[(i + 1) % PALETTE.length],
                                              values: ds.syncs.map((s) => {
         const e = s.workers.find((x) => x.worker === w);
         return e ? ms((e.pause_s || 0) + (e.update_s || 0) + (e.resume_s || 0)) : null;
       })}));
       series.push({label: "all workers", values: ds.syncs.map((s) => ms(s.seconds)), scale: "y", width: 2, color: PALETTE[0]});
       return sortByX({x: ds.syncs.map((s) => s.version), series: ds.syncs.length ? series : []});
     }},
  ];

  function sortByX(data) {
    const order = data.x.map((_, i) => i).sort((a, b) => data.x[a] - data.x[b]);
    return {x: order.map((i) => data.x[i]), series: data.series.map((s) => ({...s, values: order.map((i) => s.values[i])}))};
  }

  // The pause / transfer / resume milliseconds of one worker for its last `last` versions.
  function syncTimeline(ds, worker, last) {
    const rows = ds.syncs.filter((s) => s.workers.some((w) => w.worker === worker)).slice(-last);
    const parts = SYNC_PARTS.map((p) => ({label: p.label, color: p.color, values: rows.map((s) => {
      const e = s.workers.find((w) => w.worker === worker);
      return ms(num(e[p.key]) ?? 0);
    })}));
    const failed = rows.map((s) => { const e = s.workers.find((w) => w.worker === worker); return e.ok === false; });
    return {x: rows.map((s) => s.version), parts, failed};
  }

  function fmt(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "-";
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 10000) return v.toFixed(0);
    if (a >= 100) return v.toFixed(1);
    if (a >= 1) return v.toFixed(3);
    if (a >= 0.001) return v.toFixed(4);
    return v.toExponential(2);
  }

  // One uPlot chart in `el`, recreated when its series change, resized with its card.
  class Chart {
    constructor(el, spec, opts = {}) {
      this.el = el; this.spec = spec; this.opts = opts; this.plot = null; this.key = "";
      this.data = {x: [], series: []};
      this.empty = document.createElement("div");
      this.empty.className = "empty";
      this.empty.textContent = opts.emptyText || "no data yet";
      el.appendChild(this.empty);
    }
    width() { return Math.max(320, Math.floor(this.el.clientWidth || 560)); }
    set(data) {
      this.data = data;
      const key = data.series.map((s) => `${s.label}|${s.scale}|${s.color || ""}|${s.width || ""}`).join(";");
      this.empty.style.display = data.x.length && data.series.length ? "none" : "";
      if (!data.x.length || !data.series.length) {
        if (this.plot) { this.plot.destroy(); this.plot = null; this.key = ""; }
        return;
      }
      const aligned = [data.x, ...data.series.map((s) => s.values)];
      if (this.plot && key === this.key) { this.plot.setData(aligned); return; }
      if (this.plot) this.plot.destroy();
      this.key = key;
      this.plot = new uPlot(this.options(data), aligned, this.el);
    }
    // How many x values the uPlot instance holds (0 before it draws).
    points() { return this.plot ? this.plot.data[0].length : 0; }
    resize() { if (this.plot) this.plot.setSize({width: this.width(), height: this.opts.height || 280}); }
    options(data) {
      const spec = this.spec;
      const bars = spec.kind === "bars";
      const series = [{label: spec.x, value: (u, v) => (v === null ? "-" : fmt(v))}];
      data.series.forEach((s, i) => {
        const color = s.color || PALETTE[i % PALETTE.length];
        series.push({
          label: s.label, scale: s.scale || "y", stroke: color, width: s.width || (bars ? 1 : 1.5), dash: s.dash || [],
          fill: bars ? color + "b0" : undefined, spanGaps: true,
          points: bars ? {show: false} : {size: 5},
          paths: bars ? uPlot.paths.bars({size: [0.7, 80]}) : undefined,
          value: (u, v) => (v === null ? "-" : fmt(v)),
        });
      });
      const axes = [
        {label: spec.x, stroke: "#333", grid: {stroke: "#eee"}, ticks: {stroke: "#ccc"},
         values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(v) : ""))},
        {label: spec.y, scale: "y", stroke: "#333", grid: {stroke: "#eee"}, ticks: {stroke: "#ccc"}, size: 64},
      ];
      if (spec.y2) axes.push({label: spec.y2, scale: "y2", side: 1, stroke: "#333", grid: {show: false}, size: 64});
      const scales = {x: {time: false}, y: spec.range ? {range: spec.range} : {}};
      if (bars) scales.x.range = (u, min, max) => [min - 0.6, max + 0.6];
      if (spec.y2) scales.y2 = {};
      return {width: this.width(), height: this.opts.height || 280, series, axes, scales,
              legend: {live: true}, cursor: {drag: {x: true, y: false, setScale: !!this.opts.zoom}}};
    }
  }

  // A stacked bar chart of one worker's weight syncs: pause, transfer and resume per version. Each
  // series holds its part's milliseconds (what the legend shows); its bars are drawn from the sum of
  // the parts before it to that sum plus its own.
  class SyncChart extends Chart {
    set(tl) {
      this.timeline = tl;
      this.bases = [];
      let acc = tl.x.map(() => 0);
      for (const p of tl.parts) { this.bases.push(acc); acc = acc.map((a, i) => a + (p.values[i] || 0)); }
      this.total = acc;
      super.set({x: tl.x, series: tl.parts.map((p) => ({label: p.label, color: p.color, values: p.values, scale: "y"}))});
    }
    options(data) {
      const o = super.options(data);
      o.series.forEach((s, i) => {
        if (i === 0) return;
        const part = i - 1;
        s.fill = data.series[part].color;
        s.stroke = data.series[part].color;
        s.points = {show: false};
        s.paths = uPlot.paths.bars({size: [0.8, 40], disp: {
          y0: {unit: 1, values: () => this.bases[part]},
          y1: {unit: 1, values: () => this.bases[part].map((b, k) => b + (this.timeline.parts[part].values[k] || 0))},
        }});
        s.value = (u, v) => (v === null || v === undefined ? "-" : fmt(v) + " ms");
      });
      o.scales.x.range = (u, min, max) => [min - 0.6, max + 0.6];
      o.scales.y = {range: () => [0, Math.max(1e-3, ...this.total) * 1.08]};
      return o;
    }
  }

  return {PALETTE, DASHES, SYNC_PARTS, SPECS, Dataset, Chart, SyncChart, syncTimeline, kindOf, fmt};
})();
