"""`arlo run` against real vLLM servers: configs/vllm-cpu.yaml (two servers of the tiny model with
arlo's weight-transfer backend, the Hugging Face trainer of examples/hf_trainer, weights over tcp)
for a few dozen steps. One server is killed with SIGKILL mid-run and started again: it is left out,
answers again, and rejoins with a resync. At the end the ledger adds up and every server holds the
trainer's last version with the trainer's checksum (summary.json). And a run whose one server arlo
starts itself (inference.launch embedded) and restarts after a SIGKILL. Run with the project's Python
environment (a test's name after the flags runs that one):

    .venv/bin/python tests/vllm/arlo_run_test.py --source . --arlo build/apps/arlo/arlo
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import find_pid, read_jsonl, run_unittest  # noqa: E402
from vllm_server import MACHINERY_RUN, VllmServer, kill_group, set_args, tail  # noqa: E402

ARGS = None
MAX_STEPS = 40
KILL_AT_STEP = 3
BACKEND = ["--weight-transfer-config", '{"backend": "arlo"}']
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


def wait_for(what, check, timeout_s, proc=None, log=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"arlo run exited ({proc.returncode}) before {what}:\n{tail(log)}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout_s} s" + (f":\n{tail(log)}" if log else ""))


def last_step(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            steps = [json.loads(line).get("step", 0) for line in f if line.strip()]
        return max(steps, default=0)
    except (OSError, ValueError):
        return 0


def healthy_again(run_dir, name):
    """Whether the run's supervision events (supervision.jsonl) show `name` restarted and healthy."""
    try:
        with open(os.path.join(run_dir, "supervision.jsonl")) as f:
            kinds = [e["event"] for e in map(json.loads, f) if e.get("name") == name]
    except (OSError, ValueError, KeyError):
        return False
    return "restarting" in kinds and "healthy" in kinds[kinds.index("restarting"):]


def check_ledger_and_servers(test, summary, steps, urls):
    """A finished run's summary.json: the ledger adds up (every dispatched rollout settled, none in
    flight, every completed one with a disposition), the trainer is at version `steps`, and each
    server of `urls` holds that version with the trainer's checksum. Returns the checksum."""
    ledger = summary["ledger"]
    settled = ledger["completed"] + sum(ledger["failed"].values()) + sum(ledger["cancelled"].values())
    test.assertEqual(ledger["dispatched"], settled + ledger["in_flight"], ledger)
    test.assertEqual(ledger["in_flight"], 0, ledger)
    test.assertEqual(sum(ledger["dispositions"].values()), ledger["completed"], ledger)
    want = summary["trainer"]["checksum"]
    test.assertEqual(summary["trainer"]["version"], steps)
    for url in urls:
        test.assertEqual(summary["workers"][url], {"version": steps, "checksum": want}, summary["workers"])
    return want


