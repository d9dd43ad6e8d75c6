"""Agent throughput: the published loop, the lockstep harness on `generate`, and the KV engine.

Modes, each run in its own process on the same queries through the same ReAct loop (default
model: the agent base when it has been built), so that peak memory is the mode's own:

  published   one trajectory at a time; each step a batch-1 decode to `max_new_tokens` with
              no early stop, cut at the stop string / end of turn afterwards;
  lockstep    lockstep batches on transformers' `generate` (`model.engine: generate`): every
              step re-encodes the whole prompt; stops at `Observation:` and end of turn;
  engine      lockstep batches on the KV engine (`model.engine: kv`, the default);
  llama-cpp   the same batches as concurrent requests to llama.cpp's server over the same
              folder (`model.backend: llama-cpp`; conversion and server start not timed,
              the server's own memory not in the peak RSS).

For every substrate the report gives trajectories/s with the spread over `--repeats`, peak
RSS, the engine's prefill/decode split, and its harness efficiency: generated tokens/s inside
the cell ÷ tokens/s of a raw batched `generate` (no stop strings) at the same batch on the
cell's first prompts. It also gives the equivalence of the engine with the lockstep harness:
identical traces, and for each trajectory that differs the top-2 logit gap, in a batch-1 full
recompute, at the first token where the two replies part. Across engines (llama-cpp against
engine) identical traces are not expected: the report gives their agreement, trajectory by
trajectory and channel by channel (the matcher's leak reading of each of the six channels). `--batch-sizes` sweeps the
engine's batch size.

    PYTHONPATH=src python benchmarks/agent_throughput.py --n 16 --substrates C R-struct \\
        --modes lockstep engine --batch-sizes 4 8 16 32 --json benchmarks/agent_throughput.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kbench.backends import Conversation, Generation
from kbench.backends.base import truncate_at_stop
from kbench.backends.hf import HFBackend, encode_prompt, end_of_turn_ids, load_model, render_prompt
from kbench.backends.llama_cpp import LlamaCppBackend
from kbench.names import GENERATE_ENGINE, KV_ENGINE
from kbench.observer import CHANNELS
from kbench.observer.metrics import score_queries
from kbench.records import TraceRecord

MODES = ("published", "lockstep", "engine", "llama-cpp")


class PublishedHarnessBackend(HFBackend):
    """Batch-1 generation to `max_new_tokens` with no early stop, truncated afterwards."""

    name = "hf-published"

    @torch.inference_mode()
    def generate(self, conversations: Sequence[Conversation], *, stop: Sequence[str], max_new_tokens: int,
                 **_: Any) -> list[Generation]:
        out = []
        for conversation in conversations:
            ids = self.tokenizer(self.render(conversation), return_tensors="pt", add_special_tokens=False)["input_ids"]
            step = self.model(input_ids=ids.to(self.device), use_cache=True)
            tokens = []
            for _ in range(max_new_tokens):  # greedy, and no stop at end of turn
                token = step.logits[0, -1].argmax().item()
                tokens.append(token)
                next_ids = torch.tensor([[token]], device=self.device)
                step = self.model(input_ids=next_ids, cache=step.cache, use_cache=True)
            end = next((i for i, t in enumerate(tokens) if t in self._end_of_turn_ids), len(tokens))
            text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
            out.append(Generation(truncate_at_stop(text, stop)))
        return out


def _model_config(model_path: str | None, engine: str):
    from kbench.backends.packaged import ensure_default_model, is_model_folder
    from kbench.config import Params
    from kbench.parametric.agent_base import agent_model_config

    params = Params()
    model = agent_model_config(params)
    if model_path is not None:
        model = model.model_copy(update={"path": model_path})
    elif not is_model_folder(model.path):
        model = params.model.model_copy(update={"path": str(ensure_default_model())})
    return params, model.model_copy(update={"device": "cpu", "dtype": "float32", "engine": engine})


def run_mode(mode: str, n: int, substrate: str, batch_size: int, model_path: str | None, out: Path) -> None:
    """One mode on one substrate: records, every step's prompt and reply, timing, memory."""
    from kbench.agent import ReActAgent
    from kbench.backends import build_backend
    from kbench.corpus import generate_corpus
    from kbench.methods import MethodContext, build_method
    from kbench.substrates import build_index, build_substrate, index_entities

    params, model = _model_config(model_path, KV_ENGINE if mode == "engine" else GENERATE_ENGINE)
    corpus = generate_corpus(params.corpus)
    with tempfile.TemporaryDirectory() as scratch:
        index_dir = build_index(index_entities(corpus), scratch)
        config = params.agent.model_copy(update={"batch_size": 1 if mode == "published" else batch_size})
        if mode == "llama-cpp":
            model = model.model_copy(update={"backend": LlamaCppBackend.name})
        backend = PublishedHarnessBackend(model) if mode == "published" else build_backend(model)
        if mode == "llama-cpp":
            backend.start()  # the GGUF conversion and the server's start, outside the timed part
        agent = ReActAgent(
            backend, build_substrate(substrate, corpus, config, seed=0, index_dir=index_dir),
            build_method("none", MethodContext(corpus, params, 0)), config, seed=0,
        )
        calls: dict[str, list[dict]] = {}
        generate = agent._generate

        def logged(queries, conversations, **kwargs):  # every step's prompt and reply, per query
            generations = generate(queries, conversations, **kwargs)
            for query, conversation, generation in zip(queries, conversations, generations):
                calls.setdefault(query.query_id, []).append({"conversation": conversation, "reply": generation.text})
            return generations

        agent._generate = logged  # type: ignore[method-assign]
        items = [(q, "forget") for q in corpus.sample_queries("forget", n, 0)] + [
            (q, "retain") for q in corpus.sample_queries("retain", n, 0)]
        records = []
        started = time.perf_counter()
        agent.run(items, records.append)
        elapsed = time.perf_counter() - started
    result = {
        "mode": mode, "substrate": substrate, "batch_size": config.batch_size, "model": model.path,
        "trajectories": len(records), "seconds": elapsed, "trajectories_per_s": len(records) / elapsed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "records": {r.query_id: r.model_dump() for r in records}, "calls": calls,
    }
    if mode == "engine":
        stats = backend._engine.stats
        result["engine"] = vars(stats) | {"generated_tokens_per_s": stats.generated_tokens / elapsed}
    out.write_text(json.dumps(result))


