"""Hardware fingerprint: what every node has, and a short stable `hardware_id` for it.

The id hashes hardware only (node count, devices per node, device model and memory,
interconnect). Software versions (driver, CUDA, NCCL, torch, fbgemm) are recorded next to it
and compared separately, so a driver upgrade marks models stale instead of orphaning them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import socket
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30


@dataclass
class DeviceInfo:
    kind: str  # "cuda" or "cpu"
    name: str
    memory_bytes: int
    index: int = 0
    uuid: str = ""
    compute_capability: str = ""


@dataclass
class NodeFingerprint:
    hostname: str
    cpu_model: str
    cpu_cores: int
    memory_bytes: int
    devices: list[DeviceInfo]  # what the node offers to work: its GPUs, else its CPU slots (may be none)
    interconnect: list[list[str]] = field(default_factory=list)  # device x device link kind
    software: dict[str, str] = field(default_factory=dict)
    node_id: str = ""  # the Ray node id (where the launcher pins ranks); not part of the hardware

    def hardware_key(self) -> dict[str, Any]:
        """What identifies the node's hardware class (never hostnames, uuids or versions)."""
        return {
            "cpu": self.cpu_model,
            "cores": self.cpu_cores,
            "memory_gib": round(self.memory_bytes / GIB),
            "devices": sorted((d.kind, d.name, round(d.memory_bytes / GIB)) for d in self.devices),
            "interconnect": self.interconnect,
        }

    @property
    def device_kind(self) -> str | None:
        return "cuda" if any(d.kind == "cuda" for d in self.devices) else ("cpu" if self.devices else None)

    def label(self) -> str:
        gpus = [d for d in self.devices if d.kind == "cuda"]
        return f"{_slug(gpus[0].name)}x{len(gpus)}" if gpus else f"cpu{len(self.devices)}c"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeFingerprint":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["devices"] = [DeviceInfo(**d) for d in data.get("devices", [])]
        return cls(**fields)


@dataclass
class NodeType:
    """Device nodes of one hardware class: how many, and what each offers."""

    label: str
    nodes: int
    devices_per_node: int
    device: str
    device_memory_bytes: int

    def describe(self) -> str:
        return f"{self.nodes} x {self.label} ({self.devices_per_node} x {self.device}, {self.device_memory_bytes / GIB:.0f} GiB)"


@dataclass
class HardwareFingerprint:
    """Every node Ray reports; only the device nodes are the hardware. When any node has GPUs,
    the devices are GPUs and a node without (a KubeRay head) is not part of the hardware; on a
    CPU cluster the devices are the CPUs Ray offers for work (a head started with
    `--num-cpus=0` offers none). Device nodes are listed most devices first: the order ranks
    are packed onto them (`probes.vocabulary.placement.RankPlacement.packed`)."""

    nodes: list[NodeFingerprint]

    @property
    def device_kind(self) -> str:
        return "cuda" if any(n.device_kind == "cuda" for n in self.nodes) else "cpu"

    @property
    def device_nodes(self) -> list[NodeFingerprint]:
        kind = self.device_kind
        chosen = [n for n in self.nodes if n.device_kind == kind]
        return sorted(chosen, key=lambda n: (-len(n.devices), json.dumps(n.hardware_key(), sort_keys=True), n.node_id))

    @property
    def hardware_id(self) -> str:
        nodes = self.device_nodes
        keys = sorted(json.dumps(n.hardware_key(), sort_keys=True) for n in nodes)
        digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:10]
        labels = sorted({n.label() for n in nodes})
        label = labels[0] if len(labels) == 1 else "mixed" if labels else "nodevice"
        return f"{label}-n{len(nodes)}-{digest}"

    @property
    def devices_per_node(self) -> list[int]:
        return [len(n.devices) for n in self.device_nodes]

    @property
    def node_ids(self) -> list[str]:
        """Ray node ids of the device nodes, in `devices_per_node` order."""
        return [n.node_id for n in self.device_nodes]

    def node_types(self) -> list[NodeType]:
        groups: dict[str, list[NodeFingerprint]] = {}
        for n in self.device_nodes:
            groups.setdefault(json.dumps(n.hardware_key(), sort_keys=True), []).append(n)
        out = []
        for members in groups.values():
            first = members[0]
            out.append(
                NodeType(
                    first.label(),
                    len(members),
                    len(first.devices),
                    first.devices[0].name,
                    first.devices[0].memory_bytes,
                )
            )
        return out

    @property
    def software(self) -> dict[str, str]:
        """Versions that must match across nodes; a node that differs is reported as mixed."""
        nodes = self.device_nodes or self.nodes
        merged: dict[str, str] = {}
        for key in sorted({k for n in nodes for k in n.software}):
            values = sorted({n.software.get(key, "") for n in nodes})
            merged[key] = values[0] if len(values) == 1 else "mixed:" + "|".join(values)
        return merged

    @property
    def min_device_memory_bytes(self) -> int:
        """The smallest device's memory; 0 when no device's memory is known (GPUs that Ray
        declares but NVML cannot see)."""
        known = [d.memory_bytes for n in self.device_nodes for d in n.devices if d.memory_bytes > 0]
        return min(known) if known else 0

    def summary(self) -> str:
        if not self.device_nodes:
            return f"{len(self.nodes)} node(s), none offering a device"
        kinds = Counter(f"{d.name} ({d.memory_bytes / GIB:.0f} GiB)" for n in self.device_nodes for d in n.devices)
        devices = ", ".join(f"{c}x {k}" for k, c in kinds.items())
        others = len(self.nodes) - len(self.device_nodes)
        extra = f" (+{others} node(s) without devices)" if others else ""
        types = self.node_types()
        per_type = "; node types: " + ", ".join(t.describe() for t in types) if len(types) > 1 else ""
        return f"{len(self.device_nodes)} node(s): {devices}{extra}{per_type}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware_id": self.hardware_id,
            "software": self.software,
            "device_kind": self.device_kind,
            "devices_per_node": self.devices_per_node,
            "node_types": [asdict(t) for t in self.node_types()],
            "nodes": [asdict(n) for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HardwareFingerprint":
        """A stored fingerprint (`fingerprint.json` beside a calibration's measurements)."""
        return cls([NodeFingerprint.from_dict(n) for n in data["nodes"]])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower().replace("nvidia", ""))[:16] or "gpu"


