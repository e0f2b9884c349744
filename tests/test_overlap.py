"""Overlapped compute + collective pairs give the unfused pair's outputs, on real gloo ranks."""

import json
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawned import exit_worker

from probes.embedding import make_batch, make_tbe
from probes.vocabulary.jobspec import TableShape
from probes.vocabulary.pairs import ExchangeLayout, slice_bounds
from probes.workloads import overlap

SLICES = (1, 2, 3, 4, 8)


def _uneven_layout(world: int, seed: int) -> ExchangeLayout:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 9, size=(world, world))
    rows[0, 1] = 0  # a source that sends nothing to one destination
    widths = rng.integers(1, 6, size=world)
    return ExchangeLayout(tuple(tuple(int(x) for x in r) for r in rows), tuple(int(x) for x in widths))


def _report(out_dir: str, rank: int, result: dict) -> None:
    with open(f"{out_dir}/{rank}.json", "w") as f:
        json.dump(result, f)


def _run_ranks(worker, world: int, *args) -> list[dict]:
    """Spawn `world` gloo ranks of `worker(rank, *args, init_file, out_dir)`; each rank's report."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(*args, f"{tmp}/init", tmp), nprocs=world)
        return [json.load(open(f"{tmp}/{r}.json")) for r in range(world)]


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    errors: dict[str, float] = {}
    try:
        # GEMM + all-to-all, uneven rows (tokens per expert) and widths.
        layout = _uneven_layout(world, 7)
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(layout.rows(rank), 6, generator=g)
        w = torch.randn(6, layout.widths[rank], generator=g)
        ref = overlap.all_to_all_reference(overlap.gemm_producer(x, w), layout)
        for k in SLICES:
            got = overlap.overlapped_all_to_all(overlap.gemm_producer(x, w), layout, k)
            errors[f"gemm_a2a_k{k}"] = float((got - ref).abs().max()) if ref.numel() else 0.0
        errors["gemm_a2a_numel"] = float(ref.numel() - sum(layout.recv_sizes(rank)))

        # Embedding bag (TBE) + all-to-all: global batch of W*B bags, ranks hold different widths.
        B = 5
        dims = [8 + 4 * (r % 3) for r in range(world)]  # per rank: 8, 12, 16 (TBE dims are multiples of 4)
        tables = [TableShape(50, 4, 3), TableShape(30, dims[rank] - 4, 2)]
        torch.manual_seed(rank)
        tbe = make_tbe(tables, torch.device("cpu"))
        indices, offsets, _ = make_batch(tables, B * world, np.random.default_rng(rank))
        emb_layout = ExchangeLayout.even(world, B, dims)
        idx, off = torch.from_numpy(indices), torch.from_numpy(offsets)
        with torch.no_grad():
            for k in SLICES:
                inputs = overlap.tbe_bag_ranges(
                    idx, off, len(tables), B * world, overlap.producer_ranges(emb_layout, rank, k)
                )
                ref = overlap.all_to_all_reference(overlap.tbe_producer(tbe, inputs), emb_layout)
                got = overlap.overlapped_all_to_all(overlap.tbe_producer(tbe, inputs), emb_layout, k)
                errors[f"emb_a2a_k{k}"] = float((got - ref).abs().max())

        # GEMM + all-reduce sliced along rows (33 x 20, and a wide 30 x 40 over a short inner
        # dimension) and a GEMV's along columns (2 x 20).
        for m, inner, n in ((33, 12, 20), (30, 3, 40), (2, 12, 20)):
            x = torch.randn(m, inner, generator=g)
            w = torch.randn(inner, n, generator=g)
            ref = overlap.gemm_all_reduce_reference(x, w)
            for k in SLICES:
                got = overlap.overlapped_gemm_all_reduce(x, w, k)
                errors[f"gemm_ar_m{m}_k{k}"] = float((got - ref).abs().max() / ref.abs().max())
            for k in SLICES:  # the transfer-only form the cost model is calibrated on
                got = overlap.sliced_all_reduce(x @ w, k)
                errors[f"sliced_ar_m{m}_k{k}"] = float((got - ref).abs().max() / ref.abs().max())
        _report(out_dir, rank, errors)
    finally:
        dist.destroy_process_group()
    exit_worker()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 4])
def test_fused_equals_unfused_on_gloo_ranks(world):
    results = _run_ranks(_worker, world, world)
    for rank, errors in enumerate(results):
        # per k: GEMM + all-to-all, TBE + all-to-all, and 3 shapes x (overlapped, transfer-only)
        assert len(errors) == len(SLICES) * (1 + 1 + 3 * 2) + 1
        for key, err in errors.items():
            assert err <= 1e-5, f"rank {rank} {key}: {err}"


def test_slices_cover_rows_once_remote_first():
    layout = ExchangeLayout(((2, 3, 0), (1, 1, 1), (4, 0, 2)), (2, 3, 1))
    for source in range(3):
        for k in (1, 2, 3, 5, 9):
            slices = layout.slices(source, k)
            rows = sorted(r for pieces in slices for p in pieces for r in range(p.lo, p.hi))
            assert rows == list(range(layout.rows(source)))
            dests = [p.dest for pieces in slices for p in pieces]
            # the own rows come last, remote destinations in next-rank order before them
            order = [d for d in layout.remote_first(source) if layout.rows_to[source][d]]
            assert [d for i, d in enumerate(dests) if i == 0 or dests[i - 1] != d] == order
    assert slice_bounds(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert slice_bounds(2, 8) == [(0, 1), (1, 2)]


def test_layout_rejects_bad_shapes():
    with pytest.raises(ValueError, match="rows_to"):
        ExchangeLayout(((1, 2),), (1, 1))
    with pytest.raises(ValueError, match="non-negative"):
        ExchangeLayout(((1, -1), (0, 0)), (1, 1))


def _transformer_worker(rank: int, init_file: str, out_dir: str) -> None:
    from probes.vocabulary.transformer_spec import TransformerSpec
    from probes.workloads.transformer import ParallelTransformer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        spec = TransformerSpec(
            layers=2, hidden=32, heads=4, seq_len=8, batch_size=2, world_size=2, tensor_parallel=2, dropout=0.0
        )
        losses = {}
        for name, slices in [("unfused", None), ("overlapped", {"b0.out": 4, "b0.fc2": 2, "b1.fc2": 8})]:
            model = ParallelTransformer(spec, rank, torch.device("cpu"), overlap_slices=slices)
            losses[name] = [model.step() for _ in range(3)]
        _report(out_dir, rank, losses)
    finally:
        dist.destroy_process_group()
    exit_worker()


@pytest.mark.timeout(180)
def test_tensor_parallel_transformer_trains_the_same_with_overlapped_row_parallel_pairs():
    results = _run_ranks(_transformer_worker, 2)
    for losses in results:
        assert losses["unfused"][0] != losses["unfused"][-1]  # it trains
        assert losses["overlapped"] == pytest.approx(losses["unfused"], rel=1e-5)
