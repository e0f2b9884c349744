"""Kernel models that learn what a roofline cannot: log time = log base(x) + f(x).

`base` is the additive roofline-shaped `LinearCostModel` (launch + per-flop + per-byte ...),
which extrapolates sanely; `f` is an ML regressor on log-scaled shape features (and, for
embedding lookups, the 17 reuse-factor bins) that corrects it where cache, vectorisation and
threading effects bend the curve. Which of these predicts is chosen on rows the candidates
were not fitted on: an MLP correction, gradient-boosted trees, the base alone, or the op's
plain `baseline` (the simple model it is scored against) when one is given. A correction is
kept only where it pays: the choice is made by 5-fold cross-validation (one 20% split of a
few dozen rows judged a correction by a handful of points, and one calibration kept a
correction that was 12.7% off held out against 2.6% for the baseline), the same folds and
test at every size (under `MIN_ROWS_FOR_CORRECTION` rows only the base and the baseline
compete); and a candidate must beat the plain model by more than `CHOICE_SE` standard errors
of its gain (picking the best of several flatters it), the folds' standard error corrected
for the training rows they share (`evaluation.clearly_better_folds`). The winner is refitted
on every training row. Outside the measured range the base model's range check applies.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from predictors.evaluation import clearly_better_folds
from predictors.features import design_row
from predictors.opmodels import GroupedCostModel, LinearCostModel, OpModel
from predictors.regressors import ArrayMLP, ArrayTrees, RegressorKind, regressor_from_dict
from probes.vocabulary.records import Measurement

CANDIDATES: dict[str, RegressorKind] = {"mlp": ArrayMLP, "gbt": ArrayTrees}
# Below this many training rows a validation split leaves too little to fit or judge a
# regressor (an element-wise op's 7 inputs; 5 folds of under 8 rows each), so only the base
# and the baseline compete, on the same folds. At 20, a 600 s calibration's element-wise ops
# (21-27 training rows each) took corrections that lost on their held-out rows (gelu_bwd's MLP
# 3.9x its roofline's error); refitting eight stored calibrations at 40 left every one's
# element-wise family at or under its baseline, against one of eight above it at 20
# (`benchmarks/correction_rows.py`).
MIN_ROWS_FOR_CORRECTION = 40
# The choice is cross-validated (every row validates once) at any size. One 20% split, used
# above 200 rows before, let the MLP through in one of the family judge's five folds of the
# 11-27 02:44 calibration's embedding backward (336 rows), where it lost on the rows it had not
# seen: the embedding family held out 1.005x its baseline's error, 1.000x with this (its refit
# 270 s, the fit before ~250 s; `python -m orchestrator.cli.calibrate --refit DIR`).
FOLDS = 5
# How many standard errors a candidate must gain over the plain model to be chosen: three are
# compared with it (MLP, trees, base), and a one-sided 5% test corrected for three
# comparisons (Bonferroni) needs ~2.1. Over the rows of all folds as if independent, this
# let a default 120 s calibration's embedding backward take trees in one of the family
# judge's five folds and GEMM its base in two, and both families held out 1.05x their
# baselines; with the folds' corrected error (`clearly_better_folds`) 1.00x and 0.90x (with
# seed 1, GEMM 1.16x -> 1.00x), and 600 s calibrations keep most of their gains (one's
# embedding family 0.87x -> 0.95x; `benchmarks/choice_rules.py`, #26). Against 5 folds the
# threshold is Student's t at the same confidence (2.87): with 2.0 itself, another default
# calibration (11-28 16:56) held embedding and GEMM out at 1.01x and 1.02x, with t 1.00x both.
# Under 40 rows the base and the baseline used to be judged on each row left out in turn, a
# per-row test; they are judged on the folds now, one rule for every size (the stored default
# and 600 s calibrations refit to the same families, `benchmarks/choice_rules.py`).
CHOICE_SE = 2.0


def _gmae(pred_log: np.ndarray, true_log: np.ndarray) -> float:
    return _gmae_of(np.abs(np.expm1(pred_log - true_log)))


def _gmae_of(errors: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(errors, 1e-6)))))


def _prices(model: OpModel, row: Measurement) -> bool:
    try:
        model.predict(row.params)
    except KeyError:  # a group (dtype, precision) the model's rows never had
        return False
    return True


def _choose(errors: dict[str, list[np.ndarray]]) -> str:
    """The candidate that predicts the validation rows best, if it beats the plain model (the
    baseline, else the base) by more than `CHOICE_SE` standard errors of the paired log errors
    (`clearly_better_folds`); else the plain model. The best of several candidates validates a
    little better than it will predict (it was picked for it), and a held-out set of a few
    dozen rows cannot tell a small gain from that luck. `errors`: each candidate's errors, one
    array per cross-validation fold."""
    if not errors:
        return "base"
    joined = {name: np.concatenate(errs) for name, errs in errors.items()}
    best = min(joined, key=lambda n: _gmae_of(joined[n]))
    reference = "baseline" if "baseline" in joined else "base"
    if best == reference or reference not in joined:
        return best
    log_error = lambda name: [np.log(np.maximum(e, 1e-6)) for e in errors[name]]  # noqa: E731
    return best if clearly_better_folds(log_error(reference), log_error(best), CHOICE_SE) else reference


class LearnedKernelModel(OpModel):
    kind = "learned_kernel"

    def __init__(
        self,
        op: str,
        base_features: Sequence[str],
        design: Sequence[str],
        seed: int = 0,
        group_by: tuple[str, str] | None = None,
        baseline: Callable[[], OpModel] | None = None,
    ):
        """`group_by` = (param, default value): fit the base per value of that param.
        `baseline`: makes the op's plain model, a candidate the learned model must beat."""
        super().__init__(op)
        self.base_features, self.group_by, self.make_baseline = list(base_features), group_by, baseline
        self.base: LinearCostModel | GroupedCostModel = self._new_base()
        self.design = list(design)
        self.seed = seed
        self.regressor: Any = None
        self.fallback: OpModel | None = None  # the baseline, when it won the choice
        self.chosen = "base"
        self.validation: dict[str, float] = {}

    def _new_base(self) -> LinearCostModel | GroupedCostModel:
        if self.group_by:
            return GroupedCostModel(self.op, self.base_features, *self.group_by)
        return LinearCostModel(self.op, self.base_features)

    def _x(self, rows_params: Sequence[dict[str, Any]], base: OpModel | None = None) -> np.ndarray:
        base = base or self.base
        x = np.array([design_row(self.design, p) for p in rows_params], dtype=np.float64)
        base_log = np.log(np.maximum([base.predict(p) for p in rows_params], 1e-12))
        return np.column_stack([x, base_log])

    def fit(self, rows: Sequence[Measurement]) -> "LearnedKernelModel":
        self.base = self._new_base().fit(rows)
        self.regressor = self.fallback = None
        y_log = np.log([r.median_s for r in rows])
        learn = len(rows) >= MIN_ROWS_FOR_CORRECTION
        if not learn and self.make_baseline is None:  # the base alone: nothing to choose between
            self.chosen, self.validation = "base", {"base": _gmae(self._x([r.params for r in rows])[:, -1], y_log)}
            return self
        errors: dict[str, list[np.ndarray]] = {}
        for train, val in self._splits(len(rows)):
            try:
                judged = self._validate([rows[i] for i in train], [rows[i] for i in val], learn)
            except (ValueError, KeyError):  # this fold's share leaves some candidate unfittable: skip it
                continue
            for name, err in judged.items():
                errors.setdefault(name, []).append(err)
        self.validation = {name: _gmae_of(np.concatenate(errs)) for name, errs in errors.items()}
        if learn or errors:
            self.chosen = _choose(errors)
        else:  # no fold could fit and price both: too few rows to judge, the simpler model it is
            self.chosen = "baseline"
        if self.chosen in CANDIDATES:
            x = self._x([r.params for r in rows])
            self.regressor = CANDIDATES[self.chosen].fit(x, y_log - x[:, -1], seed=self.seed)
        elif self.chosen == "baseline" and self.make_baseline is not None:
            try:
                self.fallback = self.make_baseline().fit(rows)
            except (ValueError, KeyError):  # not even the baseline fits these rows: the base it is
                self.chosen = "base"
        return self

    def _splits(self, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        order = np.random.default_rng(self.seed).permutation(n)
        folds = np.array_split(order, FOLDS)
        return [(np.concatenate(folds[:k] + folds[k + 1 :]), folds[k]) for k in range(FOLDS)]

    def _validate(
        self, train: Sequence[Measurement], val: Sequence[Measurement], learn: bool = True
    ) -> dict[str, np.ndarray]:
        """Each candidate fitted on `train`, its relative errors on the `val` rows every
        candidate can price (a group absent from `train` is left out for all of them). Without
        `learn` (too few rows for a correction), only the base and the baseline."""
        base = self._new_base().fit(train)
        baseline = self.make_baseline().fit(train) if self.make_baseline is not None else None
        val = [r for r in val if _prices(base, r) and (baseline is None or _prices(baseline, r))]
        if not val:
            return {}
        x_train, x_val = self._x([r.params for r in train], base), self._x([r.params for r in val], base)
        y_train, y_val = np.log([r.median_s for r in train]), np.log([r.median_s for r in val])
        predicted = {"base": x_val[:, -1]}
        for name, cls in CANDIDATES.items() if learn else ():
            reg = cls.fit(x_train, y_train - x_train[:, -1], seed=self.seed)
            predicted[name] = x_val[:, -1] + reg.predict(x_val)
        if baseline is not None:
            predicted["baseline"] = np.log(np.maximum([baseline.predict(r.params) for r in val], 1e-12))
        return {name: np.abs(np.expm1(p - y_val)) for name, p in predicted.items()}

    def _correction(self, x: np.ndarray) -> np.ndarray:
        return self.regressor.predict(x) if self.regressor is not None else np.zeros(len(x))

    def predict(self, params: dict[str, Any]) -> float:
        if self.fallback is not None:
            return self.fallback.predict(params)
        if self.regressor is None:  # the base itself: its price, not its price's log exponentiated
            return self.base.predict(params)
        x = self._x([params])
        return float(np.exp(x[0, -1] + self._correction(x)[0]))

    def predict_many(self, params: Sequence[dict[str, Any]]) -> np.ndarray:
        if self.fallback is not None:
            return np.array([self.fallback.predict(p) for p in params])
        if self.regressor is None:
            return np.array([self.base.predict(p) for p in params])
        x = self._x(params)
        return np.exp(x[:, -1] + self._correction(x))

    def out_of_range(self, params: dict[str, Any]) -> list[str]:
        return (self.fallback or self.base).out_of_range(params)

    def state(self) -> dict[str, Any]:
        return {
            "base": self.base.to_dict(),
            "design": self.design,
            "seed": self.seed,
            "chosen": self.chosen,
            "validation": self.validation,
            "regressor": self.regressor.to_dict() if self.regressor is not None else None,
            "fallback": self.fallback.to_dict() if self.fallback is not None else None,
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "LearnedKernelModel":
        model = cls(data["op"], data["base"]["features"], data["design"], data.get("seed", 0))
        model.base = OpModel.from_dict(data["base"])  # type: ignore[assignment]
        model.regressor = regressor_from_dict(data["regressor"]) if data.get("regressor") else None
        model.fallback = OpModel.from_dict(data["fallback"]) if data.get("fallback") else None
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
