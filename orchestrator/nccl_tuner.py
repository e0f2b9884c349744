"""`python -m orchestrator.nccl_tuner`: the NCCL tuner CSV from a calibration's measured
choices; the command is orchestrator/cli/nccl_tuner.py, the policy policies/nccl_tuner.py."""

import sys

from orchestrator.cli.nccl_tuner import main

if __name__ == "__main__":
    sys.exit(main())
