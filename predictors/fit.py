"""Rows -> bundle: every fit of a calibration in one place.

`fit_bundle` turns the measured rows of a calibration into a `PerformanceModel`: the per-op
kernel and collective models first (each on a seeded train / held-out split), then what is
fitted on top of them: the in-step factors of kernels inside captured training steps, each
workload's per-step overhead (the residual of its measured steps over the simulated kernels),
the overlapped pairs' costs and the symmetric-memory kernels' ratios, and the HFTA fusion
curves. The held-out rows it returns score the bundle against a champion on the same data.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from predictors.collective_context import fit_collective_context
from predictors.context_model import fit_context_factors
from predictors.dlrm_estimator import fit_overhead
from predictors.evaluation import error_stats, paired_ratio, relative_errors, split_by_op
from predictors.families import baseline_model_for, default_model_for
from predictors.fusion_model import FusionModel, FusionModelError, fusion_points, held_out_errors
from predictors.opmodels import OpModel
from predictors.overhead_model import OverheadModel
from predictors.pair_estimator import fit_overlap_calibration, fit_symm_mem
from predictors.performance_model import PerformanceModel, priced
from predictors.transformer_estimator import fit_transformer_overhead
from probes.vocabulary.nccl import NCCL_CHOICE_FAMILY
from probes.vocabulary.ops import (
    CPU_OVERHEAD_OP,
    DLRM_STEP_OP,
    FUSION_OP,
    IN_CONTEXT_OP,
    PAIR_OP,
    SYMM_MEM_OP,
    TRANSFER_OP,
    TRANSFORMER_STEP_OP,
)
from probes.vocabulary.records import Measurement

# Rows that are not one kernel's time: whole steps, kernels inside steps, pairs, fused models.
COMPOSITE_OPS = (DLRM_STEP_OP, TRANSFORMER_STEP_OP, IN_CONTEXT_OP, PAIR_OP, TRANSFER_OP, SYMM_MEM_OP, FUSION_OP)
MIN_TRANSFORMER_STEPS = 3  # fewer leave one step to fit each left-out one on


def kernel_rows(rows: Sequence[Measurement]) -> list[Measurement]:
    """The rows per-op models are fitted on (one kernel, collective or dispatch each). A
    collective timed under a forced NCCL algorithm and protocol is not what a job gets (NCCL's
    own choice): those rows make the tuner CSV (`policies.nccl_tuner`), not a model."""
    return [r for r in rows if r.op not in COMPOSITE_OPS and r.family != NCCL_CHOICE_FAMILY]


def fit_bundle(
    rows: Sequence[Measurement],
    hardware_id: str,
    seed: int = 0,
    device_kind: str = "cpu",
    sentinels: Sequence[dict[str, Any]] = (),
) -> tuple[PerformanceModel, list[Measurement]]:
    """The bundle of everything `rows` can fit, and its held-out rows: kernel rows of every op,
    and every whole step of each workload (fitted on, and judged each left out in turn: those
    scores are in `metrics`, `registry.left_out_scores`). A part without rows is left empty; an
    op with too few rows is listed in `meta["unfitted"]` with the reason."""
    model, held_out = fit_performance_model(kernel_rows(rows), hardware_id, seed=seed)
    model.device_kind, model.sentinels = device_kind, list(sentinels)
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        by_op[r.op].append(r)
    if by_op[IN_CONTEXT_OP]:  # its held-out rows score kernels in context, not the bundle's ops
        fit_context_factors(model, by_op[IN_CONTEXT_OP], seed=seed)
    if by_op[DLRM_STEP_OP]:
        try:
            fit_collective_context(model, by_op[DLRM_STEP_OP], seed=seed)  # before the overhead: its kernels
            held_out += fit_overhead(model, by_op[DLRM_STEP_OP])
        except KeyError as exc:  # a kernel of the steps has no model (a short sweep): nothing to fit on
            model.meta["unfitted"][DLRM_STEP_OP] = f"its steps' kernels cannot be priced: no model for {exc.args[0]}"
    if len(by_op[TRANSFORMER_STEP_OP]) >= MIN_TRANSFORMER_STEPS:
        held_out += fit_transformer_overhead(model, by_op[TRANSFORMER_STEP_OP])
    model.symm_mem = fit_symm_mem(by_op[PAIR_OP] + by_op[SYMM_MEM_OP])
    if by_op[PAIR_OP] or by_op[TRANSFER_OP]:  # fitted on the bundle's own kernel and collective models
        model.overlap = fit_overlap_calibration(model, by_op[PAIR_OP] + by_op[TRANSFER_OP])
    if by_op[FUSION_OP]:
        fit_fusion(model, by_op[FUSION_OP])
    return model, held_out


def fit_fusion(model: PerformanceModel, rows: Sequence[Measurement]) -> None:
    """The fusion curve of every workload measured at three widths or more, and its held-out
    error (`metrics["fused_training/<workload>"]`: each interior width left out in turn, beside
    a power law's). A workload with fewer widths is listed in `meta["unfitted"]`."""
    for (workload, batch_size, optimizer), points in sorted(fusion_points(rows).items()):
        try:
            model.fusion[workload] = FusionModel.fit(workload, batch_size, optimizer, points)
        except FusionModelError as exc:
            model.meta.setdefault("unfitted", {})[f"{FUSION_OP}/{workload}"] = str(exc)
            continue
        errors, baseline = held_out_errors(points)
        stats = error_stats(errors).to_dict()
        stats["baseline_gmae"] = error_stats(baseline).gmae if len(baseline) else None
        stats["fit_gmae"] = model.fusion[workload].fit_gmae
        stats["widths"] = sorted({p.width for p in points})
        model.metrics[f"{FUSION_OP}/{workload}"] = stats


def family_heldout(paired: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> dict[str, dict[str, Any]]:
    """Per op family (collectives, element-wise, embeddings, GEMM, memcpy), the held-out rows of
    all its ops pooled: the model's GMAE and its baseline's on the same rows, with the count and
    the paired ratio's interval. An op holds out 6-9 rows in a short calibration, too few to
    tell a model from its baseline; its family holds out 50-140."""
    out: dict[str, dict[str, Any]] = {}
    for family, pairs in sorted(paired.items()):
        errors, baseline_errors = (np.concatenate([p[i] for p in pairs]) for i in (0, 1))
        stats = error_stats(errors).to_dict()
        stats["baseline_gmae"] = error_stats(baseline_errors).gmae
        stats["vs_baseline"] = paired_ratio(errors, baseline_errors).to_dict()
        out[family] = stats
    return out


def fit_op(
    op: str, train: Sequence[Measurement], test: Sequence[Measurement], seed: int = 0
) -> tuple[OpModel, dict[str, Any], tuple[str, np.ndarray, np.ndarray] | None]:
    """One op's model fitted on `train` (raises ValueError / KeyError when it cannot be), its
    held-out stats on `test` beside its baseline's, and the paired (family, model errors,
    baseline errors) on the rows both can price (None when there are none)."""
    model = default_model_for(op, seed).fit(train)
    held_out = priced(model, test)
    stats = error_stats(relative_errors(model.predict, held_out)).to_dict()
    stats["n_unpriced"] = len(test) - len(held_out)  # held-out rows of a group no training row had
    scored = None
    baseline = baseline_model_for(op)
    if baseline is not None and held_out:
        try:
            baseline.fit(train)
            both = priced(baseline, held_out)
            pair = relative_errors(model.predict, both), relative_errors(baseline.predict, both)
            stats["baseline_gmae"] = error_stats(pair[1]).gmae
            if both:
                stats["vs_baseline"] = paired_ratio(*pair).to_dict()
                scored = (both[0].family or op, *pair)
        except (ValueError, KeyError):
            stats["baseline_gmae"] = None
    stats["n_train"] = len(train)
    stats["chosen"] = getattr(model, "chosen", None)  # a learned model's pick: a correction, its base, the baseline
    return model, stats, scored


def fit_performance_model(
    rows: Sequence[Measurement], hardware_id: str, seed: int = 0, test_fraction: float = 0.2
) -> tuple[PerformanceModel, list[Measurement]]:
    """Fit every measured kernel and collective op (and the host dispatch cost) on a seeded
    split; return the bundle and the held-out rows.

    The registered bundle is the one fitted on the training split, so the metrics it carries
    describe exactly the model that is used.
    """
    train, test = split_by_op(rows, seed, test_fraction)
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in train:
        by_op[r.op].append(r)
    test_by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in test:
        test_by_op[r.op].append(r)

    models: dict[str, OpModel] = {}
    metrics: dict[str, dict[str, Any]] = {}
    unfitted: dict[str, str] = {}
    paired: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)  # family -> (model, baseline) errors
    for op, op_rows in sorted(by_op.items()):
        try:
            model, stats, scored = fit_op(op, op_rows, test_by_op[op], seed)
        except (ValueError, KeyError) as exc:  # too few or degenerate rows: report the op, keep the rest
            unfitted[op] = f"{len(op_rows)} training rows: {exc}"
            continue
        models[op], metrics[op] = model, stats
        if scored is not None:
            family, errors, baseline_errors = scored
            paired[family].append((errors, baseline_errors))
    meta = {
        "seed": seed,
        "test_fraction": test_fraction,
        "n_rows": len(rows),
        "unfitted": unfitted,
        "family_heldout": family_heldout(paired),
    }
    dispatch = models.pop(CPU_OVERHEAD_OP, None)
    assert dispatch is None or isinstance(dispatch, OverheadModel)  # default_model_for's family for it
    return PerformanceModel(hardware_id, models, metrics, meta, dispatch=dispatch), test
