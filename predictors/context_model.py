"""`ContextFactorModel`: how much slower each kernel runs inside a real training step than in
its isolated probe, learned from captured training steps (`probes/vocabulary/in_context.py`).

Isolated probes time a kernel with warm caches and a warm allocator; a training step does not
(see probes/vocabulary/in_context.py for the figures on the development VM). Per op the in-step time is
affine in the isolated prediction: `factor * isolated + add_s`. A pure ratio does not
transfer across sizes: a microsecond GEMM runs several times slower in a DLRM step, a
millisecond one about as fast as alone, because what a step adds to a small kernel is mostly a
per-call cost (cold operands, allocation), while element-wise ops like gelu stay slower at
every size.
Both terms are fitted on log time with a soft-L1 loss, robust to the few ops a busy step
stretches by scheduling; factor in [0.5, 8], add_s >= 0. Fitted on a seeded split and scored
on the held-out rows against the isolated model alone (the baseline). An op never seen in a
step keeps factor 1, add 0. A workload may have factors of its own (`by_workload`: the
collectives', learned from that workload's captured steps and kept where its whole steps bear
them out, `predictors.step_fit.fit_steps`); an op some workload prices so is priced as in isolation
in a step of any other workload. Stored as plain JSON like every other model.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np
from scipy.optimize import least_squares

from predictors.evaluation import error_stats, split_by_op
from predictors.opmodels import ROBUST_LOG_SCALE, OpModel, Params
from probes.vocabulary.ops import IN_CONTEXT_OP
from probes.vocabulary.records import Measurement

MIN_ROWS = 5
CLIP = (0.5, 8.0)


class ContextFactorModel(OpModel):
    kind = "context_factors"

    def __init__(self, op: str = IN_CONTEXT_OP):
        super().__init__(op)
        self.factors: dict[str, float] = {}
        self.adds: dict[str, float] = {}  # seconds added per call inside a step
        self.counts: dict[str, int] = {}
        # workload -> op -> its steps' own factor (the collectives'); such an op prices no
        # other workload's step
        self.by_workload: dict[str, dict[str, float]] = {}
        self.workload_counts: dict[str, dict[str, int]] = {}

    def fit_against(self, rows: Sequence[Measurement], isolated: Any) -> "ContextFactorModel":
        """`isolated`: the bundle whose per-op models price the rows' params in isolation."""
        pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            op = str(r.params.get("model_op"))
            if op not in isolated.models or r.median_s <= 0:
                continue
            try:
                predicted = isolated.predict_params(op, _kernel_params(r.params))
            except KeyError:  # a group (dtype) the isolated probes never measured: nothing to relate it to
                continue
            if predicted > 0:
                pairs[op].append((predicted, r.median_s))
        self.factors, self.adds, self.counts = {}, {}, {}
        self.by_workload, self.workload_counts = {}, {}
        for op, v in pairs.items():
            if len(v) >= MIN_ROWS:
                self.factors[op], self.adds[op] = fit_affine(np.asarray(v))
                self.counts[op] = len(v)
        return self

    def fit(self, rows: Sequence[Measurement]) -> "ContextFactorModel":
        raise TypeError("ContextFactorModel is fitted against a bundle: use fit_context_factors")

    def set_workload(self, workload: str, factors: dict[str, float], counts: dict[str, int]) -> None:
        """`workload`'s own factors (replacing any it had)."""
        self.by_workload[workload], self.workload_counts[workload] = dict(factors), dict(counts)

    def drop_workload(self, workload: str) -> None:
        self.by_workload.pop(workload, None)
        self.workload_counts.pop(workload, None)

    def owned(self, op: str) -> bool:
        """Whether some workload has a factor of its own for `op`."""
        return any(op in factors for factors in self.by_workload.values())

    def factor(self, op: str, workload: str | None = None) -> float:
        """`op`'s factor in a step of `workload` (None: a step of no named workload, which no
        workload's own factor prices)."""
        own = self.by_workload.get(workload or "", {})
        if op in own:
            return own[op]
        if self.owned(op):
            return 1.0  # another workload's own: its steps, not this one's, bore it out
        return self.factors.get(op, 1.0)

    def add_s(self, op: str, workload: str | None = None) -> float:
        """Seconds added per call: the kernels' only (a workload's own factors add none)."""
        return 0.0 if self.owned(op) else self.adds.get(op, 0.0)

    def in_step(self, op: str, isolated_s: float, workload: str | None = None) -> float:
        """The kernel's time inside a training step of `workload`, from its isolated prediction."""
        return self.factor(op, workload) * isolated_s + self.add_s(op, workload)

    def predict(self, params: Params) -> float:
        """The op's multiplicative factor in a step of the params' workload (its per-call
        addition is `add_s`)."""
        workload = params.get("workload")
        return self.factor(str(params.get("model_op")), None if workload is None else str(workload))

    def out_of_range(self, params: Params) -> list[str]:
        op = str(params.get("model_op"))
        return (
            []
            if op in self.factors or self.owned(op)
            else [f"{self.op}: {op} never seen inside a training step; factor 1"]
        )

    def state(self) -> dict[str, Any]:
        return {
            "factors": self.factors,
            "adds": self.adds,
            "counts": self.counts,
            "by_workload": self.by_workload,
            "workload_counts": self.workload_counts,
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "ContextFactorModel":
        model = cls(data["op"])
        model.factors = {k: float(v) for k, v in data["factors"].items()}
        model.adds = {k: float(v) for k, v in data.get("adds", {}).items()}  # older bundles: ratios only
        model.counts = {k: int(v) for k, v in data.get("counts", {}).items()}
        model.by_workload = {w: {k: float(v) for k, v in f.items()} for w, f in data.get("by_workload", {}).items()}
        model.workload_counts = {
            w: {k: int(v) for k, v in c.items()} for w, c in data.get("workload_counts", {}).items()
        }
        for op, workloads in data.get("workloads", {}).items():  # 11-27 bundles: one factor, scoped
            factor, count = model.factors.pop(op, 1.0), model.counts.pop(op, 0)
            model.adds.pop(op, None)
            for w in workloads:
                model.by_workload.setdefault(w, {})[op] = factor
                model.workload_counts.setdefault(w, {})[op] = count
        return model


def fit_affine(pairs: np.ndarray) -> tuple[float, float]:
    """(factor, add_s) minimising soft-L1 of log(factor * isolated + add) - log(measured)."""
    predicted, measured = pairs[:, 0], pairs[:, 1]
    ratio = float(np.clip(np.exp(np.median(np.log(measured / predicted))), *CLIP))
    scale = float(np.median(measured))  # fit add in units of a typical call: well conditioned

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(x[0] * predicted + x[1] * scale) - np.log(measured)

    start = np.array([ratio, 0.0])
    fit = least_squares(
        resid, start, bounds=([CLIP[0], 0.0], [CLIP[1], np.inf]), loss="soft_l1", f_scale=ROBUST_LOG_SCALE
    )
    return float(fit.x[0]), float(fit.x[1] * scale)


def _kernel_params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in ("model_op", "aten_op", "workload")}


