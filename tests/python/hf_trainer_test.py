"""arlo.hf_trainer and arlo.packing on a tiny random-weights Qwen3 (hidden 64, 2 layers) written into a
temporary directory by arlo_tiny_model: packing and position ids, micro-batch splits that leave the
gradient unchanged, the warm-up schedule, the SFT warm-up's cross-entropy, 2 ranks over gloo (FSDP2
and DDP) against 1 rank, and the three bad inputs. CPU only, one thread per process, seeded."""

import json
import os
import socket
import sys
import tempfile
import unittest

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import arlo_tiny_model  # noqa: E402
from arlo.hf_trainer import HFTrainer, HFTrainerError, TrainerConfig, init_distributed, lr_multiplier  # noqa: E402
from arlo.packing import (Sample, build_micro_batch, pack_micro_batches, samples_from_batch,  # noqa: E402
                          split_for_ranks)

torch.set_num_threads(1)
LENGTHS = (9, 14, 5, 11, 7, 16, 6)


def make_samples(vocab, lengths=LENGTHS, seed=0, sft=False):
    """Seeded samples: a prompt of 3 tokens, the rest completion (in the loss), advantages +-1,
    inference logprobs in [-3, -0.5]; sft: ce_weights 1 on the completion, advantages 0."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (n,), generator=g)
        mask = torch.zeros(n)
        mask[3:] = 1.0
        adv = mask * (0.0 if sft else (1.0 if i % 2 else -1.0))
        inf = -(0.5 + 2.5 * torch.rand(n, generator=g)) * mask
        out.append(Sample(ids, mask, adv, inf, mask.clone() if sft else None, i))
    return out


def grads(trainer):
    return {n: p.grad.detach().clone() for n, p in trainer.module.named_parameters() if p.grad is not None}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DP_CONFIG = dict(lr=1e-2, eps=1.0, max_grad_norm=1e9, max_tokens_per_micro_batch=20, device="cpu")


def dp_rank(rank, world_size, port, model_dir, out_dir):
    """One rank of the 2-rank run: one step with FSDP2, then one with DDP, from the same weights."""
    torch.set_num_threads(1)
    init_distributed(rank, world_size, master_port=port, backend="gloo")
    for mode in ("fsdp2", "ddp"):
        trainer = HFTrainer(model_dir, TrainerConfig(data_parallel=mode, **DP_CONFIG))
        metrics = trainer.step(make_samples(trainer.vocab_size))
        state = trainer.full_state_dict()
        if rank == 0:
            torch.save({"state": state, "metrics": metrics}, os.path.join(out_dir, f"{mode}.pt"))
    torch.distributed.destroy_process_group()


class PackingTest(unittest.TestCase):
    def test_samples_from_a_bridge_batch(self):
        ids = torch.arange(1, 13, dtype=torch.int32).view(2, 6)
        t = {"input_ids": ids, "loss_mask": (ids % 2).to(torch.uint8), "advantages": ids.float() / 10,
             "inference_logprobs": -ids.float(), "seq_lens": torch.tensor([[2, 3], [4, 0]], dtype=torch.int32),
             "sample_ids": torch.tensor([[5, 5, 1, 1, 1, -1], [0, 0, 0, 0, -1, -1]], dtype=torch.int32)}
        got = samples_from_batch(t)
        self.assertEqual([s.input_ids.tolist() for s in got], [[1, 2], [3, 4, 5], [7, 8, 9, 10]])
        self.assertEqual([s.sample_id for s in got], [5, 1, 0])
        self.assertEqual(got[1].loss_mask.tolist(), [1.0, 0.0, 1.0])
        self.assertIsNone(got[0].ce_weights)

    def test_rows_respect_the_budget_and_hold_every_sample_once(self):
        samples = make_samples(50)
        groups = pack_micro_batches(samples, 20)
        self.assertTrue(all(sum(len(s) for s in g) <= 20 for g in groups))
        self.assertEqual(sorted(s.sample_id for g in groups for s in g), list(range(len(LENGTHS))))
        # first-fit decreasing: 16 | 14+6 | 11+9 | 7+5
        self.assertEqual([[len(s) for s in g] for g in groups], [[16], [14, 6], [11, 9], [7, 5]])
        self.assertEqual([[len(s) for s in g] for g in pack_micro_batches(samples, 8)][-1], [5])  # 16 > 8: alone

    def test_packed_row_restarts_positions_and_blocks_attention(self):
        samples = make_samples(50, lengths=(3, 2))
        mb = build_micro_batch(samples, packed=True)
        self.assertEqual(mb.position_ids.tolist(), [[0, 1, 2, 0, 1]])
        self.assertEqual(mb.input_ids[0].tolist(), samples[0].input_ids.tolist() + samples[1].input_ids.tolist())
        allowed = mb.attention_mask[0, 0].int().tolist()
        self.assertEqual(allowed, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
        self.assertEqual(mb.index.tolist(), [[0, 1, 2], [3, 4, 0]])
        self.assertEqual(mb.valid.tolist(), [[1, 1, 1], [1, 1, 0]])
        additive = build_micro_batch(samples, packed=True, additive=True).attention_mask[0, 0]
        self.assertEqual(additive[3, 2].item(), torch.finfo(torch.float32).min)
        self.assertEqual(additive[4, 3].item(), 0.0)
        unpacked = build_micro_batch(samples, packed=False, pad_id=7)
        self.assertEqual(unpacked.input_ids[1].tolist(), samples[1].input_ids.tolist() + [7])
        self.assertEqual(unpacked.index.tolist(), [[0, 1, 2], [3, 4, 0]])

    def test_ranks_split_by_tokens_deterministically(self):
        samples = make_samples(50)
        shares = split_for_ranks(samples, 2)
        loads = [sum(len(s) for s in share) for share in shares]
        self.assertEqual(loads, [32, 36])  # largest first onto the lighter rank: 16+9+7 | 14+11+6+5
        self.assertLessEqual(abs(loads[0] - loads[1]), max(LENGTHS))
        self.assertEqual([[s.sample_id for s in sh] for sh in shares],
                         [[s.sample_id for s in sh] for sh in split_for_ranks(samples, 2)])
        self.assertEqual(split_for_ranks(samples, 1), [samples])


class ScheduleTest(unittest.TestCase):
    def test_linear_warmup_then_constant(self):
        self.assertEqual([lr_multiplier(s, 4) for s in (1, 2, 3, 4, 5, 100)], [0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
        self.assertEqual(lr_multiplier(1, 0), 1.0)

    def test_linear_warmup_then_cosine(self):
        got = [lr_multiplier(s, 2, "cosine", total_steps=6, min_lr_ratio=0.1) for s in (1, 2, 4, 6, 9)]
        # progress (s - 2) / 4: 0 -> 1, 0.5 -> 0.1 + 0.9 * 0.5, 1 -> 0.1
        for g, w in zip(got, [0.5, 1.0, 0.55, 0.1, 0.1]):
            self.assertAlmostEqual(g, w, places=12)
        with self.assertRaises(ValueError):
            lr_multiplier(5, 2, "linear")


class TinyModelCase(unittest.TestCase):
    """A tiny model of seed SEED in a temporary directory, written once for the class."""
    SEED = 0

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "tiny")
        arlo_tiny_model.write(cls.model_dir, seed=cls.SEED, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                              intermediate=128)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class TrainerTest(TinyModelCase):

    def trainer(self, **kw):
        return HFTrainer(self.model_dir, TrainerConfig(device="cpu", **kw))

    def test_packing_is_checked_and_used(self):
        for impl in ("sdpa", "eager"):
            t = self.trainer(attn_implementation=impl)
            self.assertEqual(t.packing_mode, "packed", t.packing_note)

    def test_micro_batch_split_leaves_the_gradient_unchanged(self):
        whole = self.trainer(max_tokens_per_micro_batch=1000)
        m = whole.backward(make_samples(whole.vocab_size))
        self.assertEqual(m["micro_batches"], 1)
        want = grads(whole)
        for kw in ({"max_tokens_per_micro_batch": 20}, {"max_tokens_per_micro_batch": 1},
                   {"max_tokens_per_micro_batch": 20, "packing": "unpacked"},
                   {"max_tokens_per_micro_batch": 1000, "attn_implementation": "eager"}):
            t = self.trainer(**kw)
            got_m = t.backward(make_samples(t.vocab_size))
            self.assertAlmostEqual(got_m["loss"], m["loss"], places=5, msg=kw)
            got = grads(t)
            self.assertEqual(got.keys(), want.keys())
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=f"{kw} {name}")
        self.assertEqual(t.steps_done, 0)

    def test_warmup_lr_and_sft_cross_entropy(self):
        t = self.trainer(lr=1e-3, sft_lr=4e-3, warmup_steps=4)
        samples = make_samples(t.vocab_size, sft=True)
        # the cross-entropy by hand: mean -log p over the completion tokens, one sample at a time
        with torch.no_grad():
            nll, n = 0.0, 0
            for s in samples:
                logp = torch.log_softmax(t.module(input_ids=s.input_ids[None]).logits[0, :-1].float(), -1)
                nll -= float((logp.gather(-1, s.input_ids[1:, None])[:, 0] * s.ce_weights[1:]).sum())
                n += int(s.ce_weights[1:].sum())
        m = t.step(samples)
        self.assertTrue(m["sft"])
        self.assertAlmostEqual(m["ce_loss"], nll / n, places=4)
        self.assertAlmostEqual(m["pg_loss"], 0.0, places=6)  # advantages 0
        self.assertAlmostEqual(m["lr"], 1e-3, places=12)     # sft_lr 4e-3 * 1/4
        m = t.step(make_samples(t.vocab_size, seed=1))
        self.assertFalse(m["sft"])
        self.assertAlmostEqual(m["lr"], 5e-4, places=12)     # lr 1e-3 * 2/4
        self.assertGreater(m["grad_norm"], 0.0)
        self.assertEqual(m["samples"], len(LENGTHS))

    def test_bf16_autocast_when_asked(self):
        # off by default on CPU; asked for, the forward runs in bf16 and the loss stays near float32's
        fp32 = self.trainer()
        self.assertFalse(fp32.bf16)
        bf16 = self.trainer(bf16=True)
        want, got = fp32.backward(make_samples(fp32.vocab_size)), bf16.backward(make_samples(bf16.vocab_size))
        self.assertNotEqual(got["loss"], want["loss"])
        self.assertAlmostEqual(got["loss"], want["loss"], delta=0.05 * abs(want["loss"]))
        self.assertIn(bf16.packing_mode, ("packed", "unpacked"))

    def test_two_ranks_over_gloo_match_one_rank(self):
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as out:
            mp.spawn(dp_rank, args=(2, free_port(), self.model_dir, out), nprocs=2, join=True)
            one = HFTrainer(self.model_dir, TrainerConfig(**DP_CONFIG))
            want_m = one.step(make_samples(one.vocab_size))
            want = one.full_state_dict()
            for mode in ("fsdp2", "ddp"):
                got = torch.load(os.path.join(out, f"{mode}.pt"))
                self.assertAlmostEqual(got["metrics"]["grad_norm"], want_m["grad_norm"],
                                       delta=1e-4 * want_m["grad_norm"])
                self.assertAlmostEqual(got["metrics"]["loss"], want_m["loss"], places=5)
                self.assertEqual(got["metrics"]["samples"], len(LENGTHS))
                self.assertEqual(got["state"].keys(), want.keys())
                for name in want:
                    torch.testing.assert_close(got["state"][name], want[name], rtol=1e-5, atol=1e-6,
                                               msg=f"{mode} {name}")
        # the step moved the weights by more than the tolerance
        start = HFTrainer(self.model_dir, TrainerConfig(device="cpu")).full_state_dict()
        self.assertGreater(max(float((want[k] - start[k]).abs().max()) for k in want), 1e-4)


class BadInputTest(TinyModelCase):
    SEED = 1

    def test_a_directory_that_is_not_a_causal_lm(self):
        d = os.path.join(self.tmp.name, "vit")
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 1}, f)
        with self.assertRaisesRegex(HFTrainerError, r"vit.*model_type 'vit'.*not a causal LM"):
            HFTrainer(d, TrainerConfig(device="cpu"))
        with self.assertRaisesRegex(HFTrainerError, r"empty.*no config\.json"):
            os.makedirs(os.path.join(self.tmp.name, "empty"))
            HFTrainer(os.path.join(self.tmp.name, "empty"), TrainerConfig(device="cpu"))

    def test_a_tokenizer_larger_than_the_embedding(self):
        from transformers import AutoTokenizer

        tok_dir = os.path.join(self.tmp.name, "bigger_tokenizer")
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        tok.add_tokens([f"<extra_{i}>" for i in range(5)])
        tok.save_pretrained(tok_dir)
        with self.assertRaisesRegex(HFTrainerError, rf"bigger_tokenizer: {len(tok)} tokens .* embeds only "
                                                    rf"{len(tok) - 5}"):
            HFTrainer(self.model_dir, TrainerConfig(device="cpu", tokenizer_dir=tok_dir))

    def test_token_ids_outside_the_vocabulary(self):
        t = HFTrainer(self.model_dir, TrainerConfig(device="cpu"))
        samples = make_samples(t.vocab_size)
        samples[4].input_ids[6] = t.vocab_size + 3
        before = {k: v.clone() for k, v in t.module.state_dict().items()}
        with self.assertRaisesRegex(HFTrainerError, rf"sample 4 \(sample_id 4\) has token id {t.vocab_size + 3} at "
                                                    rf"position 6 of 7, outside the model's vocabulary \[0, "
                                                    rf"{t.vocab_size}\)"):
            t.step(samples)
        samples[4].input_ids[6] = -1
        with self.assertRaisesRegex(HFTrainerError, "batch of rank 0|sample 4"):
            t.step(samples, split=False)
        self.assertEqual(t.steps_done, 0)
        for k, v in t.module.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)

    def test_train_py_ends_bad_input_with_exit_code_2_and_one_line(self):
        """examples/hf_trainer/train.py: HFTrainerError is exit code 2 (arlo run does not restart it) and one
        line "trainer: error: ..." naming what and where (quoted in arlo run's error)."""
        import subprocess

        d = os.path.join(self.tmp.name, "vit_for_train_py")
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 1}, f)
        train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "hf_trainer",
                             "train.py")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARLO_")}
        r = subprocess.run([sys.executable, train, "--model", d, "--weight-sync", "{}"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"trainer: error: model directory .*vit_for_train_py: config.json has model_type "
                                   r"'vit'")


if __name__ == "__main__":
    unittest.main()
