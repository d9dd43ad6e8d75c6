"""K-Bench: does LLM unlearning survive agentic deployment?"""

import os
import platform

__version__ = "0.1.0"

#: The instruction set PyTorch's vectorized kernels, oneDNN and OpenBLAS (numpy's, scipy's) are
#: held to on x86 (set before the first tensor operation and before numpy loads OpenBLAS; an
#: exported variable wins). Float32 results depend in their last bits on the kernels' vector
#: width, so on every x86 CPU with AVX2 (AVX512 ones included) the same params give the same
#: bytes. `KBENCH_CPU_ISA=native` leaves the kernels the widest the CPU has (faster; the bytes
#: are then shared only with CPUs of the same instruction set).
PINNED_CPU_ISA = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
if platform.machine().lower() in ("x86_64", "amd64") and os.environ.get("KBENCH_CPU_ISA") != "native":
    for _name, _value in PINNED_CPU_ISA.items():
        os.environ.setdefault(_name, _value)
