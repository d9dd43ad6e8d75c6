"""`kbench`: one subcommand per pipeline stage plus the scoring and project tools.

`kbench.cli.main` is the console script; `kbench.cli.app` is the one command loop and error
handler it shares with the thin stage scripts in `pipelines/`. Command groups, one module
each: `stages` (setup and the DVC stages, whose commands live beside each stage in
`kbench.stages`), `observer` (score, verdict, import-traces) and `project` (calibrate,
sync, preset, params).

This package's `__init__` imports nothing, so a stage script loads only its own stage.
"""
