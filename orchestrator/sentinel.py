"""Model drift: a small fixed set of sentinel probe points, re-measured on schedule and scored
against the champion.

The sentinels are drawn, once per calibration, from the same generators as the calibration's
kernel sweep but with their own seed, so they are fresh points of the measured distribution
(not rows the model was fitted on): a few GEMMs, embedding lookups, element-wise ops and
copies. Their specs are stored in the bundle's meta, so the nightly check re-measures exactly
the points chosen when the champion was made. A champion whose sentinel error has grown well
past its own held-out error no longer describes the machine: a driver, firmware or neighbour
changed something that the version check cannot see.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from orchestrator.fanout import ActorPool, run_local_probes
from orchestrator.measurement_store import MeasurementStore
from predictors.performance_model import PerformanceModel
from probes.records import Measurement
from probes.sweep import ProbeSpec, elementwise_specs, embedding_specs, gemm_specs, memcpy_specs

SENTINEL_SEED_OFFSET = 7919  # sentinels are not the calibration's own points
SENTINEL_COUNTS = {"gemm": 4, "embedding": 3, "elementwise": 4, "memcpy": 2}
DEFAULT_BOUND = 0.35  # sentinel GMAE that marks a champion stale, at least ...
DEFAULT_RATIO = 2.0  # ... or this many times the champion's own held-out GMAE on the same ops
STORE_ROOT = Path(".autotune/sentinels")
DRILL_ENV = "AUTOTUNE_DRILL_SLOWDOWN"  # a drill: every probe on this machine reads this much slower


def choose_sentinels(seed: int, device_kind: str) -> list[dict[str, Any]]:
    """The sentinel specs for a calibration with `seed` (as plain dicts, for the bundle's meta)."""
    s = seed + SENTINEL_SEED_OFFSET
    specs = (gemm_specs(SENTINEL_COUNTS["gemm"], s, device_kind=device_kind)
             + embedding_specs(SENTINEL_COUNTS["embedding"], s, max_rows=100_000, max_batch=1024)
             + elementwise_specs(SENTINEL_COUNTS["elementwise"], s)
             + memcpy_specs(SENTINEL_COUNTS["memcpy"], s, device_kind, max_bytes=16 * 2**20))
    return [spec.to_dict() for spec in specs]


def drill_slowdown() -> float:
    """The drill factor from the environment (1.0 when unset); refuses nonsense loudly."""
    raw = os.environ.get(DRILL_ENV)
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{DRILL_ENV}={raw!r}: expected a number > 0") from None
    if not factor > 0:
        raise ValueError(f"{DRILL_ENV}={raw!r}: expected a number > 0")
    return factor


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_sentinels(model: PerformanceModel, rows: Sequence[Measurement], bound: float = DEFAULT_BOUND,
                    ratio: float = DEFAULT_RATIO, failures: int = 0) -> SentinelReport:
    """Score re-measured sentinel rows against `model`: stale when their GMAE exceeds both the
    absolute bound and `ratio` x the model's own held-out GMAE on those ops."""
    points, skipped, logs = [], set(), []
    for r in rows:
        try:
            predicted = model.predict_params(r.op, r.params)
        except KeyError:
            skipped.add(r.op)
            continue
        error = abs(predicted - r.median_s) / r.median_s
        points.append({"op": r.op, "measured_s": r.median_s, "predicted_s": predicted, "error": error})
        logs.append(math.log(max(error, 1e-6)))
    if not points:
        return SentinelReport(None, None, bound, False, [], failures, sorted(skipped))
    gmae = math.exp(sum(logs) / len(logs))
    held = [model.metrics.get(p["op"], {}).get("gmae") for p in points]
    held = [h for h in held if h is not None and h > 0]
    expected = math.exp(sum(math.log(h) for h in held) / len(held)) if held else None
    limit = max(bound, ratio * expected) if expected is not None else bound
    return SentinelReport(gmae, expected, limit, gmae > limit, points, failures, sorted(skipped))


def run_sentinels(model: PerformanceModel, device_kind: str, hardware_id: str, deadline_s: float = 300.0,
                  bound: float = DEFAULT_BOUND, ratio: float = DEFAULT_RATIO) -> SentinelReport:
    """Re-measure the champion's sentinels on one device of this hardware (a probe actor on a
    node that has it, not the driver) and score them. Measurements are stored before scoring."""
    specs = model.meta.get("sentinels") or choose_sentinels(0, device_kind)
    t0 = time.monotonic()
    store = MeasurementStore(STORE_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{hardware_id}")
    pool = ActorPool(device_kind, hardware_id, 1).start()
    try:
        _, failed = run_local_probes(pool, [ProbeSpec(**s) for s in specs], store, time.monotonic() + deadline_s)
    finally:
        pool.stop()
    report = score_sentinels(model, store.rows(), bound, ratio, failures=failed)
    report.wall_s = time.monotonic() - t0
    return report
