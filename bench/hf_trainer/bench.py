"""The reference trainer's overhead (arlo.hf_trainer), on a tiny random-weights Qwen3 written here
(arlo_tiny_model; nothing downloaded), CPU, a few seconds. Run by `make bench` (scripts/bench) with
the project's .venv python:

    .venv/bin/python bench/hf_trainer/bench.py [--steps 12] [--threads 1] [--hidden 128]

1. Seconds per step of HFTrainer.step against a plain torch loop doing the same work on the same
   batches: the same model from the same directory, the same micro-batch rows (packed with
   position ids and a block-diagonal mask, built once before the clock starts), forward, token
   logprobs, truncated-IS policy-gradient loss, backward, gradient clipping, AdamW. The two
   alternate step by step in one process, so a machine busy with other work slows both alike; the
   figure is the median. HFTrainer's extra: the batch checks, packing each step, the metrics
   (mismatch KL, clipped/masked fractions, entropy), the lr schedule. Printed: the throughput
   ratio plain/HFTrainer time (target >= 0.9).
2. From optimizer.step() returning to the version published: HFTrainer.published_state() (the
   full state dict on the host) and arlo.bridge publish, through a filesystem weight-sync block
   (waited for until the version is announced) and through tcp (until a Receiver in this process
   holds it, checksums verified), against a memcpy of the same weights (copy_ into buffers
   allocated beforehand). Printed: the times and their ratio.
"""

import argparse
import os
import queue
import socket
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import arlo_tiny_model  # noqa: E402
from arlo.hf_trainer import HFTrainer, TrainerConfig  # noqa: E402
from arlo.packing import Sample, build_micro_batch, pack_micro_batches  # noqa: E402


def make_batches(steps, per_step, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        batch = []
        for i in range(per_step):
            n = int(torch.randint(24, 96, (1,), generator=g))
            mask = torch.zeros(n)
            mask[8:] = 1.0
            inf = -(0.5 + 2.5 * torch.rand(n, generator=g)) * mask
            batch.append(Sample(torch.randint(0, vocab, (n,), generator=g), mask, mask * (1.0 if i % 2 else -1.0),
                                inf, None, i))
        out.append(batch)
    return out


class PlainLoop:
    """The same forward/backward/AdamW without the trainer: rows prepared before the clock starts."""

    def __init__(self, model, cfg, batches, packed, additive):
        self.model, self.cfg = model, cfg
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                     weight_decay=cfg.weight_decay)
        self.steps = []
        for samples in batches:
            rows = []
            for group in pack_micro_batches(samples, cfg.max_tokens_per_micro_batch):
                mb = build_micro_batch(group, packed=packed, additive=additive)
                cols = {k: mb.columns(k) for k in ("loss_mask", "advantages", "inference_logprobs")}
                rows.append((mb, cols))
            tokens = sum(s.loss_tokens() for s in samples)
            self.steps.append((rows, max(1, tokens)))

    def step(self, i):
        rows, tokens = self.steps[i]
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        for mb, cols in rows:
            logits = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids,
                                attention_mask=mb.attention_mask).logits.float()
            flat = torch.zeros(mb.input_ids.shape)
            flat[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]
            logp = flat.reshape(-1)[mb.index] * mb.valid
            mask = (cols["loss_mask"] != 0).float()
            mask[:, 0] = 0.0
            ratio = torch.exp(logp.detach() - cols["inference_logprobs"]).clamp(max=self.cfg.is_high)
            loss = -(ratio * cols["advantages"] * logp * mask).sum() / tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.opt.step()


