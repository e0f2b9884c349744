"""Where a calibration's per-op fits run: one task per op and fold, in this process or spread
over worker processes on this machine's cores.

Why: a calibration's fit is mostly its collective curves, whose breakpoints are searched by
nested cross-validation in every fold (`collective_model`), and it grows with the groups a
cluster has (every group size, within and across nodes): the kernels of #26's 12-02 03:36
calibration took 292-297 s to fit on one of this VM's two cores (`benchmarks/fit_speed.py`).
Each op's model on all its rows and each of
its folds' models are independent fits of their own rows, so they are tasks (`FitTask`) that
any `Mapper` may run; the caller assembles their results in the op's order, so the bundle is
the same wherever they ran (`benchmarks/fit_speed.py` compares it to the serial fit's, as JSON).

The pool is joblib's (loky worker processes, started once and reused; their BLAS threads
limited so workers do not oversubscribe the cores), sized by `joblib.cpu_count()`, which
honours a container's CPU quota: a KubeRay head offers Ray no CPUs (`num-cpus: "0"`), so the
fit stays on the driver's own machine, in its own processes, and never waits for a Ray slot.
A worker imports only this package's modelling core (numpy, scipy, scikit-learn), never torch.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from predictors.families import default_model_for
from predictors.opmodels import OpModel
from probes.vocabulary.records import Measurement

WHOLE = -1  # a task's `fold` for the op's model on all its rows


@dataclass(frozen=True)
class FitTask:
    """One fit of one op: its model on every row (`fold` WHOLE) or fold `fold` of its k-fold
    cross-validation (`fit.fit_op` on the other folds, judged on this one)."""

    op: str
    rows: Sequence[Measurement]
    folds: np.ndarray  # each row's fold, -1 for none (`evaluation.fold_assignment`)
    seed: int
    fold: int = WHOLE


@dataclass(frozen=True)
class FitFailure:
    """A fit that could not be made, as the message the bundle reports for it: a record, so it
    crosses a process boundary as is. Too few or degenerate rows (a ValueError or KeyError) make
    the op unfitted or leave a fold's rows unpriced; anything else is `unexpected` (with its
    traceback) and ends the fit, unless the op's own fit on every row failed first, as the
    serial fit never reached its folds then."""

    message: str
    unexpected: bool = False


TaskResult = Any  # an OpModel (WHOLE), a fit.OpFit (a fold), or a FitFailure
Mapper = Callable[[Callable[[FitTask], TaskResult], Sequence[FitTask]], Iterable[tuple[FitTask, TaskResult]]]


def run_task(task: FitTask) -> tuple[FitTask, TaskResult]:
    """The task and its result (a ValueError or KeyError as a `FitFailure`)."""
    from predictors.fit import fit_op  # fit imports this module: the worker's fold fit, late

    try:
        if task.fold == WHOLE:
            model: OpModel = default_model_for(task.op, task.seed).fit(task.rows)
            return task, model
        train = [r for r, f in zip(task.rows, task.folds) if f != task.fold]
        test = [r for r, f in zip(task.rows, task.folds) if f == task.fold]
        return task, fit_op(task.op, train, test, task.seed)
    except (ValueError, KeyError) as exc:
        return task, FitFailure(str(exc))
    except Exception:  # raised where the op is judged (`fit.judged_op`), with the worker's traceback
        return task, FitFailure(traceback.format_exc(), unexpected=True)


def in_process(fn: Callable[[FitTask], TaskResult], tasks: Sequence[FitTask]) -> Iterable[tuple[FitTask, TaskResult]]:
    """Every task here, one after the other, in order."""
    return (fn(task) for task in tasks)


def worker_pool(workers: int | None = None) -> Mapper:
    """A mapper over `workers` processes (default: the cores this process may use, quota
    included); in this process where that is one. Results come as each task ends."""
    import joblib

    n = workers if workers is not None else joblib.cpu_count()
    if n <= 1:
        return in_process

    def run(fn: Callable[[FitTask], TaskResult], tasks: Sequence[FitTask]) -> Iterable[tuple[FitTask, TaskResult]]:
        if len(tasks) <= 1:
            return in_process(fn, tasks)
        parallel = joblib.Parallel(n_jobs=min(n, len(tasks)), return_as="generator_unordered")
        return parallel(joblib.delayed(fn)(task) for task in tasks)

    return run


def fold_ids(folds: np.ndarray) -> list[int]:
    """The folds a row assignment has, in order (-1, a row judged by none, is not one)."""
    return sorted(set(folds.tolist()) - {-1})


def op_tasks(op: str, rows: Sequence[Measurement], folds: np.ndarray, seed: int) -> list[FitTask]:
    """The op's model on all its rows, then one task per fold."""
    return [FitTask(op, rows, folds, seed)] + [FitTask(op, rows, folds, seed, f) for f in fold_ids(folds)]
