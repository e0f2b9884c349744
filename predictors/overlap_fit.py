"""Fitting an overlapped pair's costs (`predictors.overlap_model.OverlapCosts`) to measured pairs:
the transfer line that splits a collective's cost into slices, then the slice overhead,
communication's share of compute and the communication factor, on the fused / unfused ratio.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import minimize

from predictors.overlap_model import OverlapCosts, PairPrediction

# A transfer that runs beside compute is never faster than the same transfer alone, which the
# collective model prices: a factor below 1 would let the fit explain a fused form's measured
# time by cheaper communication and predict a gain no overlap produces (fitted freely, GEMM +
# all-reduce took 0.66 and was substituted where it measured 4-6% slower).
MIN_COMM_FACTOR = 1.0


def fit_transfer_line(samples: Sequence[tuple[float, int, float]]) -> tuple[float, float, float]:
    """(latency per slice, seconds per byte, geometric mean relative error) of
    `k * latency + bytes * per_byte` fitted to measured transfer-only forms
    `(bytes, k, seconds)`: non-negative least squares on relative error, so a 50 us form
    counts as much as a 50 ms one."""
    from scipy.optimize import nnls

    if len(samples) < 2:
        raise ValueError("a transfer line needs at least two measured transfer forms")
    a = np.array([[k, b] for b, k, _ in samples], dtype=float)
    t = np.array([s for _, _, s in samples], dtype=float)
    (latency, per_byte), _ = nnls(a / t[:, None], np.ones_like(t))
    errors = np.abs(a @ [latency, per_byte] - t) / t
    return float(latency), float(per_byte), float(np.exp(np.mean(np.log(np.maximum(errors, 1e-9)))))


def fit_overlap_costs(
    points: Sequence[tuple[Callable[[OverlapCosts], PairPrediction], dict[int, float]]],
    transfer_line: tuple[float, float] | None = None,
) -> OverlapCosts:
    """Fit (slice overhead, communication's compute share, communication factor) to measured pairs.

    `points`: per measured pair, a function predicting its forms under given costs, and the
    measured time per slice count (1 = unfused). Minimises the squared log error of the
    fused / unfused ratio over every measured slice count: a grid over the three, then a
    local refinement around the best cell. `transfer_line` (latency, seconds per byte), when
    given, prices the communication slices (see `OverlapCosts.slice_comm_s`)."""
    latency, per_byte = transfer_line if transfer_line else (None, None)
    if not points:
        raise ValueError("no measured pairs to fit overlap costs to")
    measured = [(predict, times) for predict, times in points if 1 in times and len(times) > 1]
    if not measured:
        raise ValueError("measured pairs need the unfused form and at least one fused form")
    scale = float(np.median([t[1] for _, t in measured]))

    def loss(o: float, s: float, f: float) -> float:
        total = 0.0
        for predict, times in measured:
            pred = predict(OverlapCosts(o, s, f, transfer_latency_s=latency, transfer_s_per_byte=per_byte))
            for k, t in times.items():
                if k == 1 or k not in pred.fused_s:
                    continue
                total += (math.log(pred.fused_s[k] / pred.unfused_s) - math.log(t / times[1])) ** 2
        return total

    # A coarse grid (each evaluation simulates every measured pair at every slice count), then
    # Nelder-Mead from its best cell.
    overheads = [0.0] + list(scale * np.logspace(-4, 0, 7))
    shares = list(np.linspace(0.0, 1.0, 6))
    factors = [MIN_COMM_FACTOR + 0.2 * i for i in range(4)]
    start = min(itertools.product(overheads, shares, factors), key=lambda p: loss(*p))
    # Refine from the best cell (Nelder-Mead; the bounds are kept by clipping inside the loss).
    clip = lambda p: (max(0.0, p[0] * scale), min(1.0, max(0.0, p[1])), max(MIN_COMM_FACTOR, p[2]))  # noqa: E731
    res = minimize(
        lambda p: loss(*clip(p)),
        [start[0] / scale, start[1], start[2]],
        method="Nelder-Mead",
        options={
            "xatol": 1e-4,
            "fatol": 1e-10,
            "maxiter": 400,
            "initial_simplex": _simplex([start[0] / scale, start[1], start[2]]),
        },
    )
    o, s, f = clip(res.x) if res.fun < loss(*start) else start
    errors = []
    for predict, times in measured:
        pred = predict(OverlapCosts(o, s, f, transfer_latency_s=latency, transfer_s_per_byte=per_byte))
        for k, t in times.items():
            if k != 1 and k in pred.fused_s:
                errors.append(abs(pred.fused_s[k] / pred.unfused_s - t / times[1]) / (t / times[1]))
    gmae = float(np.exp(np.mean(np.log(np.maximum(errors, 1e-9))))) if errors else None
    return OverlapCosts(float(o), float(s), float(f), len(measured), gmae, latency, per_byte)


def _simplex(x0: list[float]) -> np.ndarray:
    """A starting simplex around `x0` with steps the size of the search grid's cells."""
    steps = [max(abs(x0[0]), 1e-4), 0.1, 0.1]
    return np.array([x0] + [[x + (steps[i] if j == i else 0.0) for j, x in enumerate(x0)] for i in range(3)])
