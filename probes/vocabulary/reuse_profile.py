"""Reuse-factor profiles: how skewed each table's row accesses are, as data we can resample.

Zipf with one exponent is a poor stand-in for production tables, whose access curves have a
hot head, a long tail and everything between. A profile stores, per table, the access CDF
over row *rank* (the hottest row first) at log-spaced rank fractions; sampling inverts it, so
a probe can draw batches whose reuse-factor histograms look like the profiled tables at any
row count. Profiles are plain JSON.

    python -m probes.vocabulary.reuse_profile from-indices --indices ids.npy --num-embeddings E --name t0 [--out P]
    python -m probes.vocabulary.reuse_profile from-indices --dlrm-dataset fbgemm_t856_bs65536.pt [--out P]
    python -m probes.vocabulary.reuse_profile synthesize [--out P]     # rebuilds the shipped default

`from-indices` reads a 1-D int64 `.npy` of one table's ids, or a dataset in the layout of
Meta's public DLRM embedding-lookup traces (`torch.save((indices, offsets, lengths))`,
lengths shaped (tables, batch)), loaded with `weights_only=True` so no code runs.
The shipped default (`probes/data/reuse_profile.json`) is synthetic: archetype tables (power
laws, hot sets, near-uniform, heavy heads) drawn by `synthesize`; replace it with a profile
of your own traces for calibration that matches your data.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

DEFAULT_PROFILE = Path(__file__).parent.parent / "data" / "reuse_profile.json"
CDF_POINTS = 48


@dataclass(frozen=True)
class ProfileTable:
    """Access CDF at rank fractions: `access_frac[i]` of all lookups hit the hottest
    `rank_frac[i]` of the rows (both rise to 1)."""

    name: str
    num_embeddings: int
    pooling_factor: float
    rank_frac: tuple[float, ...]
    access_frac: tuple[float, ...]


@dataclass(frozen=True)
class ReuseProfile:
    source: str
    tables: tuple[ProfileTable, ...]

    def table(self, name: str) -> ProfileTable:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"reuse profile has no table {name!r}; tables: {[t.name for t in self.tables]}")

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    def to_dict(self) -> dict:
        return {"source": self.source, "tables": [asdict(t) for t in self.tables]}

    @classmethod
    def from_dict(cls, data: dict) -> "ReuseProfile":
        tables = tuple(
            ProfileTable(
                t["name"],
                int(t["num_embeddings"]),
                float(t["pooling_factor"]),
                tuple(map(float, t["rank_frac"])),
                tuple(map(float, t["access_frac"])),
            )
            for t in data["tables"]
        )
        return cls(str(data.get("source", "")), tables)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))


_HASH_PRIME = 2_654_435_761  # spreads hot rows over the table, as real ids are


def spread_ranks(ranks: np.ndarray, num_rows: int) -> np.ndarray:
    """Hot-first ranks to row ids, scattered over the table as real hashed ids are."""
    return (ranks * _HASH_PRIME) % num_rows


@lru_cache(maxsize=4)
def load_profile(path: str | None = None) -> ReuseProfile:
    return ReuseProfile.from_dict(json.loads(Path(path or DEFAULT_PROFILE).read_text()))


def table_from_indices(name: str, indices: np.ndarray, num_embeddings: int, pooling_factor: float) -> ProfileTable:
    """The access CDF of one table's ids over log-spaced rank fractions."""
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        raise ValueError(f"table {name!r}: no indices to profile")
    counts = np.sort(np.bincount(indices, minlength=num_embeddings))[::-1]
    cdf = np.cumsum(counts) / counts.sum()
    ranks = np.unique(np.round(np.geomspace(1, num_embeddings, CDF_POINTS)).astype(np.int64))
    return ProfileTable(
        name,
        int(num_embeddings),
        float(pooling_factor),
        tuple((ranks / num_embeddings).tolist()),
        tuple(cdf[ranks - 1].tolist()),
    )


