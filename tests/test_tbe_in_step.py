"""The lookup of a captured DLRM step, priced as the graph prices it: the in-context rows that
let the bundle learn how a TBE runs inside a step (`probes.vocabulary.in_context`), and the
factors fitted on them pricing the graph's lookups."""

from __future__ import annotations

import pytest
import torch

from predictors.context_model import ContextFactorModel
from predictors.dlrm_graph import build_dlrm_graph
from predictors.simulator import model_cost
from probes.probe import ProbeSpec
from probes.training import run_training_probe
from probes.vocabulary.in_context import tbe_in_context_rows
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.ops import IN_CONTEXT_OP
from probes.vocabulary.records import Measurement
from probes.workloads.dlrm import ShardedDLRM


def _job(tiny_job_dict: dict) -> dict:
    return {**tiny_job_dict, "world_size": 1}


def test_a_table_wise_step_gives_its_lookup_and_backward_priced_as_the_graph_prices_them(one_rank, tiny_job_dict):
    job = _job(tiny_job_dict)
    plan = [0] * len(job["tables"])
    rows = run_training_probe(ProbeSpec("training", {"job": job, "table_to_rank": plan}), iterations=3, warmup=1)
    tbe = [r for r in rows if r.op == IN_CONTEXT_OP and r.params["model_op"].startswith("embedding_")]
    assert sorted({r.params["model_op"] for r in tbe}) == ["embedding_bwd", "embedding_fwd"]
    assert len(tbe) == 2 * 3  # one lookup and one backward in each of the three captured steps
    assert all(r.median_s > 0 and r.params["workload"] == "dlrm" for r in tbe)
    spec = JobSpec.from_dict(job)
    graph_lookup = next(op for op in build_dlrm_graph(spec, plan).ranks[0] if op.name == "embedding_fwd")
    kernel_params = {k: v for k, v in tbe[0].params.items() if k not in ("model_op", "aten_op", "workload")}
    assert kernel_params == graph_lookup.params


def test_a_rank_with_more_than_one_lookup_gives_none(one_rank, tiny_job_dict):
    """Row-wise or replicated pieces run a second TBE: which traced op is which would be a guess."""
    job = _job(tiny_job_dict)
    plan: list = [0] * len(job["tables"])
    assert ShardedDLRM(JobSpec.from_dict(job), plan, 0, 1, torch.device("cpu")).lookup_features() is not None
    plan[1] = {"type": "data_parallel"}
    assert ShardedDLRM(JobSpec.from_dict(job), plan, 0, 1, torch.device("cpu")).lookup_features() is None


def test_a_trace_without_exactly_one_lookup_and_backward_gives_no_rows():
    def op(name: str, ms: float) -> dict:
        return {"name": name, "start_s": 0.0, "end_s": ms / 1e3}

    lookup, backward = (
        "fbgemm::split_embedding_codegen_lookup_sgd_function_pt2",
        "fbgemm::split_embedding_backward_codegen_sgd_unweighted_pt2_wrapper",
    )
    whole = {"ops": [op("fbgemm::bounds_check_indices", 0.1), op(lookup, 1.0), op("aten::mm", 2.0), op(backward, 3.0)]}
    doubled = {"ops": [op(lookup, 1.0), op(lookup, 1.0), op(backward, 3.0)]}
    rows = tbe_in_context_rows([whole, doubled], {"T": 2}, "cpu", 2, "dlrm")
    assert [(r.params["model_op"], round(r.median_s * 1e3, 6)) for r in rows] == [
        ("embedding_fwd", 1.1),  # the bounds check is part of the module's forward the probe times
        ("embedding_bwd", 3.0),
    ]


def test_factors_fitted_on_such_rows_price_the_graphs_lookups(tiny_job_dict):
    """A bundle whose lookups ran 1.3x slower inside steps prices the graph's lookups so."""

    class Isolated:
        models = {"embedding_fwd": None, "embedding_bwd": None}
        in_step = None

        def predict_params(self, op: str, params: dict) -> float:
            return 1e-3 * params["T"]

    rows = [
        Measurement(IN_CONTEXT_OP, {"model_op": op, "aten_op": "x", "workload": "dlrm", "T": t}, 1.3e-3 * t, 0.0, 1)
        for op in ("embedding_fwd", "embedding_bwd")
        for t in range(1, 7)
    ]
    factors = ContextFactorModel().fit_against(rows, Isolated())
    assert factors.factor("embedding_bwd", "dlrm") == pytest.approx(1.3, rel=0.02)
    model = Isolated()
    model.in_step = factors
    cost = model_cost(model, workload="dlrm")
    spec = JobSpec.from_dict(_job(tiny_job_dict))
    lookup = next(op for op in build_dlrm_graph(spec, [0] * len(spec.tables)).ranks[0] if op.name == "embedding_bwd")
    assert cost(lookup) == pytest.approx(1.3e-3 * lookup.params["T"], rel=0.02)
