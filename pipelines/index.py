"""DVC stage `index`: see `kbench index --help`."""

from kbench.cli import run_stage

run_stage("index")
