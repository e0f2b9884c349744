"""The overlapped pair as a k-stage pipeline in the simulator, the fit of its costs, the policy."""

import math

import pytest
from synthetic_rows import small_dlrm_job

from policies.substitution import PairPricing, apply_substitutions, choose_substitutions, decide
from predictors.graph import ExecutionGraph, GraphOp
from predictors.overlap_fit import fit_overlap_costs, fit_transfer_line
from predictors.overlap_model import (
    OverlapCalibration,
    OverlapCosts,
    PairPrediction,
    SubstitutablePair,
    predict_forms,
    substitute,
)
from predictors.simulator import simulate

MS = 1e-3


def cost(op: GraphOp) -> float:
    """Work ops cost `units` ms; collectives 1 ms per 1000 bytes."""
    if op.duration_s is not None:
        return op.duration_s
    if op.kind == "collective":
        return op.params["bytes"] * 1e-6
    return op.params.get("units", 0.0) * MS


def slice_params(rank, op, slices):
    return {"units": op.params["units"] / slices}


def two_rank_graph(producer_units=10.0, coll_bytes=10_000, with_producer=(True, True), tail_units=1.0):
    ranks = []
    for r in range(2):
        ops = [GraphOp("before", "compute", "work", {"units": 1.0})]
        if with_producer[r]:
            ops.append(GraphOp("emb", "compute", "work", {"units": producer_units}, deps=[0]))
        ops.append(
            GraphOp(
                "a2a",
                "collective",
                "all_to_all",
                {"bytes": coll_bytes, "world": 2},
                "comm",
                [len(ops) - 1] if with_producer[r] else [],
                (0, 1),
            )
        )
        ops.append(GraphOp("after", "compute", "work", {"units": tail_units}, deps=[len(ops) - 1]))
        ops.append(GraphOp("emb_bwd", "compute", "work", {"units": 4.0}, deps=[len(ops) - 1]))
        ranks.append(ops)
    meta = {
        "substitutable": [
            {
                "name": "emb_a2a",
                "pair": "embedding_all_to_all",
                "producer": "emb",
                "collective": "a2a",
                "sliced_with": ["emb_bwd"],
            }
        ]
    }
    return ExecutionGraph(ranks, meta)


PAIR = SubstitutablePair("emb_a2a", "embedding_all_to_all", "emb", "a2a", ("emb_bwd",))


def iteration_ms(graph):
    return simulate(graph, cost, synchronous=True).iteration_s / MS


def test_pipeline_overlaps_communication_with_the_next_slice():
    graph = two_rank_graph()
    assert iteration_ms(graph) == pytest.approx(1 + 10 + 10 + 1 + 4)
    fused = substitute(graph, PAIR, 2, OverlapCosts(), slice_params, cost)
    # before 1; slice0 5; its transfer (5) runs under slice1 (5); slice1's transfer 5; after 1; bwd 2 x 2
    assert iteration_ms(fused) == pytest.approx(1 + 5 + 5 + 5 + 1 + 4)
    names = [o.name for o in fused.ranks[0]]
    assert names[:3] == ["before", "emb.slice0", "a2a.slice0"]
    assert names.count("emb_bwd.slice0") == 1 and names.count("emb_bwd.slice1") == 1
    join = names.index("a2a.join")
    assert fused.ranks[0][names.index("after")].deps == [join]
    assert sorted(fused.ranks[0][join].deps) == [names.index("a2a.slice0"), names.index("a2a.slice1")]
    assert all(o.blocking is False for o in fused.ranks[0] if o.kind == "collective")


def test_contention_and_overhead_are_paid_on_the_compute_stream():
    graph = two_rank_graph()
    none = substitute(graph, PAIR, 2, OverlapCosts(comm_compute_share=1.0), slice_params, cost)
    assert iteration_ms(none) == pytest.approx(iteration_ms(graph))  # no overlap: same as unfused
    half = substitute(
        graph, PAIR, 2, OverlapCosts(slice_overhead_s=0.5 * MS, comm_compute_share=0.5), slice_params, cost
    )
    # slice0 5, contention 2.5, overhead 0.5, slice1 5 (ends 14); its transfer ends 19
    assert iteration_ms(half) == pytest.approx(1 + 5 + 2.5 + 0.5 + 5 + 5 + 1 + 4)
    dear = substitute(graph, PAIR, 2, OverlapCosts(comm_factor=2.0), slice_params, cost)
    assert iteration_ms(dear) == pytest.approx(1 + 5 + 10 + 10 + 1 + 4)  # transfers of 10 each, back to back


