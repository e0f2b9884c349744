"""Helpers for ranks started with torch.multiprocessing in tests."""

import json
import os
import sys
import tempfile
from typing import Any, Callable


def exit_worker(queue=None) -> None:
    """End a spawned rank that finished cleanly without interpreter teardown, where gloo's
    background threads can abort the process ("terminate called without an active
    exception") after its results are written. A multiprocessing queue the rank reported
    through is flushed first (its feeder thread would otherwise be cut off)."""
    if queue is not None:
        queue.close()
        queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _gloo_rank(rank: int, body: Callable[[int], Any], world: int, tmp: str) -> None:
    import torch.distributed as dist

    from probes.collective import forget_groups

    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    try:
        result = body(rank)
        with open(f"{tmp}/{rank}.json", "w") as f:
            json.dump(result, f)
    finally:
        forget_groups()
        dist.destroy_process_group()
    exit_worker()


def on_gloo_ranks(body: Callable[[int], Any], world: int) -> dict[int, Any]:
    """Run `body(rank)` (a module-level function) on `world` spawned ranks of one gloo group;
    what each returns, by rank (it must be JSON)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_gloo_rank, args=(body, world, tmp), nprocs=world)
        return {rank: json.load(open(f"{tmp}/{rank}.json")) for rank in range(world)}
