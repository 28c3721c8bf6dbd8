"""Property tests: whatever bytes the readers and the config loader get, they succeed or raise a StlsgdError.

Inputs are random bytes and mutations (flipped, inserted, deleted bytes; truncation) of real files: the head of
a9a, a small idx file cut from the real MNIST labels/images, a real CIFAR-10 PNG and a pickle batch; svmlight
lines built from hostile tokens (huge or negative indices, 1e400, nan, non-UTF-8 bytes, NUL, lone CR, qid);
CSV label files; and dataset names and data-dir layouts for the registry. Any other exception type would reach the user
as a traceback instead of the one-line ``stlsgd: error: FILE[:LINE]: ...``.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stlsgd.data.dataset import Dataset
from stlsgd.data.readers import (
    MAX_FEATURES,
    cifar10_pickle,
    cifar10_png,
    mnist10,
    mnist_binary,
    read_idx,
    read_svmlight,
)
from stlsgd.data.registry import DATASETS, fetch, load_dataset
from stlsgd.errors import ConfigError, DataError, StlsgdError
from stlsgd.executors.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from stlsgd.experiments.config import Experiment, load_config

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_counter = itertools.count()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Module-scoped: hypothesis reruns the test body, and a per-example file name keeps examples apart.
    return tmp_path_factory.mktemp("fuzz")


def _write(scratch: Path, data: bytes, suffix: str) -> Path:
    path = scratch / f"f{next(_counter)}{suffix}"
    path.write_bytes(data)
    return path


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """``base`` with a few random edits: overwrite, insert or delete a byte, or cut the tail off."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=3))
        elif kind == "delete" and data:
            del data[pos]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


def _compress(data: bytes, suffix: str) -> bytes:
    return {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress}[suffix](data)


# --------------------------------------------------------------------------- svmlight


@pytest.fixture(scope="module")
def a9a_head(shared_data: Path) -> bytes:
    with gzip.open(shared_data / "a9a" / "a9a.gz", "rb") as fh:
        return b"".join(itertools.islice(fh, 25))


def _check_svmlight(path: Path, n_features: int | None) -> None:
    try:
        ds = read_svmlight(path, n_features)
    except DataError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    assert isinstance(ds, Dataset) and ds.num_classes == 2
    assert set(np.unique(ds.y)) == {-1.0, 1.0}
    assert np.isfinite(ds.X.data).all() and ds.X.nnz > 0  # no nan/inf, not labels only
    if n_features is not None:
        assert ds.X.shape[1] == n_features
    else:
        assert ds.X.shape[1] <= MAX_FEATURES  # a dense model of d float64 per client stays allocatable


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from(["", ".gz", ".bz2"]))
def test_svmlight_random_bytes(scratch: Path, data: bytes, suffix: str) -> None:
    _check_svmlight(_write(scratch, data, suffix), None)


@FUZZ
@given(
    data=st.data(),
    compress_first=st.booleans(),
    suffix=st.sampled_from(["", ".gz", ".bz2"]),
    n_features=st.sampled_from([None, 123, 60]),
)
def test_svmlight_mutated_a9a(
    scratch: Path, a9a_head: bytes, data: st.DataObject, compress_first: bool, suffix: str, n_features: int | None
) -> None:
    if compress_first:  # damage the compressed stream itself
        content = data.draw(mutated(_compress(a9a_head, suffix)))
    else:  # damage the text, then compress it intact
        content = _compress(data.draw(mutated(a9a_head)), suffix)
    _check_svmlight(_write(scratch, content, suffix), n_features)


def test_unmutated_a9a_head_reads(scratch: Path, a9a_head: bytes) -> None:
    """The base of the mutations is itself valid, so the mutation tests exercise both outcomes."""
    ds = read_svmlight(_write(scratch, gzip.compress(a9a_head), ".gz"), 123)
    assert ds.n == 25 and ds.d == 123


