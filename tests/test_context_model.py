import numpy as np
import pytest
from synthetic_rows import gemm_rows

from predictors import fit_performance_model
from predictors.context_model import ContextFactorModel, fit_context_factors
from predictors.graph import GraphOp
from predictors.opmodels import OpModel
from predictors.simulator import model_cost
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement


def gemm_bundle():
    rng = np.random.default_rng(0)
    model, _ = fit_performance_model(gemm_rows(rng, 60), "synthetic")
    return model, rng


def test_factor_learned_from_steps_that_run_kernels_twice_as_slow():
    model, rng = gemm_bundle()
    rows = []
    for _ in range(40):
        m, n, k = (int(x) for x in rng.integers(16, 512, size=3))
        p = gemm_params(m, n, k)
        isolated = model.predict_params("gemm", p)
        rows.append(
            Measurement(
                "in_context",
                {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
                2.0 * isolated * float(rng.uniform(0.95, 1.05)),
                0.0,
                1,
            )
        )
    fit_context_factors(model, rows, seed=0)
    factors = model.in_step
    assert factors.factor("gemm") == pytest.approx(2.0, rel=0.05)
    assert factors.factor("gelu") == 1.0  # never seen in a step
    stats = model.metrics["in_context"]
    assert stats["gmae"] < 0.05 < 0.4 < stats["baseline_gmae"]
    # Plain data: it survives JSON and is applied to the graph op it was learned for.
    loaded = OpModel.from_dict(factors.to_dict())
    assert isinstance(loaded, ContextFactorModel) and loaded.factors == factors.factors
    p = gemm_params(64, 64, 64)
    op = GraphOp("fc", "compute", "gemm", p)
    assert model_cost(model)(op) == pytest.approx(2.0 * model.predict_params("gemm", p), rel=0.05)


def test_each_workloads_own_factor_prices_only_its_steps_and_survives_json():
    model, _ = gemm_bundle()
    context = ContextFactorModel()
    context.set_workload("dlrm", {"gemm": 3.0}, {"gemm": 10})
    context.set_workload("transformer", {"gemm": 1.5}, {"gemm": 8})
    model.in_step = OpModel.from_dict(context.to_dict())
    assert model.in_step.by_workload == {"dlrm": {"gemm": 3.0}, "transformer": {"gemm": 1.5}}
    op = GraphOp("fc", "compute", "gemm", gemm_params(64, 64, 64))
    isolated = model.predict_params("gemm", op.params)
    memo: dict = {}  # one memo across workloads: each is priced for its own
    assert model_cost(model, memo=memo, workload="dlrm")(op) == pytest.approx(3.0 * isolated)
    assert model_cost(model, memo=memo, workload="transformer")(op) == pytest.approx(1.5 * isolated)
    assert model_cost(model, memo=memo)(op) == pytest.approx(isolated)  # no named workload
    model.in_step.drop_workload("transformer")  # its steps refused it: the DLRM's is not theirs
    assert model.in_step.predict({"model_op": "gemm", "workload": "transformer"}) == 1.0
    assert model.in_step.predict({"model_op": "gemm", "workload": "dlrm"}) == 3.0


def test_bundles_from_before_price_their_steps_as_they_did():
    # 11-27: one factor per op (the collectives', which add nothing per call), scoped to the
    # workloads that kept it; before: unscoped
    model, _ = gemm_bundle()
    scoped = {"op": "in_context", "kind": "context_factors", "factors": {"gemm": 3.0}, "adds": {"gemm": 0.0}}
    scoped |= {"counts": {"gemm": 10}, "workloads": {"gemm": ["dlrm"]}}
    isolated = model.predict_params("gemm", gemm_params(64, 64, 64))
    loaded = OpModel.from_dict(scoped)
    assert loaded.in_step("gemm", isolated, "dlrm") == pytest.approx(3.0 * isolated)
    assert loaded.in_step("gemm", isolated, "transformer") == pytest.approx(isolated)
    assert loaded.in_step("gemm", isolated) == pytest.approx(isolated)
    unscoped = {k: v for k, v in scoped.items() if k != "workloads"} | {"adds": {"gemm": 1e-6}}
    assert OpModel.from_dict(unscoped).in_step("gemm", isolated, "transformer") == pytest.approx(3.0 * isolated + 1e-6)


def test_a_per_call_cost_is_learned_as_an_addition_not_a_ratio():
    """Steps that add 5 µs to every GEMM call: tiny GEMMs look 3x slower, big ones barely
    slower. The affine fit recovers factor 1 + 5 µs, so both ends are right; a single ratio
    (the geometric median) would over-price the big GEMMs."""
    model, rng = gemm_bundle()
    rows = []
    for _ in range(60):
        m, n, k = (int(x) for x in np.exp(rng.uniform(np.log(8), np.log(1024), size=3)))
        p = gemm_params(m, n, k)
        rows.append(
            Measurement(
                "in_context",
                {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
                (model.predict_params("gemm", p) + 5e-6) * float(rng.uniform(0.97, 1.03)),
                0.0,
                1,
            )
        )
    fit_context_factors(model, rows, seed=0)
    context = model.in_step
    assert context.factor("gemm") == pytest.approx(1.0, abs=0.05)
    assert context.add_s("gemm") == pytest.approx(5e-6, rel=0.2)
    big = gemm_params(1024, 1024, 1024)
    isolated = model.predict_params("gemm", big)
    assert model_cost(model)(GraphOp("fc", "compute", "gemm", big)) == pytest.approx(isolated + 5e-6, rel=0.03)
    assert model.metrics["in_context"]["gmae"] < 0.03
    loaded = OpModel.from_dict(context.to_dict())
    assert loaded.in_step("gemm", 1e-3) == context.in_step("gemm", 1e-3)


def test_too_few_rows_leave_the_factor_at_one():
    model, _ = gemm_bundle()
    p = gemm_params(64, 64, 64)
    rows = [
        Measurement(
            "in_context",
            {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
            5 * model.predict_params("gemm", p),
            0.0,
            1,
        )
    ] * 3
    fit_context_factors(model, rows, seed=0)
    assert model.in_step.factor("gemm") == 1.0
