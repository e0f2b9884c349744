"""Fusion-width probing on the Ray cluster: for each workload, widths 1, 2, 4, ... measured
until the memory cap, the time cap or `max_width`, then a `FusionModel` fitted per workload.

Every width runs as its own Ray task with `max_calls=1`, so it gets a fresh worker process:
on CPU the peak memory is the process's resident high-water mark, which an earlier, wider
run in the same process would mask. The workloads' sweeps run side by side, one task per
device at a time. A task that fails is retried once; a second failure, or running out of
memory, ends that workload's sweep there and is recorded, never dropped. Rows go to the
`MeasurementStore` as they arrive.

`plan_fusion_width` is what `python -m orchestrator.cli.fuse` runs: one workload's widths
probed, its model fitted, the width chosen, all logged to an MLflow run (kind=fusion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlflow
import ray
from ray.exceptions import RayError

from orchestrator.cluster import HardwareFingerprint
from orchestrator.defaults import FUSION_MEMORY_SHARE
from orchestrator.home import home_path
from orchestrator.measurement_store import MeasurementStore
from orchestrator.progress import Progress, say
from policies.fusion_width import choose_width, partition_trials, power_of_two_widths
from policies.plan import Decision
from predictors.fusion_model import FusionModel, fit_fusion_models
from probes.fusion import measure_fusion_width
from probes.vocabulary.records import Measurement


@ray.remote(max_calls=1)  # a fresh worker process per width: see the module docstring
def measure_width_task(
    workload: str, width: int, batch_size: int | None, optimizer: str, device: str, max_seconds: float, seed: int
) -> dict:
    return measure_fusion_width(workload, width, batch_size, optimizer, device, max_seconds, seed).to_row()


@dataclass
class WidthSweep:
    """One workload's sweep: the next width to try and why it stopped."""

    workload: str
    next_width: int = 1
    stopped: str = ""
    rows: list[Measurement] = field(default_factory=list)


def probe_fusion(
    workloads: Sequence[str],
    store: MeasurementStore,
    max_width: int = 64,
    memory_cap_bytes: float = 8 * 2**30,
    step_cap_s: float = 2.0,
    batch_size: int | None = None,
    optimizer: str = "adam",
    device_kind: str = "cpu",
    parallel: int = 1,
    max_seconds: float = 2.0,
    seed: int = 0,
    deadline: float | None = None,
) -> list[Measurement]:
    """Measure widths 1, 2, 4, ... of each workload; a sweep stops after the first width whose
    peak memory passes `memory_cap_bytes`, whose step takes longer than `step_cap_s`, or at
    `max_width`. `parallel` tasks run at once (one per device), the workloads' widths in turn;
    past `deadline` (time.monotonic()) no new width starts (those running finish)."""
    resources = {"num_gpus": 1, "num_cpus": 1} if device_kind == "cuda" else {"num_cpus": 1}
    device = "cuda" if device_kind == "cuda" else "cpu"
    sweeps = {w: WidthSweep(w) for w in workloads}
    total = len(workloads) * len(power_of_two_widths(max_width))
    progress = Progress("fusion widths (at most)", total)
    in_flight: dict = {}
    attempts: dict[tuple[str, int], int] = {}

    def submit() -> None:
        if deadline is not None and time.monotonic() > deadline:
            for sweep in sweeps.values():
                sweep.stopped = sweep.stopped or f"out of time at width {sweep.next_width}"
            return
        # the narrowest next width first: under a deadline every workload gets its first widths
        for sweep in sorted(sweeps.values(), key=lambda s: s.next_width):
            if len(in_flight) >= max(1, parallel):
                return
            busy = any(w == sweep.workload for w, _ in in_flight.values())
            if sweep.stopped or busy:
                continue
            width = sweep.next_width
            ref = measure_width_task.options(**resources).remote(
                sweep.workload, width, batch_size, optimizer, device, max_seconds, seed
            )
            in_flight[ref] = (sweep.workload, width)

    submit()
    while in_flight:
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        workload, width = in_flight.pop(ready[0])
        sweep = sweeps[workload]
        try:
            row = Measurement.from_row(ray.get(ready[0]))
        except RayError as exc:
            message = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
            attempts[(workload, width)] = attempts.get((workload, width), 0) + 1
            out_of_memory = "out of memory" in str(exc).lower() or "OutOfMemory" in type(exc).__name__
            if attempts[(workload, width)] >= 2 or out_of_memory:  # else: retried, next_width unchanged
                store.add_failure(
                    {"family": "fusion", "workload": workload, "width": width}, message, attempts[(workload, width)]
                )
                sweep.stopped = f"width {width} failed: {message}"
                progress.update(0, 1)
            submit()
            continue
        store.add([row])
        sweep.rows.append(row)
        progress.update(1, 0)
        peak, step = row.extra["peak_memory_bytes"], row.median_s
        if peak > memory_cap_bytes:
            sweep.stopped = (
                f"width {width} held {peak / 2**20:.0f} MiB, over the {memory_cap_bytes / 2**20:.0f} MiB cap"
            )
        elif step > step_cap_s:
            sweep.stopped = f"width {width} took {step:.2f}s a step, over the {step_cap_s:g}s cap"
        elif width * 2 > max_width:
            sweep.stopped = f"reached max_width {max_width}"
        else:
            sweep.next_width = width * 2
        submit()
    progress.close()
    for sweep in sweeps.values():
        say(f"fusion {sweep.workload}: measured widths {[r.params['width'] for r in sweep.rows]}; {sweep.stopped}")
    return [r for s in sweeps.values() for r in s.rows]