_SVM_LABELS = st.sampled_from(
    [b"nan", b"inf", b"-inf", b"1e400", b"-1e400", b"x", b"\xff\xfe", b"1_0", b"0x1", b"\xd9\xa1", b"2", b"0"]
)
_SVM_INDICES = st.sampled_from(
    [
        b"0",
        b"-0",
        b"-3",
        b"1000000000000",
        b"2000000000",
        b"2147483647",
        b"2147483648",
        b"16777216",
        b"16777217",
        b"100000000",
        b"9" * 5000,
        b"1e5",
        b"qid",
        b"\xff",
        b"",
        b"1_2",
        b"\xd9\xa1",
        b"200",
    ]
)
_SVM_VALUES = st.sampled_from(
    [b"0", b"-2.5", b"nan", b"inf", b"1e400", b"-1e400", b"1e-400", b"x", b"", b"\xff", b"1:2", b"0x10", b"1_0"]
)
_SVM_SEPARATORS = st.sampled_from([b"\t", b"  ", b"\r", b"\x00", b"\x0b", b" # ", b"\xa0", b""])


def _mostly(draw: st.DrawFn, usual: bytes, hostile: st.SearchStrategy[bytes]) -> bytes:
    """``usual`` four times in five, else a hostile token: a line usually gets past the parser up to its trap."""
    return usual if draw(st.integers(0, 4)) else draw(hostile)


@st.composite
def svmlight_line(draw: st.DrawFn) -> bytes:
    """A valid line (label, increasing index:value pairs) with, here and there, a hostile token in its place."""
    out = _mostly(draw, draw(st.sampled_from([b"+1", b"-1"])), _SVM_LABELS)
    if draw(st.integers(0, 9)) == 0:
        out += b" qid:" + draw(st.sampled_from([b"1", b"x", b""]))
    for idx in sorted(draw(st.sets(st.integers(1, 130), max_size=4))):
        sep = _mostly(draw, b" ", _SVM_SEPARATORS)
        key = _mostly(draw, str(idx).encode(), _SVM_INDICES)
        pair = key if draw(st.integers(0, 15)) == 0 else key + b":" + _mostly(draw, b"1", _SVM_VALUES)  # no colon
        out += sep + pair
    return out


@FUZZ
@given(
    lines=st.lists(svmlight_line(), max_size=6),
    base=st.booleans(),
    suffix=st.sampled_from(["", ".gz", ".bz2"]),
    n_features=st.sampled_from([None, None, 123, 2**31 - 1]),
    end=st.sampled_from([b"\n", b"\r\n", b""]),
)
@example(lines=[b"-1 2:1 1000000000000:1"], base=True, suffix="", n_features=None, end=b"\n")  # OverflowError
@example(lines=[b"-1 2:1 2000000000:1"], base=True, suffix=".gz", n_features=None, end=b"\n")  # MemoryError later
@example(lines=[b"+1", b"-1", b"+1"], base=False, suffix="", n_features=None, end=b"\n")  # labels only
@example(lines=[], base=False, suffix=".bz2", n_features=None, end=b"")  # empty
def test_svmlight_hostile_tokens(
    scratch: Path, lines: list[bytes], base: bool, suffix: str, n_features: int | None, end: bytes
) -> None:
    # With the base, a valid two-class pair is always there, so success is possible and the bounds are exercised.
    content = (b"+1 1:1\n-1 2:1\n" if base else b"") + b"\n".join(lines) + end
    _check_svmlight(_write(scratch, _compress(content, suffix), suffix), n_features)


# --------------------------------------------------------------------------- idx


