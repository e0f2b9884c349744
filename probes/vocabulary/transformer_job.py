"""A transformer job file (`workload: transformer`): the model and the cluster share it will
train on, not its layout, which the parallelism policy chooses (policies/parallelism.py).

    name: gpt_small                 # optional label (default "job")
    workload: transformer           # required
    world_size: 2                   # ranks (devices), >= 1
    layers: 4                       # blocks
    hidden: 256                     # model width; a multiple of heads
    heads: 8                        # attention heads
    seq_len: 128                    # tokens per sequence
    vocab_size: 1000                # tokens of the embedding and LM head; 0: none (random activations, MSE)
    global_batch: 16                # sequences per optimizer step, over all data-parallel replicas
    dtype: float32                  # optional: float32, bfloat16 or float16 (autocast; float16 needs CUDA)
    dropout: 0.1                    # optional, 0 <= p < 1
    iterations: 20                  # optional, timed iterations when launched (default 20)
    warmup_iterations: 5            # optional (default 5)
    seed: 0                         # optional
    memory_cap_gb: 8                # optional per-rank cap on the predicted peak memory
    network: {topology: ...}        # optional, as for DLRM jobs: chunk the gradient all-reduce

Bounds (`TRANSFORMER_LIMITS`), like the DLRM job's, are what no job this planner serves needs,
so a typo is refused at once: layers 1..1024, hidden 1..65536, heads 1..1024, seq_len 1..2^20,
vocab_size 0..2^24, global_batch 1..2^24.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from probes.vocabulary.transformer_spec import DTYPES, TransformerSpec

TRANSFORMER_LIMITS: dict[str, tuple[int, int, str]] = {
    "layers": (1, 1024, "blocks; the largest published models have under 200"),
    "hidden": (1, 65536, "model width"),
    "heads": (1, 1024, "attention heads"),
    "seq_len": (1, 2**20, "tokens per sequence"),
    "vocab_size": (0, 2**24, "tokens of the vocabulary (0: none)"),
    "global_batch": (1, 2**24, "sequences per optimizer step"),
}
# The fields a transformer job file may give, in the order it lists them.
TRANSFORMER_FIELDS = (
    "name",
    "workload",
    "world_size",
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab_size",
    "global_batch",
    "dtype",
    "dropout",
    "iterations",
    "warmup_iterations",
    "seed",
    "memory_cap_gb",
    "network",
)


@dataclass(frozen=True)
class TransformerJob:
    world_size: int
    layers: int
    hidden: int
    heads: int
    seq_len: int
    global_batch: int
    vocab_size: int = 0
    dtype: str = "float32"
    dropout: float = 0.1
    iterations: int = 20
    warmup_iterations: int = 5
    seed: int = 0
    memory_cap_gb: float | None = None
    name: str = "job"
    network: dict[str, Any] | None = None
    workload: str = "transformer"

    def spec(
        self,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        micro_batches: int = 1,
        recompute: bool = False,
        fsdp: str = "none",
    ) -> TransformerSpec:
        """The job under one layout (`TransformerSpecError` if the layout does not divide it);
        the global batch split over the data-parallel replicas."""
        data_parallel = self.world_size // (tensor_parallel * pipeline_parallel)
        return TransformerSpec(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            seq_len=self.seq_len,
            batch_size=self.global_batch // max(data_parallel, 1),
            world_size=self.world_size,
            tensor_parallel=tensor_parallel,
            dropout=self.dropout,
            iterations=self.iterations,
            warmup_iterations=self.warmup_iterations,
            seed=self.seed,
            name=self.name,
            dtype=self.dtype,
            pipeline_parallel=pipeline_parallel,
            micro_batches=micro_batches,
            recompute=recompute,
            fsdp=fsdp,
            vocab_size=self.vocab_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """The job as its file would give it (what `from_dict` reads back)."""
        out = {name: getattr(self, name) for name in TRANSFORMER_FIELDS}
        if out["network"] is None:
            del out["network"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "TransformerJob":
        from probes.vocabulary.jobspec_validation import JobSpecValidator

        return JobSpecValidator().transformer_job(data)


def random_transformer_job(index: int, world_size: int, seed: int) -> TransformerJob:
    """Random GPT-style job `index` (deterministic in `seed`), sized for a layout race on CPU
    ranks: 2-4 blocks, hidden 64-256, 2-8 heads, sequences of 32-128 tokens, a vocabulary of
    0 (random activations), 512 or 2048 tokens, a global batch of 4-16 sequences."""
    rng = np.random.default_rng([seed, index, 7919])
    hidden = int(rng.choice([64, 128, 256]))
    return TransformerJob(
        world_size=world_size,
        layers=int(rng.integers(2, 5)),
        hidden=hidden,
        heads=int(rng.choice([h for h in (2, 4, 8) if hidden % h == 0])),
        seq_len=int(rng.choice([32, 64, 128])),
        global_batch=int(rng.choice([b for b in (4, 8, 16) if b % world_size == 0] or [world_size])),
        vocab_size=int(rng.choice([0, 512, 2048])),
        dropout=0.1,
        seed=index,
        name=f"gpt{index}",
    )


__all__ = ["DTYPES", "TRANSFORMER_FIELDS", "TRANSFORMER_LIMITS", "TransformerJob", "random_transformer_job"]
