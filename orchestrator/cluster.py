"""Hardware fingerprint: what every node has, and a short stable `hardware_id` for it.

The id hashes hardware only (node count, devices per node, device model and memory,
interconnect). Software versions (driver, CUDA, NCCL, torch, fbgemm) are recorded next to it
and compared separately, so a driver upgrade marks models stale instead of orphaning them.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
from collections import Counter
from dataclasses import asdict, dataclass, field
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
    devices: list[DeviceInfo]
    interconnect: list[list[str]] = field(default_factory=list)  # device x device link kind
    software: dict[str, str] = field(default_factory=dict)

    def hardware_key(self) -> dict[str, Any]:
        """What identifies the node's hardware class (never hostnames, uuids or versions)."""
        return {
            "cpu": self.cpu_model,
            "cores": self.cpu_cores,
            "memory_gib": round(self.memory_bytes / GIB),
            "devices": sorted((d.kind, d.name, round(d.memory_bytes / GIB)) for d in self.devices),
            "interconnect": self.interconnect,
        }


@dataclass
class HardwareFingerprint:
    nodes: list[NodeFingerprint]

    @property
    def hardware_id(self) -> str:
        keys = sorted(json.dumps(n.hardware_key(), sort_keys=True) for n in self.nodes)
        digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:10]
        first = self.nodes[0]
        gpus = [d for d in first.devices if d.kind == "cuda"]
        if gpus:
            label = f"{_slug(gpus[0].name)}x{len(gpus)}"
        else:
            label = f"cpu{first.cpu_cores}c"
        return f"{label}-n{len(self.nodes)}-{digest}"

    @property
    def device_kind(self) -> str:
        return "cuda" if any(d.kind == "cuda" for n in self.nodes for d in n.devices) else "cpu"

    @property
    def devices_per_node(self) -> list[int]:
        return [len(n.devices) for n in self.nodes]

    @property
    def software(self) -> dict[str, str]:
        """Versions that must match across nodes; a node that differs is reported as mixed."""
        merged: dict[str, str] = {}
        for key in sorted({k for n in self.nodes for k in n.software}):
            values = sorted({n.software.get(key, "") for n in self.nodes})
            merged[key] = values[0] if len(values) == 1 else "mixed:" + "|".join(values)
        return merged

    @property
    def min_device_memory_bytes(self) -> int:
        return min(d.memory_bytes for n in self.nodes for d in n.devices)

    def summary(self) -> str:
        kinds = Counter(f"{d.name} ({d.memory_bytes / GIB:.0f} GiB)" for n in self.nodes for d in n.devices)
        devices = ", ".join(f"{c}x {k}" for k, c in kinds.items())
        return f"{len(self.nodes)} node(s): {devices}"

    def to_dict(self) -> dict[str, Any]:
        return {"hardware_id": self.hardware_id, "software": self.software, "nodes": [asdict(n) for n in self.nodes]}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower().replace("nvidia", ""))[:16] or "gpu"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total_memory() -> int:
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
                DeviceInfo("cuda", _str(pynvml.nvmlDeviceGetName(h)), int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                           i, _str(pynvml.nvmlDeviceGetUUID(h)), f"{major}.{minor}")
            )
        links = [[_link_kind(pynvml, a, b) for b in handles] for a in handles]
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


def software_versions() -> dict[str, str]:
    import torch

    versions = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import fbgemm_gpu

        versions["fbgemm_gpu"] = getattr(fbgemm_gpu, "__version__", "unknown")
    except ImportError:
        versions["fbgemm_gpu"] = "missing"
    if torch.version.cuda:
        versions["cuda_runtime"] = torch.version.cuda
    if torch.cuda.is_available():
        try:
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    versions["gloo"] = str(torch.distributed.is_available() and torch.distributed.is_gloo_available())
    return versions


def local_node_fingerprint(cpu_slots: int | None = None) -> NodeFingerprint:
    """This process's node. Without a GPU the devices are the usable CPU cores (one slot each),
    at most `cpu_slots`: the CPUs Ray may schedule there, which a node started with
    `--num-cpus` or a container quota keeps below the cores the affinity mask shows."""
    gpus, links, gpu_software = _nvml_devices()
    cores = _usable_cores()
    memory = _total_memory()
    cpu = _cpu_model()
    slots = min(cores, cpu_slots) if cpu_slots else cores
    devices = gpus or [DeviceInfo("cpu", cpu, memory // max(cores, 1), i) for i in range(slots)]
    software = {**software_versions(), **gpu_software}
    return NodeFingerprint(socket.gethostname(), cpu, cores, memory, devices, links, software)


def cluster_fingerprint() -> HardwareFingerprint:
    """Fingerprint every alive node of the connected Ray cluster (one task pinned per node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0)(local_node_fingerprint)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            int(n.get("Resources", {}).get("CPU", 0)) or None)
        for n in nodes
    ]
    return HardwareFingerprint(ray.get(refs))
