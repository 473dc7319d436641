"""arlo.loss against hand-computed values on one or two tiny sequences.

Most cases use one sequence of three loss tokens whose ratios r = pi_theta / pi_inf are 1, 3 and
0.5: inference logprobs 0, trainer logprobs log r = (0, ln 3, ln 0.5)."""

import math
import unittest

import torch

from arlo import loss as L

R = [1.0, 3.0, 0.5]


def fixture(mask=(1.0, 1.0, 1.0)):
    lp = torch.tensor([[math.log(r) for r in R]])
    inf = torch.zeros(1, 3)
    m = torch.tensor([list(mask)])
    return lp, inf, m, L.log_ratio(lp, inf, m)


class CorrectionsTest(unittest.TestCase):
    def close(self, got, want):
        torch.testing.assert_close(got, torch.tensor([want]), rtol=0, atol=1e-5)

    def test_token_tis_caps_each_ratio(self):
        # min(r, 2): (1, 3, 0.5) -> (1, 2, 0.5)
        _, _, m, lr = fixture()
        self.close(L.token_tis(lr, m, 2.0), [1.0, 2.0, 0.5])

    def test_sequence_tis_caps_the_product(self):
        # R = 1 * 3 * 0.5 = 1.5; cap 2 -> 1.5 on every token; cap 1.2 -> 1.2
        _, _, m, lr = fixture()
        self.close(L.sequence_tis(lr, m, 2.0), [1.5, 1.5, 1.5])
        self.close(L.sequence_tis(lr, m, 1.2), [1.2, 1.2, 1.2])
        # the third token off the mask: R = 1 * 3 = 3, capped at 2; the masked token weighs 0
        _, _, m, lr = fixture((1.0, 1.0, 0.0))
        self.close(L.sequence_tis(lr, m, 2.0), [2.0, 2.0, 0.0])

    def test_band_mask_drops_tokens_outside(self):
        # [0.8, 2]: 1 in, 3 above, 0.5 below
        _, _, m, lr = fixture()
        self.close(L.band_mask(lr, m, 0.8, 2.0), [1.0, 0.0, 0.0])
        self.close(L.band_mask(lr, m, 0.5, 3.0), [1.0, 1.0, 1.0])  # the bounds are inside

    def test_token_mis_keeps_ratio_inside_band(self):
        # [0.4, 2]: r * [0.4 <= r <= 2] = (1, 0, 0.5)
        _, _, m, lr = fixture()
        self.close(L.token_mis(lr, m, 0.4, 2.0), [1.0, 0.0, 0.5])

    def test_sequence_mis_keeps_or_drops_the_sequence(self):
        # R = 1.5: inside [0.5, 2] -> 1.5 everywhere; outside [0.5, 1.4] -> 0
        _, _, m, lr = fixture()
        self.close(L.sequence_mis(lr, m, 0.5, 2.0), [1.5, 1.5, 1.5])
        self.close(L.sequence_mis(lr, m, 0.5, 1.4), [0.0, 0.0, 0.0])

    def test_geometric_mean_mask(self):
        # G = 1.5 ** (1/3) = 1.1447: outside [0.9, 1.1], inside [0.9, 1.2]
        _, _, m, lr = fixture()
        self.close(L.geometric_mean_mask(lr, m, 0.9, 1.1), [0.0, 0.0, 0.0])
        self.close(L.geometric_mean_mask(lr, m, 0.9, 1.2), [1.0, 1.0, 1.0])

    def test_mismatch_kl_and_trust_region(self):
        # k3 = r - 1 - ln r: r=1 -> 0; r=3 -> 2 - ln 3 = 0.901388; r=0.5 -> ln 2 - 0.5 = 0.193147
        # mean = 1.094535 / 3 = 0.364845
        lp, inf, m, _ = fixture()
        self.close(L.per_token_mismatch_kl(lp, inf, m), [0.0, 0.901388, 0.193147])
        self.assertAlmostEqual(float(L.mismatch_kl(lp, inf, m)), 0.364845, places=5)
        self.close(L.trust_region_mask(lp, inf, m, 0.3), [0.0, 0.0, 0.0])
        self.close(L.trust_region_mask(lp, inf, m, 0.4), [1.0, 1.0, 1.0])

    def test_masks_are_per_sequence(self):
        # two sequences: the first as above (mean KL 0.364845), the second on-policy (KL 0)
        lp, inf, m, _ = fixture()
        lp2, inf2, m2 = torch.cat([lp, torch.zeros(1, 3)]), torch.cat([inf, inf]), torch.cat([m, m])
        torch.testing.assert_close(L.trust_region_mask(lp2, inf2, m2, 0.1),
                                   torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))

    def test_entropy(self):
        # uniform over 4 -> ln 4 = 1.386294; one-hot (logit 100 vs 0) -> ~0; masked token ignored
        logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
        m = torch.tensor([[1.0, 1.0, 0.0]])
        self.assertAlmostEqual(float(L.entropy(logits, m)), 1.386294 / 2, places=5)


