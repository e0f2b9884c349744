"""A drill: make this machine's probes read N times slower (AUTOTUNE_DRILL_SLOWDOWN=N), so drift
detection, recalibration and promotion can be exercised end to end without new hardware.
Every probe actor applies it to what it measures."""

from __future__ import annotations

import os

from probes.vocabulary.records import Measurement

DRILL_ENV = "AUTOTUNE_DRILL_SLOWDOWN"


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


def apply_drill(rows: list[Measurement], factor: float) -> list[Measurement]:
    """Rows as a machine `factor` times slower would have measured them: medians, spreads and
    a collective point's window medians (a multi-pass point is re-estimated from those)."""
    if factor != 1.0:
        for r in rows:
            r.median_s *= factor
            r.spread_s *= factor
            if "window_medians" in r.extra:
                r.extra["window_medians"] = [w * factor for w in r.extra["window_medians"]]
    return rows
