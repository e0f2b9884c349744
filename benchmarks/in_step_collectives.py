"""How much slower each DLRM step's collectives ran inside the step than their isolated price,
per step of a stored calibration: the in-step / isolated ratio the bundle's one affine factor
per collective must cover.

    .venv/bin/python benchmarks/in_step_collectives.py ROWS [--out PATH]

ROWS: a calibration's `measurements.jsonl(.gz)`. Fits the bundle the calibration would fit now
(`predictors.fit.fit_bundle`), pairs each captured step's collectives with the graph's, priced
by the isolated models (`predictors.collective_context.collective_pairs`), and prints per step
its batch, tables, step time and the median in-step / isolated ratio of its all-reduces and
all-to-alls, with the fitted factor beside; then, over every captured step, each collective's
ratio as a median, a mean and a ratio of sums (heavy tailed: the mean is what a step adds up),
for the DLRM steps and for the transformer's; and, per quarter of the calls by isolated price,
the ratio of sums and the mean seconds a call added, with the least-squares line
(in-step = slope x isolated + intercept): a ratio prices a per-call stall only at one size.
Issue #26 found the ratio depends on the batch.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.collective_context import collective_pairs  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP, TRANSFORMER_STEP_OP  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (unset: printed only)")
    args = parser.parse_args()
    rows = read_rows(args.rows)
    model, _ = fit_bundle(rows, rows[0].hardware_id or "hw", seed=0)
    steps = []
    every: dict[str, list[tuple[float, float]]] = defaultdict(list)  # each op's pairs over all steps
    for row in (r for r in rows if r.op == DLRM_STEP_OP):
        job = JobSpec.from_dict(row.params["job"])
        pairs = collective_pairs(model, [row])
        for op, v in pairs.items():
            every[op] += v
        ratios = {op: statistics.median(s / iso for iso, s in v) for op, v in pairs.items() if v}
        steps.append(
            {
                "job": job.name,
                "batch_size": job.batch_size,
                "tables": len(job.tables),
                "step_ms": row.median_s * 1e3,
                "all_reduce_isolated_ms": pairs["all_reduce"][0][0] * 1e3 if pairs.get("all_reduce") else None,
                "in_step_ratio": ratios,
                "captured": {op: len(v) for op, v in pairs.items()},
            }
        )
        ar, a2a = ratios.get("all_reduce"), ratios.get("all_to_all")
        print(
            f"{job.name:<11} B={job.batch_size:>5} T={len(job.tables):>3} step {row.median_s * 1e3:6.1f} ms  "
            f"in-step / isolated: all_reduce {ar if ar is None else round(ar, 2)}, all_to_all "
            f"{a2a if a2a is None else round(a2a, 2)}",
            flush=True,
        )
    overall = summarise("DLRM steps", every)
    # the transformer's steps, pooled: what its own factors are learned from
    transformer = collective_pairs(model, [r for r in rows if r.op == TRANSFORMER_STEP_OP])
    transformer_overall = summarise("transformer steps", transformer)
    factors = dict(model.in_step.by_workload.get("dlrm", {})) if model.in_step else {}  # kept for DLRM steps
    print(f"kept in-step factors: all_reduce {factors.get('all_reduce')}, all_to_all {factors.get('all_to_all')}")
    if args.out:
        doc = {
            "command": "benchmarks/in_step_collectives.py " + " ".join(sys.argv[1:]),
            "steps": steps,
            "overall": overall,
            "transformer_overall": transformer_overall,
            "factors": factors,
        }
        args.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


def summarise(label: str, pairs: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Each collective's in-step / isolated ratio over `pairs`: median, mean and ratio of sums."""
    overall = {}
    for op, v in sorted((op, v) for op, v in pairs.items() if v):
        isolated, in_step = [iso for iso, _ in v], [s for _, s in v]
        ratios = [s / iso for iso, s in v]
        overall[op] = {
            "n": len(v),
            "median_ratio": statistics.median(ratios),
            "mean_ratio": statistics.fmean(ratios),
            "ratio_of_sums": sum(in_step) / sum(isolated),
        }
        print(
            f"over all {label} {op:<14} n={len(v):>3} in-step / isolated: median {overall[op]['median_ratio']:.2f}, "
            f"mean {overall[op]['mean_ratio']:.2f}, ratio of sums {overall[op]['ratio_of_sums']:.2f}"
        )
        overall[op]["by_size"] = by_size(v)
        if len(set(isolated)) > 2:
            slope, intercept = statistics.linear_regression(isolated, in_step)
            overall[op]["line"] = {"slope": slope, "intercept_ms": intercept * 1e3}
            print(f"    least squares: in-step = {slope:.2f} x isolated + {intercept * 1e3:.3f} ms")
        for q in overall[op]["by_size"]:
            print(
                f"    isolated {q['isolated_ms'][0]:.3f}-{q['isolated_ms'][1]:.3f} ms (n={q['n']}): ratio of sums "
                f"{q['ratio_of_sums']:.2f}, mean added {q['mean_added_ms']:.3f} ms"
            )
    return overall


def by_size(pairs: list[tuple[float, float]], parts: int = 4) -> list[dict]:
    """The calls in `parts` groups of rising isolated price: each group's price range, ratio of
    sums and mean seconds added a call (in-step minus isolated)."""
    ordered = sorted(pairs)
    size = math.ceil(len(ordered) / parts)
    groups = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    return [
        {
            "n": len(g),
            "isolated_ms": [g[0][0] * 1e3, g[-1][0] * 1e3],
            "ratio_of_sums": sum(s for _, s in g) / sum(iso for iso, _ in g),
            "mean_added_ms": statistics.fmean(s - iso for iso, s in g) * 1e3,
        }
        for g in groups
    ]


if __name__ == "__main__":
    main()