def bench_steps(model_dir, cfg, batches, warmup):
    """(trainer, HFTrainer's step times, the plain loop's), the warm-up steps left out. The two take
    turns going first (ABBA), so neither is always the one that runs on a warm cache."""
    trainer = HFTrainer(model_dir, cfg)
    plain = PlainLoop(HFTrainer(model_dir, cfg).module, cfg, batches, trainer.packing_mode == "packed",
                      trainer.additive_mask)
    times = {"hf": [], "plain": []}
    runs = {"hf": lambda i: trainer.step(batches[i]), "plain": plain.step}
    for i in range(len(batches)):
        for name in (("hf", "plain") if i % 2 == 0 else ("plain", "hf")):
            t0 = time.perf_counter()
            runs[name](i)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return trainer, times["hf"], times["plain"]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_publish(trainer, repeats, transport):
    """Medians of (optimizer.step() -> version published, the full state dict's share, a memcpy of the
    weights) and the bytes. filesystem: published is the bridge's publish returning (waited for);
    tcp: a Receiver on a thread of this process holding the version, every bucket verified."""
    from arlo.bridge import Bridge, Receiver

    with tempfile.TemporaryDirectory() as run_dir:
        if transport == "tcp":
            address = f"127.0.0.1:{free_port()}"
            ws = {"transport": "tcp", "address": address, "expected_receivers": 1}
        else:
            ws = {"transport": "filesystem", "dir": os.path.join(run_dir, "weights")}
        received = queue.Queue()

        def receive():
            with Receiver({"transport": "tcp", "address": address}) as rx:
                for _ in range(repeats):
                    received.put(rx.receive(timeout_s=60))

        publish_t, gather_t, memcpy_t = [], [], []
        with Bridge(transport="dir", run_dir=run_dir, weight_sync=ws) as bridge:
            receiver = threading.Thread(target=receive) if transport == "tcp" else None
            if receiver:
                receiver.start()
            for version in range(1, repeats + 1):
                t0 = time.perf_counter()
                state = trainer.published_state()
                gather_t.append(time.perf_counter() - t0)
                bridge.publish(version, state, timeout_s=60)
                if receiver and received.get(timeout=60) != version:
                    raise RuntimeError(f"tcp receiver did not get version {version}")
                publish_t.append(time.perf_counter() - t0)
                buffers = {k: torch.empty_like(v) for k, v in state.items()}
                t0 = time.perf_counter()
                for k, v in state.items():
                    buffers[k].copy_(v)
                memcpy_t.append(time.perf_counter() - t0)
            if receiver:
                receiver.join()
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
    return statistics.median(publish_t), statistics.median(gather_t), statistics.median(memcpy_t), nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps (after --warmup more)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--samples", type=int, default=16, help="samples per step (24..95 tokens each)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--publishes", type=int, default=5)
    args, _ = ap.parse_known_args()  # make bench passes its own arguments to every bench
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "tiny")
        arlo_tiny_model.write(model_dir, seed=0, layers=args.layers, hidden=args.hidden,
                              intermediate=2 * args.hidden)
        cfg = TrainerConfig(lr=1e-4, max_tokens_per_micro_batch=512, device="cpu")
        probe = HFTrainer(model_dir, cfg)
        batches = make_batches(args.warmup + args.steps, args.samples, probe.vocab_size)
        params = sum(p.numel() for p in probe.module.parameters())
        del probe
        trainer, hf_t, plain_t = bench_steps(model_dir, cfg, batches, args.warmup)
        hf_s, plain_s = statistics.median(hf_t), statistics.median(plain_t)
        tokens = statistics.mean(sum(len(s) for s in b) for b in batches)
        print(f"model: tiny Qwen3, {args.layers} layers, hidden {args.hidden}, {params / 1e6:.2f} M parameters; "
              f"{args.samples} samples / {tokens:.0f} tokens per step, {trainer.packing_mode} micro-batches of "
              f"<= {cfg.max_tokens_per_micro_batch} tokens, {args.threads} thread(s), median of {args.steps} steps")
        ratios = [p / h for p, h in zip(plain_t, hf_t)]  # the same batch, back to back
        print(f"step: HFTrainer {hf_s * 1e3:.1f} ms, plain torch loop {plain_s * 1e3:.1f} ms (medians)")
        print(f"HFTrainer throughput: {statistics.median(ratios):.3f}x of the plain loop's (median over steps of plain/"
              f"HFTrainer on the same batch; all steps together {sum(plain_t) / sum(hf_t):.3f}x); target >= 0.9")
        for transport in ("filesystem", "tcp"):
            pub_s, gather_s, copy_s, nbytes = bench_publish(trainer, args.publishes, transport)
            print(f"publish ({transport}): optimizer.step() -> version published {pub_s * 1e3:.2f} ms (the full state "
                  f"dict {gather_s * 1e3:.2f} ms of it; {nbytes / 1e6:.1f} MB); memcpy of the weights "
                  f"{copy_s * 1e3:.3f} ms; ratio {pub_s / copy_s:.1f}x (medians of {args.publishes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
