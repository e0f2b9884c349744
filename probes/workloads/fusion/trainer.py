"""The training loop of B fused models: each with its own hyper-parameters, all stepping on
the same batch as one job, shrinking when some are stopped early."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from probes.workloads.fusion.fused_optim import FusedHyperParams, FusedOptimizer
from probes.workloads.fusion.hfta import FusedModels, build_members, fused_cross_entropy
from probes.workloads.fusion.models import FusionWorkload


@dataclass
class FusedTrainer:
    """B models of one workload trained as one, each with its own hyper-parameters. The data
    are the caller's: every step takes a batch that all B models see."""

    fused: FusedModels
    optimizer: FusedOptimizer

    @classmethod
    def build(
        cls,
        work: FusionWorkload,
        seeds: Sequence[int],
        hyper: FusedHyperParams,
        optimizer: str = "adam",
        dropouts: Sequence[float] | None = None,
        device: torch.device | str = "cpu",
    ) -> "FusedTrainer":
        members = build_members(work.build, seeds, dropouts, device)
        fused = FusedModels(members).train()
        return cls(fused, FusedOptimizer(optimizer, fused.params, hyper))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step of every model on the batch (x, y); returns each model's loss."""
        self.optimizer.zero_grad()
        loss, per_model = fused_cross_entropy(self.fused(x), y)
        loss.backward()
        self.optimizer.step()
        return per_model

    def keep(self, indices: Sequence[int]) -> None:
        """Go on with only the models at `indices` (the others were stopped early): the fused
        job shrinks, so stopped models no longer cost compute or memory."""
        self.fused.keep(indices)
        self.optimizer.keep(indices, self.fused.params)
