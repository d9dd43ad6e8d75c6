"""Agent throughput: this harness vs the published way of running the agent.

(a) published: one trajectory at a time; each step is one batch-1 `generate` that stops only
    at `max_new_tokens`, and the text is cut at the stop string / end of turn afterwards;
(b) this harness: lockstep batches, generation stopping at `Observation:` and end of turn.

Both run the same queries through the same ReAct loop on the default model (the agent base
when it has been built). Each mode runs in its own process so peak memory is its own.

    PYTHONPATH=src python benchmarks/agent_throughput.py --n 8 --substrate R-struct
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kbench.backends import Conversation, Generation
from kbench.backends.base import truncate_at_stop
from kbench.backends.hf import HFBackend


class PublishedHarnessBackend(HFBackend):
    """Batch-1 generation to `max_new_tokens` with no early stop, truncated afterwards."""

    name = "hf-published"

    @torch.inference_mode()
    def generate(self, conversations: Sequence[Conversation], *, stop: Sequence[str], max_new_tokens: int) -> list[Generation]:
        out = []
        for conversation in conversations:
            ids = self.tokenizer(self.render(conversation), return_tensors="pt", add_special_tokens=False)["input_ids"]
            step = self.model(input_ids=ids.to(self.device), use_cache=True)
            tokens = []
            for _ in range(max_new_tokens):  # greedy, and no stop at end of turn
                token = step.logits[0, -1].argmax().item()
                tokens.append(token)
                next_ids = torch.tensor([[token]], device=self.device)
                step = self.model(input_ids=next_ids, past_key_values=step.past_key_values, use_cache=True)
            end = next((i for i, t in enumerate(tokens) if t in self._end_of_turn_ids), len(tokens))
            text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
            out.append(Generation(truncate_at_stop(text, stop)))
        return out


def run_mode(mode: str, n: int, substrate: str, model_path: str | None, out: Path) -> None:
    from kbench.agent import ReActAgent
    from kbench.parametric.agent_base import agent_model_config
    from kbench.backends import build_backend
    from kbench.config import Params
    from kbench.corpus import generate_corpus
    from kbench.methods import MethodContext, build_method
    from kbench.backends.packaged import ensure_default_model, is_model_folder
    from kbench.substrates import build_index, build_substrate, index_entities

    params = Params()
    model = agent_model_config(params)
    if model_path is not None:
        model = model.model_copy(update={"path": model_path})
    elif not is_model_folder(model.path):
        model = params.model.model_copy(update={"path": str(ensure_default_model())})
    model = model.model_copy(update={"device": "cpu", "dtype": "float32"})
    corpus = generate_corpus(params.corpus)
    with tempfile.TemporaryDirectory() as scratch:
        index_dir = build_index(index_entities(corpus), scratch)
        config = params.agent if mode == "lockstep" else params.agent.model_copy(update={"batch_size": 1})
        backend = build_backend(model) if mode == "lockstep" else PublishedHarnessBackend(model)
        agent = ReActAgent(
            backend, build_substrate(substrate, corpus, config, seed=0, index_dir=index_dir),
            build_method("none", MethodContext(corpus, params, 0)), config, seed=0,
        )
        items = [(q, "forget") for q in corpus.sample_queries("forget", n, 0)] + [
            (q, "retain") for q in corpus.sample_queries("retain", n, 0)]
        records = []
        started = time.perf_counter()
        agent.run(items, records.append)
        elapsed = time.perf_counter() - started
    result = {
        "mode": mode,
        "model": model.path,
        "trajectories": len(records),
        "seconds": elapsed,
        "trajectories_per_s": len(records) / elapsed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "records": {r.query_id: r.model_dump() for r in records},
    }
    out.write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="queries per split")
    parser.add_argument("--substrate", default="R-struct")
    parser.add_argument("--model", help="model folder (default: the agent base if built, else the default model)")
    parser.add_argument("--mode", choices=["published", "lockstep"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.n, args.substrate, args.model, args.out)
        return
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("published", "lockstep"):
            out = Path(scratch, f"{mode}.json")
            command = [sys.executable, __file__, "--mode", mode, "--n", str(args.n),
                       "--substrate", args.substrate, "--out", str(out)]
            subprocess.run(command + (["--model", args.model] if args.model else []), check=True)
            results[mode] = json.loads(out.read_text())
    published, lockstep = results["published"], results["lockstep"]
    same = sum(published["records"][q] == lockstep["records"].get(q) for q in published["records"])
    print(f"model: {lockstep['model']}  substrate: {args.substrate}  trajectories: {lockstep['trajectories']}"
          f"  torch threads: {torch.get_num_threads()}")
    for mode in ("published", "lockstep"):
        r = results[mode]
        print(f"{mode:>10}: {r['trajectories_per_s']:.3f} trajectories/s ({r['seconds']:.1f} s), "
              f"peak RSS {r['peak_rss_mb']:.0f} MB")
    print(f"speed-up: {lockstep['trajectories_per_s'] / published['trajectories_per_s']:.2f}x")
    print(f"identical traces: {same}/{len(published['records'])} = {same / len(published['records']):.2f}")


if __name__ == "__main__":
    main()
