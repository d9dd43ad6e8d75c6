"""A user's plugin as `pip install` of their project leaves it: one module and a distribution's
metadata naming it in a `kbench.*` entry-point group (methods, operators, memory systems)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def user_project(folder: Path, module: str, source: str, group: str, entry: str) -> Path:
    """`folder` holding `module` (its `source`) and a dist-info naming it as `entry` in `group`."""
    (folder / f"{module}.py").write_text(source, encoding="utf-8")
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry} = {module}\n", encoding="utf-8")
    return folder


def docs_example(page: str, heading: str) -> str:
    """The first Python block under `heading` of docs/`page`: the how-to's plugin, as a user writes it."""
    section = (REPO / "docs" / page).read_text(encoding="utf-8").split(heading, 1)[1]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", section, re.S)[1])


def plugin_fixtures(module: str, source: str, group: str, entry: str, load_plugins: Callable[[], list[str]],
                    unload: Callable[[], None]) -> tuple[Callable, Callable]:
    """The fixtures `plugin_path` (the user's project, installed) and `plugin` (loaded in this
    process as its package loads it, unloaded afterwards) of one plugin."""

    @pytest.fixture
    def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return user_project(tmp_path_factory.mktemp("user-project"), module, source, group, entry)

    @pytest.fixture
    def plugin(plugin_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
        monkeypatch.syspath_prepend(str(plugin_path))
        assert module in load_plugins()
        yield plugin_path
        unload()
        sys.modules.pop(module, None)

    return plugin_path, plugin


def fresh_list(folder: Path, kind: str) -> list[dict]:
    """`kbench list KIND --json` in a fresh process with the user's project installed (on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "kbench.cli.main", "list", kind, "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)
