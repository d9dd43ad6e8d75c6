"""DVC stage `agent_base`: see `kbench agent-base --help`."""

from kbench.cli.app import run_stage
from kbench.stages import agent_base

run_stage(agent_base)
