"""How much slower each collective runs inside a real DLRM training step than in its isolated
probe, learned from the steps the calibration's training probes captured.

An isolated collective probe repeats one collective with both ranks waiting for it; inside a
step the backend's threads (gloo) or kernels (NCCL) share the host or the SMs with the ranks'
compute. On the 2-core development VM a 1 MiB DDP all-reduce took 0.44 ms alone and 0.7-9.4 ms
inside a traced DLRM step with both ranks idle; the step model priced it alone, so every
collective-heavy job (small batches, wide dense layers) was predicted short. Each training
probe records its collectives' in-step times (`probes.vocabulary.in_context.in_step_collectives`:
per captured step, per collective, the least over ranks, so no rank's wait for another is
counted); here they are paired, in issue order, with the collectives of the job's execution
graph, priced by the isolated models, and each collective op gets the in-step affine factor
the kernels get (`ContextFactorModel`). Fitted on the step rows the step overhead trains on,
scored on its held-out steps against the isolated price (the baseline), and proposed only when
it beats it there; `predictors.fit.fit_steps` then keeps it for each workload whose whole
steps, each left out in turn, bear it out (`ContextFactorModel.workloads`).

The factor prices a collective at its mean in-step time, not its typical one. In-step times
are heavy tailed: most calls run near their isolated time and a few stall for milliseconds
(a backend thread waiting for a core, a rank late to the rendezvous). A step adds several
collectives up, and the expected sum is the sum of the means: calibrations of issue #26 had
in-step/isolated ratios with medians of 1.1 (all-to-all) and 1.5-2.6 (all-reduce) but means
of 2.6-3.2, and the typical-call factor left every small-batch step short. So the factor is
the ratio of the summed in-step times to the summed isolated prices (per collective op), and
it is judged on what the simulator sums: the held-out collectives' total time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from predictors.context_model import CLIP, MIN_ROWS, ContextFactorModel
from predictors.dlrm_graph import build_dlrm_graph
from predictors.evaluation import error_stats, split_by_op
from predictors.performance_model import PerformanceModel
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.ops import IN_STEP_COLLECTIVE_OP
from probes.vocabulary.placement import placement_of
from probes.vocabulary.records import Measurement

# A traced kind the graph's op may run as: gloo has no reduce-scatter of its own and runs
# `reduce_scatter_single` as an all-reduce.
RUNS_AS = {"reduce_scatter": {"reduce_scatter", "all_reduce"}}


def collective_pairs(model: PerformanceModel, step_rows: Sequence[Measurement]) -> dict[str, list[tuple[float, float]]]:
    """Per collective op, (isolated price, in-step seconds) of every collective of every
    captured step whose sequence matches the graph's (rank 0's communication stream)."""
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in step_rows:
        captured = row.params.get("in_step_collectives") or []
        if not captured:
            continue
        job = JobSpec.from_dict(row.params["job"])
        graph = build_dlrm_graph(job, row.params["table_to_rank"], placement_of(row.params, job.world_size))
        collectives = [op for op in graph.ranks[0] if op.kind == "collective"]
        for step in captured:
            if not _matches(collectives, step):
                continue
            for op, (_, seconds) in zip(collectives, step):
                if op.op in model.models and seconds > 0:
                    pairs[op.op].append((model.predict_params(op.op, op.params), float(seconds)))
    return pairs


def _matches(collectives: Sequence[Any], step: Sequence[Sequence[Any]]) -> bool:
    return len(collectives) == len(step) and all(
        kind in RUNS_AS.get(op.op, {op.op}) for op, (kind, _) in zip(collectives, step)
    )


def fit_collective_context(model: PerformanceModel, step_rows: Sequence[Measurement], seed: int = 0) -> None:
    """Add each collective op's in-step factor to `model.in_step` (created if the bundle has
    none), from the collectives of a seeded 80% of `step_rows`, and keep them only where they
    pay: the other steps' collectives, priced with them, must add up closer to their measured
    total than the isolated prices (the baseline) do. `metrics["in_step_collective"]` says which was kept, with the per-call GMAE beside."""
    train, test = split_by_op(step_rows, seed)
    fitted = collective_pairs(model, train)
    learned = ContextFactorModel()
    for op, v in sorted(fitted.items()):
        if len(v) >= MIN_ROWS:
            learned.factors[op], learned.adds[op] = mean_ratio(np.asarray(v)), 0.0
            learned.counts[op] = len(v)
    if not learned.counts:
        return
    held = [(op, iso, s) for op, v in collective_pairs(model, test).items() for iso, s in v]
    priced = np.asarray([learned.in_step(op, iso) for op, iso, _ in held])
    isolated = np.asarray([iso for _, iso, _ in held])
    measured = np.asarray([s for _, _, s in held])
    stats = error_stats(np.abs(priced - measured) / measured).to_dict()
    stats["baseline_gmae"] = error_stats(np.abs(isolated - measured) / measured).gmae if held else None
    stats["total_error"] = total_error(priced, measured)
    stats["baseline_total_error"] = total_error(isolated, measured)
    stats["n_train"] = sum(len(v) for v in fitted.values())
    stats["factors"] = dict(learned.factors)
    stats["kept"] = bool(held) and stats["total_error"] < stats["baseline_total_error"]
    if stats["kept"]:
        context = model.in_step if model.in_step is not None else ContextFactorModel()
        context.factors.update(learned.factors)
        context.adds.update(learned.adds)
        context.counts.update(learned.counts)
        model.in_step = context
    model.metrics[IN_STEP_COLLECTIVE_OP] = stats


def mean_ratio(pairs: np.ndarray) -> float:
    """Summed in-step seconds over summed isolated prices (`pairs`: rows of (isolated,
    in-step)): the factor whose priced total matches the measured total, clipped as every
    in-step factor is."""
    return float(np.clip(pairs[:, 1].sum() / pairs[:, 0].sum(), *CLIP))


def total_error(priced: np.ndarray, measured: np.ndarray) -> float:
    """How far the priced collectives add up from their measured total, relative to it."""
    return float(abs(priced.sum() - measured.sum()) / measured.sum()) if len(measured) else float("nan")
