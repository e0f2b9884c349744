"""`python -m orchestrator.fuse`: how many copies of a repetitive job to fuse per device.

    python -m orchestrator.fuse --workload pointnet [--max-width 64] [--memory-cap-gb G]
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
import time
from pathlib import Path
from typing import Any, Sequence

import mlflow

from orchestrator import cli_common, registry
from orchestrator.fusion import probe_fusion
from predictors.fusion_model import fit_fusion_models
from orchestrator.measurement_store import MeasurementStore
from orchestrator.progress import say
from policies.fusion_width import choose_width, partition_trials
from probes.workloads.fusion.models import WORKLOADS


def build_parser() -> argparse.ArgumentParser:
    parser = cli_common.ArgumentParser(prog="python -m orchestrator.fuse", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--max-width", type=cli_common.int_in(1, 4096), default=64,
                        help="largest width to probe and choose")
    parser.add_argument("--memory-cap-gb", type=cli_common.number_in(0.0, 2.0**20, unit="GiB"),
                        help="per-device cap (default: 60%% of a device's memory)")
    parser.add_argument("--step-cap-s", type=cli_common.number_in(0.0, 3600.0, unit="seconds"), default=2.0,
                        help="stop widening past this step time")
    parser.add_argument("--batch-size", type=cli_common.int_in(1, 2**20), help="per-model batch size (default: the workload's)")
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"])
    parser.add_argument("--probe-seconds", type=cli_common.number_in(0.0, 3600.0, unit="seconds"), default=2.0,
                        help="timed seconds per width")
    parser.add_argument("--trials", type=cli_common.int_in(1, 1_000_000),
                        help="also split a sweep of this many trials into fused groups")
    cli_common.add_common(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return cli_common.run_main(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fp = cli_common.fingerprint(args.ray_address, start_ray=True)
    import ray

    cap = args.memory_cap_gb * 2**30 if args.memory_cap_gb else 0.6 * fp.min_device_memory_bytes
    # GPUs are measured side by side; the CPU "devices" of a host share caches and memory
    # bandwidth, and a wide fused job beside a narrow one distorts both, so one at a time.
    devices = int(ray.cluster_resources().get("GPU", 1)) if fp.device_kind == "cuda" else 1
    registry.configure(args.tracking_uri)
    store = MeasurementStore(Path(".autotune/fusion") / time.strftime("%Y%m%d-%H%M%S"))
    say(f"fusion widths of {args.workload} on {fp.summary()}: up to {args.max_width}, cap {cap / 2**30:.1f} GiB; "
        f"rows in {store.rows_path}")
    with mlflow.start_run(run_name=f"fusion-{args.workload}") as run:
        mlflow.set_tags({"kind": "fusion", "hardware_id": fp.hardware_id, "workload": args.workload})
        rows = probe_fusion([args.workload], store, args.max_width, cap, args.step_cap_s, args.batch_size,
                            args.optimizer, fp.device_kind, parallel=devices, max_seconds=args.probe_seconds)
        mlflow.log_artifact(str(store.rows_path))
        model = fit_fusion_models(rows)[args.workload]
        mlflow.log_dict(model.to_dict(), "fusion_model.json")
        decision = choose_width(model, cap, args.max_width)
        mlflow.log_dict({"policy": decision.policy, "choice": decision.choice, "detail": decision.choice_detail,
                         "candidates": [c.__dict__ for c in decision.candidates]}, "fusion_decision.json")
        mlflow.log_metrics({"chosen_width": decision.choice_detail["width"],
                            "predicted_samples_per_s": decision.choice_detail["samples_per_s"],
                            "speedup_vs_one": decision.choice_detail["speedup_vs_one"],
                            "fit_gmae": model.fit_gmae})
        out: dict[str, Any] = {"hardware_id": fp.hardware_id, "run_id": run.info.run_id,
                               "measured": {int(r.params["width"]): r.extra["samples_per_s"] for r in rows},
                               **decision.choice_detail}
        if args.trials:
            out["groups"] = [len(g) for g in partition_trials([{} for _ in range(args.trials)],
                                                              decision.choice_detail["width"])]
    cli_common.emit(out, args.json, _human)
    return 0


def _human(out: dict[str, Any]) -> None:
    measured = ", ".join(f"B={w}: {s:.0f}/s" for w, s in out["measured"].items())
    print(f"measured {measured}")
    print(f"fuse {out['width']} x {out['workload']} per device: predicted {out['samples_per_s']:.0f} samples/s "
          f"({out['speedup_vs_one']:.2f}x one model), peak {out['peak_memory_bytes'] / 2**20:.0f} MiB "
          f"(cap {out['memory_cap_bytes'] / 2**20:.0f} MiB, limited by {out['limited_by']})")
    if "groups" in out:
        print(f"a sweep of {sum(out['groups'])} trials runs as {len(out['groups'])} fused jobs of {out['groups']}")


if __name__ == "__main__":
    raise SystemExit(main())
