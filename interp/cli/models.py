"""``interp models``: list the bundled models and SAEs that load offline."""

from __future__ import annotations

import argparse

HELP = (
    "list the models and SAEs bundled with interp (they load offline by short name), and the "
    "SAE formats load_sae reads with published repositories in each"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from interp.cli.sources import (  # interp.models.loading's, torch-free
        BUNDLED_DIR,
        bundled_models,
    )
    from interp.saes.bundled import bundled_sae_info, bundled_saes  # torch-free too
    from interp.saes.published import FORMATS, PUBLISHED  # torch-free too

    names = bundled_models()
    for name in names:
        print(f"{name}\t{BUNDLED_DIR / name}")
    if not names:
        print("no bundled models are installed")
    for name in bundled_saes():  # the same two columns, then what the SAE reads
        info = bundled_sae_info(name)
        print(
            f"{name}\t{info['path']}\tSAE of {info['model'] or 'an unnamed model'} at "
            f"{info['hook']}: {info['architecture']}, {info['d_in']} -> {info['d_sae']} features"
        )
    print("\nSAE formats (load_sae takes a folder, or a hub name owner/repo/subfolder):")
    for fmt, files in FORMATS.items():  # format, its files, what interp computes, repositories
        computes, repos = PUBLISHED[fmt]
        print(f"{fmt}\t{' + '.join(files)}\t{computes}\te.g. {', '.join(repos)}")
    return 0
