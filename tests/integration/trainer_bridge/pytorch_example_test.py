#!/usr/bin/env python3
"""End to end for examples/pytorch_trainer: real rollouts from arlo-worker, packed and served by the
bridge (arlo_bridge_test_feeder), trained by the PyTorch example through the Python module, and the
published versions received by the worker (GET /weights). Both transports.

Environment (set by CMake): ARLO_SOURCE_DIR, ARLO_BRIDGE_LIB, ARLO_BRIDGE_FEEDER, ARLO_WORKER.
Exits 77 (skipped) when arlo-worker was not built (no libtorch)."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

SRC = os.environ["ARLO_SOURCE_DIR"]
FEEDER = os.environ["ARLO_BRIDGE_FEEDER"]
WORKER = os.environ.get("ARLO_WORKER", "")
EXAMPLE = os.path.join(SRC, "examples", "pytorch_trainer", "train.py")
STEPS = 3


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def start_worker(weights_from):
    # A worker loads weights only from where it is told it may (--allow-weights-from).
    proc = subprocess.Popen([WORKER, "--port", "0", "--threads", "1", "--log-level", "warn",
                             "--allow-weights-from", weights_from], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, "http://" + line.split()[-1].strip()
    fail("arlo-worker exited before listening")


def wait_file(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            fail(f"{proc.args} exited with {proc.returncode} before {path} appeared")
        if time.time() > deadline:
            fail(f"{path} did not appear")
        time.sleep(0.05)


def update_worker(client, url, version, ws_dir):
    r = client.post(url + "/weights/prepare", json={"version": version, "weight_sync": {"transport": "filesystem", "dir": ws_dir}})
    if r.status_code >= 300:
        fail(f"prepare v{version}: {r.status_code} {r.text}")
    r = client.post(url + "/weights/commit", json={"version": version})
    if r.status_code >= 300:
        fail(f"commit v{version}: {r.status_code} {r.text}")
    return client.get(url + "/weights").json()


def rollouts(client, url):
    model = client.get(url + "/v1/models").json()["data"][0]["id"]
    samples = []
    for i in range(8):
        r = client.post(url + "/v1/completions", json={"model": model, "prompt": f"{i}+{i + 1}=", "max_tokens": 8,
                                                       "n": 2, "logprobs": 0, "temperature": 1.0, "seed": 100 + i})
        if r.status_code != 200:
            fail(f"completion: {r.status_code} {r.text}")
        body = r.json()
        for k, choice in enumerate(body["choices"]):
            prompt = choice.get("prompt_token_ids") or body["prompt_token_ids"]
            samples.append({"prompt": prompt, "completion": choice["token_ids"],
                            "logprobs": choice["logprobs"]["token_logprobs"], "versions": [0] * len(choice["token_ids"]),
                            "advantage": 1.0 if k == 0 else -1.0})
    return samples


def run_trainer_and_feeder(transport, run_dir, ws_dir, samples_path, log):
    feeder = subprocess.Popen([FEEDER, "--transport", transport, "--run-dir", run_dir, "--samples", samples_path,
                               "--steps", str(STEPS), "--batch-size", "8", "--seq-len", "64", "--timeout", "200"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = None
        for line in feeder.stdout:  # log lines may come first
            if line.startswith("port "):
                port = int(line.split()[1])
                break
        if port is None:
            fail(f"feeder ({transport}) exited without a port")
        args = [sys.executable, EXAMPLE, "--transport", transport, "--run-dir", run_dir, "--port", str(port),
                "--weight-sync", json.dumps({"transport": "filesystem", "dir": ws_dir}), "--steps", str(STEPS), "--metrics", log,
                "--lr", "1e-3"]
        trainer = subprocess.run(args, capture_output=True, text=True, timeout=240)
        if trainer.returncode != 0:
            fail(f"trainer ({transport}) exited {trainer.returncode}:\n{trainer.stdout}\n{trainer.stderr}")
        out, _ = feeder.communicate(timeout=60)
    finally:
        if feeder.poll() is None:
            feeder.kill()
            feeder.wait()
    if feeder.returncode != 0:
        fail(f"feeder ({transport}) exited {feeder.returncode}: {out}")
    lines = out.split("\n")
    for s in range(1, STEPS + 1):
        if f"acked {s}" not in lines:
            fail(f"feeder ({transport}) did not see ack {s}: {out}")
    # A version superseded before anyone pulled it is dropped unannounced, so the feeder may skip
    # some; what it sees only grows, and ends at the newest.
    versions = [int(l.split()[1]) for l in lines if l.startswith("version ")]
    if versions != sorted(set(versions)) or not versions or versions[-1] != STEPS:
        fail(f"feeder ({transport}) saw versions {versions}, want increasing up to {STEPS}: {out}")
    return [json.loads(l) for l in open(log)]


def check_renamed_flag():
    # --is-cap is the old name of --is-high (the config's trainer.is_high): two values for one flag are refused.
    r = subprocess.run([sys.executable, EXAMPLE, "--is-cap", "1.5", "--is-high", "2"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 2 or "give --is-high once" not in r.stderr:
        fail(f"--is-cap 1.5 --is-high 2: exit {r.returncode}, stderr: {r.stderr[-500:]}")


def main():
    if not WORKER or not os.path.exists(WORKER):
        print("arlo-worker not built (no libtorch): skipped")
        return 77
    check_renamed_flag()
    tmp = tempfile.mkdtemp(prefix="arlo_pytorch_example_")
    worker = None
    try:
        client = httpx.Client(timeout=60)
        # dir transport, with the worker in the loop.
        run_dir = os.path.join(tmp, "dir_run")
        ws_dir = os.path.join(run_dir, "weights")
        os.makedirs(ws_dir)
        worker, url = start_worker(tmp)
        # The trainer publishes v0 first; the worker serves it; rollouts come from it.
        samples_path = os.path.join(tmp, "samples.jsonl")
        open(samples_path, "w").close()
        log = os.path.join(tmp, "dir_metrics.jsonl")
        trainer = subprocess.Popen([sys.executable, EXAMPLE, "--transport", "dir", "--run-dir", run_dir,
                                    "--weight-sync", json.dumps({"transport": "filesystem", "dir": ws_dir}), "--steps", str(STEPS),
                                    "--metrics", log, "--lr", "1e-3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        wait_file(os.path.join(ws_dir, "v0", "STABLE"), trainer)
        w0 = update_worker(client, url, 0, ws_dir)
        if w0.get("version") != 0:
            fail(f"worker did not take v0: {w0}")
        samples = rollouts(client, url)
        with open(samples_path, "w") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")
        feeder = subprocess.run([FEEDER, "--transport", "dir", "--run-dir", run_dir, "--samples", samples_path,
                                 "--steps", str(STEPS), "--batch-size", "8", "--seq-len", "64", "--timeout", "200"],
                                capture_output=True, text=True, timeout=240)
        out, err = trainer.communicate(timeout=120)
        if trainer.returncode != 0 or feeder.returncode != 0:
            fail(f"dir run: trainer {trainer.returncode} feeder {feeder.returncode}\n{out}\n{err}\n{feeder.stdout}\n{feeder.stderr}")
        records = [json.loads(l) for l in open(log)]
        if [r["step"] for r in records] != list(range(1, STEPS + 1)):
            fail(f"dir run trained steps {[r['step'] for r in records]}")
        for r in records:
            if not math.isfinite(r["loss"]) or not math.isfinite(r["grad_norm"]):
                fail(f"non-finite loss: {r}")
        # Step 1 trains on rollouts the worker sampled from the very weights the trainer holds, so
        # the PyTorch mirror of the reference model must agree with the C++ engine's logprobs.
        if records[0]["mismatch_kl"] > 1e-3:
            fail(f"PyTorch model disagrees with the reference engine: mismatch_kl {records[0]['mismatch_kl']}")
        # ... and the metric is live: after an update the trainer has moved away from v0's samples.
        if not records[-1]["mismatch_kl"] > 0.0:
            fail(f"mismatch_kl stays 0 after training: {records}")
        # The worker receives the newest version the trainer published.
        w = update_worker(client, url, STEPS, ws_dir)
        if w.get("version") != STEPS or w.get("checksum") == w0.get("checksum"):
            fail(f"worker after update: {w} (v0 was {w0})")
        print(f"dir: trained {STEPS} steps, mismatch_kl(step 1)={records[0]['mismatch_kl']:.2e}, worker at {w}")

        # socket transport with the same rollouts.
        run_dir2 = os.path.join(tmp, "socket_run")
        os.makedirs(run_dir2)
        records = run_trainer_and_feeder("socket", run_dir2, os.path.join(run_dir2, "weights"), samples_path,
                                         os.path.join(tmp, "socket_metrics.jsonl"))
        if [r["step"] for r in records] != list(range(1, STEPS + 1)):
            fail(f"socket run trained steps {[r['step'] for r in records]}")
        print(f"socket: trained {STEPS} steps, losses {[round(r['loss'], 4) for r in records]}")
        return 0
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
