"""`OverheadModel`: per-op CPU-side overhead distributions (dispatch, gap, launch), as plain data.

Why a table and not a regression: the training probe (`probes.overheads`) measures host-side
overheads per top-level op as distributions, and a simulator wants to *sample or bound* them
(p10 / p50 / p90), not fit a curve through them: an op's dispatch cost does not grow with any
feature we have, it just varies. So the model keeps, per (kind, op), a few quantiles and the
sample count, and answers for ops it never saw with the kind's pooled distribution (the
`aten_op="*"` rows), saying so through `out_of_range`.

Pooling several rows of one key (several calibrations, several probed workloads): the rows
carry quantiles, not raw samples, so the exact pooled quantile is out of reach. Each pooled
quantile is the *count-weighted median* of the rows' quantiles. It equals the true quantile
when the rows agree, follows the bulk of the samples when they do not, and one short noisy
probe cannot drag it the way a mean would. Counts add up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from predictors.opmodels import OpModel, Params
from probes.vocabulary.records import Measurement

POOLED = "*"
QUANTILES = ("p10", "p50", "p90")


@dataclass(frozen=True)
class OverheadQuantiles:
    p10: float
    p50: float
    p90: float
    count: int

    @classmethod
    def from_row(cls, row: Measurement) -> "OverheadQuantiles":
        extra = row.extra or {}
        count = int(extra.get("count", row.repeats) or 1)
        return cls(
            float(extra.get("p10", row.median_s)), float(row.median_s), float(extra.get("p90", row.median_s)), count
        )


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The smallest value at which the cumulative weight reaches half of the total."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    return float(v[order][np.searchsorted(cum, cum[-1] / 2.0)])


def pool(parts: Sequence[OverheadQuantiles]) -> OverheadQuantiles:
    """Several distributions of one key → one (count-weighted median of each quantile)."""
    counts = [max(p.count, 1) for p in parts]
    p10, p50, p90 = (weighted_median([getattr(p, q) for p in parts], counts) for q in QUANTILES)
    return OverheadQuantiles(p10, p50, p90, count=sum(counts))


class OverheadModel(OpModel):
    """Seconds of one overhead kind for one op: the median of its measured distribution."""

    kind = "overhead_quantiles"

    def __init__(self, op: str = "cpu_overhead"):
        super().__init__(op)
        self.table: dict[str, dict[str, OverheadQuantiles]] = {}  # kind → aten_op → quantiles

    def fit(self, rows: Sequence[Measurement]) -> "OverheadModel":
        grouped: dict[tuple[str, str], list[OverheadQuantiles]] = defaultdict(list)
        for r in rows:
            if r.op != self.op or "kind" not in r.params:
                continue
            grouped[(str(r.params["kind"]), str(r.params.get("aten_op", POOLED)))].append(OverheadQuantiles.from_row(r))
        if not grouped:
            raise ValueError(f"{self.op}: no overhead rows (params with 'kind' and 'aten_op') to fit")
        table: dict[str, dict[str, OverheadQuantiles]] = defaultdict(dict)
        for (kind, name), parts in grouped.items():
            table[kind][name] = pool(parts)
        for kind, ops in table.items():
            if POOLED not in ops:  # rows of single ops only: pool them for the fallback
                ops[POOLED] = pool(list(ops.values()))
        self.table = dict(table)
        return self

    def _lookup(self, params: Params) -> tuple[OverheadQuantiles, str]:
        """The distribution for `params` and the op key it came from (`*` on fallback)."""
        kind = str(params["kind"])
        if kind not in self.table:
            raise KeyError(f"{self.op}: no overhead kind {kind!r} was measured; measured: {sorted(self.table)}")
        ops = self.table[kind]
        name = str(params.get("aten_op", POOLED))
        return (ops[name], name) if name in ops else (ops[POOLED], POOLED)

    def predict(self, params: Params) -> float:
        return self._lookup(params)[0].p50

    def quantiles(self, params: Params) -> dict[str, Any]:
        """The stored distribution for `params`: p10, p50, p90, count and the key it came from."""
        q, name = self._lookup(params)
        return {**asdict(q), "kind": str(params["kind"]), "aten_op": name}

    def out_of_range(self, params: Params) -> list[str]:
        kind = str(params.get("kind"))
        if kind not in self.table:
            return [f"{self.op}: overhead kind {kind!r} never measured (measured: {sorted(self.table)})"]
        name = str(params.get("aten_op", POOLED))
        if name not in self.table[kind]:
            return [f"{self.op}: {kind} of {name!r} never measured; using the pooled {kind} distribution"]
        return []

    def state(self) -> dict[str, Any]:
        return {
            "table": {k: {name: asdict(q) for name, q in sorted(ops.items())} for k, ops in sorted(self.table.items())}
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "OverheadModel":
        model = cls(data["op"])
        model.table = {
            k: {
                name: OverheadQuantiles(float(q["p10"]), float(q["p50"]), float(q["p90"]), int(q["count"]))
                for name, q in ops.items()
            }
            for k, ops in data["table"].items()
        }
        return model
