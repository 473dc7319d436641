"""The `add` tool of arlo_vf_tools, an MCP server verifiers starts as `python -m arlo_vf_tools.tools`."""

import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "arlo"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


if __name__ == "__main__":
    AddToolset.run()
