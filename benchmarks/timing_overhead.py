"""What a device-timed window adds to a kernel's own time: `time_callable` against the profiler's
kernel durations, per sample length, with and without CUDA graphs and the L2 flush.

    PYTHONPATH=. python3 benchmarks/timing_overhead.py [--device cuda|cpu] [--out PATH]

Why: on a GPU the probes time one call per window (the L2 is flushed before each), so whatever
the window adds beyond the kernel (the event marks, the front end's start of the kernel) sits
in every small op's measurement; batched back-to-back calls spread it over the batch. This
prints per-call time minus kernel time for element-wise adds of about 5, 20 and 100 us at
1, ~8, ~40 and ~200 calls per window, eager and graph-replayed, so the fixed part and what a
batch amortises are read side by side in one run; then the probes' default (one call after an
L2 flush that reads a scratch buffer) beside the flush that zeroed it, and an empty window (the
marks alone). Imports no Ray or MLflow (it runs on the lent
GPU machine's bare python3). Writes benchmarks/results/timing_overhead_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.gpu_check import _sized_add, device_slug, profiled_per_call  # noqa: E402
from probes.timing import CudaClock, l2_flush_bytes, time_callable  # noqa: E402

US = 1e-6
TARGETS_US = (5.0, 20.0, 100.0)
SAMPLE_US = (0.0, 40.0, 200.0, 1000.0)  # min_sample_s: 0 -> one call per window


def sized_numel(target_us: float, device: torch.device) -> int:
    """An add's element count whose kernel takes about `target_us` (profiler time)."""
    numel = 2**20 if device.type == "cuda" else 4096
    for _ in range(6):
        t = profiled_per_call(_sized_add(numel, device), device, calls=20)["median_s"] / US
        if 0.85 <= t / target_us <= 1.15:
            break
        numel = int(min(2**28, max(256, numel * target_us / max(t, 1e-3))))
    return numel


class ZeroFlushClock(CudaClock):
    """The CUDA clock with the flush it had before: zeroing the scratch, which leaves the L2
    full of dirty lines whose write-back the timed call pays (kept to show that cost)."""

    def flush(self) -> None:
        if self._scratch is None:
            self._scratch = torch.empty(l2_flush_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        with torch.cuda.stream(self.stream):
            self._scratch.zero_()


def empty_window_us(device: torch.device, samples: int = 50) -> float:
    """Median time between a start and a stop mark with nothing between them, behind a spin."""
    clock = CudaClock(device)
    times = []
    for _ in range(samples):
        clock.hide_launch(50 * US)
        clock.start()
        clock.stop()
        times.append(clock.elapsed())
    return round(float(np.median(times)) / US, 3)


def _row(target: float, numel: int, kernel_us: float, t: Any, **settings: Any) -> dict[str, Any]:
    """One timing beside the kernel's own time: per call, what the window added, the spread."""
    return {
        "target_us": target,
        "numel": numel,
        "kernel_us": round(kernel_us, 3),
        **settings,
        "calls_per_sample": t.calls_per_sample,
        "method": t.method,
        "l2_flushed": t.l2_flushed,
        "per_call_us": round(t.median_s / US, 3),
        "added_us": round(t.median_s / US - kernel_us, 3),
        "rel": round(t.median_s / US / kernel_us - 1.0, 4),
        "spread_us": round(t.spread_s / US, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if kind == "cuda" else "cpu"
    out = args.out or REPO / "benchmarks" / "results" / f"timing_overhead_{device_slug(name)}.json"

    rows: list[dict[str, Any]] = []
    for target in TARGETS_US:
        numel = sized_numel(target, device)
        fn = _sized_add(numel, device)
        kernel_us = profiled_per_call(fn, device, calls=50)["median_s"] / US
        for graph in (False, True):
            for sample_us in SAMPLE_US:
                t = time_callable(fn, device=device, flush_l2=False, graph=graph, min_sample_s=sample_us * US)
                row = _row(target, numel, kernel_us, t, graph=graph, min_sample_us=sample_us)
                rows.append(row)
                print(
                    f"{target:>6.0f} us  graph={graph!s:<5} calls/sample {t.calls_per_sample:>4}  "
                    f"per call {row['per_call_us']:>8.2f} us  kernel {kernel_us:>8.2f} us  "
                    f"added {row['added_us']:>+6.2f} us ({100 * row['rel']:+.0f}%)",
                    flush=True,
                )
        cuda = device.type == "cuda"
        flushes = [("read" if cuda else "none", None)] + ([("zeroed", ZeroFlushClock(device))] if cuda else [])
        for flush_kind, clock in flushes:
            flushed = time_callable(fn, device=device, clock=clock)
            rows.append(_row(target, numel, kernel_us, flushed, graph=False, min_sample_us=None, flush=flush_kind))
            print(f"{target:>6.0f} us  L2 flushed ({flush_kind}), one call: {flushed.median_s / US:.2f} us", flush=True)
    floor = empty_window_us(device) if device.type == "cuda" else None
    print(f"empty window (start and stop marks behind a spin): {floor} us", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": name, "torch": torch.__version__, "empty_window_us": floor, "rows": rows}
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
