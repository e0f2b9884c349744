"""NCCL's own names for what its tuner chooses per collective call: the algorithm and the
protocol (torch-free; the probe is `probes.nccl_choice`, the CSV `policies.nccl_tuner`).

NCCL picks an (algorithm, protocol) pair per call from its own cost model; `NCCL_ALGO` and
`NCCL_PROTO`, read when a communicator is created, restrict that choice, and a tuner plugin
overrides it per message size. A calibration on an NCCL cluster times each collective under
every pair NCCL runs it with on any topology (ring everywhere; tree for all-reduce only) and
under NCCL's own choice (`AUTO`), so the tuner CSV overrides NCCL only where a forced pair was
measured faster. NVLS, CollNet and PAT need particular hardware (NVSwitch, SHARP, one GPU per
node) and are left to NCCL.
"""

from __future__ import annotations

NCCL_CHOICE_FAMILY = "nccl_choice"
AUTO = "auto"  # NCCL_ALGO / NCCL_PROTO unset: NCCL's own choice
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("ll", "ll128", "simple")
# Our collective op -> the example tuner plugin's `collective_type` (nccl ext-tuner/example).
TUNER_COLLECTIVES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
}
# NCCL's spelling in NCCL_ALGO / NCCL_PROTO (it compares case-insensitively; these are its own).
ENV_NAMES = {"ring": "Ring", "tree": "Tree", "ll": "LL", "ll128": "LL128", "simple": "Simple"}


def candidates(op: str) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs a calibration times `op` with, NCCL's own choice first."""
    if op not in TUNER_COLLECTIVES:
        raise ValueError(f"op: NCCL's tuner chooses for {sorted(TUNER_COLLECTIVES)}, not {op!r}")
    algorithms = ALGORITHMS if op == "all_reduce" else ("ring",)
    return [(AUTO, AUTO)] + [(a, p) for a in algorithms for p in PROTOCOLS]
