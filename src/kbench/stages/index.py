"""The `index` stage (`kbench index`): the R-text substrate's FAISS index over target and distractor passages."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kbench.cli.app import add_command
from kbench.corpus import load_corpus
from kbench.design import load_design
from kbench.stages.corpus import CORPUS_DIR
from kbench.substrates import build_index, index_entities

log = logging.getLogger(__name__)

COMMAND = "index"
INDEX_DIR = Path("artifacts/index")


def run_index_stage(corpus_dir: Path, out: Path = INDEX_DIR) -> Path:
    """Embed the passages of every queryable entity and the distractors into `out`."""
    entities = index_entities(load_corpus(corpus_dir))
    build_index(entities, out)
    log.info("index: passages of %d entities (eval pools and distractors) in %s", len(entities), out)
    return out


def cmd_index(args: argparse.Namespace) -> int:
    load_design(args.params)
    run_index_stage(Path(args.corpus), Path(args.out))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, COMMAND, cmd_index, "build the R-text FAISS index over the corpus passages",
                    corpus=CORPUS_DIR, track=False)
    p.add_argument("--out", default=str(INDEX_DIR), help="output folder (default: %(default)s)")
