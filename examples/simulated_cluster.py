"""A simulated multi-node Ray cluster on one machine, shaped like a KubeRay one: a head that
offers no work slots and worker nodes with the CPU slots you give. Prints the address to pass
as `--ray-address` and keeps the cluster up until interrupted.

    .venv/bin/python examples/simulated_cluster.py --workers 1,1
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workers",
        default="1,1",
        help="CPU slots per worker node, comma-separated (default %(default)s: two 1-CPU nodes)",
    )
    args = parser.parse_args(argv)
    try:
        slots = [int(x) for x in args.workers.split(",")]
        if not slots or min(slots) < 1:
            raise ValueError
    except ValueError:
        print(f"--workers: expected comma-separated integers >= 1, got {args.workers!r}", file=sys.stderr)
        return 2

    from ray.cluster_utils import Cluster

    from probes.host_allocator import apply_to_child_processes

    apply_to_child_processes()  # the nodes' workers inherit the allocator setting, as deployed nodes do
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for n in slots:
        cluster.add_node(num_cpus=n)
    cluster.wait_for_nodes()
    print(cluster.address, flush=True)
    print(
        f"head (no work slots) + {len(slots)} worker node(s) with {args.workers} CPU slot(s); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
