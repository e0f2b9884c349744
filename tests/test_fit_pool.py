"""The per-op fits spread over worker processes give the bundle the fits in this process give:
the same models, scores, held-out rows, unfitted ops and progress."""

import json

import numpy as np
import pytest
from synthetic_rows import gemm_rows
from test_opmodels import collective_rows

from benchmarks.fit_speed import differences
from predictors.fit import cross_validate_op, fit_op, fit_performance_model
from predictors.fit_pool import WHOLE, FitFailure, FitTask, in_process, op_tasks, run_task, worker_pool
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement


def mixed_rows() -> list[Measurement]:
    """A GEMM sweep, a noisy collective (its curve searched by nested CV), and an op with too
    few rows to fit (a ValueError in its worker)."""
    rng = np.random.default_rng(5)
    few = [Measurement("memcpy", {"bytes": 1024.0, "kind": "d2d"}, 1e-6, 0.0, 3)]
    return gemm_rows(rng, 40) + collective_rows("all_reduce", 40e-6, 3e9, noise=0.05, seed=1) + few


def plain(model, judged) -> dict:
    return json.loads(json.dumps({"bundle": model.to_dict(), "judged": [r.to_row() for r in judged]}, default=str))


def close(a, b) -> bool:
    """Equal JSON but for a number's last digits (a worker's BLAS may round a sum otherwise):
    the benchmark's own comparison (`fit_speed.differences`, within its `REL_TOL`)."""
    return not differences(a, b)[0]


def test_a_pool_of_workers_fits_the_bundle_this_process_fits():
    rows = mixed_rows()
    progress: dict[str, list] = {"in_process": [], "pool": []}
    here = fit_performance_model(
        rows, "hw", on_op=lambda op, ok: progress["in_process"].append((op, ok)), mapper=in_process
    )
    pooled = fit_performance_model(
        rows, "hw", on_op=lambda op, ok: progress["pool"].append((op, ok)), mapper=worker_pool(2)
    )
    assert close(plain(*here), plain(*pooled))
    model = pooled[0]
    assert sorted(model.ops) == ["all_reduce", "gemm"]
    assert model.meta["unfitted"]["memcpy"] == here[0].meta["unfitted"]["memcpy"]
    assert model.meta["unfitted"]["memcpy"] == "1 rows: memcpy: no direction group has 2 measurements to fit"
    assert close(
        [list(p) for p in model.out_of_fold["all_reduce"]], [list(p) for p in here[0].out_of_fold["all_reduce"]]
    )
    # every op reported once when its last fit is in, the unfittable one as not fitted
    assert (
        sorted(progress["pool"])
        == sorted(progress["in_process"])
        == [("all_reduce", True), ("gemm", True), ("memcpy", False)]
    )


def test_an_ops_tasks_are_its_whole_fit_and_each_fold():
    rows = gemm_rows(np.random.default_rng(0), 12)
    folds = np.arange(12) % 3
    tasks = op_tasks("gemm", rows, folds, seed=0)
    assert [t.fold for t in tasks] == [WHOLE, 0, 1, 2]
    # a fold's result is `fit_op` on the other folds, judged on its own rows
    task, fold_fit = run_task(tasks[2])
    assert task is tasks[2] and fold_fit.stats["n_train"] == 8 and len(fold_fit.held_out) == 4
    # the assembled op is each fold's own fit, in fold order, and the model on every row
    whole = cross_validate_op("gemm", rows, folds, seed=0)
    by_fold = [
        fit_op("gemm", [r for r, f in zip(rows, folds) if f != k], [r for r, f in zip(rows, folds) if f == k], 0)
        for k in range(3)
    ]
    assert whole.held_out == [pair for fold_fit in by_fold for pair in fold_fit.held_out]
    assert whole.model.to_dict() == run_task(tasks[0])[1].to_dict()
    assert whole.stats["n_train"] == 12 and whole.stats["n"] == 12 and whole.stats["n_unpriced"] == 0


def test_a_fold_that_cannot_be_fitted_leaves_its_rows_unpriced():
    """Two float32 products in different folds and a bfloat16 one: every fold's other rows hold
    no dtype with two measurements, so no fold fits; the model on all three still does."""
    rows = [
        Measurement("gemm", gemm_params(64, 64, 64 * (i + 1), dtype), 1e-5 * (i + 1), 0.0, 5)
        for i, dtype in enumerate(("float32", "float32", "bfloat16"))
    ]
    fitted = cross_validate_op("gemm", rows, np.array([0, 1, 1]), seed=0)
    assert fitted.stats["n_unpriced"] == 3 and fitted.held_out == []


def test_an_unexpected_error_in_a_fold_ends_the_fit_with_its_traceback(monkeypatch):
    import predictors.fit as fit

    def broken(*args, **kwargs):
        raise TypeError("a bug in a fold's fit")

    monkeypatch.setattr(fit, "fit_op", broken)  # in this process: `in_process` runs the tasks here
    rows = gemm_rows(np.random.default_rng(0), 12)
    with pytest.raises(RuntimeError, match="TypeError: a bug in a fold's fit"):
        cross_validate_op("gemm", rows, np.arange(12) % 3, seed=0)
    # an op whose fit on every row cannot be made is unfitted, as when its folds never ran
    with pytest.raises(ValueError, match="no dtype group"):
        cross_validate_op("gemm", rows[:1], np.array([0]), seed=0)


def test_a_fit_that_cannot_be_made_is_a_record_with_the_reason():
    rows = gemm_rows(np.random.default_rng(0), 1)
    _, failed = run_task(FitTask("gemm", rows, np.array([-1]), seed=0))
    assert isinstance(failed, FitFailure) and failed.message
    with pytest.raises(ValueError, match=failed.message[:20]):
        cross_validate_op("gemm", rows, np.array([-1]), seed=0)


def test_one_core_or_one_task_runs_in_this_process():
    assert worker_pool(1) is in_process
    rows = gemm_rows(np.random.default_rng(0), 6)
    tasks = op_tasks("gemm", rows, np.full(6, -1), seed=0)  # no folds: the whole fit alone
    done = list(worker_pool(2)(run_task, tasks))
    assert len(done) == 1 and done[0][0] is tasks[0]  # not pickled to a worker: the same object
