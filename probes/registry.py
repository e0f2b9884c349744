"""Every probe family, by `ProbeSpec.family`: what the sweep (`probes.sweep`) and the fan-out
(`orchestrator.fanout`) look a point's probe up in. Adding a probe: its file (measurement,
point generator, an object satisfying `probes.probe.Probe`) and one line here."""

from __future__ import annotations

from probes import collective_sweep, elementwise, embedding, fusion, gemm, memcpy, nccl_choice, overlap, training
from probes.probe import Probe

PROBES: dict[str, Probe] = {
    probe.family: probe
    for probe in (
        gemm.PROBE,
        embedding.PROBE,
        elementwise.PROBE,
        memcpy.PROBE,
        collective_sweep.PROBE,
        nccl_choice.PROBE,
        training.PROBE,
        overlap.PROBE,
        fusion.PROBE,
    )
}


def probe_for(family: str) -> Probe:
    """The probe of a point's family."""
    try:
        return PROBES[family]
    except KeyError:
        raise ValueError(f"unknown probe family {family!r}; expected one of {sorted(PROBES)}") from None
