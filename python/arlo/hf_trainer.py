"""The reference RL trainer for any Hugging Face causal LM (AutoModelForCausalLM from a local
directory), data parallel over torch.distributed. examples/hf_trainer/train.py feeds it from the
trainer bridge; a script can call it directly:

    from arlo.hf_trainer import HFTrainer, TrainerConfig
    from arlo.packing import samples_from_batch
    trainer = HFTrainer("runs/tiny", TrainerConfig(lr=1e-4, warmup_steps=10))
    metrics = trainer.step(samples_from_batch(batch.tensors()), split=False)   # one optimizer step
    bridge.publish(batch.step, trainer.published_state())                      # rank 0's copy

One step: AdamW with the lr of a linear warm-up (then constant or cosine), on batches that carry
ce_weights (the SFT warm-up steps) the cross-entropy on the answer tokens the built-in trainer has
(ce = -sum c_t log p_t / sum c_t over the step), on every batch the policy-gradient loss of
arlo.loss (pg = -sum w_t A_t log p_t / loss tokens of the step), loss = pg + ce_coef * ce; gradient
clipping (the pre-clip norm is reported); bf16 autocast where the device has it (CUDA with bf16;
off on CPU unless asked for).

Micro-batches: the step's samples (this rank's share) are packed first-fit decreasing into rows of
at most max_tokens_per_micro_batch tokens (arlo.packing), position ids restarting at every sample,
and a 4-D block-diagonal causal attention mask so no sample attends to another: a bool mask for the
sdpa attention, an additive float mask for eager (eager ignores a bool one's meaning: measured on
transformers 5.19). At start the trainer checks on two short samples that a packed row gives the
logits the samples give alone; a model that refuses the 4-D mask, or ignores it (flash-attention
kernels do), runs unpacked instead: one right-padded row per sample (`packing_mode` says which, and
`packing_note` why). Gradients accumulate over the micro-batches; both terms are normalized by the
whole step's counts (summed over ranks), so neither the micro-batch split nor the number of ranks
changes the update.

Data parallel: N ranks of one torch.distributed group (init_distributed; gloo on CPU, nccl on GPU).
FSDP2 (torch.distributed.fsdp.fully_shard per decoder layer and the root) is the default, on GPUs and
on CPUs: with torch 2.13 it runs over gloo on CPU (forward, backward, clip_grad_norm_ over DTensor
gradients, AdamW), and the tests train 2 CPU ranks with it. DDP remains as data_parallel="ddp".
Either averages gradients over ranks; the loss is scaled by the world size so the sum comes out.
`step(samples)` takes the whole step's batch and trains this rank's share (split_for_ranks: balanced
by tokens, deterministic); `step(samples, split=False)` takes a share the bridge already split.
Ranks with fewer micro-batches run empty ones, so every rank enters the same collectives.

Checkpoints (save_checkpoint / load_checkpoint, collective): the model and the AdamW state as full
state dicts under the checkpoint's names (torch.distributed.checkpoint.state_dict with
full_state_dict: FSDP2 shards and DDP's wrapper come out the same, so a checkpoint of any of the
three layouts loads into any other), the optimizer steps taken (the lr schedule's position), every
rank's RNG state and the bridge step; rank 0 writes <dir>/step-<k>.pt atomically (arlo.checkpoint).
On load rank 0 picks the newest complete file and every rank loads that one (the directory must be
visible to every rank: one host, or a shared filesystem).

Bad input fails with HFTrainerError (a ValueError) naming what and where: a model directory that is
not a causal LM, a tokenizer with more tokens than the model's input embedding, a batch token id
outside the vocabulary (sample index, sample_id and position; raised on every rank).
"""

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from arlo import checkpoint
from arlo import loss as arlo_loss
from arlo.packing import BatchError, Sample, build_micro_batch, check_token_ids, pack_micro_batches, split_for_ranks

__all__ = ["HFTrainer", "TrainerConfig", "HFTrainerError", "lr_multiplier", "load_causal_lm", "init_distributed"]


class HFTrainerError(ValueError):
    """A model, tokenizer or batch the trainer cannot use; the message names what and where."""


