"""Models of a fused job as a function of its width B (how many models are fused).

- Throughput (samples/s summed over the models): T(B) = a·B / (1 + b·B + c·B²). At small B
  it grows about linearly (each added model rides on launches and dispatch the others already
  pay); b bends it towards the plateau a/b where the device is busy; c > 0 lets it fall again
  past B* = 1/√c, where the fused working set outgrows the caches. Fitted in log space (the
  widths span orders of magnitude of work) with a, b, c ≥ 0.
- Memory: peak(B) = intercept + slope·B; the intercept is the framework's own footprint,
  the slope what each model adds (weights, gradients, optimizer state, activations).

Both are fitted per (workload, batch size, optimizer) from the rows of
`probes.fusion.measure_fusion_width` and serialise as plain JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import linregress

from probes.vocabulary.ops import FUSION_OP
from probes.vocabulary.records import Measurement


class FusionModelError(ValueError):
    pass


@dataclass(frozen=True)
class FusionPoint:
    """One measured width: throughput summed over models, and peak memory."""

    width: int
    samples_per_s: float
    peak_memory_bytes: float


def _curve(theta: np.ndarray, width: np.ndarray) -> np.ndarray:
    a, b, c = theta
    return a * width / (1.0 + b * width + c * width**2)


@dataclass
class FusionModel:
    workload: str
    batch_size: int
    optimizer: str
    a: float
    b: float
    c: float
    memory_intercept: float
    memory_slope: float
    widths: list[int]  # measured widths the model was fitted on
    fit_gmae: float  # geometric-mean relative error of the throughput curve on its own points

    @classmethod
    def fit(cls, workload: str, batch_size: int, optimizer: str, points: Sequence[FusionPoint]) -> "FusionModel":
        if len({p.width for p in points}) < 3:
            raise FusionModelError(
                f"{workload}: need throughput at 3 or more widths to fit, got {sorted({p.width for p in points})}"
            )
        width = np.array([p.width for p in points], dtype=np.float64)
        speed = np.array([p.samples_per_s for p in points], dtype=np.float64)
        if (speed <= 0).any():
            raise FusionModelError(f"{workload}: throughput must be positive, got {speed.tolist()}")

        def residual(theta: np.ndarray) -> np.ndarray:
            return np.log(_curve(theta, width)) - np.log(speed)

        single = float(np.exp(np.mean(np.log(speed[width == width.min()]))) / width.min())
        best = None
        for b0 in (1e-3, 0.05, 0.3, 2.0):
            for c0 in (0.0, 1e-4, 1e-2):
                start = np.array([single * (1 + b0 + c0), b0, c0])
                fit = least_squares(residual, start, bounds=([1e-12, 0.0, 0.0], [np.inf, np.inf, np.inf]))
                if best is None or fit.cost < best.cost:
                    best = fit
        assert best is not None  # the loops above ran at least once
        a, b, c = (float(v) for v in best.x)
        memory = np.array([p.peak_memory_bytes for p in points], dtype=np.float64)
        line = linregress(width, memory)
        errors = np.abs(_curve(best.x, width) - speed) / speed
        gmae = float(np.exp(np.mean(np.log(np.maximum(errors, 1e-9)))))
        return cls(
            workload,
            int(batch_size),
            optimizer,
            a,
            b,
            c,
            float(line.intercept),
            max(float(line.slope), 0.0),
            sorted({int(w) for w in width}),
            gmae,
        )

    def throughput(self, width: int) -> float:
        """Predicted samples/s summed over `width` fused models."""
        return float(_curve(np.array([self.a, self.b, self.c]), np.array([float(width)]))[0])

    def step_s(self, width: int) -> float:
        """Predicted seconds of one step of all `width` models (each at the curve's batch size)."""
        return width * self.batch_size / self.throughput(width)

    def memory_bytes(self, width: int) -> float:
        return self.memory_intercept + self.memory_slope * width

    def extrapolated(self, width: int) -> bool:
        """True outside the measured widths: the curve is then a guess, flagged as such."""
        return not min(self.widths) <= width <= max(self.widths)

    def max_width_within(self, memory_cap_bytes: float) -> int:
        """The largest width whose predicted peak memory fits `memory_cap_bytes` (0 if none)."""
        if self.memory_slope <= 0:
            return 10**6 if self.memory_intercept <= memory_cap_bytes else 0
        return max(0, int(math.floor((memory_cap_bytes - self.memory_intercept) / self.memory_slope + 1e-9)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FusionModel":
        return cls(**data)


def fit_fusion_models(rows: Sequence[Measurement]) -> dict[str, FusionModel]:
    """One `FusionModel` per workload in `rows` (a workload's rows must share one batch size
    and optimizer: a model fitted on a mix would describe neither)."""
    return {key[0]: FusionModel.fit(key[0], key[1], key[2], points) for key, points in fusion_points(rows).items()}


def fusion_points(rows: Sequence[Measurement]) -> dict[tuple[str, int, str], list[FusionPoint]]:
    """The measured widths per (workload, batch size, optimizer); one key per workload."""
    groups: dict[tuple, list[FusionPoint]] = {}
    for r in rows:
        if r.op != FUSION_OP:
            continue
        key = (r.params["workload"], int(r.params["batch_size"]), r.params["optimizer"])
        groups.setdefault(key, []).append(
            FusionPoint(int(r.params["width"]), float(r.extra["samples_per_s"]), float(r.extra["peak_memory_bytes"]))
        )
    workloads = [key[0] for key in groups]
    mixed = sorted({w for w in workloads if workloads.count(w) > 1})
    if mixed:
        raise ValueError(f"rows of {mixed} mix batch sizes or optimizers: {sorted(k for k in groups if k[0] in mixed)}")
    return groups


def held_out_errors(points: Sequence[FusionPoint]) -> tuple[np.ndarray, np.ndarray]:
    """Each interior width left out in turn: the curve fitted on the other widths, its relative
    throughput error at the left-out one, beside the baseline's (a power law, throughput =
    k·B^p, fitted the same way). The widest and narrowest stay in every fit: left out, they
    would test extrapolation, which the policy never does (it ranks measured widths only).
    Empty with fewer than four widths (three are the least the curve is fitted on)."""
    widths = sorted({p.width for p in points})
    errors: list[float] = []
    baseline: list[float] = []
    if len(widths) < 4:
        return np.asarray(errors), np.asarray(baseline)
    for left in widths[1:-1]:
        train = [p for p in points if p.width != left]
        test = [p for p in points if p.width == left]
        curve = FusionModel.fit("held-out", 1, "any", train)
        slope, intercept = np.polyfit(np.log([p.width for p in train]), np.log([p.samples_per_s for p in train]), 1)
        for p in test:
            errors.append(abs(curve.throughput(p.width) - p.samples_per_s) / p.samples_per_s)
            power = math.exp(intercept) * p.width**slope
            baseline.append(abs(power - p.samples_per_s) / p.samples_per_s)
    return np.asarray(errors), np.asarray(baseline)
