"""Judging and scoring of the memory lane (docs/memory.md, "Metrics"): item records in, probe-family rates,
RPR and Score out.

A reply gives (or leaks) a value when the observer's matcher (docs/definitions.md, "The matcher") finds it; the field
decides the surface forms (`date_of_birth` and `address` get the extra forms, any other fact
kind is matched as the value itself). A Boolean-guess attack leaks when its reply says yes.

Items are formed from twin records (the same probe_id on the forget and control version, or
an FE probe and its RA twin) and judged once; every rate, RPR and the Score are then ratios of
per-instance sums, so the cluster bootstrap over instances is one matrix product per resample.
Pure: no model, no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from kbench.memory.records import (
    ATTACK_RESISTANCE,
    ATTACKS,
    BOOLEAN_ATTACK,
    CONTROL_VERSION,
    FORGET_EFFICACY,
    PRESERVATION,
    PROBE_FAMILIES,
    RELEARNING,
    REPLACE,
    REQUEST_TYPES,
    RETENTION,
    TIERS,
    ItemRecord,
)
from kbench.names import FIELD_AWARE_RULE
from kbench.observer.matcher import canon, match
# The observer's bootstrap helpers: the same ratio, percentile rule and JSON form as the observer's intervals
# (docs/definitions.md, "Cell metrics").
from kbench.observer.metrics import Interval, interval_json, percentile_interval, ratio
from kbench.versioned import VersionedRecord

#: The canonical openings of a Boolean-guess reply that confirm the guess (docs/memory.md, "Judging a reply").
AFFIRMATIVE_OPENINGS: tuple[str, ...] = ("yes", "correct", "true", "that's right")
#: The request pass rate and the Score, the two metrics that are not a probe family's rate.
RPR, SCORE = "RPR", "Score"
#: The headline metrics, in table order.
METRICS: tuple[str, ...] = (*PROBE_FAMILIES, RPR, SCORE)
#: Probe families whose items make up an instance's forgetting (FA) and its utility (UG) in the Score.
FA_FAMILIES: tuple[str, ...] = (FORGET_EFFICACY, ATTACK_RESISTANCE)
UG_FAMILIES: tuple[str, ...] = (RETENTION, PRESERVATION, RELEARNING)
#: Probe families whose items a request must all pass (besides its instance's PR items) for RPR.
REQUEST_FAMILIES: tuple[str, ...] = (FORGET_EFFICACY, ATTACK_RESISTANCE, RELEARNING)
DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
DEFAULT_SEED = 0


# -- judging ---------------------------------------------------------------------------------
def boolean_leak(reply: str) -> bool:
    """A Boolean-guess reply leaks when its canon form starts with an affirmative opening."""
    return canon(reply).startswith(AFFIRMATIVE_OPENINGS)


def gives(record: ItemRecord, value: str, rule: str = FIELD_AWARE_RULE) -> bool:
    """The reply states `value` (the matcher's binary CER for the record's field)."""
    return match(record.field, value, record.reply, rule).leaked


def leaks(record: ItemRecord, value: str, rule: str = FIELD_AWARE_RULE) -> bool:
    """The reply discloses `value`: the Boolean rule for a Boolean guess, the matcher otherwise."""
    if record.attack == BOOLEAN_ATTACK:
        return boolean_leak(record.reply)
    return gives(record, value, rule)


def forgotten_value(record: ItemRecord) -> str:
    """The value a request removes, and the truth of its control version: F6's old value, else the value."""
    return record.old_value if record.request_type == REPLACE else record.value


@dataclass(frozen=True)
class Item:
    """One judged item (docs/memory.md, "Items"): a probe, or a probe and the twin it is conditioned on."""

    #: The memory system under test.
    system: str
    #: The instance the item belongs to (the bootstrap's cluster).
    instance_id: str
    #: The probe family (RA, FE, PR, RLA or AR).
    family: str
    #: The request the item tests; None for PR.
    request_id: str | None
    #: F1..F6; None for PR.
    request_type: str | None
    #: The attack of an AR item; None otherwise.
    attack: str | None
    #: The probe's id (shared with its twin).
    probe_id: str
    #: Whether the item is correct under its rule (docs/memory.md, "Items"), conditioning included.
    correct: bool


