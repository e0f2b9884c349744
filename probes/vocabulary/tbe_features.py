"""The features of a set of embedding tables looked up together, which the TBE model is fitted on.

A probe point is a *set* of tables looked up by one table-batched embedding (TBE) op, as one
rank does in a sharded DLRM. Its features are aggregated over the tables, so one model costs
any rank's table set, however heterogeneous; `expected_features` gives those of a typical
batch, for pricing a table set that was never measured.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from probes.vocabulary.indices import REUSE_BINS, Distribution, normalised_histogram, reuse_counts, sample_indices
from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.reuse_expectation import expected_reuse

# Weight storage precisions a TBE probe can use (FBGEMM's SparseType values); the pooled output
# stays float32 either way. fbgemm_gpu's CPU kernels (fbgemm_gpu-cpu 1.8.0) take fp32 and fp16
# weights but not bf16 ("split_embedding_cpu_forward" is not implemented for BFloat16).
WEIGHTS_PRECISIONS = ("fp32", "fp16", "bf16")
CPU_WEIGHTS_PRECISIONS = ("fp32", "fp16")


def batch_features(
    tables: Sequence[TableShape], batch_size: int, per_table: Sequence[np.ndarray], weights_precision: str = "fp32"
) -> dict[str, Any]:
    """The aggregated features the embedding model is fitted on (plain numbers, and the
    weights' storage precision, which the models are grouped by)."""
    return _features(tables, batch_size, [reuse_counts(idx) for idx in per_table], weights_precision)


def _features(
    tables: Sequence[TableShape],
    batch_size: int,
    reuse: Sequence[tuple[float, Sequence[float] | np.ndarray]],
    weights_precision: str = "fp32",
) -> dict[str, Any]:
    """Features from each table's (distinct rows, hit-count bin counts): tables' ids are
    disjoint, so the set's reuse histogram is the sum of theirs."""
    hist = normalised_histogram(
        np.sum([np.asarray(bins, dtype=np.float64) for _, bins in reuse], axis=0) if reuse else np.zeros(REUSE_BINS)
    )
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
        "lookups_log_table_mib": lookups_log_table_mib(tables, batch_size, weights_precision),
        "reuse_hist": [round(float(x), 6) for x in hist],
    }


# Bytes per weight of each storage precision.
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def lookups_log_table_mib(tables: Sequence[TableShape], batch_size: int, weights_precision: str = "fp32") -> float:
    """Each table's lookups times log2(1 + its size in MiB), summed. A lookup's cost grows with
    the table it reads: a table of a few hundred KiB sits in a core's cache, one of a GiB
    misses every cache level and the TLB on most rows, and each level missed adds about the
    same latency, so the cost per lookup grows with the log of the table's size. Without
    this term the linear model under-priced the lookups of table sets of 3-10M rows by 10-20%
    (and those of small sets over) on the development VM, and whole DLRM steps with them."""
    size = WEIGHT_BYTES.get(weights_precision, 4)
    return float(
        sum(
            batch_size * t.pooling_factor * np.log2(1.0 + t.num_embeddings * t.embedding_dim * size / 2**20)
            for t in tables
        )
    )


# Batches of at least this many ids of one table are described by their expected statistics
# instead of a draw (`probes.vocabulary.reuse_expectation`): drawing costs time in proportion
# to the ids, and at this size a draw is within a percent of the expectation. Every batch of
# the e2e benchmarks' tasks (at most 2,048 bags of pooling 100) stays under it, drawn.
SAMPLED_MAX_IDS = 2**18


@lru_cache(maxsize=16384)
def _typical_reuse(
    num_embeddings: int, pooling_factor: int, distribution: Distribution, batch_size: int, seed: int
) -> tuple[float, tuple[float, ...]]:
    """One table's (distinct rows, bin counts) in a typical batch, drawn from a generator seeded
    by the table's shape: the same table gets the same figures in every table set and plan
    it is priced in, and a planner pricing many plans samples each table once. A batch of
    `SAMPLED_MAX_IDS` ids or more gets the statistics' expectation instead."""
    if batch_size * pooling_factor >= SAMPLED_MAX_IDS:
        return expected_reuse(num_embeddings, batch_size * pooling_factor, distribution)
    label = zlib.crc32(distribution.label().encode())
    rng = np.random.default_rng([seed, num_embeddings, pooling_factor, batch_size, label])
    ids = sample_indices(num_embeddings, batch_size * pooling_factor, distribution, rng, unordered=True)
    distinct, bins = reuse_counts(ids)
    return distinct, tuple(int(b) for b in bins)


def expected_features(
    tables: Sequence[TableShape], batch_size: int, seed: int = 0, weights_precision: str = "fp32"
) -> dict[str, Any]:
    """Features of a typical batch, for predicting a table set that was never measured."""
    return dict(_set_features(tuple(tables), batch_size, seed, weights_precision))


@lru_cache(maxsize=8192)
def _set_features(tables: tuple[TableShape, ...], batch_size: int, seed: int, weights_precision: str) -> dict[str, Any]:
    """`expected_features`, kept per table set: a planner prices the same rank's set in many
    plans (a search moves one table, and every other rank keeps its set)."""
    reuse = [_typical_reuse(t.num_embeddings, t.pooling_factor, t.distribution, batch_size, seed) for t in tables]
    return _features(tables, batch_size, reuse, weights_precision)
