"""A verifiers environment against a real vLLM server (issue 27, item 1): `arlo run` with env.kind
verifiers starts verifiers' environment server (the real package, from the project's Python) on the
single-turn test environment tests/verifiers_envs/arlo_vf_echo; each trajectory is one episode whose
chat program calls the model through arlo's policy gateway (streaming, which the gateway answers as
server-sent events), and the gateway calls vLLM. A recording proxy between arlo and vLLM keeps every
request and answer.

Checked: the run ends ok with nothing failed; every chat call reached vLLM without `stream` (the
gateway answers the stream itself); each trajectory's model tokens are one of vLLM's completions; the
rewards are the environment's (0 or 1). About 7 minutes on 2 cores (vLLM's start is most of it).

    .venv/bin/python tests/vllm/verifiers_test.py --source . --arlo build/apps/arlo/arlo
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import run_unittest  # noqa: E402
from multi_turn_test import VllmRun, read_jsonl  # noqa: E402

ARGS = None
STEPS = 2
TASKS = [{"id": f"say-{i}", "prompt": f"say something about {i}"} for i in range(8)]


def write_model(out):
    import arlo_tiny_model as m
    m.write(out, seed=0)


class VerifiersVllmTest(unittest.TestCase):
    def test_a_verifiers_environment_runs_its_episodes_on_vllm_through_the_gateway(self):
        r = VllmRun(self, ARGS, "arlo-vllm-verifiers-", write_model, TASKS)
        r.run({"run.max_steps": STEPS, "env.kind": "verifiers", "env.verifiers_env": "arlo_vf_echo",
               "env.verifiers_python_path": os.path.join(ARGS.source, "tests", "verifiers_envs"),
               "orchestrator.batch_size": 4, "orchestrator.group_size": 2, "orchestrator.max_inflight": 4,
               "orchestrator.filter_equal_reward_groups": "false", "sampling.stop": "[]",
               "reward.modules": '[{"kind": "env"}]', "log.rollouts_every": 1})
        self.assertEqual(r.ledger["failed"], {}, r.ledger)
        chats = [(req, ans) for path, req, ans in r.proxy.calls if path == "/v1/chat/completions"]
        self.assertGreater(len(chats), 0, "no chat call reached vLLM")
        for req, _ in chats:
            self.assertFalse(req.get("stream", False), "the gateway answers the program's stream itself")
        completions = {len(a["choices"][0]["token_ids"]) for _, a in chats}
        samples = [s for g in read_jsonl(os.path.join(r.run_dir, "rollouts.jsonl")) for s in g["samples"]]
        self.assertGreater(len(samples), 0)
        for s in samples:
            self.assertIn(s["env_reward"], (0.0, 1.0), s)
            self.assertIn(s["model_tokens"], completions, s)
        print(f"verifiers_test: {len(chats)} chat calls to vLLM, {len(samples)} samples logged, "
              f"mean reward {sum(s['env_reward'] for s in samples) / len(samples):.3f}")


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