class PolicyGradientLossTest(unittest.TestCase):
    def test_token_tis_loss_gradient_and_metrics(self):
        # w = (1, 2, 0.5), A = 1, log pi = (0, ln 3, ln 0.5), N = 3:
        # L = -(0 + 2 ln 3 + 0.5 ln 0.5) / 3 = -(2.197225 - 0.346574) / 3 = -0.616884
        # dL/dlog pi = -w A / N = (-1/3, -2/3, -1/6); clipped 1 of 3 (r = 3 > 2)
        lp, inf, m, _ = fixture()
        lp.requires_grad_(True)
        loss, metrics = L.policy_gradient_loss(lp, inf, torch.ones(1, 3), m, correction="token_tis", is_high=2.0)
        self.assertAlmostEqual(float(loss), -0.616884, places=5)
        loss.backward()
        torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 3, -2 / 3, -1 / 6]]))
        self.assertAlmostEqual(metrics["clipped_frac"], 1 / 3, places=6)
        self.assertEqual(metrics["masked_frac"], 0.0)
        self.assertAlmostEqual(metrics["mismatch_kl"], 0.364845, places=5)

    def test_band_and_normalizer(self):
        # band [0.8, 2] keeps the first token only, whose log pi is 0; A = (2, 2, 2) and correction
        # none: L = -(1*2*0)/N = 0; gradient -A*k/N with N = 4: (-0.5, 0, 0); masked 2 of 3
        lp, inf, m, _ = fixture()
        lp.requires_grad_(True)
        loss, metrics = L.policy_gradient_loss(lp, inf, torch.full((1, 3), 2.0), m, correction="none",
                                               band=(0.8, 2.0), normalizer=4)
        loss.backward()
        self.assertAlmostEqual(float(loss.detach()), 0.0, places=6)
        torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, 0.0, 0.0]]))
        self.assertAlmostEqual(metrics["masked_frac"], 2 / 3, places=6)

    def test_sequence_mis_masks_and_entropy_metric(self):
        # R = 1.5 outside [0.5, 1.4]: every token dropped, loss 0, masked 3 of 3; uniform logits: ln 4
        lp, inf, m, _ = fixture()
        loss, metrics = L.policy_gradient_loss(lp, inf, torch.ones(1, 3), m, correction="sequence_mis",
                                               is_low=0.5, is_high=1.4, logits=torch.zeros(1, 3, 4))
        self.assertEqual(float(loss), 0.0)
        self.assertEqual(metrics["masked_frac"], 1.0)
        self.assertAlmostEqual(metrics["entropy"], 1.386294, places=5)


class BadInputTest(unittest.TestCase):
    def test_shapes_are_named(self):
        lp, inf, m, _ = fixture()
        with self.assertRaisesRegex(ValueError, r"advantages has shape \(1, 2\), logprobs has \(1, 3\)"):
            L.policy_gradient_loss(lp, inf, torch.ones(1, 2), m)
        with self.assertRaisesRegex(ValueError, r"logprobs must be \[batch, tokens\], got shape \(3,\)"):
            L.policy_gradient_loss(lp[0], inf[0], torch.ones(3), m[0])
        with self.assertRaisesRegex(ValueError, "mask must be a torch.Tensor, got list"):
            L.log_ratio(lp, inf, [[1, 1, 1]])
        with self.assertRaisesRegex(ValueError, r"logits must be \[batch, tokens, vocab\]"):
            L.policy_gradient_loss(lp, inf, torch.ones(1, 3), m, logits=torch.zeros(1, 2, 4))

    def test_unknown_correction(self):
        lp, inf, m, _ = fixture()
        with self.assertRaisesRegex(ValueError, "unknown correction 'tis'; one of none, token_tis"):
            L.policy_gradient_loss(lp, inf, torch.ones(1, 3), m, correction="tis")


if __name__ == "__main__":
    torch.manual_seed(0)
    unittest.main()
