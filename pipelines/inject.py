"""DVC stage `inject`: see `kbench inject --help`."""

from kbench.cli import run_stage

run_stage("inject")
