"""Probe cost: the `probes` stage with `execution.probe_workers` 1 (one model after the other,
on one thread) against 2 (two children, one thread each), on the same models, the raw rows
compared byte for byte; and one model's time split into loading, scoring and decoding.

Run it in a repo whose pipeline has been built up to the probes (`dvc repro probes`, or a
finished `dvc repro`): each mode runs `kbench probes --no-track` on `--models` into a scratch
folder. Repeats alternate the order of the modes, so drift on a noisy machine falls on both.

    PYTHONPATH=src python benchmarks/probe_cost.py --models P__lora__none P__lora__ga P__lora__eco \\
        P__lora__o3 --repeats 2 --json benchmarks/probe_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def run_mode(workers: int, models: list[str], out: Path, params: Path) -> float:
    data = yaml.safe_load(params.read_text())
    data["probes"]["out_dir"] = str(out)
    data["execution"]["probe_workers"] = workers
    scratch = out.parent / f"params-{workers}.yaml"
    scratch.write_text(yaml.safe_dump(data, sort_keys=False))
    command = [sys.executable, "-m", "kbench.cli.main", "--params", str(scratch), "probes", "--no-track"]
    for model in models:
        command += ["--model", model]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def raw_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("raw.json"))}


def split_one(model: str) -> dict[str, float]:
    """One model's probe, timed by part, in this process (one thread, as the stage runs it)."""
    import torch

    from kbench.agent import deployed_model
    from kbench.corpus import load_corpus
    from kbench.design import load_design
    from kbench.probes.items import FORGET, HELDOUT, probe_items
    from kbench.probes.run import ProbeRunner, _question_rows
    from kbench.stages.cell import deployment
    from kbench.stages.corpus import CORPUS_DIR
    from kbench.stages.probes import probed_models

    torch.set_num_threads(1)
    params = load_design("params.yaml")
    corpus = load_corpus(CORPUS_DIR)
    items = probe_items(corpus, params)
    spec = {m.key: m for m in probed_models(params)}[model].spec
    started = time.perf_counter()
    deployed = deployment(params, spec)
    backend, method = deployed_model(
        params, corpus, deployed.model, substrate=spec.substrate, method=spec.method, seed=spec.seed,
        adapter_path=str(deployed.adapter_path) if deployed.adapter_path else None,
        merge_adapter=spec.recipe == "merged", fitted=deployed.fitted, unlearned=deployed.unlearned,
    )
    loaded = time.perf_counter()
    runner = ProbeRunner(backend, method, params.probes)
    runner.score(_question_rows(items.questions) + _question_rows(items.general)
                 + [(b.query, b.prompt, "", b.text) for b in items.bios if b.group in (FORGET, HELDOUT)])
    scored = time.perf_counter()
    runner.generate([(q.query, q.prompt, "") for q in items.questions]
                    + [(b.query, b.prompt, b.prefix) for b in items.bios if b.group != HELDOUT and b.rest])
    done = time.perf_counter()
    stats = backend.engine.stats
    return {"load_s": loaded - started, "score_s": scored - loaded, "generate_s": done - scored,
            "prefill_tokens": stats.prefill_tokens, "generated_tokens": stats.generated_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    identical = True
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = (1, 2) if repeat % 2 == 0 else (2, 1)
            outputs = {}
            for workers in order:
                out = Path(tmp, f"r{repeat}-w{workers}")
                times[workers].append(run_mode(workers, args.models, out, Path("params.yaml")))
                outputs[workers] = raw_bytes(out)
            identical &= outputs[1] == outputs[2] and len(outputs[1]) == len(args.models)
    ratios = [a / b for a, b in zip(times[1], times[2])]
    report = {
        "models": args.models,
        "seconds": {f"workers_{w}": t for w, t in times.items()},
        "speedup_2_over_1": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "raw_rows_identical": identical,
        "one_model_split": split_one(args.models[0]),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
