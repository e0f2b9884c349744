"""The NCCL choice probe: a collective timed under one forced (algorithm, protocol) pair, or
under NCCL's own choice, over a fresh communicator (a gang probe).

NCCL reads `NCCL_ALGO` and `NCCL_PROTO` when it creates a communicator, so a batch sets them
(on every member, the same), creates its own process group, times its points on it exactly as
the collective probe does (`probes.collective.measure_collectives`), destroys the group and
restores the variables. Rows are family `nccl_choice`, params naming the pair and the nodes the
group spans: they feed the tuner CSV (`policies.nccl_tuner`), never the collective models (a
job gets NCCL's own choice, not a forced one; `predictors.fit.kernel_rows` leaves them out).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Sequence

import torch.distributed as dist

from probes.collective import CollectivePoint, measure_collectives
from probes.collective_sweep import ranks_by_node
from probes.comm import destroy_groups
from probes.probe import ProbeSpec
from probes.vocabulary.nccl import AUTO, ENV_NAMES, NCCL_CHOICE_FAMILY, TUNER_COLLECTIVES, candidates
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement

ENV_KEYS = ("NCCL_ALGO", "NCCL_PROTO")


@contextlib.contextmanager
def forced_nccl(algorithm: str, protocol: str) -> Iterator[None]:
    """NCCL_ALGO / NCCL_PROTO set to the pair (unset for `AUTO`) inside, restored after."""
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    try:
        for key, name in zip(ENV_KEYS, (algorithm, protocol)):
            if name == AUTO:
                os.environ.pop(key, None)
            else:
                os.environ[key] = ENV_NAMES[name]
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def nccl_groups(nodes: Sequence[Hashable]) -> list[tuple[int, ...]]:
    """The groups whose NCCL choices a job meets, given each rank's node: the whole world (a
    data-parallel all-reduce) and, on several nodes, the ranks of the node with the most (a
    tensor-parallel group within a node); groups of one rank have nothing to choose."""
    groups = [tuple(range(len(nodes)))] if len(nodes) > 1 else []
    by_node = ranks_by_node(nodes)
    biggest = max(by_node.values(), key=len) if by_node else []
    if len(by_node) > 1 and len(biggest) > 1:
        groups.append(tuple(biggest))
    return groups


def nccl_choice_specs(
    groups: Sequence[Sequence[int]], max_bytes: int, min_bytes: int = 1024, step: int = 4
) -> list[ProbeSpec]:
    """Every tunable collective on every group under each of its candidate pairs, message sizes
    from `min_bytes` to `max_bytes` by factors of `step`; a pair's sizes are consecutive (one
    batch, one communicator), the pairs of an op and group in turn, NCCL's own choice first."""
    sizes = [min_bytes]
    while sizes[-1] * step <= max_bytes:
        sizes.append(sizes[-1] * step)
    out = []
    for ranks in groups:
        for op in TUNER_COLLECTIVES:
            for algorithm, protocol in candidates(op):
                for nbytes in sizes:
                    params = {"op": op, "bytes": nbytes, "ranks": list(ranks), "algo": algorithm, "proto": protocol}
                    out.append(
                        ProbeSpec(NCCL_CHOICE_FAMILY, params, f"{op}:{algorithm}/{protocol}:{nbytes}:g{len(ranks)}")
                    )
    return out


def _point(spec: ProbeSpec) -> CollectivePoint:
    p = spec.params
    return CollectivePoint(p["op"], int(p["bytes"]), p.get("scope", "intra"), tuple(p["ranks"]))


@dataclass(frozen=True)
class NcclChoiceProbe:
    """Points of one pair on one group share a batch (and a communicator); one pass."""

    family: str = NCCL_CHOICE_FAMILY
    gang: bool = True
    multi_pass: bool = False

    def batch_key(self, spec: ProbeSpec) -> Hashable | None:
        p = spec.params
        return (tuple(p["ranks"]), p["op"], p["algo"], p["proto"])

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        ranks = spec.params["ranks"]
        nodes = len({placement.nodes[r] for r in ranks})
        return ProbeSpec(spec.family, {**spec.params, "scope": placement.scope(ranks), "nodes": nodes}, spec.key)

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        if not specs:
            return []
        if len({self.batch_key(s) for s in specs}) != 1:
            raise ValueError("an NCCL choice batch holds one op under one pair on one group")
        backend = dist.get_backend()
        if backend != "nccl":
            raise ValueError(
                f"NCCL choices are measured on an NCCL group (CUDA devices); this process group's backend is {backend!r}"
            )
        first = specs[0].params
        with forced_nccl(first["algo"], first["proto"]):
            group = dist.new_group(list(first["ranks"]))  # a communicator created under the pair
            try:
                rows = measure_collectives([_point(s) for s in specs], device=device, group=group, **(timing or {}))
            finally:
                destroy_groups([group])
        for row in rows:
            row.family = NCCL_CHOICE_FAMILY
            row.params = {
                **row.params,
                "algo": first["algo"],
                "proto": first["proto"],
                "nodes": int(first.get("nodes", 1)),
            }
        return rows


PROBE = NcclChoiceProbe()