def sample_from_table(table: ProfileTable, num_rows: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Hot-first ranks by inverting the CDF (log-linear between points), then hashed to ids."""

    return spread_ranks(ranks_from_draws(table, num_rows, rng.random(count)), num_rows)


def ranks_from_draws(table: ProfileTable, num_rows: int, draws: np.ndarray) -> np.ndarray:
    """Hot-first row ranks for uniform `draws` in [0, 1), by inverting the table's access CDF."""
    access = np.concatenate([[0.0], table.access_frac])
    log_rank = np.concatenate([[np.log(1.0 / table.num_embeddings)], np.log(table.rank_frac)])
    frac = np.exp(np.interp(draws, access, log_rank))
    # Within the hottest row fraction the rank is uniform: ranks below one row collapse to 0.
    return np.minimum((frac * num_rows).astype(np.int64), num_rows - 1)


def tables_from_dlrm_dataset(path: str | Path) -> list[ProfileTable]:
    """Tables of a (indices, offsets, lengths) trace as Meta's DLRM datasets store them."""
    import torch

    indices, _offsets, lengths = torch.load(path, weights_only=True)
    indices, lengths = indices.numpy(), lengths.numpy()
    out, start = [], 0
    for t, per_sample in enumerate(lengths):
        n = int(per_sample.sum())
        ids = indices[start : start + n]
        start += n
        if n:
            out.append(table_from_indices(f"t{t}", ids, int(ids.max()) + 1, float(per_sample.mean())))
    return out


def synthesize(seed: int = 0, rows: int = 200_000, samples: int = 400_000) -> ReuseProfile:
    """The shipped default: archetype tables, each drawn once and profiled like a real trace."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, rows + 1, dtype=np.float64)

    def from_weights(name: str, weights: np.ndarray, pooling: float) -> ProfileTable:
        ids = rng.choice(rows, size=samples, p=weights / weights.sum())
        return table_from_indices(name, ids, rows, pooling)

    tables = [from_weights(f"power{s:g}", ranks**-s, p) for s, p in ((0.5, 20), (0.9, 8), (1.1, 4), (1.3, 1), (1.6, 2))]
    for hot_share, hot_frac in ((0.8, 0.001), (0.95, 0.01), (0.6, 0.05)):
        w = np.full(rows, (1 - hot_share) / rows)
        w[: int(rows * hot_frac)] += hot_share / int(rows * hot_frac)
        tables.append(from_weights(f"hot{hot_share:g}in{hot_frac:g}", w, 10))
    tables.append(from_weights("near_uniform", 1 + 0.2 * rng.random(rows), 30))
    tables.append(from_weights("heavy_head", np.exp(-ranks / 50) + 1e-4 * ranks**-0.7, 1))
    return ReuseProfile(
        f"synthetic archetypes (probes.vocabulary.reuse_profile synthesize, seed {seed}); "
        "replace with a profile of your own traces",
        tuple(tables),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m probes.vocabulary.reuse_profile", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    syn = sub.add_parser("synthesize")
    syn.add_argument("--out", default=str(DEFAULT_PROFILE))
    syn.add_argument("--seed", type=int, default=0)
    frm = sub.add_parser("from-indices")
    frm.add_argument("--out", default="reuse_profile.json")
    frm.add_argument("--indices", help="1-D int64 .npy of one table's ids")
    frm.add_argument("--num-embeddings", type=int)
    frm.add_argument("--name", default="table")
    frm.add_argument("--pooling-factor", type=float, default=1.0)
    frm.add_argument("--dlrm-dataset", help="torch.save((indices, offsets, lengths)) trace")
    args = parser.parse_args(argv)
    if args.cmd == "synthesize":
        profile = synthesize(args.seed)
    else:
        if args.dlrm_dataset:
            tables = tables_from_dlrm_dataset(args.dlrm_dataset)
        elif args.indices:
            ids = np.load(args.indices, allow_pickle=False)
            tables = [
                table_from_indices(args.name, ids, args.num_embeddings or int(ids.max()) + 1, args.pooling_factor)
            ]
        else:
            parser.error("from-indices needs --indices or --dlrm-dataset")
        profile = ReuseProfile(f"profiled from {args.dlrm_dataset or args.indices}", tuple(tables))
    profile.save(args.out)
    print(f"wrote {len(profile.tables)} table(s) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