@pytest.fixture(scope="module")
def small_idx(shared_data: Path) -> list[bytes]:
    """Valid idx files cut from the real MNIST ones: 40 labels (idx1) and 2 images (idx3), headers rewritten."""
    labels = gzip.open(shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz", "rb").read(8 + 40)
    images = gzip.open(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz", "rb").read(16 + 2 * 784)
    return [labels[:4] + (40).to_bytes(4, "big") + labels[8:], images[:4] + (2).to_bytes(4, "big") + images[8:]]


def _check_idx(path: Path) -> None:
    try:
        arr = read_idx(path)
    except DataError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    assert isinstance(arr, np.ndarray) and arr.flags.writeable


@FUZZ
@given(data=st.binary(max_size=120), gz=st.booleans())
def test_idx_random_bytes(scratch: Path, data: bytes, gz: bool) -> None:
    _check_idx(_write(scratch, gzip.compress(data) if gz else data, ".gz" if gz else ""))


@FUZZ
@given(data=st.data(), which=st.integers(0, 1), gz=st.sampled_from(["none", "inner", "outer"]))
def test_idx_mutated_mnist(scratch: Path, small_idx: list[bytes], data: st.DataObject, which: int, gz: str) -> None:
    base = small_idx[which]
    if gz == "outer":  # damage the gzip stream
        content = data.draw(mutated(gzip.compress(base)))
    else:
        content = data.draw(mutated(base))
        content = gzip.compress(content) if gz == "inner" else content
    _check_idx(_write(scratch, content, ".gz" if gz != "none" else ""))


def test_unmutated_idx_bases_read(scratch: Path, small_idx: list[bytes]) -> None:
    assert read_idx(_write(scratch, small_idx[0], "")).shape == (40,)
    assert read_idx(_write(scratch, gzip.compress(small_idx[1]), ".gz")).shape == (2, 28, 28)


@FUZZ
@given(
    images=st.binary(max_size=80),
    labels=st.binary(max_size=40),
    which=st.sampled_from(["binary", "ten"]),
    valid_images=st.booleans(),
)
def test_mnist_pair_random_bytes(
    scratch: Path, small_idx: list[bytes], images: bytes, labels: bytes, which: str, valid_images: bool
) -> None:
    img = _write(scratch, small_idx[1] if valid_images else images, "")
    lbl = _write(scratch, bytes([0, 0, 0x08, 1]) + (2).to_bytes(4, "big") + labels[:2] if valid_images else labels, "")
    try:
        ds = (mnist_binary if which == "binary" else mnist10)(img, lbl)
    except DataError as err:
        assert "\n" not in str(err) and (str(img) in str(err) or str(lbl) in str(err))
        return
    assert isinstance(ds, Dataset)


# --------------------------------------------------------------------------- CIFAR-10 PNGs and pickles

PNG = "cifar10/train_first200_kaggle/train/1.png"


@pytest.fixture(scope="module")
def real_png(shared_data: Path) -> bytes:
    return (shared_data / PNG).read_bytes()


def _check_png(scratch: Path, png: bytes, csv_text: bytes) -> None:
    folder = scratch / f"png{next(_counter)}"
    folder.mkdir()
    (folder / "1.png").write_bytes(png)
    csv = folder / "labels.csv"
    csv.write_bytes(csv_text)
    try:
        ds = cifar10_png(folder, csv)
    except DataError as err:
        assert "\n" not in str(err) and str(folder) in str(err), str(err)
        return
    assert ds.X.shape[1:] == (3, 32, 32) and ds.X.dtype == np.float32 and ((0 <= ds.y) & (ds.y <= 9)).all()


@FUZZ
@given(data=st.data(), random=st.booleans())
def test_png_random_and_mutated_bytes(scratch: Path, real_png: bytes, data: st.DataObject, random: bool) -> None:
    png = data.draw(st.binary(max_size=300)) if random else data.draw(mutated(real_png))
    _check_png(scratch, png, b"1.png,frog\n")


def test_unmutated_png_reads(scratch: Path, real_png: bytes) -> None:
    _check_png(scratch, real_png, b"1.png,frog\n")
    folder = max(scratch.glob("png*"), key=lambda p: int(p.name[3:]))
    assert cifar10_png(folder, folder / "labels.csv").y.tolist() == [6]


_CSV_PIECES = st.sampled_from(
    [
        b"1.png",
        b"1",
        b"2.png",
        b"frog",
        b"6",
        b"10",
        b"\xc2\xb2",
        b"id",
        b"label",
        b",",
        b"\n",
        b"\r\n",
        b'"',
        b"\x00",
        b"\xff",
        b" ",
        b"/",
        b"..",
        b"../1.png",
        b"cat,dog",
    ]
)


@FUZZ
@given(pieces=st.lists(_CSV_PIECES, max_size=12), raw=st.binary(max_size=40), use_raw=st.booleans())
def test_png_labels_csv(scratch: Path, real_png: bytes, pieces: list[bytes], raw: bytes, use_raw: bool) -> None:
    _check_png(scratch, real_png, raw if use_raw else b"".join(pieces))


@pytest.fixture(scope="module")
def real_batch() -> bytes:
    import pickle

    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
    return pickle.dumps({b"batch_label": b"x", b"labels": [3, 7], b"data": rows}, protocol=2)


@FUZZ
@given(data=st.data(), random=st.booleans())
def test_cifar_batch_random_and_mutated_bytes(
    scratch: Path, real_batch: bytes, data: st.DataObject, random: bool
) -> None:
    folder = scratch / f"batches{next(_counter)}"
    folder.mkdir()
    blob = data.draw(st.binary(max_size=200)) if random else data.draw(mutated(real_batch))
    (folder / "test_batch").write_bytes(blob)
    try:
        ds = cifar10_pickle(folder, ("test_batch",))
    except DataError as err:
        assert "\n" not in str(err) and str(folder / "test_batch") in str(err), str(err)
        return
    assert ds.X.shape[1:] == (3, 32, 32)


def test_unmutated_batch_reads(scratch: Path, real_batch: bytes) -> None:
    folder = scratch / "batches-ok"
    folder.mkdir()
    (folder / "test_batch").write_bytes(real_batch)
    assert cifar10_pickle(folder, ("test_batch",)).y.tolist() == [3, 7]


# --------------------------------------------------------------------------- registry: names and data-dir layouts


@FUZZ
@given(
    name=st.one_of(st.sampled_from(list(DATASETS)), st.text(max_size=20).filter(lambda t: "/" not in t)),
    layout=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "a9a",
                    "a9a/a9a.gz",
                    "mnist",
                    "cifar10",
                    "cifar10/cifar-10-batches-py",
                    "cifar10/train_first200_kaggle",
                    "mushrooms/mushrooms.gz",
                    "",
                ]
            ),
            st.sampled_from(["file", "dir"]),
        ),
        max_size=3,
    ),
    data_dir_kind=st.sampled_from(["dir", "file", "missing", "under-file"]),
)
def test_registry_names_and_layouts(
    scratch: Path, name: str, layout: list[tuple[str, str]], data_dir_kind: str
) -> None:
    base = scratch / f"reg{next(_counter)}"
    base.mkdir()
    root = {"dir": base / "dd", "file": base / "dd", "missing": base / "none", "under-file": base / "dd" / "x"}[
        data_dir_kind
    ]
    if data_dir_kind == "dir":
        root.mkdir()
        for rel, kind in layout:
            target = root / rel
            try:
                if kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(b"garbage")
            except OSError:
                pass  # an earlier entry is in the way: that is the point
    elif data_dir_kind in ("file", "under-file"):
        (base / "dd").write_bytes(b"x")
    cwd = os.getcwd()
    os.chdir(base)  # a name that is a path is read relative to here, never from the repository
    try:
        for call in (lambda: load_dataset(name, root), lambda: fetch(name, root, urlopen=_no_network)):
            try:
                call()
            except StlsgdError as err:
                assert "\n" not in str(err), str(err)
    finally:
        os.chdir(cwd)


