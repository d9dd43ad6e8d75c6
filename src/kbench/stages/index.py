"""The `index` stage (`kbench index`): the R-text substrate's FAISS index over target and distractor passages."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kbench.config import Params
from kbench.corpus import load_corpus
from kbench.stages import option
from kbench.stages.corpus import corpus_option
from kbench.substrates import build_index, index_entities

log = logging.getLogger(__name__)

COMMAND = "index"
HELP = "build the R-text FAISS index over the corpus passages"
INDEX_DIR = Path("artifacts/index")


def run_index_stage(corpus_dir: Path, out: Path = INDEX_DIR) -> Path:
    """Embed the passages of every queryable entity and the distractors into `out`."""
    entities = index_entities(load_corpus(corpus_dir))
    build_index(entities, out)
    log.info("index: passages of %d entities (eval pools and distractors) in %s", len(entities), out)
    return out


@dataclass(frozen=True)
class Options:
    """`kbench index`'s options."""

    #: The corpus whose passages are embedded.
    corpus: Path = corpus_option()
    #: Where the index is written.
    out: Path = option(INDEX_DIR, "output folder")


def main(params: Params, options: Options) -> int:
    """Build the index (the design is loaded, and so checked, before anything runs)."""
    run_index_stage(options.corpus, options.out)
    return 0
