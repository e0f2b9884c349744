"""Held-out scoring: k-fold cross-validation (or a seeded 80/20 split) per op, GMAE / MAPE /
std of relative error, and a model's ratio to its baseline on the same rows."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as t_dist

from probes.vocabulary.records import Measurement


@dataclass
class ErrorStats:
    gmae: float  # geometric mean of |pred - meas| / meas
    mape: float  # arithmetic mean of the same
    std: float
    n: int
    # 95% interval of the GMAE (a t-interval on the mean log error): how far a figure from n
    # held-out rows can be trusted; None below two rows
    gmae_low: float | None = None
    gmae_high: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def relative_errors(predict: Callable[[dict], float], rows: Sequence[Measurement]) -> np.ndarray:
    pred = np.array([predict(r.params) for r in rows])
    meas = np.array([r.median_s for r in rows])
    return np.abs(pred - meas) / meas


ERROR_FLOOR = 1e-6  # an exact hit must not send a geometric mean to zero


def geomean(values: Sequence[float] | np.ndarray) -> float:
    """Geometric mean of relative errors (each floored at ERROR_FLOOR); nan when empty."""
    if len(values) == 0:
        return float("nan")
    return float(np.exp(np.mean(np.log(np.maximum(np.asarray(values, dtype=np.float64), ERROR_FLOOR)))))


def error_stats(errors: np.ndarray) -> ErrorStats:
    if len(errors) == 0:
        return ErrorStats(float("nan"), float("nan"), float("nan"), 0)
    stats = ErrorStats(gmae=geomean(errors), mape=float(np.mean(errors)), std=float(np.std(errors)), n=int(len(errors)))
    if len(errors) >= 2:
        stats.gmae_low, stats.gmae_high = _exp_interval(_logs(errors))
    return stats


def _logs(errors: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(np.asarray(errors, dtype=np.float64), ERROR_FLOOR))


def mean_interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% t-interval of the mean of `values` (two or more)."""
    values = np.asarray(values, dtype=np.float64)
    half = float(t_dist.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values)))
    return float(values.mean() - half), float(values.mean() + half)


def mean_change(changes: Sequence[float] | np.ndarray) -> dict | None:
    """Paired changes over cycles (one figure of two codes or fits, cycle by cycle): their
    mean, its 95% interval (from two cycles) and the count, as the refit benchmarks report
    them. None when there are none."""
    values = np.asarray(changes, dtype=np.float64)
    if len(values) == 0:
        return None
    interval = list(mean_interval(values)) if len(values) >= 2 else None
    return {"mean_change": float(values.mean()), "interval": interval, "cycles": len(values)}


def _exp_interval(logs: np.ndarray) -> tuple[float, float]:
    """exp of the 95% t-interval of the mean of `logs` (two or more values)."""
    low, high = mean_interval(logs)
    return float(np.exp(low)), float(np.exp(high))


@dataclass
class PairedRatio:
    """A model's GMAE over its baseline's on the same rows, with the 95% t-interval of that
    ratio (from the rows' paired log errors): above 1 only where the interval says the model
    is worse, not merely where a handful of rows happened to favour the baseline."""

    ratio: float
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict:
        return asdict(self)


def paired_ratio(errors: np.ndarray, baseline_errors: np.ndarray) -> PairedRatio:
    diff = _logs(errors) - _logs(baseline_errors)
    if len(diff) == 0:
        return PairedRatio(float("nan"), None, None, 0)
    ratio = float(np.exp(diff.mean()))
    if len(diff) < 2:
        return PairedRatio(ratio, None, None, 1)
    return PairedRatio(ratio, *_exp_interval(diff), len(diff))


def clearly_better(reference_loss: np.ndarray, candidate_loss: np.ndarray, standard_errors: float) -> bool:
    """Whether a candidate's per-row losses beat the reference's on the same rows by more than
    `standard_errors` standard errors of the paired differences. A candidate picked as the best
    of several validates a little better than it will predict; a bar above one standard error,
    raised with the number of candidates compared, keeps the plain model unless the gain is real.

    `standard_errors` names a one-sided confidence (`t_threshold`): n rows estimate their spread
    with n - 1 degrees of freedom, and on the 4-7 rows a short calibration gives an element-wise
    op, 2 normal standard errors let a base whose extra coefficients extrapolate badly beat its
    baseline (11-28 19:44: softmax backward's base gained 2.68 standard errors over 5 rows left
    out in turn, then missed the row held out by 10x; Student's t asks 2.87)."""
    gain = np.asarray(reference_loss, dtype=np.float64) - np.asarray(candidate_loss, dtype=np.float64)
    if len(gain) < 2:
        return False
    threshold = t_threshold(standard_errors, len(gain) - 1)
    return float(np.mean(gain)) > threshold * float(np.std(gain, ddof=1) / np.sqrt(len(gain)))


