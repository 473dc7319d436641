"""A policy-gradient trainer for a Hugging Face causal LM, started by `arlo run` (trainer.launch:
command) and fed through the trainer bridge: batches in, new weights out with their Hugging Face
names (what vLLM and SGLang load). The training itself is arlo.hf_trainer's reference trainer; this
file is the loop around it: the bridge, the published versions, the metrics file.

    .venv/bin/python examples/hf_trainer/train.py --model DIR [--lr 1e-4] [--steps N]

Per step (arlo.hf_trainer, docs/loss.md): the SFT warm-up's cross-entropy on batches with
ce_weights, token-level policy gradient with truncated importance sampling between this trainer's
logprobs and the inference engine's (ratio capped at --is-high; --correction for the others),
normalised by the step's loss tokens; micro-batches of at most --max-tokens-per-micro-batch packed
tokens; gradient clipping; AdamW with a linear warm-up over --warmup-steps. With $ARLO_NUM_RANKS > 1
(arlo run sets it with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) the ranks train their part of each
step data parallel (FSDP2; gloo on CPU, nccl on GPU) and rank 0 publishes. The initial weights are
published as v0; every step's weights as that step's version, after the step is acknowledged.

Bad input (arlo.hf_trainer.HFTrainerError: a model directory that is not a causal LM's, a tokenizer
whose vocabulary the model cannot embed, a batch with token ids outside the vocabulary) ends the
trainer with exit code 2 and one line "trainer: error: <what and where>": arlo run does not restart
a trainer after exit code 2 (it would fail the same way) and stops the run quoting that line. The
batch was not acknowledged, so no step is lost: it is delivered again to a trainer started later.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

import torch

from arlo import trainer_support
from arlo.bridge import Bridge
from arlo.hf_trainer import HFTrainer, HFTrainerError, TrainerConfig
from arlo.loss import CORRECTIONS
from arlo.packing import samples_from_batch


def main(argv=None):
    defaults = trainer_support.arlo_defaults(os.environ)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory (config, safetensors)")
    ap.add_argument("--transport", default="dir", choices=["dir", "socket"])
    ap.add_argument("--run-dir")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--weight-sync", type=json.loads, help="the weight-sync block (arlo run: $ARLO_WEIGHT_SYNC)")
    ap.add_argument("--rank", type=int, default=int(os.environ.get("ARLO_RANK", "0")),
                    help="this rank (arlo run: $ARLO_RANK; with $ARLO_NUM_RANKS > 1 the ranks train data parallel)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--sft-lr", type=float, default=0.0, help="lr on the SFT warm-up batches (0: --lr)")
    ap.add_argument("--warmup-steps", type=int, default=0, help="linear lr warm-up over this many steps")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--correction", default="token_tis", choices=CORRECTIONS, help="off-policy correction")
    ap.add_argument("--is-low", type=float, default=0.0, help="bottom of the masked corrections' band")
    ap.add_argument("--is-high", type=float, default=2.0, help="cap of the importance ratio")
    ap.add_argument("--max-tokens-per-micro-batch", type=int, default=4096)
    ap.add_argument("--data-parallel", default="fsdp2", choices=["fsdp2", "ddp"], help="with more than one rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: until arlo run ends)")
    ap.add_argument("--checkpoint-dir", help="checkpoint every step here before acknowledging it; resume from it")
    ap.add_argument("--keep-checkpoints", type=int, default=2, help="how many of the newest checkpoints to keep")
    ap.add_argument("--metrics", help="append one JSON line per step to this file")
    ap.set_defaults(**defaults)
    args = ap.parse_args(argv)
    if args.weight_sync is None:
        ap.error("--weight-sync is required (arlo run passes it as $ARLO_WEIGHT_SYNC)")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if int(os.environ.get("ARLO_NUM_RANKS", "1")) > 1:  # arlo run set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", args.rank)) % torch.cuda.device_count())
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    trainer = HFTrainer(args.model, TrainerConfig(
        lr=args.lr, sft_lr=args.sft_lr, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm, correction=args.correction, is_low=args.is_low, is_high=args.is_high,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch, data_parallel=args.data_parallel))
    leader = trainer.rank == 0  # publishes and writes the metrics
    print(f"trainer: rank {trainer.rank} of {trainer.world_size}, {trainer.packing_mode} micro-batches "
          f"({trainer.packing_note}), bf16 {trainer.bf16}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    step, saved = trainer.load_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else (0, None)
    if step:
        print(f"trainer: resumed from {args.checkpoint_dir} at step {step}", flush=True)
        if leader and saved and args.metrics and step not in logged_steps(args.metrics):
            with open(args.metrics, "a") as f:  # killed between the checkpoint and the step's line
                f.write(json.dumps(saved["record"]) + "\n")
    bridge = Bridge(transport=args.transport, run_dir=args.run_dir, host=args.host, port=args.port, rank=args.rank,
                    start_after_step=step, weight_sync=args.weight_sync if leader else None)
    metrics = trainer_support.MetricsLog(args.metrics if leader else None)
    try:
        publish(bridge, trainer, step, first=True)  # v0, or the checkpoint's version (a restarted run waits for it)
        done = stop.is_set() or bool(args.steps and step >= args.steps)  # resumed at --steps already
        for batch in () if done else trainer_support.next_batches(bridge, None, stop):
            t0 = time.time()
            record = trainer.step(samples_from_batch(batch.tensors(torch=True)), split=False)
            step = batch.step
            record = {"step": step, **record, "time/step_seconds": time.time() - t0}
            if args.checkpoint_dir:  # durable before the ack: a kill after it never trains the step again
                trainer.save_checkpoint(args.checkpoint_dir, step, {"record": record}, keep=args.keep_checkpoints)
            bridge.ack(step)
            publish(bridge, trainer, step)
            metrics.write(record, echo=leader)
            if args.steps and step >= args.steps:
                break
    finally:
        bridge.close()
        metrics.close()
    print(f"trainer: stopped after step {step}", flush=True)
    return 0


def publish(bridge, trainer, version, first=False):
    """Every rank gathers (FSDP2 shards), rank 0 publishes."""
    state = trainer.published_state()
    if trainer.rank == 0:
        bridge.publish(version, state)
        if first:
            print(f"trainer: published v{version}", flush=True)


def logged_steps(path):
    """The steps the metrics file already has a line for."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {json.loads(line)["step"] for line in f if line.strip()}


def run(argv=None):
    """main(), with bad input as exit code 2 (a usage error: arlo run does not restart it) and one line."""
    try:
        return main(argv)
    except HFTrainerError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(run())
