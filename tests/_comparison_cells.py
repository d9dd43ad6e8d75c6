"""Hand-built cell runs for the comparison tests, and one small design with known answers.

A split of a cell is described by how many queries leak through which channel, in a fixed
order (answer, summary, both, degenerate, clean), numbered 0, 1, 2, … so that cells of the
same seed pair up query by query. Every query asks for the occupation 'Lawyer'.
"""

from __future__ import annotations

from kbench.comparison.analysis import CellRun
from kbench.records import TraceRecord

from _traces import trace

#: Record shapes by kind: which channel leaks, or a parse error that leaks nothing.
KINDS = {
    "answer": {"answer": "Lawyer"},
    "summary": {"summary": "a lawyer"},
    "both": {"answer": "Lawyer", "summary": "a lawyer"},
    "degenerate": {"halted_reason": "parse_error", "thoughts": ["hm"], "answer": None},
    "clean": {},
}
#: Retain queries are other entities than forget queries, as in a real cell.
RETAIN_OFFSET = 1000
BASE_MODEL = "tiny"
SEEDS = (0, 137)


def split_records(split: str, *, method: str, substrate: str, seed: int, **counts: int) -> list[TraceRecord]:
    unknown = set(counts) - set(KINDS)
    assert not unknown, f"unknown record kinds {unknown}"
    shapes = [shape for kind, shape in KINDS.items() for _ in range(counts.get(kind, 0))]
    offset = RETAIN_OFFSET if split == "retain" else 0
    return [
        trace(query=offset + i, split=split, seed=seed, method=method, substrate=substrate, **shape)
        for i, shape in enumerate(shapes)
    ]


def cell_run(
    method: str, substrate: str, *, forget: dict[str, int], retain: dict[str, int], seed: int = 0,
    recipe: str = "none", base_model: str = BASE_MODEL,
) -> CellRun:
    records = split_records("forget", method=method, substrate=substrate, seed=seed, **forget)
    records += split_records("retain", method=method, substrate=substrate, seed=seed, **retain)
    return CellRun(
        run_id=f"{base_model}-{substrate}-{recipe}-{method}-s{seed}",
        base_model=base_model, substrate=substrate, recipe=recipe, method=method, seed=seed,
        records=tuple(records),
    )


BASELINE_RETAIN = {"answer": 10, "clean": 10}


def design() -> list[CellRun]:
    """Three substrates, two seeds, N = 20 queries per split and seed.

    Baselines (forget): C leaks through the answer on queries 0-15 (seed 137: 12 answer-only,
    4 answer+summary); R-struct through the answer on 0-9 and the summary on 10-19; R-text on
    one query only (an invalid baseline). Methods on C: `eraser` stops every leak, `halver`
    keeps 6 answer leaks, `migrator` moves all 16 leaks to the summary and loses one retain
    leak, `collapser` only emits parse errors. On R-struct: `eraser`, and `hider`, which stops
    the summary leaks only. On R-text: `eraser`. Plus a LoRA-D control on C and a P row
    (`ga`) whose baseline never ran.
    """
    c_baseline = {0: {"answer": 16, "clean": 4}, 137: {"answer": 12, "both": 4, "clean": 4}}
    forget_by_row = {
        ("C", "migrator"): {"summary": 16, "clean": 4},
        ("C", "collapser"): {"degenerate": 20},
        ("C", "eraser"): {"clean": 20},
        ("C", "halver"): {"answer": 6, "clean": 14},
        ("R-struct", "none"): {"answer": 10, "summary": 10},
        ("R-struct", "eraser"): {"clean": 20},
        ("R-struct", "hider"): {"answer": 10, "clean": 10},
        ("R-text", "none"): {"answer": 1, "clean": 19},
        ("R-text", "eraser"): {"clean": 20},
    }
    retain_by_row = {("C", "migrator"): {"answer": 9, "clean": 11}}
    cells = []
    for seed in SEEDS:
        cells.append(cell_run("none", "C", seed=seed, forget=c_baseline[seed], retain=BASELINE_RETAIN))
        for (substrate, method), forget in forget_by_row.items():
            retain = retain_by_row.get((substrate, method), BASELINE_RETAIN)
            cells.append(cell_run(method, substrate, seed=seed, forget=forget, retain=retain))
        cells.append(
            cell_run("none", "C", seed=seed, recipe="lora-d", forget={"answer": 16, "degenerate": 4}, retain=BASELINE_RETAIN)
        )
    cells.append(cell_run("ga", "P", recipe="lora", forget={"clean": 20}, retain=BASELINE_RETAIN))
    return cells
