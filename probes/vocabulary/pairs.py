"""Compute + collective pairs and how their rows are exchanged, as data.

A `PairPoint` names one pair at one size; an `ExchangeLayout` says which producer rows go to
which rank, and how a source's rows are cut into slices for the overlapped form. The
substitution policy prices pairs from these records, and `probes.workloads.overlap` runs them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.ops import uneven_splits
from probes.vocabulary.tbe_features import expected_features

PAIRS = ("embedding_all_to_all", "gemm_all_reduce", "gemm_all_to_all")

SYMM_MEM_FORM = "symm_mem"
FLOAT = 4

# A substitution's slice count for a pair run by PyTorch's symmetric-memory fused kernels
# (`symm_mem_gemm_all_reduce`) instead of the sliced pipeline.
SYMM_MEM_SLICES = 0


def slice_bounds(rows: int, k: int) -> list[tuple[int, int]]:
    """`k` contiguous, near-equal row ranges covering 0..rows (fewer when rows < k)."""
    k = max(1, min(int(k), int(rows))) if rows > 0 else 1
    edges = np.linspace(0, rows, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


@dataclass(frozen=True)
class Piece:
    """Rows `lo..hi` (in the source's producer rows) that go to `dest`, as rows
    `dest_lo..dest_lo + hi - lo` of the source's block in `dest`'s output."""

    dest: int
    lo: int
    hi: int
    dest_lo: int


@dataclass(frozen=True)
class ExchangeLayout:
    """Who sends what: `rows_to[s][d]` producer rows of source `s` go to `d`; source `s`'s
    rows are `widths[s]` wide. A source's producer rows are grouped by destination, in rank
    order (as `all_to_all_single` sends them)."""

    rows_to: tuple[tuple[int, ...], ...]
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        w = len(self.rows_to)
        if any(len(row) != w for row in self.rows_to) or len(self.widths) != w:
            raise ValueError(f"rows_to must be {w}x{w} and widths {w} long")
        if any(r < 0 for row in self.rows_to for r in row) or any(x < 0 for x in self.widths):
            raise ValueError("rows and widths must be non-negative")

    @classmethod
    def even(cls, world: int, rows_per_dest: int, widths: Sequence[int]) -> "ExchangeLayout":
        return cls(tuple(tuple([rows_per_dest] * world) for _ in range(world)), tuple(int(x) for x in widths))

    @property
    def world(self) -> int:
        return len(self.widths)

    def rows(self, source: int) -> int:
        return sum(self.rows_to[source])

    def block_start(self, source: int, dest: int) -> int:
        """First producer row of `source` that goes to `dest`."""
        return sum(self.rows_to[source][:dest])

    def send_sizes(self, source: int) -> list[int]:
        return [n * self.widths[source] for n in self.rows_to[source]]

    def recv_sizes(self, dest: int) -> list[int]:
        return [self.rows_to[s][dest] * self.widths[s] for s in range(self.world)]

    def recv_offset(self, source: int, dest: int) -> int:
        """Where `source`'s block starts in `dest`'s flat output."""
        return sum(self.recv_sizes(dest)[:source])

    def remote_first(self, source: int) -> list[int]:
        """Destinations in the order `source` computes their rows: the next rank first, its own last."""
        return [(source + i) % self.world for i in range(1, self.world + 1)]

    def slices(self, source: int, k: int) -> list[list[Piece]]:
        """`source`'s rows walked in remote-first order and cut into `k` near-equal slices;
        each slice lists its pieces (at most one per destination, since a destination's rows
        are contiguous in the walk)."""
        order = self.remote_first(source)
        walk = []  # (walk start, dest)
        pos = 0
        for d in order:
            walk.append((pos, d))
            pos += self.rows_to[source][d]
        out = []
        for a, b in slice_bounds(pos, k):
            pieces = []
            for start, d in walk:
                n = self.rows_to[source][d]
                lo, hi = max(a, start), min(b, start + n)
                if hi > lo:
                    first = self.block_start(source, d)
                    pieces.append(Piece(d, first + lo - start, first + hi - start, lo - start))
            out.append(pieces)
        return out


def slices_rows(m: int, n: int, inner: int, k: int) -> bool:
    """Whether an [m, inner] @ [inner, n] product in `k` slices is cut along its rows (else
    along its columns). Row slices are contiguous but each re-reads the whole weight, so
    `k` of them read it k - 1 extra times ((k - 1) * inner * n elements); column slices read
    it once but land in a transposed buffer that is copied back (m * n elements). Rows win
    for a GEMM with rows to spare, columns for a GEMV or a few-row product."""
    return m >= n or (k - 1) * inner <= m


@dataclass(frozen=True)
class PairPoint:
    """One pair at one size, on `world` ranks.

    - gemm_all_reduce: x [rows, inner] @ w [inner, cols] on every rank, all-reduced;
    - gemm_all_to_all: each rank's x [tokens, inner] @ w [inner, cols], `rows` tokens per
      destination on average (log-normal skew when `uneven`);
    - embedding_all_to_all: `tables` tables per rank of `cols` total width (per rank the width
      varies by +-50% when `uneven`), pooling `pooling`, `rows` bags per rank (global batch
      rows x world), each table `num_embeddings` rows.
    """

    pair: str
    rows: int
    cols: int
    inner: int = 0
    world: int = 2
    uneven: bool = False
    tables: int = 4
    pooling: int = 8
    num_embeddings: int = 20_000
    seed: int = 0
    scope: str = "intra"  # the members on one node, or spanning nodes (set by the gang that runs it)

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(f"unknown pair {self.pair!r}; expected one of {PAIRS}")
        if self.rows < 1 or self.cols < 1 or self.world < 2:
            raise ValueError(f"{self.pair}: rows and cols must be >= 1 and world >= 2")
        if self.scope not in ("intra", "inter"):
            raise ValueError(f"{self.pair}: scope must be 'intra' or 'inter', got {self.scope!r}")
        if self.pair != "embedding_all_to_all" and self.inner < 1:
            raise ValueError(f"{self.pair}: inner (the GEMM's reduction dimension) must be >= 1")

    def to_params(self) -> dict[str, Any]:
        return asdict(self)

    def exchange_layout(self) -> ExchangeLayout:
        W = self.world
        if self.pair == "gemm_all_to_all":
            rows = uneven_splits(self.rows * W, W, self.seed) if self.uneven else np.full((W, W), self.rows)
            return ExchangeLayout(tuple(tuple(int(x) for x in r) for r in rows), tuple([self.cols] * W))
        return ExchangeLayout.even(W, self.rows, self.rank_widths())

    def rank_widths(self) -> list[int]:
        """Embedding width per rank (multiples of 4 per table, as TBE needs)."""
        per_table = max(4, self.cols // self.tables // 4 * 4)
        if not self.uneven:
            return [per_table * self.tables] * self.world
        rng = np.random.default_rng(self.seed)
        scale = rng.uniform(0.5, 1.5, size=self.world)
        return [int(max(4, round(per_table * s / 4) * 4)) * self.tables for s in scale]

    def rank_tables(self, rank: int) -> list[TableShape]:
        dim = self.rank_widths()[rank] // self.tables
        return [TableShape(self.num_embeddings, dim, self.pooling) for _ in range(self.tables)]


def embedding_slice_features(point: PairPoint, rank: int, bags: int) -> dict[str, Any]:
    """The embedding model's features for `bags` bags of `rank`'s tables (one slice)."""
    return expected_features(point.rank_tables(rank), bags, seed=point.seed)
