"""Write the CSV that NCCL's example tuner plugin reads, from what a calibration measured.

    python -m orchestrator.cli.nccl_tuner [--calibration DIR] [--out FILE] [--json]

A calibration on an NCCL cluster times all-reduce, all-gather, reduce-scatter and broadcast
under each algorithm and protocol NCCL can be forced to (ring, tree; LL, LL128, Simple) and
under NCCL's own choice, on the whole cluster's group and within one node. This command writes
a rule wherever a forced pair beat NCCL's choice beyond the measurements' spread, per
nodes x ranks and size range (policies/nccl_tuner.py); elsewhere NCCL decides. Load it with
NVIDIA's example tuner plugin (nccl/ext-tuner/example, built as libnccl-tuner-example.so):
NCCL_TUNER_PLUGIN=<path to the .so> NCCL_TUNER_CONFIG_FILE=<this file>, on every rank
(deploy/README.md shows it as a ConfigMap). A CPU (gloo) calibration measures no NCCL choices.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from orchestrator.cli import options
from orchestrator.progress import say

EXAMPLES = (
    "python -m orchestrator.cli.nccl_tuner",
    "python -m orchestrator.cli.nccl_tuner --calibration .autotune/calibrations/20261126-033458-gpu8x4 --out nccl_tuner.conf",
)
DEFAULT_NAME = "nccl_tuner.conf"  # the example plugin's default file name


def build_parser() -> argparse.ArgumentParser:
    parser = options.command_parser("orchestrator.cli.nccl_tuner", __doc__, EXAMPLES)
    parser.add_argument(
        "--calibration",
        type=options.calibration_dir,
        help="calibration directory to read (unset: the newest under $AUTOTUNE_HOME/calibrations)",
    )
    parser.add_argument(
        "--out", type=options.output_file, help=f"CSV file to write (unset: $AUTOTUNE_HOME/{DEFAULT_NAME})"
    )
    options.add_output(parser)
    return parser


def _newest_calibration() -> Path | None:
    from orchestrator.home import home_path

    found = sorted(p for p in home_path("calibrations").glob("*") if (p / "measurements.jsonl").is_file())
    return found[-1] if found else None


def _human(result: dict[str, Any]) -> None:
    say(f"{len(result['rules'])} rule(s) from {result['calibration']} ({result['hardware_id']}) -> {result['out']}")
    for rule in result["rules"]:
        say(f"  {rule}")
    for c in result["wins"]:
        say(
            f"  {c['op']} {c['bytes']} B on {c['nodes']}x{c['ranks']}: {c['algorithm']}/{c['protocol']} "
            + (f"{c['speedup']:.2f}x NCCL's own choice" if c["speedup"] else "(NCCL's own choice not measured)")
        )
    say(f"load it with: NCCL_TUNER_PLUGIN=<libnccl-tuner-example.so> NCCL_TUNER_CONFIG_FILE={result['out']}")


def _main(argv: Sequence[str] | None = None) -> int:
    args = options.parse(build_parser(), argv)
    from orchestrator.home import home_path
    from orchestrator.measurement_store import MeasurementStore
    from policies.nccl_tuner import size_choices, tuner_csv, tuner_rules
    from probes.vocabulary.nccl import NCCL_CHOICE_FAMILY

    directory = Path(args.calibration) if args.calibration else _newest_calibration()
    if directory is None:
        return options.bad_input(
            f"no calibration under {home_path('calibrations')}: run `python -m orchestrator.cli.calibrate` on the "
            "GPU cluster first (or name one with --calibration DIR)",
            "--calibration",
            args.json,
        )
    rows = [r for r in MeasurementStore(directory).rows() if r.family == NCCL_CHOICE_FAMILY]
    fingerprint = json.loads((directory / "fingerprint.json").read_text())
    if not rows:
        kind = fingerprint.get("device_kind", "?")
        return options.bad_input(
            f"{directory}: no NCCL algorithm/protocol measurements: they are taken by a calibration of CUDA devices "
            f"over NCCL with at least 2 GPUs (this one ran on {kind} devices"
            + (", where collectives run over gloo" if kind != "cuda" else "")
            + "); calibrate the GPU cluster and run this again",
            "--calibration",
            args.json,
        )
    choices = size_choices(rows)
    rules = tuner_rules(rows, choices)
    out = Path(args.out) if args.out else home_path(DEFAULT_NAME)
    out.parent.mkdir(parents=True, exist_ok=True)
    provenance = [
        f"written by orchestrator.cli.nccl_tuner from {directory}",
        f"hardware {fingerprint.get('hardware_id', '?')}: {len(rows)} measurements, {len(rules)} rule(s)",
    ]
    out.write_text(tuner_csv(rules, provenance))
    wins = [
        {
            "op": c.op,
            "bytes": c.nbytes,
            "nodes": c.nodes,
            "ranks": c.ranks,
            "algorithm": c.best[0],
            "protocol": c.best[1],
            "speedup": c.speedup,
        }
        for c in choices
    ]
    result = {
        "calibration": str(directory),
        "hardware_id": fingerprint.get("hardware_id", "?"),
        "out": str(out),
        "rules": [r.line() for r in rules],
        "wins": wins,
    }
    options.emit(result, args.json, _human)
    return 0


main = options.entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())
