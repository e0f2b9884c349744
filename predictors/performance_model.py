"""`PerformanceModel`: the bundle of everything fitted for one hardware_id, serialised as JSON.

`models` holds one `OpModel` per measured kernel or collective op. What corrects or completes
them is a typed field, never a pseudo-op: the host dispatch cost per op (`dispatch`), the
in-step factors of kernels inside a real training step (`in_step`), each workload's per-step
framework overhead (`step_overheads`), the overlapped pairs' fitted costs (`overlap`), the
symmetric-memory kernels' measured ratios (`symm_mem`) and the HFTA fusion curves (`fusion`).
`predictors.fit.fit_bundle` fills all of them from the measured rows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from predictors.context_model import ContextFactorModel
from predictors.evaluation import ErrorStats, error_stats, relative_errors
from predictors.fusion_model import FusionModel
from predictors.opmodels import OpModel
from predictors.overhead_model import OverheadModel
from predictors.overlap_model import OverlapCalibration
from probes.vocabulary.files import atomic_write_text
from probes.vocabulary.ops import CPU_OVERHEAD_OP, IN_CONTEXT_OP, STEP_OVERHEAD_OPS
from probes.vocabulary.records import Measurement

MODEL_FILE = "performance_model.json"
FORMAT_VERSION = 2


class OutOfRangeError(ValueError):
    """Asked to predict far outside what was measured, with `strict=True`."""


@dataclass
class PerformanceModel:
    hardware_id: str
    models: dict[str, OpModel]  # measured op -> its model
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # op -> held-out stats
    meta: dict[str, Any] = field(default_factory=dict)  # provenance: seed, rows, unfitted ops, software
    device_kind: str = "cpu"  # "cuda": kernels run asynchronously to their host thread
    sentinels: list[dict[str, Any]] = field(default_factory=list)  # probe points re-measured for drift
    dispatch: OverheadModel | None = None  # host time to issue one op, from captured steps
    in_step: ContextFactorModel | None = None  # kernel time in a real step / isolated
    step_overheads: dict[str, OpModel] = field(default_factory=dict)  # workload -> per-step overhead
    overlap: OverlapCalibration = field(default_factory=OverlapCalibration)
    symm_mem: dict[str, dict[str, float]] = field(default_factory=dict)  # pair -> fused / unfused ratio
    fusion: dict[str, FusionModel] = field(default_factory=dict)  # workload -> HFTA fusion curve
    # (measured, predicted) of each op's rows out of their fold, as the fit judged them (for the
    # calibration's plot); the fit's record, not the model's: never saved
    out_of_fold: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False, compare=False)

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

    @property
    def synchronous(self) -> bool:
        """CPU kernels and gloo collectives hold the issuing thread; CUDA kernels do not."""
        return self.device_kind != "cuda"

    def step_overhead_s(self, workload: str, params: dict[str, Any]) -> float:
        """The fitted per-step framework overhead of `workload` (0 when none was fitted)."""
        model = self.step_overheads.get(workload)
        return model.predict(params) if model is not None else 0.0

    def scored_models(self) -> dict[str, OpModel]:
        """Every model that held-out rows score, under the op its rows carry."""
        out: dict[str, OpModel] = dict(self.models)
        if self.dispatch is not None:
            out[CPU_OVERHEAD_OP] = self.dispatch
        for workload, model in self.step_overheads.items():
            out[STEP_OVERHEAD_OPS[workload]] = model
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "hardware_id": self.hardware_id,
            "device_kind": self.device_kind,
            "models": {op: m.to_dict() for op, m in sorted(self.models.items())},
            "dispatch": self.dispatch.to_dict() if self.dispatch else None,
            "in_step": self.in_step.to_dict() if self.in_step else None,
            "step_overheads": {w: m.to_dict() for w, m in sorted(self.step_overheads.items())},
            "overlap": self.overlap.to_dict(),
            "symm_mem": self.symm_mem,
            "fusion": {w: m.to_dict() for w, m in sorted(self.fusion.items())},
            "sentinels": self.sentinels,
            "metrics": self.metrics,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PerformanceModel":
        version = data.get("format_version")
        if version == 1:
            data = _upgrade_v1(data)
        elif version != FORMAT_VERSION:
            raise ValueError(f"unsupported performance model format {version!r}; expected 1 or {FORMAT_VERSION}")
        dispatch, in_step = data.get("dispatch"), data.get("in_step")
        return cls(
            hardware_id=data["hardware_id"],
            models={op: OpModel.from_dict(m) for op, m in data["models"].items()},
            metrics=data.get("metrics", {}),
            meta=data.get("meta", {}),
            device_kind=data.get("device_kind", "cpu"),
            sentinels=list(data.get("sentinels") or []),
            dispatch=_typed(OverheadModel, dispatch),
            in_step=_typed(ContextFactorModel, in_step),
            step_overheads={w: OpModel.from_dict(m) for w, m in data.get("step_overheads", {}).items()},
            overlap=OverlapCalibration.from_dict(data.get("overlap") or {}),
            symm_mem=data.get("symm_mem") or {},
            fusion={w: FusionModel.from_dict(m) for w, m in data.get("fusion", {}).items()},
        )

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MODEL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))
        return path

    @classmethod
    def load_dir(cls, directory: str | Path) -> "PerformanceModel":
        return cls.from_dict(json.loads((Path(directory) / MODEL_FILE).read_text()))

    def score(self, rows: Sequence[Measurement]) -> dict[str, ErrorStats]:
        """Held-out error of this bundle on `rows`, per op it models."""
        models = self.scored_models()
        by_op: dict[str, list[Measurement]] = defaultdict(list)
        for r in rows:
            if r.op in models:
                by_op[r.op].append(r)
        return {
            op: error_stats(relative_errors(models[op].predict, priced(models[op], rs))) for op, rs in by_op.items()
        }


def _typed(kind: type[OpModel], data: dict[str, Any] | None) -> Any:
    """Rebuild a correction model, refusing one of another kind (no code runs either way)."""
    if data is None:
        return None
    model = OpModel.from_dict(data)
    if not isinstance(model, kind):
        raise ValueError(f"expected a {kind.kind!r} model, got kind {data.get('kind')!r}")
    return model


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A format-1 bundle (corrections stored as pseudo-ops and meta keys) in format 2's shape,
    so bundles registered before the typed fields still load."""
    models = dict(data["models"])
    meta = dict(data.get("meta", {}))
    workloads = {op: w for w, op in STEP_OVERHEAD_OPS.items()}
    return {
        **data,
        "models": {op: m for op, m in models.items() if op not in (CPU_OVERHEAD_OP, IN_CONTEXT_OP, *workloads)},
        "dispatch": models.get(CPU_OVERHEAD_OP),
        "in_step": models.get(IN_CONTEXT_OP),
        "step_overheads": {workloads[op]: m for op, m in models.items() if op in workloads},
        "device_kind": meta.pop("device_kind", "cpu"),
        "sentinels": meta.pop("sentinels", []),
        "overlap": meta.pop("overlap", {}),
        "symm_mem": meta.pop("symm_mem", {}),
        "meta": meta,
    }


def priced(model: OpModel, rows: Sequence[Measurement]) -> list[Measurement]:
    """The rows `model` can price: a held-out row of a group (a dtype, a collective's group size
    and scope) that no training row had is left out of the score rather than crashing it."""
    return [r for r, _ in predictions(model, rows)]


def predictions(model: OpModel, rows: Sequence[Measurement]) -> list[tuple[Measurement, float]]:
    """Each row `model` can price (`priced`) with its predicted seconds, each predicted once."""
    out = []
    for r in rows:
        try:
            out.append((r, model.predict(r.params)))
        except KeyError:
            continue
    return out