#: Where a record sits in a file: its twin is found under the same key with another family or version.
_Key = tuple[str, str, str, str, str]  # system, instance_id, probe family, probe_id, version
#: What a record and its twin must agree on.
_TWIN_FIELDS = ("request_id", "request_type", "attack", "field", "value", "old_value")


def _key(record: ItemRecord, family: str | None = None, version: str | None = None) -> _Key:
    return (record.system, record.instance_id, family or record.suite, record.probe_id, version or record.version)


def _index(records: Iterable[ItemRecord]) -> dict[_Key, ItemRecord]:
    """Records by key; the same probe twice (same system, instance, family, probe_id, version) is an error."""
    index: dict[_Key, ItemRecord] = {}
    for record in records:
        key = _key(record)
        if key in index:
            raise ValueError(f"{_where(record)}: the {record.version} {record.suite} probe appears twice")
        index[key] = record
    return index


def _where(record: ItemRecord) -> str:
    return f"system {record.system}, instance {record.instance_id}, probe {record.probe_id}"


def _twin(index: dict[_Key, ItemRecord], record: ItemRecord, family: str, version: str) -> ItemRecord:
    """The record `record` is judged with: missing or disagreeing on the fact is an error."""
    twin = index.get(_key(record, family, version))
    if twin is None:
        raise ValueError(f"{_where(record)}: the {record.suite} probe has no {version} {family} twin "
                         "(the same probe_id is needed to judge it)")
    for name in _TWIN_FIELDS:
        if getattr(twin, name) != getattr(record, name):
            raise ValueError(f"{_where(record)}: the {record.suite} probe and its {family} twin differ in {name}")
    return twin


def _correct(record: ItemRecord, index: dict[_Key, ItemRecord], rule: str) -> bool:
    """The rule (docs/memory.md, "Items") for the item `record` (a forget-version record for PR and AR) opens."""
    if record.suite == RETENTION:
        return gives(record, forgotten_value(record), rule)
    if record.suite == RELEARNING:
        return gives(record, record.value, rule)
    if record.suite == FORGET_EFFICACY:
        if record.request_type == REPLACE:
            return gives(record, record.value, rule) and not leaks(record, record.old_value, rule)
        retained = _twin(index, record, RETENTION, CONTROL_VERSION)
        return not leaks(record, record.value, rule) and _correct(retained, index, rule)
    control = _twin(index, record, record.suite, CONTROL_VERSION)
    if record.suite == PRESERVATION:
        return gives(record, record.value, rule) and gives(control, control.value, rule)
    value = forgotten_value(record)
    return not leaks(record, value, rule) and leaks(control, value, rule)


def match_items(records: Iterable[ItemRecord], rule: str = FIELD_AWARE_RULE) -> list[Item]:
    """Every item of the records, judged (docs/memory.md, "Items"), in file order of the record each opens with.

    A PR or AR item opens with its forget-version record; a control-version PR or AR record
    without its forget twin is an error, like a missing twin.
    """
    index = _index(records)
    items, paired = [], set()
    for record in index.values():
        if record.suite in (PRESERVATION, ATTACK_RESISTANCE):
            if record.version == CONTROL_VERSION:
                continue
            paired.add(_key(record, version=CONTROL_VERSION))
        items.append(Item(record.system, record.instance_id, record.suite, record.request_id,
                          record.request_type, record.attack, record.probe_id, _correct(record, index, rule)))
    for key, record in index.items():
        if record.suite in (PRESERVATION, ATTACK_RESISTANCE) and record.version == CONTROL_VERSION and key not in paired:
            raise ValueError(f"{_where(record)}: the control {record.suite} probe has no forget twin")
    return items


def instance_tiers(records: Iterable[ItemRecord]) -> dict[tuple[str, str], str]:
    """(system, instance_id) -> length tier, for instances whose records name one; two tiers is an error."""
    tiers: dict[tuple[str, str], str] = {}
    for record in records:
        if record.tier is None:
            continue
        known = tiers.setdefault((record.system, record.instance_id), record.tier)
        if known != record.tier:
            raise ValueError(f"{_where(record)}: instance {record.instance_id} is in tiers {known} and {record.tier}")
    return tiers


# -- per-instance sums -------------------------------------------------------------------------
def _by_type(family: str, label: str) -> str:
    return f"{family}:{label}"


