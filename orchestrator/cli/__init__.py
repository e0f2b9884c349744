"""The command-line programs, one module each: argparse, the lines printed, `--json` output and
exit codes; the work is done by the library modules of `orchestrator` they call.

    python -m orchestrator.cli.autotune   fingerprint, recalibrate if needed, plan, launch, compare
                                          (`python -m orchestrator.autotune`, the entry point
                                          `ray job submit` runs, is the same command)
    python -m orchestrator.cli.calibrate  measure this cluster, fit, register (or --refit DIR)
    python -m orchestrator.cli.plan       plan a job with the champion, no launch
    python -m orchestrator.cli.predict    a job's iteration time under a given plan
    python -m orchestrator.cli.run        run a job with a given plan and measure it
    python -m orchestrator.cli.nightly    recalibrate what is stale or drifting
    python -m orchestrator.cli.drift      prediction and sentinel error over time, with a chart
    python -m orchestrator.cli.fuse       how many copies of a repetitive job to fuse per device

`common` holds what they share: option validators, fingerprinting, error exits.
"""
