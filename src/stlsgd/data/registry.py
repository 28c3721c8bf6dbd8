"""Named datasets: where their files live under the data dir, how to load them, and how to fetch them."""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from stlsgd.data import readers
from stlsgd.data.dataset import Dataset
from stlsgd.errors import DataError
from stlsgd.files import atomic_write, cache_dir

log = logging.getLogger(__name__)

ENV_VAR = "STLSGD_DATA"
_LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
_MNIST = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
_CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"  # torchvision's check; no sha256 of the tarball is on record
_SVM_SUFFIXES = (".svm", ".libsvm", ".txt", ".gz", ".bz2")


@dataclass(frozen=True)
class RemoteFile:
    """One stored file and where it comes from.

    ``content_sha256`` is the hash of the downloaded bytes. With ``gzip_store`` the download is plain
    text that is stored gzip-compressed, so a present file is validated by its uncompressed content;
    ``sha256`` is then the hash that GNU ``gzip -9 -n`` gives (informational: zlib's output differs).
    """

    relpath: str
    urls: tuple[str, ...]
    content_sha256: str
    gzip_store: bool = False
    sha256: str | None = None


def _libsvm(relpath: str, remote: str, content: str, stored: str) -> RemoteFile:
    return RemoteFile(relpath, (_LIBSVM + remote,), content, gzip_store=True, sha256=stored)


def _mnist(fname: str, sha: str) -> RemoteFile:
    return RemoteFile(f"mnist/{fname}", tuple(u + fname for u in _MNIST), sha, sha256=sha)


