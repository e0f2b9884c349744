"""Reduced precision: element-wise probes and models per dtype, TBE weights per precision,
bfloat16 / float16 training probes, and the sweeps that draw them per device kind."""

import json

import numpy as np
import pytest
import torch

from predictors.families import baseline_model_for, default_model_for
from predictors.learned_model import ROW_OP_DESIGN, LearnedKernelModel
from predictors.opmodels import GroupedCostModel, OpModel
from predictors.transformer_graph import build_transformer_graph
from probes.elementwise import elementwise_specs, measure_elementwise
from probes.embedding import embedding_specs, measure_tbe
from probes.probe import ProbeSpec
from probes.sweep import run_local_probe
from probes.training import run_training_probe, transformer_training_specs
from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.ops import elementwise_params, gemm_params
from probes.vocabulary.records import Measurement
from probes.vocabulary.tbe_features import expected_features
from probes.vocabulary.transformer_spec import TransformerSpec, TransformerSpecError
from probes.workloads.transformer import ParallelTransformer


def _roofline_rows(op, dtype, per_byte, sizes, drop_dtype=False):
    rows = []
    for rows_, cols in sizes:
        p = elementwise_params(op, rows_, cols, dtype)
        if drop_dtype:
            p.pop("dtype")  # a row measured before dtypes were recorded
        rows.append(Measurement(op, p, 2e-6 + per_byte * p["bytes"] / (2 if dtype == "float32" else 1), 0.0, 5))
    return rows


SIZES = [(r, c) for r in (8, 64, 512, 2048) for c in (64, 256, 1024, 4096)]


@pytest.mark.parametrize("op", ["gelu", "layer_norm"])
def test_bf16_elementwise_rows_get_their_own_model(op):
    # bf16 moves half the bytes at the same time per element: per byte it costs twice fp32, so
    # the same shape costs the same; a model shared with fp32 (per byte) would call it half.
    rows = _roofline_rows(op, "float32", 1e-10, SIZES) + _roofline_rows(op, "bfloat16", 1e-10, SIZES)
    for model in (default_model_for(op).fit(rows), baseline_model_for(op).fit(rows)):
        again = OpModel.from_dict(json.loads(json.dumps(model.to_dict())))
        for m in (model, again):
            p32, p16 = elementwise_params(op, 1024, 1024), elementwise_params(op, 1024, 1024, "bfloat16")
            assert p16["bytes"] == p32["bytes"] / 2
            assert m.predict(p16) == pytest.approx(m.predict(p32), rel=0.15)
            assert m.predict(p16) == pytest.approx(2e-6 + 1e-10 * p16["bytes"], rel=0.15)
        fp16 = elementwise_params(op, 1024, 1024, "float16")  # never measured: never priced as another dtype
        assert any("never measured" in s for s in model.out_of_range(fp16))
        with pytest.raises(KeyError, match="dtype='float16'"):
            model.predict(fp16)


def test_rows_and_bundles_without_dtype_predict_as_float32():
    old_rows = _roofline_rows("gelu", "float32", 1e-10, SIZES, drop_dtype=True)
    model = default_model_for("gelu").fit(old_rows)
    p32 = elementwise_params("gelu", 300, 700)
    no_dtype = {k: v for k, v in p32.items() if k != "dtype"}
    assert model.predict(p32) == model.predict(no_dtype) == pytest.approx(2e-6 + 0.5e-10 * p32["bytes"], rel=0.15)
    # a bundle fitted before element-wise models were grouped: an ungrouped base, loaded from JSON
    old = LearnedKernelModel("gelu", ["one", "bytes"], ROW_OP_DESIGN).fit(old_rows).to_dict()
    assert old["base"]["kind"] == "linear_nnls"
    assert OpModel.from_dict(old).predict(p32) == pytest.approx(model.predict(p32), rel=0.15)
    # embedding rows without a weights precision are the fp32 group
    tables = [TableShape(1000 * (i + 1), 16, 2) for i in range(3)]
    emb_rows = []
    for b in (64, 128, 256, 512, 1024, 2048, 4096, 8192):
        f = expected_features(tables, b)
        f.pop("weights_precision")
        emb_rows.append(Measurement("embedding_fwd", f, 1e-5 + 1e-9 * f["gathered_elems"], 0.0, 5))
    emb = default_model_for("embedding_fwd").fit(emb_rows)
    assert emb.base.groups.keys() == {"fp32"}
    query = expected_features(tables, 700)
    assert query["weights_precision"] == "fp32"
    assert emb.predict(query) == pytest.approx(1e-5 + 1e-9 * query["gathered_elems"], rel=0.2)
    with pytest.raises(KeyError, match="weights_precision='fp16'"):
        emb.predict(expected_features(tables, 700, weights_precision="fp16"))


