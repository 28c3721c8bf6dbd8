"""Readers on the real shared data, and their one-line errors on damaged files."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from stlsgd.data import (
    cifar10_pickle,
    cifar10_png,
    digits_binary,
    mnist10,
    mnist_binary,
    normalize_channels,
    read_idx,
    read_svmlight,
)
from stlsgd.errors import DataError

PNG_COUNTS = [14, 28, 22, 21, 19, 19, 18, 21, 15, 23]


def _one_line(err: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def png200(shared_data: Path):
    root = shared_data / "cifar10" / "train_first200_kaggle"
    return cifar10_png(root / "train", root / "trainLabels.csv")


@pytest.fixture(scope="module")
def mnist_paths(shared_data: Path) -> tuple[Path, Path]:
    return shared_data / "mnist/train-images-idx3-ubyte.gz", shared_data / "mnist/train-labels-idx1-ubyte.gz"


def test_a9a(shared_data: Path) -> None:
    ds = read_svmlight(shared_data / "a9a/a9a.gz", n_features=123)
    assert (ds.n, ds.d) == (32561, 123)
    assert isinstance(ds.X, sp.csr_matrix) and ds.X.dtype == np.float64
    assert ds.y.dtype == np.float64 and set(np.unique(ds.y)) == {-1.0, 1.0}
    assert int((ds.y > 0).sum()) == 7841
    assert ds.X.nnz == 451592 and ds.num_classes == 2


def test_a9a_test_needs_n_features(shared_data: Path) -> None:
    assert read_svmlight(shared_data / "a9a/a9a.t.gz").d == 122  # feature 123 never occurs
    ds = read_svmlight(shared_data / "a9a/a9a.t.gz", n_features=123)
    assert (ds.n, ds.d, int((ds.y > 0).sum())) == (16281, 123, 3846)


def test_mushrooms_labels_1_2_map_to_pm1(shared_data: Path) -> None:
    ds = read_svmlight(shared_data / "mushrooms/mushrooms.gz", n_features=112)
    assert (ds.n, ds.d) == (8124, 112)
    assert int((ds.y == -1).sum()) == 3916 and int((ds.y == 1).sum()) == 4208


def test_read_idx_real(mnist_paths: tuple[Path, Path]) -> None:
    images, labels = (read_idx(p) for p in mnist_paths)
    assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (60000,)
    assert np.bincount(labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert images.flags.writeable


def test_mnist49(mnist_paths: tuple[Path, Path]) -> None:
    ds = mnist_binary(*mnist_paths)
    assert (ds.name, ds.n, ds.d) == ("mnist49", 11791, 784)
    assert int((ds.y == 1).sum()) == 5842 and int((ds.y == -1).sum()) == 5949
    assert isinstance(ds.X, sp.csr_matrix) and ds.X.min() >= 0.0 and ds.X.max() == 1.0
    # Original row order: the first kept row is the first 4 or 9 in the training file.
    labels = read_idx(mnist_paths[1])
    first = int(np.flatnonzero((labels == 4) | (labels == 9))[0])
    images = read_idx(mnist_paths[0])
    np.testing.assert_allclose(ds.X[0].toarray().ravel(), images[first].ravel() / 255.0)
    assert ds.y[0] == (1.0 if labels[first] == 4 else -1.0)


def test_mnist10(mnist_paths: tuple[Path, Path]) -> None:
    ds = mnist10(*mnist_paths)
    assert ds.X.shape == (60000, 1, 28, 28) and ds.X.dtype == np.float32
    assert ds.y.dtype == np.int64 and ds.num_classes == 10 and ds.d == 784
    assert 0.0 <= ds.X.min() and ds.X.max() <= 1.0
    assert abs(float(ds.X.mean(dtype=np.float64)) - 0.130660) < 1e-5


def test_digits49() -> None:
    ds = digits_binary()
    assert (ds.name, ds.n, ds.d) == ("digits49", 361, 64)
    assert int((ds.y == 1).sum()) == 181 and int((ds.y == -1).sum()) == 180
    assert ds.X.max() <= 1.0


def test_cifar10_png(png200) -> None:
    assert png200.X.shape == (200, 3, 32, 32) and png200.X.dtype == np.float32
    assert np.bincount(png200.y, minlength=10).tolist() == PNG_COUNTS
    assert png200.y[:20].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3, 4, 7, 7, 2, 9, 9, 9, 3, 2, 6]
    np.testing.assert_allclose(png200.X[0, 0, 0, :6], np.array([59, 43, 50, 68, 98, 119]) / 255, rtol=1e-6)


def test_cifar10_png_numeric_labels_and_header(tmp_path: Path, shared_data: Path, png200) -> None:
    names = (shared_data / "cifar10/train_first200_kaggle/trainLabels.csv").read_text().splitlines()[:5]
    csv = tmp_path / "labels.csv"
    csv.write_text(
        "id,label\n" + "".join(f"{n.split(',')[0].removesuffix('.png')},{y}\n" for n, y in zip(names, png200.y[:5]))
    )
    ds = cifar10_png(shared_data / "cifar10/train_first200_kaggle/train", csv)
    assert ds.y.tolist() == png200.y[:5].tolist()
    np.testing.assert_array_equal(ds.X, png200.X[:5])


def test_cifar10_png_errors(tmp_path: Path, shared_data: Path) -> None:
    folder = shared_data / "cifar10/train_first200_kaggle/train"
    csv = tmp_path / "labels.csv"
    csv.write_text("1.png,frog\n2.png,spaceship\n")
    with pytest.raises(DataError) as err:
        cifar10_png(folder, csv)
    assert f"{csv}:2: unknown CIFAR-10 class 'spaceship'" in _one_line(err)
    csv.write_text("1.png,frog\n\n999.png,cat\n")
    with pytest.raises(DataError) as err:
        cifar10_png(folder, csv)
    assert "999.png: not found" in _one_line(err) and f"{csv}:3" in str(err.value)
    from PIL import Image

    Image.new("L", (32, 32)).save(tmp_path / "gray.png")
    csv.write_text("gray.png,cat\n")
    with pytest.raises(DataError, match="expected a 32x32 RGB image, got L 32x32"):
        cifar10_png(tmp_path, csv)


def _write_batches(root: Path, X: np.ndarray, y: np.ndarray) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows = (X * 255).round().astype(np.uint8).reshape(len(X), 3072)
    for i, idx in enumerate(np.array_split(np.arange(len(X)), 5), start=1):
        with open(folder / f"data_batch_{i}", "wb") as fh:
            pickle.dump({b"batch_label": b"x", b"labels": y[idx].tolist(), b"data": rows[idx]}, fh, protocol=2)
    return folder


def test_cifar10_pickle_matches_png(tmp_path: Path, png200) -> None:
    # Kaggle image N is data_batch_1 row N-1, so batches built from the PNGs are the real layout.
    folder = _write_batches(tmp_path, png200.X, png200.y)
    for where in (folder, tmp_path):
        ds = cifar10_pickle(where)
        assert ds.X.shape == (200, 3, 32, 32) and ds.y.dtype == np.int64
        np.testing.assert_array_equal(ds.X, png200.X)
        np.testing.assert_array_equal(ds.y, png200.y)


def test_cifar10_pickle_refuses_code(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    with pytest.raises(DataError, match="test_batch: not a CIFAR-10 pickle batch"):
        cifar10_pickle(folder, ("test_batch",))
    with pytest.raises(DataError, match="data_batch_1: not found"):
        cifar10_pickle(folder)


def test_normalize_channels(png200) -> None:
    Xn, mean, std = normalize_channels(png200.X)
    assert mean.shape == std.shape == (3,)
    np.testing.assert_allclose(Xn.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(Xn.std(axis=(0, 2, 3)), 1.0, atol=1e-4)
    Xt, m2, s2 = normalize_channels(png200.X[:10], mean, std)
    np.testing.assert_allclose(Xt, Xn[:10], rtol=1e-6)
    assert (m2 == mean).all() and (s2 == std).all()


# --------------------------------------------------------------------------- errors


def test_malformed_line_reports_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.svm"
    path.write_text("+1 1:1 3:1\n-1 2:1\n\n+1 2:abc\n-1 1:1\n")
    with pytest.raises(DataError) as err:
        read_svmlight(path)
    assert _one_line(err).startswith(f"{path}:4: malformed svmlight line")


def test_malformed_line_in_gz(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("+1 1:1\n-1 2:1\n-1 oops\n")
    with pytest.raises(DataError) as err:
        read_svmlight(path)
    assert _one_line(err).startswith(f"{path}:3: malformed svmlight line")


def test_three_classes(tmp_path: Path) -> None:
    path = tmp_path / "three.svm"
    path.write_text("0 1:1\n1 2:1\n2 1:1\n")
    with pytest.raises(DataError) as err:
        read_svmlight(path)
    assert _one_line(err) == f"{path}: expected 2 label values, found 3 (0, 1, 2)"


def test_index_beyond_n_features(tmp_path: Path) -> None:
    path = tmp_path / "wide.svm"
    path.write_text("+1 1:1 3:1\n-1 2:1 7:1\n")
    with pytest.raises(DataError) as err:
        read_svmlight(path, n_features=5)
    assert _one_line(err) == f"{path}:2: feature index 7 exceeds n_features=5"


def test_truncated_gzip(tmp_path: Path, shared_data: Path) -> None:
    raw = (shared_data / "a9a/a9a.gz").read_bytes()
    path = tmp_path / "a9a.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError) as err:
        read_svmlight(path, 123)
    assert _one_line(err).startswith(f"{path}: corrupt or truncated gzip file (")
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_svmlight(path)


def test_missing_svmlight(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.svm: not found"):
        read_svmlight(tmp_path / "nope.svm")


def _idx(dims: tuple[int, ...], payload: bytes, magic: bytes | None = None) -> bytes:
    head = magic if magic is not None else bytes([0, 0, 0x08, len(dims)])
    return head + struct.pack(f">{len(dims)}I", *dims) + payload


def test_idx_roundtrip_and_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "x.idx.gz"
    path.write_bytes(gzip.compress(_idx((2, 3), bytes(range(6)))))
    np.testing.assert_array_equal(read_idx(path), np.arange(6, dtype=np.uint8).reshape(2, 3))
    vals = np.array([1.5, -2.0, 3.25], dtype=">f4")
    path = tmp_path / "f.idx"
    path.write_bytes(bytes([0, 0, 0x0D, 1]) + struct.pack(">I", 3) + vals.tobytes())
    out = read_idx(path)
    assert out.dtype == np.float32 and out.dtype.isnative and out.tolist() == [1.5, -2.0, 3.25]


def test_idx_wrong_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(_idx((2,), b"\x00\x01", magic=b"\x00\x01\x08\x01"))
    with pytest.raises(DataError) as err:
        read_idx(path)
    assert _one_line(err) == f"{path}: not an idx file (bad magic 00010801)"
    path.write_bytes(_idx((2,), b"\x00\x01", magic=b"\x00\x00\x07\x01"))  # unknown dtype code
    with pytest.raises(DataError, match="bad magic"):
        read_idx(path)


@pytest.mark.parametrize("payload, actual", [(bytes(5), 5), (bytes(7), 7)])
def test_idx_wrong_size(tmp_path: Path, payload: bytes, actual: int) -> None:
    path = tmp_path / "short.idx"
    path.write_bytes(_idx((2, 3), payload))
    with pytest.raises(DataError) as err:
        read_idx(path)
    assert _one_line(err) == f"{path}: idx payload is {actual} bytes, expected 6 for shape (2, 3) of uint8"


def test_mnist_label_count_mismatch(tmp_path: Path) -> None:
    img, lbl = tmp_path / "img", tmp_path / "lbl"
    img.write_bytes(_idx((2, 2, 2), bytes(8)))
    lbl.write_bytes(_idx((3,), bytes([4, 9, 4])))
    with pytest.raises(DataError, match="3 labels but .* has 2 images"):
        mnist_binary(img, lbl)
