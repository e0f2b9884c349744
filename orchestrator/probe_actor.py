"""`ProbeActor`: one per device, runs probes there; a gang of them runs collectives."""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any

import ray

from orchestrator.drill import apply_drill, drill_slowdown
from probes.probe import ProbeSpec
from probes.sweep import run_collective_batch, run_local_probe
from probes.vocabulary.records import Measurement


@ray.remote
class ProbeActor:
    """Pinned to one placement-group bundle (one GPU, or one CPU slot), one intra-op thread."""

    def __init__(self, device_kind: str = "cpu", hardware_id: str = "", threads: int = 1):
        import torch

        torch.set_num_threads(threads)
        self.device = "cuda:0" if device_kind == "cuda" else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES
        if device_kind == "cuda":
            torch.cuda.set_device(0)  # NCCL's communicators and batched point-to-point use the current device
        self.hardware_id = hardware_id
        # Simulated nodes share a hostname; the Ray node id tells them apart.
        self.node = f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
        self.backend = "nccl" if device_kind == "cuda" else "gloo"
        # A drill (orchestrator.drill): this machine behaves N times slower.
        self.slowdown = drill_slowdown()

    def _stamp(self, rows: list[Measurement], started: float) -> list[Measurement]:
        """Where the rows were measured, and each row's share of the time this call spent in
        the probe (`extra["probe_s"]`: warm-up, setup and repeats, what a calibration's wall
        time is compared with)."""
        elapsed = time.perf_counter() - started
        for r in rows:
            r.hardware_id, r.node = self.hardware_id, self.node
            r.extra["probe_s"] = elapsed / len(rows)
        return apply_drill(rows, self.slowdown)

    def where(self) -> dict[str, Any]:
        """This actor's node, address and, on a GPU, the device's free memory (what bounds the
        largest probe, decided here on the device rather than on a driver that may have none)."""
        free = None
        if self.device.startswith("cuda"):
            import torch

            free = int(torch.cuda.mem_get_info()[0])
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "niceness": os.nice(0),
            "device_free_bytes": free,
        }

    def wait_quiet(self, max_wait_s: float = 20.0) -> dict[str, Any]:
        """Wait until this actor's host has gone quiet (`orchestrator.quiet_host`), so a pass
        timed seconds after Ray started does not run beside its booting workers."""
        from dataclasses import asdict

        from orchestrator.quiet_host import wait_for_quiet_host

        return {"node": self.node, **asdict(wait_for_quiet_host(max_wait_s=max_wait_s))}

    def bind(self, index: int, count: int, mode: str) -> list[int] | None:
        """Bind this actor to slot `index` of `count` on its host (`core_binding`): the cores
        bound, or None when unbound."""
        from orchestrator.core_binding import Slot, bind_slot

        return bind_slot(Slot(index, count), mode)

    def run_local(self, spec: ProbeSpec) -> list[Measurement]:
        started = time.perf_counter()
        return self._stamp(run_local_probe(spec, self.device), started)

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def init_group(self, addr: str, port: int, rank: int, world: int, timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        from probes.collective import forget_groups

        forget_groups()
        if dist.is_initialized():
            dist.destroy_process_group()
        import torch

        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            # NCCL binds the group to its device (every tensor it is handed lives there: probes.comm)
            device_id=torch.device(self.device) if self.backend == "nccl" else None,
        )

    def run_collectives(self, specs: list[ProbeSpec], timing: dict[str, Any] | None = None) -> list[Measurement]:
        started = time.perf_counter()
        return self._stamp(run_collective_batch(specs, self.device, timing), started)

    def destroy_group(self) -> None:
        import torch.distributed as dist

        from probes.collective import forget_groups

        forget_groups()
        if dist.is_initialized():
            dist.destroy_process_group()
