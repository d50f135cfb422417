"""What an attribution graph's build holds at its peak, and the batch a memory budget allows.

The build holds, in the work dtype (float32, float64 for a float64 model) unless said:

* the sources (:mod:`interp.graphs.nodes`): per active feature its layer, position, index
  and activation, and its column in the layout of each layer it writes to (grouped by position,
  padded), the error vectors and token embeddings; no vector per feature: while a row step
  contracts, one writer block (a layer's writers' output vectors for a block of positions, at
  most ``CHUNK_BYTES``) and the decoder rows gathered into it;
* the rows: ``(kept features + logits) x (active features + errors + tokens + logits)``;
* the frozen pass of ``batch`` rows (model dtype): per layer the transcoder's input and
  output and the graph around them, ``_FROZEN`` numbers per row, position and ``d_model``;
  while it runs, one layer's attention scores and pattern (``_ATTENTION`` per row, head and
  position pair); during a backward pass, a gradient per layer and the targets' injections
  (``_BACKWARD``), and the ``[batch columns]`` block of rows computed;
* with the one-copy backward (:mod:`interp.graphs.vjp`, the default where it covers the model)
  instead of the frozen pass: one copy of every layer's pattern (model dtype), one row's
  attention while the prompt's one pass runs (``_ONE_COPY_PASS``), and the backward's
  ``[batch pos d_model]`` gradients (``_ONE_COPY_BACKWARD``, work dtype) and block of rows;
* a bfloat16/float16 model on CPU: the kernels oneDNN compiles and caches per shape, which
  grow with the passes (``_KERNELS``; the one-copy backward: one pass, its rows in float32:
  ``_KERNELS_ONE_COPY``, and one layer's pattern upcast at a time);
* with the one-copy backward on CPU, MKL's matmul buffers, kept per thread at the largest
  size each thread has met (``_GEMM_OTHER``, ``_GEMM_K``): ``torch.get_num_threads()`` of
  them, or the ``threads`` given;
* under a cap, the ranking's normalised copy of the rows and its ``[row row]`` block at the
  rows' own nodes (:mod:`interp.graphs.ranking`),
  filled as the rows are and alive with the row step's working memory until the last row,
  and the kept columns' copy at the end; afterwards pruning needs one more copy of the kept
  rows and a mask;
* with the sparse ranking instead (:mod:`interp.graphs.sparse_ranking`, where the dense one does
  not fit): no rows over every column, but each row's kept entries (at most ``entries``), the
  block in float64, a batch's normalised copy (:func:`sparse_ranking_bytes`, an upper bound: a
  row keeps at most ``entries``), then the kept rows computed again into the kept columns'
  table beside the row step's working memory (the row step runs twice).

The coefficients were fitted to peaks measured by benchmarks/bench_graph_memory.py (host RSS
of a fresh process with freed memory returned to the system at once; CUDA's
``max_memory_allocated``). :func:`plan_graph` makes a build's decisions from them before it
starts: the features kept, the batch and the rounds (:class:`interp.graphs.graph_plan.GraphPlan`).
"""

from __future__ import annotations

import functools

import torch

from interp.engine.estimates import parse_size
from interp.foundation.sizes import available_host_bytes
from interp.graphs.nodes import CHUNK_BYTES
from interp.graphs.sparse_ranking import choose_entries, sparse_ranking_bytes
from interp.graphs.vjp import BACKWARDS, one_copy_fits

__all__ = [
    "FREED_AT",
    "HEADROOM",
    "choose_batch",
    "estimate_graph_bytes",
    "free_bytes",
    "graph_bytes",
    "least_bytes",
]

