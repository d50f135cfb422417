"""interp against its peer libraries, each run by the library itself in its own environment:
circuit-tracer 0.5.0 (graphs, feature interventions), SAELens 6 (SAEs both ways, transcoders,
``ln2.hook_normalized``), eai-sparsify and dictionary-learning (their saved SAEs).

    python experiments/parity.py --out DIR [--envs DIR] [--only PEER ...]
        [--circuit-tracer-python PATH] [--saelens-python PATH]
        [--sparsify-python PATH] [--dictionary-learning-python PATH]

Run it with interp's own Python: interp's side of every comparison runs there. Each peer runs
with the Python given for it (the option, or ``INTERP_<PEER>_PYTHON``), or else in a venv this
command makes under ``--envs`` (``INTERP_PEER_ENVS``, default ``.peer-envs/`` in the repository)
and reuses on later runs (experiments/parity_envs.py). The comparisons are
experiments/parity_checks.py's. Prints one table (peer, comparison, metric, cases, worst
measured case, tolerance, PASS / FAIL / NOT RUN), writes it with every case's row to
``DIR/parity.md`` (the sides' files under ``DIR/parity-work``, their output under
``DIR/logs``), and exits 1 unless every comparison passed (a peer that could not be installed
or run is NOT RUN, which fails too); 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.parity_envs import PEERS, ensure_env, peer_versions  # noqa: E402

HEADER = ("peer", "comparison", "metric", "cases", "worst case measured", "tolerance", "result")


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="experiments/parity.py",
        description="interp against circuit-tracer, SAELens, sparsify and dictionary_learning, "
        "each peer run in its own environment; see docs/testing.md",
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="where parity.md is written"
    )
    parser.add_argument(
        "--envs",
        type=Path,
        default=Path(os.environ.get("INTERP_PEER_ENVS", ROOT / ".peer-envs")),
        metavar="DIR",
        help="where the peers' venvs are made and reused (default: %(default)s)",
    )
    parser.add_argument("--only", nargs="+", choices=list(PEERS), metavar="PEER",
                        help=f"these peers alone ({', '.join(PEERS)})")  # fmt: skip
    for peer in PEERS.values():
        parser.add_argument(
            f"--{peer.name.replace('_', '-')}-python",
            dest=peer.name,
            metavar="PATH",
            default=os.environ.get(peer.env_var),
            help=f"a Python with {' '.join(peer.requirements)} (or {peer.env_var}); "
            f"default: a venv under --envs",
        )
    args = parser.parse_args(argv)
    for peer in PEERS:
        given = getattr(args, peer)
        if given and not (shutil.which(given) or Path(given).is_file()):
            parser.error(f"--{peer.replace('_', '-')}-python {given}: no such file")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file; give a folder")
    return args


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if "model name" in line),
               platform.processor() or "unknown CPU")  # fmt: skip
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu})"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _summary(records) -> list[tuple]:
    groups: dict[tuple, list] = {}
    for r in records:
        groups.setdefault((r.peer, r.comparison, r.metric), []).append(r)
    rows = []
    for (peer, comp, metric), rs in groups.items():
        failed = [r for r in rs if r.passed is False]
        if any(r.passed is None for r in rs):
            result = "NOT RUN"
        else:
            result = "FAIL" if failed else "PASS"
        worst = max(failed or rs, key=lambda r: r.ratio)
        measured = worst.measured + (f", at {worst.case}" if len(rs) > 1 else "")
        if len(failed) > 1:
            measured += f"; {len(failed)} of {len(rs)} cases fail"
        rows.append((peer, comp, metric, str(len(rs)), measured, worst.tolerance, result))
    return rows


def _table(header, rows) -> str:
    cell = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cell])


def _compare(args, torch_req: str, work: Path, logs: Path) -> tuple[list, dict]:
    """Every peer's comparisons: ``(records, {peer: {distribution: version}})``."""
    from experiments.parity_checks import CHECKS, Record

    records, versions = [], {}
    for name in args.only or list(PEERS):
        peer = PEERS[name]
        print(f"[parity] {name}: preparing its environment", file=sys.stderr, flush=True)
        try:
            python = getattr(args, name) or str(
                ensure_env(peer, args.envs.resolve(), torch_req, logs / f"env-{name}.log")
            )
            versions[name] = peer_versions(peer, python)
        except RuntimeError as error:
            versions[name] = {"not installed": str(error)}
            records += [Record(name, comp, "ran", "-", f"not run: {error}", "-", None)
                        for comp, _ in CHECKS[name]]  # fmt: skip
            continue
        for comp, check in CHECKS[name]:
            print(f"[parity] {name}: {comp}", file=sys.stderr, flush=True)
            where = work / f"{name}-{comp}".replace(" ", "_")
            where.mkdir()
            try:
                records += check(python, where, logs / f"{name}-{comp}.log".replace(" ", "_"))
            except Exception as error:  # a side that crashed fails its comparison, with why
                text = " ".join(f"crashed: {error}".split())[:300]
                records.append(Record(name, comp, "ran to the end", "-", text, "exit 0", False))
    return records, versions


def main(argv: list[str] | None = None) -> int:
    args = _options(argv)
    import torch

    import interp

    out = args.out.resolve()
    work, logs = out / "parity-work", out / "logs"
    for folder in (work, logs):  # this command's own folders, emptied for a fresh run
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every side does: the figures are one thread's
    try:
        records, versions = _compare(args, f"torch=={torch.__version__.split('+')[0]}", work, logs)
    finally:
        torch.set_num_threads(threads)
    rows = _summary(records)
    table = _table(HEADER, rows)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with_versions = "; ".join(
        f"{name}: " + ", ".join(f"{d} {v}" for d, v in vs.items()) for name, vs in versions.items()
    )
    head = (f"Parity of interp {interp.__version__} (torch {torch.__version__}, Python "
            f"{platform.python_version()}) with its peers, {stamp}, on {_machine()}.\n\n"
            f"Peers: {with_versions}.\n")  # fmt: skip
    cases = _table(("peer", "comparison", "metric", "case", "measured", "tolerance", "result"),
                   [(r.peer, r.comparison, r.metric, r.case, r.measured, r.tolerance,
                     {True: "PASS", False: "FAIL", None: "NOT RUN"}[r.passed])
                    for r in records])  # fmt: skip
    (out / "parity.md").write_text(f"# Parity\n\n{head}\n{table}\n\n## Every case\n\n{cases}\n")
    print(f"{head}\n{table}\n\nevery case: {out / 'parity.md'}")
    return 0 if rows and all(row[-1] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
