"""Each workload's step overhead, fitted on the calibration's whole training steps on top of
the kernels' models, with the collectives' in-step factors each workload's own steps bear out:
the last stage of `fit.fit_bundle`, apart from the per-op fits it rests on."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

from predictors.collective_context import learn_collective_factors
from predictors.context_model import ContextFactorModel
from predictors.dlrm_estimator import OVERHEAD_FEATURES as DLRM_OVERHEAD_FEATURES
from predictors.dlrm_estimator import fit_overhead
from predictors.opmodels import SPARE_ROWS
from predictors.performance_model import PerformanceModel
from predictors.transformer_estimator import OVERHEAD_FEATURES as TRANSFORMER_OVERHEAD_FEATURES
from predictors.transformer_estimator import fit_transformer_overhead
from probes.vocabulary.ops import DLRM_STEP_OP, IN_STEP_COLLECTIVE_OP, TRANSFORMER_STEP_OP, task_job
from probes.vocabulary.records import Measurement

MIN_TRANSFORMER_STEPS = 3  # fewer leave one step to fit each left-out one on
STEP_OPS = (DLRM_STEP_OP, TRANSFORMER_STEP_OP)
STEP_WORKLOADS = {DLRM_STEP_OP: "dlrm", TRANSFORMER_STEP_OP: "transformer"}  # whose overhead each fits
STEP_OP_OF = {workload: op for op, workload in STEP_WORKLOADS.items()}
OVERHEAD_FEATURES = {"dlrm": DLRM_OVERHEAD_FEATURES, "transformer": TRANSFORMER_OVERHEAD_FEATURES}
OverheadFeatures = Mapping[str, Sequence[str]]  # workload -> what its step overhead is fitted on
IN_STEP_WORKLOADS = tuple(STEP_WORKLOADS.values())  # whose in-step collective factors may be kept


def fit_steps(
    model: PerformanceModel,
    dlrm_steps: Sequence[Measurement],
    transformer_steps: Sequence[Measurement],
    seed: int,
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
    every_dlrm_step: bool = False,
    in_step_workloads: Collection[str] = IN_STEP_WORKLOADS,
) -> list[Measurement]:
    """Each workload's step overhead, its collectives priced on its own in-step factors where
    its whole steps bear them out. Returns the steps fitted (each judged left out in turn; of
    the DLRM's, those `task_shaped_steps` keeps, so a champion is compared on the same ones).
    `overhead_features`: what each workload's overhead is fitted on (others for a paired
    "before"; a workload not named takes its default). `every_dlrm_step`: the DLRM's on every
    kind of step, not the task-shaped ones alone (a paired "before"). `in_step_workloads`: the
    workloads whose in-step factors are learned and may be kept; the others' collectives are
    priced on the isolated curves whatever their steps say (a paired candidate).

    Each workload's factors are learned from the collectives its own steps captured and
    proposed when the held-out collectives add up closer with them
    (`collective_context.learn_collective_factors`); but the steps, not the collectives, are
    what a plan is chosen on, and they may not bear them out (at the 11-27 13:31 calibration
    of #26 the transformer's steps left out in turn were 15.4% off with a factor learned from
    DLRM steps, 8.1% without). So each workload's overhead is fitted at the isolated prices
    and again on its proposed factors, which it keeps (`ContextFactorModel.by_workload`) only
    when its steps, each left out in turn, come out closer with them (a tie keeps the
    isolated prices). A workload's overhead is fitted on its own steps alone and its factors
    price no other workload's step, so each verdict leaves the other's fit as it is.

    The DLRM's factors and overhead rest on its task-shaped steps (`task_shaped_steps`)."""
    dlrm_features = {**OVERHEAD_FEATURES, **overhead_features}["dlrm"]
    dlrm_fitted = list(dlrm_steps) if every_dlrm_step else task_shaped_steps(dlrm_steps, dlrm_features)
    steps = {"dlrm": dlrm_fitted, "transformer": list(transformer_steps)}
    verdicts: dict[str, dict[str, Any]] = {}
    for workload, rows in steps.items():
        if workload not in in_step_workloads:
            continue
        try:
            learned = learn_collective_factors(model, rows, seed)
        except KeyError as exc:  # a kernel of the steps has no model (a short sweep): nothing to fit on
            if workload == "dlrm":
                _unpriced_steps(model, exc)
                steps["dlrm"] = []
            continue
        if learned:
            verdicts[workload] = learned
    judged = fit_step_overheads(model, steps["dlrm"], steps["transformer"], overhead_features)
    proposed = [w for w, v in verdicts.items() if v["borne_out"] and STEP_OP_OF[w] in model.metrics]
    if proposed:
        _judge_on_steps(model, {w: steps[w] for w in proposed}, {w: verdicts[w] for w in proposed}, overhead_features)
    if verdicts:
        model.metrics[IN_STEP_COLLECTIVE_OP] = {"kept": any(v.get("kept") for v in verdicts.values()), **verdicts}
    if DLRM_STEP_OP in model.metrics:  # of them, how many it was fitted on (`n`)
        model.metrics[DLRM_STEP_OP]["steps_measured"] = len(dlrm_steps)
    return judged


