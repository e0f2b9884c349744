"""What every CLI shares: options, fingerprinting, champion lookup, error exits."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Sequence

from orchestrator import registry
from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint
from orchestrator.progress import say
from policies.sharders import NoFeasiblePlanError
from predictors.network import NetworkError
from probes.hierarchical_allreduce import ScheduleError
from probes.table_shards import ShardingPlanError
from probes.jobspec import JobSpecError
from probes.placement import PlacementError
from predictors.opmodels import UncalibratedGroupError

EXIT_BAD_INPUT, EXIT_NO_MODEL, EXIT_FAILED = 2, 3, 1


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--ray-address", help="Ray cluster address (default: $RAY_ADDRESS, else a local cluster)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def fingerprint(ray_address: str | None, start_ray: bool) -> HardwareFingerprint:
    """The whole Ray cluster's fingerprint when Ray is (or must be) in use, else this node's.

    A single local node fingerprints the same either way, so planning and predicting need not
    start Ray just to learn which models to load.
    """
    if start_ray or ray_address or os.environ.get("RAY_ADDRESS"):
        from orchestrator import ray_runtime
        from orchestrator.cluster import cluster_fingerprint

        ray_runtime.connect(ray_address)
        return cluster_fingerprint()
    return HardwareFingerprint([local_node_fingerprint()])


def champion_or_exit(hardware_id: str) -> registry.RegisteredBundle:
    found = registry.get_alias(hardware_id, registry.CHAMPION)
    if found is None:
        say(f"no champion model for hardware {hardware_id}; run `python -m orchestrator.calibrate` "
            f"or `python -m orchestrator.autotune --job J` first")
        sys.exit(EXIT_NO_MODEL)
    return found


def emit(obj: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        print(json.dumps(obj))
    else:
        human(obj)


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Turn input errors into a clear message and exit code instead of a traceback."""
    try:
        return main(argv)
    except JobSpecError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except NoFeasiblePlanError as exc:
        print(f"no feasible plan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ShardingPlanError as exc:
        print(f"invalid plan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (NetworkError, ScheduleError) as exc:
        print(f"invalid network: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PlacementError as exc:
        print(f"invalid placement: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UncalibratedGroupError as exc:
        print(f"cannot price this job's collectives: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FileNotFoundError as exc:
        print(f"file not found: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
