"""The `add` tool of arlo_vf_tools, an MCP server verifiers starts as `python -m arlo_vf_tools.tools`.
Its terms are bounded (0 to 999, in its JSON schema): a server that constrains a forced call to the
schema (vLLM) keeps the random test model's numbers, and so its calls, short."""

from typing import Annotated

import verifiers.v1 as vf
from pydantic import Field

Term = Annotated[int, Field(ge=0, le=999)]


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "arlo"

    @vf.tool
    def add(self, a: Term, b: Term) -> str:
        """Add two integers."""
        return str(a + b)


if __name__ == "__main__":
    AddToolset.run()
