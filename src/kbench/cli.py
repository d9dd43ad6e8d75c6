"""`kbench`: one subcommand per pipeline stage plus the scoring and tracking tools.

Every command reads params.yaml first (`--params` to use another file), so a malformed
params file fails before any work starts, with a message naming the key.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from kbench.config import Params, ParamsError, load_params
from kbench.corpus import CorpusError

log = logging.getLogger("kbench")

#: Modules that contribute subcommands through `add_subcommands(subparsers)`; a new stage
#: family registers here and nowhere else.
COMMAND_MODULES = (
    "kbench.commands",
    "kbench.observer_cli",
    "kbench.comparison_cli",
    "kbench.injection_cli",
)

#: Errors a user can fix; they are printed as one line, never as a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ParamsError, CorpusError, FileNotFoundError, ValueError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbench",
        description=(
            "K-Bench: inject a synthetic secret into one memory substrate, apply an unlearning "
            "method, run a ReAct agent and read all six leak channels. The DVC pipeline "
            "(`dvc repro`) calls these subcommands in order; each can also be run by hand."
        ),
    )
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_subcommands(sub)
    return parser


def read_params(args: argparse.Namespace) -> Params:
    return load_params(Path(args.params))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # faiss logs each CPU-feature build it fails to load at INFO; only its warnings matter here.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        return int(args.handler(args) or 0)
    except USER_ERRORS as exc:
        print(f"kbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kbench {args.command}: interrupted; finished work is kept, rerun to resume", file=sys.stderr)
        return 130


def run_stage(command: str) -> None:
    """Entry point of a thin DVC stage script in pipelines/: `kbench <command> <argv...>`."""
    sys.exit(main([command, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
