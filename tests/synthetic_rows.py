"""Synthetic GEMM measurements with a known cost (2 µs + flops at 20 GFLOP/s), for tests that
need a fitted bundle without probing; and a small DLRM job's dict."""

from typing import Any

import numpy as np

from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement


def gemm_rows(rng: np.random.Generator, n: int) -> list[Measurement]:
    rows = []
    for _ in range(n):
        m, n_, k = (int(x) for x in rng.integers(8, 1024, size=3))
        p = gemm_params(m, n_, k)
        rows.append(Measurement("gemm", p, 2e-6 + p["flops"] / 2e10, 0, 5))
    return rows


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
