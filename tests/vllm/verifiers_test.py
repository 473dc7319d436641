"""A verifiers environment against a real vLLM server (issue 27, item 1): `arlo run` with env.kind
verifiers starts verifiers' environment server (the real package, from the project's Python) on the
single-turn test environment tests/verifiers_envs/arlo_vf_echo; each trajectory is one episode whose
chat program calls the model through arlo's policy gateway (streaming, which the gateway answers as
server-sent events), and the gateway calls vLLM. A recording proxy between arlo and vLLM keeps every
request and answer.

Checked: the run ends ok with nothing failed; every chat call reached vLLM without `stream` (the
gateway answers the stream itself); each trajectory's model tokens are one of vLLM's completions; the
rewards are the environment's (0 or 1).

The tool test runs the multi-turn environment tests/verifiers_envs/arlo_vf_tools (an `add` tool that
verifiers serves as an MCP server) the same way, with its harness forcing each episode's first model
call to call the tool (`first_tool_choice`, a named tool_choice; later calls choose for themselves)
and vLLM started with its hermes tool parser. Checked, for at least one trajectory: the model's call
of `arlo_add` (its arguments parsed), verifiers ran the tool and the next model call carries its
result (the sum of those arguments) as a tool message; that call's prompt extends the first call's
prompt and completion, and the trajectory in rollouts.jsonl holds exactly the model's completion
tokens as its model tokens (loss mask 1) and the tool message's rendering as its environment tokens
(loss mask 0); its reward is the environment's used_tool, 1.0. Every step trains, nothing fails.

The tool test's model is the tiny model with the character-level tokenizer of multi_turn_test (the
random model's text tokenizes back to its ids) and gateway_tools_test's template (it lists the tools)
rendering an assistant's tool call as the arguments' compact JSON: vLLM answers a named tool_choice
with JSON-schema guided decoding of the arguments (VLLM_ENFORCE_STRICT_TOOL_CALLING=0: the JSON
path, not the hermes structural tag, whose free whitespace the random model fills and no template
can render back) without whitespace (--structured-outputs-config disable_any_whitespace), so the
rendering of the next turn extends what the model wrote, which the gateway requires. The tool's
terms are bounded (0 to 999), so a forced call is short (sampling.max_tokens 32 holds it).

The two tests take about 5 minutes on 2 cores (each starts its own vLLM, which is most of it); ctest
runs each on its own (vllm_verifiers, vllm_verifiers_tools).

    .venv/bin/python tests/vllm/verifiers_test.py --source . --arlo build/apps/arlo/arlo
"""

import json
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import run_unittest  # noqa: E402
import gateway_tools_test  # noqa: E402
import multi_turn_test  # noqa: E402
from multi_turn_test import VllmRun, read_jsonl  # noqa: E402
from vllm_server import http_json  # noqa: E402

ARGS = None
STEPS = 2
TASKS = [{"id": f"say-{i}", "prompt": f"say something about {i}"} for i in range(8)]
TOOL_TASKS = [{"id": f"sum-{i}", "prompt": f"what is {i}+{i + 3}? use the add tool"} for i in range(8)]
ADD = "arlo_add"  # the env's `add` as verifiers names it on the wire (its toolset's TOOL_PREFIX)
FORCE_ADD = {"type": "function", "function": {"name": ADD}}
VLLM_TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--structured-outputs-config",
                  json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
# gateway_tools_test's template with an assistant's tool calls rendered as what the model wrote.
_CONTENT = "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
_CONTENT_AND_CALLS = (
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}{%- set args = call['function']['arguments'] %}"
    "{{- args if args is string else args | tojson(separators=(',', ':')) }}{%- endfor %}"
    "{{- '<|im_end|>' + '\\n' }}")
TOOL_TEMPLATE = gateway_tools_test.TEMPLATE.replace(_CONTENT, _CONTENT_AND_CALLS)
assert TOOL_TEMPLATE != gateway_tools_test.TEMPLATE, "gateway_tools_test.TEMPLATE changed its message line"


def write_model(out):
    import arlo_tiny_model as m
    m.write(out, seed=0)


def write_tool_model(out):
    """multi_turn_test's tiny model (seed 0, character-level tokenizer) with TOOL_TEMPLATE."""
    multi_turn_test.write_model(out)
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = TOOL_TEMPLATE
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def call_chains(chats):
    """The recorded chat calls grouped into trajectories: a call continues the one whose prompt and
    completion ids its own prompt starts with. Each chain is a list of (request, answer)."""
    def ids(answer):
        return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]

    chains = []
    for req, ans in sorted(chats, key=lambda c: len(c[1]["prompt_token_ids"])):
        prompt = ids(ans)[0]
        for chain in chains:
            last_prompt, last_completion = ids(chain[-1][1])
            seen = last_prompt + last_completion
            if len(prompt) >= len(seen) and prompt[:len(seen)] == seen:
                chain.append((req, ans))
                break
        else:
            chains.append([(req, ans)])
    return chains


