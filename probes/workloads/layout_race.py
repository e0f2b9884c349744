"""Time several layouts of one transformer job against each other, for real, interleaved
(as probes/workloads/plan_race.py times sharding plans): every layout's rank is built up front
on the same process group and warmed, then the timed steps run in rounds, each round a few
steps of every layout in a rotated order; a layout's time is drift-adjusted against the rounds
(`plan_race.drift_adjusted`), so a spell of a slower host lands on every layout alike.
"""

from __future__ import annotations

from typing import Sequence

import torch

from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.plan_race import RaceResult, race_steps
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
    try:
        return race_steps([lambda _i, m=model: m.step() for model in models], device, rounds, steps_per_round, warmup)
    finally:
        for model in models:
            model.close()
