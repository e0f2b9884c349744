"""Synthetic GEMM measurements with a known cost (2 µs + flops at 20 GFLOP/s), for tests that
need a fitted bundle without probing."""

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
