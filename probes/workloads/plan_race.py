"""Time several sharding plans of one DLRM job against each other, for real, interleaved.

Choosing between plans is judged on their measured times, and on a shared host the speed of
the machine drifts by tens of percent over tens of seconds: plans timed one after another
would be compared across different speeds. So every plan's model is built up front on the
same process group, and the timed steps run in rounds: each round times a few steps of every
plan, in a rotated order, and a plan's time is the median over all its rounds' steps (each
step the slowest rank's). A drift then touches every plan alike.
"""
from __future__ import annotations

from typing import Sequence

import torch

from probes.jobspec import JobSpec
from probes.workloads.dlrm import ShardedDLRM
from probes.workloads.timed_steps import RunResult, run_timed_steps


def race_plans(
    spec: JobSpec, plans: Sequence[Sequence], rank: int, world: int, device: torch.device,
    rounds: int = 5, steps_per_round: int = 4, warmup: int = 3,
) -> list[RunResult]:
    """One `RunResult` per plan (in the given order), its steps pooled over the rounds."""
    models = [ShardedDLRM(spec, plan, rank, world, device) for plan in plans]
    results = [RunResult([], []) for _ in plans]
    step_no = [0] * len(plans)

    def stepper(k: int):
        def step(_: int) -> float:
            model = models[k]
            loss = model.step(model.batches[step_no[k] % len(model.batches)])
            step_no[k] += 1
            return loss
        return step

    for k in range(len(plans)):  # warm every plan first (allocations, thread pools, caches)
        run_timed_steps(stepper(k), 0, warmup, device)
    for r in range(rounds):
        for j in range(len(plans)):
            k = (j + r) % len(plans)
            out = run_timed_steps(stepper(k), steps_per_round, 1, device)
            results[k].iteration_s.extend(out.iteration_s)
            results[k].losses.extend(out.losses)
    return results
