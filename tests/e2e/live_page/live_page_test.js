// The live run page end to end: a real, shortened `arlo run configs/quickstart.yaml` (two arlo-worker
// processes, arlo-trainer) with its status port on a port picked here, and Debian's chromium, headless,
// driven by playwright-core, on http://127.0.0.1:<port>/. Checks that the page loads without console
// errors, that its charts hold the run's data (compared with /api/records during the run and with
// metrics.jsonl after it: the same records), that they grow as steps arrive, that the page shows
// the finished state and the newest samples' table. Screenshots during and after the run go to
// $ARLO_SCREENSHOT_DIR when set.
//
// Usage: node live_page_test.js --arlo <arlo binary> --source <repo root>
//          [--steps 150] [--warmup 20] [--eval-interval 20] [--during-step S]
// (docs/images: ARLO_SCREENSHOT_DIR=docs/images ... --steps 1285 --warmup 285 --eval-interval 50 --during-step 700)
"use strict";

const assert = require("node:assert/strict");
const {spawn} = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
for (const need of ["arlo", "source"]) if (!args[need]) throw new Error(`missing --${need}`);
const {chromium} = require(path.join(args.source, "web/node_modules/playwright-core"));

const MAX_STEPS = Number(args.steps || 150);
const WARMUP = Number(args.warmup || 20);
const EVAL_INTERVAL = Number(args["eval-interval"] || 20);
const DURING_STEP = Number(args["during-step"] || 0);  // the "during" screenshot: at this step or later
const DEADLINE_S = 480;  // the whole run, on a loaded 2-core machine

function log(msg) { console.log(`[live-page ${new Date().toISOString().slice(11, 23)}] ${msg}`); }

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => { const {port} = s.address(); s.close(() => resolve(port)); });
  });
}

// Polls `probe` (async, truthy when done) every `every_ms` until it holds or `seconds` pass.
async function waitFor(what, seconds, probe, every_ms = 200) {
  const end = Date.now() + seconds * 1000;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${seconds} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every_ms));
  }
}

