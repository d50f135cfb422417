"""Check interp's main analyses on an accelerator against the same analyses on the CPU.

Two models are loaded once on the CPU and once on ``--device``: the bundled
``tiny-induction`` (GPT-2 style: LayerNorm, learned positions) and a tiny random Llama written
here with ``save_pretrained`` (tests/zoo.py: RMSNorm, rotary, grouped-query attention). On
each model, each analysis runs on both devices through the public API, as the docs show it:
logits and activations (``run_cached``), the induction scan, ``logit_attribution`` (whose
parts must add up to the logit difference on the device too), ``patch_activations`` over an
induction task, ``edge_scores`` with "exact", "eap" and "eap-ig", ``evaluate_circuit``, and,
on the bundled model, the bundled SAE spliced in and an attribution graph through the bundled
transcoders (every feature, and capped at ``max_feature_nodes`` = 24). The bundled model is also
loaded in bfloat16 and float16 (``--half``) on ``--device``, and its attribution graph, uncapped
and capped, checked against the float32 graph of the same rounded weights on the CPU within a
bound from the dtype (:func:`compare_half`); the warnings interp logs (a fallback says which
path ran) go into the row's detail. The inputs are built on each device by interp itself; the
results are read back to the CPU only to compare them, never fed back in, so a ``.cpu()`` or a
device mismatch inside interp shows up as a crash (status ``crashed``) instead of being hidden.

Tolerance, float32 throughout: a CPU and a GPU add the same products in other orders, so each
matrix product of length K differs by about sqrt(K) * 1.2e-7 relative to its size; with K at
most a few hundred here and a dozen products in a row, that is about 2e-5 of the logits'
size. Every quantity here is a logit, a difference of logits, a gradient times a difference
of activations, or a probability, so the tolerance is ``REL_TOL * scale`` with REL_TOL = 1e-4
CAP = 24  # max_feature_nodes of the capped graphs (the bundled transcoders give ~100 features)
# a half-precision graph against the float32 graph of the same rounded weights: each rounding
# moves a vector by at most u = eps / 2 of itself, about HALF_ROUNDINGS times a layer (forward
# and backward) and once more at each end, so entries are within HALF_ROUNDINGS * (n_layers +
# 1) * u of the largest (tests/graphs/test_graph_half_precision.py, where the CPU measures
# 0.0065-0.033 of it in bfloat16 on 2-layer models, against 0.117)
HALF_ROUNDINGS = 10
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
(five times that estimate) and scale = max(1, the largest |value| on the CPU, the largest
|logit| of the model). TF32 is left as torch sets it (off for matrix products); the script
prints the setting, since a library that turned it on would break this tolerance.

Run from the repository root:

    HF_HUB_OFFLINE=1 python experiments/cuda_check.py --device cuda --out results/

It writes ``cuda_check.csv`` (analysis, status, max_abs_diff, tolerance, cpu_s, device_s,
detail), prints one line per analysis and a summary, and exits 1 unless every row agrees.
``--device cpu`` checks the script itself (the CPU against itself; the half-precision rows
then compare the CPU's half model with its float32 twin, as on a GPU); ``--only-half`` runs the
half-precision rows alone.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from transformers.utils import logging as transformers_logging

import interp
from interp.discovery import EdgeGraph, edge_scores, evaluate_circuit
from interp.foundation.fallbacks import reset_fallback_warnings
from interp.tasks import induction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.zoo, from the repo root
from tests.zoo import make_zoo_checkpoint  # noqa: E402

REL_TOL = 1e-4
CAP = 24  # max_feature_nodes of the capped graphs (the bundled transcoders give ~100 features)
# a half-precision graph against the float32 graph of the same rounded weights: each rounding
# moves a vector by at most u = eps / 2 of itself, about HALF_ROUNDINGS times a layer (forward
# and backward) and once more at each end, so entries are within HALF_ROUNDINGS * (n_layers +
# 1) * u of the largest (tests/graphs/test_graph_half_precision.py, where the CPU measures
# 0.0065-0.033 of it in bfloat16 on 2-layer models, against 0.117)
HALF_ROUNDINGS = 10
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
PROMPT = "import os\nimport sys\nimport os\nimport"
COLUMNS = ["analysis", "status", "max_abs_diff", "tolerance", "cpu_s", "device_s", "detail"]


def to_numbers(result) -> dict[str, torch.Tensor]:
    """Named float64 CPU tensors of a result (tensor, number, DataFrame or dict of them)."""
    if isinstance(result, dict):
        out = {}
        for key, value in result.items():
            for sub, tensor in to_numbers(value).items():
                out[f"{key}.{sub}" if sub else str(key)] = tensor
        return out
    if isinstance(result, pd.DataFrame):
        floats = result.select_dtypes("floating")
        out = {c: torch.tensor(floats[c].to_numpy(dtype="float64")) for c in floats.columns}
        for c in result.columns.difference(floats.columns):  # labels, ids: exactly equal
            out[c] = result[c].astype(str).tolist()
        return out
    if isinstance(result, torch.Tensor) and result.is_floating_point():
        return {"": result.detach().to("cpu", torch.float64)}
    if isinstance(result, torch.Tensor):
        return {"": [str(x) for x in result.tolist()]}
    if isinstance(result, float):
        return {"": torch.tensor(result, dtype=torch.float64)}
    return {"": [str(x) for x in result] if isinstance(result, (list, tuple)) else [str(result)]}


def compare(reference, other, scale: float) -> tuple[str, float, float, str]:
    """(status, max |diff|, tolerance, detail) of two results of the same analysis."""
    ref, got = to_numbers(reference), to_numbers(other)
    if ref.keys() != got.keys():
        return "differs", math.nan, math.nan, f"parts differ: {sorted(ref)} vs {sorted(got)}"
    worst, worst_key, largest = 0.0, "", 0.0
    for key, a in ref.items():
        b = got[key]
        if isinstance(a, list) or isinstance(b, list):
            if a != b:
                return "differs", math.nan, math.nan, f"{key or 'value'}: labels differ"
            continue
        if a.shape != b.shape:
            return "differs", math.nan, math.nan, f"{key}: shape {a.shape} vs {b.shape}"
        finite = torch.isfinite(a)
        same = torch.equal(a[~finite].nan_to_num(0.0), b[~finite].nan_to_num(0.0))
        if not torch.equal(finite, torch.isfinite(b)) or not same:
            return "differs", math.nan, math.nan, f"{key}: inf/nan in other places"
        if finite.any():
            diff = float((a[finite] - b[finite]).abs().max())
            largest = max(largest, float(a[finite].abs().max()))
            if diff > worst:
                worst, worst_key = diff, key
    tolerance = REL_TOL * max(1.0, largest, scale)
    status = "agrees" if worst <= tolerance else "differs"
    return status, worst, tolerance, f"worst part: {worst_key}" if worst_key else ""


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def on_device(tensor: torch.Tensor, model) -> None:
    """Refuse a result tensor left on another device than the model's (a silent .cpu())."""
    want = device_of(model)
    if tensor.device.type != want.type:
        raise RuntimeError(f"result on {tensor.device}, model on {want}")


