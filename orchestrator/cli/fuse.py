"""How many copies of a repetitive job (a hyper-parameter sweep's trials) to fuse per device.

    python -m orchestrator.cli.fuse --workload pointnet [--max-width 64] [--memory-cap-gb G]
                                [--trials N] [--json]

Probes widths 1, 2, 4, ... of the workload on this cluster (each in a fresh Ray worker; every
row written to `$AUTOTUNE_HOME/fusion/<stamp>/measurements.jsonl` as it arrives), fits the
throughput curve and memory line, and chooses the width. With `--trials N`, also lists how
a sweep of N trials of one setting splits into fused groups. Everything is logged to an
MLflow run (kind=fusion): the measurements, the model (`fusion_model.json`, plain data) and
the decision with every candidate width.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from orchestrator.cli import options
from orchestrator.defaults import FUSION_WORKLOADS
from orchestrator.progress import say

EXAMPLES = (
    "python -m orchestrator.cli.fuse --workload pointnet",
    "python -m orchestrator.cli.fuse --workload cnn --max-width 16 --trials 100 --json",
)


def build_parser() -> argparse.ArgumentParser:
    parser = options.command_parser("orchestrator.cli.fuse", __doc__, EXAMPLES)
    seconds = options.number_in(0.0, 3600.0, unit="seconds")  # --step-cap-s and --probe-seconds
    parser.add_argument("--workload", required=True, choices=FUSION_WORKLOADS, help="the model a trial trains")
    parser.add_argument(
        "--max-width", type=options.int_in(1, 4096), default=64, help="largest width to probe and choose"
    )
    parser.add_argument(
        "--memory-cap-gb",
        type=options.number_in(0.0, 2.0**20, unit="GiB"),
        help="per-device cap (unset: 60%% of a device's memory)",
    )
    parser.add_argument("--step-cap-s", type=seconds, default=2.0, help="stop widening past this step time")
    parser.add_argument(
        "--batch-size", type=options.int_in(1, 2**20), help="per-model batch size (unset: the workload's)"
    )
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"], help="each trial's optimizer")
    parser.add_argument("--probe-seconds", type=seconds, default=2.0, help="timed seconds per width")
    parser.add_argument(
        "--trials", type=options.int_in(1, 1_000_000), help="also split a sweep of this many trials into fused groups"
    )
    options.add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = options.parse(build_parser(), argv)
    from orchestrator import registry
    from orchestrator.cli.common import fingerprint
    from orchestrator.fusion import plan_fusion_width

    fp = fingerprint(args.ray_address, start_ray=True)
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
    options.emit(out, args.json, _human)
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


main = options.entry_point(_main)


if __name__ == "__main__":
    raise SystemExit(main())
