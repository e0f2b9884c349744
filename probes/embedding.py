"""FBGEMM table-batched embedding (TBE) lookups, forward and backward, timed.

A probe point is a *set* of tables looked up together by one `SplitTableBatchedEmbeddingBags
Codegen` (as one rank does in a sharded DLRM); its features (probes/vocabulary/tbe_features.py)
are aggregated over the tables, so one model costs any rank's table set.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from probes.probe import LocalProbe, ProbeSpec, log_uniform
from probes.timing import time_callable
from probes.vocabulary.indices import Distribution, sample_indices
from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.ops import EMBEDDING_BWD_OP, EMBEDDING_FWD_OP
from probes.vocabulary.records import Measurement
from probes.vocabulary.tbe_features import CPU_WEIGHTS_PRECISIONS, WEIGHTS_PRECISIONS, batch_features


def check_weights_precision(weights_precision: str, device: torch.device | str) -> None:
    device = torch.device(device)
    allowed = WEIGHTS_PRECISIONS if device.type == "cuda" else CPU_WEIGHTS_PRECISIONS
    if weights_precision not in allowed:
        raise ValueError(
            f"weights_precision: expected one of {list(allowed)} on {device.type}, got {weights_precision!r}"
        )


def make_tbe(
    tables: Sequence[TableShape], device: torch.device, learning_rate: float = 0.01, weights_precision: str = "fp32"
):
    """A TBE over `tables` with the exact-SGD update fused into backward (as DLRM trains);
    `weights_precision` ("fp32", "fp16", "bf16" on CUDA) is how the tables are stored."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    device = torch.device(device)
    check_weights_precision(weights_precision, device)
    cuda = device.type == "cuda"
    location = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
    compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    specs = [(t.num_embeddings, t.embedding_dim, location, compute) for t in tables]
    kwargs: dict[str, Any] = {}
    if cuda:
        kwargs["device"] = device
    if weights_precision != "fp32":  # the fp32 default is left to FBGEMM, as it always was
        kwargs["weights_precision"] = SparseType(weights_precision)
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=learning_rate,
        pooling_mode=PoolingMode.SUM,
        **kwargs,
    )


def make_dense_tbe(tables: Sequence[TableShape], device: torch.device):
    """A TBE over `tables` whose weights are one dense parameter with a dense gradient: the
    kernel of data-parallel (replicated) tables, whose gradients are all-reduced like the MLPs'."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    module = DenseTableBatchedEmbeddingBagsCodegen(
        [(t.num_embeddings, t.embedding_dim) for t in tables],
        pooling_mode=PoolingMode.SUM,
        use_cpu=device.type != "cuda",
    )
    return module.to(device)


def make_batch(
    tables: Sequence[TableShape], batch_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Flat indices and offsets in TBE's table-major layout, plus each table's indices."""
    per_table = [sample_indices(t.num_embeddings, batch_size * t.pooling_factor, t.distribution, rng) for t in tables]
    lengths = np.concatenate([np.full(batch_size, t.pooling_factor, dtype=np.int64) for t in tables])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.concatenate(per_table), offsets, per_table


def measure_tbe(
    tables: Sequence[TableShape],
    batch_size: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_seconds: float = 1.5,
    distinct_batches: int = 8,
    weights_precision: str = "fp32",
    cold_backward: bool = True,
) -> list[Measurement]:
    """Time forward and backward (with the fused SGD update) of TBE batches, the tables
    stored in `weights_precision` ("fp32", "fp16"; "bf16" on CUDA only).

    Repeats cycle through `distinct_batches` different index batches: timing one batch over
    and over keeps its rows in cache and under-reports a real training step by ~1.7x. The
    backward is timed with the cache flushed after its setup forward (`time_callable`'s
    `flush_after_setup`), as it is in a step; `cold_backward=False` times it warm (only for
    showing the difference: `benchmarks/step_breakdown.py`).
    """
    device = torch.device(device)
    rng = np.random.default_rng(seed)
    tbe = make_tbe(tables, device, weights_precision=weights_precision)
    batches, feature_sets = [], []
    for _ in range(distinct_batches):
        flat, offsets, per_table = make_batch(tables, batch_size, rng)
        batches.append((torch.from_numpy(flat).to(device), torch.from_numpy(offsets).to(device)))
        feature_sets.append(batch_features(tables, batch_size, per_table, weights_precision))
    features = _mean_features(feature_sets)
    features["tables"] = [[t.num_embeddings, t.embedding_dim, t.pooling_factor, t.distribution.label()] for t in tables]
    state: dict[str, object] = {"i": 0}

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        state["i"] = (state["i"] + 1) % len(batches)
        return batches[state["i"]]

    def select() -> None:
        state["batch"] = next_batch()

    def forward() -> None:
        tbe(*state["batch"])

    fwd = time_callable(forward, device=device, max_seconds=max_seconds, setup=select)

    def forward_for_backward() -> None:
        out = tbe(*next_batch())
        state["out"], state["grad"] = out, torch.randn_like(out)

    def backward() -> None:
        state["out"].backward(state["grad"])

    # The setup's forward leaves the rows it read in cache; in a step the exchange and the dense
    # layers run between a lookup and its backward, which then finds them cold (on the host
    # too: flushed, a backward measured ~1.5-2x its warm time on 0.1-0.6 GB table sets).
    bwd = time_callable(
        backward, device=device, max_seconds=max_seconds, setup=forward_for_backward, flush_after_setup=cold_backward
    )
    common = dict(device=str(device), family="embedding")
    return [
        Measurement(EMBEDDING_FWD_OP, features, fwd.median_s, fwd.spread_s, fwd.repeats, **common),
        Measurement(EMBEDDING_BWD_OP, dict(features), bwd.median_s, bwd.spread_s, bwd.repeats, **common),
    ]


