"""The small Non-IID sets `algorithm.auto` is measured on besides Table 2+ (docs/results/schedules.md, *Tuning-free
default*), written as LIBSVM files with a run config for each, so that anyone can rerun those rows:

    .venv/bin/python benchmarks/heldout_sets.py OUT
    .venv/bin/stlsgd run OUT/parity.yaml --data-dir ../shared/data --set run.seed=0   # auto, seed 0

Each config is mushrooms' held-out base (the ``base`` of BASE, docs/results/heldout_data/mushrooms_noniid.toml:
label-sorted clients, s = 50, target gap 1e-4, 2 M iterations, an evaluation every five rounds), read from that
file, with the set's data and clients and ``algorithm.auto = true``. Beside it OUT/NAME.sweep.yaml is the grid
``auto`` is measured against: BASE's rows and a windowed Local SGD + drift row (WINDOWED), walked (``search =
"descent"``) at seeds 0-2:

    .venv/bin/stlsgd sweep OUT/parity.sweep.yaml --data-dir ../shared/data --jobs 2 --out OUT/parity_grid

The features are scikit-learn's, MinMax-scaled (those named _std standardised instead, each feature to mean 0 and
standard deviation 1; digits: pixels / 16; digits_primes: 2, 3, 5 and 7 against the rest; moons: two features; iris_vv:
iris's versicolor against virginica, 100 rows; wine_first and wine_third: wine's first and third cultivars against the
other two; diabetes_median: diabetes's disease progression above its median against the rest; friedman_median:
make_friedman1's target above its median against the rest; regression_median: make_regression's target above its median
against the rest; multilabel811: the first of make_multilabel_classification's five labels), MNIST's (pixels / 255, read
from the data directory: $STLSGD_DATA, e.g. ../shared/data; the test split's 3 against 5, 2 against 7, 0 against 8, 1
against 7, 5 against 6, 6 against 9, 1 against 2, 0 against 9, 7 against 9 and 4 against 6, the train split's 3
against 8, its first 200 of 4 against 7, its first 2,000 of 1 against 7, its first 3,000 of 5 against 8 and its first
4,000 of 2 against 3), CIFAR-10's (the data directory's first 200 train images, pixels / 255: cifar_vehicles, vehicles
against animals; cifar_catdog, cats and dogs against the rest; cifar_first5, classes 0-4 against 5-9;
cifar_vehicles_std, vehicles against animals with each pixel standardised), or sparse and text-like (sparse17,
sparse29, sparse41, sparse53, sparse67, sparse89, sparse1307, sparse1503 and sparse1603: 1,500, 1,200, 4,000, 3,000,
2,000, 2,500, 1,800, 1,600 and 1,200 features, 2%, 1%, 0.5%, 0.7%, 1%, 0.8%, 1%, 1.2% and 1.5% of them non-zero, rows
of unit length); labels +1 / -1.
The registered sets (digits 4/9, mushrooms, w8a, and the test splits of a9a, w8a and MNIST 4/9) need no file:
their configs name them.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import yaml
from sklearn.datasets import (
    dump_svmlight_file,
    load_breast_cancer,
    load_diabetes,
    load_digits,
    load_iris,
    load_wine,
    make_blobs,
    make_classification,
    make_friedman1,
    make_gaussian_quantiles,
    make_hastie_10_2,
    make_moons,
    make_multilabel_classification,
    make_regression,
)
from sklearn.preprocessing import MinMaxScaler, StandardScaler, normalize

from stlsgd.data import cifar10_png, mnist_binary
from stlsgd.data.registry import resolve_data_dir
from stlsgd.experiments.config import dump_config, load_config

Data = tuple[Any, np.ndarray]  # features dense or CSR, labels +1 / -1


def _scaled(X: np.ndarray, y: np.ndarray) -> Data:
    return MinMaxScaler().fit_transform(X), y


def _standardised(X: np.ndarray, y: np.ndarray) -> Data:
    return StandardScaler().fit_transform(X), y


def _classification(
    seed: int, n: int, d: int, informative: int, flip: float, standardise: bool = False, **more: Any
) -> Callable[[], Data]:
    def make() -> Data:
        X, y = make_classification(
            n_samples=n, n_features=d, n_informative=informative, random_state=seed, flip_y=flip, **more
        )
        return (_standardised if standardise else _scaled)(X, 2 * y - 1)

    return make


def _digits(
    positive: Callable[[np.ndarray], np.ndarray], keep: tuple[int, ...] | None = None, standardise: bool = False
) -> Callable[[], Data]:
    def make() -> Data:
        d = load_digits()
        rows = np.ones(len(d.target), dtype=bool) if keep is None else np.isin(d.target, keep)
        X, y = d.data[rows] / 16.0, np.where(positive(d.target[rows]), 1, -1)
        return _standardised(X, y) if standardise else (X, y)

    return make


def _breast_cancer(standardise: bool = False) -> Callable[[], Data]:
    def make() -> Data:
        b = load_breast_cancer()
        return (_standardised if standardise else _scaled)(b.data, 2 * b.target - 1)

    return make


def _wine(cultivar: int) -> Callable[[], Data]:
    """scikit-learn's wine, ``cultivar`` against the other two."""

    def make() -> Data:
        w = load_wine()
        return _scaled(w.data, np.where(w.target == cultivar, 1, -1))

    return make


