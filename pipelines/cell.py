"""DVC stage `cell`: see `kbench cell --help`."""

from kbench.cli import run_stage

run_stage("cell")
