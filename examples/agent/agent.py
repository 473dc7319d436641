#!/usr/bin/env python3
"""An agent program for arlo's policy gateway (docs/environments.md, "The policy gateway").

arlo POSTs one JSON object per trajectory to this server:
    {"task": {...}, "trajectory": "<id>", "base_url": "http://127.0.0.1:PORT/t/<id>/v1",
     "api_key": "<the run's token>", "headers": {"X-Arlo-Trajectory": "<id>"},
     "sampling": {"temperature", "top_p", "max_tokens"}}
The agent uses base_url as its OpenAI-compatible model endpoint for as many calls as it likes, each
call's prompt extending the previous one (the trajectory), and answers {"reward": r}: that closes
the trajectory, and r is what arlo trains on (reward module `env`).

This one answers an arithmetic-style task ("23+45=", answer "68"): it asks the model, checks the
answer and, when it is wrong, tells the model so and lets it try again, up to --turns times. Reward:
1 for a right answer at the first try, 0.5 at a later one, 0 otherwise. Standard library only (the
OpenAI SDK is used instead with --sdk, when it is installed).

Usage: agent.py [--port 0] [--turns 2] [--mode completions|chat] [--sdk]
It prints "listening on 127.0.0.1:PORT" once it serves. Test-only behaviours (--behave): "token_ids"
(completions with token-id prompts: the gateway's own ids, plus the feedback in arlo-worker's
character vocabulary), "rewrite" (the second call changes history), "garbage" (answers no reward),
"no_calls" (a reward without a model call), "unknown" (a call naming a trajectory that does not exist).
"""
import argparse
import json
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def post(url, body, api_key, headers=None, timeout=600):
    """POSTs JSON; returns (status, parsed body or text)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + api_key)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def char_ids(text):
    """arlo-worker's character vocabulary (reference/tokenizer.h): '\\n' is 8, ' '..'~' are 9..103."""
    return [8 if c == "\n" else 9 + ord(c) - 32 for c in text if c == "\n" or 32 <= ord(c) <= 126]


class Ended(Exception):
    """The gateway ended the trajectory (409): e.g. a call rewrote its history."""


class Model:
    """One trajectory's model: the gateway through urllib, or the OpenAI SDK."""

    def __init__(self, job, args):
        self.base_url = job["base_url"]
        self.api_key = job.get("api_key", "none")
        self.sampling = job.get("sampling", {})
        self.args = args
        self.client = None
        if args.sdk:
            import openai  # only with --sdk

            self.client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)

    def call(self, route, **fields):
        """One model call (route "completions" or "chat/completions"); raises Ended on a 409."""
        body = dict(model="policy", max_tokens=self.sampling.get("max_tokens", 8),
                    temperature=self.sampling.get("temperature", 1.0), **fields)
        if self.client is not None:
            api = self.client.completions if route == "completions" else self.client.chat.completions
            return api.create(**body).model_dump()
        status, answer = post(f"{self.base_url}/{route}", body, self.api_key)
        if status == 409:
            raise Ended(answer)
        if status != 200:
            raise RuntimeError(f"gateway answered {status}: {answer}")
        return answer


def ask(model, args, messages, prompt, ids):
    """One model call of the trajectory; returns (answer, its text)."""
    if args.mode == "chat":
        out = model.call("chat/completions", messages=messages)
        return out, out["choices"][0]["message"]["content"] or ""
    out = model.call("completions", prompt=ids if args.behave == "token_ids" and ids is not None else prompt)
    return out, out["choices"][0]["text"]


def solve(job, args):
    """Runs one trajectory; returns the reward."""
    task = job["task"]
    question = task.get("prompt") or "\n".join(m["content"] for m in task.get("messages", []))
    answer = str(task.get("answer", "")).strip()
    model = Model(job, args)
    if args.behave == "no_calls":
        return 0.0
    if args.behave == "unknown":
        post(job["base_url"].replace(job["trajectory"], "no-such-trajectory") + "/completions",
             {"prompt": "x"}, model.api_key)
    messages = [{"role": "user", "content": question}]
    prompt = question
    ids = None
    for turn in range(args.turns):
        try:
            out, text = ask(model, args, messages, prompt, ids)
        except Ended:  # what the trajectory holds so far is trained, with this reward
            return 0.0
        if text.strip() == answer:
            return 1.0 if turn == 0 else 0.5
        feedback = f"\nwrong, try again\n{question}"
        if args.behave == "rewrite" and turn == 0:
            feedback = ""
            prompt = "something else entirely: " + question
            continue
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "wrong, try again"}]
        prompt = prompt + text + feedback
        # Token-in/token-out by hand: what the model saw and wrote, then the feedback's ids.
        choice = out["choices"][0]
        ids = out["prompt_token_ids"] + choice["token_ids"] + char_ids(feedback)
    return 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    args = None

    def do_POST(self):
        try:
            job = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if self.args.behave == "garbage":
                reply, status = {"score": "high"}, 200
            else:
                reply, status = {"reward": solve(job, self.args)}, 200
        except Exception as e:  # the trajectory fails with the reason; the server stays up
            reply, status = {"error": str(e)}, 500
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--mode", choices=["completions", "chat"], default="completions")
    p.add_argument("--sdk", action="store_true", help="call the gateway through the OpenAI SDK")
    p.add_argument("--behave", default="", choices=["", "token_ids", "rewrite", "garbage", "no_calls", "unknown"])
    args = p.parse_args()
    Handler.args = args
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"listening on {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
