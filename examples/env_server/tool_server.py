#!/usr/bin/env python3
"""An arlo environment server with a tool, standard library only: add numbers with `add`.

The environment protocol (docs/environments.md, "Tool calls"): reset gives the task's question and
the OpenAI schema of one tool, `add` ({"terms": [numbers]}); the model calls it with
<tool_call>{"name": "add", "arguments": {"terms": [2, 3]}}</tool_call>, which arlo parses and sends
here as the turn's OpenAI "tool_calls"; the server answers each call with a {"role": "tool",
"tool_call_id", "content"} message. A turn without calls is the final answer: reward 1 when its first
number is the task's answer, else 0. At most --max-turns model turns.

    python3 tool_server.py --port 8766     # then env.kind: http, env.url: http://127.0.0.1:8766
"""
import json
import re

from server import serve

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "The sum of the terms.",
    "parameters": {"type": "object", "properties": {"terms": {"type": "array", "items": {"type": "number"}}},
                   "required": ["terms"]}}}]


def reset(body, max_turns):
    return {"messages": [], "tools": TOOLS, "state": {"turns": 0}}


def call_tool(call):
    fn = call.get("function") or {}
    try:
        terms = json.loads(fn.get("arguments") or "{}").get("terms")
        result = str(sum(float(t) for t in terms)) if isinstance(terms, list) else "error: terms must be a list"
    except (ValueError, TypeError, AttributeError) as e:
        result = f"error: {e}"
    return {"role": "tool", "tool_call_id": call.get("id", ""), "content": result}


def step(body, max_turns):
    turns = body["turns"]
    if not turns or turns[-1].get("role") != "assistant":
        raise ValueError("turns must end with the model's turn (role assistant)")
    state = {"turns": int(body["state"]["turns"]) + 1}
    calls = turns[-1].get("tool_calls") or []
    if calls and state["turns"] < max_turns:
        return {"messages": [call_tool(c) for c in calls], "done": False, "reward": None, "state": state}
    match = re.search(r"-?\d+(\.\d+)?", turns[-1].get("content") or "")
    answer = str(body["task"].get("answer", ""))
    right = match is not None and answer != "" and float(match.group()) == float(answer)
    return {"messages": [], "done": True, "reward": 1.0 if right else 0.0, "state": state}


def main():
    serve({"/reset": reset, "/step": step}, __doc__.splitlines()[0], 8766, "--max-turns", 4)


if __name__ == "__main__":
    main()