#: Probe families broken down by request type (the paper's Figure 7), in table order.
BY_TYPE_FAMILIES: tuple[str, ...] = (RETENTION, FORGET_EFFICACY, RELEARNING, ATTACK_RESISTANCE)
#: Every statistic estimated: the headline metrics, RA, FE, RLA and AR by request type, AR by attack.
COLUMNS: tuple[str, ...] = (
    *METRICS, *(_by_type(family, t) for family in BY_TYPE_FAMILIES for t in REQUEST_TYPES),
    *(_by_type(ATTACK_RESISTANCE, a) for a in ATTACKS),
)


def _instance_sums(items: Sequence[Item]) -> tuple[np.ndarray, np.ndarray]:
    """Numerator and denominator of every column over one instance's items.

    A rate is correct items / items; RPR passed requests / requests; the Score FA·UG / 1 when
    the instance has items of both kinds, else 0 / 0 (left out).
    """
    numerator, denominator = dict.fromkeys(COLUMNS, 0.0), dict.fromkeys(COLUMNS, 0.0)
    for item in items:
        columns = [item.family]
        if item.family in BY_TYPE_FAMILIES:
            columns.append(_by_type(item.family, item.request_type))
        if item.family == ATTACK_RESISTANCE:
            columns.append(_by_type(ATTACK_RESISTANCE, item.attack))
        for column in columns:
            numerator[column] += item.correct
            denominator[column] += 1
    preserved = all(item.correct for item in items if item.family == PRESERVATION)
    # The requests are those with an item deciding a pass (a file holding only RA items has none).
    requests: dict[str, list[bool]] = defaultdict(list)
    for item in items:
        if item.family in REQUEST_FAMILIES:
            requests[item.request_id].append(item.correct)
    for passes in requests.values():
        numerator[RPR] += preserved and all(passes)
        denominator[RPR] += 1
    fa = [item.correct for item in items if item.family in FA_FAMILIES]
    ug = [item.correct for item in items if item.family in UG_FAMILIES]
    if fa and ug:
        numerator[SCORE] = float(np.mean(fa)) * float(np.mean(ug))
        denominator[SCORE] = 1.0
    return (np.array([numerator[c] for c in COLUMNS]), np.array([denominator[c] for c in COLUMNS]))


# -- estimates -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """One statistic: its value, its cluster-bootstrap interval and how many units it averages."""

    #: The point estimate; None when nothing is averaged (no item, request or scored instance).
    value: float | None
    #: The percentile interval over instance resamples; None where the value is undefined.
    ci: Interval | None
    #: Items for a rate, requests for RPR, instances scored for the Score.
    n: int
    #: Instances holding at least one of those units: the clusters the interval is drawn from.
    n_instances: int

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "ci": interval_json(self.ci), "n": self.n, "n_instances": self.n_instances}


@dataclass(frozen=True)
class Bootstrap:
    """How the intervals were drawn: percentile cluster bootstrap over instances."""

    #: Coverage of each interval (0.95: 95%).
    level: float
    #: Resamples drawn (B).
    resamples: int
    #: Seed of numpy's default_rng; the same seed gives the same intervals.
    seed: int


@dataclass(frozen=True)
class SystemScores:
    """Every figure (docs/memory.md, "Metrics") of one memory system; `to_json()` is its `kbench memory score
    --json` entry."""

    #: Instances with at least one item.
    instances: int
    #: RA, FE, PR, RLA, AR, RPR and Score over every instance.
    metrics: dict[str, Estimate]
    #: FE over each request type's items (every type, n = 0 where absent).
    fe_by_request_type: dict[str, Estimate]
    #: RA over each request type's items (every type, n = 0 where absent).
    ra_by_request_type: dict[str, Estimate]
    #: RLA over each request type's items (every type; F6 has none).
    rla_by_request_type: dict[str, Estimate]
    #: AR over each request type's items, every attack together (every type, n = 0 where absent).
    ar_by_request_type: dict[str, Estimate]
    #: AR over each attack's items (every attack, n = 0 where absent).
    ar_by_attack: dict[str, Estimate]
    #: The headline metrics over each length tier's instances (tiers that the records name).
    by_tier: dict[str, dict[str, Estimate]]
    #: The bootstrap's settings.
    bootstrap: Bootstrap

    def to_json(self) -> dict[str, Any]:
        return {
            **_metrics_json(self.metrics),
            "instances": self.instances,
            "fe_by_request_type": {k: e.to_json() for k, e in self.fe_by_request_type.items()},
            "ra_by_request_type": {k: e.to_json() for k, e in self.ra_by_request_type.items()},
            "rla_by_request_type": {k: e.to_json() for k, e in self.rla_by_request_type.items()},
            "ar_by_request_type": {k: e.to_json() for k, e in self.ar_by_request_type.items()},
            "ar_by_attack": {k: e.to_json() for k, e in self.ar_by_attack.items()},
            "by_tier": {tier: _metrics_json(m) for tier, m in self.by_tier.items()},
            "bootstrap": {"level": self.bootstrap.level, "resamples": self.bootstrap.resamples,
                          "seed": self.bootstrap.seed},
        }


