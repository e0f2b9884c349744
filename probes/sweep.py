"""Sweep generation: which probe points to measure, in an order that survives a short budget.

Local points (GEMM, embedding) are interleaved across families and shuffled by seed, so a
sweep cut short still spans every family and the whole range; collective sizes are visited in
bit-reversed order of their exponent for the same reason. Points derived from a job (its MLP
layers, its tables grouped as the sharders would group them) come first: they are where the
predictor will be asked.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from probes.vocabulary.ops import COLLECTIVE_OPS
from probes.collective import (
    MAX_REPEATS,
    MIN_REPEATS,
    TARGET_S,
    CollectivePoint,
    measure_collectives,
    message_numel,
)
from probes.vocabulary.ops import ELEMENTWISE_OPS
from probes.elementwise import measure_elementwise
from probes.vocabulary.jobspec import TableShape
from probes.embedding import measure_tbe
from probes.vocabulary.ops import PRODUCTS, linear_layer_gemms
from probes.gemm import measure_gemm
from probes.vocabulary.indices import Distribution
from probes.vocabulary.ops import memcpy_directions
from probes.memcpy import measure_memcpy
from probes.vocabulary.in_context import in_context_rows
from probes.overheads import profile_overheads
from probes.workloads.dlrm import cycling_step
from probes.trace_capture import capture_step_trace
from probes.vocabulary.pairs import PairPoint
from probes.vocabulary.records import Measurement
from probes.vocabulary.table_shards import split_kinds
from probes.workloads.random_dlrm import random_dlrm_job

LOCAL_FAMILIES = ("gemm", "embedding", "elementwise", "memcpy")


@dataclass(frozen=True)
class ProbeSpec:
    family: str
    params: dict[str, Any] = field(hash=False)
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "params": self.params, "key": self.key}


def run_local_probe(spec: ProbeSpec, device: str = "cpu") -> list[Measurement]:
    """Run one GEMM, embedding, element-wise or copy probe point on `device` (in the point's
    dtype / weights precision; float32 where it names none)."""
    p = spec.params
    if spec.family == "gemm":
        return [measure_gemm(p["M"], p["N"], p["K"], p.get("dtype", "float32"), device=device,
                             variant=p.get("variant", "mm"), batch=p.get("batch", 1), product=p.get("product"))]
    if spec.family == "embedding":
        tables = [TableShape(e, d, l, Distribution.parse(dist)) for e, d, l, dist in p["tables"]]
        return measure_tbe(tables, p["B"], device=device, seed=p.get("seed", 0),
                           weights_precision=p.get("weights_precision", "fp32"))
    if spec.family == "elementwise":
        return [measure_elementwise(p["op"], p["rows"], p["cols"], device=device, dtype=p.get("dtype", "float32"))]
    if spec.family == "memcpy":
        return [measure_memcpy(p["direction"], p["bytes"], device=device)]
    raise ValueError(f"{spec.family!r} is not a local probe family; expected one of {LOCAL_FAMILIES}")


def _collective_point(spec: ProbeSpec) -> CollectivePoint:
    p = spec.params
    ranks = tuple(p["ranks"]) if p.get("ranks") is not None else None
    return CollectivePoint(p["op"], int(p["bytes"]), p.get("scope", "intra"), ranks, bool(p.get("uneven", False)),
                           int(p.get("seed", 0)))


COLLECTIVE_PASSES = 3  # visits of a collective sweep; see `merge_passes`


def collective_pass_timing(passes: int) -> dict[str, Any]:
    """`measure_collectives` settings for one of `passes` passes over a collective sweep: the
    single-pass budget per point (about 0.2 s in 5 windows) shared out over the passes."""
    if passes <= 1:
        return {}
    return {"target_s": TARGET_S / passes, "windows": 2, "min_repeats": max(4, MIN_REPEATS // passes),
            "max_repeats": max(4, MAX_REPEATS // passes), "warmup": 1}


def run_collective_batch(specs: Sequence[ProbeSpec], device: str = "cpu",
                         timing: dict[str, Any] | None = None) -> list[Measurement]:
    """Run a batch from `collective_batches` (collective points on one group, their windows
    interleaved, timed with `timing` (see `collective_pass_timing`), or a single training
    point); every member of the process group must call it."""
    if len(specs) == 1 and specs[0].family == "training":
        return run_training_probe(specs[0], device)
    if len(specs) == 1 and specs[0].family == "overlap":
        import torch.distributed as dist

        from probes.collective import group_for
        from probes.vocabulary.pairs import PairPoint
        from probes.overlap import measure_pair

        point = PairPoint(**specs[0].params)
        group = group_for(list(range(point.world)))  # every member of the gang takes part in this
        return measure_pair(point, group=group, transfer=True, device=device) if dist.get_rank() < point.world else []
    if any(s.family != "collective" for s in specs):
        raise ValueError(f"a collective batch holds collective points only; got {[s.family for s in specs]}")
    return measure_collectives([_collective_point(s) for s in specs], device=device, **(timing or {}))


def collective_batches(specs: Sequence[ProbeSpec], max_points: int = 12,
                       max_bytes: int = 2**30) -> list[list[ProbeSpec]]:
    """Split a gang's spec list, in order, into batches run with interleaved windows:
    consecutive collective points on the same ranks, at most `max_points` of them and about
    `max_bytes` of buffers (input plus output, twice the message) alive at once; any other
    spec (a training point) is a batch of its own."""
    batches: list[list[ProbeSpec]] = []
    held = 0
    for spec in specs:
        footprint = 2 * int(spec.params.get("bytes", 0))
        last = batches[-1] if batches else None
        if (spec.family == "collective" and last and last[0].family == "collective" and len(last) < max_points
                and last[0].params.get("ranks") == spec.params.get("ranks") and held + footprint <= max_bytes):
            last.append(spec)
            held += footprint
        else:
            batches.append([spec])
            held = footprint
    return batches


def collective_batch_bytes(device: str, max_message_bytes: int | None = None) -> int:
    """Buffer bytes a batch may hold at once: on a GPU twice the largest message (half the
    free memory, see `default_max_collective_bytes`), on CPU 1 GiB."""
    if device.startswith("cuda"):
        return 2 * (max_message_bytes or default_max_collective_bytes(device))
    return 2**30


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


# Share of GEMM points per variant, and per dtype on each device kind. Reduced-precision
# products on a CPU without bf16/fp16 units are emulated (~50x below fp32): sampled more
# rarely and capped in flops so one point stays under a second.
_VARIANT_SHARE = {"mm": 0.55, "addmm": 0.15, "bmm": 0.15, "baddbmm": 0.15}
_DTYPE_SHARE = {"cpu": {"float32": 0.85, "bfloat16": 0.15},
                "cuda": {"float32": 0.4, "bfloat16": 0.3, "float16": 0.3}}
_MAX_FLOPS = {"cpu": {"float32": 2.0 * 2048**3, "bfloat16": 2.0 * 256**3},
              "cuda": {"float32": 2.0 * 8192**3, "bfloat16": 2.0 * 8192**3, "float16": 2.0 * 8192**3}}


def gemm_specs(n: int, seed: int, max_dim: int = 2048, device_kind: str = "cpu") -> list[ProbeSpec]:
    """M, N, K (and the batch of bmm/baddbmm) log-uniform; variant and dtype drawn by share;
    a shape over the dtype's flop cap is drawn again."""
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed)
    variants, v_p = zip(*_VARIANT_SHARE.items())
    dtypes, d_p = zip(*_DTYPE_SHARE[kind].items())
    out = []
    for i in range(n):
        variant = str(rng.choice(variants, p=v_p))
        dtype = str(rng.choice(dtypes, p=d_p))
        while True:
            m, nn, k = (_log_uniform(rng, 8, max_dim) for _ in range(3))
            batch = _log_uniform(rng, 2, 64) if variant in ("bmm", "baddbmm") else 1
            if 2.0 * batch * m * nn * k <= _MAX_FLOPS[kind][dtype]:
                break
        params = {"M": m, "N": nn, "K": k, "dtype": dtype, "variant": variant, "batch": batch}
        out.append(ProbeSpec("gemm", params, f"{variant}:{batch}x{m}x{nn}x{k}:{dtype}"))
    return out