# the allocator's, autograd's and the float kernels' own, by the model's item size (fitted to
# 16 to 1,024 positions; a bfloat16 model's is less: with oneDNN's cache off, its 16-position
# graph peaked at 10.6 MiB, the float32 one's at 22.7)
_FIXED = {2: 5 * 2**20, 4: 8.5 * 2**20, 8: 8.5 * 2**20}
# a half-precision model on CPU: oneDNN compiles and caches kernels (with their scratch space)
# per shape, and each pass has its own (rows, positions). Measured (2-layer, d_model 128,
# bfloat16, uncapped; the peak less the peak with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0): 10.6 MiB
# over 5 passes (16 positions), 10.4 over 8 (32), 17 over 14 (64), 28 over 54 (256); fitted
# as _KERNELS * sqrt(passes), passes at most 1,024 (the cache's capacity in kernels)
_KERNELS = 4.2 * 2**20
# (per layer, fixed) [batch pos d_model] tensors the batched frozen pass (backward="batched")
# holds, fitted with the two below to 17 peaks of 2- to 6-layer models, 4 and 8 heads, d_model
# 128 and 256, 64 to 512 positions, capped and not, per-layer and cross-layer, float32 and
# bfloat16: every estimate within 7% of its peak (0.5.0's 2-layer fit, (6, 9) and 3, had
# absorbed a pattern and an input per layer that views of the batch kept alive, and fell to
# 0.58 of a 6-layer peak)
_FROZEN = (2.0, 2.0)
_ATTENTION = 2.5  # [batch head pos pos] tensors alive at one layer's attention
_BACKWARD = (0.5, 4.0)  # (per layer, fixed) [batch pos d_model] tensors of one backward pass
# under max_bytes, freed blocks of FREED_AT bytes or more go back to the system at once
# (interp.engine.return_freed_memory; 1 MiB elsewhere). A small graph's transients, [batch pos
# d_model] at 16-64 positions (128 KiB-1 MiB), otherwise came from glibc's heap, whose freed
# holes stayed resident in a layout that moved from run to run: a 64-position graph budgeted at
# 9.96 MiB peaked at 10.1-12.9 MiB in four fresh processes, 10.0-10.4 MiB with 256 KiB
FREED_AT = 256 * 2**10
# max_bytes bounds the peak; the estimate is a fit to it. The planner keeps HEADROOM of max_bytes
# unplanned for what a small graph's build allocates that the estimate cannot foresee: glibc's
# heap moves by ~0.5 MiB run to run (its free holes at the peak: 0.4-1.0 MiB at 32 positions),
# and the kernel's high-water mark itself is counted per CPU in batches (VmHWM read 0.01-0.27
# MiB under a known peak); a 32-position graph planned at 4.6 MiB had peaked at 6.0 before
# MKL's buffers were counted. Negligible at a large graph's size
HEADROOM = 2 * 2**20
# the one-copy backward (interp.graphs.vjp): [head pos pos] tensors alive at one layer's
# attention in its one-row recording pass (as _ATTENTION, for one row), [batch pos d_model]
# tensors (work dtype) alive in its backward (the residual's gradient, the attention's and a
# norm's transposes), one layer's pattern upcast to the work dtype where the model's is
# narrower, and the allocator's own. _ONE_COPY_BACKWARD was 5.0 while MKL's buffers (below)
# were not counted: the fifth copy stood in for them at 16-256 positions and overcounted from
# 512 (float32 estimates 1.11-1.14 of the peak at 512-2,048 positions: one [64 pos 128]
# float32 copy, 16-64 MiB, over; bfloat16 within 1.06 only because its upcast pattern, 4-64
# MiB, was missing). 1 MiB of the allocator's and the heap's own (glibc's heap: 1.0-1.3 MiB
# more in use at a 16-position build's peak, and free holes), fitted with the terms here to
# the 16-64 position points on 1 and 2 threads, the heap trimmed before the call (as the
# build's clean pass trims it: benchmarks/bench_graph_memory.py)
_ONE_COPY_PASS = 3.0
_ONE_COPY_BACKWARD = 4.0
_FIXED_ONE_COPY = 1 * 2**20
# a half-precision model's one pass on CPU (the one-copy backward): oneDNN's cached kernels,
# 2.1-2.7 MiB (the peak less the peak with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0, 16-256
# positions, 1 or 2 threads), and 1.3 MiB more with that cache off (a bfloat16 graph of 16
# positions peaked 4.6-4.8 MiB without its cache, the float32 graph 3.0-3.7 on one thread);
# bfloat16 less float32 peaks on the grid: 3.6-3.9 MiB at 16-256 positions
_KERNELS_ONE_COPY = 3.5 * 2**20
# MKL (float32/float64 matmuls on CPU) keeps each thread's buffers at the largest size that
# thread has met (its "fast memory manager"; MKL_DISABLE_FAST_MM=1 frees them after each
# call). Per thread the largest is the attention's transpose, pattern^T [pos pos] @ [pos
# batch*d_head] per head: measured alone (the resident size freed by mkl_free_buffers) it
# holds 4 bytes x batch*d_head x pos per thread up to pos 128 (1.07 MiB at 128 x 2,048), and
# 1.1-1.8 MiB beyond (MKL's blocking); twice that on two threads. Over a whole build (the
# other matmuls' buffers too: the skip term's, the contraction's, the clean pass's) a thread
# held 0.4-0.7 MiB at 16 positions, 1.1-1.3 at 64, 1.4-1.6 at 128, 1.7-1.8 at 256 and
# 2.4-3.0 at 512-2,048 (2-layer, d_model 128, 4 heads, batch 64), and a graph's peak on two
# threads stood 0.6-1.5 MiB above its peak on one (16-256 positions), 2.9-3.2 MiB above from
# 512: counted as _GEMM_OTHER + work bytes x batch*d_head x min(pos, _GEMM_K) per thread
_GEMM_OTHER = 0.5 * 2**20
_GEMM_K = 256
# the one-copy row step's [batch columns] blocks (its rows, a layer's scores and their gathered
# copy) come from glibc's heap while they are under FREED_AT (at batch 64 and 2 layers: up to
# 64 positions), and their freed holes stay resident there: at a 32-64 position graph's peak
# the heap held 2.0-2.8 MiB (1.1-2.3 in use, 0.4-1.6 in free holes), at 16 positions 1.0-1.5,
# and the estimate fell 0.5-1.6 MiB short at 32-64 positions (0.83-0.96 of the peak). From 128
# positions (a 500 KiB block) they are mmapped and freed at once
_HEAP_BLOCKS = 3
# [batch pos d_model] tensors (work dtype) alive beside a writer block while a layer's gradient
# is contracted with it (interp.graphs.nodes.Sources.add_writer_scores): the gradient and the
# matmul's contiguous copy of it. Measured: a cross-layer graph (4 layers, d_model 128, 4,096
# features a layer, 1,024 positions, capped at 256, float32) peaked 75 MiB higher with one
# block per layer (139 MiB of vectors) than with blocks of one position; this counts 71 MiB
_AT_BLOCK = 2.0
# the slots of a layout, padded to the fullest position, over a layer's mean writers a
# position (interp.graphs.nodes): ~1.25 at Gemma-2-2B's ~164 a position; up to ~2 at the
# small benches' ~6, where the layout is small beside the rest
_PADDING = 1.25


