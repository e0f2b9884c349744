"""Element-wise and GEMM-variant probes measure real kernels; their params feed the models."""

import json

import pytest

from predictors.opmodels import GroupedCostModel, OpModel
from probes.elementwise import elementwise_specs, measure_elementwise
from probes.gemm import gemm_specs, measure_gemm
from probes.overlap import overlap_specs
from probes.probe import ProbeSpec
from probes.sweep import interleave, run_local_probe
from probes.vocabulary.ops import ELEMENTWISE_OPS, GEMM_VARIANTS, gemm_params
from probes.vocabulary.records import Measurement


@pytest.mark.parametrize("op", ELEMENTWISE_OPS)
def test_elementwise_probe_times_every_op(op):
    small, large = measure_elementwise(op, 4, 64), measure_elementwise(op, 512, 1024)
    assert small.op == op and small.family == "elementwise" and small.median_s > 0
    assert large.median_s > 0 and large.repeats >= 3 and large.spread_s >= 0  # times compared in benchmarks, not here
    assert large.params["numel"] == 512 * 1024
    three = op in ("add", "mul") or op.endswith("_bwd")  # two inputs read (grad and saved tensor), one written
    assert large.params["bytes"] == (3 if three else 2) * 512 * 1024 * 4


def test_elementwise_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown element-wise op 'sigmoid'"):
        measure_elementwise("sigmoid", 2, 2)


def test_gemm_variants_params_and_timing():
    assert gemm_params(4, 5, 6, variant="bmm", batch=3)["flops"] == 2 * 3 * 4 * 5 * 6
    assert gemm_params(4, 5, 6, variant="baddbmm", batch=3)["flops"] == 2 * 3 * 4 * 5 * 6 + 3 * 4 * 5
    assert gemm_params(4, 5, 6, variant="addmm")["bytes"] == 4 * (4 * 6 + 6 * 5 + 4 * 5 + 5)
    with pytest.raises(ValueError, match="no batch dimension"):
        gemm_params(4, 5, 6, variant="mm", batch=2)
    times = {
        v: measure_gemm(64, 64, 64, variant=v, batch=1 if v in ("mm", "addmm") else 16).median_s for v in GEMM_VARIANTS
    }
    assert times["bmm"] > times["mm"]  # 16 products take longer than one
    row = measure_gemm(32, 16, 8, dtype="bfloat16", product="grad_weight")
    assert row.params["dtype"] == "bfloat16" and row.params["product"] == "grad_weight"


def test_sweeps_cover_variants_dtypes_and_ops():
    specs = gemm_specs(400, seed=0)
    assert {s.params["variant"] for s in specs} == set(GEMM_VARIANTS)
    assert {s.params["dtype"] for s in specs} == {"float32", "bfloat16"}  # no fp16 on a CPU sweep
    assert all(
        2 * s.params["batch"] * s.params["M"] * s.params["N"] * s.params["K"] <= 2 * 256**3
        for s in specs
        if s.params["dtype"] == "bfloat16"
    )
    assert {s.params["dtype"] for s in gemm_specs(200, seed=0, device_kind="cuda")} == {
        "float32",
        "bfloat16",
        "float16",
    }
    ew = elementwise_specs(16, seed=0)
    assert {s.params["op"] for s in ew} == set(ELEMENTWISE_OPS)
    assert run_local_probe(ew[0])[0].op == ew[0].params["op"]


def test_a_budget_cut_leaves_every_list_its_share():
    def points(name: str, n: int) -> list[ProbeSpec]:
        return [ProbeSpec("training", {}, f"{name}{i}") for i in range(n)]

    merged = interleave(points("d", 5), points("t", 4), points("o", 2), per_turn=(2, 2, 1))
    assert [s.key for s in merged] == ["d0", "d1", "t0", "t1", "o0", "d2", "d3", "t2", "t3", "o1", "d4"]
    assert [s.key for s in interleave(points("a", 2), points("b", 1))] == ["a0", "b0", "a1"]
    with pytest.raises(ValueError, match="per_turn"):
        interleave(points("a", 2), points("b", 1), per_turn=(1,))
    # the overlap pairs in turn: any prefix of three measures every kind of pair
    assert [s.params["pair"] for s in overlap_specs(2)[:3]] == [
        "gemm_all_reduce",
        "gemm_all_to_all",
        "embedding_all_to_all",
    ]


def test_grouped_cost_model_fits_per_dtype_and_flags_unmeasured_groups():
    rows = []
    for m in (16, 32, 64, 128, 256):
        for dtype, per_flop in (("float32", 1e-11), ("bfloat16", 5e-10)):
            p = gemm_params(m, m, m, dtype)
            rows.append(Measurement("gemm", p, 1e-6 + per_flop * p["flops"], 0.0, 5))
    model = GroupedCostModel("gemm", ["one", "flops"], "dtype", "float32").fit(rows)
    p32, p16 = gemm_params(100, 100, 100), gemm_params(100, 100, 100, "bfloat16")
    assert model.predict(p16) / model.predict(p32) > 20
    again = OpModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.predict(p16) == model.predict(p16)
    fp16 = gemm_params(100, 100, 100, "float16")
    assert any("never measured" in s for s in model.out_of_range(fp16))
    with pytest.raises(KeyError, match="dtype='float16'"):
        model.predict(fp16)


def test_memcpy_probe_on_cpu_and_gpu_only_directions():
    from probes.memcpy import measure_memcpy, memcpy_specs

    small, large = measure_memcpy("d2d", 4096), measure_memcpy("d2d", 64 * 2**20)
    assert small.op == "memcpy" and small.params == {"direction": "d2d", "bytes": 4096.0}
    assert large.median_s > 10 * small.median_s
    with pytest.raises(ValueError, match="needs a GPU"):
        measure_memcpy("h2d", 4096)
    assert {s.params["direction"] for s in memcpy_specs(9, 0)} == {"d2d"}
    assert {s.params["direction"] for s in memcpy_specs(9, 0, "cuda")} == {"d2d", "h2d", "d2h"}
