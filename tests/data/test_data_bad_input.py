"""Adversarial data input: every mistake is one DataError line naming the file (and line) or the argument.

Through the CLI the same mistakes end with one ``stlsgd: error: ...`` line on stderr, exit status 2 and nothing
written.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stlsgd.cli import main
from stlsgd.data import (
    cifar10_pickle,
    cifar10_png,
    fetch,
    load_dataset,
    mnist10,
    mnist_binary,
    read_idx,
    read_svmlight,
    readers,
)
from stlsgd.errors import DataError

PNG_DIR = "cifar10/train_first200_kaggle/train"
MAX_FEATURES = 2**24  # the documented limit of an svmlight file without a declared n_features
TINY = """\
name: tiny
data: {dataset: digits49, num_clients: 4}
algorithm: {method: sync_sgd, lr: 0.5}
run: {target_gap: null, max_rounds: 3}
"""


def _message(call: Callable[[], object]) -> str:
    """The DataError ``call`` raises; it must be one line."""
    with pytest.raises(DataError) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg and "\r" not in msg, msg
    return msg


def _file(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[int, str, str]]:
    """``stlsgd ARGS`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setenv("STLSGD_CACHE", str(tmp_path_factory.getbasetemp() / "stlsgd-cache"))

    def invoke(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return invoke


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _cli_error(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 2, err
    assert out == ""
    assert err.startswith("stlsgd: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.removeprefix("stlsgd: error: ").removesuffix("\n")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return _file(tmp_path, "tiny.yaml", TINY)


# --------------------------------------------------------------------------- 1. feature indices are bounded


def test_feature_index_beyond_c_int_is_too_large(tmp_path: Path) -> None:
    """10^12 used to end in sklearn's OverflowError traceback."""
    path = _file(tmp_path, "big.svm", "+1 1:1\n-1 2:1 1000000000000:1\n")
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:2: feature index 1000000000000 is too large (limit 16777216 = 2^24: d = 1000000000000 features "
        "would need 7.28 TiB of float64 model weights per client)"
    )


def test_feature_index_2e9_is_too_large(tmp_path: Path) -> None:
    """2*10^9 fits sklearn's C int; it used to load and then ask for 29.8 GiB in the model."""
    path = _file(tmp_path, "wide.svm", "+1 1:1 2000000000:1\n-1 2:1\n")
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:1: feature index 2000000000 is too large (limit 16777216 = 2^24: d = 2000000000 features "
        "would need 14.9 GiB of float64 model weights per client)"
    )


def test_1e8_features_refused_early_with_the_reason(tmp_path: Path) -> None:
    path = _file(tmp_path, "d1e8.svm.gz", gzip.compress(b"+1 1:1\n-1 5:1\n+1 100000000:0.5\n"))
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:3: feature index 100000000 is too large (limit 16777216 = 2^24: d = 100000000 features "
        "would need 763 MiB of float64 model weights per client)"
    )


def test_index_with_thousands_of_digits(tmp_path: Path) -> None:
    """More digits than Python's int() converts: still 'too large', the number shortened."""
    path = _file(tmp_path, "digits.svm", "+1 1:1\n-1 " + "9" * 5000 + ":1\n")
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:2: feature index {'9' * 40}... (5000 digits) is too large (limit 16777216 = 2^24)"
    )


def test_limit_itself_and_declared_n_features(tmp_path: Path) -> None:
    path = _file(tmp_path, "edge.svm", f"+1 1:1\n-1 {MAX_FEATURES}:1\n")
    assert read_svmlight(path).d == MAX_FEATURES == readers.MAX_FEATURES
    path = _file(tmp_path, "declared.svm", f"+1 1:1\n-1 {MAX_FEATURES + 1}:1\n")
    assert read_svmlight(path, n_features=MAX_FEATURES + 5).d == MAX_FEATURES + 5  # a declared size replaces it
    assert _message(lambda: read_svmlight(path, n_features=123)) == (
        f"{path}:2: feature index {MAX_FEATURES + 1} exceeds n_features=123"
    )
    huge = _file(tmp_path, "huge_declared.svm", "+1 1:1\n-1 1000000000000:1\n")
    assert _message(lambda: read_svmlight(huge, n_features=123)) == (
        f"{huge}:2: feature index 1000000000000 exceeds n_features=123"
    )
    assert _message(lambda: read_svmlight(path, n_features=2**31)) == (
        f"{path}: n_features=2147483648 outside 1..2147483647"
    )


def test_too_large_index_through_the_cli(tmp_path: Path, tiny: Path, cli) -> None:
    path = _file(tmp_path, "big.svm", "+1 1:1\n-1 2:1 1000000000000:1\n")
    before = _tree(tmp_path)
    msg = _cli_error(cli("run", tiny, "--out", tmp_path / "out", "--quiet", "--set", f"data.dataset={path}"))
    assert msg.startswith(f"{path}:2: feature index 1000000000000 is too large (limit 16777216 = 2^24")
    assert _tree(tmp_path) == before


# --------------------------------------------------------------------------- 2. labels only, or nothing


def test_labels_only_file_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "labels.svm", "+1\n-1  # a comment\n\n+1 \n")
    assert _message(lambda: read_svmlight(path)) == f"{path}: no features: every line holds only a label"


def test_labels_only_through_the_cli(tmp_path: Path, tiny: Path, cli) -> None:
    path = _file(tmp_path, "labels.svm", "+1\n-1\n+1\n-1\n")
    before = _tree(tmp_path)
    msg = _cli_error(cli("run", tiny, "--out", tmp_path / "out", "--quiet", "--set", f"data.dataset={path}"))
    assert msg == f"{path}: no features: every line holds only a label"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("content", [b"", b"\n\n", b"# only a comment\n   \n"])
def test_empty_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = _file(tmp_path, "empty.svm", content)
    assert _message(lambda: read_svmlight(path)) == f"{path}: no data: the file holds no svmlight lines"
    gz = _file(tmp_path, "empty.gz", gzip.compress(content))
    assert _message(lambda: read_svmlight(gz)) == f"{gz}: no data: the file holds no svmlight lines"


def test_explicit_zero_values_are_features(tmp_path: Path) -> None:
    path = _file(tmp_path, "zeros.svm", "+1 1:0\n-1 2:0\n")
    assert read_svmlight(path).d == 2


# --------------------------------------------------------------------------- 3 and 5. the data dir is a file


def test_fetch_into_a_data_dir_that_is_a_file(tmp_path: Path, cli) -> None:
    """Used to end in NotADirectoryError from mkdir."""
    data_dir = _file(tmp_path, "data", "x")
    before = _tree(tmp_path)
    msg = _cli_error(cli("data", "fetch", "mushrooms", "--data-dir", data_dir))
    assert msg == f"{data_dir}: data dir is a file, not a directory; point --data-dir or $STLSGD_DATA at a folder"
    assert _tree(tmp_path) == before and data_dir.read_text() == "x"


def test_fetch_under_a_file(tmp_path: Path, cli) -> None:
    blocker = _file(tmp_path, "data", "x")
    msg = _cli_error(cli("data", "fetch", "a9a", "--data-dir", blocker / "sub"))
    assert msg == (
        f"{blocker / 'sub'}: data dir cannot be created: {blocker} is a file; "
        "point --data-dir or $STLSGD_DATA at a folder"
    )


def test_data_dir_from_the_environment_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = _file(tmp_path, "data", "x")
    monkeypatch.setenv("STLSGD_DATA", str(data_dir))
    assert _message(lambda: fetch("a9a", urlopen=None)) == (
        f"{data_dir}: data dir is a file, not a directory; point --data-dir or $STLSGD_DATA at a folder"
    )


def test_load_from_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    """Used to say 'not found; run: stlsgd data fetch a9a --data-dir FILE', a command that itself crashed."""
    data_dir = _file(tmp_path, "data", "x")
    for name in ("a9a", "mnist49", "cifar10", "cifar10-png200"):
        assert _message(lambda name=name: load_dataset(name, data_dir)) == (
            f"{data_dir}: data dir is a file, not a directory; point --data-dir or $STLSGD_DATA at a folder"
        )
    assert load_dataset("digits49", data_dir).n == 361  # embedded: the data dir is not used


def test_run_with_a_data_dir_that_is_a_file(tmp_path: Path, tiny: Path, cli) -> None:
    data_dir = _file(tmp_path, "data", "x")
    before = _tree(tmp_path)
    msg = _cli_error(
        cli("run", tiny, "--out", tmp_path / "out", "--quiet", "--data-dir", data_dir, "--set", "data.dataset=a9a")
    )
    assert msg == f"{data_dir}: data dir is a file, not a directory; point --data-dir or $STLSGD_DATA at a folder"
    assert _tree(tmp_path) == before


def test_a_file_or_folder_in_the_way_inside_the_data_dir(tmp_path: Path, cli) -> None:
    (tmp_path / "dd").mkdir()
    _file(tmp_path / "dd", "a9a", "x")  # where the a9a folder belongs
    blocker = tmp_path / "dd" / "a9a"
    assert _message(lambda: load_dataset("a9a", tmp_path / "dd")) == (
        f"{blocker}: is a file, not a directory; remove it, then run: stlsgd data fetch a9a --data-dir {tmp_path / 'dd'}"
    )
    assert _cli_error(cli("data", "fetch", "a9a", "--data-dir", tmp_path / "dd")) == (
        f"{blocker}: is a file, not a directory; remove it, then fetch again"
    )
    blocker.unlink()
    (tmp_path / "dd" / "a9a" / "a9a.gz").mkdir(parents=True)  # a folder where the file belongs
    assert _message(lambda: load_dataset("a9a", tmp_path / "dd")) == (
        f"{blocker / 'a9a.gz'}: is a directory, not a file; remove it, then run: stlsgd data fetch a9a "
        f"--data-dir {tmp_path / 'dd'}"
    )
    assert _message(lambda: fetch("a9a", tmp_path / "dd", urlopen=None)) == (
        f"{blocker / 'a9a.gz'}: is a directory, not a file; remove it, then fetch again"
    )


def test_data_dir_with_an_unknown_user(tmp_path: Path) -> None:
    """``~nosuchuser`` used to raise RuntimeError from Path.expanduser."""
    assert _message(lambda: load_dataset("a9a", "~stlsgd-no-such-user/data")) == (
        "~stlsgd-no-such-user/data: data dir: cannot expand '~' (no such user or no home directory)"
    )
    assert _message(lambda: load_dataset("~stlsgd-no-such-user/mine.svm")) == (
        "~stlsgd-no-such-user/mine.svm: data.dataset: cannot expand '~' (no such user or no home directory)"
    )


# --------------------------------------------------------------------------- 4. a directory as data.dataset


def test_directory_as_svmlight_path(tmp_path: Path) -> None:
    folder = tmp_path / "mine.svm"
    folder.mkdir()
    assert _message(lambda: read_svmlight(folder)) == f"{folder}: is a directory, not an svmlight file"
    assert _message(lambda: load_dataset(str(folder))) == f"{folder}: is a directory, not an svmlight file"
    assert _message(lambda: load_dataset(str(tmp_path))) == f"{tmp_path}: is a directory, not an svmlight file"


def test_directory_as_dataset_through_the_cli(tmp_path: Path, tiny: Path, cli) -> None:
    folder = tmp_path / "datasets"
    folder.mkdir()
    before = _tree(tmp_path)
    msg = _cli_error(cli("run", tiny, "--out", tmp_path / "out", "--quiet", "--set", f"data.dataset={folder}"))
    assert msg == f"{folder}: is a directory, not an svmlight file"
    assert _tree(tmp_path) == before


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_device_as_svmlight_path() -> None:
    assert _message(lambda: load_dataset("/dev/null")) == (
        "/dev/null: is a special file (device, FIFO or socket), not an svmlight file"
    )


def test_path_too_long(tmp_path: Path) -> None:
    """ENAMETOOLONG used to escape Path.is_file as an OSError traceback."""
    name = "x" * 5000
    assert _message(lambda: load_dataset(name)) == f"{name}: cannot read (File name too long)"
    long_path = tmp_path / ("y" * 5000 + ".svm")
    assert _message(lambda: read_svmlight(long_path)) == f"{long_path}: cannot read (File name too long)"


def test_unreadable_file_reported_by_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the system refuses to read (chmod 000 as a user other than root): the parser's OSError is one line."""
    import sklearn.datasets._svmlight_format_io as io_mod

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    path = _file(tmp_path, "mine.svm", "+1 1:1\n-1 2:1\n")
    monkeypatch.setattr(io_mod, "open", refuse, raising=False)
    assert _message(lambda: read_svmlight(path)) == f"{path}: cannot read (Permission denied)"


# --------------------------------------------------------------------------- 6. svmlight lines as sklearn reads them


def test_non_utf8_bytes_are_shown_escaped(tmp_path: Path) -> None:
    path = _file(tmp_path, "latin1.svm", b"+1 1:1\n\xff\xfe1 2:1\n")
    assert _message(lambda: read_svmlight(path)) == f"{path}:2: malformed svmlight line: bad label '\\xff\\xfe1'"
    path = _file(tmp_path, "latin1b.svm", b"+1 1:1\n-1 2:1 3:\xe9\n")
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:2: malformed svmlight line: token '3:\\xe9' is not index:value"
    )


def test_long_token_is_shortened(tmp_path: Path) -> None:
    path = _file(tmp_path, "long.svm", "+1 1:1\n-1 " + "z" * 10_000 + "\n")
    assert _message(lambda: read_svmlight(path)) == (
        f"{path}:2: malformed svmlight line: token '{'z' * 40}...' is not index:value"
    )


def test_carriage_returns_are_not_line_breaks(tmp_path: Path) -> None:
    """sklearn splits lines on \\n only, so a lone \\r leaves '-1' as a feature token of line 1."""
    path = _file(tmp_path, "mac.svm", b"+1 1:1\r-1 2:1\n")
    assert _message(lambda: read_svmlight(path)) == f"{path}:1: malformed svmlight line: token '-1' is not index:value"


def test_qid_only_as_first_feature(tmp_path: Path) -> None:
    ok = _file(tmp_path, "qid.svm", "+1 qid:1 1:1\n-1 qid:x 2:1\n")
    assert read_svmlight(ok).d == 2  # sklearn skips the first qid token, whatever its value
    bad = _file(tmp_path, "qid_late.svm", "+1 1:1\n-1 2:1 qid:3\n")
    assert _message(lambda: read_svmlight(bad)) == f"{bad}:2: malformed svmlight line: token 'qid:3' is not index:value"


@pytest.mark.parametrize(
    "line, problem",
    [
        ("-1 2:1e400", "non-finite value in '2:1e400'"),
        ("1e400 2:1", "non-finite label '1e400'"),
        ("-1 2:-inf", "non-finite value in '2:-inf'"),
        ("nan 2:1", "non-finite label 'nan'"),
        ("-1 -3:1", "negative feature index -3"),
        ("-1 3:1 2:1", "feature indices not increasing (3 then 2)"),
        ("-1 2:1\x002:1", "token '2:1\\x002:1' is not index:value"),
    ],
)
def test_bad_numbers_name_the_line(tmp_path: Path, line: str, problem: str) -> None:
    path = _file(tmp_path, "bad.svm", f"+1 1:1\n{line}\n")
    assert _message(lambda: read_svmlight(path)) == f"{path}:2: malformed svmlight line: {problem}"


def test_zero_based_file_as_sklearn_writes_it(tmp_path: Path) -> None:
    """dump_svmlight_file writes 0-based indices by default: such a file reads as the 1-based one of the same rows."""
    from sklearn.datasets import dump_svmlight_file

    X = np.array([[0.5, 0.0, 2.0], [0.0, 1.5, 0.0], [3.0, 0.0, 0.25]])
    y = np.array([1.0, 0.0, 1.0])
    zero, one = tmp_path / "zero.svm", tmp_path / "one.svm"
    dump_svmlight_file(X, y, str(zero))
    dump_svmlight_file(X, y, str(one), zero_based=False)
    assert zero.read_text().splitlines()[0].split()[1].startswith("0:")
    a, b = read_svmlight(zero), read_svmlight(one)
    np.testing.assert_array_equal(a.X.toarray(), X)
    np.testing.assert_array_equal(b.X.toarray(), X)
    np.testing.assert_array_equal(a.y, [1.0, -1.0, 1.0])
    # A registered dataset's file (n_features declared) stays 1-based: there an index 0 is refused, on its line.
    assert _message(lambda: read_svmlight(zero, n_features=3)) == (
        f"{zero}:1: malformed svmlight line: feature index 0 < 1"
    )
    # A line of a 0-based file that is bad is still named: the scanner allows index 0 and increasing from it.
    bad = _file(tmp_path, "zero_bad.svm", "+1 0:1 2:1\n-1 0:1 0:2\n")
    assert _message(lambda: read_svmlight(bad)) == (
        f"{bad}:2: malformed svmlight line: feature indices not increasing (0 then 0)"
    )


def test_one_class(tmp_path: Path) -> None:
    path = _file(tmp_path, "one.svm", "+1 1:1\n+1 2:1\n")
    assert _message(lambda: read_svmlight(path)) == f"{path}: expected 2 label values, found 1 (1)"


# --------------------------------------------------------------------------- 6. idx (MNIST)


def _idx(dtype: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, dtype, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


def test_idx_dims_whose_product_wraps_int64(tmp_path: Path) -> None:
    """65536^4 = 2^64 wrapped to 0 in int64, matched the empty payload and crashed in reshape."""
    path = _file(tmp_path, "wrap.idx", _idx(0x08, (65536,) * 4, b""))
    assert _message(lambda: read_idx(path)) == (
        f"{path}: idx payload is 0 bytes, expected 18446744073709551616 for shape (65536, 65536, 65536, 65536) of uint8"
    )


def test_mnist_labels_must_be_integers(tmp_path: Path) -> None:
    images = _file(tmp_path, "img", _idx(0x08, (2, 2, 2), bytes(8)))
    labels = _file(tmp_path, "lbl", _idx(0x0E, (2,), np.array([np.nan, 4.0], ">f8").tobytes()))
    assert _message(lambda: mnist10(images, labels)) == (
        f"{labels}: expected a 1-d file of integer labels, got float64 (2,)"
    )


def test_mnist_binary_needs_both_digits(tmp_path: Path) -> None:
    images = _file(tmp_path, "img", _idx(0x08, (3, 2, 2), bytes(12)))
    labels = _file(tmp_path, "lbl", _idx(0x08, (3,), bytes([4, 4, 1])))
    assert _message(lambda: mnist_binary(images, labels)) == (
        f"{labels}: expected images of both digits 4 and 9, found 2 and 0"
    )


def test_idx_path_is_a_directory(tmp_path: Path) -> None:
    assert _message(lambda: read_idx(tmp_path)) == f"{tmp_path}: cannot read (Is a directory)"


# --------------------------------------------------------------------------- 6. CIFAR-10 pickles


def test_cifar_batch_is_a_directory_or_under_a_file(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "test_batch").mkdir(parents=True)
    assert _message(lambda: cifar10_pickle(folder, ("test_batch",))) == (
        f"{folder / 'test_batch'}: cannot read (Is a directory)"
    )
    not_a_dir = _file(tmp_path, "file", "x")
    assert _message(lambda: cifar10_pickle(not_a_dir)) == f"{not_a_dir / 'data_batch_1'}: not found"


def test_cifar_batch_with_non_integer_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rows = np.zeros((2, 3072), np.uint8)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": rows, b"labels": ["cat", "dog"]}, protocol=2))
    msg = _message(lambda: cifar10_pickle(folder, ("test_batch",)))
    assert msg.startswith(f"{folder / 'test_batch'}: not a CIFAR-10 pickle batch (labels or data: ")


def test_cifar_batch_unpickler_failures_are_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    good = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [3]}, protocol=2)
    for i, blob in enumerate(
        (b"", good[: len(good) // 2], b"\x80\x02}q\x00(X\xff\xff\xff\x7f", good[:30] + b"\x00" * 40)
    ):
        (folder / f"b{i}").write_bytes(blob)
        msg = _message(lambda i=i: cifar10_pickle(folder, (f"b{i}",)))
        assert msg.startswith(f"{folder / f'b{i}'}: not a CIFAR-10 pickle batch ("), msg


# --------------------------------------------------------------------------- 6. CIFAR-10 PNGs and their CSV


def test_png_that_is_not_an_image(tmp_path: Path) -> None:
    _file(tmp_path, "1.png", b"this is not a PNG")
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == (
        f"{tmp_path / '1.png'}: not an image file (listed at {csv}:1)"
    )


def test_truncated_png(tmp_path: Path, shared_data: Path) -> None:
    raw = (shared_data / PNG_DIR / "1.png").read_bytes()
    _file(tmp_path, "1.png", raw[: len(raw) // 2])
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n")
    msg = _message(lambda: cifar10_png(tmp_path, csv))
    assert msg.startswith(f"{tmp_path / '1.png'}: unreadable image (") and msg.endswith(f"(listed at {csv}:1)")


def test_png_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "1.png").mkdir()
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == (
        f"{tmp_path / '1.png'}: is a directory, not an image (listed at {csv}:1)"
    )


def test_png_listed_but_missing_and_extra_pngs_ignored(tmp_path: Path, shared_data: Path) -> None:
    folder = shared_data / PNG_DIR
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n2.png,truck\n")
    ds = cifar10_png(folder, csv)  # the folder holds 198 PNGs the CSV does not list: rows follow the CSV
    assert ds.n == 2 and ds.y.tolist() == [6, 9]
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n201.png,cat\n")
    assert _message(lambda: cifar10_png(folder, csv)) == f"{folder / '201.png'}: not found (listed at {csv}:2)"


def test_csv_field_over_the_csv_limit(tmp_path: Path, shared_data: Path) -> None:
    """csv.Error used to escape as a traceback."""
    csv = _file(tmp_path, "labels.csv", "1.png,frog\n" + "x" * 200_000 + ",cat\n")
    assert _message(lambda: cifar10_png(shared_data / PNG_DIR, csv)) == (
        f"{csv}:2: malformed CSV (field larger than field limit (131072))"
    )


def test_csv_unicode_digit_label(tmp_path: Path) -> None:
    """'²'.isdigit() is True but int('²') raises ValueError."""
    csv = _file(tmp_path, "labels.csv", "1.png,\u00b2\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == f"{csv}:1: unknown CIFAR-10 class '\u00b2'"


def test_csv_nul_or_empty_file_name(tmp_path: Path) -> None:
    csv = _file(tmp_path, "labels.csv", "1\x00.png,frog\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == f"{csv}:1: bad image file name '1\\x00.png'"
    csv = _file(tmp_path, "labels.csv", " ,frog\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == f"{csv}:1: bad image file name ''"


def test_csv_not_utf8_or_a_directory(tmp_path: Path) -> None:
    csv = _file(tmp_path, "labels.csv", b"1.png,fr\xf6g\n")
    assert _message(lambda: cifar10_png(tmp_path, csv)) == (
        f"{csv}: not a UTF-8 text file (invalid start byte at byte 8)"
    )
    assert _message(lambda: cifar10_png(tmp_path, tmp_path)) == f"{tmp_path}: cannot read (Is a directory)"


def test_png200_with_missing_files_through_the_registry(tmp_path: Path, shared_data: Path) -> None:
    root = tmp_path / "dd" / "cifar10" / "train_first200_kaggle"
    (root / "train").mkdir(parents=True)
    (root / "trainLabels.csv").write_bytes((shared_data / "cifar10/train_first200_kaggle/trainLabels.csv").read_bytes())
    (root / "train" / "1.png").write_bytes((shared_data / PNG_DIR / "1.png").read_bytes())
    assert _message(lambda: load_dataset("cifar10-png200", tmp_path / "dd")) == (
        f"{root / 'train' / '2.png'}: not found (listed at {root / 'trainLabels.csv'}:2)"
    )
