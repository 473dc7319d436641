"""A multi-turn tool environment for arlo's tests (env.kind: verifiers): the model is offered one tool,
`add(a, b)`, served by verifiers as an MCP tool server; the chat program runs the calls the model
makes and hands it the results, turn after turn. The reward is 1 when the model called the tool and
0.5 when it answered without it (so a run trains either way), deterministic for a given trajectory.
"""

import verifiers.v1 as vf

from arlo_vf_common import OfflineChatHarness
from arlo_vf_tools.tools import AddToolset


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


__all__ = ["ToolsTaskset", "OfflineChatHarness"]
