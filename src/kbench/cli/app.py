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
import dataclasses
import functools
import importlib.metadata
import logging
import sys
import textwrap
import typing
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, NoneType, UnionType

from kbench.config import DEFAULT_PARAMS
from kbench.design import load_design
from kbench.workers import configure_logging

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


def run(argv: Sequence[str] | None, modules: Sequence[ModuleType]) -> int:
    """Parse `argv` against the commands of `modules`, run the command, return its exit status."""
    args = build_parser(modules).parse_args(argv)
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
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


def add_stage(sub: argparse._SubParsersAction, stage: ModuleType) -> argparse.ArgumentParser:
    """The subcommand of a pipeline stage module (`kbench.stages`): one option per field of its
    `Options` dataclass (`--field-name`; a bool that defaults to True is `--no-field-name`, a
    tuple is a repeatable option), then `stage.main(params, options)` on the loaded design."""
    parser = sub.add_parser(stage.COMMAND, help=stage.HELP)
    hints = typing.get_type_hints(stage.Options)
    for field in dataclasses.fields(stage.Options):
        kind, meta, flag = hints[field.name], field.metadata, "--" + field.name.replace("_", "-")
        text = meta.get("help", "")
        if kind is bool:
            if field.default:
                parser.add_argument("--no-" + flag[2:], dest=field.name, action="store_false", help=text)
            else:
                parser.add_argument(flag, dest=field.name, action="store_true", help=text)
            continue
        if field.default not in (None, ()):
            text += " (default: %(default)s)"
        repeated = typing.get_origin(kind) is tuple
        parser.add_argument(
            flag, dest=field.name, type=_value_type(kind), action="append" if repeated else "store",
            default=None if repeated else field.default, help=text, choices=meta.get("choices"),
            metavar=meta.get("metavar"),
        )
    # SUPPRESS: without the option here, `kbench --params FILE <stage>` keeps its global value.
    parser.add_argument("--params", default=argparse.SUPPRESS,
                        help="params file of the design (default: the global --params, params.yaml)")
    parser.set_defaults(handler=functools.partial(_run_stage_command, stage))
    return parser


def _value_type(kind: object) -> type:
    """The type one command-line value of an option field converts to (str, int, Path)."""
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not NoneType]
    if typing.get_origin(kind) is tuple:
        kind = typing.get_args(kind)[0]
    return kind  # type: ignore[return-value]


def stage_options(stage: ModuleType, args: argparse.Namespace) -> object:
    """The stage's `Options` from parsed arguments (a repeated option's values as a tuple)."""
    values = {}
    for field in dataclasses.fields(stage.Options):
        value = getattr(args, field.name)
        values[field.name] = tuple(value or ()) if isinstance(field.default, tuple) else value
    return stage.Options(**values)


def _run_stage_command(stage: ModuleType, args: argparse.Namespace) -> int:
    return stage.main(load_design(args.params), stage_options(stage, args))


def run_stage(stage: ModuleType) -> None:
    """Entry point of a thin DVC stage script: `kbench <stage.COMMAND> <argv...>`."""
    sys.exit(run([stage.COMMAND, *sys.argv[1:]], [_StageCommands(stage)]))


class _StageCommands:
    """One stage module as a command module of `run` (its `add_subcommands`)."""

    def __init__(self, stage: ModuleType) -> None:
        self.stage = stage

    def add_subcommands(self, sub: argparse._SubParsersAction) -> None:
        add_stage(sub, self.stage)