# ---------------------------------------------------------------- the analyses


def logits_and_cache(model, extras):
    run = interp.run_cached(model, PROMPT, resid=["post"], patterns=True, head_outputs=True)
    parts = {"logits": run.logits, "resid_post": run.resid("post"), "patterns": run.patterns()}
    parts["head_outputs"] = run.head_outputs()
    for tensor in parts.values():
        on_device(tensor, model)
    return parts


def induction_scan(model, extras):
    result = interp.run_induction_scan(model, batch_size=2, seed=0)
    table = result.table.sort_values(["layer", "head"]).reset_index(drop=True)
    return {"table": table, "heads": sorted(result.induction_heads()), "loss": result.scan.loss}


def attribution(model, extras):
    answer, wrong = extras["answer"], extras["wrong"]
    rows = interp.logit_attribution(model, PROMPT, answer, wrong=wrong)
    logits = interp.run_cached(model, PROMPT).logits[0, -1]
    direct = float(logits[answer] - logits[wrong])
    parts = rows[rows["component"] != "total"]["contribution"].sum()
    total = float(rows[rows["component"] == "total"]["contribution"].iloc[0])
    bound = REL_TOL * max(1.0, float(logits.abs().max()))
    if abs(parts - direct) > bound or abs(total - direct) > bound:
        raise AssertionError(
            f"parts add up to {parts:.6g}, total {total:.6g}, logit difference {direct:.6g}"
        )
    return {"rows": rows.reset_index(drop=True), "logit_diff": direct}


