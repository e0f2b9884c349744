"""A table's expected reuse statistics over a batch of many ids, computed instead of sampled.

Pricing a table means knowing how many distinct rows a typical batch touches and how often
each is hit (`probes.vocabulary.indices.reuse_counts`). Drawing a batch and counting costs
time in proportion to its ids: a table of a 512-rank job with 512 samples per rank and
pooling 20 looks up 5M ids, and a thousand such tables took minutes to sample. Over that
many ids a draw's statistics are their expectation to well under a percent, and the
expectation costs the same for any batch: with n ids drawn independently, a row of access
probability p is hit Binomial(n, p) times, so it is touched with probability 1 - (1 - p)^n
and falls in a hit-count bin with the binomial's probability of that range.

Rows are taken in groups of nearly equal probability (hot-first ranks: the hottest 64 one by
one, then ranges growing by 2%), so a table of any size costs a few hundred binomial terms.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from probes.vocabulary.indices import REUSE_BINS, Distribution
from probes.vocabulary.reuse_profile import load_profile

HEAD_RANKS = 64  # the hottest rows, priced one by one
GROUP_GROWTH = 1.02  # each further group of ranks spans 2% more ranks than the previous edge


def rank_groups(num_rows: int) -> np.ndarray:
    """Edges of the hot-first rank groups: 0, 1, ..., 64, then growing by 2% up to `num_rows`."""
    head = min(num_rows, HEAD_RANKS)
    edges = np.arange(head + 1, dtype=np.float64)
    if num_rows > head:
        count = int(np.ceil(np.log(num_rows / head) / np.log(GROUP_GROWTH))) + 1
        edges = np.concatenate([edges, np.geomspace(head, num_rows, count)[1:]])
    return np.unique(np.round(edges).astype(np.int64))


def _zipf_mass(edges: np.ndarray, s: float) -> np.ndarray:
    """Access share of each rank group under Zipf(s): rank r (from 0) weighs (r + 1)^-s, as
    `probes.vocabulary.indices.sample_indices` draws it; a group's weight is the integral of
    x^-s over its ranks (the midpoint rule; exact enough past the head, whose groups are one
    rank each and summed exactly)."""
    lo, hi = edges[:-1].astype(np.float64), edges[1:].astype(np.float64)
    single = hi - lo == 1
    weight = np.empty_like(lo)
    weight[single] = (lo[single] + 1.0) ** (-s)
    a, b = lo[~single] + 0.5, hi[~single] + 0.5
    weight[~single] = np.log(b / a) if abs(s - 1.0) < 1e-12 else (b ** (1 - s) - a ** (1 - s)) / (1 - s)
    return weight / weight.sum()


def _profile_mass(edges: np.ndarray, table_name: str, num_rows: int) -> np.ndarray:
    """Access share of each rank group under a profile table's CDF, as `ranks_from_draws`
    inverts it: P(rank < r) is the CDF at r / num_rows (log-linear between its points); ranks
    under one row collapse to rank 0, and the last rank takes what lies beyond."""
    table = load_profile().table(table_name)
    access = np.concatenate([[0.0], table.access_frac])
    log_rank = np.concatenate([[np.log(1.0 / table.num_embeddings)], np.log(table.rank_frac)])
    inner = edges[1:-1].astype(np.float64)
    below = np.interp(np.log(inner / num_rows), log_rank, access)
    cdf = np.concatenate([[0.0], below, [1.0]])
    return np.maximum(np.diff(np.maximum.accumulate(cdf)), 0.0)


def group_masses(num_rows: int, dist: Distribution) -> tuple[np.ndarray, np.ndarray]:
    """(rows in each group, the group's share of all lookups)."""
    if dist.kind == "uniform":
        return np.array([num_rows], dtype=np.int64), np.array([1.0])
    edges = rank_groups(num_rows)
    mass = _profile_mass(edges, dist.table, num_rows) if dist.kind == "profile" else _zipf_mass(edges, dist.s)
    return np.diff(edges), mass


@lru_cache(maxsize=4096)
def expected_reuse(num_rows: int, ids: int, dist: Distribution) -> tuple[float, tuple[float, ...]]:
    """Expected (distinct rows, rows per hit-count bin [1], [2,3], [4,7], ...) of `ids` ids
    drawn from `dist` over `num_rows` rows: the mean of what `reuse_counts` gives on draws."""
    from scipy.special import bdtr  # the binomial CDF (scipy is a dependency of the core)

    rows, mass = group_masses(num_rows, dist)
    p = np.clip(mass / rows, 0.0, 1.0)
    distinct = float(np.sum(rows * (1.0 - (1.0 - p) ** ids)))
    lower = 2 ** np.arange(REUSE_BINS) - 1  # a bin holds rows hit more than `lower` times ...
    upper = np.append(2 ** np.arange(1, REUSE_BINS) - 1, ids)  # ... and at most `upper`
    at_most = lambda k: bdtr(np.minimum(k, ids)[None, :], ids, p[:, None])  # noqa: E731
    share = np.where(lower[None, :] < ids, at_most(upper) - at_most(lower), 0.0)
    bins = np.maximum(rows[:, None] * share, 0.0).sum(axis=0)
    return distinct, tuple(float(b) for b in bins)
