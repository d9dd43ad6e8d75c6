"""DVC stage `corpus`: see `kbench corpus --help`."""

from kbench.cli.app import run_stage
from kbench.stages import corpus

run_stage(corpus)
