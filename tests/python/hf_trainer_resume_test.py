"""Checkpoints and exactly-once resume of arlo.hf_trainer, on the tiny Qwen3 of hf_trainer_test: a
trainer resumed from step k's checkpoint takes step k+1 to the weights an uninterrupted run reaches
(optimizer state, lr schedule position and RNG restored); 2 ranks over gloo (FSDP2 and DDP) save and
resume, every rank the same step, and their checkpoint loads into 1 rank too; a checkpoint cut in the
middle (its .tmp left) is ignored. CPU only, one thread per process, seeded."""

import os
import sys
import tempfile
import unittest

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from arlo import checkpoint  # noqa: E402
from arlo.hf_trainer import HFTrainer, TrainerConfig, init_distributed  # noqa: E402
from hf_trainer_test import TinyModelCase, free_port, make_samples  # noqa: E402

torch.set_num_threads(1)
# weight decay, a warm-up the resumed step is still inside and a small micro-batch budget: the
# optimizer state, the schedule position and the accumulation all show in step k+1's weights.
CONFIG = dict(lr=1e-2, weight_decay=0.1, warmup_steps=4, max_grad_norm=1e9, max_tokens_per_micro_batch=20,
              device="cpu")


def batch(trainer, step):
    return make_samples(trainer.vocab_size, seed=100 + step)


def run_steps(trainer, first, last):
    for s in range(first, last + 1):
        trainer.step(batch(trainer, s))


def dp_resume_rank(rank, world_size, port, model_dir, out_dir):
    """Per layout: steps 1-2, checkpoint 2, step 3 (uninterrupted); then a fresh trainer resumes from the
    checkpoint and takes step 3 again. Rank 0 saves both weights and every rank its loaded step."""
    torch.set_num_threads(1)
    init_distributed(rank, world_size, master_port=port, backend="gloo")
    for mode in ("fsdp2", "ddp"):
        ckpt = os.path.join(out_dir, f"ckpt_{mode}")
        a = HFTrainer(model_dir, TrainerConfig(data_parallel=mode, **CONFIG))
        run_steps(a, 1, 2)
        a.save_checkpoint(ckpt, 2)
        run_steps(a, 3, 3)
        want = a.full_state_dict()
        b = HFTrainer(model_dir, TrainerConfig(data_parallel=mode, **CONFIG))
        step, _ = b.load_checkpoint(ckpt)
        torch.save({"step": step, "steps_done": b.steps_done}, os.path.join(out_dir, f"{mode}_rank{rank}.pt"))
        run_steps(b, 3, 3)
        got = b.full_state_dict()
        if rank == 0:
            torch.save({"want": want, "got": got}, os.path.join(out_dir, f"{mode}.pt"))
    torch.distributed.destroy_process_group()


class ResumeTest(TinyModelCase):
    SEED = 2

    def trainer(self, **kw):
        return HFTrainer(self.model_dir, TrainerConfig(**{**CONFIG, **kw}))

    def assert_same_weights(self, got, want, msg=""):
        self.assertEqual(got.keys(), want.keys())
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=f"{msg} {name}")

    def test_resumed_step_equals_the_uninterrupted_one(self):
        with tempfile.TemporaryDirectory() as ckpt:
            a = self.trainer()
            run_steps(a, 1, 2)
            path = a.save_checkpoint(ckpt, 2, extra={"record": {"step": 2}})
            self.assertEqual(path, os.path.join(ckpt, "step-2.pt"))
            rng = torch.get_rng_state()
            run_steps(a, 3, 3)
            want = a.full_state_dict()

            torch.manual_seed(1234)  # another RNG state, which the checkpoint replaces
            b = self.trainer()
            step, extra = b.load_checkpoint(ckpt)
            self.assertEqual((step, extra, b.steps_done), (2, {"record": {"step": 2}}, 2))
            self.assertTrue(torch.equal(torch.get_rng_state(), rng))
            m = b.step(batch(b, 3))
            self.assertAlmostEqual(m["lr"], 1e-2 * 3 / 4, places=12)  # the schedule goes on at step 3
            self.assert_same_weights(b.full_state_dict(), want, "resumed")

            # without the optimizer state the same step lands elsewhere: the comparison can tell
            c = self.trainer()
            c.module.load_state_dict(checkpoint.load(ckpt, 2)["model"])
            c.steps_done = 2
            run_steps(c, 3, 3)
            moved = max(float((c.full_state_dict()[k] - want[k]).abs().max()) for k in want)
            self.assertGreater(moved, 1e-4)

    def test_no_checkpoint_starts_at_zero(self):
        with tempfile.TemporaryDirectory() as ckpt:
            t = self.trainer()
            self.assertEqual(t.load_checkpoint(os.path.join(ckpt, "absent")), (0, None))
            self.assertEqual(t.steps_done, 0)

    def test_a_checkpoint_cut_in_the_middle_is_ignored(self):
        with tempfile.TemporaryDirectory() as ckpt:
            a = self.trainer()
            run_steps(a, 1, 1)
            a.save_checkpoint(ckpt, 1)
            want = {k: v.clone() for k, v in a.full_state_dict().items()}  # on CPU: views of the parameters
            run_steps(a, 2, 2)
            # step 2's write killed half way: its temporary file holds half of a checkpoint
            whole = open(checkpoint.path(ckpt, 1), "rb").read()
            with open(checkpoint.path(ckpt, 2) + ".tmp", "wb") as f:
                f.write(whole[:len(whole) // 2])
            self.assertEqual(checkpoint.steps(ckpt), [1])
            b = self.trainer()
            self.assertEqual(b.load_checkpoint(ckpt)[0], 1)
            self.assert_same_weights(b.full_state_dict(), want, "step 1")
            # the next save replaces the leftover and keeps the newest two
            for s in (2, 3, 4):
                b.save_checkpoint(ckpt, s)
            self.assertEqual(sorted(os.listdir(ckpt)), ["step-3.pt", "step-4.pt"])

    def test_two_ranks_save_and_resume(self):
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as out:
            mp.spawn(dp_resume_rank, args=(2, free_port(), self.model_dir, out), nprocs=2, join=True)
            for mode in ("fsdp2", "ddp"):
                for rank in (0, 1):
                    loaded = torch.load(os.path.join(out, f"{mode}_rank{rank}.pt"))
                    self.assertEqual(loaded, {"step": 2, "steps_done": 2}, f"{mode} rank {rank}")
                got = torch.load(os.path.join(out, f"{mode}.pt"))
                self.assert_same_weights(got["got"], got["want"], f"{mode} resumed")
            # the 2-rank FSDP2 checkpoint resumes on 1 rank, to the 2-rank run's step 3
            one = self.trainer()
            self.assertEqual(one.load_checkpoint(os.path.join(out, "ckpt_fsdp2"))[0], 2)
            run_steps(one, 3, 3)
            self.assert_same_weights(one.full_state_dict(), torch.load(os.path.join(out, "fsdp2.pt"))["want"],
                                     "1 rank from the 2-rank checkpoint")


if __name__ == "__main__":
    unittest.main()