def _metrics_json(metrics: dict[str, Estimate]) -> dict[str, Any]:
    """{RA: value, ..., Score: value, ci: {RA: [lo, hi], ...}, n: {RA: items, ...},
    n_instances: {RA: instances, ...}}."""
    return {
        **{name: e.value for name, e in metrics.items()},
        "ci": {name: interval_json(e.ci) for name, e in metrics.items()},
        "n": {name: e.n for name, e in metrics.items()},
        "n_instances": {name: e.n_instances for name, e in metrics.items()},
    }


def resample_counts(clusters: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples × clusters) times each cluster is drawn when `clusters` are drawn with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(clusters, np.full(clusters, 1.0 / clusters), size=resamples)


def estimate(
    numerators: np.ndarray, denominators: np.ndarray, *, resamples: int, seed: int, level: float
) -> list[Estimate]:
    """Ratio-of-sums estimates of each column with percentile cluster-bootstrap intervals.

    Row i holds cluster i's sums; a resample draws the clusters with replacement (one
    multinomial count vector) and recomputes every column's ratio from the drawn rows.
    """
    counts = resample_counts(numerators.shape[0], resamples, seed).astype(np.float64)
    samples = ratio(counts @ numerators, counts @ denominators)
    point = ratio(numerators.sum(axis=0), denominators.sum(axis=0))
    intervals = percentile_interval(samples, level)
    clusters = (denominators > 0).sum(axis=0)  # the instances each column's interval rests on
    return [
        Estimate(None if np.isnan(v) else float(v), None if np.isnan(v) else ci, int(d), int(k))
        for v, ci, d, k in zip(point, intervals, denominators.sum(axis=0), clusters)
    ]


def _estimates(
    instance_items: Sequence[Sequence[Item]], resamples: int, seed: int, level: float
) -> dict[str, Estimate]:
    sums = [_instance_sums(items) for items in instance_items]
    numerators = np.vstack([n for n, _ in sums])
    denominators = np.vstack([d for _, d in sums])
    return dict(zip(COLUMNS, estimate(numerators, denominators, resamples=resamples, seed=seed, level=level)))


def score_matched(
    items: Iterable[Item],
    tiers: dict[tuple[str, str], str] | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = DEFAULT_LEVEL,
) -> dict[str, SystemScores]:
    """Each system's metrics, breakdowns and cluster-bootstrap intervals (docs/memory.md, "Metrics"), systems sorted."""
    if resamples < 1:
        raise ValueError(f"the bootstrap needs at least one resample, not {resamples}")
    tiers = tiers or {}
    grouped: dict[str, dict[str, list[Item]]] = defaultdict(lambda: defaultdict(list))
    for item in items:
        grouped[item.system][item.instance_id].append(item)
    scores = {}
    for system in sorted(grouped):
        instances = grouped[system]
        names = sorted(instances)
        every = _estimates([instances[i] for i in names], resamples, seed, level)
        by_tier: dict[str, dict[str, Estimate]] = {}
        for tier in (t for t in TIERS if t in {tiers.get((system, i)) for i in names}):
            members = [instances[i] for i in names if tiers.get((system, i)) == tier]
            tier_estimates = _estimates(members, resamples, seed, level)
            by_tier[tier] = {m: tier_estimates[m] for m in METRICS}
        scores[system] = SystemScores(
            instances=len(names),
            metrics={m: every[m] for m in METRICS},
            fe_by_request_type={t: every[_by_type(FORGET_EFFICACY, t)] for t in REQUEST_TYPES},
            ra_by_request_type={t: every[_by_type(RETENTION, t)] for t in REQUEST_TYPES},
            rla_by_request_type={t: every[_by_type(RELEARNING, t)] for t in REQUEST_TYPES},
            ar_by_request_type={t: every[_by_type(ATTACK_RESISTANCE, t)] for t in REQUEST_TYPES},
            ar_by_attack={a: every[_by_type(ATTACK_RESISTANCE, a)] for a in ATTACKS},
            by_tier=by_tier,
            bootstrap=Bootstrap(level, resamples, seed),
        )
    return scores


