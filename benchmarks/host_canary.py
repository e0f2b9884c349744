"""Sample the host beside a run, then set the run's launches against the samples.

    .venv/bin/python benchmarks/host_canary.py sample --out FILE.jsonl [--every-s 5] [--for-s 4000]
    .venv/bin/python benchmarks/host_canary.py join FILE.jsonl RESULT.json [RESULT.json ...] [--out J]

The e2e benchmarks' small steps run in a fast and a slow mode, whole launches at a time, in
spells of minutes (README, 12-05); neither the kernel checks' single-rank speed nor the share of
the cores other processes kept busy follows them. `sample` writes one line every `--every-s`
seconds with what the kernel says of the host (the CPU time split since the last line from
/proc/stat, steal included; /proc/pressure/cpu; context switches; anonymous huge pages and
available memory; how many Ray worker processes are alive) and three canaries small enough to
leave the run alone (a few ms each): a cross-core wakeup round trip (200 one-byte pipe
ping-pongs between two processes held on the first and the last core), a fixed arithmetic loop
alone and two copies of it at once on those two cores (their time over the loop's alone: near 1
while the host runs the two CPUs side by side, near 2 while it runs them in turns), and a 16 MiB
copy. `join` takes the benchmarks' JSON (each launch's end time,
`launch_ended_unix`), averages the samples of the `--window-s` seconds before each launch ended,
and prints how each sampled figure ranks against the launch's measured time over its
prediction (Spearman), and, per result, against the launch over its task's median launch, so a host-side cause of the slow mode shows as a rank correlation, and
its absence as none.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROUND_TRIPS = 200
LOOP_TURNS = 50_000
COPY_BYTES = 16 * 2**20


@dataclass
class Sample:
    """One line of `sample`'s output."""

    unix: float
    steal_share: float
    busy_share: float
    iowait_share: float
    context_switches_per_s: float
    pressure_some_avg10: float | None
    anon_huge_mb: float
    available_mb: float
    ray_workers: int
    wakeup_us_median: float | None
    wakeup_us_p90: float | None
    loop_ms: float
    loops_at_once_over_alone: float | None
    copy_ms: float


def pressure_some_avg10() -> float | None:
    """The share of the last 10 s some runnable task waited for a CPU (None: no PSI here)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return float(dict(kv.split("=") for kv in first.split()[1:])["avg10"])


def anon_huge_mb() -> float:
    """AnonHugePages from /proc/meminfo (which psutil does not report), in MiB; 0 where absent."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return 0.0
    return next((float(line.split()[1]) / 1024 for line in lines if line.startswith("AnonHugePages:")), 0.0)


def ray_workers() -> int:
    """Processes whose command line Ray renamed to `ray::...` (actors and tasks)."""
    import psutil

    return sum(
        1 for process in psutil.process_iter(["cmdline"]) if (process.info["cmdline"] or [""])[0].startswith("ray::")
    )


class Echo:
    """A child process on the last core that answers each byte on one pipe with a byte on
    another: the parent, on the first core, times the round trips, which are the cost of waking
    a process on another core (what a gloo collective between two ranks pays each step)."""

    def __init__(self) -> None:
        cores = sorted(os.sched_getaffinity(0))
        self.cores = set(cores)
        self.active = len(cores) > 1
        if not self.active:
            return
        self.to_child_r, self.to_child_w = os.pipe()
        self.to_parent_r, self.to_parent_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # each side keeps only its own ends, so closing the parent's ends the child
            os.close(self.to_child_w)
            os.close(self.to_parent_r)
            os.sched_setaffinity(0, {cores[-1]})
            while byte := os.read(self.to_child_r, 1):
                os.write(self.to_parent_w, struct.pack("d", loop_ms()) if byte == b"L" else b"x")
            os._exit(0)
        os.close(self.to_child_r)
        os.close(self.to_parent_w)
        os.sched_setaffinity(0, {cores[0]})

    def round_trips_us(self, count: int) -> list[float]:
        """`count` round trips, sorted (none with a single core)."""
        trips = []
        for _ in range(count if self.active else 0):
            t0 = time.perf_counter_ns()
            os.write(self.to_child_w, b"x")
            os.read(self.to_parent_r, 1)
            trips.append((time.perf_counter_ns() - t0) / 1e3)
        return sorted(trips)

    def loops_at_once_ms(self) -> float:
        """The slower of two copies of the arithmetic loop started together, one on each core:
        the loop's time alone while the host runs both CPUs at once, up to twice it while it
        runs them in turns on one CPU of its own."""
        os.write(self.to_child_w, b"L")
        mine = loop_ms()
        theirs = struct.unpack("d", os.read(self.to_parent_r, 8))[0]
        return max(mine, theirs)

    def close(self) -> None:
        """Stop the child, and give this process back every core it had."""
        if self.active:
            os.close(self.to_child_w)
            os.waitpid(self.pid, 0)
            os.close(self.to_parent_r)
            os.sched_setaffinity(0, self.cores)


def wakeup_us(count: int = ROUND_TRIPS) -> list[float]:
    """`count` cross-core round trips, sorted (empty with a single core)."""
    echo = Echo()
    try:
        return echo.round_trips_us(count)
    finally:
        echo.close()


def loop_ms() -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(LOOP_TURNS):
        total += i * i
    return (time.perf_counter() - t0) * 1e3


