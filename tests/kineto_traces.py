"""Real Kineto traces for the trace importer's tests: a small MLP trained for a few steps under
torch.profiler (record_shapes=True, `prof.step()` per step) in a world-1 gloo group with DDP,
exported as a user would (`export_chrome_trace`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def write_mlp_trace(directory: Path, steps: int = 3) -> Path:
    """Profile `steps` DDP training steps (the first is warm-up) and export rank 0's trace."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "trace_rank0.json"
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    try:
        # The DDP model lives in a call of its own: its reducer holds the process group, and a
        # reducer freed after the group was destroyed deadlocked in ProcessGroupGloo's destructor
        # (the suite hung 30 min in this fixture, 2026-11-27).
        _profile_steps(out, steps)
    finally:
        if started:
            dist.destroy_process_group()
    return out


def _profile_steps(out: Path, steps: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=steps - 1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
    ) as prof:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            prof.step()