@dataclass
class TrainerConfig:
    lr: float = 1e-4
    sft_lr: float = 0.0                # lr on batches with ce_weights (the SFT warm-up); 0: lr
    weight_decay: float = 0.0
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0              # linear warm-up: lr * min(1, step / warmup_steps), step from 1
    schedule: str = "constant"         # after the warm-up: "constant" or "cosine"
    total_steps: int = 0               # cosine: the step where it reaches min_lr_ratio * lr
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    max_tokens_per_micro_batch: int = 4096
    correction: str = "token_tis"      # arlo.loss.CORRECTIONS
    is_low: float = 0.0
    is_high: float = 2.0
    band: Optional[Tuple[float, float]] = None
    geometric_band: Optional[Tuple[float, float]] = None
    max_kl: Optional[float] = None
    ce_coef: float = 1.0
    bf16: Optional[bool] = None        # None: on where the device has it (CUDA with bf16)
    packing: str = "auto"              # "auto" (checked at start), "packed" or "unpacked"
    data_parallel: str = "fsdp2"       # with more than one rank: "fsdp2" or "ddp"
    attn_implementation: Optional[str] = None  # passed to from_pretrained (None: the model's default)
    device: Optional[str] = None       # None: cuda:<current> when CUDA is there, else cpu
    tokenizer_dir: Optional[str] = None  # None: the model directory (checked when it has a tokenizer)


