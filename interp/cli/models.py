"""``interp models``: list the bundled models, SAEs and transcoder sets that load offline."""

from __future__ import annotations

import argparse

HELP = (
    "list the models, SAEs and transcoder sets bundled with interp (they load offline by "
    "short name), and the SAE formats load_sae reads with published repositories in each"
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
    for path in sorted(BUNDLED_DIR.iterdir()) if BUNDLED_DIR.is_dir() else []:
        if (path / "config.yaml").is_file():  # a transcoder set in circuit-tracer's format
            print(f"{path.name}\t{path}\ttranscoders: {_transcoder_summary(path)}")
    print("\nSAE formats (load_sae takes a folder, or a hub name owner/repo/subfolder):")
    for fmt, files in FORMATS.items():  # format, its files, what interp computes, repositories
        computes, repos = PUBLISHED[fmt]
        print(f"{fmt}\t{' + '.join(files)}\t{computes}\te.g. {', '.join(repos)}")
    return 0


def _transcoder_summary(path) -> str:
    import yaml  # light, unlike torch

    config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    kind = {"transcoder_set": "per-layer", "cross_layer_transcoder": "cross-layer"}
    activation = str(config.get("activation", "relu or jumprelu"))
    if "k" in config:
        activation += f" (k={config['k']})"
    return (
        f"{kind.get(config.get('model_kind'), '?')}, {activation}, reads "
        f"{config.get('feature_input_hook')}, writes {config.get('feature_output_hook')}"
    )