def fit_context_factors(model: Any, rows: Sequence[Measurement], seed: int = 0) -> list[Measurement]:
    """Add `in_context` factors to `model` from a seeded split of in-context rows; record
    held-out GMAE of in-context kernel times with the factors and without (the baseline).
    Returns the held-out rows (for reporting; they are not rows of any bundle op)."""
    # Split per model op so every op keeps rows on both sides.
    keyed = [
        Measurement(f"{IN_CONTEXT_OP}:{r.params.get('model_op')}", r.params, r.median_s, r.spread_s, r.repeats)
        for r in rows
    ]
    train_keyed, test_keyed = split_by_op(keyed, seed)
    train = [Measurement(IN_CONTEXT_OP, r.params, r.median_s, r.spread_s, r.repeats) for r in train_keyed]
    test = [Measurement(IN_CONTEXT_OP, r.params, r.median_s, r.spread_s, r.repeats) for r in test_keyed]
    factors = ContextFactorModel().fit_against(train, model)
    model.in_step = factors

    def errors(use_factor: bool) -> np.ndarray:
        out = []
        for r in test:
            op = str(r.params.get("model_op"))
            if op not in model.models:
                continue
            predicted = model.predict_params(op, _kernel_params(r.params))
            if use_factor:
                predicted = factors.in_step(op, predicted)
            out.append(abs(predicted - r.median_s) / r.median_s)
        return np.asarray(out)

    stats = error_stats(errors(True)).to_dict()
    stats["baseline_gmae"] = error_stats(errors(False)).gmae if len(test) else None
    stats["n_train"] = len(train)
    stats["factors"] = dict(factors.factors)
    stats["adds_us"] = {op: v * 1e6 for op, v in factors.adds.items()}
    model.metrics[IN_CONTEXT_OP] = stats
    return test