def _hastie() -> Data:
    X, y = make_hastie_10_2(n_samples=6000, random_state=5)
    return _scaled(X, y.astype(int))


def _mnist(split: str, pos: int, neg: int, rows: int | None = None) -> Callable[[], Data]:
    """MNIST's ``split`` ("train" or "t10k"), ``pos`` against ``neg`` (its first ``rows``, or all): pixels / 255,
    from the data directory (STLSGD_DATA)."""

    def make() -> Data:
        root = resolve_data_dir() / "mnist"
        d = mnist_binary(root / f"{split}-images-idx3-ubyte.gz", root / f"{split}-labels-idx1-ubyte.gz", pos, neg)
        return d.X[:rows], d.y[:rows]

    return make


def _cifar(positive: tuple[int, ...], standardise: bool = False) -> Callable[[], Data]:
    """The first 200 CIFAR-10 train images (the data directory's PNG subset): pixels / 255, all 3,072 of them (with
    ``standardise``, each pixel to mean 0 and standard deviation 1 over the 200), the classes ``positive`` against
    the rest."""

    def make() -> Data:
        root = resolve_data_dir() / "cifar10" / "train_first200_kaggle"
        d = cifar10_png(root / "train", root / "trainLabels.csv")
        X, y = d.X.reshape(len(d.y), -1).astype(float), np.where(np.isin(d.y, positive), 1, -1)
        return _standardised(X, y) if standardise else (X, y)

    return make


def _sparse(seed: int, n: int, d: int, density: float, flip: float) -> Callable[[], Data]:
    """Text-like data: ``n`` rows of ``d`` features, a fraction ``density`` of them non-zero (uniform on (0, 1)),
    each row scaled to unit length (as tf-idf's), labelled by the sign of a random Gaussian direction, a fraction
    ``flip`` of the labels flipped."""

    def make() -> Data:
        rng = np.random.default_rng(seed)
        X = normalize(sp.random(n, d, density=density, format="csr", random_state=rng))
        y = np.where(X @ rng.standard_normal(d) > 0, 1, -1)
        return X, np.where(rng.random(n) < flip, -y, y)

    return make


def _multilabel() -> Data:
    X, Y = make_multilabel_classification(n_samples=6000, n_features=60, n_classes=5, n_labels=2, random_state=811)
    return _scaled(X, 2 * Y[:, 0] - 1)


def _moons() -> Data:
    X, y = make_moons(n_samples=6000, noise=0.3, random_state=7)
    return _scaled(X, 2 * y - 1)


def _quantiles() -> Data:
    X, y = make_gaussian_quantiles(n_samples=5000, n_features=10, n_classes=2, random_state=5)
    return _scaled(X, 2 * y - 1)


def _iris() -> Data:
    i = load_iris()
    rows = i.target > 0  # versicolor against virginica: the pair that overlaps
    return _scaled(i.data[rows], np.where(i.target[rows] == 1, 1, -1))


def _above_median(X: np.ndarray, target: np.ndarray) -> Data:
    """A regression set as classes: its target above its median against the rest, the features MinMax-scaled."""
    return _scaled(X, np.where(target > np.median(target), 1, -1))


def _diabetes() -> Data:
    d = load_diabetes()
    return _above_median(d.data, d.target)


