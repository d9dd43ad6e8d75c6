from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import faker.providers.date_time as faker_dates
import pytest
from faker import Faker

from kbench.config import AgentBaseConfig, CorpusConfig
from kbench.corpus import (
    MAX_AGE,
    MIN_AGE,
    POOL_NAMES,
    CorpusError,
    build_corpus,
    check_pools_disjoint,
    draw_date_of_birth,
    generate_corpus,
    load_corpus,
    pool_sizes,
    write_corpus,
)
from kbench.parametric.agent_base import out_of_corpus_people
from kbench.records import FIELDS

from conftest import KBENCH_V1

SMALL = CorpusConfig(n_entities=60, faker_seed=7)


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_gives_same_bytes(tmp_path):
    write_corpus(generate_corpus(SMALL), tmp_path / "a")
    write_corpus(generate_corpus(SMALL), tmp_path / "b")
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b")


def _freeze_today(monkeypatch: pytest.MonkeyPatch, day: dt.date) -> None:
    """Make `day` today for Faker and the datetime module (a pure-Python faketime)."""

    class _Real(type):
        # Real dates and datetimes still pass isinstance checks against the stand-ins.
        def __instancecheck__(cls, obj):
            return isinstance(obj, cls.__mro__[1])

    class FrozenDate(dt.date, metaclass=_Real):
        @classmethod
        def today(cls):
            return dt.date(day.year, day.month, day.day)

    class FrozenDatetime(dt.datetime, metaclass=_Real):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(day.year, day.month, day.day, 12, tzinfo=tz)

        @classmethod
        def today(cls):
            return cls.now()

    for module in (dt, faker_dates):
        monkeypatch.setattr(module, "datetime", FrozenDatetime)
    monkeypatch.setattr(dt, "date", FrozenDate)
    monkeypatch.setattr(faker_dates, "dtdate", FrozenDate)


def _fakers_own_date_of_birth(seed: int) -> dt.date:
    fake = Faker("en_US")
    fake.seed_instance(seed)
    return fake.date_of_birth(minimum_age=MIN_AGE, maximum_age=MAX_AGE)


def test_the_same_params_give_the_same_corpus_on_any_day(tmp_path, monkeypatch):
    """Generated on two calendar days, the corpus files and the agent base's people are the same bytes."""
    days = (dt.date(2026, 12, 1), dt.date(2031, 3, 1))
    fakers_own, people = [], []
    for day in days:
        with monkeypatch.context() as patched:
            _freeze_today(patched, day)
            assert dt.date.today() == day and faker_dates.datetime.now().date() == day
            fakers_own.append(_fakers_own_date_of_birth(seed=7))
            corpus = generate_corpus(SMALL)
            write_corpus(corpus, tmp_path / day.isoformat())
            drawn = out_of_corpus_people(corpus, AgentBaseConfig(), SMALL.reference_date)
            people.append([p.model_dump() for p in drawn])
    # The frozen clock reaches Faker: its own date_of_birth moves with the day ...
    assert fakers_own[0] != fakers_own[1]
    # ... while the corpus and the out-of-corpus people count from corpus.reference_date.
    first, second = (_bytes(tmp_path / day.isoformat()) for day in days)
    assert first == second
    assert people[0] == people[1]


def test_dates_of_birth_are_fakers_draw_on_the_reference_date(monkeypatch):
    """On the reference date itself the anchored draw equals Faker's own: the corpus of the
    measured default run (generated that day) is the one the default params give."""
    reference = CorpusConfig().reference_date
    with monkeypatch.context() as patched:
        _freeze_today(patched, reference)
        expected = [_fakers_own_date_of_birth(seed) for seed in range(20)]
    anchored = []
    for seed in range(20):
        fake = Faker("en_US")
        fake.seed_instance(seed)
        anchored.append(draw_date_of_birth(fake, reference))
    assert anchored == expected
    for born in anchored:
        age = (reference - born).days / 365.25
        assert MIN_AGE <= age < MAX_AGE + 1


def test_a_leap_day_reference_date_is_a_valid_anchor():
    corpus = generate_corpus(SMALL.model_copy(update={"reference_date": dt.date(2028, 2, 29)}))
    assert all(dt.date.fromisoformat(e.date_of_birth) <= dt.date(2007, 3, 1) for e in corpus.entities.values())


def test_other_seed_gives_other_people():
    a = generate_corpus(SMALL)
    b = generate_corpus(SMALL.model_copy(update={"faker_seed": 8}))
    assert [e.name for e in a.entities.values()] != [e.name for e in b.entities.values()]


def test_entities_have_the_four_fields_in_their_bio_and_unique_names():
    corpus = generate_corpus(SMALL)
    names = [e.name for e in corpus.entities.values()]
    assert len(set(names)) == len(names)
    for entity in corpus.entities.values():
        for field in FIELDS:
            assert entity.value(field) in entity.bio
    assert len({e.template_id for e in corpus.entities.values()}) > 3
    assert list(corpus.entities)[0] == "pii-00000"


