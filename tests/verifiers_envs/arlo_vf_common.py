"""What arlo's test environments share: an offline chat harness and a completion reader."""

import hashlib
import os
import sys

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarness


class _LocalScripts:
    """A runtime that runs verifiers' PEP 723 chat program with this interpreter (whose
    environment has the program's packages) instead of syncing a uv environment for it."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script, env=None, *, activate=True):
        data = script.encode() if isinstance(script, str) else script
        directory = os.path.join(os.environ.get("TMPDIR", "/tmp"), "arlo-vf-scripts")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, hashlib.sha256(data).hexdigest() + ".py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return [sys.executable, path]


class OfflineChatHarness(NullHarness):
    """verifiers' null harness (its chat program, tools through MCP), run offline."""

    async def setup(self, runtime) -> None:
        await _LocalScripts(runtime).prepare_uv_script("")

    async def launch(self, ctx, trace, runtime, *args, **kwargs):
        return await super().launch(ctx, trace, _LocalScripts(runtime), *args, **kwargs)


def completion_text(trace: vf.Trace) -> str:
    """The text of the trace's assistant messages."""
    out = []
    for node in trace.nodes:
        message = node.message
        if getattr(message, "role", None) == "assistant":
            content = getattr(message, "content", None)
            out.append(content if isinstance(content, str) else str(content or ""))
    return "\n".join(out)
