"""The transformer job's description: a GPT-style block stack, its data- and tensor-parallel
layout and its training precision. The graph builder, the memory model and the real job all
read the same record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


class TransformerSpecError(ValueError):
    pass


# Training precisions: float32, or mixed precision under torch.autocast with weights, gradients
# and the optimizer kept in float32 (float16 adds a GradScaler, so it needs CUDA).
DTYPES = ("float32", "bfloat16", "float16")
CPU_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class TransformerSpec:
    layers: int
    hidden: int
    heads: int
    seq_len: int
    batch_size: int  # sequences per data-parallel rank
    world_size: int
    tensor_parallel: int = 1
    dropout: float = 0.1
    iterations: int = 20
    warmup_iterations: int = 5
    seed: int = 0
    name: str = "transformer"
    dtype: str = "float32"  # autocast precision of the step; one of DTYPES

    def __post_init__(self) -> None:
        problems = [
            f"{k}: expected an integer >= 1, got {getattr(self, k)!r}"
            for k in ("layers", "hidden", "heads", "seq_len", "batch_size", "world_size", "tensor_parallel")
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1
        ]
        if not problems:
            if self.hidden % self.heads:
                problems.append(f"heads: expected a divisor of hidden={self.hidden}, got {self.heads}")
            if self.heads % self.tensor_parallel:
                problems.append(
                    f"tensor_parallel: expected a divisor of heads={self.heads}, got {self.tensor_parallel}"
                )
            if self.world_size % self.tensor_parallel:
                problems.append(
                    f"tensor_parallel: expected a divisor of world_size={self.world_size}, got {self.tensor_parallel}"
                )
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout: expected 0 <= p < 1, got {self.dropout!r}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype: expected one of {list(DTYPES)}, got {self.dtype!r}")
        if problems:
            raise TransformerSpecError("invalid transformer spec:\n  " + "\n  ".join(problems))

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.tensor_parallel

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tp_group_of(self, rank: int) -> tuple[int, ...]:
        """Consecutive ranks share a TP group (TP is the inner, faster dimension)."""
        start = rank - rank % self.tensor_parallel
        return tuple(range(start, start + self.tensor_parallel))

    def dp_group_of(self, rank: int) -> tuple[int, ...]:
        return tuple(range(rank % self.tensor_parallel, self.world_size, self.tensor_parallel))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransformerSpec":
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise TransformerSpecError(
                f"invalid transformer spec:\n  unknown field(s) {unknown}; allowed: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**data)


def random_transformer(index: int, world_size: int, tensor_parallel: int, seed: int) -> TransformerSpec:
    """Random GPT-style task `index` (deterministic in `seed`): 1-4 blocks, hidden 64-256,
    2-8 heads, sequence 32-128, batch 2-8, sized to run in seconds on CPU ranks. The
    accuracy benchmark draws its tasks from here; calibration draws probes from its own seed
    stream."""
    rng = np.random.default_rng([seed, index, 104729])
    hidden = int(rng.choice([64, 128, 256]))
    heads = int(rng.choice([h for h in (2, 4, 8) if hidden % h == 0 and h % tensor_parallel == 0]))
    return TransformerSpec(
        layers=int(rng.integers(1, 5)),
        hidden=hidden,
        heads=heads,
        seq_len=int(rng.choice([32, 64, 128])),
        batch_size=int(rng.choice([2, 4, 8])),
        world_size=world_size,
        tensor_parallel=tensor_parallel,
        dropout=0.1,
        seed=index,
        name=f"gpt{index}-tp{tensor_parallel}",
    )
