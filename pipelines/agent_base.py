"""DVC stage `agent_base`: see `kbench agent-base --help`."""

from kbench.cli.app import run_stage
from kbench.stages import agent_base

# Guarded: a process pool's spawned workers import this script as their main module.
if __name__ == "__main__":
    run_stage(agent_base)
