"""The monitors end to end: real shortened `arlo run`s of the quickstart with monitors.use [wandb,
tensorboard] (W&B offline), read back with each tool's own reader: TensorBoard's EventAccumulator
(what `tensorboard` itself loads a log dir with) and the W&B run file parsed into wandb's own
protobuf records (wandb_file.py). Run with the project's Python environment:

    .venv/bin/python tests/e2e/monitors/monitors_test.py --arlo build/apps/arlo/arlo --source .
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import wandb_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from arlo_test_support import find_pid, run_unittest  # noqa: E402

ARGS = None
STEPS, WARMUP = 40, 10
RUN_DEADLINE_S = 300


def run_sets(run_dir, steps=STEPS):
    return [
        f"run.dir={run_dir}", "log.progress=false", "status.port=0", f"run.max_steps={steps}",
        f"orchestrator.sft_warmup_steps={WARMUP}", "eval.interval=10", "eval.size=16", "log.interval_s=1",
        "ckpt.interval=1", "monitors.use=[wandb, tensorboard]", "monitors.wandb_mode=offline",
        "monitors.wandb_project=arlo-e2e",
    ]


def arlo_run(run_dir, log_path, resume=False, steps=STEPS, extra=()):
    argv = [ARGS.arlo, "run", os.path.join(ARGS.source, "configs/quickstart.yaml")]
    for s in run_sets(run_dir, steps) + list(extra):
        argv += ["--set", s]
    if resume:
        argv.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS="1", ARLO_PYTHON=sys.executable)
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish(proc, log_path):
    try:
        proc.wait(timeout=RUN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"arlo run did not end in {RUN_DEADLINE_S} s; its output:\n{tail(log_path)}")
    return proc.returncode


def tail(path, n=6000):
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def metrics(run_dir, kind="step"):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == kind:
                out.append(rec)
    return out


def tensorboard_scalars(log_dir, tag):
    """(step, value) of every event TensorBoard shows for `tag`, in file order."""
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)], acc


def wandb_rows(run_dir):
    """History rows of every W&B run file of this run (a resumed run writes one per session), in order."""
    files = sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb")))
    assert files, f"no W&B run file under {run_dir}/wandb"
    rows = []
    for f in files:
        rows.extend(wandb_file.history(f))
    return rows, files


def monitor_pid(run_dir, kind):
    return find_pid(lambda argv: any(a.endswith("arlo_monitor.py") for a in argv) and kind in argv and run_dir in argv)


def wait_until(what, check, timeout_s=120, proc=None, log_path=None):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"arlo run ended before {what}; its output:\n{tail(log_path)}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"; output:\n{tail(log_path)}" if log_path else ""))


def logged_offset(run_dir, kind):
    try:
        with open(os.path.join(run_dir, "monitors", f"{kind}.json")) as f:
            return json.load(f).get("offset", 0)
    except (OSError, ValueError):
        return 0


class Monitors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="arlo_monitors_e2e_")
        self.run_dir = os.path.join(self.tmp, "run")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assert_steps_match(self, steps_logged, want, what):
        """steps_logged: [(step, value)] as a monitor logged them; want: {step: value} from metrics.jsonl."""
        seen = [s for s, _ in steps_logged]
        self.assertEqual(len(seen), len(set(seen)), f"{what}: a step logged twice: {sorted(seen)}")
        self.assertEqual(sorted(seen), sorted(want), f"{what}: steps differ from metrics.jsonl")
        for s, v in steps_logged:
            self.assertAlmostEqual(v, want[s], places=5, msg=f"{what}: step {s}")

    def test_every_record_reaches_wandb_and_tensorboard(self):
        log = os.path.join(self.tmp, "run.log")
        rc = finish(arlo_run(self.run_dir, log, extra=["security.token=e2e-secret-token"]), log)
        self.assertEqual(rc, 0, tail(log))
        steps = metrics(self.run_dir)
        self.assertEqual([r["step"] for r in steps], list(range(1, STEPS + 1)))
        reward = {r["step"]: r["train/reward/mean"] for r in steps if "train/reward/mean" in r}
        self.assertEqual(len(reward), STEPS - WARMUP)
        evals = metrics(self.run_dir, "eval")
        self.assertGreaterEqual(len(evals), 3)

        # TensorBoard: the same numbers under the same names.
        tb_dir = os.path.join(self.run_dir, "tensorboard")
        tb_reward, acc = tensorboard_scalars(tb_dir, "train/reward/mean")
        self.assert_steps_match(tb_reward, reward, "tensorboard train/reward/mean")
        tags = set(acc.Tags()["scalars"])
        for tag in ("trainer/loss", "throughput/tokens_per_s", "ledger/trained", "ledger/dispatched",
                    "weight_sync/seconds", "eval/arithmetic/pass@1"):
            self.assertIn(tag, tags)
        self.assertTrue(any(re.match(r"weight_sync/worker/.+/update_s", t) for t in tags), tags)
        hists = {e.step: list(e.histogram_value.bucket) for e in acc.Histograms("off_policy/histogram")}
        want_hists = {r["step"]: r["off_policy/histogram"] for r in steps if any(r.get("off_policy/histogram", []))}
        self.assertEqual(hists, want_hists, "the staleness histogram: one bucket per off-policy distance")
        tb_eval = dict(tensorboard_scalars(tb_dir, "eval/arithmetic/pass@1")[0])
        self.assertEqual(tb_eval, {r["step"]: r["eval/arithmetic/pass@1"] for r in evals})
        loss = {r["step"]: r["trainer/loss"] for r in steps if "trainer/loss" in r}
        self.assert_steps_match(tensorboard_scalars(tb_dir, "trainer/loss")[0], loss, "tensorboard trainer/loss")

        # W&B (offline): every step's reward, the eval, the config and the summary.
        rows, files = wandb_rows(self.run_dir)
        self.assertEqual(len(files), 1)
        wb_reward = [(r["arlo/step"], r["train/reward/mean"]) for r in rows if "train/reward/mean" in r]
        self.assert_steps_match(wb_reward, reward, "wandb train/reward/mean")
        self.assertTrue(any("eval/arithmetic/pass@1" in r for r in rows))
        self.assertTrue(any(k.startswith("off_policy/histogram") for r in rows for k in r))
        recs = list(wandb_file.records(files[0]))
        run = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        config = {u.key: json.loads(u.value_json) for u in run[0].config.update}
        self.assertEqual(config["run"]["max_steps"], STEPS, "the resolved config is the W&B run's config")
        self.assertEqual(config["security"]["token"], "<redacted>", "the run's token never reaches W&B")
        self.assertEqual(os.stat(os.path.join(self.run_dir, "monitors", "config.yaml")).st_mode & 0o777, 0o600)
        summary = {u.key: json.loads(u.value_json) for r in recs if r.WhichOneof("record_type") == "summary"
                   for u in r.summary.update}
        self.assertEqual(summary.get("summary/steps"), STEPS, "the run's summary.json reaches the W&B summary")
        self.assertEqual(summary.get("summary/ok"), True)

        # W&B's rollouts table: the newest sampled rollouts of rollouts.jsonl, as the run wrote them.
        tables = sorted(glob.glob(os.path.join(os.path.dirname(files[0]), "files", "media", "table", "rollouts_*.json")),
                        key=lambda p: int(re.search(r"rollouts_(\d+)_", p).group(1)))
        self.assertTrue(tables, "a rollouts table was logged")
        with open(tables[-1]) as f:
            table = json.load(f)
        self.assertEqual(table["columns"], ["step", "version", "prompt", "completion", "reward", "answer", "worker"])
        groups = []
        with open(os.path.join(self.run_dir, "rollouts.jsonl")) as f:
            groups = [json.loads(line) for line in f]
        self.assertGreater(len(groups), 10)
        want = [[g["step"], s["versions"][-1][0], g["prompt"], s["completion"], s["reward"], g["answer"], g["worker"]]
                for g in groups for s in g["samples"]][-500:]
        self.assertEqual(table["data"], want)

    def test_no_interpreter_is_an_error_at_start(self):
        log = os.path.join(self.tmp, "run.log")
        rc = finish(arlo_run(self.run_dir, log, extra=["monitors.python=/nonexistent/python"]), log)
        self.assertNotEqual(rc, 0)
        out = tail(log)
        self.assertIn("monitors: no Python interpreter at /nonexistent/python", out)
        self.assertIn("scripts/bootstrap --python", out)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "summary.json")), "the run never started")

    def test_a_killed_monitor_is_restarted_and_the_run_finishes(self):
        log = os.path.join(self.tmp, "run.log")
        proc = arlo_run(self.run_dir, log, steps=60)
        wait_until("the tensorboard monitor logs", lambda: logged_offset(self.run_dir, "tensorboard") > 0,
                   proc=proc, log_path=log)
        pid = monitor_pid(self.run_dir, "tensorboard")
        self.assertIsNotNone(pid)
        os.kill(pid, signal.SIGKILL)
        self.assertEqual(finish(proc, log), 0, tail(log))
        out = tail(log, 10**7)
        self.assertRegex(out, r"monitor-tensorboard \(pid \d+\) killed by signal 9; its last lines", "the death is said")
        self.assertIn("monitor-tensorboard restarted", out)
        reward = {r["step"]: r["train/reward/mean"] for r in metrics(self.run_dir) if "train/reward/mean" in r}
        tb_reward, _ = tensorboard_scalars(os.path.join(self.run_dir, "tensorboard"), "train/reward/mean")
        self.assert_steps_match(tb_reward, reward, "tensorboard after a restart")

    def test_a_monitor_killed_past_its_saved_offset_shows_each_step_once(self):
        """The window a SIGKILL can hit: records written to TensorBoard past the saved offset, and steps
        out of file order (an eval record for version 10 after step 15). Deterministic: the monitor runs
        over the whole file, then its saved offset is put back to just after step 15, as if it had been
        killed there, and it runs again."""
        os.makedirs(self.run_dir)
        path = os.path.join(self.run_dir, "metrics.jsonl")
        recs = [{"kind": "step", "step": s, "time": 1.0 + s, "train/reward/mean": s / 100} for s in range(1, 16)]
        recs.append({"kind": "eval", "step": 10, "time": 17.0, "eval/arithmetic/pass@1": 0.5})
        recs += [{"kind": "step", "step": s, "time": 1.0 + s, "train/reward/mean": s / 100} for s in range(16, 21)]
        with open(path, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        monitor = [sys.executable, os.path.join(ARGS.source, "python", "arlo_monitor.py"), "--kind", "tensorboard",
                   "--run-dir", self.run_dir, "--options", json.dumps({"dir": os.path.join(self.run_dir, "tb")})]
        for attempt in range(2):
            proc = subprocess.Popen(monitor, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wait_until("the monitor reads the file", lambda: logged_offset(self.run_dir, "tensorboard")
                       == os.path.getsize(path))
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=60)[0]
            self.assertEqual(proc.returncode, 0, out)
            if attempt == 0:  # "killed" right after step 15: the eval and steps 16-20 were written but not saved
                with open(path, "rb") as f:
                    offset = sum(len(line) for line in f.readlines()[:15])
                with open(os.path.join(self.run_dir, "monitors", "tensorboard.json"), "w") as f:
                    json.dump({"offset": offset, "rollouts_offset": 0}, f)
        self.assertIn("from step 10, 6 records again", out)  # steps 10-15
        want = {s: s / 100 for s in range(1, 21)}
        got, _ = tensorboard_scalars(os.path.join(self.run_dir, "tb"), "train/reward/mean")
        self.assert_steps_match(got, want, "tensorboard after a restart past the saved offset")
        self.assertEqual(tensorboard_scalars(os.path.join(self.run_dir, "tb"), "eval/arithmetic/pass@1")[0],
                         [(10, 0.5)])

    def test_a_resumed_run_logs_no_step_twice(self):
        steps = 200  # long enough that the stop lands well before the end, whatever the machine's load
        log = os.path.join(self.tmp, "first.log")
        proc = arlo_run(self.run_dir, log, steps=steps)
        wait_until("step 20", lambda: any(r["step"] >= 20 for r in metrics(self.run_dir)) if os.path.exists(
            os.path.join(self.run_dir, "metrics.jsonl")) else False, proc=proc, log_path=log)
        os.killpg(proc.pid, signal.SIGTERM)  # a graceful stop (final checkpoint), like Ctrl-C
        finish(proc, log)
        stopped_at = max(r["step"] for r in metrics(self.run_dir))
        self.assertLess(stopped_at, steps, "the run was to be stopped before its end")
        log2 = os.path.join(self.tmp, "resume.log")
        self.assertEqual(finish(arlo_run(self.run_dir, log2, resume=True, steps=steps), log2), 0, tail(log2))

        records = metrics(self.run_dir)
        self.assertEqual(sorted(r["step"] for r in records), list(range(1, steps + 1)))
        reward = {r["step"]: r["train/reward/mean"] for r in records if "train/reward/mean" in r}
        tb_reward, _ = tensorboard_scalars(os.path.join(self.run_dir, "tensorboard"), "train/reward/mean")
        self.assert_steps_match(tb_reward, reward, "tensorboard across the resume")
        rows, files = wandb_rows(self.run_dir)
        self.assertEqual(len(files), 2, "one W&B run file per session")
        ids = {re.search(r"run-(\w+)\.wandb$", f).group(1) for f in files}
        self.assertEqual(len(ids), 1, f"the resumed run continues the same W&B run: {ids}")
        wb_reward = [(r["arlo/step"], r["train/reward/mean"]) for r in rows if "train/reward/mean" in r]
        self.assert_steps_match(wb_reward, reward, "wandb across the resume")


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
