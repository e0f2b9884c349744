"""Collectives inside captured training steps: the probe's record and the in-step factor the
step model learns from it."""

import copy
import functools
import json

import numpy as np
import pytest

from predictors.collective_context import collective_pairs, graph_collectives, learn_collective_factors
from predictors.context_model import ContextFactorModel
from predictors.dlrm_graph import build_dlrm_graph
from predictors.fit import fit_performance_model
from predictors.graph import GraphOp
from predictors.kernel_classes import one_slowdown
from predictors.simulator import model_cost
from predictors.step_fit import OVERHEAD_FEATURES
from probes.vocabulary.in_context import collective_kind, in_step_collectives, step_collectives
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.records import Measurement


def test_collective_kinds_from_gloo_and_nccl_names():
    assert collective_kind("gloo:all_reduce") == "all_reduce"
    assert collective_kind("gloo:all_to_all") == "all_to_all"
    assert collective_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "all_reduce"
    assert collective_kind("ncclDevKernel_SendRecv") == "all_to_all"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "reduce_scatter"
    assert collective_kind("gloo:barrier") is None


def test_in_step_time_is_the_least_over_ranks_and_mismatched_steps_are_dropped():
    def step(*items):
        return {"comm": [{"name": n, "start_s": s, "end_s": e} for n, s, e in items]}

    rank0 = step_collectives(
        [step(("gloo:all_to_all", 0.0, 3e-3), ("gloo:all_reduce", 5e-3, 6e-3)), step(("gloo:all_to_all", 0.0, 1e-3))]
    )
    # rank 1 came late to the all-to-all (rank 0 waited 2 ms for it) and was waited for in the
    # all-reduce; in its second step it ran an extra collective rank 0 did not record
    rank1 = step_collectives(
        [
            step(("gloo:all_to_all", 2e-3, 3e-3), ("gloo:all_reduce", 4e-3, 6e-3)),
            step(("gloo:all_to_all", 0.0, 1e-3), ("gloo:all_reduce", 2e-3, 3e-3)),
        ]
    )
    assert in_step_collectives([rank0, rank1]) == [
        [["all_to_all", pytest.approx(1e-3)], ["all_reduce", pytest.approx(1e-3)]]
    ]