@torch.inference_mode()
def raw_generate_rate(model_path: str | None, prompts: list[Conversation], max_new_tokens: int) -> dict:
    """One raw batched `generate` (no stop strings): tokens/s and its prefill/decode split;
    then the same with `stop_strings=["Observation:"]`, for the cost of a decode pass with it."""
    _, config = _model_config(model_path, GENERATE_ENGINE)
    model, tokenizer = load_model(config)
    tokenizer.padding_side = "left"
    encoded = tokenizer([render_prompt(tokenizer, c) for c in prompts], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    eos = end_of_turn_ids(model, tokenizer)
    started = time.perf_counter()
    model(**encoded, logits_to_keep=1)
    prefill = time.perf_counter() - started
    runs = {}
    for label, stop in (("no_stop", None), ("stop", ["Observation:"])):
        started = time.perf_counter()
        output = model.generate(**encoded, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                                pad_token_id=tokenizer.pad_token_id, stop_strings=stop, tokenizer=tokenizer)
        seconds = time.perf_counter() - started
        new = output[:, encoded["input_ids"].shape[1]:]
        tokens = int(sum(next((i + 1 for i, t in enumerate(row.tolist()) if t in eos), len(row)) for row in new))
        runs[label] = {"seconds": seconds, "tokens": tokens, "passes": new.shape[1],
                       "ms_per_decode_pass": 1000 * (seconds - prefill) / max(new.shape[1] - 1, 1)}
    raw = runs["no_stop"]
    return {"rows": len(prompts), "prompt_tokens": int(encoded["attention_mask"].sum()),
            "padded_prompt_tokens": int(encoded["attention_mask"].numel()), "prefill_seconds": prefill,
            "tokens": raw["tokens"], "seconds": raw["seconds"], "tokens_per_s": raw["tokens"] / raw["seconds"],
            "ms_per_decode_pass": raw["ms_per_decode_pass"],
            "ms_per_decode_pass_with_stop_strings": runs["stop"]["ms_per_decode_pass"]}


@torch.inference_mode()
def near_tie_gap(model_path: str | None, conversation: Conversation, reference: str, other: str) -> float:
    """Top-2 logit gap, in a batch-1 full recompute, at the first token where two replies part."""
    _, config = _model_config(model_path, GENERATE_ENGINE)
    model, tokenizer = _cached_model(config)
    prompt = encode_prompt(tokenizer, conversation)
    eos = end_of_turn_ids(model, tokenizer)
    common = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), min(len(reference), len(other)))
    tokens: list[int] = []
    while True:  # greedy from the prompt until the decoded text leaves the common part
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        token = int(logits.argmax())
        text = tokenizer.decode(tokens + [token], skip_special_tokens=True)
        if len(text) > common or token in eos or len(tokens) > 256:
            return float(top[0] - top[1])
        tokens.append(token)


