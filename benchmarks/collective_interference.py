"""How much gloo collectives slow down when they do not run alone (2 ranks, CPU).

    .venv/bin/python benchmarks/collective_interference.py [--repeats 7]

The collective probes time one collective at a time on otherwise idle ranks. A DLRM step
runs two DDP bucket all-reduces at once (gloo has several worker threads) beside backward
GEMMs. Per message size this prints the median of: one all_reduce alone; two all_reduces
back to back; two async all_reduces overlapped with GEMM work, against the GEMM work alone.
This is the effect the simulator does not model yet (issue #5: bandwidth sharing and the
compute/communication overlap factor). Writes benchmarks/results/collective_interference.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
SIZES = (2**16, 2**18, 2**20, 2**22)
GEMMS = (0, 5, 20)


def _timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rank(rank: int, init: str, out: str, repeats: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def gemms(n: int) -> None:
        for _ in range(n):
            torch.mm(a, b)

    rows = []
    for nbytes in SIZES:
        x, y = torch.randn(nbytes // 4), torch.randn(nbytes // 4)
        for n in GEMMS:
            samples: dict[str, list[float]] = {
                "one_alone": [],
                "two_back_to_back": [],
                "gemms_alone": [],
                "two_async_with_gemms": [],
            }
            for _ in range(repeats):
                samples["one_alone"].append(_timed(lambda: dist.all_reduce(x)))
                samples["two_back_to_back"].append(_timed(lambda: (dist.all_reduce(x), dist.all_reduce(y))))
                samples["gemms_alone"].append(_timed(lambda: gemms(2 * n)))

                def overlapped() -> None:
                    first = dist.all_reduce(x, async_op=True)
                    gemms(n)
                    second = dist.all_reduce(y, async_op=True)
                    gemms(n)
                    first.wait()
                    second.wait()

                samples["two_async_with_gemms"].append(_timed(overlapped))
            rows.append({"bytes": nbytes, "gemms": 2 * n, **{k: float(np.median(v)) for k, v in samples.items()}})
    if rank == 0:
        Path(f"{out}/rows.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/collective_interference.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/init", tmp, args.repeats), nprocs=2)
        rows = json.loads(Path(f"{tmp}/rows.json").read_text())
    print(
        f"{'bytes':>8s} {'gemms':>5s} {'one alone':>10s} {'two b2b':>9s} {'2x alone':>9s} {'gemms':>8s} "
        f"{'2 async+gemms':>13s} {'vs sum':>7s}  (ms)"
    )
    for r in rows:
        serial = 2 * r["one_alone"] + r["gemms_alone"]
        r["two_back_to_back_over_twice_one"] = r["two_back_to_back"] / (2 * r["one_alone"])
        r["overlapped_over_serial_sum"] = r["two_async_with_gemms"] / serial
        print(
            f"{r['bytes']:8d} {r['gemms']:5d} {r['one_alone'] * 1e3:10.3f} {r['two_back_to_back'] * 1e3:9.3f} "
            f"{2 * r['one_alone'] * 1e3:9.3f} {r['gemms_alone'] * 1e3:8.3f} {r['two_async_with_gemms'] * 1e3:13.3f} "
            f"{r['overlapped_over_serial_sum']:7.2f}"
        )
    Path(args.out).write_text(
        json.dumps(
            {"command": f"python benchmarks/collective_interference.py --repeats {args.repeats}", "rows": rows},
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