def test_a_dtype_with_too_few_rows_is_scaled_from_its_own_rows_not_dropped():
    rows = [Measurement("gemm", gemm_params(m, m, m), 1e-6 + 1e-11 * 2 * m**3, 0.0, 5) for m in range(16, 400, 40)]
    rows += [Measurement("gemm", gemm_params(m, m, m, "bfloat16"), 1e-6 + 5e-10 * 2 * m**3, 0.0, 5) for m in (200, 300)]
    model = default_model_for("gemm").fit(rows)  # two bf16 rows cannot fit four coefficients
    bf16, fp32 = model.predict(gemm_params(250, 250, 250, "bfloat16")), model.predict(gemm_params(250, 250, 250))
    assert bf16 == pytest.approx(1e-6 + 5e-10 * 2 * 250**3, rel=0.3) and bf16 > 20 * fp32
    grouped = GroupedCostModel("gemm", ["one", "flops", "bytes", "mn"], "dtype", "float32").fit(rows)
    assert OpModel.from_dict(grouped.to_dict()).predict(gemm_params(250, 250, 250, "bfloat16")) == pytest.approx(
        grouped.predict(gemm_params(250, 250, 250, "bfloat16"))
    )


def test_element_wise_ops_run_in_every_dtype_on_cpu():
    for op in ("gelu", "layer_norm_bwd", "softmax", "dropout"):
        for dtype in ("bfloat16", "float16"):
            row = measure_elementwise(op, 64, 256, dtype=dtype, max_seconds=0.1)
            assert row.params["dtype"] == dtype and row.median_s > 0
            assert row.params["bytes"] == elementwise_params(op, 64, 256)["bytes"] / 2
    with pytest.raises(ValueError, match="unknown element-wise dtype 'float64'"):
        measure_elementwise("relu", 4, 4, dtype="float64")
    spec = ProbeSpec("elementwise", {"op": "add", "rows": 8, "cols": 32, "dtype": "bfloat16"})
    assert run_local_probe(spec)[0].params["dtype"] == "bfloat16"


def test_specs_draw_dtypes_by_device_kind():
    cpu, cuda = elementwise_specs(400, seed=0), elementwise_specs(400, seed=0, device_kind="cuda")
    assert {s.params["dtype"] for s in cpu} == {"float32", "bfloat16", "float16"}
    assert {s.params["dtype"] for s in cuda} == {"float32", "bfloat16", "float16"}
    share = lambda specs, d: np.mean([s.params["dtype"] == d for s in specs[33:]])  # noqa: E731
    assert share(cpu, "float32") > 0.6 and share(cuda, "float32") < 0.5 and share(cuda, "bfloat16") > 0.3
    assert {s.params["dtype"] for s in cpu[:33]} == {"float32"}  # a sweep cut short keeps every op's fp32 model
    # the dtype has its own random stream: the shapes are the ones the sweep always drew
    assert [(s.params["rows"], s.params["cols"]) for s in cpu] == [(s.params["rows"], s.params["cols"]) for s in cuda]

    emb_cpu, emb_cuda = embedding_specs(200, seed=0), embedding_specs(200, seed=0, device_kind="cuda")
    assert {s.params["weights_precision"] for s in emb_cpu} == {"fp32", "fp16"}  # no bf16 TBE kernels on CPU
    assert {s.params["weights_precision"] for s in emb_cuda} == {"fp32", "fp16", "bf16"}
    assert [s.params["tables"] for s in emb_cpu] == [s.params["tables"] for s in emb_cuda]

    tf_cpu = transformer_training_specs(8, seed=0, world=2)
    tf_cuda = transformer_training_specs(8, seed=0, world=2, device_kind="cuda")
    assert {s.params["transformer"]["dtype"] for s in tf_cpu} == {"float32"}
    dtypes = [s.params["transformer"]["dtype"] for s in tf_cuda]
    assert dtypes.count("bfloat16") == 4 and {dtypes[2], dtypes[3]} == {"bfloat16"}  # small and task-shaped
    for s in tf_cpu + tf_cuda:
        assert TransformerSpec.from_dict(s.params["transformer"]).dtype == s.params["transformer"]["dtype"]


def test_transformer_spec_dtype_round_trips_and_is_validated():
    base = dict(layers=1, hidden=32, heads=2, seq_len=8, batch_size=2, world_size=1)
    spec = TransformerSpec(**base, dtype="bfloat16")
    assert TransformerSpec.from_dict(spec.to_dict()) == spec
    assert TransformerSpec.from_dict(base).dtype == "float32"  # specs written before dtype existed
    with pytest.raises(TransformerSpecError, match=r"dtype: expected one of \['float32', 'bfloat16', 'float16'\]"):
        TransformerSpec(**base, dtype="float64")


def test_float16_training_on_cpu_names_the_field(one_rank):
    spec = TransformerSpec(layers=1, hidden=32, heads=2, seq_len=8, batch_size=2, world_size=1, dtype="float16")
    with pytest.raises(ValueError, match=r"dtype: 'float16' needs a CUDA device.*\['float32', 'bfloat16'\]"):
        ParallelTransformer(spec, 0, torch.device("cpu"))


