"""The `corpus` stage (`kbench corpus`): generate (or import) the corpus into `artifacts/corpus` in the v1 layout."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kbench import tracking
from kbench.cli.app import add_command
from kbench.config import GENERATED, Params
from kbench.corpus import Corpus, build_corpus
from kbench.design import load_design
from kbench.records import SPLITS

log = logging.getLogger(__name__)

COMMAND = "corpus"
CORPUS_DIR = Path("artifacts/corpus")
#: The folder of corpora, a DVC dependency of this stage (dvc.yaml): DVC sees edits only here.
DATA_DIR = Path("data")


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


def cmd_corpus(args: argparse.Namespace) -> int:
    run_corpus_stage(load_design(args.params), Path(args.out), track=not args.no_track)
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, COMMAND, cmd_corpus, "build (or import) the corpus: entities, pools, queries")
    p.add_argument("--out", default=str(CORPUS_DIR), help="output folder (default: %(default)s)")
