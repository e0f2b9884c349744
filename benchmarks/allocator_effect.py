"""What glibc's heap trimming costs compute + collective pairs on 2 gloo ranks, and how the
allocator setting the product's workers run with (`probes.host_allocator`) changes it.

    .venv/bin/python benchmarks/allocator_effect.py [--rounds 15]

Measures each point's unfused and fused forms (2/4/8/16 slices) and its transfer-only forms
twice: with glibc's defaults and with the setting. Under the defaults the heap is trimmed and
tens of MB are page-faulted back in on every call of the large unfused pairs, which slicing
dodges; that reads as a fusion gain no overlap produced. Writes
benchmarks/results/allocator_effect.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from substitution import measure  # noqa: E402

from probes.host_allocator import GLIBC_TUNABLES  # noqa: E402
from probes.vocabulary.pairs import PairPoint  # noqa: E402

POINTS = [
    PairPoint("gemm_all_to_all", 8192, 512, 64),  # 33 MB exchanged
    PairPoint("embedding_all_to_all", 8192, 256, tables=8, pooling=8),  # 16 MB
    PairPoint("gemm_all_to_all", 512, 2048, 256),  # 8 MB
]


def forms_ms(rows) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        name = f"{r.params['pair']} {r.params['rows']}x{r.params['cols']}x{r.params['inner']}"
        out.setdefault(name, {})[r.extra["form"]] = r.median_s * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/allocator_effect.json"))
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="allocator-"))
    results = {}
    for label, tuned in (("glibc defaults", False), ("tuned", True)):
        print(f"-- {label}", flush=True)
        results[label] = forms_ms(
            measure(
                POINTS,
                scratch / f"{'tuned' if tuned else 'default'}.jsonl",
                args.rounds,
                transfer=True,
                tuned_allocator=tuned,
            )
        )
    rows = []
    for name, default in results["glibc defaults"].items():
        tuned = results["tuned"][name]
        best = lambda f: min(v for k, v in f.items() if k.startswith("k"))  # noqa: E731
        rows.append(
            {
                "point": name,
                "default_ms": default,
                "tuned_ms": tuned,
                "unfused_speedup": default["unfused"] / tuned["unfused"],
                "best_fused_gain_default": 1 - best(default) / default["unfused"],
                "best_fused_gain_tuned": 1 - best(tuned) / tuned["unfused"],
            }
        )
        r = rows[-1]
        print(
            f"{name:38s} unfused {default['unfused']:6.2f} -> {tuned['unfused']:6.2f} ms "
            f"({r['unfused_speedup']:.2f}x); best fused gain {r['best_fused_gain_default']:+.1%} -> "
            f"{r['best_fused_gain_tuned']:+.1%}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": f"python benchmarks/allocator_effect.py --rounds {args.rounds}",
                "device": "cpu (2 gloo ranks, 1 thread each)",
                "tuned": GLIBC_TUNABLES,
                "points": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