def _friedman() -> Data:
    """make_friedman1's regression target (a sine, a square and linear terms of 5 of its 10 features) above its median
    against the rest: classes no linear model separates, with five features that carry nothing."""
    return _above_median(*make_friedman1(n_samples=8000, n_features=10, noise=1.0, random_state=1206))


def _regression() -> Data:
    """make_regression's linear target of 15 of 40 features, with noise, above its median against the rest."""
    return _above_median(
        *make_regression(n_samples=8000, n_features=40, n_informative=15, noise=20.0, random_state=1261)
    )


def _blobs() -> Data:
    X, y = make_blobs(n_samples=5000, centers=2, n_features=20, cluster_std=6.0, random_state=3)
    return _scaled(X, 2 * y - 1)


#: name -> (how the set is made, clients)
SETS: dict[str, tuple[Callable[[], Data], int]] = {
    "breast_cancer": (_breast_cancer(), 8),
    "wine": (_wine(1), 8),
    "digits38": (_digits(lambda t: t == 3, (3, 8)), 8),
    "digits17": (_digits(lambda t: t == 1, (1, 7)), 8),
    "digits25": (_digits(lambda t: t == 2, (2, 5)), 8),
    "parity": (_digits(lambda t: t % 2 == 0), 8),
    "classification11": (_classification(11, 8000, 40, 12, 0.03), 16),
    "classification23": (_classification(23, 5000, 50, 15, 0.04), 16),
    "classification41": (_classification(41, 4000, 30, 10, 0.02), 16),
    "classification57": (_classification(57, 5000, 40, 12, 0.03), 16),
    "hastie": (_hastie, 16),
    "classification77": (_classification(77, 6000, 25, 8, 0.05), 16),
    "digits06": (_digits(lambda t: t == 0, (0, 6)), 8),
    "blobs": (_blobs, 16),
    "classification91": (
        _classification(91, 10000, 60, 20, 0.02, weights=[0.7, 0.3], class_sep=0.7),
        32,
    ),
    "classification13": (_classification(13, 3000, 80, 30, 0.1, n_redundant=20), 8),
    "mnist35_test": (_mnist("t10k", 3, 5), 8),
    "classification29": (_classification(29, 6000, 100, 10, 0.01), 16),
    "digits_low": (_digits(lambda t: t < 5), 8),
    "sparse17": (_sparse(17, 4000, 1500, 0.02, 0.02), 16),
    "sparse29": (_sparse(29, 6000, 1200, 0.01, 0.05), 32),
    "classification103": (
        _classification(103, 8000, 40, 12, 0.03, n_redundant=8, n_clusters_per_class=3, weights=[0.6, 0.4]),
        16,
    ),
    "digits_loops": (_digits(lambda t: np.isin(t, (0, 6, 8, 9))), 8),
    "sparse41": (_sparse(41, 8000, 4000, 0.005, 0.03), 16),
    "sparse53": (_sparse(53, 9000, 3000, 0.007, 0.03), 16),
    "mnist27_test": (_mnist("t10k", 2, 7), 8),
    "moons": (_moons, 16),
    "mnist08_test": (_mnist("t10k", 0, 8), 8),
    "classification200": (_classification(200, 10000, 200, 20, 0.03), 32),
    "classification307": (_classification(307, 6000, 60, 20, 0.02, n_redundant=10, class_sep=0.8), 16),
    "quantiles": (_quantiles, 8),
    "classification419": (_classification(419, 5000, 30, 8, 0.05, n_redundant=4), 16),
    "digits58": (_digits(lambda t: t == 5, (5, 8)), 8),
    "classification521": (_classification(521, 7000, 50, 15, 0.03, n_redundant=5, class_sep=1.2), 24),
    "digits79": (_digits(lambda t: t == 7, (7, 9)), 8),
    "classification612": (_classification(612, 6000, 35, 10, 0.04, weights=[0.8, 0.2]), 16),
    "mnist17_test": (_mnist("t10k", 1, 7), 8),
    "sparse67": (_sparse(67, 5000, 2000, 0.01, 0.04), 16),
    "mnist56_test": (_mnist("t10k", 5, 6), 16),
    "classification733": (_classification(733, 12000, 20, 6, 0.06, n_clusters_per_class=4), 48),
    "mnist38_train": (_mnist("train", 3, 8), 16),
    "multilabel811": (_multilabel, 16),
    "sparse89": (_sparse(89, 6000, 2500, 0.008, 0.03), 24),
    "digits23": (_digits(lambda t: t == 2, (2, 3)), 8),
    "classification907": (_classification(907, 7000, 45, 9, 0.02, weights=[0.7, 0.3], class_sep=0.6), 16),
    "classification964": (_classification(964, 12800, 30, 10, 0.03), 64),
    "cifar_vehicles": (_cifar((0, 1, 8, 9)), 8),
    "mnist47_200": (_mnist("train", 4, 7, rows=200), 8),
    "cifar_catdog": (_cifar((3, 5)), 8),
    "cifar_first5": (_cifar((0, 1, 2, 3, 4)), 8),
    "cifar_vehicles_std": (_cifar((0, 1, 8, 9), standardise=True), 8),
    "classification1203": (_classification(1203, 6000, 30, 6, 0.03, n_redundant=4, class_sep=0.8), 16),
    "classification1204": (_classification(1204, 9000, 70, 20, 0.01, weights=[0.6, 0.4]), 24),
    "digits47": (_digits(lambda t: t == 4, (4, 7)), 8),
    "mnist69_test": (_mnist("t10k", 6, 9), 8),
    "iris_vv": (_iris, 8),
    "digits_primes": (_digits(lambda t: np.isin(t, (2, 3, 5, 7))), 8),
    "classification1205": (_classification(1205, 10000, 50, 14, 0.02, n_redundant=6, class_sep=0.9), 32),
    "classification1206": (_classification(1206, 8000, 40, 12, 0.03), 16),
    "classification1207": (_classification(1207, 8000, 40, 12, 0.03), 16),
    "digits18": (_digits(lambda t: t == 1, (1, 8)), 8),
    "mnist17_train2000": (_mnist("train", 1, 7, rows=2000), 16),
    "digits35": (_digits(lambda t: t == 3, (3, 5)), 8),
    "digits09": (_digits(lambda t: t == 0, (0, 9)), 8),
    "wine_first": (_wine(0), 8),
    "diabetes_median": (_diabetes, 8),
    "digits26": (_digits(lambda t: t == 2, (2, 6)), 8),
    "mnist12_test": (_mnist("t10k", 1, 2), 8),
    "classification1208": (_classification(1208, 8000, 60, 8, 0.02, n_clusters_per_class=3), 16),
    "breast_cancer_std": (_breast_cancer(standardise=True), 8),
    "classification1209_std": (_classification(1209, 6000, 40, 10, 0.03, standardise=True), 16),
    "digits39_std": (_digits(lambda t: t == 3, (3, 9), standardise=True), 8),
    "classification1210": (_classification(1210, 5000, 30, 8, 0.03), 8),
    "classification1211": (_classification(1211, 12000, 80, 25, 0.02, n_redundant=10), 32),
    "classification1212": (_classification(1212, 7000, 50, 12, 0.05, weights=[0.65, 0.35], class_sep=1.5), 16),
    "classification1213": (_classification(1213, 6000, 40, 10, 0.01, n_clusters_per_class=4, class_sep=0.7), 24),
    "classification1214_std": (_classification(1214, 8000, 50, 12, 0.02, standardise=True), 16),
    "mnist09_test": (_mnist("t10k", 0, 9), 8),
    "friedman_median": (_friedman, 12),
    "classification_defaults": (_classification(1206, 10000, 20, 2, 0.01), 16),
    "mnist58_train3000": (_mnist("train", 5, 8, rows=3000), 12),
    "regression_median": (_regression, 16),
    "classification1262": (_classification(1262, 8000, 30, 6, 0.02, weights=[0.9, 0.1]), 16),
    "classification1263": (_classification(1263, 9000, 40, 10, 0.03, hypercube=False), 20),
    "mnist23_train4000": (_mnist("train", 2, 3, rows=4000), 16),
    "classification1301": (_classification(1301, 7000, 45, 12, 0.03), 16),
    "classification1302": (_classification(1302, 9000, 60, 15, 0.02, n_redundant=5, weights=[0.75, 0.25]), 24),
    "classification1303_std": (_classification(1303, 6000, 25, 5, 0.04, standardise=True, class_sep=0.7), 16),
    "digits19": (_digits(lambda t: t == 1, (1, 9)), 8),
    "wine_third": (_wine(2), 8),
    "mnist79_test": (_mnist("t10k", 7, 9), 8),
    "sparse1307": (_sparse(1307, 5000, 1800, 0.01, 0.03), 16),
    "classification1308": (_classification(1308, 8000, 35, 10, 0.05, hypercube=False, n_clusters_per_class=3), 32),
    "classification1401": (_classification(1401, 5000, 30, 8, 0.03, hypercube=False, n_clusters_per_class=3), 16),
    "classification1402": (_classification(1402, 6000, 40, 10, 0.02, weights=[0.7, 0.3]), 32),
    "digits27": (_digits(lambda t: t == 2, (2, 7)), 8),
    "digits36_std": (_digits(lambda t: t == 3, (3, 6), standardise=True), 8),
    "classification1501": (_classification(1501, 7000, 35, 9, 0.02, class_sep=1.2), 16),
    "classification1502_std": (
        _classification(1502, 8000, 50, 12, 0.03, standardise=True, n_clusters_per_class=2, weights=[0.6, 0.4]),
        24,
    ),
    "digits04": (_digits(lambda t: t == 0, (0, 4)), 8),
    "digits15_std": (_digits(lambda t: t == 1, (1, 5), standardise=True), 8),
    "mnist46_test": (_mnist("t10k", 4, 6), 8),
    "sparse1503": (_sparse(1503, 4500, 1600, 0.012, 0.03), 16),
    "classification1601": (_classification(1601, 6000, 30, 7, 0.03, class_sep=0.9), 16),
    "classification1602_std": (
        _classification(1602, 9000, 45, 11, 0.02, standardise=True, weights=[0.55, 0.45]),
        24,
    ),
    "digits13": (_digits(lambda t: t == 1, (1, 3)), 8),
    "digits68_std": (_digits(lambda t: t == 6, (6, 8), standardise=True), 8),
    "sparse1603": (_sparse(1603, 3500, 1200, 0.015, 0.02), 16),
}
#: registered sets: name -> clients
REGISTERED = {"digits49": 8, "mushrooms": 16, "w8a": 16, "a9a-test": 32, "w8a-test": 16, "mnist49-test": 8}
BASE = Path(__file__).resolve().parent.parent / "docs" / "results" / "heldout_data" / "mushrooms_noniid.toml"
#: The row of windowed Local SGD + drift (control variates from a round's first W steps) the grids add to BASE's.
WINDOWED = {
    "method": "local_sgd",
    "label": "Local SGD + drift, window",
    "grid": {
        "lr": [0.32, 0.032, 3.2],
        "lr_decay": [1e-4, 1e-5, 1e-3],
        "k": [20480, 5120, 81920, 1280, 327680],
        "drift_window": [1024, 256, 4096],
    },
    "fixed": {"drift": True},
}