def patching(model, extras):
    frame = interp.patch_activations(model, extras["task"], sites=["resid_pre", "heads"])
    return frame.reset_index(drop=True)


def edges(method):
    return lambda model, extras: edge_scores(model, extras["task"], method).reset_index(drop=True)


def circuit(model, extras):
    result = evaluate_circuit(model, extras["task"], extras["circuit_edges"])
    return {
        "faithfulness": result.faithfulness,
        "per_row": result.per_row.reset_index(drop=True),
        "n_edges": result.n_edges,
    }


def sae_splice(model, extras):
    sae = interp.load_sae("tiny-induction-sae", device=device_of(model))
    spliced = interp.run_cached(model, PROMPT, saes=[sae])
    alone = interp.run_cached(model, PROMPT, saes=[sae], use_error_term=False)
    acts = spliced[f"{sae.hook_name}.hook_sae_acts"]
    for tensor in (spliced.logits, alone.logits, acts):
        on_device(tensor, model)
    return {"logits": spliced.logits, "logits_sae_alone": alone.logits, "sae_acts": acts}


def graph(model, extras):
    tc = interp.load_transcoders("tiny-induction-transcoders", device=device_of(model))
    run = interp.run_cached(model, PROMPT, transcoders=tc, use_error_term=False)
    on_device(run.logits, model)
    g = interp.attribution_graph(model, PROMPT, tc, max_n_logits=5, max_feature_nodes=None)
    nodes = g.nodes.select_dtypes("number").reset_index(drop=True)  # features, activations
    parts = {"replacement_logits": run.logits, "nodes": nodes, "adjacency": g.adjacency}
    return {**parts, "scores": g.scores()}


def graph_capped(model, extras):
    # max_feature_nodes: the features ranked by influence in rounds, batched 8 rows a pass
    tc = interp.load_transcoders("tiny-induction-transcoders", device=device_of(model))
    g = interp.attribution_graph(
        model, PROMPT, tc, max_n_logits=5, max_feature_nodes=CAP, batch_size=8
    )
    # the ranking's normalised rows live on a CUDA model's device (interp.graphs.ranking)
    if torch.device(g.info["ranking"]).type != device_of(model).type:
        raise RuntimeError(f"ranked on {g.info['ranking']}, model on {device_of(model)}")
    nodes = g.nodes.select_dtypes("number").reset_index(drop=True)
    return {"nodes": nodes, "adjacency": g.adjacency, "scores": g.scores()}


ANALYSES = [
    ("logits", logits_and_cache, False),
    ("induction_scan", induction_scan, False),
    ("logit_attribution", attribution, False),
    ("patch_activations", patching, False),
    ("edge_scores_exact", edges("exact"), False),
    ("edge_scores_eap", edges("eap"), False),
    ("edge_scores_eap_ig", edges("eap-ig"), False),
    ("evaluate_circuit", circuit, False),
    ("sae_splice", sae_splice, True),  # True: bundled model only (its SAE and transcoders)
    ("attribution_graph", graph, True),
    ("attribution_graph_capped", graph_capped, True),
]


# ---------------------------------------------------------------- running and comparing


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text[:300]