# Share of element-wise points per activation dtype on each device kind. Every op runs in
# bfloat16 and float16 on CPU too (torch 2.13; at 0.3-2x the float32 time, memory-bound either
# way), but CPUs train in bfloat16 if in reduced precision at all: float16 is sampled rarely.
_ELEMENTWISE_DTYPE_SHARE = {"cpu": {"float32": 0.7, "bfloat16": 0.2, "float16": 0.1},
                            "cuda": {"float32": 0.4, "bfloat16": 0.4, "float16": 0.2}}
# The first passes over the ops are float32, so a sweep cut short has every op's float32
# model (what it had before reduced precision was probed) instead of a few points per dtype.
_FLOAT32_PASSES = 3


def elementwise_specs(n: int, seed: int, max_numel: int = 4 * 2**20, device_kind: str = "cpu") -> list[ProbeSpec]:
    """Each element-wise / normalisation op over log-uniform (rows, cols), ops in turn; the
    dtype drawn by the device kind's share (its own random stream: the shapes are those the
    sweep always drew), after `_FLOAT32_PASSES` float32 passes over the ops."""
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed + 3)
    dtype_rng = np.random.default_rng([seed, 3, 16])
    dtypes, d_p = zip(*_ELEMENTWISE_DTYPE_SHARE[kind].items())
    out = []
    for i in range(n):
        op = ELEMENTWISE_OPS[i % len(ELEMENTWISE_OPS)]
        cols = _log_uniform(rng, 16, 4096)
        rows = max(1, min(_log_uniform(rng, 1, 8192), max_numel // cols))
        dtype = str(dtype_rng.choice(dtypes, p=d_p))
        if i < _FLOAT32_PASSES * len(ELEMENTWISE_OPS):
            dtype = "float32"
        out.append(ProbeSpec("elementwise", {"op": op, "rows": rows, "cols": cols, "dtype": dtype},
                             f"{op}:{rows}x{cols}:{dtype}"))
    return out


def memcpy_specs(n: int, seed: int, device_kind: str = "cpu", max_bytes: int = 256 * 2**20) -> list[ProbeSpec]:
    """Copy sizes log-uniform from 4 B to `max_bytes`, directions in turn."""
    rng = np.random.default_rng(seed + 4)
    directions = memcpy_directions(device_kind)
    out = []
    for i in range(n):
        direction = directions[i % len(directions)]
        nbytes = _log_uniform(rng, 4, max_bytes) // 4 * 4 or 4
        out.append(ProbeSpec("memcpy", {"direction": direction, "bytes": nbytes}, f"memcpy-{direction}:{nbytes}"))
    return out


def _distributions() -> list[Any]:
    """Uniform, three Zipf exponents, and every table of the shipped reuse-factor profile."""
    from probes.vocabulary.reuse_profile import load_profile

    return ["uniform", {"zipf": 0.8}, {"zipf": 1.05}, {"zipf": 1.2}] + [{"profile": n} for n in load_profile().names]


# Share of embedding points per TBE weights precision on each device kind: fbgemm_gpu's CPU
# kernels (fbgemm_gpu-cpu 1.8.0) take fp16 weights (fp32 pooled output, backward ~3x fp32's)
# but not bf16; its CUDA kernels take both.
_TBE_PRECISION_SHARE = {"cpu": {"fp32": 0.8, "fp16": 0.2},
                        "cuda": {"fp32": 0.5, "fp16": 0.3, "bf16": 0.2}}
_FLOAT32_TABLE_SETS = 32  # the first table sets are fp32 (as long as the element-wise float32 passes)


def embedding_specs(
    n: int, seed: int, max_rows: int = 500_000, max_batch: int = 4096, max_table_bytes: int = 256 * 2**20,
    device_kind: str = "cpu",
) -> list[ProbeSpec]:
    """Random table sets: T tables each with its own rows, dim, pooling and distribution; the
    weights precision drawn by the device kind's share (its own random stream, so the sets are
    those the sweep always drew), after `_FLOAT32_TABLE_SETS` fp32 sets.

    A set whose weights exceed `max_table_bytes` (at 4 bytes an element, whatever the precision)
    is drawn again, so probes stay inside memory.
    """
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed + 1)
    precision_rng = np.random.default_rng([seed, 1, 16])
    precisions, p_p = zip(*_TBE_PRECISION_SHARE[kind].items())
    dists = _distributions()
    out = []
    for i in range(n):
        precision = str(precision_rng.choice(precisions, p=p_p)) if i >= _FLOAT32_TABLE_SETS else "fp32"
        T = int(rng.integers(1, 9))
        while True:
            tables = [
                [
                    _log_uniform(rng, 1_000, max_rows),
                    int(rng.choice([8, 16, 32, 64, 128])),
                    _log_uniform(rng, 1, 64),
                    dists[int(rng.integers(0, len(dists)))],
                ]
                for _ in range(T)
            ]
            if sum(e * d * 4 for e, d, _, _ in tables) <= max_table_bytes:
                break
        B = _log_uniform(rng, 64, max_batch)
        out.append(ProbeSpec("embedding", {"tables": tables, "B": B, "seed": i, "weights_precision": precision},
                             f"emb:{i}:{precision}"))
    return out


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
            [job.tables[t].num_embeddings, job.tables[t].embedding_dim, job.tables[t].pooling_factor,
             job.tables[t].distribution.to_json()]
            for t in group
        ]
        out.append(ProbeSpec("embedding", {"tables": tables, "B": B * W, "seed": job.seed}, f"job-emb:{group}"))
    return out