def cpu_model() -> str:
    """This host's CPU model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_memory_bytes() -> int:
    """This host's physical memory (0 when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _nvml_devices() -> tuple[list[DeviceInfo], list[list[str]], dict[str, str]]:
    """GPUs through NVML; empty lists when there is no library, no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return [], [], {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return [], [], {}
    try:
        software = {"driver": _str(pynvml.nvmlSystemGetDriverVersion())}
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            software["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:
            pass
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        devices = []
        for i, h in enumerate(handles):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            devices.append(
                DeviceInfo(
                    "cuda",
                    _str(pynvml.nvmlDeviceGetName(h)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    i,
                    _str(pynvml.nvmlDeviceGetUUID(h)),
                    f"{major}.{minor}",
                )
            )
        links = [[_link_kind(pynvml, a, b) for b in handles] for a in handles]
        # Clock settings per GPU (settings, like TF32, not hardware identity: they stay out of
        # hardware_key()). The applications clocks are the configured targets; the momentary
        # clock (nvmlDeviceGetClockInfo) is left out on purpose: it follows load and power
        # state, and every software key is compared when a model's freshness is checked.
        for key, query, kind in (
            ("gpu_sm_app_clock_mhz", "nvmlDeviceGetApplicationsClock", "NVML_CLOCK_SM"),
            ("gpu_mem_app_clock_mhz", "nvmlDeviceGetApplicationsClock", "NVML_CLOCK_MEM"),
            ("gpu_sm_max_clock_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
            ("gpu_mem_max_clock_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
        ):
            values = []
            for h in handles:
                try:
                    values.append(str(int(getattr(pynvml, query)(h, getattr(pynvml, kind)))))
                except (pynvml.NVMLError, AttributeError):
                    values.append("n/a")
            if values and any(v != "n/a" for v in values):
                software[key] = values[0] if len(set(values)) == 1 else ",".join(values)  # per GPU index
        return devices, links, software
    finally:
        pynvml.nvmlShutdown()


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _link_kind(pynvml: Any, a: Any, b: Any) -> str:
    if a == b:
        return "self"
    try:
        if pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_OK:
            return "nvlink"
    except pynvml.NVMLError:
        pass
    try:
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
        return {0: "internal", 10: "pix", 20: "pxb", 30: "phb", 40: "node", 50: "sys"}.get(level, f"level{level}")
    except pynvml.NVMLError:
        return "unknown"


# fbgemm_gpu keeps its version in these files of its package, and `fbgemm_gpu.__version__`
# is read from the first one present (fbgemm_gpu/__init__.py).
FBGEMM_TARGETS = ("default", "genai", "hstu")


def fbgemm_version() -> str:
    """fbgemm_gpu's version, as `fbgemm_gpu.__version__` states it, read from the package's
    files without importing it: the import loads its kernel libraries (about 3 s on 2 cores),
    which a command that only prices or plans never needs, and every command fingerprints."""
    spec = importlib.util.find_spec("fbgemm_gpu")
    if spec is None or not spec.submodule_search_locations:
        return "missing"
    docs = Path(next(iter(spec.submodule_search_locations))) / "docs"
    for target in FBGEMM_TARGETS:
        try:
            return str(json.loads((docs / f"target.{target}.json.py").read_text())["version"])
        except (OSError, ValueError, KeyError):
            continue
    try:  # a layout without those files: the package says it itself
        import fbgemm_gpu
    except ImportError:
        return "missing"
    return str(getattr(fbgemm_gpu, "__version__", "unknown"))


def software_versions() -> dict[str, str]:
    import torch

    versions = {"torch": torch.__version__, "python": platform.python_version(), "fbgemm_gpu": fbgemm_version()}
    if torch.version.cuda:
        versions["cuda_runtime"] = torch.version.cuda
    if torch.cuda.is_available():
        try:
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    versions["gloo"] = str(torch.distributed.is_available() and torch.distributed.is_gloo_available())
    # TF32 in effect: on Ampere+ it decides whether an fp32 GEMM / convolution runs on tensor
    # cores (several times faster), so models fitted under one setting misprice the other.
    try:
        versions["tf32_matmul"] = str(bool(torch.backends.cuda.matmul.allow_tf32))
        versions["tf32_cudnn"] = str(bool(torch.backends.cudnn.allow_tf32))
        versions["float32_matmul_precision"] = str(torch.get_float32_matmul_precision())
    except (AttributeError, RuntimeError):
        pass
    return versions


def local_node_fingerprint(cpu_slots: int | None = None, gpu_slots: int | None = None) -> NodeFingerprint:
    """This process's node, as much of it as is offered to work: `gpu_slots` / `cpu_slots` are
    the GPUs / CPUs Ray may schedule there (None: everything the node has). With GPUs the
    devices are the GPUs NVML sees, at most `gpu_slots` (GPUs Ray declares beyond what NVML sees
    are listed with unknown memory); without, the devices are the usable cores, at most
    `cpu_slots`: a node started with `--num-cpus` or a container quota offers fewer than the
    affinity mask shows, and one started with `--num-cpus=0` offers none."""
    gpus, links, gpu_software = _nvml_devices()
    cores = _usable_cores()
    memory = total_memory_bytes()
    cpu = cpu_model()
    if gpu_slots is not None:
        gpus, links = gpus[:gpu_slots], [row[:gpu_slots] for row in links[:gpu_slots]]
        gpus += [
            DeviceInfo("cuda", "GPU declared by Ray (not seen by NVML)", 0, i) for i in range(len(gpus), gpu_slots)
        ]
    if gpus:
        devices = gpus
    else:
        slots = cores if cpu_slots is None else min(cores, max(0, cpu_slots))
        devices = [DeviceInfo("cpu", cpu, memory // max(cores, 1), i) for i in range(slots)]
    software = {**software_versions(), **gpu_software}
    return NodeFingerprint(socket.gethostname(), cpu, cores, memory, devices, links, software)


def _located(node_id: str, cpu_slots: int, gpu_slots: int) -> NodeFingerprint:
    fingerprint = local_node_fingerprint(cpu_slots, gpu_slots)
    fingerprint.node_id = node_id
    return fingerprint


def cluster_fingerprint() -> HardwareFingerprint:
    """Fingerprint every alive node of the connected Ray cluster (one zero-CPU task pinned per
    node), each with the CPUs and GPUs Ray offers there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0)(_located)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = []
    for n in nodes:
        offered = n.get("Resources", {})
        strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        refs.append(
            remote.options(scheduling_strategy=strategy).remote(
                n["NodeID"], int(offered.get("CPU", 0)), int(offered.get("GPU", 0))
            )
        )
    return HardwareFingerprint(ray.get(refs))
