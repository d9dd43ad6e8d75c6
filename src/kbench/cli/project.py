"""Project subcommands: `calibrate` (Optuna search of injection strength), `sync` (MLflow),
`preset` (swap params.yaml) and `params` (validate and show the design)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

from kbench import tracking
from kbench.corpus import load_corpus
from kbench.design import check_model_present, load_design
from kbench.parametric import agent_model_config
from kbench.parametric.calibration import CalibrationInputs, calibrate, write_calibrated
from kbench.stages.corpus import CORPUS_DIR
from kbench.stages.index import INDEX_DIR

PRESETS_DIR = Path("presets")
#: Folders whose stage outputs carry a run manifest that `kbench sync` can re-log.
OUTPUT_ROOTS = (Path("artifacts"), Path("reports"))


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Search injection epochs, learning rate and rank for a target memorization (injection.calibration)."""
    params = load_design(args.params)
    inputs = CalibrationInputs(params, load_corpus(args.corpus), agent_model_config(params), Path(args.index))
    result = calibrate(inputs)
    print(json.dumps(result, indent=2, sort_keys=True))
    if args.write:
        write_calibrated(Path(args.params), result["values"])
        print(f"{args.params}: injection.lora {result['values']} (run `dvc repro` to retrain the adapters)")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Log every stage output that has no MLflow run yet (a fresh clone, a DVC cache hit)."""
    params = load_design(args.params)
    run_ids = tracking.sync_outputs(params, [Path(p) for p in args.roots])
    print(f"{len(run_ids)} stage outputs are in MLflow ({tracking.tracking_uri(params)})")
    return 0


def cmd_preset(args: argparse.Namespace) -> int:
    """Copy a preset over params.yaml after validating it."""
    source = PRESETS_DIR / f"{args.name}.yaml"
    if not source.exists():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise ValueError(f"unknown preset {args.name!r}; known presets: {known}")
    load_design(source)
    shutil.copyfile(source, args.params)
    print(f"{args.params} now holds preset {args.name!r}; run `dvc repro` (or `dvc exp run`)")
    return 0


def cmd_check_params(args: argparse.Namespace) -> int:
    params = load_design(args.params)
    check_model_present(params, source=args.params)
    if args.show:
        print(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    else:
        print(f"{args.params}: valid")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="Optuna search of injection strength (injection.calibration.*)")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--index", default=str(INDEX_DIR))
    p.add_argument(
        "--write", action="store_true", help="write the best values into the params file's injection.lora section"
    )
    p.set_defaults(handler=cmd_calibrate)

    p = sub.add_parser("sync", help="log stage outputs that have no MLflow run yet")
    p.add_argument("roots", nargs="*", default=[str(r) for r in OUTPUT_ROOTS])
    p.set_defaults(handler=cmd_sync)

    p = sub.add_parser("preset", help="replace params.yaml by a named preset (cpu, paper)")
    p.add_argument("name")
    p.set_defaults(handler=cmd_preset)

    p = sub.add_parser("params", help="validate params.yaml (--show prints it with defaults)")
    p.add_argument("--show", action="store_true")
    p.set_defaults(handler=cmd_check_params)
