"""Where a job's ranks run: the node of every rank, and so each collective group's scope.

A collective whose members share a node runs over that node's links (NVLink, shared memory);
one that spans nodes runs over the network, at another curve entirely. The predictor asks the
placement which scope every group has, the calibration measures both wherever both exist, and
the launcher pins each rank to the node the prediction assumed. Plain data (no torch): the
predictors, the policies and the plan all speak it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

INTRA, INTER = "intra", "inter"


class PlacementError(ValueError):
    """A job that the cluster's devices cannot hold, or a malformed placement."""


@dataclass(frozen=True)
class RankPlacement:
    """`nodes[r]`: the index of the node rank r runs on (nodes as the cluster lists them)."""

    nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise PlacementError("placement.nodes: a job has at least one rank")
        if any(not isinstance(n, int) or n < 0 for n in self.nodes):
            raise PlacementError(f"placement.nodes: node indices are integers >= 0, got {list(self.nodes)}")

    @classmethod
    def packed(cls, world: int, devices_per_node: Sequence[int]) -> "RankPlacement":
        """Ranks filled onto nodes in order, each node to its device count (as Ray Train and
        torchrun number them: a node's ranks are consecutive), so as few nodes as possible
        and the fewest groups spanning nodes."""
        capacity = sum(devices_per_node)
        if world < 1:
            raise PlacementError(f"world_size: expected >= 1, got {world}")
        if world > capacity:
            raise PlacementError(
                f"world_size: {world} ranks do not fit the cluster's {capacity} device(s) "
                f"({' + '.join(str(d) for d in devices_per_node) or 'none'} per node); allowed: 1..{capacity}"
            )
        nodes: list[int] = []
        for index, devices in enumerate(devices_per_node):
            nodes.extend([index] * min(devices, world - len(nodes)))
        return cls(tuple(nodes))

    @classmethod
    def single_node(cls, world: int) -> "RankPlacement":
        return cls(tuple([0] * max(1, world)))

    @classmethod
    def from_node_names(cls, names: Sequence[str]) -> "RankPlacement":
        """Ranks' node names (ids or hostnames) to indices, in order of first appearance."""
        index: dict[str, int] = {}
        return cls(tuple(index.setdefault(n, len(index)) for n in names))

    @property
    def world(self) -> int:
        return len(self.nodes)

    @property
    def node_count(self) -> int:
        return len(set(self.nodes))

    def ranks_per_node(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for n in self.nodes:
            out[n] = out.get(n, 0) + 1
        return out

    def scope(self, ranks: Iterable[int] | None = None) -> str:
        """`intra` when every member of the group shares a node, else `inter`."""
        members = range(self.world) if ranks is None else ranks
        return INTRA if len({self.nodes[r] for r in members}) <= 1 else INTER

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "ranks_per_node": {str(k): v for k, v in self.ranks_per_node().items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, world: int | None = None) -> "RankPlacement":
        """A stored placement; none stored (rows and plans from before placements were
        recorded) means one node, as every such calibration ran."""
        if not data:
            return cls.single_node(world or 1)
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise PlacementError(f"placement: expected {{'nodes': [node index per rank]}}, got {data!r}")
        placement = cls(tuple(data["nodes"]))
        if world is not None and placement.world != world:
            raise PlacementError(f"placement.nodes: {placement.world} ranks placed, the job has world_size={world}")
        return placement


def placement_of(params: dict[str, Any], world: int) -> RankPlacement:
    """The placement a measured row or a plan recorded under `placement`."""
    return RankPlacement.from_dict(params.get("placement"), world)
