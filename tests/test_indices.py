import numpy as np
import pytest

from probes.vocabulary.indices import REUSE_BINS, Distribution, reuse_histogram, sample_indices


def test_reuse_histogram_hand_computed():
    # four bags: 0 1 4 6 | 1 2 3 5 7 | 0 5 7 | 1 6
    idx = np.array([0, 1, 4, 6, 1, 2, 3, 5, 7, 0, 5, 7, 1, 6])
    # hit once: 2, 3, 4 (3 rows); twice: 0, 5, 6, 7 (4 rows); three times: 1 (1 row)
    hist = reuse_histogram(idx)
    assert len(hist) == REUSE_BINS
    assert np.isclose(hist[0], 3 / 8)  # bin [1]
    assert np.isclose(hist[1], 5 / 8)  # bin [2, 3]: four rows hit twice and one three times
    assert np.isclose(hist.sum(), 1.0)


def test_reuse_histogram_last_bin_collects_huge_counts():
    hist = reuse_histogram(np.zeros(2**18, dtype=np.int64))
    assert hist[-1] == 1.0


def test_zipf_is_skewed_and_uniform_is_not():
    rng = np.random.default_rng(0)
    z = sample_indices(10_000, 50_000, Distribution("zipf", 1.2), rng)
    u = sample_indices(10_000, 50_000, Distribution("uniform"), rng)
    assert z.min() >= 0 and z.max() < 10_000
    assert len(np.unique(z)) < 0.5 * len(np.unique(u))
    assert np.bincount(z).max() > 20 * np.bincount(u).max()


def test_distribution_parse():
    assert Distribution.parse("uniform").kind == "uniform"
    assert Distribution.parse({"zipf": 1.1}) == Distribution("zipf", 1.1)
    assert Distribution.parse({"zipf": 1.1}).to_json() == {"zipf": 1.1}


def test_table_set_features_add_up_per_table():
    """A set's reuse histogram is that of its tables' disjoint ids together; a table's typical
    figures are the same in whatever set (and position) it is priced."""
    from probes.vocabulary.jobspec import TableShape
    from probes.vocabulary.tbe_features import batch_features, expected_features

    rng = np.random.default_rng(3)
    tables = [TableShape(5000, 16, 4, Distribution("zipf", 1.1)), TableShape(800, 8, 2), TableShape(20000, 32, 8)]
    per_table = [sample_indices(t.num_embeddings, 256 * t.pooling_factor, t.distribution, rng) for t in tables]
    feats = batch_features(tables, 256, per_table)
    together = np.concatenate([idx + (i << 40) for i, idx in enumerate(per_table)])
    assert np.allclose(feats["reuse_hist"], reuse_histogram(together), atol=1e-6)
    assert feats["distinct_elems"] == sum(len(np.unique(i)) * t.embedding_dim for i, t in zip(per_table, tables))

    alone = [expected_features([t], 256) for t in tables]
    mixed = expected_features(tables[::-1], 256)
    assert mixed["distinct_elems"] == sum(a["distinct_elems"] for a in alone)
    assert expected_features(tables[::-1], 256, seed=1)["distinct_elems"] != mixed["distinct_elems"]


def test_unordered_draws_give_the_same_ids_in_another_order():
    for dist in (Distribution("zipf", 1.05), Distribution.parse({"profile": "heavy_head"}), Distribution("uniform")):
        ordered = sample_indices(30_000, 50_000, dist, np.random.default_rng(7))
        unordered = sample_indices(30_000, 50_000, dist, np.random.default_rng(7), unordered=True)
        assert np.array_equal(np.sort(ordered), np.sort(unordered))
        if dist.kind != "uniform":
            assert not np.array_equal(ordered, unordered)


def test_a_label_names_its_distribution_again():
    for value in ("uniform", {"zipf": 1.05}, {"profile": "near_uniform"}):
        d = Distribution.parse(value)
        assert Distribution.from_label(d.label()) == d
    with pytest.raises(ValueError, match="distribution must be"):
        Distribution.from_label("gauss")
