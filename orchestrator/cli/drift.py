"""Report prediction drift and model drift per hardware and model version, with a chart.

    python -m orchestrator.cli.drift [--hardware-id H] [--last N] [--out-dir D] [--tracking-uri U] [--json]

Prediction drift: every launched job (an autotune run) logged its predicted and measured
iteration time and the model version it planned with; per (hardware_id, version) this reports
the rolling geomean error over the last N jobs and its trend (the newer half of those jobs
against the older half). Model drift: every nightly run logged the champion's sentinel error;
the chart shows both over time, one line per model version, and is logged to MLflow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from orchestrator.cli.options import (
    add_output,
    add_tracking_uri,
    command_parser,
    emit,
    entry_point,
    int_in,
    output_dir,
    parse,
)
from orchestrator.progress import say

EXAMPLES = ("python -m orchestrator.cli.drift --last 20", "python -m orchestrator.cli.drift --hardware-id H --json")


def _human(report: dict[str, Any]) -> None:
    if not report["hardware"]:
        say("no launched jobs or nightly checks recorded yet")
    for hw, data in report["hardware"].items():
        say(f"{hw}:")
        for v in data["versions"]:
            ratio = f" (x{v['trend_ratio']:.2f})" if v["trend_ratio"] else ""
            say(
                f"  model v{v['version']}: {v['jobs']} job(s), rolling geomean error {v['rolling_geomean_error']:.1%}, "
                f"trend {v['trend']}{ratio}"
            )
        for s in data["sentinel"][-5:]:
            say(
                f"  nightly sentinel on v{s['version']}: GMAE {s['gmae']:.1%}"
                + (f" (stale above {s['bound']:.1%})" if s["bound"] else "")
            )
        say(f"  chart: {report['charts'][hw]}")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("orchestrator.cli.drift", __doc__, EXAMPLES)
    parser.add_argument("--hardware-id", help="only this hardware (unset: every one recorded)")
    parser.add_argument("--last", type=int_in(1, 100_000), default=10, help="jobs in the rolling window")
    parser.add_argument(
        "--out-dir", type=output_dir, default=None, help="where the PNG charts go (unset: $AUTOTUNE_HOME/drift)"
    )
    add_tracking_uri(parser)
    add_output(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    from orchestrator import drift, registry
    from orchestrator.home import home_path

    uri = registry.configure(args.tracking_uri)
    found = drift.report(args.hardware_id, args.last, Path(args.out_dir) if args.out_dir else home_path("drift"))
    emit({"tracking_uri": uri, **found}, args.json, _human)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())
