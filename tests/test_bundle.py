"""`fit_bundle`: rows of every kind -> one bundle whose corrections are typed fields, stored as
plain JSON, and bundles stored before the typed fields still load."""

import json

import numpy as np
import pytest
from synthetic_rows import gemm_rows

from predictors import PerformanceModel, fit_bundle, fit_performance_model
from predictors.context_model import ContextFactorModel
from predictors.opmodels import fit_linear_or_constant
from predictors.overhead_model import OverheadModel
from probes.vocabulary.ops import CPU_OVERHEAD_OP, IN_CONTEXT_OP, gemm_params
from probes.vocabulary.records import Measurement


def overhead_rows() -> list[Measurement]:
    return [
        Measurement(
            CPU_OVERHEAD_OP,
            {"kind": kind, "aten_op": op, "workload": "dlrm"},
            p50,
            0.0,
            50,
            extra={"p10": p50 * 0.8, "p90": p50 * 1.5, "count": 50},
        )
        for kind, p50 in (("dispatch", 4e-6), ("gap", 2e-6))
        for op in ("aten::mm", "*")
    ]


def in_step_rows(rng: np.random.Generator, isolated) -> list[Measurement]:
    rows = []
    for _ in range(30):
        m, n, k = (int(x) for x in rng.integers(16, 512, size=3))
        p = gemm_params(m, n, k)
        rows.append(
            Measurement(
                IN_CONTEXT_OP,
                {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
                1.5 * isolated(p),
                0.0,
                1,
            )
        )
    return rows


@pytest.fixture(scope="module")
def bundle() -> tuple[PerformanceModel, list[Measurement]]:
    rng = np.random.default_rng(3)
    kernels = gemm_rows(rng, 60)
    # the kernels' isolated prices: the GEMM model a bundle of these rows alone fits (judged by
    # two folds, not five: the model fitted on every row is the same, its scores are not read)
    plain, _ = fit_performance_model(kernels, "hw", folds=2)
    rows = kernels + overhead_rows() + in_step_rows(rng, lambda p: plain.predict_params("gemm", p))
    return fit_bundle(rows, "hw", seed=0, device_kind="cuda", sentinels=[{"family": "gemm", "params": {}, "key": "s"}])


def test_corrections_are_typed_fields_not_pseudo_ops(bundle):
    model, held_out = bundle
    assert model.ops == ["gemm"]  # only measured kernels are ops
    assert isinstance(model.dispatch, OverheadModel) and isinstance(model.in_step, ContextFactorModel)
    assert model.in_step.factor("gemm") == pytest.approx(1.5, rel=0.05)
    assert model.device_kind == "cuda" and not model.synchronous
    assert model.sentinels == [{"family": "gemm", "params": {}, "key": "s"}]
    assert model.step_overheads == {} and model.overlap.pairs == {} and model.symm_mem == {} and model.fusion == {}
    assert model.step_overhead_s("dlrm", {}) == 0.0  # nothing fitted: no overhead
    # held-out rows score the dispatch model under its op, as the champion comparison needs
    assert {r.op for r in held_out} == {"gemm", CPU_OVERHEAD_OP}
    assert set(model.score(held_out)) == {"gemm", CPU_OVERHEAD_OP}


def test_the_bundle_is_plain_json_and_round_trips(bundle, tmp_path):
    model, _ = bundle
    model.save(tmp_path)
    data = json.loads((tmp_path / "performance_model.json").read_text())
    assert data["format_version"] == 2 and data["device_kind"] == "cuda"
    assert set(data["models"]) == {"gemm"} and data["dispatch"]["kind"] and data["in_step"]["kind"]
    loaded = PerformanceModel.load_dir(tmp_path)
    p = gemm_params(100, 200, 300)
    assert loaded.predict_params("gemm", p) == model.predict_params("gemm", p)
    assert loaded.in_step.factor("gemm") == model.in_step.factor("gemm")
    assert loaded.dispatch.predict({"kind": "dispatch", "aten_op": "*"}) == model.dispatch.predict(
        {"kind": "dispatch", "aten_op": "*"}
    )


def test_a_format_1_bundle_loads_into_the_typed_fields(bundle):
    model, _ = bundle
    v2 = model.to_dict()
    step_overhead = fit_linear_or_constant("dlrm_overhead", ["one"], [Measurement("dlrm_overhead", {}, 1e-3, 0.0, 5)])
    v1 = {
        "format_version": 1,
        "hardware_id": "hw",
        "metrics": v2["metrics"],
        "models": {
            **v2["models"],
            CPU_OVERHEAD_OP: v2["dispatch"],
            IN_CONTEXT_OP: v2["in_step"],
            "dlrm_overhead": step_overhead.to_dict(),
        },
        "meta": {
            "seed": 0,
            "device_kind": "cuda",
            "sentinels": v2["sentinels"],
            "symm_mem": {"gemm_all_reduce": {"ratio": 0.8, "n": 3}},
            "overlap": {},
        },
    }
    old = PerformanceModel.from_dict(v1)
    assert old.ops == ["gemm"] and old.device_kind == "cuda" and old.sentinels == v2["sentinels"]
    assert isinstance(old.dispatch, OverheadModel) and isinstance(old.in_step, ContextFactorModel)
    assert set(old.step_overheads) == {"dlrm"} and old.symm_mem["gemm_all_reduce"]["ratio"] == 0.8
    assert old.meta == {"seed": 0}


def test_an_unknown_format_or_a_mistyped_correction_is_refused(bundle):
    model, _ = bundle
    with pytest.raises(ValueError, match="unsupported performance model format 7"):
        PerformanceModel.from_dict({**model.to_dict(), "format_version": 7})
    with pytest.raises(ValueError, match="expected a 'context_factors' model|expected a"):
        PerformanceModel.from_dict({**model.to_dict(), "in_step": model.to_dict()["dispatch"]})


def test_fusion_curves_fitted_from_width_rows_round_trip_with_the_bundle(tmp_path):
    # issue #24: the fusion model travels in the hardware's bundle like the other models
    from probes.vocabulary.ops import FUSION_OP

    def width_row(width: int) -> Measurement:
        speed = 900.0 * width / (1 + 0.1 * width + 0.004 * width * width)
        params = {"workload": "pointnet", "batch_size": 32, "optimizer": "adam", "width": width}
        extra = {"samples_per_s": speed, "peak_memory_bytes": 2e8 + 3e7 * width}
        return Measurement(FUSION_OP, params, width * 32 / speed, 0.0, 5, family="fusion", extra=extra)

    rows = gemm_rows(np.random.default_rng(5), 40) + [width_row(w) for w in (1, 2, 4, 8, 16, 32)]
    model, _ = fit_bundle(rows, "hw", seed=0)
    assert set(model.fusion) == {"pointnet"} and FUSION_OP not in model.ops  # a typed field, not an op
    model.save(tmp_path)
    data = json.loads((tmp_path / "performance_model.json").read_text())
    assert data["fusion"]["pointnet"]["batch_size"] == 32  # plain JSON, no pickle
    loaded = PerformanceModel.load_dir(tmp_path).fusion["pointnet"]
    fitted = model.fusion["pointnet"]
    for width in (1, 5, 16, 48):
        assert loaded.throughput(width) == pytest.approx(fitted.throughput(width))
        assert loaded.memory_bytes(width) == pytest.approx(fitted.memory_bytes(width))
    assert loaded.throughput(16) == pytest.approx(900.0 * 16 / (1 + 1.6 + 0.004 * 256), rel=0.01)
