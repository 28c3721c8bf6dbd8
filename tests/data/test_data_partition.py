"""Client partitions: sizes, label mix, determinism, and bad parameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stlsgd.data import PARTITION_MODES, Partition, load_dataset, make_partition
from stlsgd.errors import ConfigError


@pytest.fixture(scope="module")
def a9a_y(shared_data: Path) -> np.ndarray:
    return load_dataset("a9a", shared_data).y


def _check_cover(p, n: int) -> None:
    """Disjoint modes: every row appears exactly once."""
    assert p.rows.dtype == np.int64 and p.starts.dtype == np.int64 and p.sizes.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p.rows), np.arange(n))
    np.testing.assert_array_equal(p.starts, np.concatenate([[0], np.cumsum(p.sizes)[:-1]]))


def test_shared(a9a_y: np.ndarray) -> None:
    p = make_partition(a9a_y, 32, "shared", seed=0)
    assert p.num_clients == 32 and (p.sizes == 32561).all() and (p.starts == 0).all()
    np.testing.assert_array_equal(p.client_rows(31), np.arange(32561))


def test_split_sizes(a9a_y: np.ndarray) -> None:
    p = make_partition(a9a_y, 32, "split", seed=0)
    _check_cover(p, 32561)
    assert sorted(set(p.sizes.tolist())) == [1017, 1018]
    assert int((p.sizes == 1018).sum()) == 32561 - 32 * 1017
    # A random split keeps every client's label mix near the global 24%.
    fracs = [(a9a_y[p.client_rows(c)] > 0).mean() for c in range(32)]
    assert max(abs(f - 0.2408) for f in fracs) < 0.07


@pytest.mark.parametrize("s", [0.0, 50.0, 100.0, 33.3])
def test_noniid_sizes_and_cover(a9a_y: np.ndarray, s: float) -> None:
    p = make_partition(a9a_y, 32, "noniid", seed=1, s=s)
    _check_cover(p, 32561)
    assert set(p.sizes.tolist()) <= {1017, 1018}


def test_noniid_label_mix(a9a_y: np.ndarray) -> None:
    p = make_partition(a9a_y, 32, "noniid", seed=0, s=50.0)
    first = (a9a_y[p.client_rows(0)] < 0).mean()
    last = (a9a_y[p.client_rows(31)] > 0).mean()
    assert first > 0.8 and last > 0.55  # label-sorted half: -1 at the front, +1 at the back
    pure = make_partition(a9a_y, 32, "noniid", seed=0, s=0.0)
    assert (a9a_y[pure.client_rows(0)] == -1).all() and (a9a_y[pure.client_rows(31)] == 1).all()
    # s=100 is exactly the random split with the same seed.
    split = make_partition(a9a_y, 32, "split", seed=0)
    full = make_partition(a9a_y, 32, "noniid", seed=0, s=100.0)
    np.testing.assert_array_equal(full.rows, split.rows)


def test_noniid_multiclass_uneven() -> None:
    y = np.repeat(np.arange(10), 7)[::-1].copy()  # 70 rows, 10 classes
    p = make_partition(y, 8, "noniid", seed=3, s=0.0)
    _check_cover(p, 70)
    assert set(p.sizes.tolist()) == {8, 9}
    assert (np.diff(y[p.rows]) >= 0).all()  # s=0: rows dealt in label order


def test_dirichlet(a9a_y: np.ndarray) -> None:
    p = make_partition(a9a_y, 8, "dirichlet", seed=0, alpha=0.5)
    _check_cover(p, 32561)
    fracs = np.array([(a9a_y[p.client_rows(c)] > 0).mean() for c in range(8)])
    assert fracs.max() - fracs.min() > 0.2  # label skew
    iid_like = make_partition(a9a_y, 8, "dirichlet", seed=0, alpha=1e4)
    fr = np.array([(a9a_y[iid_like.client_rows(c)] > 0).mean() for c in range(8)])
    assert fr.max() - fr.min() < 0.05


def test_row_weights_make_the_objective_the_clients_mean() -> None:
    # Three clients of 1, 2 and 3 of six rows: f = 1/3 (f_0 + f_1 + f_2), f_c its rows' mean, so row i weighs
    # n / (N n_c) = 6 / (3 n_c): 2, 1, 2/3; a sum over the rows, weighted, over n is then the clients' mean.
    unequal = Partition(
        mode="dirichlet", rows=np.array([4, 0, 5, 1, 2, 3]), starts=np.array([0, 1, 3]), sizes=np.array([1, 2, 3])
    )
    weights = unequal.row_weights(6)
    assert weights is not None
    np.testing.assert_allclose(weights, [1, 2 / 3, 2 / 3, 2 / 3, 2, 1], rtol=1e-15)
    values = np.arange(6.0) ** 2
    clients = [values[unequal.client_rows(c)].mean() for c in range(3)]
    assert values @ weights / 6 == pytest.approx(np.mean(clients), rel=1e-15)
    # All rows on every client, or n / N of them (floor or ceiling) out of many: every weight within 1% of 1, and
    # the samples' mean stands (3,203 rows on 32 clients: 100 or 101, weights 1.0009 and 0.991); out of few, weights
    # (7 rows on 3 clients: 3, 2, 2, weights 7/9 and 7/6).
    y = np.array([1, -1] * 1602)[:3203]
    for mode in ("shared", "split", "noniid"):
        assert make_partition(y, 32, mode, seed=0).row_weights(3203) is None
        few = make_partition(y[:7], 3, mode, seed=0)
        assert (few.row_weights(7) is None) == (mode == "shared")
    split = make_partition(y[:7], 3, "split", seed=0)
    np.testing.assert_allclose(split.row_weights(7)[split.client_rows(0)], 7 / 9, rtol=1e-15)
    np.testing.assert_allclose(split.row_weights(7)[split.client_rows(1)], 7 / 6, rtol=1e-15)
    skewed = make_partition(np.repeat([1, -1], [90, 10]), 4, "dirichlet", seed=0, alpha=0.5)
    assert skewed.row_weights(100) is not None and skewed.sizes.max() - skewed.sizes.min() > 1


@pytest.mark.parametrize("mode", PARTITION_MODES)
def test_deterministic(a9a_y: np.ndarray, mode: str) -> None:
    a = make_partition(a9a_y, 16, mode, seed=7)
    b = make_partition(a9a_y, 16, mode, seed=7)
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(a.sizes, b.sizes)
    if mode != "shared":
        c = make_partition(a9a_y, 16, mode, seed=8)
        assert not np.array_equal(a.rows, c.rows)


@pytest.mark.parametrize("mode", PARTITION_MODES)
def test_more_clients_than_samples(mode: str) -> None:
    with pytest.raises(ConfigError, match=r"more clients \(11\) than samples \(10\)"):
        make_partition(np.ones(10), 11, mode, seed=0)


def test_bad_parameters() -> None:
    y = np.array([1.0, -1.0] * 10)
    with pytest.raises(ConfigError, match=r"partition.s: must be in \[0, 100\], got 101"):
        make_partition(y, 2, "noniid", seed=0, s=101)
    with pytest.raises(ConfigError, match="partition.alpha: must be > 0"):
        make_partition(y, 2, "dirichlet", seed=0, alpha=0.0)
    with pytest.raises(ConfigError, match="unknown mode 'iid'"):
        make_partition(y, 2, "iid", seed=0)
    with pytest.raises(ConfigError, match="positive integer"):
        make_partition(y, 0, "split", seed=0)


def test_empty_client_names_mode_and_client() -> None:
    y = np.array([1.0, -1.0] * 10)
    with pytest.raises(ConfigError, match=r"mode 'dirichlet' leaves client \d+ with no rows"):
        make_partition(y, 20, "dirichlet", seed=0, alpha=0.01)