def _no_network(url: str, timeout: float = 0) -> None:
    raise OSError("no network in tests")


# --------------------------------------------------------------------------- config


EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "examples" / "a9a_stl_sc.toml"


def _check_config(path: Path, overrides: list[str] | None = None) -> None:
    try:
        exp = load_config(path, overrides)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message, message
        assert message.startswith((f"{path}", "--set")), message  # names the file, or the override at fault
        return
    assert isinstance(exp, Experiment)


@FUZZ
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".toml", ".yaml", ".yml", ".json", ".cfg"]))
def test_config_random_bytes(scratch: Path, data: bytes, suffix: str) -> None:
    _check_config(_write(scratch, data, suffix))


@FUZZ
@given(data=st.data(), suffix=st.sampled_from([".toml", ".yaml"]))
def test_config_mutated_example(scratch: Path, data: st.DataObject, suffix: str) -> None:
    import yaml

    text = EXAMPLE.read_bytes()
    if suffix == ".yaml":
        text = yaml.safe_dump(load_config(EXAMPLE).to_dict()).encode()
    _check_config(_write(scratch, data.draw(mutated(text)), suffix))


_KEYS = st.sampled_from(
    [
        "name",
        "data.dataset",
        "data.num_clients",
        "data.s",
        "data.partition",
        "algorithm.lr",
        "algorithm.k",
        "algorithm.gamma",
        "algorithm.method",
        "run.max_rounds",
        "run.seed",
        "data",
        "algorithm.lr.x",
        "nope.x",
        "",
    ]
)
_VALUES = st.one_of(
    st.sampled_from(
        ["0", "-1", "1e400", "nan", "inf", "true", "[1, 2]", "{a = 1}", "none", '"x"', "stl_nc", "1.5", "101"]
    ),
    st.text(max_size=12),
)


