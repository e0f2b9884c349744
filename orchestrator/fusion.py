"""Fusion-width probing on the Ray cluster: for each workload, widths 1, 2, 4, ... measured
until the memory cap, the time cap or `max_width`, then a `FusionModel` fitted per workload.

Every width runs as its own Ray task with `max_calls=1`, so it gets a fresh worker process:
on CPU the peak memory is the process's resident high-water mark, which an earlier, wider
run in the same process would mask. The workloads' sweeps run side by side, one task per
device at a time. A task that fails is retried once; a second failure, or running out of
memory, ends that workload's sweep there and is recorded, never dropped. Rows go to the
`MeasurementStore` as they arrive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import ray
from ray.exceptions import RayError

from orchestrator.measurement_store import MeasurementStore
from orchestrator.progress import Progress, say
from policies.fusion_width import power_of_two_widths
from probes.fusion import measure_fusion_width
from probes.vocabulary.records import Measurement


@ray.remote(max_calls=1)  # a fresh worker process per width: see the module docstring
def measure_width_task(workload: str, width: int, batch_size: int | None, optimizer: str, device: str,
                       max_seconds: float, seed: int) -> dict:
    return measure_fusion_width(workload, width, batch_size, optimizer, device, max_seconds, seed).to_row()


@dataclass
class WidthSweep:
    """One workload's sweep: the next width to try and why it stopped."""

    workload: str
    next_width: int = 1
    stopped: str = ""
    rows: list[Measurement] = field(default_factory=list)


def probe_fusion(workloads: Sequence[str], store: MeasurementStore, max_width: int = 64,
                 memory_cap_bytes: float = 8 * 2**30, step_cap_s: float = 2.0, batch_size: int | None = None,
                 optimizer: str = "adam", device_kind: str = "cpu", parallel: int = 1, max_seconds: float = 2.0,
                 seed: int = 0) -> list[Measurement]:
    """Measure widths 1, 2, 4, ... of each workload; a sweep stops after the first width whose
    peak memory passes `memory_cap_bytes`, whose step takes longer than `step_cap_s`, or at
    `max_width`. `parallel` tasks run at once (one per device)."""
    resources = {"num_gpus": 1, "num_cpus": 1} if device_kind == "cuda" else {"num_cpus": 1}
    device = "cuda" if device_kind == "cuda" else "cpu"
    sweeps = {w: WidthSweep(w) for w in workloads}
    total = len(workloads) * len(power_of_two_widths(max_width))
    progress = Progress("fusion widths (at most)", total)
    in_flight: dict = {}
    attempts: dict[tuple[str, int], int] = {}

    def submit() -> None:
        for sweep in sweeps.values():
            if len(in_flight) >= max(1, parallel):
                return
            busy = any(w == sweep.workload for w, _ in in_flight.values())
            if sweep.stopped or busy:
                continue
            width = sweep.next_width
            ref = measure_width_task.options(**resources).remote(sweep.workload, width, batch_size, optimizer,
                                                                 device, max_seconds, seed)
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
                store.add_failure({"family": "fusion", "workload": workload, "width": width}, message,
                                  attempts[(workload, width)])
                sweep.stopped = f"width {width} failed: {message}"
                progress.update(0, 1)
            submit()
            continue
        store.add([row])
        sweep.rows.append(row)
        progress.update(1, 0)
        peak, step = row.extra["peak_memory_bytes"], row.median_s
        if peak > memory_cap_bytes:
            sweep.stopped = f"width {width} held {peak / 2**20:.0f} MiB, over the {memory_cap_bytes / 2**20:.0f} MiB cap"
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
