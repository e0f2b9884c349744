"""The product's entry point: `python -m orchestrator.autotune --job job.yaml`, what users run
through `ray job submit` (and the KubeRay RayJob in deploy/). It runs the autotune command,
orchestrator/cli/autotune.py; the flow itself is orchestrator/autotuning.py."""

import sys

from orchestrator.cli.autotune import main

if __name__ == "__main__":
    sys.exit(main())
