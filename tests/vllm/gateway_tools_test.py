"""OpenAI-format tool calls through arlo's policy gateway to a real vLLM server (issue 26, item 2):
an agent program (served by this test) drives each trajectory of an `arlo run` through the gateway
with `tools` and a `tool_choice` naming a function; vLLM, started with its hermes tool parser, renders
the tools with the model's chat template and answers with structured `tool_calls`. A recording proxy
between arlo and vLLM keeps every request and answer.

Checked: arlo passes `tools` and `tool_choice` to vLLM unchanged; the prompt ids of each call are
vLLM's own /tokenize rendering of the conversation WITH the tools (the template lists the tools' names,
so they differ from the rendering without them); every call vLLM answered with tool_calls reaches the
agent as OpenAI tool_calls with finish_reason "tool_calls"; the trajectory holds the call's tokens
(rollouts.jsonl: model tokens = the completion's token ids); the run ends ok with nothing failed.

The model is the random tiny model of python/arlo_tiny_model.py with a template that lists the tools.
A named tool_choice makes vLLM force the "<tool_call>{"name": ..., "arguments": " prefix; the random
model then writes the arguments until it closes them (a number, usually within a few dozen tokens:
max_tokens 300 leaves room), so most calls come back as tool calls; the test needs at least one.

    .venv/bin/python tests/vllm/gateway_tools_test.py --source . --arlo build/apps/arlo/arlo
"""

import json
import os
import sys
import threading
import unittest
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import run_unittest  # noqa: E402
from multi_turn_test import VllmRun, quiet, read_jsonl, send  # noqa: E402
from vllm_server import http_json  # noqa: E402

ARGS = None
STEPS = 2
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "adds two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
TOOL_CHOICE = {"type": "function", "function": {"name": "add"}}
# ChatML that lists the tools' names in a system turn when a call has tools.
TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools:' }}{%- for t in tools %}{{- ' ' + t['function']['name'] }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TASKS = [{"id": f"sum-{i}", "messages": [{"role": "user", "content": f"what is {i}+{i + 3}? use the tool"}]}
         for i in range(8)]


def write_model(out):
    import arlo_tiny_model as m
    saved = m.CHAT_TEMPLATE
    m.CHAT_TEMPLATE = TEMPLATE
    try:
        m.write(out, seed=0)
    finally:
        m.CHAT_TEMPLATE = saved


def agent_server(answers):
    """The agent program: one call per trajectory through the gateway (its base_url), with the tools
    and the named tool_choice; the reward is 1 when the answer is a tool call. Every answer is kept."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = {"model": "policy", "messages": job["task"]["messages"], "tools": TOOLS,
                    "tool_choice": TOOL_CHOICE, "max_tokens": 300, "temperature": 1.0,
                    "seed": len(answers) + 1}
            req = urllib.request.Request(job["base_url"] + "/chat/completions", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json",
                                                                 "Authorization": "Bearer " + job["api_key"]})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    answer = {"status": r.status, "body": json.loads(r.read())}
            except urllib.error.HTTPError as e:
                answer = {"status": e.code, "body": e.read().decode(errors="replace")}
            answers.append(answer)
            called = answer["status"] == 200 and bool(answer["body"]["choices"][0]["message"].get("tool_calls"))
            send(self, 200, json.dumps({"reward": 1.0 if called else 0.0}).encode())

        log_message = quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class GatewayToolsVllmTest(unittest.TestCase):
    def test_tools_reach_vllms_template_and_parser_and_its_tool_calls_reach_the_agent(self):
        r = VllmRun(self, ARGS, "arlo-vllm-gateway-tools-", write_model, TASKS,
                    ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
        answers = []
        agent, agent_url = agent_server(answers)
        r.run({"run.max_steps": STEPS, "env.kind": "jsonl", "env.max_trajectory_tokens": 400,
               "orchestrator.seq_len": 512, "orchestrator.batch_size": 4, "orchestrator.group_size": 2,
               "orchestrator.max_inflight": 4, "sampling.stop": "[]", "gateway.agent_url": agent_url,
               "reward.modules": '[{"kind": "env"}]', "log.rollouts_every": 1}, [agent])
        vllm, proxy, run_dir = r.vllm, r.proxy, r.run_dir
        self.assertEqual(r.ledger["failed"], {}, r.ledger)

        chats = [(req, ans) for path, req, ans in proxy.calls if path == "/v1/chat/completions"]
        self.assertGreater(len(chats), 0, "no chat call reached vLLM")
        for req, ans in chats:
            self.assertEqual(req.get("tools"), TOOLS, "the tools must reach vLLM as the agent gave them")
            self.assertEqual(req.get("tool_choice"), TOOL_CHOICE)
            with_tools = http_json(vllm.url + "/tokenize", {"messages": req["messages"], "tools": TOOLS,
                                                            "add_generation_prompt": True})[1]["tokens"]
            without = http_json(vllm.url + "/tokenize", {"messages": req["messages"],
                                                         "add_generation_prompt": True})[1]["tokens"]
            self.assertNotEqual(with_tools, without)
            self.assertEqual(ans["prompt_token_ids"], with_tools, "the prompt is vLLM's rendering with the tools")

        vllm_calls = [a for _, a in chats if a["choices"][0]["message"].get("tool_calls")]
        agent_calls = [a["body"]["choices"][0] for a in answers
                       if a["status"] == 200 and a["body"]["choices"][0]["message"].get("tool_calls")]
        self.assertTrue(all(a["status"] == 200 for a in answers), answers)
        self.assertGreater(len(vllm_calls), 0, "vLLM answered no call with tool_calls")
        self.assertEqual(len(agent_calls), len(vllm_calls), "every tool call vLLM parsed must reach the agent")
        for choice in agent_calls:
            self.assertEqual(choice["finish_reason"], "tool_calls")
            for call in choice["message"]["tool_calls"]:
                self.assertEqual(call["type"], "function")
                self.assertEqual(call["function"]["name"], "add")
                self.assertIsInstance(call["function"]["arguments"], str)
                self.assertTrue(call["id"])

        completions = {tuple(a["choices"][0]["token_ids"]) for _, a in chats}
        samples = [s for g in read_jsonl(os.path.join(run_dir, "rollouts.jsonl")) for s in g["samples"]]
        self.assertGreater(len(samples), 0)
        for s in samples:
            self.assertIn(s["model_tokens"], {len(c) for c in completions}, s)
        print(f"gateway_tools_test: {len(chats)} calls with tools; {len(vllm_calls)} answered with tool_calls, "
              f"all passed on to the agent; {len(samples)} trajectories recorded", file=sys.stderr)


if __name__ == "__main__":
    run_unittest(globals(), "--arlo")
