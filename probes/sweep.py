"""Sweep generation: which probe points to measure, in an order that survives a short budget.

Local points (GEMM, embedding) are interleaved across families and shuffled by seed, so a
sweep cut short still spans every family and the whole range; collective sizes are visited in
bit-reversed order of their exponent for the same reason. Points derived from a job (its MLP
layers, its tables grouped as the sharders would group them) come first: they are where the
predictor will be asked.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from probes.collective import COLLECTIVE_OPS, measure_collective
from probes.embedding import TableShape, measure_tbe
from probes.gemm import linear_layer_gemms, measure_gemm
from probes.indices import Distribution
from probes.records import Measurement

LOCAL_FAMILIES = ("gemm", "embedding")


@dataclass(frozen=True)
class ProbeSpec:
    family: str
    params: dict[str, Any] = field(hash=False)
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "params": self.params, "key": self.key}


def run_local_probe(spec: ProbeSpec, device: str = "cpu") -> list[Measurement]:
    """Run one GEMM or embedding probe point on `device`."""
    p = spec.params
    if spec.family == "gemm":
        return [measure_gemm(p["M"], p["N"], p["K"], p.get("dtype", "float32"), device=device)]
    if spec.family == "embedding":
        tables = [TableShape(e, d, l, Distribution.parse(dist)) for e, d, l, dist in p["tables"]]
        return measure_tbe(tables, p["B"], device=device, seed=p.get("seed", 0))
    raise ValueError(f"{spec.family!r} is not a local probe family; expected one of {LOCAL_FAMILIES}")


def run_collective_probe(spec: ProbeSpec, device: str = "cpu") -> list[Measurement]:
    """Run one collective or training point; every member of the current process group must call it."""
    if spec.family == "training":
        return run_training_probe(spec, device)
    return measure_collective(spec.params["op"], spec.params["bytes"], device=device, scope=spec.params.get("scope", "intra"))


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def gemm_specs(n: int, seed: int, max_dim: int = 2048) -> list[ProbeSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m, nn, k = (_log_uniform(rng, 8, max_dim) for _ in range(3))
        out.append(ProbeSpec("gemm", {"M": m, "N": nn, "K": k, "dtype": "float32"}, f"gemm:{m}x{nn}x{k}"))
    return out


_DISTS: list[Any] = ["uniform", {"zipf": 0.8}, {"zipf": 1.05}, {"zipf": 1.2}]


def embedding_specs(
    n: int, seed: int, max_rows: int = 500_000, max_batch: int = 4096, max_table_bytes: int = 256 * 2**20
) -> list[ProbeSpec]:
    """Random table sets: T tables each with its own rows, dim, pooling and distribution.

    A set whose weights exceed `max_table_bytes` is drawn again, so probes stay inside memory.
    """
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in range(n):
        T = int(rng.integers(1, 9))
        while True:
            tables = [
                [
                    _log_uniform(rng, 1_000, max_rows),
                    int(rng.choice([8, 16, 32, 64, 128])),
                    _log_uniform(rng, 1, 64),
                    _DISTS[int(rng.integers(0, len(_DISTS)))],
                ]
                for _ in range(T)
            ]
            if sum(e * d * 4 for e, d, _, _ in tables) <= max_table_bytes:
                break
        B = _log_uniform(rng, 64, max_batch)
        out.append(ProbeSpec("embedding", {"tables": tables, "B": B, "seed": i}, f"emb:{i}"))
    return out


def job_specs(job, table_groups: Iterable[Sequence[int]] = ()) -> list[ProbeSpec]:
    """The points a DLRM job will be predicted at: its MLP GEMMs and its per-rank table sets."""

    out: list[ProbeSpec] = []
    B, W = job.batch_size, job.world_size
    seen = set()
    for fan_in, fan_out in job.dense_layers():
        for m, n, k in linear_layer_gemms(B, fan_in, fan_out):
            if (m, n, k) not in seen:
                seen.add((m, n, k))
                out.append(ProbeSpec("gemm", {"M": m, "N": n, "K": k, "dtype": "float32"}, f"job-gemm:{m}x{n}x{k}"))
    groups = {tuple(sorted(g)) for g in table_groups if g}
    for i, group in enumerate(sorted(groups)):
        tables = [
            [job.tables[t].num_embeddings, job.tables[t].embedding_dim, job.tables[t].pooling_factor,
             job.tables[t].distribution.to_json()]
            for t in group
        ]
        out.append(ProbeSpec("embedding", {"tables": tables, "B": B * W, "seed": job.seed}, f"job-emb:{group}"))
    return out


def interleave(*lists: Sequence[ProbeSpec]) -> list[ProbeSpec]:
    return [s for group in itertools.zip_longest(*lists) for s in group if s is not None]


def _bit_reversed(n: int) -> list[int]:
    bits = max(1, (n - 1).bit_length())
    order = sorted(range(2**bits), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))
    return [i for i in order if i < n]


def collective_specs(
    world: int, max_bytes: int, scope: str = "intra", min_bytes: int = 4, per_octave: int = 2
) -> list[ProbeSpec]:
    """Message sizes from `min_bytes` to `max_bytes`, `per_octave` per doubling (2: 2^k and
    2^(k+1/2)), visited coarse-to-fine so a cut-short sweep still spans the range."""
    sizes = []
    b = min_bytes
    while b <= max_bytes:
        sizes.extend(s for s in (int(b * 2 ** (i / per_octave)) for i in range(per_octave)) if s <= max_bytes)
        b *= 2
    sizes = sorted(set(sizes))
    out = []
    for i in _bit_reversed(len(sizes)):
        for op in COLLECTIVE_OPS:
            out.append(ProbeSpec("collective", {"op": op, "bytes": sizes[i], "world": world, "scope": scope}, f"{op}:{sizes[i]}"))
    return out


def default_max_collective_bytes(device: str) -> int:
    """Largest message: bounded by free memory on a GPU; on CPU, 64 MiB keeps gloo quick."""
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(2 ** math.floor(math.log2(free / 4)))
    return 64 * 2**20


def training_specs(n: int, seed: int, world: int) -> list[ProbeSpec]:
    """Small random DLRMs whose steps are dominated by framework (CPU-side) overhead.

    Kernels are tiny, so the gap between a measured step and the sum of its predicted kernels
    is the per-iteration, per-layer and per-table overhead the cost model must add.
    """
    rng = np.random.default_rng(seed + 2)
    out = []
    for i in range(n):
        n_tables = int(rng.integers(1, 13))
        job = {
            "name": f"overhead{i}",
            "workload": "dlrm",
            "world_size": world,
            "batch_size": int(rng.choice([16, 32, 64, 128])),
            "seed": i,
            "dense": {
                "num_dense_features": int(rng.integers(4, 17)),
                "bottom_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(1, 5)))],
                "top_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(0, 4)))] + [1],
            },
            "tables": [
                {
                    "name": f"t{j}",
                    "num_embeddings": int(rng.integers(100, 2000)),
                    "embedding_dim": int(rng.choice([4, 8, 16])),
                    "pooling_factor": int(rng.integers(1, 5)),
                    "distribution": "uniform",
                }
                for j in range(n_tables)
            ],
        }
        placement = [int(r) for r in rng.integers(0, world, size=n_tables)]
        out.append(ProbeSpec("training", {"job": job, "table_to_rank": placement}, f"train:{i}"))
    return out


def run_training_probe(spec: ProbeSpec, device: str = "cpu", iterations: int = 30, warmup: int = 5) -> list[Measurement]:
    """A few real DLRM steps on the current process group; rank 0 returns the step time."""
    import torch.distributed as dist

    from probes.jobspec import JobSpec
    from probes.workloads.dlrm import ShardedDLRM

    job = JobSpec.from_dict(spec.params["job"])
    placement = spec.params["table_to_rank"]
    model = ShardedDLRM(job, placement, dist.get_rank(), dist.get_world_size(), torch.device(device))
    result = model.run(iterations, warmup)
    if dist.get_rank() != 0:
        return []
    times = np.asarray(result.iteration_s)
    q1, q3 = np.percentile(times, [25, 75])
    return [
        Measurement(
            "dlrm_step", {"job": spec.params["job"], "table_to_rank": placement}, float(np.median(times)),
            float(q3 - q1), len(times), device=device, world_size=dist.get_world_size(), family="training",
        )
    ]
