"""The inference inside the agent-base and inject stages, timed alone: the agent base's
held-out evaluation and LoRA-T+D's recall probes.

Run from a project whose default stages have run (corpus, index, agent base, adapters). To
compare two commits, run it once with each commit's `src/` first on PYTHONPATH, alternating:
the printed digest covers every reply, so equal digests mean the same outputs.

    PYTHONPATH=src python benchmarks/stage_inference.py --part evaluation
    PYTHONPATH=/other/clone/src python benchmarks/stage_inference.py --part evaluation
    PYTHONPATH=src python benchmarks/stage_inference.py --part recall --json recall.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import kbench.parametric.agent_base as agent_base
import kbench.parametric.recall as recall
from kbench.backends.hf import load_model
from kbench.corpus import load_corpus
from kbench.design import load_design
from kbench.parametric.adapters import MERGED_DIR

PARTS = ("evaluation", "recall")


def evaluation(params: Any, corpus: Any) -> tuple[dict[str, float], list[Any]]:
    """`evaluate_agent` on the default agent base; every finished trajectory's replies."""
    finished: list[Any] = []
    step_batch = agent_base.ReActAgent.step_batch

    def spy(self: Any, trajectories: Any) -> None:
        step_batch(self, trajectories)
        finished.extend(t for t in trajectories if t.done)

    agent_base.ReActAgent.step_batch = spy
    with tempfile.TemporaryDirectory() as scratch:
        data = agent_base.agent_base_data(params, corpus, scratch)
        model = agent_base.agent_model_config(params)
        started = time.perf_counter()
        metrics = agent_base.evaluate_agent(model, params, data.heldout_world, data.heldout_queries,
                                            data.heldout_index, params.agent_base.faker_seed)
    seconds = time.perf_counter() - started
    outputs = sorted([t.query.query_id, t.halted_reason, t.answer, t.replies] for t in finished)
    return {**metrics, "seconds": round(seconds, 1)}, outputs


def recall_probes(params: Any, corpus: Any) -> tuple[dict[str, float], list[Any]]:
    """`recall_metrics` of the merged LoRA-T+D; every reply of both probes."""
    replies: list[Any] = []
    decode = recall.greedy_decode

    def spy(*args: Any, **kwargs: Any) -> list[str]:
        replies.append(decode(*args, **kwargs))
        return replies[-1]

    recall.greedy_decode = spy
    model, tokenizer = load_model(params.model, Path(params.injection.out_dir) / MERGED_DIR)
    started = time.perf_counter()
    metrics = recall.recall_metrics(model, tokenizer, recall.probe_groups(corpus, params), params)
    return {**metrics, "seconds": round(time.perf_counter() - started, 1)}, replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=PARTS, required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--corpus", default="artifacts/corpus")
    parser.add_argument("--json", type=Path, help="also write the metrics, seconds and outputs here")
    args = parser.parse_args()
    params, corpus = load_design(args.params), load_corpus(args.corpus)
    metrics, outputs = (evaluation if args.part == "evaluation" else recall_probes)(params, corpus)
    digest = hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]
    print(json.dumps({"part": args.part, **metrics, "outputs_digest": digest}))
    if args.json:
        args.json.write_text(json.dumps({"metrics": metrics, "outputs_digest": digest, "outputs": outputs}, indent=1))


if __name__ == "__main__":
    main()