# sha256 values from shared/data/README.md.
_FILES: dict[str, RemoteFile] = {
    f.relpath: f
    for f in (
        _libsvm(
            "a9a/a9a.gz",
            "a9a",
            "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906",
            "b301f3e87350539f3ebc751d07b4691a8c66f0bf38c1d179c86bbf5e2d9623b2",
        ),
        _libsvm(
            "a9a/a9a.t.gz",
            "a9a.t",
            "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9",
            "92967561181c73a60149cc8221b936eb746573fda8cbf483115d673f42b26c3f",
        ),
        _libsvm(
            "w8a/w8a.gz",
            "w8a",
            "6a9fa8fd5f524303240a5db07d4b3d4a51e8b7b4b20a914105d8e3e8c81640f2",
            "bbb05ebf2874051515c57bb657ee66dfa1cec7293005d6bc0eaf255d45d9befb",
        ),
        _libsvm(
            "w8a/w8a.t.gz",
            "w8a.t",
            "618929ecb01bebb841daec4cae4aa07b97832d29b08652452775598929547fde",
            "41722ce826a00f5f530f9b21a9900f53db6cf07bd56ed4275156f97963d7dc6c",
        ),
        _libsvm(
            "mushrooms/mushrooms.gz",
            "mushrooms",
            "f39a4eb628dc61a7d43760815b061c9e497aa728ce1ad8bde57a09ef6043b538",
            "c6170f9d3de835051acced088f85c13c96d23038d950b31684d793d5c7be21bd",
        ),
        _mnist("train-images-idx3-ubyte.gz", "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
        _mnist("train-labels-idx1-ubyte.gz", "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
        _mnist("t10k-images-idx3-ubyte.gz", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
        _mnist("t10k-labels-idx1-ubyte.gz", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
    )
}

_CIFAR_DIR = "cifar10/cifar-10-batches-py"
_CIFAR_MEMBERS = (*readers.CIFAR10_TRAIN_BATCHES, "test_batch", "batches.meta")
_TRAIN_IMG, _TRAIN_LBL = "mnist/train-images-idx3-ubyte.gz", "mnist/train-labels-idx1-ubyte.gz"
_TEST_IMG, _TEST_LBL = "mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz"
_PNG200 = "cifar10/train_first200_kaggle"


@dataclass(frozen=True)
class DatasetSpec:
    """How one named dataset is stored (``paths`` relative to the data dir) and loaded."""

    name: str
    paths: tuple[str, ...]
    load: Callable[[Path], Dataset]
    description: str
    fetchable: bool = True
    #: What a model needs to know without loading the data: d of a binary set, (channels, side, classes) of images.
    features: int | None = None
    image: tuple[int, int, int] | None = None
    #: Parsed once and kept under the cache dir: the sets scikit-learn parses, whose import and parse alone cost
    #: about two seconds in every process that loads them (a sweep's workers, torchrun's ranks).
    cached: bool = False


def _svm(name: str, rel: str, n_features: int, rows: int) -> Callable[[Path], Dataset]:
    # rows: the published size; a file inflating to more lines is refused before parsing (a decompression bomb).
    return lambda root: readers.read_svmlight(root / rel, n_features, name=name, max_lines=rows)


def _cifar_test(root: Path) -> Dataset:
    ds = readers.cifar10_pickle(root / _CIFAR_DIR, ("test_batch",))
    return Dataset("cifar10-test", ds.X, ds.y, ds.num_classes)


def _mnist10_test(root: Path) -> Dataset:
    ds = readers.mnist10(root / _TEST_IMG, root / _TEST_LBL)
    return Dataset("mnist10-test", ds.X, ds.y, ds.num_classes)


def _mnist49_test(root: Path) -> Dataset:
    ds = readers.mnist_binary(root / _TEST_IMG, root / _TEST_LBL)
    return Dataset("mnist49-test", ds.X, ds.y, ds.num_classes)


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "a9a",
            ("a9a/a9a.gz",),
            _svm("a9a", "a9a/a9a.gz", 123, 32_561),
            "UCI Adult, 32,561 x 123, binary",
            features=123,
            cached=True,
        ),
        DatasetSpec(
            "a9a-test",
            ("a9a/a9a.t.gz",),
            _svm("a9a-test", "a9a/a9a.t.gz", 123, 16_281),
            "a9a test split, 16,281 x 123",
            cached=True,
        ),
        DatasetSpec(
            "mnist49",
            (_TRAIN_IMG, _TRAIN_LBL),
            lambda r: readers.mnist_binary(r / _TRAIN_IMG, r / _TRAIN_LBL),
            "MNIST train digits 4 vs 9, 11,791 x 784",
            features=784,
        ),
        DatasetSpec("mnist49-test", (_TEST_IMG, _TEST_LBL), _mnist49_test, "MNIST test digits 4 vs 9, 1,991 x 784"),
        DatasetSpec(
            "mnist10",
            (_TRAIN_IMG, _TRAIN_LBL),
            lambda r: readers.mnist10(r / _TRAIN_IMG, r / _TRAIN_LBL),
            "MNIST train, 60,000 x 1x28x28, 10 classes",
            image=(1, 28, 10),
        ),
        DatasetSpec("mnist10-test", (_TEST_IMG, _TEST_LBL), _mnist10_test, "MNIST test, 10,000 x 1x28x28"),
        DatasetSpec(
            "digits49",
            (),
            lambda r: readers.digits_binary(4, 9),
            "scikit-learn digits 4 vs 9, 361 x 64 (embedded)",
            features=64,
            cached=True,
        ),
        DatasetSpec(
            "w8a",
            ("w8a/w8a.gz",),
            _svm("w8a", "w8a/w8a.gz", 300, 49_749),
            "LIBSVM w8a, 49,749 x 300, binary",
            features=300,
            cached=True,
        ),
        DatasetSpec(
            "w8a-test",
            ("w8a/w8a.t.gz",),
            _svm("w8a-test", "w8a/w8a.t.gz", 300, 14_951),
            "w8a test split, 14,951 x 300",
            cached=True,
        ),
        DatasetSpec(
            "mushrooms",
            ("mushrooms/mushrooms.gz",),
            _svm("mushrooms", "mushrooms/mushrooms.gz", 112, 8_124),
            "UCI Mushroom, 8,124 x 112, binary",
            features=112,
            cached=True,
        ),
        DatasetSpec(
            "cifar10",
            tuple(f"{_CIFAR_DIR}/{b}" for b in readers.CIFAR10_TRAIN_BATCHES),
            lambda r: readers.cifar10_pickle(r / _CIFAR_DIR),
            "CIFAR-10 train, 50,000 x 3x32x32",
            image=(3, 32, 10),
        ),
        DatasetSpec("cifar10-test", (f"{_CIFAR_DIR}/test_batch",), _cifar_test, "CIFAR-10 test, 10,000 x 3x32x32"),
        DatasetSpec(
            "cifar10-png200",
            (f"{_PNG200}/trainLabels.csv",),
            lambda r: readers.cifar10_png(
                r / _PNG200 / "train", r / _PNG200 / "trainLabels.csv", name="cifar10-png200"
            ),
            "first 200 CIFAR-10 train images as PNG (Kaggle layout)",
            fetchable=False,
            image=(3, 32, 10),
        ),
    )
}


def _expand(value: str | os.PathLike[str], what: str) -> Path:
    try:
        return Path(value).expanduser()
    except RuntimeError:  # "~nosuchuser/..."
        raise DataError(f"{value}: {what}: cannot expand '~' (no such user or no home directory)") from None


def resolve_data_dir(cli_value: str | os.PathLike[str] | None = None) -> Path:
    """The data dir: the CLI value, else $STLSGD_DATA, else the per-user cache dir."""
    if cli_value:
        return _expand(cli_value, "data dir")
    env = os.environ.get(ENV_VAR)
    if env:
        return _expand(env, f"data dir (${ENV_VAR})")
    import platformdirs

    return Path(platformdirs.user_cache_dir("stlsgd"))


def _unknown(name: str) -> DataError:
    return DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)} (or a path to an svmlight file)")


