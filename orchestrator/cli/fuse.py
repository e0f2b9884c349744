"""`python -m orchestrator.cli.fuse`: how many copies of a repetitive job to fuse per device.

    python -m orchestrator.cli.fuse --workload pointnet [--max-width 64] [--memory-cap-gb G]
                                [--trials N] [--json]

Probes widths 1, 2, 4, ... of the workload on this cluster (each in a fresh Ray worker; every
row written to `.autotune/fusion/<stamp>/measurements.jsonl` as it arrives), fits the
throughput curve and memory line, and chooses the width. With `--trials N`, also lists how
a sweep of N trials of one setting splits into fused groups. Everything is logged to an
MLflow run (kind=fusion): the measurements, the model (`fusion_model.json`, plain data) and
the decision with every candidate width.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from orchestrator import registry
from orchestrator.cli import common
from orchestrator.fusion import plan_fusion_width
from orchestrator.progress import say
from probes.workloads.fusion.models import WORKLOADS


def build_parser() -> argparse.ArgumentParser:
    parser = common.ArgumentParser(prog="python -m orchestrator.cli.fuse", description=__doc__.splitlines()[0])
    seconds = common.number_in(0.0, 3600.0, unit="seconds")  # --step-cap-s and --probe-seconds
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument(
        "--max-width", type=common.int_in(1, 4096), default=64, help="largest width to probe and choose"
    )
    parser.add_argument(
        "--memory-cap-gb",
        type=common.number_in(0.0, 2.0**20, unit="GiB"),
        help="per-device cap (default: 60%% of a device's memory)",
    )
    parser.add_argument("--step-cap-s", type=seconds, default=2.0, help="stop widening past this step time")
    parser.add_argument(
        "--batch-size", type=common.int_in(1, 2**20), help="per-model batch size (default: the workload's)"
    )
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"])
    parser.add_argument("--probe-seconds", type=seconds, default=2.0, help="timed seconds per width")
    parser.add_argument(
        "--trials", type=common.int_in(1, 1_000_000), help="also split a sweep of this many trials into fused groups"
    )
    common.add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fp = common.fingerprint(args.ray_address, start_ray=True)
    registry.configure(args.tracking_uri)
    out = plan_fusion_width(
        args.workload,
        fp,
        args.max_width,
        args.memory_cap_gb * 2**30 if args.memory_cap_gb else None,
        args.step_cap_s,
        args.batch_size,
        args.optimizer,
        args.probe_seconds,
        args.trials,
    )
    common.emit(out, args.json, _human)
    return 0


def _human(out: dict[str, Any]) -> None:
    measured = ", ".join(f"B={w}: {s:.0f}/s" for w, s in out["measured"].items())
    say(f"measured {measured}")
    say(
        f"fuse {out['width']} x {out['workload']} per device: predicted {out['samples_per_s']:.0f} samples/s "
        f"({out['speedup_vs_one']:.2f}x one model), peak {out['peak_memory_bytes'] / 2**20:.0f} MiB "
        f"(cap {out['memory_cap_bytes'] / 2**20:.0f} MiB, limited by {out['limited_by']})"
    )
    if "groups" in out:
        say(f"a sweep of {sum(out['groups'])} trials runs as {len(out['groups'])} fused jobs of {out['groups']}")


main = common.entry_point(_main)


if __name__ == "__main__":
    raise SystemExit(main())
