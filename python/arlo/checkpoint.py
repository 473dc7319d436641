"""Checkpoint files for exactly-once training over the trainer bridge: one file per step,
<dir>/step-<k>.pt, written whole or not at all (a temporary file, fsync, rename, fsync of the
directory), the newest found by its name. A file cut short by a crash is only ever a
step-<k>.pt.tmp, which nothing reads. Used by arlo.hf_trainer (HFTrainer.save_checkpoint /
load_checkpoint); a trainer of one's own can use it for its own state:

    step = checkpoint.latest_step(ckpt_dir)                  # 0: none yet
    state = checkpoint.load(ckpt_dir, step) if step else None
    ...  train step k ...
    checkpoint.save(ckpt_dir, k, {"model": ..., "optimizer": ...})   # before bridge.ack(k)
    bridge.ack(k)

The order is what makes it exactly-once: a step is acknowledged only once its checkpoint is
durable, and a restarted trainer opens the bridge with start_after_step = latest_step(dir), so the
bridge acknowledges a step that was saved but not acknowledged, and hands out again the one that
was not saved.
"""

import os
import re
from typing import Any, Dict, List

import torch

__all__ = ["path", "steps", "latest_step", "save", "load"]

_NAME = re.compile(r"^step-(\d+)\.pt$")


def path(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{int(step)}.pt")


def steps(directory: str) -> List[int]:
    """The steps with a complete checkpoint in `directory`, ascending ([] when there is none or no
    directory); temporary files are not checkpoints."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(directory)) if m)


def latest_step(directory: str) -> int:
    """The newest complete checkpoint's step, 0 when there is none."""
    found = steps(directory)
    return found[-1] if found else 0


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(directory: str, step: int, state: Dict[str, Any], keep: int = 2) -> str:
    """Writes `state` (anything torch.save takes) as step `step`'s checkpoint, durably and atomically,
    then removes all but the newest `keep` checkpoints and any leftover temporary file. Returns the path."""
    os.makedirs(directory, exist_ok=True)
    final = path(directory, step)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for old in steps(directory)[:-keep] if keep > 0 else []:
        os.remove(path(directory, old))
    for name in os.listdir(directory):
        if name.endswith(".pt.tmp") and _NAME.match(name[:-4]):
            os.remove(os.path.join(directory, name))
    return final


def load(directory: str, step: int) -> Dict[str, Any]:
    """Step `step`'s checkpoint, on the host."""
    return torch.load(path(directory, step), map_location="cpu", weights_only=False)