def interleave(*lists: Sequence[ProbeSpec]) -> list[ProbeSpec]:
    return [s for group in itertools.zip_longest(*lists) for s in group if s is not None]


def _bit_reversed(n: int) -> list[int]:
    bits = max(1, (n - 1).bit_length())
    order = sorted(range(2**bits), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))
    return [i for i in order if i < n]


def collective_groups(nodes: Sequence[str]) -> list[tuple[int, ...]]:
    """Rank groups to measure, given each rank's node: for every size 2..world, the first
    ranks that share a node (an intra-node group) and, across nodes, ranks taken round-robin
    over the nodes (an inter-node group)."""
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    columns = list(itertools.zip_longest(*by_node.values()))
    round_robin = [r for col in columns for r in col if r is not None]
    biggest_node = max(by_node.values(), key=len)
    groups: list[tuple[int, ...]] = []
    for size in range(2, len(nodes) + 1):
        if size <= len(biggest_node):
            groups.append(tuple(biggest_node[:size]))
        if len(by_node) > 1:
            groups.append(tuple(sorted(round_robin[:size])))
    return list(dict.fromkeys(groups))


def collective_specs(
    groups: Sequence[Sequence[int]], max_bytes: int, min_bytes: int = 4, per_octave: int = 2
) -> list[ProbeSpec]:
    """Every collective (and an uneven all-to-all) on every group, message sizes from
    `min_bytes` to `max_bytes`, `per_octave` per doubling (2: 2^k and 2^(k+1/2)), visited
    coarse-to-fine so a cut-short sweep still spans the range of every op and group. Sizes
    that the group rounds to the same message (a multiple of its size in float32 elements)
    are measured once, so tiny messages are not over-weighted in the fit."""
    sizes = []
    b = min_bytes
    while b <= max_bytes:
        sizes.extend(s for s in (int(b * 2 ** (i / per_octave)) for i in range(per_octave)) if s <= max_bytes)
        b *= 2
    sizes = sorted(set(sizes))
    variants = [(op, False) for op in COLLECTIVE_OPS] + [("all_to_all", True)]
    seen: set[tuple[tuple[int, ...], int]] = set()
    out = []
    for i in _bit_reversed(len(sizes)):
        for ranks in groups:
            message = message_numel(sizes[i], len(ranks))
            if (tuple(ranks), message) in seen:
                continue
            seen.add((tuple(ranks), message))
            for op, uneven in variants:
                params = {"op": op, "bytes": sizes[i], "ranks": list(ranks), "uneven": uneven, "seed": i}
                tag = f"{op}{'-uneven' if uneven else ''}:{sizes[i]}:g{len(ranks)}"
                out.append(ProbeSpec("collective", params, tag))
    return out


