"""Which model family each measured op gets, and the simple baseline it is scored against."""
from __future__ import annotations

from predictors.collective_model import SigmoidCollectiveModel
from predictors.learned_model import EMBEDDING_DESIGN, GEMM_DESIGN, LearnedKernelModel
from predictors.opmodels import AlphaBetaModel, LinearCostModel, OpModel

COLLECTIVES = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")
GEMM_FEATURES = ["one", "flops", "bytes", "mn"]
EMBEDDING_FEATURES = ["one", "tables", "bags", "lookups", "gathered_elems", "output_elems", "distinct_elems"]


def default_model_for(op: str, seed: int = 0) -> OpModel:
    if op == "gemm":
        return LearnedKernelModel(op, GEMM_FEATURES, GEMM_DESIGN, seed)
    if op.startswith("embedding_"):
        return LearnedKernelModel(op, EMBEDDING_FEATURES, EMBEDDING_DESIGN, seed)
    if op in COLLECTIVES:
        return SigmoidCollectiveModel(op)
    raise ValueError(f"no model family for op {op!r}")


def baseline_model_for(op: str) -> OpModel | None:
    """Collectives: alpha-beta. GEMM: launch + flops roofline. Embeddings: the additive
    linear roofline over lookups and bytes (what the learned model starts from)."""
    if op in COLLECTIVES:
        return AlphaBetaModel(op)
    if op == "gemm":
        return LinearCostModel(op, ["one", "flops"])
    if op.startswith("embedding_"):
        return LinearCostModel(op, EMBEDDING_FEATURES)
    return None
