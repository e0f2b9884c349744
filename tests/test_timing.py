"""probes/timing.py: the device-clock control flow against a fake clock (no GPU needed), the
CPU path, and on a CUDA machine the real clock against torch.profiler's kernel durations."""

from __future__ import annotations

import sys
import time
import types

import numpy as np
import pytest
import torch

from probes import timing
from probes.timing import SPIN_MARGIN_S, SPIN_SAFETY, Timing, time_callable


class FakeClock:
    """A device clock that logs what is enqueued, in order. Every call of the timed function
    costs `call_s` of device time; `early(i)` says whether the device had already passed the
    start mark in sample i; `synchronizing` makes the function wait for a pending spin on the
    host, as a call that synchronizes the device would."""

    method = "fake_event"

    def __init__(self, call_s: float = 1e-3, early=lambda i: False, capture_ok: bool = True):
        self.log: list[tuple] = []
        self.call_s = call_s
        self.early = early
        self.capture_ok = capture_ok
        self.samples = 0
        self.pending_spin = 0.0

    # DeviceClock
    def sync(self):
        self.log.append(("sync",))
        self.pending_spin = 0.0

    def flush(self):
        self.log.append(("flush",))

    def hide_launch(self, seconds):
        self.log.append(("hide", seconds))
        self.pending_spin = seconds

    def start(self):
        self.log.append(("start",))

    def stop(self):
        self.log.append(("stop",))

    def started_early(self):
        return bool(self.early(self.samples))

    def elapsed(self):
        i = max(k for k, e in enumerate(self.log) if e[0] == "start")
        calls = sum(e[0] == "call" for e in self.log[i:])
        self.samples += 1
        self.pending_spin = 0.0
        return calls * self.call_s

    def capture(self, fn, calls):
        self.log.append(("capture", calls))
        if not self.capture_ok:
            return None

        def replay():
            for _ in range(calls):
                self.log.append(("call",))

        return replay

    # the timed function
    def fn(self, host_s: float = 0.0, synchronizing: bool = False):
        def call():
            wait = host_s + (self.pending_spin if synchronizing else 0.0)
            if wait:
                time.sleep(wait)
            self.log.append(("call",))

        return call


def _samples(log):
    """Per timed sample: (what was enqueued since the previous sample ended, what was inside the window)."""
    out, before, inside, timed = [], [], [], False
    for e in log:
        if e[0] == "start":
            timed, inside = True, []
        elif e[0] == "stop":
            out.append((before, inside))
            timed, before = False, []
        elif timed:
            inside.append(e)
        else:
            before.append(e)
    return out


def test_l2_flush_before_every_sample_and_never_inside_the_window():
    clock = FakeClock()
    t = time_callable(clock.fn(), device="cuda", warmup=2, min_repeats=6, max_repeats=6, clock=clock)
    samples = _samples(clock.log)
    assert len(samples) == t.repeats == 6
    for before, inside in samples:
        kinds = [e[0] for e in before]
        assert kinds.count("flush") == 1
        assert kinds.index("flush") < kinds.index("hide")  # the flush is not covered by the spin: not timed
        assert all(e[0] == "call" for e in inside)  # nothing but the calls inside the window
    assert t.l2_flushed and t.calls_per_sample == 1 and t.median_s == pytest.approx(1e-3)


def test_no_flush_when_asked_and_none_on_cpu():
    clock = FakeClock()
    t = time_callable(clock.fn(), device="cuda", min_repeats=3, max_repeats=3, flush_l2=False, clock=clock)
    assert not any(e[0] == "flush" for e in clock.log) and not t.l2_flushed
    cpu = time_callable(lambda: None, device="cpu", min_repeats=3, max_repeats=3, flush_l2=True)
    assert not cpu.l2_flushed and cpu.method == "perf_counter"


