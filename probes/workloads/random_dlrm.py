"""Random DLRM tasks drawn the way the performance-model anchor draws its evaluation tasks.

Each task gets about 0.7-1.3 x ranks x 13 tables (13 is the per-GPU table count the anchor
samples around), each with its own rows E, dim D, pooling L and index distribution (uniform,
zipf, or a table resampled from the shipped reuse-factor profile), a batch size from a few
choices, and a dense part of varied depth. `scale` shrinks rows (and pooling by its square root) so a task runs
in seconds on CPU ranks; the mix of table shapes stays the same.

Tasks are plain job dicts, validated through `JobSpec.from_dict`, so a benchmark runs them
with the same code path as a user's job file.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.reuse_profile import load_profile

TABLES_PER_RANK = 13
BATCH_SIZES = (128, 256, 512, 1024)
EMBEDDING_DIMS = (8, 16, 32, 64)


def _distribution(rng: np.random.Generator, profile_names: list[str]) -> Any:
    kind = rng.choice(["uniform", "zipf", "profile"], p=[0.3, 0.4, 0.3])
    if kind == "uniform":
        return "uniform"
    if kind == "zipf":
        return {"zipf": round(float(rng.uniform(0.8, 1.3)), 2)}
    return {"profile": str(rng.choice(profile_names))}


def random_dlrm_job(index: int, world_size: int, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
    """Job dict of random task `index` (deterministic in `seed` and `index`)."""
    rng = np.random.default_rng([seed, index, 7919])
    n_tables = max(1, int(round(rng.uniform(0.7, 1.3) * world_size * TABLES_PER_RANK)))
    profile_names = list(load_profile().names)
    max_rows = max(1000, int(2_000_000 * scale))
    max_pooling = max(4, int(round(64 * np.sqrt(scale))))  # pooling shrinks slower than rows
    tables = []
    for j in range(n_tables):
        tables.append(
            {
                "name": f"t{j}",
                # Rows log-uniform over three decades, as in production table-size spreads.
                "num_embeddings": int(np.exp(rng.uniform(np.log(max_rows / 1000), np.log(max_rows)))),
                "embedding_dim": int(rng.choice(EMBEDDING_DIMS)),
                "pooling_factor": int(np.clip(round(np.exp(rng.uniform(0, np.log(max_pooling)))), 1, max_pooling)),
                "distribution": _distribution(rng, profile_names),
            }
        )
    bottom_depth, top_depth = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    return {
        "name": f"random{index}",
        "workload": "dlrm",
        "world_size": world_size,
        "batch_size": int(rng.choice(BATCH_SIZES)),
        "iterations": 20,
        "warmup_iterations": 5,
        "seed": index,
        "dense": {
            "num_dense_features": 13,
            "bottom_mlp": [int(rng.choice([64, 128, 256])) for _ in range(bottom_depth)],
            "top_mlp": [int(rng.choice([64, 128, 256])) for _ in range(top_depth)] + [1],
        },
        "tables": tables,
    }


def random_dlrm_tasks(n: int, world_size: int, seed: int = 0, scale: float = 1.0) -> list[JobSpec]:
    return [JobSpec.from_dict(random_dlrm_job(i, world_size, seed, scale)) for i in range(n)]


def fitting_scale(indices: Sequence[int], world_size: int, seed: int, memory_bytes: int) -> float:
    """1.0 (full size), halved until each of the tasks `indices` has its tables (weights,
    gradients and optimizer state, about 3x their bytes) in at most a third of `memory_bytes`,
    the memory the task's ranks share; 1.0 when `memory_bytes` is unknown (0)."""
    scale = 1.0
    while memory_bytes > 0 and scale > 1e-3:
        biggest = max(
            (
                sum(t.bytes for t in JobSpec.from_dict(random_dlrm_job(i, world_size, seed, scale)).tables)
                for i in indices
            ),
            default=0,
        )
        if 3 * biggest <= memory_bytes / 3:
            return scale
        scale /= 2
    return scale
