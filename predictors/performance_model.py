"""`PerformanceModel`: op → fitted `OpModel`, for one hardware_id, serialised as JSON."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from predictors.evaluation import ErrorStats, error_stats, relative_errors, split_by_op
from predictors.families import baseline_model_for, default_model_for
from predictors.opmodels import OpModel
from probes.vocabulary.files import atomic_write_text
from probes.vocabulary.records import Measurement

MODEL_FILE = "performance_model.json"
FORMAT_VERSION = 1


class OutOfRangeError(ValueError):
    """Asked to predict far outside what was measured, with `strict=True`."""


@dataclass
class PerformanceModel:
    hardware_id: str
    models: dict[str, OpModel]
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # op → held-out stats
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, op: str, strict: bool = False, **params: Any) -> float:
        """Seconds for one `op` with `params`; `strict` refuses far extrapolation."""
        return self.predict_params(op, params, strict)

    def predict_params(self, op: str, params: dict[str, Any], strict: bool = False) -> float:
        """`predict` for a params dict as probes record it (which may hold an `op` key)."""
        if op not in self.models:
            raise KeyError(f"no model for op {op!r}; this bundle has {sorted(self.models)}")
        model = self.models[op]
        if strict:
            problems = model.out_of_range(params)
            if problems:
                raise OutOfRangeError("; ".join(problems))
        return model.predict(params)

    def out_of_range(self, op: str, **params: Any) -> list[str]:
        return self.models[op].out_of_range(params)

    @property
    def ops(self) -> list[str]:
        return sorted(self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "hardware_id": self.hardware_id,
            "models": {op: m.to_dict() for op, m in sorted(self.models.items())},
            "metrics": self.metrics,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PerformanceModel":
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported performance model format {data.get('format_version')!r}")
        return cls(
            hardware_id=data["hardware_id"],
            models={op: OpModel.from_dict(m) for op, m in data["models"].items()},
            metrics=data.get("metrics", {}),
            meta=data.get("meta", {}),
        )

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MODEL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))
        return path

    @classmethod
    def load_dir(cls, directory: str | Path) -> "PerformanceModel":
        return cls.from_dict(json.loads((Path(directory) / MODEL_FILE).read_text()))

    @classmethod
    def load(cls, tracking_uri: str | None, hardware_id: str, alias: str = "champion") -> "PerformanceModel":
        """The registered bundle for `hardware_id` under `alias`, read as JSON (no code runs)."""
        from orchestrator.registry import load_performance_model  # the MLflow side lives there

        return load_performance_model(tracking_uri, hardware_id, alias)

    def score(self, rows: Sequence[Measurement]) -> dict[str, ErrorStats]:
        """Held-out error of this bundle on `rows`, per op it models."""
        by_op: dict[str, list[Measurement]] = defaultdict(list)
        for r in rows:
            if r.op in self.models:
                by_op[r.op].append(r)
        return {op: error_stats(relative_errors(self.models[op].predict, priced(self.models[op], rs)))
                for op, rs in by_op.items()}


def priced(model: OpModel, rows: Sequence[Measurement]) -> list[Measurement]:
    """The rows `model` can price: a held-out row of a group (a dtype, a collective's group size
    and scope) that no training row had is left out of the score rather than crashing it."""
    out = []
    for r in rows:
        try:
            model.predict(r.params)
        except KeyError:
            continue
        out.append(r)
    return out


def fit_performance_model(
    rows: Sequence[Measurement], hardware_id: str, seed: int = 0, test_fraction: float = 0.2
) -> tuple[PerformanceModel, list[Measurement]]:
    """Fit every measured op on a seeded split; return the bundle and the held-out rows.

    The registered bundle is the one fitted on the training split, so the metrics it carries
    describe exactly the model that is used.
    """
    train, test = split_by_op(rows, seed, test_fraction)
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in train:
        by_op[r.op].append(r)
    test_by_op: dict[str, list[Measurement]] = defaultdict(list)
    for r in test:
        test_by_op[r.op].append(r)

    models: dict[str, OpModel] = {}
    metrics: dict[str, dict[str, Any]] = {}
    unfitted: dict[str, str] = {}
    for op, op_rows in sorted(by_op.items()):
        try:
            model = default_model_for(op, seed).fit(op_rows)
        except (ValueError, KeyError) as exc:  # too few or degenerate rows: report the op, keep the rest
            unfitted[op] = f"{len(op_rows)} training rows: {exc}"
            continue
        models[op] = model
        held_out = priced(model, test_by_op[op])
        stats = error_stats(relative_errors(model.predict, held_out)).to_dict()
        stats["n_unpriced"] = len(test_by_op[op]) - len(held_out)  # held-out rows of a group no training row had
        baseline = baseline_model_for(op)
        if baseline is not None and held_out:
            try:
                baseline.fit(op_rows)
                stats["baseline_gmae"] = error_stats(relative_errors(baseline.predict, priced(baseline, held_out))).gmae
            except (ValueError, KeyError):
                stats["baseline_gmae"] = None
        stats["n_train"] = len(op_rows)
        metrics[op] = stats
    meta = {"seed": seed, "test_fraction": test_fraction, "n_rows": len(rows), "unfitted": unfitted}
    return PerformanceModel(hardware_id, models, metrics, meta), test