def test_a_fitted_transfer_line_prices_the_communication_slices():
    graph = two_rank_graph()
    # the line (0.5 ms + 0.1 ms per 1000 bytes) splits the 10 ms collective as 1.0 : 1.5 per half
    line = OverlapCosts(transfer_latency_s=0.5 * MS, transfer_s_per_byte=1e-7)
    fused = substitute(graph, PAIR, 2, line, slice_params, cost)
    # slice0 ends 6; transfers of 10 * 1.0 / 1.5 ms each, back to back from 6; after; bwd 2 x 2
    assert iteration_ms(fused) == pytest.approx(1 + 5 + 2 * 10 / 1.5 + 1 + 4)


def test_slices_are_never_priced_below_their_share_of_the_whole():
    graph = two_rank_graph()
    too_cheap = lambda rank, op, slices: {"units": op.params["units"] / slices / 4}  # noqa: E731
    no_overlap = OverlapCosts(comm_compute_share=1.0)
    assert iteration_ms(substitute(graph, PAIR, 2, no_overlap, too_cheap, cost)) < iteration_ms(graph)
    # priced against the whole producer and collective, k slices without overlap gain nothing
    assert iteration_ms(substitute(graph, PAIR, 2, no_overlap, too_cheap, cost, cost)) == pytest.approx(
        iteration_ms(graph)
    )


def test_transfer_line_fit_recovers_latency_and_bandwidth():
    samples = [(b, k, k * 50e-6 + b * 2e-10) for b in (4e3, 1e5, 4e6, 3e7) for k in (1, 2, 4, 8, 16)]
    latency, per_byte, err = fit_transfer_line(samples)
    assert latency == pytest.approx(50e-6, rel=1e-3) and per_byte == pytest.approx(2e-10, rel=1e-3) and err < 1e-3
    with pytest.raises(ValueError, match="at least two"):
        fit_transfer_line(samples[:1])


def test_a_rank_without_a_producer_still_runs_every_collective_slice():
    graph = two_rank_graph(with_producer=(True, False))
    fused = substitute(graph, PAIR, 4, OverlapCosts(), slice_params, cost)
    assert sum(o.kind == "collective" for o in fused.ranks[1]) == 4
    assert not any(o.name.startswith("emb.") for o in fused.ranks[1])
    assert iteration_ms(fused) < iteration_ms(graph)  # simulates without a deadlock, and gains


def test_substitute_refuses_a_collective_that_does_not_read_the_producer():
    graph = two_rank_graph()
    for ops in graph.ranks:
        ops[2].deps = [0]
    with pytest.raises(ValueError, match="does not consume"):
        substitute(graph, PAIR, 2, OverlapCosts(), slice_params, cost)


def _measured_as(costs, shapes):
    """Fit input: per (units, bytes) pair graph, its predictor and the times `costs` give it."""
    points = []
    for units, nbytes in shapes:
        graph = two_rank_graph(units, nbytes)

        def predict(c, graph=graph):
            return predict_forms(graph, PAIR, c, cost, slice_params, cost, synchronous=True)

        made = predict(costs)
        points.append((predict, {1: made.unfused_s, **made.fused_s}))
    return points


def test_fit_recovers_costs_that_generated_the_measurements():
    truth = OverlapCosts(slice_overhead_s=0.4 * MS, comm_compute_share=0.3, comm_factor=1.2)
    points = _measured_as(truth, [(10.0, 10_000), (2.0, 8_000), (20.0, 5_000), (6.0, 30_000)])
    fitted = fit_overlap_costs(points)
    assert fitted.fit_gmae < 0.01
    for predict, times in points:
        pred = predict(fitted)
        for k, t in pred.fused_s.items():
            assert t / pred.unfused_s == pytest.approx(times[k] / times[1], rel=0.01)
    assert fitted.comm_compute_share == pytest.approx(0.3, abs=0.05)
    assert fitted.comm_factor == pytest.approx(1.2, abs=0.1)


def test_fit_never_prices_communication_beside_compute_below_the_collective_alone():
    # measurements made with communication at 0.5x its price alone (a probe mismatch, not an
    # overlap): the fit must not take the cheap transfer, which would predict gains
    cheap = OverlapCosts(comm_compute_share=1.0, comm_factor=0.5)
    points = _measured_as(cheap, [(10.0, 10_000), (2.0, 8_000), (6.0, 30_000)])
    assert fit_overlap_costs(points).comm_factor >= 1.0


def test_decide_substitutes_only_above_the_threshold():
    assert decide(PairPrediction(10.0, {2: 9.0, 4: 9.4})).substitute
    assert decide(PairPrediction(10.0, {2: 9.0, 4: 9.4})).slices == 2
    kept = decide(PairPrediction(10.0, {2: 9.7, 4: 12.0}))
    assert not kept.substitute and kept.slices == 1
    assert not decide(PairPrediction(10.0, {2: 9.0}), threshold=0.2).substitute


