"""A multi-turn tool environment for arlo's tests (env.kind: verifiers): the model is offered one tool,
`add(a, b)` (on the wire `arlo_add`: verifiers prefixes a toolset's tools with its TOOL_PREFIX),
served by verifiers as an MCP tool server; the chat program runs the calls the model makes and hands
it the results, turn after turn, until the model answers without a call. The reward is 1 when the
model called the tool and 0.5 when it answered without it (so a run trains either way),
deterministic for a given trajectory.

An untrained model never calls the tool by itself. The harness's `first_tool_choice` forces the
episode's first model call (arlo's env.verifiers_args: `{agent: {harness: {id: arlo_vf_tools,
first_tool_choice: {type: function, function: {name: arlo_add}}}}}`): that call goes out with this
tool_choice, which a server that constrains tool calls (vLLM with `--enable-auto-tool-choice`)
turns into a call; later calls choose for themselves, so the episode ends at the model's first
answer without a call (bound it with `agent.max_turns`).
"""

import json
import os
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harness import Harness
from verifiers.v1.harnesses.null import NullHarnessConfig

from arlo_vf_common import OfflineChatHarness
from arlo_vf_tools.tools import AddToolset

FIRST_CALL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_call.py")


class ToolsData(vf.TaskData):
    pass


class ToolsTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ToolsTask(vf.Task[ToolsData, vf.State, ToolsTaskConfig]):
    @classmethod
    def toolsets(cls, config: ToolsTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def used_tool(self, trace: vf.Trace) -> float:
        roles = [getattr(node.message, "role", None) for node in trace.nodes]
        return 1.0 if "tool" in roles else 0.5


class ToolsConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: ToolsTaskConfig = ToolsTaskConfig()


class ToolsTaskset(vf.Taskset[ToolsTask, ToolsConfig]):
    def load(self) -> list[ToolsTask]:
        return [ToolsTask(ToolsData(prompt=f"what is {i}+{i + 3}? use the add tool"), self.config.task)
                for i in range(self.config.num_tasks)]


class ToolsHarnessConfig(NullHarnessConfig):
    first_tool_choice: str | dict[str, Any] | None = None
    """The tool_choice of each episode's first model call ("required", or a named function);
    None: every call chooses for itself."""


class _FirstCallForced:
    """A runtime that starts the chat program through first_call.py with the forced choice."""

    def __init__(self, runtime, choice):
        self._runtime, self._choice = runtime, choice

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    async def run_program(self, argv, env):
        env = {**env, "ARLO_VF_FIRST_TOOL_CHOICE": json.dumps(self._choice)}
        return await self._runtime.run_program([argv[0], FIRST_CALL, *argv[1:]], env)


class ToolsHarness(OfflineChatHarness, Harness[ToolsHarnessConfig]):
    """The offline chat harness, its first model call optionally forced to call a tool."""

    async def launch(self, ctx, trace, runtime, *args, **kwargs):
        if self.config.first_tool_choice is not None:
            runtime = _FirstCallForced(runtime, self.config.first_tool_choice)
        return await super().launch(ctx, trace, runtime, *args, **kwargs)


__all__ = ["ToolsTaskset", "ToolsHarness"]
