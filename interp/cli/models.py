"""``interp models``: list the bundled models that load offline."""

from __future__ import annotations

import argparse

HELP = "list the models bundled with interp (they load offline by short name)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from interp.cli.sources import BUNDLED_DIR, bundled_models  # interp.loading's, torch-free

    names = bundled_models()
    for name in names:
        print(f"{name}\t{BUNDLED_DIR / name}")
    if not names:
        print("no bundled models are installed")
    return 0
