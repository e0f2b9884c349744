"""Timing discipline shared by every probe: warm-up, repeats until the median is stable.

On CPU we time with `perf_counter`. On CUDA the clock is the device's: a pair of events
brackets the timed calls, and two things keep that window device-true:

* launch hiding. Events recorded right after a synchronize would wait for the host to launch
  the calls, so a microsecond kernel would measure the host's launch time. Before the start
  event we enqueue a spin kernel (`torch.cuda._sleep`) long enough to cover the host launches of
  the sample (the measured host time per launch x launches, x2, + a margin, at most 50 ms): by
  the time the device reaches the start event the calls are already queued behind it, and the
  window holds device work only. This is the primary method because it works for every call:
  ops that synchronize, use several streams, or communicate (NCCL kernels queue behind the
  spin on every rank, which is harmless). If the device reaches the start event before the
  host has launched the sample (`Timing.exposed` counts those samples), the spin doubles for
  the next samples; a call that keeps the host waiting for the device (it synchronizes) has
  nothing to hide and is then timed with plain events (method `cuda_event`). A sample is never
  retried: callers timing collectives rely on every rank calling `fn` the same number of times.
  A sample of several calls (a batch, below) is captured in a CUDA graph and its replays are
  timed (still behind a spin, which covers the one replay launch): eager back-to-back kernels
  each add the front end's start of a kernel, ~1 us on an H200, which kernel durations leave
  out (`graph=None`, the default; `graph=True` captures single calls too, `graph=False` never).
  Capture failures fall back to the spin. A call that communicates is timed one call per
  sample (`min_sample_s=0`, as `probes.collective` does), so it is never captured.
* L2 flush. A scratch buffer of 2x the device's L2 (256 MiB when the size is unknown) is
  read before every timed sample, outside the window (before the spin, so it is not timed),
  so a cache-resident shape is not measured warmer than inside a training step (`flush_l2`).
  (Read rather than zeroed: zeroing leaves dirty lines whose write-back the timed call pays.)
  A one-call window still holds ~2 us beyond the kernel's duration on an H200 (the marks,
  1.3 us with nothing between them, and the kernel's start); what eager back-to-back kernels
  pay too, and what the in-context model refits against whole steps.
  A sample of back-to-back calls would be warm after its first call, so with the flush a CUDA
  sample is one call (events resolve ~0.5 us, and the hidden launch removes the host from the
  window); without it, short calls are batched as on CPU, the batch sized from one call's
  device time (read from the warm-up calls behind a spin).
  On CPU nothing is flushed unless the call's `setup` just touched what the call reads
  (`flush_after_setup`: a TBE backward after its forward updates the rows the forward read);
  then a scratch buffer of 2x the host's last-level cache is written after the setup, because
  in a training step other work (the exchange, the dense layers) runs between the two.

The device-clock control flow goes through the small `DeviceClock` interface, so it can be
tested without a GPU (tests/test_timing.py drives it with a fake clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

SPIN_SAFETY = 2.0  # spin covers this many times the expected host launch time
SPIN_MARGIN_S = 50e-6  # + the host's own work between the spin and the first call (event record)
MAX_SPIN_S = 50e-3  # never spin longer than this per sample
DEFAULT_LAUNCH_S = 100e-6  # host launch time assumed before any was measured (warmup=0, graph replay)
FALLBACK_L2_BYTES = 128 << 20  # 2x -> a 256 MiB scratch buffer when the L2 size is unknown
FALLBACK_HOST_CACHE_BYTES = 32 << 20  # 2x -> a 64 MiB scratch buffer when the host's LLC is unknown
HOST_CACHES = "/sys/devices/system/cpu/cpu0/cache"


@dataclass
class Timing:
    median_s: float
    spread_s: float
    repeats: int
    method: str = "perf_counter"  # perf_counter | cuda_event+spin | cuda_graph+spin | cuda_event
    calls_per_sample: int = 1  # calls of `fn` in one timed sample (the median is per call)
    l2_flushed: bool = False  # the cache was flushed before every sample (a device's L2, the host's LLC)
    exposed: int = 0  # samples whose window may hold host launch time (spin too short)


class DeviceClock(Protocol):
    """What `time_callable` needs from a device clock (CUDA events, or a fake in tests).

    Per sample the order is: [flush] [hide_launch] start, calls, stop, started_early, elapsed.
    """

    method: str  # how the samples are timed, e.g. "cuda_event"

    def sync(self) -> None:
        """Wait until the device has finished all enqueued work."""

    def flush(self) -> None:
        """Enqueue work that evicts the last-level cache (untimed)."""

    def hide_launch(self, seconds: float) -> None:
        """Enqueue device work lasting at least `seconds` that the timed calls queue behind."""

    def start(self) -> None:
        """Mark the start of the timed window on the device's queue."""

    def stop(self) -> None:
        """Mark the end of the timed window."""

    def started_early(self) -> bool:
        """Whether the device already passed the start mark (asked right after `stop`)."""

    def elapsed(self) -> float:
        """Seconds between the last start and stop marks (waits for the stop mark)."""

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object] | None:
        """A replayable capture of `calls` calls of `fn` (a CUDA graph), or None if it fails."""


