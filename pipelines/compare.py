"""DVC stage `compare`: see `kbench compare --help`."""

from kbench.cli.app import run_stage
from kbench.stages import compare

run_stage(compare)
