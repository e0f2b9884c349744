"""FBGEMM table-batched embedding (TBE) lookups, forward and backward, and their features.

A probe point is a *set* of tables looked up together by one `SplitTableBatchedEmbeddingBags
Codegen` (as one rank does in a sharded DLRM). Its features are aggregated over the tables so
that one model costs any rank's table set, however heterogeneous.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import torch

from probes.indices import REUSE_BINS, Distribution, normalised_histogram, reuse_counts, sample_indices
from probes.records import Measurement
from probes.timing import time_callable

# Weight storage precisions a TBE probe can use (FBGEMM's SparseType values); the pooled output
# stays float32 either way. fbgemm_gpu's CPU kernels (fbgemm_gpu-cpu 1.8.0) take fp32 and fp16
# weights but not bf16 ("split_embedding_cpu_forward" is not implemented for BFloat16).
WEIGHTS_PRECISIONS = ("fp32", "fp16", "bf16")
CPU_WEIGHTS_PRECISIONS = ("fp32", "fp16")


def check_weights_precision(weights_precision: str, device: torch.device | str) -> None:
    device = torch.device(device)
    allowed = WEIGHTS_PRECISIONS if device.type == "cuda" else CPU_WEIGHTS_PRECISIONS
    if weights_precision not in allowed:
        raise ValueError(f"weights_precision: expected one of {list(allowed)} on {device.type}, "
                         f"got {weights_precision!r}")


@dataclass(frozen=True)
class TableShape:
    num_embeddings: int
    embedding_dim: int
    pooling_factor: int
    distribution: Distribution = Distribution()


def make_tbe(tables: Sequence[TableShape], device: torch.device, learning_rate: float = 0.01,
             weights_precision: str = "fp32"):
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
        [(t.num_embeddings, t.embedding_dim) for t in tables], pooling_mode=PoolingMode.SUM,
        use_cpu=device.type != "cuda")
    return module.to(device)


def make_batch(
    tables: Sequence[TableShape], batch_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Flat indices and offsets in TBE's table-major layout, plus each table's indices."""
    per_table = [
        sample_indices(t.num_embeddings, batch_size * t.pooling_factor, t.distribution, rng) for t in tables
    ]
    lengths = np.concatenate([np.full(batch_size, t.pooling_factor, dtype=np.int64) for t in tables])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.concatenate(per_table), offsets, per_table


def batch_features(tables: Sequence[TableShape], batch_size: int, per_table: Sequence[np.ndarray],
                   weights_precision: str = "fp32") -> dict[str, Any]:
    """The aggregated features the embedding model is fitted on (plain numbers, and the
    weights' storage precision, which the models are grouped by)."""
    return _features(tables, batch_size, [reuse_counts(idx) for idx in per_table], weights_precision)


def _features(tables: Sequence[TableShape], batch_size: int,
              reuse: Sequence[tuple[int, Sequence[int]]], weights_precision: str = "fp32") -> dict[str, Any]:
    """Features from each table's (distinct rows, hit-count bin counts): tables' ids are
    disjoint, so the set's reuse histogram is the sum of theirs."""
    hist = normalised_histogram(np.sum([np.asarray(bins, dtype=np.float64) for _, bins in reuse], axis=0)
                                if reuse else np.zeros(REUSE_BINS))
    return {
        "weights_precision": weights_precision,
        "T": len(tables),
        "B": batch_size,
        "D_sum": sum(t.embedding_dim for t in tables),
        "E_sum": sum(t.num_embeddings for t in tables),
        "L_mean": float(np.mean([t.pooling_factor for t in tables])),
        "lookups": sum(batch_size * t.pooling_factor for t in tables),
        "gathered_elems": sum(batch_size * t.pooling_factor * t.embedding_dim for t in tables),
        "output_elems": batch_size * sum(t.embedding_dim for t in tables),
        "distinct_elems": sum(distinct * t.embedding_dim for (distinct, _), t in zip(reuse, tables)),
        "table_elems": sum(t.num_embeddings * t.embedding_dim for t in tables),
        "reuse_hist": [round(float(x), 6) for x in hist],
    }


@lru_cache(maxsize=16384)
def _typical_reuse(num_embeddings: int, pooling_factor: int, distribution: Distribution, batch_size: int,
                   seed: int) -> tuple[int, tuple[int, ...]]:
    """One table's (distinct rows, bin counts) in a typical batch, drawn from a generator seeded
    by the table's shape: the same table gets the same figures in every table set and plan
    it is priced in, and a planner pricing many plans samples each table once."""
    label = zlib.crc32(distribution.label().encode())
    rng = np.random.default_rng([seed, num_embeddings, pooling_factor, batch_size, label])
    ids = sample_indices(num_embeddings, batch_size * pooling_factor, distribution, rng, unordered=True)
    distinct, bins = reuse_counts(ids)
    return distinct, tuple(int(b) for b in bins)


def expected_features(tables: Sequence[TableShape], batch_size: int, seed: int = 0,
                      weights_precision: str = "fp32") -> dict[str, Any]:
    """Features of a typical batch, for predicting a table set that was never measured."""
    reuse = [_typical_reuse(t.num_embeddings, t.pooling_factor, t.distribution, batch_size, seed) for t in tables]
    return _features(tables, batch_size, reuse, weights_precision)


def measure_tbe(
    tables: Sequence[TableShape],
    batch_size: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_seconds: float = 1.5,
    distinct_batches: int = 8,
    weights_precision: str = "fp32",
) -> list[Measurement]:
    """Time forward and backward (with the fused SGD update) of TBE batches, the tables
    stored in `weights_precision` ("fp32", "fp16"; "bf16" on CUDA only).

    Repeats cycle through `distinct_batches` different index batches: timing one batch over
    and over keeps its rows in cache and under-reports a real training step by ~1.7x.
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
    features["tables"] = [
        [t.num_embeddings, t.embedding_dim, t.pooling_factor, t.distribution.label()] for t in tables
    ]
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

    bwd = time_callable(backward, device=device, max_seconds=max_seconds, setup=forward_for_backward)
    common = dict(device=str(device), family="embedding")
    return [
        Measurement("embedding_fwd", features, fwd.median_s, fwd.spread_s, fwd.repeats, **common),
        Measurement("embedding_bwd", dict(features), bwd.median_s, bwd.spread_s, bwd.repeats, **common),
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