CPU_MAX_COLLECTIVE_BYTES = 64 * 2**20


def default_max_collective_bytes(device: str, free_bytes: int | None = None) -> int:
    """Largest message: a quarter of the device's free memory on a GPU (rounded down to a power
    of two), given by the devices themselves (`free_bytes`: the smallest any probe actor
    reported) or, without it, this process's GPU; on CPU, 64 MiB keeps gloo quick."""
    if device.startswith("cuda"):
        if free_bytes is None and torch.cuda.is_available():
            free_bytes, _ = torch.cuda.mem_get_info()
        if free_bytes:
            return int(2 ** math.floor(math.log2(free_bytes / 4)))
    return CPU_MAX_COLLECTIVE_BYTES


# The random-task generator's seed stream for calibration probes: disjoint from the streams
# the evaluation benchmarks draw their tasks from (their seeds are small integers).
CALIBRATION_TASK_STREAM = 1_000_003
CALIBRATION_TASK_SCALE = 0.05  # the CPU-rank scale of the shipped random tasks


def random_plan(job: dict, world: int, rng: np.random.Generator, mixed: bool) -> list:
    """A random plan of a job dict: every table on a random rank, or (`mixed`) a third of the
    tables row-wise, column-wise or replicated (where the table allows it) and the rest on
    random ranks."""
    plan: list = [int(r) for r in rng.integers(0, world, size=len(job["tables"]))]
    if not mixed or world < 2:
        return plan
    for j, t in enumerate(job["tables"]):
        kinds = split_kinds(t["num_embeddings"], t["embedding_dim"], world)
        if rng.random() < 1 / 3 and kinds:
            plan[j] = {"type": str(rng.choice(kinds))}
    return plan


