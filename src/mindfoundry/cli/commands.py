"""Names of commands that both the entry point and the parser need (a module of its own, so neither imports the
other at file level)."""

from __future__ import annotations

#: Commands whose process trains: SIGINT is routed before anything else is imported (cli/entry.py).
TRAINING_COMMANDS = ("train", "run")