def host_cache_bytes(caches: str = HOST_CACHES) -> int:
    """The host's last-level cache in bytes (Linux sysfs; `FALLBACK_HOST_CACHE_BYTES` unknown)."""
    levels = []
    for index in Path(caches).glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        number, unit = (size[:-1], units[size[-1]]) if size and size[-1] in units else (size, 1)
        if number.isdigit():
            levels.append((level, int(number) * unit))
    return max(levels)[1] if levels else FALLBACK_HOST_CACHE_BYTES


@lru_cache(maxsize=1)
def _host_scratch() -> torch.Tensor:
    """The buffer a host flush writes (2x the last-level cache), made once per process: a clock
    is made per timed call, and a sweep times thousands."""
    return torch.empty(2 * host_cache_bytes() // 4, dtype=torch.int32)


class _HostClock:
    """The host's clock: what CPU probes are timed with (nothing to hide; a flush writes a
    scratch buffer of 2x the last-level cache)."""

    method = "perf_counter"

    def __init__(self) -> None:
        self._t0 = self._t1 = 0.0

    def sync(self) -> None:
        pass

    def flush(self) -> None:
        _host_scratch().zero_()

    def hide_launch(self, seconds: float) -> None:
        pass

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._t1 = time.perf_counter()

    def started_early(self) -> bool:
        return False

    def elapsed(self) -> float:
        return self._t1 - self._t0

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object] | None:
        return None


_SPIN_CYCLES_PER_S: dict[int, float] = {}


def l2_flush_bytes(device: torch.device) -> int:
    """Bytes of scratch that evict the device's L2: twice its size (256 MiB if unknown)."""
    l2 = 0
    try:
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    except (RuntimeError, AssertionError, AttributeError):
        l2 = 0
    return 2 * (l2 if l2 > 0 else FALLBACK_L2_BYTES)


def _spin_cycles_per_s(index: int) -> float:
    """Clock cycles per second of `torch.cuda._sleep`'s spin, measured once per device with
    events (the SM clock under boost differs from the nominal rate); the nominal rate if that
    fails. An underestimate is caught per sample (`started_early`) and corrected."""
    if index in _SPIN_CYCLES_PER_S:
        return _SPIN_CYCLES_PER_S[index]
    rate = 0.0
    with torch.cuda.device(index):
        try:
            torch.cuda._sleep(1000)  # loads the kernel
            cycles = 5_000_000
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000)  # hides the measured spin's own launch
            start.record()
            torch.cuda._sleep(cycles)
            stop.record()
            stop.synchronize()
            seconds = start.elapsed_time(stop) / 1e3
            if seconds > 0:
                rate = cycles / seconds
        except RuntimeError:
            rate = 0.0
        if rate <= 0:
            rate = float(getattr(torch.cuda.get_device_properties(index), "clock_rate", 0) or 2_000_000) * 1e3
    _SPIN_CYCLES_PER_S[index] = rate
    return rate


