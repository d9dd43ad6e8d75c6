"""Python code run in a fresh process under one string hash seed (`PYTHONHASHSEED`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor


def run_under_hash_seed(code: str, seed: int, *args: str, **env: str) -> str:
    """`python -c code *args` with PYTHONHASHSEED=seed and `env` set: its stdout. A set iterates
    in an order that follows the seed, so output that follows a set's order differs between seeds."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONHASHSEED": str(seed)})
    assert done.returncode == 0, f"PYTHONHASHSEED={seed}: {done.stderr[-2000:]}"
    return done.stdout


def run_under_hash_seeds(code: str, seeds: Iterable[int], args: Callable[[int], tuple[str, ...]] = lambda seed: (),
                         **env: str) -> dict[int, str]:
    """`run_under_hash_seed` for each seed, as many processes at a time as there are cores (each
    on one thread): {seed: stdout}."""
    seeds = list(seeds)
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outputs = pool.map(lambda seed: run_under_hash_seed(code, seed, *args(seed), **env), seeds)
        return dict(zip(seeds, outputs))
