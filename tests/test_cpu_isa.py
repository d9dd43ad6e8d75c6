"""Importing kbench holds PyTorch's kernels to AVX2 on x86 (the same bytes on AVX2 and AVX512
CPUs), before any tensor operation and in every process that imports it; an exported value
wins, and KBENCH_CPU_ISA=native leaves the CPU's widest kernels."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_CAPABILITY = "import kbench, torch; print(torch.backends.cpu.get_cpu_capability())"

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the pin is for x86 CPUs; other CPUs keep their own kernels")


def _capability(code: str, **env: str) -> str:
    pinned = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE")
    environ = {k: v for k, v in os.environ.items() if k not in pinned}
    out = subprocess.run([sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


def test_kbench_pins_avx2_in_a_fresh_process():
    assert _capability(_CAPABILITY) == "AVX2"
    assert _capability("import kbench, os; print(os.environ['ONEDNN_MAX_CPU_ISA'])") == "AVX2"
    openblas = ("import kbench, numpy, threadpoolctl; print(sorted({i['architecture'] for i in "
                "threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'}))")
    assert _capability(openblas) == "['Haswell']"


def test_an_exported_value_wins_and_native_leaves_the_cpus_own():
    assert _capability(_CAPABILITY, ATEN_CPU_CAPABILITY="default") == "DEFAULT"
    native = _capability("import torch; print(torch.backends.cpu.get_cpu_capability())")
    assert _capability(_CAPABILITY, KBENCH_CPU_ISA="native") == native
