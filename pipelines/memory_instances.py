"""DVC stage `memory_instances`: see `kbench memory-instances --help`."""

from kbench.cli.app import run_stage
from kbench.stages import memory_instances

# Guarded: a process pool's spawned workers import this script as their main module.
if __name__ == "__main__":
    run_stage(memory_instances)
