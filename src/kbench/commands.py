"""Pipeline-stage subcommands: setup, corpus, sync, preset."""

from __future__ import annotations

import argparse
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

    p = sub.add_parser("sync", help="log stage outputs that have no MLflow run yet")
    p.add_argument("roots", nargs="*", default=[str(r) for r in OUTPUT_ROOTS])
    p.set_defaults(handler=cmd_sync)

    p = sub.add_parser("preset", help="replace params.yaml by a named preset (cpu, paper)")
    p.add_argument("name")
    p.set_defaults(handler=cmd_preset)

    p = sub.add_parser("params", help="validate params.yaml (--show prints it with defaults)")
    p.add_argument("--show", action="store_true")
    p.set_defaults(handler=cmd_check_params)

