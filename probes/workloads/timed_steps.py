"""Timing real training steps across ranks the same way for every workload: warm-up, then
each timed step starts behind a barrier, and each step's time is the slowest rank's (the
iteration time a synchronous data-parallel job sees)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class RunResult:
    iteration_s: list[float]  # per timed iteration, the slowest rank's time
    losses: list[float]

    @property
    def median_s(self) -> float:
        return float(np.median(self.iteration_s))


def run_timed_steps(step: Callable[[int], float], iterations: int, warmup: int, device: torch.device) -> RunResult:
    """`step(i)` runs training step i and returns its loss."""
    for i in range(warmup):
        step(i)
    times, losses = [], []
    for i in range(iterations):
        dist.barrier()
        t0 = time.perf_counter()
        losses.append(step(i))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)  # on the group's device (probes.comm)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return RunResult([float(t) for t in slowest.tolist()], losses)
