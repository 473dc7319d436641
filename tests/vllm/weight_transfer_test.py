"""arlo's weight transports inside a real vLLM: the "arlo" weight-transfer backend (python/arlo_vllm,
registered through vLLM's plugin entry point) in `vllm serve` of the tiny model, fed by arlo's own
publisher (arlo.bridge.Bridge.publish, the trainer's side). After each update over tcp, shm and
filesystem, with full and delta payloads, vLLM's logprobs on a fixed prompt must match a transformers
forward of the new weights and not of the old ones; the per-version cache_salt keeps a request off
prefix KV computed under older weights. Run with the project's Python environment:

    .venv/bin/python tests/vllm/weight_transfer_test.py --source .

The tests are numbered: they run in order against one server, each update building on the last.
"""

import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import run_unittest  # noqa: E402
from vllm_server import VllmServer, http_json, reference_logprobs, tail  # noqa: E402

ARGS = None
# As in vllm_test.py: vLLM's CPU kernels agree with transformers to about 1e-5 nats on this model;
# another set of weights is off by 0.1 nats or (much) more.
LOGPROB_TOL = 1e-3
OTHER_WEIGHTS = 0.05
PROMPT = "12+34=46\n" * 30 + "7+8="  # over 200 tokens: full KV blocks for the prefix cache


class World:
    server = None
    tmp = None
    dirs = {}  # seed (or name) -> model directory


def model_dir(seed):
    """The tiny model of `seed` (transformers' reference for that version's weights)."""
    import arlo_tiny_model
    if seed not in World.dirs:
        World.dirs[seed] = os.path.join(World.tmp, f"tiny-{seed}")
        arlo_tiny_model.write(World.dirs[seed], seed=seed)
    return World.dirs[seed]


def state_dict(directory):
    from safetensors.torch import load_file
    sd = {}
    for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        sd.update(load_file(f))
    return sd


def setUpModule():
    World.tmp = tempfile.mkdtemp(prefix="arlo-vllm-wt-")
    World.server = VllmServer(model_dir(0), World.tmp, extra_args=["--weight-transfer-config", '{"backend": "arlo"}'],
                              extra_env={"VLLM_SERVER_DEV_MODE": "1"}).start()
    status, out = World.server.post("/init_weight_transfer_engine", {"init_info": {}})
    assert status == 200, (status, out, tail(World.server.log))


def tearDownModule():
    World.server.stop()
    shutil.rmtree(World.tmp, ignore_errors=True)


class Publisher:
    """A trainer's publisher: arlo.bridge.Bridge over a run directory of its own, announcing where
    each version is (<run>/rollouts/versions/v<N>.json, the orchestrator's input)."""

    def __init__(self, name, weight_sync):
        from arlo.bridge import Bridge
        self.run = os.path.join(World.tmp, f"run-{name}")
        self.bridge = Bridge(transport="dir", run_dir=self.run, weight_sync=weight_sync)

    def publish(self, version, sd):
        """Publishes and returns the receiver block the orchestrator would hand vLLM."""
        self.bridge.publish(version, sd, timeout_s=60)
        path = os.path.join(self.run, "rollouts", "versions", f"v{version}.json")
        with open(path) as f:
            announced = json.load(f)["weight_sync"]
        return {"transport": announced["transport"], **announced["endpoint"], "timeout_ms": 60000}

    def close(self):
        self.bridge.close()


def update(version, block, pause="/pause?mode=abort"):
    """The vLLM admin dialect's sequence for a non-collective transport; returns its timings."""
    t = {}
    for step, path, body in [("pause", pause, {}), ("start", "/start_weight_update", {}),
                             ("update", "/update_weights", {"update_info": {"version": version, "weight_sync": block}}),
                             ("finish", "/finish_weight_update", {"weight_version": str(version)}),
                             ("resume", "/resume", {})]:
        t0 = time.monotonic()
        status, out = World.server.post(path, body)
        t[step] = time.monotonic() - t0
        assert status == 200, f"{path}: HTTP {status}: {out}\n{tail(World.server.log, 3000)}"
    return t


