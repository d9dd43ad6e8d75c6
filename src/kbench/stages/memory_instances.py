"""The `memory_instances` stage (`kbench memory-instances`): the memory lane's instances, written
to `memory.instances` as JSON Lines, generated from the corpus (seeded: the same bytes on any
day) or, when `memory.source` names a file, that file's instances checked line by line."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kbench.config import Params
from kbench.corpus import load_corpus
from kbench.memory.instances import make_instances, read_instances, write_instances
from kbench.stages.corpus import corpus_option

log = logging.getLogger(__name__)

COMMAND = "memory-instances"
HELP = "write the memory lane's instances: generated from the corpus, or memory.source checked (memory.*)"


@dataclass(frozen=True)
class Options:
    """`kbench memory-instances`'s options."""

    #: The corpus the instances are generated from.
    corpus: Path = corpus_option()


def main(params: Params, options: Options) -> int:
    config = params.memory
    if config.source:
        instances = read_instances(config.source)
    else:
        instances = make_instances(load_corpus(options.corpus), per_tier=config.per_tier, seed=config.seed,
                                   reference_date=params.corpus.reference_date)
    if not instances:
        raise ValueError(f"no memory instance to run: {config.source or 'memory.per_tier'} gives none")
    write_instances(config.instances, instances)
    tiers = Counter(i.tier for i in instances)
    log.info("%d instances (%s) in %s", len(instances), ", ".join(f"{t} {n}" for t, n in tiers.items()), config.instances)
    return 0