async function getJson(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

function readJsonl(file) {
  return fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

// The points of the page's chart series `label` as [x, y] pairs (nulls dropped).
function points(chart, label) {
  const s = chart.series.find((x) => x.label === label || x.label.startsWith(`${label} = `));
  assert.ok(s, `no series "${label}" in ${JSON.stringify(chart.series.map((x) => x.label))}`);
  return chart.x.map((x, i) => [x, s.values[i]]).filter(([, y]) => y !== null);
}

// What the charts must hold for `records` (the first records of the run, in order).
function expected(records) {
  const steps = records.filter((r) => r.kind === "step");
  const pick = (key, rows = steps) => rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
  const rl = steps.filter((r) => r["train/supervised"] !== true);
  const histogram = [];
  for (const r of steps) (r["off_policy/histogram"] || []).forEach((n, d) => { histogram[d] = (histogram[d] || 0) + n; });
  return {
    steps,
    reward: pick("train/reward/mean"),
    loss: pick("trainer/loss"),
    kl: pick("trainer/mismatch_kl", rl),  // the page shows KL on RL steps only
    evals: records.filter((r) => r.kind === "eval").map((r) => [r.step, r["eval/arithmetic/pass@1"]]),
    syncs: records.filter((r) => r.kind === "weight_sync").map((r) => r.version),
    histogram: Array.from(histogram, (n) => n || 0),
  };
}

function checkCharts(page, records, when) {
  const want = expected(records);
  const c = page.charts;
  assert.deepEqual(points(c.reward, "train mean"), want.reward, `${when}: reward chart vs the run's records`);
  assert.deepEqual(points(c.loss, "loss"), want.loss, `${when}: loss chart`);
  assert.deepEqual(points(c.kl, "mismatch KL"), want.kl, `${when}: mismatch KL chart`);
  if (want.evals.length) assert.deepEqual(points(c.eval, "arithmetic pass@1"), want.evals, `${when}: eval chart`);
  assert.deepEqual(c.sync.x, want.syncs, `${when}: weight-sync chart versions`);
  const total = want.histogram.reduce((a, b) => a + b, 0);
  assert.deepEqual(c.staleness.x, want.histogram.map((_, d) => d), `${when}: staleness bins`);
  c.staleness.series[0].values.forEach((v, d) =>
    assert.ok(Math.abs(v - 100 * want.histogram[d] / total) < 1e-9, `${when}: staleness bin ${d}: ${v} %`));
  for (const id of ["reward", "loss", "kl", "staleness", "sync"])
    assert.equal(page.drawn[id], c[id].x.length, `${when}: uPlot holds every point of chart ${id}`);
}

async function main() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "arlo_live_page_e2e_"));
  const shots = process.env.ARLO_SCREENSHOT_DIR || tmp;
  fs.mkdirSync(shots, {recursive: true});
  const port = await freePort();
  const runDir = path.join(tmp, "run");
  const base = `http://127.0.0.1:${port}`;

  const browser = await chromium.launch({executablePath: "/usr/bin/chromium", args: ["--no-sandbox"]});
  const page = await browser.newPage({viewport: {width: 1400, height: 900}});
  const consoleErrors = [];  // [message, the run had ended: summary.json written, the port about to close]
  let exited = null;
  const ended = () => exited !== null || fs.existsSync(path.join(runDir, "summary.json"));
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push([m.text(), ended()]); });
  page.on("pageerror", (e) => consoleErrors.push([`uncaught: ${e.message}`, false]));
  const elsewhere = [];  // requests to anywhere but the status port: the page must work offline
  page.on("request", (r) => { if (!r.url().startsWith(`${base}/`) && !r.url().startsWith("data:")) elsewhere.push(r.url()); });

  const runLog = path.join(tmp, "arlo-run.log");
  const out = fs.openSync(runLog, "w");
  const sets = [`run.max_steps=${MAX_STEPS}`, `orchestrator.sft_warmup_steps=${WARMUP}`, `eval.interval=${EVAL_INTERVAL}`,
                `status.port=${port}`, "status.bind=127.0.0.1", `run.dir=${runDir}`, "log.progress=false"];
  const child = spawn(args.arlo, ["run", path.join(args.source, "configs/quickstart.yaml"),
                                  ...sets.flatMap((s) => ["--set", s]), "--overwrite"],
                      {stdio: ["ignore", out, out], env: {...process.env, OMP_NUM_THREADS: "1"}});
  child.on("exit", (code, signal) => { exited = {code, signal}; });
  const tail = () => fs.readFileSync(runLog, "utf8").split("\n").slice(-40).join("\n");
  try {
    log(`arlo run on port ${port}, run dir ${runDir}`);
    await waitFor("the status port to serve the page", 240, async () => {
      if (exited) throw new Error(`arlo exited early (${JSON.stringify(exited)}):\n${tail()}`);
      try { return (await fetch(`${base}/`)).ok; } catch { return false; }
    });
    await page.goto(`${base}/`);
    log("page loaded");

    // Growth: the reward chart's point count, sampled until the run ends.
    const counts = [];
    let during = null;
    await waitFor("the run to end", DEADLINE_S, async () => {
      const s = await page.evaluate(() => ({state: window.arlo.state, n: window.arlo.charts.reward ? window.arlo.charts.reward.x.length : 0,
                                            syncs: window.arlo.charts.sync ? window.arlo.charts.sync.x.length : 0,
                                            step: window.arlo.status ? window.arlo.status.step : 0}));
      if (counts[counts.length - 1] !== s.n) counts.push(s.n);
      // "During": some RL steps and weight syncs drawn, the run still going: compare with /api/records now.
      if (!during && !exited && s.state === "running" && s.n >= 10 && s.syncs > 0 && s.step >= DURING_STEP) {
        const snapshot = await page.evaluate(() => JSON.parse(JSON.stringify(window.arlo)));
        let served;
        try { served = await getJson(`${base}/api/records?since=0`); } catch { return exited !== null; }
        assert.ok(served.next >= snapshot.records, `the server has ${served.next} records, the page ${snapshot.records}`);
        checkCharts(snapshot, served.records.slice(0, snapshot.records), "during the run");
        await page.screenshot({path: path.join(shots, "live-page-during.png"), fullPage: true});
        during = snapshot;
        log(`during: ${snapshot.records} records, ${s.n} reward points, screenshot taken`);
      }
      return exited !== null;
    }, 250);
    log(`arlo exited ${JSON.stringify(exited)}; reward point counts seen: ${counts.join(" ")}`);
    assert.equal(exited.code, 0, `arlo run failed:\n${tail()}`);
    assert.ok(during, "the page never showed the running run with RL steps and weight syncs");
    const grew = counts.filter((n) => n > 0);
    assert.ok(grew.length >= 3, `the reward chart should grow as steps arrive; point counts seen: ${counts.join(" ")}`);
    for (let i = 1; i < counts.length; i++) assert.ok(counts[i] > counts[i - 1], `point counts must only grow: ${counts.join(" ")}`);

    await waitFor("the page to show the finished state", 60, () => page.evaluate(() => window.arlo.state === "finished"));
    assert.equal((await page.textContent("#state")).trim(), "finished");
    await page.screenshot({path: path.join(shots, "live-page-after.png"), fullPage: true});
    const after = await page.evaluate(() => JSON.parse(JSON.stringify(window.arlo)));
    const records = readJsonl(path.join(runDir, "metrics.jsonl"));
    assert.ok(after.records <= records.length && after.records > during.records, `page took ${after.records} of ${records.length} records`);
    checkCharts(after, records.slice(0, after.records), "after the run");
    const want = expected(records.slice(0, after.records));
    assert.equal(Math.max(...want.steps.map((r) => r.step)), MAX_STEPS, "the page has every step of the run");
    assert.equal(want.reward.length, MAX_STEPS - WARMUP, "one reward point per RL step");
    assert.equal(want.syncs.length > 0 && after.charts["sync-0"].x.length > 0, true, "a weight-sync timeline per worker");
    assert.equal(after.charts["sync-1"].series.map((s) => s.label).join(","), "pause,transfer,resume");
    assert.equal(await page.locator("#workers tbody tr").count(), 2, "one row per worker");
    assert.equal(await page.textContent("#step"), String(MAX_STEPS));
    // The newest samples' table (/api/samples): a row per sample, each with its prompt, completion and reward.
    assert.ok(after.samples.length > 0 && after.samples.length <= 20, `samples table: ${after.samples.length} rows`);
    assert.equal(await page.locator("#samples tbody tr").count(), after.samples.length, "one table row per sample");
    for (const r of after.samples) {
      assert.ok(r.prompt && typeof r.completion === "string" && typeof r.reward === "number", JSON.stringify(r));
      assert.ok(r.step > WARMUP && r.step <= MAX_STEPS + 2 && r.version >= 0, `sample row ${JSON.stringify(r)}`);
    }
    assert.equal((await page.locator("#samples tbody tr").first().locator("td").nth(3).textContent()), after.samples[0].prompt);
    assert.ok(Number(after.status.ledger.completed) > 0, "the ledger shows completed rollouts");

    assert.deepEqual(elsewhere, [], "requests the page made to other places than the status port");
    const before = consoleErrors.filter(([, late]) => !late).map(([m]) => m);
    assert.deepEqual(before, [], "console errors while the run was going");
    const late = consoleErrors.filter(([m, l]) => l && !/^Failed to load resource: net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)/.test(m));
    assert.deepEqual(late, [], "console errors after the run ended (other than the closed port)");
    log(`ok: ${after.records} records, screenshots in ${shots}`);
  } finally {
    await browser.close();
    if (!exited) child.kill("SIGKILL");
    fs.closeSync(out);
  }
  if (!process.env.ARLO_SCREENSHOT_DIR) fs.rmSync(tmp, {recursive: true, force: true});
  else fs.rmSync(runDir, {recursive: true, force: true});
}

main().catch((e) => { console.error(e && e.stack ? e.stack : e); process.exit(1); });
