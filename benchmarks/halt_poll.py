"""Whether the cost of waking an idle CPU sets the small steps' time: the same two-rank launches
with a KVM guest's halt polling off and on, side by side.

    sudo .venv/bin/python benchmarks/halt_poll.py [--launches 6 --poll-ns 200000]

A guest CPU with nothing to run halts, and on a KVM host waking it again goes through the
hypervisor; `cpuidle-haltpoll` makes an idle CPU spin for up to
/sys/module/haltpoll/parameters/guest_halt_poll_ns first, so a wakeup that comes soon costs no
exit. A two-rank gloo step waits on the other rank several times per step, so if wakeups are what
the small steps pay for, their time and launch-to-launch spread fall with polling on and a
mid-sized step's barely move. Alternates the setting launch by launch (the order flipped every
round), measures the cross-core wakeup round trip (benchmarks/host_canary.py) beside each launch,
runs the tiny and mid-sized steps of benchmarks/core_binding.py with each rank bound to its own
core, and puts the setting back as it found it. Needs root and the haltpoll cpuidle driver (a KVM
guest); refuses elsewhere. Writes benchmarks/results/halt_poll.json. Run it with nothing else on
the host: it changes how the host's idle CPUs behave while it runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.core_binding import CASES, WORLD, launch, spread, spread_text  # noqa: E402
from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.host_canary import wakeup_us  # noqa: E402

POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=6, help="launches per case and setting")
    parser.add_argument("--iterations", type=int, default=20, help="timed steps per launch")
    parser.add_argument("--poll-ns", type=int, default=200_000, help="guest_halt_poll_ns while polling is on")
    parser.add_argument("--port", type=int, default=29700, help="first rendezvous port")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/halt_poll.json"))
    args = parser.parse_args()
    if not POLL.exists() or not os.access(POLL, os.W_OK):
        parser.error(f"needs a writable {POLL} (root, in a KVM guest with the haltpoll cpuidle driver)")
    if len(os.sched_getaffinity(0)) < WORLD:
        parser.error(f"needs at least {WORLD} cores")
    found = POLL.read_text().strip()
    settings = {"off": 0, "on": args.poll_ns}
    runs: dict[str, list[list[float]]] = {}
    wakeups: dict[str, list[float]] = {name: [] for name in settings}
    port = args.port
    try:
        for k in range(args.launches):
            for name in settings if k % 2 == 0 else reversed(list(settings)):
                POLL.write_text(str(settings[name]))
                trips = wakeup_us()
                wakeups[name].append(statistics.median(trips))
                for case_name, case in CASES.items():
                    port += 1
                    steps = launch(case, True, port, args.iterations)
                    runs.setdefault(f"{case_name} polling {name}", []).append(steps)
                    print(
                        f"launch {k} {case_name:4s} polling {name:3s} median {statistics.median(steps):7.2f} ms "
                        f"(wakeup {wakeups[name][-1]:6.1f} us)",
                        flush=True,
                    )
    finally:
        POLL.write_text(found)
    cases = {key: spread(launches) for key, launches in runs.items()}
    for key, s in cases.items():
        print(spread_text(key, s, 16))
    for name, values in wakeups.items():
        print(f"wakeup round trip, polling {name}: median of launches {statistics.median(values):.1f} us {values}")
    write_result(
        Path(args.out),
        {
            "command": " ".join(["python", *sys.argv]),
            "poll_ns_found": int(found),
            "settings_ns": settings,
            "cases": cases,
            "wakeup_round_trip_us": {name: [round(v, 1) for v in values] for name, values in wakeups.items()},
            "launches": {key: [[round(t, 3) for t in steps] for steps in launches] for key, launches in runs.items()},
        },
    )


if __name__ == "__main__":
    main()
