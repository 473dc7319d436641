"""What arlo's Python tests share (one home for it): the NCCL store driver they talk to, finding a
process by its command line, and the entry point of a unittest file run by ctest.

A test imports it from its own path:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import unittest


class StoreDriver:
    """The C++ rendezvous-store process of tests/integration/nccl_store (path in
    ARLO_NCCL_STORE_DRIVER); it prints 'port N' and answers 'get KEY', 'base64' and 'connections'
    on its stdin, one line each. Every failure raises AssertionError naming what went wrong."""

    def __init__(self, path=None):
        path = path or os.environ.get("ARLO_NCCL_STORE_DRIVER")
        if not path or not os.path.exists(path):
            raise AssertionError(f"ARLO_NCCL_STORE_DRIVER={path!r} does not name the built driver")
        self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"port (\d+)\n", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"the driver printed {line!r} instead of 'port N'")
        self.port = int(m.group(1))
        self.lock = threading.Lock()

    def ask(self, line):
        with self.lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise AssertionError(f"the driver died (exit {self.proc.poll()}) answering {line!r}")
        return answer.strip()

    def get(self, key):
        """The bytes stored under key, None when the store has none."""
        a = self.ask("get " + key)
        return None if a == "missing" else bytes.fromhex(a.split(" ", 1)[1])

    def base64(self):
        """The unique id as the text arlo offers for nccl_unique_id_b64."""
        kind, text = self.ask("base64").split(" ", 1)
        if kind != "base64":
            raise AssertionError(f"the driver answered {kind!r} to 'base64'")
        return text

    def connections(self):
        return int(self.ask("connections").split()[1])

    def close(self):
        """Ends the driver (its stdin closes) and checks that it exits 0 within 30 s."""
        self.proc.stdin.close()
        self.proc.stdout.close()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the driver did not exit when its stdin closed")
        if rc != 0:
            raise AssertionError(f"the driver exited with {rc}")


def find_pid(matches, env=None):
    """The pid of a live process whose argv (a list of str) matches(argv) accepts and whose environment
    holds every NAME=VALUE of `env` (a dict), None if none."""
    want = {f"{k}={v}".encode() for k, v in (env or {}).items()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
            if want and matches(argv):
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if not want <= set(f.read().split(b"\0")):
                        continue
        except OSError:  # gone since it was listed
            continue
        if matches(argv):
            return int(pid)
    return None


def read_jsonl(path, complete_only=False):
    """The JSON objects of a JSON-lines file, one per non-empty line; with complete_only, [] for a file
    not there yet and a last line still being written (no newline) left out."""
    if complete_only and not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().split("\n")
    if complete_only:
        lines = lines[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def run_unittest(test_globals, *required):
    """A test file's entry point: reads --source (the arlo source tree, whose python/ is imported)
    and each option in `required`, sets the file's ARGS to them, and runs its unittest cases with
    the rest of the command line."""
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True, help="the arlo source tree (its python/ is imported)")
    for name in required:
        p.add_argument(name, required=True)
    args, rest = p.parse_known_args()
    test_globals["ARGS"] = args
    sys.path.insert(0, os.path.join(args.source, "python"))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
