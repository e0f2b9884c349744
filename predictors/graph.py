"""`ExecutionGraph`: what each rank runs in one iteration, in issue order, for the simulator.

An op names the cost-model op and params that price it (`op`, `params`), the stream it runs
on, the ops of the same rank whose outputs it needs (`deps`, indices into that rank's list),
and for a collective the ranks of its group. Ops are plain data (JSON), so graphs built from a
job and a plan and graphs imported from traces are checked by the same simulator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("compute", "memory", "collective")
STREAMS = ("compute", "comm")  # plus "comm:<channel>": backends that run collectives concurrently


def is_comm_stream(stream: str) -> bool:
    return stream == "comm" or stream.startswith("comm:")


@dataclass
class GraphOp:
    name: str
    kind: str  # compute | memory | collective
    op: str  # the PerformanceModel op that costs it
    params: dict[str, Any] = field(default_factory=dict)
    stream: str = "compute"
    deps: list[int] = field(default_factory=list)
    group: tuple[int, ...] = ()  # collective members (global ranks)
    duration_s: float | None = None  # a measured duration (imported traces) overrides the model
    issue_s: float | None = None  # measured CPU time spent issuing it (imported traces)
    blocking: bool | None = None  # holds the issuing CPU until done; None: the device's rule
    # A point-to-point send (isend, e.g. a pipeline stage's activations): the rank goes on once
    # it is issued; the transfer runs when the receiver arrives, without holding the CPU.
    posted: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: kind {self.kind!r} not in {KINDS}")
        if self.stream not in STREAMS and not is_comm_stream(self.stream):
            raise ValueError(f"op {self.name!r}: stream {self.stream!r} not in {STREAMS}")
        if self.kind == "collective" and len(self.group) < 1:
            raise ValueError(f"collective {self.name!r} needs its group's ranks")
        if type(self.group) is not tuple:  # builders pass tuples of ranks; a 512-rank group is not copied per op
            self.group = tuple(int(r) for r in self.group)


@dataclass
class ExecutionGraph:
    ranks: list[list[GraphOp]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r, ops in enumerate(self.ranks):
            for i, o in enumerate(ops):
                bad = [d for d in o.deps if not 0 <= d < i]
                if bad:
                    raise ValueError(f"rank {r} op {i} ({o.name}): deps {bad} must name earlier ops of the rank")
                if o.kind == "collective" and r not in o.group:
                    raise ValueError(f"rank {r} op {i} ({o.name}): rank not in its group {o.group}")

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "ranks": [[asdict(o) for o in ops] for ops in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExecutionGraph":
        return cls([[GraphOp(**o) for o in ops] for ops in data["ranks"]], data.get("meta", {}))
