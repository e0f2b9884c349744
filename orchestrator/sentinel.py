"""Model drift: a small fixed set of sentinel probe points, re-measured on schedule and scored
against the champion.

The sentinels are drawn, once per calibration, from the same generators as the calibration's
kernel sweep but with their own seed, so they are fresh points of the measured distribution
(not rows the model was fitted on): a few GEMMs, embedding lookups, element-wise ops and
copies, and on more than one device an all-reduce and an all-to-all over all of them; after
the fit, one fused-training width per fusion curve the calibration reached. Their specs are stored in the bundle's meta, so the nightly check re-measures exactly
the points chosen when the champion was made. A champion whose sentinel error has grown well
past its own held-out error no longer describes the machine: a driver, firmware or neighbour
changed something that the version check cannot see. A pass over the bound is re-measured once
before it is called drift: a spell of a neighbour's load reads as drift for one pass, not two,
and a recalibration of the cluster's devices costs far more than a second pass of sentinels.

The calibration also times its kernel and collective sentinels, in three passes after its sweep
and the way a nightly pass does (`record_baseline`), and the bundle keeps each point's median. A nightly's
pass then says how fast the machine runs them now against then (`speed`, the geomean of now
over then): the host or its neighbours can slow every lookup and copy by a tenth while no point
strays far from the model, which the GMAE bound cannot see and every prediction inherits (11-28,
#26: three hours after a calibration its embedding points ran 1.093x and its copies 1.099x their
stored times, its GEMMs 1.021x, and its DLRM steps 1.195x). With a `speed_bound`, a speed past
it either way, with most points moved the same way (noise moves them both ways), is drift as
well; without one the speed is reported only (see `DEFAULT_SENTINEL_SPEED_BOUND`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import ray
from ray.exceptions import RayError

from orchestrator.defaults import DEFAULT_SENTINEL_BOUND, DEFAULT_SENTINEL_RATIO, DEFAULT_SENTINEL_SPEED_BOUND
from orchestrator.fanout import Phase, run_collective_probes, run_local_probes
from orchestrator.home import home_path
from orchestrator.measurement_store import MeasurementStore, spec_key
from orchestrator.probe_pool import ACTOR_CALL_TIMEOUT_S, ActorPool
from orchestrator.progress import say
from predictors.evaluation import geomean
from predictors.performance_model import PerformanceModel
from probes.elementwise import elementwise_specs
from probes.embedding import embedding_specs
from probes.gemm import gemm_specs
from probes.memcpy import memcpy_specs
from probes.probe import ProbeSpec
from probes.vocabulary.ops import FUSION_OP
from probes.vocabulary.records import Measurement

SENTINEL_SEED_OFFSET = 7919  # sentinels are not the calibration's own points
SENTINEL_COUNTS = {"gemm": 4, "embedding": 3, "elementwise": 4, "memcpy": 2}
SENTINEL_COLLECTIVES = ("all_reduce", "all_to_all")
SENTINEL_COLLECTIVE_BYTES = (64 * 2**10, 2**20, 8 * 2**20)
FUSION_SENTINEL_SECONDS = 1.0  # timed seconds of a fusion sentinel
SPEED_SAME_WAY = 0.75  # share of points that must have moved the same way for a speed drift
SPEED_MIN_POINTS = 4  # common points a speed is judged on (one point always moved "the same way")
PASS_DEADLINE_S = 300.0  # a pass's wait, the calibration's baseline and a nightly's alike
QUIET_WAIT_S = 20.0  # at most, per pass, for the hosts to go quiet
BASELINE_DIRECTORY = "sentinels"  # in a calibration's directory: its sentinel points' passes
BASELINE_PASSES = 3  # a point's baseline is the median of its passes (one pass is one noise draw)
# The tests a pass can fail, each reason starting with its test's name and a colon
# (`confirmed` keeps only the tests both passes failed).
GMAE_TEST = "sentinel drift"
SPEED_TEST = "speed drift"


def fusion_sentinels(model: PerformanceModel) -> list[dict[str, Any]]:
    """One point per fusion curve of the bundle, re-measured by the nightly: the middle of the
    curve's measured widths (on the curve, not at its ends), at its batch size and optimizer.
    Chosen after the fit, since only the widths a calibration reached have a curve."""
    out = []
    for name, curve in sorted(model.fusion.items()):
        width = sorted(curve.widths)[len(curve.widths) // 2]
        params = {
            "workload": name,
            "width": int(width),
            "batch_size": curve.batch_size,
            "optimizer": curve.optimizer,
            "max_seconds": FUSION_SENTINEL_SECONDS,
        }
        out.append(ProbeSpec("fusion", params, f"sentinel-fusion:{name}:{width}").to_dict())
    return out


def sentinel_prediction(model: PerformanceModel, row: Measurement) -> tuple[str, float]:
    """What `row` is scored as (the op whose held-out error it is compared with) and the
    seconds `model` predicts for it; KeyError when the bundle has no model for it. A fused
    training step of `width` models is priced on the workload's fusion curve."""
    if row.op == FUSION_OP:
        name = str(row.params["workload"])
        return f"{FUSION_OP}/{name}", model.fusion[name].step_s(int(row.params["width"]))
    return row.op, model.predict_params(row.op, row.params)


