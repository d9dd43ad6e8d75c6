"""Python code run in a fresh process under one string hash seed (`PYTHONHASHSEED`)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_under_hash_seed(code: str, seed: int, *args: str, **env: str) -> str:
    """`python -c code *args` with PYTHONHASHSEED=seed and `env` set: its stdout. A set iterates
    in an order that follows the seed, so output that follows a set's order differs between seeds."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONHASHSEED": str(seed)})
    assert done.returncode == 0, f"PYTHONHASHSEED={seed}: {done.stderr[-2000:]}"
    return done.stdout
