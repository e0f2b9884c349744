"""Which earlier calibrations of the same hardware lend their whole steps to a new
calibration's step fit.

Why pool: a calibration measures a couple of dozen whole steps per workload, and the step
overhead fitted on them takes its level from that handful of jobs and the spell they ran in.
In #26 three calibrations of one host within three hours priced the same measured steps
10-14% apart, each within its interval of zero on its own steps
(`benchmarks/step_drift_cross.py`), more than the +-5% a run's mean signed error may lean.
The same hardware's earlier calibrations measured other jobs in other spells; the step fit on
all of them averages both out (`benchmarks/pooled_steps.py`). Judged again on 22 stored #26
cycles of two hosts (12-07, README), pooled against own steps: the transformer's data-parallel
runs met every bar in 14 of 22 against 7 (mean |signed| -1.6 points [-2.9, -0.4]), the DLRM's
in 11 against 12 (-0.2 [-1.7, +1.4]): neither worse, so it stays on.

Why not every one: steps measured on other software, or on hardware that has since changed
speed, describe another machine. An earlier calibration lends its steps only when its software
is the new one's and its kernels ran at the new calibration's speed: a sample of its kernel
rows, priced by the new kernel models, measured within `SPEED_BOUND` of what the new
calibration's own rows measured against the same models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Collection, Sequence

import numpy as np

from predictors.evaluation import geomean
from predictors.performance_model import PerformanceModel
from predictors.step_fit import IN_STEP_WORKLOADS, OVERHEAD_FEATURES, STEP_OPS, OverheadFeatures, fit_steps
from probes.vocabulary.nccl import NCCL_CHOICE_FAMILY
from probes.vocabulary.ops import DLRM_STEP_OP, TRANSFORMER_STEP_OP
from probes.vocabulary.records import Measurement

EARLIER_CALIBRATIONS = 3  # the newest earlier calibrations of the hardware considered
# Beyond this ratio of kernel speeds (either way) an earlier calibration measured another
# machine: a host or device throttled, clocked or shared that much moves every step with it.
SPEED_BOUND = 1.10
SPEED_SAMPLE = 400  # kernel rows priced per calibration (evenly spaced): enough for a geomean


@dataclass
class EarlierCalibration:
    """An earlier calibration of the hardware, as its store kept it."""

    label: str  # where it came from (an MLflow run, a directory), for the record
    rows: list[Measurement]
    software: dict[str, str] = field(default_factory=dict)


@dataclass
class StepHistory:
    """What a calibration's step fit may pool: the earlier calibrations of its hardware, and
    its own software (theirs must be the same)."""

    software: dict[str, str]
    calibrations: list[EarlierCalibration]


@dataclass
class PoolVerdict:
    """Whether an earlier calibration's steps were pooled, and on what."""

    label: str
    steps: int
    pooled: bool
    why: str
    speed: float | None = None  # its kernels' time over the new calibration's, same models
    kernel_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_speed(model: PerformanceModel, rows: Sequence[Measurement], sample: int = SPEED_SAMPLE) -> tuple[float, int]:
    """Geomean of measured over predicted time over up to `sample` of `rows` (evenly spaced)
    that `model` prices, and how many it priced. A collective timed under a forced NCCL
    algorithm is not what the model prices (NCCL's own choice): never compared."""
    priced = [r for r in rows if r.op in model.models and r.median_s > 0 and r.family != NCCL_CHOICE_FAMILY]
    if len(priced) > sample:
        priced = [priced[int(i)] for i in np.linspace(0, len(priced) - 1, sample)]
    ratios = []
    for row in priced:
        try:
            predicted = model.predict_params(row.op, row.params)
        except (KeyError, TypeError, ValueError):  # a point this model cannot price (rows of older code)
            continue
        if predicted > 0 and np.isfinite(predicted):
            ratios.append(row.median_s / predicted)
    if not ratios:
        return float("nan"), 0
    return geomean(ratios), len(ratios)


