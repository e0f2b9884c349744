"""Bind each rank of a job (and each probe actor of a calibration) to its own share of its
host's cores, as `torchrun --numa-binding=exclusive` does for GPU jobs.

Why: unbound, the scheduler moves a rank's threads and its gloo / NCCL proxy threads between
cores, and a collective's helper thread can wake on the core where the other rank is computing.
Small steps pay for it (#26, 12-05, `benchmarks/core_binding.py`: a one-layer, hidden-64,
batch-2 data-parallel step on 2 ranks, six fresh launches each way, alternating: the launch
medians' median 4.14 ms bound against 6.88 ms unbound; a 34 ms step 33.8 against 35.1 ms).
Binding does not remove slow launches (two of the six bound ones ran 6.5-7.7 ms). A calibration's steps and
the launched job's must run bound the same way, or the model prices a mode the job does not
run in: the probe actors and the launcher's ranks both bind here.

The share is of the cores this process may run on (`os.sched_getaffinity`, which a container's
cpuset narrows), whole physical cores in socket order (`physical_cores`), split among the job's
processes on the same host (`socket.gethostname`: the nodes of a simulated Ray cluster share
one host and its cores). `AUTOTUNE_CORE_BINDING=off`
leaves every process unbound: in a pod without Kubernetes' static CPU manager the allowed set
is the whole machine's, which pods beside it share too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

BINDING_ENV = "AUTOTUNE_CORE_BINDING"
TOPOLOGY = Path("/sys/devices/system/cpu")
MODES = ("exclusive", "off")


class BindingError(ValueError):
    """An invalid `AUTOTUNE_CORE_BINDING`: names the variable and the values it takes."""


def binding_mode() -> str:
    """The binding asked for by `AUTOTUNE_CORE_BINDING` (default `exclusive`)."""
    return checked(os.environ.get(BINDING_ENV, "exclusive").strip().lower())


def checked(mode: str) -> str:
    """`mode` when it is a binding, else a `BindingError` naming the variable and its values."""
    if mode not in MODES:
        raise BindingError(f"{BINDING_ENV}={mode!r} is not a binding; allowed: {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Slot:
    """A process's place among the job's processes on its host."""

    index: int
    count: int


def host_slots(hosts: Sequence[str]) -> list[Slot]:
    """Each process's slot on its host, from the host of every process in rank order."""
    seen: dict[str, int] = {}
    slots = []
    for host in hosts:
        slots.append(Slot(seen.get(host, 0), 0))
        seen[host] = seen.get(host, 0) + 1
    return [Slot(s.index, seen[h]) for s, h in zip(slots, hosts)]


def cpu_list(text: str) -> list[int]:
    """A kernel CPU list (`0-3,8,10-11`) as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def physical_cores(cpus: Iterable[int], topology: Path = TOPOLOGY) -> list[list[int]]:
    """The logical CPUs of `cpus` grouped by physical core (hyperthread siblings together),
    socket by socket, from the kernel's topology; each CPU alone where it is not readable.

    Why grouped: Linux numbers a 2-socket node's first hyperthreads 0..n-1 and their siblings
    n..2n-1, so a split of the numbers in order gives rank 0 CPUs 0-11 and rank 4 CPUs 48-59,
    the same physical cores; a split of physical cores in socket order keeps each rank's CPUs
    its own, on one socket where they fit."""
    wanted = set(cpus)
    groups: dict[tuple[int, ...], int] = {}  # siblings -> socket
    for cpu in sorted(wanted):
        base = topology / f"cpu{cpu}" / "topology"
        try:
            siblings = tuple(c for c in cpu_list((base / "thread_siblings_list").read_text()) if c in wanted)
            socket_id = int((base / "physical_package_id").read_text())
        except (OSError, ValueError):
            siblings, socket_id = (cpu,), 0
        groups.setdefault(siblings or (cpu,), socket_id)
    return [list(g) for g, _ in sorted(groups.items(), key=lambda kv: (kv[1], kv[0][0]))]


def core_share(cores: Sequence[Sequence[int]], slot: Slot) -> list[int]:
    """Slot `slot.index` of `slot.count`'s disjoint, contiguous share of `cores` (physical
    cores, each its logical CPUs: `physical_cores`), as logical CPUs; with more processes than
    cores, the processes share the cores in turn (one core each)."""
    if not cores:
        raise ValueError("no cores to share")
    if slot.count <= 0 or not 0 <= slot.index < slot.count:
        raise ValueError(f"slot {slot.index} of {slot.count} is not a slot")
    if slot.count >= len(cores):
        return sorted(cores[slot.index % len(cores)])
    size, extra = divmod(len(cores), slot.count)  # the first `extra` slots take one core more
    start = slot.index * size + min(slot.index, extra)
    return sorted(cpu for core in cores[start : start + size + (slot.index < extra)] for cpu in core)


def bind_process(cores: Sequence[int]) -> int:
    """Bind every thread this process has (the collective backend's and Ray's included) to
    `cores`; threads started later inherit it from the thread that starts them. Returns how
    many threads were bound."""
    wanted = set(cores)
    bound = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), wanted)
            bound += 1
        except (ProcessLookupError, PermissionError):  # a thread that ended, or one not ours to move
            continue
    return bound


def bind_slot(slot: Slot, mode: str) -> list[int] | None:
    """Bind this process to its slot's share of the cores it may run on under `mode` (the
    driver's `binding_mode()`: a worker's environment may differ); the cores bound, or None
    where binding is off or the platform has none (macOS)."""
    if checked(mode) == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    share = core_share(physical_cores(os.sched_getaffinity(0)), slot)
    bind_process(share)
    return share
