"""The per-op fits spread over worker processes give the bundle the fits in this process give:
the same models, scores, held-out rows, unfitted ops and progress."""

import json

import numpy as np
import pytest
from synthetic_rows import gemm_rows
from test_opmodels import collective_rows

from predictors.fit import cross_validate_op, fit_performance_model
from predictors.fit_pool import WHOLE, FitFailure, FitTask, in_process, op_tasks, run_task, worker_pool
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
    """Equal JSON but for a number's last digits (a worker's BLAS may round a sum otherwise)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, nan_ok=True)
    return a == b


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
    # the assembled op is the serial cross-validation's
    whole = cross_validate_op("gemm", rows, folds, seed=0)
    assert whole.stats["n_train"] == 12 and len(whole.held_out) == 12


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
