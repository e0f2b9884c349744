"""The fusion-width probe: throughput (summed over models) and peak memory of B fused models
trained as one (`probes.workloads.fusion.trainer.FusedTrainer`).

Peak memory on a GPU is the allocator's high-water mark. On CPU it is the process's resident
high-water mark above its resident size before the models were built (see `MemoryWatch`);
the orchestrator also runs each width in a fresh worker process (`orchestrator.fusion`), so
no allocator cache from a wider run is counted.
"""

from __future__ import annotations

import itertools
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probes.probe import LocalProbe
from probes.timing import time_callable
from probes.vocabulary.ops import FUSION_OP
from probes.vocabulary.records import Measurement
from probes.workloads.fusion.fused_optim import FusedHyperParams
from probes.workloads.fusion.models import batches, workload
from probes.workloads.fusion.trainer import FusedTrainer

DATA_BATCHES = 4  # distinct batches cycled through while timing (drawing data is not timed)


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


@dataclass
class MemoryWatch:
    """Peak memory of what runs between `start()` and `peak_bytes()` on `device`.

    On CPU: the resident high-water mark above the resident size at `start()`. Linux lets a
    process reset its own high-water mark (`/proc/self/clear_refs`, "5"), so imports and
    earlier work in the same process do not mask the peak; where that is not allowed, the
    lifetime peak (`ru_maxrss`) is used, which is right in a fresh process."""

    device: torch.device
    baseline: int = 0
    reset: bool = False

    def start(self) -> "MemoryWatch":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return self
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = _status_kib("VmHWM") is not None
        except OSError:
            self.reset = False
        import psutil  # CPU only: a GPU image without it still measures (and imports this probe)

        self.baseline = psutil.Process().memory_info().rss
        return self

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device) - self.baseline)
        high_water = _status_kib("VmHWM") if self.reset else None
        if high_water is None:
            high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, high_water * 1024 - self.baseline)


def measure_fusion_width(
    workload_name: str,
    width: int,
    batch_size: int | None = None,
    optimizer: str = "adam",
    device: torch.device | str = "cpu",
    max_seconds: float = 2.0,
    seed: int = 0,
) -> Measurement:
    """Train `width` fused copies of a workload and time their steps (after warm-up, until the
    median settles or `max_seconds`); the row's time is the median step, `samples_per_s` the
    samples of all models per second, `peak_memory_bytes` what the fused job held at most."""
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width: expected an integer >= 1, got {width!r}")
    work = workload(workload_name)
    device = torch.device(device)
    batch_size = int(batch_size or work.batch_size)
    watch = MemoryWatch(device).start()
    rng = np.random.default_rng(seed)
    hyper = FusedHyperParams(
        lr=list(10 ** rng.uniform(-4, -2, width)),
        weight_decay=list(rng.uniform(0, 1e-3, width)),
        momentum=0.9,
        beta1=list(rng.uniform(0.85, 0.95, width)),
    )
    trainer = FusedTrainer.build(
        work,
        seeds=[seed * 1000 + i for i in range(width)],
        hyper=hyper,
        optimizer=optimizer,
        dropouts=list(rng.uniform(0, 0.3, width)),
        device=device,
    )
    data = [(x.to(device), y.to(device)) for x, y in itertools.islice(batches(work, batch_size, seed), DATA_BATCHES)]
    cycle = itertools.cycle(data)
    t0 = time.perf_counter()
    timing = time_callable(
        lambda: trainer.step(*next(cycle)),
        device=device,
        warmup=3,
        min_repeats=5,
        max_repeats=200,
        max_seconds=max_seconds,
        min_sample_s=0.0,
    )
    peak = watch.peak_bytes()
    params: dict[str, Any] = {
        "workload": workload_name,
        "width": width,
        "batch_size": batch_size,
        "optimizer": optimizer,
    }
    extra = {
        "samples_per_s": width * batch_size / timing.median_s,
        "peak_memory_bytes": peak,
        "parameters_per_model": sum(p[0].numel() for p in trainer.fused.params.values()),
        "wall_s": time.perf_counter() - t0,
    }
    return Measurement(
        FUSION_OP,
        params,
        timing.median_s,
        timing.spread_s,
        timing.repeats,
        device=str(device),
        family="fusion",
        extra=extra,
    )


def _measure(params: dict[str, Any], device: str) -> list[Measurement]:
    return [
        measure_fusion_width(
            params["workload"],
            int(params["width"]),
            params.get("batch_size"),
            params.get("optimizer", "adam"),
            device,
            float(params["max_seconds"]),
            int(params.get("seed", 0)),
        )
    ]


# A fusion point on a probe actor (the nightly's sentinels); the calibration's widths run in
# fresh workers instead (orchestrator.fusion), where the peak memory is the width's own.
PROBE = LocalProbe("fusion", _measure)
