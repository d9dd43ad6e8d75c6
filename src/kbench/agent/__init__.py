"""The deployed ReAct agent: prompts, tools, parser, lockstep loop, elicited summary, and the
runner that deploys one cell's agent and appends its trace records resumably."""

from kbench.agent.parser import ParsedStep, parse_step
from kbench.agent.react import ReActAgent, Trajectory
from kbench.agent.runner import deployed_model, read_finished, run_cell, setup_cell
from kbench.agent.tools import Tool, ToolContext, ToolResult, call_tool, register_tool, registered_tools, tool_names

__all__ = [
    "ParsedStep",
    "ReActAgent",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Trajectory",
    "call_tool",
    "parse_step",
    "read_finished",
    "register_tool",
    "registered_tools",
    "run_cell",
    "deployed_model",
    "setup_cell",
    "tool_names",
]