def log_fusion_decision(model: FusionModel, decision: Decision, **extra: Any) -> None:
    """The curve (`fusion_model.json`) and the width policy's decision with every candidate
    (`fusion_decision.json`, plus `extra`) as artifacts of the active run."""
    mlflow.log_dict(model.to_dict(), "fusion_model.json")
    mlflow.log_dict(
        {
            "policy": decision.policy,
            "choice": decision.choice,
            "detail": decision.choice_detail,
            "candidates": [c.__dict__ for c in decision.candidates],
            **extra,
        },
        "fusion_decision.json",
    )


def widths_at_once(fp: HardwareFingerprint) -> int:
    """How many widths to measure at once: one per GPU; on CPU one, since the "devices" of a
    host share caches and memory bandwidth, and a wide fused job beside a narrow one distorts
    both (the same width measured up to 42% apart when two ran at once)."""
    return max(1, int(sum(fp.devices_per_node))) if fp.device_kind == "cuda" else 1


def plan_fusion_width(
    workload: str,
    fp: HardwareFingerprint,
    max_width: int = 64,
    memory_cap_bytes: float | None = None,
    step_cap_s: float = 2.0,
    batch_size: int | None = None,
    optimizer: str = "adam",
    probe_seconds: float = 2.0,
    trials: int | None = None,
) -> dict[str, Any]:
    """Probe `workload`'s widths on this cluster (rows under $AUTOTUNE_HOME/fusion/<stamp>/), fit its
    FusionModel, choose the width under the memory cap (default 60% of a device's memory) and
    log rows, model and decision to an MLflow run (kind=fusion); with `trials`, also how a
    sweep of that many trials of one setting splits into fused groups."""
    cap = memory_cap_bytes or FUSION_MEMORY_SHARE * fp.min_device_memory_bytes
    store = MeasurementStore(home_path("fusion") / time.strftime("%Y%m%d-%H%M%S"))
    say(
        f"fusion widths of {workload} on {fp.summary()}: up to {max_width}, cap {cap / 2**30:.1f} GiB; "
        f"rows in {store.rows_path}"
    )
    with mlflow.start_run(run_name=f"fusion-{workload}") as run:
        mlflow.set_tags({"kind": "fusion", "hardware_id": fp.hardware_id, "workload": workload})
        rows = probe_fusion(
            [workload],
            store,
            max_width,
            cap,
            step_cap_s,
            batch_size,
            optimizer,
            fp.device_kind,
            parallel=widths_at_once(fp),
            max_seconds=probe_seconds,
        )
        mlflow.log_artifact(str(store.rows_path))
        model = fit_fusion_models(rows)[workload]
        decision = choose_width(model, cap, max_width)
        log_fusion_decision(model, decision)
        mlflow.log_metrics(
            {
                "chosen_width": decision.choice_detail["width"],
                "predicted_samples_per_s": decision.choice_detail["samples_per_s"],
                "speedup_vs_one": decision.choice_detail["speedup_vs_one"],
                "fit_gmae": model.fit_gmae,
            }
        )
        out: dict[str, Any] = {
            "hardware_id": fp.hardware_id,
            "run_id": run.info.run_id,
            "measured": {int(r.params["width"]): r.extra["samples_per_s"] for r in rows},
            **decision.choice_detail,
        }
        if trials:
            out["groups"] = [
                len(g) for g in partition_trials([{} for _ in range(trials)], decision.choice_detail["width"])
            ]
    return out
