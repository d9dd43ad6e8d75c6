"""The `kbench` console script: every command group on one parser."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kbench.cli import app, audit, catalog, memory, observer, project, replay, stages

#: Modules that contribute subcommands through `add_subcommands(subparsers)`.
COMMAND_MODULES = (stages, observer, project, catalog, memory, replay, audit)


def build_parser():
    return app.build_parser(COMMAND_MODULES)


def main(argv: Sequence[str] | None = None) -> int:
    return app.run(argv, COMMAND_MODULES)


if __name__ == "__main__":
    sys.exit(main())
