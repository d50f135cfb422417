"""The comparisons experiments/parity.py runs: each runs interp's side with this Python (the
project's environment) and the peer's side with the peer's Python, and returns one
:class:`Record` per case and metric.

The peers' sides are the scripts that already hold them (experiments/*_vs_*.py,
benchmarks/saelens_side.py, benchmarks/formats_side.py); each comparison here says which.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.parity_envs import plain_env

__all__ = ["CHECKS", "PEER_RTOL", "Record", "StepFailed"]

ROOT = Path(__file__).resolve().parent.parent
EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
# Both sides compute the same float32 formula in another order (other matmul blocking, sums
# over up to 4,096 terms, two or three layers): each rounding is at most eps * |value| and they
# add up about as the square root of the terms summed (sqrt(4096) eps = 64 eps), so a difference
# beyond 84 eps of the largest value compared is more than rounding.
PEER_RTOL = 1e-5
BITWISE = "0 (bit-identical: the same operations in the same order)"
RELATIVE = f"{PEER_RTOL:g} x largest |value| (float32 rounding)"
BOTH = "features and outputs max |diff|"
D_IN, D_SAE, ROWS = 768, 4096, 128  # the SAE cases (benchmarks/bench_saes.py's widths)


@dataclass
class Record:
    """One case's measurement: ``passed`` is None when it could not be run."""

    peer: str
    comparison: str
    metric: str
    case: str
    measured: str
    tolerance: str
    passed: bool | None
    ratio: float = 0.0  # measured / allowed, to pick the worst case of a metric


class StepFailed(RuntimeError):
    """A side's process exited non-zero; the message names it and its log."""


def _run(cmd: list, log: Path, *, peer: bool) -> None:
    env = plain_env() if peer else {**plain_env(), "PYTHONPATH": str(ROOT)}
    cmd = [str(c) for c in cmd]
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if done.returncode:
        lines = log.read_text(errors="replace").strip().splitlines()
        raise StepFailed(f"{Path(cmd[1]).name} exited {done.returncode}: {lines[-1]} ({log})")


def _close(peer, comp, metric, case, diff: float, largest: float) -> Record:
    allowed = PEER_RTOL * largest
    ratio = diff / allowed if allowed else float(diff > 0)
    measured = f"{diff:.2g} (largest |value| {largest:.3g})"
    return Record(peer, comp, metric, case, measured, RELATIVE, diff <= allowed, ratio)


def _bitwise(peer, comp, metric, case, diff: float) -> Record:
    return Record(peer, comp, metric, case, f"{diff:.2g}", BITWISE, diff == 0, diff)


def _same(peer, comp, metric, case, same: bool, detail: str = "") -> Record:
    text = ("equal" if same else "differ") + (f" ({detail})" if detail else "")
    return Record(peer, comp, metric, case, text, "equal", bool(same), 0.0 if same else 1.0)


def graph_vs_circuit_tracer(python: str, work: Path, log: Path) -> list[Record]:
    """experiments/graph_vs_circuit_tracer.py: 2-layer GPT-2, 64-wide transcoders, 12 tokens."""
    script, peer, comp = ROOT / "experiments/graph_vs_circuit_tracer.py", "circuit-tracer", "graph"
    records = []
    for kind in ("per-layer", "cross-layer"):
        for hook in ("mlp.hook_in", "ln2.hook_normalized"):
            case = f"{kind}, {hook}"
            where = work / f"graph-{kind}-{hook}"
            opts = ["--kind", kind, "--input-hook", hook]
            _run([sys.executable, script, "write", where, *opts], log, peer=False)
            _run([python, script, "compare", where], log, peer=True)
            m = json.loads((where / "metrics.json").read_text())
            records += [
                _same(peer, comp, "active features and logit tokens", case,
                      m["same_features"] and m["same_logits"] and m["nodes"] == m["interp_nodes"],
                      f"{m['features']} features, {m['nodes']} nodes"),
                _close(peer, comp, "adjacency max |diff|", case, m["entry_diff"],
                       m["largest_entry"]),
                _close(peer, comp, "replacement and completeness scores max |diff|", case,
                       m["score_diff"], 1.0),
                _same(peer, comp, "pruned nodes and edges", case,
                      m["same_kept_nodes"] and m["same_kept_edges"],
                      f"{m['kept_edges']} edges kept"),
            ]  # fmt: skip
    return records


