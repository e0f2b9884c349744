"""Which model family each measured op gets, and the simple baseline it is scored against."""

from __future__ import annotations

from predictors.collective_curves import AlphaBetaModel, CurveModel  # noqa: F401  (CurveModel: registers its kind)
from predictors.collective_model import SigmoidCollectiveModel
from predictors.context_model import ContextFactorModel  # noqa: F401  (registers its kind for loading)
from predictors.learned_model import EMBEDDING_DESIGN, GEMM_DESIGN, ROW_OP_DESIGN, LearnedKernelModel
from predictors.opmodels import GroupedCostModel, OpModel
from predictors.overhead_model import OverheadModel

COLLECTIVES = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")
GEMM_FEATURES = ["one", "flops", "bytes", "mn"]
STREAMING_OPS = ("relu", "gelu", "tanh", "add", "mul", "gelu_bwd")
ROW_OPS = ("layer_norm", "softmax", "dropout", "layer_norm_bwd", "softmax_bwd")
# Element-wise ops start from the roofline (launch + bytes / bandwidth); row ops add a per-row
# cost (one reduction per row). The learned part corrects where caches bend either.
ROOFLINE_FEATURES = ["one", "bytes"]
ROW_OP_FEATURES = ["one", "rows", "bytes"]
EMBEDDING_FEATURES = [
    "one",
    "tables",
    "bags",
    "lookups",
    "gathered_elems",
    "output_elems",
    "distinct_elems",
    "lookups_log_table",  # a lookup costs more the larger its table (cache and TLB misses)
]
# Reduced precision gets models of its own: element-wise ops per activation dtype, TBE lookups
# per weights' storage precision (a row without the key is the default: what was measured
# before either was recorded). The learned correction, shared, sees which one it corrects.
DTYPE_GROUP = ("dtype", "float32")
PRECISION_GROUP = ("weights_precision", "fp32")
ELEMENTWISE_DESIGN = ROW_OP_DESIGN + ["is:dtype=bfloat16", "is:dtype=float16"]
TBE_DESIGN = EMBEDDING_DESIGN + ["is:weights_precision=fp16", "is:weights_precision=bf16"]


def default_model_for(op: str, seed: int = 0) -> OpModel:
    # Elsewhere the learned model's base is the op's baseline already (a candidate it must beat);
    # GEMM's baseline (launch + flops) and the row ops' (no per-row cost) are simpler than their
    # bases, so they compete on their own.
    if op == "gemm":
        return LearnedKernelModel(op, GEMM_FEATURES, GEMM_DESIGN, seed, group_by=DTYPE_GROUP, baseline=gemm_roofline)
    if op.startswith("embedding_"):
        return LearnedKernelModel(op, EMBEDDING_FEATURES, TBE_DESIGN, seed, group_by=PRECISION_GROUP)
    if op in COLLECTIVES:
        return SigmoidCollectiveModel(op)
    if op == "cpu_overhead":
        return OverheadModel(op)
    if op == "memcpy":
        return LearnedKernelModel(op, ROOFLINE_FEATURES, ["log:bytes"], seed, group_by=("direction", "d2d"))
    if op in STREAMING_OPS:
        return LearnedKernelModel(op, ROOFLINE_FEATURES, ELEMENTWISE_DESIGN, seed, group_by=DTYPE_GROUP)
    if op in ROW_OPS:
        # the roofline it is scored against is a candidate too: kept where a per-row cost (or a
        # correction) does not clearly pay on rows it was not fitted on
        return LearnedKernelModel(
            op, ROW_OP_FEATURES, ELEMENTWISE_DESIGN, seed, group_by=DTYPE_GROUP, baseline=lambda: element_roofline(op)
        )
    raise ValueError(f"no model family for op {op!r}")


def gemm_roofline() -> GroupedCostModel:
    """GEMM's baseline: launch + flops per dtype."""
    return GroupedCostModel("gemm", ["one", "flops"], *DTYPE_GROUP)


def element_roofline(op: str) -> GroupedCostModel:
    """Element-wise and row ops' baseline: launch + bytes per dtype."""
    return GroupedCostModel(op, ROOFLINE_FEATURES, *DTYPE_GROUP)


def baseline_model_for(op: str) -> OpModel | None:
    """Collectives: alpha-beta. GEMM: launch + flops roofline. Embeddings and element-wise /
    row ops: the additive linear roofline the learned model starts from (per weights
    precision / dtype, as the learned model's base is)."""
    if op in COLLECTIVES:
        return AlphaBetaModel(op)
    if op == "gemm":
        return gemm_roofline()
    if op.startswith("embedding_"):
        return GroupedCostModel(op, EMBEDDING_FEATURES, *PRECISION_GROUP)
    if op in STREAMING_OPS or op in ROW_OPS:
        return element_roofline(op)
    if op == "memcpy":
        return GroupedCostModel(op, ROOFLINE_FEATURES, "direction", "d2d")
    return None