def test_on_cpu_a_setup_that_touched_the_inputs_is_flushed_out_before_each_sample(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(timing._HostClock, "flush", lambda self: order.append("flush"))
    t = time_callable(
        lambda: order.append("call"),
        device="cpu",
        warmup=1,
        min_repeats=3,
        max_repeats=3,
        setup=lambda: order.append("setup"),
        flush_after_setup=True,
    )
    assert t.l2_flushed and t.calls_per_sample == 1
    assert order == ["setup", "call"] + ["setup", "flush", "call"] * 3  # not in the warm-up, not timed


def test_host_cache_size_is_the_last_level_from_sysfs(tmp_path):
    for index, level, size in (("index0", "1", "48K"), ("index2", "2", "1024K"), ("index3", "3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert timing.host_cache_bytes(str(tmp_path)) == 32 << 20
    assert timing.host_cache_bytes(str(tmp_path / "missing")) == timing.FALLBACK_HOST_CACHE_BYTES


def test_launch_hiding_is_enqueued_before_the_start_and_covers_the_sample():
    clock = FakeClock()
    host_s = 2e-3  # each call takes 2 ms of host time to launch
    t = time_callable(clock.fn(host_s), device="cuda", warmup=3, min_repeats=4, max_repeats=4, clock=clock)
    for before, inside in _samples(clock.log):
        assert before[-1][0] == "hide"  # the last thing before the start mark
        calls = sum(e[0] == "call" for e in inside)
        assert before[-1][1] >= SPIN_SAFETY * host_s * calls  # covers every launch of the sample
        assert before[-1][1] <= timing.MAX_SPIN_S
    assert t.method == "fake_event+spin" and t.exposed == 0


def test_batching_rules():
    # On a device with the flush: one call per sample, even for a fast call.
    clock = FakeClock(call_s=1e-6)
    t = time_callable(clock.fn(), device="cuda", min_repeats=3, max_repeats=3, clock=clock)
    assert t.calls_per_sample == 1 and all(len(inside) == 1 for _, inside in _samples(clock.log))
    # Without the flush a fast call is batched as on CPU, and the spin covers the whole batch.
    # The batch is sized from the call's device time (1 us: 200 calls make the 200 us sample),
    # read from the warm-up calls after the first in a hidden window, not from the host's 100 us
    # per launch (which would make it 2 calls).
    clock = FakeClock(call_s=1e-6)
    t = time_callable(
        clock.fn(host_s=1e-4), device="cuda", warmup=3, min_repeats=3, max_repeats=3, flush_l2=False, clock=clock
    )
    sizing, *samples = _samples(clock.log)
    assert sizing[0][-1][0] == "hide" and sum(e[0] == "call" for e in sizing[1]) == 2  # warm-up calls 2 and 3
    assert 190 <= t.calls_per_sample <= 210
    for before, inside in samples:
        assert sum(e[0] == "call" for e in inside) == t.calls_per_sample
        assert before[-1][0] == "hide" and before[-1][1] >= SPIN_MARGIN_S
    assert t.median_s == pytest.approx(1e-6)  # per call
    # A setup forces one call per sample; it runs (and is finished) before the flush.
    clock = FakeClock(call_s=1e-6)
    setups = []
    t = time_callable(
        clock.fn(),
        device="cuda",
        min_repeats=3,
        max_repeats=3,
        flush_l2=False,
        setup=lambda: (setups.append(1), clock.log.append(("setup",))),
        clock=clock,
    )
    assert t.calls_per_sample == 1
    clock2 = FakeClock()
    time_callable(
        clock2.fn(),
        device="cuda",
        min_repeats=3,
        max_repeats=3,
        setup=lambda: clock2.log.append(("setup",)),
        clock=clock2,
    )
    for before, _ in _samples(clock2.log)[:]:
        kinds = [e[0] for e in before]
        assert kinds[-4:] == ["setup", "sync", "flush", "hide"]
    # CPU: a fast call is batched.
    cpu = time_callable(lambda: None, device="cpu", min_repeats=3, max_repeats=3)
    assert cpu.calls_per_sample > 1


def test_every_rank_calls_fn_the_same_number_of_times():
    # Collectives: warmup 0, fixed repeats; exposed samples are kept, never retried.
    clock = FakeClock(early=lambda i: i % 2 == 0)
    t = time_callable(clock.fn(), device="cuda", warmup=0, min_repeats=7, max_repeats=7, max_seconds=1e9, clock=clock)
    assert sum(e[0] == "call" for e in clock.log) == 7 == t.repeats
    assert t.exposed == 4 and not any(e[0] == "capture" for e in clock.log)  # never a graph unless asked


def test_a_short_spin_grows_after_an_exposed_sample():
    clock = FakeClock(early=lambda i: i == 0)
    t = time_callable(clock.fn(), device="cuda", warmup=2, min_repeats=3, max_repeats=3, clock=clock)
    spins = [e[1] for e in clock.log if e[0] == "hide"]
    assert spins[1] >= 2 * spins[0] - 1e-12 and spins[2] == spins[1]
    assert t.exposed == 1 and t.method == "fake_event+spin"


def test_a_synchronizing_call_gives_up_launch_hiding():
    clock = FakeClock(early=lambda i: True)
    t = time_callable(
        clock.fn(host_s=1e-4, synchronizing=True), device="cuda", warmup=1, min_repeats=5, max_repeats=5, clock=clock
    )
    hides = [i for i, e in enumerate(clock.log) if e[0] == "hide"]
    assert len(hides) == 2  # two exposed samples where the host waited out the spin, then plain events
    assert t.method == "fake_event" and t.repeats == 5


def test_graph_replays_when_asked_and_the_spin_when_capture_fails():
    clock = FakeClock(call_s=1e-6)
    t = time_callable(clock.fn(), device="cuda", min_repeats=3, max_repeats=3, flush_l2=False, graph=True, clock=clock)
    assert ("capture", t.calls_per_sample) in clock.log and t.method == "fake_graph+spin"
    assert all(len(inside) == t.calls_per_sample for _, inside in _samples(clock.log)[1:])
    # By default a device batch is a graph and a single call is not; graph=False never captures.
    batch = FakeClock(call_s=1e-6)
    t = time_callable(batch.fn(), device="cuda", min_repeats=3, max_repeats=3, flush_l2=False, clock=batch)
    assert t.calls_per_sample > 1 and ("capture", t.calls_per_sample) in batch.log and t.method == "fake_graph+spin"
    single = FakeClock(call_s=1e-6)
    t = time_callable(single.fn(), device="cuda", min_repeats=3, max_repeats=3, clock=single)  # flushed: one call
    assert t.calls_per_sample == 1 and not any(e[0] == "capture" for e in single.log)
    eager = FakeClock(call_s=1e-6)
    t = time_callable(eager.fn(), device="cuda", min_repeats=3, max_repeats=3, flush_l2=False, graph=False, clock=eager)
    assert t.calls_per_sample > 1 and not any(e[0] == "capture" for e in eager.log) and t.method == "fake_event+spin"
    failing = FakeClock(capture_ok=False)
    t = time_callable(failing.fn(), device="cuda", min_repeats=3, max_repeats=3, graph=True, clock=failing)
    assert ("capture", 1) in failing.log and t.method == "fake_event+spin"
    with_setup = FakeClock()
    time_callable(
        with_setup.fn(), device="cuda", min_repeats=3, max_repeats=3, graph=True, setup=lambda: None, clock=with_setup
    )
    assert not any(e[0] == "capture" for e in with_setup.log)  # a setup's fresh inputs cannot be replayed


def test_cpu_path_times_real_calls_with_perf_counter():
    t = time_callable(lambda: time.sleep(2e-3), device="cpu", warmup=1, min_repeats=5, max_repeats=9)
    assert isinstance(t, Timing) and t.method == "perf_counter" and t.calls_per_sample == 1
    assert 5 <= t.repeats <= 9 and t.exposed == 0
    assert t.median_s >= 2e-3  # at least what the host slept (a busy host adds jitter on top, unbounded)

    calls = []
    t = time_callable(lambda: calls.append(1), device="cpu", warmup=2, min_repeats=3, max_repeats=3)
    assert len(calls) == 2 + 3 * t.calls_per_sample and t.calls_per_sample > 1
    assert 0 < t.median_s < 200e-6


def test_the_cpu_median_is_the_median_of_the_perf_counter_samples(monkeypatch):
    # A fake perf_counter: every sample of one call lasts a known amount.
    durations = iter([1.0, 3.0, 2.0, 5.0, 4.0] * 10)
    now = [0.0]

    def fn():
        now[0] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    t = time_callable(fn, device="cpu", warmup=0, min_repeats=5, max_repeats=5, max_seconds=1e9)
    assert t.repeats == 5 and t.median_s == 3.0 and t.spread_s == pytest.approx(2.0)


def test_l2_flush_size_falls_back_without_a_device(monkeypatch):
    def no_props(device):
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_props)
    assert timing.l2_flush_bytes(torch.device("cuda", 0)) == 256 << 20
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(L2_cache_size=50 << 20))
    assert timing.l2_flush_bytes(torch.device("cuda", 0)) == 100 << 20


# Settings recorded beside the hardware id (orchestrator/cluster.py), part of the same issue.


def test_tf32_settings_and_gpu_clocks_are_software_not_hardware(monkeypatch):
    from orchestrator import cluster

    versions = cluster.software_versions()
    assert versions["tf32_matmul"] in ("True", "False") and versions["tf32_cudnn"] in ("True", "False")
    assert versions["float32_matmul_precision"] == torch.get_float32_matmul_precision()

    class NVMLError(Exception):
        pass

    clocks = {("app", 1): 1755, ("app", 2): 2619, ("max", 1): 1980, ("max", 2): 2619}
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_P2P_CAPS_INDEX_NVLINK=0,
        NVML_P2P_STATUS_OK=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 << 30),
        nvmlDeviceGetP2PStatus=lambda a, b, c: 0,
        nvmlDeviceGetApplicationsClock=lambda h, kind: clocks[("app", kind)] - (h if kind == 1 else 0),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: clocks[("max", kind)],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    devices, _, software = cluster._nvml_devices()
    assert len(devices) == 2
    assert software["gpu_sm_app_clock_mhz"] == "1755,1754" and software["gpu_mem_app_clock_mhz"] == "2619"
    assert software["gpu_sm_max_clock_mhz"] == "1980" and software["gpu_mem_max_clock_mhz"] == "2619"
    node = cluster.NodeFingerprint("h", "cpu", 8, 64 << 30, devices, software={**versions, **software})
    key = repr(node.hardware_key())
    assert "1755" not in key and "1980" not in key and "tf32" not in key

    def unsupported(h, kind):
        raise NVMLError("not supported")

    fake.nvmlDeviceGetApplicationsClock = unsupported
    fake.nvmlDeviceGetMaxClockInfo = unsupported
    _, _, software = cluster._nvml_devices()
    assert not any("clock" in k for k in software) and software["driver"] == "550.54"


