"""Time several sharding plans of one DLRM job against each other, for real, interleaved.

Choosing between plans is judged on their measured times, and on a shared host the speed of
the machine drifts by tens of percent over tens of seconds: plans timed one after another
would be compared across different speeds. So every plan's model is built up front on the
same process group, and the timed steps run in rounds: each round times a few steps of every
plan, in a rotated order (each step the slowest rank's). A plan's time is read against the
round it ran in: per round, every plan's median step relative to the round's geometric mean;
a plan's relative time is the median of its rounds', and its time that relative time times the
geometric mean of all rounds. A drift between rounds then cancels instead of landing on
whichever plan ran during it (the paired comparison an A/B test makes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from probes.vocabulary.jobspec import JobSpec
from probes.workloads.dlrm import ShardedDLRM
from probes.workloads.timed_steps import RunResult, run_timed_steps


@dataclass
class RaceResult:
    steps: list[RunResult]  # per plan (in the given order), its timed steps pooled over the rounds
    round_medians_s: np.ndarray  # [rounds, plans]: each plan's median step in each round

    def plan_seconds(self) -> np.ndarray:
        """Per plan, the drift-adjusted time (see the module docstring)."""
        return drift_adjusted(self.round_medians_s)


def drift_adjusted(round_medians: np.ndarray) -> np.ndarray:
    """Per plan: the median over rounds of its time relative to the round's geometric mean,
    times the geometric mean over all rounds and plans."""
    logs = np.log(np.asarray(round_medians, dtype=np.float64))
    relative = logs - logs.mean(axis=1, keepdims=True)
    return np.exp(np.median(relative, axis=0) + logs.mean())


def race_plans(
    spec: JobSpec,
    plans: Sequence[Sequence],
    rank: int,
    world: int,
    device: torch.device,
    rounds: int = 10,
    steps_per_round: int = 8,
    warmup: int = 3,
) -> RaceResult:
    """Build every plan's model, warm each, then time them in rotated rounds."""
    models = [ShardedDLRM(spec, plan, rank, world, device) for plan in plans]
    step_no = [0] * len(plans)

    def stepper(k: int) -> Callable[[int], float]:
        def step(_: int) -> float:
            model = models[k]
            loss = model.step(model.batches[step_no[k] % len(model.batches)])
            step_no[k] += 1
            return loss

        return step

    return race_steps([stepper(k) for k in range(len(plans))], device, rounds, steps_per_round, warmup)


def race_steps(
    steps: Sequence[Callable[[int], float]], device: torch.device, rounds: int, steps_per_round: int, warmup: int
) -> RaceResult:
    """Warm every contender's `step` (allocations, thread pools, caches), then time them in
    `rounds` rounds of `steps_per_round` steps, each round in a rotated order."""
    results = [RunResult([], []) for _ in steps]
    medians = np.zeros((rounds, len(steps)))
    for step in steps:
        run_timed_steps(step, 0, warmup, device)
    for r in range(rounds):
        for j in range(len(steps)):
            k = (j + r) % len(steps)
            out = run_timed_steps(steps[k], steps_per_round, 1, device)
            results[k].iteration_s.extend(out.iteration_s)
            results[k].losses.extend(out.losses)
            medians[r, k] = out.median_s
    return RaceResult(results, medians)
