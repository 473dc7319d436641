// `arlo report`: the charts of charts.js for one or more finished runs, overlaid (one color per run).
// The runs come inlined as JSON: {generated, runs: [{name, dir, summary, records}]}.
// window.arlo exposes what the page shows, for tests: {charts: {id: data}, drawn: {id: points uPlot
// holds}, runs}.
"use strict";

(() => {
  const {Dataset, Chart, SPECS, PALETTE, DASHES, fmt} = ArloCharts;
  const input = JSON.parse(document.getElementById("arlo-data").textContent);
  const runs = input.runs.map((run) => {
    const ds = new Dataset();
    for (const r of run.records) ds.add(r);
    return {...run, ds};
  });
  const page = {charts: {}, drawn: {}, runs: runs.length};
  window.arlo = page;
  document.getElementById("run-count").textContent = `${runs.length} run${runs.length === 1 ? "" : "s"}`;
  document.getElementById("generated").textContent = `generated ${input.generated}`;

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
  }
  const body = document.querySelector("#runs tbody");
  runs.forEach((run, i) => {
    const s = run.summary || {};
    const tr = document.createElement("tr");
    const name = document.createElement("td");
    name.innerHTML = `<span style="display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px"></span>`;
    name.firstChild.style.background = PALETTE[i % PALETTE.length];
    name.append(run.name);
    name.title = run.dir;
    tr.appendChild(name);
    cell(tr, s.steps ?? run.ds.lastStep, "num");
    cell(tr, s.seconds !== undefined ? `${fmt(s.seconds)} s` : "-", "num");
    cell(tr, `${fmt(s["train/reward/first5"])} \u2192 ${fmt(s["train/reward/last5"])}`);
    const first = s.eval_first || {}, last = s.eval_last || {};
    cell(tr, Object.keys(last).filter((k) => k.startsWith("eval/")).map((k) =>
      `${k.replace(/^eval\//, "")}: v${first.step ?? "?"} ${fmt(first[k])} \u2192 v${last.step ?? "?"} ${fmt(last[k])}`).join("; ") || "-");
    const l = s.ledger || {};
    const failed = Object.values(l.failed || {}).reduce((a, b) => a + b, 0);
    cell(tr, `${l.completed ?? "-"} / ${failed}`, "num");
    cell(tr, s.ok === false ? `failed: ${s.error}` : s.ok ? "ok" : "no summary", s.ok === false ? "bad" : s.ok ? "ok" : "");
    body.appendChild(tr);
  });

  // Overlays one spec's data of every run: x joined, each run's series in its color, dashed by series.
  function overlay(spec) {
    const tables = [], series = [];
    runs.forEach((run, r) => {
      const d = spec.build(run.ds);
      if (spec.overlay) d.series = d.series.filter((s) => spec.overlay.includes(s.label));
      if (!d.x.length || !d.series.length) return;
      let x = d.x;
      if (spec.kind === "bars" && runs.length > 1) x = x.map((v) => v + (r - (runs.length - 1) / 2) * (0.8 / runs.length));
      tables.push([x, ...d.series.map((s) => s.values)]);
      let solid = 0;  // the run's first series that is not faint is solid, the next dashed, ...
      d.series.forEach((s) => series.push({
        label: d.series.length === 1 && spec.kind !== "bars" ? run.name : `${run.name}: ${s.label}`,
        scale: s.scale, width: s.width, color: PALETTE[r % PALETTE.length] + (s.faint ? "60" : ""),
        dash: s.faint ? [] : DASHES[solid++ % DASHES.length]}));
    });
    if (!tables.length) return {x: [], series: []};
    const joined = uPlot.join(tables);
    const clean = (a) => Array.from(a, (v) => (v === undefined ? null : v));
    return {x: clean(joined[0]), series: series.map((s, i) => ({...s, values: clean(joined[i + 1])}))};
  }

  for (const spec of SPECS) {
    const c = document.createElement("div");
    c.className = "card";
    c.innerHTML = "<h3></h3><div class=\"sub\"></div><div class=\"plot\"></div>";
    c.querySelector("h3").textContent = spec.title;
    c.querySelector(".sub").textContent = spec.subtitle;
    document.getElementById("charts").appendChild(c);
    const chart = new Chart(c.querySelector(".plot"), spec, {emptyText: "no data in these runs", zoom: true});
    chart.set(overlay(spec));
    page.charts[spec.id] = chart.data;
    page.drawn[spec.id] = chart.points();
    window.addEventListener("resize", () => chart.resize());
  }
})();
