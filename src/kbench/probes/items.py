"""What the probes ask a model (docs/definitions.md, "Direct-elicitation probes"): built from the corpus and
the design's queries alone,
so every model of a design is probed on the same items (docs/probes.md).

- A `ProbeQuestion` per query the cells ask (forget and retain, every seed): the plain
  question, the answer ("The <field> of <name> is <value>") and perturbed answers, the same
  with other entities' values of the field. They are also the four options of the
  forced-choice MCQ.
- A `ProbeBio` per entity those queries are about (VerbMem, Min-K% members) and per held-out
  entity no adapter learned (Min-K% non-members).
- A `ProbeQuestion` per general-ability fact (`general.GENERAL_FACTS`), for model utility.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from kbench.backends import Conversation
from kbench.config import Params
from kbench.corpus import Corpus
from kbench.parametric.injection import ASSISTANT_SYSTEM, queried_entities, training_entities
from kbench.probes.general import GENERAL_FACTS
from kbench.records import FIELD_PHRASES, FORGET, RETAIN, SPLITS, Entity, Query

#: The item kinds a probe row belongs to.
QUESTION, BIO, GENERAL = "question", "bio", "general"
#: Bio groups: the queried entities of each split, and entities no adapter learned.
HELDOUT = "heldout"


@dataclass(frozen=True)
class ProbeQuestion:
    """One question with the answers a scoring pass compares: a stem the assistant turn
    starts with ("The <field> of <name> is"), then the true value or a perturbed one. Only the
    value's tokens are scored, so the candidates of a question share the stem's forward pass."""

    #: The query (a design query, or a stand-in for a general fact: a non-forget input).
    query: Query
    #: FORGET, RETAIN or GENERAL.
    group: str
    #: The plain chat: the assistant persona and the question (no agent, no tools, no bios).
    prompt: Conversation
    #: The answer's stem; empty for a general fact (its answers stand alone).
    stem: str
    #: The true value (TOFU's answer probability; KnowMem's reference, LUME's exact match).
    value: str
    #: Other entities' values of the field (truth ratio; MCQ options 1..).
    perturbed: tuple[str, ...]

    def candidates(self) -> list[tuple[str, str]]:
        """(stem, scored text) of the true answer, then of each perturbed answer."""
        return [(self.stem, v) for v in (self.value, *self.perturbed)]


@dataclass(frozen=True)
class ProbeBio:
    """One entity's bio, as the adapters learned it (a reply to "Tell me about <name>.")."""

    #: A stand-in query about the entity (what a detector gates on).
    query: Query
    #: FORGET, RETAIN or HELDOUT.
    group: str
    prompt: Conversation
    #: The whole bio (Min-K% scores it).
    text: str
    #: Its first words (VerbMem's prefix) and the rest (VerbMem's reference).
    prefix: str
    rest: str


@dataclass(frozen=True)
class ProbeItems:
    questions: list[ProbeQuestion]
    bios: list[ProbeBio]
    general: list[ProbeQuestion]


def plain_chat(question: str) -> Conversation:
    return [{"role": "system", "content": ASSISTANT_SYSTEM}, {"role": "user", "content": question}]


def answer_stem(entity: Entity, field: str) -> str:
    """The answer's words before the value: a paraphrase of the records' phrasing."""
    return f"The {FIELD_PHRASES[field]} of {entity.name} is"


def perturbed_values(corpus: Corpus, query: Query, n: int) -> list[str]:
    """`n` other entities' values of the query's field, drawn with a seed from the query id."""
    values = sorted({e.value(query.field) for e in corpus.entities.values()} - {query.ground_truth})
    if len(values) < n:
        raise ValueError(f"the corpus has {len(values)} other values of {query.field}; the probes need {n}")
    return random.Random(zlib.crc32(query.query_id.encode())).sample(values, n)


def design_queries(corpus: Corpus, params: Params) -> dict[str, list[Query]]:
    """Per split, every query the cells ask (all seeds), in first-asked order."""
    fields = tuple(params.queries.fields)
    out: dict[str, list[Query]] = {}
    for split in SPLITS:
        seen: dict[str, Query] = {}
        for seed in params.seeds:
            for q in corpus.sample_queries(split, params.queries.n_per_split, seed, fields):
                seen.setdefault(q.query_id, q)
        out[split] = list(seen.values())
    return out


def _bio(entity: Entity, group: str, prefix_fraction: float, field: str) -> ProbeBio:
    words = entity.bio.split()
    cut = max(1, int(len(words) * prefix_fraction))
    question = f"Tell me about {entity.name}."
    query = Query.canonical(entity, field).model_copy(update={"query_id": f"{entity.id}::bio", "question": question})
    return ProbeBio(query, group, plain_chat(question), entity.bio, " ".join(words[:cut]), " ".join(words[cut:]))


def heldout_entities(corpus: Corpus, params: Params) -> list[str]:
    """Entities no adapter learned and no cell asks about (Min-K% non-members), sorted."""
    learned = {e for ids in training_entities(corpus, params).values() for e in ids}
    asked = {e for ids in queried_entities(corpus, params).values() for e in ids}
    return sorted(set(corpus.entities) - learned - asked - set(corpus.distractor_ids))


def probe_items(corpus: Corpus, params: Params) -> ProbeItems:
    config = params.probes
    queries = design_queries(corpus, params)
    questions = []
    for split in SPLITS:
        for q in queries[split]:
            entity = corpus.entities[q.entity_id]
            questions.append(ProbeQuestion(
                q, split, plain_chat(q.question), answer_stem(entity, q.field), q.ground_truth,
                tuple(perturbed_values(corpus, q, config.n_perturbed)),
            ))
    field = params.queries.fields[0]
    bios = []
    for split in SPLITS:
        for entity_id in dict.fromkeys(q.entity_id for q in queries[split]):
            bios.append(_bio(corpus.entities[entity_id], split, config.verbmem_prefix, field))
    n_members = sum(b.group == FORGET for b in bios)
    for entity_id in heldout_entities(corpus, params)[:n_members]:
        bios.append(_bio(corpus.entities[entity_id], HELDOUT, config.verbmem_prefix, field))
    # a general fact is a non-forget input: its stand-in query is about a retain entity
    stand_in = corpus.entities[corpus.pools[f"{RETAIN}_eval"][0]]
    general = []
    for i, (question, truth, wrong) in enumerate(GENERAL_FACTS[: config.n_general]):
        query = Query.canonical(stand_in, field).model_copy(
            update={"query_id": f"general::{i}", "question": question, "ground_truth": truth})
        general.append(ProbeQuestion(query, GENERAL, plain_chat(question), "", truth, wrong))
    return ProbeItems(questions, bios, general)