def at_speed(step: Measurement, speed: float) -> Measurement:
    """A lent step as this calibration would have timed it: its times (the whole step, its
    spread, the collectives it captured) over `speed`, its calibration's kernel time over this
    one's. On a shared host the whole process slows, not the kernels alone."""
    params = dict(step.params)
    if params.get("in_step_collectives"):
        params["in_step_collectives"] = [
            [[kind, seconds / speed] for kind, seconds in captured] for captured in params["in_step_collectives"]
        ]
    return replace(step, params=params, median_s=step.median_s / speed, spread_s=step.spread_s / speed)


def pool_steps(
    model: PerformanceModel,
    own_kernels: Sequence[Measurement],
    history: StepHistory,
    bound: float = SPEED_BOUND,
    rescale_lent: bool = False,
) -> tuple[list[Measurement], list[PoolVerdict]]:
    """The whole steps of the `history`'s calibrations that measured this machine (its
    software, its kernels within `bound` of `own_kernels`' speed under `model`, the bundle's
    kernel models fitted on them) and a verdict on each earlier calibration. `rescale_lent`: each
    lent step taken at this calibration's speed (`at_speed`), not as its own calibration
    timed it (a candidate: within the bound a lender can still run 10% off, and its steps move
    the fitted level with them)."""
    own_speed, own_points = kernel_speed(model, own_kernels)
    software = history.software
    pooled: list[Measurement] = []
    verdicts = []
    for calibration in history.calibrations:
        steps = [r for r in calibration.rows if r.op in STEP_OPS]
        verdict = PoolVerdict(calibration.label, len(steps), False, "")
        if not steps:
            verdict.why = "no whole steps"
        elif calibration.software != software:
            changed = sorted(
                k for k in set(software) | set(calibration.software) if software.get(k) != calibration.software.get(k)
            )
            verdict.why = f"other software ({', '.join(changed)})"
        else:
            speed, points = kernel_speed(model, [r for r in calibration.rows if r.op not in STEP_OPS])
            verdict.kernel_rows = points
            if not points or not own_points:
                verdict.why = "no kernel rows to compare speeds on"
            else:
                verdict.speed = speed / own_speed
                if max(verdict.speed, 1 / verdict.speed) > bound:
                    verdict.why = f"its kernels ran {verdict.speed:.2f}x this calibration's (bound {bound:.2f}x)"
                else:
                    verdict.pooled, verdict.why = True, f"same software, kernels at {verdict.speed:.3f}x"
                    if rescale_lent:
                        verdict.why += ", its steps taken at this calibration's speed"
                        steps = [at_speed(step, verdict.speed) for step in steps]
                    pooled += steps
        verdicts.append(verdict)
    return pooled, verdicts


def fit_pooled_steps(
    model: PerformanceModel,
    own_steps: Sequence[Measurement],
    own_kernels: Sequence[Measurement],
    history: StepHistory | None,
    seed: int,
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
    every_dlrm_step: bool = False,
    in_step_workloads: Collection[str] = IN_STEP_WORKLOADS,
    rescale_lent: bool = False,
) -> list[Measurement]:
    """`step_fit.fit_steps` on this calibration's whole steps and those its `history` lends
    (`pool_steps`, each lent step at this calibration's speed where `rescale_lent`; the
    verdicts in `meta["pooled_steps"]`). Returns this calibration's own steps, judged: a
    champion is compared on rows it never saw, and it fitted the lent ones."""
    lent: list[Measurement] = []
    if history is not None and history.calibrations:
        lent, verdicts = pool_steps(model, own_kernels, history, rescale_lent=rescale_lent)
        model.meta["pooled_steps"] = [v.to_dict() for v in verdicts]
    steps = list(own_steps) + lent
    borrowed = {id(r) for r in lent}
    fitted = fit_steps(
        model,
        [r for r in steps if r.op == DLRM_STEP_OP],
        [r for r in steps if r.op == TRANSFORMER_STEP_OP],
        seed,
        overhead_features,
        every_dlrm_step,
        in_step_workloads,
    )
    return [r for r in fitted if id(r) not in borrowed]
