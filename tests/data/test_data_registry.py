"""Registry loading, data-dir resolution and checksummed fetch (with a fake urlopen, no network)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import subprocess
import sys
import tarfile
import urllib.error
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stlsgd.data import DATASETS, fetch, load_dataset, registry, resolve_data_dir
from stlsgd.errors import DataError

A9A_CONTENT_SHA = "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_urlopen(shared: Path, calls: list[str], tamper: bool = False, dead: tuple[str, ...] = ()) -> Callable:
    """Serve LIBSVM files uncompressed (as the LIBSVM server does) and MNIST files as stored."""

    def urlopen(url: str, timeout: float = 0) -> io.BytesIO:
        calls.append(url)
        if url.startswith(dead):
            raise urllib.error.URLError("connection refused")
        base = url.rsplit("/", 1)[1]
        if "libsvmtools" in url:
            data = gzip.decompress((shared / base.split(".")[0] / f"{base}.gz").read_bytes())
        else:
            data = (shared / "mnist" / base).read_bytes()
        if tamper:
            data = data[:-1] + bytes([data[-1] ^ 1])
        return io.BytesIO(data)

    return urlopen


def test_registry_a9a_mnist49_digits(shared_data: Path) -> None:
    a9a = load_dataset("a9a", shared_data)
    assert (a9a.name, a9a.n, a9a.d, int((a9a.y > 0).sum())) == ("a9a", 32561, 123, 7841)
    assert load_dataset("a9a-test", shared_data).d == 123
    m = load_dataset("mnist49", shared_data)
    assert (m.n, m.d, int((m.y > 0).sum())) == (11791, 784, 5842)
    mt = load_dataset("mnist49-test", shared_data)
    assert (int((mt.y > 0).sum()), int((mt.y < 0).sum())) == (982, 1009)
    assert load_dataset("digits49", shared_data / "does-not-matter").n == 361


def test_registry_w8a_mushrooms_png(shared_data: Path) -> None:
    w = load_dataset("w8a", shared_data)
    assert (w.n, w.d, int((w.y > 0).sum())) == (49749, 300, 1479)
    mu = load_dataset("mushrooms", shared_data)
    assert (mu.n, mu.d) == (8124, 112)
    png = load_dataset("cifar10-png200", shared_data)
    assert png.name == "cifar10-png200" and png.X.shape == (200, 3, 32, 32)


def test_registry_cifar10_pickle_layout(tmp_path: Path, shared_data: Path) -> None:
    png = load_dataset("cifar10-png200", shared_data)
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows = (png.X * 255).round().astype(np.uint8).reshape(200, 3072)
    for i in range(1, 6):
        sl = slice((i - 1) * 40, i * 40)
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps({b"data": rows[sl], b"labels": png.y[sl].tolist()}))
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": rows[:7], b"labels": png.y[:7].tolist()}))
    ds = load_dataset("cifar10", tmp_path)
    np.testing.assert_array_equal(ds.y, png.y)
    assert load_dataset("cifar10-test", tmp_path).n == 7


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DataError) as err:
        load_dataset("a9b")
    msg = str(err.value)
    assert "unknown dataset 'a9b'" in msg and all(n in msg for n in DATASETS)


def test_missing_file_says_fetch(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("a9a", tmp_path)
    assert str(err.value) == f"{tmp_path / 'a9a/a9a.gz'}: not found; run: stlsgd data fetch a9a --data-dir {tmp_path}"
    with pytest.raises(DataError, match="stlsgd data fetch cifar10 "):
        load_dataset("cifar10", tmp_path)


def test_name_can_be_svmlight_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.svm"
    path.write_text("1 1:0.5\n2 2:1\n1 3:2\n")
    ds = load_dataset(str(path))
    assert (ds.n, ds.d) == (3, 3) and ds.y.tolist() == [-1.0, 1.0, -1.0]
    with pytest.raises(DataError, match="other.svm: not found"):
        load_dataset(str(tmp_path / "other.svm"))


def test_resolve_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STLSGD_DATA", str(tmp_path / "env"))
    assert resolve_data_dir("/x/cli") == Path("/x/cli")
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("STLSGD_DATA")
    assert "stlsgd" in str(resolve_data_dir(None))


def test_fetch_libsvm_stores_verified_gzip(tmp_path: Path, shared_data: Path) -> None:
    calls: list[str] = []
    paths = fetch("a9a", tmp_path, urlopen=_fake_urlopen(shared_data, calls))
    assert paths == [tmp_path / "a9a/a9a.gz"]
    assert calls == ["https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/a9a"]
    stored = paths[0].read_bytes()
    # Content is the README's; zlib's deflate differs from GNU gzip's, so compare the uncompressed bytes.
    assert _sha(gzip.decompress(stored)) == A9A_CONTENT_SHA
    assert _sha(gzip.decompress(stored)) == _sha(gzip.decompress((shared_data / "a9a/a9a.gz").read_bytes()))
    assert stored[4:8] == b"\0\0\0\0" and stored[3] & 0x08 == 0  # mtime 0, no file name: reproducible
    assert load_dataset("a9a", tmp_path).n == 32561
    # Present and valid: nothing downloaded.
    assert fetch("a9a", tmp_path, urlopen=_fake_urlopen(shared_data, calls)) == paths and len(calls) == 1
    assert list(tmp_path.rglob("*.part")) == []


def test_fetch_mnist_falls_back_to_second_mirror(tmp_path: Path, shared_data: Path) -> None:
    calls: list[str] = []
    urlopen = _fake_urlopen(shared_data, calls, dead=("https://ossci-datasets",))
    paths = fetch("mnist49", tmp_path, urlopen=urlopen)
    for p in paths:
        assert _sha(p.read_bytes()) == _sha((shared_data / "mnist" / p.name).read_bytes())
    assert sum("yann.lecun.com" in c for c in calls) == 2
    assert load_dataset("mnist49", tmp_path).n == 11791


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path: Path, shared_data: Path) -> None:
    calls: list[str] = []
    with pytest.raises(DataError) as err:
        fetch("mushrooms", tmp_path, urlopen=_fake_urlopen(shared_data, calls, tamper=True))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'mushrooms/mushrooms.gz'}: download failed")
    assert "sha256" in msg
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_fetch_replaces_corrupt_existing_file(tmp_path: Path, shared_data: Path) -> None:
    target = tmp_path / "mushrooms/mushrooms.gz"
    target.parent.mkdir()
    target.write_bytes(b"garbage")
    fetch("mushrooms", tmp_path, urlopen=_fake_urlopen(shared_data, []))
    assert load_dataset("mushrooms", tmp_path).n == 8124


def test_fetch_embedded_and_sourceless(tmp_path: Path) -> None:
    assert fetch("digits49", tmp_path, urlopen=None) == []
    with pytest.raises(DataError, match="no download source"):
        fetch("cifar10-png200", tmp_path, urlopen=None)
    with pytest.raises(DataError, match="unknown dataset"):
        fetch("nope", tmp_path, urlopen=None)


def _cifar_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i, member in enumerate(registry._CIFAR_MEMBERS):
            rows = np.full((2, 3072), i, dtype=np.uint8)
            data = pickle.dumps({b"data": rows, b"labels": [i % 10, 0]})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_fetch_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = _cifar_tarball()
    urlopen = lambda url, timeout=0: io.BytesIO(blob)  # noqa: E731
    with pytest.raises(DataError, match="md5 .* != expected c58f30108f718f92721af3b95e74349a"):
        fetch("cifar10", tmp_path, urlopen=urlopen)
    assert list(tmp_path.rglob("*data_batch*")) == []
    monkeypatch.setattr(registry, "_CIFAR_MD5", hashlib.md5(blob).hexdigest())
    paths = fetch("cifar10", tmp_path, urlopen=urlopen)
    assert all(p.is_file() for p in paths)
    ds = load_dataset("cifar10", tmp_path)
    assert ds.n == 10 and ds.y.tolist() == [0, 0, 1, 0, 2, 0, 3, 0, 4, 0]
    assert [p.name for p in tmp_path.joinpath("cifar10").iterdir()] == ["cifar-10-batches-py"]


def _digest(ds) -> str:
    arrays = (ds.X.data, ds.X.indices, ds.X.indptr, ds.y)
    return hashlib.sha256(b"".join(f"{a.dtype}{a.shape}".encode() + a.tobytes() for a in arrays)).hexdigest()


def test_parsed_sets_are_cached_per_source_file_and_parsed_again_when_it_changes(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    monkeypatch.setenv("STLSGD_CACHE", str(cache))
    (root / "a9a").mkdir(parents=True)
    source = root / "a9a" / "a9a.gz"
    source.write_bytes((shared_data / "a9a" / "a9a.gz").read_bytes())
    parses: list[str] = []
    parse = registry.readers.read_svmlight
    monkeypatch.setattr(registry.readers, "read_svmlight", lambda *a, **k: parses.append(str(a[0])) or parse(*a, **k))

    digest = _digest(load_dataset("a9a", root))
    assert len(parses) == 1 and len(list((cache / "datasets").glob("a9a-*.npz"))) == 1
    assert _digest(load_dataset("a9a", root)) == digest and len(parses) == 1  # the same bytes, dtypes included
    # The file rewritten (a new modification time) is parsed, and so checked, again.
    source.write_bytes(source.read_bytes())
    assert _digest(load_dataset("a9a", root)) == digest and len(parses) == 2
    # A torn copy is a miss, said in the log: the source is parsed and the copy replaced, never read half.
    [copy] = [c for c in (cache / "datasets").glob("a9a-*.npz") if c.stat().st_mtime_ns >= source.stat().st_mtime_ns]
    copy.write_bytes(copy.read_bytes()[:1000])
    assert _digest(load_dataset("a9a", root)) == digest and len(parses) == 3
    assert "cached copy of a9a unreadable" in caplog.text and "parsing the source again" in caplog.text
    # A new process (a sweep's worker, a torchrun rank) loads the copy without importing scikit-learn.
    probe = f"import sys\nfrom stlsgd.data import load_dataset\nload_dataset('a9a', {str(root)!r})\n"
    probe += "print(sorted(m for m in sys.modules if m.startswith('sklearn')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ))
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr[-2000:]
    # The digits embedded in scikit-learn are kept too, keyed by its version.
    digits = _digest(load_dataset("digits49"))
    assert len(list((cache / "datasets").glob("digits49-*.npz"))) == 1 and _digest(load_dataset("digits49")) == digits
