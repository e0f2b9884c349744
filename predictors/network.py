"""Multi-dimensional network model: what one stage of a hierarchical collective costs on one
dimension of the network.

A cluster's network is a stack of dimensions (NVLink inside a node, a rail or pod fabric, the
NICs to the spine). Each has a peer count, the bandwidth one NPU can drive on it (all its
links on that dimension together), a per-step latency and the algorithm it runs, which fixes
how many steps a stage takes. All three algorithms send the same volume per NPU, (P-1)/P of
the stage's larger side (a reduce-scatter's input, an all-gather's output), as bandwidth-optimal
collectives do; they differ in steps: a ring P-1, fully-connected (direct) 1, a switch running
halving-doubling log2 P.

Dimensions come from config (presets below, for hardware we only plan for) or from the
collective models measured on the hardware that exists (`dimension_from_model`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol, Sequence

ALGORITHMS = ("ring", "direct", "switch")
GB = 1e9


class NetworkError(ValueError):
    """A network description that cannot be simulated; the message names the field."""


@dataclass(frozen=True)
class Dimension:
    peers: int
    bandwidth_gbps: float  # GB/s one NPU sends on this dimension, all its links together
    latency_us: float  # per algorithm step
    algorithm: str = "ring"
    name: str = ""

    def __post_init__(self) -> None:
        where = self.name or "dimension"
        if int(self.peers) != self.peers or self.peers < 1:
            raise NetworkError(f"{where}.peers must be a positive integer, got {self.peers!r}")
        if not self.bandwidth_gbps > 0:
            raise NetworkError(f"{where}.bandwidth_gbps must be > 0, got {self.bandwidth_gbps!r}")
        if self.latency_us < 0:
            raise NetworkError(f"{where}.latency_us must be >= 0, got {self.latency_us!r}")
        if self.algorithm not in ALGORITHMS:
            raise NetworkError(f"{where}.algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}")

    @property
    def bandwidth_bps(self) -> float:
        return self.bandwidth_gbps * GB

    @property
    def steps(self) -> int:
        if self.peers == 1:
            return 0
        if self.algorithm == "ring":
            return self.peers - 1
        if self.algorithm == "direct":
            return 1
        return math.ceil(math.log2(self.peers))

    def bytes_sent(self, larger_side_bytes: float) -> float:
        """Bytes one NPU sends in a reduce-scatter (of that input) or all-gather (to that output)."""
        return (self.peers - 1) / self.peers * larger_side_bytes

    def latency_s(self) -> float:
        return self.steps * self.latency_us * 1e-6

    def stage_seconds(self, larger_side_bytes: float) -> float:
        """Time of one stage alone on an idle dimension."""
        return self.latency_s() + self.bytes_sent(larger_side_bytes) / self.bandwidth_bps


@dataclass(frozen=True)
class NetworkTopology:
    name: str
    dims: tuple[Dimension, ...]

    def __post_init__(self) -> None:
        if not self.dims:
            raise NetworkError(f"{self.name}: a topology needs at least one dimension")

    @property
    def npus(self) -> int:
        return math.prod(d.peers for d in self.dims)

    @property
    def peers(self) -> tuple[int, ...]:
        return tuple(d.peers for d in self.dims)

    @property
    def total_bandwidth_bps(self) -> float:
        return sum(d.bandwidth_bps for d in self.dims if d.peers > 1)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dims": [asdict(d) for d in self.dims]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NetworkTopology":
        if "dims" not in data or not isinstance(data["dims"], list):
            raise NetworkError("dims must be a list of dimensions")
        dims = []
        for i, d in enumerate(data["dims"]):
            unknown = set(d) - {"peers", "bandwidth_gbps", "latency_us", "algorithm", "name"}
            if unknown:
                raise NetworkError(f"dims[{i}] has unknown fields {sorted(unknown)}")
            missing = {"peers", "bandwidth_gbps", "latency_us"} - set(d)
            if missing:
                raise NetworkError(f"dims[{i}] lacks {sorted(missing)}")
            try:
                dims.append(Dimension(**{"name": f"dim{i + 1}", **d}))
            except (TypeError, NetworkError) as exc:
                raise NetworkError(f"dims[{i}]: {exc}") from None
        return cls(name=str(data.get("name", "custom")), dims=tuple(dims))


# The six 1024-NPU topologies of the Themis paper (its Table 2): per dimension the peers, the
# aggregate bandwidth per NPU (links x link bandwidth, one direction, Gb/s), the link latency
# (ns) and the algorithm (Ring: ring, FC: direct, SW: halving-doubling on a switch).
PAPER_TOPOLOGIES: dict[str, tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]] = {
    "2D-SW_SW": ((16, 64), (1200, 800), (700, 1700)),
    "3D-SW_SW_SW_homo": ((16, 8, 8), (800, 800, 800), (700, 700, 1700)),
    "3D-SW_SW_SW_hetero": ((16, 8, 8), (1600, 800, 400), (700, 700, 1700)),
    "3D-FC_Ring_SW": ((8, 16, 8), (1400, 800, 400), (700, 700, 1700)),
    "4D-Ring_SW_SW_SW": ((4, 4, 8, 8), (2000, 1600, 800, 400), (20, 700, 700, 1700)),
    "4D-Ring_FC_Ring_SW": ((4, 8, 4, 8), (3000, 1400, 1200, 800), (20, 700, 700, 1700)),
}

# Common GPU clusters, from the vendors' nominal figures (one direction): NVLink inside an
# 8-GPU node, one NIC per GPU to a rail-optimised fabric. For planning hardware we do not have;
# measured hardware is calibrated instead (`dimension_from_model`).
GPU_CLUSTERS: dict[str, tuple[float, float, float, float]] = {
    # name: (NVLink GB/s per GPU, NVLink step latency us, NIC Gb/s per GPU, network step latency us)
    "dgx-a100-200g": (300.0, 0.7, 200.0, 3.0),
    "dgx-h100-400g": (450.0, 0.7, 400.0, 3.0),
    "dgx-b200-400g": (900.0, 0.7, 400.0, 3.0),
}


def _paper_topology(name: str) -> NetworkTopology:
    peers, gbits, latency_ns = PAPER_TOPOLOGIES[name]
    algorithms = {"Ring": "ring", "FC": "direct", "SW": "switch"}
    kinds = name.split("-", 1)[1].replace("_homo", "").replace("_hetero", "").split("_")
    dims = tuple(
        Dimension(peers=p, bandwidth_gbps=b / 8, latency_us=lat / 1000, algorithm=algorithms[k], name=f"dim{i + 1}-{k}")
        for i, (k, p, b, lat) in enumerate(zip(kinds, peers, gbits, latency_ns))
    )
    return NetworkTopology(name=name, dims=dims)


def gpu_cluster(name: str, nodes: int) -> NetworkTopology:
    """An 8-GPU-per-node cluster of `nodes` nodes: NVLink ring inside, NIC ring across."""
    if name not in GPU_CLUSTERS:
        raise NetworkError(f"cluster must be one of {', '.join(GPU_CLUSTERS)}; got {name!r}")
    if int(nodes) != nodes or nodes < 1:
        raise NetworkError(f"nodes must be a positive integer, got {nodes!r}")
    nvlink, nvlink_us, nic_gbit, nic_us = GPU_CLUSTERS[name]
    return NetworkTopology(
        name=f"{name}x{nodes}",
        dims=(
            Dimension(peers=8, bandwidth_gbps=nvlink, latency_us=nvlink_us, algorithm="ring", name="nvlink"),
            Dimension(peers=int(nodes), bandwidth_gbps=nic_gbit / 8, latency_us=nic_us, algorithm="ring", name="nic"),
        ),
    )


def preset(name: str) -> NetworkTopology:
    """A named topology: one of the paper's six, or `<cluster>x<nodes>` (e.g. dgx-h100-400gx16)."""
    if name in PAPER_TOPOLOGIES:
        return _paper_topology(name)
    for cluster in GPU_CLUSTERS:
        rest = name[len(cluster) :]
        if name.startswith(cluster) and rest.startswith("x") and rest[1:].isdigit():
            return gpu_cluster(cluster, int(rest[1:]))
    raise NetworkError(
        f"unknown topology {name!r}; presets: {', '.join(PAPER_TOPOLOGIES)}, or "
        f"<cluster>x<nodes> with cluster one of {', '.join(GPU_CLUSTERS)}"
    )


