"""Embedding sharding plans: which piece of which table each rank holds.

A plan has one entry per table of the job:
- an int `r`: table-wise, the whole table on rank `r` (what the classic sharders produce);
- `{"type": "column_wise", "ranks": [...]}`: the embedding dimension split as evenly as
  possible over those ranks; each piece is looked up for the global batch and exchanged in
  the pooled all-to-all like a table-wise table of the narrower dimension;
- `{"type": "row_wise"}`: the rows split over every rank; each rank looks up the global
  batch's indices that fall in its rows (on average pooling / ranks per bag) and the partial
  pooled sums are reduce-scattered to the ranks that own the samples (all-gathered back in
  the backward pass), as TorchRec's row-wise sharding does;
- `{"type": "data_parallel"}`: a replica on every rank, looked up for the local batch only,
  its dense gradient all-reduced (for tiny tables whose exchange would cost more).

Row-wise pieces assume lookups spread evenly over the row ranges (uniform indices); a skewed
table sends more of its lookups to the shard holding the hot rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple, Sequence

from probes.vocabulary.jobspec import JobSpec, TableShape

TABLE_WISE, ROW_WISE, COLUMN_WISE, DATA_PARALLEL = "table_wise", "row_wise", "column_wise", "data_parallel"
SHARDING_TYPES = (TABLE_WISE, ROW_WISE, COLUMN_WISE, DATA_PARALLEL)
# Pieces exchanged in the pooled all-to-all (the others reduce-scatter or stay local).
EXCHANGED = (TABLE_WISE, COLUMN_WISE)

PlanEntry = int | dict[str, Any]


class ShardingPlanError(ValueError):
    """A plan that does not describe every table of the job with a valid sharding."""


class TableShard(NamedTuple):
    """One piece of one table on one rank (a tuple: a 512-rank plan of row-wise tables lists
    half a million of them, and a planner lists many plans)."""

    table: int
    rank: int
    kind: str
    shape: TableShape  # the piece as one TBE table: its rows, dimension and pooling


def _even_split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _entry(spec: JobSpec, i: int, entry: PlanEntry) -> tuple[str, list[int]]:
    W = spec.world_size
    where = f"plan[{i}] (table {spec.tables[i].name!r})"
    if isinstance(entry, bool) or not isinstance(entry, (int, dict)):
        raise ShardingPlanError(f"{where}: expected a rank or a {{'type': ...}} object, got {entry!r}")
    if isinstance(entry, int):
        if not 0 <= entry < W:
            raise ShardingPlanError(f"{where}: rank {entry} outside 0..{W - 1}")
        return TABLE_WISE, [entry]
    kind = entry.get("type")
    if kind not in SHARDING_TYPES:
        raise ShardingPlanError(f"{where}.type: {kind!r} is not one of {SHARDING_TYPES}")
    ranks = [int(r) for r in entry.get("ranks", range(W))]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < W for r in ranks):
        raise ShardingPlanError(f"{where}.ranks: {ranks} must be distinct ranks in 0..{W - 1}")
    if kind == TABLE_WISE and len(ranks) != 1:
        raise ShardingPlanError(f"{where}.ranks: a table-wise table lives on one rank, got {ranks}")
    if kind in (ROW_WISE, DATA_PARALLEL) and sorted(ranks) != list(range(W)):
        raise ShardingPlanError(f"{where}.ranks: {kind} spans every rank (0..{W - 1}), got {ranks}")
    if kind == COLUMN_WISE and len(ranks) > spec.tables[i].embedding_dim:
        raise ShardingPlanError(
            f"{where}.ranks: {len(ranks)} column shards of a {spec.tables[i].embedding_dim}-wide table"
        )
    return kind, ranks


def table_shards(spec: JobSpec, plan: Sequence[PlanEntry]) -> list[TableShard]:
    """Every piece of every table, validated against the job (clear errors naming the entry)."""
    if len(plan) != len(spec.tables):
        raise ShardingPlanError(f"plan places {len(plan)} tables, job has {len(spec.tables)}")
    shards: list[TableShard] = []
    for i, (table, entry) in enumerate(zip(spec.tables, plan)):
        kind, ranks = _entry(spec, i, entry)
        shape = table.shape
        if kind == COLUMN_WISE:
            widths = {
                dim: replace(shape, embedding_dim=dim) for dim in set(_even_split(shape.embedding_dim, len(ranks)))
            }
            shards.extend(
                TableShard(i, r, kind, widths[dim])
                for r, dim in zip(ranks, _even_split(shape.embedding_dim, len(ranks)))
            )
        elif kind == ROW_WISE:
            pooling = max(1, round(shape.pooling_factor / len(ranks)))
            split = _even_split(shape.num_embeddings, len(ranks))  # at most two sizes: one piece shape each
            pieces = {rows: replace(shape, num_embeddings=max(rows, 1), pooling_factor=pooling) for rows in set(split)}
            shards.extend(TableShard(i, r, kind, pieces[rows]) for r, rows in zip(ranks, split))
        else:  # table-wise, or a full replica per rank
            shards.extend(TableShard(i, r, kind, shape) for r in ranks)
    return shards


# A replica's dense gradient (the whole table) is all-reduced every step; past a few MiB that
# never beats a lookup exchange, and the all-reduce model would be asked far beyond its sizes.
DATA_PARALLEL_MAX_BYTES = 4 * 2**20
# Column pieces narrower than this waste the TBE's vector width (TorchRec's minimum is 4 too).
MIN_COLUMN_PIECE = 4


def split_kinds(num_embeddings: int, embedding_dim: int, world: int) -> list[str]:
    """The sharding types beyond table-wise that a table of this shape may take on `world`
    ranks: row-wise (a row per rank at least), column-wise (pieces of `MIN_COLUMN_PIECE`
    columns at least), data-parallel (replicas up to `DATA_PARALLEL_MAX_BYTES`)."""
    if world < 2:
        return []
    kinds = [ROW_WISE] if num_embeddings >= world else []
    if embedding_dim >= world * MIN_COLUMN_PIECE:
        kinds.append(COLUMN_WISE)
    if 4 * num_embeddings * embedding_dim <= DATA_PARALLEL_MAX_BYTES:
        kinds.append(DATA_PARALLEL)
    return kinds


def exchanged_widths(spec: JobSpec, shards: Sequence[TableShard]) -> list[int]:
    """Per rank, the pooled width it sends in the all-to-all (table- and column-wise pieces)."""
    widths = [0] * spec.world_size
    for s in shards:
        if s.kind in EXCHANGED:
            widths[s.rank] += s.shape.embedding_dim
    return widths


def row_wise_width(shards: Sequence[TableShard]) -> int:
    """Summed dimension of the row-wise tables: the width of their reduce-scatter (each spans
    every rank, so rank 0 holds one full-width piece of each)."""
    return sum(s.shape.embedding_dim for s in shards if s.kind == ROW_WISE and s.rank == 0)


def replicated_tables(shards: Sequence[TableShard]) -> list[TableShape]:
    """The data-parallel tables, once each (every rank holds the same replicas)."""
    return [s.shape for s in shards if s.kind == DATA_PARALLEL and s.rank == 0]


def shard_bytes(shards: Sequence[TableShard], world: int) -> list[int]:
    """Embedding weight bytes per rank (fp32)."""
    mem = [0] * world
    for s in shards:
        mem[s.rank] += 4 * s.shape.num_embeddings * s.shape.embedding_dim
    return mem


def local_pieces(shards: Sequence[TableShard], world: int) -> list[list[TableShape]]:
    """Per rank, the table pieces it looks up for the global batch (all but replicas), listed
    in one pass over the plan's pieces."""
    local: list[list[TableShape]] = [[] for _ in range(world)]
    for s in shards:
        if s.kind != DATA_PARALLEL:
            local[s.rank].append(s.shape)
    return local
