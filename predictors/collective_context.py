"""How much slower each collective runs inside a real training step than in its isolated
probe, learned per workload from the steps the calibration's training probes captured.

An isolated collective probe repeats one collective with both ranks waiting for it; inside a
step the backend's threads (gloo) or kernels (NCCL) share the host or the SMs with the ranks'
compute. On the 2-core development VM a 1 MiB DDP all-reduce took 0.44 ms alone and 0.7-9.4 ms
inside a traced DLRM step with both ranks idle; the step model priced it alone, so every
collective-heavy job (small batches, wide dense layers) was predicted short. Each training
probe records its collectives' in-step times (`probes.vocabulary.in_context.in_step_collectives`:
per captured step, per collective, the least over ranks, so no rank's wait for another is
counted); here they are paired, in issue order, with the collectives of the job's execution
graph (a DLRM's or a transformer layout's), priced by the isolated models, and each collective
op gets a factor. Learned from a seeded 80% of one workload's steps and scored on the rest
against the isolated price (the baseline); `predictors.step_fit.fit_steps` then keeps a workload's
factors where its whole steps, each left out in turn, bear them out
(`ContextFactorModel.by_workload`).

Per workload, because what a step does beside its collectives differs: a DLRM's all-to-alls
and small dense all-reduces contend with its embedding lookups, a data-parallel transformer's
few large gradient all-reduces with its backward GEMMs. At the 11-27 23:55 calibration of #26
the DLRM steps' all-reduces ran 3.65x their isolated price in sum, the transformer steps'
2.46x (`benchmarks/in_step_collectives.py`); priced at the DLRM's, the transformer's smallest
stacks were predicted 35% long.

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
from predictors.graph import GraphOp
from predictors.performance_model import PerformanceModel
from predictors.transformer_graph import build_transformer_graph, is_transfer
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.ops import TRANSFORMER_STEP_OP
from probes.vocabulary.placement import placement_of
from probes.vocabulary.records import Measurement
from probes.vocabulary.transformer_spec import TransformerSpec

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
        collectives = graph_collectives(row)
        for step in captured:
            if not _matches(collectives, step):
                continue
            for op, (_, seconds) in zip(collectives, step):
                if op.op in model.models and seconds > 0:
                    pairs[op.op].append((model.predict_params(op.op, op.params), float(seconds)))
    return pairs


def graph_collectives(row: Measurement) -> list[GraphOp]:
    """Rank 0's collectives, in issue order, in the execution graph of the step `row` measured.
    A pipeline's transfers are left out: batched sends and receives, not traced collectives."""
    if row.op == TRANSFORMER_STEP_OP:
        spec = TransformerSpec.from_dict(row.params["transformer"])
        ops = build_transformer_graph(spec, placement_of(row.params, spec.world_size)).ranks[0]
        return [op for op in ops if op.kind == "collective" and not is_transfer(op)]
    job = JobSpec.from_dict(row.params["job"])
    graph = build_dlrm_graph(job, row.params["table_to_rank"], placement_of(row.params, job.world_size))
    return [op for op in graph.ranks[0] if op.kind == "collective"]


def _matches(collectives: Sequence[Any], step: Sequence[Sequence[Any]]) -> bool:
    return len(collectives) == len(step) and all(
        kind in RUNS_AS.get(op.op, {op.op}) for op, (kind, _) in zip(collectives, step)
    )


def learn_collective_factors(
    model: PerformanceModel, step_rows: Sequence[Measurement], seed: int = 0
) -> dict[str, Any] | None:
    """Each collective op's in-step factor from the collectives of a seeded 80% of `step_rows`
    (one workload's), scored on the other steps' collectives: `borne_out` when, priced with
    them, they add up closer to their measured total than at the isolated prices (the
    baseline). The per-call GMAE is beside. None when no op had enough captured calls. The
    model is left as it is: `predictors.step_fit.fit_steps` decides what it keeps."""
    train, test = split_by_op(step_rows, seed)
    fitted = collective_pairs(model, train)
    learned = ContextFactorModel()
    for op, v in sorted(fitted.items()):
        if len(v) >= MIN_ROWS:
            learned.factors[op], learned.counts[op] = mean_ratio(np.asarray(v)), len(v)
    if not learned.counts:
        return None
    held = [(op, iso, s) for op, v in collective_pairs(model, test).items() for iso, s in v]
    priced = np.asarray([learned.in_step(op, iso) for op, iso, _ in held])
    isolated = np.asarray([iso for _, iso, _ in held])
    measured = np.asarray([s for _, _, s in held])
    stats = error_stats(np.abs(priced - measured) / measured).to_dict()
    stats["baseline_gmae"] = error_stats(np.abs(isolated - measured) / measured).gmae if held else None
    stats["total_error"] = total_error(priced, measured)
    stats["baseline_total_error"] = total_error(isolated, measured)
    stats["n_train"] = sum(len(v) for v in fitted.values())
    stats["factors"], stats["counts"] = dict(learned.factors), dict(learned.counts)
    stats["borne_out"] = bool(held) and stats["total_error"] < stats["baseline_total_error"]
    return stats


def mean_ratio(pairs: np.ndarray) -> float:
    """Summed in-step seconds over summed isolated prices (`pairs`: rows of (isolated,
    in-step)): the factor whose priced total matches the measured total, clipped as every
    in-step factor is."""
    return float(np.clip(pairs[:, 1].sum() / pairs[:, 0].sum(), *CLIP))


def total_error(priced: np.ndarray, measured: np.ndarray) -> float:
    """How far the priced collectives add up from their measured total, relative to it."""
    return float(abs(priced.sum() - measured.sum()) / measured.sum()) if len(measured) else float("nan")
