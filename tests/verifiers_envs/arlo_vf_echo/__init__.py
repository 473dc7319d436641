"""A single-turn verifiers environment for arlo's tests (env.kind: verifiers).

The model is asked one question; the reward is 1 when its answer contains a letter and 0 otherwise
(deterministic for a given completion, so the tests can check the reward arlo records). The
taskset exports its own harness (arlo_vf_common.OfflineChatHarness): verifiers' built-in chat
program run with this Python instead of a uv script, because the test machine has no network.
"""

import verifiers.v1 as vf

from arlo_vf_common import OfflineChatHarness, completion_text


class EchoData(vf.TaskData):
    pass


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def has_letter(self, trace: vf.Trace) -> float:
        return 1.0 if any(c.isalpha() for c in completion_text(trace)) else 0.0


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 4


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [EchoTask(EchoData(prompt=f"say something about {i}"), self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["EchoTaskset", "OfflineChatHarness"]