class CudaClock:
    """CUDA events on the device's current stream; a spin kernel hides launches; reading a
    scratch buffer flushes L2; captures are CUDA graphs."""

    method = "cuda_event"

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.stream = torch.cuda.current_stream(self.device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._stop = torch.cuda.Event(enable_timing=True)
        self._scratch: torch.Tensor | None = None
        self._cycles_per_s = 0.0

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def flush(self) -> None:
        # Read, not write: zeroing the scratch leaves the L2 full of dirty lines whose
        # write-back the timed call then pays (+1.3 to +5 us per call on an H200,
        # benchmarks/results/timing_overhead_nvidia_h200.json); a read evicts as well and
        # leaves clean lines.
        if self._scratch is None:
            self._scratch = torch.zeros(l2_flush_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        with torch.cuda.stream(self.stream):
            self._scratch.sum()

    def hide_launch(self, seconds: float) -> None:
        if not self._cycles_per_s:
            self._cycles_per_s = _spin_cycles_per_s(self.device.index)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            torch.cuda._sleep(max(1, int(seconds * self._cycles_per_s)))

    def start(self) -> None:
        self._start.record(self.stream)

    def stop(self) -> None:
        self._stop.record(self.stream)

    def started_early(self) -> bool:
        return bool(self._start.query())

    def elapsed(self) -> float:
        self._stop.synchronize()
        return self._start.elapsed_time(self._stop) / 1e3

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object] | None:
        # Warm up and capture on one side stream (lazily created library handles are then
        # made before the capture), forked from and joined back to the timing stream.
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(self.stream)
            # A call that synchronizes cannot be captured, and a capture it breaks leaves the
            # CUDA generator in capture mode (every later torch.randn on the device then
            # fails): such a call is refused here, where synchronizing raises instead.
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.cuda.stream(side):
                    fn()
            finally:
                torch.cuda.set_sync_debug_mode(previous)
            self.stream.wait_stream(side)
            self.sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                for _ in range(calls):
                    fn()
            self.sync()
            graph.replay()  # the first replay uploads the graph
            self.sync()
        except Exception:  # noqa: BLE001 - any capture failure means: time it eagerly
            try:
                self.sync()
            except RuntimeError:
                pass
            return None
        return graph.replay


def time_callable(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    warmup: int = 2,
    min_repeats: int = 15,
    max_repeats: int = 50,
    rel_tolerance: float = 0.02,
    max_seconds: float = 2.0,
    setup: Callable[[], object] | None = None,
    min_sample_s: float = 200e-6,
    *,
    flush_l2: bool = True,
    flush_after_setup: bool = False,
    graph: bool | None = None,
    clock: DeviceClock | None = None,
) -> Timing:
    """Run `fn` until the running median moves less than `rel_tolerance` between checks.

    Stops early at `max_repeats` or when `max_seconds` of timed work has been spent, so a
    large shape cannot eat the calibration budget. `setup`, when given, runs untimed before
    every call (e.g. the forward pass whose backward is being timed); on a device it is
    finished before the flush, so the flush evicts what it wrote.

    A call shorter than `min_sample_s` is timed in a batch of back-to-back calls (as `timeit`
    does): a microsecond kernel timed alone is mostly clock and loop jitter. Calls with a
    `setup`, and on a device with `flush_l2` every call, are timed one at a time.

    On CUDA (or with a device `clock`) see the module docstring: events, launch hidden behind a
    spin kernel, L2 flushed before each sample (`flush_l2`; on CPU only with a `setup` and
    `flush_after_setup`, see the module docstring), batches replayed from a CUDA graph
    (`graph`: None batches only, True always, False never). `fn` is called
    exactly `warmup` + samples x calls-per-sample times (plus the capture's calls with a graph),
    whatever happens, so ranks timing a collective stay in step.
    """
    device = torch.device(device)
    if clock is None:
        clock = CudaClock(device) if device.type == "cuda" else _HostClock()
    on_device = not isinstance(clock, _HostClock)
    flush = (flush_l2 and on_device) or (flush_after_setup and setup is not None)

    # A batch is sized from one call's time. On a device that is its device time, read from the
    # warm-up calls after the first behind a spin (the host's wall time per call, sync included,
    # is several times a microsecond kernel's and would size the batch too short).
    batchable = setup is None and warmup > 0 and not flush
    device_sized = batchable and on_device and warmup >= 2
    t_warm = time.perf_counter()
    launch_times: list[float] = []  # host seconds per call (launch time on an asynchronous device)
    for i in range(warmup):
        if setup is not None:
            setup()
        if device_sized and i == 1:
            clock.sync()
            clock.hide_launch(min(MAX_SPIN_S, SPIN_MARGIN_S + SPIN_SAFETY * launch_times[0] * (warmup - 1)))
            clock.start()
        t0 = time.perf_counter()
        fn()
        launch_times.append(time.perf_counter() - t0)
    if device_sized:
        clock.stop()
        per_call = clock.elapsed() / (warmup - 1)
    clock.sync()
    if not device_sized:
        per_call = (time.perf_counter() - t_warm) / max(warmup, 1)
    inner = int(min(1000, max(1, np.ceil(min_sample_s / max(per_call, 1e-9))))) if batchable else 1

    call, launches, method = fn, inner, clock.method
    # A device batch is replayed from a CUDA graph unless `graph=False`: eager back-to-back
    # kernels each pay the front end's start of a kernel (~1 us on an H200, 20% of a 5 us
    # kernel; benchmarks/timing_overhead.py), which the profiler's kernel durations leave out.
    use_graph = graph if graph is not None else inner > 1
    if use_graph and on_device and setup is None:
        replay = clock.capture(fn, inner)
        if replay is not None:
            call, launches, method = replay, 1, method.replace("event", "graph")
            launch_times = []  # a replay launches once, whatever fn costs to launch
    hide = on_device
    # The first warm-up call pays one-time costs (allocation, library handles): skip it.
    launch_s = float(np.median(launch_times[1:] or launch_times)) if launch_times else DEFAULT_LAUNCH_S
    boost, misses, exposed = 1.0, 0, 0

    samples: list[float] = []
    spent = 0.0
    last_median = None
    while len(samples) < max_repeats:
        if setup is not None:
            setup()
            clock.sync()
        if flush:
            clock.flush()
        spin_s = 0.0
        if hide:
            spin_s = min(MAX_SPIN_S, boost * (SPIN_MARGIN_S + SPIN_SAFETY * launch_s * launches))
            clock.hide_launch(spin_s)
        clock.start()
        t0 = time.perf_counter() if hide else 0.0
        for _ in range(launches):
            call()
        host_s = time.perf_counter() - t0 if hide else 0.0
        clock.stop()
        if hide:
            if not clock.started_early():
                misses = 0
            else:  # the device reached the start mark before the host had launched the sample
                exposed += 1
                misses += 1
                if misses >= 2 and host_s >= spin_s:
                    hide = False  # twice the host waited out the spin: the call synchronizes
                else:
                    boost = min(boost * 2.0, 1e6)
                    launch_s = max(launch_s, host_s / launches)
        elapsed = clock.elapsed() / inner
        samples.append(elapsed)
        spent += elapsed * inner
        if len(samples) >= min_repeats and len(samples) % 2 == 1:
            median = float(np.median(samples))
            if last_median is not None and abs(median - last_median) <= rel_tolerance * last_median:
                break
            last_median = median
        if spent > max_seconds and len(samples) >= 3:
            break
    if hide:
        method = f"{method}+spin"
    arr = np.asarray(samples)
    q1, q3 = np.percentile(arr, [25, 75])
    return Timing(
        float(np.median(arr)),
        float(q3 - q1),
        len(samples),
        method=method,
        calls_per_sample=inner,
        l2_flushed=flush,
        exposed=exposed,
    )


__all__ = ["CudaClock", "DeviceClock", "Timing", "host_cache_bytes", "l2_flush_bytes", "time_callable"]