def copy_ms(source: bytearray, target: bytearray) -> float:
    t0 = time.perf_counter()
    target[:] = source
    return (time.perf_counter() - t0) * 1e3


def sample(out: Path, every_s: float, for_s: float) -> None:
    import psutil

    echo = Echo()
    source, target = bytearray(os.urandom(COPY_BYTES)), bytearray(COPY_BYTES)
    psutil.cpu_times_percent()  # the first call only sets the mark the next one is measured from
    switches = psutil.cpu_stats().ctx_switches
    last = time.time()
    end = last + for_s
    try:
        with out.open("a") as stream:
            while time.time() < end:
                time.sleep(every_s)
                split = psutil.cpu_times_percent()
                now_switches = psutil.cpu_stats().ctx_switches
                now = time.time()
                trips = echo.round_trips_us(ROUND_TRIPS)
                alone = loop_ms()
                row = Sample(
                    unix=round(now, 1),
                    steal_share=getattr(split, "steal", 0.0) / 100,
                    busy_share=1 - (split.idle + getattr(split, "iowait", 0.0) + getattr(split, "steal", 0.0)) / 100,
                    iowait_share=getattr(split, "iowait", 0.0) / 100,
                    context_switches_per_s=(now_switches - switches) / (now - last),
                    pressure_some_avg10=pressure_some_avg10(),
                    anon_huge_mb=anon_huge_mb(),
                    available_mb=psutil.virtual_memory().available / 2**20,
                    ray_workers=ray_workers(),
                    wakeup_us_median=statistics.median(trips) if trips else None,
                    wakeup_us_p90=trips[int(0.9 * len(trips))] if trips else None,
                    loop_ms=alone,
                    loops_at_once_over_alone=echo.loops_at_once_ms() / alone if echo.active else None,
                    copy_ms=copy_ms(source, target),
                )
                stream.write(json.dumps(asdict(row)) + "\n")
                stream.flush()
                switches, last = now_switches, now
    finally:
        echo.close()


def spearman(xs: list[float], ys: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(xs) < 4 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    rho = spearmanr(xs, ys).statistic
    return None if math.isnan(rho) else float(rho)


def launches(result: dict) -> list[dict]:
    """Every launch of a benchmark JSON: its task, end time and measured over predicted."""
    rows = []
    for task in result["tasks"]:
        for ms, ended in zip(task["measured_rounds_ms"], task.get("launch_ended_unix") or []):
            rows.append({"task": task["name"], "ended": ended, "measured_ms": ms, "over": ms / task["predicted_ms"]})
    return rows


def join(samples_path: Path, results: list[Path], window_s: float) -> dict:
    samples = [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]
    fields = [f for f in Sample.__dataclass_fields__ if f != "unix"]
    joined = []
    for path in results:
        for launch in launches(json.loads(path.read_text())):
            near = [s for s in samples if launch["ended"] - window_s <= s["unix"] <= launch["ended"]]
            if not near:
                continue
            means = {}
            for f in fields:
                values = [s[f] for s in near if s.get(f) is not None]
                means[f] = statistics.fmean(values) if values else None
            joined.append({**launch, "result": path.name, "samples": len(near), **means})
    by_task: dict[tuple[str, str], list[float]] = {}
    for j in joined:
        by_task.setdefault((j["result"], j["task"]), []).append(j["measured_ms"])
    for j in joined:  # the launch against its own task's others: what the host, not the model, moved
        j["within_task"] = j["measured_ms"] / statistics.median(by_task[(j["result"], j["task"])])
    within = {}
    for path in results:
        of_result = [j for j in joined if j["result"] == path.name]
        within[path.name] = {f: ranked(of_result, f, "within_task") for f in fields}
    return {
        "window_s": window_s,
        "launches": len(joined),
        "spearman_vs_over": {f: ranked(joined, f, "over") for f in fields},
        "spearman_within_task": within,
        "joined": joined,
    }


def ranked(joined: list[dict], field: str, against: str) -> float | None:
    """Spearman of a sampled figure against `against` over the launches that have the figure."""
    pairs = [(j[field], j[against]) for j in joined if j[field] is not None]
    return spearman([p[0] for p in pairs], [p[1] for p in pairs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sampler = sub.add_parser("sample", help="write one line of host figures every --every-s seconds")
    sampler.add_argument("--out", type=Path, required=True)
    sampler.add_argument("--every-s", type=float, default=5.0)
    sampler.add_argument("--for-s", type=float, default=4000.0)
    joiner = sub.add_parser("join", help="rank each sampled figure against the launches' measured/predicted")
    joiner.add_argument("samples", type=Path)
    joiner.add_argument("results", type=Path, nargs="+")
    joiner.add_argument("--window-s", type=float, default=20.0)
    joiner.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "sample":
        sample(args.out, args.every_s, args.for_s)
        return
    report = join(args.samples, args.results, args.window_s)
    print(f"{report['launches']} launches joined (samples of the {args.window_s:g} s before each ended)")
    for field, rho in report["spearman_vs_over"].items():
        print(f"  {field:24s} spearman vs measured/predicted {'-' if rho is None else f'{rho:+.2f}'}")
    for name, ranks in report["spearman_within_task"].items():
        print(f"{name}, a launch over its task's median:")
        for field, rho in ranks.items():
            print(f"  {field:24s} spearman {'-' if rho is None else f'{rho:+.2f}'}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
