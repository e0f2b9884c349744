"""Rows -> bundle: every fit of a calibration in one place.

`fit_bundle` turns the measured rows of a calibration into a `PerformanceModel`: the per-op
kernel and collective models first (each on all its rows, judged by 5-fold cross-validation),
then what is fitted on top of them (`fit_below_steps`): the in-step factors of kernels inside
captured training steps, the overlapped pairs' costs and the symmetric-memory kernels' ratios,
and the HFTA fusion curves; last, each workload's per-step overhead (`fit_step_stage`: the
residual of its measured steps over the simulated kernels, `step_fit.fit_steps`). The rows it
returns (each judged out of its fold) score a champion on the same data.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import numpy as np

from predictors.context_model import fit_context_factors
from predictors.evaluation import CV_FOLDS, error_stats, fold_assignment, paired_ratio
from predictors.families import baseline_model_for, default_model_for
from predictors.fit_pool import WHOLE, FitFailure, Mapper, fold_ids, in_process, op_tasks, run_task, worker_pool
from predictors.fusion_model import FusionModel, FusionModelError, fusion_points, held_out_errors
from predictors.opmodels import OpModel
from predictors.overhead_model import OverheadModel
from predictors.pair_estimator import fit_overlap_calibration, fit_symm_mem
from predictors.performance_model import PerformanceModel, predictions
from predictors.step_fit import IN_STEP_WORKLOADS, OVERHEAD_FEATURES, OverheadFeatures
from predictors.step_pool import StepHistory, fit_pooled_steps
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
    on_op: Callable[[str, bool], None] | None = None,
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
    history: StepHistory | None = None,
) -> tuple[PerformanceModel, list[Measurement]]:
    """The bundle of everything `rows` can fit, and the rows it was judged on: kernel rows of
    every op (fitted on, and judged out of their fold) and every whole step of each workload
    (fitted on, and judged each left out in turn): those scores are in `metrics`
    (`registry.left_out_scores`). A part without rows is left empty; an op with too few rows
    is listed in `meta["unfitted"]` with the reason. `on_op(op, fitted)`: after each kernel op
    (`fit_performance_model`). `overhead_features`: what each workload's step overhead is
    fitted on (others, for a benchmark's paired "before"). `history`:
    the hardware's earlier calibrations, whose whole steps the step fit pools with these where
    they measured this machine (`step_pool.pool_steps`; the verdicts in `meta["pooled_steps"]`);
    the rows returned are this calibration's own, so a champion is compared on what it never saw."""
    model, judged = fit_below_steps(rows, hardware_id, seed, device_kind, sentinels, on_op)
    judged += fit_step_stage(model, rows, seed, overhead_features, history)
    return model, judged


def fit_step_stage(
    model: PerformanceModel,
    rows: Sequence[Measurement],
    seed: int = 0,
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
    history: StepHistory | None = None,
    every_dlrm_step: bool = False,
    in_step_workloads: Collection[str] = IN_STEP_WORKLOADS,
) -> list[Measurement]:
    """The last stage of `fit_bundle`: each workload's step overhead over `rows`' whole steps,
    on a `model` that has every other part (`fit_below_steps`). Apart, so that a benchmark
    can refit the steps on other features, or the DLRM's on every kind of step
    (`every_dlrm_step`), or with a workload's in-step factors never kept (`in_step_workloads`
    leaving it out), without refitting every kernel (`benchmarks/overhead_feature_refit.py`,
    `benchmarks/step_fit_kinds.py`). Returns the calibration's own steps, judged."""
    steps = [r for r in rows if r.op in (DLRM_STEP_OP, TRANSFORMER_STEP_OP)]
    return fit_pooled_steps(
        model, steps, kernel_rows(rows), history, seed, overhead_features, every_dlrm_step, in_step_workloads
    )


def fit_below_steps(
    rows: Sequence[Measurement],
    hardware_id: str,
    seed: int = 0,
    device_kind: str = "cpu",
    sentinels: Sequence[dict[str, Any]] = (),
    on_op: Callable[[str, bool], None] | None = None,
) -> tuple[PerformanceModel, list[Measurement]]:
    """`fit_bundle` but for the step overheads: the kernels' models, the in-step factors, the
    pairs' and symmetric-memory costs and the fusion curves (none of which reads a step's
    overhead), and the kernel rows judged."""
    kernels = kernel_rows(rows)
    model, judged = fit_performance_model(kernels, hardware_id, seed=seed, on_op=on_op)
    model.device_kind, model.sentinels = device_kind, list(sentinels)
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        by_op[r.op].append(r)
    if by_op[IN_CONTEXT_OP]:  # its held-out rows score kernels in context, not the bundle's ops
        fit_context_factors(model, by_op[IN_CONTEXT_OP], seed=seed)
    model.symm_mem = fit_symm_mem(by_op[PAIR_OP] + by_op[SYMM_MEM_OP])
    if by_op[PAIR_OP] or by_op[TRANSFER_OP]:  # fitted on the bundle's own kernel and collective models
        model.overlap = fit_overlap_calibration(model, by_op[PAIR_OP] + by_op[TRANSFER_OP])
    if by_op[FUSION_OP]:
        fit_fusion(model, by_op[FUSION_OP])
    return model, judged


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


@dataclass
class OpFit:
    """One op's model and how it was judged: on held-out rows (`fit_op`), or fold by fold with
    the model refitted on all rows (`cross_validate_op`)."""

    model: OpModel
    stats: dict[str, Any]  # held-out error beside the baseline's, n = rows judged
    scored: tuple[str, np.ndarray, np.ndarray] | None  # (family, model errors, baseline errors)
    held_out: list[tuple[float, float]]  # (measured, predicted) of every row judged


def fit_op(op: str, train: Sequence[Measurement], test: Sequence[Measurement], seed: int = 0) -> OpFit:
    """One op's model fitted on `train` (raises ValueError / KeyError when it cannot be), its
    held-out stats on `test` beside its baseline's, and the paired (family, model errors,
    baseline errors) on the rows both can price (`scored`, None when there are none). Each
    held-out row is predicted once by each model."""
    model = default_model_for(op, seed).fit(train)
    held_out = predictions(model, test)
    errors = np.array([abs(p - r.median_s) / r.median_s for r, p in held_out])
    stats = error_stats(errors).to_dict()
    stats["n_unpriced"] = len(test) - len(held_out)  # held-out rows of a group no training row had
    scored = None
    baseline = baseline_model_for(op)
    if baseline is not None and held_out:
        try:
            baseline.fit(train)
            both = predictions(baseline, [r for r, _ in held_out])
            error_of = {id(r): e for (r, _), e in zip(held_out, errors)}  # a row's error, whichever model priced it
            pair = (
                np.array([error_of[id(r)] for r, _ in both]),
                np.array([abs(p - r.median_s) / r.median_s for r, p in both]),
            )
            stats["baseline_gmae"] = error_stats(pair[1]).gmae
            if both:
                stats["vs_baseline"] = paired_ratio(*pair).to_dict()
                scored = (both[0][0].family or op, *pair)
        except (ValueError, KeyError):
            stats["baseline_gmae"] = None
    stats["n_train"] = len(train)
    stats["chosen"] = getattr(model, "chosen", None)  # a learned model's pick: a correction, its base, the baseline
    return OpFit(model, stats, scored, [(r.median_s, p) for r, p in held_out])


def fold_pick(pick: dict[str, Any]) -> str:
    """One judge fold's choice and its held-out error against the baseline's ("base 1.60x")."""
    ratio = pick.get("vs_baseline")
    shown = f" {ratio:.2f}x" if ratio is not None and math.isfinite(ratio) else ""
    return f"{pick['chosen']}{shown}"


def cross_validate_op(op: str, rows: Sequence[Measurement], folds: np.ndarray, seed: int = 0) -> OpFit:
    """The op's model fitted on all of `rows` (raises ValueError when it cannot be), and judged
    by k-fold cross-validation: each fold (`folds[i]` is row i's, -1 for none) is predicted by
    the model and by its baseline fitted on the other folds (`fit_op`), and the errors of every
    fold are pooled. A seeded 20% split held out 6-9 rows of an op, and which rows it drew
    could put a model on either side of its baseline (#26: a collective family at 7.0% against
    6.7% on one draw, 7.6% against 8.0% over all rows); each row judged once holds out all of
    them. A fold that cannot be fitted (a group only it has) leaves its rows unpriced. Its fits
    run here, one after another; `fit_performance_model` spreads every op's over a pool."""
    done = in_process(run_task, op_tasks(op, rows, folds, seed))
    return judged_op(op, rows, folds, {task.fold: result for task, result in done})


def judged_op(op: str, rows: Sequence[Measurement], folds: np.ndarray, results: dict[int, Any]) -> OpFit:
    """An op's `OpFit` from its fit tasks' results (`fit_pool.op_tasks`, by fold: WHOLE is
    the model on every row), assembled fold by fold in order wherever each ran."""
    whole = results[WHOLE]
    if isinstance(whole, FitFailure) and not whole.unexpected:  # unfitted, whatever its folds did
        raise ValueError(whole.message)
    for failure in results.values():
        if isinstance(failure, FitFailure) and failure.unexpected:
            raise RuntimeError(f"{op}: a fit failed unexpectedly: {failure.message}")
    errors: list[np.ndarray] = []
    paired: list[tuple[np.ndarray, np.ndarray]] = []
    out_of_fold: list[tuple[float, float]] = []
    unpriced, family = 0, None
    picks: list[dict[str, Any]] = []  # each fold's choice and how it held out
    for fold in fold_ids(folds):
        fold_fit = results[fold]
        if isinstance(fold_fit, FitFailure):
            unpriced += int(np.sum(folds == fold))
            continue
        unpriced += fold_fit.stats["n_unpriced"]
        pick = getattr(fold_fit.model, "chosen", None)
        if pick:
            ratio = fold_fit.stats.get("vs_baseline", {}).get("ratio")
            picks.append({"chosen": pick, "n": len(fold_fit.held_out), "vs_baseline": ratio})
        errors.append(np.array([abs(p - m) / m for m, p in fold_fit.held_out]))
        out_of_fold += fold_fit.held_out
        if fold_fit.scored is not None:
            family = fold_fit.scored[0]
            paired.append(fold_fit.scored[1:])
    stats = error_stats(np.concatenate(errors) if errors else np.array([])).to_dict()
    stats.update(judged=f"{int(folds.max()) + 1}-fold" if len(folds) and folds.max() >= 0 else None)
    stats.update(n_unpriced=unpriced, n_train=len(rows), chosen=getattr(whole, "chosen", None))
    if picks:  # a learned model: which candidate each fold's model took, where the figure comes from
        stats["fold_picks"] = picks
    scored = None
    if paired:
        model_errors, baseline_errors = (np.concatenate([p[i] for p in paired]) for i in (0, 1))
        stats["baseline_gmae"] = error_stats(baseline_errors).gmae
        stats["vs_baseline"] = paired_ratio(model_errors, baseline_errors).to_dict()
        scored = (family or op, model_errors, baseline_errors)
    return OpFit(whole, stats, scored, out_of_fold)


def fit_performance_model(
    rows: Sequence[Measurement],
    hardware_id: str,
    seed: int = 0,
    folds: int = CV_FOLDS,
    on_op: Callable[[str, bool], None] | None = None,
    mapper: Mapper | None = None,
) -> tuple[PerformanceModel, list[Measurement]]:
    """Fit every measured kernel and collective op (and the host dispatch cost) on all its
    rows, judge each by `folds`-fold cross-validation (`judged_op` over its fit tasks), and return the
    bundle and the rows it was judged on (every row of an op with 3 or more).

    The registered bundle is fitted on every row; its metrics are the out-of-fold figures
    (`judged: "5-fold"`), what a refit on 80% of the rows scores on the other 20%, each row
    once. A champion is compared on the same rows by those figures
    (`orchestrator.registry.left_out_scores`), not by re-predicting rows the bundle saw.
    `on_op(op, fitted)` after each op (`fitted` False for one listed as unfitted): a calibration's
    fit takes minutes (a collective curve's breakpoints are searched by nested CV in every
    fold), and says how far it has come. `mapper`: where the fits run (`fit_pool`; default a
    pool of this machine's cores): the bundle is the same wherever they ran.
    """
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        by_op[r.op].append(r)
    rng = np.random.default_rng(seed)
    models: dict[str, OpModel] = {}
    metrics: dict[str, dict[str, Any]] = {}
    unfitted: dict[str, str] = {}
    judged: list[Measurement] = []
    out_of_fold: dict[str, list[tuple[float, float]]] = {}
    paired: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)  # family -> (model, baseline) errors
    assignments = {op: fold_assignment(len(op_rows), rng, folds) for op, op_rows in sorted(by_op.items())}
    results = run_fits(by_op, assignments, seed, mapper or worker_pool(), on_op)
    for op, op_rows in sorted(by_op.items()):
        assignment = assignments[op]
        try:
            fitted = judged_op(op, op_rows, assignment, results[op])
        except ValueError as exc:  # too few or degenerate rows: report the op, keep the rest
            unfitted[op] = f"{len(op_rows)} rows: {exc}"
            continue
        models[op], metrics[op], out_of_fold[op] = fitted.model, fitted.stats, fitted.held_out
        judged += [r for r, f in zip(op_rows, assignment) if f >= 0]
        if fitted.scored is not None:
            family, errors, baseline_errors = fitted.scored
            paired[family].append((errors, baseline_errors))
    meta = {
        "seed": seed,
        "folds": folds,
        "n_rows": len(rows),
        "unfitted": unfitted,
        "family_heldout": family_heldout(paired),
    }
    dispatch = models.pop(CPU_OVERHEAD_OP, None)
    assert dispatch is None or isinstance(dispatch, OverheadModel)  # default_model_for's family for it
    model = PerformanceModel(hardware_id, models, metrics, meta, dispatch=dispatch)
    model.out_of_fold = out_of_fold
    return model, judged


def run_fits(
    by_op: dict[str, list[Measurement]],
    assignments: dict[str, np.ndarray],
    seed: int,
    mapper: Mapper,
    on_op: Callable[[str, bool], None] | None,
) -> dict[str, dict[int, Any]]:
    """Every op's fit tasks (`fit_pool.op_tasks`) through `mapper`: each op's results by fold.
    `on_op(op, fitted)` once all of an op's tasks are in, in whatever order they end."""
    tasks = [t for op, op_rows in sorted(by_op.items()) for t in op_tasks(op, op_rows, assignments[op], seed)]
    left = Counter(t.op for t in tasks)
    results: dict[str, dict[int, Any]] = defaultdict(dict)
    for task, result in mapper(run_task, tasks):
        results[task.op][task.fold] = result
        left[task.op] -= 1
        if on_op is not None and not left[task.op]:
            on_op(task.op, not isinstance(results[task.op][WHOLE], FitFailure))
    return results
