import numpy as np
import pytest

from predictors import fit_performance_model
from predictors.context_model import ContextFactorModel, fit_context_factors
from predictors.graph import GraphOp
from predictors.opmodels import OpModel
from predictors.simulator import model_cost
from probes.gemm import gemm_params
from probes.records import Measurement


def gemm_bundle():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(60):
        m, n, k = (int(x) for x in rng.integers(8, 1024, size=3))
        p = gemm_params(m, n, k)
        rows.append(Measurement("gemm", p, 2e-6 + p["flops"] / 2e10, 0, 5))
    model, _ = fit_performance_model(rows, "synthetic")
    return model, rng


def test_factor_learned_from_steps_that_run_kernels_twice_as_slow():
    model, rng = gemm_bundle()
    rows = []
    for _ in range(40):
        m, n, k = (int(x) for x in rng.integers(16, 512, size=3))
        p = gemm_params(m, n, k)
        isolated = model.predict_params("gemm", p)
        rows.append(Measurement("in_context", {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
                                2.0 * isolated * float(rng.uniform(0.95, 1.05)), 0.0, 1))
    fit_context_factors(model, rows, seed=0)
    factors = model.models["in_context"]
    assert factors.factor("gemm") == pytest.approx(2.0, rel=0.05)
    assert factors.factor("gelu") == 1.0  # never seen in a step
    stats = model.metrics["in_context"]
    assert stats["gmae"] < 0.05 < 0.4 < stats["baseline_gmae"]
    # Plain data: it survives JSON and is applied to graph kernels, never to collectives.
    loaded = OpModel.from_dict(factors.to_dict())
    assert isinstance(loaded, ContextFactorModel) and loaded.factors == factors.factors
    p = gemm_params(64, 64, 64)
    op = GraphOp("fc", "compute", "gemm", p)
    assert model_cost(model)(op) == pytest.approx(2.0 * model.predict_params("gemm", p), rel=0.05)


def test_too_few_rows_leave_the_factor_at_one():
    model, _ = gemm_bundle()
    p = gemm_params(64, 64, 64)
    rows = [Measurement("in_context", {"model_op": "gemm", "aten_op": "aten::mm", "workload": "dlrm", **p},
                        5 * model.predict_params("gemm", p), 0.0, 1)] * 3
    fit_context_factors(model, rows, seed=0)
    assert model.models["in_context"].factor("gemm") == 1.0
