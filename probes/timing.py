"""Timing discipline shared by every probe: warm-up, repeats until the median is stable.

On CPU we time with `perf_counter`; on CUDA with events around the call so the host clock
never measures launch queueing instead of kernel time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class Timing:
    median_s: float
    spread_s: float
    repeats: int


def time_callable(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    warmup: int = 2,
    min_repeats: int = 15,
    max_repeats: int = 50,
    rel_tolerance: float = 0.02,
    max_seconds: float = 2.0,
    setup: Callable[[], object] | None = None,
    min_sample_s: float = 200e-6,
) -> Timing:
    """Run `fn` until the running median moves less than `rel_tolerance` between checks.

    Stops early at `max_repeats` or when `max_seconds` of timed work has been spent, so a
    large shape cannot eat the calibration budget. `setup`, when given, runs untimed before
    every call (e.g. the forward pass whose backward is being timed).

    A call shorter than `min_sample_s` is timed in a batch of back-to-back calls (as `timeit`
    does): a microsecond kernel timed alone is mostly clock and loop jitter. Calls with a
    `setup` are always timed one at a time.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    t_warm = time.perf_counter()
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    per_call = (time.perf_counter() - t_warm) / max(warmup, 1)
    inner = 1 if setup is not None or warmup == 0 else int(min(1000, max(1, np.ceil(min_sample_s / max(per_call, 1e-9)))))
    samples: list[float] = []
    spent = 0.0
    last_median = None
    while len(samples) < max_repeats:
        if setup is not None:
            setup()
            if cuda:
                torch.cuda.synchronize(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3 / inner
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            elapsed = (time.perf_counter() - t0) / inner
        samples.append(elapsed)
        spent += elapsed * inner
        if len(samples) >= min_repeats and len(samples) % 2 == 1:
            median = float(np.median(samples))
            if last_median is not None and abs(median - last_median) <= rel_tolerance * last_median:
                break
            last_median = median
        if spent > max_seconds and len(samples) >= 3:
            break
    arr = np.asarray(samples)
    q1, q3 = np.percentile(arr, [25, 75])
    return Timing(float(np.median(arr)), float(q3 - q1), len(samples))
