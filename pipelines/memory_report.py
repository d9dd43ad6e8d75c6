"""DVC stage `memory_report`: see `kbench memory-report --help`."""

from kbench.cli.app import run_stage
from kbench.stages import memory_report

# Guarded: a process pool's spawned workers import this script as their main module.
if __name__ == "__main__":
    run_stage(memory_report)
