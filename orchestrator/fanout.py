"""Fan probes out over one `ProbeActor` per device, inside a placement group.

Local probes go through a work queue (one in flight per actor). A probe that raises, or whose
actor dies, is retried once on another actor; a second failure is recorded with its error.
Every result is written to the `MeasurementStore` as it arrives. Collective probes run on a
gang of all actors sharing one torch.distributed group; a failed point tears the gang down,
rebuilds it (replacing dead actors) and retries once.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.measurement_store import MeasurementStore
from orchestrator.probe_actor import ProbeActor
from probes.collective_sweep import (
    COLLECTIVE_PASSES,
    collective_batch_bytes,
    collective_pass_timing,
    default_max_collective_bytes,
)
from probes.probe import ProbeSpec
from probes.registry import probe_for
from probes.sweep import collective_batches
from probes.vocabulary.placement import RankPlacement

ProgressFn = Callable[[int, int], None]  # (done, failed) increments
ACTOR_CALL_TIMEOUT_S = 60.0  # a bookkeeping call (where, free_port) on a live actor answers in well under this


@dataclass
class ActorPool:
    """The actors, one per bundle of a placement group, with their replacements on death."""

    device_kind: str
    hardware_id: str
    num_devices: int
    strategy: str = "PACK"
    pg: object = None
    actors: list = field(default_factory=list)
    replaced: int = 0

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
            ray.get([a.where.remote() for a in self.actors], timeout=ready_timeout_s)
        except GetTimeoutError:
            self.stop()
            raise RuntimeError(f"{self.num_devices} probe actor(s) not ready within {ready_timeout_s:.0f}s") from None
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


GRACE_S = 20.0  # how far past its deadline a phase may run: a probe started just before it finishes
PROBE_TIMEOUT_S = 120.0  # no single local probe point takes this long (time_callable caps its repeats)


def run_local_probes(
    pool: ActorPool,
    specs: Sequence[ProbeSpec],
    store: MeasurementStore,
    deadline: float,
    progress: ProgressFn | None = None,
    grace_s: float = GRACE_S,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
) -> tuple[int, int]:
    """Measure `specs` until done or `deadline`; returns (points measured, points failed).

    Every wait is bounded: a probe still running `probe_timeout_s` after it started, or at
    `deadline + grace_s`, is cancelled (its actor killed and replaced: a hung or stopped process
    answers no cancel) and retried once on another actor while time remains, else recorded as
    failed with the reason; a retry the deadline leaves no time for is recorded too."""
    queue = collections.deque((s, 0, None) for s in specs)  # (spec, attempt, actor that failed it)
    idle: list[int] = []
    # Every actor takes probes once it answers: a replacement from an earlier phase may still be
    # starting (importing torch on a loaded host takes tens of seconds), which no probe is charged.
    booting: dict = {a.where.remote(): (i, time.monotonic()) for i, a in enumerate(pool.actors)}
    in_flight: dict = {}  # ref -> (actor index, spec, attempt, started)
    done = failed = 0

    def restart(actor_index: int) -> None:
        """Kill and replace an actor; it takes probes again once it answers (its start-up is
        not charged to a probe)."""
        pool.replace(actor_index)
        booting[pool.actors[actor_index].where.remote()] = (actor_index, time.monotonic())

    def fail(spec: ProbeSpec, attempt: int, actor_index: int | None, why: str) -> None:
        nonlocal failed
        if attempt == 0 and time.monotonic() < deadline:
            queue.appendleft((spec, 1, actor_index))
            return
        if attempt == 0:
            why += "; no time left for a retry"
        store.add_failure(spec.to_dict(), why, attempt + 1)
        failed += 1
        progress and progress(0, 1)

    def submit() -> None:
        while idle and queue and time.monotonic() < deadline:
            spec, attempt, avoid = queue[0]
            choices = [i for i in idle if i != avoid] or idle
            actor_index = choices[0]
            queue.popleft()
            idle.remove(actor_index)
            ref = pool.actors[actor_index].run_local.remote(spec)
            in_flight[ref] = (actor_index, spec, attempt, time.monotonic())

    def admit_booted(wait_s: float = 0.0) -> None:
        if not booting:
            return
        ready, _ = ray.wait(list(booting), num_returns=len(booting), timeout=wait_s)
        now = time.monotonic()
        for ref in list(booting):
            actor_index, asked = booting[ref]
            if ref in ready or now - asked > ACTOR_CALL_TIMEOUT_S:
                del booting[ref]
                try:
                    if ref not in ready:
                        raise GetTimeoutError("no answer")
                    ray.get(ref)
                    idle.append(actor_index)
                except (RayError, GetTimeoutError):
                    restart(actor_index)  # it never came up: try a fresh one (bounded by the deadline)

    admit_booted(wait_s=min(5.0, max(0.0, deadline - time.monotonic())))
    submit()
    while (in_flight or (booting and queue)) and (in_flight or time.monotonic() < deadline):
        now = time.monotonic()
        limit = min([started + probe_timeout_s for _, _, _, started in in_flight.values()] + [deadline + grace_s])
        waiting_on = list(in_flight) + list(booting)
        ready, _ = ray.wait(waiting_on, num_returns=1, timeout=max(0.0, min(limit - now, 1.0)))
        admit_booted()
        finished = [r for r in ready if r in in_flight]
        if not finished:
            now = time.monotonic()
            for ref, (actor_index, spec, attempt, started) in list(in_flight.items()):
                if now >= started + probe_timeout_s or now >= deadline + grace_s:
                    del in_flight[ref]
                    restart(actor_index)  # kill: a hung (or SIGSTOPped) actor answers no cancel
                    fail(
                        spec, attempt, actor_index, f"timed out after {now - started:.0f}s (actor killed and replaced)"
                    )
            submit()
            continue
        ref = finished[0]
        actor_index, spec, attempt, _ = in_flight.pop(ref)
        try:
            rows = ray.get(ref)
            store.add(rows, done=spec.to_dict())
            done += 1
            progress and progress(1, 0)
            idle.append(actor_index)
        except RayError as exc:
            if isinstance(exc, RayActorError):
                restart(actor_index)
            else:
                idle.append(actor_index)
            fail(spec, attempt, actor_index, _short(exc))
        submit()
    # A retry still queued when the deadline passed was neither measured nor dropped silently.
    for spec, attempt, _ in queue:
        if attempt > 0:
            store.add_failure(spec.to_dict(), "its retry was queued when the deadline passed", attempt)
            failed += 1
    store.sync()
    return done, failed


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]


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


def run_collective_probes(
    pool: ActorPool,
    specs: Sequence[ProbeSpec],
    store: MeasurementStore,
    deadline: float,
    progress: ProgressFn | None = None,
    passes: int = COLLECTIVE_PASSES,
    members: Sequence[int] | None = None,
    grace_s: float = GRACE_S,
) -> tuple[int, int]:
    """Measure `specs` on a gang of every actor until done or `deadline`; returns (points
    measured, points failed).

    Collective points are visited in `passes` passes over the whole list, each timing a share
    of the point's repeats, and in `collective_batches` whose windows interleave; the store
    merges a point's passes into one row (`merge_passes`), so its windows span the sweep.
    Training points run once. A batch that fails rebuilds the gang and is retried once; a
    second failure records each of its points with the error. Progress counts batch visits.
    `members`: the pool actors that form the gang (default: all), e.g. one node's."""
    gang = Gang(pool, members)
    if len(gang.members) < 2:
        return 0, 0
    try:
        gang.form()
    except (RayError, GetTimeoutError) as exc:  # degrade: record the phase's points, let the others run
        for spec in specs:
            store.add_failure(spec.to_dict(), f"the probe gang could not form: {_short(exc)}", 1)
        progress and progress(0, len(specs))
        gang.disband(timeout_s=5.0)
        return 0, len(specs)
    done = failed = 0
    device = "cuda" if pool.device_kind == "cuda" else "cpu"
    batches = collective_batches(specs, max_bytes=collective_batch_bytes(device, pool.max_collective_bytes()))
    measured: set[int] = set()
    visit_s = 0.0  # seconds per point visit so far, to cut the last batch at the deadline
    try:
        timing = collective_pass_timing(passes)
        for visit in range(max(1, passes)):
            for index, batch in enumerate(batches):
                if time.monotonic() >= deadline:
                    break
                multi_pass = probe_for(batch[0].family).multi_pass
                if visit > 0 and (not multi_pass or index not in measured):
                    continue  # training points run once; a failed batch is not retried per pass
                fit = (deadline - time.monotonic()) / visit_s if visit_s > 0 else float("inf")
                if fit < len(batch):  # a batch is several points: run only what fits before the deadline
                    batch = batch[: max(1, int(fit))]
                plain = list(batch)  # as generated: what a resumed calibration looks up
                batch = [gang.placed(s) for s in batch]
                for attempt in (0, 1):
                    try:
                        t0 = time.monotonic()
                        # A collective batch stops by itself at the deadline (its members agree
                        # on it), measuring a prefix of its points, so nobody is killed for it.
                        settings = {**timing, "stop_at": time.time() + deadline - t0} if multi_pass else None
                        rows = gang.run(batch, settings, until=deadline + grace_s)
                        store.add(rows)
                        reached = len(rows) if multi_pass else len(batch)  # one row per measured point
                        if visit == 0:
                            store.mark_done([s.to_dict() for s in plain[:reached]])
                        if multi_pass and reached:
                            visit_s = max(visit_s, (time.monotonic() - t0) / reached)
                        if visit == 0 and reached:
                            measured.add(index)
                            done += reached
                        progress and progress(reached, 0)
                        break
                    except (RayError, GetTimeoutError) as exc:
                        why = (
                            "timed out (members killed and replaced)"
                            if isinstance(exc, GetTimeoutError)
                            else _short(exc)
                        )
                        late = time.monotonic() >= deadline
                        if late and isinstance(exc, GetTimeoutError):
                            for i in gang.members:  # stop what they still run: the next phase needs them
                                pool.replace(i)
                        if not late:
                            try:
                                gang.rebuild()  # a stuck or dead member: restart every member
                            except (RayError, GetTimeoutError) as broken:
                                why += f"; the gang could not be rebuilt: {_short(broken)}"
                                late = True
                        if attempt == 1 or late:
                            for spec in batch:
                                store.add_failure(
                                    {**spec.to_dict(), "pass": visit},
                                    why + ("; no time left for a retry" if late and attempt == 0 else ""),
                                    attempt + 1,
                                )
                            failed += len(batch) if visit == 0 else 0
                            progress and progress(0, len(batch))
                            if late:
                                return done, failed  # past the deadline (or no gang left): the phase ends
                            break
    finally:
        gang.disband()
        store.sync()
    return done, failed


def collective_visits(specs: Sequence[ProbeSpec], passes: int = COLLECTIVE_PASSES) -> int:
    """Batch-point visits `run_collective_probes` makes on `specs` when time allows (for a progress bar)."""
    points = sum(1 for s in specs if probe_for(s.family).multi_pass)
    return points * max(1, passes) + (len(specs) - points)