def topology_from_config(config: dict[str, Any]) -> NetworkTopology:
    """A job file's `network` section (a preset name or explicit dims) → topology; errors
    name the field under `network.`. `topology: calibrated` is built by the orchestrator from
    the cluster's fingerprint and measured collectives instead."""
    if "dims" in config:
        try:
            return NetworkTopology.from_dict({"name": "job", "dims": config["dims"]})
        except NetworkError as exc:
            raise NetworkError(f"network.{exc}") from None
    try:
        return preset(str(config.get("topology")))
    except NetworkError as exc:
        raise NetworkError(f"network.topology: {exc}") from None


def check_topology_size(topology: NetworkTopology, world_size: int) -> NetworkTopology:
    if topology.npus != world_size:
        raise NetworkError(
            f"network: the topology has {topology.npus} NPUs "
            f"({' x '.join(map(str, topology.peers))}), the job's world_size is {world_size}"
        )
    return topology


class CollectivePredictor(Protocol):
    def predict(self, op: str, strict: bool = False, **params: Any) -> float: ...


def dimension_from_model(
    model: CollectivePredictor,
    peers: int,
    scope: str,
    name: str = "",
    sizes: Sequence[int] = (1 << 16, 1 << 20, 1 << 22),
) -> Dimension:
    """A dimension calibrated from the measured reduce-scatter curve of a `peers`-rank group:
    the time at the smallest size is the latency, the slope between the larger sizes the
    bandwidth (per the volume a ring sends). Measured hardware is treated as a ring, which is
    what gloo and NCCL run inside a group."""
    if peers < 2:
        raise NetworkError(f"{name or 'dimension'}: calibrating needs a group of at least 2 ranks")
    times = [model.predict("reduce_scatter", bytes=int(s), world=peers, scope=scope) for s in sizes]
    small, mid, large = times
    sent = (peers - 1) / peers * (sizes[2] - sizes[1])
    if large <= mid:
        raise NetworkError(
            f"{name or 'dimension'}: the reduce_scatter curve for {peers} ranks ({scope}) does not "
            f"grow with size; recalibrate"
        )
    bandwidth = sent / (large - mid) / GB
    latency_us = max(small - (peers - 1) / peers * sizes[0] / (bandwidth * GB), 0.0) / (peers - 1) * 1e6
    return Dimension(
        peers=peers, bandwidth_gbps=bandwidth, latency_us=latency_us, algorithm="ring", name=name or f"{scope}{peers}"
    )
