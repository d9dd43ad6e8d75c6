"""DVC stage `fit`: see `kbench fit --help`."""

from kbench.cli.app import run_stage
from kbench.stages import fit

run_stage(fit)