def choose_sentinels(seed: int, device_kind: str, world: int = 1) -> list[dict[str, Any]]:
    """The sentinel specs for a calibration with `seed` on `world` devices (as plain dicts, for
    the bundle's meta): kernels, and with more than one device an all-reduce and an all-to-all
    over all of them at three sizes."""
    s = seed + SENTINEL_SEED_OFFSET
    specs = (
        gemm_specs(SENTINEL_COUNTS["gemm"], s, device_kind=device_kind)
        + embedding_specs(SENTINEL_COUNTS["embedding"], s, max_rows=100_000, max_batch=1024, device_kind=device_kind)
        + elementwise_specs(SENTINEL_COUNTS["elementwise"], s, device_kind=device_kind)
        + memcpy_specs(SENTINEL_COUNTS["memcpy"], s, device_kind, max_bytes=16 * 2**20)
    )
    if world > 1:
        ranks = list(range(world))
        specs += [
            ProbeSpec(
                "collective",
                {"op": op, "bytes": size, "ranks": ranks, "uneven": False, "seed": i},
                f"sentinel-{op}:{size}:g{world}",
            )
            for op in SENTINEL_COLLECTIVES
            for i, size in enumerate(SENTINEL_COLLECTIVE_BYTES)
        ]
    return [spec.to_dict() for spec in specs]


