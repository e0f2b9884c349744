"""A rank's kernel time split by how a training step slows each kind of kernel beyond its
probed time: the step overheads' features (`dlrm_estimator`, `transformer_estimator`).

Why split: a step runs its kernels beside the other ranks' and beside the framework's threads,
and each kind suffers that differently. A GEMM is compute-bound: on a rank with its own cores
(or its own GPU) it runs about as fast as it was probed alone. Lookups, element-wise ops and
copies are memory-bound and share the memory system with everything else on the host.
Collectives wait for the slowest rank, and on CPU ranks their threads compete with compute.
One slowdown for all kernels (the overheads' `kernels_s`, a single coefficient) took its value
from the mix of the calibration's steps and missed the steps whose mix differs: the transformer's
largest (GEMM-bound) tasks of #26 came out 13-27% over. Refitted on seven stored #26
calibrations (`benchmarks/kernel_class_split.py`), the split slowed the transformer's GEMMs by
0-15%, its memory-bound kernels by 17-66% and its collectives by 1.2-1.6x, and the DLRM's GEMMs
by 0 in all seven; the transformer's steps left out in turn went from 8.0% to 6.6% (mean GMAE),
the DLRM's from 8.2% to 8.1%."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from predictors.graph import GraphOp

GEMM, MEMORY, COLLECTIVE = "gemm_s", "memory_s", "collective_s"
KERNEL_CLASSES = (GEMM, MEMORY, COLLECTIVE)
# Of the busiest rank's memory-bound time, what its node's other ranks can run beside it
# (`dlrm_ranks.memory_alongside`): what a shared memory system slows.
MEMORY_ALONGSIDE = "memory_alongside_s"
ALL_KERNELS = "kernels_s"  # the simulated kernels as a whole: one slowdown for every class


def one_slowdown(features: Sequence[str]) -> list[str]:
    """`features` with the kernel classes folded into one slowdown on all the kernels: what a
    step overhead is fitted on when there are too few steps for a slowdown per class (the
    overheads before the split, and a benchmark's paired "before")."""
    split = (*KERNEL_CLASSES, MEMORY_ALONGSIDE)
    if not any(f in split for f in features):
        return list(features)
    return [f for f in features if f not in split] + [ALL_KERNELS]


def kernel_class(op: GraphOp) -> str:
    """Which class `op` is in: collectives (and point-to-point transfers), GEMMs, the rest."""
    if op.kind == "collective":
        return COLLECTIVE
    return GEMM if op.op == "gemm" else MEMORY


def kernel_classes(ops: Iterable[GraphOp], cost: Callable[[GraphOp], float]) -> dict[str, float]:
    """Seconds of `ops` (one rank's) in each class, priced by `cost`."""
    seconds = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for op in ops:
        seconds[kernel_class(op)] += cost(op)
    return seconds


def busiest_rank(ranks: Sequence[Sequence[GraphOp]], cost: Callable[[GraphOp], float]) -> tuple[int, dict[str, float]]:
    """The index (in `ranks`) of the rank whose kernels add up to the most (the step waits for
    it) and its class split; 0 and zeros when no rank has an op. Both workloads' overheads read
    the busiest rank's classes, and the DLRM's also which rank it is (what runs beside it)."""
    splits = {i: kernel_classes(ops, cost) for i, ops in enumerate(ranks) if ops}
    if not splits:
        return 0, dict.fromkeys(KERNEL_CLASSES, 0.0)
    index = max(splits, key=lambda i: sum(splits[i].values()))
    return index, splits[index]
