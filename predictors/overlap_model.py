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
  (`predictors.overlap_fit.fit_transfer_line`), applied to the collective model's price of the
  whole; without a line, the collective model's price of a slice. `comm_factor` (at least 1)
  scales either: the transfer runs beside compute, not alone;
- `comm_compute_share`: the share of a communication slice's time it takes from the compute
  stream while both run (on a CPU the backend's thread competes for the cores the kernels run
  on; on a GPU a fused kernel gives SMs to communication). 0 is perfect overlap, 1 none.
Ops that read the producer's output read its last slice; ops that read the collective's output
wait for every collective slice (the join). The simulator then times both forms.

The two costs are fitted per pair from measured pairs (`probes/overlap.py`) on the
ratio fused / unfused, so the base models' own error at a size cancels out of the fit
(`predictors/overlap_fit.py`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from predictors.graph import ExecutionGraph, GraphOp
from predictors.simulator import simulate

PAIR_OPS = {
    "embedding_all_to_all": ("embedding_fwd", "all_to_all"),
    "gemm_all_reduce": ("gemm", "all_reduce"),
    "gemm_all_to_all": ("gemm", "all_to_all"),
}
SLICE_COUNTS = (2, 4, 8, 16)

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


def substitute(
    graph: ExecutionGraph,
    pair: SubstitutablePair,
    slices: int,
    costs: OverlapCosts,
    slice_params: SliceParams,
    collective_cost: CostFn,
    compute_cost: CostFn | None = None,
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
        c_i, p_i = _pair_indices(r, ops, names, pair)
        coll = ops[c_i]
        piece = dict(coll.params, bytes=max(1, int(math.ceil(coll.params["bytes"] / slices))))
        comm_s = costs.slice_comm_s(
            slices, coll.params["bytes"], collective_cost(coll), collective_cost(replace(coll, params=piece))
        )
        pipeline = _RankPipeline(r, ops, pair, slices, costs, slice_params, compute_cost, c_i, p_i, piece, comm_s)
        ranks.append(pipeline.rewrite())
    return ExecutionGraph(ranks, dict(graph.meta))


def _pair_indices(r: int, ops: list[GraphOp], names: list[str], pair: SubstitutablePair) -> tuple[int, int | None]:
    """Where rank `r` runs the pair's collective and its producer (None: not on this rank);
    refuses a producer the collective does not consume, or whose output other ops read first."""
    c_i = names.index(pair.collective)
    p_i = names.index(pair.producer) if pair.producer in names else None
    if p_i is not None and (c_i < p_i or p_i not in ops[c_i].deps):
        raise ValueError(f"rank {r}: {pair.collective} does not consume {pair.producer}")
    if p_i is not None and any(p_i in ops[j].deps for j in range(p_i + 1, c_i)):
        raise ValueError(f"rank {r}: ops between {pair.producer} and {pair.collective} read the producer")
    return c_i, p_i


@dataclass
class _RankPipeline:
    """One rank's ops rewritten with the pair as a pipeline of `slices` stages."""

    rank: int
    ops: list[GraphOp]
    pair: SubstitutablePair
    slices: int
    costs: OverlapCosts
    slice_params: SliceParams
    compute_cost: CostFn | None
    c_i: int  # the collective's index
    p_i: int | None  # the producer's index (None: this rank produces nothing for it)
    piece: dict[str, Any]  # a collective slice's params
    comm_s: float  # a collective slice's time

    def sliced(self, op: GraphOp, name: str, deps: list[int]) -> GraphOp:
        out = replace(op, name=name, params=self.slice_params(self.rank, op, self.slices), deps=deps)
        if self.compute_cost is not None:
            out = replace(out, duration_s=max(self.compute_cost(out), self.compute_cost(op) / self.slices))
        return out

    def rewrite(self) -> list[GraphOp]:
        """The rank's ops with the stages where the collective was and no producer of its own;
        deps renumbered, readers of the collective reading the join."""
        new: list[GraphOp] = []
        index: dict[int, int] = {}
        join = -1
        for i, o in enumerate(self.ops):
            deps = sorted({join if d == self.c_i else index[d] for d in o.deps if d in index or d == self.c_i})
            if i == self.c_i:
                join = self.stages(new, index)
                continue
            if i == self.p_i:
                continue  # produced slice by slice where the collective was
            if o.name in self.pair.sliced_with:
                for s in range(self.slices):
                    new.append(self.sliced(o, f"{o.name}.slice{s}", deps if s == 0 else []))
            else:
                new.append(replace(o, deps=deps))
            index[i] = len(new) - 1
        return new

    def stages(self, new: list[GraphOp], index: dict[int, int]) -> int:
        """Append per slice its compute slice (after the slice overhead), its collective slice and
        its contention, then the join; returns the join's index. Readers of the producer read its
        last slice."""
        coll, costs = self.ops[self.c_i], self.costs
        comm_slices, last_slice = [], None
        for s in range(self.slices):
            compute = None
            if self.p_i is not None:
                producer = self.ops[self.p_i]
                if s:
                    new.append(
                        GraphOp(
                            f"{producer.name}.slice_overhead",
                            "compute",
                            "overlap_overhead",
                            {},
                            duration_s=costs.slice_overhead_s,
                        )
                    )
                new.append(
                    self.sliced(
                        producer, f"{producer.name}.slice{s}", [index[d] for d in producer.deps] if s == 0 else []
                    )
                )
                compute = last_slice = len(new) - 1
            new.append(
                GraphOp(
                    f"{coll.name}.slice{s}",
                    "collective",
                    coll.op,
                    self.piece,
                    coll.stream,
                    [compute] if compute is not None else [],
                    coll.group,
                    duration_s=self.comm_s,
                    blocking=False,
                )
            )
            comm_slices.append(len(new) - 1)
            if self.p_i is not None and costs.comm_compute_share > 0:  # what the transfer takes from compute
                new.append(
                    GraphOp(
                        f"{coll.name}.slice{s}.contention",
                        "compute",
                        "overlap_contention",
                        {},
                        duration_s=costs.comm_compute_share * self.comm_s,
                    )
                )
        new.append(GraphOp(f"{coll.name}.join", "compute", "overlap_join", {}, deps=comm_slices, duration_s=0.0))
        if self.p_i is not None and last_slice is not None:  # a producer always has a last slice
            index[self.p_i] = last_slice
        return len(new) - 1


def pair_graph(producers: Sequence[GraphOp], collective: GraphOp, pair: str) -> ExecutionGraph:
    """The standalone pair on a group: per rank its producer, then the collective."""
    ranks = []
    for producer in producers:
        ranks.append([replace(producer, name="producer", deps=[]), replace(collective, name="collective", deps=[0])])
    return ExecutionGraph(ranks, {"substitutable": [asdict(SubstitutablePair("pair", pair, "producer", "collective"))]})


@dataclass
class PairPrediction:
    unfused_s: float
    fused_s: dict[int, float] = field(default_factory=dict)  # slices -> seconds

    def best(self) -> tuple[int, float]:
        k = min(self.fused_s, key=lambda slices: self.fused_s[slices])
        return k, self.fused_s[k]

    def gain(self) -> float:
        """Predicted fraction of the unfused time the best fused form saves."""
        return 1.0 - self.best()[1] / self.unfused_s if self.unfused_s > 0 else 0.0


def predict_forms(
    graph: ExecutionGraph,
    pair: SubstitutablePair,
    costs: OverlapCosts,
    cost: CostFn,
    slice_params: SliceParams,
    collective_cost: CostFn,
    synchronous: bool,
    slice_counts: Sequence[int] = SLICE_COUNTS,
    cpu_overhead: CostFn | None = None,
    unfused_s: float | None = None,
) -> PairPrediction:
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
