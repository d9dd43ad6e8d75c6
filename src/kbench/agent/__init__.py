"""The deployed ReAct agent: prompts, tools, parser, lockstep loop and elicited summary."""

from kbench.agent.parser import ParsedStep, parse_step
from kbench.agent.react import ReActAgent, Trajectory
from kbench.agent.tools import Tool, ToolContext, ToolResult, call_tool, register_tool, registered_tools

__all__ = [
    "ParsedStep",
    "ReActAgent",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Trajectory",
    "call_tool",
    "parse_step",
    "register_tool",
    "registered_tools",
]
