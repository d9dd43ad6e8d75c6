"""Each forget operator's own wall time in the execution-state lane: the `seconds` a session
record measures around the operator's `apply` (its work before the post-revocation turns and
probes), as a median over the suite's sessions with its spread (min, max), per suite.

Reads the records a replay stage wrote, so the figures are the run's own; writes a JSON record
of the run (machine, command, figures) and the table between this script's markers in
BENCHMARKS.md (written here, never by hand):

    PYTHONPATH=src python benchmarks/replay_operator_seconds.py artifacts/replay/*/sessions.jsonl \\
        --json benchmarks/replay_operator_seconds.json --benchmarks BENCHMARKS.md --note "idle"
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from kbench.replay.records import operator_order, read_sessions

START, END = "<!-- replay_operator_seconds: start -->", "<!-- replay_operator_seconds: end -->"


def machine() -> dict:
    """The CPU the run was on: model name, cores, and whether it has AVX512-BF16."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return {"cpu": model or platform.processor(), "cores": info.count("processor\t:") or None,
            "avx512_bf16": "avx512_bf16" in flags}


def figures(paths: list[Path]) -> dict[str, dict[str, dict]]:
    """{suite: {operator: {sessions, median, min, max}}} of the records' `seconds`."""
    seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in read_sessions(paths):
        seconds[record.suite][record.operator].append(record.seconds)
    return {suite: {op: {"sessions": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
                    for op, v in sorted(ops.items(), key=lambda item: operator_order(item[0]))}
            for suite, ops in sorted(seconds.items())}


def table(run: dict) -> str:
    """The markdown section BENCHMARKS.md shows between the markers."""
    m = run["machine"]
    lines = [START, "",
             f"Each operator's own seconds (median over sessions, [min, max]) from `{run['command']}` on "
             f"{m['cpu']} ({'AVX512-BF16' if m['avx512_bf16'] else 'AVX2'}), {run['date']}; {run['note']}.", "",
             "| suite | " + " | ".join(run["operators"]) + " |", "|---|" + "---|" * len(run["operators"])]
    for suite, ops in run["figures"].items():
        cells = [f"{ops[o]['median']:.1f} [{ops[o]['min']:.1f}, {ops[o]['max']:.1f}]" if o in ops else "-"
                 for o in run["operators"]]
        lines.append(f"| {suite} ({max(v['sessions'] for v in ops.values())}) | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", END])


def write_section(path: Path, section: str) -> None:
    """Replace the section between the markers (or append it under its heading)."""
    text = path.read_text(encoding="utf-8")
    if START in text and END in text:
        text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Execution-state lane: each operator's own wall time\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="sessions.jsonl files of a replay run")
    parser.add_argument("--json", type=Path, help="write the run record here")
    parser.add_argument("--benchmarks", type=Path, help="rewrite this file's section (BENCHMARKS.md)")
    parser.add_argument("--date", required=True, help="the run's day (YYYY-MM-DD), stated with the figures")
    parser.add_argument("--note", default="", help="how the machine was used during the run (idle, shared)")
    args = parser.parse_args(argv)
    found = figures(args.records)
    run = {"date": args.date, "command": "kbench replay-run (dvc repro replay)", "note": args.note,
           "machine": machine(), "records": [str(p) for p in args.records], "figures": found,
           "operators": sorted({o for ops in found.values() for o in ops}, key=operator_order)}
    if args.json:
        args.json.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.benchmarks:
        write_section(args.benchmarks, table(run))
    print(table(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
