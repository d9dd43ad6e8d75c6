"""DVC stage `corpus`: build or import the corpus into artifacts/corpus."""

import sys

from kbench.cli import main

sys.exit(main(["corpus", *sys.argv[1:]]))
