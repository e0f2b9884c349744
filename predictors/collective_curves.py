"""Collective models per measured group (group size and scope), serialised as plain data.

- `CurveModel`: per (group size, scope) the measured time-vs-bytes curve, interpolated in
  log-log space; beyond the largest size it extends with the last measured bandwidth.
- `AlphaBetaModel`: t = alpha + bytes * beta per group, the baseline collectives must beat.
- `GroupCurveModel`: what they (and `collective_model.SigmoidCollectiveModel`) share: a curve
  per group, fitted group by group.

`group_key` / `curve_key` name the measured group a collective's params fall in;
`UncalibratedGroupError` is a collective over a group that was never measured.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import defaultdict
from typing import Any, Generic, Sequence, TypeVar

import numpy as np
from sklearn.isotonic import IsotonicRegression

from predictors.opmodels import LinearCostModel, OpModel, Params
from probes.vocabulary.records import Measurement

Curve = TypeVar("Curve")  # what a group's fit gives: arrays, a line, a sigmoid


def group_key(params: Params) -> str:
    """A collective's curve: group size and scope; an uneven all-to-all (per-pair splits that
    differ, measured at its largest per-rank send or receive) has curves of its own."""
    key = f"{int(params['world'])}:{params.get('scope', 'intra')}"
    return key + ":uneven" if params.get("uneven") else key


def rows_by_group(rows: Sequence[Measurement]) -> dict[str, list[Measurement]]:
    """A collective's rows by `group_key`: each group has a curve of its own."""
    grouped: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        grouped[group_key(r.params)].append(r)
    return grouped


class UncalibratedGroupError(KeyError):
    """A collective over a group (size, scope) the calibration never measured. A KeyError, so
    a candidate plan that needs it is listed as unpriceable; its message says what to
    calibrate, because guessing the curve of another scope would be off by the network."""

    def __init__(self, key: str, measured: Sequence[str], op: str = ""):
        self.key, self.measured, self.op = key, sorted(measured), op
        world, scope = (key.split(":") + ["", ""])[:2]
        where = "on one node" if scope == "intra" else "spanning nodes"
        super().__init__(
            f"{op + ': ' if op else ''}no measurements for group {key} ({world} ranks {where}); measured groups: "
            f"{', '.join(self.measured) or 'none'}. Calibrate on a cluster that holds a group of {world} ranks "
            f"{where} (python -m orchestrator.cli.calibrate --ray-address <cluster>), or choose a world_size whose "
            f"groups were measured"
        )

    def __str__(self) -> str:  # KeyError's own quotes its message
        return str(self.args[0])

    def with_op(self, op: str) -> "UncalibratedGroupError":
        return UncalibratedGroupError(self.key, self.measured, op)


def curve_key(curves: Any, params: Params) -> str:
    """The measured group for `params`: its own, or for an uneven all-to-all with no uneven
    measurements, the even curve of the same group size and scope."""
    key = group_key(params)
    if key not in curves and params.get("uneven"):
        key = group_key({**params, "uneven": False})
    if key not in curves:
        raise UncalibratedGroupError(key, list(curves))
    return key


class GroupCurveModel(OpModel, Generic[Curve]):
    """A collective model of one curve per rank group (`group_key`): fitted group by group
    (`fit_curve`); a prediction reads its group's curve (`curve_key`), and a group never
    measured is refused naming what to calibrate."""

    def __init__(self, op: str):
        super().__init__(op)
        self.curves: dict[str, Curve] = {}

    @abstractmethod
    def fit_curve(self, rows: Sequence[Measurement]) -> Curve:
        """One group's curve from its rows."""

    def fit(self, rows: Sequence[Measurement]) -> "GroupCurveModel[Curve]":
        self.curves = {key: self.fit_curve(items) for key, items in rows_by_group(rows).items()}
        return self

    def _curve(self, params: Params) -> Curve:
        try:
            return self.curves[curve_key(self.curves, params)]
        except UncalibratedGroupError as exc:
            raise exc.with_op(self.op) from None

    def _beyond(self, params: Params, log2_max: float) -> list[str]:
        """Why `params` lies far beyond the largest message measured (empty when it does not)."""
        if np.log2(max(float(params["bytes"]), 1.0)) > log2_max + 2:
            return [f"{self.op}.bytes={params['bytes']:.3g} beyond measured max {2**log2_max:.3g}"]
        return []


class CurveModel(GroupCurveModel[tuple[np.ndarray, np.ndarray]]):
    """Measured latency curve per collective group: isotonic in log2(bytes)-log(time).

    Isotonic regression (time never falls as messages grow) averages noise away instead of
    following it; the fitted step points are stored as plain arrays and interpolated.
    """

    kind = "loglog_curve"

    def fit_curve(self, rows: Sequence[Measurement]) -> tuple[np.ndarray, np.ndarray]:
        points: dict[float, list[float]] = defaultdict(list)
        for r in rows:
            points[np.log2(r.params["bytes"])].append(np.log(r.median_s))
        xs = np.array(sorted(points))
        ys = np.array([np.median(points[x]) for x in xs])
        return xs, np.asarray(IsotonicRegression(increasing=True).fit_transform(xs, ys), dtype=np.float64)

    def predict(self, params: Params) -> float:
        xs, ys = self._curve(params)
        x = np.log2(max(float(params["bytes"]), 1.0))
        if x <= xs[0]:
            return float(np.exp(ys[0]))
        if x >= xs[-1] and len(xs) >= 2:
            # Extend with the bandwidth of the last measured step: t grows linearly in bytes.
            t_last, t_prev = np.exp(ys[-1]), np.exp(ys[-2])
            per_byte = max((t_last - t_prev) / (2 ** xs[-1] - 2 ** xs[-2]), 0.0)
            return float(t_last + per_byte * (2**x - 2 ** xs[-1]))
        return float(np.exp(np.interp(x, xs, ys)))

    def out_of_range(self, params: Params) -> list[str]:
        try:
            xs, _ = self._curve(params)
        except KeyError as exc:
            return [exc.args[0]]
        return self._beyond(params, float(xs[-1]))

    def state(self) -> dict[str, Any]:
        return {
            "curves": {
                k: {"log2_bytes": xs.tolist(), "log_seconds": ys.tolist()} for k, (xs, ys) in self.curves.items()
            }
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "CurveModel":
        model = cls(data["op"])
        model.curves = {
            k: (np.asarray(v["log2_bytes"]), np.asarray(v["log_seconds"])) for k, v in data["curves"].items()
        }
        return model


class AlphaBetaModel(GroupCurveModel[LinearCostModel]):
    """t = alpha + beta * bytes per group, fitted on relative error: the collective baseline."""

    kind = "alpha_beta"

    def fit_curve(self, rows: Sequence[Measurement]) -> LinearCostModel:
        return LinearCostModel(self.op, ["one", "bytes"]).fit(rows)

    def predict(self, params: Params) -> float:
        return self._curve(params).predict(params)

    def out_of_range(self, params: Params) -> list[str]:
        try:
            return self._curve(params).out_of_range(params)
        except KeyError as exc:
            return [exc.args[0]]

    def state(self) -> dict[str, Any]:
        return {"groups": {k: m.to_dict() for k, m in self.curves.items()}}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> "AlphaBetaModel":
        model = cls(data["op"])
        model.curves = {k: LinearCostModel._from_dict(v) for k, v in data["groups"].items()}
        return model
