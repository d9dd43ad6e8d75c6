"""Pipeline-stage subcommands: setup, corpus, index, agent-base, cell, sync, preset, params."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import yaml

from kbench import tracking
from kbench.config import load_params
from kbench.corpus import build_corpus
from kbench.models import DEFAULT_MODEL_DIR, ensure_default_model

log = logging.getLogger(__name__)

PRESETS_DIR = Path("presets")
CORPUS_DIR = Path("artifacts/corpus")
INDEX_DIR = Path("artifacts/index")
#: Folders whose stage outputs carry a run manifest that `kbench sync` can re-log.
OUTPUT_ROOTS = (Path("artifacts"), Path("reports"))


def cmd_setup(args: argparse.Namespace) -> int:
    """Prepare inputs that are not pip packages: the default model folder and data/."""
    path = ensure_default_model(Path(args.model_dir))
    Path("data").mkdir(exist_ok=True)
    print(f"default model ready at {path}")
    return 0


def cmd_corpus(args: argparse.Namespace) -> int:
    from kbench.cli import read_params

    params = read_params(args)
    out = Path(args.out)
    corpus = build_corpus(params.corpus, out)
    sizes = {name: len(ids) for name, ids in corpus.pools.items()}
    log.info("corpus %s: %d entities, pools %s", corpus.source, len(corpus.entities), sizes)
    metrics = {f"pool_{name}": size for name, size in sizes.items()}
    metrics["n_entities"] = len(corpus.entities)
    metrics["n_distractors"] = len(corpus.distractor_ids)
    tracking.write_manifest(
        out, "corpus", corpus.fingerprint(),
        tags={"kbench.corpus_source": corpus.source}, metrics=metrics,
    )
    if not args.no_track:
        tracking.log_output(params, out)
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    """The R-text substrate's FAISS index over target and distractor passages."""
    from kbench.cli import read_params
    from kbench.corpus import load_corpus
    from kbench.substrates import build_index, index_entities

    read_params(args)
    corpus = load_corpus(args.corpus)
    entities = index_entities(corpus)
    build_index(entities, Path(args.out))
    log.info("index: passages of %d entities (eval pools and distractors) in %s", len(entities), args.out)
    return 0


def cmd_agent_base(args: argparse.Namespace) -> int:
    """LoRA-tune the base model into a ReAct agent and merge it (skipped when disabled)."""
    from kbench.agent_base import train_agent_base
    from kbench.cli import read_params
    from kbench.corpus import load_corpus

    params = read_params(args)
    out = Path(params.agent_base.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = train_agent_base(params, load_corpus(args.corpus), out)
    report = out / "agent_base_metrics.json"
    report.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    tracking.write_manifest(
        out, "agent_base", Path(params.model.path).name,
        tags={"kbench.base_model": Path(params.model.path).name}, metrics=metrics,
        artifacts=[report.name],
    )
    if not args.no_track:
        tracking.log_output(params, out)
    return 0


def cmd_cell(args: argparse.Namespace) -> int:
    """One cell (or, on P without --recipe, one per `p_recipes`): run, score, record."""
    from kbench.cells import CellSpec, run_cell_stage, unreachable_reason, write_skipped
    from kbench.cli import read_params

    params = read_params(args)
    out_root = Path(args.out_root)
    if args.recipe:
        recipes = [args.recipe]
    else:
        recipes = list(params.p_recipes) if args.substrate == "P" else ["none"]
    specs = [CellSpec(args.substrate, args.method, args.seed, recipe) for recipe in recipes]
    reason = unreachable_reason(args.substrate, args.method)
    if reason is not None:
        if not args.skip_unreachable:
            raise ValueError(reason)
        write_skipped(out_root, specs[0], reason)
        print(f"skipped: {reason}")
        return 0
    for spec in specs:
        out = run_cell_stage(
            params, spec, corpus_dir=Path(args.corpus), index_dir=Path(args.index),
            adapter_path=Path(args.adapter) if args.adapter else None,
            out_root=out_root, track=not args.no_track,
        )
        print(f"cell {spec.cell_id}: {out}")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Log every stage output that has no MLflow run yet (a fresh clone, a DVC cache hit)."""
    from kbench.cli import read_params

    params = read_params(args)
    run_ids = tracking.sync_outputs(params, [Path(p) for p in args.roots])
    print(f"{len(run_ids)} stage outputs are in MLflow ({tracking.tracking_uri(params)})")
    return 0


def cmd_preset(args: argparse.Namespace) -> int:
    """Copy a preset over params.yaml after validating it."""
    source = PRESETS_DIR / f"{args.name}.yaml"
    if not source.exists():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise ValueError(f"unknown preset {args.name!r}; known presets: {known}")
    load_params(source)
    shutil.copyfile(source, args.params)
    print(f"{args.params} now holds preset {args.name!r}; run `dvc repro` (or `dvc exp run`)")
    return 0


def cmd_check_params(args: argparse.Namespace) -> int:
    from kbench.cli import read_params

    params = read_params(args)
    if args.show:
        print(yaml.safe_dump(params.model_dump(), sort_keys=False))
    else:
        print(f"{args.params}: valid")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("setup", help="convert the packaged default model into models/ (once)")
    p.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    p.set_defaults(handler=cmd_setup)

    p = sub.add_parser("corpus", help="build (or import) the corpus: entities, pools, queries")
    p.add_argument("--out", default=str(CORPUS_DIR), help="output folder (default: %(default)s)")
    p.add_argument("--no-track", action="store_true", help="do not log an MLflow run")
    p.set_defaults(handler=cmd_corpus)

    p = sub.add_parser("index", help="build the R-text FAISS index over the corpus passages")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--out", default=str(INDEX_DIR))
    p.set_defaults(handler=cmd_index)

    p = sub.add_parser("agent-base", help="LoRA-tune the base model into a ReAct agent (agent_base.*)")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--no-track", action="store_true", help="do not log an MLflow run")
    p.set_defaults(handler=cmd_agent_base)

    p = sub.add_parser("cell", help="run one cell (substrate x recipe x method x seed) and score it")
    p.add_argument("--substrate", required=True, help="P, C, R-text or R-struct")
    p.add_argument("--method", default="none", help="unlearning method (default: none)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument(
        "--recipe", default=None,
        help="none (default off P), lora or merged (P; default: every one in p_recipes), lora-d (control)",
    )
    p.add_argument(
        "--skip-unreachable", action="store_true",
        help="a method that cannot act on the substrate writes a skip marker instead of failing "
        "(the DVC matrix crosses every substrate with every method)",
    )
    p.add_argument("--adapter", default=None, help="LoRA adapter folder for P or the LoRA-D control")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--index", default=str(INDEX_DIR))
    p.add_argument("--out-root", default="artifacts/cells")
    p.add_argument("--no-track", action="store_true", help="do not log an MLflow run")
    p.set_defaults(handler=cmd_cell)

    p = sub.add_parser("sync", help="log stage outputs that have no MLflow run yet")
    p.add_argument("roots", nargs="*", default=[str(r) for r in OUTPUT_ROOTS])
    p.set_defaults(handler=cmd_sync)

    p = sub.add_parser("preset", help="replace params.yaml by a named preset (cpu, paper)")
    p.add_argument("name")
    p.set_defaults(handler=cmd_preset)

    p = sub.add_parser("params", help="validate params.yaml (--show prints it with defaults)")
    p.add_argument("--show", action="store_true")
    p.set_defaults(handler=cmd_check_params)

