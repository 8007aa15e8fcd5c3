"""Tools the model can call, by name: an explicit name -> class dict users may extend."""

from agent_core.registry import resolve_subclass
from agent_core.tools.base import BaseTool, ToolError, ToolResult
from agent_core.tools.calculator import CalculatorTool
from agent_core.tools.python_sandbox import PythonTool

TOOLS: dict[str, type[BaseTool]] = {
    CalculatorTool.name: CalculatorTool,
    PythonTool.name: PythonTool,
}


def tool_class(name: str) -> type[BaseTool]:
    """The tool class for a configured name ('python' or 'package.module:Class')."""
    return resolve_subclass("tool", name, TOOLS, BaseTool)


__all__ = [
    "TOOLS",
    "BaseTool",
    "CalculatorTool",
    "PythonTool",
    "ToolError",
    "ToolResult",
    "tool_class",
]
