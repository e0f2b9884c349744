"""Device time of captured ops (probes/trace_capture.py on CUDA) from hand-built profiler events,
and its use by the in-context rows; a real capture where a GPU exists."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from probes.overhead_trace import STEP_MARK
from probes.trace_capture import _one_step, capture_step_trace, device_collectives, device_time_by_op
from probes.vocabulary.in_context import in_context_rows, op_duration_s

MAIN, AUTOGRAD = 1, 2


def _ev(
    name,
    start,
    end,
    *,
    id=0,
    linked=0,
    thread=MAIN,
    parent=None,
    device=False,
    scope=0,
    shapes=(),
    annotation=False,
    stream=7,
    activity=None,
):
    e = SimpleNamespace(
        name=name,
        id=id,
        linked_correlation_id=linked,
        thread=thread,
        cpu_parent=parent,
        device_type=DeviceType.CUDA if device else DeviceType.CPU,
        is_async=False,
        scope=scope,
        is_user_annotation=annotation,
        time_range=SimpleNamespace(start=start, end=end),
        input_shapes=[list(s) for s in shapes],
        device_resource_id=stream if device else thread,
        activity_type=activity or ("kernel" if device else "cpu_op"),
    )
    return e


def _step():
    """One step (0-1000 us on the host): a linear (its addmm's GEMM kernel), a gelu (two
    kernels), an all-reduce (an NCCL kernel and the host's `nccl:` range), a view (no kernel),
    the gelu's backward on the autograd engine's thread, and a kernel nobody launched."""
    window = _ev(STEP_MARK, 0.0, 1000.0, scope=7, annotation=True)
    fwd = _ev("## forward ##", 5.0, 95.0, scope=7, annotation=True, parent=window)
    linear = _ev("aten::linear", 10.0, 60.0, id=1, parent=fwd, shapes=[(64, 32), (16, 32), (16,)])
    addmm = _ev("aten::addmm", 12.0, 58.0, id=2, parent=linear)
    launch = _ev("cudaLaunchKernel", 20.0, 25.0, id=90, linked=2, parent=addmm)
    gelu = _ev("aten::gelu", 60.0, 80.0, id=3, parent=fwd, shapes=[(64, 16)])
    allreduce = _ev("c10d::allreduce_", 80.0, 90.0, id=4, parent=fwd)
    nccl_host = _ev("nccl:all_reduce", 82.0, 88.0, id=8, parent=allreduce)
    view = _ev("aten::view", 92.0, 93.0, id=6, parent=fwd)
    engine = _ev("autograd::engine::evaluate_function: GeluBackward0", 100.0, 150.0, thread=AUTOGRAD)
    gelu_bwd = _ev(
        "aten::gelu_backward", 101.0, 140.0, id=5, thread=AUTOGRAD, parent=engine, shapes=[(64, 16), (64, 16)]
    )
    kernels = [
        _ev("sm90_gemm", 100.0, 300.0, id=101, linked=2, device=True),
        _ev("vectorized_elementwise_kernel<gelu>", 300.0, 350.0, id=102, linked=3, device=True),
        _ev("Memset (Device)", 360.0, 370.0, id=103, linked=3, device=True),
        _ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 400.0, 600.0, id=104, linked=4, device=True, stream=13),
        _ev("vectorized_elementwise_kernel<gelu_bwd>", 620.0, 640.0, id=105, linked=5, device=True),
        _ev("orphan_kernel", 650.0, 660.0, id=106, linked=99, device=True),
        # GPU-side copies of record_function ranges (they span kernels, they are not work)
        _ev(STEP_MARK, 90.0, 700.0, device=True, annotation=True),
        _ev("aten::addmm", 100.0, 300.0, linked=2, device=True, activity="gpu_user_annotation"),
    ]
    host = [window, fwd, linear, addmm, launch, gelu, allreduce, nccl_host, view, engine, gelu_bwd]
    named = {e.name: e for e in host}
    return window, host, kernels, named


def test_kernels_are_attributed_to_their_top_level_op():
    window, host, kernels, named = _step()
    spans = device_time_by_op(host + kernels)
    assert spans[id(named["aten::linear"])] == {"device_us": 200.0, "start_us": 100.0, "end_us": 300.0, "kernels": 1}
    assert spans[id(named["aten::gelu"])] == {"device_us": 60.0, "start_us": 300.0, "end_us": 370.0, "kernels": 2}
    assert spans[id(named["aten::gelu_backward"])]["device_us"] == 20.0
    # the NCCL kernel is communication, not the launching op's compute; the orphan has no op
    assert set(spans) == {id(named["aten::linear"]), id(named["aten::gelu"]), id(named["aten::gelu_backward"])}
    ((nccl, launched_at),) = device_collectives(host + kernels)
    assert nccl.name.startswith("ncclDevKernel") and launched_at == 80.0


def test_a_cuda_step_uses_kernel_time_and_keeps_the_host_span():
    window, host, kernels, named = _step()
    events = host + kernels
    step = _one_step(events, window, (device_time_by_op(events), device_collectives(events)))
    assert step["device"] == "cuda" and step["step_s"] == pytest.approx(1e-3)
    ops = {o["name"]: o for o in step["ops"]}
    assert [o["name"] for o in step["ops"]] == [
        "aten::linear",
        "aten::gelu",
        "c10d::allreduce_",
        "aten::view",
        "aten::gelu_backward",
    ]
    linear = ops["aten::linear"]
    assert (linear["start_s"], linear["end_s"]) == pytest.approx((10e-6, 60e-6))  # host: the issue order
    assert linear["device_s"] == pytest.approx(200e-6) and linear["kernels"] == 1
    assert (linear["device_start_s"], linear["device_end_s"]) == pytest.approx((100e-6, 300e-6))
    assert ops["aten::gelu"]["device_s"] == pytest.approx(60e-6)
    assert ops["aten::view"]["device_s"] == 0.0 and ops["aten::view"]["kernels"] == 0
    assert ops["c10d::allreduce_"]["kernels"] == 0
    # the NCCL kernel is the work item (on its stream), the host's bracketing range is not
    assert step["comm"] == [
        {
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "start_s": pytest.approx(400e-6),
            "end_s": pytest.approx(600e-6),
            "thread": 13,
        }
    ]

    rows = in_context_rows([step], "cuda", 1, "test")
    by_op = {r.params["aten_op"]: r for r in rows}
    assert set(by_op) == {"aten::linear", "aten::gelu", "aten::gelu_backward"}
    assert by_op["aten::linear"].median_s == pytest.approx(200e-6)  # kernel time, not the 50 us dispatch
    assert by_op["aten::gelu_backward"].median_s == pytest.approx(20e-6)


def test_the_cpu_capture_is_unchanged():
    window, host, kernels, named = _step()
    cpu = _one_step(host, window)
    assert [o["name"] for o in cpu["ops"]] == ["aten::linear", "aten::gelu", "c10d::allreduce_", "aten::view"]
    assert all(set(o) == {"name", "start_s", "end_s", "shapes"} for o in cpu["ops"]) and "device" not in cpu
    assert [c["name"] for c in cpu["comm"]] == ["nccl:all_reduce"]
    # CUDA activity recorded but no device work in the step: written as on CPU
    assert _one_step(host, window, ({}, [])) == cpu
    assert op_duration_s(cpu["ops"][0]) == pytest.approx(50e-6)
    rows = in_context_rows([cpu], "cpu", 1, "test")
    assert [r.median_s for r in rows] == pytest.approx([50e-6, 20e-6])


def test_capture_on_cpu_records_no_device_keys():
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(64, 32)

    def step():
        torch.nn.functional.gelu(lin(x)).sum().backward()

    trace = capture_step_trace(step, iterations=2, warmup=1, cuda=False)
    assert len(trace["steps"]) == 2
    for s in trace["steps"]:
        assert "device" not in s and s["ops"]
        assert all("device_s" not in o for o in s["ops"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_capture_on_cuda_gives_ops_their_kernel_time():
    lin = torch.nn.Linear(1024, 1024).cuda()
    x = torch.randn(4096, 1024, device="cuda")

    def step():
        torch.nn.functional.gelu(lin(x)).sum().backward()
        torch.cuda.synchronize()

    trace = capture_step_trace(step, iterations=2, warmup=1)
    step0 = trace["steps"][-1]
    assert step0["device"] == "cuda"
    ops = {o["name"]: o for o in step0["ops"]}
    assert ops["aten::linear"]["kernels"] >= 1 and ops["aten::linear"]["device_s"] > 0
    assert ops["aten::gelu"]["device_s"] > 0
    assert "aten::gelu_backward" in ops and ops["aten::gelu_backward"]["device_s"] > 0  # the autograd thread's op
    rows = in_context_rows(trace["steps"], "cuda", 1, "test")
    assert {r.params["aten_op"] for r in rows} >= {"aten::linear", "aten::gelu", "aten::gelu_backward"}
