"""One module per DVC stage (`dvc.yaml`): corpus, index, agent_base, inject, fit, unlearn, probes, cell, compare.

Each exposes `run_<stage>_stage(params, ...)`, which the `kbench` command of the same name
calls (`kbench.cli`) and the thin script in `pipelines/` reaches through it.
"""
