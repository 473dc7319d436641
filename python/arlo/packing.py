"""Samples of an arlo batch, split over data-parallel ranks and packed into micro-batches by a token
budget, for the reference Hugging Face trainer (arlo.hf_trainer) and any trainer of one's own.

    samples = samples_from_batch(batch.tensors(torch=True))     # the bridge's packed rows -> samples
    mine = split_for_ranks(samples, world_size)[rank]             # balanced by tokens, deterministic
    for group in pack_micro_batches(mine, max_tokens=4096):      # first-fit decreasing
        mb = build_micro_batch(group, packed=True)                # one row, position ids per sample

Everything here is deterministic for a given input: the same samples give the same split, the same
rows and the same order on every rank and every run.
"""

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence

import torch


class BatchError(ValueError):
    """A batch the trainer cannot train on; the message names the sample and position."""


@dataclass
class Sample:
    """One sample's tokens and per-token columns (all 1-D, the same length). sample_id is its index in
    the step's input order (the batch's sample_ids)."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    inference_logprobs: torch.Tensor
    ce_weights: Optional[torch.Tensor] = None
    sample_id: int = 0

    def __len__(self) -> int:
        return int(self.input_ids.numel())

    def loss_tokens(self) -> int:
        """Tokens in the policy loss: loss_mask set and not the first token (nothing predicts it)."""
        return int((self.loss_mask[1:] != 0).sum())

    def ce_sum(self) -> float:
        return 0.0 if self.ce_weights is None else float(self.ce_weights[1:].float().sum())


def samples_from_batch(t: Mapping[str, torch.Tensor]) -> List[Sample]:
    """The samples of a bridge batch (dict of [rows, seq_len] tensors plus seq_lens [rows, segments]),
    in row order: every row's packed segments, cut by seq_lens."""
    out = []
    ce = t.get("ce_weights")
    sample_ids = t.get("sample_ids")
    for r in range(t["input_ids"].shape[0]):
        start = 0
        for n in t["seq_lens"][r].tolist():
            if n <= 0:
                break
            sl = slice(start, start + n)
            sid = int(sample_ids[r, start]) if sample_ids is not None else len(out)
            out.append(Sample(t["input_ids"][r, sl].long(), t["loss_mask"][r, sl].float(),
                              t["advantages"][r, sl].float(), t["inference_logprobs"][r, sl].float(),
                              None if ce is None else ce[r, sl].float(), sid))
            start += n
    return out


def check_token_ids(samples: Sequence[Sample], vocab_size: int, where: str = "batch") -> None:
    """Raises BatchError naming the first sample and position whose token id is outside [0, vocab_size)."""
    for i, s in enumerate(samples):
        bad = ((s.input_ids < 0) | (s.input_ids >= vocab_size)).nonzero()
        if bad.numel():
            p = int(bad[0, 0])
            raise BatchError(f"{where}: sample {i} (sample_id {s.sample_id}) has token id {int(s.input_ids[p])} at "
                             f"position {p} of {len(s)}, outside the model's vocabulary [0, {vocab_size}); "
                             f"{bad.shape[0]} such token(s) in this sample. The batch was tokenized with "
                             "another tokenizer than the model's?")


def split_for_ranks(samples: Sequence[Sample], num_ranks: int) -> List[List[Sample]]:
    """The step's samples over num_ranks ranks, balanced by tokens: largest first onto the least-loaded
    rank (ties: the lower rank); each rank's samples keep their input order."""
    if num_ranks < 1:
        raise ValueError(f"split_for_ranks: num_ranks must be >= 1, got {num_ranks}")
    load = [0] * num_ranks
    owner = [0] * len(samples)
    for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i)):
        r = min(range(num_ranks), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += len(samples[i])
    return [[s for i, s in enumerate(samples) if owner[i] == r] for r in range(num_ranks)]


def pack_micro_batches(samples: Sequence[Sample], max_tokens: int) -> List[List[Sample]]:
    """Groups of samples of at most max_tokens tokens each, first-fit decreasing (a sample longer than
    max_tokens gets a group of its own). A sample is never cut: sequence-level corrections see it whole."""
    if max_tokens < 1:
        raise ValueError(f"pack_micro_batches: max_tokens must be >= 1, got {max_tokens}")
    groups: List[List[int]] = []
    used: List[int] = []
    for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i)):
        n = len(samples[i])
        for g, u in enumerate(used):
            if u + n <= max_tokens:
                groups[g].append(i)
                used[g] += n
                break
        else:
            groups.append([i])
            used.append(n)
    return [[samples[i] for i in g] for g in groups]


@dataclass
class MicroBatch:
    """Model inputs for a group of samples, and where each sample's tokens sit in them.

    input_ids, position_ids: [B, T] (packed: B = 1, positions restart at every sample; unpacked: one
    row per sample, right-padded). attention_mask: packed, [1, 1, T, T] block-diagonal causal (bool,
    or additive float when `additive`); unpacked, [B, T] of 0/1. index: [n, L] positions into the
    flattened [B*T] tokens of each sample's tokens (L: the longest sample), valid: [n, L] 0/1."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor
    samples: List[Sample]

    def columns(self, name: str) -> torch.Tensor:
        """[n, L] of one per-token column of the samples (ce_weights: 0 where a sample has none)."""
        width = self.index.shape[1]
        rows = []
        for s in self.samples:
            v = getattr(s, name)
            v = torch.zeros(len(s)) if v is None else v.float()
            rows.append(torch.nn.functional.pad(v, (0, width - len(s))))
        return torch.stack(rows)


def build_micro_batch(samples: Sequence[Sample], packed: bool, additive: bool = False,
                      pad_id: int = 0) -> MicroBatch:
    """The model inputs of one group of samples (see MicroBatch); an empty group gives one row of a
    single pad token and no samples (a rank with nothing left to train still runs the forward its
    peers' collectives wait for)."""
    samples = list(samples)
    lens = [len(s) for s in samples] or [1]
    width = max(lens)
    if packed:
        total = sum(lens)
        ids = torch.cat([s.input_ids for s in samples]) if samples else torch.full((1,), pad_id)
        pos = torch.cat([torch.arange(n) for n in lens])
        seg = torch.cat([torch.full((n,), k) for k, n in enumerate(lens)])
        allowed = (seg[:, None] == seg[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
        mask = allowed[None, None]
        if additive:
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        starts = torch.tensor([0] + lens[:-1]).cumsum(0)
        ids, pos = ids[None], pos[None]
    else:
        ids = torch.full((len(lens), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(lens), width, dtype=torch.long)
        for k, s in enumerate(samples):
            ids[k, :len(s)] = s.input_ids
            mask[k, :len(s)] = 1
        pos = torch.arange(width).expand(len(lens), width).clone()
        starts = torch.arange(len(lens)) * width
    offsets = torch.arange(width)
    valid = (offsets[None, :] < torch.tensor(lens)[:, None]).float()
    index = (starts[:, None] + offsets[None, :]) * valid.long()
    if not samples:
        index, valid = index[:0], valid[:0]
    return MicroBatch(ids, pos, mask, index, valid, samples)