class FakeModel:
    """What the policy reads from a bundle: whether kernels hold their thread, the overlap
    costs, the symmetric-memory ratios and prices."""

    def __init__(self, overlap: OverlapCalibration):
        self.synchronous = True
        self.overlap = overlap
        self.symm_mem = {}
        self.models = {}

    def predict_params(self, op, params):
        if op == "all_to_all":
            return params["bytes"] * 1e-6
        return params.get("units", 0.0) * MS


def test_policy_lists_every_pair_with_both_predictions_and_applies_the_winners():
    graph = two_rank_graph()
    model = FakeModel(OverlapCalibration({"embedding_all_to_all": OverlapCosts(0.1 * MS, 0.2, 1.0)}))
    decision = choose_substitutions(graph, model, slice_params, cost=cost)
    applied = apply_substitutions(
        PairPricing(graph, model, slice_params, cost), decision.choice_detail["substitutions"]
    )
    cand = decision.candidates[0]
    assert decision.choice.startswith("emb_a2a:k")
    assert cand.detail["substitute"] and cand.detail["predicted_unfused_ms"] == pytest.approx(iteration_ms(graph))
    assert set(cand.detail["predicted_fused_ms"]) == {"2", "4", "8", "16"}
    assert decision.predicted_ms == pytest.approx(min(cand.detail["predicted_fused_ms"].values()))
    assert any(o.name == "a2a.join" for o in applied.ranks[0])
    assert decision.choice_detail["unfused_ms"] == pytest.approx(iteration_ms(graph))
    # the plan carries the chosen pairs to the launcher, through its JSON
    from policies.plan import Plan

    plan = Plan.from_dict(Plan({}, "hw", None, 1.0, {"substitution": decision}).to_dict())
    assert plan.substitutions == {"emb_a2a": int(decision.choice.split(":k")[1])}
    assert Plan({}, "hw", None, 1.0, {}).substitutions == {}
    # the same pair with costly slices stays unfused, and a bundle without costs says why
    dear = FakeModel(OverlapCalibration({"embedding_all_to_all": OverlapCosts(5 * MS, 1.0, 1.0)}))
    decision = choose_substitutions(graph, dear, slice_params, cost=cost)
    applied = apply_substitutions(PairPricing(graph, dear, slice_params, cost), decision.choice_detail["substitutions"])
    assert decision.choice == "none" and applied is graph
    decision = choose_substitutions(graph, FakeModel(OverlapCalibration()), slice_params, cost=cost)
    assert not decision.candidates[0].feasible and "no fitted overlap costs" in decision.candidates[0].detail["reason"]
    assert math.isclose(decision.predicted_ms, iteration_ms(graph))


def test_reference_job_graphs_mark_their_pairs_and_simulate_substituted():
    from predictors.dlrm_graph import build_dlrm_graph, dlrm_slice_params
    from predictors.overlap_model import pairs_in
    from predictors.transformer_graph import build_transformer_graph
    from probes.vocabulary.jobspec import JobSpec
    from probes.vocabulary.transformer_spec import TransformerSpec

    job = JobSpec.from_dict(small_dlrm_job("g", world_size=2))
    placement = [0, 0, 0]  # rank 1 holds no table: it only receives
    graph = build_dlrm_graph(job, placement)
    [pair] = pairs_in(graph)
    unit = lambda op: op.duration_s if op.duration_s is not None else 1e-4 * (1 + op.params.get("B", 0) / 64)  # noqa: E731
    fused = substitute(graph, pair, 4, OverlapCosts(), dlrm_slice_params(job, placement), unit)
    lookups = [o for o in fused.ranks[0] if o.op == "embedding_fwd"]
    assert [o.params["B"] for o in lookups] == [16] * 4  # 64 bags of the global batch in 4 slices
    assert sum(o.op == "embedding_bwd" for o in fused.ranks[0]) == 4
    assert sum(o.name.startswith("all_to_all_fwd.slice") for o in fused.ranks[1]) == 4
    simulate(fused, unit, synchronous=True)  # every rank meets every slice

    tf = build_transformer_graph(
        TransformerSpec(
            layers=2, hidden=32, heads=4, seq_len=8, batch_size=2, world_size=2, tensor_parallel=2, dropout=0.1
        )
    )
    names = [p.name for p in pairs_in(tf)]
    assert names == ["b0.out", "b0.fc2", "b1.out", "b1.fc2"]
    assert (
        pairs_in(
            build_transformer_graph(
                TransformerSpec(layers=1, hidden=32, heads=4, seq_len=8, batch_size=2, world_size=2, tensor_parallel=1)
            )
        )
        == []
    )


