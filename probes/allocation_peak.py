"""The most bytes torch's allocator held at once during a step, on any device: what
torch.cuda.max_memory_allocated reports on a GPU, measured the same way on a CPU (where torch
keeps no such counter) from the profiler's memory events. The memory models' predictions
are checked against it (tests/test_memory.py, benchmarks/oom_prediction.py).

The profiler records allocations and frees only on the threads it follows. A collective's
buffer can be freed on gloo's worker thread (DDP's start-up broadcast of the module state,
a tensor-parallel all-reduce), and counting it live for ever would raise every later peak
by its size. So a free is also inferred where a new block overlaps it, and, before each
measured step, where its pages are no longer mapped (large blocks are mmap'd and unmapped
when freed)."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

WINDOW = "measured step"
MAPS = Path("/proc/self/maps")


def mapped_ranges() -> list[tuple[int, int]]:
    """The process's mapped address ranges, sorted ([] where /proc/self/maps is absent)."""
    if not MAPS.exists():
        return []
    ranges = []
    for line in MAPS.read_text().splitlines():
        start, end = line.split(" ", 1)[0].split("-")
        ranges.append((int(start, 16), int(end, 16)))
    return sorted(ranges)


def _is_mapped(ranges: Sequence[tuple[int, int]], ptr: int) -> bool:
    i = bisect.bisect_right(ranges, (ptr, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= ptr < ranges[i][1]


def _events(roots: list[Any]) -> Iterator[Any]:
    for event in roots:
        yield event
        yield from _events(event.children)


def allocation_peaks(prof: Any, windows: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> list[int]:
    """The peak of torch's live allocations inside each (name, mapped) window: a
    record_function of a finished profile (`profile_memory=True`), and the address ranges
    mapped as it began (`mapped_ranges`; a block outside them was freed before it, though no
    event said so). One pass over the profile's allocations, counting only blocks allocated
    while it profiled: each free is matched to its allocation by address, so a block
    allocated before (or the reporter's stale size for an address reused since an earlier
    profile) cannot shift the count."""
    from torch._C._profiler import _EventType

    events = list(_events(prof.profiler.kineto_results.experimental_event_tree()))
    spans = []
    for name, mapped in windows:
        markers = [e for e in events if e.tag == _EventType.TorchOp and e.name == name]
        if len(markers) != 1:
            raise ValueError(f"the profile has {len(markers)} record_function windows named {name!r}; wanted 1")
        spans.append((markers[0].start_time_ns, markers[0].end_time_ns, mapped))
    allocations = sorted((e for e in events if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns)
    blocks = _LiveBlocks()
    peaks, checked = [0] * len(spans), [not mapped for _, _, mapped in spans]
    for event in allocations:
        t = event.start_time_ns
        for i, (start, end, mapped) in enumerate(spans):
            if not checked[i] and t >= start:
                blocks.drop_unmapped(mapped)
                checked[i] = True
        ptr, size = event.extra_fields.ptr, event.extra_fields.alloc_size
        if size > 0:
            blocks.allocate(ptr, size)
        else:
            blocks.free(ptr)
        for i, (start, end, _) in enumerate(spans):
            if start <= t <= end:
                peaks[i] = max(peaks[i], blocks.live)
    return peaks


class _LiveBlocks:
    """The blocks allocated under the profiler and not yet seen freed, by address. A new
    block overlapping one of them proves that one was freed (two live blocks cannot share an
    address), though no event said so."""

    def __init__(self) -> None:
        self.starts: list[int] = []  # sorted
        self.sizes: dict[int, int] = {}
        self.live = 0

    def allocate(self, ptr: int, size: int) -> None:
        i = bisect.bisect_left(self.starts, ptr)
        if i and self.starts[i - 1] + self.sizes[self.starts[i - 1]] > ptr:
            i -= 1
        while i < len(self.starts) and self.starts[i] < ptr + size:
            self.free(self.starts[i])
        bisect.insort(self.starts, ptr)
        self.sizes[ptr] = size
        self.live += size

    def free(self, ptr: int) -> None:
        size = self.sizes.pop(ptr, None)
        if size is None:  # allocated before profiling began
            return
        del self.starts[bisect.bisect_left(self.starts, ptr)]
        self.live -= size

    def drop_unmapped(self, mapped: Sequence[tuple[int, int]]) -> None:
        for ptr in [p for p in self.starts if not _is_mapped(mapped, p)]:
            self.free(ptr)


def step_allocation_peak(
    build: Callable[[], Any], step: Callable[[Any], Any], between: Callable[[], Any] = lambda: None, repeats: int = 3
) -> tuple[Any, int]:
    """Build a model and take one step under the profiler, then `repeats` measured ones: the
    model and a step's allocation peak over what was live before it was built (so the first
    step's one-time allocations, e.g. DDP's buckets or the pipeline's buffers, count as they
    would on a device, and earlier work does not). The steps are identical, and a free the
    profiler missed can only raise a step's figure, so the smallest is kept. `between` runs
    after the first step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    maps = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = build()
        step(model)
        between()
        for i in range(repeats):
            maps.append(mapped_ranges())
            with record_function(f"{WINDOW} {i}"):
                step(model)
    return model, min(allocation_peaks(prof, [(f"{WINDOW} {i}", maps[i]) for i in range(repeats)]))