def job() -> JobSpec:
    return JobSpec.from_dict(
        {
            "name": "c",
            "workload": "dlrm",
            "world_size": 2,
            "batch_size": 32,
            "dense": {"num_dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
            "tables": [
                {"name": f"t{i}", "num_embeddings": 1000, "embedding_dim": 8, "pooling_factor": 2} for i in range(3)
            ],
        }
    )


def bundle(spec: JobSpec, plan: list[int]):
    """A bundle fitted on synthetic rows of every op the job's graph prices (a fresh copy: the
    tests change its factors; the fit, ~10 s on 2 cores, is done once per job and plan)."""
    model, graph = _fitted(json.dumps(spec.to_dict(), sort_keys=True), tuple(plan))
    return copy.deepcopy(model), graph


@functools.lru_cache(maxsize=None)
def _fitted(spec_json: str, plan: tuple[int, ...]):
    spec, plan = JobSpec.from_dict(json.loads(spec_json)), list(plan)
    graph = build_dlrm_graph(spec, plan)
    rows = []
    for i, o in enumerate(o for ops in graph.ranks for o in ops):
        if o.op == "memcpy" and any(r.op == "memcpy" for r in rows):
            continue  # one copy's rows: the memcpy model prices every copy by its bytes
        for k in range(12):
            p = dict(o.params)
            if "bytes" in p:
                p["bytes"] = float(p["bytes"]) * (1 + k)
            rows.append(Measurement(o.op, p, 1e-5 * (1 + k) * (1 + i % 3), 0.0, 5))
    # two judge folds, not five: the models fitted on every row are the same (the folds only
    # score them), and these tests price with the models, never read the kernels' scores
    model, _ = fit_performance_model(rows, "hw", folds=2)
    return model, graph


def test_collectives_running_three_times_slower_in_steps_get_a_factor_of_three():
    spec, plan = job(), [0, 0, 1]
    model, graph = bundle(spec, plan)
    collectives = [o for o in graph.ranks[0] if o.kind == "collective"]
    rng = np.random.default_rng(0)
    rows = []
    for i in range(10):
        steps = [
            [[o.op, 3.0 * model.predict_params(o.op, o.params) * float(rng.uniform(0.95, 1.05))] for o in collectives]
            for _ in range(3)
        ]
        steps.append([["all_reduce", 1.0]])  # a step that does not match the graph: left out
        params = {"job": spec.to_dict(), "table_to_rank": plan, "in_step_collectives": steps}
        rows.append(Measurement("dlrm_step", params, 0.01, 0.0, 30))
    assert sum(len(v) for v in collective_pairs(model, rows).values()) == 10 * 3 * len(collectives)
    isolated = {o.name: model_cost(model)(o) for o in collectives}
    stats = learn_collective_factors(model, rows, seed=0)
    assert model.in_step is None  # learned, not yet kept: the steps decide (`fit_steps`)
    assert stats["factors"]["all_to_all"] == pytest.approx(3.0, rel=0.05)
    assert stats["factors"]["all_reduce"] == pytest.approx(3.0, rel=0.05)
    assert stats["borne_out"] and stats["n"] > 0 and stats["gmae"] < 0.05 < 0.5 < stats["baseline_gmae"]
    # kept for the DLRM, the simulator prices its graph's collectives at their in-step time,
    # kernels as before, and another workload's collectives as in isolation
    model.in_step = ContextFactorModel()
    model.in_step.set_workload("dlrm", stats["factors"], stats["counts"])
    cost = model_cost(model, workload="dlrm")
    for o in collectives:
        assert cost(o) == pytest.approx(3.0 * isolated[o.name], rel=0.05)
        assert model_cost(model, workload="transformer")(o) == pytest.approx(isolated[o.name])
    fc = GraphOp("fc", "compute", "gemm", next(o for o in graph.ranks[0] if o.op == "gemm").params)
    assert cost(fc) == pytest.approx(model.predict_params("gemm", fc.params))


def test_steps_without_captured_collectives_leave_the_bundle_as_it_was():
    spec, plan = job(), [0, 0, 1]
    model, _ = bundle(spec, plan)
    rows = [Measurement("dlrm_step", {"job": spec.to_dict(), "table_to_rank": plan}, 0.01, 0.0, 30) for _ in range(5)]
    assert learn_collective_factors(model, rows, seed=0) is None


def test_a_factor_the_held_out_steps_do_not_bear_out_is_not_kept():
    from predictors.evaluation import split_by_op

    spec, plan = job(), [0, 0, 1]
    model, graph = bundle(spec, plan)
    collectives = [o for o in graph.ranks[0] if o.kind == "collective"]

    def row(slowdown: float) -> Measurement:
        steps = [[[o.op, slowdown * model.predict_params(o.op, o.params)] for o in collectives] for _ in range(3)]
        return Measurement(
            "dlrm_step", {"job": spec.to_dict(), "table_to_rank": plan, "in_step_collectives": steps}, 0.01, 0.0, 30
        )

    rows = [row(3.0) for _ in range(10)]
    _, test = split_by_op(rows, 0)
    held = {id(r) for r in test}
    rows = [row(1.0) if id(r) in held else r for r in rows]  # the held-out steps ran them as fast as alone
    stats = learn_collective_factors(model, rows, seed=0)
    assert stats["borne_out"] is False and stats["factors"]["all_to_all"] == pytest.approx(3.0, rel=0.05)
    assert stats["baseline_total_error"] < 1e-3 < 0.5 < stats["total_error"]  # the isolated price is exact here


def test_heavy_tailed_in_step_times_are_priced_at_their_mean():
    # Most calls run as fast as alone and one in four stalls at ten times its isolated price:
    # a step of several collectives adds up to the mean (3.25x), which the factor must give,
    # though a per-call error (GMAE) would favour the typical call.
    spec, plan = job(), [0, 0, 1]
    model, graph = bundle(spec, plan)
    collectives = [o for o in graph.ranks[0] if o.kind == "collective"]
    slowdowns = [10.0, 1.0, 1.0, 1.0]
    rows = []
    for i in range(12):
        steps = [
            [
                [o.op, slowdowns[(i + k + j) % 4] * model.predict_params(o.op, o.params)]
                for j, o in enumerate(collectives)
            ]
            for k in range(4)
        ]
        params = {"job": spec.to_dict(), "table_to_rank": plan, "in_step_collectives": steps}
        rows.append(Measurement("dlrm_step", params, 0.01, 0.0, 30))
    stats = learn_collective_factors(model, rows, seed=0)
    assert stats["factors"]["all_to_all"] == pytest.approx(3.25, rel=0.02)
    assert stats["borne_out"] and stats["total_error"] < 0.05 < stats["baseline_total_error"]
    assert stats["gmae"] > stats["baseline_gmae"]  # per call, the typical (isolated) price is closer


def dlrm_steps(model, steps_slowed_by: float, rng: np.random.Generator) -> list[Measurement]:
    """DLRM steps of widening tables whose captured collectives ran at 3x their isolated price
    and whose measured times are their graphs with the collectives at `steps_slowed_by`."""
    from predictors.dlrm_estimator import estimate_iteration

    truth = ContextFactorModel()
    for op in ("all_to_all", "all_reduce"):
        truth.factors[op], truth.adds[op], truth.counts[op] = steps_slowed_by, 0.0, 10
    rows, base, plan = [], job().to_dict(), [0, 0, 1]
    for batch in (32, 128, 512):
        for dim in (4, 8, 16, 32):  # the all-to-all's share of the step grows with the width
            spec = JobSpec.from_dict(
                {**base, "batch_size": batch, "tables": [{**t, "embedding_dim": dim} for t in base["tables"]]}
            )
            collectives = [o for o in build_dlrm_graph(spec, plan).ranks[0] if o.kind == "collective"]
            captured = [[[o.op, 3.0 * model.predict_params(o.op, o.params)] for o in collectives] for _ in range(3)]
            context, model.in_step = model.in_step, truth
            step_s = estimate_iteration(spec, plan, model, include_overhead=False).iteration_s
            model.in_step = context
            params = {"job": spec.to_dict(), "table_to_rank": plan, "in_step_collectives": captured}
            rows.append(Measurement("dlrm_step", params, (step_s + 2e-4) * rng.uniform(0.99, 1.01), 0.0, 30))
    return rows


# Step overheads with one slowdown on all the kernels: an overhead with a collective class of
# its own (the default, `predictors.kernel_classes`) prices a slowdown of the collectives alone
# at their isolated prices as well as the factors do, and a tie keeps the isolated prices, so
# the verdict between the two is tested where only the factors can price it.
ONE_SLOWDOWN = {workload: one_slowdown(names) for workload, names in OVERHEAD_FEATURES.items()}


@pytest.mark.parametrize("steps_slowed_by", [3.0, 1.0])
def test_the_factors_stay_only_where_the_whole_steps_bear_them_out(steps_slowed_by):
    # Every captured step saw its collectives at 3x their isolated price, so the collectives'
    # totals keep a 3x factor; but the steps' measured times are their graphs at
    # `steps_slowed_by` (1.0: the slowdown hid behind compute): the factor stays only when the
    # steps, each left out in turn, come out closer with it.
    from predictors.step_fit import fit_steps

    model, _ = bundle(job(), [0, 0, 1])
    rows = dlrm_steps(model, steps_slowed_by, np.random.default_rng(0))
    with_classes = copy.deepcopy(model)
    fit_steps(with_classes, rows, [], seed=0)  # by factors or by its collective class, the steps come out right
    assert with_classes.metrics["dlrm_step"]["gmae"] < 0.03
    fit_steps(model, rows, [], seed=0, overhead_features=ONE_SLOWDOWN)
    stats = model.metrics["in_step_collective"]["dlrm"]
    assert stats["total_error"] < 0.05 < 0.5 < stats["baseline_total_error"]  # the totals say 3x either way
    if steps_slowed_by == 3.0:
        assert stats["kept"] and stats["steps_gmae"] < stats["baseline_steps_gmae"]
        assert model.in_step.factor("all_to_all", "dlrm") == pytest.approx(3.0, rel=0.05)
        assert model.metrics["dlrm_step"]["gmae"] == pytest.approx(stats["steps_gmae"])
    else:
        assert not stats["kept"] and stats["baseline_steps_gmae"] <= stats["steps_gmae"]
        assert model.in_step is None or model.in_step.factor("all_to_all", "dlrm") == 1.0
        assert model.metrics["dlrm_step"]["gmae"] == pytest.approx(stats["baseline_steps_gmae"])


def transformer_steps(model, captured_at: float, steps_slowed_by: float, rng) -> list[Measurement]:
    """Data-parallel transformer steps whose gradient all-reduces were captured at `captured_at`
    their isolated price and whose whole steps took their graphs with them at `steps_slowed_by`."""
    from predictors.transformer_estimator import estimate_transformer_iteration
    from probes.vocabulary.transformer_spec import TransformerSpec

    truth = ContextFactorModel()
    truth.set_workload("transformer", {"all_reduce": steps_slowed_by}, {"all_reduce": 10})
    rows = []
    for layers in (1, 2, 4):
        for hidden in (32, 64, 128):
            spec = TransformerSpec(layers=layers, hidden=hidden, heads=4, seq_len=16, batch_size=4, world_size=2)
            row = Measurement("transformer_step", {"transformer": spec.to_dict()}, 0.0, 0.0, 9)
            calls = graph_collectives(row)
            row.params["in_step_collectives"] = [
                [[o.op, captured_at * model.predict_params(o.op, o.params) * rng.uniform(0.97, 1.03)] for o in calls]
                for _ in range(3)
            ]
            context, model.in_step = model.in_step, truth
            step_s = estimate_transformer_iteration(spec, model, include_overhead=False).iteration_s
            model.in_step = context
            row.median_s = (step_s + 2e-4) * rng.uniform(0.99, 1.01)
            rows.append(row)
    return rows


@pytest.mark.parametrize("captured_at, steps_slowed_by", [(1.5, 1.5), (3.0, 1.0)])
def test_each_workload_learns_its_own_factors_and_keeps_them_where_its_steps_bear_them_out(
    captured_at, steps_slowed_by
):
    # The DLRM steps ran their collectives at 3x their isolated price. The transformer's
    # (data parallel: gradient all-reduces) were captured at `captured_at` and its steps took
    # their graphs with them at `steps_slowed_by`: it learns its own factor from its own
    # collectives, and keeps it only where its own steps bear it out; the DLRM's 3x stays
    # the DLRM's either way.
    from predictors.step_fit import fit_steps

    model, _ = bundle(job(), [0, 0, 1])
    rng = np.random.default_rng(1)
    dlrm_rows = dlrm_steps(model, 3.0, rng)
    transformer_rows = transformer_steps(model, captured_at, steps_slowed_by, rng)
    fit_steps(model, dlrm_rows, transformer_rows, seed=0, overhead_features=ONE_SLOWDOWN)
    stats = model.metrics["in_step_collective"]
    dlrm, transformer = stats["dlrm"], stats["transformer"]
    assert stats["kept"] and dlrm["kept"]
    assert transformer["factors"]["all_reduce"] == pytest.approx(captured_at, rel=0.05)  # its own, not 3x
    assert transformer["borne_out"]  # its collectives add up to it either way
    assert model.in_step.factor("all_reduce", "dlrm") == pytest.approx(3.0, rel=0.05)
    if steps_slowed_by == captured_at:
        assert transformer["kept"] and transformer["steps_gmae"] < transformer["baseline_steps_gmae"]
        assert model.in_step.factor("all_reduce", "transformer") == pytest.approx(captured_at, rel=0.05)
        assert model.metrics["transformer_step"]["gmae"] == pytest.approx(transformer["steps_gmae"])
    else:
        assert not transformer["kept"] and transformer["baseline_steps_gmae"] < transformer["steps_gmae"]
        assert model.in_step.factor("all_reduce", "transformer") == 1.0
        assert model.metrics["transformer_step"]["gmae"] == pytest.approx(transformer["baseline_steps_gmae"])


def test_a_workload_left_out_of_in_step_workloads_keeps_the_isolated_prices_whatever_its_steps_say():
    # The steps that bear out their factor of 1.5 (kept above) are fitted with the transformer
    # left out: its collectives stay at their isolated prices and nothing is learned for it,
    # while the DLRM's 3x is learned and kept as before.
    from predictors.step_fit import fit_steps

    model, _ = bundle(job(), [0, 0, 1])
    rng = np.random.default_rng(1)
    dlrm_rows = dlrm_steps(model, 3.0, rng)
    transformer_rows = transformer_steps(model, 1.5, 1.5, rng)
    fit_steps(model, dlrm_rows, transformer_rows, seed=0, overhead_features=ONE_SLOWDOWN, in_step_workloads=("dlrm",))
    stats = model.metrics["in_step_collective"]
    assert stats["dlrm"]["kept"] and "transformer" not in stats
    assert model.in_step.factor("all_reduce", "dlrm") == pytest.approx(3.0, rel=0.05)
    assert model.in_step.factor("all_reduce", "transformer") == 1.0
    assert model.step_overheads["transformer"] is not None and "transformer_step" in model.metrics


def test_the_calibration_says_whether_the_factors_were_kept_and_why():
    from predictors.step_fit import in_step_verdict

    stats = {
        "kept": True,
        "dlrm": {"factors": {"all_reduce": 3.92}, "kept": True, "steps_gmae": 0.062, "baseline_steps_gmae": 0.071},
        "transformer": {"factors": {"all_reduce": 2.46}, "total_error": 0.9, "baseline_total_error": 0.1},
    }
    assert in_step_verdict(stats) == (
        "in-step collective factors: dlrm (all_reduce 3.92x) kept: its steps left out in turn 6.2% with them, "
        "7.1% without; transformer (all_reduce 2.46x) dropped: held-out collectives' total off by 90.0% with "
        "them, 10.0% at isolated prices"
    )
