"""Substrate P subcommands: `kbench inject` (the DVC stage) and `kbench calibrate` (Optuna)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from kbench.commands import CORPUS_DIR, INDEX_DIR

log = logging.getLogger(__name__)


def cmd_inject(args: argparse.Namespace) -> int:
    """Train LoRA-T+D, merge it, train LoRA-D and the retain-only gold (injection.*)."""
    from kbench.agent_base import agent_model_config
    from kbench.cli import read_params
    from kbench.corpus import load_corpus
    from kbench.injection import run_inject_stage

    params = read_params(args)
    results = run_inject_stage(
        params, load_corpus(args.corpus), Path(agent_model_config(params).path), track=not args.no_track,
    )
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Search injection epochs, learning rate and rank for a target memorization (injection.calibration)."""
    from kbench.agent_base import agent_model_config
    from kbench.calibration import CalibrationInputs, calibrate, write_calibrated
    from kbench.cli import read_params
    from kbench.corpus import load_corpus

    params = read_params(args)
    inputs = CalibrationInputs(params, load_corpus(args.corpus), agent_model_config(params), Path(args.index))
    result = calibrate(inputs)
    print(json.dumps(result, indent=2, sort_keys=True))
    if args.write:
        write_calibrated(Path(args.params), result["values"])
        print(f"{args.params}: injection {result['values']} (run `dvc repro` to retrain the adapters)")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inject", help="train the P adapters: LoRA-T+D, merged, LoRA-D, gold (injection.*)")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--no-track", action="store_true", help="do not log MLflow runs")
    p.set_defaults(handler=cmd_inject)

    p = sub.add_parser("calibrate", help="Optuna search of injection strength (injection.calibration.*)")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--index", default=str(INDEX_DIR))
    p.add_argument(
        "--write", action="store_true", help="write the best values into the params file's injection section"
    )
    p.set_defaults(handler=cmd_calibrate)
