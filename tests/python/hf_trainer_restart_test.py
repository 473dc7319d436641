"""examples/hf_trainer/train.py killed with SIGKILL after an acknowledged step and started again, over
the dir bridge: every step is trained exactly once. The orchestrator side is the bridge's test feeder
(arlo_bridge_test_feeder: steps 1..N of seeded samples, done when all are acknowledged and version N
is announced); the model is the tiny Qwen3 of hf_trainer_test. The trainer checkpoints before each
ack (--checkpoint-dir) and resumes with start_after_step; its metrics file must hold steps 1..N once
each, and the restarted trainer must say which step it resumed from.

Environment (set by CMake): ARLO_BRIDGE_FEEDER, ARLO_BRIDGE_LIB; run by hand, the build folder's."""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import arlo_tiny_model  # noqa: E402

FEEDER = os.environ.get("ARLO_BRIDGE_FEEDER",
                        os.path.join(SRC, "build", "tests", "integration", "trainer_bridge", "arlo_bridge_test_feeder"))
TRAIN = os.path.join(SRC, "examples", "hf_trainer", "train.py")
STEPS = 5
KILL_AFTER_ACK = 2


def write_samples(path, vocab, n=8, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            completion = [rng.randrange(vocab) for _ in range(rng.randint(4, 10))]
            f.write(json.dumps({"prompt": [rng.randrange(vocab) for _ in range(5)], "completion": completion,
                                "logprobs": [-1.0] * len(completion), "versions": [0] * len(completion),
                                "advantage": 1.0 if i % 2 else -1.0}) + "\n")


class Lines:
    """A process's stdout lines, read on a thread, waited for one at a time."""

    def __init__(self, proc):
        self.all, self._q = [], queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, wanted, timeout=180):
        while True:
            line = self._q.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"exited before '{wanted}'; output: {self.all}")
            self.all.append(line)
            if line == wanted:
                return


class RestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "tiny")
        arlo_tiny_model.write(cls.model, seed=3, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128)
        cls.samples = os.path.join(cls.tmp.name, "samples.jsonl")
        write_samples(cls.samples, vocab=200)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_feeder_and_trainer(self, name, first_run):
        """The feeder serving steps 1..STEPS (one step outstanding at a time), first_run(cmd, events, metrics,
        feeder) with the trainer's command line, then a trainer started again to the end: (its output, the
        metrics file's steps)."""
        self.assertTrue(os.path.exists(FEEDER), f"{FEEDER}: not built (target arlo_bridge_test_feeder)")
        run_dir, metrics = (os.path.join(self.tmp.name, f"{name}_{n}") for n in ("run", "metrics.jsonl"))
        os.makedirs(run_dir)
        feeder = subprocess.Popen([FEEDER, "--transport", "dir", "--run-dir", run_dir, "--samples", self.samples,
                                   "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "64", "--timeout", "240",
                                   "--max-pending", "1"],
                                  stdout=subprocess.PIPE, text=True)
        cmd = [sys.executable, TRAIN, "--model", self.model, "--transport", "dir", "--run-dir", run_dir,
               "--weight-sync", json.dumps({"transport": "filesystem", "dir": os.path.join(run_dir, "weights")}),
               "--checkpoint-dir", os.path.join(run_dir, "ckpt"), "--metrics", metrics, "--lr", "1e-3"]
        try:
            events = Lines(feeder)
            first_run(cmd, events, metrics, feeder)
            out = subprocess.run(cmd + ["--steps", str(STEPS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=240).stdout
            self.assertIn(f"trainer: stopped after step {STEPS}", out)
            feeder.wait(timeout=60)
            self.assertEqual(feeder.returncode, 0, events.all)
        finally:
            if feeder.poll() is None:
                feeder.kill()
                feeder.wait()
            feeder.stdout.close()
        with open(metrics) as f:
            return out, [json.loads(line)["step"] for line in f], cmd, metrics

    def test_kill_after_an_acked_step_trains_every_step_once(self):
        def killed(cmd, events, _, feeder):
            trainer = subprocess.Popen(cmd + ["--steps", str(STEPS)], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            try:
                events.wait_for(f"acked {KILL_AFTER_ACK}")
                # The feeder paused hands out at most one more step, so the trainer cannot finish before
                # the kill however slowly this process gets to it: it is in that step or waiting.
                feeder.send_signal(signal.SIGSTOP)
                trainer.send_signal(signal.SIGKILL)
            finally:
                feeder.send_signal(signal.SIGCONT)
                self.first_out = trainer.communicate(timeout=60)[0]
            self.assertEqual(trainer.returncode, -signal.SIGKILL, self.first_out)

        out, steps, _, _ = self.run_feeder_and_trainer("kill", killed)
        resumed = [line for line in out.splitlines() if line.startswith("trainer: resumed from")]
        self.assertEqual(len(resumed), 1, out)
        self.assertGreaterEqual(int(resumed[0].split()[-1]), KILL_AFTER_ACK, out)
        self.assertEqual(steps, list(range(1, STEPS + 1)), f"{self.first_out}\n{out}")
        print(f"killed after ack {KILL_AFTER_ACK}; {resumed[0]}; metrics steps {steps}", flush=True)

    def test_a_step_checkpointed_but_not_logged_gets_its_line_from_the_checkpoint(self):
        def stopped_before_the_line(cmd, events, metrics, _):
            # a run to step 2, then its last metrics line removed: the kill between checkpoint and line
            subprocess.run(cmd + ["--steps", "2"], stdout=subprocess.DEVNULL, check=True, timeout=240)
            with open(metrics) as f:
                lines = f.readlines()
            self.assertEqual([json.loads(line)["step"] for line in lines], [1, 2])
            with open(metrics, "w") as f:
                f.writelines(lines[:1])

        out, steps, cmd, metrics = self.run_feeder_and_trainer("unlogged", stopped_before_the_line)
        self.assertIn("resumed from", out)
        self.assertEqual(steps, list(range(1, STEPS + 1)), out)
        # started again at --steps already reached: it publishes its version and stops, training nothing
        out = subprocess.run(cmd + ["--steps", str(STEPS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=240).stdout
        self.assertIn(f"trainer: resumed from {os.path.join(self.tmp.name, 'unlogged_run', 'ckpt')} at step {STEPS}\n", out)
        self.assertIn(f"trainer: stopped after step {STEPS}", out)
        with open(metrics) as f:
            self.assertEqual(len(f.readlines()), STEPS)


if __name__ == "__main__":
    unittest.main()
