#!/usr/bin/env python3
"""A real PyTorch trainer for arlo's built-in small policy, fed through the trainer bridge.

It mirrors reference/model.h in plain PyTorch (same Hugging Face parameter names, shapes and
arithmetic: RMSNorm, rotary positions with the rotate-half convention, causal attention inside each
packed sample, SwiGLU MLP, untied lm_head), trains with a token-level policy-gradient loss with
truncated importance sampling against the inference logprobs (plus cross-entropy on tokens with
ce_weights), and publishes every new version through weight_sync so inference workers pick it up.

    python3 examples/pytorch_trainer/train.py --run-dir runs/x --transport dir \\
        --weight-sync '{"transport": "filesystem", "dir": "runs/x/weights"}'

Started by `arlo run` (trainer.launch: command, e.g. configs/pytorch-trainer.yaml), it takes its
defaults from the environment arlo gives it: the bridge (ARLO_BRIDGE_TRANSPORT, ARLO_BRIDGE_ADDRESS,
ARLO_RUN_DIR), the weight-sync block to publish with (ARLO_WEIGHT_SYNC, handed to the bridge as is),
the model shape and seed (ARLO_MODEL) and the threads (OMP_NUM_THREADS); its metrics go to
<run dir>/trainer_metrics.jsonl. Flags given on the command line win. It stops, exit status 0, when
arlo run ends (SIGTERM).

Exactly-once across restarts: with --checkpoint-dir the trainer saves (model, optimizer, step)
after every step *before* acknowledging it, and on start resumes from the checkpoint and tells the
bridge start_after_step, so a crash at any point trains each step once.
See docs/bring-your-own-trainer.md.
"""

import argparse
import json
import math
import os
import signal
import struct
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from arlo import trainer_support  # noqa: E402
from arlo.bridge import Bridge  # noqa: E402


# ----------------------------------------------------------------------------------------------
# The model (reference/model.h, in PyTorch).

