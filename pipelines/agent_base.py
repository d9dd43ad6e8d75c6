"""DVC stage `agent_base`: see `kbench agent-base --help`."""

from kbench.cli import run_stage

run_stage("agent-base")
