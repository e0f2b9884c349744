"""The six classic table-wise sharders: each maps tables to ranks by a cost proxy.

Greedy sharders sort tables by their proxy (largest first) and give each to the rank with the
smallest accumulated proxy that still has memory for it (the classic LPT heuristic).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from probes.vocabulary.jobspec import TableSpec


class NoFeasiblePlanError(ValueError):
    """No placement (or layout) keeps every rank under its memory cap; `field`: the job field
    to change."""

    def __init__(self, message: str, field: str = "tables"):
        self.field = field
        super().__init__(message)


def _greedy(
    tables: Sequence[TableSpec], ranks: int, cap_bytes: float, proxy: Callable[[TableSpec], float]
) -> list[int]:
    load = [0.0] * ranks
    mem = [0] * ranks
    out = [-1] * len(tables)
    order = sorted(range(len(tables)), key=lambda i: (-proxy(tables[i]), i))
    for i in order:
        t = tables[i]
        fits = [r for r in range(ranks) if mem[r] + t.bytes <= cap_bytes]
        if not fits:
            raise NoFeasiblePlanError(
                f"table {t.name!r} ({t.bytes / 2**30:.2f} GiB) fits on no rank under the cap of "
                f"{cap_bytes / 2**30:.2f} GiB (ranks hold {[round(m / 2**30, 2) for m in mem]} GiB)"
            )
        r = min(fits, key=lambda q: (load[q], mem[q], q))
        out[i] = r
        load[r] += proxy(t)
        mem[r] += t.bytes
    return out


def naive(tables: Sequence[TableSpec], ranks: int, cap_bytes: float, seed: int = 0) -> list[int]:
    return [i % ranks for i in range(len(tables))]


def random_sharder(tables: Sequence[TableSpec], ranks: int, cap_bytes: float, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(r) for r in rng.integers(0, ranks, size=len(tables))]


def size_greedy(tables, ranks, cap_bytes, seed=0):
    return _greedy(tables, ranks, cap_bytes, lambda t: t.num_embeddings)


def lookup_greedy(tables, ranks, cap_bytes, seed=0):
    return _greedy(tables, ranks, cap_bytes, lambda t: t.pooling_factor * t.embedding_dim)


def norm_lookup_greedy(tables, ranks, cap_bytes, seed=0):
    return _greedy(tables, ranks, cap_bytes, lambda t: t.pooling_factor / t.num_embeddings)


def size_lookup_greedy(tables, ranks, cap_bytes, seed=0):
    return _greedy(
        tables, ranks, cap_bytes, lambda t: t.pooling_factor * t.embedding_dim * math.log10(max(t.num_embeddings, 10))
    )


SHARDERS: dict[str, Callable[..., list[int]]] = {
    "naive": naive,
    "random": random_sharder,
    "size_greedy": size_greedy,
    "lookup_greedy": lookup_greedy,
    "norm_lookup_greedy": norm_lookup_greedy,
    "size_lookup_greedy": size_lookup_greedy,
}


def rank_memory(tables: Sequence[TableSpec], table_to_rank: Sequence[int], ranks: int) -> list[int]:
    """Embedding bytes per rank (fp32 weights; the exact-SGD update keeps no optimizer state)."""
    mem = [0] * ranks
    for t, r in zip(tables, table_to_rank):
        mem[r] += t.bytes
    return mem
