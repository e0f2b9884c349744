"""The data-parallel reductions of a transformer rank's iteration besides DDP's buckets, with
the copies made around them (predictors/transformer_graph.py strings them into the iteration):
FSDP2's all-gather of a unit's parameters and reduce-scatter of its gradients, and a pipeline
stage's own bucket reduction.

FSDP2's copies are listed because they are a layout's cost a plan weighs against DDP's
(traced on a two-rank CPU step of four 256-wide blocks under full_shard, #26: 6.9 ms of
113 ms): the rank's shard into each gather's input, the gathered unit out into its parameters
before the unit runs, the unit's gradients into each reduce-scatter's input.
"""

from __future__ import annotations

from predictors.ddp_buckets import ddp_buckets
from predictors.dlrm_graph import FLOAT
from predictors.transformer_block_graph import RankOps
from probes.vocabulary.ops import memcpy_params

# A flat run of parameters or gradients is priced as rows of this many elements.
FLAT_COLS = 1024


def fsdp_gather(g: RankOps, name: str, numel: int) -> int:
    """FSDP's all-gather of one unit's parameters (the output: the whole unit, float32), after
    FSDP2 copies the rank's shard into the gather's input (`foreach_all_gather`; on a GPU on a
    stream of its own, here on the compute stream off its chain: the graph has no third
    stream, and the copy is a memory-bound kernel beside compute either way)."""
    world = g.spec.data_parallel
    shard = memcpy_params("d2d", FLOAT * -(-numel // world))
    copy_in = g.add(name + "_copy_in", "memory", "memcpy", shard, chain=False)
    params = {"bytes": FLOAT * numel, "world": world, "scope": g.dp_scope}
    return g.add(name, "collective", "all_gather", params, (copy_in,), stream="comm", group=g.dp_group, chain=False)


def fsdp_unshard(g: RankOps, name: str, gathered: int | None, numel: int) -> int | None:
    """Where a unit's gathered parameters are first used: FSDP2 copies the gather's output into
    the unit's parameters (`split_with_sizes_copy`, the whole unit) on the compute stream once
    the gather is done, and the unit's ops follow. None without a gather (already whole)."""
    if gathered is None:
        return None
    return g.add(name, "memory", "memcpy", memcpy_params("d2d", FLOAT * numel), (gathered,))


def fsdp_reduce_scatter(g: RankOps, name: str, numel: int, after: int | None) -> int:
    """FSDP's reduce-scatter of one unit's gradients, after FSDP2 concatenates them into the
    collective's input on the compute stream (`chunk_cat`, the whole unit)."""
    copy_in = g.add(name + "_copy_in", "memory", "memcpy", memcpy_params("d2d", FLOAT * numel), (after,))
    params = {"bytes": FLOAT * numel, "world": g.spec.data_parallel, "scope": g.dp_scope}
    return g.add(name, "collective", "reduce_scatter", params, (copy_in,), stream="comm", group=g.dp_group, chain=False)


def bucket_all_reduce(g: RankOps, nbytes: int, bucket_bytes: int) -> list[int]:
    """A pipeline stage's data-parallel gradient average after its last backward, in DDP-sized
    buckets one after the other (the workload's `_all_reduce_gradients`): each bucket
    concatenated, all-reduced, averaged and copied back into the gradients. Returns the
    all-reduces."""
    reduces = []
    for k, size in enumerate(ddp_buckets(nbytes, bucket_bytes)):
        g.add(f"dp_bucket{k}_cat", "memory", "memcpy", memcpy_params("d2d", size))
        params = {"bytes": size, "world": g.spec.data_parallel, "scope": g.dp_scope}
        reduces.append(g.add(f"dp_all_reduce{k}", "collective", "all_reduce", params, group=g.dp_group))
        g.elementwise(f"dp_bucket{k}_average", "mul", -(-size // (FLOAT * FLAT_COLS)), FLAT_COLS)
        g.add(f"dp_bucket{k}_copy_back", "memory", "memcpy", memcpy_params("d2d", size))
    return reduces
