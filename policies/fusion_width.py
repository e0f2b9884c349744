"""Fusion-width policy: how many repetitive jobs to fuse per device, and how to group a sweep.

The width B is chosen on the fitted `FusionModel`: candidate widths up to the user's maximum
are ranked by predicted throughput, those whose predicted peak memory passes the cap marked
infeasible. The candidates are the widths of the form the probe measured (powers of two), not
every integer: the curve is fitted at those widths, and between them it interpolates a smooth
shape that kernels need not follow (grouped convolutions and batched GEMMs take shape-dependent
code paths), so a width no probe ran has no measurement behind it. (One benchmark run put a
6-wide CNN at 0.66x of its 4- and 8-wide neighbours; that run measured two widths at once and
its 8-wide point moved by 42% in the next run, so it shows the risk, not its size.) Pass
`widths` to rank other widths, after probing them.

The choice is the smallest candidate within `tolerance` of the best predicted throughput:
past the knee the curve is flat within the model's own error, and a narrower fused job holds
less memory and leaves more groups to spread over devices.

A sweep of N trials is then split into fused groups: trials fuse only when every
infusible hyper-parameter (batch size, architecture switches: anything not in
`FUSIBLE_KEYS`) is equal, and each such class is cut into ceil(n / B) groups of near-equal
size (so 10 trials at B = 8 run as 5 + 5, not 8 + 2).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Sequence

from policies.plan import Candidate, Decision
from policies.policy import Estimator, decide, decision_for
from predictors.fusion_model import FusionModel

# Hyper-parameters that can differ between fused models (HFTA's fusible set).
FUSIBLE_KEYS = frozenset({"lr", "beta1", "beta2", "weight_decay", "momentum", "dropout", "seed", "eps"})
DEFAULT_TOLERANCE = 0.02


class FusionPolicyError(ValueError):
    pass


def power_of_two_widths(max_width: int) -> list[int]:
    """1, 2, 4, ... up to `max_width`: the widths the probe measures."""
    return [2**k for k in range(int(max_width).bit_length()) if 2**k <= max_width]


def candidate_widths(model: FusionModel, max_width: int) -> list[int]:
    """Powers of two up to `max_width`, plus any other width the model was measured at."""
    return sorted(set(power_of_two_widths(max_width)) | {w for w in model.widths if w <= max_width})


def fusion_estimator(model: FusionModel, memory_cap_bytes: float) -> Estimator[int]:
    """Prices a width on the fitted fusion curve: one step of all `width` models (per-model
    batch), infeasible where the predicted peak memory passes the cap."""
    memory_limit = model.max_width_within(memory_cap_bytes)

    def estimate(name: str, width: int) -> Candidate:
        speed, memory = model.throughput(width), model.memory_bytes(width)
        feasible = width <= memory_limit
        detail: dict[str, Any] = {
            "width": width,
            "samples_per_s": speed,
            "peak_memory_bytes": memory,
            "extrapolated": model.extrapolated(width),
        }
        if not feasible:
            detail["reason"] = (
                f"predicted peak memory {memory / 2**20:.0f} MiB exceeds the cap {memory_cap_bytes / 2**20:.0f} MiB"
            )
        return Candidate(f"width={width}", model.step_s(width) * 1e3 if feasible else None, feasible, detail)

    return estimate


class FusionWidthPolicy:
    """The smallest width within `tolerance` of the best predicted throughput (module docstring)."""

    name = "fusion_width"

    def __init__(
        self,
        model: FusionModel,
        memory_cap_bytes: float,
        max_width: int = 64,
        tolerance: float = DEFAULT_TOLERANCE,
        widths: Sequence[int] | None = None,
    ):
        if max_width < 1:
            raise FusionPolicyError(f"max_width: expected an integer >= 1, got {max_width!r}")
        if not 0 <= tolerance < 1:
            raise FusionPolicyError(f"tolerance: expected 0 <= tolerance < 1, got {tolerance!r}")
        self.model, self.memory_cap_bytes, self.max_width, self.tolerance = (
            model,
            memory_cap_bytes,
            max_width,
            tolerance,
        )
        self.widths = list(widths or candidate_widths(model, max_width))

    def options(self) -> Iterable[tuple[str, int]]:
        return ((f"width={w}", w) for w in self.widths)

    def choose(self, priced: list[Candidate], estimate: Estimator[int]) -> Decision:
        model, cap = self.model, self.memory_cap_bytes
        feasible = [c for c in priced if c.feasible]
        if not feasible:
            raise FusionPolicyError(
                f"{model.workload}: even one model is predicted to need {model.memory_bytes(1) / 2**20:.0f} MiB, over "
                f"the cap of {cap / 2**20:.0f} MiB"
            )
        best_speed = max(c.detail["samples_per_s"] for c in feasible)
        chosen = min(
            (c for c in feasible if c.detail["samples_per_s"] >= (1 - self.tolerance) * best_speed),
            key=lambda c: c.detail["width"],
        )
        candidates = sorted(priced, key=lambda c: (not c.feasible, -c.detail["samples_per_s"], c.detail["width"]))
        memory_limit = model.max_width_within(cap)
        detail = {
            "workload": model.workload,
            "batch_size": model.batch_size,
            "optimizer": model.optimizer,
            "width": chosen.detail["width"],
            "samples_per_s": chosen.detail["samples_per_s"],
            "speedup_vs_one": chosen.detail["samples_per_s"] / model.throughput(1),
            "peak_memory_bytes": chosen.detail["peak_memory_bytes"],
            "memory_cap_bytes": float(cap),
            "width_limit": min(int(self.max_width), memory_limit),
            "limited_by": "memory" if memory_limit < self.max_width else "max_width",
            "tolerance": self.tolerance,
            "extrapolated": chosen.detail["extrapolated"],
        }
        return decision_for(self.name, chosen, candidates, detail)


def choose_width(
    model: FusionModel,
    memory_cap_bytes: float,
    max_width: int = 64,
    tolerance: float = DEFAULT_TOLERANCE,
    widths: Sequence[int] | None = None,
    estimate: Estimator[int] | None = None,
) -> Decision:
    """Rank `widths` (default `candidate_widths`) by predicted throughput (or by `estimate`);
    see the module docstring for the choice."""
    policy = FusionWidthPolicy(model, memory_cap_bytes, max_width, tolerance, widths)
    return decide(policy, estimate or fusion_estimator(model, memory_cap_bytes))


def infusible_key(trial: dict[str, Any], fusible: Iterable[str] = FUSIBLE_KEYS) -> str:
    """The part of a trial's config that must be equal for trials to fuse, as a stable key."""
    fusible = set(fusible)
    return json.dumps({k: v for k, v in sorted(trial.items()) if k not in fusible}, sort_keys=True, default=str)


def partition_trials(
    trials: Sequence[dict[str, Any]], width: int, fusible: Iterable[str] = FUSIBLE_KEYS
) -> list[list[int]]:
    """Indices of `trials` in fused groups of at most `width`: equal infusible settings only,
    each class split into near-equal groups. Every trial appears exactly once; groups keep
    the trials' order."""
    if width < 1:
        raise FusionPolicyError(f"width: expected an integer >= 1, got {width!r}")
    classes: dict[str, list[int]] = {}
    for i, trial in enumerate(trials):
        classes.setdefault(infusible_key(trial, fusible), []).append(i)
    groups: list[list[int]] = []
    for members in classes.values():
        count = math.ceil(len(members) / width)
        base, extra = divmod(len(members), count)
        start = 0
        for g in range(count):
            size = base + (1 if g < extra else 0)
            groups.append(members[start : start + size])
            start += size
    return groups
