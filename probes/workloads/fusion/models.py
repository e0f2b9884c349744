"""Reference workloads for fusion: small models of the kinds that fill a cluster with
repetitive single-device jobs (HFTA's PointNet classifier, a small CNN, a small transformer
encoder), with synthetic, learnable data generated locally.

Every model uses `RateDropout` (its rate a fusible hyper-parameter) and, where the original
does, batch norm; a layer feeding a batch norm has no bias (the norm removes it, so its
gradient is zero up to rounding, which Adam would blow up into full-size random steps). The data are class-conditional (each class has its own point-cloud blob,
image pattern or token distribution), so losses fall and fused-vs-separate comparisons are
made on real training, not on noise.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from probes.workloads.fusion.hfta import RateDropout

NUM_CLASSES = 10


class PointwiseBlock(nn.Module):
    """PointNet's shared per-point layer: the same linear map for every point (a 1x1
    convolution, written as a linear layer over the last axis), batch norm over all points of
    the batch, ReLU."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(fan_in, fan_out, bias=False)
        self.norm = nn.BatchNorm1d(fan_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, P, fan_in]
        y = self.linear(x)
        return F.relu(self.norm(y.reshape(-1, y.shape[-1])).view(y.shape))


class PointNetClassifier(nn.Module):
    """PointNet-style: a shared per-point MLP with batch norm, max-pooled over the points, then
    a classifier head with dropout."""

    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 16) -> None:
        super().__init__()
        self.point_mlp = nn.Sequential(
            PointwiseBlock(3, width), PointwiseBlock(width, 2 * width), PointwiseBlock(2 * width, 4 * width)
        )
        self.head = nn.Sequential(
            nn.Linear(4 * width, 2 * width, bias=False),
            nn.BatchNorm1d(2 * width),
            nn.ReLU(),
            RateDropout(),
            nn.Linear(2 * width, num_classes),
        )

    def forward(self, points: torch.Tensor) -> torch.Tensor:  # [N, P, 3]
        return self.head(self.point_mlp(points).amax(dim=1))


class SmallCNN(nn.Module):
    """Two conv + batch-norm + ReLU + max-pool stages and a two-layer classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES, channels: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 4 * 4, 64), nn.ReLU(), RateDropout(), nn.Linear(64, num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # [N, 3, 16, 16]
        return self.head(self.features(images))


class EncoderLayer(nn.Module):
    """Pre-LN transformer encoder layer (multi-head self-attention, GELU MLP), dropout as
    `RateDropout` so its rate can differ per fused model."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.drop1, self.drop2 = RateDropout(), RateDropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, L, H]
        n, length, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, length, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // self.heads), dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(n, length, hidden)
        x = x + self.drop1(self.proj(mixed))
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class SmallTransformerEncoder(nn.Module):
    """Token + position embeddings, a stack of encoder layers, mean-pooled, a linear head."""

    def __init__(
        self,
        num_classes: int = NUM_CLASSES,
        vocab: int = 128,
        seq_len: int = 16,
        hidden: int = 32,
        heads: int = 2,
        layers: int = 2,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(seq_len, hidden) * 0.02)
        self.layers = nn.ModuleList([EncoderLayer(hidden, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [N, L] int64
        x = self.tokens(tokens) + self.positions[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def _point_batch(n: int, gen: torch.Generator, points: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    centres = torch.linspace(-1, 1, NUM_CLASSES)
    # Class c: an anisotropic blob whose scale along x grows with c.
    scale = torch.stack(
        [
            0.2 + 0.08 * torch.arange(NUM_CLASSES),
            torch.full((NUM_CLASSES,), 0.3),
            0.5 - 0.03 * torch.arange(NUM_CLASSES),
        ],
        dim=1,
    )
    cloud = torch.randn(n, points, 3, generator=gen) * scale[y][:, None, :]
    cloud[:, :, 2] += centres[y][:, None]
    return cloud, y


def _image_batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    grid = torch.linspace(0, 2 * math.pi, 16)
    freq = (1 + y).float()[:, None, None]
    pattern = torch.sin(freq * grid[None, :, None]) * torch.cos(freq * grid[None, None, :] / 2)
    images = pattern[:, None].expand(n, 3, 16, 16) + 0.5 * torch.randn(n, 3, 16, 16, generator=gen)
    return images.contiguous(), y


def _token_batch(
    n: int, gen: torch.Generator, vocab: int = 128, seq_len: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    # Class c draws most tokens from its own band of the vocabulary, the rest uniformly.
    band = vocab // NUM_CLASSES
    own = y[:, None] * band + torch.randint(0, band, (n, seq_len), generator=gen)
    other = torch.randint(0, vocab, (n, seq_len), generator=gen)
    tokens = torch.where(torch.rand(n, seq_len, generator=gen) < 0.6, own, other)
    return tokens, y


@dataclass(frozen=True)
class FusionWorkload:
    """A reference workload: how to build one model, how to draw a batch of its data, and the
    per-model batch size it is usually trained with."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    batch_size: int


WORKLOADS: dict[str, FusionWorkload] = {
    "pointnet": FusionWorkload("pointnet", PointNetClassifier, _point_batch, 32),
    "cnn": FusionWorkload("cnn", SmallCNN, _image_batch, 32),
    "transformer": FusionWorkload("transformer", SmallTransformerEncoder, _token_batch, 32),
}


def workload(name: str) -> FusionWorkload:
    """A reference workload by name, or the user's own as `package.module:factory`, a callable
    returning a `FusionWorkload` (their model and data, trained by the same fused loop). The
    import runs in every process that trains it (each Ray worker), so it takes a module
    importable there, not an object."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if ":" not in name:
        raise ValueError(
            f"workload: expected one of {', '.join(WORKLOADS)} or an import path module:factory, got {name!r}"
        )
    module_name, _, attribute = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"workload: cannot import {name!r}: {type(exc).__name__}: {exc}") from None
    made = factory() if callable(factory) else factory
    if not isinstance(made, FusionWorkload):
        raise ValueError(f"workload: {name!r} gave {type(made).__name__}, expected a FusionWorkload")
    return made


def batches(work: FusionWorkload, batch_size: int, seed: int):
    """An endless stream of (inputs, labels) for `work`, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(int(seed))
    while True:
        yield work.batch(batch_size, gen)
