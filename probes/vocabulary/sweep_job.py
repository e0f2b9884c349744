"""A sweep job file (`workload: sweep`): many short trainings of one model that differ in their
hyper-parameters, which autotune runs fused, several per device (HFTA), at the width the
hardware's fusion model chooses.

    name: pointnet_lr               # optional label (default "sweep")
    workload: sweep                 # required
    model: pointnet                 # a reference workload (cnn, pointnet, transformer), or
    # factory: mypkg.sweeps:make    # the user's own: module:callable returning a FusionWorkload
    search_space:                   # Tune's search space, one entry per hyper-parameter
      lr: {loguniform: [1.0e-4, 1.0e-2]}
      weight_decay: {uniform: [0.0, 1.0e-3]}
      dropout: {choice: [0.0, 0.1, 0.2]}
      batch_size: 32                # a constant; infusible keys (batch_size) split the groups
      seed: {randint: [0, 1000]}
      # momentum: {grid_search: [0.8, 0.9]}  (every trial is repeated for each grid value)
    trials: 16                      # samples drawn from the space (Tune's num_samples)
    optimizer: adam                 # optional: sgd, adam or adamw (default adam)
    epochs: 3                       # optional (default 3)
    steps_per_epoch: 20             # optional (default 20)
    max_width: 64                   # optional: the widest fused job considered (default 64)
    memory_free_gb: 2               # optional: device memory to leave free (default: 40% of it)
    seed: 0                         # optional: the draw of the trials and the data

The search-space domains are Tune's (`tune.uniform`, `tune.loguniform`, `tune.randint`,
`tune.choice`, `tune.grid_search`); the orchestrator turns them into Tune's objects. Only the
hyper-parameters the fused trainer reads are allowed (`SWEEP_KEYS`), so a misspelt key is an
error instead of a sweep that silently ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SWEEP_FIELDS = (
    "name",
    "workload",
    "model",
    "factory",
    "search_space",
    "trials",
    "optimizer",
    "epochs",
    "steps_per_epoch",
    "max_width",
    "memory_free_gb",
    "seed",
)
# What the fused trainer reads of a trial's config (orchestrator.fusion_tune.train_group).
SWEEP_KEYS = ("lr", "weight_decay", "momentum", "beta1", "beta2", "dropout", "seed", "batch_size")
INTEGER_KEYS = ("seed", "batch_size")
# Tune's domains as the job file writes them: the name and how many values it takes.
RANGE_DOMAINS = ("uniform", "loguniform", "randint")  # [low, high]
LIST_DOMAINS = ("choice", "grid_search")  # [value, ...]
OPTIMIZERS = ("sgd", "adam", "adamw")
SWEEP_LIMITS: dict[str, tuple[int, int, str]] = {
    "trials": (1, 100_000, "samples drawn from the search space"),
    "epochs": (1, 10_000, "epochs every trial trains"),
    "steps_per_epoch": (1, 10**7, "training steps per epoch"),
    "max_width": (1, 4096, "models fused into one job"),
}


@dataclass(frozen=True)
class SweepJob:
    workload_ref: str  # a reference workload's name or the user's `module:factory`
    search_space: dict[str, Any]  # as the job file gives it (`{domain: [...]}` or a constant)
    trials: int
    optimizer: str = "adam"
    epochs: int = 3
    steps_per_epoch: int = 20
    max_width: int = 64
    memory_free_gb: float | None = None
    seed: int = 0
    name: str = "sweep"
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    workload = "sweep"
    world_size = 1  # every fused group trains on one device

    @property
    def is_reference(self) -> bool:
        """Whether the model is one of the reference workloads (the calibration measures
        their fusion curves; a user's own is measured when its sweep is planned)."""
        return ":" not in self.workload_ref

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "workload": "sweep",
            ("model" if self.is_reference else "factory"): self.workload_ref,
            "search_space": self.search_space,
            "trials": self.trials,
            "optimizer": self.optimizer,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "max_width": self.max_width,
            "seed": self.seed,
        }
        if self.memory_free_gb is not None:
            out["memory_free_gb"] = self.memory_free_gb
        return out
