"""DVC stage `unlearn`: see `kbench unlearn --help`."""

from kbench.cli.app import run_stage
from kbench.stages import unlearn

run_stage(unlearn)