def task_shaped_steps(rows: Sequence[Measurement], features: Sequence[str]) -> list[Measurement]:
    """The DLRM steps its overhead is fitted on: the task-shaped ones (`ops.task_job`, drawn
    like the jobs plans are made for) when there are enough of them for `features`
    (`SPARE_ROWS` beyond one per coefficient), else every step (a short calibration).

    The light and framework steps follow other lines than a task's (at the 11-29 10:39
    calibration of #26: tasks 4.6 ms + 1.19x their kernels, light steps 0.85 ms + 1.95x,
    framework steps -1.0 ms + 4.2x; `benchmarks/step_slope.py`), and one overhead fitted on all
    three priced a task's fixed cost low and its kernels high: small-batch jobs under, large-
    batch ones over. Refitted on 11 stored cycles of #26 on the task steps alone
    (`benchmarks/step_fit_kinds.py`), the runs' batch-128 tasks leaned 5.6 points [2.8, 8.4]
    higher against their run's mean, the batch-1024 ones 4.0 [1.9, 6.0] lower, and the worst
    task of a run fell 5.5 points [1.7, 9.3]. The other steps are measured still; the bundle's
    `dlrm_step` metrics count them (`steps_measured`) beside the steps fitted (`n`)."""
    tasks = [r for r in rows if task_job(r.params["job"])]
    return tasks if len(tasks) >= len(features) + SPARE_ROWS else list(rows)


def _judge_on_steps(
    model: PerformanceModel,
    steps: dict[str, list[Measurement]],
    verdicts: dict[str, dict[str, Any]],
    overhead_features: OverheadFeatures,
) -> None:
    """Refit each proposed workload's overhead on its factors and keep them where its steps,
    each left out in turn, come out closer than at the isolated prices (fitted already)."""
    isolated_overheads = dict(model.step_overheads)
    isolated_scores = {w: model.metrics[STEP_OP_OF[w]] for w in steps}
    before, context = model.in_step, model.in_step if model.in_step is not None else ContextFactorModel()
    for workload, verdict in verdicts.items():
        context.set_workload(workload, verdict["factors"], verdict["counts"])
    model.in_step = context
    fit_step_overheads(model, steps.get("dlrm", []), steps.get("transformer", []), overhead_features)
    for workload, verdict in verdicts.items():
        op = STEP_OP_OF[workload]
        learned, isolated = model.metrics[op]["gmae"], isolated_scores[workload]["gmae"]
        verdict["steps_gmae"], verdict["baseline_steps_gmae"] = learned, isolated
        verdict["kept"] = bool(learned < isolated)
        if not verdict["kept"]:
            context.drop_workload(workload)
            model.step_overheads[workload] = isolated_overheads[workload]
            model.metrics[op] = isolated_scores[workload]
    if before is None and not context.by_workload:
        model.in_step = None  # nothing was kept and the bundle had no in-step factors


def in_step_verdict(stats: dict[str, Any]) -> str:
    """Each workload's in-step collective factors, whether they were kept and on what
    (`fit_steps`): a step model priced on them is a different model, and a reader of a
    drifting step wants to know."""
    verdicts = []
    for workload in STEP_WORKLOADS.values():
        verdict = stats.get(workload)
        if not verdict:
            continue
        factors = ", ".join(f"{op} {f:.2f}x" for op, f in sorted(verdict["factors"].items()))
        if "kept" in verdict:
            verdicts.append(
                f"{workload} ({factors}) {'kept' if verdict['kept'] else 'dropped'}: its steps left out in turn "
                f"{verdict['steps_gmae']:.1%} with them, {verdict['baseline_steps_gmae']:.1%} without"
            )
        else:  # the collectives' totals did not bear them out: no step was priced on them
            verdicts.append(
                f"{workload} ({factors}) dropped: held-out collectives' total off by "
                f"{verdict['total_error']:.1%} with them, {verdict['baseline_total_error']:.1%} at isolated prices"
            )
    return "in-step collective factors: " + "; ".join(verdicts)


def fit_step_overheads(
    model: PerformanceModel,
    dlrm_steps: Sequence[Measurement],
    transformer_steps: Sequence[Measurement],
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
) -> list[Measurement]:
    """Each workload's step overhead on the model's prices as they stand; the steps judged."""
    features = {**OVERHEAD_FEATURES, **overhead_features}
    judged: list[Measurement] = []
    if dlrm_steps:
        try:
            judged += fit_overhead(model, dlrm_steps, features=features["dlrm"])
        except KeyError as exc:
            _unpriced_steps(model, exc)
    if len(transformer_steps) >= MIN_TRANSFORMER_STEPS:
        judged += fit_transformer_overhead(model, transformer_steps, features["transformer"])
    return judged


def _unpriced_steps(model: PerformanceModel, exc: KeyError) -> None:
    """The DLRM steps left unfitted: a kernel of theirs has no model (a short sweep)."""
    model.meta["unfitted"][DLRM_STEP_OP] = f"its steps' kernels cannot be priced: no model for {exc.args[0]}"
