"""Synthetic GEMM measurements with a known cost (2 µs + flops at 20 GFLOP/s), for tests that
need a fitted bundle without probing, and such a bundle fitted once per session; and a small
DLRM job's dict."""

import copy
import functools
from typing import Any, Callable, TypeVar

import numpy as np

from predictors.performance_model import PerformanceModel
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement


def gemm_rows(rng: np.random.Generator, n: int) -> list[Measurement]:
    rows = []
    for _ in range(n):
        m, n_, k = (int(x) for x in rng.integers(8, 1024, size=3))
        p = gemm_params(m, n_, k)
        rows.append(Measurement("gemm", p, 2e-6 + p["flops"] / 2e10, 0, 5))
    return rows


Fitted = TypeVar("Fitted")


def fitted_once(fit: Callable[..., Fitted]) -> Callable[..., Fitted]:
    """`fit`, run once per session for each argument, its result handed out as a copy (a test
    may change the bundle it is given)."""
    cached = functools.lru_cache(maxsize=None)(fit)

    @functools.wraps(fit)
    def copy_of(*args: Any) -> Fitted:
        return copy.deepcopy(cached(*args))

    return copy_of


@fitted_once
def gemm_bundle(n: int) -> PerformanceModel:
    """The bundle fitted on `gemm_rows(default_rng(0), n)`, for the tests that price with it.
    Judged by two folds, not five: the model fitted on every row is the same (the folds only
    score it), and these tests read its prices, never its scores."""
    from predictors.fit import fit_performance_model

    model, _ = fit_performance_model(gemm_rows(np.random.default_rng(0), n), "synthetic", folds=2)
    return model


def small_dlrm_job(name: str, world_size: int) -> dict[str, Any]:
    """A small DLRM job: three 1000-row tables of dimension 8, pooling 2."""
    return {
        "name": name,
        "workload": "dlrm",
        "world_size": world_size,
        "batch_size": 32,
        "dense": {"num_dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "tables": [
            {"name": f"t{i}", "num_embeddings": 1000, "embedding_dim": 8, "pooling_factor": 2} for i in range(3)
        ],
    }
