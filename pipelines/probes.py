"""DVC stage `probes`: see `kbench probes --help`."""

from kbench.cli.app import run_stage
from kbench.stages import probes

run_stage(probes)