def timed(fn, model, extras, device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn(model, extras)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def setup(model) -> dict:
    """What every analysis of ``model`` shares: answer tokens, a task, a circuit's edges."""
    tokens = model.to_tokens(PROMPT, prepend_bos=False)[0].tolist()
    answer, wrong = tokens[-3], tokens[-1]  # " sys" and " import"-like: two prompt tokens
    if answer == wrong:
        wrong = tokens[0]
    task = induction(model, 4, seed=0, seq_len=6)  # prompts only: runs on any device
    graph_edges = EdgeGraph.from_model(model).edge_names
    return {"answer": answer, "wrong": wrong, "task": task, "circuit_edges": graph_edges[::3]}


def check_model(name, source, device, rows) -> None:
    print(f"loading {name} on cpu and {device}", flush=True)
    try:
        cpu_model = interp.load_model(source, device="cpu")
        dev_model = interp.load_model(source, device=device)
        extras = setup(cpu_model)
        scale = float(interp.run_cached(cpu_model, PROMPT).logits.abs().max())
    except Exception as error:  # noqa: BLE001 (one row, then the next model)
        rows.append([f"{name}/load", "crashed", "", "", "", "", one_line(error)])
        print(f"{name}/load: crashed: {one_line(error)}", flush=True)
        return
    for analysis, fn, bundled_only in ANALYSES:
        if bundled_only and name != "tiny-induction":
            continue
        label = f"{name}/{analysis}"
        cpu_s = device_s = math.nan
        try:
            expected, cpu_s = timed(fn, cpu_model, extras, "cpu")
            got, device_s = timed(fn, dev_model, extras, device)
            status, diff, tolerance, detail = compare(expected, got, scale)
        except Exception as error:  # noqa: BLE001 (a crash is a finding; go on)
            status, diff, tolerance, detail = "crashed", math.nan, math.nan, one_line(error)
        rows.append([label, status, diff, tolerance, cpu_s, device_s, detail])
        print(
            f"{label}: {status}  max|diff| {diff:.3g} (tol {tolerance:.3g})  "
            f"cpu {cpu_s:.2f}s  {device} {device_s:.2f}s  {detail}",
            flush=True,
        )


# ---------------------------------------------------------------- half precision


class Said(logging.Handler):
    """The warnings interp logs while open (a fallback says which path ran)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def node_keys(g) -> list[tuple]:
    return list(g.nodes[["kind", "layer", "pos", "feature", "token_id"]].itertuples(index=False))


def half_graph(model, capped: bool):
    tc = interp.load_transcoders("tiny-induction-transcoders", device=device_of(model))
    cap = dict(max_feature_nodes=CAP, batch_size=8) if capped else {}
    return interp.attribution_graph(model, PROMPT, tc, max_n_logits=5, **cap)


def lone_features(reference, half, k_ref, k_half, both, bound) -> list[str]:
    """Features in one graph only must sit at the edge of firing: an activation within ``bound``
    of the largest (ReLU), or a swap at a TopK's k-th place (a feature of the other graph only,
    at the same layer and position, with an activation within ``bound`` of the largest of it)."""
    lone = {}
    for name, g, keys in (("reference", reference, k_ref), ("half", half, k_half)):
        acts = g.nodes.activation.to_numpy()
        lone[name] = [(k[1], k[2], float(acts[i])) for i, k in enumerate(keys) if k not in both]
    top = max(float(reference.nodes.activation.max()), float(half.nodes.activation.max()))
    edge = bound * top
    problems = []
    for name, other in (("reference", "half"), ("half", "reference")):
        for layer, pos, act in lone[name]:
            swap = any(
                (lay, p) == (layer, pos) and abs(a - act) <= edge for lay, p, a in lone[other]
            )
            if act > edge and not swap:
                problems.append(f"feature at layer {layer} pos {pos} ({act:.3g}) in {name} only")
    return problems


def compare_half(reference, half, dtype, n_layers: int, capped: bool):
    """(status, max |diff| / max |A|, bound, detail): the half model's graph against the float32
    graph of its rounded weights. The same logits; the entries the two share within the bound;
    uncapped, a feature in one graph only at the edge of firing (:func:`lone_features`); capped,
    at least 90% of the kept features the same (near-ties in the
    influence ranking may swap)."""
    bound = HALF_ROUNDINGS * (n_layers + 1) * torch.finfo(dtype).eps / 2
    problems = []
    if half.adjacency.dtype != torch.float32:
        problems.append(f"the graph is {half.adjacency.dtype}, not float32")
    if half.logit_token_ids.tolist() != reference.logit_token_ids.tolist():
        problems.append("other logits")
    k_ref, k_half = node_keys(reference), node_keys(half)
    both = set(k_ref) & set(k_half)
    n_feat = reference.n_features
    shared_feat = sum(1 for k in both if k[0] == "feature")
    if capped and shared_feat < 0.9 * n_feat:
        problems.append(f"{shared_feat} of {n_feat} kept features shared")
    if not capped:
        problems += lone_features(reference, half, k_ref, k_half, both, bound)
    common = [k for k in k_ref if k in both]
    at_ref = torch.tensor([k_ref.index(k) for k in common])
    at_half = torch.tensor([k_half.index(k) for k in common])
    a_ref = reference.adjacency[at_ref][:, at_ref].double()
    a_half = half.adjacency.cpu()[at_half][:, at_half].double()
    worst = float((a_half - a_ref).abs().max() / a_ref.abs().max())
    if worst > bound:
        problems.append(f"entries off by {worst:.3g} of the largest")
    detail = f"{len(both)} of {len(k_ref)} nodes shared; " + "; ".join(problems)
    return ("differs" if problems else "agrees"), worst, bound, detail


def check_half(device: str, dtype_name: str, rows) -> None:
    """The bundled model in ``dtype_name`` on ``device`` against its float32 twin with rounded
    weights on the CPU: the attribution graph, uncapped and capped, and which paths ran."""
    dtype = HALF_DTYPES[dtype_name]
    print(f"loading tiny-induction in {dtype_name} on {device}", flush=True)
    try:
        reference = interp.load_model("tiny-induction", device="cpu")
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(p.to(dtype).float())
        half = interp.load_model("tiny-induction", device=device, dtype=dtype)
    except Exception as error:  # noqa: BLE001 (one row, then the next check)
        rows.append(
            [f"tiny-induction/{dtype_name}/load", "crashed", "", "", "", "", one_line(error)]
        )
        print(f"tiny-induction/{dtype_name}/load: crashed: {one_line(error)}", flush=True)
        return
    for capped in (False, True):
        label = f"tiny-induction/{dtype_name}/attribution_graph" + ("_capped" if capped else "")
        said = Said()
        logging.getLogger("interp").addHandler(said)
        reset_fallback_warnings()
        cpu_s = device_s = math.nan
        try:
            run = partial(half_graph, capped=capped)
            expected, cpu_s = timed(lambda m, e: run(m), reference, {}, "cpu")  # noqa: B023
            got, device_s = timed(lambda m, e: run(m), half, {}, device)  # noqa: B023
            n_layers = int(half.cfg.n_layers)
            status, diff, tolerance, detail = compare_half(expected, got, dtype, n_layers, capped)
        except Exception as error:  # noqa: BLE001 (a crash is a finding; go on)
            status, diff, tolerance, detail = "crashed", math.nan, math.nan, one_line(error)
        finally:
            logging.getLogger("interp").removeHandler(said)
        if said.lines:
            detail += " | warned: " + " / ".join(said.lines)
        rows.append([label, status, diff, tolerance, cpu_s, device_s, detail])
        print(
            f"{label}: {status}  max|diff|/max|A| {diff:.3g} (bound {tolerance:.3g})  "
            f"cpu {cpu_s:.2f}s  {device} {device_s:.2f}s  {detail}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="folder for cuda_check.csv")
    parser.add_argument(
        "--half",
        default="bfloat16,float16",
        help="half dtypes whose graphs are checked (comma-separated; '' for none)",
    )
    parser.add_argument(
        "--only-half", action="store_true", help="only the half-precision graph checks"
    )
    args = parser.parse_args()
    halves = [h for h in args.half.split(",") if h]
    unknown = [h for h in halves if h not in HALF_DTYPES]
    if unknown:
        parser.error(f"--half takes {', '.join(HALF_DTYPES)}, not {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, interp {interp.__version__}, device {args.device}")
    if torch.device(args.device).type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(args.device)}")
    print(f"float32 matmul precision: {torch.get_float32_matmul_precision()}", flush=True)
    torch.manual_seed(0)
    transformers_logging.disable_progress_bar()
    rows: list[list] = []
    start = time.perf_counter()
    if not args.only_half:
        check_model("tiny-induction", "tiny-induction", args.device, rows)
        with tempfile.TemporaryDirectory() as folder:
            llama = make_zoo_checkpoint(Path(folder) / "llama", "llama")
            check_model("llama", llama, args.device, rows)
    for name in halves:
        check_half(args.device, name, rows)
    print(f"float32 matmul precision at the end: {torch.get_float32_matmul_precision()}")
    with open(args.out / "cuda_check.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    bad = [row[0] for row in rows if row[1] != "agrees"]
    print(
        f"{len(rows) - len(bad)} of {len(rows)} agree in {time.perf_counter() - start:.0f}s"
        + (f"; not agreeing: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
