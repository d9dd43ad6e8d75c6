"""The `corpus` stage (`kbench corpus`): generate (or import) the corpus into `artifacts/corpus` in the v1 layout."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbench import tracking
from kbench.config import GENERATED, Params
from kbench.corpus import CORPUS_DIR, Corpus, build_corpus
from kbench.records import SPLITS
from kbench.stages import option, track_option

log = logging.getLogger(__name__)

COMMAND = "corpus"
HELP = "build (or import) the corpus: entities, pools, queries"
#: The folder of corpora, a DVC dependency of this stage (dvc.yaml): DVC sees edits only here.
DATA_DIR = Path("data")


def corpus_option() -> Any:
    """The `--corpus` option of a stage that reads the corpus."""
    return option(CORPUS_DIR, "corpus folder")


def watched_by_dvc(source: str) -> bool:
    """Whether DVC reruns this stage when the corpus folder `source` changes in place."""
    return Path(source).resolve().is_relative_to(DATA_DIR.resolve())


def run_corpus_stage(params: Params, out: Path = CORPUS_DIR, *, track: bool = True) -> Corpus:
    """Build the corpus of `params.corpus` in `out` and record it (pool sizes as metrics)."""
    corpus = build_corpus(params.corpus, out)
    for split in SPLITS:  # an imported corpus's pools may be too small: say so now, not at the first cell
        for seed in params.seeds:
            corpus.sample_queries(split, params.queries.n_per_split, seed, tuple(params.queries.fields))
    if corpus.source != GENERATED and not watched_by_dvc(corpus.source):
        log.warning(
            "corpus.source %s is outside %s/: dvc repro reruns this stage when corpus.source changes, "
            "not when that folder's files do, and dvc push leaves it out; copy it under %s/ to version it",
            corpus.source, DATA_DIR, DATA_DIR,
        )
    sizes = {name: len(ids) for name, ids in corpus.pools.items()}
    log.info("corpus %s: %d entities, pools %s", corpus.source, len(corpus.entities), sizes)
    metrics = {f"pool_{name}": size for name, size in sizes.items()}
    metrics["n_entities"] = len(corpus.entities)
    metrics["n_distractors"] = len(corpus.distractor_ids)
    tracking.record_output(
        params, out, tracking.KIND_CORPUS, corpus.fingerprint(),
        tags={tracking.TAG_CORPUS_SOURCE: corpus.source}, metrics=metrics, track=track,
    )
    return corpus


@dataclass(frozen=True)
class Options:
    """`kbench corpus`'s options."""

    #: Where the corpus is written.
    out: Path = option(CORPUS_DIR, "output folder")
    #: Record the corpus as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    run_corpus_stage(params, options.out, track=options.track)
    return 0
