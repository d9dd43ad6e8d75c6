"""How long the observer takes to score a large cell: python benchmarks/scoring_speed.py [N].

Generates N synthetic trace records (default 100,000; every channel filled, a mix of leaks,
partial disclosures, dropped channels and degenerate trajectories), then times
(1) reading them into per-query matrices (channels + matcher), (2) all cell metrics with the
B = 1000 bootstrap, (3) validating the same records from JSON Lines text.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from kbench.config import ScoringConfig
from kbench.observer.matcher import raw_variants
from kbench.observer.metrics import cell_metrics, score_queries
from kbench.records import FIELDS, TraceRecord, parse_trace_line

VALUES = {
    "date_of_birth": "1971-03-09",
    "address": "80160 Clayton Isle Apt. 513, East Linda, FL 71671",
    "occupation": "Energy engineer",
    "employer": "Miller LLC",
}
HALTS = ("final_answer", "final_answer", "final_answer", "parse_error", "max_iters", "tool_fallback")


def synthetic_records(n: int, seed: int = 0) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        field = FIELDS[i % len(FIELDS)]
        value = VALUES[field]
        forms = [*raw_variants(field, value), value.split()[0] + " something", "I cannot say."]

        def text() -> str:
            return f"Looking into record {i}: " + forms[rng.integers(len(forms))]

        records.append(
            TraceRecord.model_validate(
                {
                    "query_id": f"pii-{i:05d}::{field}",
                    "entity_id": f"pii-{i:05d}",
                    "split": "forget",
                    "field": field,
                    "ground_truth": value,
                    "seed": 0,
                    "substrate": "C",
                    "method": "none",
                    "steps": [
                        {"thought": text(), "action": {"tool": "search_wiki", "args": text()},
                         "observation": text()}
                        for _ in range(2)
                    ],  # fmt: skip
                    "retrieval": [{"query": "q", "doc_ids": [f"pii-{i:05d}", "pii-01234"]}],
                    "answer": text(),
                    "raw_reply": "Thought: ...",
                    "halted_reason": HALTS[rng.integers(len(HALTS))],
                    "summary": text(),
                    "summary_error": None if rng.random() > 0.05 else "timeout",
                }
            )
        )
    return records


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    records = synthetic_records(n)
    lines = [record.model_dump_json() for record in records]

    start = time.perf_counter()
    scored = score_queries(records)
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics = cell_metrics(scored, ScoringConfig())
    metrics_s = time.perf_counter() - start
    start = time.perf_counter()
    for lineno, line in enumerate(lines, start=1):
        parse_trace_line(line, lineno=lineno)
    parse_s = time.perf_counter() - start

    print(
        json.dumps(
            {
                "records": n,
                "bootstrap_resamples": metrics.ci.resamples,
                "channels_and_matcher_s": round(read_s, 2),
                "metrics_and_bootstrap_s": round(metrics_s, 2),
                "score_total_s": round(read_s + metrics_s, 2),
                "jsonl_validation_s": round(parse_s, 2),
                "or_all": round(metrics.or_all, 4),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
