"""DVC stage `index`: see `kbench index --help`."""

from kbench.cli.app import run_stage
from kbench.stages import index

run_stage(index)
