"""Shared fixtures: offline model loading, an isolated MLflow store per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
KBENCH_V1 = SHARED / "data" / "kbench-v1"
DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct"

# No hub at run time: every model comes from a package or a local folder.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
# Stage commands call `python`/`kbench`; make them the ones of this interpreter's venv.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


@pytest.fixture
def kbench_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway project root: MLflow store and artifacts land in tmp_path."""
    monkeypatch.setenv("KBENCH_ROOT", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def device() -> str:
    """Where the engine and LoRA tests put their models: KBENCH_TEST_DEVICE, default cpu (`cuda`: a GPU)."""
    return os.environ.get("KBENCH_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The converted SmolLM2-135M-Instruct folder (made by `kbench setup`, i.e. `make setup`)."""
    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.fail(f"{DEFAULT_MODEL} is missing: run `make setup` (kbench setup) first")
    return DEFAULT_MODEL
