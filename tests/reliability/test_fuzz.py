"""Property tests: whatever bytes the readers and the config loader get, they succeed or raise a StlsgdError.

Inputs are random bytes and mutations (flipped, inserted, deleted bytes; truncation) of real files: the head of
a9a and a small idx file cut from the real MNIST labels/images. Any other exception type would reach the user
as a traceback instead of the one-line ``stlsgd: error: FILE[:LINE]: ...``.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stlsgd.data.dataset import Dataset
from stlsgd.data.readers import read_idx, read_svmlight
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
    if n_features is not None:
        assert ds.X.shape[1] == n_features


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from(["", ".gz", ".bz2"]))
def test_svmlight_random_bytes(scratch: Path, data: bytes, suffix: str) -> None:
    _check_svmlight(_write(scratch, data, suffix), None)


@FUZZ
@given(data=st.data(), compress_first=st.booleans(), suffix=st.sampled_from(["", ".gz", ".bz2"]),
       n_features=st.sampled_from([None, 123, 60]))
def test_svmlight_mutated_a9a(scratch: Path, a9a_head: bytes, data: st.DataObject, compress_first: bool,
                              suffix: str, n_features: int | None) -> None:
    if compress_first:  # damage the compressed stream itself
        content = data.draw(mutated(_compress(a9a_head, suffix)))
    else:  # damage the text, then compress it intact
        content = _compress(data.draw(mutated(a9a_head)), suffix)
    _check_svmlight(_write(scratch, content, suffix), n_features)


def test_unmutated_a9a_head_reads(scratch: Path, a9a_head: bytes) -> None:
    """The base of the mutations is itself valid, so the mutation tests exercise both outcomes."""
    ds = read_svmlight(_write(scratch, gzip.compress(a9a_head), ".gz"), 123)
    assert ds.n == 25 and ds.d == 123


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


_KEYS = st.sampled_from(["name", "data.dataset", "data.num_clients", "data.s", "data.partition", "algorithm.lr",
                         "algorithm.k", "algorithm.gamma", "algorithm.method", "run.max_rounds", "run.seed",
                         "data", "algorithm.lr.x", "nope.x", ""])
_VALUES = st.one_of(st.sampled_from(["0", "-1", "1e400", "nan", "inf", "true", "[1, 2]", "{a = 1}", "none", '"x"',
                                     "stl_nc", "1.5", "101"]), st.text(max_size=12))


@FUZZ
@given(overrides=st.lists(st.tuples(_KEYS, _VALUES).map(lambda kv: f"{kv[0]}={kv[1]}") | st.text(max_size=15),
                          max_size=4))
def test_config_random_overrides(overrides: list[str]) -> None:
    _check_config(EXAMPLE, overrides)


def test_config_errors_are_stlsgd_errors() -> None:
    """The CLI turns exactly StlsgdError subclasses into one line and exit status 2."""
    assert issubclass(ConfigError, StlsgdError) and issubclass(DataError, StlsgdError)


# --------------------------------------------------------------------------- checkpoint


@pytest.fixture(scope="module")
def real_checkpoint(scratch: Path) -> bytes:
    from stlsgd.executors.simulator import RunState

    rng = np.random.Generator(np.random.PCG64(1))
    state = RunState(clients={"w": rng.standard_normal((3, 5))}, sampler_state=rng.bit_generator.state, round=4,
                     last={"round": 4, "objective": 0.5})
    path = scratch / "real-checkpoint"
    save_checkpoint(path, state, {"metrics_bytes": 10})
    return path.read_bytes()


@FUZZ
@given(data=st.data(), random=st.booleans())
def test_checkpoint_random_and_mutated_bytes(scratch: Path, real_checkpoint: bytes, data: st.DataObject,
                                             random: bool) -> None:
    content = data.draw(st.binary(max_size=200)) if random else data.draw(mutated(real_checkpoint))
    path = _write(scratch, content, ".ckpt")
    try:
        state, meta = load_checkpoint(path)
    except CheckpointError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    assert isinstance(state.round, int) and isinstance(meta, dict)
