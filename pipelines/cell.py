"""DVC stage `cell`: see `kbench cell --help`."""

from kbench.cli.app import run_stage
from kbench.stages import cell

run_stage(cell)