_MODELS: dict[str, Any] = {}


def _cached_model(config):
    if config.path not in _MODELS:
        _MODELS[config.path] = load_model(config)
    return _MODELS[config.path]


def equivalence(model_path: str | None, reference: dict, engine: dict) -> dict:
    """Identical traces between two runs, and the near-tie gap of every one that differs."""
    same, gaps = 0, []
    for query_id, record in reference["records"].items():
        if engine["records"].get(query_id) == record:
            same += 1
            continue
        for ref_call, eng_call in zip(reference["calls"][query_id], engine["calls"][query_id]):
            if ref_call["reply"] != eng_call["reply"]:
                gap = near_tie_gap(model_path, ref_call["conversation"], ref_call["reply"], eng_call["reply"])
                gaps.append({"query_id": query_id, "gap": gap})
                break
    return {"identical": same, "trajectories": len(reference["records"]), "differing": gaps,
            "near_ties": sum(g["gap"] < 1e-3 for g in gaps)}


def agreement(reference: dict, other: dict) -> dict:
    """How far two engines' trajectories agree: identical records, answers, and the matcher's
    leak reading per channel (the share of trajectories where it is the same)."""
    ids = sorted(reference["records"])
    pair = [score_queries(TraceRecord.model_validate(run["records"][i]) for i in ids) for run in (reference, other)]
    same_channel = (pair[0].hits == pair[1].hits).mean(axis=0)
    return {
        "trajectories": len(ids),
        "identical": sum(reference["records"][i] == other["records"][i] for i in ids),
        "same_answer": sum(reference["records"][i]["answer"] == other["records"][i]["answer"] for i in ids),
        "same_leak_any_channel": float((pair[0].leaked() == pair[1].leaked()).mean()),
        "same_leak_per_channel": dict(zip(CHANNELS, map(float, same_channel))),
        "leaked_share": [float(p.leaked().mean()) for p in pair],
    }


def spawn(mode: str, args: argparse.Namespace, substrate: str, batch_size: int, scratch: str) -> dict:
    out = Path(scratch, f"{mode}-{substrate}-{batch_size}.json")
    command = [sys.executable, __file__, "--mode", mode, "--n", str(args.n), "--substrate", substrate,
               "--batch-size", str(batch_size), "--out", str(out)]
    subprocess.run(command + (["--model", args.model] if args.model else []), check=True)
    return json.loads(out.read_text())


