"""Sparse-feature index generation and the reuse-factor histogram.

The embedding-lookup cost depends on how often the rows of a batch repeat (cache hits), not
only on how many rows are read, so both the probe and the predictor describe a batch by its
reuse-factor histogram: the share of touched rows hit once, 2-3 times, 4-7 times, ...
(power-of-two bins, 17 of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from probes.vocabulary.reuse_profile import load_profile, ranks_from_draws, spread_ranks

REUSE_BINS = 17


@dataclass(frozen=True)
class Distribution:
    """`uniform`, Zipf with exponent `s` over the table's rows, or `profile`: the access curve
    of table `table` of the shipped reuse-factor profile (probes/vocabulary/reuse_profile.py)."""

    kind: str = "uniform"
    s: float = 0.0
    table: str = ""

    @classmethod
    def parse(cls, value: object) -> "Distribution":
        if value in (None, "uniform"):
            return cls("uniform")
        if isinstance(value, dict) and set(value) == {"zipf"}:
            return cls("zipf", float(value["zipf"]))
        if isinstance(value, dict) and set(value) == {"profile"}:
            load_profile().table(str(value["profile"]))  # unknown names fail here, with the choices
            return cls("profile", table=str(value["profile"]))
        if isinstance(value, Distribution):
            return value
        raise ValueError(f"distribution must be 'uniform', {{zipf: s}} or {{profile: table}}, got {value!r}")

    def to_json(self) -> object:
        if self.kind == "profile":
            return {"profile": self.table}
        return "uniform" if self.kind == "uniform" else {"zipf": self.s}

    def label(self) -> str:
        if self.kind == "profile":
            return f"profile:{self.table}"
        return "uniform" if self.kind == "uniform" else f"zipf{self.s:g}"

    @classmethod
    def from_label(cls, label: str) -> "Distribution":
        """The distribution a stored row's `label()` names (a row keeps labels, not specs)."""
        if label.startswith("profile:"):
            return cls.parse({"profile": label.removeprefix("profile:")})
        if label.startswith("zipf"):
            return cls("zipf", float(label.removeprefix("zipf")))
        return cls.parse(label)


@lru_cache(maxsize=64)
def _zipf_cdf(num_rows: int, s: float) -> np.ndarray:
    ranks = np.arange(1, num_rows + 1, dtype=np.float64)
    weights = ranks ** (-s)
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def sample_indices(
    num_rows: int, count: int, dist: Distribution, rng: np.random.Generator, unordered: bool = False
) -> np.ndarray:
    """`count` row ids in [0, num_rows) drawn from `dist` (int64). `unordered`: the same
    multiset of ids without the batch's order (the uniform draws are sorted, so inverting the
    CDF walks it once): about twice as fast, for statistics such as reuse counts only."""
    if dist.kind == "uniform":
        return rng.integers(0, num_rows, size=count, dtype=np.int64)
    draws = np.sort(rng.random(count)) if unordered else rng.random(count)
    if dist.kind == "profile":
        return spread_ranks(ranks_from_draws(load_profile().table(dist.table), num_rows, draws), num_rows)
    ranks = np.searchsorted(_zipf_cdf(num_rows, dist.s), draws, side="right")
    return spread_ranks(np.minimum(ranks, num_rows - 1).astype(np.int64), num_rows)


def reuse_counts(indices: np.ndarray) -> tuple[int, np.ndarray]:
    """(distinct rows, how many of them fall in each hit-count bin [1], [2,3], [4,7], ...):
    one sort of the ids gives both, and bins of disjoint id sets add up."""
    if len(indices) == 0:
        return 0, np.zeros(REUSE_BINS, dtype=np.int64)
    _, counts = np.unique(np.asarray(indices), return_counts=True)
    bins = np.minimum(np.floor(np.log2(counts)).astype(int), REUSE_BINS - 1)
    return len(counts), np.bincount(bins, minlength=REUSE_BINS)


def normalised_histogram(bin_counts: np.ndarray) -> np.ndarray:
    total = bin_counts.sum()
    return bin_counts / total if total else np.zeros(REUSE_BINS)


def reuse_histogram(indices: np.ndarray) -> np.ndarray:
    """Share of distinct rows by hit count, binned [1], [2,3], [4,7], ... (17 bins)."""
    return normalised_histogram(reuse_counts(indices)[1].astype(np.float64))
