"""Multi-turn `arlo run` against a real vLLM server (issue 26, item 6): chat tasks run by an
environment server over the HTTP protocol (one served by this test), the first turn through vLLM's
/v1/chat/completions, every later turn as a token-id prompt to /v1/completions whose ids arlo made
token-in/token-out: the previous prompt and completion ids, then what vLLM's own /tokenize renders
for the environment's message (session/adapters/environment_adapter.h). A recording proxy between
arlo and vLLM keeps every request and answer. The test checks, for every trajectory in
rollouts.jsonl, that each turn's prompt ids were sent exactly as vLLM's chat template renders the
conversation so far (asked of /tokenize here) and that they extend the previous turn's prompt and
completion, or, where the template does not extend them, that the trajectory split there and its
next piece's prompt is that rendering; and that the splits are counted.

The model is the tiny model of python/arlo_tiny_model.py with two changes, both for this test:
- a character-level tokenizer (no merges; the ChatML tokens, <|im_end|> the only special one), so
  that the random model's text tokenizes back to the ids it sampled: with the BPE merges the model
  emits non-canonical pieces ("u","s" where the tokenizer makes "us") and about half of its turns
  fail the extension for that reason alone;
- a ChatML template that has the extension property, except for conversations whose system message
  is "think: off": there it ends the generation prompt with an empty think block that a rendered
  assistant turn does not have (as Qwen3's template does with thinking off), so those trajectories
  fail the extension at every step, by construction: each splits into one piece per model turn
  (docs/environments.md, "When a trajectory splits"), and the splits are counted (multi_turn/split).

    .venv/bin/python tests/vllm/multi_turn_test.py --source . --arlo build/apps/arlo/arlo
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import read_jsonl, run_unittest  # noqa: E402
from vllm_server import MACHINERY_RUN, VllmServer, http_json, kill_group, set_args, tail  # noqa: E402

ARGS = None
STEPS = 3
TURNS = 3  # model turns per trajectory (the environment ends it after the third)
THINK_OFF = {"role": "system", "content": "think: off"}
TEMPLATE = (
    "{%- set think_off = messages[0]['role'] == 'system' and messages[0]['content'] == 'think: off' %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if think_off %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
TASKS = [
    {"id": "count", "messages": [{"role": "user", "content": "count to ten"}]},
    {"id": "think-off", "messages": [THINK_OFF, {"role": "user", "content": "name a color"}]},
    {"id": "sum", "messages": [{"role": "user", "content": "what is 12+30"}]},
    {"id": "think-off-2", "messages": [THINK_OFF, {"role": "user", "content": "say yes"}]},
]


def write_model(out):
    """The tiny model (seed 0) with a character-level tokenizer and TEMPLATE (see the docstring)."""
    import arlo_tiny_model as m
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    def char_level(seed):
        chars = m.byte_level_chars()
        vocab = {m.IM_END: 0, m.IM_START: 1}
        for b in [0x09, 0x0A] + list(range(0x20, 0x7F)):
            vocab[chars[b]] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(m.IM_END, special=True, normalized=False)])
        # Not special: a <|im_start|> the model emits stays in its text and tokenizes back to itself.
        tok.add_tokens([AddedToken(m.IM_START, special=False, normalized=False)])
        return tok, len(vocab)

    saved = m.build_tokenizer_json, m.CHAT_TEMPLATE
    m.build_tokenizer_json, m.CHAT_TEMPLATE = char_level, TEMPLATE
    try:
        m.write(out, seed=0)
    finally:
        m.build_tokenizer_json, m.CHAT_TEMPLATE = saved
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(pad_token=m.IM_END, unk_token=None, additional_special_tokens=[])
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def send(handler, status, data, content_type=None):
    """An HTTP/1.1 answer with its length (the connection stays open for arlo's keep-alive client)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type or "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def quiet(handler, *args):
    """No line per request in the test's output."""


class Recorder:
    """A proxy in front of vLLM that keeps (path, request, answer) of the completions and /tokenize."""
    KEEP = ("/v1/completions", "/v1/chat/completions", "/tokenize")

    def __init__(self, upstream):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.calls, self.lock = [], threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(recorder.upstream.hostname, recorder.upstream.port, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                if self.path in Recorder.KEEP and r.status == 200:
                    with recorder.lock:
                        recorder.calls.append((self.path, json.loads(body), json.loads(data)))
                send(self, r.status, data, r.getheader("Content-Type"))

            do_GET = do_POST = do_PUT = do_DELETE = forward
            log_message = quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def env_server():
    """The environment (docs/environments.md, the protocol): the task's messages stay the prompt; each
    model turn gets "turn k: go on" until the third, which ends it with the share of the model's turns
    that hold a digit as the reward."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/reset":
                out = {"messages": [], "state": 0}
            else:
                n = body["state"] + 1
                model = [t["content"] for t in body["turns"] if t["role"] == "assistant"]
                done = n >= TURNS
                out = {"messages": [] if done else [{"role": "user", "content": f"turn {n}: go on"}], "done": done,
                       "reward": sum(any(c.isdigit() for c in t) for t in model) / len(model) if done else None,
                       "state": n}
            send(self, 200, json.dumps(out).encode())

        log_message = quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class VllmRun:
    """One `arlo run` (args.arlo) of configs/vllm-cpu.yaml on one vLLM server behind a Recorder (both cleaned up
    by `test`): vLLM on the tiny model `write_model` makes (with arlo's weight-transfer backend and
    `vllm_args`), the tasks written to a file, the test's own `servers` shut down at the end, and the
    run's `sets` (its dir, the external server and the trainer's model added here). Fails `test`
    unless arlo exits 0; then `vllm`, `proxy`, `run_dir` and `ledger` (summary.json's) are there."""

    def __init__(self, test, args, prefix, write_model, tasks, vllm_args=()):
        self.args = args  # --source and --arlo of the test file that runs it
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        test.addCleanup(shutil.rmtree, self.tmp, True)
        self.model = os.path.join(self.tmp, "tiny")
        write_model(self.model)
        self.vllm = VllmServer(self.model, self.tmp, extra_env={"VLLM_SERVER_DEV_MODE": "1"},
                               extra_args=["--weight-transfer-config", '{"backend": "arlo"}', *vllm_args])
        test.addCleanup(self.vllm.stop)
        self.vllm.start()
        self.proxy = Recorder(self.vllm.url)
        self.tasks = os.path.join(self.tmp, "tasks.jsonl")
        with open(self.tasks, "w") as f:
            f.writelines(json.dumps(t) + "\n" for t in tasks)
        self.run_dir = os.path.join(self.tmp, "run")
        self.test = test

    def run(self, sets, servers=()):
        for server in (self.proxy.server, *servers):
            self.test.addCleanup(server.server_close)
            self.test.addCleanup(server.shutdown)
        sets = {**MACHINERY_RUN, "run.dir": self.run_dir, "inference.launch": "external",
                "inference.urls": json.dumps([self.proxy.url]), "trainer.model": self.model, "env.path": self.tasks, **sets}
        argv = [self.args.arlo, "run", os.path.join(self.args.source, "configs/vllm-cpu.yaml"), *set_args(sets)]
        log = os.path.join(self.tmp, "arlo.log")
        with open(log, "w") as out:
            arlo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.args.source, start_new_session=True,
                                    env=dict(os.environ, OMP_NUM_THREADS="1", ARLO_PYTHON=sys.executable))
        self.test.addCleanup(kill_group, arlo)
        self.test.assertEqual(arlo.wait(timeout=600), 0, tail(log))
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            self.ledger = json.load(f)["ledger"]
        return self


class MultiTurnVllmTest(unittest.TestCase):
    def test_turn_prompts_are_the_servers_own_rendering_and_extend_turn_by_turn(self):
        r = VllmRun(self, ARGS, "arlo-vllm-multi-turn-", write_model, TASKS)
        env, env_url = env_server()
        r.run({"run.max_steps": STEPS, "env.kind": "http", "env.url": env_url, "env.max_turns": TURNS,
               "env.max_trajectory_tokens": 200, "env.step_timeout_s": 60, "orchestrator.seq_len": 320,
               "orchestrator.batch_size": 8, "orchestrator.max_inflight": 8, "sampling.max_tokens": 6,
               "sampling.stop": "[]", "reward.modules": '[{"kind": "env"}]', "log.rollouts_every": 1}, [env])
        vllm, proxy, run_dir, ledger = r.vllm, r.proxy, r.run_dir, r.ledger
        settled = ledger["completed"] + sum(ledger["failed"].values()) + sum(ledger["cancelled"].values())
        self.assertEqual(ledger["dispatched"], settled + ledger["in_flight"], ledger)
        self.assertEqual(ledger["failed"], {}, ledger)
        self.check_turns(vllm, proxy.calls, read_jsonl(os.path.join(run_dir, "rollouts.jsonl")))
        steps = [r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "step"]
        self.assertEqual(len(steps), STEPS)
        self.assertEqual(steps[-1]["multi_turn/env_failed"], 0)
        self.assertGreater(self.splits_seen, 0)
        self.assertEqual(steps[-1]["multi_turn/split"], self.splits_seen)
        print(f"multi_turn_test: {STEPS} steps; multi_turn/split {steps[-1]['multi_turn/split']}, "
              f"turns_mean {steps[-1].get('multi_turn/turns_mean')}; {len(proxy.calls)} calls recorded", file=sys.stderr)

    def check_turns(self, vllm, calls, groups):
        # What was generated from each prompt: the chat turns' (vLLM's rendering of the task) and the
        # token-id turns'; a completion's ids are the prompt's continuation whatever its n.
        sent = {}
        for path, req, ans in calls:
            if path == "/tokenize":
                continue
            prompt = ans.get("prompt_token_ids") or ans["choices"][0]["prompt_token_ids"]
            if path == "/v1/completions":
                self.assertIsInstance(req["prompt"], list, "a later turn's prompt must be token ids")
                self.assertEqual(req["prompt"], prompt)
            sent.setdefault(tuple(prompt), []).extend(c["token_ids"] for c in ans["choices"])
        extended, split, self.splits_seen, self.eos_turns = 0, 0, 0, 0
        for g in groups:
            for s in g["samples"]:
                model_turns = [t for t in s["turns"] if t["role"] == "assistant"]
                self.assertEqual(len(model_turns), TURNS, s)
                self.assertEqual(s["env_reward"], sum(any(c.isdigit() for c in t["content"]) for t in model_turns) / TURNS)
                think_off = g["messages"][0] == THINK_OFF
                if think_off:
                    # The template's generation prompt is not what a rendered assistant turn starts
                    # with: the trajectory splits at every step, one piece per model turn.
                    self.assertEqual(len(s.get("segments", [])), TURNS, s)
                    self.splits_seen += len(s["segments"]) - 1
                    split += 1
                else:
                    self.assertNotIn("segments", s)
                    extended += 1
                self.check_trajectory(vllm, g["messages"], s, sent, think_off)
        self.assertGreater(extended, 0, "no trajectory of the extending tasks")
        self.assertGreater(split, 0, "no trajectory of the think-off tasks")
        print(f"multi_turn_test: {extended} trajectories of {TURNS} turns extend turn by turn ({self.eos_turns} "
              f"turns ended on the EOS); {split} split into {TURNS} pieces each ({self.splits_seen} splits)",
              file=sys.stderr)

    def check_trajectory(self, vllm, task_messages, sample, sent, splits):
        """Each model turn after the first was sent as the ids vLLM's /tokenize renders for the
        conversation so far (with the generation prompt), and those ids start with the previous turn's
        prompt and one of its completions; or, for a trajectory that `splits` at every step, those ids
        are the prompt of the turn's own piece (rollouts.jsonl: each piece's prompt token count) and
        do not extend the previous turn's. The model tokens add up to the sample's."""
        conversation = list(task_messages)
        previous = None  # the previous turn's prompt ids
        model_tokens, piece = 0, 0
        for turn in sample["turns"]:
            if turn["role"] == "assistant":
                status, rendered = http_json(vllm.url + "/tokenize",
                                             {"messages": conversation, "add_generation_prompt": True})
                self.assertEqual(status, 200, rendered)
                ids = tuple(rendered["tokens"])
                self.assertIn(ids, sent, f"turn prompt {conversation} was not sent as vLLM renders it")
                extends = previous is not None and any(
                    ids[:len(previous) + len(c)] == previous + tuple(c) and len(ids) > len(previous) + len(c)
                    for c in sent[previous])
                if splits:
                    self.assertFalse(extends, f"the prompt of {conversation} extends, yet the trajectory split")
                    self.assertEqual(sample["segments"][piece]["prompt_tokens"], len(ids), sample)
                    piece += 1
                elif previous is not None:
                    self.assertTrue(extends, f"the prompt of {conversation} does not extend the previous turn's ids")
                matches = [c for c in sent[ids] if self.text_of(vllm, c) == turn["content"]]
                self.assertTrue(matches, f"no completion of that prompt is the turn {turn['content']!r}")
                model_tokens += len(matches[0])
                self.eos_turns += bool(matches[0]) and matches[0][-1] == 0  # <|im_end|>: in token_ids, not in the text
                previous = ids
            conversation.append(turn)
        self.assertEqual(sample["model_tokens"], model_tokens, sample)

    @staticmethod
    def text_of(vllm, ids):
        status, out = http_json(vllm.url + "/detokenize", {"tokens": [i for i in ids if i != 0]})
        return out["prompt"]


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