def lr_multiplier(step: int, warmup_steps: int, schedule: str = "constant", total_steps: int = 0,
                  min_lr_ratio: float = 0.0) -> float:
    """The lr factor of optimizer step `step` (counted from 1): step / warmup_steps during the warm-up,
    then 1 (constant), or cosine from 1 down to min_lr_ratio at total_steps (and there after)."""
    if warmup_steps > 0 and step < warmup_steps:
        return max(step, 0) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"lr schedule '{schedule}': one of constant, cosine")
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _causal_lm_config(model_dir: str):
    """The directory's config, or HFTrainerError when it is not a causal LM's."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not os.path.isdir(model_dir):
        raise HFTrainerError(f"model directory {model_dir}: not a directory")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise HFTrainerError(f"model directory {model_dir}: no config.json; a Hugging Face model directory holds "
                             "config.json and the weights (save_pretrained writes both)")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as e:
        raise HFTrainerError(f"model directory {model_dir}: config.json is not a model config transformers "
                             f"knows: {e}") from e
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise HFTrainerError(f"model directory {model_dir}: config.json has model_type '{config.model_type}' "
                             f"({type(config).__name__}), which is not a causal LM: AutoModelForCausalLM has no "
                             "class for it. The trainer needs a decoder-only language model (Llama, Qwen, ...)")
    return config


def _check_tokenizer(model, model_dir: str, tokenizer_dir: Optional[str]) -> None:
    """HFTrainerError when the tokenizer has more tokens than the model's input embedding has rows
    (fewer is fine: checkpoints pad their embedding). Nothing to check without tokenizer files."""
    where = tokenizer_dir or model_dir
    if not any(os.path.isfile(os.path.join(where, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(where)
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise HFTrainerError(
            f"tokenizer of {where}: {len(tok)} tokens ({tok.vocab_size} in its vocabulary + "
            f"{len(tok) - tok.vocab_size} added), but the model of {model_dir} embeds only {rows} "
            f"(config vocab_size {model.config.vocab_size}): "
            f"token ids {rows}..{len(tok) - 1} have no embedding. Use the model's own tokenizer, or resize the "
            "embedding (model.resize_token_embeddings) and save the model again")


def load_causal_lm(model_dir: str, tokenizer_dir: Optional[str] = None, attn_implementation: Optional[str] = None):
    """AutoModelForCausalLM from a local directory in float32 (the master weights; bf16 comes from
    autocast), after checking that it is a causal LM and that its tokenizer fits its embedding."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    _causal_lm_config(model_dir)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True, **kwargs)
    except (ValueError, OSError) as e:
        raise HFTrainerError(f"model directory {model_dir}: AutoModelForCausalLM cannot load it: {e}") from e
    _check_tokenizer(model, model_dir, tokenizer_dir)
    return model


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
                     backend: Optional[str] = None) -> None:
    """Joins the process group of world_size ranks (nccl when CUDA is there, else gloo; tcp
    rendezvous at master_addr:master_port); on CUDA, this rank uses GPU rank % device_count."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size)


def _probe_samples(vocab: int) -> List[Sample]:
    out = []
    for k, n in enumerate((5, 3)):
        ids = (torch.arange(n) * 7 + 3 + k) % vocab
        zeros = torch.zeros(n)
        out.append(Sample(ids, zeros, zeros, zeros, None, k))
    return out


class HFTrainer:
    """See the module docstring. Collective calls (step, backward, full_state_dict) must be made by
    every rank in the same order."""

    def __init__(self, model_dir: str, config: Optional[TrainerConfig] = None):
        self.cfg = config or TrainerConfig()
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world_size > 1 else 0
        if self.cfg.device:
            self.device = torch.device(self.cfg.device)
        elif torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        has_bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.bf16 = has_bf16 if self.cfg.bf16 is None else bool(self.cfg.bf16)
        self.module = load_causal_lm(model_dir, self.cfg.tokenizer_dir, self.cfg.attn_implementation).to(self.device)
        self.vocab_size = self.module.get_input_embeddings().num_embeddings
        self.pad_id = self.module.config.pad_token_id or 0
        self.additive_mask = getattr(self.module.config, "_attn_implementation", "sdpa") != "sdpa"
        self.packing_mode, self.packing_note = self._choose_packing()
        self.model = self._wrap(self.module)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, betas=self.cfg.betas,
                                           eps=self.cfg.eps, weight_decay=self.cfg.weight_decay)
        self.steps_done = 0  # optimizer steps taken (set it when resuming: the lr schedule counts from it)

    # -- set-up -----------------------------------------------------------------------------------
    def _autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _forward(self, mb):
        with self._autocast():
            return self.model(input_ids=mb.input_ids.to(self.device), position_ids=mb.position_ids.to(self.device),
                              attention_mask=mb.attention_mask.to(self.device)).logits.float()

    def _choose_packing(self) -> Tuple[str, str]:
        """("packed" | "unpacked", why): packed when the model's logits on a packed row match the samples'
        own (the attention respects the 4-D mask), unless the config fixes the mode."""
        if self.cfg.packing in ("packed", "unpacked"):
            return self.cfg.packing, "set by the config"
        if self.cfg.packing != "auto":
            raise HFTrainerError(f"packing '{self.cfg.packing}': one of auto, packed, unpacked")
        samples = _probe_samples(self.vocab_size)
        self.model = self.module
        with torch.no_grad():
            alone = self._forward(build_micro_batch(samples, packed=False, pad_id=self.pad_id))
            try:
                packed = self._forward(build_micro_batch(samples, packed=True, additive=self.additive_mask))
            except Exception as e:  # noqa: BLE001 - any refusal of the 4-D mask means unpacked
                return "unpacked", f"the model refused a 4-D attention mask: {type(e).__name__}: {e}"
        diff = max(float((packed[0, 5 * k:5 * k + n] - alone[k, :n]).abs().max()) for k, n in ((0, 5), (1, 3)))
        # Relative to the logits' scale: bf16 kernels differ with the shape; a leak across samples is of
        # the order of the logits themselves.
        tolerance = (0.03 if self.bf16 else 1e-3) * max(1.0, float(alone.abs().max()))
        if diff > tolerance:
            return "unpacked", f"a packed row's logits differ from the samples' own by {diff:.3g} (mask ignored)"
        return "packed", f"packed logits match the samples' own (max difference {diff:.2g})"

    def _wrap(self, module):
        if self.world_size == 1:
            return module
        if self.cfg.data_parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(module, device_ids=ids)
        if self.cfg.data_parallel != "fsdp2":
            raise HFTrainerError(f"data_parallel '{self.cfg.data_parallel}': one of fsdp2, ddp")
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(module):
            fully_shard(layer)
        fully_shard(module)
        return module

    # -- one step ---------------------------------------------------------------------------------
    def _all_reduce(self, values: Sequence[float], op=None) -> List[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
        return t.tolist()

    def _local_samples(self, samples: Sequence[Sample], split: bool) -> List[Sample]:
        """This rank's share, after the token-id check (every rank raises when any rank's share is bad)."""
        where = "batch" if split or self.world_size == 1 else f"batch of rank {self.rank}"
        if split:
            check_token_ids(samples, self.vocab_size, where)
            return split_for_ranks(samples, self.world_size)[self.rank]
        message = ""
        try:
            check_token_ids(samples, self.vocab_size, where)
        except BatchError as e:
            message = str(e)
        bad = self._all_reduce([1.0 if message else 0.0])[0]
        if bad:
            raise HFTrainerError(message or f"{int(bad)} other rank(s) have token ids outside the vocabulary "
                                 f"[0, {self.vocab_size}) in their batch (see their error)")
        return list(samples)

    def _sync_context(self, last: bool):
        """Gradient all-reduce / reduce-scatter only on the step's last micro-batch."""
        if self.world_size == 1:
            return contextlib.nullcontext()
        if self.cfg.data_parallel == "ddp":
            return contextlib.nullcontext() if last else self.model.no_sync()
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def backward(self, samples: Sequence[Sample], split: bool = True) -> Dict[str, float]:
        """Zeroes the gradients and accumulates the step's (the update direction, before clipping and
        the optimizer) over this rank's micro-batches; returns the step's metrics summed over ranks."""
        try:
            local = self._local_samples(samples, split)
        except BatchError as e:
            raise HFTrainerError(str(e)) from e
        groups = pack_micro_batches(local, self.cfg.max_tokens_per_micro_batch)
        loss_tokens, ce_sum = self._all_reduce([sum(s.loss_tokens() for s in local), sum(s.ce_sum() for s in local)])
        n_micro = int(self._all_reduce([len(groups)], dist.ReduceOp.MAX if self.world_size > 1 else None)[0])
        groups += [[]] * (n_micro - len(groups))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(len(_SUMS), dtype=torch.float64)
        for i, group in enumerate(groups):
            mb = build_micro_batch(group, packed=self.packing_mode == "packed", additive=self.additive_mask,
                                   pad_id=self.pad_id)
            with self._sync_context(i == n_micro - 1):
                loss, part = self._micro_loss(mb, loss_tokens, ce_sum)
                (loss * self.world_size).backward()
            sums += part
        total = dict(zip(_SUMS, self._all_reduce(sums.tolist())))
        tokens = max(1.0, total["loss_tokens"])
        return {"loss": total["pg_loss"] + self.cfg.ce_coef * total["ce_loss"], "pg_loss": total["pg_loss"],
                "ce_loss": total["ce_loss"], "mismatch_kl": total["kl_sum"] / tokens,
                "clipped_frac": total["clipped_sum"] / tokens, "masked_frac": total["masked_sum"] / tokens,
                "entropy": total["entropy_sum"] / tokens, "loss_tokens": total["loss_tokens"],
                "samples": total["samples"], "tokens": total["tokens"], "micro_batches": n_micro,
                "sft": ce_sum > 0}

    def _micro_loss(self, mb, loss_tokens: float, ce_sum: float):
        """(this micro-batch's share of the step's loss, its metric sums in _SUMS order)."""
        logits = self._forward(mb)
        if not mb.samples:  # an empty micro-batch: in the graph, zero gradient
            return logits.sum() * 0.0, torch.zeros(len(_SUMS), dtype=torch.float64)
        ids = mb.input_ids.to(self.device)
        logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
        flat = torch.zeros(ids.shape, device=self.device)
        flat[:, 1:] = logp_all.gather(-1, ids[:, 1:, None])[..., 0]
        ent = torch.zeros(ids.shape, device=self.device)
        ent[:, 1:] = -(logp_all.detach().exp() * logp_all.detach()).sum(-1)
        index, valid = mb.index.to(self.device), mb.valid.to(self.device)
        predicted = valid.clone()
        predicted[:, 0] = 0.0  # a sample's first token has no prediction
        logp = flat.reshape(-1)[index] * valid
        col = {k: mb.columns(k).to(self.device) for k in ("loss_mask", "advantages", "inference_logprobs")}
        mask = (col["loss_mask"] != 0).float() * predicted
        c = self.cfg
        pg, m = arlo_loss.policy_gradient_loss(logp, col["inference_logprobs"], col["advantages"], mask,
                                               correction=c.correction, is_low=c.is_low, is_high=c.is_high,
                                               band=c.band, geometric_band=c.geometric_band, max_kl=c.max_kl,
                                               normalizer=max(1.0, loss_tokens))
        ce = torch.zeros((), device=self.device)
        if ce_sum > 0:
            ce = -(mb.columns("ce_weights").to(self.device) * predicted * logp).sum() / ce_sum
        n = float(mask.sum())
        part = torch.tensor([float(pg.detach()), float(ce.detach()), m["mismatch_kl"] * n, m["clipped_frac"] * n,
                             m["masked_frac"] * n, float((ent.reshape(-1)[index] * mask).sum()), n, len(mb.samples),
                             float(valid.sum())], dtype=torch.float64)
        return pg + c.ce_coef * ce, part

    def step(self, samples: Sequence[Sample], split: bool = True) -> Dict[str, float]:
        """One optimizer step on the step's batch (split=True: the whole batch, this rank trains its
        share; False: this rank's share, already split). Returns the metrics, grad_norm (before
        clipping) and lr included; the same on every rank."""
        metrics = self.backward(samples, split)
        base = self.cfg.sft_lr if metrics["sft"] and self.cfg.sft_lr > 0 else self.cfg.lr
        lr = base * lr_multiplier(self.steps_done + 1, self.cfg.warmup_steps, self.cfg.schedule,
                                  self.cfg.total_steps, self.cfg.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.optimizer.step()
        self.steps_done += 1
        return {**metrics, "grad_norm": float(norm), "lr": lr}

    # -- weights ----------------------------------------------------------------------------------
    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """Every parameter and buffer, whole, on the host, under the checkpoint's names, on rank 0 ({}
        elsewhere). With FSDP2 each tensor is gathered on its own, never the whole model at once on
        a device. Collective: call it on every rank."""
        out = {}
        for name, value in self.module.state_dict().items():
            if hasattr(value, "full_tensor"):
                value = value.full_tensor()
            if self.rank == 0:
                out[name] = value.detach().to("cpu").contiguous()
        return out

    def save_checkpoint(self, directory: str, step: int, extra: Optional[Dict] = None, keep: int = 2) -> str:
        """Writes the bridge step `step`'s checkpoint (model, optimizer, steps_done, every rank's RNG, `extra`)
        to <directory>/step-<step>.pt on rank 0, atomically, keeping the newest `keep`. Collective; call it
        after step() and before acknowledging the step. Returns the path."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, [self.optimizer],
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        rng = {"torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        rngs = [rng]
        if self.world_size > 1:
            rngs = [None] * self.world_size
            dist.all_gather_object(rngs, rng)
        where = checkpoint.path(directory, step)
        if self.rank == 0:
            checkpoint.save(directory, step, {"format": 1, "step": int(step), "steps_done": self.steps_done,
                                              "model": model_sd, "optimizer": optim_sd, "rng": rngs,
                                              "world_size": self.world_size, "extra": extra}, keep=keep)
        if self.world_size > 1:
            dist.barrier()  # no rank acknowledges before the file is there
        return where

    def load_checkpoint(self, directory: str) -> Tuple[int, Optional[Dict]]:
        """Loads the newest complete checkpoint of `directory` (rank 0 chooses; every rank loads the same
        one): (its bridge step, its `extra`), or (0, None) when there is none. Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        chosen = [checkpoint.latest_step(directory) if self.rank == 0 else 0]
        if self.world_size > 1:
            dist.broadcast_object_list(chosen, src=0)
        step = int(chosen[0])
        if step == 0:
            return 0, None
        try:
            state = checkpoint.load(directory, step)
        except OSError as e:
            raise HFTrainerError(f"rank {self.rank}: checkpoint {checkpoint.path(directory, step)} (rank 0's newest) "
                                 f"cannot be read here: {e}; the checkpoint directory must be visible to every "
                                 "rank") from e
        set_state_dict(self.model, [self.optimizer], model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        self.steps_done = int(state["steps_done"])
        rngs = state["rng"]
        rng = rngs[self.rank] if len(rngs) == self.world_size else rngs[0]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return step, state.get("extra")

    def published_state(self) -> Dict[str, torch.Tensor]:
        """full_state_dict without a tied LM head (not a tensor of its own in the checkpoint)."""
        sd = self.full_state_dict()
        if getattr(self.module.config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)
        return sd


_SUMS = ("pg_loss", "ce_loss", "kl_sum", "clipped_sum", "masked_sum", "entropy_sum", "loss_tokens", "samples",
         "tokens")


def _decoder_layers(module) -> List[torch.nn.Module]:
    """The decoder blocks FSDP2 shards one by one: the longest ModuleList in the model (model.layers in
    Llama/Qwen, transformer.h in GPT-2); none found: the root alone is sharded."""
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []
