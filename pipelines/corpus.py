"""DVC stage `corpus`: see `kbench corpus --help`."""

from kbench.cli import run_stage

run_stage("corpus")