# On a CUDA machine: the real clock against the profiler's kernel durations.


def _profiled_kernel_s(fn, flush: bool = True, calls: int = 30) -> float:
    """Median device time of `fn`'s kernels per call, from torch.profiler (L2 flushed before
    each call, as time_callable does)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    scratch = torch.zeros(timing.l2_flush_bytes(torch.device("cuda")) // 4, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # the calls queue behind a spin and run back to back, as time_callable's do (a GPU left
        # idle between microsecond kernels runs them slower)
        timing.CudaClock("cuda").hide_launch(calls * 100e-6)
        for _ in range(calls):
            if flush:
                scratch.sum()  # as time_callable flushes: a read, no dirty lines to write back
            with record_function("timed_target"):
                fn()
        torch.cuda.synchronize()
    times = [
        e.device_time_total * 1e-6
        for e in prof.events()
        if e.name == "timed_target" and e.device_type == DeviceType.CPU
    ]
    assert len(times) == calls and min(times) > 0
    return float(np.median(times))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
def test_cuda_microsecond_kernel_matches_the_profiler():
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)

    def fn():
        torch.mul(x, 1.0001, out=y)  # ~5 us: 8 MiB through HBM

    # The profiler sees back-to-back calls, operands warm in L2: compared unflushed, like for
    # like (a batch, replayed from a graph).
    t = time_callable(fn, device="cuda", max_repeats=200, min_repeats=50, flush_l2=False)
    ref = _profiled_kernel_s(fn, flush=False)
    assert t.method == "cuda_graph+spin" and not t.l2_flushed and t.calls_per_sample > 1
    assert t.median_s == pytest.approx(ref, rel=0.15), (t, ref)
    # The probes' default, one call after a flush: cold operands are never faster than warm.
    cold = time_callable(fn, device="cuda", max_repeats=200, min_repeats=50)
    assert cold.method == "cuda_event+spin" and cold.l2_flushed and cold.calls_per_sample == 1
    assert cold.median_s >= 0.95 * t.median_s, (cold, t)


@pytest.mark.cuda
@cuda
def test_cuda_gemm_matches_the_profiler():
    a = torch.randn(16384, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 16384, device="cuda", dtype=torch.float16)

    def fn():
        torch.mm(a, b)  # 4.4 TFLOP: ~5-7 ms on an H100 / H200

    t = time_callable(fn, device="cuda", max_repeats=20)
    ref = _profiled_kernel_s(fn, calls=10)
    assert 1e-3 < ref < 30e-3
    assert t.median_s == pytest.approx(ref, rel=0.15), (t, ref)


@pytest.mark.cuda
@cuda
def test_cuda_graph_replay_and_its_fallback():
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    t = time_callable(lambda: torch.mul(x, 1.0001, out=y), device="cuda", graph=True, min_repeats=20)
    assert t.method == "cuda_graph+spin"
    # A call that synchronizes cannot be captured: eager events with the spin (then plain events).
    t = time_callable(lambda: torch.mul(x, 1.0001, out=y).sum().item(), device="cuda", graph=True, min_repeats=20)
    assert t.method in ("cuda_event+spin", "cuda_event") and t.median_s > 0
