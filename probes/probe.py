"""What a probe is to the sweep and the fan-out: `ProbeSpec` (one point to measure) and the
`Probe` protocol that every probe family implements.

A probe family is one file: its measurement, the generator(s) of its sweep points
(`<family>_specs`, with the arguments that family needs) and an object satisfying `Probe`,
registered in `probes.registry.PROBES`. Nothing dispatches on the family string itself: the
sweep (`probes.sweep`) and the fan-out (`orchestrator.fanout`) look the probe up.

Torch-free: the generators and the fan-out's bookkeeping need only this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol, Sequence

import numpy as np

from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement

if TYPE_CHECKING:
    from probes.timing import Timing


@dataclass(frozen=True)
class ProbeSpec:
    """One point of a sweep. Its serialized form (`to_dict`) is what stored measurements and a
    resumed calibration match on: keep it {"family", "params", "key"}."""

    family: str
    params: dict[str, Any] = field(hash=False)
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "params": self.params, "key": self.key}


class Probe(Protocol):
    """A probe family, as the sweep and the fan-out use it."""

    family: str  # the `ProbeSpec.family` of its points
    gang: bool  # False: one device measures a point alone; True: every member of a process group runs its batches
    # Its points are visited in every pass of a gang sweep, each visit timing a share of the
    # repeats; its `run` honours `timing["stop_at"]` (epoch seconds) and returns one row per
    # measured point, a prefix of the batch in order.
    multi_pass: bool

    def batch_key(self, spec: ProbeSpec) -> Hashable | None:
        """Consecutive points with the same key (not None) may run as one batch; None: a
        batch of its own."""
        ...

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        """The point with where its ranks ran (`placement`: the node of every gang rank), as
        its rows record it; a local probe's point unchanged."""
        ...

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        """Measure a batch of its points (a local probe: one point) on `device`; a gang probe is
        called by every member of the process group. `timing`: settings of one pass."""
        ...


@dataclass(frozen=True)
class LocalProbe:
    """A probe whose points one device measures alone, one at a time: `measure(params, device)`
    gives a point's rows."""

    family: str
    measure: Callable[[dict[str, Any], str], list[Measurement]]
    gang: bool = False
    multi_pass: bool = False

    def batch_key(self, spec: ProbeSpec) -> Hashable | None:
        return None

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        return spec

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        return [row for spec in specs for row in self.measure(spec.params, device)]


@dataclass(frozen=True)
class SoloGangProbe:
    """A gang probe whose points run alone and once: each point is a batch of its own, not
    visited again in later passes (a training step, an overlapped pair). Subclasses name their
    family and say how a point is placed and run."""

    family: str
    gang: bool = True
    multi_pass: bool = False

    def batch_key(self, spec: ProbeSpec) -> Hashable | None:
        return None


def log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer drawn log-uniformly from [lo, hi] (the sweep generators' size distribution)."""
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def timed_measurement(op: str, params: dict[str, Any], t: Timing, device: object, family: str) -> Measurement:
    """A local probe's row: `op` at `params`, timed by `time_callable` on `device`."""
    return Measurement(op, params, t.median_s, t.spread_s, t.repeats, device=str(device), family=family)
