"""`kbench audit` against llama.cpp's server: the default run's P target must fail, gold must pass.

After a default run (`dvc repro`), from the project root:

    PYTHONPATH=src .venv/bin/python benchmarks/audit_llama_cpp.py --subjects 4 --json benchmarks/audit_llama_cpp.json

The subjects are forget-split people the target adapter was trained on and gold was not
(artifacts/adapters/*/injection.json), with their facts from artifacts/corpus. The target is
the merged LoRA-T+D folder; gold is its adapter merged onto the agent base here. Each is
converted to GGUF, served on 127.0.0.1 by `kbench.serving.llama_cpp` and audited in harness mode
with every query form; the certificates go to a temporary folder and the figures to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def subjects(corpus: Path, adapters: Path, count: int) -> list[dict]:
    target = set(json.loads((adapters / "lora_td" / "injection.json").read_text())["entities"])
    gold = set(json.loads((adapters / "gold" / "injection.json").read_text())["entities"])
    forget = {line.strip() for line in (corpus / "forget_ids_eval.txt").read_text().splitlines() if line.strip()}
    facts = {row["id"]: row for row in map(json.loads, (corpus / "v1_facts.jsonl").read_text().splitlines())}
    keys = ("id", "name", "date_of_birth", "address", "occupation", "employer")
    return [{k: facts[e][k] for k in keys} for e in sorted((target - gold) & forget)[:count]]


def merged_gold(base: Path, adapter: Path, out: Path) -> Path:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (base / name).exists():
            shutil.copyfile(base / name, out / name)
    return out


def main() -> None:
    from kbench.serving.llama_cpp import llama_server, to_gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=4)
    parser.add_argument("--adapters", type=Path, default=Path("artifacts/adapters"))
    parser.add_argument("--base", type=Path, default=Path("artifacts/agent_base"))
    parser.add_argument("--corpus", type=Path, default=Path("artifacts/corpus"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "local")
    results = {}
    with tempfile.TemporaryDirectory(prefix="kbench-audit-") as scratch:
        work = Path(scratch)
        (work / "subjects.jsonl").write_text("".join(json.dumps(s) + "\n" for s in subjects(args.corpus, args.adapters, args.subjects)))
        models = {"target": args.adapters / "merged_td", "gold": merged_gold(args.base, args.adapters / "gold", work / "gold")}
        for name, folder in models.items():
            with llama_server(to_gguf(folder, work / f"{name}.gguf"), alias=name, threads=2, n_ctx=8192) as base:
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "kbench.cli.main", "audit", "--endpoint", base, "--model",
                                       name, "--subjects", str(work / "subjects.jsonl"), "--out", str(work / name)],
                                      capture_output=True, text=True)
                certificate = json.loads((work / name / "certificate.json").read_text())
            results[name] = {
                "exit": done.returncode, "seconds": round(time.perf_counter() - started, 1), "passed": certificate["passed"],
                "subjects": {s["name"]: {c["channel"]: [c["leaks"], c["n"]] for c in s["channels"]}
                             for s in certificate["subjects"]},
            }
            print(name, done.stdout.strip(), f"({results[name]['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