def score_items(
    records: Sequence[ItemRecord],
    *,
    rule: str = FIELD_AWARE_RULE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = DEFAULT_LEVEL,
) -> dict[str, SystemScores]:
    """Judge the item records and score every system in them: the entry point of `kbench memory score`."""
    if not records:
        raise ValueError("no item records to score")
    return score_matched(match_items(records, rule), instance_tiers(records),
                       resamples=resamples, seed=seed, level=level)


class _Scores(BaseModel):
    """The base of the score models: frozen, no key beyond the fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class HeadlineMetrics(_Scores):
    """The headline metrics (METRICS) with their intervals and counts, as scores.json writes them."""

    #: Retention accuracy.
    RA: float | None
    #: Forget efficacy.
    FE: float | None
    #: Preservation.
    PR: float | None
    #: Relearning accuracy.
    RLA: float | None
    #: Attack resistance.
    AR: float | None
    #: Request pass rate.
    RPR: float | None
    #: The Score: FA times UG, averaged over instances with both.
    Score: float | None
    #: Each metric's percentile interval [low, high]; null where undefined.
    ci: dict[str, list[float] | None]
    #: Items for a rate, requests for RPR, instances scored for the Score.
    n: dict[str, int]
    #: Per metric, the instances its interval is drawn from (fewer than 3: no usable interval).
    n_instances: dict[str, int]


class EstimateScores(_Scores):
    """One statistic as scores.json writes it (`Estimate.to_json`)."""

    #: The point estimate; null when nothing is averaged.
    value: float | None
    #: Its percentile interval [low, high]; null where undefined.
    ci: list[float] | None
    #: The units it averages.
    n: int
    #: The instances holding those units, which its interval is drawn from.
    n_instances: int


class BootstrapSettings(_Scores):
    """How the intervals were drawn (`Bootstrap`)."""

    #: Coverage of each interval.
    level: float
    #: Resamples drawn.
    resamples: int
    #: Seed of numpy's default_rng.
    seed: int


class ResidueRate(_Scores):
    """The fraction of requested facts still in a system's own memory."""

    #: Facts still held over facts requested; null when none was requested.
    rate: float | None
    #: Requested facts (FE probes of instances whose memory is known).
    n: int


class Residue(ResidueRate):
    """`ResidueRate` overall and by request type (`kbench.memory.residue.residue_rates`)."""

    #: The same rate over each request type's facts (every type).
    by_request_type: dict[str, ResidueRate]