def tool_round_trip(chain):
    """(a, b, tool message, env ids) of a chain's first tool call whose result the next call carries."""
    for (_, first), (second, answer) in zip(chain, chain[1:]):
        calls = first["choices"][0]["message"].get("tool_calls") or []
        results = [m for m in second["messages"] if m.get("role") == "tool"]
        if calls and results:
            args = json.loads(calls[0]["function"]["arguments"])
            seen = len(first["prompt_token_ids"]) + len(first["choices"][0]["token_ids"])
            return calls[0], args, results[0], answer["prompt_token_ids"][seen:]
    return None


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

    def test_a_tool_call_goes_round_the_gateway_verifiers_and_back_into_the_trajectory(self):
        with mock.patch.dict(os.environ, {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}):
            r = VllmRun(self, ARGS, "arlo-vllm-verifiers-tools-", write_tool_model, TOOL_TASKS, VLLM_TOOL_ARGS)
        harness = {"id": "arlo_vf_tools", "first_tool_choice": FORCE_ADD}
        r.run({"run.max_steps": STEPS, "env.kind": "verifiers", "env.verifiers_env": "arlo_vf_tools",
               "env.verifiers_python_path": os.path.join(ARGS.source, "tests", "verifiers_envs"),
               "env.verifiers_args": json.dumps({"agent": {"max_turns": 3, "harness": harness}}),
               "env.max_trajectory_tokens": 400, "orchestrator.seq_len": 512, "sampling.max_tokens": 32,
               "orchestrator.batch_size": 4, "orchestrator.group_size": 2, "orchestrator.max_inflight": 4,
               "orchestrator.filter_equal_reward_groups": "false", "sampling.stop": "[]",
               "reward.modules": '[{"kind": "env"}]', "log.rollouts_every": 1})
        self.assertEqual(r.ledger["failed"], {}, r.ledger)
        steps = [m for m in read_jsonl(os.path.join(r.run_dir, "metrics.jsonl")) if m["kind"] == "step"]
        self.assertEqual(len(steps), STEPS, "every step trains")
        chats = [(req, ans) for path, req, ans in r.proxy.calls if path == "/v1/chat/completions"]
        for req, _ in chats:  # the first call of an episode forced, the later ones free
            first = not any(m.get("role") in ("assistant", "tool") for m in req["messages"])
            self.assertEqual(req.get("tool_choice"), FORCE_ADD if first else None, req)
        samples = [s for g in read_jsonl(os.path.join(r.run_dir, "rollouts.jsonl")) for s in g["samples"]]
        checked = 0
        for chain in call_chains(chats):
            trip = tool_round_trip(chain)
            if trip is None:
                continue
            call, args, result, env_ids = trip
            self.assertEqual(call["function"]["name"], ADD)
            self.assertEqual(result["content"], str(args["a"] + args["b"]), (call, result))
            env_text = http_json(r.vllm.url + "/detokenize", {"model": "tiny", "tokens": env_ids})[1]["prompt"]
            self.assertTrue(env_text.startswith(f"\n<|im_start|>tool\n{args['a'] + args['b']}<|im_end|>"), env_text)
            model = sum(len(a["choices"][0]["token_ids"]) for _, a in chain)
            env = len(chain[-1][1]["prompt_token_ids"]) - len(chain[0][1]["prompt_token_ids"]) - sum(
                len(a["choices"][0]["token_ids"]) for _, a in chain[:-1])
            mine = [s for s in samples if any(t.get("tool_call_id") == call["id"] for t in s.get("turns", []))]
            self.assertEqual(len(mine), 1, f"one trajectory holds the result of {call}: {samples}")
            tool_turn = next(t for t in mine[0]["turns"] if t.get("tool_call_id") == call["id"])
            self.assertEqual(tool_turn["content"], result["content"], mine[0])
            # The model's completions are its tokens (loss mask 1), the tool message's rendering the
            # environment's (loss mask 0).
            self.assertEqual((mine[0]["model_tokens"], mine[0]["env_tokens"]), (model, env), mine[0])
            self.assertEqual(mine[0]["env_reward"], 1.0, mine[0])
            checked += 1
        self.assertGreater(checked, 0, "no tool call came back as a tool message")
        for s in samples:
            self.assertIn(s["env_reward"], (0.5, 1.0), s)
        paid = sum(s["env_reward"] == 1.0 for s in samples)
        print(f"verifiers_test: {len(chats)} chat calls to vLLM, {checked} tool round trips checked, "
              f"{len(samples)} samples, {paid} with reward 1.0", file=sys.stderr)


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
