"""Fixed costs side by side: the agent-base and inject stages at two commits, on one machine.

Issue 13's target is a ratio ("the two stages together at most half of today's time"), and
the same stage on the same code varies by a third between machines and days, so both commits
run here, alternating within each repeat. Each commit gets its own clone with its own
default params, a copy of `models/` and an empty `data/`, and runs `dvc repro --force inject`
(corpus, index, agent_base, inject) with this project's environment and its own `src/` first
on PYTHONPATH. Stage times come from DVC's "Running stage" lines; peak RSS from the run; the
digests of the written `hashes.json` and metrics files show whether two runs wrote the same.

    PYTHONPATH=src .venv/bin/python benchmarks/fixed_costs.py --before 656585d --after HEAD \\
        --repeats 1 --json benchmarks/fixed_costs.json

`--after-set queries.n_per_split=4` runs the after commit on the before commit's workload
(656585d's default: 4 + 4 queries, so LoRA-T+D learns the same 16 entities): a key of the
after clone's params.yaml is set before its runs, the comments kept. `--keep DIR` makes the
clones in DIR and keeps them (`dvc repro` in the after clone then runs the rest of the pipeline).

The environment must hold every dependency of both commits (here: HEAD's `make setup` covers
656585d's, whose pyproject only lacks two packages). Runs take about 10-20 minutes a commit.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
_RUNNING = re.compile(r"Running stage '([^']+)'")
_LEARNED = re.compile(r"inject: (\d+) entities, (\d+) examples")
_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


def checkout(rev: str, where: Path) -> Path:
    """A clone of this repository at `rev`, with the models and an empty data folder."""
    path = where / rev
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(path), "checkout", "-q", rev], check=True, capture_output=True)
    shutil.copytree(ROOT / "models", path / "models")
    (path / "data").mkdir(exist_ok=True)
    return path


def assignment(text: str) -> tuple[str, str]:
    """`--after-set`'s KEY=VALUE, checked when the command line is read (before any clone)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"wants KEY=VALUE, got {text!r}")
    return key, value


def set_params(path: Path, assignments: list[tuple[str, str]]) -> None:
    """Set dotted keys of `path`/params.yaml (`queries.n_per_split`, `4`); the value is read as YAML."""
    if not assignments:
        return
    yaml = YAML()
    yaml.width, yaml.preserve_quotes = 4096, True
    params_file = path / "params.yaml"
    params = yaml.load(params_file)
    for key, value in assignments:
        *parents, leaf = key.split(".")
        section = params
        for part in parents:
            section = section[part]
        if leaf not in section:
            raise SystemExit(f"--after-set: params.yaml has no key {key!r}")
        section[leaf] = yaml.load(value)
    yaml.dump(params, params_file)


def output_digests(path: Path) -> dict[str, str]:
    """sha256 (first 16 hex digits) of each `hashes.json` and metrics file the stages wrote:
    equal digests across runs mean the same weights, adapters and recall figures."""
    files = sorted(f for pattern in ("hashes.json", "*metrics.json") for f in (path / "artifacts").rglob(pattern))
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in files}


def run_stages(path: Path) -> dict[str, Any]:
    """`dvc repro --force inject` in `path`: seconds per stage from the time each starts."""
    env = dict(os.environ, PYTHONPATH=str(path / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    started = time.monotonic()
    process = subprocess.Popen(["/usr/bin/time", "-v", "dvc", "repro", "--force", "inject"], cwd=path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks: list[tuple[str, float]] = []
    rss_kb = 0
    learned: list[str] = []  # "entities/examples" of each adapter trained: the same workload reads the same
    assert process.stdout is not None
    for line in process.stdout:
        if match := _RUNNING.search(line):
            marks.append((match.group(1), time.monotonic() - started))
            print(f"  {marks[-1][1]:7.1f} s  {match.group(1)}", flush=True)
        elif match := _LEARNED.search(line):
            learned.append(f"{match.group(1)}/{match.group(2)}")
        elif match := _RSS.search(line):
            rss_kb = int(match.group(1))
    if process.wait() != 0:
        raise SystemExit(f"dvc repro failed in {path} (rc {process.returncode})")
    total = time.monotonic() - started
    ends = [t for _, t in marks[1:]] + [total]
    seconds = {name: round(end - start, 1) for (name, start), end in zip(marks, ends)}
    return {"stages": seconds, "fixed_costs_s": round(seconds["agent_base"] + seconds["inject"], 1),
            "peak_rss_gb": round(rss_kb / 1e6, 2),
            "learned_entities_examples": learned, "outputs": output_digests(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="656585d", help="the commit of the filing day")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--after-first", action="store_true", help="start each pair of runs with --after")
    parser.add_argument("--after-set", action="append", default=[], type=assignment, metavar="KEY=VALUE",
                        help="set a params.yaml key of the after clone (repeatable), e.g. queries.n_per_split=4")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="make the clones in this new folder and keep them "
                        "(e.g. to run the rest of the pipeline in the after clone)")
    args = parser.parse_args()
    if args.keep and args.keep.exists():
        parser.error(f"--keep {args.keep}: the folder exists (it must be a new one)")
    if args.keep:
        args.keep.mkdir(parents=True)
    revs = {side: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                                 capture_output=True, text=True).stdout.strip()
            for side, rev in (("before", args.before), ("after", args.after))}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    folder = contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="kbench-fixed-")
    with folder as tmp:
        paths = {side: checkout(rev, Path(tmp)) for side, rev in revs.items()}
        set_params(paths["after"], args.after_set)
        for repeat in range(args.repeats):
            order = ("before", "after") if (repeat + args.after_first) % 2 == 0 else ("after", "before")
            for side in order:
                print(f"repeat {repeat + 1}, {side} ({revs[side]})", flush=True)
                runs[side].append(run_stages(paths[side]))
                print(f"  agent_base + inject: {runs[side][-1]['fixed_costs_s']} s", flush=True)
    ratios = [a["fixed_costs_s"] / b["fixed_costs_s"] for a, b in zip(runs["after"], runs["before"])]
    report = {"revisions": revs, "after_set": [f"{key}={value}" for key, value in args.after_set], "runs": runs, "after_over_before": [round(r, 3) for r in ratios]}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
