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
) -> Timing:
    """Run `fn` until the running median moves less than `rel_tolerance` between checks.

    Stops early at `max_repeats` or when `max_seconds` of timed work has been spent, so a
    large shape cannot eat the calibration budget. `setup`, when given, runs untimed before
    every call (e.g. the forward pass whose backward is being timed).
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if cuda:
        torch.cuda.synchronize(device)
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
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
        samples.append(elapsed)
        spent += elapsed
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
