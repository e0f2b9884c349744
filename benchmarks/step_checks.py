"""The calibration's own DLRM task steps timed again at labelled moments of an e2e benchmark, and
priced by the champion: whether a run's lean is the host's or the jobs'.

The host checks (`e2e_accuracy.HostChecks`) re-measure kernel points one rank at a time; a
two-rank step on a 2-vCPU VM can run 10-30% apart from one spell to the next while those
checks stay within 5% (#26, 11-29 20:20: the 15:33 calibration's table-wise task steps ran
1.09x their stored times, one of them 1.29x; 2 h after that calibration they had run 1.009x).
So a run's mean signed error mixes the host's spell against the calibration's with the model's
error on jobs it never saw. Timing a few of the calibration's own table-wise task steps beside
the run's tasks separates them: the champion's signed error on its own steps now (they were
priced within their noise when fitted) is the spell, and what the run's tasks lean beyond it
is the jobs'.

Each check forms a probe gang, times the steps as the calibration's training phase does
(`launch_vs_probe.gang_step_s`) and hands the devices back before the next task is launched.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks.launch_vs_probe import gang_step_s
from benchmarks.refit_e2e import read_rows
from predictors.dlrm_estimator import estimate_step
from predictors.performance_model import PerformanceModel
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.ops import DLRM_STEP_OP
from probes.vocabulary.records import Measurement

TASK_PREFIX = "task"  # the training probe's production-shaped jobs (probes.training.probe_kind)


def table_wise_task_steps(directory: Path, count: int | None = None) -> list[Measurement]:
    """Up to `count` (None: all) of the calibration's table-wise task steps (the jobs the e2e tasks are
    like: plans of whole tables on ranks), spread over its batch sizes: sorted by batch and
    taken at even intervals. ValueError when it stores none."""
    rows = read_rows(directory / "measurements.jsonl")
    steps = [
        r
        for r in rows
        if r.op == DLRM_STEP_OP
        and str(r.params["job"]["name"]).startswith(TASK_PREFIX)
        and all(isinstance(p, int) for p in r.params["table_to_rank"])
    ]
    steps = list({r.params["job"]["name"]: r for r in steps}.values())  # a retried step: its last row
    if not steps:
        raise ValueError(f"no table-wise {DLRM_STEP_OP} task rows in {directory}")
    steps.sort(key=lambda r: (r.params["job"]["batch_size"], r.params["job"]["name"]))
    if count is None or count >= len(steps):
        return steps
    return [steps[math.floor(k * len(steps) / count)] for k in range(count)]


class StepChecks:
    """At each labelled moment: the picked steps timed on a probe gang formed for the check,
    each one's time now over its stored time, and the champion's signed error on it now."""

    def __init__(self, directory: Path | None, count: int, model: PerformanceModel, hardware_id: str):
        self.directory, self.count, self.model, self.hardware_id = directory, count, model, hardware_id
        self.steps: list[Measurement] | None = None  # read at the first check
        self.checks: list[dict[str, Any]] = []

    def __call__(self, label: str) -> None:
        if self.directory is None or self.count == 0:
            return
        if self.steps is None:
            self.steps = table_wise_task_steps(self.directory, self.count)
        timed = self._time(self.steps)
        rows = []
        for step, seconds in zip(self.steps, timed):
            job = JobSpec.from_dict(step.params["job"])
            predicted = estimate_step(self.model, step, include_overhead=True, simulate_graph=True).iteration_s
            rows.append(
                {
                    "name": job.name,
                    "batch_size": job.batch_size,
                    "stored_ms": step.median_s * 1e3,
                    "now_ms": seconds * 1e3,
                    "predicted_ms": predicted * 1e3,
                }
            )
        check = {"label": label, "steps": rows, **summary(rows)}
        self.checks.append(check)
        print(
            f"  own steps {label}: now / stored geomean {check['now_over_stored']:.3f}, champion's mean signed "
            f"on them now {check['signed_now']:+.1%} (when stored {check['signed_stored']:+.1%})",
            flush=True,
        )

    def _time(self, steps: list[Measurement]) -> list[float]:
        from orchestrator.probe_pool import ActorPool, Gang

        kind = "cuda" if steps[0].device.startswith("cuda") else "cpu"
        pool = ActorPool(kind, self.hardware_id, steps[0].world_size).start()
        try:
            gang = Gang(pool)
            gang.form()
            params = [{"job": s.params["job"], "table_to_rank": s.params["table_to_rank"]} for s in steps]
            seconds = [gang_step_s(gang, p, DLRM_STEP_OP) for p in params]
            gang.disband()
        finally:
            pool.stop()  # the launcher's next job needs the devices
        return seconds

    def result(self) -> dict[str, Any]:
        """The checks as a result's keys, and their medians: the spell (`own_steps_now_over_stored`)
        and the champion's signed error on its own steps over the run (`own_steps_signed`)."""
        if not self.checks:
            return {"step_checks": [], "own_steps_now_over_stored": None, "own_steps_signed": None}
        return {
            "step_checks": self.checks,
            "own_steps_now_over_stored": statistics.median(c["now_over_stored"] for c in self.checks),
            "own_steps_signed": statistics.median(c["signed_now"] for c in self.checks),
        }


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """Geomean of now / stored, and the mean signed error of the prices against now and stored."""
    return {
        "now_over_stored": math.exp(statistics.fmean(math.log(r["now_ms"] / r["stored_ms"]) for r in rows)),
        "signed_now": statistics.fmean((r["predicted_ms"] - r["now_ms"]) / r["now_ms"] for r in rows),
        "signed_stored": statistics.fmean((r["predicted_ms"] - r["stored_ms"]) / r["stored_ms"] for r in rows),
    }
