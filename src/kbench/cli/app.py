"""The one `kbench` command loop: parse, run the handler, turn a user error into one line.

A user-caused failure (bad params, a corrupt corpus, trace or adapter, a missing file, an
unreachable endpoint) is printed as `kbench <command>: error: <what>` and exits 2; any other
exception (a bug) as one `internal error` line and exit 1. `--debug` shows the traceback
instead; `-v` turns on debug logging (docs/troubleshooting.md). `kbench.cli.main` runs every command through here; each thin script in
`pipelines/` runs its one stage's command through `run_stage`, so a DVC stage imports only
the code of that stage.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from kbench.config import DEFAULT_PARAMS

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_INTERRUPTED = 130
#: Errors a user can fix (every kbench error type is a ValueError; OSError: an unreadable
#: file); printed as one line, never as a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError)
DESCRIPTION = (
    "K-Bench: inject a synthetic secret into one memory substrate, apply an unlearning\n"
    "method, run a ReAct agent and read all six leak channels."
)
#: Width of the command list in `kbench --help` (fixed, so the help reads the same everywhere).
HELP_WIDTH = 79
EPILOG = "Run `kbench COMMAND --help` for a command's options (docs/cli.md)."
#: The group title of a module's commands in `kbench --help` when the module names none.
DEFAULT_GROUP = "commands"


def package_version() -> str:
    """The installed kbench distribution's version (package metadata), "unknown" if not installed."""
    try:
        return importlib.metadata.version("kbench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser(modules: Sequence[ModuleType]) -> argparse.ArgumentParser:
    """The `kbench` parser with the commands of `modules` (each has `add_subcommands(sub)` and
    may name its group in the help with `GROUP`; modules with the same `GROUP` share it)."""
    parser = argparse.ArgumentParser(
        prog="kbench", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", default=DEFAULT_PARAMS, help="params file (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    parser.add_argument("--version", action="version", version=f"kbench {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="one of the commands above")
    groups: dict[str, list[str]] = {}
    for module in modules:
        before = set(sub.choices)
        module.add_subcommands(sub)
        added = [name for name in sub.choices if name not in before]
        groups.setdefault(getattr(module, "GROUP", DEFAULT_GROUP), []).extend(added)
    parser.description = f"{DESCRIPTION}\n\n{_command_groups(sub, groups)}"
    # The commands are listed by group in the description, not again as one flat list.
    sub._choices_actions.clear()
    return parser


def _command_groups(sub: argparse._SubParsersAction, groups: dict[str, list[str]]) -> str:
    """The help's command list: one block per group, each command with its one-line help."""
    helps = {action.dest: action.help or "" for action in sub._choices_actions}
    width = max((len(name) for names in groups.values() for name in names), default=0) + 4
    blocks = []
    for title, names in groups.items():
        lines = [f"{title}:"]
        for name in names:
            indent = f"  {name:<{width - 2}}"
            text = helps.get(name, "")
            lines.append(textwrap.fill(text, HELP_WIDTH, initial_indent=indent, subsequent_indent=" " * width)
                         if text else indent.rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def add_command(
    sub: argparse._SubParsersAction, name: str, handler: Callable[[argparse.Namespace], int], help: str, *,
    corpus: Path | None = None, track: bool = True,
) -> argparse.ArgumentParser:
    """A subcommand running `handler`; `--corpus` (defaulting to `corpus`) and `--no-track`
    (do not log an MLflow run) when asked for."""
    parser = sub.add_parser(name, help=help)
    if corpus is not None:
        parser.add_argument("--corpus", default=str(corpus), help="corpus folder (default: %(default)s)")
    if track:
        parser.add_argument("--no-track", action="store_true", help="do not log an MLflow run")
    parser.set_defaults(handler=handler)
    return parser


def run(argv: Sequence[str] | None, modules: Sequence[ModuleType]) -> int:
    """Parse `argv` against the commands of `modules`, run the command, return its exit status."""
    args = build_parser(modules).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # faiss logs each CPU-feature build it fails to load at INFO; only its warnings matter here.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    # The HTTP client under the openai backend logs one INFO line per request: noise in a cell log.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return int(args.handler(args) or 0)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"kbench {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"kbench {args.command}: interrupted; finished work is kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        print(f"kbench {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug: rerun "
              "with --debug for the traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a library's multi-line message is joined)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def run_stage(stage: ModuleType) -> None:
    """Entry point of a thin DVC stage script: `kbench <stage.COMMAND> <argv...>`."""
    sys.exit(run([stage.COMMAND, *sys.argv[1:]], [stage]))
