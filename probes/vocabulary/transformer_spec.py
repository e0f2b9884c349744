"""The transformer job's description: a GPT-style block stack, its parallel layout (data x
tensor x pipeline parallel, micro-batches, activation recomputation, sharded data parallel
through FSDP) and its training precision. The graph builder, the memory model and the real job
all read the same record.

Ranks are laid out Megatron-style, tensor parallel innermost: rank = stage x (DP x TP) +
dp_rank x TP + tp_rank, so a TP group is consecutive ranks (one node while it fits one) and a
pipeline's stages are the slowest dimension (across nodes first).
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
# Sharded data parallel through PyTorch FSDP (fully_shard): none (DDP), shard_grad_op (ZeRO-2:
# gradients and optimizer state sharded, parameters gathered once per step and kept until the
# backward), full_shard (ZeRO-3: parameters gathered again for the backward).
FSDP_MODES = ("none", "shard_grad_op", "full_shard")
# A pipeline stage's data-parallel gradient buckets, all-reduced after its last backward: DDP's
# default cap (25 MiB)
GRADIENT_BUCKET_BYTES = 25 * 2**20


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
    pipeline_parallel: int = 1  # stages; each holds a contiguous run of blocks (1F1B schedule)
    micro_batches: int = 1  # the local batch split for gradient accumulation / the pipeline
    recompute: bool = False  # activation recomputation: each block's forward re-run in its backward
    fsdp: str = "none"  # one of FSDP_MODES (data parallel only: tensor_parallel = pipeline_parallel = 1)
    vocab_size: int = 0  # >0: token ids in, an embedding and an LM head with cross-entropy; 0: random activations, MSE

    def __post_init__(self) -> None:
        counts = ("layers", "hidden", "heads", "seq_len", "batch_size", "world_size", "tensor_parallel") + (
            "pipeline_parallel",
            "micro_batches",
        )
        problems = [
            f"{k}: expected an integer >= 1, got {getattr(self, k)!r}"
            for k in counts
            if isinstance(getattr(self, k), bool) or not isinstance(getattr(self, k), int) or getattr(self, k) < 1
        ]
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or self.vocab_size < 0:
            problems.append(
                f"vocab_size: expected an integer >= 0 (0: no embedding or LM head), got {self.vocab_size!r}"
            )
        if not problems:
            problems += self._layout_problems()
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout: expected 0 <= p < 1, got {self.dropout!r}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype: expected one of {list(DTYPES)}, got {self.dtype!r}")
        if self.fsdp not in FSDP_MODES:
            problems.append(f"fsdp: expected one of {list(FSDP_MODES)}, got {self.fsdp!r}")
        if not isinstance(self.recompute, bool):
            problems.append(f"recompute: expected true or false, got {self.recompute!r}")
        if problems:
            raise TransformerSpecError("invalid transformer spec:\n  " + "\n  ".join(problems))

    def _layout_problems(self) -> list[str]:
        problems = []
        tp, pp = self.tensor_parallel, self.pipeline_parallel
        if self.hidden % self.heads:
            problems.append(f"heads: expected a divisor of hidden={self.hidden}, got {self.heads}")
        if self.heads % tp:
            problems.append(f"tensor_parallel: expected a divisor of heads={self.heads}, got {tp}")
        if pp == 1 and self.world_size % tp:
            problems.append(f"tensor_parallel: expected a divisor of world_size={self.world_size}, got {tp}")
        elif self.world_size % (tp * pp):
            problems.append(
                f"tensor_parallel x pipeline_parallel: expected a divisor of world_size={self.world_size}, "
                f"got {tp} x {pp}"
            )
        if pp > self.layers:
            problems.append(f"pipeline_parallel: expected at most layers={self.layers} stages, got {pp}")
        if self.batch_size % self.micro_batches:
            problems.append(
                f"micro_batches: expected a divisor of batch_size={self.batch_size} (sequences per data-parallel "
                f"rank), got {self.micro_batches}"
            )
        if 1 < pp and self.micro_batches < pp:
            problems.append(
                f"micro_batches: expected at least pipeline_parallel={pp} (the 1F1B schedule keeps a micro-batch "
                f"in every stage), got {self.micro_batches}"
            )
        if self.fsdp != "none" and (tp > 1 or pp > 1):
            problems.append(
                f"fsdp: {self.fsdp!r} shards a data-parallel job (tensor_parallel=1, pipeline_parallel=1); "
                f"with tensor_parallel={tp}, pipeline_parallel={pp} the allowed value is 'none'"
            )
        return problems

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def stage_width(self) -> int:
        """Ranks of one pipeline stage (its DP x TP grid)."""
        return self.data_parallel * self.tensor_parallel

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.data_parallel

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_width

    def dp_rank_of(self, rank: int) -> int:
        return rank % self.stage_width // self.tensor_parallel

    def stage_layers(self, stage: int) -> range:
        """The blocks stage `stage` holds: contiguous, the first stages one more when uneven."""
        per, extra = divmod(self.layers, self.pipeline_parallel)
        start = stage * per + min(stage, extra)
        return range(start, start + per + (stage < extra))

    def pp_group_of(self, rank: int) -> tuple[int, ...]:
        """The rank's pipeline: the ranks at its DP x TP position in every stage, first to last."""
        offset = rank % self.stage_width
        return tuple(offset + s * self.stage_width for s in range(self.pipeline_parallel))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tp_group_of(self, rank: int) -> tuple[int, ...]:
        """Consecutive ranks share a TP group (TP is the inner, faster dimension)."""
        start = rank - rank % self.tensor_parallel
        return tuple(range(start, start + self.tensor_parallel))

    def dp_group_of(self, rank: int) -> tuple[int, ...]:
        """The ranks of the rank's stage holding the same TP shard."""
        base = self.stage_of(rank) * self.stage_width + rank % self.tensor_parallel
        return tuple(range(base, base + self.stage_width, self.tensor_parallel))

    @property
    def layout(self) -> str:
        """A short name of the parallel layout, e.g. dp2-tp1-pp2-mb4-rc (as plans list candidates)."""
        name = f"dp{self.data_parallel}-tp{self.tensor_parallel}-pp{self.pipeline_parallel}-mb{self.micro_batches}"
        name += "-rc" if self.recompute else ""
        return name + (f"-{self.fsdp}" if self.fsdp != "none" else "")

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
