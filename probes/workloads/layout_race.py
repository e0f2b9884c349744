"""Time several layouts of one transformer job against each other, for real, interleaved
(as probes/workloads/plan_race.py times sharding plans): every layout's rank is built up front
on the same process group and warmed, then the timed steps run in rounds, each round a few
steps of every layout in a rotated order; a layout's time is drift-adjusted against the rounds
(`plan_race.drift_adjusted`), so a spell of a slower host lands on every layout alike.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.plan_race import RaceResult
from probes.workloads.timed_steps import RunResult, run_timed_steps
from probes.workloads.transformer import ParallelTransformer


def race_layouts(
    specs: Sequence[TransformerSpec],
    rank: int,
    device: torch.device,
    rounds: int = 3,
    steps_per_round: int = 2,
    warmup: int = 1,
) -> RaceResult:
    """Build every layout's rank, warm each, then time them in rotated rounds."""
    models = [ParallelTransformer(spec, rank, device) for spec in specs]
    results = [RunResult([], []) for _ in specs]
    medians = np.zeros((rounds, len(specs)))
    for model in models:  # warm every layout first (allocations, thread pools, shape inference)
        run_timed_steps(lambda _i, m=model: m.step(), 0, warmup, device)
    for r in range(rounds):
        for j in range(len(specs)):
            k = (j + r) % len(specs)
            out = models[k].run(steps_per_round, 0)
            results[k].iteration_s.extend(out.iteration_s)
            results[k].losses.extend(out.losses)
            medians[r, k] = out.median_s
    for model in models:
        model.close()
    return RaceResult(results, medians)
