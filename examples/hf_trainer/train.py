"""A policy-gradient trainer for a Hugging Face causal LM, started by `arlo run` (trainer.launch:
command) and fed through the trainer bridge: batches in, new weights out with their Hugging Face
names (what vLLM and SGLang load). Small and CPU-first: it trains the tiny model of
scripts/make-tiny-model in the real-vLLM test; a GPU trainer for real models is the same loop.

    .venv/bin/python examples/hf_trainer/train.py --model DIR [--lr 1e-4] [--steps N]

Per step: token-level policy gradient with truncated importance sampling between this trainer's
logprobs and the inference engine's (ratio capped at --is-high; arlo.loss, docs/loss.md), normalised by the step's loss
tokens; gradient clipping; AdamW. The packed rows of a batch are unpacked into their samples
(seq_lens), padded and run as one batch, so no sample attends to another. The initial weights are
published as v0; every step's weights as that step's version, after the step is acknowledged.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

import torch

from arlo import loss as arlo_loss
from arlo import trainer_support
from arlo.bridge import Bridge


def samples_of(t):
    """The batch's samples: (ids, loss_mask, advantages, inference_logprobs) per packed segment."""
    out = []
    rows = t["input_ids"].shape[0]
    for r in range(rows):
        start = 0
        for n in t["seq_lens"][r].tolist():
            if n <= 0:
                break
            sl = slice(start, start + n)
            out.append((t["input_ids"][r, sl].long(), t["loss_mask"][r, sl].float(), t["advantages"][r, sl].float(),
                        t["inference_logprobs"][r, sl].float()))
            start += n
    return out


def policy_loss(model, t, loss_tokens, is_high):
    samples = samples_of(t)
    n = max(len(s[0]) for s in samples)
    pad = lambda x, v: torch.nn.functional.pad(x, (0, n - len(x)), value=v)  # noqa: E731
    ids = torch.stack([pad(s[0], 0) for s in samples])
    attn = torch.stack([pad(torch.ones(len(s[0]), dtype=torch.long), 0) for s in samples])
    mask, adv, inf_lp = (torch.stack([pad(s[k], 0.0) for s in samples]) for k in (1, 2, 3))
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    # The logprob of token t comes from the logits at t - 1 (position 0 is never in the loss).
    logp = torch.zeros_like(mask)
    logp[:, 1:] = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    loss, metrics = arlo_loss.policy_gradient_loss(logp, inf_lp, adv, mask, correction="token_tis", is_high=is_high,
                                                   normalizer=max(1.0, float(loss_tokens)),
                                                   logits=torch.nn.functional.pad(logits[:, :-1], (0, 0, 1, 0)))
    return loss, {**metrics, "samples": len(samples)}


def published_state(model):
    """The state dict under the checkpoint's names: a tied LM head is not a tensor of its own."""
    sd = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    return {k: v.detach().contiguous() for k, v in sd.items()}


def main(argv=None):
    defaults = trainer_support.arlo_defaults(os.environ)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory (config, safetensors)")
    ap.add_argument("--transport", default="dir", choices=["dir", "socket"])
    ap.add_argument("--run-dir")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--weight-sync", type=json.loads, help="the weight-sync block (arlo run: $ARLO_WEIGHT_SYNC)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--is-high", type=float, default=2.0, help="cap of the importance ratio")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: until arlo run ends)")
    ap.add_argument("--metrics", help="append one JSON line per step to this file")
    ap.set_defaults(**defaults)
    args = ap.parse_args(argv)
    if args.weight_sync is None:
        ap.error("--weight-sync is required (arlo run passes it as $ARLO_WEIGHT_SYNC)")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    bridge = Bridge(transport=args.transport, run_dir=args.run_dir, host=args.host, port=args.port,
                    weight_sync=args.weight_sync)
    metrics = trainer_support.MetricsLog(args.metrics)
    step = 0
    try:
        bridge.publish(0, published_state(model))
        print("trainer: published v0", flush=True)
        for batch in trainer_support.next_batches(bridge, None, stop):
            t0 = time.time()
            t = batch.tensors(torch=True)
            loss_tokens = batch.meta_int("step_loss_tokens") / batch.num_ranks
            loss, extra, grad_norm = trainer_support.train_step(
                model, opt, lambda: policy_loss(model, t, loss_tokens, args.is_high), args.max_grad_norm)
            step = batch.step
            bridge.ack(step)
            bridge.publish(step, published_state(model))
            record = {"step": step, "loss": float(loss.detach()), "grad_norm": float(grad_norm), **extra,
                      "time/step_seconds": time.time() - t0}
            metrics.write(record, echo=True)
            if args.steps and step >= args.steps:
                break
    finally:
        bridge.close()
        metrics.close()
    print(f"trainer: stopped after step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
