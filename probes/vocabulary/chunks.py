"""A chunked hierarchical all-reduce's schedule, as data.

Ranks are laid out on a D-dimensional grid, dimension 0 varying fastest (consecutive ranks
share a node, so dimension 0 is the intra-node one). Which order of dimensions each chunk
takes, and the order in which ranks issue the stages, is a `ChunkSchedule`: the chunk policy
chooses it, the network simulator prices it and `probes.workloads` runs it, all from the same
record.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence


class ScheduleError(ValueError):
    """A chunk schedule that does not describe a valid hierarchical all-reduce."""


@dataclass(frozen=True)
class ChunkSchedule:
    """Per chunk, the reduce-scatter order of dimensions (all-gather runs it backwards), and
    the global order in which ranks issue (chunk, stage) pairs. Stage s < D of a chunk is its
    reduce-scatter on `orders[c][s]`; stage D + k is its all-gather on `orders[c][D - 1 - k]`.
    Every rank must issue the same sequence, so the issue order is part of the schedule."""

    dims: tuple[int, ...]
    orders: tuple[tuple[int, ...], ...]
    issue: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.dims or any(int(p) < 1 for p in self.dims):
            raise ScheduleError(f"dims must be positive peer counts, got {self.dims}")
        if not self.orders:
            raise ScheduleError("a schedule needs at least one chunk")
        d = len(self.dims)
        for c, order in enumerate(self.orders):
            if sorted(order) != list(range(d)):
                raise ScheduleError(f"orders[{c}]={order} is not a permutation of the {d} dimensions")
        if not self.issue:
            object.__setattr__(self, "issue", tuple((c, s) for c in range(len(self.orders)) for s in range(2 * d)))
        seen: dict[int, int] = {}
        for chunk, stage in self.issue:
            if not 0 <= chunk < len(self.orders) or not 0 <= stage < 2 * d:
                raise ScheduleError(
                    f"issue entry ({chunk}, {stage}) is outside {len(self.orders)} chunks x {2 * d} stages"
                )
            if seen.get(chunk, -1) != stage - 1:
                raise ScheduleError(f"issue order runs chunk {chunk}'s stage {stage} out of sequence")
            seen[chunk] = stage
        if len(self.issue) != 2 * d * len(self.orders):
            raise ScheduleError("issue order must list every stage of every chunk once")

    @property
    def chunks(self) -> int:
        return len(self.orders)

    @property
    def world_size(self) -> int:
        return math.prod(self.dims)

    def stage_dim(self, chunk: int, stage: int) -> tuple[int, str]:
        """(dimension, "rs" or "ag") of a chunk's stage."""
        d = len(self.dims)
        order = self.orders[chunk]
        return (order[stage], "rs") if stage < d else (order[2 * d - 1 - stage], "ag")

    def to_dict(self) -> dict[str, Any]:
        return {
            "dims": list(self.dims),
            "orders": [list(o) for o in self.orders],
            "issue": [list(i) for i in self.issue],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ChunkSchedule":
        return cls(
            dims=tuple(int(p) for p in data["dims"]),
            orders=tuple(tuple(int(x) for x in o) for o in data["orders"]),
            issue=tuple((int(c), int(s)) for c, s in data.get("issue", ())),
        )

    @classmethod
    def baseline(cls, dims: Sequence[int], chunks: int) -> "ChunkSchedule":
        """Every chunk reduce-scatters dimension 0 first, then 1, ... (the hierarchical default)."""
        return cls(dims=tuple(dims), orders=tuple(tuple(range(len(dims))) for _ in range(chunks)))


def rank_coords(rank: int, dims: Sequence[int]) -> tuple[int, ...]:
    """A rank's coordinate on each dimension, dimension 0 varying fastest."""
    coords = []
    for p in dims:
        coords.append(rank % p)
        rank //= p
    return tuple(coords)


def dimension_lines(dims: Sequence[int], dim: int) -> list[tuple[int, ...]]:
    """The groups of dimension `dim`: ranks that differ only in that coordinate, in coordinate
    order (so a rank's index in its group is its coordinate)."""
    strides = [math.prod(dims[:i]) for i in range(len(dims))]
    others = [range(p) if i != dim else range(1) for i, p in enumerate(dims)]
    lines = []
    for base in itertools.product(*others):
        start = sum(c * s for c, s in zip(base, strides))
        lines.append(tuple(start + k * strides[dim] for k in range(dims[dim])))
    return sorted(lines)
