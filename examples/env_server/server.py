#!/usr/bin/env python3
"""An arlo environment server using only the Python standard library: guess the number.

The environment protocol (docs/environments.md), JSON over POST:

  POST /reset {"task": {...}}                              -> {"messages": [...], "state": ...}
  POST /step  {"task": {...}, "state": ..., "turns": [...]} -> {"messages": [...], "done": bool,
                                                               "reward": number | null, "state": ...}

The game: the server thinks of a number in [1, 100] (the task's info.secret, or one derived from the
task's id), the model guesses, the server says "higher" or "lower", up to --max-guesses guesses.
Reward: 1 for finding it, less for each extra guess (1 - 0.1 * (guesses - 1)), 0 when every guess
missed. The state carries everything ({"secret", "guesses"}), so the server keeps nothing per
trajectory and can serve any number of them at once.

    python3 server.py --port 8765          # then env.kind: http, env.url: http://127.0.0.1:8765

It prints "listening on port N" once it accepts connections (--port 0 picks a free port).
"""
import argparse
import hashlib
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOW, HIGH = 1, 100


def secret_of(task):
    info = task.get("info") or {}
    if isinstance(info.get("secret"), int) and LOW <= info["secret"] <= HIGH:
        return info["secret"]
    digest = hashlib.sha256(str(task.get("id", "")).encode()).digest()
    return LOW + int.from_bytes(digest[:4], "big") % (HIGH - LOW + 1)


def reset(body, max_guesses):
    task = body["task"]
    prompt = f"I am thinking of a number from {LOW} to {HIGH}. You have {max_guesses} guesses.\nguess: "
    return {"messages": [{"role": "user", "content": prompt}],
            "state": {"secret": secret_of(task), "guesses": 0}}


def step(body, max_guesses):
    state, turns = body["state"], body["turns"]
    if not turns or turns[-1].get("role") != "assistant":
        raise ValueError("turns must end with the model's turn (role assistant)")
    guesses = int(state["guesses"]) + 1
    secret = int(state["secret"])
    match = re.search(r"-?\d+", turns[-1].get("content") or "")
    state = {"secret": secret, "guesses": guesses}
    if match and int(match.group()) == secret:
        return {"messages": [], "done": True, "reward": max(0.0, 1.0 - 0.1 * (guesses - 1)), "state": state}
    if guesses >= max_guesses:
        return {"messages": [], "done": True, "reward": 0.0, "state": state}
    if not match:
        hint = "that is not a number"
    else:
        hint = "higher" if int(match.group()) < secret else "lower"
    return {"messages": [{"role": "user", "content": f"\n{hint}\nguess: "}], "done": False, "reward": None,
            "state": state}


def make_handler_for(routes, limit):
    """The protocol's HTTP handler: each route is route(body, limit) -> the reply (tool_server.py too)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as arlo's client expects

        def do_POST(self):
            route = routes.get(self.path.rstrip("/"))
            if route is None:
                return self.reply(404, {"error": f"no route {self.path}: use /reset or /step"})
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                answer = route(body, limit)
            except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
                return self.reply(400, {"error": f"bad request: {e!r}"})
            self.reply(200, answer)

        def reply(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            for name, value in (("Content-Type", "application/json"), ("Content-Length", str(len(data)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):  # quiet: one line per request is noise in a run's log
            pass

    return Handler


def serve(routes, description, default_port, limit_flag, limit_default):
    """Parses --host, --port and the limit flag, serves `routes` (make_handler_for) until interrupted."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port, help="0 picks a free port")
    parser.add_argument(limit_flag, type=int, default=limit_default)
    args = parser.parse_args()
    limit = getattr(args, limit_flag.lstrip("-").replace("-", "_"))
    server = ThreadingHTTPServer((args.host, args.port), make_handler_for(routes, limit))
    print(f"listening on port {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


def main():
    serve({"/reset": reset, "/step": step}, __doc__.splitlines()[0], 8765, "--max-guesses", 7)


if __name__ == "__main__":
    main()
