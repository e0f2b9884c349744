import numpy as np

from probes.indices import REUSE_BINS, Distribution, reuse_histogram, sample_indices


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
