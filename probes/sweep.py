"""Sweeps: the points a job will be predicted at, interleaving point lists so a sweep cut short
still spans every family, batching a gang's points, and running a point or a batch through its
probe (`probes.registry`).

Each family's own points are generated in its probe's file (`gemm_specs` in `probes.gemm`,
`collective_specs` in `probes.collective_sweep`, `training_specs` in `probes.training`, ...):
local points (GEMM, embedding) shuffled by seed, collective sizes visited in bit-reversed order
of their exponent, so a sweep cut short still spans the whole range. Points derived from a job
(its MLP layers, its tables grouped as the sharders would group them) come first: they are
where the predictor will be asked.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from probes.probe import ProbeSpec
from probes.registry import PROBES, probe_for
from probes.vocabulary.ops import PRODUCTS, linear_layer_gemms
from probes.vocabulary.records import Measurement


def run_local_probe(spec: ProbeSpec, device: str = "cpu") -> list[Measurement]:
    """Run one point of a local probe (GEMM, embedding, element-wise, copy) on `device` (in the
    point's dtype / weights precision; float32 where it names none)."""
    probe = probe_for(spec.family)
    if probe.gang:
        local = [family for family, p in PROBES.items() if not p.gang]
        raise ValueError(f"{spec.family!r} is not a local probe family; expected one of {local}")
    return probe.run([spec], device)


def run_collective_batch(
    specs: Sequence[ProbeSpec], device: str = "cpu", timing: dict | None = None
) -> list[Measurement]:
    """Run a batch from `collective_batches` (collective points on one group, their windows
    interleaved, timed with `timing` (see `collective_pass_timing`), or a single training or
    pair point); every member of the process group must call it."""
    if not specs:
        return []
    probe = probe_for(specs[0].family)
    keys = {probe.batch_key(s) for s in specs}
    if not probe.gang or any(s.family != specs[0].family for s in specs) or (len(specs) > 1 and None in keys):
        raise ValueError(f"a gang batch holds points of one gang probe that batches; got {[s.family for s in specs]}")
    return probe.run(specs, device, timing)


def collective_batches(
    specs: Sequence[ProbeSpec], max_points: int = 12, max_bytes: int = 2**30
) -> list[list[ProbeSpec]]:
    """Split a gang's spec list, in order, into batches run with interleaved windows:
    consecutive points of the same batch key (collective points on the same ranks), at most
    `max_points` of them and about `max_bytes` of buffers (input plus output, twice the
    message) alive at once; any other spec (a training point) is a batch of its own."""
    batches: list[list[ProbeSpec]] = []
    last_key = None
    held = 0
    for spec in specs:
        footprint = 2 * int(spec.params.get("bytes", 0))
        key = probe_for(spec.family).batch_key(spec)
        last = batches[-1] if batches else None
        if key is not None and last and key == last_key and len(last) < max_points and held + footprint <= max_bytes:
            last.append(spec)
            held += footprint
        else:
            batches.append([spec])
            held = footprint
        last_key = key
    return batches


def job_specs(job, table_groups: Iterable[Sequence[int]] = ()) -> list[ProbeSpec]:
    """The points a DLRM job will be predicted at: its MLP GEMMs and its per-rank table sets."""

    out: list[ProbeSpec] = []
    B, W = job.batch_size, job.world_size
    seen = set()
    for fan_in, fan_out in job.dense_layers():
        for product, (m, n, k) in zip(PRODUCTS, linear_layer_gemms(B, fan_in, fan_out)):
            if (m, n, k) not in seen:
                seen.add((m, n, k))
                params = {"M": m, "N": n, "K": k, "dtype": "float32", "product": product}
                out.append(ProbeSpec("gemm", params, f"job-gemm-{product}:{m}x{n}x{k}"))
    groups = {tuple(sorted(g)) for g in table_groups if g}
    for i, group in enumerate(sorted(groups)):
        tables = [
            [
                job.tables[t].num_embeddings,
                job.tables[t].embedding_dim,
                job.tables[t].pooling_factor,
                job.tables[t].distribution.to_json(),
            ]
            for t in group
        ]
        out.append(ProbeSpec("embedding", {"tables": tables, "B": B * W, "seed": job.seed}, f"job-emb:{group}"))
    return out


def interleave(*lists: Sequence[ProbeSpec], per_turn: Sequence[int] | None = None) -> list[ProbeSpec]:
    """The lists' points in turn, `per_turn[i]` of list i at a time (default one each); a list
    that runs out drops from the turns. A budget cut anywhere leaves every list its share."""
    counts = list(per_turn) if per_turn is not None else [1] * len(lists)
    if len(counts) != len(lists) or any(c < 1 for c in counts):
        raise ValueError(f"per_turn must give a count >= 1 for each of the {len(lists)} lists, got {counts}")
    chunks = [[lst[i : i + c] for i in range(0, len(lst), c)] for lst, c in zip(lists, counts)]
    return [s for group in itertools.zip_longest(*chunks, fillvalue=[]) for chunk in group for s in chunk]