def write_config(out: Path, name: str, dataset: str, clients: int) -> None:
    """OUT/NAME.yaml: BASE's experiment on ``dataset`` with ``clients`` clients, run by ``algorithm.auto``."""
    overrides = [f"name={name}", f"data.dataset={dataset}", f"data.num_clients={clients}", "algorithm.auto=true"]
    dump_config(load_config(BASE, overrides, sweep_base=True), out / f"{name}.yaml")


def write_sweep(out: Path, name: str, dataset: str, clients: int) -> None:
    """OUT/NAME.sweep.yaml: BASE's rows and WINDOWED on ``dataset`` with ``clients`` clients, walked at seeds 0-2."""
    spec = tomllib.loads(BASE.read_text())
    spec.update(name=f"held_{name}", title=f"{name} (Non-IID), held out", search="descent", seeds=[0, 1, 2])
    spec["base"]["data"].update(dataset=dataset, num_clients=clients)
    spec["methods"].append(WINDOWED)
    (out / f"{name}.sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the .svm files and the configs")
    out = parser.parse_args().out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name, (make, clients) in SETS.items():
        X, y = make()
        dump_svmlight_file(X, y, str(out / f"{name}.svm"), zero_based=False)
        write_config(out, name, str(out / f"{name}.svm"), clients)
        write_sweep(out, name, str(out / f"{name}.svm"), clients)
        print(f"{name}: {X.shape[0]} x {X.shape[1]}, {clients} clients")
    for name, clients in REGISTERED.items():
        write_config(out, name, name, clients)
        write_sweep(out, name, name, clients)
        print(f"{name}: registered, {clients} clients")


if __name__ == "__main__":
    main()