def interventions_vs_circuit_tracer(python: str, work: Path, log: Path) -> list[Record]:
    """experiments/interventions_vs_circuit_tracer.py: 3-layer GPT-2, 6 cases per kind."""
    script = ROOT / "experiments/interventions_vs_circuit_tracer.py"
    peer, comp = "circuit-tracer", "feature_intervention"
    where = work / "interventions"
    _run([sys.executable, script, "write", where], log, peer=False)
    _run([python, script, "compare", where], log, peer=True)
    records = []
    for m in json.loads((where / "metrics.json").read_text()):
        layers = m["constrained"]
        layers = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
        case = f"{m['kind']}, {layers} constrained, freeze_attention {m['freeze_attention']}"
        records += [
            _close(peer, comp, "logits max |diff|", case, m["logit_diff"], m["largest_logit"]),
            _close(peer, comp, "activations max |diff|", case, m["act_diff"], m["largest_act"]),
            # the edits must move the logits well past the tolerance, or nothing was compared
            Record(peer, comp, "the edits move the logits by", case, f"{m['moved']:.2g}",
                   "> 10 x the logits' tolerance", m["moved"] > 10 * PEER_RTOL * m["largest_logit"],
                   10 * PEER_RTOL * m["largest_logit"] / m["moved"]),
        ]  # fmt: skip
    return records


def _max_diff(ours: tuple, theirs: tuple) -> float:
    return max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))


def _sae_outputs(sae, x):
    with torch.no_grad():
        f = sae.encode(x)
        return f, sae(x) if sae.W_skip is not None else sae.decode(f, x)


def saes_vs_saelens(python: str, work: Path, log: Path) -> list[Record]:
    """benchmarks/saelens_side.py: bench_saes.py's 17 cases built, saved and loaded by SAELens,
    then read by ``load_sae``; and interp's ``SAE.save`` of each read back by SAELens."""
    from safetensors.torch import load_file

    from benchmarks.bench_saes import cases
    from interp import load_sae

    side, peer = ROOT / "benchmarks/saelens_side.py", "saelens"
    todo = cases(D_IN, D_SAE, ROWS, repeat=1)
    (work / "cases.json").write_text(json.dumps(todo))
    _run([python, side, work / "cases.json", work, "build"], log, peer=True)
    records, ours = [], {}
    for case in todo:
        folder = work / case["name"]
        ref = load_file(str(folder / "saelens_outputs.safetensors"))
        sae = load_sae(folder)
        f, out = ours[case["name"]] = _sae_outputs(sae, ref["x"])
        diff = _max_diff((f, out), (ref["features"], ref["output"]))
        comp = "load_sae of a folder SAELens saved"
        records.append(_bitwise(peer, comp, BOTH, case["label"], diff))
        sae.save(folder / "interp_saved")
    _run([python, side, work / "cases.json", work, "readback"], log, peer=True)
    comp = "SAELens's load_from_disk of SAE.save"
    for case in todo:
        saved = work / case["name"] / "interp_saved"
        error = saved / "saelens_readback_error.txt"
        if error.exists():
            text = "SAELens refused it: " + " ".join(error.read_text().split())[:160]
            records.append(Record(peer, comp, BOTH, case["label"], text, BITWISE, False, 1.0))
            continue
        back = load_file(str(saved / "saelens_readback.safetensors"))
        f, out = ours[case["name"]]
        diff = _max_diff((f, out), (back["features"], back["output"]))
        records.append(_bitwise(peer, comp, BOTH, case["label"], diff))
    return records


