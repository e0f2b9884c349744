"""Predicting an overlapped (fused) compute + collective pair as a k-stage pipeline.

`substitute` rewrites an `ExecutionGraph`: a producer op and the collective that consumes its
output become, on every rank of the group, k compute slices on the compute stream, each
followed by its collective slice on the communication stream (asynchronous: it does not hold
the issuing thread, whatever the device), plus two costs that are measured, not assumed:
- `slice_overhead_s`: what each extra slice costs the issuing stream (a launch, an async
  collective's set-up, a slice's smaller and less efficient kernel beyond what the kernel model
  already prices);
- the price of a communication slice: the overlapped form's transfers are point-to-point
  sends or asynchronous all-reduces, not the probed collective call; how their cost splits into
  k slices (a latency per slice, the bytes shared) is a line `transfer_latency_s +
  transfer_s_per_byte * bytes` fitted to the pair probe's transfer-only forms
  (`fit_transfer_line`), applied to the collective model's price of the whole; without a line,
  the collective model's price of a slice. `comm_factor` (at least 1) scales either: the
  transfer runs beside compute, not alone;
- `comm_compute_share`: the share of a communication slice's time it takes from the compute
  stream while both run (on a CPU the backend's thread competes for the cores the kernels run
  on; on a GPU a fused kernel gives SMs to communication). 0 is perfect overlap, 1 none.
Ops that read the producer's output read its last slice; ops that read the collective's output
wait for every collective slice (the join). The simulator then times both forms.

The two costs are fitted per pair from measured pairs (`probes/overlap.py`) on the
ratio fused / unfused, so the base models' own error at a size cancels out of the fit.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
from scipy.optimize import minimize

from predictors.graph import ExecutionGraph, GraphOp
from predictors.simulator import simulate

PAIR_OPS = {
    "embedding_all_to_all": ("embedding_fwd", "all_to_all"),
    "gemm_all_reduce": ("gemm", "all_reduce"),
    "gemm_all_to_all": ("gemm", "all_to_all"),
}
SLICE_COUNTS = (2, 4, 8, 16)
# A transfer that runs beside compute is never faster than the same transfer alone, which the
# collective model prices: a factor below 1 would let the fit explain a fused form's measured
# time by cheaper communication and predict a gain no overlap produces (fitted freely, GEMM +
# all-reduce took 0.66 and was substituted where it measured 4-6% slower).
MIN_COMM_FACTOR = 1.0

# slice_params(rank, producer op, slices) -> the producer's params for one of `slices` slices
SliceParams = Callable[[int, GraphOp, int], dict[str, Any]]
CostFn = Callable[[GraphOp], float]


@dataclass
class OverlapCosts:
    slice_overhead_s: float = 0.0
    comm_compute_share: float = 0.0
    comm_factor: float = 1.0
    n_points: int = 0
    fit_gmae: float | None = None  # on the fused / unfused ratios it was fitted to
    transfer_latency_s: float | None = None  # per communication slice (None: the collective model prices it)
    transfer_s_per_byte: float | None = None

    def slice_comm_s(self, slices: int, whole_bytes: float, whole_price: float, piece_price: float) -> float:
        """A communication slice's time. With a fitted transfer line, the whole collective's
        model price times the line's share for one slice of `slices`: the line says how the
        transfer's cost splits into slices (a latency per slice, the bytes shared), the model
        what the whole costs on this op, so a mismatch between the two probes is never
        predicted as a gain. Without one, the collective model's price of a slice."""
        if self.transfer_latency_s is None or self.transfer_s_per_byte is None:
            return self.comm_factor * max(piece_price, whole_price / slices)
        line = lambda b: self.transfer_latency_s + self.transfer_s_per_byte * b  # noqa: E731
        return self.comm_factor * whole_price * line(whole_bytes / slices) / line(whole_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OverlapCosts":
        return cls(**data)


@dataclass
class SubstitutablePair:
    """A producer and the collective consuming its output, by op name, on every rank that runs
    them (names are the same on every rank of a graph built by our builders)."""

    name: str
    pair: str  # a key of PAIR_OPS
    producer: str
    collective: str
    sliced_with: tuple[str, ...] = ()  # ops the overlapped form also runs per slice (its backward)

    def __post_init__(self) -> None:
        self.sliced_with = tuple(self.sliced_with)
        if self.pair not in PAIR_OPS:
            raise ValueError(f"pair {self.name!r}: kind {self.pair!r} not in {sorted(PAIR_OPS)}")


def pairs_in(graph: ExecutionGraph) -> list[SubstitutablePair]:
    """The pairs the graph's builder marked as substitutable (`meta["substitutable"]`)."""
    return [SubstitutablePair(**p) for p in graph.meta.get("substitutable", [])]


def scale_gemm_rows(params: dict[str, Any], slices: int) -> dict[str, Any]:
    """A GEMM's params for 1/slices of its output rows (M), or of its columns (N) for a
    few-row product, as `probes.workloads.overlap.overlapped_gemm_all_reduce` cuts it."""
    from probes.vocabulary.ops import gemm_params
    from probes.vocabulary.pairs import slices_rows

    m, n, k = int(params["M"]), int(params["N"]), int(params["K"])
    if slices_rows(m, n, k, slices):
        m = max(1, math.ceil(m / slices))
    else:
        n = max(1, math.ceil(n / slices))
    return gemm_params(m, n, k, params.get("dtype", "float32"), params.get("variant", "mm"))


def substitute(graph: ExecutionGraph, pair: SubstitutablePair, slices: int, costs: OverlapCosts,
               slice_params: SliceParams, collective_cost: CostFn, compute_cost: CostFn | None = None,
               ) -> ExecutionGraph:
    """`graph` with `pair` replaced on every rank that runs it by a `slices`-stage pipeline.

    A rank that takes part in the collective without producing anything for it (a DLRM rank
    holding no tables) runs the collective's slices alone. Ops named in `pair.sliced_with` (the
    producer's backward, which the overlapped form runs per slice) become `slices` ops in a row.

    A slice is never priced below its share of the whole (k slices of a kernel or a transfer
    cannot cost less than the whole): with `compute_cost`, a compute slice costs at least
    1/k of the whole producer's price, and a collective slice at least 1/k of the whole
    collective's. A model fitted across sizes can otherwise price k small calls below one big
    one and predict a gain that no overlap produces."""
    if slices < 2:
        return graph
    ranks = []
    for r, ops in enumerate(graph.ranks):
        names = [o.name for o in ops]
        if pair.collective not in names:
            ranks.append(list(ops))
            continue
        c_i = names.index(pair.collective)
        p_i = names.index(pair.producer) if pair.producer in names else None
        if p_i is not None and (c_i < p_i or p_i not in ops[c_i].deps):
            raise ValueError(f"rank {r}: {pair.collective} does not consume {pair.producer}")
        if p_i is not None and any(p_i in ops[j].deps for j in range(p_i + 1, c_i)):
            raise ValueError(f"rank {r}: ops between {pair.producer} and {pair.collective} read the producer")
        coll = ops[c_i]
        piece = dict(coll.params, bytes=max(1, int(math.ceil(coll.params["bytes"] / slices))))
        comm_s = costs.slice_comm_s(slices, coll.params["bytes"], collective_cost(coll),
                                    collective_cost(replace(coll, params=piece)))

        def sliced(op: GraphOp, s: int, name: str, deps: list[int]) -> GraphOp:
            out = replace(op, name=name, params=slice_params(r, op, slices), deps=deps)
            if compute_cost is not None:
                out = replace(out, duration_s=max(compute_cost(out), compute_cost(op) / slices))
            return out

        new: list[GraphOp] = []
        index: dict[int, int] = {}
        join = -1
        for i, o in enumerate(ops):
            deps = sorted({join if d == c_i else index[d] for d in o.deps if d in index or d == c_i})
            if i == c_i:
                comm_slices, last_slice = [], None
                for s in range(slices):
                    compute = None
                    if p_i is not None:
                        producer = ops[p_i]
                        if s:
                            new.append(GraphOp(f"{producer.name}.slice_overhead", "compute", "overlap_overhead", {},
                                               duration_s=costs.slice_overhead_s))
                        new.append(sliced(producer, s, f"{producer.name}.slice{s}",
                                          [index[d] for d in producer.deps] if s == 0 else []))
                        compute = last_slice = len(new) - 1
                    new.append(GraphOp(f"{coll.name}.slice{s}", "collective", coll.op, piece, coll.stream,
                                       [compute] if compute is not None else [], coll.group, duration_s=comm_s,
                                       blocking=False))
                    comm_slices.append(len(new) - 1)
                    if p_i is not None and costs.comm_compute_share > 0:  # what the transfer takes from compute
                        new.append(GraphOp(f"{coll.name}.slice{s}.contention", "compute", "overlap_contention", {},
                                           duration_s=costs.comm_compute_share * comm_s))
                new.append(GraphOp(f"{coll.name}.join", "compute", "overlap_join", {}, deps=comm_slices,
                                   duration_s=0.0))
                join = len(new) - 1
                if p_i is not None:
                    index[p_i] = last_slice
                continue
            if i == p_i:
                continue  # produced slice by slice where the collective was
            if o.name in pair.sliced_with:
                for s in range(slices):
                    new.append(sliced(o, s, f"{o.name}.slice{s}", deps if s == 0 else []))
            else:
                new.append(replace(o, deps=deps))
            index[i] = len(new) - 1
        ranks.append(new)
    return ExecutionGraph(ranks, dict(graph.meta))


def pair_graph(producers: Sequence[GraphOp], collective: GraphOp, pair: str) -> ExecutionGraph:
    """The standalone pair on a group: per rank its producer, then the collective."""
    ranks = []
    for producer in producers:
        ranks.append([replace(producer, name="producer", deps=[]),
                      replace(collective, name="collective", deps=[0])])
    return ExecutionGraph(ranks, {"substitutable": [asdict(SubstitutablePair("pair", pair, "producer", "collective"))]})


@dataclass
class PairPrediction:
    unfused_s: float
    fused_s: dict[int, float] = field(default_factory=dict)  # slices -> seconds

    def best(self) -> tuple[int, float]:
        k = min(self.fused_s, key=self.fused_s.get)
        return k, self.fused_s[k]

    def gain(self) -> float:
        """Predicted fraction of the unfused time the best fused form saves."""
        return 1.0 - self.best()[1] / self.unfused_s if self.unfused_s > 0 else 0.0


def predict_forms(graph: ExecutionGraph, pair: SubstitutablePair, costs: OverlapCosts, cost: CostFn,
                  slice_params: SliceParams, collective_cost: CostFn, synchronous: bool,
                  slice_counts: Sequence[int] = SLICE_COUNTS, cpu_overhead: CostFn | None = None,
                  unfused_s: float | None = None) -> PairPrediction:
    """Simulated time of `graph` with `pair` unfused and fused at each slice count;
    `unfused_s`, when the caller already simulated `graph`, is not simulated again."""
    run = lambda g: simulate(g, cost, cpu_overhead, synchronous=synchronous).iteration_s  # noqa: E731
    out = PairPrediction(run(graph) if unfused_s is None else unfused_s)
    for k in slice_counts:
        out.fused_s[k] = run(substitute(graph, pair, k, costs, slice_params, collective_cost, cost))
    return out




def fuse_as_one_kernel(graph: ExecutionGraph, pair: SubstitutablePair, ratio: float, cost: CostFn) -> ExecutionGraph:
    """`graph` with `pair` run as one fused kernel (PyTorch's symmetric-memory ops, which
    micro-pipeline the product with its communication inside the kernel): on every rank that
    runs both, the producer takes `ratio` x what the unfused producer and collective cost, and
    the collective none of its own (it stays, at zero length, as the point where the ranks
    meet). `ratio` is measured (fused / unfused, geometric mean over the calibration's pairs)."""
    ranks = []
    for ops in graph.ranks:
        names = [o.name for o in ops]
        if pair.collective not in names or pair.producer not in names:
            ranks.append(list(ops))
            continue
        p_i, c_i = names.index(pair.producer), names.index(pair.collective)
        new = list(ops)
        new[p_i] = replace(ops[p_i], duration_s=ratio * (cost(ops[p_i]) + cost(ops[c_i])))
        new[c_i] = replace(ops[c_i], duration_s=0.0)
        ranks.append(new)
    return ExecutionGraph(ranks, meta=graph.meta)


def fit_transfer_line(samples: Sequence[tuple[float, int, float]]) -> tuple[float, float, float]:
    """(latency per slice, seconds per byte, geometric mean relative error) of
    `k * latency + bytes * per_byte` fitted to measured transfer-only forms
    `(bytes, k, seconds)`: non-negative least squares on relative error, so a 50 us form
    counts as much as a 50 ms one."""
    from scipy.optimize import nnls

    if len(samples) < 2:
        raise ValueError("a transfer line needs at least two measured transfer forms")
    a = np.array([[k, b] for b, k, _ in samples], dtype=float)
    t = np.array([s for _, _, s in samples], dtype=float)
    (latency, per_byte), _ = nnls(a / t[:, None], np.ones_like(t))
    errors = np.abs(a @ [latency, per_byte] - t) / t
    return float(latency), float(per_byte), float(np.exp(np.mean(np.log(np.maximum(errors, 1e-9)))))


def fit_overlap_costs(points: Sequence[tuple[Callable[[OverlapCosts], PairPrediction], dict[int, float]]],
                      transfer_line: tuple[float, float] | None = None) -> OverlapCosts:
    """Fit (slice overhead, communication's compute share, communication factor) to measured pairs.

    `points`: per measured pair, a function predicting its forms under given costs, and the
    measured time per slice count (1 = unfused). Minimises the squared log error of the
    fused / unfused ratio over every measured slice count: a grid over the three, then a
    local refinement around the best cell. `transfer_line` (latency, seconds per byte), when
    given, prices the communication slices (see `OverlapCosts.slice_comm_s`)."""
    line = dict(zip(("transfer_latency_s", "transfer_s_per_byte"), transfer_line)) if transfer_line else {}
    if not points:
        raise ValueError("no measured pairs to fit overlap costs to")
    measured = [(predict, times) for predict, times in points if 1 in times and len(times) > 1]
    if not measured:
        raise ValueError("measured pairs need the unfused form and at least one fused form")
    scale = float(np.median([t[1] for _, t in measured]))

    def loss(o: float, s: float, f: float) -> float:
        total = 0.0
        for predict, times in measured:
            pred = predict(OverlapCosts(o, s, f, **line))
            for k, t in times.items():
                if k == 1 or k not in pred.fused_s:
                    continue
                total += (math.log(pred.fused_s[k] / pred.unfused_s) - math.log(t / times[1])) ** 2
        return total

    # A coarse grid (each evaluation simulates every measured pair at every slice count), then
    # Nelder-Mead from its best cell.
    overheads = [0.0] + list(scale * np.logspace(-4, 0, 7))
    shares = list(np.linspace(0.0, 1.0, 6))
    factors = [MIN_COMM_FACTOR + 0.2 * i for i in range(4)]
    start = min(itertools.product(overheads, shares, factors), key=lambda p: loss(*p))
    # Refine from the best cell (Nelder-Mead; the bounds are kept by clipping inside the loss).
    clip = lambda p: (max(0.0, p[0] * scale), min(1.0, max(0.0, p[1])), max(MIN_COMM_FACTOR, p[2]))  # noqa: E731
    res = minimize(lambda p: loss(*clip(p)), [start[0] / scale, start[1], start[2]], method="Nelder-Mead",
                   options={"xatol": 1e-4, "fatol": 1e-10, "maxiter": 400,
                            "initial_simplex": _simplex([start[0] / scale, start[1], start[2]])})
    o, s, f = clip(res.x) if res.fun < loss(*start) else start
    errors = []
    for predict, times in measured:
        pred = predict(OverlapCosts(o, s, f, **line))
        for k, t in times.items():
            if k != 1 and k in pred.fused_s:
                errors.append(abs(pred.fused_s[k] / pred.unfused_s - t / times[1]) / (t / times[1]))
    gmae = float(np.exp(np.mean(np.log(np.maximum(errors, 1e-9))))) if errors else None
    return OverlapCosts(float(o), float(s), float(f), len(measured), gmae, **line)


def _simplex(x0: list[float]) -> np.ndarray:
    """A starting simplex around `x0` with steps the size of the search grid's cells."""
    steps = [max(abs(x0[0]), 1e-4), 0.1, 0.1]
    return np.array([x0] + [[x + (steps[i] if j == i else 0.0) for j, x in enumerate(x0)] for i in range(3)])


@dataclass
class OverlapCalibration:
    """Fitted costs per pair kind, the `overlap` field of a `PerformanceModel` (plain JSON)."""

    pairs: dict[str, OverlapCosts] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {pair: c.to_dict() for pair, c in sorted(self.pairs.items())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OverlapCalibration":
        return cls({pair: OverlapCosts.from_dict(c) for pair, c in data.items()})


def group_rows_by_point(rows: Sequence[Any]) -> dict[tuple, dict[int, Any]]:
    """Measured pair rows (`overlap_pair`) grouped per point: point key -> slices -> row."""
    grouped: dict[tuple, dict[int, Any]] = defaultdict(dict)
    for row in rows:
        key = tuple(sorted((k, v) for k, v in row.params.items() if k != "k"))
        grouped[key][int(row.params["k"])] = row
    return grouped
