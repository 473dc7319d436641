"""What a Python trainer started by `arlo run` needs besides its model: the defaults arlo run's
environment gives, the batch loop over the bridge, and the per-step metrics file. Shared by
examples/hf_trainer and examples/pytorch_trainer; a trainer of one's own can use it too."""

import json
import os
import time

from arlo.bridge import CANCELLED, BridgeError, TimeoutError_


def arlo_defaults(env):
    """argparse defaults from arlo run's environment ({} when not run by arlo): the bridge's
    transport, run directory and address ($ARLO_BRIDGE_*), the weight-sync block to publish with
    ($ARLO_WEIGHT_SYNC) and the metrics file (<run dir>/trainer_metrics.jsonl)."""
    if not env.get("ARLO_BRIDGE_TRANSPORT"):
        return {}
    d = {"transport": env["ARLO_BRIDGE_TRANSPORT"], "run_dir": env.get("ARLO_RUN_DIR")}
    address = env.get("ARLO_BRIDGE_ADDRESS", "")
    if address:
        host, _, port = address.rpartition(":")
        d["host"], d["port"] = host, int(port)
    if env.get("ARLO_WEIGHT_SYNC"):
        d["weight_sync"] = json.loads(env["ARLO_WEIGHT_SYNC"])
    if d["run_dir"]:
        d["metrics"] = os.path.join(d["run_dir"], "trainer_metrics.jsonl")
    return d


def next_batches(bridge, idle_timeout, stop):
    """Batches as they come, until `stop` (a threading.Event) is set, the bridge is closed, or
    idle_timeout seconds pass without one (None: no limit). Polls in short waits so a stop is seen
    within half a second. An unacknowledged batch comes again."""
    last = time.monotonic()
    while not stop.is_set():
        try:
            batch = bridge.next_batch(timeout_s=0.5)
        except TimeoutError_:
            if idle_timeout is not None and time.monotonic() - last > idle_timeout:
                return
            continue
        except BridgeError as e:
            if e.status == CANCELLED:  # the bridge was closed
                return
            raise
        last = time.monotonic()
        yield batch


class MetricsLog:
    """One JSON line per step, appended to `path` (nothing without one), and printed when asked."""

    def __init__(self, path):
        self._file = open(path, "a") if path else None

    def write(self, record, echo=False):
        line = json.dumps(record)
        if echo:
            print(line, flush=True)
        if self._file:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self):
        if self._file:
            self._file.close()
            self._file = None


def train_step(model, optimizer, loss_fn, max_grad_norm, data_parallel=False):
    """One optimizer step: gradients zeroed, (loss, extra) = loss_fn() backpropagated, averaged
    over the ranks of torch.distributed's default group when data_parallel (each rank's loss_fn
    covers its part of the step's batch), the gradient norm clipped to max_grad_norm, the optimizer
    stepped. Returns (loss, extra, grad_norm)."""
    import torch

    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss, extra = loss_fn()
    loss.backward()
    if data_parallel:
        import torch.distributed as dist

        for p in model.parameters():
            if p.grad is None:  # a parameter this rank's part did not reach still takes part
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= dist.get_world_size()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss, extra, grad_norm
