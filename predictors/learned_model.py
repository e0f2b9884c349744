"""Kernel models that learn what a roofline cannot: log time = log base(x) + f(x).

`base` is the additive roofline-shaped `LinearCostModel` (launch + per-flop + per-byte ...),
which extrapolates sanely; `f` is an ML regressor on log-scaled shape features (and, for
embedding lookups, the 17 reuse-factor bins) that corrects it where cache, vectorisation and
threading effects bend the curve. An MLP and gradient-boosted trees are both fitted on a
seeded split of the training rows; the one with the lower validation GMAE is kept and refitted
on all training rows, unless the base alone validates better (then no correction is used). Outside the measured range the base model's range check applies.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from predictors.features import design_row
from predictors.opmodels import GroupedCostModel, LinearCostModel, OpModel
from predictors.regressors import ArrayMLP, ArrayTrees, RegressorKind, regressor_from_dict
from probes.vocabulary.records import Measurement

CANDIDATES: dict[str, RegressorKind] = {"mlp": ArrayMLP, "gbt": ArrayTrees}
# Below this many training rows a validation split leaves too little to fit or judge a
# regressor (the MLP's own early-stopping split needs several rows), so the base is used alone.
MIN_ROWS_FOR_CORRECTION = 20


def _gmae(pred_log: np.ndarray, true_log: np.ndarray) -> float:
    err = np.abs(np.expm1(pred_log - true_log))
    return float(np.exp(np.mean(np.log(np.maximum(err, 1e-6)))))


class LearnedKernelModel(OpModel):
    kind = "learned_kernel"

    def __init__(
        self,
        op: str,
        base_features: Sequence[str],
        design: Sequence[str],
        seed: int = 0,
        group_by: tuple[str, str] | None = None,
    ):
        """`group_by` = (param, default value): fit the base per value of that param."""
        super().__init__(op)
        self.base: LinearCostModel | GroupedCostModel = (
            GroupedCostModel(op, base_features, *group_by) if group_by else LinearCostModel(op, base_features)
        )
        self.design = list(design)
        self.seed = seed
        self.regressor: Any = None
        self.chosen = "base"
        self.validation: dict[str, float] = {}

    def _x(self, rows_params: Sequence[dict[str, Any]]) -> np.ndarray:
        x = np.array([design_row(self.design, p) for p in rows_params], dtype=np.float64)
        base = np.log(np.maximum([self.base.predict(p) for p in rows_params], 1e-12))
        return np.column_stack([x, base])

    def fit(self, rows: Sequence[Measurement]) -> "LearnedKernelModel":
        self.base.fit(rows)
        params = [r.params for r in rows]
        x = self._x(params)
        y_log = np.log([r.median_s for r in rows])
        target = y_log - x[:, -1]
        if len(rows) < MIN_ROWS_FOR_CORRECTION:
            self.chosen, self.regressor = "base", None
            self.validation = {"base": _gmae(x[:, -1], y_log)}
            return self
        order = np.random.default_rng(self.seed).permutation(len(rows))
        n_val = max(1, len(rows) // 5)
        val, train = order[:n_val], order[n_val:]
        for name, cls in CANDIDATES.items():
            reg = cls.fit(x[train], target[train], seed=self.seed)
            self.validation[name] = _gmae(x[val, -1] + reg.predict(x[val]), y_log[val])
        self.validation["base"] = _gmae(x[val, -1], y_log[val])
        best = min(self.validation, key=lambda n: self.validation[n])
        self.chosen = best
        self.regressor = CANDIDATES[best].fit(x, target, seed=self.seed) if best in CANDIDATES else None
        return self

    def _correction(self, x: np.ndarray) -> np.ndarray:
        return self.regressor.predict(x) if self.regressor is not None else np.zeros(len(x))

    def predict(self, params: dict[str, Any]) -> float:
        x = self._x([params])
        return float(np.exp(x[0, -1] + self._correction(x)[0]))

    def predict_many(self, params: Sequence[dict[str, Any]]) -> np.ndarray:
        x = self._x(params)
        return np.exp(x[:, -1] + self._correction(x))

    def out_of_range(self, params: dict[str, Any]) -> list[str]:
        return self.base.out_of_range(params)

    def state(self) -> dict[str, Any]:
        return {
            "base": self.base.to_dict(),
            "design": self.design,
            "seed": self.seed,
            "chosen": self.chosen,
            "validation": self.validation,
            "regressor": self.regressor.to_dict() if self.regressor is not None else None,
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "LearnedKernelModel":
        model = cls(data["op"], data["base"]["features"], data["design"], data.get("seed", 0))
        model.base = OpModel.from_dict(data["base"])  # type: ignore[assignment]
        model.regressor = regressor_from_dict(data["regressor"]) if data.get("regressor") else None
        model.chosen = data.get("chosen", "base")
        model.validation = data.get("validation", {})
        return model


GEMM_DESIGN = [
    "log:M",
    "log:N",
    "log:K",
    "log:batch",
    "log:flops",
    "log:bytes",
    "log:arith_intensity",
    "is:dtype=float32",
    "is:dtype=bfloat16",
    "is:dtype=float16",
    "is:variant=addmm",
    "is:variant=bmm",
    "is:variant=baddbmm",
]
EMBEDDING_DESIGN = [
    "log:tables",
    "log:B",
    "log:D_sum",
    "log:E_sum",
    "log:L_mean",
    "log:lookups",
    "log:gathered_elems",
    "log:output_elems",
    "log:distinct_elems",
    "log:table_elems",
    "hist:reuse_hist",
]
ROW_OP_DESIGN = ["log:rows", "log:cols", "log:numel", "log:bytes"]
