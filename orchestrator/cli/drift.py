"""Report prediction drift and model drift per hardware and model version, with a chart.

    python -m orchestrator.cli.drift [--hardware-id H] [--last N] [--out-dir D] [--tracking-uri U] [--json]

Prediction drift: every launched job (an autotune run) logged its predicted and measured
iteration time and the model version it planned with; per (hardware_id, version) this reports
the rolling geomean error over the last N jobs and its trend (the newer half of those jobs
against the older half). Model drift: every nightly run logged the champion's sentinel error;
the chart shows both over time, one line per model version, and is logged to MLflow.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from orchestrator import drift, registry
from orchestrator.cli.common import ArgumentParser, emit, entry_point, int_in, output_dir
from orchestrator.progress import say


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


def _main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m orchestrator.cli.drift", description=__doc__.splitlines()[0])
    parser.add_argument("--hardware-id", help="only this hardware (default: every one recorded)")
    parser.add_argument(
        "--last", type=int_in(1, 100_000), default=10, help="jobs in the rolling window (default %(default)s)"
    )
    parser.add_argument("--out-dir", type=output_dir, default=".autotune/drift", help="where the PNG charts go")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error("--last must be >= 1")
    uri = registry.configure(args.tracking_uri)
    found = drift.report(args.hardware_id, args.last, Path(args.out_dir))
    emit({"tracking_uri": uri, **found}, args.json, _human)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())