def complete(**extra):
    status, out = World.server.post("/v1/completions", {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0,
        "return_token_ids": True, **extra})
    assert status == 200, out
    c = out["choices"][0]
    return c["prompt_token_ids"], c["token_ids"], c["logprobs"]["token_logprobs"]


def distance(directory, answer):
    """Largest |vLLM - transformers| over the generated tokens' logprobs, under `directory`'s weights."""
    prompt_ids, ids, lps = answer
    ref, _ = reference_logprobs(directory, prompt_ids + ids)
    n = len(prompt_ids)
    return max(abs(v - ref[n - 1 + k]) for k, v in enumerate(lps))


def served_version():
    status, out = http_json(World.server.url + "/weight_info")
    assert status == 200, out
    return out["weight_version"]


def loaded_line(version):
    """The backend's log line for `version` (transport, path, buckets, wire bytes, seconds)."""
    with open(World.server.log, errors="replace") as f:
        lines = [line for line in f if re.search(rf"arlo: loaded weights v{version} ", line)]
    assert lines, f"no 'loaded weights v{version}' line in vLLM's log:\n{tail(World.server.log, 3000)}"
    return lines[-1]


class T1Transports(unittest.TestCase):
    def test_an_update_over_each_transport_serves_the_new_weights_and_not_the_old(self):
        previous = model_dir(0)
        self.assertLess(distance(previous, complete()), LOGPROB_TOL, "the server starts on seed 0")
        blocks = {"tcp": {"transport": "tcp", "address": "127.0.0.1:0", "expected_receivers": 1},
                  "shm": {"transport": "shm", "shm_name": f"arlo-wt-{os.getpid()}", "expected_receivers": 1},
                  "filesystem": {"transport": "filesystem", "dir": os.path.join(World.tmp, "weights")}}
        for version, transport in enumerate(blocks, start=1):
            with self.subTest(transport=transport):
                new = model_dir(version)
                pub = Publisher(transport, blocks[transport])
                try:
                    t = update(version, pub.publish(version, state_dict(new)))
                finally:
                    pub.close()
                answer = complete(cache_salt=f"v{version}")
                self.assertLess(distance(new, answer), LOGPROB_TOL, f"v{version} over {transport}")
                self.assertGreater(distance(previous, answer), OTHER_WEIGHTS, f"v{version} still serves the old weights")
                self.assertEqual(served_version(), str(version))
                self.assertIn(f"over {transport}", loaded_line(version))
                print(f"weight_transfer_test: v{version} over {transport}: " +
                      ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in t.items()), file=sys.stderr)
                previous = new


class T2Delta(unittest.TestCase):
    def test_a_delta_payload_changes_what_changed(self):
        """v4 in full, then v5 = v4 with layer 1's MLP of seed 5, as a delta."""
        pub = Publisher("delta", {"transport": "tcp", "address": "127.0.0.1:0", "expected_receivers": 1,
                                  "payload": "delta"})
        try:
            v4 = state_dict(model_dir(4))
            update(4, pub.publish(4, v4))
            self.assertLess(distance(model_dir(4), complete(cache_salt="v4")), LOGPROB_TOL)
            v5 = dict(v4)
            other = state_dict(model_dir(5))
            for name in v5:
                if name.startswith("model.layers.1.mlp."):
                    v5[name] = other[name]
            changed = os.path.join(World.tmp, "tiny-v5")
            shutil.copytree(model_dir(4), changed)
            from safetensors.torch import save_file
            for f in glob.glob(os.path.join(changed, "*.safetensors")):
                os.remove(f)
            save_file(v5, os.path.join(changed, "model.safetensors"), metadata={"format": "pt"})
            index = os.path.join(changed, "model.safetensors.index.json")
            if os.path.exists(index):
                os.remove(index)
            update(5, pub.publish(5, v5))
        finally:
            pub.close()
        answer = complete(cache_salt="v5")
        self.assertLess(distance(changed, answer), LOGPROB_TOL)
        self.assertGreater(distance(model_dir(4), answer), OTHER_WEIGHTS)
        self.assertIn("payload delta", loaded_line(5))