def _mean_features(feature_sets: list[dict[str, Any]]) -> dict[str, Any]:
    """Average the per-batch features (counts as floats, the histogram bin by bin)."""
    out: dict[str, Any] = {}
    for key, value in feature_sets[0].items():
        if key == "reuse_hist":
            out[key] = [round(float(x), 6) for x in np.mean([f[key] for f in feature_sets], axis=0)]
        elif key in ("T", "B", "weights_precision"):
            out[key] = value
        else:
            out[key] = float(np.mean([f[key] for f in feature_sets]))
    return out


def _measure(p: dict[str, Any], device: str) -> list[Measurement]:
    tables = [TableShape(e, d, pooling, Distribution.parse(dist)) for e, d, pooling, dist in p["tables"]]
    return measure_tbe(
        tables, p["B"], device=device, seed=p.get("seed", 0), weights_precision=p.get("weights_precision", "fp32")
    )


PROBE = LocalProbe("embedding", _measure)


def _distributions() -> list[Any]:
    """Uniform, three Zipf exponents, and every table of the shipped reuse-factor profile."""
    from probes.vocabulary.reuse_profile import load_profile

    return ["uniform", {"zipf": 0.8}, {"zipf": 1.05}, {"zipf": 1.2}] + [{"profile": n} for n in load_profile().names]


# Share of embedding points per TBE weights precision on each device kind: fbgemm_gpu's CPU
# kernels (fbgemm_gpu-cpu 1.8.0) take fp16 weights (fp32 pooled output, backward ~3x fp32's)
# but not bf16; its CUDA kernels take both.
_TBE_PRECISION_SHARE = {"cpu": {"fp32": 0.8, "fp16": 0.2}, "cuda": {"fp32": 0.5, "fp16": 0.3, "bf16": 0.2}}
_FLOAT32_TABLE_SETS = 32  # the first table sets are fp32 (as long as the element-wise float32 passes)


# The job space a sweep spans, as users shard it: a rank's table set of up to 16 tables (a
# table-wise DLRM puts ~13 tables on a GPU), pooling to 128 (production features pool up to
# ~100 ids), rows to 2M and a global batch to 8192 (a rank looks up the whole batch of the
# tables it holds); `max_table_bytes` keeps a set inside one device's memory.
MAX_TABLES_PER_SET = 16
MAX_POOLING = 128
MAX_LOOKUPS = 4_000_000  # ids in one batch of a set (8 batches are held at once)


def embedding_specs(
    n: int,
    seed: int,
    max_rows: int = 2_000_000,
    max_batch: int = 8192,
    max_table_bytes: int = 2**30,
    device_kind: str = "cpu",
) -> list[ProbeSpec]:
    """Random table sets: T tables each with its own rows, dim, pooling and distribution; the
    weights precision drawn by the device kind's share (its own random stream, so the sets are
    those the sweep always drew), after `_FLOAT32_TABLE_SETS` fp32 sets.

    A set whose weights exceed `max_table_bytes` (at 4 bytes an element, whatever the precision)
    or whose batch holds over `MAX_LOOKUPS` ids is drawn again, so probes stay inside memory.
    """
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed + 1)
    precision_rng = np.random.default_rng([seed, 1, 16])
    precisions, p_p = zip(*_TBE_PRECISION_SHARE[kind].items())
    dists = _distributions()
    out = []
    for i in range(n):
        precision = str(precision_rng.choice(precisions, p=p_p)) if i >= _FLOAT32_TABLE_SETS else "fp32"
        T = int(rng.integers(1, MAX_TABLES_PER_SET + 1))
        B = log_uniform(rng, 64, max_batch)
        while True:
            tables = [
                [
                    log_uniform(rng, 1_000, max_rows),
                    int(rng.choice([8, 16, 32, 64, 128])),
                    log_uniform(rng, 1, MAX_POOLING),
                    dists[int(rng.integers(0, len(dists)))],
                ]
                for _ in range(T)
            ]
            fits = sum(e * d * 4 for e, d, _, _ in tables) <= max_table_bytes
            if fits and B * sum(pooling for _, _, pooling, _ in tables) <= MAX_LOOKUPS:
                break
        out.append(
            ProbeSpec(
                "embedding",
                {"tables": tables, "B": B, "seed": i, "weights_precision": precision},
                f"emb:{i}:{precision}",
            )
        )
    return out
