"""The command-line programs, one module each: argparse, the lines printed, `--json` output and
exit codes; the work is done by the library modules of `orchestrator` they call. Each is also a
console script (pyproject.toml):

    autotune            python -m orchestrator.autotune   fingerprint, recalibrate if needed, plan,
                                                          launch, compare (what `ray job submit` runs)
    autotune-calibrate  python -m orchestrator.cli.calibrate  measure this cluster, fit, register (or --refit DIR)
    autotune-plan       python -m orchestrator.cli.plan       plan a job with the champion, no launch
    autotune-predict    python -m orchestrator.cli.predict    a job's iteration time under a given plan
    autotune-run        python -m orchestrator.cli.run        run a job with a given plan and measure it
    autotune-nightly    python -m orchestrator.cli.nightly    recalibrate what is stale or drifting
    autotune-drift      python -m orchestrator.cli.drift      prediction and sentinel error over time, with a chart
    autotune-fuse       python -m orchestrator.cli.fuse       how many copies of a repetitive job to fuse per device

`options` builds their parsers and reports bad input, and imports nothing heavy, so `--help`
answers at once; `common` (the fingerprint, the champion) is imported after parsing.
"""
