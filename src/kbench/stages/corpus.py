"""The `corpus` stage (`kbench corpus`): generate (or import) the corpus into `artifacts/corpus` in the v1 layout."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kbench import tracking
from kbench.cli.app import add_command
from kbench.config import Params
from kbench.corpus import Corpus, build_corpus
from kbench.design import load_design

log = logging.getLogger(__name__)

COMMAND = "corpus"
CORPUS_DIR = Path("artifacts/corpus")


def run_corpus_stage(params: Params, out: Path = CORPUS_DIR, *, track: bool = True) -> Corpus:
    """Build the corpus of `params.corpus` in `out` and record it (pool sizes as metrics)."""
    corpus = build_corpus(params.corpus, out)
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
