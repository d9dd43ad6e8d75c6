"""DVC stage `inject`: see `kbench inject --help`."""

from kbench.cli.app import run_stage
from kbench.stages import inject

run_stage(inject)