def test_bf16_transformer_probe_runs_on_a_one_rank_group(one_rank):
    torch.manual_seed(0)
    spec = dict(
        layers=1,
        hidden=32,
        heads=2,
        seq_len=16,
        batch_size=2,
        world_size=1,
        tensor_parallel=1,
        dropout=0.1,
        seed=0,
        name="probe-bf16",
        dtype="bfloat16",
    )
    model = ParallelTransformer(TransformerSpec.from_dict(spec), 0, torch.device("cpu"))
    losses = [model.step() for _ in range(4)]
    assert all(np.isfinite(losses))
    assert all(p.dtype == torch.float32 for p in model.model.parameters())  # autocast: float32 weights
    rows = run_training_probe(ProbeSpec("training", {"transformer": spec}), iterations=3, warmup=1)
    step = [r for r in rows if r.op == "transformer_step"]
    assert len(step) == 1 and step[0].params["transformer"]["dtype"] == "bfloat16" and step[0].median_s > 0
    assert step[0].params["in_step_collectives"] == [[], [], []]  # three captured steps, one rank: no collectives


def test_graph_prices_a_bf16_stack_in_the_dtypes_its_ops_run_in():
    base = dict(layers=2, hidden=64, heads=4, seq_len=16, batch_size=2, world_size=2, tensor_parallel=1)
    fp32, bf16 = (build_transformer_graph(TransformerSpec(**base, dtype=d)).ranks[0] for d in ("float32", "bfloat16"))
    assert {o.params["dtype"] for o in fp32 if o.op in ("gemm", "softmax", "layer_norm", "gelu")} == {"float32"}
    assert not [o for o in fp32 if "cast" in o.name]
    by_name = {o.name: o for o in bf16}
    assert {o.params["dtype"] for o in bf16 if o.op == "gemm"} == {"bfloat16"}
    for name in ("b0.softmax", "b0.gelu", "b0.gelu_bwd", "b0.softmax_bwd", "b0.attn_dropout"):
        assert by_name[name].params["dtype"] == "bfloat16"
    for name in ("b0.ln1", "b0.ln2_bwd", "b0.out_residual", "optimizer_step"):
        assert by_name[name].params["dtype"] == "float32"  # the residual stream stays float32
    assert by_name["b0.qkv_permute"].params["bytes"] == {o.name: o for o in fp32}["b0.qkv_permute"].params["bytes"] / 2
    casts = [o.name for o in bf16 if o.name.endswith("_cast")]
    assert "b0.qkv_weight_cast" in casts and "b0.qkv_input_cast" in casts and "b0.out_input_cast" not in casts
    assert "b1.fc1_grad_weight_cast" in casts and "b1.fc2_grad_output_cast" in casts


def test_tbe_fp16_weights_are_measured_on_cpu():
    tables = [TableShape(2000, 16, 4), TableShape(500, 8, 2)]
    rows = measure_tbe(tables, 128, max_seconds=0.2, weights_precision="fp16")
    assert [r.op for r in rows] == ["embedding_fwd", "embedding_bwd"]
    assert all(r.params["weights_precision"] == "fp16" and r.median_s > 0 for r in rows)
    assert measure_tbe(tables, 128, max_seconds=0.1)[0].params["weights_precision"] == "fp32"
    with pytest.raises(ValueError, match=r"weights_precision: expected one of \['fp32', 'fp16'\] on cpu, got 'bf16'"):
        measure_tbe(tables, 128, weights_precision="bf16")
    spec = ProbeSpec(
        "embedding", {"tables": [[2000, 16, 4, "uniform"]], "B": 64, "seed": 0, "weights_precision": "fp16"}
    )
    assert {r.params["weights_precision"] for r in run_local_probe(spec)} == {"fp16"}


def test_sharded_dlrm_stores_tables_in_the_weights_precision(one_rank, tiny_job_dict):
    from probes.vocabulary.jobspec import JobSpec
    from probes.workloads.dlrm import ShardedDLRM

    job = JobSpec.from_dict({**tiny_job_dict, "world_size": 1})
    plain = ShardedDLRM(job, [0] * 5, 0, 1, torch.device("cpu"))
    assert plain.tbe.split_embedding_weights()[0].dtype == torch.float32  # the default is unchanged
    half = ShardedDLRM(job, [0] * 5, 0, 1, torch.device("cpu"), weights_precision="fp16")
    assert half.tbe.split_embedding_weights()[0].dtype == torch.float16
    result = half.run(3, 1)
    assert all(np.isfinite(result.losses))
    with pytest.raises(ValueError, match="weights_precision"):
        ShardedDLRM(job, [0] * 5, 0, 1, torch.device("cpu"), weights_precision="int8")