class T3CacheSalt(unittest.TestCase):
    def test_the_version_salt_keeps_a_request_off_kv_of_older_weights(self):
        """arlo pauses keep with clear_cache=false (the kept requests' KV must survive; docs/vllm.md),
        so vLLM's prefix cache outlives the update: the same prompt then reuses the old weights' KV
        without a salt, and not with the new version's salt, which is what arlo sends."""
        complete()                      # the prefix cached without a salt ...
        complete(cache_salt="v5")       # ... and under v5's salt
        pub = Publisher("salt", {"transport": "tcp", "address": "127.0.0.1:0", "expected_receivers": 1})
        try:
            update(6, pub.publish(6, state_dict(model_dir(6))), pause="/pause?mode=keep&clear_cache=false")
        finally:
            pub.close()
        salted, unsalted = complete(cache_salt="v6"), complete()
        self.assertLess(distance(model_dir(6), salted), LOGPROB_TOL, "under v6's salt: v6's weights only")
        self.assertGreater(distance(model_dir(6), unsalted), OTHER_WEIGHTS,
                           "without a salt the prompt reused KV of v5 (if this fails, vLLM no longer keeps the "
                           "prefix cache over an update and the salt is a second guard only)")


class T4Errors(unittest.TestCase):
    def test_a_bad_block_or_version_is_refused_with_the_reason_and_the_old_weights_stay(self):
        before, version = complete(cache_salt="err"), served_version()
        for info, reason in [({"version": 7, "weight_sync": {"transport": "pigeon"}}, "pigeon"),
                             ({"version": -1, "weight_sync": {"transport": "tcp"}}, "version"),
                             ({"version": 7, "weight_sync": {"transport": "tcp", "address": "127.0.0.1:1",
                                                             "timeout_ms": 2000}}, "127.0.0.1:1")]:
            with self.subTest(reason=reason):
                status, _ = World.server.post("/start_weight_update", {})
                self.assertEqual(status, 200)
                status, out = World.server.post("/update_weights", {"update_info": info})
                self.assertNotEqual(status, 200)
                self.assertIn(reason, json.dumps(out))
                # vLLM ended the session; the server still serves the version before, whole.
                self.assertEqual(complete(cache_salt="err"), before)
                self.assertEqual(served_version(), version)


class T5AlreadyHeld(unittest.TestCase):
    def test_an_update_to_a_version_already_held_loads_it_again_without_waiting(self):
        """An update asked for v brought v+1 (the publisher's newest): the next one, asked for v+1,
        must not wait for a newer version the trainer cannot make before this update ends."""
        before, version = complete(cache_salt="held"), served_version()
        status, out = World.server.post("/collective_rpc", {"method": "arlo_weights"})
        self.assertEqual(status, 200, out)
        held = out["results"][0]
        t0 = time.monotonic()
        pub = Publisher("held", {"transport": "tcp", "address": "127.0.0.1:0", "expected_receivers": 1})
        try:
            block = pub.publish(int(version) + 1, state_dict(model_dir(int(version) + 1)))
            update(int(version) + 1, block)                 # receives v+1
            update(int(version), block)                     # asks for v, holds v+1: loads it again
        finally:
            pub.close()
        self.assertLess(time.monotonic() - t0, 30)
        self.assertLess(distance(model_dir(int(version) + 1), complete(cache_salt="held2")), LOGPROB_TOL)
        self.assertNotEqual(complete(cache_salt="held3"), before)
        self.assertNotEqual(held.get("version"), int(version) + 1)


if __name__ == "__main__":
    run_unittest(globals())
