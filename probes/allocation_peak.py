"""The most bytes torch's allocator held at once during a step, on any device: what
torch.cuda.max_memory_allocated reports on a GPU, measured the same way on a CPU (where torch
keeps no such counter) from the profiler's memory events. The memory models' predictions
are checked against it (tests/test_transformer_memory.py, benchmarks/oom_prediction.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

WINDOW = "measured step"


def _events(roots: list[Any]) -> Iterator[Any]:
    for event in roots:
        yield event
        yield from _events(event.children)


def allocation_peak(prof: Any, window: str = WINDOW) -> int:
    """The peak of torch's live allocations inside the `window` record_function of a finished
    profile (`profile_memory=True`), counting only blocks allocated while it profiled: each
    free is matched to its allocation by address, so a block allocated before (or the
    reporter's stale size for an address reused since an earlier profile) cannot shift the
    count. A free on a thread the profiler does not follow is seen only when its address is
    reused; until then the block counts as live, so the peak errs high, never low."""
    from torch._C._profiler import _EventType

    events = list(_events(prof.profiler.kineto_results.experimental_event_tree()))
    markers = [e for e in events if e.tag == _EventType.TorchOp and e.name == window]
    if len(markers) != 1:
        raise ValueError(f"the profile has {len(markers)} record_function windows named {window!r}; wanted 1")
    start, end = markers[0].start_time_ns, markers[0].end_time_ns
    allocations = sorted((e for e in events if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns)
    sizes: dict[int, int] = {}
    live, peak = 0, 0
    for event in allocations:
        ptr, size = event.extra_fields.ptr, event.extra_fields.alloc_size
        if size > 0:
            # an address handed out again was freed, though no event said so: the profiler
            # records only its own threads, and a collective's worker thread may drop a
            # block's last reference
            live += size - sizes.get(ptr, 0)
            sizes[ptr] = size
        else:
            live -= sizes.pop(ptr, 0)
        if start <= event.start_time_ns <= end:
            peak = max(peak, live)
    return peak


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

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = build()
        step(model)
        between()
        for i in range(repeats):
            with record_function(f"{WINDOW} {i}"):
                step(model)
    return model, min(allocation_peak(prof, f"{WINDOW} {i}") for i in range(repeats))