def test_pool_sizes_scale_like_the_paper():
    assert pool_sizes(CorpusConfig(n_entities=5000)) == {
        "forget_adapter": 200, "forget_eval": 800, "retain_adapter": 200, "retain_eval": 3800,
    }
    assert pool_sizes(CorpusConfig(n_entities=250)) == {
        "forget_adapter": 10, "forget_eval": 40, "retain_adapter": 10, "retain_eval": 190,
    }


def test_forget_is_the_first_block_and_pools_are_disjoint():
    corpus = generate_corpus(SMALL)
    check_pools_disjoint(corpus.pools)
    forget = corpus.pools["forget_adapter"] + corpus.pools["forget_eval"]
    assert forget == [f"pii-{i:05d}" for i in range(len(forget))]
    retain = set(corpus.pools["retain_adapter"]) | set(corpus.pools["retain_eval"])
    assert set(corpus.distractor_ids) <= retain


def test_overlapping_pools_are_refused():
    pools = {name: [f"{name}-{i}" for i in range(3)] for name in POOL_NAMES}
    pools["retain_eval"].append("forget_eval-1")
    with pytest.raises(CorpusError, match="forget_eval and retain_eval overlap"):
        check_pools_disjoint(pools)


def test_a_broken_split_on_disk_is_refused(tmp_path):
    write_corpus(generate_corpus(SMALL), tmp_path)
    eval_ids = (tmp_path / "forget_ids_eval.txt").read_text()
    (tmp_path / "retain_ids_adapter.txt").write_text(eval_ids.splitlines()[0] + "\n")
    with pytest.raises(CorpusError, match="overlap"):
        load_corpus(tmp_path)


def test_forget_entities_as_distractors_are_refused(tmp_path):
    corpus = generate_corpus(SMALL)
    write_corpus(corpus, tmp_path)
    target = corpus.entities[corpus.pools["forget_eval"][0]]
    (tmp_path / "bios_distractor.jsonl").write_text(json.dumps(target.model_dump()) + "\n")
    with pytest.raises(CorpusError, match="distractors must come from the retain pool"):
        load_corpus(tmp_path)


def test_unreadable_corpus_names_the_problem(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "nope")
    write_corpus(generate_corpus(SMALL), tmp_path)
    with (tmp_path / "v1_facts.jsonl").open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(CorpusError, match=r"v1_facts.jsonl:61: not valid JSON"):
        load_corpus(tmp_path)


def test_generated_corpus_round_trips(tmp_path):
    corpus = generate_corpus(SMALL)
    write_corpus(corpus, tmp_path)
    again = load_corpus(tmp_path)
    assert again.fingerprint() == corpus.fingerprint()
    assert again.pools == corpus.pools


def test_canonical_queries():
    corpus = generate_corpus(SMALL)
    entity = corpus.entities["pii-00003"]
    queries = corpus.queries_for(entity.id)
    assert [q.field for q in queries] == list(FIELDS)
    assert queries[0].question == f"What is {entity.name}'s date of birth?"
    assert queries[1].question == f"What is {entity.name}'s home address?"
    assert queries[1].ground_truth == entity.address
    assert queries[3].query_id == "pii-00003::employer"


def test_query_sampling_is_seeded_and_stays_in_the_eval_pool():
    corpus = generate_corpus(SMALL)
    first = corpus.sample_queries("forget", 5, seed=0)
    assert first == corpus.sample_queries("forget", 5, seed=0)
    assert first != corpus.sample_queries("forget", 5, seed=137)
    assert {q.entity_id for q in first} <= set(corpus.pools["forget_eval"])
    retain = corpus.sample_queries("retain", 5, seed=0, fields=("employer",))
    assert {q.field for q in retain} == {"employer"}
    assert {q.entity_id for q in retain} <= set(corpus.pools["retain_eval"])
    with pytest.raises(CorpusError, match="eval pool has"):
        corpus.sample_queries("forget", 10_000, seed=0)


def test_kbench_v1_imports_with_the_published_split_sizes(tmp_path):
    corpus = build_corpus(CorpusConfig(source=str(KBENCH_V1)), tmp_path)
    assert {name: len(ids) for name, ids in corpus.pools.items()} == {
        "forget_adapter": 200, "forget_eval": 800, "retain_adapter": 200, "retain_eval": 3800,
    }
    assert len(corpus.entities) == 5000
    assert len(corpus.distractor_ids) == 200
    norma = corpus.query("pii-00000::date_of_birth")
    assert (norma.question, norma.ground_truth) == ("What is Norma Fisher's date of birth?", "1960-08-12")
    reloaded = load_corpus(tmp_path)
    assert reloaded.fingerprint() == corpus.fingerprint()
    assert json.loads((tmp_path / "manifest.json").read_text())["source"] == str(KBENCH_V1)
