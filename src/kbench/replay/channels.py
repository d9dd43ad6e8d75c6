"""Through which channel z resurfaces under each operator (beyond the paper): the post-revocation
turns read as K-Bench trace records by the six-channel observer
(docs/definitions.md, "The six channels and when one is dropped"; docs/definitions.md, "The matcher").
Pure: records in, rates out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kbench.observer.metrics import channel_hit_rates
from kbench.records import TraceRecord
from kbench.replay.records import operator_order


def channel_rates(traces: Iterable[TraceRecord]) -> dict[str, dict[str, Any]]:
    """Per operator: the fraction of post-revocation turns whose channel holds z (over the turns
    where the channel is not dropped; None when it is dropped on every turn), and `turns`."""
    by_operator: dict[str, list[TraceRecord]] = defaultdict(list)
    for record in traces:
        by_operator[record.method].append(record)
    rates: dict[str, dict[str, Any]] = {}
    for operator in sorted(by_operator, key=operator_order):
        found = channel_hit_rates(by_operator[operator])
        rates[operator] = {"turns": found.pop("n"), **found}
    return rates