def test_launcher_refuses_a_substitution_the_job_cannot_run():
    from orchestrator.launch import _checked_substitutions

    allowed = {"b0.out", "b0.fc2"}
    assert _checked_substitutions({"b0.out": 4}, allowed) == {"b0.out": 4}
    assert _checked_substitutions(None, allowed) == {}
    with pytest.raises(ValueError, match="no pair 'b3.out'.*allowed"):
        _checked_substitutions({"b3.out": 4}, allowed)
    with pytest.raises(ValueError, match="slices must be >= 1"):
        _checked_substitutions({"b0.fc2": 0}, allowed)


def test_symmetric_memory_kernels_are_a_candidate_priced_by_their_measured_ratio():
    """PyTorch's fused kernels (CUDA) beside our sliced pipeline: their measured ratio to the
    unfused pair is fitted per pair kind, and the policy picks them (slices 0) only where the
    simulated iteration with the pair as one fused kernel beats both unfused and sliced."""
    from policies.substitution import SYMM_MEM_SLICES
    from predictors.overlap_model import fuse_as_one_kernel
    from predictors.pair_estimator import fit_symm_mem
    from probes.vocabulary.ops import PAIR_OP, SYMM_MEM_OP
    from probes.vocabulary.pairs import PairPoint
    from probes.vocabulary.records import Measurement

    point = PairPoint("gemm_all_reduce", 256, 256, 256).to_params()
    rows = [
        Measurement(PAIR_OP, {**point, "k": 1}, 2.0 * MS, 0, 5),
        Measurement(PAIR_OP, {**point, "k": 2}, 1.9 * MS, 0, 5),
        Measurement(SYMM_MEM_OP, {**point, "k": 1}, 1.0 * MS, 0, 5),
    ]
    other = {**point, "rows": 512}
    rows += [
        Measurement(PAIR_OP, {**other, "k": 1}, 4.0 * MS, 0, 5),
        Measurement(SYMM_MEM_OP, {**other, "k": 1}, 1.0 * MS, 0, 5),
    ]
    fitted = fit_symm_mem(rows)
    assert fitted["gemm_all_reduce"]["n"] == 2
    assert fitted["gemm_all_reduce"]["ratio"] == pytest.approx(math.sqrt(0.5 * 0.25))

    graph = two_rank_graph()  # the pair kind only decides which ratio applies
    graph.meta["substitutable"][0]["pair"] = "gemm_all_reduce"
    pair = SubstitutablePair("emb_a2a", "gemm_all_reduce", "emb", "a2a", ("emb_bwd",))
    one = fuse_as_one_kernel(graph, pair, 0.5, cost)
    assert iteration_ms(one) == pytest.approx(1 + 0.5 * (10 + 10) + 1 + 4)
    slow_slices = OverlapCalibration({"gemm_all_reduce": OverlapCosts(5 * MS, 1.0, 1.0)})
    model = FakeModel(slow_slices)
    model.symm_mem = {"gemm_all_reduce": {"ratio": 0.5, "n": 2}}
    decision = choose_substitutions(graph, model, slice_params, cost=cost)
    applied = apply_substitutions(
        PairPricing(graph, model, slice_params, cost), decision.choice_detail["substitutions"]
    )
    assert iteration_ms(applied) == pytest.approx(iteration_ms(one))  # the fused kernels, applied
    assert decision.choice == f"emb_a2a:k{SYMM_MEM_SLICES}"
    assert decision.choice_detail["substitutions"] == {"emb_a2a": SYMM_MEM_SLICES}
    assert decision.candidates[0].detail["predicted_symm_mem_ms"] == pytest.approx(iteration_ms(one))
    assert decision.predicted_ms == pytest.approx(iteration_ms(one))
    model.symm_mem = {"gemm_all_reduce": {"ratio": 1.1, "n": 2}}  # slower than unfused: not chosen
    assert choose_substitutions(graph, model, slice_params, cost=cost).choice == "none"

    from orchestrator.launch import _checked_substitutions

    assert _checked_substitutions({"b0.out": 0}, {"b0.out"}, {"b0.out"}) == {"b0.out": 0}
    with pytest.raises(ValueError, match="slices must be >= 1"):
        _checked_substitutions({"emb": 0}, {"emb"})


def test_symmetric_memory_kernels_run_only_on_cuda():
    from probes.workloads.overlap import symm_mem_supported

    assert not symm_mem_supported("cpu", 256, 2)
