"""The calibration's own training steps timed again at labelled moments of an e2e benchmark, and
priced by the champion: whether a run's lean is the host's or the jobs'.

The host checks (`e2e_accuracy.HostChecks`) re-measure kernel points one rank at a time; a
two-rank step on a 2-vCPU VM can run 10-30% apart from one spell to the next while those
checks stay within 5% (#26, 11-29 20:20: the 15:33 calibration's table-wise task steps ran
1.09x their stored times, one of them 1.29x; 2 h after that calibration they had run 1.009x).
So a run's mean signed error mixes the host's spell against the calibration's with the model's
error on jobs it never saw. Timing a few of the calibration's own steps of the run's kind
beside the run's tasks separates them: the champion's signed error on its own steps as stored
is its fit's own lean on such steps (a fit over a calibration whose host drifted leaves one:
#26, 11-29 20:22, +12% on the data-parallel transformer stacks), the change from there to its
error on them now is the host's spell, and what the run's tasks lean beyond it is the jobs'.
The steps are those like the run's tasks (`OWN_STEPS`): a DLRM run's are the table-wise
task-shaped steps, a transformer run's the data-parallel float32 stacks.

Each check forms a probe gang, times the steps as the calibration's training phase does
(`launch_vs_probe.gang_step_s`) and hands the devices back before the next task is launched.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.launch_vs_probe import formed_gang, gang_step_s
from benchmarks.refit_e2e import read_rows
from predictors.dlrm_estimator import estimate_step
from predictors.performance_model import PerformanceModel
from predictors.transformer_estimator import estimate_transformer_iteration
from probes.training import table_wise_task
from probes.vocabulary.ops import DLRM_STEP_OP, TRANSFORMER_STEP_OP
from probes.vocabulary.placement import placement_of
from probes.vocabulary.records import Measurement
from probes.vocabulary.transformer_spec import TransformerSpec


@dataclass(frozen=True)
class OwnSteps:
    """One workload's steps as a check needs them: which stored rows are like the run's tasks,
    a step's name, what a training probe takes to run it again, and the champion's price."""

    op: str
    like_tasks: Callable[[Measurement], bool]
    name: Callable[[Measurement], str]
    probe_params: Callable[[Measurement], dict[str, Any]]
    price_s: Callable[[PerformanceModel, Measurement], float]


def _data_parallel_float32(row: Measurement) -> bool:
    spec = TransformerSpec.from_dict(row.params["transformer"])
    return spec.layout == f"dp{spec.world_size}-tp1-pp1-mb1" and spec.dtype == "float32"


def _transformer_price_s(model: PerformanceModel, row: Measurement) -> float:
    spec = TransformerSpec.from_dict(row.params["transformer"])
    return estimate_transformer_iteration(spec, model, placement=placement_of(row.params, spec.world_size)).iteration_s


OWN_STEPS = {
    "dlrm": OwnSteps(
        DLRM_STEP_OP,
        table_wise_task,
        lambda row: str(row.params["job"]["name"]),
        lambda row: {"job": row.params["job"], "table_to_rank": row.params["table_to_rank"]},
        lambda model, row: estimate_step(model, row, include_overhead=True, simulate_graph=True).iteration_s,
    ),
    "transformer": OwnSteps(
        TRANSFORMER_STEP_OP,
        _data_parallel_float32,
        lambda row: str(row.params["transformer"]["name"]),
        lambda row: {"transformer": row.params["transformer"]},
        _transformer_price_s,
    ),
}


def own_steps(directory: Path, workload: str, count: int | None = None) -> list[Measurement]:
    """Up to `count` (None: all) of the calibration's steps of `workload` that are like its
    run's tasks (`OWN_STEPS`; a step timed again after a failure once, its last row), spread
    over their sizes: sorted by stored time and taken at even intervals from the shortest to
    the longest (one: the middle one). ValueError when it stores none."""
    kind = OWN_STEPS[workload]
    rows = read_rows(directory / "measurements.jsonl")
    steps = list({kind.name(r): r for r in rows if r.op == kind.op and kind.like_tasks(r)}.values())
    if not steps:
        raise ValueError(f"no {kind.op} rows like the {workload} benchmark's tasks in {directory}")
    steps.sort(key=lambda r: (r.median_s, kind.name(r)))
    if count is None or count >= len(steps):
        return steps
    if count == 1:
        return [steps[len(steps) // 2]]
    return [steps[round(k * (len(steps) - 1) / (count - 1))] for k in range(count)]


class StepChecks:
    """At each labelled moment: the picked steps of `workload` timed on a probe gang formed for
    the check, each one's time now over its stored time, and the champion's signed error on it
    now. A check that fails (the gang cannot form, a step fails) is recorded with its error and
    left out of the medians: the run's tasks are measured all the same."""

    def __init__(self, directory: Path | None, workload: str, count: int, model: PerformanceModel, hardware_id: str):
        self.model, self.hardware_id, self.kind = model, hardware_id, OWN_STEPS[workload]
        # read now, so a calibration without such steps is refused before any task is launched
        self.steps = own_steps(directory, workload, count) if directory is not None and count > 0 else []
        self.predicted_s: list[float] | None = None  # the champion's prices, the same at every check
        self.checks: list[dict[str, Any]] = []

    def __call__(self, label: str) -> None:
        if not self.steps:
            return
        try:
            timed = self._time(self.steps)
        except Exception as exc:  # noqa: BLE001 - a check is a control beside the run, not the run
            self.checks.append({"label": label, "error": f"{type(exc).__name__}: {exc}"})
            print(f"  own steps {label}: check failed ({type(exc).__name__}: {exc})", flush=True)
            return
        if self.predicted_s is None:
            self.predicted_s = [self.kind.price_s(self.model, step) for step in self.steps]
        rows = [
            {
                "name": self.kind.name(step),
                "stored_ms": step.median_s * 1e3,
                "now_ms": seconds * 1e3,
                "predicted_ms": predicted * 1e3,
            }
            for step, seconds, predicted in zip(self.steps, timed, self.predicted_s)
        ]
        check = {"label": label, "steps": rows, **summary(rows)}
        self.checks.append(check)
        print(
            f"  own steps {label}: now / stored geomean {check['now_over_stored']:.3f}, champion's mean signed "
            f"on them now {check['signed_now']:+.1%} (when stored {check['signed_stored']:+.1%})",
            flush=True,
        )

    def _time(self, steps: list[Measurement]) -> list[float]:
        device_kind = "cuda" if steps[0].device.startswith("cuda") else "cpu"
        assert all(s.world_size == steps[0].world_size for s in steps), "one gang times every step"
        with formed_gang(device_kind, self.hardware_id, steps[0].world_size) as gang:  # released: the next launch
            return [gang_step_s(gang, self.kind.probe_params(s), self.kind.op) for s in steps]

    def result(self) -> dict[str, Any]:
        """The checks as a result's keys, and their medians: the spell (`own_steps_now_over_stored`)
        and the champion's signed error on its own steps over the run (`own_steps_signed`)."""
        done = [c for c in self.checks if "error" not in c]
        if not done:
            return {"step_checks": self.checks, "own_steps_now_over_stored": None, "own_steps_signed": None}
        return {
            "step_checks": self.checks,
            "own_steps_now_over_stored": statistics.median(c["now_over_stored"] for c in done),
            "own_steps_signed": statistics.median(c["signed_now"] for c in done),
        }


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Geomean of now / stored, and the mean signed error of the prices against now and stored."""
    return {
        "now_over_stored": math.exp(statistics.fmean(math.log(r["now_ms"] / r["stored_ms"]) for r in rows)),
        "signed_now": statistics.fmean((r["predicted_ms"] - r["now_ms"]) / r["now_ms"] for r in rows),
        "signed_stored": statistics.fmean((r["predicted_ms"] - r["stored_ms"]) / r["stored_ms"] for r in rows),
    }