@FUZZ
@given(
    overrides=st.lists(st.tuples(_KEYS, _VALUES).map(lambda kv: f"{kv[0]}={kv[1]}") | st.text(max_size=15), max_size=4)
)
def test_config_random_overrides(overrides: list[str]) -> None:
    _check_config(EXAMPLE, overrides)


def test_config_errors_are_stlsgd_errors() -> None:
    """The CLI turns exactly StlsgdError subclasses into one line and exit status 2."""
    assert issubclass(ConfigError, StlsgdError) and issubclass(DataError, StlsgdError)


# --------------------------------------------------------------------------- checkpoint


CHECKPOINT_W = np.random.default_rng(1).standard_normal((3, 5))


@pytest.fixture(scope="module")
def real_checkpoint(scratch: Path) -> bytes:
    from stlsgd.algorithms import Cursor
    from stlsgd.executors.simulator import RunState

    rng = np.random.Generator(np.random.PCG64(1))
    state = RunState(
        clients={"w": CHECKPOINT_W.copy()},
        sampler_state=rng.bit_generator.state,
        cursor=Cursor(index=4, iteration=40).to_dict(),
        last={"round": 4, "objective": 0.5},
    )
    path = scratch / "real-checkpoint"
    save_checkpoint(path, state, {"metrics_bytes": 10})
    return path.read_bytes()


@FUZZ
@given(data=st.data(), random=st.booleans())
def test_checkpoint_random_and_mutated_bytes(
    scratch: Path, real_checkpoint: bytes, data: st.DataObject, random: bool
) -> None:
    content = data.draw(st.binary(max_size=200)) if random else data.draw(mutated(real_checkpoint))
    path = _write(scratch, content, ".ckpt")
    try:
        state, meta = load_checkpoint(path)
    except CheckpointError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    # Whatever survives loading is the checkpoint that was written, never silently different numbers.
    assert state.round == 4 and meta == {"metrics_bytes": 10}
    assert state.clients["w"].tobytes() == CHECKPOINT_W.tobytes()
