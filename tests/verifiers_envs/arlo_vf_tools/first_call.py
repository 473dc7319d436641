"""Runs verifiers' chat program (the file in argv[1], its arguments after it) with the tool_choice of
its first model call set to $ARLO_VF_FIRST_TOOL_CHOICE (JSON: "required", or {"type": "function",
"function": {"name": ...}}): that call is forced to call a tool, every later call chooses for itself
(the program's own default), so the episode still ends on the model's first answer without a call.
The program's `chat` is the one function every model call goes through (its compaction passes a
tool_choice of its own, which is kept). Started by arlo_vf_tools.ToolsHarness."""

import asyncio
import importlib.util
import json
import os
import sys


def load(path):
    spec = importlib.util.spec_from_file_location("arlo_vf_chat_program", path)
    program = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = program  # its dataclasses look their module up
    spec.loader.exec_module(program)  # not as __main__: its entry point stays put
    return program


def force_first_call(program, choice):
    chat, calls = program.chat, []

    async def chat_first_forced(client, model, messages, tools, *, tool_choice=None):
        if not calls and tools and tool_choice is None:
            tool_choice = choice
        calls.append(tool_choice)
        return await chat(client, model, messages, tools, tool_choice=tool_choice)

    program.chat = chat_first_forced


def main():
    path = sys.argv[1]
    program = load(path)
    force_first_call(program, json.loads(os.environ["ARLO_VF_FIRST_TOOL_CHOICE"]))
    sys.argv = [path, *sys.argv[2:]]
    asyncio.run(program.main())


if __name__ == "__main__":
    main()
