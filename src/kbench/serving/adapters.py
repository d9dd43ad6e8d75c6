"""LoRA adapters a server applies by name (vLLM's `--enable-lora --lora-modules NAME=PATH`).

On a backend that `serves_adapters`, a cell does not load its adapter into weights: it asks
the server for the adapter by name, request by request. The name is the folder's path with
the first 12 hex digits of its content hash (`<path>@<hash>`), so a server started before an
adapter was retrained does not answer with stale weights: it serves no adapter of that name,
and the cell stops before its first trajectory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from kbench import io

#: The LoRA ranks vLLM accepts as `--max-lora-rank` (its LoRAConfig); an adapter's rank is
#: served under the smallest one at least as large.
VLLM_MAX_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
#: The digits of the folder hash a served name carries.
HASH_DIGITS = 12


def served_name(path: str | Path) -> str:
    """The name a server serves the adapter folder `path` under: its path, relative to this
    working directory where it lies inside it, and its content hash."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"adapter folder {folder} does not exist")
    resolved = folder.resolve()
    try:
        shown = resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        shown = resolved.as_posix()
    return f"{shown}@{io.folder_hash(folder)[:HASH_DIGITS]}"


def lora_rank(path: str | Path) -> int:
    """The rank `r` of the peft LoRA adapter in `path`."""
    config = Path(path) / "adapter_config.json"
    try:
        rank = json.loads(config.read_text())["r"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{config} is not a peft LoRA config with a rank r") from None
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{config}: r must be a positive integer, got {rank!r}")
    return rank


def vllm_flags(adapters: Sequence[str | Path]) -> list[str]:
    """`vllm serve`'s flags that serve `adapters` by name: LoRA on, the smallest rank bound vLLM
    accepts that holds every adapter, and one `NAME=PATH` per adapter (paths as given: run the
    server from the same working directory)."""
    if not adapters:
        raise ValueError("no adapter to serve")
    largest = max(lora_rank(path) for path in adapters)
    bound = next((rank for rank in VLLM_MAX_LORA_RANKS if rank >= largest), None)
    if bound is None:
        raise ValueError(f"an adapter has rank {largest}; vLLM serves LoRA ranks up to {VLLM_MAX_LORA_RANKS[-1]}")
    modules = [f"{served_name(path)}={os.fspath(path)}" for path in adapters]
    return ["--enable-lora", "--max-lora-rank", str(bound), "--lora-modules", *modules]