def transcoders_vs_saelens(python: str, work: Path, log: Path) -> list[Record]:
    """experiments/transcoders_vs_saelens.py: SAELens's 4 transcoder architectures, 3 layers."""
    script, peer = ROOT / "experiments/transcoders_vs_saelens.py", "saelens"
    _run([python, script, "saelens", work], log, peer=True)
    _run([sys.executable, script, "interp", work], log, peer=False)
    records = []
    for m in json.loads((work / "metrics.json").read_text()):
        diff = max(m["feature_diff"], m["output_diff"])
        comp = "load_transcoders of folders SAELens saved"
        records.append(_bitwise(peer, comp, BOTH, m["architecture"], diff))
    return records


def normalized_vs_saelens(python: str, work: Path, log: Path) -> list[Record]:
    """experiments/transcoders_vs_saelens_normalized.py: ``ln2.hook_normalized`` against
    TransformerLens 3 on 5 zoo models; SAELens transcoders spliced on GPT-2."""
    script, peer = ROOT / "experiments/transcoders_vs_saelens_normalized.py", "saelens"
    _run([sys.executable, script, "write", work], log, peer=False)
    _run([python, script, "saelens", work], log, peer=True)
    _run([sys.executable, script, "compare", work], log, peer=False)
    m = json.loads((work / "metrics.json").read_text())
    comp = "ln2.hook_normalized vs TransformerLens 3"
    records = [_close(peer, comp, "value max |diff|", h["model"], h["diff"], h["largest"])
               for h in m["hooks"]]  # fmt: skip
    comp = "transcoders on ln2.hook_normalized, spliced"
    for t in m["transcoders"]:
        arch = t["architecture"]
        records += [
            _close(peer, comp, "features max |diff|", arch, t["feature_diff"],
                   t["largest_feature"]),
            _close(peer, comp, "reconstructions max |diff|", arch, t["recon_diff"],
                   t["largest_recon"]),
            _close(peer, comp, "log-probabilities max |diff|", arch, t["logprob_diff"],
                   t["largest_logprob"]),
        ]  # fmt: skip
    return records


def _formats(library: str, python: str, work: Path, log: Path) -> list[Record]:
    from safetensors.torch import load_file

    from interp import load_sae

    side = ROOT / "benchmarks/formats_side.py"
    _run([python, side, work, D_IN, D_SAE, ROWS, library], log, peer=True)
    records = []
    for folder in sorted((work / library).iterdir()):
        ref = load_file(str(folder / "ref_outputs.safetensors"))
        with torch.no_grad():
            sae = load_sae(folder)
            f, out = sae.encode(ref["x"]), sae(ref["x"])
        comp = "load_sae of a folder the library saved"
        records += [
            _close(library, comp, "features max |diff|", folder.name,
                   (f - ref["features"]).abs().max().item(), ref["features"].abs().max().item()),
            _close(library, comp, "outputs max |diff|", folder.name,
                   (out - ref["output"]).abs().max().item(), ref["output"].abs().max().item()),
        ]  # fmt: skip
    return records


def sparsify_formats(python: str, work: Path, log: Path) -> list[Record]:
    """benchmarks/formats_side.py: ``SparseCoder`` saved and reloaded by sparsify (3 cases)."""
    return _formats("sparsify", python, work, log)


def dictionary_learning_formats(python: str, work: Path, log: Path) -> list[Record]:
    """benchmarks/formats_side.py: the 7 dictionary classes, reloaded by ``load_dictionary``."""
    return _formats("dictionary_learning", python, work, log)


# peer -> its comparisons, in the order they run: (name in the table, function)
CHECKS = {
    "circuit-tracer": [("graph", graph_vs_circuit_tracer),
                       ("feature_intervention", interventions_vs_circuit_tracer)],
    "saelens": [("SAEs", saes_vs_saelens), ("load_transcoders", transcoders_vs_saelens),
                ("ln2.hook_normalized", normalized_vs_saelens)],
    "sparsify": [("load_sae", sparsify_formats)],
    "dictionary_learning": [("load_sae", dictionary_learning_formats)],
}  # fmt: skip