def _looks_like_path(name: str) -> bool:
    if name.endswith(_SVM_SUFFIXES) or os.sep in name or "/" in name or name.startswith("~"):
        return True
    try:
        return Path(name).is_file()
    except OSError:  # e.g. a name too long for the file system: let the reader say so
        return True


def _kind(path: Path) -> str:
    """'file', 'dir', 'missing' or 'other' (a device, FIFO or socket); a stat failure is a one-line DataError."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as err:  # permission denied on a parent, name too long, ...
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def _check_data_dir(root: Path) -> None:
    """Refuse a data dir that is, or lies under, something other than a directory: nothing could be fetched there."""
    for p in (root, *root.parents):
        kind = _kind(p)
        if kind == "missing":
            continue  # created by fetch
        if kind == "dir":
            return
        what = "a file" if kind == "file" else "a special file (device, FIFO or socket)"
        if p == root:
            raise DataError(f"{root}: data dir is {what}, not a directory; point --data-dir or ${ENV_VAR} at a folder")
        raise DataError(
            f"{root}: data dir cannot be created: {p} is {what}; point --data-dir or ${ENV_VAR} at a folder"
        )


def _blocker(root: Path, rel: str) -> tuple[Path, str] | None:
    """Something in the way of ``root/rel``: a file where a folder belongs, or a folder where the file belongs."""
    path = root / rel
    for p in reversed(path.parents[: len(Path(rel).parts) - 1]):  # the folders between root and the file
        kind = _kind(p)
        if kind == "missing":
            return None
        if kind != "dir":
            return p, "is a file, not a directory" if kind == "file" else "is not a directory"
    kind = _kind(path)
    if kind in ("file", "missing"):
        return None
    return path, "is a directory, not a file" if kind == "dir" else "is not a regular file"


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Load a registered dataset by name, or an svmlight file given by path."""
    spec = DATASETS.get(name)
    if spec is None:
        if _looks_like_path(name):
            return readers.read_svmlight(_expand(name, "data.dataset"))
        raise _unknown(name)
    root = resolve_data_dir(data_dir)
    if spec.paths:
        _check_data_dir(root)
    for rel in spec.paths:
        path = root / rel
        remedy = (
            f"run: stlsgd data fetch {name} --data-dir {root}"
            if spec.fetchable
            else f"{name} has no download source, copy it from shared/data/{rel}"
        )
        if (blocker := _blocker(root, rel)) is not None:
            raise DataError(f"{blocker[0]}: {blocker[1]}; remove it, then {remedy}")
        if _kind(path) != "file":
            raise DataError(f"{path}: not found; {remedy}")
    if not spec.cached:
        return spec.load(root)
    cached = cache_dir() / "datasets" / f"{name}-{_source_key(spec, root)}.npz"
    dataset = _read_cached(cached, name)
    if dataset is None:
        dataset = spec.load(root)
        _write_cached(cached, dataset)
    return dataset


