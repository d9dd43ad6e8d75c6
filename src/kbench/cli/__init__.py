"""`kbench`: one subcommand per pipeline stage plus the scoring and project tools.

`kbench.cli.main` is the console script; `kbench.cli.app` is the one command loop and error
handler it shares with the thin stage scripts in `pipelines/`. Command groups, one module
each: `stages` (the DVC stages, whose commands live beside each stage in `kbench.stages`),
`observer` (score, verdict, import-traces, power), `project` (setup, preset, params,
calibrate, sync) and `catalog` (list).

This package's `__init__` imports nothing, so a stage script loads only its own stage.
"""
