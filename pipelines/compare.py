"""DVC stage `compare`: see `kbench compare --help`."""

from kbench.cli import run_stage

run_stage("compare")
