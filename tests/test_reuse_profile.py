"""Reuse-factor profiles: built from indices, resampled, and usable as a table distribution."""

import json

import numpy as np
import pytest

from probes.vocabulary.indices import Distribution, reuse_histogram, sample_indices
from probes.vocabulary.reuse_profile import ReuseProfile, load_profile, main, sample_from_table, table_from_indices


def test_profile_of_known_indices():
    # row 7 takes half of all lookups, the other half spreads evenly over rows 0..9
    ids = np.concatenate([np.full(500, 7), np.repeat(np.arange(10), 50)])
    t = table_from_indices("t", ids, 10, 2.0)
    assert t.rank_frac[0] == pytest.approx(0.1) and t.access_frac[0] == pytest.approx(0.55)
    assert t.rank_frac[-1] == pytest.approx(1.0) and t.access_frac[-1] == pytest.approx(1.0)


def test_resampling_reproduces_the_profiled_curve():
    rng = np.random.default_rng(0)
    weights = np.arange(1, 5001, dtype=float) ** -1.1
    ids = rng.choice(5000, size=200_000, p=weights / weights.sum())
    original = table_from_indices("zipfish", ids, 5000, 1.0)
    again = table_from_indices("again", sample_from_table(original, 5000, 200_000, rng), 5000, 1.0)
    # The hottest 1% and 10% of rows take the same share of lookups (within a few points).
    for frac in (0.01, 0.1):
        share = lambda t: np.interp(np.log(frac), np.log(t.rank_frac), t.access_frac)  # noqa: E731
        assert share(again) == pytest.approx(share(original), abs=0.04)


def test_shipped_profile_tables_differ_in_reuse():
    rng = np.random.default_rng(1)
    names = load_profile().names
    assert len(names) >= 8
    distinct = {
        n: len(np.unique(sample_indices(50_000, 20_000, Distribution.parse({"profile": n}), rng))) for n in names
    }
    assert max(distinct.values()) > 20 * min(distinct.values())  # from near-uniform to a heavy head
    hist = reuse_histogram(sample_indices(50_000, 20_000, Distribution.parse({"profile": "heavy_head"}), rng))
    assert hist[4:].sum() > 0.3  # most touched rows of a heavy head are hit 16+ times


def test_profile_distribution_parse_and_errors():
    d = Distribution.parse({"profile": "power1.1"})
    assert d.kind == "profile" and d.to_json() == {"profile": "power1.1"}
    with pytest.raises(KeyError, match="no table 'nope'"):
        Distribution.parse({"profile": "nope"})


def test_cli_from_indices(tmp_path):
    ids = np.random.default_rng(0).integers(0, 100, size=1000)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "profile.json"
    assert main(["from-indices", "--indices", str(tmp_path / "ids.npy"), "--name", "mine", "--out", str(out)]) == 0
    profile = ReuseProfile.from_dict(json.loads(out.read_text()))
    assert profile.names == ["mine"] and profile.tables[0].num_embeddings == 100
