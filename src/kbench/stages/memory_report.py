"""The `memory_report` stage (`kbench memory-report`): the memory lane's results page
(`memory.results`) from the scores every system of `memory.systems` left in
`memory.out_dir/<system>/scores.json`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kbench import io
from kbench.config import Params
from kbench.memory.report import render_results
from kbench.memory.scoring import MemoryScores
from kbench.stages.inputs import shaping
from kbench.stages.memory import SCORES_FILE
from kbench.versioned import read_versioned

log = logging.getLogger(__name__)

COMMAND = "memory-report"
HELP = "write the memory lane's results page from every system's scores (memory.results)"


class MemoryReportError(ValueError):
    """A system of memory.systems without scores (its `memory` stage has not run)."""


@dataclass(frozen=True)
class Options:
    """`kbench memory-report` takes no options."""


def main(params: Params, options: Options) -> int:
    config = params.memory
    scores = {}
    for system in config.systems:
        path = Path(config.out_dir) / system / SCORES_FILE
        if not path.is_file():
            raise MemoryReportError(f"no scores for memory system {system} at {path}: run `dvc repro memory` first")
        scores[system] = read_versioned(path, MemoryScores, stage="memory").model_dump(mode="json")
    page = render_results(scores, model=params.base_model, params_digest=io.json_digest(shaping(params, "memory")))
    io.write_text(config.results, page)
    log.info("results page %s (%d systems)", config.results, len(scores))
    return 0