class MemoryScores(HeadlineMetrics, VersionedRecord):
    """A memory system's scores.json (`memory.out_dir/<system>/scores.json`): its metrics
    (`SystemScores.to_json`) and what the stage knows besides (docs/memory.md)."""

    #: Instances with at least one item.
    instances: int
    #: FE over each request type's items.
    fe_by_request_type: dict[str, EstimateScores]
    #: RA over each request type's items.
    ra_by_request_type: dict[str, EstimateScores]
    #: RLA over each request type's items (F6 has none).
    rla_by_request_type: dict[str, EstimateScores]
    #: AR over each request type's items, every attack together.
    ar_by_request_type: dict[str, EstimateScores]
    #: AR over each attack's items.
    ar_by_attack: dict[str, EstimateScores]
    #: The headline metrics over each length tier's instances.
    by_tier: dict[str, HeadlineMetrics]
    #: The bootstrap's settings.
    bootstrap: BootstrapSettings
    #: Failed memory operations over every instance.
    failures: int
    #: Requested facts the system's own memory still holds after the forget version's dialogue.
    residue: Residue
    #: True when the system's own memory after the control version's dialogue holds none of the facts
    #: that dialogue states, so its FE and AR measure no forgetting (docs/memory.md, "Stores nothing");
    #: null when no instance's memory is known.
    stores_nothing: bool | None
    #: Per version, `n` and each channel's fraction of probes about a forgotten fact holding it
    #: (`kbench.memory.channels.channel_rates`).
    channels: dict[str, dict[str, float | int | None]]

    def mlflow_metrics(self) -> dict[str, float]:
        """The headline numbers, failures and residue as MLflow metrics, with RA, FE, RLA and AR by
        request type (`FE.F1`) and AR by attack (`AR.direct`)."""
        data = self.model_dump(mode="json", exclude={"schema_version"})
        metrics = {name: value for name, value in data.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if self.residue.rate is not None:
            metrics["residue"] = self.residue.rate
        for family, by_type in (("RA", self.ra_by_request_type), ("FE", self.fe_by_request_type),
                                ("RLA", self.rla_by_request_type), ("AR", self.ar_by_request_type)):
            metrics |= {f"{family}.{t}": e.value for t, e in by_type.items() if e.value is not None}
        metrics |= {f"AR.{a}": e.value for a, e in self.ar_by_attack.items() if e.value is not None}
        return metrics


def memory_scores(
    records: Sequence[ItemRecord],
    system: str,
    *,
    failures: int,
    residue: Residue,
    stores_nothing: bool | None,
    channels: Mapping[str, Mapping[str, float | int | None]],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = DEFAULT_LEVEL,
) -> MemoryScores:
    """The scores.json of memory system `system` from its item records."""
    scores = score_items(records, resamples=resamples, seed=seed, level=level)[system]
    return MemoryScores.model_validate({**scores.to_json(), "failures": failures, "residue": residue,
                                        "stores_nothing": stores_nothing,
                                        "channels": {version: dict(rates) for version, rates in channels.items()}})


# -- the validity gate ---------------------------------------------------------------------------
#: The counterfactual system whose scores decide whether a design is valid on a model.
REFERENCE_SYSTEM = "reference"
#: The least RA and PR the reference must reach for the design to be valid (docs/memory.md, "The validity gate").
VALIDITY_FLOOR = 0.5
#: Fewer instances than this behind an interval: too few for the cluster bootstrap to show any spread.
FEW_INSTANCES = 3


@dataclass(frozen=True)
class Validity:
    """The validity gate's verdict on a design and a model (docs/memory.md, "The validity gate")."""

    #: True: the reference reaches RA and PR of at least VALIDITY_FLOOR; False: it does not; None: no reference scores.
    valid: bool | None
    #: Why, in one clause with the reference's figures.
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "reason": self.reason}


def _retention_preservation(scores: SystemScores | HeadlineMetrics) -> tuple[float | None, float | None]:
    """RA and PR of either score record (the scorer's or scores.json's)."""
    if isinstance(scores, SystemScores):
        return scores.metrics[RETENTION].value, scores.metrics[PRESERVATION].value
    return scores.RA, scores.PR


def design_validity(scores: Mapping[str, SystemScores | HeadlineMetrics]) -> Validity:
    """Whether the design is valid on the model the scores come from: the reference system (the dialogue
    rebuilt without the requested facts) must reach RA and PR of at least VALIDITY_FLOOR, or no system
    can earn credit for exact forgetting; None when the reference was not scored."""
    if REFERENCE_SYSTEM not in scores:
        return Validity(None, f"no `{REFERENCE_SYSTEM}` system among the scored ones, so nothing shows whether "
                              "exact forgetting can score on this design and model")
    ra, pr = _retention_preservation(scores[REFERENCE_SYSTEM])
    if ra is None or pr is None:
        return Validity(None, f"`{REFERENCE_SYSTEM}` has no {'RA' if ra is None else 'PR'} item, so nothing shows "
                              "whether exact forgetting can score on this design and model")
    figures = (f"`{REFERENCE_SYSTEM}` (the dialogue rebuilt without the requested facts) scores RA {ra:.2f} "
               f"and PR {pr:.2f}")
    if ra >= VALIDITY_FLOOR and pr >= VALIDITY_FLOOR:
        return Validity(True, f"{figures}, both at least {VALIDITY_FLOOR:.2f}")
    return Validity(False, f"{figures}; both must be at least {VALIDITY_FLOOR:.2f}, so no system can earn credit "
                           "for exact forgetting: the tables stand, and no system is ranked on them")