#: Bump when a reader's output changes, so that copies an older reader cached are parsed again.
_CACHE_FORMAT = "1"


def _source_key(spec: DatasetSpec, root: Path) -> str:
    """What a cached copy was parsed from: each file's path, size and modification time, or, for a set embedded
    in scikit-learn, its version. A file changed in any way is parsed again (and checked again)."""
    from importlib.metadata import version

    parts = [spec.name, _CACHE_FORMAT, version("numpy")]
    if not spec.paths:
        parts.append(version("scikit-learn"))
    for rel in spec.paths:
        path = (root / rel).resolve()
        st = path.stat()
        parts += [str(path), str(st.st_size), str(st.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _read_cached(path: Path, name: str) -> Dataset | None:
    """The CSR dataset cached at ``path``; None when there is none or it cannot be read (parsed again then)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            # Filled in place: the constructor would narrow int64 indices to int32, and the data's fingerprint
            # (which a checkpoint's resume checks) hashes the dtypes as loaded.
            X = sp.csr_matrix(tuple(z["shape"]), dtype=z["data"].dtype)
            X.data, X.indices, X.indptr = z["data"], z["indices"], z["indptr"]
            X.check_format()
            return Dataset(name=str(z["name"]), X=X, y=z["y"], num_classes=int(z["num_classes"]))
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 -- a torn or foreign file is only a cache miss
        log.warning("%s: cached copy of %s unreadable (%s); parsing the source again", path, name, err)
        return None


def _write_cached(path: Path, ds: Dataset) -> None:
    X = sp.csr_matrix(ds.X)  # the cached sets are binary, CSR already (no copy)
    arrays = {"data": X.data, "indices": X.indices, "indptr": X.indptr, "shape": np.array(X.shape), "y": ds.y}
    arrays |= {"num_classes": np.array(ds.num_classes), "name": np.array(ds.name)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file and a rename: processes loading the same set at once never read half a file.
        atomic_write(path, lambda fh: np.savez(fh, **arrays), mode="wb")
    except OSError as err:  # a read-only or full cache only costs a parse next time
        log.info("%s: not cached (%s)", path, err)


# --------------------------------------------------------------------------- fetch

Urlopen = Callable[..., Any]
_CHUNK = 1 << 20


def _sha256_file(path: Path, *, gunzip: bool = False) -> str:
    h = hashlib.sha256()
    opener = gzip.open if gunzip else open
    with opener(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _is_valid(path: Path, rf: RemoteFile) -> bool:
    if not path.is_file():
        return False
    try:
        return _sha256_file(path, gunzip=rf.gzip_store) == rf.content_sha256
    except (OSError, EOFError, zlib.error):
        return False


def _download(url: str, dest_tmp: Path, urlopen: Urlopen, *, gzip_store: bool) -> tuple[str, str]:
    """Stream ``url`` into ``dest_tmp``; return (sha256, md5) of the downloaded bytes."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with urlopen(url, timeout=60) as resp, open(dest_tmp, "wb") as raw_out:
        # mtime=0 and no file name: the stored .gz is the same bytes on every fetch.
        out: Any = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw_out, compresslevel=9, mtime=0) if gzip_store else raw_out
        )
        try:
            while chunk := resp.read(_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
                out.write(chunk)
        finally:
            if gzip_store:
                out.close()
    return sha.hexdigest(), md5.hexdigest()


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"{path}: cannot create the directory ({err.strerror or err})") from None