def row_identity(row: Measurement) -> str:
    """Which sentinel point a row measured: its op and params (the same spec measures the same
    params again: its shapes, and for lookups the features of its seeded index draw)."""
    text = json.dumps([row.op, row.params], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def baseline_times(rows: Sequence[Measurement]) -> dict[str, float]:
    """The sentinel rows a calibration measured, as the bundle keeps them: identity -> seconds,
    the median of a point's passes."""
    passes: dict[str, list[float]] = {}
    for r in rows:
        if r.median_s > 0:
            passes.setdefault(row_identity(r), []).append(r.median_s)
    return {identity: statistics.median(times) for identity, times in passes.items()}


def calibration_baseline(directory: Path) -> dict[str, float]:
    """The sentinel times a calibration in `directory` measured, over its passes (empty when it
    measured none)."""
    stores = sorted((directory / BASELINE_DIRECTORY).glob("pass*/measurements.jsonl"))
    rows = [r for path in stores for r in MeasurementStore(path.parent).rows()]
    return baseline_times(rows)


def split_points(specs: Sequence[dict[str, Any]], devices: int) -> tuple[list[ProbeSpec], list[ProbeSpec]]:
    """The collective sentinels this cluster can run (over at most `devices` ranks) and the rest."""
    points = [ProbeSpec(**s) for s in specs]
    collective = [s for s in points if s.family == "collective" and len(s.params["ranks"]) <= devices]
    return collective, [s for s in points if s.family != "collective"]


def sentinel_pool(device_kind: str, hardware_id: str, devices: int, collective: bool) -> ActorPool:
    """Probe actors for a pass: one per device when collectives run (local points spread over
    them, as in calibration), else one."""
    return ActorPool(device_kind, hardware_id, devices if collective else 1, strategy="SPREAD").start()


def measure_pass(
    pool: ActorPool, collective: list[ProbeSpec], local: list[ProbeSpec], store: MeasurementStore, deadline_s: float
) -> int:
    """One pass over the points into `store` (collectives first, within half of `deadline_s`),
    once every actor's host has gone quiet (or 20 s passed); returns how many failed."""
    refs = [actor.wait_quiet.remote(QUIET_WAIT_S) for actor in pool.actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=QUIET_WAIT_S + ACTOR_CALL_TIMEOUT_S)
    busy = {}
    for ref in ready:  # an actor that does not answer is the probes' business (fanout replaces it)
        try:
            waited = ray.get(ref)
        except RayError:
            continue
        if not waited["quiet"]:
            busy[waited["node"]] = waited
    for node, waited in busy.items():
        say(f"{node}: host still {waited['busy_share']:.0%} busy after {waited['waited_s']:.0f}s; timing anyway")
    failed = 0
    if collective:
        failed += run_collective_probes(Phase(pool, collective, store, time.monotonic() + deadline_s / 2))[1]
    if local:
        failed += run_local_probes(Phase(pool, local, store, time.monotonic() + deadline_s))[1]
    store.sync()
    return failed


def record_baseline(
    specs: Sequence[dict[str, Any]],
    device_kind: str,
    hardware_id: str,
    devices: int,
    directory: Path,
    deadline_s: float,
    passes: int = BASELINE_PASSES,
) -> int:
    """Time a calibration's kernel and collective sentinels in `passes` passes, the way a
    nightly pass will (`sentinel_pool`, `measure_pass`, each pass within `deadline_s`), into
    `directory`/sentinels/pass<k> (not the calibration's rows: they are no fit's points);
    returns how many points have a baseline. A resumed calibration measures only what is
    missing."""
    collective, local = split_points([s for s in specs if s["family"] != "fusion"], devices)
    stores = [MeasurementStore(directory / BASELINE_DIRECTORY / f"pass{k}") for k in range(passes)]
    todo = []
    for store in stores:
        done = store.done_keys()
        todo.append([[s for s in points if spec_key(s.to_dict()) not in done] for points in (collective, local)])
    if any(c or loc for c, loc in todo):
        pool = sentinel_pool(device_kind, hardware_id, devices, bool(collective))
        try:
            for store, (c, loc) in zip(stores, todo):
                if c or loc:
                    measure_pass(pool, c, loc, store, deadline_s)
        finally:
            pool.stop()
    return len(calibration_baseline(directory))


def speed_against(baseline: dict[str, float], rows: Sequence[Measurement]) -> tuple[float | None, int, float]:
    """How fast `rows` ran against the calibration's times of the same points: the geomean of
    now over then (None without a common point), how many points, and the share of them that
    moved the way the geomean did."""
    then = [(r.median_s, baseline.get(row_identity(r))) for r in rows if r.median_s > 0]
    ratios = [now / before for now, before in then if before]
    if not ratios:
        return None, 0, 0.0
    speed = geomean(ratios)
    same_way = sum((x > 1) == (speed > 1) for x in ratios) / len(ratios)
    return speed, len(ratios), same_way


@dataclass
class SentinelReport:
    gmae: float | None  # None: nothing could be scored
    expected_gmae: float | None  # the champion's held-out GMAE over the same ops, weighted by points
    bound: float
    stale: bool
    points: list[dict[str, Any]] = field(default_factory=list)  # op, measured_s, predicted_s, error
    failures: int = 0
    skipped: list[str] = field(default_factory=list)  # ops the champion has no model for
    wall_s: float = 0.0
    passes: list[float | None] = field(default_factory=list)  # each measuring pass's GMAE, in order
    # geomean of measured / predicted: which way the points moved (above 1: the machine runs
    # them slower than the champion says). The GMAE says how far, not which way; a host or
    # device slowed by its neighbours or its clocks moves every point the same way.
    ratio: float | None = None
    # geomean of time now over the calibration's own time of the same points (None: the bundle
    # keeps no times, or no point ran again); how many points; the share that moved that way
    speed: float | None = None
    speed_points: int = 0
    speed_same_way: float = 0.0
    speed_bound: float | None = DEFAULT_SENTINEL_SPEED_BOUND
    reasons: list[str] = field(default_factory=list)  # why stale, in words

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speed_drift(speed: float | None, points: int, same_way: float, bound: float | None) -> bool:
    """A machine running the sentinels more than `bound` times slower or faster than when it
    was calibrated, over `SPEED_MIN_POINTS` or more points, most of them moved that way (never
    without a bound)."""
    return (
        bound is not None
        and speed is not None
        and points >= SPEED_MIN_POINTS
        and max(speed, 1 / speed) > bound
        and same_way >= SPEED_SAME_WAY
    )


def score_sentinels(
    model: PerformanceModel,
    rows: Sequence[Measurement],
    bound: float = DEFAULT_SENTINEL_BOUND,
    ratio: float = DEFAULT_SENTINEL_RATIO,
    failures: int = 0,
    speed_bound: float | None = DEFAULT_SENTINEL_SPEED_BOUND,
) -> SentinelReport:
    """Score re-measured sentinel rows against `model`: stale when their GMAE exceeds both the
    absolute bound and `ratio` x the model's own held-out GMAE on those ops, or when they run
    more than `speed_bound` times slower or faster than the calibration timed them (`speed_drift`)."""
    speed, speed_points, same_way = speed_against(model.meta.get("sentinel_baseline") or {}, rows)
    points, skipped = [], set()
    for r in rows:
        try:
            op, predicted = sentinel_prediction(model, r)
        except KeyError:
            skipped.add(r.op)
            continue
        error = abs(predicted - r.median_s) / r.median_s
        points.append({"op": op, "measured_s": r.median_s, "predicted_s": predicted, "error": error})
    moved = speed_drift(speed, speed_points, same_way, speed_bound)
    speed_fields: dict[str, Any] = {
        "speed": speed,
        "speed_points": speed_points,
        "speed_same_way": same_way,
        "speed_bound": speed_bound,
    }
    speed_reason = (
        [
            f"{SPEED_TEST}: sentinels run {speed:.2f}x their calibration times over {speed_points} point(s) (bound {speed_bound:.2f}x either way)"
        ]
        if moved and speed is not None
        else []
    )
    if not points:
        return SentinelReport(
            None, None, bound, moved, [], failures, sorted(skipped), reasons=speed_reason, **speed_fields
        )
    gmae = geomean([p["error"] for p in points])
    ratios = [p["measured_s"] / p["predicted_s"] for p in points if p["predicted_s"] > 0 and p["measured_s"] > 0]
    measured_over_predicted = geomean(ratios) if ratios else None
    held = [model.metrics.get(p["op"], {}).get("gmae") for p in points]
    held = [h for h in held if h is not None and h > 0]
    expected = geomean(held) if held else None
    limit = max(bound, ratio * expected) if expected is not None else bound
    reasons = ([f"{GMAE_TEST}: GMAE {gmae:.1%} > {limit:.1%}"] if gmae > limit else []) + speed_reason
    return SentinelReport(
        gmae,
        expected,
        limit,
        bool(reasons),
        points,
        failures,
        sorted(skipped),
        passes=[gmae],
        ratio=measured_over_predicted,
        reasons=reasons,
        **speed_fields,
    )


def failed_test(reason: str) -> str:
    """Which test (`GMAE_TEST`, `SPEED_TEST`) a report's reason says failed."""
    return reason.split(":", 1)[0]


def confirmed(first: SentinelReport, second: SentinelReport) -> SentinelReport:
    """The verdict of a stale pass `first` and its re-measurement `second`: the second pass's
    figures, stale only for a test (GMAE, speed) both passes failed, with both passes' GMAE and
    failures kept."""
    failed_first = {failed_test(reason) for reason in first.reasons}
    kept = [reason for reason in second.reasons if failed_test(reason) in failed_first]
    return SentinelReport(
        second.gmae,
        second.expected_gmae,
        second.bound,
        bool(kept),
        second.points,
        first.failures + second.failures,
        sorted(set(first.skipped) | set(second.skipped)),
        passes=first.passes + second.passes,
        ratio=second.ratio,
        speed=second.speed,
        speed_points=second.speed_points,
        speed_same_way=second.speed_same_way,
        speed_bound=second.speed_bound,
        reasons=kept,
    )


def run_sentinels(
    model: PerformanceModel,
    device_kind: str,
    hardware_id: str,
    devices: int = 1,
    deadline_s: float = PASS_DEADLINE_S,
    bound: float = DEFAULT_SENTINEL_BOUND,
    ratio: float = DEFAULT_SENTINEL_RATIO,
    speed_bound: float | None = DEFAULT_SENTINEL_SPEED_BOUND,
) -> SentinelReport:
    """Re-measure the champion's sentinels on this hardware's devices (probe actors on the
    nodes that have them, as in calibration, not the driver) and score them; a pass over the
    bound is measured once more, and only two stale passes make the report stale. Measurements
    are stored before scoring; collective sentinels over more ranks than the cluster has now
    are left out. Each pass waits at most `deadline_s` (its collectives half of it), so a
    confirmed drift can take twice `deadline_s`."""
    collective, local = split_points(model.sentinels or choose_sentinels(0, device_kind, devices), devices)
    t0 = time.monotonic()
    folder = home_path("sentinels") / f"{time.strftime('%Y%m%d-%H%M%S')}-{hardware_id}"
    pool = sentinel_pool(device_kind, hardware_id, devices, bool(collective))
    try:

        def measure(store: MeasurementStore) -> SentinelReport:
            failed = measure_pass(pool, collective, local, store, deadline_s)
            return score_sentinels(model, store.rows(), bound, ratio, failures=failed, speed_bound=speed_bound)

        report = measure(MeasurementStore(folder))
        if report.stale:
            say(f"{hardware_id}: {'; '.join(report.reasons)}; re-measuring once to confirm")
            report = confirmed(report, measure(MeasurementStore(folder.with_name(folder.name + "-confirm"))))
    finally:
        pool.stop()
    report.wall_s = time.monotonic() - t0
    return report
