"""Keeping the C allocator from handing freed buffers back to the OS between iterations.

With glibc's defaults, a process that frees a few tens of MB at the top of its heap each
iteration (a producer's output and a collective's receive buffer) has the heap trimmed and
then page-faults the same memory back in on the next iteration. On the 2-core CPU host the
unfused embedding + all-to-all pair of 16 MB buffers took 17.9 ms against 11.2 ms with the
setting below, and GEMM + all-to-all of 33 MB 48.7 against 27.0 ms
(benchmarks/allocator_effect.py); slicing the pair into smaller buffers dodged it, which read
as a fusion gain that no overlap produced. Memory allocators tuned for PyTorch on CPU (jemalloc, tcmalloc) avoid
the same churn; glibc's own tunables do it without a new dependency.

The setting must be in a process's environment when it starts (glibc reads it once), so it
is applied to the environment child processes inherit: probe and training workers of a local
Ray cluster, and processes spawned by `torch.multiprocessing`. A GLIBC_TUNABLES the user set
is left as it is.
"""

from __future__ import annotations

import os
from typing import MutableMapping

# Keep up to 1 GiB free at the heap's top before trimming; buffers up to 32 MiB (glibc's
# largest mmap threshold on 64-bit) come from the heap, where a freed one is reused.
GLIBC_TUNABLES = "glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432"


def allocator_env() -> dict[str, str]:
    """Environment variables for a worker process (e.g. a node's container spec)."""
    return {"GLIBC_TUNABLES": GLIBC_TUNABLES}


def apply_to_child_processes(environ: MutableMapping[str, str] | None = None) -> bool:
    """Put the allocator setting into the environment children inherit, unless the user
    already set GLIBC_TUNABLES; whether it was set here."""
    environ = os.environ if environ is None else environ
    if "GLIBC_TUNABLES" in environ:
        return False
    environ.update(allocator_env())
    return True
