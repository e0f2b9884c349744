"""Run a calibration phase's probe points on the pool's actors (`orchestrator.probe_pool`).

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

from orchestrator.measurement_store import MeasurementStore
from orchestrator.probe_pool import ACTOR_CALL_TIMEOUT_S, ActorPool, Gang
from probes.collective_sweep import COLLECTIVE_PASSES, collective_batch_bytes, collective_pass_timing
from probes.probe import ProbeSpec
from probes.registry import probe_for
from probes.sweep import collective_batches

ProgressFn = Callable[[int, int], None]  # (done, failed) increments


GRACE_S = 20.0  # how far past its deadline a phase may run: a probe started just before it finishes
PROBE_TIMEOUT_S = 120.0  # no single local probe point takes this long (time_callable caps its repeats)


@dataclass
class Phase:
    """One phase of a calibration: its points, the pool that measures them, the store their
    rows and failures go to as they arrive, and until when (monotonic `deadline`, which a probe
    started just before it may overrun by `grace_s`)."""

    pool: ActorPool
    specs: Sequence[ProbeSpec]
    store: MeasurementStore
    deadline: float
    progress: ProgressFn | None = None
    grace_s: float = GRACE_S


def run_local_probes(phase: Phase, probe_timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, int]:
    """Measure the phase's points until done or its deadline; returns (points measured,
    points failed).

    Every wait is bounded: a probe still running `probe_timeout_s` after it started, or at
    `deadline + grace_s`, is cancelled (its actor killed and replaced: a hung or stopped process
    answers no cancel) and retried once on another actor while time remains, else recorded as
    failed with the reason; a retry the deadline leaves no time for is recorded too."""
    pool, specs, store, deadline, progress, grace_s = (
        phase.pool,
        phase.specs,
        phase.store,
        phase.deadline,
        phase.progress,
        phase.grace_s,
    )
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


def run_collective_probes(
    phase: Phase, passes: int = COLLECTIVE_PASSES, members: Sequence[int] | None = None
) -> tuple[int, int]:
    """Measure the phase's points on a gang of every actor until done or its deadline; returns
    (points measured, points failed).

    Collective points are visited in `passes` passes over the whole list, each timing a share
    of the point's repeats, and in `collective_batches` whose windows interleave; the store
    merges a point's passes into one row (`merge_passes`), so its windows span the sweep.
    Training points run once. A batch that fails rebuilds the gang and is retried once; a
    second failure records each of its points with the error. Progress counts batch visits.
    `members`: the pool actors that form the gang (default: all), e.g. one node's."""
    specs, store, progress = phase.specs, phase.store, phase.progress
    gang = Gang(phase.pool, members)
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
    sweep = _GangSweep(phase, gang, collective_pass_timing(passes))
    try:
        sweep.run(passes)
    finally:
        gang.disband()
        store.sync()
    return sweep.done, sweep.failed


@dataclass
class _GangSweep:
    """One gang phase under way: what it measured so far, and how long a point's visit takes
    (to cut the last batch at the deadline)."""

    phase: Phase
    gang: Gang
    timing: dict
    done: int = 0
    failed: int = 0
    # batch index -> points of it the first pass measured (a batch cut at the deadline: a prefix)
    measured: dict[int, int] = field(default_factory=dict)
    visit_s: float = 0.0

    def run(self, passes: int) -> None:
        pool = self.phase.pool
        device = "cuda" if pool.device_kind == "cuda" else "cpu"
        batches = collective_batches(
            self.phase.specs, max_bytes=collective_batch_bytes(device, pool.max_collective_bytes())
        )
        for visit in range(max(1, passes)):
            for index, batch in enumerate(batches):
                if time.monotonic() >= self.phase.deadline:
                    break
                multi_pass = probe_for(batch[0].family).multi_pass
                if visit > 0 and (not multi_pass or index not in self.measured):
                    continue  # training points run once; a failed batch is not retried per pass
                if visit > 0:
                    batch = batch[: self.measured[index]]  # later passes revisit what the first measured
                if not self._visit(visit, index, self._fitting(batch), multi_pass):
                    return  # past the deadline (or no gang left): the phase ends

    def _fitting(self, batch: list[ProbeSpec]) -> list[ProbeSpec]:
        """A batch is several points: only what fits before the deadline."""
        fit = (self.phase.deadline - time.monotonic()) / self.visit_s if self.visit_s > 0 else float("inf")
        return batch[: max(1, int(fit))] if fit < len(batch) else batch

    def _visit(self, visit: int, index: int, plain: list[ProbeSpec], multi_pass: bool) -> bool:
        """Measure one batch, retried once on a rebuilt gang; False when the phase must end.
        `plain`: its points as generated (what a resumed calibration looks up)."""
        batch = [self.gang.placed(s) for s in plain]
        for attempt in (0, 1):
            try:
                self._measure(visit, index, plain, batch, multi_pass)
                return True
            except (RayError, GetTimeoutError) as exc:
                why, late = self._recover(exc)
                if attempt == 1 or late:
                    for spec in batch:
                        self.phase.store.add_failure(
                            {**spec.to_dict(), "pass": visit},
                            why + ("; no time left for a retry" if late and attempt == 0 else ""),
                            attempt + 1,
                        )
                    self.failed += len(batch) if visit == 0 else 0
                    self.phase.progress and self.phase.progress(0, len(batch))
                    return not late
        return True

    def _measure(
        self, visit: int, index: int, plain: list[ProbeSpec], batch: list[ProbeSpec], multi_pass: bool
    ) -> None:
        phase = self.phase
        t0 = time.monotonic()
        # A collective batch stops by itself at the deadline (its members agree on it),
        # measuring a prefix of its points, so nobody is killed for it.
        settings = {**self.timing, "stop_at": time.time() + phase.deadline - t0} if multi_pass else None
        rows = self.gang.run(batch, settings, until=phase.deadline + phase.grace_s)
        phase.store.add(rows)
        reached = len(rows) if multi_pass else len(batch)  # one row per measured point
        if visit == 0:
            phase.store.mark_done([s.to_dict() for s in plain[:reached]])
        if multi_pass and reached:
            self.visit_s = max(self.visit_s, (time.monotonic() - t0) / reached)
        if visit == 0 and reached:
            self.measured[index] = reached
            self.done += reached
        phase.progress and phase.progress(reached, 0)

    def _recover(self, exc: BaseException) -> tuple[str, bool]:
        """After a failed batch: why it failed, and whether the phase is over (past its
        deadline, or the gang could not be rebuilt)."""
        timed_out = isinstance(exc, GetTimeoutError)
        why = "timed out (members killed and replaced)" if timed_out else _short(exc)
        late = time.monotonic() >= self.phase.deadline
        if late and timed_out:
            for i in self.gang.members:  # stop what they still run: the next phase needs them
                self.phase.pool.replace(i)
        if not late:
            try:
                self.gang.rebuild()  # a stuck or dead member: restart every member
            except (RayError, GetTimeoutError) as broken:
                why += f"; the gang could not be rebuilt: {_short(broken)}"
                late = True
        return why, late


def collective_visits(specs: Sequence[ProbeSpec], passes: int = COLLECTIVE_PASSES) -> int:
    """Batch-point visits `run_collective_probes` makes on `specs` when time allows (for a progress bar)."""
    points = sum(1 for s in specs if probe_for(s.family).multi_pass)
    return points * max(1, passes) + (len(specs) - points)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]
