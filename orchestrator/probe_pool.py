"""The probe actors of a calibration: `ActorPool`, one `ProbeActor` per device inside a
placement group, replaced when one dies or hangs; and `Gang`, pool actors joined in one
torch.distributed group for collective and training probes (`orchestrator.fanout` runs the
probes on them)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.core_binding import Slot, binding_mode, host_slots
from orchestrator.probe_actor import ProbeActor
from probes.collective_sweep import default_max_collective_bytes
from probes.probe import ProbeSpec
from probes.registry import probe_for
from probes.vocabulary.placement import RankPlacement

ACTOR_CALL_TIMEOUT_S = 60.0  # a bookkeeping call (where, free_port) on a live actor answers in well under this


@dataclass
class ActorPool:
    """The actors, one per bundle of a placement group, with their replacements on death."""

    device_kind: str
    hardware_id: str
    num_devices: int
    strategy: str = "PACK"
    mode: str = "off"  # the core binding, read from the driver's environment at `start`
    pg: object = None
    actors: list = field(default_factory=list)
    replaced: int = 0
    slots: list[Slot] = field(default_factory=list)  # each actor's place on its host (`core_binding`)
    # the cores each actor was bound to at `start` (a replacement is rebound to its slot, unawaited)
    cores: list[list[int] | None] = field(default_factory=list)

    def start(self, ready_timeout_s: float = 120.0) -> "ActorPool":
        bundle = {"CPU": 1, "GPU": 1} if self.device_kind == "cuda" else {"CPU": 1}
        self.pg = placement_group([dict(bundle) for _ in range(self.num_devices)], strategy=self.strategy)
        try:
            ray.get(self.pg.ready(), timeout=ready_timeout_s)
        except GetTimeoutError:
            remove_placement_group(self.pg)
            raise RuntimeError(
                f"could not reserve {self.num_devices} x {bundle} within {ready_timeout_s:.0f}s; "
                f"cluster resources: {ray.cluster_resources()}"
            ) from None
        self.actors = [self._spawn(i) for i in range(self.num_devices)]
        try:
            where = ray.get([a.where.remote() for a in self.actors], timeout=ready_timeout_s)
        except GetTimeoutError:
            self.stop()
            raise RuntimeError(f"{self.num_devices} probe actor(s) not ready within {ready_timeout_s:.0f}s") from None
        # Each actor on its own share of its host's cores, as the launched job's ranks will be:
        # the steps and kernels the models are fitted on run as the job's do (`core_binding`).
        self.mode = binding_mode()
        self.slots = host_slots([w["host"] for w in where])
        self.cores = ray.get(
            [a.bind.remote(s.index, s.count, self.mode) for a, s in zip(self.actors, self.slots)],
            timeout=ACTOR_CALL_TIMEOUT_S,
        )
        return self

    def _spawn(self, index: int):
        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=index
            ),
            "num_cpus": 1,
        }
        if self.device_kind == "cuda":
            options["num_gpus"] = 1
        return ProbeActor.options(**options).remote(self.device_kind, self.hardware_id)

    def replace(self, index: int) -> None:
        try:
            ray.kill(self.actors[index])
        except RayError:
            pass
        self.actors[index] = self._spawn(index)
        self.replaced += 1
        if self.slots:  # the same bundle, so the same host: the same slot
            slot = self.slots[index]
            self.actors[index].bind.remote(slot.index, slot.count, self.mode)

    def stop(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except RayError:
                pass
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None

    def nodes(self) -> list[str]:
        return [w["node_id"] for w in ray.get([a.where.remote() for a in self.actors], timeout=ACTOR_CALL_TIMEOUT_S)]

    def max_collective_bytes(self) -> int:
        """The largest collective message, from the free memory of the devices themselves (the
        driver may be a head with no device at all)."""
        free = [
            w.get("device_free_bytes")
            for w in ray.get([a.where.remote() for a in self.actors], timeout=ACTOR_CALL_TIMEOUT_S)
        ]
        known = [f for f in free if f]
        return default_max_collective_bytes(self.device_kind, min(known) if known else None)


class Gang:
    """Pool actors (all, or `members`) joined in one process group for collective and training
    probes. Ranks are numbered node by node (as Ray Train and torchrun number a job's ranks), so
    a group of consecutive ranks stays on a node the way a job's would."""

    def __init__(self, pool: ActorPool, members: Sequence[int] | None = None, timeout_s: float = 120.0):
        self.pool, self.timeout_s = pool, timeout_s
        where = pool.nodes()
        chosen = list(range(len(pool.actors))) if members is None else list(members)
        first_seen = {node: i for i, node in reversed(list(enumerate(where)))}
        self.members = sorted(chosen, key=lambda i: (first_seen[where[i]], i))
        self.nodes = [where[i] for i in self.members]

    @property
    def actors(self) -> list:
        return [self.pool.actors[i] for i in self.members]

    def placement(self, world: int | None = None) -> RankPlacement:
        """The node of each of the first `world` ranks (default: all)."""
        return RankPlacement.from_node_names(self.nodes[:world])

    def scope(self, ranks: Sequence[int] | None = None) -> str:
        """`intra` when every member of the group is on one node, else `inter`."""
        return self.placement().scope(ranks)

    def form(self) -> None:
        leader = self.actors[0]
        addr = ray.get(leader.where.remote(), timeout=ACTOR_CALL_TIMEOUT_S)["ip"]
        port = ray.get(leader.free_port.remote(), timeout=ACTOR_CALL_TIMEOUT_S)
        world = len(self.members)
        ray.get(
            [a.init_group.remote(addr, port, rank, world, self.timeout_s) for rank, a in enumerate(self.actors)],
            timeout=self.timeout_s + ACTOR_CALL_TIMEOUT_S,
        )

    def disband(self, timeout_s: float = 15.0) -> None:
        """Destroy the group on every member, waiting `timeout_s` in all (a stuck member is
        killed with the pool)."""
        refs = [a.destroy_group.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayError:
                pass

    def rebuild(self) -> None:
        """A group with a dead or stuck member cannot be reused: restart every member (each on
        its own bundle, so on the same node)."""
        for i in self.members:
            self.pool.replace(i)
        self.form()

    def run(self, specs: Sequence[ProbeSpec], timing: dict | None = None, until: float | None = None):
        """Run one batch on every member; rows come from each group's first rank. Waits at most
        until `until` (monotonic), else `timeout_s` per spec: a stuck member raises
        GetTimeoutError and the caller rebuilds the gang (killing every member)."""
        refs = [a.run_collectives.remote(list(specs), timing) for a in self.actors]
        timeout = self.timeout_s * (1 + len(specs))
        if until is not None:
            timeout = max(1.0, min(timeout, until - time.monotonic()))
        results = ray.get(refs, timeout=timeout)
        return [row for rows in results for row in rows]

    def placed(self, spec: ProbeSpec) -> ProbeSpec:
        """The spec with where its ranks run, as its probe records it (`Probe.placed`): a
        collective's or pair's scope, a training probe's placement (so its step is priced on
        the curves of the scopes it ran at)."""
        return probe_for(spec.family).placed(spec, self.placement())