class Policy(torch.nn.Module):
    def __init__(self, vocab=104, layers=2, hidden=64, heads=4, intermediate=256, rope_theta=10000.0, norm_eps=1e-5):
        super().__init__()
        self.cfg = dict(vocab=vocab, layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                        rope_theta=rope_theta, norm_eps=norm_eps)
        P = lambda *shape: torch.nn.Parameter(torch.empty(*shape))  # noqa: E731
        # Registered in reference/model.h's order under its names ("model.layers.0.self_attn.q_proj.weight").
        self.params = torch.nn.ParameterDict()
        self._names = []

        def add(name, *shape):
            self._names.append(name)
            self.params[name.replace(".", "__")] = P(*shape)

        add("model.embed_tokens.weight", vocab, hidden)
        for i in range(layers):
            p = f"model.layers.{i}."
            add(p + "input_layernorm.weight", hidden)
            for proj in ("q", "k", "v", "o"):
                add(p + f"self_attn.{proj}_proj.weight", hidden, hidden)
            add(p + "post_attention_layernorm.weight", hidden)
            add(p + "mlp.gate_proj.weight", intermediate, hidden)
            add(p + "mlp.up_proj.weight", intermediate, hidden)
            add(p + "mlp.down_proj.weight", hidden, intermediate)
        add("model.norm.weight", hidden)
        add("lm_head.weight", vocab, hidden)

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def hf_state_dict(self):
        """Parameters under their Hugging Face names, in the reference order."""
        return {name: self.p(name) for name in self._names}

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        out_scale = 1.0 / math.sqrt(2 * self.cfg["layers"])
        with torch.no_grad():
            for name in self._names:
                t = self.p(name)
                if name.endswith("norm.weight"):
                    t.fill_(1.0)
                else:
                    std = 0.02 * (out_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
                    t.normal_(0.0, std, generator=g)

    def load_safetensors(self, path):
        """Loads F32 parameters from a safetensors file (e.g. one arlo-trainer or weight_sync wrote)."""
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        with torch.no_grad():
            for name in self._names:
                info = header[name]
                if info["dtype"] != "F32":
                    raise ValueError(f"{path}: {name} is {info['dtype']}, expected F32")
                begin, end = info["data_offsets"]
                arr = np.frombuffer(data[begin:end], dtype=np.float32).reshape(info["shape"])
                self.p(name).copy_(torch.from_numpy(arr.copy()))

    @staticmethod
    def _rms_norm(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    @staticmethod
    def _rope(x, pos, theta):  # x: [B, T, heads, hd]; pos: [B, T]
        hd = x.shape[-1]
        inv_freq = torch.pow(torch.tensor(theta), torch.arange(0, hd // 2, dtype=torch.float32) * (-2.0 / hd))
        angles = pos.to(torch.float32).unsqueeze(-1) * inv_freq
        emb = torch.cat([angles, angles], -1).unsqueeze(2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

    def forward(self, input_ids, position_ids):
        """Logits [B, T, vocab]. Packed rows: a token attends to earlier tokens of its own sample
        (samples start where position_ids is 0)."""
        c = self.cfg
        B, T = input_ids.shape
        nh, hd = c["heads"], c["hidden"] // c["heads"]
        x = F.embedding(input_ids, self.p("model.embed_tokens.weight"))
        seg = torch.cumsum((position_ids == 0).to(torch.long), 1)
        allowed = (seg.unsqueeze(2) == seg.unsqueeze(1)) & torch.ones(T, T, dtype=torch.bool).tril()
        allowed = allowed.unsqueeze(1)
        for i in range(c["layers"]):
            p = f"model.layers.{i}."
            h = self._rms_norm(x, self.p(p + "input_layernorm.weight"), c["norm_eps"])
            q = self._rope(F.linear(h, self.p(p + "self_attn.q_proj.weight")).view(B, T, nh, hd), position_ids, c["rope_theta"])
            k = self._rope(F.linear(h, self.p(p + "self_attn.k_proj.weight")).view(B, T, nh, hd), position_ids, c["rope_theta"])
            v = F.linear(h, self.p(p + "self_attn.v_proj.weight")).view(B, T, nh, hd)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
            scores = scores.masked_fill(~allowed, float("-inf"))
            a = torch.matmul(torch.softmax(scores, -1), v)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, c["hidden"]), self.p(p + "self_attn.o_proj.weight"))
            h = self._rms_norm(x, self.p(p + "post_attention_layernorm.weight"), c["norm_eps"])
            x = x + F.linear(F.silu(F.linear(h, self.p(p + "mlp.gate_proj.weight"))) * F.linear(h, self.p(p + "mlp.up_proj.weight")),
                             self.p(p + "mlp.down_proj.weight"))
        x = self._rms_norm(x, self.p("model.norm.weight"), c["norm_eps"])
        return F.linear(x, self.p("lm_head.weight"))


# ----------------------------------------------------------------------------------------------
# The loss.

def token_logprobs(logits, input_ids):
    """log p(input_ids[t] | input_ids[<t]) for every t >= 1 (0 at t = 0): logits at t-1 predict t."""
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(lp, (1, 0))


def policy_loss(model, t, loss_tokens, is_high):
    """Token-level policy gradient with truncated importance sampling (ratio capped at is_high)
    between this trainer's policy and the logprobs the inference engine sampled with; tokens
    with ce_weights also get a weighted cross-entropy. Normalised by the step's loss tokens."""
    ids = t["input_ids"].long()
    pos = t["position_ids"].long()
    mask = t["loss_mask"].float()
    logp = token_logprobs(model(ids, pos), ids)
    inf_lp = t["inference_logprobs"].float()
    log_ratio = (logp.detach() - inf_lp) * mask
    ratio = torch.exp(log_ratio).clamp(max=is_high)
    pg = -(ratio * t["advantages"].float() * logp * mask).sum()
    ce = torch.zeros(())
    if "ce_weights" in t:
        ce = -(t["ce_weights"].float() * logp * mask).sum()
    denom = max(1.0, float(loss_tokens))
    # k3 estimator of KL(inference || trainer) on the sampled tokens: how far the two engines disagree.
    d = (inf_lp - logp.detach()) * mask
    mismatch_kl = ((torch.exp(-d) - 1 + d) * mask).sum() / denom
    return (pg + ce) / denom, {"mismatch_kl": float(mismatch_kl), "ce": float(ce) / denom,
                               "clipped_frac": float(((torch.exp(log_ratio) > is_high).float() * mask).sum() / denom)}


# ----------------------------------------------------------------------------------------------
# Started by arlo run (trainer.launch: command): defaults from the environment it gives.

def arlo_defaults(env):
    """argparse defaults from arlo run's environment ({} when not run by arlo): the bridge and
    weight-sync ones of arlo.trainer_support, plus the model shape and seed ($ARLO_MODEL) and threads."""
    d = trainer_support.arlo_defaults(env)
    if not d:
        return d
    if env.get("ARLO_MODEL"):
        model = json.loads(env["ARLO_MODEL"])
        d.update({k: int(model[k]) for k in ("layers", "hidden", "heads", "seed") if k in model})
    if env.get("OMP_NUM_THREADS", "").isdigit():
        d["threads"] = int(env["OMP_NUM_THREADS"])
    d["log_every"] = 50
    return d


def main(argv=None):
    defaults = arlo_defaults(os.environ)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="dir", choices=["dir", "socket"])
    ap.add_argument("--run-dir", help="dir transport: the orchestrator's run directory")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="socket transport: the orchestrator's bridge port")
    ap.add_argument("--rank", type=int, default=int(os.environ.get("ARLO_RANK", "0")),
                    help="this rank (arlo run: $ARLO_RANK); with $ARLO_NUM_RANKS > 1 the ranks average their "
                    "gradients over torch.distributed (gloo, env:// rendezvous) and rank 0 publishes")
    ap.add_argument("--weight-sync", type=json.loads,
                    help="the weight-sync block as JSON (docs/weight-sync.md), e.g. '{\"transport\": \"tcp\", "
                    "\"address\": \"0.0.0.0:0\", \"expected_receivers\": 2}'; run by arlo: $ARLO_WEIGHT_SYNC; "
                    "else filesystem under <run-dir>/weights")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--init-weights", help="safetensors file to start from (else a seeded init)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--sft-lr", type=float, default=0.0, help="learning rate on batches with ce_weights (0: --lr)")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    ap.add_argument("--beta2", type=float, default=0.999, help="AdamW beta2")
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--is-high", type=float, default=None,
                    help="truncated importance sampling cap (the config's trainer.is_high; default 2.0)")
    ap.add_argument("--is-cap", type=float, default=None, help=argparse.SUPPRESS)  # old name of --is-high
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: run until idle)")
    ap.add_argument("--idle-timeout", type=float, default=None, help="stop after this many seconds without a batch")
    ap.add_argument("--checkpoint-dir", help="save model+optimizer after every step; resume from it")
    ap.add_argument("--metrics", help="append one JSON line per step to this file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=1, help="print every this many steps' record (0: none)")
    ap.set_defaults(**defaults)
    args = ap.parse_args(argv)
    if args.is_cap is not None:
        if args.is_high is not None and args.is_high != args.is_cap:
            ap.error(f"--is-cap {args.is_cap} and --is-high {args.is_high} both set --is-high: give --is-high once")
        print("train.py: --is-cap is deprecated and goes in the next release: use --is-high "
              "(named as the config's trainer.is_high)", file=sys.stderr, flush=True)
        args.is_high = args.is_cap
    if args.is_high is None:
        args.is_high = 2.0

    # arlo run ends its trainer with SIGTERM: finish the step in progress, close the bridge, exit 0.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data_parallel = int(os.environ.get("ARLO_NUM_RANKS", "1")) > 1
    if data_parallel:  # arlo run set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        import torch.distributed as dist

        dist.init_process_group("gloo")
    leader = args.rank == 0  # publishes, checkpoints and writes the metrics
    model = Policy(layers=args.layers, hidden=args.hidden, heads=args.heads, intermediate=args.intermediate)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), weight_decay=args.weight_decay)
    step = 0
    ckpt = os.path.join(args.checkpoint_dir, "checkpoint.pt") if args.checkpoint_dir else None
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        print(f"resumed from {ckpt} at step {step}", flush=True)
    elif args.init_weights:
        model.load_safetensors(args.init_weights)
    else:
        model.init_weights(args.seed)

    # The block goes to the bridge unchanged: it is the weight_sync library's own form.
    ws = args.weight_sync
    if ws is None:
        if not args.run_dir:
            ap.error("--weight-sync is required without --run-dir (or ARLO_WEIGHT_SYNC)")
        ws = {"transport": "filesystem", "dir": os.path.join(args.run_dir, "weights")}
    bridge = Bridge(transport=args.transport, run_dir=args.run_dir, host=args.host, port=args.port, rank=args.rank,
                    start_after_step=step, weight_sync=ws if leader else None)
    metrics = trainer_support.MetricsLog(args.metrics if leader else None)
    try:
        # v0 at start; after a restart, the version of the checkpoint (the workers may not hold it,
        # and a resumed orchestrator waits for it before the first rollout).
        if leader:
            bridge.publish(step, model.hf_state_dict())
            print(f"published v{step}", flush=True)
        for batch in trainer_support.next_batches(bridge, args.idle_timeout, stop):
            t0 = time.time()
            t = batch.tensors(torch=True)
            loss_tokens = batch.meta_int("step_loss_tokens") / batch.num_ranks
            for group in opt.param_groups:
                group["lr"] = args.sft_lr if "ce_weights" in t and args.sft_lr > 0 else args.lr
            loss, extra, grad_norm = trainer_support.train_step(
                model, opt, lambda: policy_loss(model, t, loss_tokens, args.is_high), args.max_grad_norm,
                data_parallel)
            step = batch.step
            if ckpt and leader:  # durable before the ack, so a crash after this line never trains the step again
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            bridge.ack(step)
            if leader:
                bridge.publish(step, model.hf_state_dict())
            record = {"step": step, "loss": float(loss), "grad_norm": float(grad_norm),
                      "mismatch_kl": extra["mismatch_kl"], "clipped_frac": extra["clipped_frac"],
                      "samples": batch.meta_int("samples"), "loss_tokens": batch.meta_int("loss_tokens"),
                      "policy_version_mean": float(batch.metadata["policy_version_mean"]),
                      "time/step_seconds": time.time() - t0}
            record["num_ranks"] = batch.num_ranks
            metrics.write(record, echo=bool(leader and args.log_every and step % args.log_every == 0))
            if args.steps and step >= args.steps:
                break
    finally:
        bridge.close()
        metrics.close()
    if stop.is_set():
        why = "SIGTERM (arlo run ended)"
    else:
        why = "--steps reached" if args.steps and step >= args.steps else "no batch within --idle-timeout"
    print(f"trainer: stopped after step {step}: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
