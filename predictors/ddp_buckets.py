"""DDP's gradient buckets: the sizes it all-reduces (a small first bucket, then up to
`bucket_cap_mb`) and the order gradients fill them in, shared by the DLRM's and the
transformer's execution graphs (`predictors/dlrm_graph.py`, `predictors/transformer_graph.py`)."""

from __future__ import annotations

from typing import Sequence

DDP_FIRST_BUCKET_BYTES = 1 * 2**20
GRADIENT_REDUCE = "ddp_all_reduce"  # the name each bucket's all-reduce in a graph starts with
DDP_BUCKET_BYTES = 25 * 2**20


def ddp_buckets(param_bytes: int, bucket_bytes: int = DDP_BUCKET_BYTES) -> list[int]:
    """Bucket sizes DDP all-reduces: a small first bucket, then up to `bucket_bytes` each."""
    buckets, left = [], param_bytes
    first = min(left, DDP_FIRST_BUCKET_BYTES)
    if first:
        buckets.append(first)
        left -= first
    while left > 0:
        buckets.append(min(left, bucket_bytes))
        left -= buckets[-1]
    return buckets


class BucketFill:
    """DDP's buckets as gradients fill them, last layer first: a bucket's all-reduce is
    launched once its last gradient is written."""

    def __init__(self, sizes: Sequence[int], filled: float = 0.0) -> None:
        self.left, self.filled = list(sizes), filled

    def add(self, nbytes: float) -> list[int]:
        """The sizes of the buckets that `nbytes` more gradient bytes complete, in order."""
        self.filled += nbytes
        done = []
        while self.left and self.filled >= self.left[0] - 1e-9:
            self.filled -= self.left[0]
            done.append(int(self.left.pop(0)))
        return done