def t_threshold(standard_errors: float, degrees: int) -> float:
    """Student's t with `degrees` degrees of freedom at the one-sided confidence that
    `standard_errors` normal standard errors give: a spread estimated from few values is itself
    uncertain, so the same confidence needs a larger multiple of it (2.0 -> 2.87 at 4 degrees,
    2.07 at 50)."""
    return float(t_dist.ppf(norm.cdf(standard_errors), degrees))


def clearly_better_folds(
    reference_loss: Sequence[np.ndarray], candidate_loss: Sequence[np.ndarray], standard_errors: float
) -> bool:
    """`clearly_better` for losses of k-fold cross-validation (one array per fold, the same rows
    for both): the gain's standard error is Nadeau and Bengio's corrected one over the folds'
    mean gains, (1/k + n_test/n_train) times their variance. The folds' models share most of
    their training rows, so their gains are not independent, and the per-row standard error
    understates how much the gain would move on another draw of rows (#26: one fold of a short
    calibration's embedding backward took trees that gained 27% on their 45 rows' folds and
    lost 53% on the 11 rows held out from them).

    `standard_errors` names the one-sided confidence of that many normal standard errors; the
    threshold is Student's t at that confidence with k - 1 degrees of freedom, since k fold
    means estimate their own spread (5 folds: 2.0 -> 2.87). With the normal threshold a 120 s
    default calibration's embedding and GEMM corrections were taken in some of the family
    judge's folds on small inner gains and held out 1.01x and 1.02x their baselines
    (`benchmarks/choice_rules.py`, rule `folds_z`)."""
    gains = [
        np.asarray(r, dtype=np.float64) - np.asarray(c, dtype=np.float64)
        for r, c in zip(reference_loss, candidate_loss)
    ]
    gains = [g for g in gains if len(g)]
    if len(gains) < 2:
        return False
    k = len(gains)
    fold_means = np.array([g.mean() for g in gains])
    spread = float(np.var(fold_means, ddof=1)) * (1.0 / k + 1.0 / (k - 1))  # n_test / n_train = 1 / (k - 1)
    threshold = t_threshold(standard_errors, k - 1)
    return float(np.concatenate(gains).mean()) > threshold * float(np.sqrt(spread))


def leave_one_out(
    residuals: Sequence[Measurement],
    kernels_s: Sequence[float],
    measured_s: Sequence[float],
    fit: Callable[[Sequence[Measurement]], Any],
) -> ErrorStats:
    """Whole steps, each predicted by its kernels plus an overhead fitted (`fit`) on every
    other step's residual: a calibration measures a dozen steps, and a 20% split would judge
    the step model by two or three of them."""
    return error_stats(leave_one_out_errors(residuals, kernels_s, measured_s, fit))


def leave_one_out_errors(
    residuals: Sequence[Measurement],
    kernels_s: Sequence[float],
    measured_s: Sequence[float],
    fit: Callable[[Sequence[Measurement]], Any],
) -> np.ndarray:
    """`leave_one_out`'s relative error of each step."""
    return np.abs(leave_one_out_signed(residuals, kernels_s, measured_s, fit))


def leave_one_out_signed(
    residuals: Sequence[Measurement],
    kernels_s: Sequence[float],
    measured_s: Sequence[float],
    fit: Callable[[Sequence[Measurement]], Any],
) -> np.ndarray:
    """Each step's (predicted - measured) / measured, its overhead fitted on the other steps:
    below 0 where the step model leans low on steps it did not see."""
    errors = []
    for i, row in enumerate(residuals):
        others = [r for j, r in enumerate(residuals) if j != i]
        if not others:
            break
        overhead = fit(others).predict(row.params)
        errors.append((kernels_s[i] + overhead - measured_s[i]) / measured_s[i])
    return np.asarray(errors)


CV_FOLDS = 5  # each row judged by a model fitted on the other 80%


def fold_assignment(rows: int, rng: np.random.Generator, folds: int = CV_FOLDS) -> np.ndarray:
    """Each of `rows` rows' fold, shuffled by `rng`: fold f is predicted by a model fitted on
    every other fold, so every row is held out once. Fewer rows than folds: one row per fold
    (leave one out); under 3 rows: none is held out (-1), as `split_by_op` holds none out."""
    if rows < 3:
        return np.full(rows, -1, dtype=np.int64)
    return rng.permutation(rows) % min(folds, rows)


def held_out_count(rows: int, test_fraction: float = 0.2) -> int:
    """How many of an op's `rows` `split_by_op` holds out: the fraction, at least one of 3+."""
    return max(int(round(rows * test_fraction)), 1) if rows >= 3 else 0


def split_by_op(
    rows: Sequence[Measurement], seed: int, test_fraction: float = 0.2
) -> tuple[list[Measurement], list[Measurement]]:
    """Per op, a random `test_fraction` of rows (at least one when an op has 3+) is held out."""
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        by_op[r.op].append(r)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for op in sorted(by_op):
        items = by_op[op]
        n_test = held_out_count(len(items), test_fraction)
        order = rng.permutation(len(items))
        test += [items[i] for i in order[:n_test]]
        train += [items[i] for i in order[n_test:]]
    return train, test