def _rate(runs: list[dict]) -> str:
    rates = [r["trajectories_per_s"] for r in runs]
    spread = f" ± {statistics.stdev(rates):.3f}" if len(rates) > 1 else ""
    return f"{statistics.mean(rates):.3f}{spread} trajectories/s over {len(rates)} run(s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="queries per split")
    parser.add_argument("--substrates", nargs="+", default=["C", "R-struct"])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--batch-size", type=int, default=16, help="lockstep and engine batch size")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[], help="engine batch-size sweep")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode (the spread is reported)")
    parser.add_argument("--model", help="model folder (default: the agent base if built, else the default model)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--substrate", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.n, args.substrate, args.batch_size, args.model, args.out)
        return
    report: dict[str, Any] = {"n_per_split": args.n, "torch_threads": torch.get_num_threads(), "substrates": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for substrate in args.substrates:
            runs = {m: [spawn(m, args, substrate, args.batch_size, scratch) for _ in range(args.repeats)]
                    for m in args.modes}
            entry: dict[str, Any] = {}
            print(f"== {substrate}: {2 * args.n} trajectories, batch {args.batch_size}")
            for mode, results in runs.items():
                entry[mode] = {k: [r[k] for r in results] for k in ("trajectories_per_s", "seconds", "peak_rss_mb")}
                print(f"{mode:>10}: {_rate(results)}, peak RSS {max(r['peak_rss_mb'] for r in results):.0f} MB")
            if "engine" in runs:
                first = runs["engine"][0]
                stats = first["engine"]
                prompts = [calls[0]["conversation"] for calls in list(first["calls"].values())[: args.batch_size]]
                raw = raw_generate_rate(args.model, prompts, 96)
                efficiency = stats["generated_tokens_per_s"] / raw["tokens_per_s"]
                entry["engine_stats"], entry["raw_generate"], entry["harness_efficiency"] = stats, raw, efficiency
                print(f"    engine: prefill {stats['prefill_seconds']:.1f} s ({stats['prefill_tokens']} tokens fed, "
                      f"{stats['reused_tokens']} reused), decode {stats['decode_seconds']:.1f} s "
                      f"({stats['decode_passes']} passes); {stats['generated_tokens_per_s']:.1f} generated tokens/s")
                print(f"    raw generate at batch {raw['rows']}: {raw['tokens_per_s']:.1f} tokens/s "
                      f"(prefill {raw['prefill_seconds']:.1f} s of {raw['seconds']:.1f} s); "
                      f"harness efficiency {efficiency:.2f}")
                print(f"    generate decode pass: {raw['ms_per_decode_pass']:.0f} ms without stop strings, "
                      f"{raw['ms_per_decode_pass_with_stop_strings']:.0f} ms with them; engine decode pass "
                      f"{1000 * stats['decode_seconds'] / max(stats['decode_passes'], 1):.0f} ms")
            for mode in ("lockstep", "published"):
                if mode in runs and mode != "engine" and "engine" in runs:
                    ratio = statistics.mean(r["trajectories_per_s"] for r in runs["engine"]) / statistics.mean(
                        r["trajectories_per_s"] for r in runs[mode])
                    entry[f"engine_over_{mode}"] = ratio
                    print(f"    engine / {mode}: {ratio:.2f}x")
            if "llama-cpp" in runs and "engine" in runs:
                ratio = statistics.mean(r["trajectories_per_s"] for r in runs["llama-cpp"]) / statistics.mean(
                    r["trajectories_per_s"] for r in runs["engine"])
                agree = agreement(runs["engine"][0], runs["llama-cpp"][0])
                entry["llama_cpp_over_engine"], entry["llama_cpp_agreement"] = ratio, agree
                print(f"    llama-cpp / engine: {ratio:.2f}x; identical traces {agree['identical']}/"
                      f"{agree['trajectories']}, same answer {agree['same_answer']}, same leak reading (any "
                      f"channel) {agree['same_leak_any_channel']:.2f}, per channel "
                      f"{ {c: round(v, 2) for c, v in agree['same_leak_per_channel'].items()} }, leaked share "
                      f"engine {agree['leaked_share'][0]:.2f} vs llama-cpp {agree['leaked_share'][1]:.2f}")
            if "lockstep" in runs and "engine" in runs:
                eq = equivalence(args.model, runs["lockstep"][0], runs["engine"][0])
                entry["equivalence"] = eq
                print(f"    identical traces (engine vs lockstep): {eq['identical']}/{eq['trajectories']}; "
                      f"differing: {len(eq['differing'])}, of which near ties (gap < 1e-3): {eq['near_ties']}; "
                      f"gaps {[round(g['gap'], 5) for g in eq['differing']]}")
            sweep = {}
            for size in args.batch_sizes:
                result = spawn("engine", args, substrate, size, scratch)
                sweep[size] = {k: result[k] for k in ("trajectories_per_s", "seconds", "peak_rss_mb")}
                print(f"    engine batch {size:>3}: {result['trajectories_per_s']:.3f} trajectories/s, "
                      f"peak RSS {result['peak_rss_mb']:.0f} MB")
            if sweep:
                entry["batch_sweep"] = sweep
            report["substrates"][substrate] = entry
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