def _fetch_file(rf: RemoteFile, root: Path, urlopen: Urlopen) -> Path:
    dest = root / rf.relpath
    if _is_valid(dest, rf):
        return dest
    _make_dir(dest.parent)
    problems: list[str] = []
    for url in rf.urls:
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        except OSError as err:
            raise DataError(f"{dest.parent}: cannot write ({err.strerror or err})") from None
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            sha, _ = _download(url, tmp, urlopen, gzip_store=rf.gzip_store)
            if sha != rf.content_sha256:
                problems.append(f"{url}: sha256 {sha} != expected {rf.content_sha256}")
                continue
            os.replace(tmp, dest)
            return dest
        except (urllib.error.URLError, OSError, ValueError) as err:
            problems.append(f"{url}: {getattr(err, 'reason', None) or err}")
        finally:
            tmp.unlink(missing_ok=True)
    raise DataError(f"{dest}: download failed; " + "; ".join(problems))


def _fetch_cifar(root: Path, urlopen: Urlopen) -> list[Path]:
    final = root / _CIFAR_DIR
    wanted = [final / m for m in _CIFAR_MEMBERS]
    if all(p.is_file() for p in wanted):
        return wanted
    _make_dir(final.parent)
    try:
        work = Path(tempfile.mkdtemp(prefix=".cifar10.", dir=final.parent))
    except OSError as err:
        raise DataError(f"{final.parent}: cannot write ({err.strerror or err})") from None
    try:
        tar_path = work / "cifar-10-python.tar.gz"
        try:
            _, md5 = _download(_CIFAR_URL, tar_path, urlopen, gzip_store=False)
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise DataError(f"{final}: download failed; {_CIFAR_URL}: {getattr(err, 'reason', None) or err}") from None
        if md5 != _CIFAR_MD5:
            raise DataError(f"{final}: download failed; {_CIFAR_URL}: md5 {md5} != expected {_CIFAR_MD5}")
        out = work / "cifar-10-batches-py"
        out.mkdir()
        try:
            with tarfile.open(tar_path, "r:gz") as tar:
                for member in _CIFAR_MEMBERS:
                    # Only the known regular files, written by us: no path from the archive reaches the disk.
                    info = tar.getmember(f"cifar-10-batches-py/{member}")
                    src = tar.extractfile(info) if info.isfile() else None
                    if src is None:
                        raise DataError(f"{_CIFAR_URL}: archive member {member} is not a regular file")
                    with src, open(out / member, "wb") as dst:
                        shutil.copyfileobj(src, dst, _CHUNK)
        except (tarfile.TarError, KeyError, EOFError, OSError) as err:
            raise DataError(f"{tar_path.name}: unreadable CIFAR-10 archive ({err})") from None
        if final.exists():
            shutil.rmtree(final)  # an incomplete earlier extraction
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return wanted


def fetch(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, urlopen: Urlopen = urllib.request.urlopen
) -> list[Path]:
    """Download ``name``'s files into the data dir (checksummed, atomic); skip files already valid."""
    spec = DATASETS.get(name)
    if spec is None:
        raise _unknown(name)
    root = resolve_data_dir(data_dir)
    if not spec.paths:
        return []  # embedded in a package, nothing to download
    if not spec.fetchable:
        raise DataError(f"{root / spec.paths[0]}: {name} has no download source; copy it from shared/data/{_PNG200}")
    _check_data_dir(root)
    for rel in spec.paths:
        if (blocker := _blocker(root, rel)) is not None:
            raise DataError(f"{blocker[0]}: {blocker[1]}; remove it, then fetch again")
    if spec.paths[0].startswith(_CIFAR_DIR):
        return _fetch_cifar(root, urlopen)
    return [_fetch_file(_FILES[rel], root, urlopen) for rel in spec.paths]