def graph_bytes(
    model,
    tc,
    n_pos: int,
    *,
    n_active: int,
    keep: int,
    n_logits: int,
    batch: int,
    source_bytes: int | None = None,
    one_copy: bool = False,
    block_bytes: int | None = None,
    entries: int | None = None,
    threads: int | None = None,
) -> int:
    """Bytes the build of a graph of ``n_active`` active features (``keep`` kept) holds at its
    peak (module docstring); ``source_bytes``, ``block_bytes``: what the sources hold and what
    their writer block adds (:attr:`interp.graphs.nodes.Sources.held_bytes`, ``block_bytes``)
    where known; ``one_copy``: rows by the one-copy backward (:mod:`interp.graphs.vjp`);
    ``entries``: under a cap, ranked by the sparse ranking keeping at most this many entries a
    row (None: dense); ``threads``: the threads its matmuls run on (None:
    ``torch.get_num_threads()``)."""
    cfg = model.cfg
    d, n_heads, n_layers = int(cfg.d_model), int(cfg.n_heads), int(tc.n_layers)
    work = 8 if cfg.dtype == torch.float64 else 4
    item = torch.empty((), dtype=cfg.dtype).element_size()
    if source_bytes is None:
        source_bytes = _sources_held(tc, n_pos, n_active, d, work)
    if block_bytes is None:
        block_bytes = _writer_block(tc, n_pos, n_active, d, work)
    rows = keep + n_logits
    columns = n_active + n_layers * (n_pos - 1) + n_pos + n_logits
    kept_columns = columns - n_active + keep
    block = rows * columns * work
    token = batch * n_pos * d
    frozen = token * item * (_FROZEN[0] * n_layers + _FROZEN[1])
    attention = _ATTENTION * batch * n_heads * n_pos * n_pos * item
    backward = token * work * (_BACKWARD[0] * n_layers + _BACKWARD[1]) + batch * columns * work
    if one_copy:  # one copy of the patterns, no batch of activations; the rows' gradients
        frozen = n_layers * n_heads * n_pos * n_pos * item
        attention = _ONE_COPY_PASS * n_heads * n_pos * n_pos * item
        backward = token * work * _ONE_COPY_BACKWARD + batch * columns * work
        if item < work:  # a layer's pattern upcast for its transpose (value_path._dense)
            backward += n_heads * n_pos * n_pos * work
        if batch * columns * work < FREED_AT:  # the row step's blocks in glibc's heap
            backward += _HEAP_BLOCKS * batch * columns * work
    # a row step contracts at one layer at a time, beside fewer of its gradients than its
    # peak holds: a writer block and the rows gathered into it show only when they outgrow those
    backward = max(backward, token * work * _AT_BLOCK + block_bytes + batch * columns * work)
    capped = keep < n_active
    # the normalised rows and their [row row] block at the rows' own nodes, on the host or on
    # a CUDA device (ranking_device)
    ranking = block + rows * rows * work if capped else 0
    end = rows * kept_columns * work if capped else 0
    pruning = rows * kept_columns * (work + 1)
    sparse = capped and entries is not None
    if sparse:  # no rows over every column; the kept rows computed again beside the row step
        ranking = sparse_ranking_bytes(
            rows, columns, n_active, batch, entries, work, n_layers, n_pos
        )
        block, end = 0, end + frozen + max(attention, backward)
    during = frozen + ranking + max(attention, backward)
    kernels = 0.0
    on_cpu = str(cfg.device).startswith("cpu")
    if item < 4 and on_cpu:
        passes = (-(-n_logits // batch) + -(-keep // batch)) * (1 + sparse)
        # the one-copy backward runs one pass in the model's dtype (its rows in float32)
        kernels = _KERNELS_ONE_COPY if one_copy else _KERNELS * min(passes, 1024) ** 0.5
    if one_copy and on_cpu:  # MKL's buffers, per thread (the batched pass's fit has its own)
        threads = torch.get_num_threads() if threads is None else int(threads)
        d_head = d // n_heads
        kernels += threads * (_GEMM_OTHER + work * batch * d_head * min(n_pos, _GEMM_K))
    fixed = _FIXED_ONE_COPY if one_copy else _FIXED.get(item, _FIXED[4])
    return int(fixed + kernels + source_bytes + block + max(during, end, pruning))


def _writes(tc) -> float:
    """The layers each feature writes to, on average (a cross-layer feature: its own and on)."""
    return 1.0 if tc.kind == "per-layer" else (int(tc.n_layers) + 1) / 2


def _sources_held(tc, n_pos: int, n_active: int, d: int, work: int) -> int:
    """The sources' bytes (:attr:`interp.graphs.nodes.Sources.held_bytes`): per feature its
    layer, position, index (int64) and activation, a column (int64) in each layer's layout it
    writes to (padded: ``_PADDING``); the errors and embeddings ``[pos d_model]`` per layer + 1."""
    per_feature = 3 * 8 + work + 8 * _PADDING * _writes(tc)
    return int(n_active * per_feature) + (int(tc.n_layers) + 1) * n_pos * d * work


def _writer_block(tc, n_pos: int, n_active: int, d: int, work: int) -> int:
    """What a row step's writer block adds (:attr:`interp.graphs.nodes.Sources.block_bytes`):
    the largest layer's writers' vectors (per-layer: an even share of the features; cross-layer:
    the last layer's, every feature), padded, at most ``CHUNK_BYTES`` (one position at least),
    and one source layer's decoder rows gathered into it (``n_active / n_layers`` features in
    that block's share)."""
    n_layers = int(tc.n_layers)
    share = 1 / n_layers if tc.kind == "per-layer" else 1.0
    vectors = _PADDING * n_active * share * d * work
    block = min(vectors, max(CHUNK_BYTES, vectors / n_pos))
    return int(block * (1 + 1 / (_PADDING * n_layers * share)))


def estimate_graph_bytes(
    model,
    tc,
    n_pos: int,
    max_feature_nodes: int | None = None,
    batch_size: int | None = None,
    *,
    n_active: int | None = None,
    n_logits: int = 10,
    backward: str = "auto",
    ranking: str = "auto",
    max_bytes: int | str | None = None,
    threads: int | None = None,
) -> int:
    """Bytes :func:`interp.attribution_graph` holds at its peak for a prompt of ``n_pos`` tokens
    through transcoders ``tc`` (the model's own weights not counted).

    Args:
        max_feature_nodes: the cap on kept features (None: every active feature kept).
        batch_size: targets per backward pass (None: 64, attribution_graph's default).
        n_active: the active features (positions 1 onwards). None counts every feature at
            every position active: an upper bound. ``attribution_graph`` counts them itself.
        n_logits: the logit nodes (at most ``max_n_logits``).
        backward: the row step (``attribution_graph``'s): ``"auto"`` counts the one-copy
            backward where the model's hooks fit it (:func:`interp.graphs.vjp.one_copy_fits`).
        ranking, max_bytes: the ranking under a cap (``attribution_graph``'s): ``"auto"``
            counts the sparse one where the dense one needs more than ``max_bytes`` (or, without
            it, the memory free on the model's device).
        threads: the threads the build's matmuls run on (None: ``torch.get_num_threads()``,
            what the build will use); on CPU MKL keeps buffers per thread.
    """
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    one_copy = backward == "one-copy" or (backward == "auto" and one_copy_fits(model, tc))
    if n_pos < 2:
        raise ValueError(f"a graph needs at least 2 positions, got {n_pos}")
    if n_active is None:
        n_active = int(tc.n_layers) * int(tc.d_tc) * (n_pos - 1)
    keep = n_active if max_feature_nodes is None else min(int(max_feature_nodes), n_active)
    batch = 64 if batch_size is None else int(batch_size)
    batch = max(1, min(batch, keep + n_logits))

    def sized(batch: int, entries: int | None = None) -> int:
        return graph_bytes(
            model, tc, n_pos, n_active=n_active, keep=keep, n_logits=n_logits, batch=batch,
            one_copy=one_copy, entries=entries, threads=threads,
        )  # fmt: skip

    room = parse_size(max_bytes) - HEADROOM if max_bytes is not None else None
    if room is None and ranking == "auto" and keep < n_active:  # the build's own room
        room = free_bytes(model.cfg.device)
    least = lambda e: least_bytes(functools.partial(sized, entries=e), batch)  # noqa: E731
    return sized(batch, choose_entries(ranking, keep < n_active, least, room))


def free_bytes(device: torch.device | str) -> int | None:
    """Memory free for a build on ``device``: CUDA's free memory, or the host's available RAM
    (``MemAvailable``); None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return available_host_bytes()


def choose_batch(need, batch: int, budget: int) -> int:
    """The largest of ``batch``, ``batch // 2``, ... whose ``need(batch)`` fits ``budget``
    (at least 1)."""
    while batch > 1 and need(batch) > budget:
        batch //= 2
    return batch


def least_bytes(need, batch: int) -> int:
    """The least ``need(b)`` over ``batch``, ``batch // 2``, ..., 1: not always one row's (on
    CPU a half-precision model's kernels grow with the passes)."""
    sizes = [need(batch)]
    while batch > 1:
        batch //= 2
        sizes.append(need(batch))
    return min(sizes)