class ArloRunTest(unittest.TestCase):
    def test_a_run_keeps_every_server_on_the_trainers_weights_through_a_kill(self):
        tmp, model, run_dir, log = self.scratch("arlo-vllm-run-")
        servers = [VllmServer(model, tmp, name=f"vllm{i}", extra_args=BACKEND, extra_env=DEV_MODE) for i in (0, 1)]
        for s in servers:
            self.addCleanup(s.stop)
            s.launch()
        for s in servers:
            s.wait_ready()

        argv = self.run_argv(run_dir, model, MAX_STEPS, {"inference.launch": "external",
                                                         "inference.urls": json.dumps([s.url for s in servers])})
        arlo = self.start_arlo(argv, log)
        wait_for(f"step {KILL_AT_STEP}", lambda: last_step(run_dir) >= KILL_AT_STEP, 300, arlo, log)

        # Server 1 dies mid-run: the next update fails on it and leaves it out. The trainer is then
        # held (SIGSTOP) while the server starts again, so the run cannot end before it rejoins.
        os.killpg(servers[1].proc.pid, signal.SIGKILL)
        servers[1].proc.wait()
        left_out = f"weight sync: worker {servers[1].url} is left out"
        wait_for("server 1 left out of the updates", lambda: left_out in tail(log, 400000), 120, arlo, log)
        trainer_pid = wait_for("the trainer's pid", lambda: self.pid_of(model), 30)
        os.kill(trainer_pid, signal.SIGSTOP)
        try:
            restarted = VllmServer(model, tmp, name="vllm1", extra_args=BACKEND, extra_env=DEV_MODE,
                                   port=servers[1].port)
            self.addCleanup(restarted.stop)
            restarted.start()
            rejoined = f"weight sync: worker {servers[1].url} answers again"
            wait_for("the restarted server's rejoin", lambda: rejoined in tail(log, 400000), 120, arlo, log)
        finally:
            os.kill(trainer_pid, signal.SIGCONT)

        self.assertEqual(arlo.wait(timeout=300), 0, tail(log))
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        ledger = summary["ledger"]
        want = check_ledger_and_servers(self, summary, MAX_STEPS, [s.url for s in servers])
        with open(log) as f:
            text = f.read()
        self.assertIn(f"worker {servers[1].url}", text)
        print(f"arlo_run_test: {MAX_STEPS} steps, ledger {ledger}, both servers on {want}", file=sys.stderr)

    def test_arlo_starts_its_vllm_server_and_restarts_it_after_a_kill(self):
        """inference.launch embedded: arlo run starts the vLLM server itself (configs/vllm-cpu.yaml, one
        server here), waits for its /health, and when it is killed mid-run starts it again; the
        restarted server loads the model from disk and is synced the current version before the run
        ends on the trainer's last one."""
        tmp, model, run_dir, log = self.scratch("arlo-vllm-embedded-")
        steps = 12
        argv = self.run_argv(run_dir, model, steps, {"inference.num_workers": 1})
        arlo = self.start_arlo(argv, log)
        wait_for("step 2", lambda: last_step(run_dir) >= 2, 300, arlo, log)
        server = find_pid(lambda argv: "vllm.entrypoints.openai.api_server" in argv and model in argv)
        self.assertTrue(server, "no vLLM server process of this run")
        trainer_pid = wait_for("the trainer's pid", lambda: self.pid_of(model), 30)
        os.kill(trainer_pid, signal.SIGSTOP)  # the run cannot end before the server is back
        try:
            os.kill(server, signal.SIGKILL)
            wait_for("the server's restart", lambda: healthy_again(run_dir, "vllm-0"), 180, arlo, log)
        finally:
            os.kill(trainer_pid, signal.SIGCONT)
        self.assertEqual(arlo.wait(timeout=400), 0, tail(log))
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        want = summary["trainer"]["checksum"]
        self.assertEqual(summary["trainer"]["version"], steps)
        self.assertEqual(len(summary["workers"]), 1, summary["workers"])
        for url, held in summary["workers"].items():
            self.assertEqual(held, {"version": steps, "checksum": want}, url)
        print(f"arlo_run_test: embedded vLLM restarted, {steps} steps, on {want}", file=sys.stderr)

    def test_a_killed_trainer_rank_restarts_the_group_and_no_step_is_lost(self):
        """trainer.num_ranks 2 (the reference trainer, FSDP2 over gloo) with a checkpoint before each
        ack: rank 1 is killed with SIGKILL mid-run. arlo run stops rank 0, starts both again with a
        fresh rendezvous, both resume from the checkpoint, and the run ends 0 with every step 1..N in
        the trainer's metrics exactly once and the server on the trainer's last version and checksum."""
        tmp, model, run_dir, log = self.scratch("arlo-vllm-ranks-")
        steps, kill_after = 10, 3
        argv = self.run_argv(run_dir, model, steps, {"inference.num_workers": 1, "trainer.num_ranks": 2,
                                                     "trainer.ckpt_interval": 1})
        arlo = self.start_arlo(argv, log)
        metrics = os.path.join(run_dir, "trainer_metrics.jsonl")
        wait_for(f"the trainer's step {kill_after}", lambda: len(read_jsonl(metrics, complete_only=True)) >= kill_after, 400, arlo, log)
        rank1 = wait_for("rank 1's pid", lambda: find_pid(
            lambda argv: model in argv and any(a.endswith("hf_trainer/train.py") for a in argv), env={"ARLO_RANK": "1"}), 30)
        os.kill(rank1, signal.SIGKILL)

        self.assertEqual(arlo.wait(timeout=500), 0, tail(log))
        self.assertEqual([r["step"] for r in read_jsonl(metrics)], list(range(1, steps + 1)), tail(log))
        restarts = [e for e in read_jsonl(os.path.join(run_dir, "supervision.jsonl")) if e.get("event") == "restarting"]
        self.assertEqual([(e.get("name"), e.get("group"), e.get("signal"), e.get("exited_pid")) for e in restarts],
                         [("trainer-1", "trainer", signal.SIGKILL, rank1)], tail(log))
        text = tail(log, 10**7)
        for rank in (0, 1):
            self.assertIn(f"[trainer-{rank}] trainer: resumed from", text)
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        want = summary["trainer"]["checksum"]
        self.assertEqual(summary["trainer"]["version"], steps)
        for url, held in summary["workers"].items():
            self.assertEqual(held, {"version": steps, "checksum": want}, url)
        print(f"arlo_run_test: rank 1 killed after step {kill_after}, both ranks resumed, steps 1..{steps} "
              f"trained once, on {want}", file=sys.stderr)

    def scratch(self, prefix):
        """A temporary directory (removed at the end) with the tiny model written into it: (the
        directory, the model's directory, the run's directory, arlo's log)."""
        import arlo_tiny_model
        tmp = tempfile.mkdtemp(prefix=prefix)
        self.addCleanup(shutil.rmtree, tmp, True)
        model = os.path.join(tmp, "tiny")
        arlo_tiny_model.write(model, seed=0)
        return tmp, model, os.path.join(tmp, "run"), os.path.join(tmp, "arlo.log")

    @staticmethod
    def run_argv(run_dir, model, steps, sets):
        """arlo run of configs/vllm-cpu.yaml cut down to a test of the machinery (MACHINERY_RUN), for
        `steps` steps into run_dir on `model`, with `sets` on top."""
        return [ARGS.arlo, "run", os.path.join(ARGS.source, "configs/vllm-cpu.yaml"),
                *set_args({**MACHINERY_RUN, "run.dir": run_dir, "run.max_steps": steps, "trainer.model": model,
                           **sets})]

    def start_arlo(self, argv, log):
        """`arlo run` with argv, its output in `log`, from the source tree, killed with its group at the
        end; the trainer and vLLM run in this Python's environment."""
        with open(log, "w") as out:
            arlo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ARGS.source,
                                    start_new_session=True,
                                    env=dict(os.environ, OMP_NUM_THREADS="1", ARLO_PYTHON=sys.executable))
        self.addCleanup(kill_group, arlo)
        return arlo

    @staticmethod
    def pid_of(model):
        """The trainer's pid: the process whose command line names this test's model directory and
        the trainer script."""
        return find_pid(lambda argv: model in argv and any(a.endswith("hf_trainer/train.py") for a in argv))


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