TaskPlacer = Callable[[dict, int, int], list]  # (job dict, world, k) -> a table-wise plan


def training_specs(n: int, seed: int, world: int, place_task: TaskPlacer | None = None) -> list[ProbeSpec]:
    """Real DLRM training steps, alternating two kinds so the step model sees both ends:

    - small random DLRMs whose kernels are tiny, so the gap between a measured step and the
      sum of its predicted kernels is the per-iteration, per-layer and per-table framework
      overhead;
    - production-shaped tasks from the random-task generator (`random_dlrm_job`, its own
      seed stream), whose steps are dominated by kernels and collectives, so the slowdown
      they suffer beside each other in a real step is measured, not extrapolated; every
      other one with a mixed plan (`random_plan`), the rest table-wise, placed by
      `place_task` (the orchestrator passes the classic sharders, in turn: balanced plans
      like those the policies price, where both ranks compute at once and slow each other
      on a small host) or, without one, on random ranks.
    """
    rng = np.random.default_rng(seed + 2)
    out = []
    for i in range(n):
        if i % 2:
            job = random_dlrm_job(i, world, seed=seed + CALIBRATION_TASK_STREAM, scale=CALIBRATION_TASK_SCALE)
            job["name"] = f"task{i}"
            # every other task-shaped probe mixes in row-/column-wise and replicated tables, so the
            # step model has seen the collectives and TBEs of the plans the sharding search tries
            placement = random_plan(job, world, rng, mixed=i % 4 == 3)
            if place_task is not None and i % 4 == 1:
                placement = [int(r) for r in place_task(job, world, i // 4)]
            out.append(ProbeSpec("training", {"job": job, "table_to_rank": placement}, f"train:{i}"))
            continue
        n_tables = int(rng.integers(1, 13))
        job = {
            "name": f"overhead{i}",
            "workload": "dlrm",
            "world_size": world,
            "batch_size": int(rng.choice([16, 32, 64, 128])),
            "seed": i,
            "dense": {
                "num_dense_features": int(rng.integers(4, 17)),
                "bottom_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(1, 5)))],
                "top_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(0, 4)))] + [1],
            },
            "tables": [
                {
                    "name": f"t{j}",
                    "num_embeddings": int(rng.integers(100, 2000)),
                    "embedding_dim": int(rng.choice([4, 8, 16])),
                    "pooling_factor": int(rng.integers(1, 5)),
                    "distribution": "uniform",
                }
                for j in range(n_tables)
            ],
        }
        placement = [int(r) for r in rng.integers(0, world, size=n_tables)]
        out.append(ProbeSpec("training", {"job": job, "table_to_rank": placement}, f"train:{i}"))
    return out


def run_training_probe(spec: ProbeSpec, device: str = "cpu", iterations: int = 30, warmup: int = 5) -> list[Measurement]:
    """A few real training steps on the current process group; rank 0 returns the step time,
    the per-op CPU overheads and the in-context kernel times of a captured step."""
    import torch.distributed as dist

    if "transformer" in spec.params:
        from probes.workloads.transformer import ParallelTransformer
        from probes.vocabulary.transformer_spec import TransformerSpec

        model: Any = ParallelTransformer(TransformerSpec.from_dict(spec.params["transformer"]), dist.get_rank(),
                                         torch.device(device))
        step_op, workload, step = "transformer_step", "transformer", model.step
        iterations = min(iterations, 10)
        params = {"transformer": spec.params["transformer"]}
    else:
        from probes.vocabulary.jobspec import JobSpec
        from probes.workloads.dlrm import ShardedDLRM

        plan = spec.params["table_to_rank"]
        model = ShardedDLRM(JobSpec.from_dict(spec.params["job"]), plan, dist.get_rank(),
                            dist.get_world_size(), torch.device(device))
        step_op, workload, step = "dlrm_step", "dlrm", cycling_step(model)
        params = {"job": spec.params["job"], "table_to_rank": plan}
    if "placement" in spec.params:  # the node of each rank, set by the gang that ran it
        params["placement"] = spec.params["placement"]
    try:
        result = model.run(iterations, warmup)
        # Every rank profiles (the steps hold collectives); rank 0 reports.
        overheads = profile_overheads(step, iterations=5, warmup=0, device=device, workload=workload)
        trace = capture_step_trace(step, iterations=3, warmup=0, barrier=dist.barrier)
    finally:
        if hasattr(model, "close"):
            model.close()  # its subgroups: a calibration builds many models on one process group
    if dist.get_rank() != 0:
        return []
    times = np.asarray(result.iteration_s)
    q1, q3 = np.percentile(times, [25, 75])
    world = dist.get_world_size()
    return [
        Measurement(step_op, params, float(np.median(times)), float(q3 - q1), len(times), device=device,
                    world_size=world, family="training")
    ] + overheads + (in_context_rows(trace["steps"], device, world, workload) if float32_step(spec) else [])


def float32_step(spec: ProbeSpec) -> bool:
    """Whether a training probe's captured kernels run in float32: the in-context rows price
    them with the float32 probe models (a bfloat16 step's kernels would skew those factors)."""
    return spec.params.get("transformer", {}).get("dtype", "float32") == "float32"


# Which transformer probes (by index mod 4) train under bfloat16 autocast: on a GPU half of
# them, small and task-shaped alike. On CPU none for now: bfloat16 steps do work there (on the
# AVX512-BF16 development host 0.5-1.4x the float32 step), but the in-context rows of a captured
# step are labelled float32 whatever the step ran in (probes/vocabulary/in_context.py), so they would skew
# the float32 context factors, and a CPU without bf16 units emulates the products (~50x
# slower). (2,) here would probe every other small stack once those rows carry their dtype.
# float16 (a GradScaler, CUDA only) is not probed: jobs train in bfloat16.
_TRAINING_BF16_SLOTS: dict[str, tuple[int, ...]] = {"cpu": (), "cuda": (2, 3)}


def transformer_training_specs(n: int, seed: int, world: int, device_kind: str = "cpu") -> list[ProbeSpec]:
    """Data-parallel block stacks whose captured steps give the in-context times of the
    transformer kernels (gelu, softmax, layer_norm and their backward, batched GEMMs),
    alternating small stacks with task-shaped ones from the random-task generator (its own
    seed stream), so the step model is not extrapolated to the sizes jobs have; some of them
    in bfloat16 mixed precision (`_TRAINING_BF16_SLOTS`)."""
    from probes.vocabulary.transformer_spec import random_transformer

    bf16_slots = _TRAINING_BF16_SLOTS["cuda" if device_kind.startswith("cuda") else "cpu"]
    rng = np.random.default_rng(seed + 3)
    out = []
    for i in range(n):
        dtype = "bfloat16" if i % 4 in bf16_slots else "float32"
        if i % 2:
            spec = random_transformer(i, world, 1, seed + CALIBRATION_TASK_STREAM).to_dict()
            spec["name"] = f"probe{i}"
            spec["dtype"] = dtype
        else:
            hidden = int(rng.choice([64, 128, 256]))
            spec = {"layers": int(rng.integers(1, 3)), "hidden": hidden, "heads": int(rng.choice([2, 4])),
                    "seq_len": int(rng.choice([32, 64, 128])), "batch_size": int(rng.choice([2, 4])),
                    "world_size": world, "tensor_parallel": 1, "dropout": 0.1, "seed": i, "name": f"probe{i}",
                    "dtype": dtype}
        out.append(ProbeSpec("training", {"transformer": spec}, f"train-transformer:{i}:{dtype}"))
    return out

def overlap_points(world: int) -> list[PairPoint]:
    """The measured compute + collective pairs a calibration fits overlap costs to: per pair
    eight sizes from sub-millisecond to tens of milliseconds, square, tall, wide and GEMV-like
    products, skewed splits, few and many tables, on the first two devices (about 5-15 s each
    on two CPU cores, the transfer-only forms included)."""
    w = min(world, 2)
    gar = [(128, 128, 128), (1024, 512, 256), (4, 2048, 2048), (2048, 512, 768), (256, 1024, 1024),
           (4096, 1024, 256), (1, 4096, 4096), (1024, 4096, 256)]
    ga2a = [(256, 256, 256, False), (2048, 512, 256, False), (1024, 512, 512, True), (4096, 768, 128, False),
            (512, 512, 1024, False), (8192, 512, 64, False), (1024, 1024, 128, False), (64, 256, 256, False)]
    emb = [(512, 64, 4, 8, False), (2048, 128, 8, 16, False), (1024, 128, 4, 8, True), (4096, 192, 6, 12, False),
           (8192, 128, 4, 8, False), (4096, 512, 8, 4, False), (16384, 64, 2, 8, False), (1024, 256, 8, 32, False)]
    return ([PairPoint("gemm_all_reduce", m, n, k, world=w) for m, n, k in gar]
            + [PairPoint("gemm_all_to_all", m, n, k, world=w, uneven=u) for m, n, k, u in ga2a]
            + [PairPoint("embedding_all_to_all", rows, cols, world=w, tables=t, pooling=p, uneven=u)
               for rows, cols, t, p, u in emb])


def overlap_specs(world: int) -> list[ProbeSpec]:
    """`overlap_points` as gang specs; a pair runs on ranks 0..1 of the gang (world 2)."""
    return [ProbeSpec("overlap", p.to_params(), f"overlap:{i}") for i, p in enumerate(overlap_points(world))]
