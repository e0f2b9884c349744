"""FBGEMM table-batched embedding (TBE) lookups, forward and backward, timed.

A probe point is a *set* of tables looked up together by one `SplitTableBatchedEmbeddingBags
Codegen` (as one rank does in a sharded DLRM); its features (probes/vocabulary/tbe_features.py)
are aggregated over the tables, so one model costs any rank's table set.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from probes.timing import time_callable
from probes.vocabulary.indices import sample_indices
from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.ops import EMBEDDING_BWD_OP, EMBEDDING_FWD_OP
from probes.vocabulary.records import Measurement
from probes.vocabulary.tbe_features import CPU_WEIGHTS_PRECISIONS, WEIGHTS_PRECISIONS, batch_features

def check_weights_precision(weights_precision: str, device: torch.device | str) -> None:
    device = torch.device(device)
    allowed = WEIGHTS_PRECISIONS if device.type == "cuda" else CPU_WEIGHTS_PRECISIONS
    if weights_precision not in allowed:
        raise ValueError(f"weights_precision: expected one of {list(allowed)} on {device.type}, "
                         f"got {weights_precision!r}")


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
