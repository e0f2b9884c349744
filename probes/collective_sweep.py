"""The collective probe's sweep: which rank groups and message sizes to measure, in an order
that survives a short budget (sizes visited in bit-reversed order of their exponent), how a
gang sweep's passes share a point's repeats, and the `Probe` that runs a batch of points
(`probes.collective.measure_collectives`) on every member of a process group."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from probes.collective import MAX_REPEATS, MIN_REPEATS, TARGET_S, CollectivePoint, measure_collectives, message_numel
from probes.probe import ProbeSpec
from probes.vocabulary.ops import COLLECTIVE_OPS
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement

COLLECTIVE_PASSES = 3  # visits of a collective sweep; see `merge_passes`


def collective_pass_timing(passes: int) -> dict[str, Any]:
    """`measure_collectives` settings for one of `passes` passes over a collective sweep: the
    single-pass budget per point (about 0.2 s in 5 windows) shared out over the passes."""
    if passes <= 1:
        return {}
    return {
        "target_s": TARGET_S / passes,
        "windows": 2,
        "min_repeats": max(4, MIN_REPEATS // passes),
        "max_repeats": max(4, MAX_REPEATS // passes),
        "warmup": 1,
    }


def collective_batch_bytes(device: str, max_message_bytes: int | None = None) -> int:
    """Buffer bytes a batch may hold at once: on a GPU twice the largest message (half the
    free memory, see `default_max_collective_bytes`), on CPU 1 GiB."""
    if device.startswith("cuda"):
        return 2 * (max_message_bytes or default_max_collective_bytes(device))
    return 2**30


CPU_MAX_COLLECTIVE_BYTES = 64 * 2**20


def default_max_collective_bytes(device: str, free_bytes: int | None = None) -> int:
    """Largest message: a quarter of the device's free memory on a GPU (rounded down to a power
    of two), given by the devices themselves (`free_bytes`: the smallest any probe actor
    reported) or, without it, this process's GPU; on CPU, 64 MiB keeps gloo quick."""
    if device.startswith("cuda"):
        if free_bytes is None and torch.cuda.is_available():
            free_bytes, _ = torch.cuda.mem_get_info()
        if free_bytes:
            return int(2 ** math.floor(math.log2(free_bytes / 4)))
    return CPU_MAX_COLLECTIVE_BYTES


def _bit_reversed(n: int) -> list[int]:
    bits = max(1, (n - 1).bit_length())
    order = sorted(range(2**bits), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))
    return [i for i in order if i < n]


def ranks_by_node(nodes: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Each node's ranks in order, given each rank's node (nodes in order of first rank)."""
    by_node: dict[Hashable, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    return by_node


def collective_groups(nodes: Sequence[str]) -> list[tuple[int, ...]]:
    """Rank groups to measure, given each rank's node: for every size 2..world, the first
    ranks that share a node (an intra-node group) and, across nodes, ranks taken round-robin
    over the nodes (an inter-node group)."""
    by_node = ranks_by_node(nodes)
    columns = list(itertools.zip_longest(*by_node.values()))
    round_robin = [r for col in columns for r in col if r is not None]
    biggest_node = max(by_node.values(), key=len)
    groups: list[tuple[int, ...]] = []
    for size in range(2, len(nodes) + 1):
        if size <= len(biggest_node):
            groups.append(tuple(biggest_node[:size]))
        if len(by_node) > 1:
            groups.append(tuple(sorted(round_robin[:size])))
    return list(dict.fromkeys(groups))


def collective_specs(
    groups: Sequence[Sequence[int]], max_bytes: int, min_bytes: int = 4, per_octave: int = 2
) -> list[ProbeSpec]:
    """Every collective (and an uneven all-to-all) on every group, message sizes from
    `min_bytes` to `max_bytes`, `per_octave` per doubling (2: 2^k and 2^(k+1/2)), visited
    coarse-to-fine so a cut-short sweep still spans the range of every op and group. Sizes
    that the group rounds to the same message (a multiple of its size in float32 elements)
    are measured once, so tiny messages are not over-weighted in the fit."""
    sizes = []
    b = min_bytes
    while b <= max_bytes:
        sizes.extend(s for s in (int(b * 2 ** (i / per_octave)) for i in range(per_octave)) if s <= max_bytes)
        b *= 2
    sizes = sorted(set(sizes))
    variants = [(op, False) for op in COLLECTIVE_OPS] + [("all_to_all", True)]
    seen: set[tuple[tuple[int, ...], int]] = set()
    out = []
    for i in _bit_reversed(len(sizes)):
        for ranks in groups:
            message = message_numel(sizes[i], len(ranks))
            if (tuple(ranks), message) in seen:
                continue
            seen.add((tuple(ranks), message))
            for op, uneven in variants:
                params = {"op": op, "bytes": sizes[i], "ranks": list(ranks), "uneven": uneven, "seed": i}
                tag = f"{op}{'-uneven' if uneven else ''}:{sizes[i]}:g{len(ranks)}"
                out.append(ProbeSpec("collective", params, tag))
    return out


def _collective_point(spec: ProbeSpec) -> CollectivePoint:
    p = spec.params
    ranks = tuple(p["ranks"]) if p.get("ranks") is not None else None
    return CollectivePoint(
        p["op"], int(p["bytes"]), p.get("scope", "intra"), ranks, bool(p.get("uneven", False)), int(p.get("seed", 0))
    )


@dataclass(frozen=True)
class CollectiveProbe:
    """Collective points on a gang: consecutive points on the same ranks share a batch (their
    windows interleave), visited once per pass; a point records the scope of its ranks."""

    family: str = "collective"
    gang: bool = True
    multi_pass: bool = True

    def batch_key(self, spec: ProbeSpec) -> Hashable | None:
        ranks = spec.params.get("ranks")
        return ("ranks", None if ranks is None else tuple(ranks))

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        return ProbeSpec(spec.family, {**spec.params, "scope": placement.scope(spec.params.get("ranks"))}, spec.key)

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        return measure_collectives([_collective_point(s) for s in specs], device=device, **(timing or {}))


PROBE = CollectiveProbe()
