"""Project subcommands: `setup` (the default model folder), `preset` (swap params.yaml),
`params` (validate and show the design), `calibrate` (Optuna search of injection strength),
`adapters` (the LoRA adapters a server serves by name), `tracking-server` (an MLflow server)
and `sync` (MLflow)."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import threading
from pathlib import Path
from typing import Any

import yaml

from kbench import tracking
from kbench.backends.packaged import DEFAULT_PACKAGED, PACKAGED_MODELS, ensure_packaged_model
from kbench.config import read_yaml
from kbench.corpus import load_corpus
from kbench.design import check_model_present, load_design
from kbench.parametric import agent_model_config
from kbench.parametric.calibration import CalibrationInputs, calibrate, write_calibrated
from kbench.serving.adapters import served_name, vllm_flags
from kbench.stages.cell import served_adapters
from kbench.corpus import CORPUS_DIR
from kbench.stages.index import INDEX_DIR

#: The title of these commands in `kbench --help`.
GROUP = "project tools"
PRESETS_DIR = Path("presets")
#: Folders whose stage outputs carry a run manifest that `kbench sync` can re-log.
OUTPUT_ROOTS = (Path("artifacts"), Path("reports"))


def cmd_setup(args: argparse.Namespace) -> int:
    """Prepare inputs that are not pip packages: packaged model folders and data/."""
    if args.model_dir and len(args.model or ()) > 1:
        raise ValueError("--model-dir names one folder: give one --model with it")
    for name in args.model or [DEFAULT_PACKAGED]:
        path = ensure_packaged_model(name, Path(args.model_dir) if args.model_dir else None)
        print(f"model {name} ready at {path}")
    Path("data").mkdir(exist_ok=True)
    return 0


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


def cmd_adapters(args: argparse.Namespace) -> int:
    """The LoRA adapters the design's cells deploy, by the names a server serves them under."""
    params = load_design(args.params)
    folders = served_adapters(params)
    if not folders:
        raise ValueError(f"{args.params}: no cell of the design deploys an adapter (p_recipes without lora "
                         "and no adapter-free substrate for the LoRA-D control)")
    if args.vllm_flags:
        print(shlex.join(vllm_flags(list(folders))))
        return 0
    for folder, cells in folders.items():
        print(f"{served_name(folder)}\t{', '.join(cells)}")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Log every stage output that has no MLflow run yet (a fresh clone, a DVC cache hit)."""
    params = load_design(args.params)
    run_ids = tracking.sync_outputs(params, [Path(p) for p in args.roots])
    print(f"{len(run_ids)} stage outputs are in MLflow ({tracking.tracking_uri(params)})")
    return 0


def cmd_tracking_server(args: argparse.Namespace) -> int:
    """Serve the project's MLflow tracking server on 127.0.0.1 until Ctrl-C."""
    root = tracking.repo_root()
    with tracking.tracking_server(root, args.port) as uri:
        print(f"MLflow tracking server at {uri} (runs: {tracking.SERVER_STORE}, artifacts: {tracking.SERVER_ARTIFACTS}/)")
        print(f"Log to it from another shell: export MLFLOW_TRACKING_URI={uri}; Ctrl-C stops it", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopped the MLflow tracking server")
    return 0


def preset_paths(folder: Path = PRESETS_DIR) -> dict[str, Path]:
    """The presets in `folder` by name (file stem), sorted; none when the folder is absent."""
    return {path.stem: path for path in sorted(folder.glob("*.yaml"), key=lambda path: path.stem)}


#: What `_yaml_data` returns for a file that does not parse: equal to no preset's data.
_UNPARSABLE = object()


def _yaml_data(path: Path) -> Any:
    """The parsed YAML of `path`, or `_UNPARSABLE`."""
    try:
        return read_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return _UNPARSABLE


def cmd_preset(args: argparse.Namespace) -> int:
    """Copy a preset over params.yaml after validating it. A params file whose YAML data equals
    no preset's (the user edited it) is kept unless `--force`: comments and layout do not count."""
    presets = preset_paths()
    source = presets.get(args.name)
    if source is None:
        raise ValueError(f"unknown preset {args.name!r}; known presets: {sorted(presets)}")
    load_design(source)
    target = Path(args.params)
    if target.exists() and not args.force:
        current = _yaml_data(target)
        if current is _UNPARSABLE or all(current != _yaml_data(path) for path in presets.values()):
            raise ValueError(f"{target} differs from every preset in {PRESETS_DIR}/ (edited?); keep a copy, or "
                             f"rerun with --force to replace it by preset {args.name!r}")
    shutil.copyfile(source, target)
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
    p = sub.add_parser("setup", help="convert packaged models into folders under models/ (once)")
    p.add_argument("--model", action="append", choices=sorted(PACKAGED_MODELS),
                   help=f"a packaged model (repeatable; default: {DEFAULT_PACKAGED})")
    p.add_argument("--model-dir", default=None, help="the folder to write (default: the model's own under models/)")
    p.set_defaults(handler=cmd_setup)

    found = ", ".join(preset_paths()) or f"none found in {PRESETS_DIR}/"
    p = sub.add_parser("preset", help=f"replace params.yaml by a preset ({found})")
    p.add_argument("name", help=f"a preset in {PRESETS_DIR}/: {found}")
    p.add_argument("--force", action="store_true",
                   help="replace the params file even when it differs from every preset (an edited one)")
    p.set_defaults(handler=cmd_preset)

    p = sub.add_parser("params", help="validate params.yaml (--show prints it with defaults)")
    p.add_argument("--show", action="store_true")
    p.set_defaults(handler=cmd_check_params)

    p = sub.add_parser("calibrate", help="Optuna search of injection strength (injection.calibration.*)")
    p.add_argument("--corpus", default=str(CORPUS_DIR))
    p.add_argument("--index", default=str(INDEX_DIR))
    p.add_argument(
        "--write", action="store_true", help="write the best values into the params file's injection.lora section"
    )
    p.set_defaults(handler=cmd_calibrate)

    p = sub.add_parser("adapters", help="the LoRA adapters the design's cells deploy, by the names a server "
                       "serves them under (--vllm-flags: `vllm serve`'s flags that serve them)")
    p.add_argument("--vllm-flags", action="store_true",
                   help="print `--enable-lora --max-lora-rank R --lora-modules NAME=PATH ...` for `vllm serve`")
    p.set_defaults(handler=cmd_adapters)

    p = sub.add_parser("tracking-server", help="run an MLflow tracking server on 127.0.0.1 (its own SQL store "
                       "and artifact root under the project) until Ctrl-C")
    p.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default: %(default)s)")
    p.set_defaults(handler=cmd_tracking_server)

    p = sub.add_parser("sync", help="log stage outputs that have no MLflow run yet")
    p.add_argument("roots", nargs="*", default=[str(r) for r in OUTPUT_ROOTS])
    p.set_defaults(handler=cmd_sync)
